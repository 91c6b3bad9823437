"""A GPU's NUMA node from sysfs (`<root>/bus/pci/devices/<bus id>/numa_node`).

The kernel writes -1 when the firmware gives the device no proximity (a VM without a SLIT/SRAT
entry for it): that is *unknown*, never node 0. Then, and only then, `local_cpulist` is read
as a measure (which CPUs the kernel considers local), reported as such and never turned into a
NUMA node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pyctl.cluster.bounds import MAX_NUMA_ID, MAX_TEXT_CHARS

_BUS_ID: Final = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:00:06.0" as sysfs names it: "0000:00:06.0" (ValueError if malformed)."""
    m = _BUS_ID.match(nvml_bus_id.strip())
    if not m:
        raise ValueError(f"PCI bus id {nvml_bus_id[:64]!r} is not DOMAIN:BUS:DEVICE.FUNCTION")
    domain, bus, dev, fn = m.groups()
    if int(domain, 16) > 0xFFFF:
        raise ValueError(f"PCI domain of {nvml_bus_id!r} is beyond 16 bits")
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


@dataclass(frozen=True, slots=True)
class Numa:
    #: the NUMA node, or None when unknown
    node: int | None
    #: where it was read and what it said ("sysfs numa_node=1", "sysfs numa_node=-1: unknown")
    source: str
    #: only when `node` is unknown: sysfs local_cpulist, a measure, not a NUMA node
    local_cpulist: str | None = None


def _read(path: Path) -> str:
    with path.open("r", encoding="ascii", errors="replace") as f:
        return f.read(MAX_TEXT_CHARS).strip()


def read_numa(sysfs_root: Path, nvml_bus_id: str) -> Numa:
    """The GPU's NUMA node as the kernel knows it; never raises for a bad or missing file."""
    try:
        dev = sysfs_root / "bus" / "pci" / "devices" / sysfs_bus_id(nvml_bus_id)
    except ValueError as e:
        return Numa(None, f"unknown: {e}")
    try:
        raw = _read(dev / "numa_node")
    except OSError as e:
        return Numa(None, f"unknown: {dev / 'numa_node'} unreadable ({e.strerror or e})")
    try:
        value = int(raw)
    except ValueError:
        return Numa(None, f"unknown: sysfs numa_node reads {raw[:32]!r}, not a number")
    if 0 <= value <= MAX_NUMA_ID:
        return Numa(value, f"sysfs numa_node={value}")
    if value != -1:
        return Numa(None, f"unknown: sysfs numa_node={value} is outside 0..{MAX_NUMA_ID}")
    try:
        cpus: str | None = _read(dev / "local_cpulist")[:256]
    except OSError:
        cpus = None
    return Numa(
        None,
        "unknown: sysfs numa_node=-1 (the firmware gives the device no proximity); "
        "local_cpulist is reported as a measure only",
        cpus,
    )
