"""The kube-scheduler extender's requests, answered: the wire format
(`pyctl.cluster.kube.extender`) around the controller's placement advice
(`pyctl.controller.placement.PlacementAdvisor`).

A broken request never raises: the filter answers HTTP 200 with ``Error`` set (the scheduler then
applies the extender's ``ignorable`` setting); ``HostPriorityList`` has no error field, so a broken
prioritize request gets an empty list (no preference) and is logged.
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
from pyctl.controller.placement import PlacementAdvisor

log = logging.getLogger("pyctl.placement")


class ExtenderHandler:
    def __init__(self, advisor: PlacementAdvisor) -> None:
        self.advisor = advisor

    def handle(self, verb: str, body: bytes) -> bytes:
        """The JSON answer to one POST on ``/scheduler/<verb>`` (``filter`` or ``prioritize``)."""
        if verb == "filter":
            try:
                args = parse_args(body)
                return encode(filter_result(args, self.advisor.filter(args.pod, args.names)))
            except Exception as e:  # answer the scheduler, whatever went wrong
                msg = _message(e)
                log.warning("scheduler extender filter: %s", msg)
                return encode(filter_error(f"pyctl: {msg}"))
        if verb == "prioritize":
            try:
                args = parse_args(body)
                scores = self.advisor.prioritize(args.pod, args.names)
                return encode(priority_list(scores, args.names))
            except Exception as e:
                log.warning("scheduler extender prioritize: %s (no preference given)", _message(e))
                return encode([])
        return encode({"Error": f"pyctl: unknown extender verb {verb!r}"})


def _message(e: Exception) -> str:
    return str(e) if isinstance(e, ExtenderInputError) else f"{type(e).__name__}: {e}"
