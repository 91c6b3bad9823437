"""`pyctl agent`: the CLI on the NVML double (`--nvml-fixture`, tests only), the loop's metrics
scraped from its real HTTP server, and the real NVML path on this machine."""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyctl.app.agent import Agent, AgentOptions
from pyctl.cli.main import main

from . import agent_boards as boards


def _fixture(tmp_path: Path, data: dict[str, Any], numa: list[int]) -> tuple[Path, Path]:
    f = tmp_path / "nvml.json"
    f.write_text(json.dumps(data))
    return f, boards.sysfs(tmp_path / "sys", data, numa)


def test_once_json_on_the_h200_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f, root = _fixture(tmp_path, boards.capture(), [-1])
    argv = ["agent", "--once", "--json", "--nvml-fixture", str(f), "--sysfs-root", str(root)]
    assert main([*argv, "--node", "gpu-1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["v"], doc["node"], doc["catalog_disagreements"]) == (1, "gpu-1", 0)
    [g] = doc["gpus"]
    assert (g["model"], g["numa"]["node"], g["mig_current"]) == ("H200-141GB", None, False)
    assert len(g["profiles"]) == 7


def test_fixture_from_the_environment_and_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    f, root = _fixture(tmp_path, boards.capture(), [-1])
    monkeypatch.setenv("PYCTL_AGENT_NVML_FIXTURE", str(f))
    assert main(["agent", "--once", "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    # the lines nvidia-smi mig -lgipp printed, in the agent's words
    assert "profile  9 3g.71gb      {0,4}:4" in out
    assert "profile 15 1g.35gb      {0,2,4,6}:2" in out
    assert "NUMA node unknown (unknown: sysfs numa_node=-1" in out
    assert "local_cpulist 0-15" in out
    assert "MIG disabled" in out


def test_disagreements_in_the_text_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = boards.capture()
    for p in data["devices"][0]["gpu_instance_profiles"]:
        if p.get("id") == 0:
            p["sliceCount"] = 8
    f, root = _fixture(tmp_path, data, [-1])
    assert main(["agent", "--once", "--nvml-fixture", str(f), "--sysfs-root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "catalog disagrees, profile 0 compute_slices: device 8, catalog 7" in out


def test_bad_fixture_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.json"
    f.write_text("[1, 2")
    assert main(["agent", "--once", "--nvml-fixture", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pyctl: error: --nvml-fixture:")
    assert err.count("\n") == 1


def test_without_a_fixture_the_real_nvml_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYCTL_AGENT_NVML_FIXTURE", raising=False)
    rc = main(["agent", "--once", "--json"])
    captured = capsys.readouterr()
    if ctypes.util.find_library("nvidia-ml") is None:
        assert rc == 1
        assert captured.err == "pyctl: error: NVML: NVML Shared Library Not Found\n"
    else:  # a GPU machine: the node's view
        assert rc == 0
        assert json.loads(captured.out)["v"] == 1


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    return int(raw.split()[1]), raw.split("\r\n\r\n", 1)[1]


def test_the_loop_publishes_metrics(tmp_path: Path) -> None:
    data = boards.nvlink_pairs()
    for d in data["devices"][:2]:
        for p in d["gpu_instance_profiles"]:
            if p.get("id") == 9:
                p["placements"] = [{"start": 0, "size": 4}]
    data["devices"][7]["uuid"] = {"nvml_error": "GPU is lost"}
    f, root = _fixture(tmp_path, data, [0] * 8)
    published: list[dict[str, Any]] = []

    async def publish(doc: dict[str, Any]) -> None:
        published.append(doc)

    async def scenario() -> tuple[int, int, str]:
        agent = Agent(
            AgentOptions(node="n1", sysfs_root=root, interval=0.01, metrics_port=0, nvml_fixture=f),
            publish,
        )
        port = await agent.start()
        assert port is not None
        try:
            before, _ = await _get(port, "/readyz")
            await agent.run(iterations=2)
            after, body = await _get(port, "/metrics")
        finally:
            await agent.stop()
        return before, after, body

    before, after, body = asyncio.run(scenario())
    assert (before, after) == (503, 200)
    assert len(published) == 2
    assert published[-1]["node"] == "n1"
    assert "pyctl_agent_gpus 7.0" in body
    assert "pyctl_agent_gpus_failed 1.0" in body
    assert "pyctl_agent_reads_total 2.0" in body
    line = 'pyctl_agent_catalog_disagreements{model="H200-141GB",profile_id="9",what="placements"}'
    assert f"{line} 2.0" in body


def test_pyctl_starts_without_the_agent_extra() -> None:
    """nvidia-ml-py, grpcio and protobuf are the extra `agent`'s: the CLI imports none of them
    until `pyctl agent` reads a node."""
    code = (
        "import sys, pyctl.cli.main; "
        "print(sorted(m for m in ('grpc', 'google.protobuf', 'pynvml') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
