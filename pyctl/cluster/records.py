"""The compact records that watch events become: only the fields pyctl needs, nothing of the
Kubernetes object model. They are what the state store keeps (encoded with msgspec as JSON
arrays) and what the reconcile loop reads. Kubernetes JSON never gets past `cluster/kube/`."""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

Kind: TypeAlias = Literal["Node", "Pod", "PodDisruptionBudget", "NodeResourceTopology"]
KINDS: tuple[Kind, ...] = ("Node", "Pod", "PodDisruptionBudget", "NodeResourceTopology")


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
    #: taint keys with effect NoSchedule or NoExecute
    taints: tuple[str, ...] = ()
    ready: bool = True


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


class NrtRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    name: str
    resource_version: str = ""
    policy: str = ""
    scope: str = ""
    zones: tuple[ZoneRecord, ...] = ()


Record: TypeAlias = NodeRecord | PodRecord | PdbRecord | NrtRecord


def record_key(r: Record) -> str:
    """The record's identity within its kind: the name, or namespace/name."""
    if isinstance(r, PodRecord | PdbRecord):
        return r.key
    return r.name


def record_kind(r: Record) -> Kind:
    if isinstance(r, NodeRecord):
        return "Node"
    if isinstance(r, PodRecord):
        return "Pod"
    if isinstance(r, PdbRecord):
        return "PodDisruptionBudget"
    return "NodeResourceTopology"


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
}


def encode_record(r: Record) -> bytes:
    return _ENC.encode(r)


def decode_record(kind: Kind, data: bytes) -> Record:
    rec: Record = _DECODERS[kind].decode(data)
    return rec
