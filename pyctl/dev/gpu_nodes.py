"""Fake GPU nodes, shown the way the NVIDIA stack shows real ones, for kwok to play.

A node gets:

* the annotation ``kwok.x-k8s.io/node: fake`` (kwok then plays its kubelet: Ready, pods Running);
* extended resources in ``status.capacity``/``allocatable``, MIG "mixed" strategy: whole GPUs as
  ``nvidia.com/gpu``, each MIG profile as ``nvidia.com/mig-<profile>`` (a GPU in MIG mode is not
  counted in ``nvidia.com/gpu``);
* GPU Feature Discovery labels: ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count`` (here: the
  whole GPUs, the ones ``nvidia.com/gpu`` counts), ``nvidia.com/gpu.memory``,
  ``nvidia.com/mig.capable``, ``nvidia.com/mig.strategy``, ``nvidia.com/mig-<profile>.count``,
  and the MIG manager's ``nvidia.com/mig.config`` / ``nvidia.com/mig.config.state``;
* a NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``, named after the node) with one
  zone per NUMA node, ``node-<id>`` of type ``Node``, holding that zone's CPUs, memory and GPUs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from pyctl.jsontypes import JsonObject, JsonValue, as_object

from .control_plane import KWOK_NODE_ANNOTATION, REPO

NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_PLURAL = "noderesourcetopologies"
NRT_CRD = REPO / "deploy" / "crds" / "noderesourcetopology.yaml"

GPU = "nvidia.com/gpu"
# Label put on every node these helpers make, for selection and clean-up.
E2E_NODE_LABEL = "pyctl.e2e/gpu-node"


def body(obj: Mapping[str, Any]) -> Any:
    """A plain dict as a request body: kubernetes_asyncio sends it as is (it is typed as models)."""
    return obj


def mig_resource(profile: str) -> str:
    return f"nvidia.com/mig-{profile}"


@dataclass(frozen=True)
class GpuNodeSpec:
    """One fake GPU node. GPUs are numbered 0..n-1 and fill NUMA zones in order."""

    name: str
    product: str = "NVIDIA-A100-SXM4-80GB"
    gpu_memory_mib: int = 81920
    numa_zones: int = 2
    gpus_per_zone: int = 4
    # GPU index -> MIG instances on it ({profile: count}); GPUs not listed are whole GPUs.
    mig: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    mig_config: str = "all-disabled"
    cpus_per_zone: int = 64
    memory_gib_per_zone: int = 512
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    #: other extended resources of the node (an RDMA device plugin's shared HCA devices)
    extra: Mapping[str, int] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return self.numa_zones * self.gpus_per_zone

    def zone_of(self, gpu: int) -> int:
        return gpu // self.gpus_per_zone

    def gpu_resources(self, zone: int | None = None) -> dict[str, int]:
        """Extended resources of the whole node (zone None) or of one NUMA zone."""
        out: Counter[str] = Counter()
        for gpu in range(self.gpus):
            if zone is not None and self.zone_of(gpu) != zone:
                continue
            if gpu in self.mig:
                for profile, count in self.mig[gpu].items():
                    out[mig_resource(profile)] += count
            else:
                out[GPU] += 1
        out.setdefault(GPU, 0)
        return dict(out)


def node_manifest(spec: GpuNodeSpec) -> JsonObject:
    resources: JsonObject = {
        "cpu": str(spec.cpus_per_zone * spec.numa_zones),
        "memory": f"{spec.memory_gib_per_zone * spec.numa_zones}Gi",
        "pods": str(spec.pods),
        **{name: str(n) for name, n in spec.gpu_resources().items()},
        **{name: str(n) for name, n in spec.extra.items()},
    }
    gpu_res = spec.gpu_resources()
    labels: JsonObject = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        E2E_NODE_LABEL: "true",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": spec.product,
        "nvidia.com/gpu.count": str(gpu_res[GPU]),
        "nvidia.com/gpu.memory": str(spec.gpu_memory_mib),
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": spec.mig_config,
        "nvidia.com/mig.config.state": "success",
        **{f"{name}.count": str(n) for name, n in gpu_res.items() if name != GPU},
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
        },
        # No kwok.x-k8s.io/node=fake:NoSchedule taint: it only keeps real pods off fake nodes in
        # real clusters, and every test pod would have to tolerate it.
        "spec": {},
        # Status may be set on create; later changes go through the /status subresource.
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def nrt_manifest(
    spec: GpuNodeSpec, used: Mapping[int, Mapping[str, int]] | None = None
) -> JsonObject:
    """The node's NodeResourceTopology.

    ``used`` (zone -> resource -> amount) lowers ``available``, as an exporter does for pods.
    """
    used = used or {}
    zones: list[JsonValue] = []
    for zone in range(spec.numa_zones):
        taken = used.get(zone, {})
        # Amounts in their unit: cpu in cores, memory in GiB (the "memory" key of `used` too).
        amounts = {"cpu": spec.cpus_per_zone, "memory": spec.memory_gib_per_zone}
        amounts.update(spec.gpu_resources(zone))
        resources: list[JsonValue] = []
        for name, total in amounts.items():
            unit = "Gi" if name == "memory" else ""
            resources.append(
                {
                    "name": name,
                    "capacity": f"{total}{unit}",
                    "allocatable": f"{total}{unit}",
                    "available": f"{total - taken.get(name, 0)}{unit}",
                }
            )
        zones.append(
            {
                "name": f"node-{zone}",
                "type": "Node",
                "costs": [
                    {"name": f"node-{other}", "value": 10 if other == zone else 21}
                    for other in range(spec.numa_zones)
                ],
                "resources": resources,
            }
        )
    return {
        "apiVersion": f"{NRT_GROUP}/{NRT_VERSION}",
        "kind": "NodeResourceTopology",
        "metadata": {"name": spec.name, "labels": {E2E_NODE_LABEL: "true"}},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "pod"},
        ],
        "zones": zones,
    }


# --------------------------------------------------------------------------------------------------
# Talking to the apiserver


def nrt_crd_manifest() -> JsonObject:
    crd = yaml.safe_load(Path(NRT_CRD).read_text())
    if not isinstance(crd, dict):
        raise ValueError(f"{NRT_CRD}: not a mapping")
    return crd


async def apply_crd(api: client.ApiClient, crd: JsonObject, within: float = 30.0) -> bool:
    """Create a CRD (if missing) and wait until it is Established; whether it was created."""
    name = as_object(crd.get("metadata"), "CRD: metadata").get("name")
    if not isinstance(name, str):
        raise ValueError("CRD: metadata.name is not a string")
    ext = client.ApiextensionsV1Api(api)
    created = True
    try:
        await ext.create_custom_resource_definition(body(crd))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
        created = False
    async with asyncio.timeout(within):
        while True:
            got = await ext.read_custom_resource_definition(name)
            conditions = (got.status.conditions or []) if got.status else []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return created
            await asyncio.sleep(0.1)


async def apply_nrt_crd(api: client.ApiClient, within: float = 30.0) -> None:
    """Create the NodeResourceTopology CRD (if missing) and wait until it is Established."""
    await apply_crd(api, nrt_crd_manifest(), within)


async def _bounded(jobs: Iterable[Any], concurrency: int) -> list[Any]:
    sem = asyncio.Semaphore(concurrency)

    async def run(job: Any) -> Any:
        async with sem:
            return await job

    return list(await asyncio.gather(*(run(j) for j in jobs)))


async def create_gpu_nodes(
    api: client.ApiClient, specs: Sequence[GpuNodeSpec], *, concurrency: int = 16
) -> None:
    """Create the nodes and their NodeResourceTopology objects (the CRD must be applied)."""
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    await _bounded((core.create_node(body(node_manifest(s))) for s in specs), concurrency)
    await _bounded(
        (
            custom.create_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, nrt_manifest(s))
            for s in specs
        ),
        concurrency,
    )


async def wait_nodes_ready(
    api: client.ApiClient, names: Iterable[str], *, within: float = 60.0
) -> None:
    """Wait until kwok reports every named node Ready."""
    core = client.CoreV1Api(api)
    wanted = set(names)
    async with asyncio.timeout(within):
        while True:
            nodes = await core.list_node(label_selector=f"{E2E_NODE_LABEL}=true")
            ready = {
                n.metadata.name
                for n in nodes.items
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            }
            if wanted <= ready:
                return
            await asyncio.sleep(0.25)


async def delete_gpu_nodes(api: client.ApiClient) -> None:
    """Delete every node and NodeResourceTopology these helpers made."""
    selector = f"{E2E_NODE_LABEL}=true"
    await client.CoreV1Api(api).delete_collection_node(label_selector=selector)
    custom = client.CustomObjectsApi(api)
    try:
        await custom.delete_collection_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, label_selector=selector
        )
    except client.ApiException as exc:
        if exc.status != 404:  # CRD not applied
            raise
