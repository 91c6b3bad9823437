"""Link groups from the NVIDIA DRA driver's Fabric Manager partitions (docs/fabric.md, docs/dra.md).

Under its alpha gate `FabricManagerPartitioning`, the driver publishes on each full GPU device
`partition<N>` (an int, in the driver's domain `gpu.nvidia.com`): the id of the Fabric Manager
partition of N GPUs that holds the GPU, one attribute per partition size Fabric Manager reports
(1, 2, 4 and 8 on an 8-GPU board; `cmd/gpu-kubelet-plugin/deviceinfo.go`,
`addFabricManagerAttributes`, and `pkg/fabricmanager/manager.go`,
`GetPartitionsBySizeByModuleID`, in kubernetes-sigs/dra-driver-nvidia-gpu). Prepare fails unless
a claim's GPUs are exactly one partition, so each size is a level of link groups: a claim of g
GPUs needs a whole partition of the smallest size of at least g.

A node's partitions are read whole or not at all: every full GPU of the node publishes the same
sizes, each value an int, no partition of size N holds more than N of the node's GPUs, and no id
names partitions of two sizes (Fabric Manager's ids are unique). Otherwise the node's levels are
left out (its GPUs keep no link groups) and why is said once in the node's notes. Groups are
renumbered per level in the order of the partition ids.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from pyctl.cluster.bounds import MAX_GPUS_PER_NODE, MAX_LINK_LEVELS
from pyctl.cluster.dra.devices import NVIDIA_DRIVER, DeviceId, DeviceView

#: `partition<N>`; N is malformed unless it has no leading zero (the driver writes
#: `fmt.Sprintf("partition%d", size)`) and is in 1..`MAX_GPUS_PER_NODE`
PARTITION_ATTRIBUTE: Final = re.compile(r"^partition([0-9]+)$")
#: the largest partition id read (the API's int64)
MAX_PARTITION_ID: Final = (1 << 63) - 1


@dataclass
class Partitions:
    """A node's Fabric Manager partitions as levels of link groups."""

    #: device -> (size, group) by size, for every full GPU of the node
    levels: dict[DeviceId, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    #: the sizes read, ascending (empty: none published, or left out)
    sizes: tuple[int, ...] = ()
    #: why the node's partitions were left out ("" if they were not)
    left_out: str = ""


def partition_size(name: str) -> int | None:
    """N of an attribute name `partition<N>` (unqualified or in the driver's domain), or None."""
    domain, sep, ident = name.rpartition("/")
    if sep and domain != NVIDIA_DRIVER:
        return None
    size = _size(ident)
    return size if size > 0 else None


def _size(ident: str) -> int:
    """N of `partition<N>` (-1: malformed N, 0: not such a name)."""
    m = PARTITION_ATTRIBUTE.match(ident)
    if m is None:
        return 0
    digits = m.group(1)
    if digits.startswith("0") or len(digits) > 7 or not 1 <= int(digits) <= MAX_GPUS_PER_NODE:
        return -1
    return int(digits)


def _read(d: DeviceView) -> tuple[dict[int, int], str]:
    """A device's partition ids by size, or why one of its values is malformed."""
    out: dict[int, int] = {}
    for ident, v in d.attributes.get(NVIDIA_DRIVER, {}).items():
        size = _size(ident)
        if size == 0:
            continue
        if size < 0:
            return {}, f"{ident[:40]}: N is not in 1..{MAX_GPUS_PER_NODE}"
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_PARTITION_ID:
            return {}, f"{ident} is {str(v)[:40]!r}, not a partition id (a non-negative int)"
        out[size] = v
    return out, ""


def read_partitions(devices: Sequence[DeviceView]) -> Partitions:
    """The partitions the full GPU devices `devices` of one node publish (see the module)."""
    if not devices:
        return Partitions()
    per: list[tuple[DeviceView, dict[int, int]]] = []
    bad: list[str] = []
    for d in devices:
        got, why = _read(d)
        if why:
            bad.append(f"{d.id.device[:64]}: {why}")
        per.append((d, got))
    published = sum(1 for _, got in per if got)
    if not published and not bad:
        return Partitions()  # the gate is off: nothing to say
    left = _check(per, bad)
    if left:
        return Partitions(left_out=left)
    sizes = tuple(sorted(per[0][1]))
    levels: dict[DeviceId, list[tuple[int, int]]] = defaultdict(list)
    for size in sizes:
        number = {pid: k for k, pid in enumerate(sorted({got[size] for _, got in per}))}
        for d, got in per:
            levels[d.id].append((size, number[got[size]]))
    return Partitions({k: tuple(v) for k, v in levels.items()}, sizes)


def _check(per: list[tuple[DeviceView, dict[int, int]]], bad: list[str]) -> str:
    """Why a node's partitions cannot be read whole ("" if they can)."""
    n = len(per)
    if bad:
        return f"{len(bad)} of {n} GPUs publish a malformed partition attribute ({bad[0]})"
    sizes = set(per[0][1])
    differ = [d for d, got in per if set(got) != sizes]
    if differ:
        return (
            f"{len(differ)} of {n} GPUs publish other partition sizes than "
            f"{per[0][0].id.device[:64]} (e.g. {differ[0].id.device[:64]})"
        )
    if len(sizes) > MAX_LINK_LEVELS:
        return f"{len(sizes)} partition sizes, more than {MAX_LINK_LEVELS}"
    members: dict[tuple[int, int], int] = defaultdict(int)
    size_of: dict[int, int] = {}
    for _, got in per:
        for size, pid in sorted(got.items()):
            members[(size, pid)] += 1
            if size_of.setdefault(pid, size) != size:
                a, b = sorted((size_of[pid], size))
                return f"partition id {pid} names partitions of {a} and {b} GPUs"
    for (size, pid), count in sorted(members.items()):
        if count > size:
            return f"partition{size} {pid} holds {count} of the node's GPUs, more than {size}"
    return ""
