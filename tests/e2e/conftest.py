"""Fixtures of the e2e tier: one real control plane per test session (see control_plane.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
from kubernetes_asyncio import client, config

from .control_plane import Binaries, ControlPlane, ControlPlaneError, ensure_binaries

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
        plane = ControlPlane(control_plane_binaries, tmp_path_factory.mktemp("control-plane"))
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for plane in _started:
        terminalreporter.write_line(f"e2e control plane: {plane.describe()}")
