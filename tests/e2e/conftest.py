"""Fixtures of the e2e tier: one real control plane per test session (see control_plane.py)."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client, config

from pyctl.cluster.records import Event, Kind, ObjectRef, Record, record_key
from pyctl.controller.cache import ClusterCache
from pyctl.dev.control_plane import (
    Binaries,
    ControlPlane,
    ControlPlaneError,
    ExtraApiserver,
    ensure_binaries,
)
from tests.redis_servers import RedisServer, RedisServerError, find_binaries

_started: list[ControlPlane] = []


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def control_plane_binaries(tmp_path_factory: pytest.TempPathFactory) -> Binaries:
    """The built binaries; builds them (once, about 11 minutes) if they are missing."""
    try:
        return ensure_binaries(tmp_path_factory.mktemp("control-plane-build") / "build.log")
    except ControlPlaneError as exc:
        failure = str(exc)
    pytest.fail(failure, pytrace=False)  # outside `except`: no chained duplicate of the message


@pytest.fixture(scope="session")
def control_plane(
    control_plane_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, on 127.0.0.1.

    A start failure fails the test (it does not skip), naming the component and its log tail.
    """
    # kubernetes_asyncio's aiohttp session honours HTTP(S)_PROXY: keep loopback off any proxy.
    with pytest.MonkeyPatch.context() as mp:
        no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
        mp.setenv("NO_PROXY", no_proxy)
        mp.setenv("no_proxy", no_proxy)
        plane = ControlPlane(
            control_plane_binaries, tmp_path_factory.mktemp("control-plane"), audit=True
        )
        failure = None
        try:
            plane.start()
        except ControlPlaneError as exc:
            failure = str(exc)
        if failure is not None:
            pytest.fail(failure, pytrace=False)  # a failed start fails the tests, never skips them
        _started.append(plane)
        try:
            yield plane
        finally:
            plane.stop()


@pytest.fixture
async def api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """A kubernetes_asyncio client for the test control plane (cluster admin)."""
    api_client = await config.new_client_from_config(
        config_file=str(control_plane.kubeconfig), persist_config=False
    )
    async with api_client:
        yield api_client


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server for one test (the crash tests' workflow store and limits)."""
    try:
        server = RedisServer(find_binaries(), tmp_path, name="crash")
        server.start()
    except RedisServerError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def nocache_apiserver(control_plane: ControlPlane) -> Iterator[ExtraApiserver]:
    """A second kube-apiserver on the same etcd without a watch cache: watches go to etcd, so a
    compacted resourceVersion gets 410 Gone. Tests may stop it (to drop every watch) and must
    start it again before they end."""
    extra = ExtraApiserver(control_plane, "nocache", ["--watch-cache=false"])
    failure = None
    try:
        extra.start()
    except ControlPlaneError as exc:
        failure = str(exc)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    try:
        yield extra
    finally:
        extra.stop()


class CacheSink:
    """An EventSink feeding a `ClusterCache`, recording what it was told (for the kube tests)."""

    def __init__(self) -> None:
        self.cache = ClusterCache()
        self.rv: dict[Kind, str] = {}
        self.replaced: Counter[Kind] = Counter()
        self.applied: Counter[str] = Counter()
        self.decode_errors: list[tuple[Kind, str]] = []
        self.decode_refs: list[tuple[str, ObjectRef | None]] = []
        #: (event type, record key, resourceVersion) of every event, in order
        self.log: list[tuple[str, str, str]] = []
        self.changed = anyio.Event()

    def _poke(self) -> None:
        event, self.changed = self.changed, anyio.Event()
        event.set()

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        self.cache.replace(kind, records)
        self.rv[kind] = resource_version
        self.replaced[kind] += 1
        self._poke()

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        self.cache.apply(events)
        self.rv.update(resource_versions)
        for ev in events:
            self.applied[ev.type] += 1
            self.log.append((ev.type, record_key(ev.record), ev.record.resource_version))
        self._poke()

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        self.decode_errors.append((kind, message))
        self.decode_refs.append((reason, ref))


class WaitTimeout(AssertionError):
    """`wait_until` gave up. An AssertionError, not `pytest.fail()`'s BaseException: raised inside
    a task group, a BaseException makes a BaseExceptionGroup, which stops anyio's pytest runner
    task, and every async fixture's teardown then fails with `ClosedResourceError`, hiding this
    message behind it."""


def not_scheduled(pod: Any) -> Any | None:
    """The pod's `PodScheduled=False` condition (the scheduler found no node, or a gate holds it
    back), None while it has none."""
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return c
    return None


async def if_present(call: Awaitable[Any]) -> None:
    """Awaits `call` (a delete), an object already gone (404) ignored."""
    try:
        await call
    except client.ApiException as exc:
        if exc.status != 404:
            raise


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]], what: str, within: float = 15.0
) -> None:
    """Poll `check` (every 50 ms) until it is true; fail naming `what` after `within` s."""
    with anyio.move_on_after(within):
        while True:
            got = check()
            if not isinstance(got, bool):
                got = await got
            if got:
                return
            await anyio.sleep(0.05)
    raise WaitTimeout(f"timed out after {within:.0f} s waiting for {what}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for plane in _started:
        terminalreporter.write_line(f"e2e control plane: {plane.describe()}")
