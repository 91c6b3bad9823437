"""The `StateStore` contract, run against every store: in memory, on a real single Redis, and on a
real three-master Redis Cluster (the `store` fixture is parametrised over the three)."""

from __future__ import annotations

import pytest

from pyctl.cluster.records import KINDS, record_key
from pyctl.state.memory import MemoryStore
from pyctl.state.redis_store import CHUNK, RedisStore
from pyctl.state.store import StateReader, StateStore, StoreError

from .records import ev, node, nrt, pdb, pod

pytestmark = pytest.mark.anyio

Store = MemoryStore | RedisStore


async def test_is_a_state_store(store: Store) -> None:
    assert isinstance(store, StateStore)
    assert await store.ping()


async def test_empty_store_loads_nothing(store: Store) -> None:
    for kind in KINDS:
        assert await store.load(kind) == ({}, "")


async def test_apply_round_trip(store: Store) -> None:
    n1, n2 = node("gpu-1"), node("gpu-2", gpus=4)
    p1, p2 = pod("ml", "llama-0", "gpu-1"), pod("ml", "llama-1")
    await store.apply(
        [ev("ADDED", n1), ev("ADDED", n2), ev("ADDED", p1), ev("ADDED", p2)],
        {"Node": "100", "Pod": "101"},
    )
    await store.apply([ev("ADDED", pdb("ml", "llama")), ev("ADDED", nrt("gpu-1"))], {})
    assert await store.load("Node") == ({"gpu-1": n1, "gpu-2": n2}, "100")
    assert await store.load("Pod") == ({"ml/llama-0": p1, "ml/llama-1": p2}, "101")
    assert await store.load("PodDisruptionBudget") == ({"ml/llama": pdb("ml", "llama")}, "")
    assert await store.load("NodeResourceTopology") == ({"gpu-1": nrt("gpu-1")}, "")

    p2_bound = pod("ml", "llama-1", "gpu-2", rv="2")
    await store.apply(
        [ev("MODIFIED", p2_bound), ev("DELETED", p1), ev("DELETED", n1)],
        {"Pod": "102", "Node": "103", "PodDisruptionBudget": "104"},
    )
    assert await store.load("Pod") == ({"ml/llama-1": p2_bound}, "102")
    assert await store.load("Node") == ({"gpu-2": n2}, "103")
    assert (await store.load("PodDisruptionBudget"))[1] == "104"


async def test_resource_versions_alone(store: Store) -> None:
    """A batch of bookmarks only moves resourceVersions."""
    await store.apply([ev("ADDED", node("gpu-1"))], {"Node": "5"})
    await store.apply([], {"Node": "9", "Pod": "7"})
    assert await store.load("Node") == ({"gpu-1": node("gpu-1")}, "9")
    assert await store.load("Pod") == ({}, "7")
    await store.apply([], {})  # nothing at all: a no-op
    assert (await store.load("Node"))[1] == "9"


async def test_last_event_of_an_object_wins(store: Store) -> None:
    a, b = pod("ns", "a"), pod("ns", "b")
    await store.apply([ev("ADDED", a), ev("DELETED", a), ev("DELETED", b), ev("ADDED", b)], {})
    assert (await store.load("Pod"))[0] == {"ns/b": b}
    b2 = pod("ns", "b", "gpu-1", rv="3")
    await store.apply([ev("MODIFIED", b2), ev("DELETED", pod("ns", "ghost"))], {"Pod": "3"})
    assert await store.load("Pod") == ({"ns/b": b2}, "3")


async def test_replace_is_the_whole_kind(store: Store) -> None:
    await store.apply(
        [ev("ADDED", pod("ns", "old")), ev("ADDED", node("gpu-1"))], {"Pod": "1", "Node": "1"}
    )
    fresh = [pod("ns", f"new-{i}") for i in range(5)]
    await store.replace("Pod", fresh, "50")
    assert await store.load("Pod") == ({record_key(p): p for p in fresh}, "50")
    assert await store.load("Node") == ({"gpu-1": node("gpu-1")}, "1")  # other kinds untouched
    await store.replace("Pod", [], "51")
    assert await store.load("Pod") == ({}, "51")


async def test_large_batches(store: Store) -> None:
    """Several script chunks' worth of arguments, in one replace and in one apply."""
    n = CHUNK * 3 + 17
    pods = [pod(f"ns-{i % 7}", f"p-{i}", f"gpu-{i % 50}") for i in range(n)]
    await store.replace("Pod", pods, "1000")
    loaded, rv = await store.load("Pod")
    assert rv == "1000"
    assert loaded == {record_key(p): p for p in pods}

    moved = [pod(p.namespace, p.name, "gpu-x", rv="2") for p in pods[: n // 2]]
    gone = pods[n // 2 :]
    await store.apply(
        [ev("MODIFIED", p) for p in moved] + [ev("DELETED", p) for p in gone], {"Pod": "1001"}
    )
    assert await store.load("Pod") == ({record_key(p): p for p in moved}, "1001")


async def test_summary_of_this_cluster(store: Store) -> None:
    await store.put_summary(b'{"idle_gpus": 3}', ttl_seconds=30)
    assert (await store.get_summaries())[store.cluster] == b'{"idle_gpus": 3}'
    member = (await store.get_members())[store.cluster]
    assert member.summary == b'{"idle_gpus": 3}'
    assert member.ttl_seconds == 30
    assert 0 <= member.age_seconds < 5
    assert not member.stale


async def test_closed_store_refuses(store: Store) -> None:
    await store.close()
    assert not await store.ping()
    with pytest.raises(StoreError, match=r"not open|closed"):
        await store.apply([ev("ADDED", node("gpu-1"))], {})
    with pytest.raises(StoreError, match=r"not open|closed"):
        await store.load("Node")


# ---- reading back (`StateReader`: pyctl status, pyctl explain) ---------------------------------


async def test_read_is_every_kind_at_one_instant(store: Store) -> None:
    assert isinstance(store, StateReader)
    n1, p1 = node("gpu-1", rv="7"), pod("ml", "llama-0", "gpu-1", rv="9")
    await store.apply([ev("ADDED", n1), ev("ADDED", p1)], {"Node": "100", "Pod": "101"})
    await store.replace("PodDisruptionBudget", [pdb("ml", "llama")], "102")
    state = await store.read()
    assert state.cluster == store.cluster
    assert set(state.kinds) == set(KINDS)
    assert state.records("Node") == {"gpu-1": n1}
    assert state.records("Pod") == {"ml/llama-0": p1}
    assert state.records("PodDisruptionBudget") == {"ml/llama": pdb("ml", "llama")}
    assert state.kinds["Node"].resource_version == "100"
    assert state.kinds["PodDisruptionBudget"].resource_version == "102"
    assert state.skipped == []
    # written: by the store's clock, for the kinds written only
    for kind in ("Node", "Pod", "PodDisruptionBudget"):
        written = state.kinds[kind].written
        assert written is not None, kind
        assert 0 <= state.now - written < 5, kind
    assert state.kinds["ResourceSlice"].written is None
    # the same records `load` gives
    for kind in KINDS:
        records, rv = await store.load(kind)
        assert state.records(kind) == records
        assert state.kinds[kind].resource_version == rv


async def test_read_summary_of_this_cluster(store: Store) -> None:
    assert await store.read_summary() is None
    await store.put_summary(b'{"nodes": 3}', ttl_seconds=30)
    got = await store.read_summary()
    assert got is not None
    assert got.summary == b'{"nodes": 3}'
    assert got.ttl_seconds == 30
    assert 0 <= got.age_seconds < 5


async def test_a_record_beyond_the_bounds_is_quarantined_on_load(store: Store) -> None:
    """Stored records are held to pyctl.cluster.bounds when read back: one beyond them (written
    by anything) is moved aside, never fatal, and the others load."""
    good, bad = node("gpu-1"), node("gpu-2", gpus=10**6)
    await store.apply([ev("ADDED", good), ev("ADDED", bad)], {"Node": "1"})
    assert await store.load("Node") == ({"gpu-1": good}, "1")
    assert set(await store.quarantined("Node")) == {"gpu-2"}
    assert await store.load("Node") == ({"gpu-1": good}, "1")
