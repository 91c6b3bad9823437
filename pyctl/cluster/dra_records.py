"""The compact records of Dynamic Resource Allocation (`resource.k8s.io/v1`): DeviceClasses,
ResourceSlices, ResourceClaims and ResourceClaimTemplates, with only what pyctl reads (see
docs/dra.md). Like every record they are stored by the state store (msgspec JSON arrays) and
carry no Kubernetes object model. Quantities stay the strings the API server wrote (exact);
`pyctl.cluster.quantity` parses them where arithmetic is needed."""

from __future__ import annotations

from typing import TypeAlias

import msgspec

#: an attribute value: int, bool, string or version (a semver string), or a list of one of them
#: (DRAListTypeAttributes)
AttrValue: TypeAlias = int | bool | str | tuple[int | bool | str, ...]


class Attr(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A device attribute: its name as published (unqualified names belong to the driver's
    domain), its type (`int`, `bool`, `string`, `version`, or the list forms `ints`, `bools`,
    `strings`, `versions`) and its value."""

    name: str
    kind: str
    value: AttrValue


class DeviceTaint(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    key: str
    value: str = ""
    #: NoSchedule, NoExecute (or None: informational)
    effect: str = ""


class CounterUse(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """What a device consumes from one counter set of its pool when allocated."""

    counter_set: str
    #: (counter name, quantity)
    counters: tuple[tuple[str, str], ...] = ()


class CounterSet(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    name: str
    counters: tuple[tuple[str, str], ...] = ()


class CapacityPolicy(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A capacity's requestPolicy (consumable capacity): what a claim consumes when it asks for
    none (`default`; "" is the whole value), and how a request is rounded up: to the next of
    `valid_values`, or to `min` + a multiple of `step` within `max`."""

    name: str
    default: str = ""
    valid_values: tuple[str, ...] = ()
    min: str = ""
    max: str = ""
    step: str = ""


class Device(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    name: str
    attributes: tuple[Attr, ...] = ()
    #: (capacity name, quantity)
    capacity: tuple[tuple[str, str], ...] = ()
    consumes: tuple[CounterUse, ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    #: allowMultipleAllocations (consumable capacity: several claims may share the device)
    multiple: bool = False
    #: the device's own nodeName (perDeviceNodeSelection pools)
    node: str = ""
    #: the request policies of its capacities (consumable capacity)
    policies: tuple[CapacityPolicy, ...] = ()


class SliceRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A ResourceSlice: part of a driver's pool at one generation."""

    name: str
    resource_version: str = ""
    driver: str = ""
    pool: str = ""
    generation: int = 0
    slice_count: int = 1
    #: spec.nodeName (node-local pools); "" for pools not tied to one node
    node: str = ""
    #: spec.allNodes, spec.nodeSelector, or perDeviceNodeSelection (then see Device.node)
    all_nodes: bool = False
    node_selector: bool = False
    per_device_node: bool = False
    devices: tuple[Device, ...] = ()
    counter_sets: tuple[CounterSet, ...] = ()


class DeviceClassRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    name: str
    resource_version: str = ""
    #: CEL expressions, all of which a device must satisfy
    selectors: tuple[str, ...] = ()
    #: spec.extendedResourceName (DRA-backed extended resources)
    extended_resource: str = ""


class DeviceToleration(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    key: str = ""
    #: Equal or Exists
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


class Request(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """A device request (`exactly`), or a list of alternatives (`first_available`), each a
    Request without alternatives of its own."""

    name: str
    class_name: str = ""
    selectors: tuple[str, ...] = ()
    #: ExactCount or All
    mode: str = "ExactCount"
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[DeviceToleration, ...] = ()
    #: capacity.requests (consumable capacity): (capacity name, quantity)
    capacity: tuple[tuple[str, str], ...] = ()
    first_available: tuple[Request, ...] = ()


class Constraint(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    #: the requests it applies to (empty: all of the claim's)
    requests: tuple[str, ...] = ()
    match_attribute: str = ""
    distinct_attribute: str = ""


class ClaimSpec(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    requests: tuple[Request, ...] = ()
    constraints: tuple[Constraint, ...] = ()


class Allocated(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One entry of status.allocation.devices.results."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    #: consumable capacity: the share's id and what it consumed (capacity name, quantity)
    share_id: str = ""
    consumed: tuple[tuple[str, str], ...] = ()


class Consumer(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """An entry of status.reservedFor."""

    resource: str
    name: str
    uid: str = ""


class ClaimRecord(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)
    allocated: tuple[Allocated, ...] = ()
    #: the node of a node-local allocation (status.allocation.nodeSelector), "" if none
    allocated_node: str = ""
    reserved_for: tuple[Consumer, ...] = ()
    #: the pod that owns it (a claim made from a template for that pod), "" if none
    owner_pod: str = ""
    owner_uid: str = ""
    #: the annotation resource.kubernetes.io/pod-claim-name (the pod's claim entry it serves)
    pod_claim_name: str = ""
    #: made by the scheduler for DRA-backed extended resources
    extended: bool = False
    deleting: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_allocated(self) -> bool:
        return bool(self.allocated)


class ClaimTemplateRecord(
    msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False
):
    namespace: str
    name: str
    resource_version: str = ""
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodClaim(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """An entry of a pod's spec.resourceClaims, with the claim generated for it when it comes
    from a template (status.resourceClaimStatuses)."""

    name: str
    claim: str = ""
    template: str = ""
    generated: str = ""

    @property
    def claim_name(self) -> str:
        """The ResourceClaim that serves it ("" while a template's claim is not made yet)."""
        return self.claim or self.generated
