"""A stand-in for the GPU Operator's mig-manager (and, for the capacity it reports, the device
plugin), following the label protocol of `shared/docs/mig.md` §c against the real API server.

What it does, as mig-manager does:

* it watches the nodes (here: the kwok GPU nodes of the e2e helpers) and acts only when
  ``nvidia.com/mig.config`` **changes** (the initial value of a node whose state is already
  ``success`` counts as applied, as ``assert`` would find it; re-writing the same value does
  nothing);
* it reads the named config from the mig-parted config file, a ConfigMap (key ``config.yaml``),
  parsed and checked as mig-parted v1 (`pyctl.core.mig.parse_mig_parted`);
* it sets ``nvidia.com/mig.config.state=pending``, applies the config, then sets ``success``; an
  unknown config name (or a test switch) sets ``failed`` instead and leaves the GPUs as they were;
* applying: each GPU takes the first entry whose ``devices`` selects it (``all`` or its index):
  MIG on with the entry's ``mig-devices``, or a whole GPU when ``mig-enabled`` is false; GPUs no
  entry selects keep their layout. The node's ``status.capacity``/``allocatable`` then show the
  new ``nvidia.com/mig-<profile>`` counts (vanished profiles removed) and ``nvidia.com/gpu``
  the whole GPUs, as the restarted device plugin reports them (through the ``/status``
  subresource), and the GFD labels ``nvidia.com/mig-<profile>.count`` follow.

What it does not do (needs GPUs): NVML/mig-parted themselves (so no "In use" failure when a
process still holds an instance, unless a test asks for ``failed``), stopping and restarting the
operand pods (``nvidia.com/gpu.deploy.*`` relabelling), MIG mode changes, reboots, the
``rebooting`` state, and device-filter matching (entries with a ``device-filter`` are taken to
apply to every GPU their ``devices`` select).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client, watch

from pyctl.core.mig import MIG_CONFIG_LABEL, parse_mig_parted, to_yaml
from pyctl.jsontypes import JsonObject

from .gpu_nodes import (
    E2E_NODE_LABEL,
    GPU,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
    mig_resource,
)

log = logging.getLogger("tests.mig_manager_sim")

STATE_LABEL = "nvidia.com/mig.config.state"
MERGE = "application/merge-patch+json"
#: kubernetes-asyncio takes the patch's content type as a keyword its stubs do not declare
MERGE_KW: dict[str, Any] = {"_content_type": MERGE}
#: the mig-parted config the test nodes start from (the operator's `all-1g.5gb`)
BASE_CONFIGS = {
    "all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]
}


def a100_all_1g(name: str) -> GpuNodeSpec:
    """A kwok node with two A100-40GB GPUs in MIG mode, each 7 x `1g.5gb` (`all-1g.5gb`)."""
    return GpuNodeSpec(
        name,
        product="NVIDIA-A100-SXM4-40GB",
        gpu_memory_mib=40960,
        numa_zones=1,
        gpus_per_zone=2,
        mig={0: {"1g.5gb": 7}, 1: {"1g.5gb": 7}},
        mig_config="all-1g.5gb",
        labels={"nvidia.com/gpu.count": "2"},
    )


async def create_mig_node(
    api: client.ApiClient, spec: GpuNodeSpec, configmap: str, namespace: str = "gpu-operator"
) -> None:
    """The node (and its NodeResourceTopology), the GPU Operator's namespace, and the mig-parted
    ConfigMap mig-manager reads, holding `BASE_CONFIGS`."""
    core = client.CoreV1Api(api)
    await apply_nrt_crd(api)
    await create_gpu_nodes(api, [spec])
    try:
        await core.create_namespace(body({"metadata": {"name": namespace}}))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    text = to_yaml({"version": "v1", "mig-configs": BASE_CONFIGS})
    await core.create_namespaced_config_map(
        namespace, body({"metadata": {"name": configmap}, "data": {"config.yaml": text}})
    )


def mig_pod(name: str, node: str, profile: str, app: str) -> JsonObject:
    """A pod asking for one `nvidia.com/mig-<profile>` instance on `node`."""
    res: JsonObject = {f"nvidia.com/mig-{profile}": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/infer:1",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


#: per GPU index: {profile: count} (MIG on) or None (a whole GPU)
Gpus = dict[int, dict[str, int] | None]


def apply_config(gpus: Gpus, entries: Sequence[Mapping[str, Any]]) -> Gpus:
    """The node's GPUs after mig-parted applied `entries`."""
    out: Gpus = {}
    for g, layout in gpus.items():
        for e in entries:
            dev = e.get("devices")
            if dev == "all" or (isinstance(dev, list) and g in dev):
                out[g] = dict(e.get("mig-devices") or {}) if e.get("mig-enabled") else None
                break
        else:
            out[g] = layout
    return out


def capacity(gpus: Gpus) -> dict[str, int]:
    """Extended resources as the device plugin (mixed strategy) reports them."""
    out: dict[str, int] = {GPU: 0}
    for layout in gpus.values():
        if layout is None:
            out[GPU] += 1
            continue
        for prof, n in layout.items():
            if n:
                out[mig_resource(prof)] = out.get(mig_resource(prof), 0) + n
    return out


@dataclass
class MigManagerSim:
    api: client.ApiClient
    specs: Sequence[GpuNodeSpec]
    namespace: str = "gpu-operator"
    configmap: str = "pyctl-mig-parted-config"
    key: str = "config.yaml"
    #: seconds between pending and the outcome (mig-parted apply, operands restarting)
    delay: float = 0.3
    #: config names (or "*") that end in `failed`, as an "In use" error would
    fail: set[str] = field(default_factory=set)
    #: this many next reconfigurations end in `failed` (a test switch)
    fail_next: int = 0
    #: (node, config, state) in the order the states were written
    history: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.gpus: dict[str, Gpus] = {
            s.name: {g: (dict(s.mig[g]) if g in s.mig else None) for g in range(s.gpus)}
            for s in self.specs
        }
        #: the last value of the label seen per node (mig-manager acts on changes only)
        self.seen: dict[str, str] = {}
        self.ready = asyncio.Event()

    async def _state(self, node: str, config: str, state: str) -> None:
        await self.core.patch_node(node, {"metadata": {"labels": {STATE_LABEL: state}}}, **MERGE_KW)
        self.history.append((node, config, state))

    async def _configs(self) -> dict[str, list[JsonObject]]:
        try:
            cm = await self.core.read_namespaced_config_map(self.configmap, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        text = (cm.data or {}).get(self.key)
        return parse_mig_parted(text) if text else {}

    async def reconfigure(self, node: str, config: str) -> None:
        await self._state(node, config, "pending")
        await asyncio.sleep(self.delay)
        try:
            configs = await self._configs()
        except ValueError:
            configs = {}
        failing = self.fail_next > 0
        self.fail_next = max(0, self.fail_next - 1)
        if config not in configs or config in self.fail or "*" in self.fail or failing:
            await self._state(node, config, "failed")
            return
        before = capacity(self.gpus[node])
        self.gpus[node] = apply_config(self.gpus[node], configs[config])
        after = capacity(self.gpus[node])
        res: dict[str, str | None] = {k: str(v) for k, v in after.items()}
        res.update({k: None for k in before if k not in after})
        await self.core.patch_node_status(
            node, {"status": {"capacity": res, "allocatable": res}}, **MERGE_KW
        )
        labels: dict[str, str | None] = {
            f"{k}.count": (None if v is None else v) for k, v in res.items() if k != GPU
        }
        await self.core.patch_node(node, {"metadata": {"labels": labels}}, **MERGE_KW)
        await self._state(node, config, "success")

    async def _on(self, obj: Any) -> None:
        name = obj.metadata.name
        if name not in self.gpus:
            return
        labels = obj.metadata.labels or {}
        want = labels.get(MIG_CONFIG_LABEL, "")
        if name not in self.seen:  # AddFunc: the initial value
            self.seen[name] = want
            if labels.get(STATE_LABEL) == "success" or not want:
                return
        elif self.seen[name] == want:
            return  # UpdateFunc acts only when the value changed
        self.seen[name] = want
        if want:
            await self.reconfigure(name, want)

    async def run(self) -> None:
        selector = f"{E2E_NODE_LABEL}=true"
        while True:
            nodes = await self.core.list_node(label_selector=selector)
            for n in nodes.items:
                await self._on(n)
            self.ready.set()
            rv = nodes.metadata.resource_version
            try:
                async with watch.Watch().stream(
                    self.core.list_node,
                    label_selector=selector,
                    resource_version=rv,
                    timeout_seconds=30,
                ) as stream:
                    async for ev in stream:
                        if ev["type"] in ("ADDED", "MODIFIED"):
                            await self._on(ev["object"])
                        elif ev["type"] == "ERROR":
                            break  # 410 Gone: list again
            except client.ApiException as exc:
                if exc.status != 410:
                    raise
