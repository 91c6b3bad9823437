"""Workflow records: compare-and-set on a version, in memory, on Redis and on Redis Cluster; and
a race of writers on two clients where exactly one wins each round."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from pyctl.state.redis_client import close_client, connect
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.state.workflows import (
    ConflictError,
    MemoryWorkflowStore,
    WorkflowRecord,
    WorkflowStore,
)

from .conftest import STORE_MODES, config_for

pytestmark = pytest.mark.anyio


@pytest.fixture(params=STORE_MODES)
async def workflows(
    request: pytest.FixtureRequest, cluster_name: str
) -> AsyncIterator[WorkflowStore]:
    if request.param == "memory":
        yield MemoryWorkflowStore()
        return
    config = config_for(request, request.param)
    client = connect(config)
    try:
        yield RedisWorkflowStore(client, config, cluster_name)
    finally:
        await close_client(client)


async def test_compare_and_set(workflows: WorkflowStore) -> None:
    assert isinstance(workflows, WorkflowStore)
    assert await workflows.get("mig-gpu-1") is None
    assert await workflows.put("mig-gpu-1", b'{"step": "cordon"}', 0) == 1
    with pytest.raises(ConflictError) as err:  # created twice
        await workflows.put("mig-gpu-1", b'{"step": "cordon"}', 0)
    assert (err.value.expected, err.value.found) == (0, 1)
    assert "version 1" in str(err.value)

    assert await workflows.put("mig-gpu-1", b'{"step": "evict"}', 1) == 2
    with pytest.raises(ConflictError):  # a writer that read version 1 is too late
        await workflows.put("mig-gpu-1", b'{"step": "stale"}', 1)
    assert await workflows.get("mig-gpu-1") == WorkflowRecord("mig-gpu-1", 2, b'{"step": "evict"}')

    with pytest.raises(ConflictError, match="does not exist"):
        await workflows.put("never-created", b"x", 3)
    assert await workflows.get("never-created") is None


async def test_list_and_delete(workflows: WorkflowStore) -> None:
    await workflows.put("a", b"\x00binary\xff", 0)
    await workflows.put("b", b"", 0)
    await workflows.put("b", b"two", 1)
    assert await workflows.list() == {
        "a": WorkflowRecord("a", 1, b"\x00binary\xff"),
        "b": WorkflowRecord("b", 2, b"two"),
    }
    with pytest.raises(ConflictError):
        await workflows.delete("b", 1)
    await workflows.delete("b", 2)
    with pytest.raises(ConflictError) as err:
        await workflows.delete("b", 2)
    assert err.value.found == 0
    assert set(await workflows.list()) == {"a"}
    with pytest.raises(ValueError, match="workflow id"):
        await workflows.put("", b"x", 0)
    with pytest.raises(ValueError, match="expected_version"):
        await workflows.put("a", b"x", -1)


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["redis", "redis-cluster"])
async def test_racing_writers_on_two_clients(
    request: pytest.FixtureRequest, mode: str, cluster_name: str
) -> None:
    """Two replicas (two clients) race 10 writers per round on one record: one wins a round."""
    config = config_for(request, mode)
    clients = [connect(config), connect(config)]
    try:
        stores = [RedisWorkflowStore(c, config, cluster_name) for c in clients]
        await stores[0].put("run", b"0", 0)
        for round_ in range(1, 6):
            wins: list[int] = []

            async def write(i: int, version: int, wins: list[int] = wins) -> None:
                try:
                    await stores[i % 2].put("run", f"{version}:{i}".encode(), version)
                    wins.append(i)
                except ConflictError:
                    pass

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(write, i, round_)
            assert len(wins) == 1
            record = await stores[1].get("run")
            assert record == WorkflowRecord("run", round_ + 1, f"{round_}:{wins[0]}".encode())
    finally:
        for c in clients:
            await close_client(c)
