"""The compaction loop: plan from the controller's view at a bounded rate, export the plan as
metrics, and (in enforce mode, on the leader) turn each rescue of a pending pod into a rescue
workflow and each other move into a compaction workflow; then advance the workflows through the
gate. The active rescues' nodes are reserved: the planner sends nothing there, and the
scheduler extender keeps other pods off them (`reservations`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from pyctl.cluster.records import PodRecord
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.core.policy import PlanLimits
from pyctl.metrics import Metrics
from pyctl.workflows import rescue
from pyctl.workflows.compaction import KIND, CompactionPlan, plan_compaction
from pyctl.workflows.engine import Engine, Workflow
from pyctl.workflows.evictor import EvictorOptions
from pyctl.workflows.gate import Gate
from pyctl.workflows.loop import WorkflowGauge, run_every

log = logging.getLogger("pyctl.compaction")


def departures(workflows: list[Workflow], now: float, seconds: float) -> dict[str, str]:
    """Workload -> the node a compaction move (or a rescue) took one of its pods off, for moves
    in progress or done less than `seconds` ago: the scheduler extender keeps the workload's
    replacement pods off that node."""
    out: dict[str, str] = {}
    for wf in workflows:
        if wf.finished and (wf.step != "done" or now - wf.updated > seconds):
            continue
        if wf.kind == KIND:
            out[f"{wf.data['namespace']}/{wf.data.get('workload', '')}"] = wf.node
        elif wf.kind == rescue.KIND:
            for ns, _name, _uid, workload, _to in rescue.planned_pods(wf):
                out[f"{ns}/{workload}"] = wf.node
    return out


def abandoned(workflows: list[Workflow]) -> dict[str, str]:
    """The pods whose move was abandoned (until the engine forgets the record), with why: a
    compaction move given up, or the pod whose eviction a rescue could not make (protected, or
    denied by admission). The next plans leave them where they are, so the other moves (and
    other rescues) go on instead of the same refused one being planned again and again."""
    out: dict[str, str] = {}
    for wf in workflows:
        if wf.step != "abandoned":
            continue
        if wf.kind == KIND:
            key = f"{wf.data.get('namespace', '')}/{wf.data.get('pod', '')}"
            out[key] = f"its last move was abandoned: {wf.result}"[:300]
        elif wf.kind == rescue.KIND and wf.data.get("refused"):
            out[wf.data["refused"]] = f"a rescue could not evict it: {wf.result}"[:300]
    return out


class Compactor:
    def __init__(
        self,
        cache: ClusterCache,
        reconciler: Reconciler,
        engine: Engine,
        metrics: Metrics,
        cluster: str,
        mode: str = "observe",
        interval: float = 10.0,
        max_moves: int = 3,
        options: EvictorOptions | None = None,
        gate: Gate | None = None,
        limits: PlanLimits | None = None,
        rescue_options: rescue.RescueOptions | None = None,
    ) -> None:
        self.cache = cache
        self.reconciler = reconciler
        self.engine = engine
        self.metrics = metrics
        self.cluster = cluster
        self.mode = mode
        self.interval = interval
        self.limits = limits or PlanLimits(max_moves=max_moves)
        self.options = options or EvictorOptions()
        self.gate = gate
        self.rescue_options = rescue_options or rescue.RescueOptions()
        #: how long after an eviction its workload's pods are kept off the node it left
        self.departure_seconds = max(60.0, 4 * interval)
        self.last_plan: CompactionPlan | None = None
        self.gauge = WorkflowGauge(metrics, cluster)
        #: node -> the pending pod ("namespace/name") an active rescue makes room for
        self.reservations: Mapping[str, str] = {}
        #: workload ("namespace/kind/name") -> the node a recent move took one of its pods off
        self.departures: Mapping[str, str] = {}
        #: pod key -> why it is not planned now: its move was abandoned (a denial by admission,
        #: the evictor's rules on the live pod, too many failures) and the record is still kept
        self.exclude: dict[str, str] = {}

    def pending(self) -> list[PodRecord]:
        """The unschedulable pods to make room for: not already being rescued, in the workload's
        scope, and of a shape the core can model (a pod pyctl ignores never makes it evict)."""
        r = self.reconciler
        rescued = set(self.reservations.values())
        return [
            p
            for p in self.cache.pending_pods()
            if p.unschedulable and p.key not in rescued and r.scope.admits(p) and r.modelled(p)
        ]

    def plan(self) -> CompactionPlan:
        reserved = set(self.reservations)
        plan = plan_compaction(
            self.reconciler.models,
            self.cache.nodes,
            list(self.cache.pods.values()),
            list(self.cache.pdbs.values()),
            self.reconciler.workload,
            pending=self.pending(),
            options=self.options,
            limits=self.limits,
            reserved=reserved,
            dra=self.cache.dra,
            dra_positions=self.reconciler.dra_positions,
            exclude=self.exclude,
        )
        w = self.metrics.workflow
        w.planned_moves.labels(self.cluster).set(len(plan.moves))
        w.planned_rescues.labels(self.cluster).set(len(plan.rescues))
        w.expected_gain.labels(self.cluster).set(plan.gain_gpu_milli / 1000)
        self.last_plan = plan
        return plan

    async def _start(self, plan: CompactionPlan, now: float) -> None:
        pods = self.cache.pods
        for r in plan.rescues:
            p = pods.get(r.pending)
            moved = [(pods[m.pod], m.to_node) for m in r.moves if m.pod in pods]
            if p is None or len(moved) != len(r.moves):
                continue
            wf = rescue.workflow_for(p, r.node, moved, now, self.rescue_options)
            if await self.engine.start(wf):
                log.info(
                    "rescue started",
                    extra={"pod": r.pending, "node": r.node, "evictions": len(moved)},
                )
        for mv in plan.moves:
            if mv.rescue is not None:
                continue
            p = pods.get(mv.pod)
            if p is None:
                continue
            await self.engine.start(
                Workflow(
                    id=f"{KIND}-{p.uid or p.key}",
                    kind=KIND,
                    node=mv.from_node,
                    step="evicting",
                    created=now,
                    updated=now,
                    data={
                        "namespace": p.namespace,
                        "pod": p.name,
                        "uid": p.uid,
                        "workload": f"{p.owner_kind}/{p.owner_name}",
                        "to": mv.to_node,
                        "gain_gpu_milli": f"{mv.gain_gpu_milli:.1f}",
                    },
                )
            )

    async def _clear_orphans(self) -> None:
        """A node carrying pyctl's rescue taint with no rescue in progress (the store was lost,
        e.g. an in-memory one with the controller) is made schedulable again."""
        if self.gate is None or not self.gate.enforce:
            return
        for n in list(self.cache.nodes.values()):
            if n.has_taint(rescue.TAINT_KEY) and n.name not in self.reservations:
                log.warning("removing an orphaned rescue taint", extra={"node": n.name})
                await self.gate.taint(n.name, rescue.TAINT_KEY, on=False)

    def _track(self, workflows: list[Workflow], now: float) -> None:
        self.reservations = rescue.reservations(workflows)
        self.departures = departures(workflows, now, self.departure_seconds)
        self.exclude = abandoned(workflows)

    async def tick(self, leader: bool) -> None:
        try:
            self._track(await self.engine.workflows(), self.engine.now())
            plan: CompactionPlan | None = self.plan()
        except Exception:  # a plan that fails never stops the workflows already running
            log.exception("compaction planning failed; the workflows still advance")
            self.metrics.reconcile_errors.labels(self.cluster).inc()
            plan = None
        if leader:
            await self._clear_orphans()
            if plan is not None:
                await self._start(plan, self.engine.now())
            self.gauge.export(await self.engine.advance_all())
            self._track(await self.engine.workflows(), self.engine.now())

    async def run(self, leader: Callable[[], bool]) -> None:
        await run_every(self.interval, self.tick, leader, "compaction")
