"""The model of a node's DRA GPUs (docs/dra.md): each in a zone, with its usage and MIG geometry.
A GPU's zone is its `numaNode` (the lowest of a list), else, when no GPU of the node publishes
one, its `pcieRoot` (zones numbered in the order of the roots), else one zone. A dynamic MIG
GPU's placements are checked against pyctl's MIG catalog; where the counters disagree with the
catalog it says so and trusts the published slices. Whole GPUs carry the link groups of the
driver's Fabric Manager partitions (`pyctl.cluster.dra.partitions`), where the node publishes
them whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pyctl.cluster.dra.devices import MEMORY_SLICE_COUNTER, gpu_model_name, placement_start
from pyctl.cluster.dra.node import NodeDevices, PhysicalGpu
from pyctl.cluster.dra.partitions import read_partitions

if TYPE_CHECKING:
    from pyctl.core.mig import GpuModel, MigProfile


@dataclass
class ModelGpu:
    """A DRA GPU as the model shows it: whole (`used_milli`, `holder`), or a MIG GPU (dynamic
    or with static MIG devices) with its instances `(profile, start, used, pod)` and, for a
    dynamic one, its free memory slices."""

    zone: int
    gpu: PhysicalGpu
    whole: bool
    used_milli: int = 0
    holder: str | None = None
    #: a device several claims share by capacity: each holder's share (milli-GPU)
    holders: list[tuple[str, int]] = field(default_factory=list)
    shared: bool = False
    dynamic: bool = False
    instances: list[tuple[str, int, bool, str | None]] = field(default_factory=list)
    free_slices: int | None = None
    #: a whole GPU's link groups at given sizes, (size, group) by size (its Fabric Manager
    #: partitions)
    link_levels: tuple[tuple[int, int], ...] = ()


@dataclass
class DraModel:
    #: how zones were found: "numaNode", "pcieRoot", or "none" (one zone)
    basis: str
    gpus: list[ModelGpu]
    #: NUMA id (or PCIe root's number) of each zone with DRA GPUs
    zones: list[int]
    #: the PCIe roots numbered as zones, when the basis is pcieRoot
    roots: dict[str, int]
    notes: list[str]
    product: str = ""
    #: where its GPUs' link groups come from ("" if none): the partition sizes read
    links: str = ""
    #: why the node's Fabric Manager partitions were left out ("" if they were not)
    links_left_out: str = ""


def _full_profile(m: GpuModel) -> str | None:
    for p in m.profiles:
        if p.memory_slices == m.memory_slices and p.compute_slices == m.compute_slices:
            return str(p.name)
    return None


def model_gpus(nd: NodeDevices, gpu_model: str = "") -> DraModel:
    """The node's DRA GPUs for the model, with their zones, usage and MIG geometry; the MIG
    catalog model is `gpu_model` (the node's GFD label), else the GPUs' `productName`."""
    from pyctl.core import mig  # the catalog (the core's facade)

    notes = list(nd.notes)
    gpus = [g for g in nd.gpus if g.whole is not None or g.parts]
    if any(g.numa for g in gpus):
        basis = "numaNode"
    elif any(g.pcie_root for g in gpus):
        basis = "pcieRoot"
    else:
        basis = "none"
    roots = {r: i for i, r in enumerate(sorted({g.pcie_root for g in gpus if g.pcie_root}))}
    product = next((g.product for g in gpus if g.product), "")
    catalog = None
    name = gpu_model or gpu_model_name(product)
    if any(g.parts for g in gpus):
        try:
            catalog = mig.model(name)
        except ValueError:
            notes.append(f"MIG devices on a GPU model pyctl's MIG catalog does not know ({name!r})")
    parts = read_partitions([g.whole for g in gpus if g.whole is not None])
    if parts.left_out:
        notes.append(f"Fabric Manager partitions left out (no link groups): {parts.left_out}")
    out: list[ModelGpu] = []
    for g in gpus:
        if basis == "numaNode":
            zone = g.numa[0] if g.numa else min((x.numa[0] for x in gpus if x.numa), default=0)
            if not g.numa:
                notes.append(f"{g.key}: no numaNode attribute; counted in zone {zone}")
        elif basis == "pcieRoot":
            zone = roots.get(g.pcie_root, 0)
        else:
            zone = 0
        if not g.parts:
            d = g.whole
            assert d is not None
            if d.shared:
                milli, holders = nd.shares(d)
                out.append(
                    ModelGpu(
                        zone,
                        g,
                        True,
                        milli,
                        nd.holder(d),
                        holders=holders,
                        shared=True,
                        link_levels=parts.levels.get(d.id, ()),
                    )
                )
                continue
            used = nd.in_use(d)
            levels = parts.levels.get(d.id, ())
            out.append(
                ModelGpu(zone, g, True, 1000 if used else 0, nd.holder(d), link_levels=levels)
            )
            continue
        if catalog is None:
            continue  # said above: MIG devices of an unknown model are left out
        out.append(_mig_gpu(nd, g, zone, catalog, notes))
    zones = sorted({m.zone for m in out})
    links = (
        "Fabric Manager partitions (" + ", ".join(f"partition{n}" for n in parts.sizes) + ")"
        if parts.sizes
        else ""
    )
    return DraModel(
        basis,
        out,
        zones,
        roots if basis == "pcieRoot" else {},
        notes,
        product,
        links,
        parts.left_out,
    )


def _mig_gpu(nd: NodeDevices, g: PhysicalGpu, zone: int, m: GpuModel, notes: list[str]) -> ModelGpu:
    """A MIG GPU: dynamic (its placements allocated on demand), or with static MIG devices,
    each a placement of the catalog or left out (said in `notes`)."""
    if g.dynamic:
        return _dynamic_mig_gpu(nd, g, zone, m, notes)
    profiles = {p.name: p for p in m.profiles}
    instances: list[tuple[str, int, bool, str | None]] = []
    for d in g.parts:
        start = placement_start(d)
        p = profiles.get(d.profile)
        if p is None or start is None or not any(s == start for s, _ in p.placements):
            notes.append(
                f"{g.key}: MIG device {d.id.device} ({d.profile!r} at {start}) is not a placement "
                f"of pyctl's catalog for {m.name} (left out)"
            )
            continue
        instances.append((d.profile, start, nd.in_use(d), nd.holder(d)))
    return ModelGpu(zone, g, False, instances=instances)


def _dynamic_mig_gpu(
    nd: NodeDevices, g: PhysicalGpu, zone: int, m: GpuModel, notes: list[str]
) -> ModelGpu:
    """A dynamic MIG GPU: its allocated placements, and the memory slices its counters publish
    that no allocated device consumes (none while the whole GPU is allocated)."""
    full_mask = (1 << m.memory_slices) - 1
    profiles = {p.name: p for p in m.profiles}
    instances: list[tuple[str, int, bool, str | None]] = []
    published = sorted(
        int(mm.group(1)) for c in g.counters if (mm := MEMORY_SLICE_COUNTER.match(c))
    )
    if len(published) != m.memory_slices:
        notes.append(
            f"{g.key}: {len(published)} memory-slice counters, pyctl's catalog says "
            f"{m.memory_slices} for {m.name} (pyctl trusts the published slices)"
        )
    free = 0
    for i in published:
        if i < m.memory_slices:
            free |= 1 << i
    bad = _off_catalog(g, profiles)
    if bad:
        notes.append(
            f"{g.key}: {bad} MIG device(s) whose memory slices disagree with pyctl's catalog "
            f"for {m.name} (pyctl trusts the published slices)"
        )
    for d in g.devices:
        if not nd.in_use(d):
            continue
        for i in d.memory_slices:
            free &= ~(1 << i)
        if d is g.whole:
            full = _full_profile(m)
            if full is not None:
                instances.append((full, 0, True, nd.holder(d)))
            free = 0
            continue
        start = placement_start(d)
        p = profiles.get(d.profile)
        if p is not None and start is not None and any(s == start for s, _ in p.placements):
            instances.append((d.profile, start, True, nd.holder(d)))
    return ModelGpu(zone, g, False, dynamic=True, instances=instances, free_slices=free & full_mask)


def _off_catalog(g: PhysicalGpu, profiles: Mapping[str, MigProfile]) -> int:
    """How many of a dynamic GPU's MIG devices consume memory slices other than the catalog's
    placement at their start (or have no known profile or start)."""
    bad = 0
    for d in g.parts:
        p = profiles.get(d.profile)
        start = placement_start(d)
        slices = d.memory_slices
        if p is None or start is None:
            bad += 1
            continue
        want = next((s for s, z in p.placements if s == start), None)
        size = next((z for s, z in p.placements if s == start), 0)
        if want is None or tuple(range(start, start + size)) != slices:
            bad += 1
    return bad
