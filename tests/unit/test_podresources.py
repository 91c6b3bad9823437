"""The kubelet's PodResources API v1: the committed stubs are what grpcio-tools makes of the
committed proto, and the agent's client, against a real gRPC server speaking that proto on a unix
socket, attributes each container's devices to the node's GPUs exactly."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.kubelet import (
    PodResourcesError,
    attribute,
    read_pod_resources,
)
from pyctl.agent.podresources import api_pb2, api_pb2_grpc
from pyctl.agent.view import Gpu, read_node

from . import agent_boards as boards

ROOT = Path(__file__).resolve().parents[2]
PROTO = "pyctl/agent/podresources/api.proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")


def test_the_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    (tmp_path / PROTO).parent.mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    out = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--pyi_out=.",
         "--grpc_python_out=.", PROTO],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    for name in GENERATED:
        made = (tmp_path / PROTO).parent / name
        assert made.read_text() == (ROOT / PROTO).parent.joinpath(name).read_text(), name


def test_the_proto_is_the_kubelets() -> None:
    """The service and its methods as the kubelet serves them (package v1)."""
    svc = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert sorted(m.name for m in svc.methods) == ["Get", "GetAllocatableResources", "List"]


def _numa(*ids: int) -> api_pb2.TopologyInfo:
    return api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=i) for i in ids])


def _gpus(tmp_path: Path) -> list[Gpu]:
    b = boards.board()
    root = boards.sysfs(tmp_path / "sys", b, [0, 0, 0, 0, 1, 1, 1, 1])
    return read_node(FixtureNvml(b), root).gpus


UUID = "GPU-00000000-0000-0000-0000-00000000000{}"

LISTED = api_pb2.ListPodResourcesResponse(
    pod_resources=[
        api_pb2.PodResources(
            name="llm-0",
            namespace="serve",
            containers=[
                api_pb2.ContainerResources(
                    name="main",
                    devices=[
                        api_pb2.ContainerDevices(
                            resource_name="nvidia.com/gpu",
                            device_ids=[UUID.format(5), UUID.format(6)],
                            topology=_numa(1),
                        )
                    ],
                ),
                api_pb2.ContainerResources(name="sidecar"),
            ],
        ),
        api_pb2.PodResources(
            name="small",
            namespace="serve",
            containers=[
                api_pb2.ContainerResources(
                    name="main",
                    devices=[
                        api_pb2.ContainerDevices(
                            resource_name="nvidia.com/gpu.shared",
                            device_ids=[UUID.format(2) + "::3", "MIG-1234", "GPU-unknown"],
                            topology=_numa(0, 99999),
                        )
                    ],
                    dynamic_resources=[
                        api_pb2.DynamicResource(
                            claim_name="mig",
                            claim_namespace="serve",
                            claim_resources=[
                                api_pb2.ClaimResource(
                                    driver_name="gpu.nvidia.com",
                                    pool_name="node-a",
                                    device_name="gpu-3-mig-3g71gb-9-4",
                                    cdi_devices=[api_pb2.CDIDevice(name="k8s.gpu.nvidia.com/x")],
                                ),
                                api_pb2.ClaimResource(
                                    driver_name="gpu.nvidia.com",
                                    pool_name="node-a",
                                    device_name="gpu-7",
                                ),
                                api_pb2.ClaimResource(
                                    driver_name="other.example.com",
                                    pool_name="node-a",
                                    device_name="gpu-1",
                                ),
                            ],
                        )
                    ],
                )
            ],
        ),
    ]
)

ALLOCATABLE = api_pb2.AllocatableResourcesResponse(
    devices=[
        api_pb2.ContainerDevices(
            resource_name="nvidia.com/gpu", device_ids=[UUID.format(i)], topology=_numa(i // 4)
        )
        for i in range(8)
    ]
)


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.calls.append("List")
        return LISTED

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        self.calls.append("GetAllocatableResources")
        return ALLOCATABLE


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # a short path: a unix socket's path is at most 107 bytes
    d = Path(tempfile.mkdtemp(prefix="pr-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def _serve_and_read(sock: Path, kubelet: Kubelet) -> tuple[Any, Any]:
    server = grpc.aio.server()
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)  # type: ignore[no-untyped-call]
    assert server.add_insecure_port(f"unix://{sock}") == 1
    await server.start()
    try:
        return await read_pod_resources(sock)
    finally:
        await server.stop(None)


def test_attribution_over_a_real_grpc_server(tmp_path: Path, socket_dir: Path) -> None:
    kubelet = Kubelet()
    listed, alloc = asyncio.run(_serve_and_read(socket_dir / "kubelet.sock", kubelet))
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    view = attribute(listed, alloc, _gpus(tmp_path))
    got = {
        (c.namespace, c.pod, c.container): [
            (d.source, d.id, d.gpu_index, d.numa, d.mig_profile_id, d.mig_start, d.unresolved)
            for d in c.devices
        ]
        for c in view.containers
    }
    assert got == {
        ("serve", "llm-0", "main"): [
            ("device-plugin", UUID.format(5), 5, [1], None, None, None),
            ("device-plugin", UUID.format(6), 6, [1], None, None, None),
        ],
        ("serve", "small", "main"): [
            ("device-plugin", UUID.format(2) + "::3", 2, [0], None, None, None),
            ("device-plugin", "MIG-1234", None, [0], None, None,
             "a MIG device UUID that no live MIG device of this node has"),
            ("device-plugin", "GPU-unknown", None, [0], None, None,
             "no GPU of this node has this UUID or index"),
            ("dra", "gpu-3-mig-3g71gb-9-4", 3, [], 9, 4, None),
            ("dra", "gpu-7", 7, [], None, None, None),
            ("dra", "gpu-1", None, [], None, None,
             "driver 'other.example.com' is not gpu.nvidia.com"),
        ],
    }  # fmt: skip
    # the NUMA id 99999 is out of bounds: dropped and counted
    assert view.dropped == 1
    assert [(d.gpu_index, d.numa) for d in view.allocatable] == [(i, [i // 4]) for i in range(8)]
    dra = [d for c in view.containers for d in c.devices if d.source == "dra"]
    assert {d.claim for d in dra} == {"serve/mig"}


def test_device_plugin_mig_devices_are_attributed_to_their_gpu_instance(tmp_path: Path) -> None:
    """The device plugin hands out MIG devices by their UUID (`nvidia.com/mig-3g.71gb`): the
    agent reads each GPU instance's MIG devices from NVML and gives the GPU, the profile and the
    placement; a UUID of a MIG device the node does not have stays unresolved."""
    b = boards.mig_board()
    gpus = read_node(FixtureNvml(b), boards.sysfs(tmp_path / "sys", b, [0] * 8)).gpus
    listed = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="llm",
                namespace="serve",
                containers=[
                    api_pb2.ContainerResources(
                        name="main",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="nvidia.com/mig-3g.71gb",
                                device_ids=[boards.mig_uuid(1), boards.mig_uuid(99)],
                                topology=_numa(0),
                            )
                        ],
                    )
                ],
            )
        ]
    )
    view = attribute(listed, api_pb2.AllocatableResourcesResponse(), gpus)
    [c] = view.containers
    got = [(d.id, d.gpu_index, d.mig_profile_id, d.mig_start, d.unresolved) for d in c.devices]
    assert got == [
        (boards.mig_uuid(1), 0, 9, 4, None),  # 3g.71gb at slices 4-7 of GPU 0
        (boards.mig_uuid(99), None, None, None,
         "a MIG device UUID that no live MIG device of this node has"),
    ]  # fmt: skip


def test_no_socket_is_a_clear_error(socket_dir: Path) -> None:
    with pytest.raises(PodResourcesError, match="no such socket"):
        asyncio.run(read_pod_resources(socket_dir / "missing.sock"))


def test_a_socket_nobody_serves_is_a_clear_error(socket_dir: Path) -> None:
    import socket as s

    path = socket_dir / "dead.sock"
    sock = s.socket(s.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the file stays, nobody listens
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        asyncio.run(read_pod_resources(path, deadline_s=2.0))


class SyncKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        return LISTED

    def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        return ALLOCATABLE


def test_agent_once_prints_the_attribution(
    tmp_path: Path, socket_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from pyctl.cli.main import main

    b = boards.board()
    fixture = tmp_path / "nvml.json"
    fixture.write_text(json.dumps(b))
    root = boards.sysfs(tmp_path / "sys", b, [0, 0, 0, 0, 1, 1, 1, 1])
    sock = socket_dir / "kubelet.sock"
    server = grpc.server(ThreadPoolExecutor(2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(SyncKubelet(), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    argv = ["agent", "--once", "--nvml-fixture", str(fixture), "--sysfs-root", str(root)]
    try:
        assert main([*argv, "--pod-resources-socket", str(sock), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert main([*argv, "--pod-resources-socket", str(sock)]) == 0
        text = capsys.readouterr().out
    finally:
        server.stop(None)
    [llm, small] = doc["pod_resources"]["containers"]
    assert [d["gpu_index"] for d in llm["devices"]] == [5, 6]
    assert small["devices"][3]["mig_profile_id"] == 9
    assert f"serve/llm-0/main: device-plugin {UUID.format(5)} -> GPU 5" in text
    assert "serve/small/main: dra gpu-7 -> GPU 7" in text
    # without the kubelet's socket: said, and the GPUs are read all the same
    assert main([*argv, "--pod-resources-socket", str(socket_dir / "none"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "no such socket" in doc["pod_resources"]["error"]
    assert len(doc["gpus"]) == 8
