"""The state store's health (pyctl/state/health.py): one place, fed by every part that uses the
store, read by /readyz and `pyctl_store_up` (issue 36)."""

from __future__ import annotations

import pytest

from pyctl.metrics import Metrics
from pyctl.state.health import MonitoredRateLimiter, MonitoredWorkflowStore, StoreHealth
from pyctl.state.ratelimit import Bucket, MemoryRateLimiter, Request
from pyctl.state.store import StoreError, StoreUnreachable
from pyctl.state.workflows import ConflictError, MemoryWorkflowStore, WorkflowRecord


def gauges(m: Metrics) -> tuple[float, dict[str, float]]:
    up = m.store_up.labels("c")._value.get()
    parts = {
        s.labels["part"]: s.value
        for metric in m.store_part_up.collect()
        for s in metric.samples
        if s.labels["cluster"] == "c"
    }
    return up, parts


def test_a_store_that_does_not_answer_is_back_when_any_part_gets_an_answer() -> None:
    m = Metrics()
    h = StoreHealth(m, "c")
    h.ok("mirror")
    assert (h.available, h.reason) == (True, "")
    h.failed("workflows", StoreUnreachable("list workflows: cannot reach redis"))
    assert not h.available
    assert h.reason == "state store unavailable (workflows): list workflows: cannot reach redis"
    assert gauges(m) == (0.0, {"mirror": 0.0, "workflows": 0.0})
    h.ok("probe")
    assert h.available
    assert gauges(m) == (1.0, {"mirror": 1.0, "workflows": 1.0, "probe": 1.0})


def test_a_refused_part_is_back_only_when_it_gets_an_answer() -> None:
    m = Metrics()
    h = StoreHealth(m, "c")
    h.failed("workflows", StoreError("WRONGTYPE Operation against a key holding\n a list"))
    h.ok("probe")
    h.ok("mirror")
    assert not h.available
    assert (
        h.reason
        == "state store refuses workflows: WRONGTYPE Operation against a key holding a list"
    )
    assert gauges(m) == (0.0, {"workflows": 0.0, "probe": 1.0, "mirror": 1.0})
    h.ok("workflows")
    assert (h.available, gauges(m)[0]) == (True, 1.0)


def test_a_conflict_is_the_store_working() -> None:
    h = StoreHealth()
    h.failed("workflows", ConflictError("wf", 1, 2))
    assert h.available


def test_availability_changes_are_told_once() -> None:
    h = StoreHealth()
    seen: list[bool] = []
    h.on_change.append(seen.append)
    h.ok("mirror")
    h.failed("mirror", StoreUnreachable("gone"))
    h.failed("probe", StoreUnreachable("gone"))
    h.ok("mirror")
    h.ok("probe")
    assert seen == [True, False, True]


class _Broken(MemoryWorkflowStore):
    async def list(self) -> dict[str, WorkflowRecord]:
        raise StoreError("list workflows: WRONGTYPE")


@pytest.mark.anyio
async def test_the_workflow_store_and_the_limits_report_every_call() -> None:
    h = StoreHealth()
    wf = MonitoredWorkflowStore(_Broken(), h)
    with pytest.raises(StoreError):
        await wf.list()
    assert h.refused == {"workflows": "list workflows: WRONGTYPE"}
    await wf.put("a", b"x", 0)
    assert h.available
    with pytest.raises(ConflictError):
        await wf.put("a", b"x", 0)
    assert h.available
    lim = MonitoredRateLimiter(MemoryRateLimiter(), h)
    assert (await lim.acquire(Request(buckets=(Bucket("global", 1, 0.0),)))).allowed
    assert h.available


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
