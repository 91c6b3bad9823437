"""The compaction loop: plan from the controller's view at a bounded rate, export the plan as
metrics, and (in enforce mode, on the leader) turn each move into a workflow; then advance the
workflows through the gate."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.metrics import Metrics
from pyctl.workflows.compaction import CompactionPlan, plan_compaction
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

    def plan(self) -> CompactionPlan:
        got = [self.reconciler.shape_of(p) for p in self.cache.pending_pods() if p.unschedulable]
        pending = [s for s in got if s is not None]
        plan = plan_compaction(
            self.cache.nodes,
            self.cache.nrts,
            list(self.cache.pods.values()),
            list(self.cache.pdbs.values()),
            self.reconciler.workload,
            pending=[s for s in pending if not s.is_cpu_only],
            options=self.options,
            max_moves=self.max_moves,
            default_policy=self.reconciler.default_policy,
            dra=self.cache.dra,
        )
        w = self.metrics.workflow
        w.planned_moves.labels(self.cluster).set(len(plan.moves))
        w.expected_gain.labels(self.cluster).set(plan.gain_gpu_milli / 1000)
        self.last_plan = plan
        return plan

    async def tick(self, leader: bool) -> None:
        plan = self.plan()
        if leader:
            now = time.time()
            for mv in plan.moves:
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
