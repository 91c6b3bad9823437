"""A controller process for the crash-safety test: advances compaction workflows whose state,
rate limits and the cluster it acts on all live in a real Redis, until none is left, or until it
is killed (SIGKILL, at a random point, by the test).

The "cluster" is a Redis hash of pods; an eviction deletes the pod and appends it to a log in one
transaction, as the API server deletes an evicted pod: the log is how the test sees evictions.
Usage: python -m tests.integration.crash_worker REDIS_URL
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import anyio

from pyctl.cluster.records import PodRecord
from pyctl.cluster.source import EvictionOutcome, NullActuator
from pyctl.metrics import Metrics
from pyctl.state.redis_client import RedisConfig, connect
from pyctl.state.redis_ratelimit import RedisRateLimiter
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.engine import Context, Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from tests.limits import global_only

CLUSTER = "crash"
PODS = "test:{crash}:pods"
LOG = "test:{crash}:evictions"


class RedisCluster(NullActuator):
    """Pods kept in Redis, evicted by deleting them there (and logged); the other mutations are
    NullActuator's (recorded, not made)."""

    def __init__(self, client: object) -> None:
        super().__init__()
        self.client = client
        self.pods: dict[str, PodRecord] = {}

    async def refresh(self) -> None:
        names = await self.client.hkeys(PODS)  # type: ignore[attr-defined]
        self.pods = {
            f"ns/{n.decode()}": PodRecord("ns", n.decode(), uid=f"u-{n.decode()}", node="n1")
            for n in names
        }

    async def cordon(self, node: str, on: bool) -> None: ...

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        async with self.client.pipeline(transaction=True) as p:  # type: ignore[attr-defined]
            p.hdel(PODS, pod)
            p.rpush(LOG, pod)
            await p.execute()
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


async def main(url: str) -> None:
    rc = RedisConfig(url=url)
    client = connect(rc)
    cluster = RedisCluster(client)
    limits = global_only(1000, 1000.0)
    gate = Gate(
        "enforce",
        lambda: True,
        RedisRateLimiter(client, rc, CLUSTER),
        limits,
        cluster,
        Metrics(),
        CLUSTER,
    )
    engine = Engine(
        RedisWorkflowStore(client, rc, CLUSTER),
        Context(gate, lambda ns, name: cluster.pods.get(f"{ns}/{name}")),
        builtin_registry(),
        retention_seconds=3600,
        kinds=("compaction",),
    )
    print("ready", flush=True)
    while True:
        await cluster.refresh()
        counts = await engine.advance_all()
        if all(step in ("done", "dry-run", "abandoned", "failed") for (_, step) in counts):
            break
        await anyio.sleep(0.01)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
