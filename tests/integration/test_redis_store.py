"""What only the Redis store has: the schema version, refusals that leave nothing behind, one
slot per cluster, Redis Cluster, AUTH, TLS, and Redis going away and coming back."""

from __future__ import annotations

import time
from dataclasses import replace

import anyio
import anyio.lowlevel
import pytest
import redis.asyncio as aioredis

from pyctl.cluster.records import encode_record, record_key
from pyctl.metrics import Metrics
from pyctl.state.keys import Keys, members_key
from pyctl.state.redis_client import REDIS_COMMANDS, RedisConfig, close_client, connect
from pyctl.state.redis_ratelimit import RedisRateLimiter
from pyctl.state.redis_store import RedisStore
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.state.store import SCHEMA_VERSION, SchemaError, StateLostError, StoreError
from tests.redis_servers import RedisClusterServers, RedisServer, Tls

from .conftest import AUTH_PASSWORD, RedisConn, redis_config
from .ratelimits import every_kind_of_limit
from .records import ev, node, pod

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def _state(st: RedisStore) -> dict[str, object]:
    return {kind: await st.load(kind) for kind in ("Node", "Pod")}


async def test_schema_version_written_then_checked(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    first = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await first.open()
    assert await redis_conn.client.get(first.keys.schema) == str(SCHEMA_VERSION).encode()
    later = SCHEMA_VERSION + 1
    newer = RedisStore(
        redis_conn.config, cluster_name, client=redis_conn.client, schema_version=later
    )
    with pytest.raises(SchemaError) as err:
        await newer.open()
    assert f"schema version {SCHEMA_VERSION}" in str(err.value)
    assert f"schema version {later}" in str(err.value)
    assert cluster_name in str(err.value)
    await first.open()  # the same version opens again


async def test_schema_changed_under_a_writer(redis_conn: RedisConn, cluster_name: str) -> None:
    """Another pyctl migrated the state after this one opened: its writes are refused whole."""
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await st.open()
    await st.apply([ev("ADDED", node("gpu-1"))], {"Node": "1"})
    before = await _state(st)
    await redis_conn.client.set(st.keys.schema, "7")
    with pytest.raises(SchemaError, match=rf"schema version 7.*schema version {SCHEMA_VERSION}"):
        await st.apply([ev("ADDED", node("gpu-2")), ev("DELETED", node("gpu-1"))], {"Node": "2"})
    with pytest.raises(SchemaError):
        await st.replace("Node", [node("gpu-3")], "3")
    with pytest.raises(SchemaError):
        await st.load("Node")
    await redis_conn.client.set(st.keys.schema, str(SCHEMA_VERSION))
    assert await _state(st) == before


async def test_refused_batch_leaves_no_partial_state(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    """A batch whose last kind cannot be written writes none of the kinds before it."""
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await st.open()
    await st.apply([ev("ADDED", node("gpu-1")), ev("ADDED", pod("ns", "a"))], {"Node": "1"})
    before = await _state(st)
    await redis_conn.client.delete(st.keys.objects("Pod"))
    await redis_conn.client.set(st.keys.objects("Pod"), "not a hash")  # someone else's key
    with pytest.raises(StoreError, match=r"obj:Pod holds a string, not a hash.*nothing"):
        await st.apply(
            [ev("DELETED", node("gpu-1")), ev("ADDED", node("gpu-2")), ev("ADDED", pod("ns", "b"))],
            {"Node": "2", "Pod": "2"},
        )
    with pytest.raises(StoreError, match="not a hash"):
        await st.replace("Pod", [pod("ns", "c")], "3")
    assert await st.load("Node") == before["Node"]
    await redis_conn.client.delete(st.keys.objects("Pod"))


async def test_out_of_memory_leaves_no_partial_state(disposable_redis: RedisServer) -> None:
    """Redis at maxmemory refuses the whole batch, with a clear error; then takes it."""
    config = redis_config(disposable_redis.url)
    st = RedisStore(config, "oom")
    await st.open()
    try:
        await st.replace("Pod", [pod("ns", f"p-{i}") for i in range(100)], "1")
        before = await _state(st)
        await st.client.config_set("maxmemory", "1")
        batch = [ev("DELETED", pod("ns", f"p-{i}")) for i in range(50)]
        batch += [ev("ADDED", pod("ns", f"q-{i}")) for i in range(500)]
        with pytest.raises(StoreError, match="out of memory"):
            await st.apply(batch, {"Pod": "2"})
        await st.client.config_set("maxmemory", "0")
        assert await _state(st) == before
        await st.apply(batch, {"Pod": "2"})
        assert len((await st.load("Pod"))[0]) == 550
    finally:
        await st.close()


async def test_readers_never_see_half_a_replace(redis_conn: RedisConn, cluster_name: str) -> None:
    """Concurrent replaces of two generations and loads: every load is one whole generation."""
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await st.open()
    gens = {rv: [pod("ns", f"p-{i}", f"gpu-{rv}", rv=rv) for i in range(2000)] for rv in ("a", "b")}
    seen: set[str] = set()

    async def writer() -> None:
        for i in range(6):
            rv = "ab"[i % 2]
            await st.replace("Pod", gens[rv], rv)

    async def reader() -> None:
        for _ in range(15):
            records, rv = await st.load("Pod")
            if rv:
                assert {r.resource_version for r in records.values()} == {rv}
                assert len(records) == 2000
                seen.add(rv)
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(writer)
        tg.start_soon(reader)
        tg.start_soon(reader)
    assert seen


async def test_one_cluster_one_slot(redis_cluster: RedisClusterServers, cluster_name: str) -> None:
    """Every key a cluster's store, rate limiter and workflows write is on the slot of its hash
    tag (CLUSTER KEYSLOT on the real cluster); the federation index is outside it."""
    config = redis_config(redis_cluster.url, cluster=True)
    client = connect(config)
    try:
        st = RedisStore(config, cluster_name, client=client)
        await st.open()
        await st.apply([ev("ADDED", node("gpu-1")), ev("ADDED", pod("ns", "a"))], {"Node": "1"})
        await st.replace("PodDisruptionBudget", [], "1")
        await st.put_summary(b"{}", 30)
        limiter = RedisRateLimiter(client, config, cluster_name)
        assert (await limiter.acquire(every_kind_of_limit())).allowed
        workflows = RedisWorkflowStore(client, config, cluster_name)
        await workflows.put("compaction-1", b"{}", 0)

        keys = Keys(cluster_name)
        written: set[str] = set()
        for server in redis_cluster.nodes:
            node_client = aioredis.Redis(host="127.0.0.1", port=server.port)
            try:
                async for key in node_client.scan_iter(match=keys.pattern, count=1000):
                    written.add(key.decode())
            finally:
                await node_client.aclose()
        expected = {
            keys.schema,
            keys.resource_versions,
            keys.written,
            keys.objects("Node"),
            keys.objects("Pod"),
            keys.summary,
            keys.workflow_data,
            keys.workflow_versions,
        }
        assert expected <= written
        assert any(":rl:" in k for k in written)
        slot = redis_cluster.keyslot(keys.hash_tag)
        assert {redis_cluster.keyslot(k) for k in written} == {slot}
        # every name the schema can make, not only those written here
        named = [keys.objects(k) for k in ("NodeResourceTopology", "PodDisruptionBudget")]
        named += [keys.bucket("x"), keys.cooldown("x"), keys.slots("x"), keys.budget("x")]
        named += [keys.budget_seq("x")]
        assert {redis_cluster.keyslot(k) for k in named} == {slot}
        assert await client.zscore(members_key(), cluster_name) is not None
    finally:
        await close_client(client)


async def test_clusters_spread_over_the_masters(redis_cluster: RedisClusterServers) -> None:
    """Twelve clusters' states on the three masters: each on its own slot, all readable."""
    config = redis_config(redis_cluster.url, cluster=True)
    client = connect(config)
    try:
        names = [f"spread-{i}-{time.monotonic_ns()}" for i in range(12)]
        for name in names:
            st = RedisStore(config, name, client=client)
            await st.open()
            await st.replace("Node", [node(f"{name}-gpu")], name)
        owners = set()
        for name in names:
            st = RedisStore(config, name, client=client)
            await st.open()
            assert await st.load("Node") == ({f"{name}-gpu": node(f"{name}-gpu")}, name)
            owners.add(client.get_node_from_key(Keys(name).schema).port)  # type: ignore[union-attr]
        assert len(owners) >= 2
    finally:
        await close_client(client)


async def test_auth(redis_auth_server: RedisServer, cluster_name: str) -> None:
    url = redis_auth_server.url
    good = RedisStore(redis_config(url, password=AUTH_PASSWORD), cluster_name)
    await good.open()
    await good.apply([ev("ADDED", node("gpu-1"))], {"Node": "1"})
    assert await good.ping()
    await good.close()

    in_url = url.replace("redis://", f"redis://:{AUTH_PASSWORD}@")
    via_url = RedisStore(redis_config(in_url), cluster_name)
    await via_url.open()
    assert (await via_url.load("Node"))[1] == "1"
    await via_url.close()

    wrong_in_url = RedisStore(
        redis_config(url.replace("redis://", "redis://:not-the-password@")), cluster_name
    )
    with pytest.raises(StoreError, match="refused authentication") as err:
        await wrong_in_url.open()
    assert "not-the-password" not in str(err.value)
    await wrong_in_url.close()

    wrong = RedisStore(redis_config(url, password="not-the-password"), cluster_name)
    with pytest.raises(
        StoreError, match=r"refused authentication.*check the username and password"
    ):
        await wrong.open()
    assert not await wrong.ping()
    await wrong.close()

    missing = RedisStore(redis_config(url), cluster_name)
    with pytest.raises(StoreError, match="authentication"):
        await missing.open()
    await missing.close()


async def test_acl_user_with_only_pyctl_keys(
    redis_auth_server: RedisServer, cluster_name: str
) -> None:
    """A least-privilege ACL user (pyctl's keys, the commands it uses) is enough for everything."""
    admin = aioredis.Redis(host="127.0.0.1", port=redis_auth_server.port, password=AUTH_PASSWORD)
    try:
        await admin.acl_setuser(
            "pyctl",
            enabled=True,
            reset=True,
            passwords=["+pyctl-user-pw"],
            keys=["pyctl:*"],
            commands=[f"+{command}" for command in REDIS_COMMANDS],
        )
        config = redis_config(redis_auth_server.url, username="pyctl", password="pyctl-user-pw")
        st = RedisStore(config, cluster_name)
        await st.open()
        assert await st.ping()
        await st.apply([ev("ADDED", node("gpu-1"))], {"Node": "1"})
        await st.replace("Pod", [pod("ns", "a")], "2")
        assert (await st.load("Pod"))[1] == "2"
        await st.put_summary(b"{}", 30)
        await admin.zadd(members_key(), {f"{cluster_name}-ghost": 1.0})  # no summary: forgotten
        assert set(await st.get_members()) >= {cluster_name}
        assert await admin.zscore(members_key(), f"{cluster_name}-ghost") is None
        limiter = RedisRateLimiter(st.client, config, cluster_name)
        granted = await limiter.acquire(every_kind_of_limit())
        assert granted.receipt is not None
        assert not (await limiter.acquire(every_kind_of_limit())).allowed
        assert await limiter.refund(granted.receipt)
        assert not await limiter.refund(granted.receipt)
        await limiter.start_cooldown("node/x", 10)
        assert await limiter.cooldown_remaining("node/x") > 0
        assert await limiter.renew_slot(every_kind_of_limit().slot)  # type: ignore[arg-type]
        assert set(await limiter.slot_holders("mig-reconfiguration")) == {"wf-1"}
        await limiter.release_slot("mig-reconfiguration", "wf-1")
        workflows = RedisWorkflowStore(st.client, config, cluster_name)
        assert await workflows.put("w", b"x", 0) == 1
        assert await workflows.get("w") is not None
        assert set(await workflows.list()) == {"w"}
        await workflows.delete("w", 1)
        # keys outside ~pyctl:* (another prefix) are denied, with a clear error
        other = RedisStore(replace(config, key_prefix="other"), cluster_name)
        with pytest.raises(StoreError, match="denied a command to this user"):
            await other.open()
        await other.close()
        await st.close()
    finally:
        await admin.acl_deluser("pyctl")
        await admin.aclose()


async def test_tls(redis_tls_server: RedisServer, tls_files: Tls, cluster_name: str) -> None:
    url = redis_tls_server.url
    assert url.startswith("rediss://")
    st = RedisStore(redis_config(url, ssl_ca_file=str(tls_files.ca)), cluster_name)
    await st.open()
    await st.replace("Node", [node("gpu-1")], "1")
    assert await st.load("Node") == ({"gpu-1": node("gpu-1")}, "1")
    await st.close()

    mutual = redis_config(
        url,
        ssl_ca_file=str(tls_files.ca),
        ssl_cert_file=str(tls_files.cert),
        ssl_key_file=str(tls_files.key),
    )
    st = RedisStore(mutual, cluster_name)
    await st.open()
    await st.close()

    untrusted = RedisStore(redis_config(url), cluster_name)  # the system CAs do not know it
    with pytest.raises(StoreError, match=r"cannot reach.*certificate verify failed"):
        await untrusted.open()
    await untrusted.close()

    plain = RedisStore(redis_config(url.replace("rediss://", "redis://")), cluster_name)
    with pytest.raises(StoreError, match=r"redis at redis://127\.0\.0\.1"):
        await plain.open()
    await plain.close()


async def test_redis_killed_then_back(disposable_redis: RedisServer) -> None:
    """Killed: clear StoreErrors and ping() False, quickly. Back (empty: nothing was persisted):
    writes say the state was lost; reopened and relisted, everything works again."""
    st = RedisStore(redis_config(disposable_redis.url), "killed")
    await st.open()
    pods = [pod("ns", f"p-{i}") for i in range(10)]
    await st.replace("Pod", pods, "10")

    disposable_redis.kill()
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"cannot reach redis at redis://127\.0\.0\.1"):
        await st.apply([ev("ADDED", node("gpu-1"))], {"Node": "1"})
    with pytest.raises(StoreError, match="cannot reach"):
        await st.load("Pod")
    assert not await st.ping()
    assert time.monotonic() - started < 5

    disposable_redis.start()  # same port, empty
    assert await st.ping()
    with pytest.raises(StateLostError, match="lost pyctl's state"):
        await st.apply([ev("ADDED", node("gpu-1"))], {"Node": "1"})
    with pytest.raises(StateLostError):
        await st.load("Pod")
    await st.open()
    await st.replace("Pod", pods, "11")
    assert await st.load("Pod") == ({record_key(p): p for p in pods}, "11")
    await st.apply([ev("ADDED", node("gpu-1"))], {"Node": "12"})
    await st.close()


async def test_redis_not_answering(disposable_redis: RedisServer) -> None:
    """A Redis that stops answering (SIGSTOP) makes calls fail after the socket timeout instead
    of hanging; when it answers again, the same store goes on with its data intact."""
    config = redis_config(disposable_redis.url, socket_timeout=0.3, connect_timeout=0.3)
    st = RedisStore(config, "paused")
    await st.open()
    await st.replace("Node", [node("gpu-1")], "1")
    disposable_redis.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"did not answer within 0\.3s"):
            await st.apply([ev("ADDED", node("gpu-2"))], {"Node": "2"})
        assert not await st.ping()
        assert time.monotonic() - started < 5
    finally:
        disposable_redis.resume()
    assert await st.ping()
    await st.apply([ev("ADDED", node("gpu-2"))], {"Node": "2"})
    assert await st.load("Node") == ({"gpu-1": node("gpu-1"), "gpu-2": node("gpu-2")}, "2")
    await st.close()


async def test_unreachable_address_is_a_store_error(cluster_name: str) -> None:
    from tests.redis_servers import free_port

    config = RedisConfig(url=f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5, retries=0)
    st = RedisStore(config, cluster_name)
    with pytest.raises(StoreError, match=r"cannot reach redis at redis://127\.0\.0\.1"):
        await st.open()
    assert not await st.ping()
    await st.close()


async def test_undecodable_records_are_quarantined_one_at_a_time(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    metrics = Metrics()
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client, metrics=metrics)
    await st.open()
    await st.replace("Node", [node("gpu-1"), node("gpu-3")], "1")
    c = redis_conn.client
    await c.hset(st.keys.objects("Node"), "gpu-2", b"{not a record")
    await c.hset(st.keys.objects("Node"), "gpu-4", encode_record(node("gpu-4", gpus=10**6)))
    await c.hset(st.keys.objects("Node"), b"\xff\xfe", encode_record(node("gpu-5")))
    # the good records load; each bad one is moved aside with why, and counted
    assert await st.load("Node") == ({"gpu-1": node("gpu-1"), "gpu-3": node("gpu-3")}, "1")
    q = await st.quarantined("Node")
    assert set(q) == {"gpu-2", "gpu-4", "\ufffd\ufffd"}
    assert q["gpu-2"][0] == b"{not a record"
    assert "outside 0..1024" in q["gpu-4"][1]
    assert set(await c.hkeys(st.keys.objects("Node"))) == {b"gpu-1", b"gpu-3"}
    counted = metrics.registry.get_sample_value(
        "pyctl_quarantined_records_total", {"cluster": st.cluster, "store": "objects"}
    )
    assert counted == 3
    assert await st.load("Node") == ({"gpu-1": node("gpu-1"), "gpu-3": node("gpu-3")}, "1")
    await st.replace("Node", [node("gpu-1")], "2")  # a relist writes the kind again
    assert await st.load("Node") == ({"gpu-1": node("gpu-1")}, "2")
