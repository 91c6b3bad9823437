"""A stand-in for NFD's topology-updater on kwok nodes (which have no kubelet, hence no real NUMA
accounting): per node and NUMA zone, the GPUs and CPUs of the pods bound there, written to the
node's NodeResourceTopology ``available``.

A pod gets the first zone whose free GPUs (and CPUs) fit it, as the kubelet's Topology Manager
does under ``single-numa-node`` (the narrowest hint, lowest NUMA id first). While `spreading` is
on, new pods get the zone with the most free GPUs instead: the history of arrivals and departures
that leaves 1-GPU replicas scattered over both zones of a node (what fragmentation looks like).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import anyio
from kubernetes_asyncio import client

from pyctl.dev.gpu_nodes import (
    GPU,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    body,
    nrt_manifest,
)


def pod_request(p: Any, resource: str) -> int:
    """The pod's whole-unit request of `resource` (GPUs, or CPUs rounded up)."""
    total = 0
    for c in p.spec.containers:
        req = (c.resources.requests or {}) if c.resources else {}
        raw = str(req.get(resource, "0"))
        total += -(-int(raw[:-1]) // 1000) if raw.endswith("m") else int(float(raw))
    return total


class TopologyUpdater:
    def __init__(self, api: client.ApiClient, specs: Iterable[GpuNodeSpec]) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.specs: dict[str, GpuNodeSpec] = {s.name: s for s in specs}
        #: pod key -> (node, zone, gpus, cpus)
        self.where: dict[str, tuple[str, int, int, int]] = {}
        #: new pods go to the emptiest zone (see the module's doc)
        self.spreading = False

    def used(self, node: str) -> dict[int, dict[str, int]]:
        out = {z: {GPU: 0, "cpu": 0} for z in range(self.specs[node].numa_zones)}
        for n, z, g, c in self.where.values():
            if n == node:
                out[z][GPU] += g
                out[z]["cpu"] += c
        return out

    def gpus_used(self, node: str) -> list[int]:
        return [u[GPU] for _, u in sorted(self.used(node).items())]

    async def write(self, node: str) -> None:
        manifest = nrt_manifest(self.specs[node], self.used(node))
        cur = await self.custom.get_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, node)
        cur["zones"] = manifest["zones"]
        await self.custom.replace_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, node, body(cur)
        )

    def _zone(
        self, spec: GpuNodeSpec, used: Mapping[int, Mapping[str, int]], gpus: int, cpus: int
    ) -> int:
        fits = [
            z
            for z in range(spec.numa_zones)
            if spec.gpus_per_zone - used[z][GPU] >= gpus
            and spec.cpus_per_zone - used[z]["cpu"] >= cpus
        ]
        if not fits:  # the kubelet would reject it (TopologyAffinityError): account it somewhere
            return 0
        if self.spreading:
            return max(fits, key=lambda z: (spec.gpus_per_zone - used[z][GPU], -z))
        return fits[0]

    async def sync(self) -> bool:
        """Account for pods bound or gone since the last call; True if anything changed."""
        pods = await self.core.list_pod_for_all_namespaces()
        live = {}
        for p in pods.items:
            if p.spec.node_name in self.specs and p.status.phase not in ("Succeeded", "Failed"):
                live[f"{p.metadata.namespace}/{p.metadata.name}/{p.metadata.uid}"] = p
        dirty: set[str] = set()
        for key in [k for k in self.where if k not in live]:
            dirty.add(self.where.pop(key)[0])
        for key, p in sorted(live.items(), key=lambda kv: kv[1].metadata.creation_timestamp):
            if key in self.where:
                continue
            node = p.spec.node_name
            gpus, cpus = pod_request(p, GPU), pod_request(p, "cpu")
            if not gpus:
                continue
            zone = self._zone(self.specs[node], self.used(node), gpus, cpus)
            self.where[key] = (node, zone, gpus, cpus)
            dirty.add(node)
        for node in sorted(dirty):
            await self.write(node)
        return bool(dirty)

    async def run(self, period: float = 0.2) -> None:
        while True:
            await self.sync()
            await anyio.sleep(period)
