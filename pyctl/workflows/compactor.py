"""The compaction loop: plan from the controller's view at a bounded rate, export the plan as
metrics, and (in enforce mode, on the leader) turn each move into a workflow; then advance the
workflows through the gate."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from pyctl.cluster.records import NodeRecord, PodRecord, Taint, Toleration
from pyctl.cluster.translate import pod_shape
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.metrics import Metrics
from pyctl.model import Shape
from pyctl.workflows.compaction import KIND, CompactionPlan, plan_compaction
from pyctl.workflows.engine import Engine, Workflow
from pyctl.workflows.evictor import EvictorOptions
from pyctl.workflows.loop import WorkflowGauge, run_every

log = logging.getLogger("pyctl.compaction")


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
    ) -> None:
        self.cache = cache
        self.reconciler = reconciler
        self.engine = engine
        self.metrics = metrics
        self.cluster = cluster
        self.mode = mode
        self.interval = interval
        self.max_moves = max_moves
        self.options = options or EvictorOptions()
        self.last_plan: CompactionPlan | None = None
        self.gauge = WorkflowGauge(metrics, cluster)
        #: pod key -> why it is not planned now: its move was abandoned (a denial by admission,
        #: the evictor's rules on the live pod, too many failures) and the record is still kept
        self.exclude: dict[str, str] = {}

    def pending(self) -> tuple[list[Shape], float]:
        """The distinct shapes of the unschedulable GPU pods in the workload's scope that the
        core can model, and the weight they get in all (so that none weighs more than the
        scope's `max_shape_weight` of the planning workload: a tenant cannot steer compaction
        by creating pending pods, whether many of one shape or a few of many)."""
        r = self.reconciler
        shapes: dict[object, Shape] = {}
        for p in self.cache.pending_pods():
            if not p.unschedulable or not (p.gpus or p.mig) or not r.scope.admits(p):
                continue
            if r.modelled(p):
                s = pod_shape(p)
                shapes.setdefault(s.key(), s)
        k, cap = len(shapes), r.scope.max_shape_weight
        # each pending shape's share of M + pending is w / (k (1 + w)) for a total weight w
        weight = 1.0 if cap * k >= 1.0 else min(1.0, cap * k / (1.0 - cap * k))
        return list(shapes.values()), weight

    def plan(self) -> CompactionPlan:
        pending, weight = self.pending()
        r = self.reconciler
        plan = plan_compaction(
            # the nodes the reconciler could model (one it could not is left out, never fatal)
            {n: rec for n, rec in self.cache.nodes.items() if n in r.models},
            self.cache.nrts,
            list(self.cache.pods.values()),
            list(self.cache.pdbs.values()),
            r.workload,
            pending=pending,
            options=self.options,
            max_moves=self.max_moves,
            pending_weight=weight,
            default_policy=r.default_policy,
            exclude=self.exclude,
        )
        plan = without_unusable_targets(plan, self.cache.pods, self.cache.nodes)
        w = self.metrics.workflow
        w.planned_moves.labels(self.cluster).set(len(plan.moves))
        w.expected_gain.labels(self.cluster).set(plan.gain_gpu_milli / 1000)
        self.last_plan = plan
        return plan

    async def _abandoned(self) -> dict[str, str]:
        """The pods whose move was abandoned (until the engine forgets the record): the next
        plans leave them where they are, so the other moves go on instead of the same refused
        one being planned again and again."""
        out: dict[str, str] = {}
        for wf in await self.engine.workflows():
            if wf.kind == KIND and wf.step == "abandoned":
                key = f"{wf.data.get('namespace', '')}/{wf.data.get('pod', '')}"
                out[key] = f"its last move was abandoned: {wf.result}"[:300]
        return out

    async def tick(self, leader: bool) -> None:
        try:
            self.exclude = await self._abandoned()
            plan: CompactionPlan | None = self.plan()
        except Exception:  # a plan that fails never stops the workflows already running
            log.exception("compaction planning failed; the workflows still advance")
            self.metrics.reconcile_errors.labels(self.cluster).inc()
            plan = None
        if leader:
            now = time.time()
            for mv in plan.moves if plan is not None else ():
                p = self.cache.pods.get(mv.pod)
                if p is None:
                    continue
                await self.engine.start(
                    Workflow(
                        id=f"compaction-{p.uid or p.key}",
                        kind="compaction",
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
            self.gauge.export(await self.engine.advance_all())

    async def run(self, leader: Callable[[], bool]) -> None:
        await run_every(self.interval, self.tick, leader, "compaction")


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    """Kubernetes' toleration matching: an empty key with Exists tolerates everything; the
    effect must match unless empty; Exists ignores the value, Equal compares it."""
    if tol.effect and tol.effect != taint.effect:
        return False
    if not tol.key:
        return tol.operator == "Exists"
    if tol.key != taint.key:
        return False
    return tol.operator == "Exists" or tol.value == taint.value


def unusable_target(pod: PodRecord, node: str, rec: NodeRecord | None) -> str | None:
    """Why the scheduler would not put `pod`'s replacement on `node` now (gone, cordoned, or a
    NoSchedule/NoExecute taint the pod does not tolerate), or None."""
    if rec is None:
        return f"its target {node} is gone"
    if rec.unschedulable:
        return f"its target {node} is cordoned"
    tolerations = pod.constraints.tolerations if pod.constraints is not None else ()
    for t in rec.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not any(
            _tolerates(tol, t) for tol in tolerations
        ):
            return f"its target {node} has the taint {t.key}:{t.effect}"
    return None


def without_unusable_targets(
    plan: CompactionPlan, pods: Mapping[str, PodRecord], nodes: Mapping[str, NodeRecord]
) -> CompactionPlan:
    """The plan without the moves toward a node the scheduler would not use: such a move only
    recreates the pod where it was, to be planned and evicted again (an eviction loop). The
    moves dropped are listed in `refused` with why."""
    kept, refused = [], dict(plan.refused)
    for mv in plan.moves:
        p = pods.get(mv.pod)
        why = unusable_target(p, mv.to_node, nodes.get(mv.to_node)) if p else "the pod is gone"
        if why is None:
            kept.append(mv)
        else:
            refused[mv.pod] = why
    if len(kept) == len(plan.moves):
        return plan
    return dataclasses.replace(plan, moves=tuple(kept), refused=refused)
