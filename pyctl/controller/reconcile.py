"""Level-triggered reconcile: a dirty node is re-translated from the cache and re-scored by the
core; the cluster summary (totals, categories, pending pods blocked by fragmentation, the
scheduling success rate) is recomputed from the per-node scores at a bounded rate.

Nothing here reads watch events or talks to Redis: it reads the cache and writes scores and metrics.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Final

from pyctl.cluster.dra.claims import unknown_kind
from pyctl.cluster.dra.context import Misaligned, misaligned_pods
from pyctl.cluster.dra.zones import DraModel
from pyctl.cluster.gangs import gangs_of
from pyctl.cluster.records import NodeRecord, ObjectRef, PodRecord
from pyctl.cluster.translate import (
    DraPositions,
    TranslateError,
    model_of,
    pod_shape_problem,
    shape_of,
)
from pyctl.controller.cache import ClusterCache
from pyctl.controller.domains import DomainIdle
from pyctl.controller.fabric_sources import (
    CliqueFill,
    fabric_levels,
    node_labels,
    object_cliques,
    volcano_gangs,
)
from pyctl.controller.ignored import IgnoredObjects
from pyctl.controller.summary import MAX_LEFT_OUT, Summary
from pyctl.controller.workload import WorkloadScope, capped_workload
from pyctl.core.fabric import DEFAULT_LEVELS, FabricScore, Levels, fabric_score, levels_for
from pyctl.core.fragmentation import (
    CATEGORIES,
    FragmentationModel,
    NodeScore,
    admits,
    derive_workload,
    too_full_for,
)
from pyctl.metrics import Metrics
from pyctl.model import DEFAULT_TOPOLOGY_POLICY, Node, Shape, Snapshot, Workload

log = logging.getLogger("pyctl.controller")

#: the prefix of the taints pyctl puts on nodes (exported as pyctl_node_taint)
PYCTL_TAINT_PREFIX = "pyctl.io/"

GPU = 1000.0
#: topology domains exported as metrics, the most fragmented first (a bound on cardinality)
MAX_EXPORTED_DOMAINS = 512
#: seconds between two fabric passes (also when M changes); the `fabric_interval` setting's default
FABRIC_INTERVAL: Final = 10.0

#: what the summary adds up of one scored node: its name, GPU model, idle and fragment GPU
#: milli, idle, fragment and recoverable MIG slices, then its fragment by category (CATEGORIES)
_Row = tuple[Any, ...]
_IDLE, _FRAG, _MIG_IDLE, _MIG_FRAG, _MIG_RECOV, _CATS = 2, 3, 4, 5, 6, 7


def _row(node: Node, s: NodeScore) -> _Row:
    return (
        s.name,
        node.gpu_model or "unknown",
        s.idle_gpu_milli,
        s.fragment_gpu_milli,
        s.idle_mig_slices,
        s.fragment_mig_slices,
        s.recoverable_mig_slices,
        *(s.categories[c] for c in CATEGORIES),
    )


class SchedulingWindow:
    """Pods bound vs. pods marked Unschedulable over a sliding window (the seed's 95% threshold)."""

    def __init__(self, seconds: float = 300.0) -> None:
        self.seconds = seconds
        self._events: deque[tuple[float, bool]] = deque()
        #: how many of `_events` are bindings (kept as events come and go)
        self._ok = 0
        self._bound: set[str] = set()
        self._unschedulable: set[str] = set()

    def observe(self, old: PodRecord | None, new: PodRecord | None, now: float) -> None:
        if new is None:
            if old is not None:
                self._bound.discard(old.key)
                self._unschedulable.discard(old.key)
            return
        key = new.key
        if new.node and key not in self._bound:
            self._bound.add(key)
            self._unschedulable.discard(key)
            self._events.append((now, True))
            self._ok += 1
        elif not new.node and new.unschedulable and key not in self._unschedulable:
            self._unschedulable.add(key)
            self._events.append((now, False))

    def ratio(self, now: float) -> float:
        while self._events and self._events[0][0] < now - self.seconds:
            self._ok -= self._events.popleft()[1]
        total = len(self._events)
        return self._ok / total if total else 1.0


#: how far a shape's weight in M may move before the re-derived M replaces the one in use
WORKLOAD_TOLERANCE = 0.02


def same_workload(a: Workload, b: Workload, tolerance: float = WORKLOAD_TOLERANCE) -> bool:
    """Whether two derived workloads are the same for scoring: the same shapes, each weight
    within `tolerance`. M is re-derived from the pods at a slow rate and each change re-scores
    every node; pods coming and going move the weights by a hair all the time, which says
    nothing new about the workload."""
    wa = {s.key(): s.weight for s in a.shapes}
    wb = {s.key(): s.weight for s in b.shapes}
    return wa.keys() == wb.keys() and all(abs(wa[k] - wb[k]) <= tolerance for k in wa)


class _ShapeView:
    """One pending shape on every modelled node: whether the node admits it and its fragment
    by category (the node scored for that shape alone), with the cluster's totals, kept up to
    date node by node as the reconciler re-scores nodes."""

    REFRESH = 256  # summaries between two exact recounts of the totals

    def __init__(self, shape: Shape) -> None:
        self.workload = Workload((replace(shape, weight=1.0),))
        self.mig = shape.mig_profile is not None
        self.per_node: dict[str, tuple[bool, tuple[float, ...]]] = {}
        self.admitted = 0
        self.totals = [0.0] * len(CATEGORIES)
        self.updates = 0

    def _drop(self, name: str) -> None:
        old = self.per_node.pop(name, None)
        if old is not None:
            self.admitted -= old[0]
            for i, v in enumerate(old[1]):
                self.totals[i] -= v

    def update(self, models: dict[str, Node], names: Iterable[str]) -> None:
        present = []
        for name in names:
            self._drop(name)
            if name in models:
                present.append(name)
        if present:
            r = FragmentationModel(Snapshot(tuple(models[n] for n in present))).score(self.workload)
            for name, ns in zip(present, r.nodes, strict=True):
                ok = admits(ns)
                cats = ns.mig_categories if self.mig else ns.categories
                row = tuple(cats[c] for c in CATEGORIES)
                self.per_node[name] = (ok, row)
                self.admitted += ok
                for i, v in enumerate(row):
                    self.totals[i] += v
        self.updates += 1
        if self.updates % self.REFRESH == 0:  # float sums drift: recount exactly now and then
            rows = [r for _, r in self.per_node.values()]
            self.totals = [sum(r[i] for r in rows) for i in range(len(CATEGORIES))]

    def reason(self) -> str | None:
        """None when some node admits the shape; else the category stranding the most."""
        if self.admitted > 0:
            return None
        return max(zip(CATEGORIES, self.totals, strict=True), key=lambda cv: cv[1])[0]


class Reconciler:
    def __init__(
        self,
        cache: ClusterCache,
        metrics: Metrics,
        cluster: str,
        workload: Workload | None = None,
        default_policy: str = DEFAULT_TOPOLOGY_POLICY,
        scope: WorkloadScope | None = None,
        ignored: IgnoredObjects | None = None,
    ) -> None:
        self.cache = cache
        self.metrics = metrics
        self.cluster = cluster
        self.fixed_workload = workload
        self.default_policy = default_policy
        self.workload = workload or Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000),))
        #: True until M has been derived from observed pods (then refreshed at a slow rate)
        self.workload_unset = workload is None
        #: which pods shape M, and the cap on one shape's weight
        self.scope = scope or WorkloadScope()
        self.ignored = ignored or IgnoredObjects(metrics, cluster)
        self.models: dict[str, Node] = {}
        self.scores: dict[str, NodeScore] = {}
        #: the fabric pass (docs/fabric.md): the levels it reads, how often it runs, its last
        #: result (None: no node carries a level's label and M has no gang)
        self.fabric_levels: tuple[str, ...] = DEFAULT_LEVELS
        self.fabric_interval = FABRIC_INTERVAL
        self.fabric_last: FabricScore | None = None
        self._fabric_at = -math.inf
        self._fabric_workload: Workload | None = None
        self._domain_labels: set[tuple[str, str]] = set()
        self._level_labels: set[str] = set()
        self._gang_labels: set[tuple[str, str]] = set()
        #: the levels and cliques of Topology and ComputeDomainClique objects (fabric_sources.py),
        #: for the cache's `fabric_version` and the configured levels they were built from
        self._sources: tuple[int, tuple[str, ...], Levels, CliqueFill] | None = None
        self._source_labels: set[tuple[str, str]] = set()
        #: each domain's idle GPU, node by node: the placement advice's tie order (domains.py)
        self._domain_idle = DomainIdle()
        self._domain_idle_for: tuple[Workload, tuple[str, ...]] | None = None
        self.bad_nodes: dict[str, str] = {}
        #: node -> pyctl taint keys exported as pyctl_node_taint
        self._taints: dict[str, set[str]] = {}
        self.window = SchedulingWindow()
        #: DRA: each DRA node's devices as modelled (zones' basis, notes)
        self.dra_models: dict[str, DraModel] = {}
        #: per node, where each pod's DRA devices sit (translation's finding, for compaction)
        self.dra_positions: dict[str, DraPositions] = {}
        #: pods whose claims pyctl cannot turn into a shape, with why (refreshed by `summary`)
        self.unknown: dict[str, str] = {}
        #: running pods whose allocated devices span NUMA nodes (refreshed by `summary`)
        self.misaligned: list[Misaligned] = []
        self._misaligned_labels: set[tuple[str, str]] = set()
        self._unknown_labels: set[str] = set()
        #: per scored node, in `scores`' order, what the summary adds up of it (`_row`)
        self._rows: dict[str, _Row] = {}
        #: nodes re-scored (or gone) since the last summary, and the pending shapes' views
        self._touched: set[str] = set()
        self._shape_views: dict[Shape, _ShapeView] = {}
        #: called with (name, model node, the node alone as scored) after each node scored, on
        #: the reconciling thread (e.g. the extender's ranks, computed ahead); what a listener
        #: raises is logged, the node's score stands
        self.on_scored: list[Callable[[str, Node, FragmentationModel], None]] = []

    def shape_of(self, p: PodRecord) -> Shape | None:
        """The pod's shape (its claims resolved); None if pyctl cannot tell (recorded)."""
        s = shape_of(p, self.cache.dra, self.cache.nodes.get(p.node))
        if s is None:
            self.unknown[p.key] = self.cache.dra.need(p.namespace, p.claims).unknown
        else:
            self.unknown.pop(p.key, None)
        return s

    def pending_shapes(self) -> list[Shape]:
        """The GPU shapes of the pods waiting for a node that the scheduler has not found
        unschedulable (those it, and its extender, place next; an unschedulable pod is tried
        again on a cluster event or after a backoff, and its shape is hot once it asks), the
        most common first; pods whose shape pyctl cannot tell or the core cannot model are left
        out (without being reported: the summary reports them)."""
        counts: Counter[Shape] = Counter()
        dra, nodes = self.cache.dra, self.cache.nodes
        for p in self.cache.pending_pods():
            if p.unschedulable:
                continue
            s = shape_of(p, dra, nodes.get(p.node))
            if s is not None and not s.is_cpu_only and pod_shape_problem(p, s) is None:
                counts[s] += 1
        return [s for s, _ in counts.most_common()]

    def modelled_shape(self, p: PodRecord) -> Shape | None:
        """The pod's shape if the core can model it; None if its claims are unknown (recorded
        in `unknown`) or the core cannot model it (reported: counted, logged, an Event), so that
        it is left out of M, of the pending pods and of the compaction candidates."""
        s = self.shape_of(p)
        if s is None:
            return None
        why = pod_shape_problem(p, s)
        if why is None:
            return s
        ref = ObjectRef("Pod", p.namespace, p.name, p.uid)
        self.ignored.report("Pod", "shape_rejected", why, ref)
        return None

    def modelled(self, p: PodRecord) -> bool:
        """Whether `p` has a shape the core can model (`modelled_shape`)."""
        return self.modelled_shape(p) is not None

    def refresh_workload(self) -> bool:
        """Re-derive M from the observed pods in scope (unless it is configured), each shape's
        weight capped; True if it changed, in which case every node must be re-scored."""
        if self.fixed_workload is not None:
            return False
        # GPU and MIG pods only: a CPU-only shape would count every idle GPU as fragment (FGD's
        # definition), which says nothing about GPU placement on a mixed pool
        shapes = []
        gangs = gangs_of(
            self.cache.pods.values(),
            volcano_gangs(self.cache.pod_groups.values(), self.fabric_sources()[1].hypernodes),
        )
        for p in self.cache.pods.values():
            if p.terminated or not self.scope.admits(p):
                continue
            s = self.modelled_shape(p)
            if s is not None and not s.is_cpu_only:
                g = gangs.get(p.key)
                shapes.append(s if g is None else replace(s, gang=g))
        if not shapes:
            return False
        new = capped_workload(derive_workload(shapes), self.scope.max_shape_weight)
        try:  # every shape passed the core's check: this cannot fail, but M is shared by all
            FragmentationModel(Snapshot(())).score(new)
        except ValueError as e:
            log.error(
                "derived workload refused by the core; kept the last", extra={"error": str(e)}
            )
            return False
        first = self.workload_unset
        self.workload_unset = False
        if new == self.workload or (not first and same_workload(new, self.workload)):
            return False
        self.workload = new
        return True

    def _export_taints(self, name: str, rec: NodeRecord | None) -> None:
        """pyctl_node_taint{node, key}: pyctl's own taints as the API shows them (so a taint
        left behind is seen, and alerted on, whatever process put it there)."""
        now = (
            {t.key for t in rec.taints if t.key.startswith(PYCTL_TAINT_PREFIX)}
            if rec is not None
            else set()
        )
        before = self._taints.get(name, set())
        if now == before:
            return
        g = self.metrics.node_taint
        for key in before - now:
            g.remove(self.cluster, name, key)
        for key in now - before:
            g.labels(self.cluster, name, key).set(1)
        if now:
            self._taints[name] = now
        else:
            self._taints.pop(name, None)

    def reconcile(self, name: str) -> None:
        """Re-translate and re-score one node (raises on a failure, for the queue to retry)."""
        t0 = time.perf_counter()
        rec = self.cache.nodes.get(name)
        m = self.metrics
        self._touched.add(name)
        self._export_taints(name, rec)
        if rec is None:
            self.models.pop(name, None)
            self._domain_idle.update(name, None, 0)
            self.dra_models.pop(name, None)
            self.dra_positions.pop(name, None)
            old = self.scores.pop(name, None)
            self._rows.pop(name, None)
            if self.bad_nodes.pop(name, None) is not None:
                self.ignored.forget("Node", name)
            if old is not None:
                m.node_idle.remove(self.cluster, name)
                m.node_fragment.remove(self.cluster, name)
                for z in old.zones:
                    m.zone_idle.remove(self.cluster, name, str(z.numa))
                    m.zone_fragment.remove(self.cluster, name, str(z.numa))
            return
        positions: DraPositions = {}
        try:
            node, dm = model_of(
                rec,
                self.cache.nrts.get(name),
                self.cache.pods_on(name),
                self.default_policy,
                self.cache.dra,
                positions,
                # shared GPUs: replicas stay on the GPUs they were attributed to
                self.models.get(name),
            )
            alone = FragmentationModel(Snapshot((node,)))
            score = alone.score(self.workload).nodes[0]
        except (TranslateError, ValueError) as e:
            # a node pyctl cannot understand: counted once, kept out of the totals; the other
            # nodes are scored on their own and never see it
            if name not in self.bad_nodes:
                m.decode_errors.labels(self.cluster, "Node").inc()
            self.ignored.report("Node", "untranslatable", str(e), ObjectRef("Node", "", name))
            self.bad_nodes[name] = str(e)
            self.models.pop(name, None)
            self._domain_idle.update(name, None, 0)
            self.dra_models.pop(name, None)
            self.dra_positions.pop(name, None)
            old = self.scores.pop(name, None)
            self._rows.pop(name, None)
            if old is not None:
                m.node_idle.remove(self.cluster, name)
                m.node_fragment.remove(self.cluster, name)
                for z in old.zones:
                    m.zone_idle.remove(self.cluster, name, str(z.numa))
                    m.zone_fragment.remove(self.cluster, name, str(z.numa))
            return
        if self.bad_nodes.pop(name, None) is not None:
            self.ignored.forget("Node", name)
        previous = self.models.get(name)
        if previous is not None and previous == node:
            # the same node as before (a re-score under a new M, an event that changed nothing
            # pyctl models): the same object, so what is kept per model object (the extender's
            # ranks, the planning rounds' attributions, the federation encoder's bytes) stays
            node = previous
        self.models[name] = node
        self.scores[name] = score
        self._domain_idle.update(name, self._fabric_labels(name, rec), round(score.idle_gpu_milli))
        self._rows[name] = _row(node, score)
        if dm is not None:
            self.dra_models[name] = dm
            self.dra_positions[name] = positions
        else:
            self.dra_models.pop(name, None)
            self.dra_positions.pop(name, None)
        m.node_idle.labels(self.cluster, name).set(score.idle_gpu_milli / GPU)
        m.node_fragment.labels(self.cluster, name).set(score.fragment_gpu_milli / GPU)
        for z in score.zones:
            m.zone_idle.labels(self.cluster, name, str(z.numa)).set(z.idle_gpu_milli / GPU)
            m.zone_fragment.labels(self.cluster, name, str(z.numa)).set(z.fragment_gpu_milli / GPU)
        for listener in self.on_scored:
            try:
                listener(name, node, alone)
            except Exception:
                log.exception("a listener of scored nodes failed", extra={"node": name})
        m.reconcile_duration.labels(self.cluster).observe(time.perf_counter() - t0)

    def _blocked(
        self, pending: list[PodRecord], idle_gpu: float, idle_mig: float
    ) -> dict[str, int]:
        """Unschedulable pods that the idle capacity could hold in total but no node admits,
        by the reason that strands the most capacity for their shape, as `blocked_by` decides it.
        Each pending shape's view of the nodes is kept between summaries and updated for the
        nodes re-scored since the last one, so a summary costs what changed, not the cluster."""
        touched, self._touched = self._touched, set()
        if not pending or not self.models:
            self._shape_views.clear()
            return {}
        out: Counter[str] = Counter()
        by_shape: dict[Shape, str | None] = {}
        updated: set[Shape] = set()
        try:
            for p in pending:
                got = self.modelled_shape(p)
                if got is None or got.is_cpu_only:
                    continue
                shape = replace(got, weight=1.0)
                if shape not in by_shape:
                    if too_full_for(shape, idle_gpu, idle_mig):
                        by_shape[shape] = None  # the cluster is full, not fragmented
                    else:
                        view = self._shape_views.get(shape)
                        if view is None:
                            view = self._shape_views[shape] = _ShapeView(shape)
                            view.update(self.models, list(self.models))
                        else:
                            view.update(self.models, touched)
                        updated.add(shape)
                        # a node admits it: waiting, not blocked
                        by_shape[shape] = view.reason()
                reason = by_shape[shape]
                if reason is not None:
                    out[reason] += 1
        except ValueError as e:  # modelled_shape asked the core: not expected, never fatal
            log.error("pending analysis failed", extra={"error": str(e)[:300]})
            self._shape_views.clear()
            return {}
        # views not brought up to date this time (the shape is no longer pending, or the
        # cluster was simply full for it) are built anew when next needed
        for stale in [s for s in self._shape_views if s not in updated]:
            del self._shape_views[stale]
        return dict(out)

    def summary(self, now: float | None = None) -> Summary:
        """The cluster now. Its totals add up each scored node's row (kept by `reconcile`, in
        the order of `scores`, so every sum is the same as over the scores); the pending pods
        and the pods with claims come from the cache's indexes, never a walk over every pod."""
        now = time.monotonic() if now is None else now
        rows = list(self._rows.values())
        cols: list[tuple[Any, ...]] = (
            list(zip(*rows, strict=True)) if rows else [()] * (_CATS + len(CATEGORIES))
        )
        cats = {c: sum(cols[_CATS + i]) for i, c in enumerate(CATEGORIES)}
        idle_gpu, idle_mig = sum(cols[_IDLE]), sum(cols[_MIG_IDLE])
        pending = self.cache.waiting_for_room()
        blocked = self._blocked(pending, idle_gpu, idle_mig)
        by_model: dict[str, tuple[float, float]] = {}
        for r in rows:
            i, f = by_model.get(r[1], (0.0, 0.0))
            by_model[r[1]] = (i + r[_IDLE], f + r[_FRAG])
        shared = [g for n in self.models.values() if n.sharing for z in n.zones for g in z.gpus]
        worst = [
            (r[0], r[_IDLE], r[_FRAG])
            for r in heapq.nsmallest(10, rows, key=lambda r: (-r[_FRAG], r[0]))
        ]
        self._dra_summary()
        fab = self.fabric(now)
        frag = sum(cols[_FRAG])
        if fab is not None:
            cats["domain_split"] = fab.domain_split_gpu_milli
            cats["no_domain"] = fab.no_domain_gpu_milli
            frag += fab.domain_split_gpu_milli + fab.no_domain_gpu_milli
        left_out_count, left_out = self._left_out()
        summ = Summary(
            cluster=self.cluster,
            nodes=len(rows),
            idle_gpu_milli=idle_gpu,
            fragment_gpu_milli=frag,
            categories=cats,
            idle_mig_slices=idle_mig,
            fragment_mig_slices=sum(cols[_MIG_FRAG]),
            recoverable_mig_slices=sum(cols[_MIG_RECOV]),
            pending=self.cache.pending_count(),
            blocked=blocked,
            scheduling_success=self.window.ratio(now),
            worst=worst,
            by_model=by_model,
            shared_gpus=len(shared),
            shared_used_milli=float(sum(g.used_milli for g in shared)),
            shared_pods=len({pod for g in shared for pod, _ in g.holders}),
            left_out_count=left_out_count,
            left_out=left_out,
        )
        self._export(summ)
        return summ

    def fabric_sources(self) -> tuple[Levels, CliqueFill]:
        """The levels the fabric reads (the configured ones, then those of Kueue's and KAI's
        `Topology` objects and the HyperNodes' tiers) and the nodes' cliques from
        `ComputeDomainClique` objects and domains from HyperNodes (docs/fabric.md), built again
        when one of those objects or the configured levels change."""
        version = self.cache.fabric_version
        got = self._sources
        if got is None or got[0] != version or got[1] != self.fabric_levels:
            # each table copied in one step: the extender's threads may call this
            fill = object_cliques(
                list(self.cache.cliques.values()), list(self.cache.hypernodes.values())
            )
            got = self._sources = (
                version,
                self.fabric_levels,
                fabric_levels(
                    self.fabric_levels,
                    list(self.cache.kueue_topologies.values()),
                    list(self.cache.kai_topologies.values()),
                    fill.hypernodes.tiers,
                ),
                fill,
            )
        return got[2], got[3]

    def _fabric_labels(self, name: str, rec: NodeRecord) -> dict[str, str]:
        """A node's labels as the fabric reads them (its clique filled in from the objects)."""
        return node_labels(rec.labels, name, self.fabric_sources()[1])[0]

    def domain_idle(self) -> DomainIdle:
        """Each topology domain's idle GPU, at the fabric pass's levels (the configured ones,
        the `Topology` objects' and the gangs' keys), kept node by node as nodes are re-scored:
        the placement advice's tie order (`pyctl.controller.domains`). Built again when the
        levels change."""
        key = (self.workload, self.fabric_sources()[0].levels)
        if self._domain_idle_for is None or (
            self._domain_idle_for[0] is not key[0] or self._domain_idle_for[1] != key[1]
        ):
            levels = levels_for(self.workload, key[1])
            if levels != self._domain_idle.levels:
                self._domain_idle.relevel(
                    levels,
                    (  # read under the index's lock; the extender's threads may call this
                        (n, self._fabric_labels(n, rec), round(score.idle_gpu_milli))
                        for n in list(self.models)
                        if (rec := self.cache.nodes.get(n)) is not None
                        and (score := self.scores.get(n)) is not None
                    ),
                )
            self._domain_idle_for = key
        return self._domain_idle

    def fabric(self, now: float) -> FabricScore | None:
        """The fabric pass over every scored node (docs/fabric.md), at most every
        `fabric_interval` seconds unless M changed; None while no node carries a level's label
        and M has no gang. Its domains and levels are exported as metrics."""
        if now - self._fabric_at < self.fabric_interval and self._fabric_workload is self.workload:
            return self.fabric_last
        self._fabric_at = now
        self._fabric_workload = self.workload
        levels, fill = self.fabric_sources()
        keys = set(levels_for(self.workload, levels.levels))
        labels: dict[str, dict[str, str]] = {}
        said: Counter[str] = Counter()
        for name in self.models:
            rec = self.cache.nodes.get(name)
            if rec is not None:
                full, what = node_labels(rec.labels, name, fill)
                said[what] += 1
                if rec.sharing is not None and rec.sharing.links_error:
                    said["link_scores"] += 1
                dm = self.dra_models.get(name)
                if dm is not None and dm.links_left_out:
                    said["partitions"] += 1
                mine = {k: v for k, v in full.items() if k in keys}
                if mine:
                    labels[name] = mine
        self._export_sources(
            levels, fill, said["filled"], said["disagrees"], said["link_scores"], said["partitions"]
        )
        gangs = any(s.gang is not None for s in self.workload.shapes)
        if not labels and not gangs:
            self.fabric_last = None
        else:
            snap = Snapshot(tuple(self.models[n] for n in sorted(self.models)))
            try:
                self.fabric_last = fabric_score(
                    FragmentationModel(snap), self.workload, levels.levels, labels
                )
            except ValueError as e:  # the models and M passed the core already
                log.error("fabric pass failed; kept the last", extra={"error": str(e)[:300]})
        self._export_fabric(self.fabric_last)
        return self.fabric_last

    def _export_sources(
        self,
        levels: Levels,
        fill: CliqueFill,
        filled: int,
        disagree: int,
        link_scores: int = 0,
        partitions: int = 0,
    ) -> None:
        """Where the levels came from (`pyctl_level_source`), the nodes whose clique came from
        `ComputeDomainClique` objects, and what of those sources was left out (with the nodes
        whose link scores, HAMi's `hami.io/node-nvidia-score`, or whose Fabric Manager
        partitions, the DRA driver's `partitionN`, were left out)."""
        m, c = self.metrics, self.cluster
        now = {(lv, levels.origin[lv]) for lv in levels.levels}
        for gone in self._source_labels - now:
            m.level_source.remove(c, *gone)
        for k in now:
            m.level_source.labels(c, *k).set(1)
        self._source_labels = now
        m.clique_filled_nodes.labels(c).set(filled)
        for problem, n in (
            ("levels_past_bound", levels.dropped),
            ("clique_objects_past_bound", fill.objects_left_out),
            ("clique_daemons_unread", fill.items_left_out),
            ("clique_conflicts", fill.conflicts),
            ("clique_label_disagrees", disagree),
            ("hypernodes_past_bound", fill.hypernodes.objects_left_out),
            ("hypernode_members_unread", fill.hypernodes.items_left_out),
            ("hypernode_patterns_past_bound", fill.hypernodes.patterns_left_out),
            ("hypernode_conflicts", fill.hypernodes.conflicts),
            ("link_scores_left_out", link_scores),
            ("fm_partitions_left_out", partitions),
        ):
            m.fabric_source_problems.labels(c, problem).set(n)

    def _export_fabric(self, f: FabricScore | None) -> None:
        m, c = self.metrics, self.cluster
        domains = (
            sorted(f.domains, key=lambda d: (-d.fragment_gpu_milli, d.level, d.name))[
                :MAX_EXPORTED_DOMAINS
            ]
            if f is not None
            else []
        )
        now = {(d.level, d.name) for d in domains}
        for lv, name in self._domain_labels - now:
            m.domain_idle.remove(c, lv, name)
            m.domain_fragment.remove(c, lv, name)
        for d in domains:
            m.domain_idle.labels(c, d.level, d.name).set(d.idle_gpu_milli / GPU)
            m.domain_fragment.labels(c, d.level, d.name).set(d.fragment_gpu_milli / GPU)
        self._domain_labels = now
        levels = {lv.level: lv for lv in f.levels} if f is not None else {}
        for gone in self._level_labels - set(levels):
            m.level_domains.remove(c, gone)
            m.level_whole.remove(c, gone)
        for summary in levels.values():
            m.level_domains.labels(c, summary.level).set(summary.domains)
            m.level_whole.labels(c, summary.level).set(summary.whole)
        self._level_labels = set(levels)
        gangs: dict[tuple[str, str], int] = {}
        if f is not None:
            for level in f.levels:
                for g, n in zip(f.gangs, level.largest, strict=True):
                    if n is not None:
                        k = (level.level, str(g.gpus_per_pod))
                        gangs[k] = max(gangs.get(k, 0), n)
        for k in self._gang_labels - set(gangs):
            m.level_largest_gang.remove(c, *k)
        for k, n in gangs.items():
            m.level_largest_gang.labels(c, *k).set(n)
        self._gang_labels = set(gangs)

    def _left_out(self) -> tuple[int, tuple[tuple[str, str, str, str], ...]]:
        """What the summary says of the objects left out: how many are remembered, and the
        most recently reported `MAX_LEFT_OUT` of them (kind, name, reason, message)."""
        items = self.ignored.current()
        return len(items), tuple(
            (i.kind, i.ref.key if i.ref is not None else "", i.reason, i.message)
            for i in items[-MAX_LEFT_OUT:]
        )

    def _dra_summary(self) -> None:
        """Unknown DRA requests and pods whose devices span NUMA nodes, as metrics."""
        m, c = self.metrics, self.cluster
        live = {p.key for p in self.cache.claim_pods()}
        for k in [k for k in self.unknown if k not in live]:
            del self.unknown[k]
        for k in live - set(self.unknown):
            p = self.cache.pods[k]
            need = self.cache.dra.need(p.namespace, p.claims)
            if need.unknown:
                self.unknown[k] = need.unknown
        kinds = Counter(unknown_kind(r) for r in self.unknown.values())
        for kind in self._unknown_labels - set(kinds):
            m.dra_unknown_requests.labels(c, kind).set(0)
        for kind, n in kinds.items():
            m.dra_unknown_requests.labels(c, kind).set(n)
        self._unknown_labels |= set(kinds)
        pods = self.cache.pods
        self.misaligned = [
            x
            for x in misaligned_pods(self.cache.dra)
            if (q := pods.get(x.pod)) is not None and q.node and q.phase == "Running"
        ]
        per: Counter[tuple[str, str]] = Counter()
        for x in self.misaligned:
            p = self.cache.pods[x.pod]
            workload = f"{p.owner_kind}/{p.owner_name}" if p.owner_kind else f"Pod/{p.name}"
            per[(p.namespace, workload)] += 1
        for labels in self._misaligned_labels - set(per):
            m.pods_numa_misaligned.remove(c, *labels)
        for (ns, workload), n in per.items():
            m.pods_numa_misaligned.labels(c, ns, workload).set(n)
        self._misaligned_labels = set(per)

    def _export(self, s: Summary) -> None:
        m, c = self.metrics, self.cluster
        m.fragmentation_ratio.labels(c).set(s.fragmentation_rate)
        m.gpu_idle.labels(c).set(s.idle_gpu_milli / GPU)
        m.gpu_fragment.labels(c).set(s.fragment_gpu_milli / GPU)
        for cat, v in s.categories.items():
            m.gpu_fragment_category.labels(c, cat).set(v / GPU)
        m.mig_idle.labels(c).set(s.idle_mig_slices)
        m.mig_fragment.labels(c).set(s.fragment_mig_slices)
        m.mig_recoverable.labels(c).set(s.recoverable_mig_slices)
        for cat in CATEGORIES:
            m.pending_blocked.labels(c, cat).set(s.blocked.get(cat, 0))
        m.pending.labels(c).set(s.pending)
        m.scheduling_success.labels(c).set(s.scheduling_success)
        m.nodes.labels(c).set(s.nodes)
