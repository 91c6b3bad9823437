"""The controller's in-process view of one cluster (the informer cache): records by kind and
key, pods indexed by node. Applying a change returns the nodes it dirtied."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from pyctl.cluster.records import (
    Event,
    Kind,
    NodeRecord,
    NrtRecord,
    PdbRecord,
    PodRecord,
    Record,
    record_key,
    record_kind,
)


def _nodes_of(r: Record) -> Iterable[str]:
    if isinstance(r, NodeRecord | NrtRecord):
        yield r.name
    elif isinstance(r, PodRecord) and r.node:
        yield r.node


class ClusterCache:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self.pdbs: dict[str, PdbRecord] = {}
        self.nrts: dict[str, NrtRecord] = {}
        self.pods_by_node: dict[str, dict[str, PodRecord]] = defaultdict(dict)

    def _table(self, kind: Kind) -> dict[str, Record]:
        tables: dict[str, dict[str, Record]] = {
            "Node": self.nodes,  # type: ignore[dict-item]
            "Pod": self.pods,  # type: ignore[dict-item]
            "PodDisruptionBudget": self.pdbs,  # type: ignore[dict-item]
            "NodeResourceTopology": self.nrts,  # type: ignore[dict-item]
        }
        return tables[kind]

    def _put(self, r: Record) -> set[str]:
        kind = record_kind(r)
        key = record_key(r)
        old = self._table(kind).get(key)
        self._table(kind)[key] = r
        dirty = set(_nodes_of(r))
        if old is not None:
            dirty.update(_nodes_of(old))
        if isinstance(r, PodRecord):
            if isinstance(old, PodRecord) and old.node and old.node != r.node:
                self.pods_by_node[old.node].pop(key, None)
            if r.node:
                self.pods_by_node[r.node][key] = r
        return dirty

    def _delete(self, r: Record) -> set[str]:
        kind = record_kind(r)
        key = record_key(r)
        old = self._table(kind).pop(key, None)
        dirty = set(_nodes_of(r))
        if old is not None:
            dirty.update(_nodes_of(old))
            if isinstance(old, PodRecord) and old.node:
                self.pods_by_node[old.node].pop(key, None)
        return dirty

    def apply(self, events: Sequence[Event]) -> set[str]:
        dirty: set[str] = set()
        for ev in events:
            dirty |= self._delete(ev.record) if ev.type == "DELETED" else self._put(ev.record)
        return dirty

    def replace(self, kind: Kind, records: Sequence[Record]) -> set[str]:
        """Replace a whole kind; returns the nodes whose inputs changed (added, changed, gone)."""
        table = self._table(kind)
        new = {record_key(r): r for r in records}
        dirty: set[str] = set()
        for key, old in list(table.items()):
            if key not in new:
                dirty |= self._delete(old)
        for key, r in new.items():
            if table.get(key) != r:
                dirty |= self._put(r)
        return dirty

    def pods_on(self, node: str) -> list[PodRecord]:
        return list(self.pods_by_node.get(node, {}).values())

    def pending_pods(self) -> list[PodRecord]:
        return [p for p in self.pods.values() if not p.node and not p.terminated and not p.deleting]
