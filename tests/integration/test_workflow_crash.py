"""Crash safety and shared limits with real processes and a real Redis: a controller killed
with SIGKILL at 30 random points while it works through compaction workflows always converges
after restart, and no pod is evicted twice; two replicas sharing one Redis share the limits."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

import anyio
import msgspec
import pytest

from pyctl.cluster.records import PodRecord
from pyctl.cluster.source import EvictionOutcome, NullActuator
from pyctl.metrics import Metrics
from pyctl.state.redis_client import RedisConfig, close_client, connect
from pyctl.state.redis_ratelimit import RedisRateLimiter
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.compaction import CompactionData
from pyctl.workflows.engine import Context, Engine, Workflow, decode
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from tests.integration.crash_worker import CLUSTER, LOG, PODS
from tests.limits import global_only

pytestmark = pytest.mark.redis
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PER_ROUND = 20


def _wf(i: int) -> Workflow[CompactionData]:
    data = CompactionData("ns", f"p{i}", f"u-p{i}", "ReplicaSet/x")
    return Workflow(
        f"compaction-u-p{i}", "compaction", "n1", "evicting", created=time.time(), data=data
    )


async def _seed(url: str, first: int, n: int) -> None:
    """n more pods, each with a compaction workflow to evict it."""
    rc = RedisConfig(url=url)
    client = connect(rc)
    await client.hset(PODS, mapping={f"p{i}": "1" for i in range(first, first + n)})
    store = RedisWorkflowStore(client, rc, CLUSTER)
    for i in range(first, first + n):
        await store.put(_wf(i).id, msgspec.json.encode(_wf(i)), 0)
    await close_client(client)


def _worker(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.crash_worker", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.anyio
async def test_sigkill_at_30_random_points_converges_without_double_evictions(
    redis_server: object,
) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    client = connect(RedisConfig(url=url))
    await client.flushall()
    await close_client(client)
    rnd = random.Random(1234)
    kills = 0
    total = 0
    for _ in range(30):
        # every round brings new work, so each worker is killed in the middle of some
        await _seed(url, total, PER_ROUND)
        total += PER_ROUND
        p = _worker(url)
        assert p.stdout is not None
        assert p.stdout.readline().strip() == b"ready"
        await anyio.sleep(rnd.uniform(0.0, 0.03))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.wait(timeout=10)
    final = _worker(url)
    _, err = final.communicate(timeout=120)
    assert final.returncode == 0, err.decode()[-2000:]
    client = connect(RedisConfig(url=url))
    log = [x.decode() if isinstance(x, bytes) else x for x in await client.lrange(LOG, 0, -1)]
    left = await client.hlen(PODS)
    store = RedisWorkflowStore(client, RedisConfig(url=url), CLUSTER)
    records = await store.list()
    await close_client(client)
    assert kills >= 15, f"only {kills} of 30 workers were killed mid-run"
    assert len(log) == len(set(log)), f"a pod was evicted twice: {sorted(log)}"
    assert sorted(log) == sorted(f"p{i}" for i in range(total))
    assert left == 0
    steps = {decode(r.data, builtin_registry()).step for r in records.values()}
    assert steps == {"done"}


class _Recorder(NullActuator):
    """Records evictions; the other mutations are NullActuator's (recorded, not made)."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[str] = []

    async def cordon(self, node: str, on: bool) -> None: ...

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        self.evicted.append(pod)
        return EvictionOutcome(True, 201)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None: ...

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None: ...


@pytest.mark.anyio
async def test_two_replicas_sharing_redis_share_the_limits(redis_server: object) -> None:
    url = redis_server.url  # type: ignore[attr-defined]
    rc = RedisConfig(url=url)
    setup = connect(rc)
    await setup.flushall()
    await close_client(setup)
    limits = global_only(5, 0.0001)
    pods = {f"ns/p{i}": PodRecord("ns", f"p{i}", uid=f"u-p{i}", node="n1") for i in range(20)}
    recorders = [_Recorder(), _Recorder()]
    clients = [connect(rc), connect(rc)]
    engines = []
    for i in range(2):
        gate = Gate(
            "enforce",
            lambda: True,
            RedisRateLimiter(clients[i], rc, "shared"),
            limits,
            recorders[i],
            Metrics(),
            "c",
        )
        store = RedisWorkflowStore(clients[i], rc, "shared")
        engines.append(
            Engine(
                store,
                Context(gate, lambda ns, n: pods.get(f"{ns}/{n}")),
                builtin_registry(),
                kinds=("compaction",),
            )
        )
    for i in range(20):
        await engines[0].start(_wf(i))
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(engines[0].advance_all)
            tg.start_soon(engines[1].advance_all)
    for c in clients:
        await close_client(c)
    evicted = recorders[0].evicted + recorders[1].evicted
    assert len(evicted) == 5, evicted  # the shared bucket held, whichever replica acted
    assert len(set(evicted)) == 5
