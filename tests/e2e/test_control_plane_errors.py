"""When the control plane can't start, the e2e tier fails naming the component and the reason.

None of these needs a full control plane: the first component that fails stops the start.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyctl.dev.control_plane import (
    APISERVER,
    ETCD,
    Binaries,
    ControlPlane,
    ControlPlaneError,
    Ports,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120, func_only=True)]


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A 127.0.0.1 port with a listener on it for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_missing_binary_names_component_and_reason(tmp_path: Path) -> None:
    bogus = Binaries(bin_dir=tmp_path / "no-such-bin", kwok_stages=tmp_path / "stages.yaml")
    plane = ControlPlane(bogus, tmp_path / "plane", timeout=5)
    with pytest.raises(ControlPlaneError) as err:
        plane.start()
    assert err.value.component == ETCD
    message = str(err.value)
    assert message.startswith(f"control plane: {ETCD}: cannot execute {bogus.bin_dir / ETCD}")
    assert "No such file or directory" in message
    assert str(tmp_path / "plane" / "logs" / "etcd.log") in message
    assert plane.started == []


def test_occupied_etcd_port_fails_fast_with_log_tail(
    control_plane_binaries: Binaries, tmp_path: Path, occupied_port: int
) -> None:
    plane = ControlPlane(
        control_plane_binaries,
        tmp_path,
        ports=Ports.free(etcd_client=occupied_port),
        timeout=30,
    )
    t0 = time.monotonic()
    with pytest.raises(ControlPlaneError) as err:
        plane.start()
    assert time.monotonic() - t0 < 20, "an early exit is reported at once, not at the deadline"
    assert err.value.component == ETCD
    message = str(err.value)
    assert "exited with code" in message
    assert "a port it needs is already in use" in message
    assert f"127.0.0.1:{occupied_port}" in message  # from the log tail
    assert plane.started == [], "whatever was started is stopped again"


def test_occupied_apiserver_port_names_the_apiserver(
    control_plane_binaries: Binaries, tmp_path: Path, occupied_port: int
) -> None:
    plane = ControlPlane(
        control_plane_binaries,
        tmp_path,
        ports=Ports.free(apiserver=occupied_port),
        timeout=60,
    )
    with pytest.raises(ControlPlaneError) as err:
        plane.start()
    assert err.value.component == APISERVER
    assert "a port it needs is already in use" in str(err.value)
    assert err.value.log == tmp_path / "logs" / f"{APISERVER}.log"
    assert plane.started == [], "etcd, started first, was stopped again"


def test_rejected_flag_is_reported_with_the_components_own_words(
    control_plane_binaries: Binaries, tmp_path: Path
) -> None:
    plane = ControlPlane(
        control_plane_binaries,
        tmp_path,
        components=(ETCD, APISERVER),
        extra_args={APISERVER: ["--no-such-flag=1"]},
        timeout=60,
    )
    with pytest.raises(ControlPlaneError) as err:
        plane.start()
    assert err.value.component == APISERVER
    message = str(err.value)
    assert "it rejected a command-line flag" in message
    assert "its last word: Error: unknown flag: --no-such-flag" in message
