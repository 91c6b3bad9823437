"""Records → the core's cluster model: where what the NVIDIA stack shows becomes nodes, NUMA
zones, GPUs and MIG instances.

- GPUs: `nvidia.com/gpu` allocatable; the model from the GFD label `nvidia.com/gpu.product`.
- MIG (mixed strategy): `nvidia.com/mig-<profile>` allocatable, one instance per unit. Kubernetes
  does not show placements, so instances are packed onto the node's MIG GPUs by the exact
  placement search (a layout mig-parted could have made); pods' requests say which are in use.
- NUMA: per-zone resources from NodeResourceTopology, with its Topology Manager policy; otherwise
  the per-GPU labels `nvidia.com/gpu-<i>-numa` (CPU and memory then split evenly over the zones, an
  approximation); otherwise one zone.
  When NodeResourceTopology's MIG counts differ from the node's allocatable (the agent lags a
  re-partition), the allocatable's are taken.
- Used amounts: the requests of the pods bound to the node that have not terminated; with
  NodeResourceTopology, its per-zone usage, topped up with what the pods use and it does not
  show yet (the agent that writes it lags the scheduler).
- DRA (`pyctl.cluster.dra`, docs/dra.md): GPUs published in ResourceSlices join the zones of
  their `numaNode` as DRA GPUs (`Zone.dra_gpus`, MIG GPUs with `dra`), used exactly as the
  claims' allocation results say. Extended-resource requests a DRA claim serves
  (`extendedResourceClaimStatus`) are those devices, not device-plugin GPUs: counted once.
- Shared GPUs (time-slicing, MPS, HAMi): `pyctl.cluster.sharing` says how many physical GPUs
  there are, in which zone, and each one's used share and holders; docs/sharing.md.

Every count translate loops over (GPUs, MIG instances, NUMA zones) is first checked against
`pyctl.cluster.bounds` (`records.check_record`): a record beyond them is a `TranslateError`, never
a long loop.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import cast

from pyctl.cluster import bounds, sharing
from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.dra.devices import gpu_model_name
from pyctl.cluster.dra.shapes import DraNeed
from pyctl.cluster.dra.zones import DraModel, ModelGpu, model_gpus
from pyctl.cluster.records import NodeRecord, NrtRecord, PodRecord, check_record
from pyctl.core import mig
from pyctl.core.fragmentation import check_shape
from pyctl.core.inputs import AssignmentInput
from pyctl.model import (
    DEFAULT_TOPOLOGY_POLICY,
    TOPOLOGY_POLICIES,
    Gpu,
    MigGpu,
    MigInstance,
    Node,
    PolicyName,
    Shape,
    Zone,
)

#: where a pod's DRA devices sit in a node's model: ("dra_gpus", zone position, GPU position)
#: for a whole GPU, ("dra_gpus", zone, GPU, milli-GPU) for its share of a shared one,
#: ("mig", zone, MIG GPU, instance) for a static MIG device, ("mig_new", zone, MIG GPU, profile,
#: start) for a dynamic placement, ("dyn_whole", zone, MIG GPU) for a dynamic GPU taken whole
DraPositions = dict[str, list[tuple[object, ...]]]


class TranslateError(ValueError):
    """A node whose resources cannot be turned into the model; the message names it."""


@dataclass
class _Draft:
    numa: int
    cpu: int = 0
    cpu_used: int = 0
    mem: int = 0
    mem_used: int = 0
    gpus: int = 0
    gpus_used: int = 0
    mig: dict[str, int] = field(default_factory=dict)
    #: its GPUs' link groups from NodeResourceTopology's nested zones: (GPUs, used) each
    links: list[tuple[int, int]] = field(default_factory=list)


def _grouped(d: _Draft) -> list[tuple[bool, int]]:
    """Per GPU of `d` (whole, device plugin) whether it is in use and its link group's position
    in `d.links`: group by group, the used ones first; usage the zone shows beyond its groups'
    (NodeResourceTopology lagging the pods) fills the free GPUs in order, less usage frees them
    from the last."""
    rows = [(j < used, k) for k, (n, used) in enumerate(d.links) for j in range(n)]
    extra = d.gpus_used - sum(1 for u, _ in rows if u)
    order = range(len(rows)) if extra > 0 else range(len(rows) - 1, -1, -1)
    for i in order:
        if extra == 0:
            break
        used, k = rows[i]
        if used != (extra > 0):
            rows[i] = (extra > 0, k)
            extra += -1 if extra > 0 else 1
    return rows


def pod_shape(p: PodRecord, node: NodeRecord | None = None, need: DraNeed | None = None) -> Shape:
    """The pod's task shape. `node`, the node it runs on, tells whether `nvidia.com/gpu` is
    replicated there (docs/sharing.md); with `need` (its claims, `DraContext.need`), a DRA shape
    when the claims ask for GPUs (the extended resources a DRA claim serves are not counted
    twice)."""
    if need is not None and (need.gpus or need.mig_profile):
        return Shape(
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            gpus=max(need.gpus, 1 if need.mig_profile else 0),
            gpu_milli=need.gpu_milli if need.gpus else 0,
            mig_profile=need.mig_profile,
            dra=True,
            numa_aligned=need.numa_aligned,
            link_group=need.link_group,
            rdma=p.rdma,
        )
    # shares only where the pod or its node says so (most pods: neither)
    if p.sharing is not None or (p.gpus and node is not None and node.sharing is not None):
        shared = sharing.shared_shape(p, node)
        if shared is not None:
            return shared
    return _plain_shape(p.cpu_milli, p.memory_mib, p.gpus, p.mig[0][0] if p.mig else None, p.rdma)


@lru_cache(maxsize=4096)
def _plain_shape(
    cpu_milli: int, memory_mib: int, gpus: int, profile: str | None, rdma: int = 0
) -> Shape:
    """A device-plugin shape (one object per distinct request: pods of a workload share it)."""
    return Shape(
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=gpus,
        gpu_milli=1000 if gpus else 0,
        mig_profile=profile,
        rdma=rdma,
    )


def pod_shape_problem(p: PodRecord, shape: Shape | None = None) -> str | None:
    """Why pyctl cannot model `p`'s request as a task shape (so the pod is left out of the
    workload M, of the pending pods and of the compaction candidates), or None. `shape`: the
    pod's shape as the caller derived it (`shape_of`: its claims, the node that sizes a shared
    GPU), else `pod_shape(p)`. The core decides (`check_shape`); the common mistake is named in
    the user's words."""
    if p.gpus and p.mig and not p.extended_claim:
        return f"requests both nvidia.com/gpu and a MIG profile (nvidia.com/mig-{p.mig[0][0]})"
    why = check_shape(shape if shape is not None else pod_shape(p))
    return None if why is None else f"its GPU request is not one pyctl can model: {why}"


def _top_up(drafts: list[_Draft], used_cpu: int, used_mem: int, used_gpus: int) -> None:
    for attr, cap, total in (
        ("cpu_used", "cpu", used_cpu),
        ("mem_used", "mem", used_mem),
        ("gpus_used", "gpus", used_gpus),
    ):
        missing = total - sum(getattr(d, attr) for d in drafts)
        for d in drafts:
            if missing <= 0:
                break
            room = getattr(d, cap) - getattr(d, attr)
            add = min(max(room, 0), missing)
            setattr(d, attr, getattr(d, attr) + add)
            missing -= add


def _spread(drafts: list[_Draft], used_cpu: int, used_mem: int, used_gpus: int) -> None:
    for d in drafts:
        d.cpu_used = min(d.cpu, used_cpu)
        d.mem_used = min(d.mem, used_mem)
        d.gpus_used = min(d.gpus, used_gpus)
        used_cpu -= d.cpu_used
        used_mem -= d.mem_used
        used_gpus -= d.gpus_used


def _mig_from_allocatable(drafts: list[_Draft], node: NodeRecord) -> None:
    """After a re-partition the node's allocatable (the device plugin, via the kubelet) shows
    the new MIG instances before the topology agent rewrites NodeResourceTopology. The scheduler
    goes by the allocatable, so when the two disagree the allocatable's counts are taken, on the
    first zone that had MIG instances (the split over zones is unknown until the agent catches
    up)."""
    counts = Counter[str]()
    for d in drafts:
        counts.update({p: n for p, n in d.mig.items() if n > 0})
    want = {p: n for p, n in node.mig if n > 0}
    if dict(counts) == want:
        return
    home = next((d for d in drafts if any(d.mig.values())), drafts[0])
    for d in drafts:
        d.mig = {}
    home.mig = dict(want)


#: the agent's exact view of a node: GPU index -> NUMA node, GPU index -> the pod holding it
_Exact = tuple[dict[int, int], dict[int, str]]


@dataclass
class _Usage:
    """What a node's live pods use, as translate hands it out."""

    #: the pods whose GPUs come from the device plugin (extended resources a DRA claim serves
    #: are that claim's devices, counted by `dra`)
    plugin: list[PodRecord]
    cpu: int
    mem: int
    #: whole GPUs; 0 where the GPUs are shared: the pods' GPU counts are replicas, not GPUs
    gpus: int
    #: MIG profile -> the pods using an instance of it, one entry per instance
    mig: dict[str, list[str]]


@dataclass
class _Drafts:
    """A node's zones before their GPUs are numbered, and what finding them told."""

    zones: list[_Draft]
    policy: str
    #: whether the GPUs' NUMA nodes are known (else the zones are a guess: one)
    numa_known: bool
    exact: _Exact | None = None
    #: how the GPUs were attributed (the node's `gpu_source`)
    source: str = ""


def node_from_records(
    node: NodeRecord,
    nrt: NrtRecord | None,
    pods: Iterable[PodRecord],
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
    dra: DraModel | None = None,
    positions: DraPositions | None = None,
    previous: Node | None = None,
) -> Node:
    """The node's model. `dra`: its DRA GPUs (`pyctl.cluster.dra.zones.model_gpus`); `positions`, if
    given, is filled with where each pod's DRA devices sit; `previous`, its last model: replicas
    of shared GPUs already attributed stay where they were (docs/sharing.md)."""
    where = f"node {node.name[:253]}"
    # in name order: the model is a function of the records, not of the order they arrived in
    # (MIG instances and shared GPUs are attributed to pods in this order)
    live = sorted((p for p in pods if not p.terminated), key=lambda p: p.key)
    _check_bounds(where, node, nrt, live)
    shares = sharing.plan(node)
    use = _usage(live, shares)
    drafts = _draft_zones(where, node, nrt, shares, dra, use, default_policy)
    model = sharing.gpu_model(node, shares)
    gpu_model = model or (gpu_model_name(dra.product) if dra is not None else "")
    mig_per_zone = _mig_gpus_per_zone(node, shares, drafts.zones)
    dra_by_zone = _place_dra_gpus(drafts, dra)
    ordered = sorted(drafts.zones, key=lambda d: d.numa)
    laid, notes = _lay_out_shared(shares, ordered, live, drafts.policy, previous)
    build = _ZoneBuilder(
        where=where,
        model=model,
        gpu_model=gpu_model,
        shares=shares,
        laid=laid,
        use_ids=_keeps_device_ids(node, laid, dra),
        exact=drafts.exact,
        links=_link_groups(node, drafts.exact),
        use=use,
        mig_per_zone=mig_per_zone,
        dra=dra,
        dra_by_zone=dra_by_zone,
        positions=positions,
    )
    zones = tuple(build.zone(zi, d) for zi, d in enumerate(ordered))
    source = drafts.source
    if nrt is not None:
        source = _agent_note(node, "NodeResourceTopology gives the zones")
    return Node(
        name=node.name,
        gpu_model=gpu_model,
        topology_policy=cast(PolicyName, drafts.policy),
        zones=zones,
        gpu_source=source,
        gpu_pool=shares.pool if shares else "",
        gpu_replicas=shares.replicas if shares else 1,
        gpu_memory_mib=shares.memory_mib if shares else 0,
        sharing=_sharing_note(shares, notes, dra),
        rdma=node.rdma,
        # what the pods hold, within what the node has: a device plugin that restarts publishes
        # less while its pods still run (then none is free)
        rdma_used=min(node.rdma, sum(p.rdma for p in live)),
    )


def _check_bounds(
    where: str, node: NodeRecord, nrt: NrtRecord | None, live: list[PodRecord]
) -> None:
    """Every count translate loops over within `pyctl.cluster.bounds`, else `TranslateError`."""
    try:
        check_record(node)
        if nrt is not None:
            check_record(nrt)
        for p in live:
            bounds.check(f"pod {p.key[:300]} nvidia.com/gpu", p.gpus, bounds.MAX_GPUS_PER_POD)
            for prof, n in p.mig[: bounds.MAX_MIG_PROFILES + 1]:
                bounds.check(f"pod {p.key[:300]} MIG {prof[:40]}", n, bounds.MAX_MIG_PER_POD)
            bounds.check_len(f"pod {p.key[:300]} MIG", len(p.mig), bounds.MAX_MIG_PROFILES)
    except bounds.BoundsError as e:
        raise TranslateError(f"{where}: {e}") from None


def _usage(live: list[PodRecord], shares: sharing.Plan | None) -> _Usage:
    """What the live pods use: CPU, memory, the device plugin's whole GPUs and MIG instances."""
    plugin = [p for p in live if not p.extended_claim]
    used_mig: dict[str, list[str]] = defaultdict(list)
    for p in plugin:
        for prof, n in p.mig:
            used_mig[prof].extend([p.key] * n)
    return _Usage(
        plugin=plugin,
        cpu=sum(p.cpu_milli for p in live),
        mem=sum(p.memory_mib for p in live),
        gpus=0 if shares else sum(p.gpus for p in plugin),
        mig=used_mig,
    )


def _draft_zones(
    where: str,
    node: NodeRecord,
    nrt: NrtRecord | None,
    shares: sharing.Plan | None,
    dra: DraModel | None,
    use: _Usage,
    default_policy: str,
) -> _Drafts:
    """The zones from NodeResourceTopology where it has some, else from the node's labels."""
    policy = node.topology_policy or default_policy
    if nrt is not None and nrt.zones:
        policy = nrt.policy or policy
        drafts = _Drafts(_drafts_from_nrt(node, nrt, shares, use), policy, numa_known=True)
    else:
        drafts = _drafts_from_labels(node, shares, dra, use, policy)
    if policy not in TOPOLOGY_POLICIES:
        raise TranslateError(f"{where}: unknown Topology Manager policy {policy!r}")
    return drafts


def _drafts_from_nrt(
    node: NodeRecord, nrt: NrtRecord, shares: sharing.Plan | None, use: _Usage
) -> list[_Draft]:
    """NodeResourceTopology's zones, topped up with the usage it does not show yet."""
    drafts = [
        _Draft(
            z.numa,
            z.cpu_milli,
            z.cpu_milli - z.cpu_available,
            z.memory_mib,
            z.memory_mib - z.memory_available,
            z.gpus,
            z.gpus - z.gpus_available,
            {p: n for p, n, _ in z.mig},
            [(n, n - a) for n, a in z.links],
        )
        for z in nrt.zones
    ]
    if shares:
        _shared_zone_gpus(drafts, nrt, shares)
    # NodeResourceTopology is written by an agent on the node and can lag the pods bound
    # there: usage it does not show yet goes to the zones with room, in order
    _top_up(drafts, use.cpu, use.mem, use.gpus)
    _mig_from_allocatable(drafts, node)
    return drafts


def _drafts_from_labels(
    node: NodeRecord,
    shares: sharing.Plan | None,
    dra: DraModel | None,
    use: _Usage,
    policy: str,
) -> _Drafts:
    """One zone per NUMA node the agent, the shared devices or the labels give GPUs (else one);
    CPU and memory split evenly, usage spread in order, or exact where the agent speaks."""
    whole = shares.gpus if shares else node.gpus
    numa_of = dict(node.gpu_numa)
    if shares and shares.devices:
        numa_of = {i: d.numa for i, d in enumerate(shares.devices)}
    exact, source = _agent_view(node, use.plugin, shares, dra, numa_of)
    if exact is not None:
        numa_of = exact[0]
    per_numa = Counter(numa_of.values())
    dra_ids = set(dra.zones) if dra is not None else set()
    ids = sorted(set(per_numa) | dra_ids) or [0]
    drafts = [_Draft(i) for i in ids]
    k = len(drafts)
    for i, d in enumerate(drafts):
        d.cpu = node.cpu_milli // k + (node.cpu_milli % k if i == 0 else 0)
        d.mem = node.memory_mib // k + (node.memory_mib % k if i == 0 else 0)
        d.gpus = per_numa[d.numa] if numa_of else 0
    if sum(d.gpus for d in drafts) != whole:
        drafts[0].gpus = max(0, drafts[0].gpus + whole - sum(d.gpus for d in drafts))
    drafts[0].mig = dict(node.mig)
    _spread(drafts, use.cpu, use.mem, use.gpus)
    if exact is not None:
        held_in = Counter(numa_of[i] for i in exact[1])
        for d in drafts:
            d.gpus_used = held_in[d.numa]
    return _Drafts(drafts, policy, numa_known=bool(numa_of), exact=exact, source=source)


def _mig_gpus_per_zone(node: NodeRecord, shares: sharing.Plan | None, drafts: list[_Draft]) -> int:
    """The node's MIG GPUs shared out over the zones that have MIG instances: how many each."""
    whole_gpus = shares.gpus if shares else node.gpus
    mig_gpus = max(0, node.gpu_count_label - whole_gpus) if node.mig else 0
    mig_zones = sum(1 for d in drafts if any(d.mig.values()))
    return max(1, -(-mig_gpus // max(1, mig_zones)))


def _place_dra_gpus(drafts: _Drafts, dra: DraModel | None) -> dict[int, list[int]]:
    """The DRA GPUs by zone (their positions in `dra.gpus`), with a zone added where needed."""
    # NUMA ids join the zones of that id; PCIe roots (or nothing) only where the node shows no
    # NUMA zones of its own, else they go to the first zone
    dra_by_zone: dict[int, list[int]] = defaultdict(list)
    if dra is None:
        return dra_by_zone
    first = min(d.numa for d in drafts.zones)
    for i, g in enumerate(dra.gpus):
        z = g.zone if dra.basis == "numaNode" or not drafts.numa_known else first
        if not any(d.numa == z for d in drafts.zones):
            drafts.zones.append(_Draft(z))
        dra_by_zone[z].append(i)
    return dra_by_zone


def _lay_out_shared(
    shares: sharing.Plan | None,
    ordered: list[_Draft],
    live: list[PodRecord],
    policy: str,
    previous: Node | None,
) -> tuple[list[sharing.SharedGpu], list[str]]:
    """The shared GPUs zone by zone with their holders (`sharing.layout`), and its notes."""
    if not shares:
        return [], []
    before = None
    # replicas already attributed stay where they were
    if previous is not None and previous.gpu_replicas == shares.replicas:
        before = [g.holders for z in previous.zones for g in z.gpus]
    return sharing.layout(shares, [(d.numa, max(d.gpus, 0)) for d in ordered], live, policy, before)


def _keeps_device_ids(
    node: NodeRecord, laid: list[sharing.SharedGpu], dra: DraModel | None
) -> bool:
    """Whether HAMi's GPUs keep their device index as id (not where MIG GPUs share the ids)."""
    hami_ids = [g.id for g in laid]
    use_ids = bool(laid) and min(hami_ids) >= 0 and len(set(hami_ids)) == len(hami_ids)
    return use_ids and not node.mig and dra is None


def _link_groups(node: NodeRecord, exact: _Exact | None) -> dict[int, int]:
    """The GPUs' link groups, GPU index -> group: the agent's NVLink groups where the agent's
    view is used, else HAMi's (from its link scores, by device index)."""
    if exact is not None and node.agent is not None:
        return {i: gi for gi, grp in enumerate(node.agent.nvlink) for i in grp}
    hami = node.sharing.hami if node.sharing is not None else ()
    return {d.index: d.link for d in hami if d.link >= 0}


def _sharing_note(shares: sharing.Plan | None, notes: list[str], dra: DraModel | None) -> str:
    """How the node's GPUs are shared: the device plugin's sharing, then DRA's ("" if none)."""
    plugin = (
        shares.describe(any("attributed" in n for n in notes)) + "".join(f"; {n}" for n in notes)
        if shares
        else ""
    )
    return "; ".join(x for x in (plugin, _dra_sharing(dra)) if x)


@dataclass
class _ZoneBuilder:
    """Builds a node's zones in NUMA order, numbering the GPUs as it goes (in each zone its
    whole GPUs, then its MIG GPUs, then its DRA devices) and filling `positions` with where each
    pod's DRA devices sit."""

    where: str
    #: the GPU model of the node's labels ("" if none: then MIG instances cannot be laid out)
    model: str
    #: the GPU model shown (the labels', else that of the DRA devices' product)
    gpu_model: str
    shares: sharing.Plan | None
    #: the shared GPUs in zone order (`sharing.layout`), and whether they keep their device ids
    laid: list[sharing.SharedGpu]
    use_ids: bool
    exact: _Exact | None
    #: GPU index -> link group (the agent's NVLink groups, or HAMi's)
    links: dict[int, int]
    use: _Usage
    mig_per_zone: int
    dra: DraModel | None
    dra_by_zone: dict[int, list[int]]
    positions: DraPositions | None
    #: the next GPU's id, the next shared GPU's position in `laid`, the next link group's number
    gid: int = 0
    next_shared: int = 0
    next_link: int = 0

    def zone(self, zi: int, d: _Draft) -> Zone:
        """The zone of `d`, the `zi`-th in NUMA order."""
        gpus = self._whole_gpus(d)
        migs = self._mig_gpus(d)
        dra_gpus = self._dra_devices(zi, d, migs)
        return Zone(
            d.numa,
            d.cpu,
            min(max(d.cpu_used, 0), d.cpu),
            d.mem,
            min(max(d.mem_used, 0), d.mem),
            tuple(gpus),
            tuple(migs),
            tuple(dra_gpus),
        )

    def _whole_gpus(self, d: _Draft) -> list[Gpu]:
        """The zone's device-plugin GPUs: shared as laid out, the agent's exact, else in order
        (in their link groups where NodeResourceTopology nests them)."""
        gpus = []
        grouped = _grouped(d) if d.links and sum(n for n, _ in d.links) == d.gpus else []
        for j in range(max(d.gpus, 0)):
            if self.shares:
                sg = self.laid[self.next_shared]
                self.next_shared += 1
                gid = sg.id if self.use_ids else self.gid
                link = self.links.get(gid) if self.use_ids else None
                gpus.append(Gpu(gid, sg.used, tuple(sorted(sg.holders.items())), link))
            elif self.exact is not None:
                # the agent's GPU: its NVML index, the pod the kubelet says holds it, and its
                # NVLink group (docs/fabric.md: link groups)
                i = sorted(x for x, numa in self.exact[0].items() if numa == d.numa)[j]
                pod = self.exact[1].get(i)
                link = self.links.get(i)
                gpus.append(Gpu(i, 1000, ((pod, 1000),), link) if pod else Gpu(i, link=link))
            elif grouped:
                # NodeResourceTopology's link groups (nested zones): node-wide group numbers
                used, k = grouped[j]
                gpus.append(Gpu(self.gid, 1000 if used else 0, link=self.next_link + k))
            else:
                gpus.append(Gpu(self.gid, 1000 if j < d.gpus_used else 0))
            self.gid += 1
        self.next_link += len(d.links)
        return gpus

    def _mig_gpus(self, d: _Draft) -> list[MigGpu]:
        """The zone's device-plugin MIG instances packed onto GPUs, each given to a pod using it."""
        if not any(d.mig.values()):
            return []
        if not self.model:
            raise TranslateError(f"{self.where}: MIG resources but no nvidia.com/gpu.product label")
        try:
            layouts = mig.pack(self.model, sorted(d.mig.items()), self.mig_per_zone)
        except ValueError as e:
            raise TranslateError(f"{self.where}: {e}") from None
        migs = []
        for layout in layouts:
            insts = []
            for prof, start in layout:
                users = self.use.mig.get(prof) or []
                pod = users.pop(0) if users else None
                insts.append(MigInstance(prof, int(start), pod is not None, pod))
            migs.append(MigGpu(self.gid, tuple(insts)))
            self.gid += 1
        return migs

    def _dra_devices(self, zi: int, d: _Draft, migs: list[MigGpu]) -> list[Gpu]:
        """The zone's whole DRA GPUs; its DRA MIG GPUs are appended to `migs`."""
        dra_gpus: list[Gpu] = []
        if self.dra is None:
            return dra_gpus
        for i in self.dra_by_zone.get(d.numa, ()):
            g = self.dra.gpus[i]
            if g.whole:
                dra_gpus.append(self._dra_whole(zi, len(dra_gpus), g))
            else:
                migs.append(self._dra_mig(zi, len(migs), g))
            self.gid += 1
        return dra_gpus

    def _dra_whole(self, zi: int, gi: int, g: ModelGpu) -> Gpu:
        """A whole DRA GPU (at zone `zi`, position `gi`), its holders' positions noted."""
        if g.shared:
            # a device shared by capacity: each holder where its share is
            if self.positions is not None:
                for pod, milli in g.holders:
                    self.positions.setdefault(pod, []).append(("dra_gpus", zi, gi, milli))
            return Gpu(self.gid, g.used_milli, tuple(g.holders), link_levels=g.link_levels)
        if self.positions is not None and g.holder and g.used_milli:
            self.positions.setdefault(g.holder, []).append(("dra_gpus", zi, gi))
        return Gpu(self.gid, g.used_milli, link_levels=g.link_levels)

    def _dra_mig(self, zi: int, mi: int, g: ModelGpu) -> MigGpu:
        """A DRA MIG GPU (at zone `zi`, position `mi`), its instances' users' positions noted."""
        insts = []
        for ii, (prof, start, used, pod) in enumerate(g.instances):
            insts.append(MigInstance(prof, start, used, pod))
            if self.positions is not None and pod and used:
                at: tuple[object, ...] = (
                    ("mig_new", zi, mi, prof, start) if g.dynamic else ("mig", zi, mi, ii)
                )
                if g.dynamic and start == 0 and _is_full(self.gpu_model, prof):
                    at = ("dyn_whole", zi, mi)
                self.positions.setdefault(pod, []).append(at)
        return MigGpu(
            self.gid,
            tuple(insts),
            dra=True,
            dynamic=g.dynamic,
            free_slices=g.free_slices if g.dynamic else None,
        )


def _agent_note(node: NodeRecord, why_not: str) -> str:
    """How the node's GPUs were attributed when the agent's view is not used, and why."""
    if node.agent_error:
        return f"rules (the agent's annotation is left out: {node.agent_error})"
    if node.agent is None:
        return ""
    cd = node.agent.catalog_disagreements
    note = f"; the agent found {cd} MIG catalog disagreement(s), the device wins" if cd else ""
    return f"rules ({why_not}){note}"


def _agent_view(
    node: NodeRecord,
    plugin: list[PodRecord],
    shares: sharing.Plan | None,
    dra: DraModel | None,
    numa_of: dict[int, int],
) -> tuple[_Exact | None, str]:
    """Where `pyctl agent` speaks for this node (annotation pyctl.io/node-topology): each GPU's
    NUMA node and which pod holds it, exactly ((GPU index -> NUMA, GPU index -> pod key)), and
    the source shown for the node. None where the agent is silent or cannot be used: then the
    rules apply (NUMA from the labels, the pods' GPUs handed out in order), and the source says
    why."""
    agent = node.agent
    if agent is None or agent.pods is None:
        return None, _agent_note(node, "the agent did not read the kubelet's PodResources")
    if shares or dra is not None or node.mig:
        return None, _agent_note(node, "shared, DRA or MIG GPUs are attributed by their own means")
    if len(agent.gpus) != node.gpus:
        return None, _agent_note(
            node, f"the agent lists {len(agent.gpus)} GPUs, the node allocates {node.gpus}"
        )
    agent_numa = agent.numa_of()
    if len(agent_numa) == node.gpus:
        numa = agent_numa
    elif len(numa_of) == node.gpus:
        numa = numa_of
    else:
        return None, _agent_note(node, "the GPUs' NUMA nodes are unknown")
    want = {p.key: p.gpus for p in plugin if p.gpus}
    holder: dict[int, str] = {}
    for key, gpus in agent.pods:
        if key in want:
            for i in gpus:
                holder[i] = key
    held = Counter(holder.values())
    if dict(held) != want:
        return None, _agent_note(
            node,
            f"the agent's attribution ({sum(held.values())} GPUs) and the pods bound "
            f"({sum(want.values())} GPUs) disagree",
        )
    cd = agent.catalog_disagreements
    note = f"; the agent found {cd} MIG catalog disagreement(s), the device wins" if cd else ""
    return (numa, holder), f"agent (exact: the kubelet's PodResources and sysfs NUMA){note}"


def _dra_sharing(dra: DraModel | None) -> str:
    """How a node's DRA devices shared by capacity were read ("" if it has none)."""
    if dra is None:
        return ""
    n = sum(1 for g in dra.gpus if g.shared)
    return f"dra consumable capacity ({n} shared GPUs), exact" if n else ""


def models_of(
    nodes: Iterable[NodeRecord],
    nrts: Iterable[NrtRecord],
    pods: Iterable[PodRecord],
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
    dra: DraContext | None = None,
    positions: dict[str, DraPositions] | None = None,
) -> dict[str, Node]:
    """Every node's model, by name, with its DRA devices from `dra` (raises `TranslateError` on a
    node it cannot model); `positions`, if given, gets per node where each pod's DRA devices
    sit."""
    by_node: dict[str, list[PodRecord]] = defaultdict(list)
    for p in pods:
        if p.node and not p.terminated:
            by_node[p.node].append(p)
    nrt = {t.name: t for t in nrts}
    out: dict[str, Node] = {}
    for n in nodes:
        where: DraPositions = {}
        out[n.name] = model_of(n, nrt.get(n.name), by_node[n.name], default_policy, dra, where)[0]
        if positions is not None and where:
            positions[n.name] = where
    return out


def _shared_zone_gpus(drafts: list[_Draft], nrt: NrtRecord, shares: sharing.Plan) -> None:
    """Physical GPUs per zone on a node that shares them: HAMi's devices by their NUMA node;
    replicas per zone (NodeResourceTopology) divided by the replicas per GPU; otherwise all in
    the first zone. Their usage comes from `sharing.layout`."""
    numas = [d.numa for d in drafts]
    per = dict.fromkeys(numas, 0)
    if shares.devices:
        for dev in shares.devices:
            per[sharing.zone_of_device(dev, numas)] += 1
    else:
        n = shares.replicas
        for z in nrt.zones:
            if z.numa in per:
                per[z.numa] = (z.shared if shares.pool else z.gpus) // n
        if sum(per.values()) != shares.gpus:
            per = dict.fromkeys(numas, 0)
            per[numas[0]] = shares.gpus
    for d in drafts:
        d.gpus = per[d.numa]
        d.gpus_used = 0


def _is_full(gpu_model: str, profile: str) -> bool:
    """Whether `profile` takes a whole GPU of `gpu_model` (a dynamic GPU's full device)."""
    try:
        m = mig.model(gpu_model)
        p = m.profile(profile)
    except ValueError:
        return False
    return p.memory_slices == m.memory_slices and p.compute_slices == m.compute_slices


def _take(left: list[int], amount: int, order: Sequence[int]) -> list[tuple[int, int]]:
    """Up to `amount` out of `left`, zone by zone in `order`: (zone, amount taken) each."""
    taken = []
    for zi in order:
        if amount <= 0:
            break
        t = min(left[zi], amount)
        if t > 0:
            taken.append((zi, t))
            left[zi] -= t
            amount -= t
    return taken


def attribute_pods(
    node: Node, pods: Iterable[PodRecord], dra_positions: DraPositions | None = None
) -> dict[str, AssignmentInput]:
    """Where each pod sits on `node`, as a core assignment (zone positions, GPU positions, MIG
    instance). Kubernetes shows per-zone usage (NodeResourceTopology) but not which pod holds which
    device, so pods are attributed in order: a MIG pod to the instance translate gave it, a pod
    holding shares of shared GPUs to those shares, a pod with DRA devices to where its
    allocation puts them (`dra_positions`), a GPU pod to the next used GPUs, zone by zone, and
    its CPU and memory to the zones with used CPU and memory left, its GPUs' zone first, and
    its RDMA while the node's used RDMA lasts. The amounts always add up to the node's usage."""
    # shared GPUs say who holds them; the device plugin's whole GPUs are handed out in order
    # (its shared GPUs, time-slicing, MPS, HAMi, say it all in their holders)
    plugin_shared = node.gpu_replicas > 1 or node.gpu_pool != ""
    held: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    used_gpus: list[tuple[int, int]] = []
    mig_of: dict[str, tuple[int, int, int]] = {}
    for zi, z in enumerate(node.zones):
        for gi, g in enumerate(z.gpus):
            if g.holders:
                for pod, milli in g.holders:
                    held[pod].append((zi, gi, milli))
            elif g.used_milli and not plugin_shared:
                used_gpus.append((zi, gi))
        for mi, m in enumerate(z.mig):
            for ii, inst in enumerate(m.instances):
                if inst.pod and inst.pod not in mig_of:
                    mig_of[inst.pod] = (zi, mi, ii)
    zones = range(len(node.zones))
    # each zone's pods take CPU and memory from it first, then from the others in order
    orders = {h: [h, *(i for i in zones if i != h)] for h in zones}
    cpu_left = [z.cpu_milli_used for z in node.zones]
    mem_left = [z.memory_mib_used for z in node.zones]
    rdma_left = node.rdma_used
    next_gpu = 0
    out: dict[str, AssignmentInput] = {}
    for p in sorted((p for p in pods if not p.terminated), key=lambda p: p.key):
        key = p.key
        own = dra_positions.get(key) if dra_positions else None
        gpus = held.get(key)
        if gpus is None:
            n_plugin = 0 if p.extended_claim else p.gpus
            gpus = [(zi, gi, 1000) for zi, gi in used_gpus[next_gpu : next_gpu + n_plugin]]
            next_gpu += n_plugin
        extra: AssignmentInput = {}
        if own:  # where its DRA allocation puts it
            mig = None
            for a in own:
                if a[0] == "mig":
                    mig = (int(str(a[1])), int(str(a[2])), int(str(a[3])))
            dra_gpus = [
                (int(str(a[1])), int(str(a[2])), int(str(a[3])) if len(a) > 3 else 1000)
                for a in own
                if a[0] == "dra_gpus"
            ]
            if dra_gpus:
                extra["dra_gpus"] = dra_gpus
            dyn_whole = [(int(str(a[1])), int(str(a[2]))) for a in own if a[0] == "dyn_whole"]
            if dyn_whole:
                extra["dyn_whole"] = dyn_whole
            mig_new = next(
                (
                    (int(str(a[1])), int(str(a[2])), str(a[3]), int(str(a[4])))
                    for a in own
                    if a[0] == "mig_new"
                ),
                None,
            )
            if mig_new is not None:
                extra["mig_new"] = mig_new
            first_zone = int(str(own[0][1]))
        else:
            mig = mig_of.get(key)
            first_zone = 0
        home = gpus[0][0] if gpus else (mig[0] if mig else first_zone)
        order = orders.get(home) or [home, *(i for i in zones if i != home)]
        if p.rdma and rdma_left:
            extra["rdma"] = min(p.rdma, rdma_left)
            rdma_left -= extra["rdma"]
        out[key] = {
            "cpu": _take(cpu_left, p.cpu_milli, order),
            "memory": _take(mem_left, p.memory_mib, order),
            "gpus": gpus,
            "mig": mig,
            **extra,
        }
    return out


def shape_of(
    p: PodRecord, dra: DraContext | None = None, node: NodeRecord | None = None
) -> Shape | None:
    """The pod's shape, with its DRA claims resolved through `dra` and its share of a shared GPU
    sized by `node` (the node it runs on); None when its claims ask for something pyctl cannot
    tell (`DraNeed.unknown`, counted and shown by the callers)."""
    if not p.claims or dra is None:
        return pod_shape(p, node)
    need = dra.need(p.namespace, p.claims)
    if need.unknown:
        return None
    return pod_shape(p, node, need)


def model_of(
    node: NodeRecord,
    nrt: NrtRecord | None,
    pods: Iterable[PodRecord],
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
    dra: DraContext | None = None,
    positions: DraPositions | None = None,
    previous: Node | None = None,
) -> tuple[Node, DraModel | None]:
    """`node_from_records` with the node's DRA devices taken from `dra`; also returns the DRA
    part (its zones' basis and notes), None if the node publishes no DRA devices."""
    nd = dra.node(node.name) if dra is not None else None
    dm = model_gpus(nd, node.gpu_model) if nd is not None else None
    return node_from_records(node, nrt, pods, default_policy, dm, positions, previous), dm
