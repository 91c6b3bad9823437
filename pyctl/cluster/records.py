"""The compact records that watch events become: only the fields pyctl needs, nothing of the
Kubernetes object model. They are what the state store keeps (encoded with msgspec as JSON
arrays) and what the reconcile loop reads. Kubernetes JSON never gets past `cluster/kube/`."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

from pyctl.cluster.dra_records import (
    ClaimRecord,
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
]
#: the kinds of Dynamic Resource Allocation (resource.k8s.io/v1), watched where served
DRA_KINDS: tuple[Kind, ...] = (
    "DeviceClass",
    "ResourceSlice",
    "ResourceClaim",
    "ResourceClaimTemplate",
)
KINDS: tuple[Kind, ...] = ("Node", "Pod", "PodDisruptionBudget", "NodeResourceTopology", *DRA_KINDS)


class Taint(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    key: str
    value: str = ""
    #: NoSchedule, PreferNoSchedule or NoExecute
    effect: str = ""


class Toleration(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    key: str = ""
    #: Equal or Exists
    operator: str = "Equal"
    value: str = ""
    #: empty: every effect
    effect: str = ""


class Requirement(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """One requirement of a label (or node field) selector."""

    key: str
    #: In, NotIn, Exists, DoesNotExist (labels), Gt, Lt (node selectors)
    operator: str
    values: tuple[str, ...] = ()


class Selector(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A metav1.LabelSelector: every label and every expression must match (empty: all)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()


class NodeTerm(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A NodeSelectorTerm: its expressions (labels) and fields (`metadata.name`) all match."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


class PodTerm(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A required PodAffinityTerm: pods matching `selector` in `namespaces` (empty: the pod's
    own; `all_namespaces`: every namespace) within the node's `topology_key` domain."""

    topology_key: str
    selector: Selector | None = None
    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False


class Spread(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """A topology spread constraint with whenUnsatisfiable: DoNotSchedule."""

    max_skew: int
    topology_key: str
    selector: Selector | None = None
    min_domains: int = 0


class Constraints(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """Where a pod may run (what the scheduler's filters check besides resources)."""

    node_selector: tuple[tuple[str, str], ...] = ()
    #: required node affinity: any one term matches
    node_affinity: tuple[NodeTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    #: required pod affinity and anti-affinity terms
    affinity: tuple[PodTerm, ...] = ()
    anti_affinity: tuple[PodTerm, ...] = ()
    spread: tuple[Spread, ...] = ()


class HamiDevice(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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


class NodeSharing(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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


class NodeRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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

    def has_taint(self, key: str) -> bool:
        """Whether a NoSchedule or NoExecute taint with this key is on the node."""
        return any(t.key == key and t.effect in ("NoSchedule", "NoExecute") for t in self.taints)


class HamiShare(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """What a pod holds of one GPU, as HAMi's scheduler assigned it (pod annotation
    ``hami.io/vgpu-devices-allocated``, containers collapsed as HAMi does)."""

    uuid: str
    memory_mib: int = 0
    cores: int = 0
    #: tasks (containers running at once) on the device
    slots: int = 1


class PodSharing(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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


class PodRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class PdbRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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


class ZoneRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
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


class NrtRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    name: str
    resource_version: str = ""
    policy: str = ""
    scope: str = ""
    zones: tuple[ZoneRecord, ...] = ()


Record: TypeAlias = (
    NodeRecord
    | PodRecord
    | PdbRecord
    | NrtRecord
    | DeviceClassRecord
    | SliceRecord
    | ClaimRecord
    | ClaimTemplateRecord
)


def record_key(r: Record) -> str:
    """The record's identity within its kind: the name, or namespace/name."""
    if isinstance(r, PodRecord | PdbRecord | ClaimRecord | ClaimTemplateRecord):
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
}


def encode_record(r: Record) -> bytes:
    return _ENC.encode(r)


def decode_record(kind: Kind, data: bytes) -> Record:
    rec: Record = _DECODERS[kind].decode(data)
    return rec
