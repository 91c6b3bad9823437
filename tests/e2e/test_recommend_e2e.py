"""`pyctl recommend --kubeconfig` on the real control plane: kwok GPU nodes (one A100-80GB node
with four GPUs in MIG mode, 7 x 1g.10gb each, and four whole GPUs; one with eight whole GPUs) and
Deployments of mixed sizes, whose pods the real controller-manager creates (owned by
ReplicaSets) and the real scheduler binds (or leaves Unschedulable). The command runs as a user
runs it (a subprocess with the kubeconfig); its answer is checked against a hand computation,
against `pyctl recommend` on a dump of the same objects read with another client, and its patch
against the API server (a server-side dry run).

Hand computation (docs/normalization.md, the objective). Pool: 16 GPUs (8 + 8). Needs per
replica: small 1g.10gb x20 (1/7 GPU), embed 1g.20gb x1 (1/7, 20 GB), llm 1 GPU x2, trainer 2 GPUs
x1: 7 GPUs in all, scaled by 16/7 (largest remainder) to small 46, embed 2, llm 5, trainer 2.
trainer's 2 x 2 GPUs take one node's 4 GPUs: 12 GPUs are left for the rest.
- k=1: {1g.20gb} holds small and embed, 4 per GPU: 48 fit; llm is held by no size:
  served 48/7 + 4 = 10.857 of 16 = 67.857%.
- k=2: {1g.10gb, gpu}: embed (20 GB) rounds to a whole GPU: 7 GPUs for llm and embed, 5 x 7 = 35
  small: 5 + 2/7 + 35/7 + 4 = 14.286 = 89.286%.
- k=3: {1g.10gb, 1g.20gb, gpu}: 5 GPUs for llm, one GPU with 2 x 1g.20gb + 4 x 1g.10gb, 6 x 7 =
  42 small: all placed, 15.857 = 99.107% (= as requested); k=4, 5 add nothing.
With --tolerance 10 the recommendation is k=2 (89.286 >= 99.107 - 10): embed moves to a whole GPU.
Classes: gpu-large gets the node without MIG (trainer's 2 + 3 whole GPUs), mig the MIG node (the
planner's layout for 20 x 1g.10gb).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.core import mig
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
)
from tests.e2e.conftest import if_present, wait_until
from tests.e2e.test_placement_e2e import create_nodes, delete_nodes
from tests.paths import REPO

pytestmark = [pytest.mark.e2e]

NS = "rec-e2e"
SEL = {"pyctl.e2e/recommend": "true"}
MIG_NODE = GpuNodeSpec(
    "rec-mig",
    mig={g: {"1g.10gb": 7} for g in range(4)},
    mig_config="all-1g.10gb",
    labels=SEL,
)
WHOLE_NODE = GpuNodeSpec("rec-whole", labels=SEL)
#: (name, replicas, resource, count)
DEPLOYMENTS = (
    ("small", 20, "nvidia.com/mig-1g.10gb", 1),
    ("embed", 1, "nvidia.com/mig-1g.20gb", 1),
    ("llm", 2, "nvidia.com/gpu", 1),
    ("trainer", 1, "nvidia.com/gpu", 2),
)


def deployment(name: str, replicas: int, resource: str, count: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(SEL),
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {"name": "proxy", "image": "registry.example/proxy:1"},
                        {
                            "name": "server",
                            "image": "registry.example/serve:1",
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "1Gi"},
                                "limits": {resource: str(count)},
                            },
                        },
                    ],
                },
            },
        },
    }


def run_cli(*args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    r = subprocess.run(
        [sys.executable, "-m", "pyctl.cli.main", "recommend", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


async def dump_with_the_generated_client(api: client.ApiClient) -> dict[str, Any]:
    """What `kubectl get nodes,pods,replicasets,noderesourcetopologies -o json` shows, read with
    kubernetes-asyncio's generated client (not pyctl's)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    items: list[Any] = []
    for kind, got in (
        ("Node", await core.list_node()),
        ("Pod", await core.list_namespaced_pod(NS)),
        ("ReplicaSet", await apps.list_namespaced_replica_set(NS)),
    ):
        for o in got.items:
            d = api.sanitize_for_serialization(o)
            d["kind"] = kind
            items.append(d)
    nrts = await client.CustomObjectsApi(api).list_cluster_custom_object(
        NRT_GROUP, NRT_VERSION, NRT_PLURAL
    )
    items += nrts["items"]
    return {"apiVersion": "v1", "kind": "List", "items": items}


@pytest.mark.anyio
async def test_recommend_on_the_live_cluster(
    control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    specs = [MIG_NODE, WHOLE_NODE]
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    await core.create_namespace(body({"metadata": {"name": NS}}))
    try:
        for d in DEPLOYMENTS:
            await apps.create_namespaced_deployment(NS, body(deployment(*d)))

        async def settled() -> bool:
            pods = (await core.list_namespaced_pod(NS)).items
            bound = sum(1 for p in pods if p.spec.node_name)
            unsched = [
                p
                for p in pods
                if not p.spec.node_name
                and any(
                    c.type == "PodScheduled" and c.reason == "Unschedulable"
                    for c in (p.status.conditions or [])
                )
            ]
            # 23 bound (20 small on the MIG node, 2 llm, 1 trainer); embed finds no 1g.20gb
            return len(pods) == 24 and bound == 23 and len(unsched) == 1

        await wait_until(settled, "the Deployments' pods bound by the real scheduler", 60)

        kubeconfig = str(control_plane.kubeconfig)
        sel = ",".join(f"{k}={v}" for k, v in SEL.items())
        common = ["--namespace", NS, "--node-selector", sel, "--tolerance", "10"]
        live = await anyio.to_thread.run_sync(lambda: run_cli("--kubeconfig", kubeconfig, *common))
        (pool,) = live["pools"]
        assert pool["gpu_model"] == "NVIDIA-A100-SXM4-80GB"
        assert pool["mig"] is True
        assert pool["gpus"] == 16
        assert pool["replicas"] == 24
        rows = [(r["menu"], r["served_pct"]) for r in pool["tradeoff"]]
        assert rows[0] == (["1g.20gb"], 67.857)
        assert rows[1] == (["1g.10gb", "gpu"], 89.286)
        assert rows[2] == (["1g.10gb", "1g.20gb", "gpu"], 99.107)
        assert pool["as_requested"]["served_pct"] == 99.107
        assert pool["recommended_k"] == 2
        assert pool["menu"] == ["1g.10gb", "gpu"]
        w = {x["workload"]["name"]: x for x in live["workloads"]}
        assert {n: x["workload"]["kind"] for n, x in w.items()} == {
            "small": "Deployment",
            "embed": "Deployment",
            "llm": "Deployment",
            "trainer": "Deployment",
        }
        assert (w["small"]["current"], w["small"]["recommended"]) == ("1g.10gb", "1g.10gb")
        assert (w["embed"]["current"], w["embed"]["recommended"]) == ("1g.20gb", "gpu")
        assert w["embed"]["change"] is True
        assert (w["trainer"]["current"], w["trainer"]["change"]) == ("2 gpus", False)
        classes = {c["class"]: c for c in live["classes"]}
        assert classes["gpu-large"]["nodes"] == ["rec-whole"]
        assert classes["gpu-large"]["demand"] == {"gpu": 3, "2 gpus": 1}
        assert classes["mig"]["nodes"] == ["rec-mig"]
        assert classes["mig"]["demand"] == {"1g.10gb": 20}
        assert classes["mig"]["shortfall"] == {}
        configs = mig.parse_mig_parted(json.dumps(live["mig_parted"]))
        (layout,) = configs.values()
        assert sum(e["mig-devices"].get("1g.10gb", 0) for e in layout) >= 20

        # the same objects, read by another client and given as a dump
        dump = tmp_path / "dump.json"
        dump.write_text(json.dumps(await dump_with_the_generated_client(api)))
        from_dump = await anyio.to_thread.run_sync(lambda: run_cli(str(dump), *common))
        assert from_dump["pools"] == live["pools"]
        assert from_dump["workloads"] == live["workloads"]
        assert from_dump["classes"] == live["classes"]

        # the patch, as the API server would apply it (server-side dry run)
        patch = w["embed"]["patch"]
        kube = await connect(kubeconfig=kubeconfig)
        try:
            resp = await kube.request(
                "PATCH",
                f"/apis/apps/v1/namespaces/{NS}/deployments/embed",
                query=[("dryRun", "All")],
                body=patch["body"],
                content_type="application/strategic-merge-patch+json",
            )
        finally:
            await kube.close()
        assert resp.ok, resp.data[:300]
        containers = {c["name"]: c for c in resp.json()["spec"]["template"]["spec"]["containers"]}
        assert containers["server"]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert "resources" not in containers["proxy"] or not containers["proxy"]["resources"]
        still = await apps.read_namespaced_deployment("embed", NS)
        limits = still.spec.template.spec.containers[1].resources.limits
        assert limits == {"nvidia.com/mig-1g.20gb": "1"}  # a dry run: nothing changed
    finally:
        await if_present(core.delete_namespace(NS))
        await delete_nodes(api, specs)
