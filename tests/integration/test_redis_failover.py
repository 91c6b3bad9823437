"""Fault: a Redis Cluster master fails over (issue 36). pyctl's store on a real Redis Cluster of
three masters with one replica each (`cluster-node-timeout` 1 s), configured as a user
configures `pyctl run` (`PYCTL_REDIS_URL`, `PYCTL_REDIS_CLUSTER=true`, the stores the
application wires from them): the Kubernetes path's controller mirroring a cluster, and the
workflow records behind the health monitor the acting side uses.

The master serving pyctl's slot (the node the URL names: the worst case) is killed with SIGKILL.
Until its replica is promoted, calls fail with `StoreUnreachable` and the store is reported
down (`/readyz` not ready, `pyctl_store_up` 0); once promoted, the same clients (nothing
restarted) write and read again, `/readyz` is ready, and what was written before the failover is
there. Replication is asynchronous: a write the old master acknowledged but had not yet sent to
its replica is lost with it. The test waits until the replica has caught up before the kill, so
that everything written before must survive. The old master started again rejoins as a replica.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
import redis

from pyctl.app.config import load_config
from pyctl.app.wiring import make_store, release_after_resync, workflow_backends
from pyctl.controller.controller import Controller
from pyctl.state.health import MonitoredWorkflowStore
from pyctl.state.keys import Keys
from pyctl.state.redis_client import close_client
from pyctl.state.redis_store import RedisStore
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.state.store import StoreError, StoreUnreachable
from tests.redis_servers import HOST, Binaries, RedisClusterServers

from .conftest import _run
from .test_store_outage import _Listed

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

#: records written before the failover
BEFORE = 20


@pytest.fixture
def failover_cluster(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of this test's own: 3 masters, 3 replicas, a failover in seconds."""
    yield from _run(
        RedisClusterServers(
            redis_binaries,
            tmp_path_factory.mktemp("redis-failover"),
            replicas=1,
            node_timeout_ms=1000,
        )
    )


def record(i: int) -> bytes:
    return f'{{"workflow": {i}}}'.encode()


async def test_redis_cluster_master_failover_keeps_the_store_working(
    failover_cluster: RedisClusterServers,
) -> None:
    servers = failover_cluster
    name = "failover"
    keys = Keys(name)
    old = servers.master_of(keys.schema)
    slot = servers.keyslot(keys.schema)
    cfg = load_config(
        None,
        {"PYCTL_REDIS_URL": old.url, "PYCTL_REDIS_CLUSTER": "true", "PYCTL_CLUSTER": name},
        {},
    )
    assert cfg.redis.cluster
    store = make_store(cfg)
    ctl = Controller(name, _Listed(), store, summary_interval=0)
    ctl.store_probe_interval = 0.5
    raw_flows, _limits = workflow_backends(cfg)
    flows = MonitoredWorkflowStore(raw_flows, ctl.store_health)

    async def until(what: str, ok: Callable[[], bool], within: float = 30.0) -> None:
        with anyio.fail_after(within):
            while not ok():  # noqa: ASYNC110 (a condition of plain attributes)
                await anyio.sleep(0.05)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await until("ready", lambda: ctl.ready() == (True, "ok"))
            versions = {f"wf-{i}": await flows.put(f"wf-{i}", record(i), 0) for i in range(BEFORE)}
            assert set(versions.values()) == {1}
            # everything written so far has reached the replica (asynchronous replication)
            servers.wait_in_sync(old)
            replicas = servers.replicas_of(old)
            assert len(replicas) == 1

            servers.kill(old)
            t_kill = time.monotonic()
            # while the slot has no master: the store does not answer, and says so
            with pytest.raises(StoreError) as failed:
                await flows.put("during", b"x", 0)
            assert isinstance(failed.value, StoreUnreachable), failed.value
            assert not ctl.store_health.available
            ok, why = ctl.ready()
            assert not ok
            assert why.startswith("state store unavailable ("), why
            assert ctl.metrics.store_up.labels(name)._value.get() == 0

            new = servers.wait_promoted(old, slot)
            assert new in replicas
            promoted_after = time.monotonic() - t_kill
            # the same clients, nothing restarted: writes and reads succeed again
            with anyio.fail_after(30):
                while True:
                    try:
                        await flows.put("after", b"y", 0)
                        break
                    except StoreUnreachable:
                        await anyio.sleep(0.1)
            await until("ready again", lambda: ctl.ready() == (True, "ok"))
            assert ctl.metrics.store_up.labels(name)._value.get() == 1
            listed = await flows.list()
            for i in range(BEFORE):  # nothing written before the failover is lost
                assert listed[f"wf-{i}"].data == record(i)
                assert listed[f"wf-{i}"].version == 1
            assert (await flows.get("after")) is not None
            assert await flows.put("wf-0", record(100), 1) == 2  # compare-and-set still holds
            # the controller's mirror is on the new master (kept, or written again)
            r = redis.Redis(host=HOST, port=new.port)
            assert r.hkeys(keys.objects("Pod")) == [b"ns/llm"]

            # the old master comes back as a replica of the new one; the store is unaffected
            servers.rejoin(old)
            assert servers.master_of(keys.schema) is new
            assert old in servers.replicas_of(new)
            assert (await flows.get("wf-0")) is not None
            assert ctl.ready() == (True, "ok")
            tg.cancel_scope.cancel()
    finally:
        await store.close()
        client = getattr(raw_flows, "_client", None)  # the application never closes it
        if client is not None:
            await close_client(client)
    print(f"failover: replica promoted {promoted_after:.1f} s after the kill")


def _connected(*clients: Any) -> int:
    """Open sockets of Redis Cluster clients, over every node they know."""
    n = 0
    for client in clients:
        for node in client.get_nodes():
            n += sum(1 for c in node._connections if c.is_connected)
    return n


async def test_redis_failover_leaves_no_connections_open_after_the_resync(
    failover_cluster: RedisClusterServers,
) -> None:
    """Fault (the hour's soak on Redis Cluster, docs/soak.md): after each failover a replica
    kept about six more file descriptors than before: its clients' connections to every node
    of the cluster (rediscovery) and the pool its retries grew. Once the store is written whole
    again (`Controller.after_resync`), the clients drop their idle connections."""
    servers = failover_cluster
    name = "fds"
    keys = Keys(name)
    cfg = load_config(
        None,
        {
            "PYCTL_REDIS_URL": servers.master_of(keys.schema).url,
            "PYCTL_REDIS_CLUSTER": "true",
            "PYCTL_CLUSTER": name,
        },
        {},
    )
    store = make_store(cfg)
    ctl = Controller(name, _Listed(), store, summary_interval=0)
    ctl.store_probe_interval = 0.3
    raw_flows, _limits = workflow_backends(cfg)
    assert isinstance(raw_flows, RedisWorkflowStore)
    release_after_resync(ctl, raw_flows)  # as `attach_workflows` registers them
    assert len(ctl.after_resync) == 2
    assert isinstance(store, RedisStore)
    resyncs: list[float] = []

    async def count() -> None:
        resyncs.append(time.monotonic())

    ctl.after_resync.append(count)
    seq = iter(range(10**6))

    async def burst(n: int = 20) -> None:
        async def one() -> None:
            with contextlib.suppress(StoreError):
                await raw_flows.put(f"wf-{next(seq)}", b"x", 0)

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)

    def clients() -> tuple[Any, Any]:
        return store._client, raw_flows._client

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            with anyio.fail_after(30):
                while ctl.ready() != (True, "ok"):  # noqa: ASYNC110 (plain attributes)
                    await anyio.sleep(0.05)
            await burst()
            # the pool grew to the burst; the hooks drop what is idle
            assert _connected(*clients()) >= 10
            for release in ctl.after_resync:
                await release()
            before = _connected(*clients())
            assert before <= 2, before
            for _ in range(2):
                synced_before = len(resyncs)
                old = servers.master_of(keys.schema)
                slot = servers.keyslot(keys.schema)
                servers.wait_in_sync(old)
                servers.kill(old)
                with anyio.fail_after(30):
                    while ctl.ready()[0]:
                        await burst(5)
                        await anyio.sleep(0.1)
                servers.wait_promoted(old, slot)
                with anyio.fail_after(30):
                    while ctl.ready() != (True, "ok") or not ctl.store_synced:
                        await burst(5)
                        await anyio.sleep(0.1)
                servers.rejoin(old)
                # the controller ran the hooks once the store was written whole again
                assert len(resyncs) > synced_before, resyncs
                for release in ctl.after_resync:
                    await release()
                after = _connected(*clients())
                assert after <= before + 2, (before, after)
            tg.cancel_scope.cancel()
    finally:
        await store.close()
        await close_client(raw_flows._client)
