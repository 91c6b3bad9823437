"""One way to read a cluster outside the controller's loop: a `kubectl get ... -o json` dump, or
one list of a live cluster, into the records the controller's watches produce.

Both go through the controller's own source: the kinds it watches (`records.KINDS`: Nodes, Pods,
PodDisruptionBudgets, NodeResourceTopology objects and the `resource.k8s.io` kinds of Dynamic
Resource Allocation, the optional ones only where their API is served), the same decoding and
bounds (`decode.decode_object`, `pyctl.cluster.bounds`), and the same isolation: an object that
does not decode is left out with the reason the controller gives it (`DecodeError.reason`), the
rest is read. A live cluster is listed by the controller's reflectors (`Reflector.list_once`);
a dump's items are decoded as the reflector decodes a list's. Only a file that is not a List
is refused (`DumpError`).

`Listed` is what was read; `pyctl.controller.view` turns it into the controller's view (models,
the objects it leaves out, M).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.dra_records import (
    ClaimRecord,
    ClaimTemplateRecord,
    DeviceClassRecord,
    SliceRecord,
)
from pyctl.cluster.kube.client import KubeClient
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.kube.reflector import Reflector, ReflectorOptions
from pyctl.cluster.records import (
    KINDS,
    Event,
    Kind,
    NodeRecord,
    NrtRecord,
    ObjectRef,
    PdbRecord,
    PodRecord,
    Record,
)


class DumpError(ValueError):
    """A file pyctl cannot read as a dump (not a List); the message says why."""


def is_dump(data: Any) -> bool:
    """A `kubectl get ... -o json` answer: a List of Kubernetes objects."""
    return isinstance(data, Mapping) and data.get("kind") == "List" and "items" in data


@dataclass(frozen=True)
class LeftOut:
    """An object that did not decode: its kind, the reason in one word (a metric label of the
    controller's), the message naming it, and the object when its metadata could be read."""

    kind: Kind
    reason: str
    message: str
    ref: ObjectRef | None = None


@dataclass
class Listed:
    """Every object of the controller's kinds that was read, as records, and the objects left
    out. It is an `EventSink`: the controller's reflectors list into it."""

    records: dict[Kind, list[Record]] = field(default_factory=dict)
    left_out: list[LeftOut] = field(default_factory=list)

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        self.records[kind] = list(records)

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        raise NotImplementedError("a listing is not watched")

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        self.left_out.append(LeftOut(kind, reason, message, ref))

    def of(self, kind: Kind) -> list[Record]:
        return self.records.get(kind, [])

    @property
    def nodes(self) -> list[NodeRecord]:
        return [r for r in self.of("Node") if isinstance(r, NodeRecord)]

    @property
    def pods(self) -> list[PodRecord]:
        return [r for r in self.of("Pod") if isinstance(r, PodRecord)]

    @property
    def nrts(self) -> list[NrtRecord]:
        return [r for r in self.of("NodeResourceTopology") if isinstance(r, NrtRecord)]

    @property
    def pdbs(self) -> list[PdbRecord]:
        return [r for r in self.of("PodDisruptionBudget") if isinstance(r, PdbRecord)]

    def dra(self) -> DraContext | None:
        """The DRA objects read (None if there are none)."""
        classes = [r for r in self.of("DeviceClass") if isinstance(r, DeviceClassRecord)]
        slices = [r for r in self.of("ResourceSlice") if isinstance(r, SliceRecord)]
        claims = [r for r in self.of("ResourceClaim") if isinstance(r, ClaimRecord)]
        templates = [
            r for r in self.of("ResourceClaimTemplate") if isinstance(r, ClaimTemplateRecord)
        ]
        if not (classes or slices or claims or templates):
            return None
        return DraContext.of(classes, slices, claims, templates)


#: kinds read by API group: Kueue's and KAI's `Topology` and Kueue's `Workload` (whose names in a
#: dump are not pyctl's), Volcano's `HyperNode` and `PodGroup` (other schedulers have a `PodGroup`
#: of their own)
_BY_GROUP: dict[tuple[str, str], Kind] = {
    ("kueue.x-k8s.io", "Topology"): "KueueTopology",
    ("kai.scheduler", "Topology"): "KaiTopology",
    ("topology.volcano.sh", "HyperNode"): "HyperNode",
    ("scheduling.volcano.sh", "PodGroup"): "PodGroup",
    ("kueue.x-k8s.io", "Workload"): "KueueWorkload",
}
#: pyctl's kinds whose real name other groups use too: read only from their own group
_GROUPED: frozenset[str] = frozenset(("HyperNode", "PodGroup"))


def _kind(o: Mapping[str, Any]) -> Kind | None:
    kind = o.get("kind")
    if kind in KINDS and kind not in _GROUPED:
        return kind  # type: ignore[no-any-return]
    api = o.get("apiVersion")
    if isinstance(kind, str) and isinstance(api, str):
        return _BY_GROUP.get((api.partition("/")[0], kind))
    return None


def dump_items(data: Any, name: str = "kubectl dump") -> list[Any]:
    """A dump's items; `DumpError` naming `name` when `data` is not a List of them."""
    if not is_dump(data):
        raise DumpError(f"{name}: expected a kubectl -o json dump (kind: List)")
    items = data["items"]
    if not isinstance(items, list):
        raise DumpError(f"{name}: 'items' must be a list")
    return items


def read_dump(data: Any, name: str = "kubectl dump", rdma_resource: str = "") -> Listed:
    """The objects of a dump whose kind the controller watches, decoded as a list's items are
    (`rdma_resource`: the reflector's); an item that does not decode is left out with its
    reason. Items of other kinds are skipped. `DumpError` only when `data` is not a List."""
    items = dump_items(data, name)
    listed = Listed({k: [] for k in KINDS})
    for i, o in enumerate(items):
        kind = _kind(o) if isinstance(o, Mapping) else None
        if kind is None:
            continue
        try:
            listed.records[kind].append(decode_object(kind, o, rdma_resource))
        except DecodeError as e:
            listed.decode_error(kind, f"items[{i}]: {e}", reason=e.reason, ref=e.ref)
        except ValueError as e:  # any other ValueError of one object (as the reflector takes it)
            listed.decode_error(kind, f"items[{i}]: {kind}: {e}")
    return listed


async def list_cluster(
    kube: KubeClient, kinds: Sequence[Kind] = KINDS, options: ReflectorOptions | None = None
) -> Listed:
    """One list of each kind by the controller's reflectors, with its `options` (an optional
    kind not served is read as none). Raises what the API server's errors raise
    (`KubeApiError`, connection errors)."""
    listed = Listed()
    for kind in kinds:
        await Reflector(kube, kind, options).list_once(listed)
    return listed
