"""`pyctl agent` on the real control plane: the agent (NVML through the double of an 8-GPU board,
sysfs in a temporary tree, a real gRPC server speaking the kubelet's PodResources proto) publishes
its node's topology annotation, and the controller, following the cluster, changes the node's
model from today's rules to the agent's exact attribution: the hand-worked case of
docs/agent.md (two 1-GPU pods the kubelet put on GPU 0 and GPU 4: zones 2/4 idle by the rules,
3/3 by the agent)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import grpc
import pytest
from kubernetes_asyncio import client

from pyctl.agent.podresources import api_pb2, api_pb2_grpc
from pyctl.agent.publish import NodeAnnotationPublisher
from pyctl.app.agent import Agent, AgentOptions
from pyctl.cluster import agent_topology as at
from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body, node_manifest
from pyctl.state.memory import MemoryStore
from tests.e2e.conftest import wait_until
from tests.unit import agent_boards as boards

pytestmark = [pytest.mark.e2e]

NODE = "agent-gpu-0"
CLUSTER = "e2e-agent"
LABEL = {"pyctl.e2e/agent": "true"}


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's answer: pod a on GPU 0, pod b on GPU 4 (UUIDs of the board)."""

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        def pod(name: str, gpu: int) -> api_pb2.PodResources:
            dev = api_pb2.ContainerDevices(
                resource_name="nvidia.com/gpu",
                device_ids=[boards.board()["devices"][gpu]["uuid"]],
                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=gpu // 4)]),
            )
            return api_pb2.PodResources(
                name=name,
                namespace="default",
                containers=[api_pb2.ContainerResources(name="c", devices=[dev])],
            )

        return api_pb2.ListPodResourcesResponse(
            pod_resources=[pod("agent-a", 0), pod("agent-b", 4)]
        )

    def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        return api_pb2.AllocatableResourcesResponse()


@pytest.fixture
def kubelet_socket() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    sock = d / "kubelet.sock"
    server = grpc.server(ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    try:
        yield sock
    finally:
        server.stop(None)
        shutil.rmtree(d, ignore_errors=True)


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "agent-e2e"}},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/llm:1",
                    "resources": {
                        "requests": {"cpu": "2", "nvidia.com/gpu": "1"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                }
            ],
        },
    }


def _zone_idle(ctl: Controller, numa: str) -> float | None:
    v = ctl.metrics.registry.get_sample_value(
        "pyctl_zone_gpu_idle_gpus", {"cluster": CLUSTER, "node": NODE, "numa": numa}
    )
    return None if v is None else float(v)


@pytest.mark.anyio
async def test_the_agents_annotation_reaches_the_controller(
    control_plane: ControlPlane,
    api: client.ApiClient,
    kube: Any,
    kubelet_socket: Path,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    await apply_nrt_crd(api)
    # the GPU NUMA labels give the rules two zones too: what differs is who holds which GPU
    spec = GpuNodeSpec(
        NODE,
        product="NVIDIA-H200",
        labels={**LABEL, **{f"nvidia.com/gpu-{i}-numa": str(i // 4) for i in range(8)}},
    )
    await core.create_node(body(node_manifest(spec)))
    for name in ("agent-a", "agent-b"):
        await core.create_namespaced_pod("default", body(_pod(name)))

    board = boards.board()
    fixture = tmp_path / "nvml.json"
    fixture.write_text(json.dumps(board))
    opts = AgentOptions(
        node=NODE,
        sysfs_root=boards.sysfs(tmp_path / "sys", board, [0, 0, 0, 0, 1, 1, 1, 1]),
        nvml_fixture=fixture,
        pod_resources_socket=kubelet_socket,
    )
    agent = Agent(opts, NodeAnnotationPublisher(kube, NODE))
    ctl = Controller(CLUSTER, KubeClusterSource(kube), MemoryStore(CLUSTER), summary_interval=0.2)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)

            def by_rules() -> bool:
                return (_zone_idle(ctl, "0"), _zone_idle(ctl, "1")) == (2.0, 4.0)

            await wait_until(by_rules, "the rules' zones (2 and 4 idle)", within=60)

            doc: Any = await agent.read()
            assert doc is not None
            assert doc["pod_resources"]["containers"][0]["devices"][0]["gpu_index"] == 0
            got = await core.read_node(NODE)
            topo = at.decode(got.metadata.annotations[at.ANNOTATION])
            assert topo.pods == (("default/agent-a", (0,)), ("default/agent-b", (4,)))
            assert topo.numa_of() == {i: i // 4 for i in range(8)}

            def by_agent() -> bool:
                return (_zone_idle(ctl, "0"), _zone_idle(ctl, "1")) == (3.0, 3.0)

            await wait_until(by_agent, "the agent's zones (3 and 3 idle)", within=60)
            model = ctl.reconciler.models[NODE]
            assert model.gpu_source.startswith("agent (exact")
            # a second read with nothing changed writes nothing
            rv = got.metadata.resource_version
            await agent.read()
            assert (await core.read_node(NODE)).metadata.resource_version == rv
            tg.cancel_scope.cancel()
    finally:
        await agent.stop()
        await core.delete_collection_namespaced_pod("default", label_selector="app=agent-e2e")
        await core.delete_node(NODE)


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.anyio
async def test_pyctl_agent_publishes_from_the_command_line(
    control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    """`pyctl agent --kubeconfig … --node …` (the loop, as the DaemonSet runs it with
    --in-cluster) writes the annotation on its node; stopped, it leaves it there."""
    core = client.CoreV1Api(api)
    name = "agent-cli-0"
    await core.create_node(body(node_manifest(GpuNodeSpec(name, labels=LABEL))))
    board = boards.nvswitch(clique=3)
    fixture = tmp_path / "nvml.json"
    fixture.write_text(json.dumps(board))
    root = boards.sysfs(tmp_path / "sys", board, [0, 0, 0, 0, 1, 1, 1, 1])
    argv = [
        sys.executable, "-m", "pyctl.cli.main", "agent",
        "--kubeconfig", str(control_plane.kubeconfig), "--node", name,
        "--nvml-fixture", str(fixture), "--sysfs-root", str(root),
        "--pod-resources-socket", "", "--interval", "0.5", "--metrics-port", "0",
    ]  # fmt: skip
    proc = _start(argv, tmp_path / "agent.log")
    try:

        async def published() -> bool:
            got = await core.read_node(name)
            return at.ANNOTATION in (got.metadata.annotations or {})

        await wait_until(published, "the annotation on the agent's node", within=60)
        got = await core.read_node(name)
        topo = at.decode(got.metadata.annotations[at.ANNOTATION])
        assert topo.nvlink == (tuple(range(8)),)
        assert {g.clique for g in topo.gpus} == {"0123456789abcdef0123456789abcdef.3"}
        assert topo.pods is None  # the kubelet was not read: the controller keeps its rules
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        await core.delete_node(name)
    assert b"node topology published" in (tmp_path / "agent.log").read_bytes()
