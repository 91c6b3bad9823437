"""The pending pods blocked by fragmentation, kept node by node between summaries (the reconciler
updates each pending shape's view for the nodes re-scored since the last summary): on a whole
simulated day, every summary says what scoring the whole cluster for each shape says."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller.controller import Controller
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import Summary
from pyctl.core.fragmentation import CATEGORIES, FragmentationModel
from pyctl.model import Shape, Snapshot, Workload
from pyctl.state.memory import MemoryStore


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def blocked_from_scratch(r: Reconciler) -> dict[str, int]:
    """The whole cluster scored once per pending shape (what a summary did before the views)."""
    pending = [p for p in r.cache.pending_pods() if p.unschedulable]
    if not pending or not r.models:
        return {}
    model = FragmentationModel(Snapshot(tuple(r.models[n] for n in sorted(r.models))))
    idle_gpu = sum(s.idle_gpu_milli for s in r.scores.values())
    idle_mig = sum(s.idle_mig_slices for s in r.scores.values())
    out: Counter[str] = Counter()
    by_shape: dict[Shape, str | None] = {}
    for p in pending:
        shape = r.shape_of(p)
        if shape is None or shape.is_cpu_only:
            continue
        if shape not in by_shape:
            full = shape.gpus * shape.gpu_milli > idle_gpu
            if full if shape.mig_profile is None else idle_mig == 0:
                by_shape[shape] = None  # the cluster is full for it, not fragmented
            else:
                res = model.score(Workload((replace(shape, weight=1.0),)))
                admitted = any(
                    n.fragment_gpu_milli < n.idle_gpu_milli - 1e-9
                    or n.fragment_mig_slices < n.idle_mig_slices - 1e-9
                    for n in res.nodes
                )
                cats = res.mig_categories if shape.mig_profile else res.categories
                by_shape[shape] = None if admitted else max(CATEGORIES, key=lambda c: cats[c])
        reason = by_shape[shape]
        if reason is not None:
            out[reason] += 1
    return dict(out)


@pytest.mark.anyio
async def test_blocked_views_agree_with_scoring_the_whole_cluster() -> None:
    seen: list[tuple[dict[str, int], dict[str, int]]] = []
    ctl: Controller | None = None

    def check(s: Summary) -> None:
        assert ctl is not None
        seen.append((s.blocked, blocked_from_scratch(ctl.reconciler)))

    src = SimClusterSource(inference_day(), speed=None)
    ctl = Controller("sim", src, MemoryStore(), summary_interval=0.02, on_summary=check)
    await ctl.run(until_source_ends=True)
    assert len(seen) > 20
    for got, want in seen:
        assert got == want
    # not a vacuous agreement: some summaries found pods blocked
    assert sum(1 for got, _ in seen if got) > 3


def test_a_workload_whose_weights_move_by_a_hair_is_the_same() -> None:
    from pyctl.controller.reconcile import same_workload

    one = Shape(cpu_milli=4000, gpus=1, gpu_milli=1000, weight=0.60)
    two = Shape(cpu_milli=8000, gpus=2, gpu_milli=1000, weight=0.40)
    m = Workload((one, two))
    assert same_workload(m, Workload((replace(one, weight=0.61), replace(two, weight=0.39))))
    assert not same_workload(m, Workload((replace(one, weight=0.65), replace(two, weight=0.35))))
    assert not same_workload(m, Workload((replace(one, weight=1.0),)))
