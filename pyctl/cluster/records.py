"""The compact records that watch events become: only the fields pyctl needs, nothing of the
Kubernetes object model. They are what the state store keeps (encoded with msgspec as JSON
arrays) and what the reconcile loop reads. Kubernetes JSON never gets past `cluster/kube/`.

Records are immutable trees of strings, numbers, tuples and other records: they never take part
in a reference cycle, so they are not tracked by Python's cycle collector (`gc=False`). A
controller holds one per pod and node (50,000 and more); tracked, each full collection would walk
all of them with the GIL held, a stall of a few hundred milliseconds for the scheduler extender's
threads and the event loop (docs/scale.md)."""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from operator import attrgetter, itemgetter
from typing import Any, Literal, TypeAlias

import msgspec

from pyctl.cluster import bounds as b
from pyctl.cluster import quantity as q
from pyctl.cluster.agent_topology import AgentTopology
from pyctl.cluster.dra_records import (
    ClaimRecord,
    ClaimSpec,
    ClaimTemplateRecord,
    DeviceClassRecord,
    PodClaim,
    SliceRecord,
)

Kind: TypeAlias = Literal[
    "Node",
    "Pod",
    "PodDisruptionBudget",
    "NodeResourceTopology",
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
    "KueueTopology",
    "KaiTopology",
    "ComputeDomainClique",
    "HyperNode",
    "PodGroup",
    "KueueWorkload",
]
#: the kinds of Dynamic Resource Allocation (resource.k8s.io/v1), watched where served
DRA_KINDS: tuple[Kind, ...] = (
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
)
#: the sources of the fabric's levels and cliques (docs/fabric.md), watched where served: Kueue's
#: and KAI's `Topology` objects, the NVIDIA DRA driver's `ComputeDomainClique` objects, Volcano's
#: `HyperNode` tree (levels) and `PodGroup` objects (gangs of a `networkTopology`)
FABRIC_KINDS: tuple[Kind, ...] = (
    "KueueTopology",
    "KaiTopology",
    "ComputeDomainClique",
    "HyperNode",
    "PodGroup",
    "KueueWorkload",
)
KINDS: tuple[Kind, ...] = (
    "Node",
    "Pod",
    "PodDisruptionBudget",
    "NodeResourceTopology",
    *DRA_KINDS,
    *FABRIC_KINDS,
)


class Taint(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    key: str
    value: str = ""
    #: NoSchedule, PreferNoSchedule or NoExecute
    effect: str = ""


class Toleration(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    key: str = ""
    #: Equal or Exists
    operator: str = "Equal"
    value: str = ""
    #: empty: every effect
    effect: str = ""


class Requirement(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One requirement of a label (or node field) selector."""

    key: str
    #: In, NotIn, Exists, DoesNotExist (labels), Gt, Lt (node selectors)
    operator: str
    values: tuple[str, ...] = ()


class Selector(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A metav1.LabelSelector: every label and every expression must match (empty: all)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()


class NodeTerm(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A NodeSelectorTerm: its expressions (labels) and fields (`metadata.name`) all match."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


class PodTerm(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A required PodAffinityTerm: pods matching `selector` in `namespaces` (empty: the pod's
    own; `all_namespaces`: every namespace) within the node's `topology_key` domain."""

    topology_key: str
    selector: Selector | None = None
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False


class Spread(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A topology spread constraint with whenUnsatisfiable: DoNotSchedule."""

    max_skew: int
    topology_key: str
    selector: Selector | None = None
    min_domains: int = 0


class Constraints(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Where a pod may run (what the scheduler's filters check besides resources)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    #: required node affinity: any one term matches
    node_affinity: tuple[NodeTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    #: required pod affinity and anti-affinity terms
    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()
    spread: tuple[Spread, ...] = ()


class HamiDevice(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One GPU as HAMi's device plugin registers it (node annotation
    ``hami.io/node-nvidia-register``)."""

    uuid: str
    index: int = 0
    #: deviceSplitCount: the most tasks it may hold at once
    split: int = 0
    memory_mib: int = 0
    #: devcore: 100, or scaled by deviceCoreScaling
    cores: int = 0
    type: str = ""
    numa: int = 0
    healthy: bool = True
    #: hami-core, mps or mig
    mode: str = ""
    #: its NVLink group (``hami.io/node-nvidia-score``; -1: not known)
    link: int = -1


class NodeSharing(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """How a node's whole GPUs are shared, as the NVIDIA device plugin (with GPU Feature
    Discovery's labels) or HAMi show it. docs/sharing.md."""

    #: GFD ``nvidia.com/gpu.sharing-strategy``: time-slicing, mps or none ("" if absent)
    strategy: str = ""
    #: GFD ``nvidia.com/gpu.replicas``: replicas per GPU (0 or 1: not replicated)
    replicas: int = 0
    #: allocatable ``nvidia.com/gpu.shared`` (replicas renamed by renameByDefault)
    shared: int = 0
    #: GFD ``nvidia.com/gpu.memory``: MiB per GPU
    gpu_memory_mib: int = 0
    #: the GPUs HAMi registered
    hami: tuple[HamiDevice, ...] = ()
    #: why HAMi's link scores (``hami.io/node-nvidia-score``) were left out ("" if not)
    links_error: str = ""


class NodeRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    name: str
    resource_version: str = ""
    gpu_model: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    #: (profile, allocatable count) of `nvidia.com/mig-<profile>` resources
    mig: tuple[tuple[str, int], ...] = ()
    #: (GPU index, NUMA id) from the `nvidia.com/gpu-<i>-numa` labels
    gpu_numa: tuple[tuple[int, int], ...] = ()
    gpu_count_label: int = 0
    mig_config: str = ""
    mig_config_state: str = ""
    mig_strategy: str = ""
    #: Topology Manager policy, when a label or annotation states it (NRT is preferred)
    topology_policy: str = ""
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    #: GPU sharing (time-slicing, MPS, HAMi); None: the GPUs are not shared
    sharing: NodeSharing | None = None
    #: what `pyctl agent` says about the node (annotation pyctl.io/node-topology); None: nothing
    agent: AgentTopology | None = None
    #: why the annotation was left out, when it was there but unreadable
    agent_error: str = ""
    #: allocatable of the extended resource that meters its RDMA (shared HCA devices, bandwidth
    #: shares), when the reflector is told its name (`reflector_rdma_resource`); 0: none
    rdma: int = 0

    def has_taint(self, key: str) -> bool:
        """Whether a NoSchedule or NoExecute taint with this key is on the node."""
        return any(t.key == key and t.effect in ("NoSchedule", "NoExecute") for t in self.taints)


class HamiShare(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """What a pod holds of one GPU, as HAMi's scheduler assigned it (pod annotation
    ``hami.io/vgpu-devices-allocated``, containers collapsed as HAMi does)."""

    uuid: str
    memory_mib: int = 0
    cores: int = 0
    #: tasks (containers running at once) on the device
    slots: int = 1


class PodSharing(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A pod's requests for shared GPUs and, for HAMi, the devices it was given."""

    #: ``nvidia.com/gpu.shared`` requested: replicas
    shared: int = 0
    #: HAMi pod: requests HAMi's resources, names hami-scheduler or carries its annotations
    hami: bool = False
    #: HAMi requests per GPU: ``nvidia.com/gpumem`` (MiB), ``nvidia.com/gpumem-percentage``,
    #: ``nvidia.com/gpucores`` (percent; -1 when not given)
    memory_mib: int = 0
    memory_percent: int = 0
    cores: int = -1
    #: ``hami.io/vgpu-devices-allocated``
    devices: tuple[HamiShare, ...] = ()
    #: ``hami.io/gpu-scheduler-policy`` names ``topology-aware``: its GPUs are best linked
    topology: bool = False


class PodGang(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The gang a pod says it belongs to (docs/fabric.md): its pods must all run in one domain of
    the level `key` (a node label key); `group` names the gang within the pod's namespace;
    `size`, its pods when the pod says (0: as many as exist)."""

    key: str
    group: str
    size: int = 0
    #: Kueue's PodSet slices: every `size` pods of the group are a gang of their own
    slice: bool = False


class PodRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    node: str = ""
    phase: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    priority: int = 0
    priority_class: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    #: PodScheduled=False with reason Unschedulable
    unschedulable: bool = False
    unschedulable_message: str = ""
    deleting: bool = False
    mirror: bool = False
    local_storage: bool = False
    #: annotation descheduler.alpha.kubernetes.io/evict or pyctl.io/evict ("true"/"false"), if set
    evict_annotation: str = ""
    #: mounts a PersistentVolumeClaim (or a generic ephemeral volume)
    pvc: bool = False
    #: creationTimestamp, seconds since the epoch (0: unknown)
    created: float = 0.0
    #: spec.schedulerName when not the default scheduler
    scheduler: str = ""
    #: nodeSelector, required (anti-)affinity, tolerations, spread (None: no constraints)
    constraints: Constraints | None = None
    #: spec.resourceClaims (DRA), with the claims generated from templates
    claims: tuple[PodClaim, ...] = ()
    #: status.extendedResourceClaimStatus: the claim that serves its extended resources through
    #: DRA (then its `gpus`/`mig` requests are devices of that claim, not of a device plugin)
    extended_claim: str = ""
    #: shared GPUs asked for or held (None: none)
    sharing: PodSharing | None = None
    #: the gang it says it belongs to (Kueue's or KAI's required topology; None: none said)
    gang: PodGang | None = None
    #: pending because a scheduling gate holds it back (Kueue's admission, `gangs.kueue_waiting`),
    #: not because a scheduler found no room: it does not take room that is free
    gated: bool = False
    #: the Volcano PodGroup it belongs to (annotation `scheduling.k8s.io/group-name`, or
    #: `scheduling.volcano.sh/group-name`), in its namespace: a gang where that PodGroup's
    #: `networkTopology` is hard (`gangs.gangs_of`)
    pod_group: str = ""
    #: its request of the RDMA resource (`NodeRecord.rdma`); 0: none
    rdma: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class PdbRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    namespace: str
    name: str
    resource_version: str = ""
    match_labels: tuple[tuple[str, str], ...] = ()
    min_available: str = ""
    max_unavailable: str = ""
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0
    expected_pods: int = 0
    match_expressions: tuple[Requirement, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class ZoneRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    numa: int
    cpu_milli: int = 0
    cpu_available: int = 0
    memory_mib: int = 0
    memory_available: int = 0
    gpus: int = 0
    gpus_available: int = 0
    #: (profile, allocatable, available)
    mig: tuple[tuple[str, int, int], ...] = ()
    #: ``nvidia.com/gpu.shared`` replicas in the zone (allocatable, available)
    shared: int = 0
    shared_available: int = 0
    #: its GPUs' link groups: the zones whose ``parent`` it is that hold ``nvidia.com/gpu``,
    #: (allocatable, available) each, in zone name order (docs/fabric.md)
    links: tuple[tuple[int, int], ...] = ()


class NrtRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    name: str
    resource_version: str = ""
    policy: str = ""
    scope: str = ""
    zones: tuple[ZoneRecord, ...] = ()


class TopologyRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A scheduler's `Topology` object: its levels' node label keys as the object orders them
    (the widest first), those pyctl could read; `dropped` counts the levels it could not (not a
    label key, past `bounds.MAX_LEVELS`)."""

    name: str
    resource_version: str = ""
    levels: tuple[str, ...] = ()
    dropped: int = 0


class KueueTopologyRecord(
    TopologyRecord, frozen=True, array_like=True, omit_defaults=True, gc=False
):
    """Kueue's `Topology` (kueue.x-k8s.io/v1beta1)."""


class KaiTopologyRecord(TopologyRecord, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """KAI's `Topology` (kai.scheduler/v1alpha1)."""


class CliqueRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The NVIDIA DRA driver's `ComputeDomainClique` (resource.nvidia.com/v1beta1): the nodes of
    one NVLink clique of a ComputeDomain, each with its clique id (`<ClusterUUID>.<CliqueID>`,
    the value of `nvidia.com/gpu.clique`). `dropped` counts the daemons it names that pyctl
    could not take (no node name, a clique id that is no label value, a node named twice,
    past `bounds.MAX_CLIQUE_NODES`)."""

    namespace: str
    name: str
    resource_version: str = ""
    #: (node, clique id)
    members: tuple[tuple[str, str], ...] = ()
    dropped: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class HyperNodeRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Volcano's `HyperNode` (topology.volcano.sh/v1alpha1): one domain of its tier (1 the
    narrowest) and its members, those pyctl could read. `tier` 0: none pyctl models (absent, not a
    number in 1..`bounds.MAX_LEVELS`). `dropped` counts the members it could not take (no or
    several selectors, a name that is no DNS subdomain, a pattern that is not `safe_pattern`,
    a selector that does not decode, past `bounds.MAX_HYPERNODE_MEMBERS`)."""

    name: str
    resource_version: str = ""
    tier: int = 0
    tier_name: str = ""
    #: member nodes by name (`exactMatch`)
    nodes: tuple[str, ...] = ()
    #: member nodes by a pattern on their name (`regexMatch`)
    patterns: tuple[str, ...] = ()
    #: member nodes by their labels (`labelMatch`)
    label_selectors: tuple[Selector, ...] = ()
    #: member HyperNodes by name
    children: tuple[str, ...] = ()
    dropped: int = 0


class SubGroupRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One entry of a Volcano PodGroup's `subGroupPolicy`: the pods its `selector` matches (None:
    every pod), grouped by their values of `match_keys` (a pod missing one, or with none to
    match, is in no sub-group of it), each sub-group of `size` pods (`subGroupSize`) and, where
    its `networkTopology` is `hard`, inside one HyperNode of `tier` (or of the tier named
    `tier_name`)."""

    name: str
    size: int = 1
    hard: bool = False
    tier: int = 0
    tier_name: str = ""
    selector: Selector | None = None
    match_keys: tuple[str, ...] = ()


class PodGroupRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Volcano's `PodGroup` (scheduling.volcano.sh/v1beta1): `min_member` and, where its
    `networkTopology` is `hard`, the highest tier its pods may span (`tier`, or `tier_name` to be
    found among the HyperNodes' `tierName`s; 0 and "": none). `sub_groups`: its `subGroupPolicy`
    entries, in order (a pod belongs to the first that takes it; kept only when one gives its
    sub-groups a hard topology); `sub_unread`: entries pyctl could not read (a selector or key it
    cannot read, past `MAX_SUB_GROUPS`; counted where some entry's topology is or may be hard),
    for which it makes no room for the group's pods (`ClusterCache.volcano_held`)."""

    namespace: str
    name: str
    resource_version: str = ""
    min_member: int = 0
    hard: bool = False
    tier: int = 0
    tier_name: str = ""
    sub_groups: tuple[SubGroupRecord, ...] = ()
    sub_unread: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class WorkloadRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Kueue's `Workload`: the pods it stands for (its owners of kind Pod, in its namespace) and,
    when Kueue holds it back for something room does not give (quota, say), its
    message (`held`, `gangs.kueue_held`): no eviction admits it then."""

    namespace: str
    name: str
    resource_version: str = ""
    pods: tuple[str, ...] = ()
    held: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


Record: TypeAlias = (
    NodeRecord
    | PodRecord
    | PdbRecord
    | NrtRecord
    | DeviceClassRecord
    | SliceRecord
    | ClaimRecord
    | ClaimTemplateRecord
    | KueueTopologyRecord
    | KaiTopologyRecord
    | CliqueRecord
    | HyperNodeRecord
    | PodGroupRecord
    | WorkloadRecord
)


def record_key(r: Record) -> str:
    """The record's identity within its kind: the name, or namespace/name."""
    if isinstance(
        r,
        PodRecord
        | PdbRecord
        | ClaimRecord
        | ClaimTemplateRecord
        | CliqueRecord
        | PodGroupRecord
        | WorkloadRecord,
    ):
        return r.key
    return r.name


_KIND_OF: dict[type, Kind] = {
    NodeRecord: "Node",
    PodRecord: "Pod",
    PdbRecord: "PodDisruptionBudget",
    NrtRecord: "NodeResourceTopology",
    DeviceClassRecord: "DeviceClass",
    SliceRecord: "ResourceSlice",
    ClaimRecord: "ResourceClaim",
    ClaimTemplateRecord: "ResourceClaimTemplate",
    KueueTopologyRecord: "KueueTopology",
    KaiTopologyRecord: "KaiTopology",
    CliqueRecord: "ComputeDomainClique",
    HyperNodeRecord: "HyperNode",
    PodGroupRecord: "PodGroup",
    WorkloadRecord: "KueueWorkload",
}


def record_kind(r: Record) -> Kind:
    return _KIND_OF[type(r)]


EventType: TypeAlias = Literal["ADDED", "MODIFIED", "DELETED"]


class Event(msgspec.Struct, frozen=True):
    """One change of one object, as the store applies it."""

    type: EventType
    record: Record
    #: when the watch delivered it (time.monotonic()), for the event-to-state lag
    received: float = 0.0


_ENC = msgspec.json.Encoder()
_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "Node": msgspec.json.Decoder(NodeRecord),
    "Pod": msgspec.json.Decoder(PodRecord),
    "PodDisruptionBudget": msgspec.json.Decoder(PdbRecord),
    "NodeResourceTopology": msgspec.json.Decoder(NrtRecord),
    "DeviceClass": msgspec.json.Decoder(DeviceClassRecord),
    "ResourceSlice": msgspec.json.Decoder(SliceRecord),
    "ResourceClaim": msgspec.json.Decoder(ClaimRecord),
    "ResourceClaimTemplate": msgspec.json.Decoder(ClaimTemplateRecord),
    "KueueTopology": msgspec.json.Decoder(KueueTopologyRecord),
    "KaiTopology": msgspec.json.Decoder(KaiTopologyRecord),
    "ComputeDomainClique": msgspec.json.Decoder(CliqueRecord),
    "HyperNode": msgspec.json.Decoder(HyperNodeRecord),
    "PodGroup": msgspec.json.Decoder(PodGroupRecord),
    "KueueWorkload": msgspec.json.Decoder(WorkloadRecord),
}


def encode_record(r: Record) -> bytes:
    return _ENC.encode(r)


def decode_record(kind: Kind, data: bytes) -> Record:
    """A stored record; raises ValueError (msgspec's, or `bounds.BoundsError`) when `data` is not
    one or holds a value beyond `pyctl.cluster.bounds`."""
    try:
        rec: Record = _DECODERS[kind].decode(data)
    except RecursionError:
        raise ValueError(f"{kind} record: nested too deeply") from None
    check_record(rec)
    return rec


class ObjectRef(msgspec.Struct, frozen=True):
    """Which object a message is about (as far as it could be read)."""

    kind: Kind
    namespace: str = ""
    name: str = ""
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def tombstone(ref: ObjectRef) -> Record | None:
    """A record with only the identity of `ref`: what a DELETED event needs to drop the object
    from the cache and the store (None when the name is unknown)."""
    if not ref.name:
        return None
    if ref.kind == "Node":
        return NodeRecord(ref.name)
    if ref.kind == "Pod":
        return PodRecord(ref.namespace, ref.name, ref.uid)
    if ref.kind == "PodDisruptionBudget":
        return PdbRecord(ref.namespace, ref.name)
    if ref.kind == "NodeResourceTopology":
        return NrtRecord(ref.name)
    if ref.kind == "DeviceClass":
        return DeviceClassRecord(ref.name)
    if ref.kind == "ResourceSlice":
        return SliceRecord(ref.name)
    if ref.kind == "ResourceClaim":
        return ClaimRecord(ref.namespace, ref.name, ref.uid)
    if ref.kind == "ResourceClaimTemplate":
        return ClaimTemplateRecord(ref.namespace, ref.name)
    if ref.kind == "KueueTopology":
        return KueueTopologyRecord(ref.name)
    if ref.kind == "KaiTopology":
        return KaiTopologyRecord(ref.name)
    if ref.kind == "ComputeDomainClique":
        return CliqueRecord(ref.namespace, ref.name)
    if ref.kind == "HyperNode":
        return HyperNodeRecord(ref.name)
    if ref.kind == "PodGroup":
        return PodGroupRecord(ref.namespace, ref.name)
    if ref.kind == "KueueWorkload":
        return WorkloadRecord(ref.namespace, ref.name)
    return None


# -- bounds (pyctl.cluster.bounds) on a record from anywhere: decode, the store, the simulator ----


def _mig(where: str, mig: tuple[tuple[str, int], ...], per_profile: int) -> None:
    b.check_len(f"{where} MIG resources", len(mig), b.MAX_MIG_PROFILES)
    for prof, n in mig:
        b.check(f"{where} nvidia.com/mig-{prof[:40]}", n, per_profile)


def _lists(where: str, **lists: tuple[object, ...]) -> None:
    for name, items in lists.items():
        b.check_len(
            f"{where} {name}", len(items), b.MAX_LABELS if name == "labels" else b.MAX_ITEMS
        )


def _name(where: str, *names: str) -> None:
    for n in names:
        if len(n) > b.MAX_NAME_CHARS:
            raise b.BoundsError(f"{where}: a name of {len(n)} characters")


def _constraints(where: str, c: Constraints) -> None:
    _lists(
        where,
        node_selector=c.node_selector,
        node_affinity=c.node_affinity,
        tolerations=c.tolerations,
        affinity=c.affinity,
        anti_affinity=c.anti_affinity,
        spread=c.spread,
    )
    for t in c.node_affinity:
        _lists(where, match_expressions=t.match_expressions, match_fields=t.match_fields)
        for r in (*t.match_expressions, *t.match_fields):
            b.check_len(f"{where} requirement {r.key[:40]}", len(r.values), b.MAX_VALUES)
    for pt in (*c.affinity, *c.anti_affinity):
        _lists(where, namespaces=pt.namespaces)
        if pt.selector is not None:
            _selector(where, pt.selector)
    for sp in c.spread:
        if sp.selector is not None:
            _selector(where, sp.selector)


def _check_pod_group(where: str, r: PodGroupRecord) -> None:
    b.check(f"{where} minMember", r.min_member, b.MAX_GANG_PODS)
    b.check(f"{where} tier", r.tier, b.MAX_LEVELS)
    b.check_len(f"{where} subGroupPolicy", len(r.sub_groups), b.MAX_SUB_GROUPS)
    b.check(f"{where} subGroupPolicy unread", r.sub_unread, b.MAX_ITEMS)
    for sg in r.sub_groups:
        b.check(f"{where} subGroupSize", sg.size, b.MAX_GANG_PODS, low=1)
        b.check(f"{where} sub-group tier", sg.tier, b.MAX_LEVELS)
        b.check_len(f"{where} matchLabelKeys", len(sg.match_keys), b.MAX_SUB_GROUP_KEYS)
        if sg.selector is not None:
            _selector(where, sg.selector)


def _selector(where: str, s: Selector) -> None:
    _lists(where, match_labels=s.match_labels, match_expressions=s.match_expressions)
    for r in s.match_expressions:
        b.check_len(f"{where} requirement {r.key[:40]}", len(r.values), b.MAX_VALUES)


#: the longest string of each field of a record (by field name; a pair's by position; every other
#: string `bounds.MAX_TEXT_CHARS`): as the API server holds the object's fields it comes from
_NAME, _NS, _UID, _KEY, _VALUE = (
    b.MAX_NAME_CHARS,
    b.MAX_NAMESPACE_CHARS,
    b.MAX_UID_CHARS,
    b.MAX_KEY_CHARS,
    b.MAX_LABEL_VALUE_CHARS,
)
_TEXT_BOUNDS: dict[str, int | tuple[int, int]] = {
    **dict.fromkeys(("namespace",), _NS),
    **dict.fromkeys(("uid", "owner_uid"), _UID),
    **dict.fromkeys(
        (
            *("name", "node", "allocated_node", "owner_name", "owner_pod", "priority_class"),
            *("scheduler", "extended_claim", "claim", "template", "generated", "pod_claim_name"),
            *("class_name", "driver", "pool", "device", "counter_set", "request", "resource"),
            *("namespaces", "values"),
            *("nodes", "children", "tier_name", "pod_group", "pods"),
        ),
        _NAME,
    ),
    **dict.fromkeys(("key", "topology_key", "levels", "match_keys"), _KEY),
    "members": (_NAME, _VALUE),
    "value": _VALUE,
    **dict.fromkeys(("labels", "match_labels", "node_selector"), (_KEY, _VALUE)),
    "selectors": b.DRA_BOUNDS["selector_length"],
    "patterns": b.MAX_PATTERN_CHARS,
}
#: fields whose bound differs in one struct: a device attribute's value (a string attribute of
#: k8s.io/api/resource/v1 is at most 64 characters; a version 64 too)
_TEXT_BOUNDS_OF: dict[str, dict[str, int | tuple[int, int]]] = {"Attr": {"value": 64}}


class _Plan(msgspec.Struct, frozen=True):
    """How one record type's strings are checked: its plain string fields grouped by bound (read
    with one `attrgetter` per group), then the fields that hold tuples or other structs."""

    groups: tuple[tuple[int, Callable[[Any], Any], tuple[str, ...]], ...]
    #: (field, bound, how: "strs" a tuple of strings, "pair<i>" the strings at <i> of a tuple of
    #: tuples, "any" else)
    others: tuple[tuple[str, int | tuple[int, int], str], ...]


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type[msgspec.Struct]) -> _Plan:
    got = _PLANS.get(cls)
    if got is not None:
        return got
    own = _TEXT_BOUNDS_OF.get(cls.__name__, {})
    by_bound: dict[int, list[str]] = {}
    others: list[tuple[str, int | tuple[int, int], str]] = []
    for f in msgspec.structs.fields(cls):
        bound = own.get(f.name, _TEXT_BOUNDS.get(f.name, b.MAX_TEXT_CHARS))
        t = f.type
        if t in (int, bool, float):
            continue
        if t is str and isinstance(bound, int):
            by_bound.setdefault(bound, []).append(f.name)
        elif typing.get_origin(t) is tuple and typing.get_args(t)[0] is str:
            others.append((f.name, bound, "strs"))
        elif typing.get_origin(t) is tuple and typing.get_origin(typing.get_args(t)[0]) is tuple:
            parts = typing.get_args(typing.get_args(t)[0])
            for i, part in enumerate(parts):
                if part is str:
                    high = bound[i] if isinstance(bound, tuple) else bound
                    others.append((f.name, high, f"pair{i}"))
        else:
            others.append((f.name, bound, "any"))
    groups = tuple(
        (bound, attrgetter(*names) if len(names) > 1 else _one(attrgetter(names[0])), tuple(names))
        for bound, names in by_bound.items()
    )
    got = _PLANS[cls] = _Plan(groups, tuple(others))
    return got


def _one(get: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, ...]]:
    return lambda obj: (get(obj),)


def _too_long(where: str, field: str, n: int, high: int) -> b.BoundsError:
    return b.BoundsError(f"{where} {field}: {n} characters, more than {high}")


def _texts(where: str, obj: msgspec.Struct) -> None:
    """Every string in `obj` (its fields, their tuples and pairs, nested structs) within its
    field's bound (`_TEXT_BOUNDS`); `BoundsError` naming the field and the length otherwise."""
    plan = _plan(type(obj))
    for high, get, names in plan.groups:
        values = get(obj)
        if max(map(len, values)) > high:
            field, v = next((n, v) for n, v in zip(names, values, strict=True) if len(v) > high)
            raise _too_long(where, field, len(v), high)
    for field, bound, how in plan.others:
        v = getattr(obj, field)
        if not v:
            continue
        if how == "strs":
            high = bound if isinstance(bound, int) else b.MAX_TEXT_CHARS
            longest = max(map(len, v))
            if longest > high:
                raise _too_long(where, f"{field} entry", longest, high)
        elif how.startswith("pair"):
            assert isinstance(bound, int)
            longest = max(map(len, map(itemgetter(int(how[4:])), v)))
            if longest > bound:
                raise _too_long(where, f"{field} entry", longest, bound)
        else:
            _any(where, field, v, bound)


def _any(where: str, field: str, v: object, bound: int | tuple[int, int]) -> None:
    """A field of another type (a struct, a tuple of structs, an attribute's value)."""
    if isinstance(v, msgspec.Struct):
        _texts(where, v)
    elif isinstance(v, str):
        high = bound if isinstance(bound, int) else b.MAX_TEXT_CHARS
        if len(v) > high:
            raise _too_long(where, field, len(v), high)
    elif isinstance(v, tuple):
        for item in v:
            _any(where, field, item, bound)


def check_texts(r: Record) -> None:
    """Every string of `r` within its field's bound (what `check_record` checks of strings)."""
    _texts(f"{record_kind(r)} {record_key(r)[:300]}:", r)


def check_record(r: Record) -> None:
    """Raise `bounds.BoundsError` (a ValueError naming the field) if a count, amount, list or
    string of `r` is beyond `pyctl.cluster.bounds`. Cheap: it compares numbers and lengths."""
    check_texts(r)
    if isinstance(r, PodRecord):
        where = f"pod {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name, r.node)
        b.check_len(f"{where} resource claims", len(r.claims), b.DRA_BOUNDS["claims_per_pod"])
        b.check(f"{where} cpu request (millicores)", r.cpu_milli, b.MAX_CPU_MILLI)
        b.check(f"{where} memory request (MiB)", r.memory_mib, b.MAX_MEMORY_MIB)
        b.check(f"{where} nvidia.com/gpu", r.gpus, b.MAX_GPUS_PER_POD)
        b.check(f"{where} RDMA request", r.rdma, b.MAX_RDMA)
        _mig(where, r.mig, b.MAX_MIG_PER_POD)
        b.check(f"{where} priority", r.priority, b.INT32[1], b.INT32[0])
        _lists(where, labels=r.labels)
        if r.constraints is not None:
            _constraints(where, r.constraints)
        if r.gang is not None:
            b.check(f"{where} gang size", r.gang.size, b.MAX_GANG_PODS)
            b.check_len(f"{where} gang level key", len(r.gang.key), b.MAX_KEY_CHARS)
            b.check_len(f"{where} gang name", len(r.gang.group), b.MAX_NAME_CHARS)
    elif isinstance(r, NodeRecord):
        where = f"node {r.name[:253]}"
        _name(where, r.name)
        b.check(f"{where} cpu (millicores)", r.cpu_milli, b.MAX_CPU_MILLI)
        b.check(f"{where} memory (MiB)", r.memory_mib, b.MAX_MEMORY_MIB)
        b.check(f"{where} nvidia.com/gpu", r.gpus, b.MAX_GPUS_PER_NODE)
        b.check(f"{where} nvidia.com/gpu.count", r.gpu_count_label, b.MAX_GPUS_PER_NODE)
        b.check(f"{where} RDMA resource", r.rdma, b.MAX_RDMA)
        _mig(where, r.mig, b.MAX_MIG_PER_NODE)
        b.check(f"{where} MIG instances", sum(n for _, n in r.mig), b.MAX_MIG_PER_NODE)
        b.check_len(f"{where} GPU NUMA labels", len(r.gpu_numa), b.MAX_NUMA_ZONES)
        for gpu, numa in r.gpu_numa:
            b.check(f"{where} GPU index of nvidia.com/gpu-<i>-numa", gpu, b.MAX_GPUS_PER_NODE)
            b.check(f"{where} nvidia.com/gpu-{gpu}-numa", numa, b.MAX_NUMA_ID)
        _lists(where, labels=r.labels, taints=r.taints)
    elif isinstance(r, NrtRecord):
        where = f"NodeResourceTopology {r.name[:253]}"
        _name(where, r.name)
        b.check_len(f"{where} zones", len(r.zones), b.MAX_NUMA_ZONES)
        seen: set[int] = set()
        for z in r.zones:
            zw = f"{where} zone {z.numa}"
            b.check(f"{where} NUMA id", z.numa, b.MAX_NUMA_ID)
            if z.numa in seen:
                raise b.BoundsError(f"{where}: NUMA id {z.numa} appears twice")
            seen.add(z.numa)
            for what, v, hi in (
                ("cpu", z.cpu_milli, b.MAX_CPU_MILLI),
                ("cpu available", z.cpu_available, b.MAX_CPU_MILLI),
                ("memory", z.memory_mib, b.MAX_MEMORY_MIB),
                ("memory available", z.memory_available, b.MAX_MEMORY_MIB),
                ("nvidia.com/gpu", z.gpus, b.MAX_GPUS_PER_NODE),
                ("nvidia.com/gpu available", z.gpus_available, b.MAX_GPUS_PER_NODE),
            ):
                b.check(f"{zw} {what}", v, hi)
            b.check_len(f"{zw} MIG resources", len(z.mig), b.MAX_MIG_PROFILES)
            for prof, total, avail in z.mig:
                b.check(f"{zw} nvidia.com/mig-{prof[:40]}", total, b.MAX_MIG_PER_NODE)
                b.check(f"{zw} nvidia.com/mig-{prof[:40]} available", avail, b.MAX_MIG_PER_NODE)
        b.check(f"{where} nvidia.com/gpu", sum(z.gpus for z in r.zones), b.MAX_GPUS_PER_NODE)
        mig = sum(n for z in r.zones for _, n, _ in z.mig)
        b.check(f"{where} MIG instances", mig, b.MAX_MIG_PER_NODE)
    elif isinstance(r, PdbRecord):
        where = f"PodDisruptionBudget {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name)
        _lists(where, match_labels=r.match_labels, match_expressions=r.match_expressions)
    elif isinstance(r, TopologyRecord):
        where = f"{record_kind(r)} {r.name[:253]}"
        _name(where, r.name)
        b.check_len(f"{where} levels", len(r.levels), b.MAX_LEVELS)
        b.check(f"{where} levels left out", r.dropped, b.MAX_OBJECT_BYTES)
    elif isinstance(r, CliqueRecord):
        where = f"ComputeDomainClique {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name)
        b.check_len(f"{where} daemons", len(r.members), b.MAX_CLIQUE_NODES)
        b.check(f"{where} daemons left out", r.dropped, b.MAX_OBJECT_BYTES)
    elif isinstance(r, HyperNodeRecord):
        where = f"HyperNode {r.name[:253]}"
        _name(where, r.name)
        b.check(f"{where} tier", r.tier, b.MAX_LEVELS)
        members = len(r.nodes) + len(r.patterns) + len(r.label_selectors) + len(r.children)
        b.check_len(f"{where} members", members, b.MAX_HYPERNODE_MEMBERS)
        b.check(f"{where} members left out", r.dropped, b.MAX_OBJECT_BYTES)
        for s in r.label_selectors:
            _selector(where, s)
    elif isinstance(r, PodGroupRecord):
        where = f"PodGroup {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name)
        _check_pod_group(where, r)
    elif isinstance(r, WorkloadRecord):
        where = f"Workload {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name)
        b.check_len(f"{where} pods", len(r.pods), b.MAX_GANG_PODS)
    else:
        _check_dra(r)


def _dra(what: str, n: int, where: str) -> None:
    b.check_len(f"{where} {what.replace('_', ' ')}", n, b.DRA_BOUNDS[what])


def _quantities(where: str, pairs: Iterable[tuple[str, str]]) -> None:
    """Quantities of a stored DRA record parse (the decoder checked them; a record from anywhere
    else may not have been)."""
    for name, v in pairs:
        try:
            q.parse_quantity(v)
        except q.QuantityError as e:
            raise b.BoundsError(f"{where} {name[:63]}: {e}") from None


def _claim_spec(where: str, spec: ClaimSpec) -> None:
    _dra("requests_per_claim", len(spec.requests), where)
    _dra("constraints_per_claim", len(spec.constraints), where)
    for req in spec.requests:
        _dra("subrequests_per_request", len(req.first_available), where)
        for sub in (req, *req.first_available):
            _dra("selectors_per_request", len(sub.selectors), where)
            _dra("tolerations_per_request", len(sub.tolerations), where)
            _quantities(f"{where} request {sub.name[:63]} capacity", sub.capacity)
            b.check(
                f"{where} request {sub.name[:63]} count",
                sub.count,
                b.DRA_BOUNDS["count_per_request"],
            )


def _check_dra(r: DeviceClassRecord | SliceRecord | ClaimRecord | ClaimTemplateRecord) -> None:
    """The limits of k8s.io/api/resource/v1 that `kube/dra_decode.py` applies when decoding,
    on a DRA record from anywhere."""
    if isinstance(r, SliceRecord):
        where = f"ResourceSlice {r.name[:253]}"
        _name(where, r.name, r.node)
        _dra("devices_per_slice", len(r.devices), where)
        _dra("counter_sets_per_slice", len(r.counter_sets), where)
        for cs in r.counter_sets:
            _dra("counters_per_set", len(cs.counters), where)
            _quantities(f"{where} counter set {cs.name[:63]}", cs.counters)
        for d in r.devices:
            dw = f"{where} device {d.name[:63]}"
            _dra("attributes_and_capacities_per_device", len(d.attributes) + len(d.capacity), dw)
            _dra("consumptions_per_device", len(d.consumes), dw)
            _dra("taints_per_device", len(d.taints), dw)
            _quantities(f"{dw} capacity", d.capacity)
            for use in d.consumes:
                _quantities(f"{dw} counters of {use.counter_set[:63]}", use.counters)
            for p in d.policies:
                _dra("capacity_valid_values", len(p.valid_values), dw)
                _quantities(
                    f"{dw} capacity {p.name[:63]} requestPolicy",
                    [
                        (k, v)
                        for k, v in (
                            ("default", p.default),
                            ("min", p.min),
                            ("max", p.max),
                            ("step", p.step),
                        )
                        if v
                    ]
                    + [("validValues", v) for v in p.valid_values],
                )
    elif isinstance(r, DeviceClassRecord):
        where = f"DeviceClass {r.name[:253]}"
        _name(where, r.name)
        _dra("selectors_per_request", len(r.selectors), where)
    elif isinstance(r, ClaimRecord):
        where = f"ResourceClaim {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name, r.allocated_node)
        _claim_spec(where, r.spec)
        _dra("results_per_claim", len(r.allocated), where)
        _dra("reserved_for", len(r.reserved_for), where)
        for a in r.allocated:
            _quantities(f"{where} result {a.device[:63]} consumed", a.consumed)
    else:
        where = f"ResourceClaimTemplate {r.namespace[:63]}/{r.name[:253]}"
        _name(where, r.namespace, r.name)
        _claim_spec(where, r.spec)
