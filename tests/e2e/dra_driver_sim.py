"""A SIMULATED NVIDIA DRA driver for kwok nodes: it publishes ResourceSlices the way the NVIDIA
DRA GPU driver's kubelet plugin does (github.com/NVIDIA/k8s-dra-driver-gpu, now
kubernetes-sigs/dra-driver-nvidia-gpu: `cmd/gpu-kubelet-plugin/deviceinfo.go`, `mig.go`,
`partitions.go`), because the real plugin needs NVML and GPUs, which the test machine does not
have. It simulates only the documented protocol towards the API server; nothing here prepares a
device (there is no kubelet: kwok plays it).

What it publishes, per node (pool name = node name, driver `gpu.nvidia.com`, one pool generation):

* GPUs several claims share by capacity (`shared`): as whole GPUs, with
  `allowMultipleAllocations: true` and the capacities of `SHARED_POLICIES` (KEP-5075's fields;
  the real driver does not publish these);
* whole GPUs: devices `gpu-<minor>` with the driver's attributes (`type: gpu`, `uuid`,
  `productName`, `brand`, `architecture`, `cudaComputeCapability`, `driverVersion`,
  `cudaDriverVersion`, `addressingMode`) and the standard ones (`resource.kubernetes.io/numaNode`
  as an int, or as a list of ints when `numa_lists` is set - the `DRAListTypeAttributes` form;
  `pcieRoot`, `pciBusID`), capacity `memory`;
* with `fm_partitions` (the driver's alpha gate `FabricManagerPartitioning`), every full GPU
  device also carries `gpuModuleID` (its position on the node, from 1) and `partition<N>` for
  N = 1, 2, 4, 8 up to the node's GPU count: the id of the partition of N GPUs that holds it,
  numbered as Fabric Manager does on an 8-GPU board (the partition of 8 is 1, those of 4 are 2
  and 3, those of 2 are 4 to 7, those of 1 are 8 to 15; `deviceinfo.go`,
  `addFabricManagerAttributes`); MIG devices carry none;
* a MIG-capable GPU in DynamicMIG mode (`dynamic_mig`): one slice with a shared counter set
  `gpu-<minor>-counter-set` (the per-GPU maxima of `multiprocessors`, `copy-engines`, `decoders`,
  `encoders`, `jpeg-engines`, `ofa-engines`, `memory`, and one `memory-slice-<i>` counter per
  memory slice), and a slice with the full device `gpu-<minor>` (consuming every counter) plus
  one device per MIG profile and placement,
  `gpu-<minor>-mig-<profile without dots>-<profileID>-<start>`, `type: mig`, `profile`,
  `parentUUID`, consuming its capacities and the memory slices of its placement. Counter sets and
  devices are in separate slices of one pool, as the API requires.

The MIG geometry (profiles, their GI profile IDs, memory slices and placements) comes from pyctl's
MIG catalog (`pyctl/data/mig_profiles.json`, which cites `nvidia-smi mig -lgipp` captures); the
engine counts and multiprocessor numbers are illustrative (per compute slice), since NVML is not
here to say them. `profile_placements` may be overridden to publish a geometry that disagrees with
the catalog (the tests of pyctl's check).
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from pyctl.core import mig
from pyctl.dev.gpu_nodes import E2E_NODE_LABEL, body

DRIVER = "gpu.nvidia.com"
GROUP, VERSION = "resource.k8s.io", "v1"
#: label on every object this module makes (clean-up)
LABEL = "pyctl.e2e/dra-sim"
#: the DeviceClasses the NVIDIA driver's Helm chart installs (same selectors)
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PRODUCTS = {
    "H100-80GB": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559),
    "A100-SXM4-40GB": ("NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960),
}
SMS_PER_SLICE = {"Hopper": 16, "Ampere": 14}
#: request policies of a shared GPU's capacities (`SimGpu.shared`): memory in steps of 1Gi (8Gi
#: when a claim asks none), compute as a percentage of the GPU's multiprocessors in four sizes
#: (10 when a claim asks none). NVIDIA's driver does not publish GPUs this way (yet); the shape
#: is the API's (KEP-5075), and the API server validates it.
SHARED_POLICIES: dict[str, dict[str, Any]] = {
    "memory": {"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}},
    "compute": {"default": "10", "validValues": ["10", "25", "50", "100"]},
}


def device_classes() -> list[dict[str, Any]]:
    def cls(name: str, kind: str) -> dict[str, Any]:
        expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {LABEL: "true"}},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }

    return [cls(GPU_CLASS, "gpu"), cls(MIG_CLASS, "mig")]


def _str(v: str) -> dict[str, Any]:
    return {"string": v}


def _q(v: int) -> dict[str, Any]:
    return {"value": str(v)}


@dataclass(frozen=True)
class SimGpu:
    minor: int
    numa: int | Sequence[int]
    model: str = "H100-80GB"
    #: publish its MIG profiles and placements with counters (DynamicMIG)
    dynamic_mig: bool = False
    pcie_root: str = ""
    #: publish it as a device several claims share by capacity (KEP-5075: allowMultipleAllocations
    #: with `memory` and `compute` capacities and their request policies, see `SHARED_POLICIES`)
    shared: bool = False

    def uuid(self, node: str) -> str:
        return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/gpu-{self.minor}"))


@dataclass
class SimNode:
    name: str
    gpus: Sequence[SimGpu]
    #: profile -> placements to publish instead of the catalog's (start, size) (a disagreement)
    profile_placements: Mapping[str, Sequence[tuple[int, int]]] = field(default_factory=dict)
    #: publish the Fabric Manager attributes (`gpuModuleID`, `partition<N>`) on full GPUs
    fm_partitions: bool = False


def fm_attrs(node: SimNode, g: SimGpu) -> dict[str, Any]:
    """The Fabric Manager attributes of a full GPU (none without `node.fm_partitions`)."""
    if not node.fm_partitions:
        return {}
    n = len(node.gpus)
    i = next(k for k, x in enumerate(node.gpus) if x is g)
    out: dict[str, Any] = {"gpuModuleID": {"int": i + 1}}
    first = 1
    for size in (8, 4, 2, 1):
        if size <= n:
            out[f"partition{size}"] = {"int": first + i // size}
            first += -(-n // size)
    return out


def _gpu_attrs(node: str, g: SimGpu) -> dict[str, Any]:
    product, arch, cc, _ = PRODUCTS[g.model]
    numa = {"ints": list(g.numa)} if not isinstance(g.numa, int) else {"int": g.numa}
    root = (
        g.pcie_root
        or f"pci0000:{0x10 + 0x40 * (g.numa if isinstance(g.numa, int) else g.numa[0]):02x}"
    )
    return {
        "type": _str("gpu"),
        "uuid": _str(g.uuid(node)),
        "productName": _str(product),
        "brand": _str("Nvidia"),
        "architecture": _str(arch),
        "cudaComputeCapability": {"version": f"{cc}.0"},
        "driverVersion": {"version": "580.82.7"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "addressingMode": _str("None"),
        "resource.kubernetes.io/numaNode": numa,
        "resource.kubernetes.io/pcieRoot": _str(root),
        "resource.kubernetes.io/pciBusID": _str(f"0000:{0x18 + 0x10 * g.minor:02x}:00.0"),
    }


def _mig_caps(p: mig.MigProfile, arch: str) -> dict[str, int]:
    return {
        "multiprocessors": SMS_PER_SLICE[arch] * p.compute_slices,
        "copyEngines": p.compute_slices,
        "decoders": p.compute_slices // 2,
        "encoders": 0,
        "jpegEngines": 1 if p.media_extensions or p.compute_slices == 7 else 0,
        "ofaEngines": 1 if p.media_extensions or p.compute_slices == 7 else 0,
        "memory": p.memory_slices * (1 << 30) * 10,
    }


def _counter(name: str) -> str:
    """camelCase capacity name -> DNS-label counter name (the driver's camelToDNSName)."""
    out = ""
    for ch in name:
        out += f"-{ch.lower()}" if ch.isupper() else ch
    return out


def dynamic_gpu(node: SimNode, g: SimGpu) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(counter set, devices) of a MIG-capable GPU in DynamicMIG mode."""
    m = mig.model(g.model)
    _, arch, _, _ = PRODUCTS[g.model]
    maxima: dict[str, int] = {}
    for p in m.profiles:
        for k, v in _mig_caps(p, arch).items():
            maxima[k] = max(maxima.get(k, 0), v)
    set_name = f"gpu-{g.minor}-counter-set"
    all_counters = {_counter(k): _q(v) for k, v in maxima.items()}
    all_counters |= {f"memory-slice-{i}": _q(1) for i in range(m.memory_slices)}
    attrs = _gpu_attrs(node.name, g)
    full = {
        "name": f"gpu-{g.minor}",
        "attributes": attrs | fm_attrs(node, g),
        "capacity": {k: _q(v) for k, v in maxima.items()},
        "consumesCounters": [{"counterSet": set_name, "counters": dict(all_counters)}],
    }
    devices = [full]
    for p in m.profiles:
        placements = node.profile_placements.get(p.name, p.placements)
        for start, size in placements:
            caps = _mig_caps(p, arch)
            counters = {_counter(k): _q(v) for k, v in caps.items()}
            counters |= {f"memory-slice-{i}": _q(1) for i in range(start, start + size)}
            mattrs = {k: v for k, v in attrs.items() if k not in ("type", "uuid", "addressingMode")}
            mattrs |= {
                "type": _str("mig"),
                "profile": _str(p.name),
                "parentUUID": _str(g.uuid(node.name)),
            }
            name = p.name.replace(".", "").replace("+", "-")
            devices.append(
                {
                    "name": f"gpu-{g.minor}-mig-{name}-{p.id}-{start}",
                    "attributes": mattrs,
                    "capacity": {k: _q(v) for k, v in caps.items()},
                    "consumesCounters": [{"counterSet": set_name, "counters": counters}],
                }
            )
    return {"name": set_name, "counters": all_counters}, devices


def slices_for(node: SimNode, generation: int = 1) -> list[dict[str, Any]]:
    """The node's ResourceSlices: whole GPUs in one slice; each DynamicMIG GPU's devices in a
    slice of their own, all counter sets in one more."""
    whole = []
    sets = []
    mig_slices = []
    for g in node.gpus:
        if g.dynamic_mig:
            cs, devs = dynamic_gpu(node, g)
            sets.append(cs)
            mig_slices.append(devs)
        elif g.shared:
            _, _, _, mem = PRODUCTS[g.model]
            whole.append(
                {
                    "name": f"gpu-{g.minor}",
                    "attributes": _gpu_attrs(node.name, g) | fm_attrs(node, g),
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": f"{mem}Mi",
                            "requestPolicy": SHARED_POLICIES["memory"],
                        },
                        "compute": {"value": "100", "requestPolicy": SHARED_POLICIES["compute"]},
                    },
                }
            )
        else:
            _, _, _, mem = PRODUCTS[g.model]
            whole.append(
                {
                    "name": f"gpu-{g.minor}",
                    "attributes": _gpu_attrs(node.name, g) | fm_attrs(node, g),
                    "capacity": {"memory": _q(mem * 2**20)},
                }
            )
    specs: list[dict[str, Any]] = []
    if whole:
        specs.append({"devices": whole})
    specs += [{"devices": d} for d in mig_slices]
    if sets:
        specs.append({"sharedCounters": sets})
    out = []
    for i, extra in enumerate(specs):
        out.append(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ResourceSlice",
                "metadata": {
                    "name": f"{node.name}-{DRIVER}-{i}",
                    "labels": {LABEL: "true", E2E_NODE_LABEL: "true"},
                },
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node.name,
                    "pool": {
                        "name": node.name,
                        "generation": generation,
                        "resourceSliceCount": len(specs),
                    },
                    **extra,
                },
            }
        )
    return out


class SimDraDriver:
    """Publishes (and withdraws) the simulated driver's DeviceClasses and ResourceSlices."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)

    async def _create(self, plural: str, obj: Mapping[str, Any]) -> None:
        try:
            await self.custom.create_cluster_custom_object(GROUP, VERSION, plural, body(obj))
        except client.ApiException as exc:
            if exc.status != 409:
                raise

    async def install_classes(self) -> None:
        for c in device_classes():
            await self._create("deviceclasses", c)

    async def publish(self, nodes: Iterable[SimNode]) -> None:
        for n in nodes:
            for s in slices_for(n):
                await self._create("resourceslices", s)

    async def withdraw(self) -> None:
        await self.custom.delete_collection_cluster_custom_object(
            GROUP, VERSION, "resourceslices", label_selector=f"{LABEL}=true"
        )
