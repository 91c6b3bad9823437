"""The controller's in-process view of one cluster (the informer cache): records by kind and
key, pods indexed by node, and the pods the summary asks about every second (the pending ones,
the live ones with resource claims) indexed as they change, so reading them costs what they
are, not the cluster. Applying a change returns the nodes it dirtied."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from pyctl.cluster.dra.context import DraContext, slice_nodes
from pyctl.cluster.dra_records import (
    ClaimRecord,
    ClaimTemplateRecord,
    DeviceClassRecord,
    SliceRecord,
)
from pyctl.cluster.records import (
    CliqueRecord,
    Event,
    HyperNodeRecord,
    KaiTopologyRecord,
    Kind,
    KueueTopologyRecord,
    NodeRecord,
    NrtRecord,
    PdbRecord,
    PodGroupRecord,
    PodRecord,
    Record,
    WorkloadRecord,
    record_key,
    record_kind,
)


def _nodes_of(r: Record) -> Iterable[str]:
    if isinstance(r, NodeRecord | NrtRecord):
        yield r.name
    elif isinstance(r, PodRecord) and r.node:
        yield r.node
    elif isinstance(r, SliceRecord):
        if r.node:
            yield r.node
        for d in r.devices:
            if d.node:
                yield d.node
    elif isinstance(r, ClaimRecord) and r.allocated_node:
        yield r.allocated_node
    elif isinstance(r, CliqueRecord):
        for node, _ in r.members:
            yield node
    elif isinstance(r, HyperNodeRecord):
        yield from r.nodes


def _names_nodes_by_rule(*records: Record | None) -> bool:
    """Whether a HyperNode holds nodes other than by name (a pattern, labels, HyperNodes below
    it): a change to it may change any node's domains."""
    return any(
        isinstance(r, HyperNodeRecord) and bool(r.patterns or r.label_selectors or r.children)
        for r in records
    )


_DRA_TYPES = (DeviceClassRecord, SliceRecord, ClaimRecord, ClaimTemplateRecord)
#: the sources of the levels and the filled-in labels (a PodGroup changes gangs, read with M)
_FABRIC_TYPES = (KueueTopologyRecord, KaiTopologyRecord, CliqueRecord, HyperNodeRecord)


def is_pending(p: PodRecord) -> bool:
    """Not bound to a node, not finished, not being deleted (`ClusterCache.pending_pods`)."""
    return not p.node and not p.terminated and not p.deleting


def has_live_claims(p: PodRecord) -> bool:
    """Not finished and asking for resource claims (`ClusterCache.claim_pods`)."""
    return not p.terminated and bool(p.claims)


class ClusterCache:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.pods: dict[str, PodRecord] = {}
        self.pdbs: dict[str, PdbRecord] = {}
        self.nrts: dict[str, NrtRecord] = {}
        self.device_classes: dict[str, DeviceClassRecord] = {}
        self.slices: dict[str, SliceRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.claim_templates: dict[str, ClaimTemplateRecord] = {}
        #: the fabric's sources (docs/fabric.md), and a count of their changes (what the
        #: reconciler's levels and cliques were built from)
        self.kueue_topologies: dict[str, KueueTopologyRecord] = {}
        self.kai_topologies: dict[str, KaiTopologyRecord] = {}
        self.cliques: dict[str, CliqueRecord] = {}
        self.hypernodes: dict[str, HyperNodeRecord] = {}
        #: Volcano's PodGroups (gangs where their networkTopology is hard), by namespace/name
        self.pod_groups: dict[str, PodGroupRecord] = {}
        #: Kueue's Workloads, by namespace/name (`kueue_held`)
        self.workloads: dict[str, WorkloadRecord] = {}
        self.fabric_version = 0
        self.pods_by_node: dict[str, dict[str, PodRecord]] = defaultdict(dict)
        self.slices_by_node: dict[str, dict[str, SliceRecord]] = defaultdict(dict)
        self.claims_by_node: dict[str, dict[str, ClaimRecord]] = defaultdict(dict)
        #: pods by key as `is_pending` and `has_live_claims` say, kept per change; `_order` is
        #: each pod's place in `pods` (its insertion), so the indexes read in the table's order
        self._pending: dict[str, PodRecord] = {}
        self._claimed: dict[str, PodRecord] = {}
        self._order: dict[str, int] = {}
        self._next = 0
        #: the cluster's DRA view over the live indexes (invalidated as objects change)
        self.dra = DraContext(
            self.device_classes,
            self.claims,
            self.claim_templates,
            self.slices_by_node,
            self.claims_by_node,
        )

    def _table(self, kind: Kind) -> dict[str, Record]:
        tables: dict[str, dict[str, Record]] = {
            "Node": self.nodes,  # type: ignore[dict-item]
            "Pod": self.pods,  # type: ignore[dict-item]
            "PodDisruptionBudget": self.pdbs,  # type: ignore[dict-item]
            "NodeResourceTopology": self.nrts,  # type: ignore[dict-item]
            "DeviceClass": self.device_classes,  # type: ignore[dict-item]
            "ResourceSlice": self.slices,  # type: ignore[dict-item]
            "ResourceClaim": self.claims,  # type: ignore[dict-item]
            "ResourceClaimTemplate": self.claim_templates,  # type: ignore[dict-item]
            "KueueTopology": self.kueue_topologies,  # type: ignore[dict-item]
            "KaiTopology": self.kai_topologies,  # type: ignore[dict-item]
            "ComputeDomainClique": self.cliques,  # type: ignore[dict-item]
            "HyperNode": self.hypernodes,  # type: ignore[dict-item]
            "PodGroup": self.pod_groups,  # type: ignore[dict-item]
            "KueueWorkload": self.workloads,  # type: ignore[dict-item]
        }
        return tables[kind]

    def records(self, kind: Kind) -> list[Record]:
        """Every record of one kind the cache holds (a list of its own)."""
        return list(self._table(kind).values())

    def _dra_index(self, old: Record | None, new: Record | None) -> set[str]:
        """Keep the DRA indexes current for one change; returns the nodes it dirties. A class
        or template can change any DRA node's shapes, so every node with slices is dirtied."""
        rec = new if new is not None else old
        if isinstance(rec, SliceRecord):
            nodes: set[str] = set()
            if isinstance(old, SliceRecord):
                for n in slice_nodes(old):
                    nodes.add(n)
                    self.slices_by_node[n].pop(old.name, None)
                    if not self.slices_by_node[n]:
                        del self.slices_by_node[n]
            if isinstance(new, SliceRecord):
                for n in slice_nodes(new):
                    nodes.add(n)
                    self.slices_by_node[n][new.name] = new
            self.dra.invalidate(nodes, devices=True)
            return nodes
        if isinstance(rec, ClaimRecord):
            nodes = set()
            if isinstance(old, ClaimRecord) and old.allocated_node:
                self.claims_by_node[old.allocated_node].pop(old.key, None)
                nodes.add(old.allocated_node)
            if isinstance(new, ClaimRecord) and new.allocated_node:
                self.claims_by_node[new.allocated_node][new.key] = new
                nodes.add(new.allocated_node)
            self.dra.invalidate(nodes)
            return nodes
        if isinstance(rec, DeviceClassRecord | ClaimTemplateRecord):
            self.dra.invalidate(devices=True)
            return set(self.slices_by_node)
        return set()

    def _put(self, r: Record) -> set[str]:
        kind = record_kind(r)
        key = record_key(r)
        old = self._table(kind).get(key)
        self._table(kind)[key] = r
        dirty = set(_nodes_of(r))
        if old is not None:
            dirty.update(_nodes_of(old))
        if isinstance(r, _DRA_TYPES):
            dirty |= self._dra_index(old, r)
        if isinstance(r, _FABRIC_TYPES):
            self.fabric_version += 1
            dirty &= self.nodes.keys()  # a clique's nodes this cluster has (a node comes later)
            if _names_nodes_by_rule(r, old):
                dirty |= self.nodes.keys()
        if isinstance(r, PodRecord):
            if isinstance(old, PodRecord) and old.node and old.node != r.node:
                self.pods_by_node[old.node].pop(key, None)
            if r.node:
                self.pods_by_node[r.node][key] = r
            self._index_pod(key, r, new=old is None)
        return dirty

    def _index_pod(self, key: str, p: PodRecord | None, new: bool = False) -> None:
        if p is None:
            self._order.pop(key, None)
        elif new:
            self._order[key] = self._next
            self._next += 1
        for index, belongs in ((self._pending, is_pending), (self._claimed, has_live_claims)):
            if p is not None and belongs(p):
                index[key] = p
            else:
                index.pop(key, None)

    def _delete(self, r: Record) -> set[str]:
        kind = record_kind(r)
        key = record_key(r)
        old = self._table(kind).pop(key, None)
        dirty = set(_nodes_of(r))
        if old is not None:
            dirty.update(_nodes_of(old))
            if isinstance(old, _DRA_TYPES):
                dirty |= self._dra_index(old, None)
            if isinstance(old, _FABRIC_TYPES):
                self.fabric_version += 1
                dirty &= self.nodes.keys()
                if _names_nodes_by_rule(old):
                    dirty |= self.nodes.keys()
            if isinstance(old, PodRecord):
                if old.node:
                    self.pods_by_node[old.node].pop(key, None)
                self._index_pod(key, None)
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

    def _in_order(self, index: dict[str, PodRecord]) -> list[PodRecord]:
        order = self._order
        return [index[k] for k in sorted(index, key=order.__getitem__)]

    def pending_pods(self) -> list[PodRecord]:
        """The pods `is_pending` says, in `pods`' order."""
        return self._in_order(self._pending)

    def waiting_for_room(self) -> list[PodRecord]:
        """The pending pods (`pending_pods`) that wait for room: marked unschedulable (or held
        back by Kueue for a domain, `gangs.kueue_waiting`), and not held back for something
        room does not give, or that pyctl cannot make (`held`)."""
        held = self.held()
        return [p for p in self.pending_pods() if p.unschedulable and p.key not in held]

    def held(self) -> dict[str, str]:
        """Pod (namespace/name) -> why pyctl makes no room for it, in a sentence (`pyctl plan`,
        `pyctl explain`): `kueue_held`, else `volcano_held`."""
        kueue = {
            k: f"Kueue holds its Workload back for what no eviction gives: {why}"
            for k, why in self.kueue_held().items()
        }
        return {**self.volcano_held(), **kueue}

    def volcano_held(self) -> dict[str, str]:
        """Pending pod (namespace/name) -> why, for the pods of a Volcano PodGroup with
        `subGroupPolicy` entries pyctl cannot read (`PodGroupRecord.sub_unread`): which of its
        pods share a domain is not known, so room made for them could be room Volcano does not
        use."""
        unread = {k: g.sub_unread for k, g in self.pod_groups.items() if g.sub_unread}
        if not unread:
            return {}
        out: dict[str, str] = {}
        for p in self.pending_pods():
            n = unread.get(f"{p.namespace}/{p.pod_group}") if p.pod_group else None
            if n:
                entries = "entry" if n == 1 else "entries"
                out[p.key] = (
                    f"Volcano PodGroup {p.pod_group}: {n} subGroupPolicy {entries} pyctl cannot "
                    "read (which of its pods must share a domain is not known)"
                )
        return out

    def kueue_held(self) -> dict[str, str]:
        """Pod (namespace/name) -> why Kueue holds its Workload back, for the pods whose Workload
        waits for something room does not give (quota, say; `gangs.kueue_held`):
        no eviction admits them."""
        return {
            f"{w.namespace}/{pod}": w.held
            for w in self.workloads.values()
            if w.held
            for pod in w.pods
        }

    def pending_count(self) -> int:
        return len(self._pending)

    def claim_pods(self) -> list[PodRecord]:
        """The pods `has_live_claims` says, in `pods`' order."""
        return self._in_order(self._claimed)
