"""`workflow.rescue_after`: an unschedulable pod younger than this is not rescued yet (room a
departure frees meanwhile costs no eviction); older ones, and pods of unknown age, are."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from pyctl.app.config import ConfigError, load_config
from pyctl.cluster.records import PodRecord
from pyctl.cluster.source import NullActuator
from pyctl.state.ratelimit import MemoryRateLimiter, SafetyLimits
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.compactor import Compactor, plan_round
from pyctl.workflows.engine import Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.rescue import CompactionContext, RescueOptions
from tests.unit.test_isolation import CLUSTER, cluster, reconciled

BIG = PodRecord(
    "serving",
    "big",
    "uid-big",
    cpu_milli=4000,
    gpus=4,
    unschedulable=True,
    owner_kind="ReplicaSet",
    owner_name="big",
    created=1000.0,
)


def pending(pod: PodRecord, after: float, now: float) -> list[str]:
    cache = cluster([pod])
    r = reconciled(cache)
    gate = Gate(
        "observe",
        lambda: True,
        MemoryRateLimiter(),
        SafetyLimits(),
        NullActuator(),
        r.metrics,
        CLUSTER,
    )
    options = RescueOptions(after=after)
    ctx = CompactionContext(
        gate, lambda ns, n: cache.pods.get(f"{ns}/{n}"), clock=lambda: now, rescue=options
    )
    engine = Engine(MemoryWorkflowStore(), ctx, builtin_registry())
    compactor = Compactor(
        cache, r, engine, r.metrics, CLUSTER, "observe", max_moves=3, rescue_options=options
    )
    # what the round makes room for, and what it plans: a rescue only for a pod it considers
    considered = [p.key for p in compactor.pending()]
    assert [r.pending for r in compactor.plan().rescues] == considered
    # `pyctl explain` asks `plan_round` the same question, with the same answer
    stored = plan_round(cache, r, compactor.options, compactor.limits, {}, {}, after, now)
    assert [x.pending for x in stored.rescues] == considered
    return considered


@pytest.mark.parametrize(
    ("after", "now", "rescued"),
    [(0.0, 1001.0, True), (60.0, 1010.0, False), (60.0, 1060.0, True), (60.0, 1500.0, True)],
)
def test_a_pod_is_rescued_once_it_is_old_enough(after: float, now: float, rescued: bool) -> None:
    assert pending(BIG, after, now) == (["serving/big"] if rescued else [])


def test_a_pod_of_unknown_age_is_not_held_back() -> None:
    assert pending(replace(BIG, created=0.0), 60.0, 1010.0) == ["serving/big"]


def test_the_setting_is_read_and_bounded() -> None:
    assert load_config(env={"PYCTL_WORKFLOW_RESCUE_AFTER": "45"}).workflow.rescue_after == 45.0
    with pytest.raises(ConfigError):
        load_config(env={"PYCTL_WORKFLOW_RESCUE_AFTER": "-1"})
