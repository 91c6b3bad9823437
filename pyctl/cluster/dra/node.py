"""The DRA devices of one node and what is allocated on them (docs/dra.md).

- **Pools**: the ResourceSlices of a node's pools, the highest generation of each pool only, and
  only complete pools (as many slices as the pool says; the scheduler does not allocate from
  incomplete pools either), nor pools that publish a device or counter set twice.
- **Physical GPUs**: a whole-GPU device, and the MIG devices on it (by `parentUUID`, the counter
  set they consume, or the `gpu-<minor>` prefix of their name). A GPU whose MIG devices consume
  `memory-slice-<i>` counters of a shared counter set is *dynamic* (the driver's DynamicMIG: any
  placement can be allocated, the scheduler picks it).
- **Usage**: exactly the devices of `status.allocation.devices.results` of allocated claims, and
  the pods in `status.reservedFor`. Admin-access results use no capacity; a shared device's
  allocations consume what their `consumedCapacity` says (consumable capacity).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from pyctl.cluster import quantity as q
from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.devices import GPU_DEVICE_NAME, DeviceId, DeviceView, device_view
from pyctl.cluster.dra_records import Allocated, ClaimRecord, SliceRecord


@dataclass
class Pool:
    driver: str
    name: str
    generation: int
    slices: list[SliceRecord]
    complete: bool
    #: why the scheduler would not allocate from it ("" if it would)
    invalid: str = ""


def pools_of(slices: Iterable[SliceRecord]) -> list[Pool]:
    """The pools of these slices at their highest generation, with their completeness."""
    by: dict[tuple[str, str], list[SliceRecord]] = {}
    for s in slices:
        cur = by.get((s.driver, s.pool))
        if cur is None or s.generation > cur[0].generation:
            by[(s.driver, s.pool)] = [s]
        elif s.generation == cur[0].generation:
            cur.append(s)
    out = []
    for (driver, name), group in sorted(by.items()):
        group.sort(key=lambda s: s.name)
        complete = len(group) == group[0].slice_count
        pool = Pool(driver, name, group[0].generation, group, complete)
        seen: set[str] = set()
        sets: set[str] = set()
        for s in group:
            for d in s.devices:
                if d.name in seen:
                    pool.invalid = f"device {d.name} is published twice"
                seen.add(d.name)
            for c in s.counter_sets:
                if c.name in sets:
                    pool.invalid = f"counter set {c.name} is published twice"
                sets.add(c.name)
        for s in group:
            for d in s.devices:
                for u in d.consumes:
                    if u.counter_set not in sets:
                        pool.invalid = (
                            f"device {d.name} consumes unknown counter set {u.counter_set}"
                        )
        out.append(pool)
    return out


@dataclass
class PhysicalGpu:
    """A GPU of a node as DRA shows it: its whole device and its MIG devices."""

    key: str
    whole: DeviceView | None = None
    parts: list[DeviceView] = field(default_factory=list)
    #: (pool id, counter set name) shared by its devices, when partitionable
    counter_set: tuple[str, str, str] | None = None
    #: counter -> amount the pool publishes
    counters: dict[str, Fraction] = field(default_factory=dict)

    @property
    def devices(self) -> list[DeviceView]:
        return ([self.whole] if self.whole else []) + self.parts

    @property
    def dynamic(self) -> bool:
        """MIG placements allocated on demand (DynamicMIG): its MIG devices consume memory-slice
        counters."""
        return any(p.memory_slices for p in self.parts)

    @property
    def numa(self) -> tuple[int, ...]:
        for d in self.devices:
            if d.numa:
                return d.numa
        return ()

    @property
    def pcie_root(self) -> str:
        return next((d.pcie_root for d in self.devices if d.pcie_root), "")

    @property
    def product(self) -> str:
        return next((d.product for d in self.devices if d.product), "")


@dataclass
class Allocation:
    """Who holds a device: the claim, its request, and the pods it is reserved for."""

    claim: str
    request: str
    pods: tuple[str, ...]
    admin: bool = False
    #: what it consumed of a shared device's capacities (consumable capacity)
    consumed: dict[str, Fraction] = field(default_factory=dict)


@dataclass
class NodeDevices:
    """The DRA devices of one node, and what is allocated on them."""

    node: str
    devices: list[DeviceView]
    gpus: list[PhysicalGpu]
    #: (driver, pool, counter set) -> counter -> amount
    counter_sets: dict[tuple[str, str, str], dict[str, Fraction]]
    allocated: dict[DeviceId, list[Allocation]]
    #: what pyctl could not use, said once per node (incomplete pools, catalog disagreements)
    notes: list[str] = field(default_factory=list)

    def in_use(self, d: DeviceView) -> bool:
        return any(not a.admin for a in self.allocated.get(d.id, ()))

    def holder(self, d: DeviceView) -> str | None:
        for a in self.allocated.get(d.id, ()):
            if not a.admin:
                return a.pods[0] if a.pods else a.claim
        return None

    def capacity_used(self, d: DeviceView) -> dict[str, Fraction]:
        """What the allocations on a shared device consume, capacity by capacity."""
        used: dict[str, Fraction] = defaultdict(Fraction)
        for a in self.allocated.get(d.id, ()):
            if not a.admin:
                for n, v in a.consumed.items():
                    used[n] += v
        return dict(used)

    def shares(self, d: DeviceView) -> tuple[int, list[tuple[str, int]]]:
        """A shared device's used share (milli-GPU) and each holder's share: its largest
        fraction over the capacities, scaled down (largest remainder) when the holders' own
        roundings add up to more than the device's."""
        held: dict[str, int] = {}
        for a in self.allocated.get(d.id, ()):
            if a.admin:
                continue
            who = a.pods[0] if a.pods else a.claim
            held[who] = held.get(who, 0) + dc.share(d.caps, a.consumed)
        if not held:
            return 0, []
        used = dc.share(d.caps, self.capacity_used(d))
        if sum(held.values()) > used:
            held = q.largest_remainder(held, used)
        return used, sorted(held.items())

    def counters_used(self) -> dict[tuple[str, str, str, str], Fraction]:
        used: dict[tuple[str, str, str, str], Fraction] = defaultdict(Fraction)
        for d in self.devices:
            if self.in_use(d):
                for (cs, c), v in d.consumes.items():
                    used[(d.id.driver, d.id.pool, cs, c)] += v
        return used


def claim_pods(c: ClaimRecord) -> tuple[str, ...]:
    """The pods a claim is reserved for (namespace/name)."""
    return tuple(f"{c.namespace}/{r.name}" for r in c.reserved_for if r.resource == "pods")


def node_devices(
    node: str, slices: Iterable[SliceRecord], claims: Iterable[ClaimRecord]
) -> NodeDevices:
    """The node's DRA devices (complete pools of its slices, highest generation) and the
    allocations of `claims` on them."""
    notes: list[str] = []
    devices: list[DeviceView] = []
    counter_sets: dict[tuple[str, str, str], dict[str, Fraction]] = {}
    for pool in pools_of(slices):
        if not pool.complete:
            notes.append(
                f"pool {pool.driver}/{pool.name}: {len(pool.slices)} of "
                f"{pool.slices[0].slice_count} slices at generation {pool.generation} "
                "(incomplete: the scheduler allocates nothing from it; pyctl counts none of it)"
            )
            continue
        if pool.invalid:
            notes.append(f"pool {pool.driver}/{pool.name}: {pool.invalid} (left out)")
            continue
        order = 0
        for s in pool.slices:
            for cs in s.counter_sets:
                counter_sets[(pool.driver, pool.name, cs.name)] = {
                    c: q.parse_quantity(v) for c, v in cs.counters
                }
            for d in s.devices:
                if d.node and d.node != node:
                    continue
                devices.append(device_view(pool.driver, pool.name, d, order))
                order += 1
    by_id = {d.id: d for d in devices}
    allocated: dict[DeviceId, list[Allocation]] = defaultdict(list)
    for c in claims:
        pods = claim_pods(c)
        for r in c.allocated:
            did = DeviceId(r.driver, r.pool, r.device)
            view = by_id.get(did)
            if view is None:
                continue
            used = _consumed_by(c, r, view) if view.shared and not r.admin_access else {}
            allocated[did].append(Allocation(c.key, r.request, pods, r.admin_access, used))
    nd = NodeDevices(node, devices, [], counter_sets, dict(allocated), notes)
    nd.gpus = _physical_gpus(nd)
    return nd


def _consumed_by(c: ClaimRecord, r: Allocated, d: DeviceView) -> dict[str, Fraction]:
    """What an allocation result consumed of a shared device: its `consumedCapacity` (the
    scheduler records every capacity of the device), else what its request consumes by the
    allocator's arithmetic, else the whole device."""
    if r.consumed:
        return dc.amounts(r.consumed)
    for raw in c.spec.requests:
        for req in (raw, *raw.first_available):
            if req.name == r.request:
                got = dc.consumed(d.caps, req.capacity)
                if got is not None:
                    return got
    return {n: cap.value for n, cap in d.caps.items()}


def _physical_gpus(nd: NodeDevices) -> list[PhysicalGpu]:
    gpus: dict[str, PhysicalGpu] = {}
    by_uuid: dict[str, str] = {}
    by_set: dict[tuple[str, str, str], str] = {}
    for d in nd.devices:
        if d.kind == "gpu":
            m = GPU_DEVICE_NAME.match(d.id.device)
            key = f"{d.id.pool}/{m.group(0) if m else d.id.device}"
            g = gpus.setdefault(key, PhysicalGpu(key))
            g.whole = d
            if d.uuid:
                by_uuid[d.uuid] = key
            for cs, _ in d.consumes:
                by_set[(d.id.driver, d.id.pool, cs)] = key
    for d in nd.devices:
        if d.kind != "mig":
            continue
        key = by_uuid.get(d.parent_uuid, "")
        if not key:
            for cs, _ in d.consumes:
                key = by_set.get((d.id.driver, d.id.pool, cs), "")
                if key:
                    break
        if not key:
            m = GPU_DEVICE_NAME.match(d.id.device)
            key = f"{d.id.pool}/{m.group(0) if m else d.id.device}"
        g = gpus.setdefault(key, PhysicalGpu(key))
        g.parts.append(d)
    for g in gpus.values():
        for d in g.devices:
            for cs, _ in d.consumes:
                sid = (d.id.driver, d.id.pool, cs)
                if sid in nd.counter_sets:
                    g.counter_set = sid
                    g.counters = nd.counter_sets[sid]
                    break
            if g.counter_set:
                break
    return sorted(gpus.values(), key=_gpu_order)


def _gpu_order(g: PhysicalGpu) -> tuple[str, int, str]:
    m = re.search(r"gpu-(\d+)$", g.key)
    return (g.key.rsplit("/", 1)[0], int(m.group(1)) if m else 1 << 30, g.key)
