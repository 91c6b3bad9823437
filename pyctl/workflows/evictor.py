"""Which pods may be moved: the descheduler's DefaultEvictor rules, with the same knobs
(`shared/docs/traces_and_compaction.md` §4.3)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyctl.cluster.records import PdbRecord, PodRecord

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000


@dataclass(frozen=True)
class EvictorOptions:
    evict_local_storage_pods: bool = False
    evict_system_critical_pods: bool = False
    #: pods at or above this priority are not evicted (None: no threshold)
    priority_threshold: int | None = None
    #: an owner must have at least this many pods for one to be evicted
    min_replicas: int = 1
    #: namespaces never touched
    excluded_namespaces: tuple[str, ...] = ("kube-system",)


def _pdb_matches(pdb: PdbRecord, pod: PodRecord) -> bool:
    labels = dict(pod.labels)
    return (
        pdb.namespace == pod.namespace
        and bool(pdb.match_labels)
        and all(labels.get(k) == v for k, v in pdb.match_labels)
    )


class Evictor:
    def __init__(
        self,
        options: EvictorOptions,
        pods: Iterable[PodRecord],
        pdbs: Iterable[PdbRecord] = (),
    ) -> None:
        self.options = options
        self.pdbs = list(pdbs)
        self.replicas: Counter[tuple[str, str, str]] = Counter(
            (p.namespace, p.owner_kind, p.owner_name)
            for p in pods
            if p.owner_name and not p.terminated
        )

    def why_not(self, p: PodRecord) -> str | None:
        """None if `p` may be evicted, else the reason it may not."""
        o = self.options
        if p.evict_annotation == "false":
            return "annotated not to be evicted"
        forced = p.evict_annotation == "true"
        if not p.node or p.terminated or p.deleting:
            return "not running on a node"
        if p.namespace in o.excluded_namespaces:
            return f"namespace {p.namespace} is excluded"
        if p.mirror:
            return "mirror (static) pod"
        if not p.owner_kind:
            return "bare pod (no controller would recreate it)"
        if p.owner_kind == "DaemonSet":
            return "DaemonSet pod"
        if forced:
            return None
        critical = p.priority >= SYSTEM_CRITICAL_PRIORITY or p.priority_class.startswith("system-")
        if critical and not o.evict_system_critical_pods:
            return "system-critical pod"
        if p.local_storage and not o.evict_local_storage_pods:
            return "uses local storage"
        if o.priority_threshold is not None and p.priority >= o.priority_threshold:
            return f"priority {p.priority} at or above the threshold"
        if self.replicas[(p.namespace, p.owner_kind, p.owner_name)] < o.min_replicas:
            return f"owner has fewer than {o.min_replicas} replicas"
        return None

    def pdb_allows(self, p: PodRecord) -> bool:
        """Whether every PodDisruptionBudget covering `p` has budget left now (the API server has
        the last word: an eviction refused with 429 is retried later)."""
        return all(b.disruptions_allowed > 0 for b in self.pdbs if _pdb_matches(b, p))

    def movable(self, pods: Iterable[PodRecord]) -> tuple[list[PodRecord], Mapping[str, str]]:
        ok: list[PodRecord] = []
        refused: dict[str, str] = {}
        for p in pods:
            why = self.why_not(p)
            if why is None and not self.pdb_allows(p):
                why = "PodDisruptionBudget has no budget left"
            if why is None:
                ok.append(p)
            else:
                refused[p.key] = why
        return ok, refused
