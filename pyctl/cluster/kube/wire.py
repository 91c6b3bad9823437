"""The Kubernetes JSON shapes pyctl reads, as msgspec structs: only the fields it needs, so that
decoding a watch event skips everything else without building the generated model classes."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from pyctl.cluster.bounds import (
    MAX_ITEMS,
    MAX_LABELS,
    MAX_RESOURCES,
    Int32,
    Key,
    Labels,
    Name,
    Names,
    Text,
    Values,
)

#: a list of at most `MAX_ITEMS` entries (checked while decoding)
ITEMS = msgspec.Meta(max_length=MAX_ITEMS)


class OwnerRef(msgspec.Struct):
    kind: Text = ""
    name: Name = ""
    controller: bool = False
    uid: str = ""


class Meta(msgspec.Struct):
    name: Name = ""
    namespace: Name = ""
    uid: Text = ""
    resourceVersion: Text = ""
    creationTimestamp: Text | None = None
    labels: Labels = {}
    #: unbounded values (kubectl's last-applied-configuration is a whole object): only a few
    #: short ones are carried into records, cut to `MAX_TEXT_CHARS`
    annotations: Annotated[dict[Key, str], msgspec.Meta(max_length=MAX_LABELS)] = {}
    ownerReferences: Annotated[list[OwnerRef], ITEMS] = []
    deletionTimestamp: Text | None = None


class Taint(msgspec.Struct):
    key: Key = ""
    value: Text = ""
    effect: Text = ""


class Toleration(msgspec.Struct):
    key: Key = ""
    operator: Text = ""
    value: Text = ""
    effect: Text = ""


class Requirement(msgspec.Struct):
    key: Key = ""
    operator: Text = ""
    values: Values = []


class LabelSelector(msgspec.Struct):
    matchLabels: Labels = {}
    matchExpressions: Annotated[list[Requirement], ITEMS] = []


class NodeSelectorTerm(msgspec.Struct):
    matchExpressions: Annotated[list[Requirement], ITEMS] = []
    matchFields: Annotated[list[Requirement], ITEMS] = []


class NodeSelector(msgspec.Struct):
    nodeSelectorTerms: Annotated[list[NodeSelectorTerm], ITEMS] = []


class NodeAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector | None = None


class PodAffinityTerm(msgspec.Struct):
    topologyKey: Key = ""
    labelSelector: LabelSelector | None = None
    namespaces: Names = []
    namespaceSelector: LabelSelector | None = None


class PodAffinity(msgspec.Struct):
    requiredDuringSchedulingIgnoredDuringExecution: Annotated[list[PodAffinityTerm], ITEMS] = []


class Affinity(msgspec.Struct):
    nodeAffinity: NodeAffinity | None = None
    podAffinity: PodAffinity | None = None
    podAntiAffinity: PodAffinity | None = None


class TopologySpreadConstraint(msgspec.Struct):
    maxSkew: Int32 = 1
    topologyKey: Key = ""
    whenUnsatisfiable: Text = ""
    labelSelector: LabelSelector | None = None
    minDomains: Int32 | None = None


class Condition(msgspec.Struct):
    type: Text = ""
    status: Text = ""
    reason: Text = ""
    #: unbounded (the scheduler's message lists every node's reason): records keep 200 characters
    message: str = ""


#: resource name -> quantity (a quantity string longer than 64 characters is refused when parsed)
Quantities = Annotated[dict[Key, Text | int | float], msgspec.Meta(max_length=MAX_RESOURCES)]


class NodeSpec(msgspec.Struct):
    unschedulable: bool = False
    taints: Annotated[list[Taint], ITEMS] = []


class NodeStatus(msgspec.Struct):
    allocatable: Quantities = {}
    capacity: Quantities = {}
    conditions: Annotated[list[Condition], ITEMS] = []


class Node(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


class Resources(msgspec.Struct):
    requests: Quantities = {}
    limits: Quantities = {}


class Container(msgspec.Struct):
    name: Name = ""
    resources: Resources = msgspec.field(default_factory=Resources)


class Present(msgspec.Struct):
    """An object whose presence is all pyctl reads (its fields are skipped)."""


class Volume(msgspec.Struct):
    name: Name = ""
    emptyDir: Present | None = None
    hostPath: Present | None = None
    persistentVolumeClaim: Present | None = None
    ephemeral: Present | None = None


class PodResourceClaim(msgspec.Struct):
    """spec.resourceClaims[] (DRA)."""

    name: Name = ""
    resourceClaimName: Name | None = None
    resourceClaimTemplateName: Name | None = None


class PodResourceClaimStatus(msgspec.Struct):
    name: Name = ""
    resourceClaimName: Name | None = None


class PodExtendedResourceClaimStatus(msgspec.Struct):
    resourceClaimName: Name = ""


class SchedulingGate(msgspec.Struct):
    name: Key = ""


class PodSpec(msgspec.Struct):
    nodeName: Name = ""
    containers: Annotated[list[Container], ITEMS] = []
    initContainers: Annotated[list[Container], ITEMS] = []
    priority: Int32 | None = None
    priorityClassName: Name = ""
    volumes: Annotated[list[Volume], ITEMS] = []
    schedulerName: Name = ""
    nodeSelector: Labels = {}
    affinity: Affinity | None = None
    tolerations: Annotated[list[Toleration], ITEMS] = []
    topologySpreadConstraints: Annotated[list[TopologySpreadConstraint], ITEMS] = []
    resourceClaims: Annotated[list[PodResourceClaim], ITEMS] = []
    schedulingGates: Annotated[list[SchedulingGate], ITEMS] = []


class PodStatus(msgspec.Struct):
    phase: Text = ""
    conditions: Annotated[list[Condition], ITEMS] = []
    resourceClaimStatuses: Annotated[list[PodResourceClaimStatus], ITEMS] = []
    extendedResourceClaimStatus: PodExtendedResourceClaimStatus | None = None


class Pod(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class PdbSpec(msgspec.Struct):
    minAvailable: Int32 | Text | None = None
    maxUnavailable: Int32 | Text | None = None
    selector: LabelSelector = msgspec.field(default_factory=LabelSelector)


class PdbStatus(msgspec.Struct):
    disruptionsAllowed: Int32 = 0
    currentHealthy: Int32 = 0
    desiredHealthy: Int32 = 0
    expectedPods: Int32 = 0


class Pdb(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PdbSpec = msgspec.field(default_factory=PdbSpec)
    status: PdbStatus = msgspec.field(default_factory=PdbStatus)


class NrtResource(msgspec.Struct):
    name: Key = ""
    capacity: Text | int = 0
    allocatable: Text | int | None = None
    available: Text | int | None = None


class NrtZone(msgspec.Struct):
    name: Name = ""
    type: Text = "Node"
    #: the zone this one is part of (a zone of GPUs inside a NUMA node: a link group)
    parent: Name = ""
    resources: Annotated[list[NrtResource], msgspec.Meta(max_length=MAX_RESOURCES)] = []


class NrtAttribute(msgspec.Struct):
    name: Text = ""
    value: Text = ""


class Nrt(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    attributes: Annotated[list[NrtAttribute], ITEMS] = []
    topologyPolicies: Annotated[list[Text], ITEMS] = []
    zones: Annotated[list[NrtZone], ITEMS] = []


class Status(msgspec.Struct):
    """The object of an ERROR watch event (e.g. 410 Gone)."""

    code: int = 0
    reason: str = ""
    message: str = ""


class WatchLine(msgspec.Struct):
    """One line of a watch stream; `object` is decoded once its type is known."""

    type: str
    object: msgspec.Raw


# -- the fabric's sources (docs/fabric.md): each item of a list is read on its own when the record
# is made (`kube/fabric_decode.py`), so one bad level or daemon is left out, not the object


class TopologySpec(msgspec.Struct):
    levels: list[Any] | None = None


class Topology(msgspec.Struct):
    """Kueue's (kueue.x-k8s.io/v1beta1) and KAI's (kai.scheduler/v1alpha1) `Topology`: the same
    shape, `spec.levels[].nodeLabel`, the widest level first."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: TopologySpec = msgspec.field(default_factory=TopologySpec)


class ComputeDomainClique(msgspec.Struct):
    """The NVIDIA DRA driver's `ComputeDomainClique` (resource.nvidia.com/v1beta1): `daemons`
    of `{nodeName, ipAddress, cliqueID, index, status}` (api/nvidia.com/resource/v1beta1/
    computedomainclique.go), at the object's top level."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    daemons: list[Any] | None = None


class HyperNodeSpec(msgspec.Struct):
    tier: Any = None
    tierName: Any = None
    members: list[Any] | None = None


class HyperNode(msgspec.Struct):
    """Volcano's `HyperNode` (topology.volcano.sh/v1alpha1, cluster-scoped): `spec.tier`,
    `spec.tierName`, `spec.members[]` of `{type: Node|HyperNode, selector: {exactMatch: {name},
    regexMatch: {pattern}, labelMatch: LabelSelector}}` (volcano-sh/apis
    pkg/apis/topology/v1alpha1/hypernode_types.go)."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: HyperNodeSpec = msgspec.field(default_factory=HyperNodeSpec)


class PodGroupSpec(msgspec.Struct):
    minMember: Any = None
    networkTopology: Any = None
    subGroupPolicy: Annotated[list[Any], ITEMS] = []


class PodGroup(msgspec.Struct):
    """Volcano's `PodGroup` (scheduling.volcano.sh/v1beta1): `spec.minMember`,
    `spec.networkTopology{mode, highestTierAllowed, highestTierName}` and `spec.subGroupPolicy`
    (each entry read by `fabric_decode.podgroup_record`; volcano-sh/apis
    pkg/apis/scheduling/v1beta1/types.go)."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: PodGroupSpec = msgspec.field(default_factory=PodGroupSpec)


class WorkloadStatus(msgspec.Struct):
    conditions: Annotated[list[Condition], ITEMS] = []


class Workload(msgspec.Struct):
    """Kueue's `Workload` (kueue.x-k8s.io/v1beta2, or v1beta1): the pods it stands for
    (`metadata.ownerReferences` of kind Pod: every pod of a pod group) and
    `status.conditions` (`QuotaReserved`, whose message says why Kueue has not admitted it;
    sigs.k8s.io/kueue apis/kueue/v1beta2/workload_types.go)."""

    metadata: Meta = msgspec.field(default_factory=Meta)
    status: WorkloadStatus = msgspec.field(default_factory=WorkloadStatus)
