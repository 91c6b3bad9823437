"""Which pods may be moved: the descheduler's DefaultEvictor rules, with the same knobs
(configuration section `evictor`, `docs/placement.md`).

Never evicted, whatever the settings: pods annotated `pyctl.io/evict: "false"` (or the
descheduler's `descheduler.alpha.kubernetes.io/evict: "false"`), pods not running on a node,
mirror (static) pods, bare pods (no controller would recreate them), DaemonSet pods. Then, unless
annotated `"true"`: namespaces (include/exclude), the label selector, system-critical priority,
a priority threshold, local storage, PersistentVolumeClaims, the owner's replica count, the pod's
age. PodDisruptionBudgets are checked separately (`pdb_allows`); the API server has the last
word (an eviction refused with 429 is retried later).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from pyctl.cluster.records import PdbRecord, PodRecord, Selector
from pyctl.cluster.selectors import matches, parse_selector

SYSTEM_CRITICAL_PRIORITY = 2_000_000_000


@dataclass(frozen=True)
class EvictorOptions:
    #: only pods of these namespaces (empty: every namespace)
    namespaces: tuple[str, ...] = ()
    #: namespaces never touched
    excluded_namespaces: tuple[str, ...] = ("kube-system",)
    #: only pods matching this label selector (`kubectl -l` syntax; empty: every pod)
    label_selector: str = ""
    evict_system_critical_pods: bool = False
    #: pods at or above this priority are not evicted (None: no threshold)
    priority_threshold: int | None = None
    evict_local_storage_pods: bool = False
    #: pods with PersistentVolumeClaims (or generic ephemeral volumes)
    evict_pvc_pods: bool = False
    #: an owner must have at least this many pods for one to be evicted
    min_replicas: int = 1
    #: pods younger than this are not evicted (0: any age)
    min_pod_age_seconds: float = 0.0

    def __post_init__(self) -> None:
        parse_selector(self.label_selector)  # raises a readable error on a bad selector

    @cached_property
    def selector(self) -> Selector | None:
        return parse_selector(self.label_selector) if self.label_selector else None


def pdb_matches(pdb: PdbRecord, pod: PodRecord) -> bool:
    """Whether the budget covers the pod (its namespace, and its selector, which must select
    something: an empty selector selects nothing in policy/v1 PodDisruptionBudgets)."""
    if pdb.namespace != pod.namespace or not (pdb.match_labels or pdb.match_expressions):
        return False
    return matches(Selector(pdb.match_labels, pdb.match_expressions), dict(pod.labels))


class Evictor:
    def __init__(
        self,
        options: EvictorOptions,
        pods: Iterable[PodRecord],
        pdbs: Iterable[PdbRecord] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.options = options
        self.pdbs = list(pdbs)
        self.clock = clock
        # budgets by namespace (only those whose selector selects something), and which cover
        # a pod, per (namespace, labels): the pods of one workload share their labels
        self._by_ns: dict[str, list[PdbRecord]] = {}
        for b in self.pdbs:
            if b.match_labels or b.match_expressions:
                self._by_ns.setdefault(b.namespace, []).append(b)
        self._covering: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[PdbRecord, ...]] = {}
        self._headroom: dict[tuple[str, tuple[tuple[str, str], ...]], int | None] = {}
        self._facts: dict[
            tuple[str, str, str, tuple[tuple[str, str], ...]],
            tuple[bool, tuple[str, ...], int | None],
        ] = {}
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
        if p.mirror:
            return "mirror (static) pod"
        if not p.owner_kind:
            return "bare pod (no controller would recreate it)"
        if p.owner_kind == "DaemonSet":
            return "DaemonSet pod"
        if p.namespace in o.excluded_namespaces:
            return f"namespace {p.namespace} is excluded"
        if o.namespaces and p.namespace not in o.namespaces:
            return f"namespace {p.namespace} is not one of the evictor's namespaces"
        if forced:
            return None
        if o.selector is not None and not matches(o.selector, dict(p.labels)):
            return f"does not match the label selector {o.label_selector!r}"
        critical = p.priority >= SYSTEM_CRITICAL_PRIORITY or p.priority_class.startswith("system-")
        if critical and not o.evict_system_critical_pods:
            return "system-critical pod"
        if o.priority_threshold is not None and p.priority >= o.priority_threshold:
            return f"priority {p.priority} at or above the threshold"
        if p.local_storage and not o.evict_local_storage_pods:
            return "uses local storage"
        if p.pvc and not o.evict_pvc_pods:
            return "uses a PersistentVolumeClaim"
        if self.facts(p)[0]:  # the owner's replicas, read through `facts` (what rounds keep)
            return f"owner has fewer than {o.min_replicas} replicas"
        if o.min_pod_age_seconds > 0 and p.created > 0:
            age = self.clock() - p.created
            if age < o.min_pod_age_seconds:
                return f"younger than {o.min_pod_age_seconds:g} s"
        return None

    def covering(self, p: PodRecord) -> tuple[PdbRecord, ...]:
        """The budgets that cover `p`, in the order they were given."""
        key = (p.namespace, p.labels)
        hit = self._covering.get(key)
        if hit is None:
            hit = tuple(b for b in self._by_ns.get(p.namespace, ()) if pdb_matches(b, p))
            self._covering[key] = hit
        return hit

    def pdb_headroom(self, p: PodRecord) -> int | None:
        """The disruptions every budget covering `p` allows now (the smallest); None when no
        budget covers it."""
        key = (p.namespace, p.labels)
        if key in self._headroom:
            return self._headroom[key]
        allowed = [b.disruptions_allowed for b in self.covering(p)]
        got = min(allowed) if allowed else None
        self._headroom[key] = got
        return got

    def pdb_allows(self, p: PodRecord) -> bool:
        """Whether every PodDisruptionBudget covering `p` has budget left now (the API server has
        the last word: an eviction refused with 429 is retried later)."""
        h = self.pdb_headroom(p)
        return h is None or h > 0

    def facts(self, p: PodRecord) -> tuple[bool, tuple[str, ...], int | None]:
        """What the verdict on `p` (`why_not`, `pdb_allows`) and its budget read beyond `p`
        itself, the options and the clock: whether its owner has fewer than `min_replicas` pods,
        the budgets that cover it, and the disruptions they allow now. Pods of one owner with the
        same labels share them."""
        key = (p.namespace, p.owner_kind, p.owner_name, p.labels)
        hit = self._facts.get(key)
        if hit is None:
            short = self.replicas[key[:3]] < self.options.min_replicas
            hit = short, tuple(b.key for b in self.covering(p)), self.pdb_headroom(p)
            self._facts[key] = hit
        return hit

    def holds_until(self, p: PodRecord) -> float:
        """Until when the verdict on `p` holds with time alone: the clock time it comes of age
        (`min_pod_age_seconds`) if it is younger now, else forever (inf)."""
        age = self.options.min_pod_age_seconds
        if age > 0 and p.created > 0 and self.clock() - p.created < age:
            return p.created + age
        return math.inf

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
