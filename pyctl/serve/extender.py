"""The kube-scheduler extender's requests, answered: the wire format
(`pyctl.cluster.kube.extender`) around the controller's placement advice
(`pyctl.controller.placement.PlacementAdvisor`). Served by `pyctl.serve.extender_server`.

A broken request never raises: the filter (and ``choose``, a filter that also decides) answers
HTTP 200 with ``Error`` set (the scheduler then applies the extender's ``ignorable`` setting);
``HostPriorityList`` has no error field, so a broken prioritize request gets an empty list (no
preference) and is logged. "No advice" (`no_advice`: pyctl overloaded or past its deadline) is
answered the same way.

Each answer comes with its outcome for the request counter: ``ok``, ``bad-request`` (a request
the extender cannot read) or ``error`` (pyctl failed); the server adds ``overload`` and
``deadline``.
"""

from __future__ import annotations

import logging

from pyctl.cluster.kube.extender import (
    ExtenderInputError,
    encode,
    filter_error,
    filter_result,
    parse_args,
    priority_list,
)
from pyctl.controller.placement import NotKept, PlacementAdvisor

log = logging.getLogger("pyctl.placement")

#: ``choose``: a filter verb that also decides (`PlacementAdvisor.choose`), for a scheduler
#: configured with ``filterVerb: choose`` and no ``prioritizeVerb`` (the shipped configuration)
VERBS = ("filter", "prioritize", "choose")
OUTCOMES = ("ok", "bad-request", "deadline", "overload", "error")


def no_advice(verb: str, why: str) -> bytes:
    """The answer that gives no advice: for filter an ``Error`` (so the scheduler applies
    ``ignorable``: true schedules without pyctl, false retries the pod later), for prioritize an
    empty ``HostPriorityList`` (no score from pyctl: what the scheduler does on any prioritize
    error)."""
    if verb != "prioritize":
        return encode(filter_error(f"pyctl: no advice: {why}"))
    return encode([])


class ExtenderHandler:
    """The scheduler's requests answered by `advisor`; the pod in each is read as the
    reflector reads pods (`rdma_resource`: the extended resource read as its RDMA)."""

    def __init__(self, advisor: PlacementAdvisor, rdma_resource: str = "") -> None:
        self.advisor = advisor
        self.rdma_resource = rdma_resource

    def handle(self, verb: str, body: bytes) -> bytes:
        """The JSON answer to one POST on ``/scheduler/<verb>`` (``filter`` or ``prioritize``)."""
        return self.answer(verb, body)[0]

    def answer(self, verb: str, body: bytes) -> tuple[bytes, str]:
        """The JSON answer and the outcome (`OUTCOMES`)."""
        got = self._answer(verb, body, True)
        assert got is not None  # only answers from kept ranks may be refused
        return got

    def answer_kept(self, verb: str, body: bytes) -> tuple[bytes, str] | None:
        """`answer`, if it needs no rank computed (every candidate's is kept,
        `pyctl.controller.placement.RankTable`), else None (nothing was counted or kept): a
        lookup per candidate, small enough for the server's own thread."""
        return self._answer(verb, body, False)

    def _answer(self, verb: str, body: bytes, compute: bool) -> tuple[bytes, str] | None:
        if verb not in VERBS:
            return encode({"Error": f"pyctl: unknown extender verb {verb[:40]!r}"}), "bad-request"
        try:
            args = parse_args(body, self.rdma_resource)
            # each distinct candidate once (a request naming a node many times costs no more
            # than naming it once); the answer keeps the scheduler's list as sent
            unique = tuple(dict.fromkeys(args.names))
            if verb == "filter":
                failed = self.advisor.filter(args.pod, unique, compute)
                return encode(filter_result(args, failed)), "ok"
            if verb == "choose":
                failed, chosen = self.advisor.choose(args.pod, unique, compute)
                return encode(filter_result(args, failed, only=chosen)), "ok"
            scores = self.advisor.prioritize(args.pod, unique, compute)
            return encode(priority_list(scores, args.names)), "ok"
        except NotKept:
            return None
        except Exception as e:  # answer the scheduler, whatever went wrong
            bad = isinstance(e, ExtenderInputError | RecursionError)
            outcome = "bad-request" if bad else "error"
            msg = _message(e)
            if verb != "prioritize":
                log.warning("scheduler extender %s: %s", verb, msg, extra={"outcome": outcome})
                return encode(filter_error(f"pyctl: {msg}")), outcome
            log.warning(
                "scheduler extender prioritize: %s (no preference given)",
                msg,
                extra={"outcome": outcome},
            )
            return encode([]), outcome


def _message(e: Exception) -> str:
    """What went wrong, on one line (a message may quote a pod's name, which may hold any
    character: the log and the scheduler's event get one line each)."""
    if isinstance(e, ExtenderInputError):
        text = str(e)
    elif isinstance(e, RecursionError):
        text = "request body nested too deeply"
    else:
        text = f"{type(e).__name__}: {str(e)[:300]}"
    return " ".join(text.split())
