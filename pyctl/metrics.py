"""Prometheus metrics (prometheus-client), named after Prometheus conventions: base units
(`_gpus`, `_seconds`, `_ratio`), `_total` for counters, labels for cluster, node, NUMA zone and
category. One `Metrics` object per controller, on its own registry."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The controller's metrics, grouped by subject (each group a method that registers it);
    the acting side's and the recommender's in `WorkflowMetrics` and `RecommendMetrics`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._fragmentation()
        self._fabric()
        self._mig()
        self._pending()
        self._watches()
        self._loop()
        self._store()
        self._cluster()
        self._dra()
        self.workflow = WorkflowMetrics(self)
        self.recommend = RecommendMetrics(self)

    def _fragmentation(self) -> None:
        """Fragmentation under the workload M: the cluster's, per node and per NUMA zone."""
        r, c = self.registry, ["cluster"]
        self.fragmentation_ratio = Gauge(
            "pyctl_fragmentation_ratio",
            "Fragment GPU / idle GPU under the workload M (FGD's fragmentation rate, NUMA-aware)",
            c,
            registry=r,
        )
        self.gpu_idle = Gauge("pyctl_gpu_idle_gpus", "Idle GPU capacity, in GPUs", c, registry=r)
        self.gpu_fragment = Gauge(
            "pyctl_gpu_fragment_gpus", "Idle GPU capacity M could not use, in GPUs", c, registry=r
        )
        self.gpu_fragment_category = Gauge(
            "pyctl_gpu_fragment_by_category_gpus",
            "Fragment GPU by reason (lack_gpu, lack_cpu, numa_split, mig_geometry, ...)",
            [*c, "category"],
            registry=r,
        )
        self.node_idle = Gauge(
            "pyctl_node_gpu_idle_gpus", "Idle GPU per node", [*c, "node"], registry=r
        )
        self.node_fragment = Gauge(
            "pyctl_node_gpu_fragment_gpus", "Fragment GPU per node", [*c, "node"], registry=r
        )
        self.zone_idle = Gauge(
            "pyctl_zone_gpu_idle_gpus", "Idle GPU per NUMA zone", [*c, "node", "numa"], registry=r
        )
        self.zone_fragment = Gauge(
            "pyctl_zone_gpu_fragment_gpus",
            "Fragment GPU per NUMA zone",
            [*c, "node", "numa"],
            registry=r,
        )

    def _fabric(self) -> None:
        """The fabric (docs/fabric.md), per topology domain (MAX_EXPORTED_DOMAINS at most)."""
        r, c = self.registry, ["cluster"]
        self.domain_idle = Gauge(
            "pyctl_domain_gpu_idle_gpus",
            "Idle GPU per topology domain (an NVLink clique, a rack, a leaf)",
            [*c, "level", "domain"],
            registry=r,
        )
        self.domain_fragment = Gauge(
            "pyctl_domain_gpu_fragment_gpus",
            "Idle GPU of a domain that no gang of M can use for want of room in it (domain_split)",
            [*c, "level", "domain"],
            registry=r,
        )
        self.level_domains = Gauge(
            "pyctl_level_domains", "Topology domains per level", [*c, "level"], registry=r
        )
        self.level_whole = Gauge(
            "pyctl_level_whole_domains",
            "Topology domains of a level with no GPU in use",
            [*c, "level"],
            registry=r,
        )
        self.level_largest_gang = Gauge(
            "pyctl_level_largest_gang_pods",
            "Most pods of a gang's shape one domain of the level could host now",
            [*c, "level", "gpus_per_pod"],
            registry=r,
        )
        self.level_source = Gauge(
            "pyctl_level_source",
            "A level the fabric reads (1) and where it came from: config, kueue/<Topology>, "
            "kai/<Topology>, volcano/hypernodes",
            [*c, "level", "source"],
            registry=r,
        )
        self.clique_filled_nodes = Gauge(
            "pyctl_clique_filled_nodes",
            "Nodes without an nvidia.com/gpu.clique label whose clique came from "
            "ComputeDomainClique objects",
            c,
            registry=r,
        )
        self.fabric_source_problems = Gauge(
            "pyctl_fabric_source_problems",
            "What the fabric's Topology, ComputeDomainClique and HyperNode objects and the "
            "nodes' link scores had that pyctl left out or overrode, by problem",
            [*c, "problem"],
            registry=r,
        )

    def _mig(self) -> None:
        """MIG compute slices: idle, fragment and recoverable by a re-partition."""
        r, c = self.registry, ["cluster"]
        self.mig_idle = Gauge("pyctl_mig_idle_slices", "Idle MIG compute slices", c, registry=r)
        self.mig_fragment = Gauge(
            "pyctl_mig_fragment_slices", "Idle MIG compute slices M could not use", c, registry=r
        )
        self.mig_recoverable = Gauge(
            "pyctl_mig_recoverable_slices",
            "Idle MIG slices a re-partition of free slices would make usable",
            c,
            registry=r,
        )

    def _pending(self) -> None:
        """Pending pods and how scheduling fares."""
        r, c = self.registry, ["cluster"]
        self.pending_blocked = Gauge(
            "pyctl_pending_pods_blocked_by_fragmentation",
            "Unschedulable pods that the cluster's idle capacity could hold in total, by reason",
            [*c, "reason"],
            registry=r,
        )
        self.pending = Gauge("pyctl_pending_pods", "Pods not bound to a node", c, registry=r)
        self.scheduling_success = Gauge(
            "pyctl_scheduling_success_ratio",
            "Pods bound / (bound + marked Unschedulable) over the window",
            c,
            registry=r,
        )

    def _watches(self) -> None:
        """What the watches read: events, relists, objects left out, pyctl's taints, lag."""
        r, c = self.registry, ["cluster"]
        self.watch_events = Counter(
            "pyctl_watch_events_total", "Watch events received", [*c, "kind", "type"], registry=r
        )
        self.relists = Counter(
            "pyctl_watch_relists_total", "Full lists (start and 410 Gone)", [*c, "kind"], registry=r
        )
        self.decode_errors = Counter(
            "pyctl_decode_errors_total",
            "Objects pyctl could not understand",
            [*c, "kind"],
            registry=r,
        )
        self.ignored_objects = Counter(
            "pyctl_ignored_objects_total",
            "Objects left out of pyctl's view (counted once per object and reason): malformed, "
            "too_large, bad_quantity, out_of_bounds (decode), shape_rejected (a pod the core "
            "cannot model), untranslatable (a node)",
            [*c, "kind", "reason"],
            registry=r,
        )
        self.node_taint = Gauge(
            "pyctl_node_taint",
            "1 while the node carries pyctl's own taint `key` (pyctl.io/*), as the API shows it",
            [*c, "node", "key"],
            registry=r,
        )
        self.event_lag = Histogram(
            "pyctl_event_to_state_seconds",
            "From a watch event's arrival to its state update",
            c,
            buckets=_LAG_BUCKETS,
            registry=r,
        )

    def _loop(self) -> None:
        """The controller's loop: GC pauses, reconciles, extender ranks, its work queue."""
        r, c = self.registry, ["cluster"]
        self.gc_pause = Histogram(
            "pyctl_gc_pause_seconds",
            "Python's cycle collections by generation: how long each held the GIL (the event "
            "loop and the extender's threads wait meanwhile)",
            [*c, "generation"],
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "pyctl_reconcile_duration_seconds",
            "One node's reconcile",
            c,
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.extender_ranks = Counter(
            "pyctl_extender_ranks_total",
            "Node ranks the scheduler extender computed, by when: request (no rank kept for a "
            "candidate's current model, computed while the scheduler waits) or ahead (for the "
            "shapes asked about recently and the pending pods', when the reconciler re-scored "
            "the node or in the background)",
            [*c, "when"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "pyctl_reconcile_errors_total",
            "Reconciles that failed and were requeued",
            c,
            registry=r,
        )
        self.workqueue_depth = Gauge(
            "pyctl_workqueue_depth", "Nodes waiting to be reconciled", c, registry=r
        )

    def _store(self) -> None:
        """The state store (Redis)."""
        r, c = self.registry, ["cluster"]
        self.store_errors = Counter(
            "pyctl_store_errors_total", "State store (Redis) operations that failed", c, registry=r
        )
        self.store_up = Gauge(
            "pyctl_store_up",
            "1 when the state store answers and refuses none of pyctl's parts (/readyz says why "
            "not)",
            c,
            registry=r,
        )
        self.store_part_up = Gauge(
            "pyctl_store_part_up",
            "1 when the state store's last answer to this part of pyctl (mirror, summary, "
            "workflows, rate limits, probe) was not a failure",
            [*c, "part"],
            registry=r,
        )

    def _cluster(self) -> None:
        """The controller's standing: kinds listed, leadership, nodes, federation."""
        r, c = self.registry, ["cluster"]
        self.kind_listed = Gauge(
            "pyctl_kind_listed",
            "1 once the kind has been listed (or found not served); no node is scored and no "
            "planning round runs until every kind is",
            [*c, "kind"],
            registry=r,
        )
        self.leader = Gauge("pyctl_leader", "1 on the replica holding the Lease", c, registry=r)
        self.nodes = Gauge("pyctl_nodes", "Nodes seen", c, registry=r)
        self.federation_members_stale = Gauge(
            "pyctl_federation_members_stale",
            "Federation members (clusters) with no heartbeat within their TTL, seen from here",
            c,
            registry=r,
        )

    def _dra(self) -> None:
        """Dynamic Resource Allocation (docs/dra.md)."""
        r, c = self.registry, ["cluster"]
        self.dra_unknown_requests = Gauge(
            "pyctl_dra_unknown_requests",
            "Pods whose ResourceClaims pyctl cannot turn into a shape (a CEL selector it cannot "
            "evaluate, devices of several kinds, ...), by reason kind",
            [*c, "reason"],
            registry=r,
        )
        self.pods_numa_misaligned = Gauge(
            "pyctl_pods_devices_span_numa_nodes",
            "Running pods whose allocated DRA devices span NUMA nodes (they pay the cross-NUMA "
            "penalty), per namespace and workload",
            [*c, "namespace", "workload"],
            registry=r,
        )

    def watch_collections(self, cluster: str) -> Callable[[], None]:
        """Time every cycle collection of this process (`pyctl_gc_pause_seconds`); returns
        the function that stops it."""
        hist = [self.gc_pause.labels(cluster, str(g)) for g in range(3)]
        return time_collections(lambda g, seconds: hist[min(max(g, 0), 2)].observe(seconds))


def time_collections(observe: Callable[[int, float], None]) -> Callable[[], None]:
    """Call `observe(generation, seconds)` after every cycle collection of this process (the
    controller's histogram; the extender's own process sends them to the controller); returns
    the function that stops it."""
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif started[0]:
            observe(int(info.get("generation", 2)), time.perf_counter() - started[0])
            started[0] = 0.0

    gc.callbacks.append(timed)
    return lambda: gc.callbacks.remove(timed) if timed in gc.callbacks else None


class WorkflowMetrics:
    """Metrics of the acting side (compaction, evictions, rate limits); registered on the same
    registry as `Metrics`."""

    def __init__(self, m: Metrics) -> None:
        r, c = m.registry, ["cluster"]
        self.planned_moves = Gauge(
            "pyctl_compaction_planned_moves",
            "Evictions the compaction planner proposes now",
            c,
            registry=r,
        )
        self.plan_duration = Gauge(
            "pyctl_plan_duration_seconds",
            "How long the last planning round over the whole cluster took, by loop (compaction, "
            "mig); the planner alone, not the workflows it starts",
            [*c, "loop"],
            registry=r,
        )
        self.expected_gain = Gauge(
            "pyctl_compaction_expected_gain_gpus",
            "Fragment reduction the proposed evictions would bring, in GPUs",
            c,
            registry=r,
        )
        self.evictions = Counter(
            "pyctl_evictions_total",
            "Evictions by result (evicted, refused, dry-run)",
            [*c, "result"],
            registry=r,
        )
        self.rate_limited = Counter(
            "pyctl_rate_limited_total",
            "Actions held back by a rate limit, by limit",
            [*c, "limit"],
            registry=r,
        )
        self.refunds = Counter(
            "pyctl_rate_limit_refunds_total",
            "Evictions whose rate limits were given back because the eviction did not happen, "
            "by why (refused, failed, not-leader)",
            [*c, "why"],
            registry=r,
        )
        self.workflows = Gauge(
            "pyctl_workflows",
            "Workflows in progress, by kind and step",
            [*c, "kind", "step"],
            registry=r,
        )
        self.step_errors = Counter(
            "pyctl_workflow_step_errors_total",
            "Workflow steps that raised (retried with backoff), by kind and step",
            [*c, "kind", "step"],
            registry=r,
        )
        self.abandoned = Counter(
            "pyctl_workflows_abandoned_total",
            "Workflows given up after too many failed attempts, or abandoned by a step, by kind",
            [*c, "kind"],
            registry=r,
        )
        self.quarantined = Counter(
            "pyctl_quarantined_records_total",
            "Stored records that did not decode and were moved aside (workflows, objects) or "
            "skipped (summaries of federation members), by store",
            [*c, "store"],
            registry=r,
        )
        self.rescues = Counter(
            "pyctl_rescues_total",
            "Rescues of pending pods (room made by several evictions) by outcome (done, "
            "bound_elsewhere, withdrawn, abandoned)",
            [*c, "outcome"],
            registry=r,
        )
        self.planned_rescues = Gauge(
            "pyctl_compaction_planned_rescues",
            "Pending pods the compaction planner can make room for now",
            c,
            registry=r,
        )
        # -- MIG reconfiguration (pyctl/workflows/mig_reconfig.py) --
        self.mig_reconfigurations = Counter(
            "pyctl_mig_reconfigurations",
            "Finished MIG reconfigurations by result (succeeded, failed, rolled_back)",
            [*c, "node", "result"],
            registry=r,
        )
        self.mig_in_progress = Gauge(
            "pyctl_mig_reconfiguration_in_progress",
            "1 while a MIG reconfiguration of the node runs (from the slot to the node restored)",
            [*c, "node"],
            registry=r,
        )


class RecommendMetrics:
    """The periodic resource-normalization report (`pyctl.recommend.recommender`), per GPU model
    (the pool); registered on the same registry as `Metrics`."""

    def __init__(self, m: Metrics) -> None:
        r, c = m.registry, ["cluster"]
        self.runs = Counter(
            "pyctl_recommend_runs_total",
            "Recommendation reports computed, by result (ok, error)",
            [*c, "result"],
            registry=r,
        )
        self.last_success = Gauge(
            "pyctl_recommend_last_success_timestamp_seconds",
            "When the last recommendation report was computed",
            c,
            registry=r,
        )
        self.duration = Gauge(
            "pyctl_recommend_duration_seconds",
            "How long the last report took (including Prometheus)",
            c,
            registry=r,
        )
        self.menu_sizes = Gauge(
            "pyctl_recommend_menu_sizes",
            "Standard sizes in the recommended menu of a GPU model",
            [*c, "gpu_model"],
            registry=r,
        )
        self.served = Gauge(
            "pyctl_recommend_demand_served_ratio",
            "Demand served at 100% of capacity: the best menu of at most k sizes "
            "(k=requested: the requests as they are)",
            [*c, "gpu_model", "k"],
            registry=r,
        )
        self.waste = Gauge(
            "pyctl_recommend_rounding_waste_ratio",
            "Rounding waste of the recommended menu on the replicas running now, of their need",
            [*c, "gpu_model"],
            registry=r,
        )
        self.workloads = Gauge(
            "pyctl_recommend_workloads",
            "GPU workloads by recommendation (change, keep)",
            [*c, "action"],
            registry=r,
        )
        self.class_nodes = Gauge(
            "pyctl_recommend_class_nodes",
            "Nodes a resource class needs for the normalized demand",
            [*c, "gpu_model", "class"],
            registry=r,
        )
        self.usage_bad_points = Gauge(
            "pyctl_recommend_usage_bad_points",
            "Usage points left out of the last report (NaN, negative, out of range)",
            c,
            registry=r,
        )
        self.usage_stale_pods = Gauge(
            "pyctl_recommend_usage_stale_pods",
            "Pods with usage series that match no current workload, in the last report",
            c,
            registry=r,
        )
