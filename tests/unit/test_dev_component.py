"""A control-plane component of the dev harness (`pyctl.dev.control_plane.Component`) starts at
the niceness it is given (the scale bench runs the control plane below pyctl's priority)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pyctl.dev.control_plane import Component


def _niceness(pid: int) -> int:
    # /proc/<pid>/stat: the 19th field is the nice value (the 2nd, the name, is in parentheses)
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("nice", [0, 7])
def test_a_component_runs_at_its_niceness(tmp_path: Path, nice: int) -> None:
    c = Component("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"],
                  tmp_path / "sleeper.log", nice=nice)  # fmt: skip
    c.start()
    try:
        assert c.process is not None
        assert _niceness(c.process.pid) == os.nice(0) + nice
    finally:
        c.stop()
