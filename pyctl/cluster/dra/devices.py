"""One published DRA device as pyctl reads it (docs/dra.md): its id, its attributes grouped by
domain (the CEL input's shape), its kind (a whole GPU, a MIG device, other), NUMA node and PCIe
root, the counters it consumes and its capacities.

Devices of known GPU drivers (the NVIDIA DRA driver, `gpu.nvidia.com`) are GPUs: attribute
`type` `gpu` (a whole GPU) or `mig` (a MIG device, with `profile` and `parentUUID`);
`productName`, `uuid`; the standard `resource.kubernetes.io/numaNode` (an int, or a list of ints
with `DRAListTypeAttributes`), `pcieRoot`, `pciBusID`. A MIG device's placement start is the
lowest memory slice it consumes (DynamicMIG), else the `<start>` of its name
`gpu-<n>-mig-<profile>-<profileID>-<start>`, else its `memorySlice<i>` capacities.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Final

from pyctl.cluster import quantity as q
from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.cel import CelAttribute, CelCapacity, CelDevice
from pyctl.cluster.dra_records import Attr, Device

NVIDIA_DRIVER: Final = "gpu.nvidia.com"
#: drivers whose devices pyctl models as GPUs
GPU_DRIVERS: Final = frozenset({NVIDIA_DRIVER})
STANDARD_DOMAIN: Final = "resource.kubernetes.io"
NUMA_ATTRIBUTE: Final = "resource.kubernetes.io/numaNode"
PCIE_ATTRIBUTE: Final = "resource.kubernetes.io/pcieRoot"
MIG_DEVICE_NAME: Final = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")
GPU_DEVICE_NAME: Final = re.compile(r"^gpu-(\d+)")
MEMORY_SLICE_COUNTER: Final = re.compile(r"^memory-slice-(\d+)$")


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


def _cel_value(a: Attr) -> CelAttribute:
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
    attributes: dict[str, dict[str, CelAttribute]]
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

    def attribute(self, qualified_name: str) -> CelAttribute | None:
        domain, ident = qualified(qualified_name, self.id.driver)
        return self.attributes.get(domain, {}).get(ident)

    def cel_input(self) -> CelDevice:
        caps: dict[str, dict[str, CelCapacity]] = defaultdict(dict)
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


def _int_list(v: CelAttribute | None) -> tuple[int, ...]:
    if isinstance(v, bool):
        return ()
    if isinstance(v, int):
        return (v,)
    if isinstance(v, list):
        return tuple(sorted({x for x in v if isinstance(x, int) and not isinstance(x, bool)}))
    return ()


def device_view(driver: str, pool: str, d: Device, order: int) -> DeviceView:
    attrs: dict[str, dict[str, CelAttribute]] = defaultdict(dict)
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
        view.kind = t if isinstance(t, str) and t in ("gpu", "mig") else "other"
        view.product = str(own.get("productName", ""))
        view.uuid = str(own.get("uuid", ""))
        view.parent_uuid = str(own.get("parentUUID", ""))
        view.profile = str(own.get("profile", ""))
    return view


def gpu_model_name(product: str) -> str:
    """The GFD label form of an NVML product name ("NVIDIA H100 80GB HBM3" →
    "NVIDIA-H100-80GB-HBM3"), which pyctl's MIG catalog resolves."""
    return "-".join(product.split())


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
