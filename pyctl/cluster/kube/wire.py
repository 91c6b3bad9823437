"""The Kubernetes JSON shapes pyctl reads, as msgspec structs: only the fields it needs, so that
decoding a watch event skips everything else without building the generated model classes."""

from __future__ import annotations

from typing import Any

import msgspec


class OwnerRef(msgspec.Struct):
    kind: str = ""
    name: str = ""
    controller: bool = False
    uid: str = ""


class Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    creationTimestamp: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    ownerReferences: list[OwnerRef] = []
    deletionTimestamp: str | None = None


class Taint(msgspec.Struct):
    key: str = ""
    value: str = ""
    effect: str = ""


class Toleration(msgspec.Struct):
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""


class Requirement(msgspec.Struct):
    key: str = ""
    operator: str = ""
    values: list[str] = []


class LabelSelector(msgspec.Struct):
    matchLabels: dict[str, str] = {}
    matchExpressions: list[Requirement] = []


class NodeSelectorTerm(msgspec.Struct):
    matchExpressions: list[Requirement] = []
    matchFields: list[Requirement] = []


class NodeSelector(msgspec.Struct):
    nodeSelectorTerms: list[NodeSelectorTerm] = []


class NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class PodAffinityTerm(msgspec.Struct):
    topologyKey: str = ""
    labelSelector: LabelSelector | None = None
    namespaces: list[str] = []
    namespaceSelector: LabelSelector | None = None


class PodAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: list[PodAffinityTerm] = []


class Affinity(msgspec.Struct):
    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class TopologySpreadConstraint(msgspec.Struct):
    maxSkew: int = 1
    topologyKey: str = ""
    whenUnsatisfiable: str = ""
    labelSelector: LabelSelector | None = None
    minDomains: int | None = None


class Condition(msgspec.Struct):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""


Quantities = dict[str, str | int | float]


class NodeSpec(msgspec.Struct):
    unschedulable: bool = False
    taints: list[Taint] = []


class NodeStatus(msgspec.Struct):
    allocatable: Quantities = {}
    capacity: Quantities = {}
    conditions: list[Condition] = []


class Node(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class Resources(msgspec.Struct):
    requests: Quantities = {}
    limits: Quantities = {}


class Container(msgspec.Struct):
    name: str = ""
    resources: Resources = msgspec.field(default_factory=Resources)


class Volume(msgspec.Struct):
    name: str = ""
    emptyDir: dict[str, Any] | None = None
    hostPath: dict[str, Any] | None = None
    persistentVolumeClaim: dict[str, Any] | None = None
    ephemeral: dict[str, Any] | None = None


class PodResourceClaim(msgspec.Struct):
    """spec.resourceClaims[] (DRA)."""

    name: str = ""
    resourceClaimName: str | None = None
    resourceClaimTemplateName: str | None = None


class PodResourceClaimStatus(msgspec.Struct):
    name: str = ""
    resourceClaimName: str | None = None


class PodExtendedResourceClaimStatus(msgspec.Struct):
    resourceClaimName: str = ""


class PodSpec(msgspec.Struct):
    nodeName: str = ""
    containers: list[Container] = []
    initContainers: list[Container] = []
    priority: int | None = None
    priorityClassName: str = ""
    volumes: list[Volume] = []
    schedulerName: str = ""
    nodeSelector: dict[str, str] = {}
    affinity: Affinity | None = None
    tolerations: list[Toleration] = []
    topologySpreadConstraints: list[TopologySpreadConstraint] = []
    resourceClaims: list[PodResourceClaim] = []


class PodStatus(msgspec.Struct):
    phase: str = ""
    conditions: list[Condition] = []
    resourceClaimStatuses: list[PodResourceClaimStatus] = []
    extendedResourceClaimStatus: PodExtendedResourceClaimStatus | None = None


class Pod(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class PdbSpec(msgspec.Struct):
    minAvailable: int | str | None = None
    maxUnavailable: int | str | None = None
    selector: LabelSelector = msgspec.field(default_factory=LabelSelector)


class PdbStatus(msgspec.Struct):
    disruptionsAllowed: int = 0
    currentHealthy: int = 0
    desiredHealthy: int = 0
    expectedPods: int = 0


class Pdb(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PdbSpec = msgspec.field(default_factory=PdbSpec)
    status: PdbStatus = msgspec.field(default_factory=PdbStatus)


class NrtResource(msgspec.Struct):
    name: str = ""
    capacity: str | int = 0
    allocatable: str | int | None = None
    available: str | int | None = None


class NrtZone(msgspec.Struct):
    name: str = ""
    type: str = "Node"
    resources: list[NrtResource] = []


class NrtAttribute(msgspec.Struct):
    name: str = ""
    value: str = ""


class Nrt(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    attributes: list[NrtAttribute] = []
    topologyPolicies: list[str] = []
    zones: list[NrtZone] = []


class Status(msgspec.Struct):
    """The object of an ERROR watch event (e.g. 410 Gone)."""

    code: int = 0
    reason: str = ""
    message: str = ""


class WatchLine(msgspec.Struct):
    """One line of a watch stream; `object` is decoded once its type is known."""

    type: str
    object: msgspec.Raw
