"""One way to read a cluster (issue 32, "Must show"): on the real control plane, `kubectl pyctl
score --json` (the real kubectl running the plugin on the live cluster) and the running
controller's `pyctl status --json` (``pyctl run`` as deployed, its state in a real redis-server)
agree on every node's idle and fragment GPUs and every NUMA zone's, on a cluster with

- DRA GPUs (a simulated DRA driver's ResourceSlices, claims allocated by the real kube-scheduler);
- device-plugin GPUs on a kwok node without NodeResourceTopology, and on one with it (an NRT node);
- one hostile tenant pod the API server accepts: `nvidia.com/gpu: 4294967296`.

Both leave the hostile pod out and name it with the controller's reason (`out_of_bounds`): the
plugin on stderr and under `left_out`, status from the controller's published summary; neither
refuses the cluster for it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.core.fragmentation import shape_dict
from pyctl.dev.control_plane import ControlPlane, free_port
from pyctl.dev.gpu_nodes import (
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    node_manifest,
    wait_nodes_ready,
)
from pyctl.model import Shape
from tests.deploy.tools import tool
from tests.e2e.conftest import wait_until
from tests.e2e.dra_driver_sim import SimDraDriver, SimGpu, SimNode
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.e2e.test_dra_e2e import (
    ALIGNED,
    Dra,
    claim_pod,
    dra_node,
    gpus_request,
    remove,
    template,
)
from tests.e2e.test_placement_e2e import create_nodes, delete_nodes, gpu_pod
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

CLUSTER = "e2e-oneway"
LABEL = "oneway-e2e"
HOSTILE = "ow-evil"
TEMPLATES = ["ow-pair", "ow-one"]
DRA_PODS = ["ow-dra-pair", "ow-dra-one"]
GPU_PODS = [("ow-dp-3", "ow-dp", 3), ("ow-nrt-1", "ow-nrt", 1), ("ow-nrt-2", "ow-nrt", 2)]
#: M of both: one device-plugin GPU, and four aligned DRA GPUs
SHAPES = (
    Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
    Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, dra=True, numa_aligned=True, weight=0.5),
)


def _env(kubeconfig: Path) -> dict[str, str]:
    """The real kubectl (and the plugin's console script) on PATH, no PYCTL_* settings."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join([venv_bin, str(tool("KUBECTL").parent), os.environ.get("PATH", "")])
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    return {**env, "PATH": path, "KUBECONFIG": str(kubeconfig), "NO_PROXY": no_proxy,
            "no_proxy": no_proxy}  # fmt: skip


async def _run(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    done = await anyio.run_process(list(argv), env=env, check=False)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def _nodes(nodes: list[dict[str, Any]]) -> dict[str, tuple[float, float, list[Any]]]:
    """name -> (idle, fragment, [(numa, idle, fragment) per zone]), milli-GPU to 3 places."""
    return {
        n["name"]: (
            round(n["idle_gpu_milli"], 3),
            round(n["fragment_gpu_milli"], 3),
            [
                (z["numa"], round(z["idle_gpu_milli"], 3), round(z["fragment_gpu_milli"], 3))
                for z in n["zones"]
            ],
        )
        for n in nodes
    }


def _hostile(left_out: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(reason, message) of each mention of the hostile pod under `left_out`."""
    objects = (left_out or {}).get("objects") or []
    return [
        (o["reason"], o["message"])
        for o in objects
        if o["kind"] == "Pod" and o["name"] == f"default/{HOSTILE}"
    ]


@pytest.mark.anyio
async def test_kubectl_pyctl_score_and_the_controllers_status_agree(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    driver = SimDraDriver(api)
    dra = Dra(api)
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps({"shapes": [shape_dict(s) for s in SHAPES]}))
    dp = GpuNodeSpec("ow-dp", labels={"pyctl.e2e/oneway": "true"})
    nrt = GpuNodeSpec("ow-nrt", labels={"pyctl.e2e/oneway": "true"})
    sim = [SimNode("ow-dra", [SimGpu(i, i // 4) for i in range(8)])]
    controller = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        free_port(),
        tmp_path,
        extra_env={"PYCTL_LEASE_NAME": "pyctl-oneway-e2e", "PYCTL_WORKLOAD_FILE": str(workload)},
        cluster=CLUSTER,
        mode="observe",
    )
    env = _env(control_plane.kubeconfig)
    kubectl = str(tool("KUBECTL"))
    pods = [HOSTILE, *DRA_PODS, *(name for name, _, _ in GPU_PODS)]
    try:
        # nodes: device-plugin GPUs without NRT, with NRT, and DRA GPUs
        await apply_nrt_crd(api)
        await core.create_node(body(node_manifest(dp)))
        await create_nodes(api, [nrt])
        await core.create_node(body(dra_node("ow-dra")))
        await wait_nodes_ready(api, ["ow-dp", "ow-dra"])
        await driver.install_classes()
        await driver.publish(sim)
        await dra.create("resourceclaimtemplates", template("ow-pair", gpus_request(2), ALIGNED))
        await dra.create("resourceclaimtemplates", template("ow-one", gpus_request(1)))
        # DRA pods: claims allocated by the real kube-scheduler (the fixture's default one)
        for name, tmpl in zip(DRA_PODS, TEMPLATES, strict=True):
            await core.create_namespaced_pod(
                "default", body(claim_pod(name, {"gpus": f"template:{tmpl}"}, node="ow-dra"))
            )
        # device-plugin pods, bound by name
        for name, node, gpus in GPU_PODS:
            await core.create_namespaced_pod(
                "default", body(gpu_pod(name, gpus, label=LABEL, node=node))
            )
        # the hostile tenant pod: accepted by the API server, pending (no node has the GPUs)
        evil = gpu_pod(HOSTILE, 4294967296, label=LABEL)
        await core.create_namespaced_pod("default", body(evil))

        async def allocated() -> bool:
            for name in DRA_PODS:
                if not await dra.bound(name) or not await dra.allocated(name):
                    return False
            return True

        await wait_until(allocated, "the DRA claims allocated by the scheduler", within=60)
        controller.start("ow-0")

        seen: dict[str, Any] = {}

        async def agree() -> bool:
            rc, out, err = await _run(
                env, kubectl, "pyctl", "score", "--json", "--workload", str(workload)
            )
            assert rc == 0, err
            score = json.loads(out)
            rc2, out2, err2 = await _run(
                env,
                sys.executable,
                "-m",
                "pyctl.cli.main",
                "status",
                "--redis",
                redis_server.url,
                "--cluster",
                CLUSTER,
                "--json",
            )
            seen.update(score=score, score_err=err, status_rc=rc2, status_err=err2)
            if rc2 != 0:  # no state stored yet
                await anyio.sleep(0.5)
                return False
            status = json.loads(out2)
            seen["status"] = status
            ok = (
                status["controller"]["fresh"]
                and _nodes(score["nodes"]) == _nodes(status["nodes"])
                and bool(_hostile(status["left_out"]))
            )
            if not ok:
                await anyio.sleep(0.5)
            return bool(ok)

        try:
            await wait_until(agree, "kubectl pyctl score and pyctl status to agree", within=120)
        except Exception:
            print(json.dumps(seen, indent=1)[:20000])  # what each said last
            raise
        score, status = seen["score"], seen["status"]
        nodes = _nodes(score["nodes"])
        # the nodes of the test are all there, each zone scored (the NRT node and the DRA node
        # by their two NUMA zones), and what the pods use is what the scheduler allocated
        for name in ("ow-dp", "ow-nrt", "ow-dra"):
            assert name in nodes, sorted(nodes)
        assert [z[0] for z in nodes["ow-nrt"][2]] == [0, 1]
        assert [z[0] for z in nodes["ow-dra"][2]] == [0, 1]
        assert nodes["ow-dra"][0] == 5000.0  # 8 DRA GPUs, 3 allocated to the claims
        assert nodes["ow-dp"][0] == 5000.0  # 8 GPUs, 3 used
        assert nodes["ow-nrt"][0] == 5000.0  # 8 GPUs, 1 + 2 used
        # the hostile pod: left out by both, with the controller's reason
        (mine,) = _hostile(score["left_out"])
        assert mine[0] == "out_of_bounds"
        assert "4294967296" in mine[1]
        assert [r for r, _ in _hostile(status["left_out"])] == ["out_of_bounds"]
        assert f"left out: Pod default/{HOSTILE} (out_of_bounds)" in seen["score_err"]
        # and the plugin, whose only input is the live cluster, scored every node besides
        assert score["left_out"]["count"] == len(score["left_out"]["objects"])
    finally:
        controller.kill()
        await dra.cleanup(pods, {"resourceclaimtemplates": TEMPLATES})
        await remove(driver, core, sim)
        await delete_nodes(api, [dp, nrt])  # ow-dp has no NRT object: its 404 is ignored
