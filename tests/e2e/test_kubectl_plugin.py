"""`kubectl pyctl score|plan`: the real kubectl finds the `kubectl-pyctl` console script on PATH and
runs it on the current kubeconfig context; it lists the cluster live (every kind the controller
watches) and prints exactly what `pyctl score` / `pyctl plan` print for a `kubectl get
nodes,pods,poddisruptionbudgets,noderesourcetopologies,<the resource.k8s.io kinds> -A -o json` dump
of the same cluster (made by the same real kubectl)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from tests.deploy.tools import tool
from tests.e2e.test_placement_e2e import create_nodes, delete_nodes, gpu_pod

pytestmark = [pytest.mark.e2e]

LABEL = "plugin-e2e"


def _env(kubeconfig: Path) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join([venv_bin, str(tool("KUBECTL").parent), os.environ.get("PATH", "")])
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
    return {**os.environ, "PATH": path, "KUBECONFIG": str(kubeconfig), "NO_PROXY": no_proxy,
            "no_proxy": no_proxy, "COLUMNS": "160"}  # fmt: skip


def _run(env: dict[str, str], *argv: str) -> str:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr}"
    return proc.stdout


@pytest.mark.anyio
async def test_kubectl_pyctl_prints_what_pyctl_prints_for_a_dump(
    control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    core = client.CoreV1Api(api)
    specs = [GpuNodeSpec(n, labels={"pyctl.e2e/plugin": "true"}) for n in ("kp-a", "kp-b")]
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    try:
        for name, node, gpus in (("kp-1", "kp-a", 1), ("kp-2", "kp-a", 2), ("kp-3", "kp-b", 3)):
            await core.create_namespaced_pod(
                "default", body(gpu_pod(name, gpus, label=LABEL, node=node))
            )
        env = _env(control_plane.kubeconfig)
        kubectl = str(tool("KUBECTL"))
        listed = _run(env, kubectl, "plugin", "list")
        assert "kubectl-pyctl" in listed
        dump = tmp_path / "dump.json"
        dump.write_text(
            _run(
                env,
                kubectl,
                "get",
                "nodes,pods,poddisruptionbudgets,noderesourcetopologies,"
                "deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates",
                "-A",
                "-o",
                "json",
            )
        )
        pyctl = [sys.executable, "-m", "pyctl.cli.main"]
        for cmd, extra in (
            ("score", ["--json"]),
            ("score", []),
            ("plan", ["--json"]),
            ("plan", []),
        ):
            live = _run(env, kubectl, "pyctl", cmd, *extra)
            offline = _run(env, *pyctl, cmd, str(dump), *extra)
            assert live == offline, (cmd, extra)
            if extra:
                assert json.loads(live)
        score = json.loads(_run(env, kubectl, "pyctl", "score", "--json"))
        assert {n["name"] for n in score["nodes"]} >= {"kp-a", "kp-b"}
        # another context name is refused clearly
        bad = subprocess.run(  # noqa: ASYNC221
            [kubectl, "pyctl", "score", "--context", "nope"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert bad.returncode == 2
        assert "kubectl pyctl: error:" in bad.stderr
    finally:
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)
