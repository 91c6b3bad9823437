"""A stand-in for NFD's topology-updater on kwok nodes (which have no kubelet, hence no real NUMA
accounting): per node and NUMA zone, the GPUs and CPUs of the pods bound there, written to the
node's NodeResourceTopology ``available``.

A pod gets the first zone whose free GPUs (and CPUs) fit it, as the kubelet's Topology Manager
does under ``single-numa-node`` (the narrowest hint, lowest NUMA id first). While `spreading` is
on, new pods get the zone with the most free GPUs instead: the history of arrivals and departures
that leaves 1-GPU replicas scattered over both zones of a node (what fragmentation looks like).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    """Keeps the NodeResourceTopology of `specs`' nodes current with the pods bound there.

    `label`: only pods labelled `app=<label>` in `namespace` (a test's own pods); None: every pod
    on those nodes. `cpu_pods`: whether pods without GPUs are accounted too (their CPUs).
    A test may steer the zones: `pinned` (pod key -> zone), `hints` (pod name prefix -> zones the
    next such pods get, in order: the history that fragmented a node). `misaligned` lists the pods
    no zone could hold (the kubelet would have rejected them with a TopologyAffinityError)."""

    def __init__(
        self,
        api: client.ApiClient,
        specs: Iterable[GpuNodeSpec],
        label: str | None = None,
        namespace: str = "default",
        cpu_pods: bool = True,
    ) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.specs: dict[str, GpuNodeSpec] = {s.name: s for s in specs}
        self.label = label
        self.namespace = namespace
        self.cpu_pods = cpu_pods
        #: pod key ("namespace/name") -> (node, zone, gpus, cpus)
        self.where: dict[str, tuple[str, int, int, int]] = {}
        #: pod key -> the uid accounted (a pod recreated under the same name is a new pod)
        self.uids: dict[str, str] = {}
        self.pinned: dict[str, int] = {}
        self.hints: dict[str, list[int]] = {}
        self.misaligned: list[str] = []
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

    def _zone(self, key: str, name: str, node: str, gpus: int, cpus: int) -> int:
        zone = self.pinned.get(key)
        for prefix, zones in self.hints.items():
            if zone is None and zones and name.startswith(prefix):
                zone = zones.pop(0)
        if zone is not None:
            return zone
        spec, used = self.specs[node], self.used(node)
        fits = [
            z
            for z in range(spec.numa_zones)
            if spec.gpus_per_zone - used[z][GPU] >= gpus
            and spec.cpus_per_zone - used[z]["cpu"] >= cpus
        ]
        if not fits:  # the kubelet would reject it (TopologyAffinityError): account it somewhere
            self.misaligned.append(key)
            return 0
        if self.spreading:
            return max(fits, key=lambda z: (spec.gpus_per_zone - used[z][GPU], -z))
        return fits[0]

    async def _pods(self) -> list[Any]:
        if self.label is None:
            got = await self.core.list_pod_for_all_namespaces()
        else:
            got = await self.core.list_namespaced_pod(
                self.namespace, label_selector=f"app={self.label}"
            )
        return list(got.items)

    async def sync(self) -> bool:
        """Account for pods bound or gone since the last call; True if anything changed."""
        live = {}
        for p in await self._pods():
            if p.spec.node_name in self.specs and p.status.phase not in ("Succeeded", "Failed"):
                live[f"{p.metadata.namespace}/{p.metadata.name}"] = p
        dirty: set[str] = set()
        for key in [
            k for k in self.where if k not in live or live[k].metadata.uid != self.uids.get(k)
        ]:
            dirty.add(self.where.pop(key)[0])
            self.uids.pop(key, None)
        for key, p in sorted(live.items(), key=lambda kv: kv[1].metadata.creation_timestamp):
            if key in self.where:
                continue
            node = p.spec.node_name
            gpus, cpus = pod_request(p, GPU), pod_request(p, "cpu")
            if not gpus and not self.cpu_pods:
                continue
            self.where[key] = (node, self._zone(key, p.metadata.name, node, gpus, cpus), gpus, cpus)
            self.uids[key] = p.metadata.uid
            dirty.add(node)
        for node in sorted(dirty):
            await self.write(node)
        return bool(dirty)

    async def run(self, period: float = 0.2) -> None:
        while True:
            await self.sync()
            await anyio.sleep(period)
