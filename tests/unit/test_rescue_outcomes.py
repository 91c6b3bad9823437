"""How a rescue ends: its pod running on the node it freed (done), bound to another node first
(bound elsewhere: a node freed by a departure or by another rescue), deleted (withdrawn), or
the room not made (abandoned). Only the last is a workflow abandoned, with its warning Event and
`pyctl_workflows_abandoned_total`: a pending pod served elsewhere is not a failure to alert on.
Run through the engine and the gate as the controller runs them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pyctl.cluster.records import PodRecord
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import MemoryRateLimiter
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows import rescue
from pyctl.workflows.engine import Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from tests.unit.test_workflows import LOOSE, FakeCluster


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


PENDING = PodRecord("ns", "big", uid="ub", gpus=4, owner_kind="ReplicaSet", owner_name="big")
VICTIM = PodRecord("ns", "p0", uid="u0", node="n1", gpus=1, owner_kind="ReplicaSet", owner_name="x")


@dataclass
class Run:
    cluster: FakeCluster
    engine: Engine
    metrics: Metrics
    now: list[float]

    async def advance(self, times: int = 1) -> str:
        for _ in range(times):
            self.now[0] += 5.0
            await self.engine.advance_all()
        wf = await self.engine.get(WID)
        assert wf is not None
        return wf.step

    def rescues(self, outcome: str) -> float:
        got = self.metrics.registry.get_sample_value(
            "pyctl_rescues_total", {"cluster": "c", "outcome": outcome}
        )
        return got or 0.0

    def abandoned(self) -> float:
        got = self.metrics.registry.get_sample_value(
            "pyctl_workflows_abandoned_total", {"cluster": "c", "kind": "rescue"}
        )
        return got or 0.0


WID = rescue.workflow_for(PENDING, "n1", [(VICTIM, "n9")], 0.0).id


async def started() -> Run:
    cluster = FakeCluster({PENDING.key: PENDING, VICTIM.key: VICTIM})
    metrics = Metrics()
    now = [0.0]
    gate = Gate("enforce", lambda: True, MemoryRateLimiter(), LOOSE, cluster, metrics, "c")
    ctx = rescue.CompactionContext(
        gate, lambda ns, name: cluster.pods.get(f"{ns}/{name}"), clock=lambda: now[0]
    )
    engine = Engine(MemoryWorkflowStore(), ctx, builtin_registry())
    assert await engine.start(rescue.workflow_for(PENDING, "n1", [(VICTIM, "n9")], 0.0))
    run = Run(cluster, engine, metrics, now)
    # isolating (the taint), evicting (the one pod), then the pod gone: waiting
    assert await run.advance(3) == "waiting"
    assert cluster.evictions == [VICTIM.key]
    return run


@pytest.mark.anyio
async def test_the_pod_on_the_node_it_freed_is_done() -> None:
    run = await started()
    run.cluster.pods[PENDING.key] = PodRecord("ns", "big", uid="ub", node="n1", gpus=4)
    assert await run.advance(2) == "done"
    wf = await run.engine.get(WID)
    assert wf is not None
    assert wf.result == "done: ns/big runs on n1"
    assert (run.rescues("done"), run.abandoned()) == (1.0, 0.0)
    assert run.cluster.told[-1][0::2] == ("PyctlRescue", False)
    assert not run.cluster.tainted


@pytest.mark.anyio
async def test_a_pod_bound_to_another_node_first_ends_the_rescue_without_an_alert() -> None:
    run = await started()
    run.cluster.pods[PENDING.key] = PodRecord("ns", "big", uid="ub", node="n2", gpus=4)
    assert await run.advance(2) == "done"
    wf = await run.engine.get(WID)
    assert wf is not None
    assert wf.result == "bound_elsewhere: the pending pod was bound to n2"
    assert (run.rescues("bound_elsewhere"), run.rescues("abandoned")) == (1.0, 0.0)
    assert run.abandoned() == 0.0
    reason, message, warning = run.cluster.told[-1]
    assert (reason, warning) == ("PyctlRescueEnded", False)
    assert "bound to n2" in message
    assert not any(warning for _, _, warning in run.cluster.told)
    assert not run.cluster.tainted


@pytest.mark.anyio
async def test_a_pod_deleted_while_evicting_is_withdrawn_and_nothing_more_is_evicted() -> None:
    run = await started()
    cluster = run.cluster
    # a second rescue whose pod goes away after the taint, before its eviction
    other = PodRecord("ns", "p1", uid="u1", node="n3", gpus=1, owner_kind="ReplicaSet")
    pending = PodRecord("ns", "big2", uid="ub2", gpus=4)
    cluster.pods.update({other.key: other, pending.key: pending})
    wf = rescue.workflow_for(pending, "n3", [(other, "n9")], run.now[0])
    assert await run.engine.start(wf)
    await run.advance()  # isolating: n3 tainted
    assert "n3" in cluster.tainted
    del cluster.pods[pending.key]
    await run.advance(2)
    got = await run.engine.get(wf.id)
    assert got is not None
    assert (got.step, got.result) == ("done", "withdrawn: the pending pod is gone")
    assert other.key not in cluster.evictions
    assert "n3" not in cluster.tainted
    assert (run.rescues("withdrawn"), run.abandoned()) == (1.0, 0.0)


@pytest.mark.anyio
async def test_a_pod_never_bound_before_the_deadline_is_abandoned_with_a_warning() -> None:
    run = await started()
    run.now[0] = rescue.RescueOptions().deadline + 1.0
    assert await run.advance(2) == "abandoned"
    wf = await run.engine.get(WID)
    assert wf is not None
    assert wf.result.startswith("abandoned: the pending pod was not bound before the deadline")
    assert (run.rescues("abandoned"), run.abandoned()) == (1.0, 1.0)
    warned = {reason for reason, _, warning in run.cluster.told if warning}
    assert warned == {"PyctlRescueAbandoned", "PyctlWorkflowAbandoned"}
    assert not run.cluster.tainted
