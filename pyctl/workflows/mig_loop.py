"""The MIG loop: decides when to re-partition. From the controller's view, the pending pods that
ask for `nvidia.com/mig-<profile>` and were marked Unschedulable (blocked by the MIG geometry:
the cluster may have the slices, not in that shape) become the MIG planner's demand; each node
plan that serves some of it by changing GPUs becomes a `mig-reconfigure` workflow (at most one
per node at a time; the MIG slot of the rate limits bounds how many run at once). Then the
workflows are advanced through the gate.

It also clears orphaned taints: a node carrying `pyctl.io/mig-reconfiguration` with no workflow
of its own in the store (the store was lost, e.g. an in-memory one with the controller) is made
schedulable again."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import msgspec

from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.controller.cache import ClusterCache
from pyctl.core import mig
from pyctl.metrics import Metrics
from pyctl.model import Node, Snapshot
from pyctl.workflows.engine import Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.loop import (
    MIG_PHASE,
    WORKFLOW_INTERVAL,
    WorkflowGauge,
    collector_paused,
    run_every,
)
from pyctl.workflows.mig_reconfig import KIND, STEPS, TAINT_KEY, MigOptions, workflow_for

log = logging.getLogger("pyctl.mig_loop")


def pending_demand(
    cache: ClusterCache, admit: Callable[[PodRecord], bool] | None = None
) -> Counter[str]:
    """Profile -> count of pending, Unschedulable pods asking for MIG instances (those `admit`
    takes: the workload's scope, and a shape the core can model)."""
    want: Counter[str] = Counter()
    for p in cache.pending_pods():
        if p.unschedulable and p.mig and (admit is None or admit(p)):
            for prof, n in p.mig:
                want[prof] += n
    return want


def has_dra_gpus(node: Node) -> bool:
    """Whether a DRA driver publishes any of the node's GPUs."""
    return any(z.dra_gpus or any(m.dra for m in z.mig) for z in node.zones)


def plan_nodes(
    nodes: Mapping[str, NodeRecord],
    models: Mapping[str, Node],
    demand: Counter[str],
    exclude: Sequence[str] = (),
    options: MigOptions | None = None,
) -> list[mig.NodePlan]:
    """Node plans (mig-parted executor) that serve some of `demand` by changing GPUs, one GPU
    model after another (each model gets the profiles it has; what one serves is taken off).
    `nodes`: the cache's node records; `models`: the reconciler's model of each node (nodes it
    could not model are left out)."""
    opt = options or MigOptions()
    eligible = {
        n.name: n
        for n in nodes.values()
        if n.mig
        and n.gpu_model
        and n.name in models
        and n.name not in exclude
        and (not opt.nodes or n.name in opt.nodes)
        and not n.unschedulable
        and not n.has_taint(TAINT_KEY)
        and n.mig_config_state != "pending"
        # never mig-parted on a node with DRA GPUs: the NVIDIA DRA driver's DynamicMIG destroys
        # MIG devices it did not create, and a node managed both ways is refused (docs/dra.md)
        and not has_dra_gpus(models[n.name])
    }
    left = Counter(demand)
    out: list[mig.NodePlan] = []
    for model_name in sorted({n.gpu_model for n in eligible.values()}):
        try:
            m = mig.model(model_name)
        except ValueError:
            continue
        pending = []
        for prof, count in sorted(left.items()):
            if count <= 0:
                continue
            try:
                pending.append(mig.Pending(mig.profile_name(m.name, prof), count, m.name))
            except ValueError:
                continue
        if not pending:
            continue
        group = [models[n] for n in sorted(eligible) if eligible[n].gpu_model == model_name]
        demand_ = mig.Demand(
            tuple(pending),
            limits=mig.Limits(max_used_destroyed=opt.max_used_destroyed, executor="mig-parted"),
        )
        try:
            plans = mig.plan_snapshot(Snapshot(tuple(group)), demand_)
        except ValueError as e:
            log.warning("MIG loop: planner refused", extra={"error": str(e)})
            continue
        for np_ in plans:
            result = np_.plan
            served = {
                d["profile"]: d["served_after"] - d["served_before"] for d in result["demand"]
            }
            if result["changed_gpus"] and sum(served.values()) > 0:
                out.append(np_)
                for prof, n in served.items():
                    left[prof] -= max(n, 0)
    return out


def round_inputs(
    cache: ClusterCache,
    models: Mapping[str, Node],
    exclude: Sequence[str],
    options: MigOptions,
    admit: Callable[[PodRecord], bool] | None = None,
) -> dict[str, Any]:
    """What one MIG planning round reads from the controller's view, taken at one moment on the
    event loop: the demand (`pending_demand`, `admit` asked on the loop), and copies of the node
    records and models (records and models are immutable, so copying the containers is enough),
    so `plan_nodes` can run in a worker thread while events keep changing the cache."""
    return {
        "nodes": dict(cache.nodes),
        "models": dict(models),
        "demand": pending_demand(cache, admit),
        "exclude": tuple(exclude),
        "options": options,
    }


def fresh_id(base: str, taken: set[str]) -> str:
    """The id of a new workflow: `base` (node and config), or `base-2`, `base-3`... when the node
    went through the same reconfiguration before and its finished record is still kept. The
    same for every replica reading the same store, so two that start it at once make one."""
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


class MigLoop:
    def __init__(
        self,
        cache: ClusterCache,
        models: Mapping[str, Node],
        engine: Engine,
        gate: Gate,
        metrics: Metrics,
        cluster: str,
        interval: float = WORKFLOW_INTERVAL,
        options: MigOptions | None = None,
        admit: Callable[[PodRecord], bool] | None = None,
    ) -> None:
        self.cache = cache
        #: which pending pods make demand (None: all)
        self.admit = admit
        #: the reconciler's node models (kept current by it)
        self.models = models
        self.engine = engine
        self.gate = gate
        self.metrics = metrics
        self.cluster = cluster
        self.interval = interval
        self.options = options or MigOptions()
        self.last_plans: list[mig.NodePlan] = []
        steps = (*STEPS, "done", "failed", "abandoned", "dry-run")
        self.gauge = WorkflowGauge(metrics, cluster, [(KIND, s) for s in steps])

    async def _clear_orphans(self, active: set[str]) -> None:
        gate = self.gate
        if not gate.enforce:
            return
        for n in list(self.cache.nodes.values()):
            if n.has_taint(TAINT_KEY) and n.name not in active:
                log.warning("removing an orphaned MIG taint", extra={"node": n.name})
                await gate.taint(n.name, TAINT_KEY, on=False)

    def _plan(self, inputs: Mapping[str, Any]) -> list[mig.NodePlan]:
        t0, c0 = time.perf_counter(), time.thread_time()
        with collector_paused():
            plans = plan_nodes(**inputs) if inputs["demand"] else []
        took = time.perf_counter() - t0
        self.metrics.workflow.plan_duration.labels(self.cluster, "mig").set(took)
        log.info(
            "planning round",
            extra={
                "loop": "mig",
                "seconds": round(took, 3),
                "cpu_seconds": round(time.thread_time() - c0, 3),
                "nodes": len(plans),
            },
        )
        return plans

    async def plan_off_loop(self, exclude: Sequence[str] = ()) -> list[mig.NodePlan]:
        """A planning round in a worker thread (as the compactor's): its inputs are taken on the
        event loop (`round_inputs`), the round (seconds on thousands of nodes) runs beside it,
        so watch events, scoring and the extender's answers do not wait for it. The caller
        awaits the round: the simulated cluster's lockstep tick waits for it as before."""
        inputs = round_inputs(self.cache, self.models, exclude, self.options, self.admit)
        return await anyio.to_thread.run_sync(self._plan, inputs)

    async def tick(self, leader: bool) -> None:
        wfs = await self.engine.workflows()
        now = self.engine.now()
        active = {w.node for w in wfs if w.kind == KIND and not w.finished}
        # a node whose last attempt ended less than `holdoff` ago is left alone
        recent = {
            w.node
            for w in wfs
            if w.kind == KIND
            and (not w.finished or now - w.updated < self.options.node_holdoff_seconds)
        }
        plans = await self.plan_off_loop(sorted(recent))
        self.last_plans = plans
        if not leader:
            return
        await self._clear_orphans(active)
        taken = {w.id for w in wfs}
        for np_ in plans[: self.options.max_starts]:
            wf = workflow_for(np_, self.cache.pods, now)
            await self.engine.start(msgspec.structs.replace(wf, id=fresh_id(wf.id, taken)))
        self.gauge.export(await self.engine.advance_all())

    async def run(self, leader: Callable[[], bool]) -> None:
        await run_every(self.interval, self.tick, leader, "MIG loop", MIG_PHASE)
