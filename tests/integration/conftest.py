"""Fixtures of the integration tier: real Redis servers on loopback (see tests/redis_servers.py).

Each server is started once per session, only when a test asks for it, and stopped at the end
even on failure. A missing redis-server fails the tests that need it (it never skips them).
Tests share the servers; each uses its own cluster name, so their keys never meet.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from pyctl.state.memory import MemoryStore
from pyctl.state.redis_client import RedisClient, RedisConfig, close_client, connect
from pyctl.state.redis_store import RedisStore
from tests.redis_servers import (
    Binaries,
    RedisClusterServers,
    RedisServer,
    RedisServerError,
    Tls,
    find_binaries,
    make_certificates,
)

AUTH_PASSWORD = "pyctl-test-secret"

S = TypeVar("S", RedisServer, RedisClusterServers)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def redis_binaries() -> Binaries:
    try:
        return find_binaries()
    except RedisServerError as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


def _run(server: S) -> Iterator[S]:
    failure = None
    try:
        server.start()
    except RedisServerError as exc:
        failure = str(exc)
    if failure is not None:
        server.stop()
        pytest.fail(failure, pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_server(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """One plain redis-server shared by the session."""
    yield from _run(RedisServer(redis_binaries, tmp_path_factory.mktemp("redis"), name="single"))


@pytest.fixture(scope="session")
def redis_cluster(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterServers]:
    """A three-master Redis Cluster shared by the session."""
    yield from _run(RedisClusterServers(redis_binaries, tmp_path_factory.mktemp("redis-cluster")))


@pytest.fixture(scope="session")
def redis_auth_server(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A redis-server with `requirepass` (AUTH)."""
    server = RedisServer(
        redis_binaries, tmp_path_factory.mktemp("redis-auth"), name="auth", password=AUTH_PASSWORD
    )
    yield from _run(server)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    try:
        return make_certificates(tmp_path_factory.mktemp("redis-tls-certs"))
    except RedisServerError as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def redis_tls_server(
    redis_binaries: Binaries, tls_files: Tls, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A redis-server that speaks TLS only."""
    server = RedisServer(
        redis_binaries, tmp_path_factory.mktemp("redis-tls"), name="tls", tls=tls_files
    )
    yield from _run(server)


@pytest.fixture
def disposable_redis(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    """A redis-server of this test's own, for tests that kill or pause it."""
    yield from _run(RedisServer(redis_binaries, tmp_path_factory.mktemp("redis-own"), name="own"))


@pytest.fixture
def cluster_name() -> str:
    """A cluster name no other test uses (the servers are shared)."""
    return f"test-{uuid.uuid4().hex[:10]}"


def redis_config(url: str, **overrides: Any) -> RedisConfig:
    """Short timeouts and few retries: a failure shows in well under a second or two."""
    settings: dict[str, Any] = {
        "url": url,
        "socket_timeout": 2.0,
        "connect_timeout": 1.0,
        "retries": 1,
        "retry_backoff_base": 0.01,
        "retry_backoff_cap": 0.05,
    }
    settings.update(overrides)
    return RedisConfig(**settings)


def config_for(request: pytest.FixtureRequest, mode: str) -> RedisConfig:
    """The config of a `redis` or `redis-cluster` parameter (starts the server if needed)."""
    if mode == "redis-cluster":
        servers: RedisClusterServers = request.getfixturevalue("redis_cluster")
        return redis_config(servers.url, cluster=True)
    server: RedisServer = request.getfixturevalue("redis_server")
    return redis_config(server.url)


STORE_MODES = [
    "memory",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]
REDIS_MODES = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]


@pytest.fixture(params=STORE_MODES)
async def store(
    request: pytest.FixtureRequest, cluster_name: str
) -> AsyncIterator[MemoryStore | RedisStore]:
    """An open store of each kind: in memory, on a single Redis, on Redis Cluster."""
    mode: str = request.param
    st: MemoryStore | RedisStore
    st = (
        MemoryStore(cluster_name)
        if mode == "memory"
        else RedisStore(config_for(request, mode), cluster_name)
    )
    await st.open()
    try:
        yield st
    finally:
        await st.close()


@dataclass
class RedisConn:
    mode: str
    config: RedisConfig
    client: RedisClient


@pytest.fixture(params=REDIS_MODES)
async def redis_conn(request: pytest.FixtureRequest) -> AsyncIterator[RedisConn]:
    """A client (and its config) on a single Redis, and on Redis Cluster."""
    config = config_for(request, request.param)
    client = connect(config)
    try:
        yield RedisConn(request.param, config, client)
    finally:
        await close_client(client)
