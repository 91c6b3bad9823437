"""The node's own view: per GPU what NVML and sysfs say, and where pyctl's MIG catalog disagrees
with the device (the device wins).

`read_node(nvml, sysfs_root)` reads every GPU; a call answering Not Supported is recorded as
such (`not_supported` lists the calls), any other failure of one GPU leaves that GPU out with the
reason (`failed`) and the others as they are. `view_json(view)` is the agent's output (`v` is the
format's version).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

from pyctl.agent import nvml as n
from pyctl.agent.sysfs import Numa, read_numa, sysfs_bus_id
from pyctl.cluster.bounds import MAX_GPUS_PER_NODE, MAX_TEXT_CHARS
from pyctl.core import mig
from pyctl.jsontypes import JsonObject, as_object, plain

#: the version of the output format
FORMAT_VERSION: Final = 1

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Profile:
    """One GPU-instance profile as the device lists it."""

    index: int
    id: int
    name: str
    compute_slices: int
    memory_slices: int | None
    max_count: int
    memory_mib: int
    placements: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class GpuInstance:
    id: int
    profile_id: int
    profile: str | None
    start: int
    size: int
    compute_instances: list[n.Instance]
    #: the UUIDs (`MIG-...`) of its MIG devices, one per compute instance: the device ids the
    #: device plugin hands out for it
    mig_devices: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Disagreement:
    """One place where the catalog says something else than the device."""

    profile_id: int
    profile: str
    what: str
    device: Any
    catalog: Any


@dataclass(slots=True)
class Gpu:
    index: int
    uuid: str
    minor: int
    name: str
    pci_bus_id: str
    pci_device_id: str
    #: the catalog's model for the PCI device id, or None (not a MIG GPU pyctl knows)
    model: str | None
    numa: Numa
    mig_current: bool | None = None
    mig_pending: bool | None = None
    #: `<ClusterUUID>.<CliqueID>` when the fabric manager registered the GPU, else None
    clique: str | None = None
    fabric_state: int | None = None
    nvlink_active_links: int | None = None
    nvlink_switch_links: int | None = None
    #: indexes of the GPUs at the other end of a direct link
    nvlink_peers: list[int] = field(default_factory=list)
    #: indexes of the GPUs NVML says this one reaches peer-to-peer over NVLink
    p2p_nvlink_peers: list[int] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    gpu_instances: list[GpuInstance] = field(default_factory=list)
    #: the NVML calls that answered Not Supported
    not_supported: list[str] = field(default_factory=list)
    disagreements: list[Disagreement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Failed:
    index: int
    reason: str


@dataclass(slots=True)
class NodeView:
    driver: str
    nvml_version: str
    gpus: list[Gpu]
    failed: list[Failed]
    #: GPUs that share NVLink peer-to-peer, each group sorted (singletons left out)
    nvlink_groups: list[list[int]] = field(default_factory=list)


def _maybe(gpu: Gpu, what: str, fn: Callable[[], T]) -> T | None:
    """`fn()`, or None when NVML answers Not Supported (recorded); other errors propagate."""
    try:
        return fn()
    except n.NvmlError as e:
        if e.not_supported:
            gpu.not_supported.append(what)
            return None
        raise


def _model(device_id: int) -> mig.GpuModel | None:
    try:
        return mig.model(f"0x{device_id:08X}")
    except ValueError:
        return None


def _profiles(nv: n.Nvml, h: object, gpu: Gpu) -> None:
    for index in range(n.GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.gi_profile(h, index)
        except n.NvmlError as e:
            # Not Supported: not on this GPU; Invalid Argument: an index newer than the driver
            # (the captured H200 answers so for the last one). Neither is a failure.
            if e.code in (n.NOT_SUPPORTED, n.INVALID_ARGUMENT):
                continue
            raise
        places = _maybe(
            gpu,
            f"nvmlDeviceGetGpuInstancePossiblePlacements_v2({info.id})",
            partial(nv.gi_placements, h, info.id),
        )
        sizes = {z for _, z in places or []}
        gpu.profiles.append(
            Profile(
                index=index,
                id=info.id,
                name=info.name.removeprefix("MIG ").strip()[:MAX_TEXT_CHARS],
                compute_slices=info.slice_count,
                memory_slices=sizes.pop() if len(sizes) == 1 else None,
                max_count=info.instance_count,
                memory_mib=info.memory_size_mb,
                placements=sorted(places or []),
            )
        )


def _instances(nv: n.Nvml, h: object, gpu: Gpu) -> None:
    names = {p.id: p.name for p in gpu.profiles}
    for p in gpu.profiles:
        live = _maybe(gpu, f"nvmlDeviceGetGpuInstances({p.id})", partial(nv.gpu_instances, h, p.id))
        for gi in live or []:
            cis = _maybe(
                gpu,
                f"nvmlGpuInstanceGetComputeInstances(gi {gi.id})",
                partial(nv.compute_instances, h, gi.id),
            )
            gpu.gpu_instances.append(
                GpuInstance(
                    gi.id,
                    gi.profile_id,
                    names.get(gi.profile_id),
                    gi.start,
                    gi.size,
                    sorted(cis or [], key=lambda c: (c.start, c.id)),
                )
            )
    gpu.gpu_instances.sort(key=lambda g: (g.start, g.id))
    devices = _maybe(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", partial(nv.mig_devices, h))
    by_id = {g.id: g for g in gpu.gpu_instances}
    for d in devices or []:
        owner = by_id.get(d.gpu_instance_id)
        if owner is not None:
            owner.mig_devices.append(d.uuid[:MAX_TEXT_CHARS])
        else:
            gpu.notes.append(
                f"MIG device {d.uuid[:64]} is on GPU instance {d.gpu_instance_id}, not listed"
            )


def catalog_check(gpu: Gpu, m: mig.GpuModel) -> list[Disagreement]:
    """Where the catalog's model disagrees with the device's profiles (by profile id)."""
    out: list[Disagreement] = []
    device = {p.id: p for p in gpu.profiles}
    catalog = {p.id: p for p in m.profiles}
    for pid, dp in sorted(device.items()):
        cp = catalog.get(pid)
        if cp is None:
            out.append(
                Disagreement(pid, dp.name, "profile missing from the catalog", dp.name, None)
            )
            continue
        for what, dv, cv in (
            ("name", dp.name, cp.name),
            ("compute_slices", dp.compute_slices, cp.compute_slices),
            ("memory_slices", dp.memory_slices, cp.memory_slices),
            ("max_count", dp.max_count, cp.max_count),
            ("placements", dp.placements, sorted(cp.placements)),
        ):
            if dv != cv:
                out.append(Disagreement(pid, dp.name, what, dv, cv))
    for pid, cp in sorted(catalog.items()):
        if pid not in device:
            out.append(Disagreement(pid, cp.name, "profile missing on the device", None, cp.name))
    return out


def _read_gpu(nv: n.Nvml, index: int, sysfs_root: Path) -> tuple[Gpu, object]:
    h = nv.handle(index)
    pci = nv.pci(h)
    m = _model(pci.device_id)
    gpu = Gpu(
        index=index,
        uuid=nv.uuid(h)[:MAX_TEXT_CHARS],
        minor=nv.minor(h),
        name=nv.name(h)[:MAX_TEXT_CHARS],
        pci_bus_id=pci.bus_id[:64],
        pci_device_id=f"0x{pci.device_id:08X}",
        model=m.name if m else None,
        numa=read_numa(sysfs_root, pci.bus_id),
    )
    if _maybe(gpu, "nvmlDeviceGetNumaNodeId", lambda: nv.numa_node_id(h)) is not None:
        gpu.notes.append("NVML's NUMA node id is not used: sysfs is the kernel's view")
    mode = _maybe(gpu, "nvmlDeviceGetMigMode", lambda: nv.mig_mode(h))
    if mode is not None:
        gpu.mig_current, gpu.mig_pending = bool(mode[0]), bool(mode[1])
    fabric = _maybe(gpu, "nvmlDeviceGetGpuFabricInfo", lambda: nv.fabric(h))
    if fabric is not None:
        gpu.fabric_state = fabric.state
        if fabric.state == n.FABRIC_STATE_COMPLETED and fabric.status == 0:
            gpu.clique = f"{fabric.cluster_uuid}.{fabric.clique_id}"
    _profiles(nv, h, gpu)
    if gpu.mig_current:
        _instances(nv, h, gpu)
    if m is not None and gpu.profiles:
        gpu.disagreements = catalog_check(gpu, m)
    elif m is not None:
        gpu.notes.append(f"the catalog knows {m.name} but the device lists no MIG profile")
    return gpu, h


def _nvlink(nv: n.Nvml, g: Gpu, h: object, others: list[tuple[Gpu, object]]) -> None:
    """GPU `g`'s links: how many are active, how many go to an NVSwitch, which GPUs of this node
    are at the other end, and which GPUs it reaches peer-to-peer over NVLink."""
    by_bus: dict[str, int] = {}
    for o, _ in others:
        with contextlib.suppress(ValueError):
            by_bus[sysfs_bus_id(o.pci_bus_id)] = o.index
    active = switch = 0
    peers: set[int] = set()
    supported = True
    for link in range(n.NVLINK_MAX_LINKS):
        try:
            state = nv.nvlink_state(h, link)
        except n.NvmlError as e:
            if link == 0 and e.not_supported:
                g.not_supported.append("nvmlDeviceGetNvLinkState")
                supported = False
                break
            if e.code in (n.NOT_SUPPORTED, n.INVALID_ARGUMENT):
                break  # past the GPU's last link
            raise
        if not state:
            continue
        active += 1
        kind = _maybe(
            g, "nvmlDeviceGetNvLinkRemoteDeviceType", partial(nv.nvlink_remote_type, h, link)
        )
        if kind == n.NVLINK_REMOTE_SWITCH:
            switch += 1
        elif kind == n.NVLINK_REMOTE_GPU:
            with contextlib.suppress(ValueError):
                peer = by_bus.get(sysfs_bus_id(nv.nvlink_remote_bus_id(h, link)))
                if peer is not None and peer != g.index:
                    peers.add(peer)
    if supported:
        g.nvlink_active_links, g.nvlink_switch_links = active, switch
    g.nvlink_peers = sorted(peers)
    for other, oh in others:
        if other.index == g.index:
            continue
        status = _maybe(g, "nvmlDeviceGetP2PStatus(NVLINK)", partial(nv.p2p_nvlink_status, h, oh))
        if status == n.P2P_STATUS_OK:
            g.p2p_nvlink_peers.append(other.index)
    g.not_supported = sorted(set(g.not_supported))


def _groups(gpus: list[Gpu]) -> list[list[int]]:
    """Connected components of the NVLink graph (direct links and P2P over NVLink)."""
    parent = {g.index: g.index for g in gpus}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for g in gpus:
        for p in (*g.nvlink_peers, *g.p2p_nvlink_peers):
            if p in parent:
                parent[find(p)] = find(g.index)
    comps: dict[int, list[int]] = {}
    for g in gpus:
        comps.setdefault(find(g.index), []).append(g.index)
    return sorted(sorted(c) for c in comps.values() if len(c) > 1)


def read_node(nv: n.Nvml, sysfs_root: Path) -> NodeView:
    """Every GPU NVML lists, each read on its own: one GPU's failure is that GPU's alone."""
    count = nv.device_count()
    if not 0 <= count <= MAX_GPUS_PER_NODE:
        raise n.NvmlError(n.UNKNOWN, f"NVML lists {count} GPUs (at most {MAX_GPUS_PER_NODE})")
    read: list[tuple[Gpu, object]] = []
    failed: list[Failed] = []
    for index in range(count):
        try:
            read.append(_read_gpu(nv, index, sysfs_root))
        except n.NvmlError as e:
            failed.append(Failed(index, f"NVML: {e}"[:MAX_TEXT_CHARS]))
        except (ValueError, KeyError, TypeError) as e:
            failed.append(Failed(index, f"unreadable answer: {e!r}"[:MAX_TEXT_CHARS]))
    ok: list[tuple[Gpu, object]] = []
    for g, h in read:
        try:
            _nvlink(nv, g, h, read)
            ok.append((g, h))
        except n.NvmlError as e:
            failed.append(Failed(g.index, f"NVML (NVLink): {e}"[:MAX_TEXT_CHARS]))
    gpus = [g for g, _ in ok]
    return NodeView(
        driver=nv.driver_version()[:64],
        nvml_version=nv.nvml_version()[:64],
        gpus=gpus,
        failed=sorted(failed, key=lambda f: f.index),
        nvlink_groups=_groups(gpus),
    )


def disagreements(view: NodeView) -> int:
    return sum(len(g.disagreements) for g in view.gpus)


def view_json(view: NodeView, node: str | None = None) -> JsonObject:
    """The agent's output: JSON-ready, versioned (`v`)."""
    out = {"v": FORMAT_VERSION, "node": node, **dataclasses.asdict(view)}
    out["catalog_disagreements"] = disagreements(view)
    return as_object(plain(out), "the agent's view")
