"""The compaction loop: plan from the controller's view at a bounded rate, export the plan as
metrics, and (in enforce mode, on the leader) turn each rescue of a pending pod into a rescue
workflow and each other move into a compaction workflow; then advance the workflows through the
gate. The active rescues' nodes are reserved: the planner sends nothing there, and the
scheduler extender keeps other pods off them (`reservations`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypedDict

import anyio

from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.gangs import VolcanoGang
from pyctl.cluster.records import NodeRecord, PdbRecord, PodRecord
from pyctl.cluster.translate import DraPositions
from pyctl.controller.cache import ClusterCache
from pyctl.controller.fabric_sources import volcano_gangs
from pyctl.controller.reconcile import Reconciler
from pyctl.core.policy import PlanLimits
from pyctl.metrics import Metrics
from pyctl.model import Node, Workload
from pyctl.state.store import StoreError
from pyctl.workflows import rescue
from pyctl.workflows.compaction import (
    KIND,
    CompactionData,
    CompactionPlan,
    PlannedMove,
    RoundCache,
    plan_compaction,
)
from pyctl.workflows.engine import Engine, Workflow, WorkflowData
from pyctl.workflows.evictor import EvictorOptions
from pyctl.workflows.gate import Gate
from pyctl.workflows.loop import (
    COMPACTION_PHASE,
    WORKFLOW_INTERVAL,
    WorkflowGauge,
    collector_paused,
    run_every,
)

log = logging.getLogger("pyctl.compaction")


def departures(
    workflows: list[Workflow[WorkflowData]], now: float, seconds: float
) -> dict[str, str]:
    """Workload -> the node a compaction move (or a rescue) took one of its pods off, for moves
    in progress or done less than `seconds` ago: the scheduler extender keeps the workload's
    replacement pods off that node."""
    out: dict[str, str] = {}
    for wf in workflows:
        if wf.finished and (wf.step != "done" or now - wf.updated > seconds):
            continue
        d = wf.data
        if isinstance(d, CompactionData):
            out[f"{d.namespace}/{d.workload}"] = wf.node
        elif isinstance(d, rescue.RescueData):
            for m in d.pods:
                out[f"{m.namespace}/{m.workload}"] = wf.node
    return out


def departure_seconds(interval: float) -> float:
    """How long after an eviction its workload's pods are kept off the node it left, for a
    compaction loop planning every `interval` seconds."""
    return max(60.0, 4 * interval)


class RoundInputs(TypedDict):
    """What one compaction round plans on (`plan_compaction`'s arguments of the same names)."""

    models: dict[str, Node]
    nodes: dict[str, NodeRecord]
    pods: list[PodRecord]
    pdbs: list[PdbRecord]
    workload: Workload
    pending: list[PodRecord]
    reserved: dict[str, str]
    dra: DraContext
    dra_positions: dict[str, DraPositions]
    exclude: dict[str, str]
    pod_groups: dict[str, VolcanoGang]
    domain_labels: dict[str, dict[str, str]]


def _volcano(cache: ClusterCache, reconciler: Reconciler) -> _VolcanoInputs:
    """Volcano's PodGroups that are gangs and each node's domains at the HyperNodes' tiers (none
    when the cluster has no HyperNodes)."""
    fill = reconciler.fabric_sources()[1].hypernodes
    if not fill.tiers:
        return {"pod_groups": {}, "domain_labels": {}}
    domains = {n: fill.domains(n, rec.labels) for n, rec in list(cache.nodes.items())}
    return {
        "pod_groups": volcano_gangs(list(cache.pod_groups.values()), fill),
        "domain_labels": {n: d for n, d in domains.items() if d},
    }


class _VolcanoInputs(TypedDict):
    pod_groups: dict[str, VolcanoGang]
    domain_labels: dict[str, dict[str, str]]


def too_young(p: PodRecord, rescue_after: float, now: float) -> bool:
    """Whether the rescue of `p` waits: it has existed less than `rescue_after` seconds
    (`workflow.rescue_after`; a pod of unknown age does not wait)."""
    return rescue_after > 0 and p.created > 0 and now - p.created < rescue_after


def round_inputs(
    cache: ClusterCache,
    reconciler: Reconciler,
    reservations: Mapping[str, str],
    exclude: Mapping[str, str] | None = None,
    rescue_after: float = 0.0,
    now: float = 0.0,
) -> RoundInputs:
    """What one compaction round reads from the controller's view (`cache`, `reconciler`), taken
    at one moment: copies of the live tables (records and models are immutable, so copying the
    containers is enough; the DRA view is made anew over copies of its indexes), so the round can
    run away from the event loop while events keep changing the cache. The nodes of the rescues
    in progress (`reservations`: node -> the pending pod it is kept for) are out of reach, and
    those pods out of the new rescues. The pods to make room for are the unschedulable ones in
    the workload's scope whose shape the core can model (a pod pyctl ignores never makes it
    evict); `exclude` (pod -> why: `abandoned`) are left where they are; pods younger than
    `rescue_after` seconds at `now` wait (`too_young`); a pod held back for something room does
    not give (Kueue's quota) or that pyctl cannot tell (a Volcano sub-group it cannot read) is not
    made room for (`ClusterCache.waiting_for_room`).

    The inputs are a function of the state, not of the order events arrived in: pending pods are
    rescued oldest first (creation time, then name), and pods and budgets are offered to the
    planner in name order (its ties go to the first)."""
    c = cache
    rescued = set(reservations.values())
    r = reconciler
    pending = sorted(
        (
            p
            for p in c.waiting_for_room()
            if p.key not in rescued
            and r.scope.admits(p)
            and r.modelled(p)
            and not too_young(p, rescue_after, now)
        ),
        key=lambda p: (p.created, p.key),
    )
    return {
        "models": dict(reconciler.models),
        "nodes": dict(c.nodes),
        "pods": sorted(c.pods.values(), key=lambda p: p.key),
        "pdbs": sorted(c.pdbs.values(), key=lambda b: b.key),
        "workload": reconciler.workload,
        "pending": pending,
        "reserved": dict(reservations),
        "dra": DraContext(
            dict(c.device_classes),
            dict(c.claims),
            dict(c.claim_templates),
            {n: dict(v) for n, v in c.slices_by_node.items()},
            {n: dict(v) for n, v in c.claims_by_node.items()},
        ),
        "dra_positions": dict(reconciler.dra_positions),
        "exclude": dict(exclude or {}),
        **_volcano(c, reconciler),
    }


def this_round(plan: CompactionPlan) -> tuple[list[PlannedMove], list[PlannedMove]]:
    """The plan's defragmentation moves to start now, and those left for the next round. The
    planner places its moves in order, each on the cluster the moves before it left; their
    evictions run at once. A move into a node that a move started before it (or a rescue of the
    plan) evicts from may need the room that eviction frees, which the scheduler sees only once
    the pod is gone: its pod's replacement would be placed before, elsewhere, and its eviction
    wasted. It waits: the next round plans again from the cluster as it is then."""
    freed = {m.from_node for r in plan.rescues for m in r.moves}
    now: list[PlannedMove] = []
    later: list[PlannedMove] = []
    for mv in plan.moves:
        if mv.rescue is not None:
            continue
        if mv.to_node in freed:
            later.append(mv)
            continue
        now.append(mv)
        freed.add(mv.from_node)
    return now, later


def plan_round(
    cache: ClusterCache,
    reconciler: Reconciler,
    options: EvictorOptions,
    limits: PlanLimits,
    reservations: Mapping[str, str],
    exclude: Mapping[str, str] | None = None,
    rescue_after: float = 0.0,
    now: float = 0.0,
) -> CompactionPlan:
    """What one compaction round plans on the controller's view: moves and rescues of the
    unschedulable pods (`round_inputs`). `pyctl explain` asks the same question of the stored
    state."""
    return plan_compaction(
        options=options,
        limits=limits,
        **round_inputs(cache, reconciler, reservations, exclude, rescue_after, now),
    )


def abandoned(workflows: list[Workflow[WorkflowData]]) -> dict[str, str]:
    """The pods whose move was abandoned (until the engine forgets the record), with why: a
    compaction move given up, or the pod whose eviction a rescue could not make (protected, or
    denied by admission). The next plans leave them where they are, so the other moves (and
    other rescues) go on instead of the same refused one being planned again and again."""
    out: dict[str, str] = {}
    for wf in workflows:
        if wf.step != "abandoned":
            continue
        d = wf.data
        if isinstance(d, CompactionData):
            out[f"{d.namespace}/{d.pod}"] = f"its last move was abandoned: {wf.result}"[:300]
        elif isinstance(d, rescue.RescueData) and d.refused:
            out[d.refused] = f"a rescue could not evict it: {wf.result}"[:300]
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
        interval: float = WORKFLOW_INTERVAL,
        max_moves: int = PlanLimits.max_moves,
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
        self.departure_seconds = departure_seconds(interval)
        self.last_plan: CompactionPlan | None = None
        self._round_cache = RoundCache()
        self.gauge = WorkflowGauge(metrics, cluster)
        #: node -> the pending pod ("namespace/name") an active rescue makes room for
        self.reservations: Mapping[str, str] = {}
        #: workload ("namespace/kind/name") -> the node a recent move took one of its pods off
        self.departures: Mapping[str, str] = {}
        #: pod key -> why it is not planned now: its move was abandoned (a denial by admission,
        #: the evictor's rules on the live pod, too many failures) and the record is still kept
        self.exclude: dict[str, str] = {}

    def pending(self) -> list[PodRecord]:
        """The unschedulable pods a round makes room for (`round_inputs`)."""
        return self._inputs()["pending"]

    def _inputs(self) -> RoundInputs:
        return round_inputs(
            self.cache,
            self.reconciler,
            self.reservations,
            self.exclude,
            self.rescue_options.after,
            self.engine.ctx.clock(),
        )

    def _plan(self, inputs: RoundInputs) -> CompactionPlan:
        t0, c0 = time.perf_counter(), time.thread_time()
        with collector_paused():
            plan = plan_compaction(
                options=self.options,
                limits=self.limits,
                round_cache=self._round_cache,
                **inputs,
            )
        took = time.perf_counter() - t0
        log.info(
            "planning round",
            extra={
                "loop": "compaction",
                "seconds": round(took, 3),
                # the round's own work (this thread's CPU time); the rest of `seconds` it
                # waited for a core or for the GIL
                "cpu_seconds": round(time.thread_time() - c0, 3),
                "considered": plan.considered,
                # nodes whose pods were derived again (the others' were kept, `RoundCache`)
                "derived": plan.derived,
                "moves": len(plan.moves),
                "rescues": len(plan.rescues),
            },
        )
        w = self.metrics.workflow
        w.plan_duration.labels(self.cluster, "compaction").set(took)
        w.planned_moves.labels(self.cluster).set(len(plan.moves))
        w.planned_rescues.labels(self.cluster).set(len(plan.rescues))
        w.expected_gain.labels(self.cluster).set(plan.gain_gpu_milli / 1000)
        self.last_plan = plan
        return plan

    def plan(self) -> CompactionPlan:
        """A planning round on the cluster as the controller sees it now."""
        return self._plan(self._inputs())

    async def plan_off_loop(self) -> CompactionPlan:
        """A planning round in a worker thread: its inputs are taken on the event loop, the
        round itself (seconds on thousands of nodes) runs beside it, so watch events, scoring
        and the scheduler extender's answers do not wait for it (the core's planner releases
        the GIL; the Python around it shares the GIL in slices)."""
        inputs = self._inputs()
        return await anyio.to_thread.run_sync(self._plan, inputs)

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
        now_moves, later = this_round(plan)
        if later:
            log.info(
                "moves left for the next round",
                extra={"moves": len(later), "why": "into a node a move of this round evicts from"},
            )
        for mv in now_moves:
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
                    data=CompactionData(
                        namespace=p.namespace,
                        pod=p.name,
                        uid=p.uid,
                        workload=f"{p.owner_kind}/{p.owner_name}",
                        to=mv.to_node,
                        gain_gpu_milli=round(mv.gain_gpu_milli, 1),
                    ),
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

    def _track(self, workflows: list[Workflow[WorkflowData]], now: float) -> None:
        self.reservations = rescue.reservations(workflows)
        self.departures = departures(workflows, now, self.departure_seconds)
        self.exclude = abandoned(workflows)

    async def tick(self, leader: bool) -> None:
        try:
            self._track(await self.engine.workflows(), self.engine.now())
            plan: CompactionPlan | None = await self.plan_off_loop()
        except StoreError:
            raise  # the workflows cannot advance either: the round ends here (`guarded`)
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
        await run_every(self.interval, self.tick, leader, "compaction", COMPACTION_PHASE)
