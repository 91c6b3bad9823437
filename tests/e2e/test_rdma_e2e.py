"""The RDMA resource against the real kube-scheduler: kwok nodes that advertise an RDMA device
plugin's shared HCA devices (`rdma/hca_shared_devices_a`, 200 on one node, 800 on another, none on
a third), pods that request some, and a controller whose reflectors are told the resource's name
(`reflector_rdma_resource`). The controller reads each node's allocatable and its pods' requests as
the API server holds them, and for each pod, before it is created, pyctl's placement says whether
the node admits it; the real scheduler (its NodeResourcesFit) then binds it or leaves it
Unschedulable. The two must agree on every pod, and the idle GPUs no RDMA is left for are counted
as fragment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.policy import rank
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import GPU, GpuNodeSpec, body, node_manifest, wait_nodes_ready
from pyctl.model import Shape, Snapshot, Workload
from pyctl.state.memory import MemoryStore
from tests.e2e.conftest import wait_until

pytestmark = [pytest.mark.e2e]

RDMA = "rdma/hca_shared_devices_a"
LABEL = "rdma-e2e"
#: M: single GPUs with 100 of RDMA each
SHAPE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=100)
WORKLOAD = Workload((SHAPE,))
NODES = [
    GpuNodeSpec("rdma-a", extra={RDMA: 200}),
    GpuNodeSpec("rdma-b", extra={RDMA: 800}),
    GpuNodeSpec("rdma-c"),
]


def rdma_pod(name: str, node: str) -> dict[str, Any]:
    """One GPU and 100 of RDMA (a limit only, as device-plugin resources often are), on `node`
    by its hostname label (the default scheduler decides whether it fits)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": LABEL}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/dlrm:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", GPU: "1"},
                        "limits": {GPU: "1", RDMA: "100"},
                    },
                }
            ],
        },
    }


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


async def _outcome(core: client.CoreV1Api, name: str) -> str | None:
    """ "bound", "unschedulable" (with the scheduler's reason), or None while undecided."""
    p = await core.read_namespaced_pod(name, "default")
    if p.spec.node_name:
        return "bound"
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return f"unschedulable: {c.message}"
    return None


@pytest.mark.anyio
async def test_pyctl_admits_exactly_what_the_real_scheduler_binds(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    core = client.CoreV1Api(api)
    for s in NODES:
        await core.create_node(body(node_manifest(s)))
    await wait_nodes_ready(api, [s.name for s in NODES], within=60)
    ctl = Controller(
        "e2e-rdma",
        KubeClusterSource(kube, options=ReflectorOptions(rdma_resource=RDMA)),
        MemoryStore("e2e-rdma"),
        workload=WORKLOAD,
        summary_interval=0.5,
    )
    # what the API server holds: each node's allocatable, and the requests of its bound pods
    bound: dict[str, int] = {s.name: 0 for s in NODES}

    def model_current() -> bool:
        models = ctl.reconciler.models
        return all(
            (m := models.get(s.name)) is not None
            and (m.rdma, m.rdma_used) == (s.extra.get(RDMA, 0), bound[s.name])
            for s in NODES
        )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await wait_until(model_current, "the controller's models of the nodes", within=30)
            # a fills after two, b takes more, c has no RDMA at all
            asked = ["rdma-a", "rdma-a", "rdma-a", "rdma-b", "rdma-c", "rdma-b"]
            seen: list[tuple[str, bool, str]] = []
            for i, node in enumerate(asked):
                model = FragmentationModel(Snapshot((ctl.reconciler.models[node],)))
                (best,) = rank(model, SHAPE, WORKLOAD)
                name = f"rdma-{i}"
                await core.create_namespaced_pod("default", body(rdma_pod(name, node)))
                outcome: list[str] = []

                async def decided(name: str = name, outcome: list[str] = outcome) -> bool:
                    got = await _outcome(core, name)
                    if got is not None:
                        outcome.append(got)
                    return got is not None

                await wait_until(decided, f"the scheduler's decision on {name}", within=30)
                seen.append((node, best is not None, outcome[0]))
                if outcome[0] == "bound":
                    bound[node] += 100
                    await wait_until(model_current, f"the controller to see {name}", within=30)
            for _, admitted, got in seen:
                assert admitted == (got == "bound"), seen
            # the scheduler said why: the resource, not the GPUs
            assert [got.startswith("unschedulable") for _, _, got in seen] == [
                False, False, True, False, True, False,
            ], seen  # fmt: skip
            assert all(RDMA in got for _, _, got in seen if got != "bound"), seen
            # the measure: a's 6 idle GPUs and c's 8 have no RDMA left for M's shape
            models = ctl.reconciler.models
            snap = Snapshot(tuple(models[s.name] for s in NODES))
            scores = {n.name: n for n in FragmentationModel(snap).score(WORKLOAD).nodes}
            assert scores["rdma-a"].fragment_gpu_milli == 6000.0
            assert scores["rdma-a"].categories["lack_cpu"] == 6000.0
            assert scores["rdma-c"].fragment_gpu_milli == 8000.0
            assert scores["rdma-b"].fragment_gpu_milli == 0.0
            tg.cancel_scope.cancel()
    finally:
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        for s in NODES:
            try:
                await core.delete_node(s.name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
