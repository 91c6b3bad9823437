"""The cluster's DRA view (`DraContext`: its DRA objects, each node's devices and the index of
device kinds, cached) and the running pods whose devices span NUMA nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from pyctl.cluster.dra.claims import Catalogue, KindIndex
from pyctl.cluster.dra.devices import DeviceView
from pyctl.cluster.dra.node import NodeDevices, node_devices
from pyctl.cluster.dra.shapes import DraNeed, pod_need
from pyctl.cluster.dra_records import (
    ClaimRecord,
    ClaimTemplateRecord,
    DeviceClassRecord,
    PodClaim,
    SliceRecord,
)


class DraContext:
    """The DRA objects of a cluster, with what is derived from them cached: each node's devices
    and the index of device kinds. `slices_by_node` and `claims_by_node` may be live indexes
    kept by their owner (the controller's cache), which calls `invalidate` for what changed."""

    def __init__(
        self,
        classes: Mapping[str, DeviceClassRecord],
        claims: Mapping[str, ClaimRecord],
        templates: Mapping[str, ClaimTemplateRecord],
        slices_by_node: Mapping[str, Mapping[str, SliceRecord]],
        claims_by_node: Mapping[str, Mapping[str, ClaimRecord]],
    ) -> None:
        self.cat = Catalogue(classes, claims, templates)
        self.slices_by_node = slices_by_node
        self.claims_by_node = claims_by_node
        self._nodes: dict[str, NodeDevices] = {}
        self._index: KindIndex | None = None

    @classmethod
    def of(
        cls,
        classes: Iterable[DeviceClassRecord] = (),
        slices: Iterable[SliceRecord] = (),
        claims: Iterable[ClaimRecord] = (),
        templates: Iterable[ClaimTemplateRecord] = (),
    ) -> DraContext:
        """A context from lists of records (a dump, a test)."""
        by_node: dict[str, dict[str, SliceRecord]] = defaultdict(dict)
        for s in slices:
            for n in slice_nodes(s):
                by_node[n][s.name] = s
        claim_map = {c.key: c for c in claims}
        claims_by_node: dict[str, dict[str, ClaimRecord]] = defaultdict(dict)
        for c in claim_map.values():
            if c.allocated_node:
                claims_by_node[c.allocated_node][c.key] = c
        return cls(
            {c.name: c for c in classes},
            claim_map,
            {t.key: t for t in templates},
            dict(by_node),
            dict(claims_by_node),
        )

    def invalidate(self, nodes: Iterable[str] = (), devices: bool = False) -> None:
        """Forget what was derived for `nodes`; `devices`: the set of devices changed (the kind
        index is rebuilt)."""
        for n in nodes:
            self._nodes.pop(n, None)
        if devices:
            self._index = None

    def node(self, name: str) -> NodeDevices | None:
        """The node's DRA devices (None if it publishes none)."""
        slices = self.slices_by_node.get(name)
        if not slices:
            return None
        nd = self._nodes.get(name)
        if nd is None:
            claims = self.claims_by_node.get(name, {})
            nd = node_devices(name, slices.values(), claims.values())
            self._nodes[name] = nd
        return nd

    @property
    def index(self) -> KindIndex:
        if self._index is None:
            devices: list[DeviceView] = []
            for n in sorted(self.slices_by_node):
                nd = self.node(n)
                if nd is not None:
                    devices.extend(nd.devices)
            self._index = KindIndex(devices)
        return self._index

    def need(self, namespace: str, claims: Sequence[PodClaim]) -> DraNeed:
        return pod_need(namespace, claims, self.cat, self.index)


def slice_nodes(s: SliceRecord) -> set[str]:
    """The nodes a slice's devices are on (node-local pools only)."""
    if s.node:
        return {s.node}
    if s.per_device_node:
        return {d.node for d in s.devices if d.node}
    return set()


EMPTY_CONTEXT: Final = DraContext({}, {}, {}, {}, {})


@dataclass(frozen=True)
class Misaligned:
    """A pod whose allocated devices share no NUMA node."""

    pod: str
    node: str
    #: the NUMA nodes of each of its devices
    numa: tuple[tuple[int, ...], ...]
    devices: tuple[str, ...]


def misaligned_pods(ctx: DraContext) -> list[Misaligned]:
    """Every pod whose allocated devices (of any driver that publishes `numaNode`: GPUs, and
    CPUs where a CPU driver publishes them) span NUMA nodes: no NUMA node is common to all of
    them (a list-valued numaNode counts as the set of its nodes)."""
    out = []
    for node in sorted(ctx.claims_by_node):
        nd = ctx.node(node)
        if nd is None:
            continue
        per_pod: dict[str, list[DeviceView]] = defaultdict(list)
        for d in nd.devices:
            for a in nd.allocated.get(d.id, ()):
                for pod in a.pods:
                    per_pod[pod].append(d)
        for pod, devs in sorted(per_pod.items()):
            with_numa = [d for d in devs if d.numa]
            if len(with_numa) < 2:
                continue
            common = set(with_numa[0].numa)
            for d in with_numa[1:]:
                common &= set(d.numa)
            if not common:
                out.append(
                    Misaligned(
                        pod,
                        node,
                        tuple(d.numa for d in with_numa),
                        tuple(str(d.id) for d in with_numa),
                    )
                )
    return out
