"""Federation summaries: members publish into a shared Redis (single and Cluster), every member
sees every other; a member without a heartbeat within its TTL is still shown, marked stale; after
the retention its summary and its index entry are gone."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from pyctl.state.keys import members_key
from pyctl.state.memory import MemoryStore
from pyctl.state.redis_store import RedisStore

from .conftest import RedisConn

pytestmark = pytest.mark.anyio


@pytest.mark.redis
async def test_members_fresh_stale_and_gone(redis_conn: RedisConn, cluster_name: str) -> None:
    config, client = redis_conn.config, redis_conn.client
    fresh = RedisStore(config, f"{cluster_name}-fresh", client=client)
    stale = RedisStore(config, f"{cluster_name}-stale", client=client)
    gone = RedisStore(replace(config, summary_retention_seconds=1), f"{cluster_name}-gone")
    for st in (fresh, stale, gone):
        await st.open()
    try:
        await fresh.put_summary(b"fresh", ttl_seconds=60)
        await stale.put_summary(b"stale", ttl_seconds=1)
        await gone.put_summary(b"gone", ttl_seconds=1)
        members = await fresh.get_members()
        assert {m.summary for c, m in members.items() if c.startswith(cluster_name)} == {
            b"fresh",
            b"stale",
            b"gone",
        }
        assert not any(m.stale for c, m in members.items() if c.startswith(cluster_name))

        await anyio.sleep(1.3)
        members = await stale.get_members()  # any member sees all of them
        assert members[fresh.cluster].summary == b"fresh"
        assert not members[fresh.cluster].stale
        assert members[stale.cluster].summary == b"stale"  # still readable...
        assert members[stale.cluster].stale  # ...and marked
        assert members[stale.cluster].age_seconds > 1
        assert gone.cluster not in members  # past its retention
        assert await client.zscore(members_key(), gone.cluster) is None  # dropped from the index
        summaries = await fresh.get_summaries()
        assert summaries[fresh.cluster] == b"fresh"
        assert stale.cluster not in summaries

        await stale.put_summary(b"stale, back", ttl_seconds=1)  # a heartbeat: fresh again
        back = (await fresh.get_members())[stale.cluster]
        assert back.summary == b"stale, back"
        assert not back.stale
    finally:
        for st in (fresh, stale, gone):
            await st.close()


@pytest.mark.redis
async def test_index_is_outside_every_cluster_slot(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await st.open()
    await st.put_summary(b"x", 10)
    assert st.keys.members == "pyctl:federation:members"
    assert "{" not in st.keys.members
    assert await redis_conn.client.zscore("pyctl:federation:members", cluster_name) is not None


async def test_memory_store_marks_stale() -> None:
    now = [100.0]
    st = MemoryStore("solo", clock=lambda: now[0])
    await st.open()
    await st.put_summary(b"s", ttl_seconds=10)
    now[0] += 10
    assert not (await st.get_members())["solo"].stale
    assert await st.get_summaries() == {"solo": b"s"}
    now[0] += 0.5
    member = (await st.get_members())["solo"]
    assert member.stale
    assert member.age_seconds == pytest.approx(10.5)
    assert await st.get_summaries() == {}


@pytest.mark.redis
async def test_many_members(redis_conn: RedisConn, cluster_name: str) -> None:
    stores = [
        RedisStore(redis_conn.config, f"{cluster_name}-{i}", client=redis_conn.client)
        for i in range(70)
    ]
    for i, st in enumerate(stores):
        await st.open()
        await st.put_summary(f"summary {i}".encode(), ttl_seconds=60)
    members = await stores[0].get_members()
    mine = {c: m.summary for c, m in members.items() if c.startswith(f"{cluster_name}-")}
    assert mine == {st.cluster: f"summary {i}".encode() for i, st in enumerate(stores)}
