"""The `resource.k8s.io/v1` JSON shapes pyctl reads (k8s.io/api/resource/v1), as msgspec
structs: only the fields it needs; everything else is skipped while decoding."""

from __future__ import annotations

import msgspec

from pyctl.cluster.kube.wire import Meta, NodeSelector

Quantity = str | int | float


class Value(msgspec.Struct):
    value: Quantity = 0


class CapacityRange(msgspec.Struct):
    min: Quantity | None = None
    max: Quantity | None = None
    step: Quantity | None = None


class CapacityRequestPolicy(msgspec.Struct):
    default: Quantity | None = None
    validValues: list[Quantity] = []
    validRange: CapacityRange | None = None


class DeviceCapacity(msgspec.Struct):
    value: Quantity = 0
    requestPolicy: CapacityRequestPolicy | None = None


class CelSelector(msgspec.Struct):
    expression: str = ""


class DeviceSelector(msgspec.Struct):
    cel: CelSelector | None = None


# -- DeviceClass -----------------------------------------------------------------------------


class DeviceClassSpec(msgspec.Struct):
    selectors: list[DeviceSelector] = []
    extendedResourceName: str | None = None


class DeviceClass(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: DeviceClassSpec = msgspec.field(default_factory=DeviceClassSpec)


# -- ResourceSlice ---------------------------------------------------------------------------


class DeviceAttribute(msgspec.Struct, rename={"int_": "int", "bool_": "bool"}):
    int_: int | None = None
    bool_: bool | None = None
    string: str | None = None
    version: str | None = None
    ints: list[int] | None = None
    bools: list[bool] | None = None
    strings: list[str] | None = None
    versions: list[str] | None = None


class DeviceTaint(msgspec.Struct):
    key: str = ""
    value: str = ""
    effect: str = ""


class CounterConsumption(msgspec.Struct):
    counterSet: str = ""
    counters: dict[str, Value] = {}


class Device(msgspec.Struct):
    name: str = ""
    attributes: dict[str, DeviceAttribute] = {}
    capacity: dict[str, DeviceCapacity] = {}
    consumesCounters: list[CounterConsumption] = []
    taints: list[DeviceTaint] = []
    allowMultipleAllocations: bool | None = None
    nodeName: str | None = None


class CounterSet(msgspec.Struct):
    name: str = ""
    counters: dict[str, Value] = {}


class ResourcePool(msgspec.Struct):
    name: str = ""
    generation: int = 0
    resourceSliceCount: int = 1


class ResourceSliceSpec(msgspec.Struct):
    driver: str = ""
    pool: ResourcePool = msgspec.field(default_factory=ResourcePool)
    nodeName: str | None = None
    nodeSelector: NodeSelector | None = None
    allNodes: bool | None = None
    perDeviceNodeSelection: bool | None = None
    devices: list[Device] = []
    sharedCounters: list[CounterSet] = []


class ResourceSlice(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ResourceSliceSpec = msgspec.field(default_factory=ResourceSliceSpec)


# -- ResourceClaim(Template) -----------------------------------------------------------------


class DeviceToleration(msgspec.Struct):
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""


class CapacityRequirements(msgspec.Struct):
    requests: dict[str, Quantity] = {}


class SubRequest(msgspec.Struct):
    name: str = ""
    deviceClassName: str = ""
    selectors: list[DeviceSelector] = []
    allocationMode: str = ""
    count: int | None = None
    adminAccess: bool | None = None
    tolerations: list[DeviceToleration] = []
    capacity: CapacityRequirements | None = None


class DeviceRequest(msgspec.Struct):
    name: str = ""
    exactly: SubRequest | None = None
    firstAvailable: list[SubRequest] = []


class DeviceConstraint(msgspec.Struct):
    requests: list[str] = []
    matchAttribute: str | None = None
    distinctAttribute: str | None = None


class DeviceClaim(msgspec.Struct):
    requests: list[DeviceRequest] = []
    constraints: list[DeviceConstraint] = []


class ResourceClaimSpec(msgspec.Struct):
    devices: DeviceClaim = msgspec.field(default_factory=DeviceClaim)


class AllocationResultEntry(msgspec.Struct):
    request: str = ""
    driver: str = ""
    pool: str = ""
    device: str = ""
    adminAccess: bool | None = None
    shareID: str | None = None
    consumedCapacity: dict[str, Quantity] = {}


class DeviceAllocationResult(msgspec.Struct):
    results: list[AllocationResultEntry] = []


class AllocationResult(msgspec.Struct):
    devices: DeviceAllocationResult = msgspec.field(default_factory=DeviceAllocationResult)
    nodeSelector: NodeSelector | None = None


class ConsumerReference(msgspec.Struct):
    resource: str = ""
    name: str = ""
    uid: str = ""


class ResourceClaimStatus(msgspec.Struct):
    allocation: AllocationResult | None = None
    reservedFor: list[ConsumerReference] = []


class ResourceClaim(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ResourceClaimSpec = msgspec.field(default_factory=ResourceClaimSpec)
    status: ResourceClaimStatus = msgspec.field(default_factory=ResourceClaimStatus)


class ResourceClaimTemplateSpec(msgspec.Struct):
    spec: ResourceClaimSpec = msgspec.field(default_factory=ResourceClaimSpec)


class ResourceClaimTemplate(msgspec.Struct):
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: ResourceClaimTemplateSpec = msgspec.field(default_factory=ResourceClaimTemplateSpec)
