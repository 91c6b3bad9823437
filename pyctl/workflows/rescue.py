"""The rescue workflow: room made on one node for one pending pod, by several evictions, as one
plan (the planner's rescue, `pyctl.core.policy`).

Steps (each an engine handler, persisted after it returns; each idempotent):

``isolating``  pyctl's taint `pyctl.io/rescue=<pending pod uid>:NoSchedule` on the node, so that
               the evicted pods' replacements (and anything else) do not land there again.
``evicting``   the planned pods, one per advance, through the gate (rate limits, the Lease, the
               evictor's rules re-checked on the live pod, the uid as a precondition). A
               PodDisruptionBudget's 429 waits and retries, so pods of one budget go one after
               the other as their replacements become ready; then it waits until they are gone.
``waiting``    the taint removed; until the pending pod is bound. Meanwhile the scheduler
               extender keeps every other pod off the node (`reservations`), so the freed room
               goes to the pod it was made for.
``releasing``  the taint removed (if still there), the outcome counted and announced; then
               ``done`` or ``abandoned`` (the outcome and why in the result).

The plan stops making sense, and the workflow goes to ``releasing``, when the pending pod is
gone or bound elsewhere; when a planned pod cannot be evicted (protected, denied by admission);
or at the deadline. The outcomes (`OUTCOMES`): ``done``, the pod runs on the node;
``bound_elsewhere``, the scheduler found it room on another node first (a node freed by a
departure, or by another rescue: the default scheduler does not keep freed room for the pod it
was made for, pyctl's scheduler profile does); ``withdrawn``, the pod was deleted;
``abandoned``, the room could not be made (an eviction refused for good, or the deadline). The
first three end the workflow ``done``: nothing failed; only the last is a workflow abandoned
(its metric and alert). Every path from ``isolating`` ends in ``releasing``, so a controller
killed anywhere never leaves the node tainted (and the compactor also clears a
rescue taint no workflow owns).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Final, TypeAlias

import msgspec

from pyctl.cluster.bounds import MAX_ITEMS, MAX_TEXT_CHARS, Name, Text
from pyctl.cluster.records import PodRecord
from pyctl.workflows.base import (
    Context,
    Namespace,
    PodKey,
    Uid,
    Workflow,
    WorkflowData,
    WorkflowKind,
)

log = logging.getLogger("pyctl.rescue")

KIND: Final = "rescue"
TAINT_KEY: Final = "pyctl.io/rescue"
REASON: Final = "PyctlRescue"
STEPS: Final = ("isolating", "evicting", "waiting", "releasing")
#: steps that may leave the node tainted (releasing is owed)
ISOLATED: Final = ("isolating", "evicting", "waiting")
#: how a rescue ends (`pyctl_rescues_total{outcome}`): the pod runs on the node; it was bound
#: to another node first; it was deleted; the room could not be made
DONE: Final = "done"
BOUND_ELSEWHERE: Final = "bound_elsewhere"
WITHDRAWN: Final = "withdrawn"
ABANDONED: Final = "abandoned"
OUTCOMES: Final = (DONE, BOUND_ELSEWHERE, WITHDRAWN, ABANDONED)
#: the outcomes in which nothing failed: the workflow ends ``done``
SETTLED: Final = (DONE, BOUND_ELSEWHERE, WITHDRAWN)


class PlannedEviction(msgspec.Struct, frozen=True, array_like=True):
    """One pod a rescue evicts (stored as an array)."""

    namespace: Namespace
    name: Name
    uid: Uid
    #: "kind/name" of its owner
    workload: Text
    #: where the plan expects its replacement to land
    to: Name

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class RescueData(WorkflowData, frozen=True, tag=f"{KIND}/1"):
    """A rescue's data: the pending pod it makes room for, the pods it evicts, and how far it
    got."""

    namespace: Namespace
    pod: Name
    uid: Uid
    pods: Annotated[tuple[PlannedEviction, ...], msgspec.Meta(max_length=MAX_ITEMS)]
    #: from the start to the pending pod bound (wall-clock seconds)
    deadline: float
    #: the pods asked to leave ("namespace/name"; never asked twice)
    evicted: Annotated[tuple[PodKey, ...], msgspec.Meta(max_length=MAX_ITEMS)] = ()
    #: the taint is removed (the waiting step removes it once)
    untainted: bool = False
    #: one of `OUTCOMES`, and why, once it is releasing
    outcome: Text = ""
    reason: Text = ""
    #: the pod whose eviction was refused for good (the next plans leave it where it is)
    refused: PodKey = ""

    def named(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.namespace and self.pod else ""

    def moves(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.pods)


@dataclass(frozen=True)
class RescueOptions:
    #: from the start to the pending pod bound, seconds (evictions wait on budgets meanwhile)
    deadline: float = 900.0
    #: how often a waiting step looks again
    poll: float = 2.0
    #: seconds a pod must have existed before a rescue evicts for it (0: at once): room that
    #: departures free within that time costs no eviction (cluster-autoscaler's
    #: `--new-pod-scale-up-delay` for scale-ups)
    after: float = 0.0


@dataclass
class CompactionContext(Context):
    """The context of the compaction engine (compaction and rescue workflows)."""

    rescue: RescueOptions = field(default_factory=RescueOptions)


def workflow_for(
    pending: PodRecord,
    node: str,
    moves: Iterable[tuple[PodRecord, str]],
    now: float,
    options: RescueOptions | None = None,
) -> Workflow[RescueData]:
    """The workflow that frees `node` for `pending` by evicting `moves` (pod, expected
    destination) in order."""
    opt = options or RescueOptions()
    moves = list(moves)
    # one record per pending pod and set of evictions: the same rescue is not started again
    # while the record of an earlier attempt is kept, another one (e.g. without a pod whose
    # eviction was refused) may be
    plan = hashlib.sha256(
        json.dumps(sorted([node, *(f"{p.key}/{p.uid}" for p, _ in moves)])).encode()
    ).hexdigest()[:10]
    return Workflow(
        id=f"{KIND}-{pending.uid or pending.key}-{plan}",
        kind=KIND,
        node=node,
        step="isolating",
        created=now,
        updated=now,
        data=RescueData(
            namespace=pending.namespace,
            pod=pending.name,
            uid=pending.uid,
            pods=tuple(
                PlannedEviction(p.namespace, p.name, p.uid, f"{p.owner_kind}/{p.owner_name}", to)
                for p, to in moves
            ),
            deadline=now + opt.deadline,
        ),
    )


RescueWorkflow: TypeAlias = Workflow[RescueData]


def _set(wf: RescueWorkflow, step: str | None = None, **data: object) -> RescueWorkflow:
    """The workflow at `step` (None: the same), its data's fields `data` changed."""
    return msgspec.structs.replace(
        wf,
        step=step or wf.step,
        data=msgspec.structs.replace(wf.data, **data),
        attempts=0 if step else wf.attempts,
    )


def _later(wf: RescueWorkflow, ctx: Context, seconds: float, why: str) -> RescueWorkflow:
    return msgspec.structs.replace(wf, not_before=ctx.clock() + seconds, result=why)


def _release(wf: RescueWorkflow, outcome: str, why: str) -> RescueWorkflow:
    return _set(wf, "releasing", outcome=outcome, reason=why[:MAX_TEXT_CHARS])


def _pending(ctx: Context, wf: RescueWorkflow) -> tuple[PodRecord | None, str, str]:
    """The pending pod, or the outcome and why the rescue no longer makes sense."""
    p = ctx.pod(wf.data.namespace, wf.data.pod)
    uid = wf.data.uid
    if p is None or (uid and p.uid != uid) or p.terminated or p.deleting:
        return None, WITHDRAWN, "the pending pod is gone"
    if p.node and p.node != wf.node:
        return None, BOUND_ELSEWHERE, f"the pending pod was bound to {p.node}"
    return p, "", ""


def _options(ctx: Context) -> RescueOptions:
    return ctx.rescue if isinstance(ctx, CompactionContext) else RescueOptions()


async def _isolating(ctx: Context, wf: RescueWorkflow) -> RescueWorkflow:
    p, outcome, why = _pending(ctx, wf)
    if p is None:
        return _release(wf, outcome, why)
    if p.node == wf.node:
        return _release(wf, DONE, "the pending pod is already there")
    r = await ctx.gate.taint(wf.node, TAINT_KEY, on=True, value=wf.data.uid)
    if r.outcome == "dry-run":
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    if not r.done:
        return _later(wf, ctx, _options(ctx).poll, r.reason or r.outcome)
    n = len(wf.data.pods)
    # no evictions: a hold of room the pod fits in now, while a gate keeps it back
    what = (
        f"making room for this pod on {wf.node}: {n} eviction(s)"
        if n
        else (
            f"keeping {wf.node} for this pod (it fits there now; its scheduling gate holds it back)"
        )
    )
    await ctx.gate.event(
        "Pod", wf.data.namespace, wf.data.pod, REASON, f"pyctl is {what}", uid=wf.data.uid
    )
    return _set(wf, "evicting")


async def _evicting(ctx: Context, wf: RescueWorkflow) -> RescueWorkflow:
    p, outcome, why = _pending(ctx, wf)
    if p is None:
        return _release(wf, outcome, why)
    if ctx.clock() > wf.data.deadline:
        return _release(wf, ABANDONED, "deadline passed while evicting")
    evicted = wf.data.evicted
    remaining = 0
    for planned in wf.data.pods:
        key, uid = planned.key, planned.uid
        pod = ctx.pod(planned.namespace, planned.name)
        present = (
            pod is not None
            and (not uid or pod.uid == uid)
            and pod.node == wf.node
            and not pod.terminated
        )
        if not present:
            continue
        remaining += 1
        assert pod is not None
        if key in evicted or pod.deleting:
            continue  # asked once: never again; wait for it to go
        r = await ctx.gate.evict(
            pod,
            wf.node,
            workload=planned.workload,
            reason=REASON,
            message=f"evicted from {wf.node} to make room for "
            f"{wf.data.namespace}/{wf.data.pod} (expected to land on {planned.to})",
        )
        if r.outcome == "dry-run":
            return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
        if r.done:
            # one eviction per advance, persisted before the next
            return _set(wf, evicted=(*evicted, key))
        if not r.retriable:
            # kept with the record: the next plans leave this pod where it is (`refused`)
            return _release(_set(wf, refused=key), ABANDONED, f"cannot evict {key}: {r.reason}")
        return _later(wf, ctx, max(r.retry_after, 1.0), f"{r.reason}: waiting")
    if remaining == 0:
        return _set(wf, "waiting")
    return _later(wf, ctx, _options(ctx).poll, f"waiting for {remaining} pod(s) to go")


async def _waiting(ctx: Context, wf: RescueWorkflow) -> RescueWorkflow:
    p, outcome, why = _pending(ctx, wf)
    if p is None:
        return _release(wf, outcome, why)
    if p.node == wf.node:
        return _release(wf, DONE, f"{p.key} runs on {wf.node}")
    if not wf.data.untainted:
        r = await ctx.gate.taint(wf.node, TAINT_KEY, on=False)
        if not r.done:
            return _later(wf, ctx, _options(ctx).poll, r.reason or r.outcome)
        wf = _set(wf, untainted=True)
    if ctx.clock() > wf.data.deadline:
        return _release(wf, ABANDONED, "the pending pod was not bound before the deadline")
    return _later(wf, ctx, _options(ctx).poll, "waiting for the scheduler to bind the pod")


async def _releasing(ctx: Context, wf: RescueWorkflow) -> RescueWorkflow:
    if not wf.data.untainted:
        r = await ctx.gate.taint(wf.node, TAINT_KEY, on=False)
        if not r.done:
            return _later(wf, ctx, _options(ctx).poll, r.reason or r.outcome)
    outcome = wf.data.outcome if wf.data.outcome in OUTCOMES else ABANDONED
    reason = wf.data.reason
    gate = ctx.gate
    gate.metrics.workflow.rescues.labels(gate.cluster, outcome).inc()
    settled = outcome in SETTLED
    await gate.event(
        "Pod",
        wf.data.namespace,
        wf.data.pod,
        REASON if outcome == DONE else f"{REASON}Ended" if settled else f"{REASON}Abandoned",
        f"rescue on {wf.node}: {reason}",
        uid=wf.data.uid,
        warning=not settled,
    )
    step = "done" if settled else "abandoned"
    return msgspec.structs.replace(_set(wf, step), result=f"{outcome}: {reason}")


def _give_up(wf: RescueWorkflow, error: str) -> RescueWorkflow:
    """After too many failed attempts: release the node (never leave it tainted)."""
    if wf.step == "releasing":
        return wf  # keep trying to remove the taint
    return _release(wf, ABANDONED, error)


def workflow_kind(max_errors: int = 10) -> WorkflowKind[RescueData]:
    return WorkflowKind(
        KIND,
        RescueData,
        {
            "isolating": _isolating,
            "evicting": _evicting,
            "waiting": _waiting,
            "releasing": _releasing,
        },
        give_up=_give_up,
        max_errors=max_errors,
    )


def reservations(workflows: Iterable[Workflow[WorkflowData]]) -> Mapping[str, str]:
    """Nodes whose room is promised to a pending pod (node -> "namespace/name"): the active
    rescues' nodes. The scheduler extender keeps every other pod off them."""
    return {
        wf.node: f"{wf.data.namespace}/{wf.data.pod}"
        for wf in workflows
        if isinstance(wf.data, RescueData) and wf.step in ISOLATED
    }
