"""End to end: a real Prometheus server (Debian's package) scrapes a running `pyctl run` (the
built-in simulated cluster at high speed) and evaluates the fragmentation alert of
deploy/monitoring/rules.yaml, with its `for:` shortened; the test reads Prometheus's alerts API
until the alert fires. Everything runs on loopback in a temporary directory, with bounded waits,
and is stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .promtool import RULES, binary

ALERT = "PyctlFragmentationHigh"
STARTUP_TIMEOUT = 30.0
FIRE_TIMEOUT = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
        return body


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the process exited ({proc.returncode}):\n{_tail(log)}")
        try:
            last = check()
        except OSError as e:
            last = e
        else:
            if last:
                return last
        time.sleep(0.25)
    pytest.fail(f"{what}: not within {timeout:g}s (last: {last!r})\n{_tail(log)}")


def _tail(log: Path, n: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _short_rules(path: Path) -> None:
    """The fragmentation alert exactly as deployed, with `for: 3s` instead of 30 minutes."""
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    rules = [r for g in groups for r in g["rules"] if r.get("alert") == ALERT]
    assert len(rules) == 1
    rules[0]["for"] = "3s"
    path.write_text(yaml.safe_dump({"groups": [{"name": "e2e", "rules": rules}]}))


@pytest.fixture
def pyctl_run(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    port = _free_port()
    log = tmp_path / "pyctl.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    env["PYCTL_CLUSTER"] = "e2e"
    args = ["run", "--forever", "--speed", "2000", "--no-live", "--metrics-port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyctl.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        yield port, proc, log
    finally:
        _stop(proc)


@pytest.fixture
def prometheus(
    tmp_path: Path, pyctl_run: tuple[int, subprocess.Popen[bytes], Path]
) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    exe = binary("prometheus")
    target_port = pyctl_run[0]
    port = _free_port()
    rules = tmp_path / "rules.yaml"
    _short_rules(rules)
    config = tmp_path / "prometheus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "pyctl-metrics",
                        "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
                    }
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
    try:
        yield port, proc, log
    finally:
        _stop(proc)


def test_fragmentation_alert_fires(
    pyctl_run: tuple[int, subprocess.Popen[bytes], Path],
    prometheus: tuple[int, subprocess.Popen[bytes], Path],
) -> None:
    metrics_port, pyctl_proc, pyctl_log = pyctl_run
    port, prom_proc, prom_log = prometheus
    api = f"http://127.0.0.1:{port}/api/v1"

    _wait(
        "pyctl serves /metrics",
        lambda: b"pyctl_nodes" in _get(f"http://127.0.0.1:{metrics_port}/metrics"),
        STARTUP_TIMEOUT,
        pyctl_proc,
        pyctl_log,
    )
    _wait(
        "prometheus is ready",
        lambda: _get(f"http://127.0.0.1:{port}/-/ready").startswith(b"Prometheus"),
        STARTUP_TIMEOUT,
        prom_proc,
        prom_log,
    )

    def target_up() -> bool:
        targets = json.loads(_get(f"{api}/targets"))["data"]["activeTargets"]
        return any(t["health"] == "up" for t in targets)

    _wait("prometheus scrapes pyctl", target_up, STARTUP_TIMEOUT, prom_proc, prom_log)

    def alerts() -> list[dict[str, Any]]:
        data = json.loads(_get(f"{api}/alerts"))["data"]["alerts"]
        return [a for a in data if a["labels"].get("alertname") == ALERT]

    def firing() -> list[dict[str, Any]]:
        assert pyctl_proc.poll() is None, _tail(pyctl_log)
        return [a for a in alerts() if a["state"] == "firing"]

    fired = _wait("the fragmentation alert fires", firing, FIRE_TIMEOUT, prom_proc, prom_log)
    alert = fired[0]
    assert alert["labels"] == {"alertname": ALERT, "cluster": "e2e", "severity": "warning"}
    assert "cluster e2e" in alert["annotations"]["summary"]
    assert alert["annotations"]["runbook"].strip()
    assert float(alert["value"]) > 0.3  # the fragmentation ratio that fired it
    # and Prometheus holds the scraped series the alert was computed from
    q = urllib.parse.quote('max_over_time(pyctl_gpu_fragment_gpus{cluster="e2e"}[5m]) >= 1')
    assert json.loads(_get(f"{api}/query?query={q}"))["data"]["result"]
