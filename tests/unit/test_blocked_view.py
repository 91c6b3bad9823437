"""The pending pods blocked by fragmentation, kept node by node between summaries (the reconciler
updates each pending shape's view for the nodes re-scored since the last summary): on a whole
simulated day, every summary says what scoring the whole cluster for each shape says."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller.controller import Controller
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import Summary
from pyctl.core.fragmentation import FragmentationModel, blocked_by
from pyctl.model import Shape, Snapshot, Workload
from pyctl.state.memory import MemoryStore


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def blocked_from_scratch(r: Reconciler) -> dict[str, int]:
    """The whole cluster scored once per pending shape: `blocked_by`, the one definition."""
    pending = [p for p in r.cache.pending_pods() if p.unschedulable]
    if not pending or not r.models:
        return {}
    model = FragmentationModel(Snapshot(tuple(r.models[n] for n in sorted(r.models))))
    return blocked_by(model, [s for s in (r.shape_of(p) for p in pending) if s is not None])


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
