"""The MIG reconfiguration workflow: one node re-partitioned by the GPU Operator's mig-manager,
driven through its label protocol (`shared/docs/mig.md` §c, `docs/mig-reconfiguration.md`).

Steps (each an engine handler, persisted by the engine after it returns; each idempotent):

``acquiring``     the MIG concurrency slot, buckets, node cooldown and disruption budget in one
                  request (`SafetyLimits.mig_reconfiguration`); remembers the node's current
                  `nvidia.com/mig.config` (the rollback target) and checks that the published
                  mig-parted config holds it. Nothing on the node is touched yet; past
                  `acquire_timeout` from its start, the workflow is abandoned.
``isolating``     the `pyctl.io/mig-reconfiguration:NoSchedule` taint (or a cordon).
``evicting``      the pods on the GPUs that change, through the Eviction API, one per advance
                  (so a crash never repeats one); a 429 waits; then waits until they are gone.
``publishing``    merges the new config into the mig-parted ConfigMap and sets
                  `nvidia.com/mig.config` to its content-derived name.
``waiting``       until `nvidia.com/mig.config.state=success` (and the node reports the new
                  `nvidia.com/mig-*` capacity), or `failed`, or the deadline.
``rolling-back``  the label back to the previous config name.
``confirming-rollback``  until mig-manager reports the previous config applied again
                  (`success` with the capacity the node had before), so the node is not made
                  schedulable while its GPUs change; `failed` or the deadline restore it anyway,
                  with outcome failed.
``restoring``     the taint removed (or the node uncordoned, unless it was cordoned before), the
                  slot released, the result counted and announced; then ``done`` (succeeded) or
                  ``failed`` (failed, rolled_back).

Every path from ``isolating`` on ends in ``restoring``: a controller killed anywhere resumes from
the last persisted step and restores the node. Only the Lease holder acts: every mutation checks
`gate.still_leader()` right before it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, TypeAlias

import msgspec

from pyctl.cluster.bounds import (
    MAX_ITEMS,
    MAX_MIG_PER_NODE,
    MAX_MIG_PROFILES,
    MAX_TEXT_CHARS,
    Key,
    Name,
    Text,
)
from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.core.mig import (
    MIG_CONFIG_LABEL,
    NodePlan,
    config_name,
    mig_parted_entries,
    parse_mig_parted,
    to_yaml,
)
from pyctl.jsontypes import JsonObject
from pyctl.metrics import WorkflowMetrics
from pyctl.state.ratelimit import Slot
from pyctl.workflows.base import (
    Context,
    Handler,
    Namespace,
    PodKey,
    Uid,
    Workflow,
    WorkflowData,
    WorkflowKind,
)
from pyctl.workflows.gate import GateResult, limit_wait

log = logging.getLogger("pyctl.mig_reconfig")

KIND: Final = "mig-reconfigure"
TAINT_KEY: Final = "pyctl.io/mig-reconfiguration"
REASON: Final = "PyctlMigReconfiguration"
SLOT: Final = "mig-reconfiguration"
#: results counted in pyctl_mig_reconfigurations_total
SUCCEEDED, FAILED, ROLLED_BACK = "succeeded", "failed", "rolled_back"
#: steps after which the node may carry the taint/cordon (restoring is owed)
ISOLATED_STEPS: Final = (
    "isolating",
    "evicting",
    "publishing",
    "waiting",
    "rolling-back",
    "confirming-rollback",
)


#: `nvidia.com/mig-<profile>` counts of a node (profile -> instances)
MigCounts: TypeAlias = Annotated[
    dict[Key, Annotated[int, msgspec.Meta(ge=0, le=MAX_MIG_PER_NODE)]],
    msgspec.Meta(max_length=MAX_MIG_PROFILES),
]


class MigEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One mig-parted v1 entry of a config pyctl publishes (`core.mig.mig_parted_entries`): the
    GPUs it applies to, and their profile counts (its fields in the order of the JSON sorted by
    key, as mig-parted's file shows them)."""

    devices: Annotated[tuple[int, ...], msgspec.Meta(max_length=MAX_ITEMS)]
    mig_devices: MigCounts = msgspec.field(name="mig-devices", default_factory=dict)
    mig_enabled: bool = msgspec.field(name="mig-enabled", default=False)

    def to_config(self) -> JsonObject:
        """The entry as mig-parted's file holds it."""
        return {
            "devices": list(self.devices),
            "mig-devices": dict(self.mig_devices),
            "mig-enabled": self.mig_enabled,
        }


class MigPod(msgspec.Struct, frozen=True, array_like=True):
    """A pod on a GPU that changes (stored as an array)."""

    namespace: Namespace
    name: Name
    #: its uid when the plan was made ("" if unknown: then any pod of that name)
    uid: Uid

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class MigData(WorkflowData, frozen=True, tag=f"{KIND}/1"):
    """A MIG reconfiguration's data: the config to apply, the pods to move first, and what each
    step found (times in wall-clock seconds; a value set once stays on a retried step)."""

    #: the config's name (`nvidia.com/mig.config`) and its entries
    config: Text
    entries: Annotated[tuple[MigEntry, ...], msgspec.Meta(max_length=MAX_ITEMS)]
    #: the node's `nvidia.com/mig-*` capacity once applied
    expected: MigCounts
    pods: Annotated[tuple[MigPod, ...], msgspec.Meta(max_length=MAX_ITEMS)] = ()
    #: the pods asked to leave ("namespace/name"; never asked twice)
    evicted: Annotated[tuple[PodKey, ...], msgspec.Meta(max_length=MAX_ITEMS)] = ()
    gpu_model: Text = ""
    #: acquiring: the config to roll back to, whether the node was cordoned, its capacity
    previous: Text = ""
    was_unschedulable: bool = False
    capacity_before: MigCounts = msgspec.field(default_factory=dict)
    #: isolating: when the pods must be gone
    drain_deadline: float = 0.0
    #: publishing: mig-manager's state before the label changed, and the deadline of waiting
    state_before: Text | None = None
    deadline: float | None = None
    #: waiting: mig-manager was seen `pending` for this config
    seen_pending: bool = False
    #: rolling back: the same for the previous config
    rollback_state_before: Text | None = None
    rollback_deadline: float | None = None
    rollback_seen_pending: bool = False
    #: the result once restoring (succeeded, failed, rolled_back; "": failed) and why
    outcome: Text = ""
    reason: Text = ""

    def moves(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.pods)


MigWorkflow: TypeAlias = Workflow[MigData]


#: at most this long between two looks of a workflow waiting for its limits in `acquiring`
ACQUIRE_RECHECK: Final = 30.0


@dataclass(frozen=True)
class MigOptions:
    """MIG reconfiguration: where mig-manager reads its config, how long each step may take,
    how nodes are isolated, and what the MIG loop may start (`pyctl.workflows.mig_loop`)."""

    #: the mig-parted config file mig-manager reads: a ConfigMap named in the ClusterPolicy
    #: (`spec.migManager.config.name`), key `config.yaml`
    configmap_namespace: str = "gpu-operator"
    configmap_name: str = "pyctl-mig-parted-config"
    configmap_key: str = "config.yaml"
    #: from the label set to `success` (mig-manager documents no figure; expect minutes)
    apply_timeout: float = 900.0
    #: from the taint to every evicted pod gone
    drain_timeout: float = 900.0
    #: from the workflow's start: how long `acquiring` may wait for its limits (the MIG slot, the
    #: buckets, the node's cool-down, the disruption budget) or for mig-manager to be idle before
    #: the workflow is abandoned (nothing on the node was touched yet; the MIG loop starts it
    #: again while the demand is still there). One reconfiguration at a time may take
    #: `drain_timeout` + `apply_timeout`: those queued behind it wait that long each, so the
    #: default leaves room for a queue of two; a workflow whose demand is gone ends at once
    #: (`MigContext.demand`)
    acquire_timeout: float = 3600.0
    #: how often a waiting step looks again
    poll: float = 2.0
    #: "taint" (pyctl's own NoSchedule taint) or "cordon"
    isolate: str = "taint"
    #: reconfigurations at once, cluster-wide (a rate-limit slot)
    concurrency: int = 1
    #: used MIG instances one node's plan may destroy (their pods are evicted); 0: only free
    #: slices are re-partitioned
    max_used_destroyed: int = 0
    #: new workflows the loop starts per tick
    max_starts: int = 1
    #: only these nodes are re-partitioned (empty: every MIG node)
    nodes: tuple[str, ...] = ()
    #: seconds after a node's reconfiguration ended before the loop plans that node again (a
    #: failed one is not retried at once, a served one is not re-partitioned back and forth);
    #: the engine keeps finished records at least this long
    node_holdoff_seconds: float = 600.0

    def __post_init__(self) -> None:
        if self.isolate not in ("taint", "cordon"):
            raise ValueError(f"mig isolate must be taint or cordon, got {self.isolate!r}")


@dataclass
class MigContext(Context):
    """The engine context of MIG workflows: the node as the controller's cache sees it now."""

    node: Callable[[str], NodeRecord | None] = lambda name: None
    options: MigOptions = field(default_factory=MigOptions)
    #: the MIG profiles pending pods ask for now (the MIG loop's demand, `pending_demand`); None:
    #: not known (a workflow waiting to start then only ends at `acquire_timeout`)
    demand: Callable[[], Mapping[str, int]] | None = None


# ---- starting one --------------------------------------------------------------------------------


def expected_capacity(entries: Iterable[Mapping[str, Any]], gpus: int = 1) -> dict[str, int]:
    """The node's `nvidia.com/mig-<profile>` counts once `entries` are applied (`devices: all`
    counts `gpus` times)."""
    out: dict[str, int] = {}
    for e in entries:
        if not e.get("mig-enabled"):
            continue
        dev = e.get("devices")
        n = gpus if dev == "all" else len(dev or [])
        for prof, count in (e.get("mig-devices") or {}).items():
            out[prof] = out.get(prof, 0) + int(count) * n
    return {k: v for k, v in sorted(out.items()) if v}


def workflow_for(
    plan: NodePlan, pods: Mapping[str, PodRecord], now: float, *, workflow_id: str = ""
) -> MigWorkflow:
    """The workflow that applies one node's plan. `pods`: the controller's pods by key (for the
    uids of the pods to move: a recreated pod with the same name is never evicted)."""
    entries = mig_parted_entries(plan.plan)
    name = config_name(entries)
    move: list[MigPod] = []
    for g in plan.plan["gpus"]:
        if not g.get("changed"):
            continue
        for key in g.get("pods_to_move") or []:
            ns, _, pod = str(key).partition("/")
            rec = pods.get(key)
            move.append(MigPod(ns, pod, rec.uid if rec is not None else ""))
    return Workflow(
        id=workflow_id or f"{KIND}-{plan.node}-{name}",
        kind=KIND,
        node=plan.node,
        step="acquiring",
        created=now,
        updated=now,
        data=MigData(
            config=name,
            entries=msgspec.convert(entries, tuple[MigEntry, ...]),
            expected=expected_capacity(entries),
            pods=tuple(move),
            gpu_model=plan.gpu_model,
        ),
    )


# ---- helpers -------------------------------------------------------------------------------------


def _set(wf: MigWorkflow, step: str | None = None, **data: object) -> MigWorkflow:
    """The workflow at `step` (None: the same), its data's fields `data` changed (a reason cut
    to its bound)."""
    if isinstance(reason := data.get("reason"), str):
        data["reason"] = reason[:MAX_TEXT_CHARS]
    return msgspec.structs.replace(
        wf,
        step=step or wf.step,
        data=msgspec.structs.replace(wf.data, **data),
        attempts=0 if step else wf.attempts,
    )


def _demand_gone(ctx: MigContext, wf: MigWorkflow, node: NodeRecord) -> str:
    """Why a workflow that has not started is no longer wanted ("" while it is): none of the
    profiles it would add to the node is asked for by a pending pod any more (they were bound
    elsewhere, deleted, or their owner scaled down)."""
    if ctx.demand is None:
        return ""
    now = dict(node.mig)
    adds = sorted(p for p, n in wf.data.expected.items() if n > now.get(p, 0))
    wanted = ctx.demand()
    if not adds or any(wanted.get(p, 0) > 0 for p in adds):
        return ""
    return f"no pending pod asks for {', '.join(adds)} any more: the demand it served is gone"


def _later(wf: MigWorkflow, ctx: Context, seconds: float, why: str = "") -> MigWorkflow:
    return msgspec.structs.replace(wf, not_before=ctx.clock() + seconds, result=why or wf.result)


def _finish_to(wf: MigWorkflow, outcome: str, reason: str) -> MigWorkflow:
    """Go to `restoring`, to end with `outcome`."""
    return _set(wf, "restoring", outcome=outcome, reason=reason)


def _deadline(at: float | None) -> float:
    """A deadline a step set (one not set, in a record no step wrote it to: passed)."""
    return 0.0 if at is None else at


def _mig(node: NodeRecord) -> dict[str, int]:
    return {p: n for p, n in sorted(node.mig) if n}


def _pod_present(p: PodRecord | None, uid: str, node: str) -> bool:
    return p is not None and (not uid or p.uid == uid) and p.node == node and not p.terminated


async def _event(ctx: MigContext, wf: MigWorkflow, message: str, warning: bool = False) -> None:
    """A Node Event (type Warning for failures)."""
    reason = f"{REASON}Failed" if warning else REASON
    await ctx.gate.event("Node", "", wf.node, reason, message, warning=warning)


def _not_done(r: GateResult) -> str | None:
    """Why a mutation through the gate did not happen (None: it did)."""
    return None if r.done else (r.reason or r.outcome)


def _metrics(ctx: MigContext) -> WorkflowMetrics:
    return ctx.gate.metrics.workflow


def _slot(ctx: MigContext, wf: MigWorkflow) -> Slot:
    lim = ctx.gate.limits
    return Slot(SLOT, wf.id, lim.mig_concurrency, lim.mig_slot_ttl_seconds)


# ---- steps ---------------------------------------------------------------------------------------


async def _acquiring(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _set(wf, "abandoned", reason="node gone")
    if gate.mode != "enforce":
        log.info(
            "would reconfigure MIG (observe mode)",
            extra={"node": wf.node, "config": wf.data.config},
        )
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    previous = node.mig_config
    if not previous:
        # deleting the label makes the GPU Operator set all-disabled: never a rollback target
        return _set(wf, "abandoned", reason="node has no nvidia.com/mig.config to roll back to")
    if previous == wf.data.config:
        return _set(wf, "abandoned", reason="config already selected")
    gone = _demand_gone(ctx, wf, node)
    if gone:
        return _set(wf, "abandoned", reason=gone)
    waited = ctx.clock() - wf.created
    if waited > opt.acquire_timeout:
        limit = f"acquire_timeout {opt.acquire_timeout:g} s"
        why = wf.result or "no answer yet"
        return _set(wf, "abandoned", reason=f"waited {waited:.0f} s ({limit}) to start: {why}")
    if node.mig_config_state == "pending":
        return _later(wf, ctx, opt.poll, "mig-manager busy (state pending)")
    data = await gate.read_configmap(opt.configmap_namespace, opt.configmap_name)
    configs = _configs(data, opt)
    if previous not in configs:
        await _event(
            ctx,
            wf,
            f"MIG reconfiguration not started: config {previous!r} (the rollback target) is not "
            f"in ConfigMap {opt.configmap_namespace}/{opt.configmap_name}",
            warning=True,
        )
        return _set(wf, "abandoned", reason=f"rollback target {previous!r} not published")
    if not gate.still_leader():
        return _later(wf, ctx, opt.poll, "not the leader")
    evictions = len(wf.data.pods)
    decision = await gate.acquire(gate.limits.mig_reconfiguration(wf.node, wf.id, evictions))
    if not decision.allowed:
        # look again when the limit may allow it, at least every ACQUIRE_RECHECK seconds (the
        # demand may be gone meanwhile), and no later than just past acquire_timeout
        left = max(opt.acquire_timeout - waited, 0.0) + opt.poll
        wait = min(max(limit_wait(decision), 1.0), ACQUIRE_RECHECK, left)
        return _later(wf, ctx, wait, f"limit {decision.limit} binds")
    _metrics(ctx).mig_in_progress.labels(gate.cluster, wf.node).set(1)
    return _set(
        wf,
        "isolating",
        previous=previous,
        was_unschedulable=node.unschedulable,
        capacity_before=_mig(node),
    )


async def _isolating(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    if opt.isolate == "cordon":
        r = await gate.cordon(wf.node, True) if not wf.data.was_unschedulable else None
    else:
        r = await gate.taint(wf.node, TAINT_KEY, on=True)
    if r is not None and (why := _not_done(r)):
        return _later(wf, ctx, opt.poll, why)
    n = len(wf.data.pods)
    await _event(
        ctx,
        wf,
        f"re-partitioning MIG GPUs: nvidia.com/mig.config {wf.data.previous} -> "
        f"{wf.data.config}; {n} pod(s) to evict",
    )
    return _set(wf, "evicting", drain_deadline=ctx.clock() + opt.drain_timeout)


async def _evicting(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    now = ctx.clock()
    evicted = wf.data.evicted
    remaining = []
    for pod in wf.data.pods:
        key = pod.key
        p = ctx.pod(pod.namespace, pod.name)
        if not _pod_present(p, pod.uid, wf.node):
            continue
        remaining.append(key)
        if key in evicted or (p is not None and p.deleting):
            continue  # asked once: never again; wait for it to go
        if now > wf.data.drain_deadline:
            break
        assert p is not None  # _pod_present
        # the workflow took its eviction limits up front (acquiring)
        r = await gate.evict(
            p,
            wf.node,
            reason=REASON,
            message=f"evicted: its MIG GPU on {wf.node} is re-partitioned",
            limited=False,
        )
        if r.outcome in ("not-leader", "dry-run"):
            return _later(wf, ctx, opt.poll, r.reason or r.outcome)
        if not r.done:
            if not r.retriable:
                return _finish_to(wf, FAILED, f"cannot evict: {r.reason}")
            return _later(wf, ctx, r.retry_after, f"{r.reason}: waiting")
        # one eviction per advance, persisted before the next
        return _set(wf, evicted=(*evicted, key))
    if not remaining:
        return _set(wf, "publishing")
    if now > wf.data.drain_deadline:
        return _finish_to(wf, FAILED, f"drain timed out: {', '.join(sorted(remaining))} remain")
    return _later(wf, ctx, opt.poll, f"waiting for {len(remaining)} pod(s) to go")


def _configs(data: Mapping[str, str] | None, opt: MigOptions) -> dict[str, list[JsonObject]]:
    text = (data or {}).get(opt.configmap_key)
    return dict(parse_mig_parted(text)) if text else {}


async def _publishing(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    if not gate.still_leader():
        return _later(wf, ctx, opt.poll, "not the leader")
    name, entries = wf.data.config, [e.to_config() for e in wf.data.entries]
    data = await gate.read_configmap(opt.configmap_namespace, opt.configmap_name)
    configs = _configs(data, opt)
    if wf.data.previous not in configs:
        return _finish_to(wf, FAILED, f"rollback target {wf.data.previous!r} not published")
    if configs.get(name) != entries:
        configs[name] = entries
        text = to_yaml({"version": "v1", "mig-configs": configs})
        r = await gate.publish_configmap(
            opt.configmap_namespace, opt.configmap_name, {opt.configmap_key: text}
        )
        if why := _not_done(r):
            return _later(wf, ctx, opt.poll, why)
    node = ctx.node(wf.node)
    if node is None:
        return _finish_to(wf, FAILED, "node gone")
    r = await gate.label(wf.node, {MIG_CONFIG_LABEL: name})
    if why := _not_done(r):
        return _later(wf, ctx, opt.poll, why)
    state_before = "" if node.mig_config == name else node.mig_config_state
    return _set(
        wf,
        "waiting",
        state_before=state_before if wf.data.state_before is None else wf.data.state_before,
        deadline=ctx.clock() + opt.apply_timeout if wf.data.deadline is None else wf.data.deadline,
    )


async def _waiting(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _finish_to(wf, FAILED, "node gone")
    await gate.renew_slot(_slot(ctx, wf))
    name = wf.data.config
    if node.mig_config == name:
        state = node.mig_config_state
        seen = wf.data.seen_pending
        if state == "pending" and not seen:
            return _later(_set(wf, seen_pending=True), ctx, opt.poll, "mig-manager pending")
        expected = wf.data.expected
        # a stale `success` of the previous config shows the previous capacity
        fresh = seen or wf.data.capacity_before != expected
        if state == "success" and _mig(node) == expected and fresh:
            return _finish_to(wf, SUCCEEDED, f"config {name} applied")
        if state == "failed" and (seen or wf.data.state_before != "failed"):
            return _set(wf, "rolling-back", outcome=ROLLED_BACK, reason="mig-manager: failed")
    if ctx.clock() > _deadline(wf.data.deadline):
        why = f"no success within {opt.apply_timeout:.0f} s (state {node.mig_config_state!r})"
        return _set(wf, "rolling-back", outcome=ROLLED_BACK, reason=why)
    return _later(wf, ctx, opt.poll, f"waiting for mig-manager ({node.mig_config_state})")


async def _rolling_back(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    if ctx.node(wf.node) is not None:
        r = await gate.label(wf.node, {MIG_CONFIG_LABEL: wf.data.previous})
        if why := _not_done(r):
            return _later(wf, ctx, opt.poll, why)
        await _event(
            ctx,
            wf,
            f"MIG reconfiguration to {wf.data.config} failed ({wf.data.reason}); "
            f"nvidia.com/mig.config rolled back to {wf.data.previous}",
            warning=True,
        )
        node = ctx.node(wf.node)
        return _set(
            wf,
            "confirming-rollback",
            rollback_state_before=(
                (node.mig_config_state if node is not None else "")
                if wf.data.rollback_state_before is None
                else wf.data.rollback_state_before
            ),
            rollback_deadline=(
                ctx.clock() + opt.apply_timeout
                if wf.data.rollback_deadline is None
                else wf.data.rollback_deadline
            ),
        )
    return _set(wf, "restoring")


async def _confirming_rollback(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    opt = ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _set(wf, "restoring")
    await ctx.gate.renew_slot(_slot(ctx, wf))
    previous = wf.data.previous
    if node.mig_config == previous:
        state = node.mig_config_state
        seen = wf.data.rollback_seen_pending
        if state == "pending" and not seen:
            wf = _set(wf, rollback_seen_pending=True)
            return _later(wf, ctx, opt.poll, "mig-manager re-applying the previous config")
        # the capacity the node had before: the previous layout is back (or never left)
        if state == "success" and _mig(node) == wf.data.capacity_before:
            return _set(wf, "restoring")
        # a `failed` left over from the forward attempt is not the rollback's
        if state == "failed" and (seen or wf.data.rollback_state_before != "failed"):
            why = f"{wf.data.reason}; rollback to {previous} failed too (mig-manager)"
            return _set(wf, "restoring", outcome=FAILED, reason=why)
    if ctx.clock() > _deadline(wf.data.rollback_deadline):
        why = (
            f"{wf.data.reason}; rollback to {previous} not confirmed within "
            f"{opt.apply_timeout:.0f} s (state {node.mig_config_state!r})"
        )
        return _set(wf, "restoring", outcome=FAILED, reason=why)
    return _later(wf, ctx, opt.poll, f"waiting for the rollback ({node.mig_config_state})")


async def _restoring(ctx: MigContext, wf: MigWorkflow) -> MigWorkflow:
    gate, opt = ctx.gate, ctx.options
    if ctx.node(wf.node) is not None:
        if opt.isolate == "cordon":
            r = await gate.cordon(wf.node, False) if not wf.data.was_unschedulable else None
        else:
            r = await gate.taint(wf.node, TAINT_KEY, on=False)
        if r is not None and (why := _not_done(r)):
            return _later(wf, ctx, opt.poll, why)
    await gate.release_slot(SLOT, wf.id)
    outcome = wf.data.outcome or FAILED
    reason = wf.data.reason
    m = _metrics(ctx)
    m.mig_reconfigurations.labels(gate.cluster, wf.node, outcome).inc()
    m.mig_in_progress.labels(gate.cluster, wf.node).set(0)
    if outcome == SUCCEEDED:
        await _event(ctx, wf, f"MIG re-partitioned ({wf.data.config}); node schedulable again")
    else:
        await _event(ctx, wf, f"MIG reconfiguration {outcome}: {reason}", warning=True)
    step = "done" if outcome == SUCCEEDED else "failed"
    return msgspec.structs.replace(_set(wf, step), result=f"{outcome}: {reason}")


_STEPS: dict[str, Callable[[MigContext, MigWorkflow], Awaitable[MigWorkflow]]] = {
    "acquiring": _acquiring,
    "isolating": _isolating,
    "evicting": _evicting,
    "publishing": _publishing,
    "waiting": _waiting,
    "rolling-back": _rolling_back,
    "confirming-rollback": _confirming_rollback,
    "restoring": _restoring,
}


STEPS: Final = tuple(_STEPS)


def _give_up(wf: MigWorkflow, error: str) -> MigWorkflow:
    """Where a step goes after too many errors: never past restoring, never leaving the node
    tainted."""
    if wf.step == "acquiring":
        return _set(wf, "abandoned", reason=error)
    if wf.step in ("isolating", "evicting"):
        return _finish_to(wf, FAILED, error)
    if wf.step in ("publishing", "waiting"):
        return _set(wf, "rolling-back", outcome=ROLLED_BACK, reason=error)
    if wf.step in ("rolling-back", "confirming-rollback"):
        return _set(wf, "restoring")
    return wf  # restoring: keep trying (PyctlMigReconfigurationStuck fires)


def _handler(step: str) -> Handler[MigData]:
    fn = _STEPS[step]

    async def run(ctx: Context, wf: MigWorkflow) -> MigWorkflow:
        if not isinstance(ctx, MigContext):
            if step in ISOLATED_STEPS or step == "restoring":
                # keep it for an engine that can restore the node
                return msgspec.structs.replace(
                    wf, not_before=ctx.clock() + 30.0, result="needs a MigContext"
                )
            return msgspec.structs.replace(wf, step="abandoned", result="needs a MigContext")
        return await fn(ctx, wf)

    return run


def workflow_kind(max_errors: int = 10) -> WorkflowKind[MigData]:
    """MIG reconfiguration: its steps; a step that keeps failing goes where `_give_up` says
    (never past restoring, never leaving the node tainted)."""
    return WorkflowKind(
        KIND,
        MigData,
        {step: _handler(step) for step in _STEPS},
        give_up=_give_up,
        max_errors=max_errors,
    )
