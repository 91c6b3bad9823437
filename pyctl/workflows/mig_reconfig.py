"""The MIG reconfiguration workflow: one node re-partitioned by the GPU Operator's mig-manager,
driven through its label protocol (`shared/docs/mig.md` §c, `docs/mig-reconfiguration.md`).

Steps (each an engine handler, persisted by the engine after it returns; each idempotent):

``acquiring``     the MIG concurrency slot, buckets, node cooldown and disruption budget in one
                  request (`SafetyLimits.mig_reconfiguration`); remembers the node's current
                  `nvidia.com/mig.config` (the rollback target) and checks that the published
                  mig-parted config holds it. Nothing on the node is touched yet.
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

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.core.mig import (
    MIG_CONFIG_LABEL,
    NodePlan,
    config_name,
    mig_parted_entries,
    parse_mig_parted,
    to_yaml,
)
from pyctl.state.ratelimit import Slot
from pyctl.workflows.base import Context, Handler, Workflow, WorkflowKind
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
) -> Workflow:
    """The workflow that applies one node's plan. `pods`: the controller's pods by key (for the
    uids of the pods to move: a recreated pod with the same name is never evicted)."""
    entries = mig_parted_entries(plan.plan)
    name = config_name(entries)
    move: list[list[str]] = []
    for g in plan.plan["gpus"]:
        if not g.get("changed"):
            continue
        for key in g.get("pods_to_move") or []:
            ns, _, pod = str(key).partition("/")
            rec = pods.get(key)
            move.append([ns, pod, rec.uid if rec is not None else ""])
    return Workflow(
        id=workflow_id or f"{KIND}-{plan.node}-{name}",
        kind=KIND,
        node=plan.node,
        step="acquiring",
        created=now,
        updated=now,
        data={
            "config": name,
            "entries": json.dumps(entries, sort_keys=True),
            "expected": json.dumps(expected_capacity(entries), sort_keys=True),
            "pods": json.dumps(move),
            "evicted": "[]",
            "gpu_model": plan.gpu_model,
        },
    )


# ---- helpers -------------------------------------------------------------------------------------


def _set(wf: Workflow, step: str | None = None, **data: str) -> Workflow:
    new_data = {**wf.data, **data}
    return msgspec.structs.replace(
        wf, step=step or wf.step, data=new_data, attempts=0 if step else wf.attempts
    )


def _later(wf: Workflow, ctx: Context, seconds: float, why: str = "") -> Workflow:
    return msgspec.structs.replace(wf, not_before=ctx.clock() + seconds, result=why or wf.result)


def _finish_to(wf: Workflow, outcome: str, reason: str) -> Workflow:
    """Go to `restoring`, to end with `outcome`."""
    return _set(wf, "restoring", outcome=outcome, reason=reason)


def _mig(node: NodeRecord) -> dict[str, int]:
    return {p: n for p, n in sorted(node.mig) if n}


def _pod_present(p: PodRecord | None, uid: str, node: str) -> bool:
    return p is not None and (not uid or p.uid == uid) and p.node == node and not p.terminated


async def _event(ctx: MigContext, wf: Workflow, message: str, warning: bool = False) -> None:
    """A Node Event (type Warning for failures)."""
    reason = f"{REASON}Failed" if warning else REASON
    await ctx.gate.event("Node", "", wf.node, reason, message, warning=warning)


def _not_done(r: GateResult) -> str | None:
    """Why a mutation through the gate did not happen (None: it did)."""
    return None if r.done else (r.reason or r.outcome)


def _metrics(ctx: MigContext) -> Any:
    return ctx.gate.metrics.workflow


def _slot(ctx: MigContext, wf: Workflow) -> Slot:
    lim = ctx.gate.limits
    return Slot(SLOT, wf.id, lim.mig_concurrency, lim.mig_slot_ttl_seconds)


# ---- steps ---------------------------------------------------------------------------------------


async def _acquiring(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _set(wf, "abandoned", reason="node gone")
    if gate.mode != "enforce":
        log.info(
            "would reconfigure MIG (observe mode)",
            extra={"node": wf.node, "config": wf.data["config"]},
        )
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    previous = node.mig_config
    if not previous:
        # deleting the label makes the GPU Operator set all-disabled: never a rollback target
        return _set(wf, "abandoned", reason="node has no nvidia.com/mig.config to roll back to")
    if previous == wf.data["config"]:
        return _set(wf, "abandoned", reason="config already selected")
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
    evictions = len(json.loads(wf.data["pods"]))
    decision = await gate.acquire(gate.limits.mig_reconfiguration(wf.node, wf.id, evictions))
    if not decision.allowed:
        return _later(wf, ctx, max(limit_wait(decision), 1.0), f"limit {decision.limit} binds")
    _metrics(ctx).mig_in_progress.labels(gate.cluster, wf.node).set(1)
    return _set(
        wf,
        "isolating",
        previous=previous,
        was_unschedulable="1" if node.unschedulable else "",
        capacity_before=json.dumps(_mig(node), sort_keys=True),
    )


async def _isolating(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    if opt.isolate == "cordon":
        r = await gate.cordon(wf.node, True) if not wf.data.get("was_unschedulable") else None
    else:
        r = await gate.taint(wf.node, TAINT_KEY, on=True)
    if r is not None and (why := _not_done(r)):
        return _later(wf, ctx, opt.poll, why)
    n = len(json.loads(wf.data["pods"]))
    await _event(
        ctx,
        wf,
        f"re-partitioning MIG GPUs: nvidia.com/mig.config {wf.data['previous']} -> "
        f"{wf.data['config']}; {n} pod(s) to evict",
    )
    return _set(wf, "evicting", drain_deadline=str(ctx.clock() + opt.drain_timeout))


async def _evicting(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    now = ctx.clock()
    evicted: list[str] = json.loads(wf.data.get("evicted", "[]"))
    remaining = []
    for ns, name, uid in json.loads(wf.data["pods"]):
        key = f"{ns}/{name}"
        p = ctx.pod(ns, name)
        if not _pod_present(p, uid, wf.node):
            continue
        remaining.append(key)
        if key in evicted or (p is not None and p.deleting):
            continue  # asked once: never again; wait for it to go
        if now > float(wf.data["drain_deadline"]):
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
        return _set(wf, evicted=json.dumps([*evicted, key]))
    if not remaining:
        return _set(wf, "publishing")
    if now > float(wf.data["drain_deadline"]):
        return _finish_to(wf, FAILED, f"drain timed out: {', '.join(sorted(remaining))} remain")
    return _later(wf, ctx, opt.poll, f"waiting for {len(remaining)} pod(s) to go")


def _configs(data: Mapping[str, str] | None, opt: MigOptions) -> dict[str, Any]:
    text = (data or {}).get(opt.configmap_key)
    return dict(parse_mig_parted(text)) if text else {}


async def _publishing(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    if not gate.still_leader():
        return _later(wf, ctx, opt.poll, "not the leader")
    name, entries = wf.data["config"], json.loads(wf.data["entries"])
    data = await gate.read_configmap(opt.configmap_namespace, opt.configmap_name)
    configs = _configs(data, opt)
    if wf.data["previous"] not in configs:
        return _finish_to(wf, FAILED, f"rollback target {wf.data['previous']!r} not published")
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
        state_before=wf.data.get("state_before", state_before),
        deadline=wf.data.get("deadline", str(ctx.clock() + opt.apply_timeout)),
    )


async def _waiting(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _finish_to(wf, FAILED, "node gone")
    await gate.renew_slot(_slot(ctx, wf))
    name = wf.data["config"]
    if node.mig_config == name:
        state = node.mig_config_state
        seen = wf.data.get("seen_pending") == "1"
        if state == "pending" and not seen:
            return _later(_set(wf, seen_pending="1"), ctx, opt.poll, "mig-manager pending")
        expected = json.loads(wf.data["expected"])
        # a stale `success` of the previous config shows the previous capacity
        fresh = seen or json.loads(wf.data.get("capacity_before", "{}")) != expected
        if state == "success" and _mig(node) == expected and fresh:
            return _finish_to(wf, SUCCEEDED, f"config {name} applied")
        if state == "failed" and (seen or wf.data.get("state_before") != "failed"):
            return _set(wf, "rolling-back", outcome=ROLLED_BACK, reason="mig-manager: failed")
    if ctx.clock() > float(wf.data["deadline"]):
        why = f"no success within {opt.apply_timeout:.0f} s (state {node.mig_config_state!r})"
        return _set(wf, "rolling-back", outcome=ROLLED_BACK, reason=why)
    return _later(wf, ctx, opt.poll, f"waiting for mig-manager ({node.mig_config_state})")


async def _rolling_back(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    if ctx.node(wf.node) is not None:
        r = await gate.label(wf.node, {MIG_CONFIG_LABEL: wf.data["previous"]})
        if why := _not_done(r):
            return _later(wf, ctx, opt.poll, why)
        await _event(
            ctx,
            wf,
            f"MIG reconfiguration to {wf.data['config']} failed ({wf.data.get('reason', '')}); "
            f"nvidia.com/mig.config rolled back to {wf.data['previous']}",
            warning=True,
        )
        node = ctx.node(wf.node)
        return _set(
            wf,
            "confirming-rollback",
            rollback_state_before=wf.data.get(
                "rollback_state_before", node.mig_config_state if node is not None else ""
            ),
            rollback_deadline=wf.data.get(
                "rollback_deadline", str(ctx.clock() + opt.apply_timeout)
            ),
        )
    return _set(wf, "restoring")


async def _confirming_rollback(ctx: MigContext, wf: Workflow) -> Workflow:
    opt = ctx.options
    node = ctx.node(wf.node)
    if node is None:
        return _set(wf, "restoring")
    await ctx.gate.renew_slot(_slot(ctx, wf))
    previous = wf.data["previous"]
    if node.mig_config == previous:
        state = node.mig_config_state
        seen = wf.data.get("rollback_seen_pending") == "1"
        if state == "pending" and not seen:
            wf = _set(wf, rollback_seen_pending="1")
            return _later(wf, ctx, opt.poll, "mig-manager re-applying the previous config")
        # the capacity the node had before: the previous layout is back (or never left)
        if state == "success" and _mig(node) == json.loads(wf.data.get("capacity_before", "{}")):
            return _set(wf, "restoring")
        # a `failed` left over from the forward attempt is not the rollback's
        if state == "failed" and (seen or wf.data.get("rollback_state_before") != "failed"):
            why = f"{wf.data.get('reason', '')}; rollback to {previous} failed too (mig-manager)"
            return _set(wf, "restoring", outcome=FAILED, reason=why)
    if ctx.clock() > float(wf.data["rollback_deadline"]):
        why = (
            f"{wf.data.get('reason', '')}; rollback to {previous} not confirmed within "
            f"{opt.apply_timeout:.0f} s (state {node.mig_config_state!r})"
        )
        return _set(wf, "restoring", outcome=FAILED, reason=why)
    return _later(wf, ctx, opt.poll, f"waiting for the rollback ({node.mig_config_state})")


async def _restoring(ctx: MigContext, wf: Workflow) -> Workflow:
    gate, opt = ctx.gate, ctx.options
    if ctx.node(wf.node) is not None:
        if opt.isolate == "cordon":
            r = await gate.cordon(wf.node, False) if not wf.data.get("was_unschedulable") else None
        else:
            r = await gate.taint(wf.node, TAINT_KEY, on=False)
        if r is not None and (why := _not_done(r)):
            return _later(wf, ctx, opt.poll, why)
    await gate.release_slot(SLOT, wf.id)
    outcome = wf.data.get("outcome", FAILED)
    reason = wf.data.get("reason", "")
    m = _metrics(ctx)
    m.mig_reconfigurations.labels(gate.cluster, wf.node, outcome).inc()
    m.mig_in_progress.labels(gate.cluster, wf.node).set(0)
    if outcome == SUCCEEDED:
        await _event(ctx, wf, f"MIG re-partitioned ({wf.data['config']}); node schedulable again")
    else:
        await _event(ctx, wf, f"MIG reconfiguration {outcome}: {reason}", warning=True)
    step = "done" if outcome == SUCCEEDED else "failed"
    return msgspec.structs.replace(_set(wf, step), result=f"{outcome}: {reason}")


_STEPS: dict[str, Callable[[MigContext, Workflow], Awaitable[Workflow]]] = {
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


def _give_up(wf: Workflow, error: str) -> Workflow:
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


def _handler(step: str) -> Handler:
    fn = _STEPS[step]

    async def run(ctx: Context, wf: Workflow) -> Workflow:
        if not isinstance(ctx, MigContext):
            if step in ISOLATED_STEPS or step == "restoring":
                # keep it for an engine that can restore the node
                return msgspec.structs.replace(
                    wf, not_before=ctx.clock() + 30.0, result="needs a MigContext"
                )
            return msgspec.structs.replace(wf, step="abandoned", result="needs a MigContext")
        return await fn(ctx, wf)

    return run


def workflow_kind(max_errors: int = 10) -> WorkflowKind:
    """MIG reconfiguration: its steps; a step that keeps failing goes where `_give_up` says
    (never past restoring, never leaving the node tainted)."""
    return WorkflowKind(
        KIND, {step: _handler(step) for step in _STEPS}, give_up=_give_up, max_errors=max_errors
    )
