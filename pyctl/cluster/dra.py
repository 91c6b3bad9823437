"""Dynamic Resource Allocation, from records to what pyctl reasons about (docs/dra.md).

- **Devices of a node**: the ResourceSlices of its pools, the highest generation of each pool
  only, and only complete pools (as many slices as the pool says; the scheduler does not allocate
  from incomplete pools either). Devices of known GPU drivers (the NVIDIA DRA driver,
  `gpu.nvidia.com`) are GPUs: attribute `type` `gpu` (a whole GPU) or `mig` (a MIG device, with
  `profile` and `parentUUID`); `productName`, `uuid`; the standard
  `resource.kubernetes.io/numaNode` (an int, or a list of ints with `DRAListTypeAttributes`),
  `pcieRoot`, `pciBusID`.
- **Physical GPUs**: a whole-GPU device, and the MIG devices on it (by `parentUUID`, the counter
  set they consume, or the `gpu-<minor>` prefix of their name). A GPU whose MIG devices consume
  `memory-slice-<i>` counters of a shared counter set is *dynamic* (the driver's DynamicMIG: any
  placement can be allocated, the scheduler picks it); its placement start is the lowest memory
  slice a device consumes (the `<start>` of `gpu-<n>-mig-<profile>-<profileID>-<start>`), checked
  against pyctl's MIG catalog; where the counters disagree with the catalog it says so and trusts
  the published slices.
- **Usage**: exactly the devices of `status.allocation.devices.results` of allocated claims, and
  the pods in `status.reservedFor`. Admin-access results use no capacity.
- **Zones**: a GPU's zone is its `numaNode` (the lowest of a list), else, when no GPU of the node
  publishes one, its `pcieRoot` (zones numbered in the order of the roots), else one zone.
- **Claims → shapes**: a request's devices are those that satisfy its DeviceClass's and its own
  CEL selectors (`pyctl.cluster.dra_cel`); if they are all whole GPUs it asks for `count` GPUs,
  if they are all MIG devices of one profile, for that profile. A `matchAttribute` constraint on
  `numaNode` or `pcieRoot` over its GPU requests makes the shape NUMA-aligned. Anything else
  (selectors pyctl cannot evaluate, devices of several kinds, `All` mode, several MIG devices) is
  "unknown" with a reason: counted and shown, never guessed.
- **Admission** (`allocate`): a search over the node's devices as the scheduler's allocator does
  it (requests in order, devices in slice order, selectors, taints and tolerations, devices in
  use, counters, matchAttribute/distinctAttribute with list attributes as sets), bounded in steps.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any, Final

from pyctl.cluster import dra_capacity as dc
from pyctl.cluster import dra_cel
from pyctl.cluster import quantity as q
from pyctl.cluster.dra_records import (
    Allocated,
    Attr,
    ClaimRecord,
    ClaimSpec,
    ClaimTemplateRecord,
    Device,
    DeviceClassRecord,
    DeviceToleration,
    PodClaim,
    Request,
    SliceRecord,
)

NVIDIA_DRIVER: Final = "gpu.nvidia.com"
#: drivers whose devices pyctl models as GPUs
GPU_DRIVERS: Final = frozenset({NVIDIA_DRIVER})
STANDARD_DOMAIN: Final = "resource.kubernetes.io"
NUMA_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"
PCIE_ATTRIBUTE: Final = "resource.kubernetes.io/pcieRoot"
ALIGN_ATTRIBUTES: Final = frozenset({NUMA_ATTRIBUTE, PCIE_ATTRIBUTE})
MIG_DEVICE_NAME: Final = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
GPU_DEVICE_NAME: Final = re.compile(r"^gpu-(\d+)")
MEMORY_SLICE_COUNTER: Final = re.compile(r"^memory-slice-(\d+)$")
#: steps of the allocation search before it gives up ("unknown")
SEARCH_STEPS: Final = 20_000


# ---- devices ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceId:
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


def qualified(name: str, driver: str) -> tuple[str, str]:
    """(domain, id) of an attribute or capacity name; an unqualified name is the driver's."""
    domain, sep, ident = name.rpartition("/")
    return (domain, ident) if sep else (driver, name)


def _cel_value(a: Attr) -> Any:
    return list(a.value) if isinstance(a.value, tuple) else a.value


@lru_cache(maxsize=65536)
def _quantity_int(v: str) -> int | float:
    f = q.parse_quantity(v)
    return int(f) if f.denominator == 1 else float(f)


@dataclass
class DeviceView:
    """One published device, with what pyctl reads from it."""

    id: DeviceId
    device: Device
    #: domain -> id -> value (the CEL input's shape)
    attributes: dict[str, dict[str, Any]]
    #: index of the device in its pool's slices (the order the scheduler tries devices in)
    order: int
    kind: str = "other"  # gpu, mig, other
    numa: tuple[int, ...] = ()
    pcie_root: str = ""
    product: str = ""
    uuid: str = ""
    parent_uuid: str = ""
    profile: str = ""
    #: (counter set, counter) -> amount consumed when allocated
    consumes: dict[tuple[str, str], Fraction] = field(default_factory=dict)

    @cached_property
    def caps(self) -> dict[str, dc.Capacity]:
        """Its capacities with their request policies (consumable capacity)."""
        return dc.capacities(self.device)

    @property
    def shared(self) -> bool:
        """Several claims may share it (allowMultipleAllocations)."""
        return self.device.multiple

    def attribute(self, qualified_name: str) -> Any:
        domain, ident = qualified(qualified_name, self.id.driver)
        return self.attributes.get(domain, {}).get(ident)

    def cel_input(self) -> dict[str, Any]:
        caps: dict[str, dict[str, Any]] = defaultdict(dict)
        for name, v in self.device.capacity:
            domain, ident = qualified(name, self.id.driver)
            caps[domain][ident] = _quantity_int(v)
        return {
            "driver": self.id.driver,
            "attributes": self.attributes,
            "capacity": dict(caps),
            "allowMultipleAllocations": self.device.multiple,
        }

    @property
    def memory_slices(self) -> tuple[int, ...]:
        """The memory slices its counters consume (dynamic MIG devices)."""
        return tuple(
            sorted(
                int(m.group(1))
                for (_, c), v in self.consumes.items()
                if v > 0 and (m := MEMORY_SLICE_COUNTER.match(c))
            )
        )


def _int_list(v: Any) -> tuple[int, ...]:
    if isinstance(v, bool):
        return ()
    if isinstance(v, int):
        return (v,)
    if isinstance(v, list):
        return tuple(sorted({x for x in v if isinstance(x, int) and not isinstance(x, bool)}))
    return ()


def device_view(driver: str, pool: str, d: Device, order: int) -> DeviceView:
    attrs: dict[str, dict[str, Any]] = defaultdict(dict)
    for a in d.attributes:
        domain, ident = qualified(a.name, driver)
        attrs[domain][ident] = _cel_value(a)
    view = DeviceView(DeviceId(driver, pool, d.name), d, dict(attrs), order)
    for use in d.consumes:
        for c, v in use.counters:
            view.consumes[(use.counter_set, c)] = q.parse_quantity(v)
    view.numa = _int_list(view.attribute(NUMA_ATTRIBUTE))
    root = view.attribute(PCIE_ATTRIBUTE)
    view.pcie_root = root if isinstance(root, str) else ""
    if driver in GPU_DRIVERS:
        own = attrs.get(driver, {})
        t = own.get("type")
        view.kind = t if t in ("gpu", "mig") else "other"
        view.product = str(own.get("productName", ""))
        view.uuid = str(own.get("uuid", ""))
        view.parent_uuid = str(own.get("parentUUID", ""))
        view.profile = str(own.get("profile", ""))
    return view


def gpu_model_name(product: str) -> str:
    """The GFD label form of an NVML product name ("NVIDIA H100 80GB HBM3" →
    "NVIDIA-H100-80GB-HBM3"), which pyctl's MIG catalog resolves."""
    return "-".join(product.split())


# ---- pools -----------------------------------------------------------------------------------


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


# ---- physical GPUs ---------------------------------------------------------------------------


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
            held = scaled(held, used)
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


def scaled(holders: Mapping[str, int], to: int) -> dict[str, int]:
    """Shares scaled down to add up to `to` (largest remainder)."""
    total = sum(holders.values())
    exact = {k: Fraction(v * to, total) for k, v in holders.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    rest = to - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:rest]:
        out[k] += 1
    return out


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


def _gpu_order(g: PhysicalGpu) -> tuple[Any, ...]:
    m = re.search(r"gpu-(\d+)$", g.key)
    return (g.key.rsplit("/", 1)[0], int(m.group(1)) if m else 1 << 30, g.key)


def placement_start(d: DeviceView) -> int | None:
    """The memory slice a MIG device's placement starts at: the lowest slice its counters
    consume, else the last number of its name (`gpu-<n>-mig-<profile>-<id>-<start>`), else the
    `memorySlice<i>` capacities a static MIG device publishes."""
    slices = d.memory_slices
    if slices:
        return slices[0]
    m = MIG_DEVICE_NAME.match(d.id.device)
    if m:
        return int(m.group(4))
    caps = sorted(
        int(n[len("memorySlice") :])
        for n, _ in d.device.capacity
        if n.startswith("memorySlice") and n[len("memorySlice") :].isdigit()
    )
    return caps[0] if caps else None


# ---- claims and pods -------------------------------------------------------------------------


@dataclass(frozen=True)
class Catalogue:
    """What resolving claims needs besides the node: DeviceClasses, claims and templates."""

    classes: Mapping[str, DeviceClassRecord]
    claims: Mapping[str, ClaimRecord]
    templates: Mapping[str, ClaimTemplateRecord]


def pod_claim_specs(
    namespace: str, claims: Sequence[PodClaim], cat: Catalogue
) -> tuple[list[tuple[PodClaim, ClaimSpec | None, ClaimRecord | None]], bool]:
    """Each of a pod's claims with its spec (the claim's, or its template's before the claim is
    made) and the claim record; and whether every claim comes from a template (the pod may be
    moved: its replacement gets a new claim)."""
    out = []
    all_templates = True
    for pc in claims:
        rec = cat.claims.get(f"{namespace}/{pc.claim_name}") if pc.claim_name else None
        spec: ClaimSpec | None = rec.spec if rec is not None else None
        if pc.template:
            if spec is None:
                t = cat.templates.get(f"{namespace}/{pc.template}")
                spec = t.spec if t is not None else None
        else:
            all_templates = False
        out.append((pc, spec, rec))
    return out, all_templates


# ---- selectors -------------------------------------------------------------------------------


class Unknown(Exception):
    """pyctl cannot tell (a selector it cannot evaluate, a search too large); says why."""


@lru_cache(maxsize=262144)
def _selector_matches(expression: str, driver: str, device: Device) -> bool | str:
    """True/False, or the reason pyctl cannot evaluate it (cached per device and expression)."""
    view = device_view(driver, "", device, 0)
    try:
        return dra_cel.evaluate(expression, view.cel_input())
    except dra_cel.SelectorUnknown as e:
        return str(e)


def request_matches(
    req: Request, cls: DeviceClassRecord | None, d: DeviceView, claim: str = ""
) -> bool:
    """Whether device `d` satisfies the request's DeviceClass and its own selectors; `Unknown`
    if a selector cannot be evaluated for it (or the class does not exist)."""
    if cls is None:
        raise Unknown(f"{claim}: request {req.name}: DeviceClass {req.class_name!r} not found")
    for expr in (*cls.selectors, *req.selectors):
        got = _selector_matches(expr, d.id.driver, d.device)
        if isinstance(got, str):
            raise Unknown(f"{claim}: request {req.name}: {got}")
        if not got:
            return False
    return True


def kind_of(d: DeviceView) -> tuple[str, str]:
    """What a device is for a shape: ("gpu", ""), ("shared", "") (a whole GPU several claims
    share by capacity), ("mig", profile), or ("other", driver)."""
    if d.id.driver in GPU_DRIVERS and d.kind == "gpu":
        return ("shared", "") if d.shared else ("gpu", "")
    if d.id.driver in GPU_DRIVERS and d.kind == "mig":
        return ("mig", d.profile)
    return ("other", d.id.driver)


class KindIndex:
    """The cluster's devices grouped by (driver, kind, profile, product), to tell which kinds of
    device a request can get without evaluating its selectors on every device of the cluster:
    each group is tried up to `per_group` devices."""

    def __init__(self, devices: Iterable[DeviceView], per_group: int = 64) -> None:
        groups: dict[tuple[Any, ...], list[DeviceView]] = defaultdict(list)
        for d in devices:
            # shared devices also by their capacities (what a share of them is depends on it)
            shared = (d.device.capacity, d.device.policies) if d.shared else None
            g = groups[(d.id.driver, d.kind, d.profile, d.product, shared)]
            if len(g) < per_group:
                g.append(d)
        self.groups = dict(groups)

    def kinds(
        self, req: Request, cls: DeviceClassRecord | None, claim: str
    ) -> dict[tuple[str, str], list[DeviceView]]:
        """The kinds of device the request can get, each with the first matching device of
        each of its groups."""
        out: dict[tuple[str, str], list[DeviceView]] = {}
        for members in self.groups.values():
            for d in members:
                if request_matches(req, cls, d, claim):
                    out.setdefault(kind_of(d), []).append(d)
                    break
        return out


# ---- shapes of claims ------------------------------------------------------------------------


@dataclass(frozen=True)
class DraNeed:
    """What a pod's claims ask of GPUs, as a shape sees it."""

    gpus: int = 0
    mig_profile: str | None = None
    numa_aligned: bool = False
    #: the share of each GPU (milli-GPU; below 1000 for a share of a shared device)
    gpu_milli: int = 1000
    #: why pyctl cannot say ("" when it can)
    unknown: str = ""
    #: every claim comes from a template (the pod can be moved: its replacement gets new claims)
    movable: bool = True
    #: the pod has claims at all
    claims: int = 0


def _effective(req: Request) -> Request:
    """A request with alternatives is taken as its first alternative (the allocator tries them
    in order; the first is what it gets where devices are free)."""
    return req.first_available[0] if req.first_available else req


def share_need(req: Request, devices: Sequence[DeviceView], claim: str) -> int:
    """The share (milli-GPU) a request takes of each shared device it gets: what it consumes by
    the allocator's arithmetic, as a fraction of the devices it matches (the largest, when
    devices of different capacities match); raises `Unknown` when none can serve it."""
    got = [
        dc.share(d.caps, c) for d in devices if (c := dc.consumed(d.caps, req.capacity)) is not None
    ]
    if not got:
        raise Unknown(
            f"{claim}: request {req.name}: no shared device it matches can serve its capacity "
            "request"
        )
    return max(1, max(got))


def claim_need(
    spec: ClaimSpec, cat: Catalogue, index: KindIndex, claim: str
) -> tuple[int, str | None, bool, int]:
    """(GPUs, MIG profile, aligned, share of each GPU in milli-GPU) of one claim; raises
    `Unknown`."""
    gpus = 0
    profiles: list[str] = []
    milli: set[int] = set()
    gpu_requests: list[str] = []
    for raw in spec.requests:
        req = _effective(raw)
        if req.admin_access:
            continue  # admin access uses no capacity
        if req.mode == "All":
            raise Unknown(f"{claim}: request {req.name}: allocationMode All is not modelled")
        kinds = index.kinds(req, cat.classes.get(req.class_name), claim)
        gpu_kinds = {k for k in kinds if k[0] != "other"}
        if not gpu_kinds:
            if not kinds:
                raise Unknown(f"{claim}: request {req.name}: no device in the cluster matches it")
            continue  # not a GPU (a NIC, CPUs of a CPU driver): no GPU shape
        if len(kinds) > 1:
            raise Unknown(
                f"{claim}: request {req.name}: matches devices of several kinds "
                f"({', '.join(sorted(f'{a} {b}'.strip() for a, b in kinds))})"
            )
        ((k, profile),) = gpu_kinds
        if k in ("gpu", "shared"):
            gpus += req.count
            milli.add(share_need(req, kinds[(k, profile)], claim) if k == "shared" else 1000)
        else:
            if req.count != 1:
                raise Unknown(
                    f"{claim}: request {req.name}: {req.count} MIG devices (one is modelled)"
                )
            profiles.append(profile)
        gpu_requests.append(raw.name)
    if profiles and (gpus or len(profiles) > 1):
        raise Unknown(f"{claim}: asks for MIG devices together with other GPUs (not modelled)")
    if len(milli) > 1:
        raise Unknown(f"{claim}: asks for GPU shares of different sizes (not modelled)")
    aligned = False
    for c in spec.constraints:
        if c.match_attribute in ALIGN_ATTRIBUTES:
            covered = set(c.requests) if c.requests else {r.name for r in spec.requests}
            if set(gpu_requests) <= {r.split("/")[0] for r in covered}:
                aligned = True
    return gpus, (profiles[0] if profiles else None), aligned, min(milli, default=1000)


def pod_need(
    namespace: str, claims: Sequence[PodClaim], cat: Catalogue, index: KindIndex
) -> DraNeed:
    """A pod's DRA need from its claims (or their templates before the claims are made)."""
    if not claims:
        return DraNeed()
    resolved, movable = pod_claim_specs(namespace, claims, cat)
    gpus = 0
    profile: str | None = None
    aligned_all = True
    claims_with_gpus = 0
    milli: set[int] = set()
    try:
        for pc, spec, _ in resolved:
            where = f"{namespace}/{pc.claim_name or pc.template or pc.name}"
            if spec is None:
                raise Unknown(f"{where}: the claim (or its template) is not known yet")
            g, p, aligned, share = claim_need(spec, cat, index, where)
            if g:
                milli.add(share)
                if len(milli) > 1:
                    raise Unknown(f"{where}: GPU shares of different sizes (not modelled)")
            if g or p:
                claims_with_gpus += 1
                aligned_all = aligned_all and (aligned or g <= 1)
            if p is not None:
                if profile is not None or gpus:
                    raise Unknown(f"{where}: MIG devices together with other GPUs (not modelled)")
                profile = p
            gpus += g
            if gpus and profile is not None:
                raise Unknown(f"{where}: MIG devices together with other GPUs (not modelled)")
    except Unknown as e:
        return DraNeed(unknown=str(e), movable=movable, claims=len(claims))
    # GPUs of several claims are aligned only if one claim holds them all
    aligned = gpus > 1 and aligned_all and claims_with_gpus == 1
    return DraNeed(gpus, profile, aligned, min(milli, default=1000), "", movable, len(claims))


# ---- admission: the allocator's search ------------------------------------------------------


def _tolerates(t: DeviceToleration, key: str, value: str, effect: str) -> bool:
    if t.effect and t.effect != effect:
        return False
    if t.key and t.key != key:
        return False
    if t.operator == "Exists":
        return True
    return t.value == value


def taint_blocks(d: DeviceView, req: Request) -> bool:
    """A NoSchedule/NoExecute taint of the device that the request does not tolerate."""
    for t in d.device.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not any(
            _tolerates(tol, t.key, t.value, t.effect) for tol in req.tolerations
        ):
            return True
    return False


def _attr_set(d: DeviceView, name: str) -> frozenset[tuple[str, Any]] | None:
    v = d.attribute(name)
    if v is None:
        return None
    vals = v if isinstance(v, list) else [v]
    return frozenset((type(x).__name__, x) for x in vals)


@dataclass
class AllocationResult:
    ok: bool | None  # None: unknown
    devices: list[tuple[int, str, DeviceView]] = field(default_factory=list)
    reason: str = ""


def allocate(
    specs: Sequence[tuple[str, ClaimSpec]],
    nd: NodeDevices,
    cat: Catalogue,
    steps: int = SEARCH_STEPS,
    extra_in_use: Iterable[DeviceId] = (),
) -> AllocationResult:
    """Whether the scheduler's allocator could allocate these claims (`(name, spec)`) on the
    node now, and with which devices (the first solution in its order: requests in order,
    devices in slice order)."""
    taken = {d.id for d in nd.devices if nd.in_use(d) and not d.shared}
    taken |= set(extra_in_use)
    used = nd.counters_used()
    # shared devices: what their allocations consume, and which ones already hold shares (a
    # further share does not charge the device's counters again, as in the allocator)
    cap_used = {d.id: nd.capacity_used(d) for d in nd.devices if d.shared}
    sharing = {d.id for d in nd.devices if d.shared and nd.in_use(d)}
    capacity = {
        (drv, pool, cs, c): v
        for (drv, pool, cs), cnt in nd.counter_sets.items()
        for c, v in cnt.items()
    }
    # slots: one per device to allocate
    slots: list[tuple[int, Request, list[DeviceView]]] = []
    try:
        for ci, (name, spec) in enumerate(specs):
            for raw in spec.requests:
                req = _effective(raw)
                cls = cat.classes.get(req.class_name)
                cands = [
                    d
                    for d in nd.devices
                    if request_matches(req, cls, d, name) and not taint_blocks(d, req)
                ]
                if req.mode == "All":
                    if any(d.id in taken for d in cands) and not req.admin_access:
                        return AllocationResult(
                            False, reason=f"{name}: request {req.name}: a device is in use"
                        )
                    count = len(cands)
                else:
                    count = req.count
                for _ in range(count):
                    slots.append((ci, req, cands))
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    # constraints per claim: (requests or None, attribute, match?)
    constraints = [
        [
            (
                {r.split("/")[0] for r in c.requests} or None,
                c.match_attribute or c.distinct_attribute,
                bool(c.match_attribute),
            )
            for c in spec.constraints
            if c.match_attribute or c.distinct_attribute
        ]
        for _, spec in specs
    ]
    chosen: list[tuple[int, str, DeviceView]] = []
    state: dict[tuple[int, int], Any] = {}
    budget = [steps]

    def fits_counters(d: DeviceView) -> bool:
        if d.id in sharing:
            return True
        for (cs, c), v in d.consumes.items():
            key = (d.id.driver, d.id.pool, cs, c)
            if key not in capacity or used[key] + v > capacity[key]:
                return False
        return True

    def search(i: int) -> bool:
        if i == len(slots):
            return True
        ci, req, cands = slots[i]
        base = req.name.split("/")[0]
        for d in cands:
            budget[0] -= 1
            if budget[0] < 0:
                raise Unknown("the allocation search ran out of steps")
            if not req.admin_access and (d.id in taken or not fits_counters(d)):
                continue
            if not d.shared and any(d.id == x.id for _, _, x in chosen):
                continue
            need: dict[str, Fraction] = {}
            if d.caps and (req.capacity or d.shared):
                # the capacity check the allocator makes of every device it tries
                got = dc.consumed(d.caps, req.capacity)
                if got is None or not dc.fits(d.caps, cap_used.get(d.id, {}), got):
                    continue
                if d.shared and not req.admin_access:
                    need = got
            saved = []
            ok = True
            for k, (reqs, attr, match) in enumerate(constraints[ci]):
                if reqs is not None and base not in reqs:
                    continue
                vals = _attr_set(d, attr)
                cur = state.get((ci, k))
                if vals is None:
                    ok = False
                    break
                if match:
                    new = vals if cur is None else cur & vals
                    if not new:
                        ok = False
                        break
                else:
                    if cur is not None and cur & vals:
                        ok = False
                        break
                    new = vals if cur is None else cur | vals
                saved.append(((ci, k), cur))
                state[(ci, k)] = new
            if ok:
                charge = not req.admin_access and d.id not in sharing
                if charge:
                    for (cs, c), v in d.consumes.items():
                        used[(d.id.driver, d.id.pool, cs, c)] += v
                if not req.admin_access:
                    if d.shared:
                        sharing.add(d.id)
                        held = cap_used.setdefault(d.id, {})
                        for n, v in need.items():
                            held[n] = held.get(n, Fraction(0)) + v
                    else:
                        taken.add(d.id)
                chosen.append((ci, req.name, d))
                if search(i + 1):
                    return True
                chosen.pop()
                if not req.admin_access:
                    if d.shared:
                        held = cap_used[d.id]
                        for n, v in need.items():
                            held[n] -= v
                        if charge:
                            sharing.discard(d.id)
                    else:
                        taken.discard(d.id)
                if charge:
                    for (cs, c), v in d.consumes.items():
                        used[(d.id.driver, d.id.pool, cs, c)] -= v
            for key, cur in reversed(saved):
                if cur is None:
                    state.pop(key, None)
                else:
                    state[key] = cur
        return False

    try:
        if search(0):
            return AllocationResult(True, list(chosen))
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    except RecursionError:
        return AllocationResult(None, reason="the allocation search is too deep")
    names = ", ".join(n for n, _ in specs)
    return AllocationResult(
        False, reason=f"{names}: no devices of node {nd.node} satisfy the claim"
    )


# ---- the model: DRA GPUs of a node in NUMA zones ---------------------------------------------


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


def _full_profile(m: Any) -> str | None:
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
                    ModelGpu(zone, g, True, milli, nd.holder(d), holders=holders, shared=True)
                )
                continue
            used = nd.in_use(d)
            out.append(ModelGpu(zone, g, True, 1000 if used else 0, nd.holder(d)))
            continue
        if catalog is None:
            continue  # said above: MIG devices of an unknown model are left out
        out.append(_mig_gpu(nd, g, zone, catalog, notes))
    zones = sorted({m.zone for m in out})
    return DraModel(basis, out, zones, roots if basis == "pcieRoot" else {}, notes, product)


def _mig_gpu(nd: NodeDevices, g: PhysicalGpu, zone: int, m: Any, notes: list[str]) -> ModelGpu:
    full_mask = (1 << m.memory_slices) - 1
    profiles = {p.name: p for p in m.profiles}
    instances: list[tuple[str, int, bool, str | None]] = []
    dynamic = g.dynamic
    if dynamic:
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
        return ModelGpu(
            zone, g, False, dynamic=True, instances=instances, free_slices=free & full_mask
        )
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


# ---- the cluster's DRA view ------------------------------------------------------------------


class DraContext:
    """The DRA objects of a cluster, with what is derived from them cached: each node's devices
    and the index of device kinds. `slices_by_node` and `claims_by_node` may be live indexes
    kept by their owner (the controller's cache), which calls `invalidate` for what changed."""

    def __init__(
        self,
        classes: Mapping[str, DeviceClassRecord],
        claims: Mapping[str, ClaimRecord],
        templates: Mapping[str, ClaimTemplateRecord],
        slices_by_node: Mapping[str, Mapping[str, SliceRecord]],
        claims_by_node: Mapping[str, Mapping[str, ClaimRecord]],
    ) -> None:
        self.cat = Catalogue(classes, claims, templates)
        self.slices_by_node = slices_by_node
        self.claims_by_node = claims_by_node
        self._nodes: dict[str, NodeDevices] = {}
        self._index: KindIndex | None = None

    @classmethod
    def of(
        cls,
        classes: Iterable[DeviceClassRecord] = (),
        slices: Iterable[SliceRecord] = (),
        claims: Iterable[ClaimRecord] = (),
        templates: Iterable[ClaimTemplateRecord] = (),
    ) -> DraContext:
        """A context from lists of records (a dump, a test)."""
        by_node: dict[str, dict[str, SliceRecord]] = defaultdict(dict)
        for s in slices:
            for n in slice_nodes(s):
                by_node[n][s.name] = s
        claim_map = {c.key: c for c in claims}
        claims_by_node: dict[str, dict[str, ClaimRecord]] = defaultdict(dict)
        for c in claim_map.values():
            if c.allocated_node:
                claims_by_node[c.allocated_node][c.key] = c
        return cls(
            {c.name: c for c in classes},
            claim_map,
            {t.key: t for t in templates},
            dict(by_node),
            dict(claims_by_node),
        )

    def invalidate(self, nodes: Iterable[str] = (), devices: bool = False) -> None:
        """Forget what was derived for `nodes`; `devices`: the set of devices changed (the kind
        index is rebuilt)."""
        for n in nodes:
            self._nodes.pop(n, None)
        if devices:
            self._index = None

    def node(self, name: str) -> NodeDevices | None:
        """The node's DRA devices (None if it publishes none)."""
        slices = self.slices_by_node.get(name)
        if not slices:
            return None
        nd = self._nodes.get(name)
        if nd is None:
            claims = self.claims_by_node.get(name, {})
            nd = node_devices(name, slices.values(), claims.values())
            self._nodes[name] = nd
        return nd

    @property
    def index(self) -> KindIndex:
        if self._index is None:
            devices: list[DeviceView] = []
            for n in sorted(self.slices_by_node):
                nd = self.node(n)
                if nd is not None:
                    devices.extend(nd.devices)
            self._index = KindIndex(devices)
        return self._index

    def need(self, namespace: str, claims: Sequence[PodClaim]) -> DraNeed:
        return pod_need(namespace, claims, self.cat, self.index)


def slice_nodes(s: SliceRecord) -> set[str]:
    """The nodes a slice's devices are on (node-local pools only)."""
    if s.node:
        return {s.node}
    if s.per_device_node:
        return {d.node for d in s.devices if d.node}
    return set()


EMPTY_CONTEXT: Final = DraContext({}, {}, {}, {}, {})


# ---- alignment of running pods ---------------------------------------------------------------


@dataclass(frozen=True)
class Misaligned:
    """A pod whose allocated devices share no NUMA node."""

    pod: str
    node: str
    #: the NUMA nodes of each of its devices
    numa: tuple[tuple[int, ...], ...]
    devices: tuple[str, ...]


def misaligned_pods(ctx: DraContext) -> list[Misaligned]:
    """Every pod whose allocated devices (of any driver that publishes `numaNode`: GPUs, and
    CPUs where a CPU driver publishes them) span NUMA nodes: no NUMA node is common to all of
    them (a list-valued numaNode counts as the set of its nodes)."""
    out = []
    for node in sorted(ctx.claims_by_node):
        nd = ctx.node(node)
        if nd is None:
            continue
        per_pod: dict[str, list[DeviceView]] = defaultdict(list)
        for d in nd.devices:
            for a in nd.allocated.get(d.id, ()):
                for pod in a.pods:
                    per_pod[pod].append(d)
        for pod, devs in sorted(per_pod.items()):
            with_numa = [d for d in devs if d.numa]
            if len(with_numa) < 2:
                continue
            common = set(with_numa[0].numa)
            for d in with_numa[1:]:
                common &= set(d.numa)
            if not common:
                out.append(
                    Misaligned(
                        pod,
                        node,
                        tuple(d.numa for d in with_numa),
                        tuple(str(d.id) for d in with_numa),
                    )
                )
    return out


def unknown_kind(reason: str) -> str:
    """A short, bounded label for why a request is unknown (metrics)."""
    for needle, kind in (
        ("CEL", "selector"),
        ("selector pyctl does not know", "selector"),
        ("several kinds", "several_kinds"),
        ("not found", "class_not_found"),
        ("no device in the cluster", "no_device"),
        ("not known yet", "claim_not_known_yet"),
        ("out of steps", "search_limit"),
    ):
        if needle in reason:
            return kind
    return "not_modelled"
