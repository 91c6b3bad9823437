"""`workflow.rescue_after`: an unschedulable pod younger than this is not rescued yet (room a
departure frees meanwhile costs no eviction); older ones, and pods of unknown age, are."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from pyctl.app.config import ConfigError, load_config
from pyctl.cluster.records import PodRecord
from pyctl.workflows.compactor import plan_round
from pyctl.workflows.rescue import RescueOptions
from tests.unit import test_isolation as isolation
from tests.unit.test_isolation import PENDING_FOUR, cluster, reconciled

BIG = replace(PENDING_FOUR, created=1000.0)


def pending(pod: PodRecord, after: float, now: float) -> list[str]:
    cache = cluster([pod])
    r = reconciled(cache)
    compactor, _ = isolation.compactor(cache, r, RescueOptions(after=after), lambda: now)
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
