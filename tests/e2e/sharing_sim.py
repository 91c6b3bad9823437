"""GPU sharing on kwok nodes, for the e2e tests of docs/sharing.md. kwok plays the kubelets but no
device plugin runs and no HAMi scheduler exists here, so two stand-ins follow their documented
protocols against the real API server:

* `time_sliced_node`, `hami_node`: nodes as the NVIDIA device plugin with a time-slicing config
  (and GPU Feature Discovery) or HAMi's device plugin show them: the advertised resources
  (`nvidia.com/gpu.shared` = GPUs x replicas with `renameByDefault`; HAMi: `nvidia.com/gpu` =
  GPUs x deviceSplitCount) and the labels / registration annotation, in the upstream formats.
* `ReplicaAllocator`: the device plugin's allocation of replicas when the kubelet admits a pod
  (k8s-device-plugin `internal/rm/allocate.go`, `greedyAlloc` with the default `distributed`
  policy): one replica at a time from the GPU with the fewest allocated replicas, ties to the GPU
  this allocation took fewest from. Upstream leaves further ties to Go's map order (the candidate
  list comes from a map); here they go to the lowest GPU index, the rule pyctl documents. The
  kubelet admits pods in the order they are bound; the allocator follows the pods as the watch
  shows them bound, and frees their replicas when they go.
* `HamiScheduler`: HAMi's scheduler extender (`pkg/scheduler/scheduler.go` Filter and Bind) for a
  real kube-scheduler profile `hami-scheduler` that calls it with HAMi's chart configuration
  (filter + bind, nodeCacheCapable, HAMi's resources `ignoredByScheduler`). Filter computes each
  candidate node's device usage from the `hami.io/vgpu-devices-allocated` annotations of the pods
  assigned there, fits the pod's containers device by device with HAMi's checks (`Fit` in
  `pkg/device/nvidia/device.go`: task count < deviceSplitCount, free memory, free cores, exclusive
  use at 100 cores, no core-less task on a GPU whose cores are all taken), picks one node and
  writes the annotations HAMi writes (`hami.io/vgpu-node`, `hami.io/vgpu-time`,
  `hami.io/vgpu-devices-to-allocate`, `hami.io/vgpu-devices-allocated`: `uuid,NVIDIA,mem,cores:`
  per device, `;` after each container). Bind writes `hami.io/bind-phase: allocating` and
  `hami.io/bind-time`, binds, then (as HAMi's device plugin does once it allocated) sets the phase
  to `success`. Simplified: device and node ranking (HAMi scores with weights; here: `spread`
  over devices, least used first; `binpack` over nodes, most used first), quotas, MIG mode,
  topology-aware and NUMA-bound allocation, node locks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client

# the API server writes quantities in canonical form ("20000" becomes "20k")
from pyctl.cluster.quantity import count as quantity

from .control_plane import KWOK_NODE_ANNOTATION
from .gpu_nodes import E2E_NODE_LABEL, body

SHARED = "nvidia.com/gpu.shared"
GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"
GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
GPUCORES = "nvidia.com/gpucores"
HAMI_REGISTER = "hami.io/node-nvidia-register"
HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_SCHEDULER = "hami-scheduler"
#: HAMi's chart: the resources its extender manages, which the kube-scheduler must not check
HAMI_MANAGED = (GPU, GPUMEM, GPUCORES, GPUMEM_PERCENT, "nvidia.com/priority")


def gpu_uuid(node: str, i: int) -> str:
    import hashlib

    h = hashlib.sha256(f"{node}/{i}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _node(
    name: str,
    labels: Mapping[str, str],
    resources: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", **resources}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                E2E_NODE_LABEL: "true",
                **labels,
            },
            "annotations": {KWOK_NODE_ANNOTATION: "fake", **(annotations or {})},
        },
        "spec": {},
        "status": {"capacity": dict(res), "allocatable": dict(res)},
    }


def time_sliced_node(
    name: str,
    gpus: int,
    replicas: int,
    product: str = "NVIDIA-A10G",
    memory_mib: int = 23028,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The device plugin with `sharing.timeSlicing.renameByDefault: true` and `replicas`; GFD's
    labels (the product without -SHARED since the replicas are renamed)."""
    return _node(
        name,
        {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.replicas": str(replicas),
            "nvidia.com/gpu.sharing-strategy": "time-slicing",
            "nvidia.com/mig.capable": "false",
            **(labels or {}),
        },
        {GPU: "0", SHARED: str(gpus * replicas)},
    )


def exclusive_node(name: str, gpus: int, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return _node(
        name,
        {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-L40S",
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            **(labels or {}),
        },
        {GPU: str(gpus)},
    )


@dataclass(frozen=True)
class HamiDevice:
    uuid: str
    index: int
    numa: int
    memory_mib: int = 81920
    cores: int = 100
    split: int = 10
    type: str = "NVIDIA A100-SXM4-80GB"


def hami_devices(name: str, gpus: int, zones: int = 2) -> list[HamiDevice]:
    per = max(1, gpus // zones)
    return [HamiDevice(gpu_uuid(name, i), i, min(i // per, zones - 1)) for i in range(gpus)]


def hami_node(name: str, devices: Sequence[HamiDevice]) -> dict[str, Any]:
    """HAMi's device plugin (v2.8+): the JSON registration (zero/false fields left out, as Go's
    omitempty does) and `nvidia.com/gpu` = GPUs x deviceSplitCount."""
    reg = []
    for d in devices:
        item: dict[str, Any] = {"id": d.uuid}
        if d.index:
            item["index"] = d.index
        item.update({"count": d.split, "devmem": d.memory_mib, "devcore": d.cores, "type": d.type})
        if d.numa:
            item["numa"] = d.numa
        item.update({"mode": "hami-core", "health": True})
        reg.append(item)
    return _node(
        name,
        {"gpu": "on", "nvidia.com/gpu.present": "true"},
        {GPU: str(sum(d.split for d in devices))},
        {
            HAMI_REGISTER: json.dumps(reg, separators=(",", ":")),
            "hami.io/node-handshake": "Reported " + time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )


# --------------------------------------------------------------------------------------------
# The device plugin's replica allocation


@dataclass
class ReplicaAllocator:
    """Per time-sliced node: which pod holds how many replicas of which GPU."""

    gpus: Mapping[str, int]
    replicas: int
    #: node -> GPU -> pod -> replicas
    held: dict[str, list[dict[str, int]]] = field(default_factory=dict)
    #: pods seen bound (key -> node)
    bound: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node, n in self.gpus.items():
            self.held[node] = [{} for _ in range(n)]

    def admit(self, pod: str, node: str, k: int) -> None:
        """greedyAlloc(distributed): k replicas, one at a time."""
        gpus = self.held[node]
        picked: dict[int, int] = {}
        for _ in range(k):
            free = [i for i, g in enumerate(gpus) if sum(g.values()) < self.replicas]
            if not free:
                raise AssertionError(f"{pod}: the kubelet would refuse it (no free replica)")
            i = min(free, key=lambda i: (sum(gpus[i].values()), picked.get(i, 0), i))
            gpus[i][pod] = gpus[i].get(pod, 0) + 1
            picked[i] = picked.get(i, 0) + 1
        self.bound[pod] = node

    def release(self, pod: str) -> None:
        node = self.bound.pop(pod, None)
        if node is not None:
            for g in self.held[node]:
                g.pop(pod, None)

    async def sync(self, core: client.CoreV1Api, namespace: str, label: str) -> None:
        """Follow the pods: admit the newly bound in the order they were bound (creation order
        among those bound since the last call), release the gone."""
        pods = await core.list_namespaced_pod(namespace, label_selector=f"app={label}")
        live = {}
        for p in pods.items:
            if p.spec.node_name in self.held and p.metadata.deletion_timestamp is None:
                live[f"{namespace}/{p.metadata.name}"] = p
        for key in [k for k in self.bound if k not in live]:
            self.release(key)
        new = [p for k, p in live.items() if k not in self.bound]
        for p in sorted(new, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name)):
            k = 0
            for c in p.spec.containers:
                req = (c.resources.requests or {}) if c.resources else {}
                k += quantity(req.get(SHARED, 0))
            self.admit(f"{namespace}/{p.metadata.name}", p.spec.node_name, k)


# --------------------------------------------------------------------------------------------
# HAMi's scheduler extender


@dataclass
class _Usage:
    used: int = 0
    mem: int = 0
    cores: int = 0


def _container_request(res: Mapping[str, Any]) -> tuple[int, int, int, int] | None:
    """HAMi's GenerateResourceRequests (defaults of its chart: defaultMemory 0, defaultCores 0):
    (devices, MiB or 0, percent or 101, cores)."""
    if GPU not in res:
        return None
    n = quantity(res[GPU])
    mem = quantity(res.get(GPUMEM, 0))
    pct = quantity(res.get(GPUMEM_PERCENT, 101))
    if pct <= 0:
        pct = 101
    if pct == 101 and mem == 0:
        pct = 100
    return n, mem, pct, quantity(res.get(GPUCORES, 0))


class HamiScheduler:
    """The extender's HTTP face (filter, bind) and what it assigned: pod key -> node, and per
    container [(uuid, mem, cores)]."""

    def __init__(self, api: client.ApiClient, devices: Mapping[str, Sequence[HamiDevice]]) -> None:
        self.core = client.CoreV1Api(api)
        self.devices = {n: list(d) for n, d in devices.items()}
        self.assigned: dict[str, tuple[str, list[list[tuple[str, int, int]]]]] = {}
        self.app = web.Application()
        self.app.router.add_post("/filter", self.filter)
        self.app.router.add_post("/bind", self.bind)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> int:
        self._runner = web.AppRunner(self.app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def config(self) -> dict[str, Any]:
        """A KubeSchedulerConfiguration as HAMi's chart writes it (profile + extender)."""
        return {
            "profiles": [{"schedulerName": HAMI_SCHEDULER}],
            "extenders": [
                {
                    "urlPrefix": f"http://127.0.0.1:{self.port}",
                    "filterVerb": "filter",
                    "bindVerb": "bind",
                    "nodeCacheCapable": True,
                    "weight": 1,
                    "httpTimeout": "30s",
                    "enableHTTPS": False,
                    "managedResources": [
                        {"name": r, "ignoredByScheduler": True} for r in HAMI_MANAGED
                    ],
                }
            ],
        }

    async def _usage(self, node: str, skip: str) -> dict[str, _Usage]:
        """Device usage from the annotations of the pods HAMi assigned to `node`."""
        usage = {d.uuid: _Usage() for d in self.devices[node]}
        pods = await self.core.list_pod_for_all_namespaces()
        for p in pods.items:
            ann = p.metadata.annotations or {}
            key = f"{p.metadata.namespace}/{p.metadata.name}"
            if key == skip or ann.get("hami.io/vgpu-node") != node:
                continue
            if p.status.phase in ("Succeeded", "Failed") or p.metadata.deletion_timestamp:
                continue
            for c in ann.get(HAMI_ALLOCATED, "").split(";"):
                for e in c.split(":"):
                    f = e.split(",")
                    if len(f) >= 4 and f[0] in usage:
                        u = usage[f[0]]
                        u.used += 1
                        u.mem += int(f[2])
                        u.cores += int(f[3])
        return usage

    def _fit(
        self, node: str, usage: dict[str, _Usage], reqs: list[tuple[int, int, int, int] | None]
    ) -> list[list[tuple[str, int, int]]] | None:
        out: list[list[tuple[str, int, int]]] = []
        for r in reqs:
            if r is None:
                out.append([])
                continue
            n, mem, pct, cores = r
            cores = min(cores, 100)
            got: list[tuple[str, int, int]] = []

            def score(d: HamiDevice) -> float:
                u = usage[d.uuid]
                return u.used / d.split + u.cores / d.cores + u.mem / d.memory_mib

            # spread: the least used device first
            for d in sorted(self.devices[node], key=lambda d: (score(d), d.index)):
                if len(got) == n:
                    break
                u = usage[d.uuid]
                need = mem if mem else d.memory_mib * pct // 100
                if (
                    u.used >= d.split
                    or d.memory_mib - u.mem < need
                    or d.cores - u.cores < cores
                    or (cores == 100 and u.used > 0)
                    or (u.cores == d.cores and cores == 0)
                ):
                    continue
                got.append((d.uuid, need, cores))
            if len(got) < n:
                return None
            for uuid, m, c in got:
                usage[uuid].used += 1
                usage[uuid].mem += m
                usage[uuid].cores += c
            out.append(got)
        return out

    async def filter(self, request: web.Request) -> web.Response:
        args = await request.json()
        pod = args["Pod"]
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        spec = pod["spec"]
        containers = [*(spec.get("initContainers") or []), *spec["containers"]]
        reqs = [
            _container_request(
                {
                    **(c.get("resources", {}).get("requests") or {}),
                    **(c.get("resources", {}).get("limits") or {}),
                }
            )
            for c in containers
        ]
        names = args.get("NodeNames") or []
        fits: list[tuple[float, str, list[list[tuple[str, int, int]]]]] = []
        failed = {}
        for name in names:
            if name not in self.devices:
                failed[name] = "no HAMi devices registered"
                continue
            usage = await self._usage(name, key)
            before = sum(u.mem for u in usage.values())
            got = self._fit(name, usage, reqs)
            if got is None:
                failed[name] = "CardInsufficientMemory/Core or TimeSlicingExhausted"
                continue
            fits.append((-before, name, got))
        if not fits:
            return web.json_response({"NodeNames": [], "FailedNodes": failed, "Error": ""})
        # binpack: the most used node first
        _, node, got = min(fits)
        encoded = "".join("".join(f"{u},NVIDIA,{m},{c}:" for u, m, c in ctr) + ";" for ctr in got)
        await self.core.patch_namespaced_pod(
            meta["name"],
            meta["namespace"],
            body(
                {
                    "metadata": {
                        "annotations": {
                            "hami.io/vgpu-node": node,
                            "hami.io/vgpu-time": str(int(time.time())),
                            "hami.io/vgpu-devices-to-allocate": encoded,
                            HAMI_ALLOCATED: encoded,
                        }
                    }
                }
            ),
        )
        self.assigned[key] = (node, got)
        return web.json_response({"NodeNames": [node], "FailedNodes": failed, "Error": ""})

    async def bind(self, request: web.Request) -> web.Response:
        args = await request.json()
        name, ns, node = args["PodName"], args["PodNamespace"], args["Node"]
        patch = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": str(int(time.time()))}
        await self.core.patch_namespaced_pod(name, ns, body({"metadata": {"annotations": patch}}))
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "uid": args.get("PodUID", "")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            await self.core.create_namespaced_binding(ns, body(binding), _preload_content=False)
        except client.ApiException as e:
            return web.json_response({"Error": f"bind: {e.status} {e.reason}"})
        # HAMi's device plugin, once it allocated the devices on the node
        done = {"hami.io/bind-phase": "success", "hami.io/vgpu-devices-to-allocate": ";"}
        await self.core.patch_namespaced_pod(name, ns, body({"metadata": {"annotations": done}}))
        return web.json_response({"Error": ""})
