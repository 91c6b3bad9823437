"""`pyctl dev up` (what `make cluster` runs) as a user runs it: started as a process, it prints the
kubeconfig, the real `kubectl` reads the cluster with it, pyctl compacts the fragmenting workload
(the 4-GPU replica gets placed, pyctl's PyctlCompaction Events name the evicted replicas) and
re-partitions the MIG node; then Ctrl-C (SIGINT) stops it, exit code 0, and no process it started
is left (none has its work directory on its command line)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.deploy.tools import kubectl

pytestmark = [pytest.mark.e2e]


def _ours(work: Path) -> list[str]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(work) in cmd:
            out.append(f"{pid} {cmd[:200]}")
    return out


def test_dev_up_compacts_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    work = tmp_path / "dev-cluster"
    log = tmp_path / "dev-up.out"
    argv = [sys.executable, "-m", "pyctl.cli.main", "dev", "up", "--no-live", "--nodes", "2"]
    argv += ["--pause", "5", "--work-dir", str(work)]
    env = {**os.environ, "COLUMNS": "200"}
    # A test run started in the background by a shell without job control ignores SIGINT, and an
    # ignored signal stays ignored across exec: dev up would never see the Ctrl-C. A signal with a
    # handler is reset to its default in the new program, so it is given one around the start.
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    finally:
        signal.signal(signal.SIGINT, old)
    try:
        deadline = time.monotonic() + 240
        while not re.search(r"MIG demand served", log.read_text()):
            assert proc.poll() is None, f"dev up exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no compaction/MIG in 240 s:\n{log.read_text()}"
            time.sleep(0.5)
        text = log.read_text()
        kubeconfig = Path(re.search(r"kubeconfig: (\S+)", text).group(1))  # type: ignore[union-attr]
        assert kubeconfig == work / "admin.kubeconfig"
        pods = kubectl(kubeconfig, "get", "pods", "-A").stdout
        assert "web-small" in pods
        assert re.search(r"llm-big placed on gpu-\d after", text), text
        # the 4-GPU replica waits: pyctl rescues it, evicting a small replica off its node
        assert re.search(r"event PyctlRescue Pod/web-small-\S+: evicted from gpu-\d", text), text
        assert "MIG re-partitioned" in text, text
        assert _ours(work), "no process of the dev cluster found while it runs"
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "stopping (Ctrl-C)" in text
    assert re.search(
        r"stopped: pyctl, kube-scheduler-pyctl, kwok, kube-scheduler, "
        r"kube-controller-manager, kube-apiserver, etcd",
        text,
    ), text
    left = _ours(work)
    assert not left, f"processes left after Ctrl-C: {left}"
    print("\n" + "\n".join(line for line in text.splitlines() if line.strip())[-3000:])
