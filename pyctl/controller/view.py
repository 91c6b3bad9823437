"""The controller's view of a cluster read once (a dump, or one list of a live cluster:
`pyctl.cluster.kube.dump.Listed`), made by the controller's own code: the records go into a
`ClusterCache`, a `Reconciler` translates and scores every node, and what the controller leaves
out is left out here for the same reason, in one `IgnoredObjects`:

- an object that did not decode (malformed, too_large, bad_quantity, out_of_bounds);
- a pod whose shape the core cannot model (shape_rejected);
- a node that cannot be translated (untranslatable).

`pyctl score`, `pyctl plan` and `kubectl pyctl` read clusters through this, so that they see what
the running controller sees (`pyctl status` rebuilds the same view from the stored records).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyctl.cluster.dra.context import misaligned_pods
from pyctl.cluster.dra.zones import model_gpus
from pyctl.cluster.kube.dump import Listed
from pyctl.cluster.records import KINDS, PodRecord
from pyctl.controller.cache import ClusterCache
from pyctl.controller.fabric_sources import node_labels
from pyctl.controller.ignored import Ignored, IgnoredObjects
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.workload import WorkloadScope
from pyctl.jsontypes import JsonObject
from pyctl.metrics import Metrics
from pyctl.model import DEFAULT_TOPOLOGY_POLICY, Shape, Snapshot, Workload

#: the cluster name the metrics of a one-off view carry (they are not exported)
CLUSTER = "listed"


@dataclass
class ListedView:
    cache: ClusterCache
    reconciler: Reconciler
    ignored: IgnoredObjects
    #: whether the listing had any object of Dynamic Resource Allocation
    has_dra: bool

    @property
    def workload(self) -> Workload:
        return self.reconciler.workload

    def fabric_labels(self) -> tuple[tuple[str, ...], dict[str, dict[str, str]]]:
        """The levels the fabric reads (the default ones, then those of the listing's Kueue and
        KAI `Topology` objects) and each node's labels with its clique from the listing's
        `ComputeDomainClique` objects where it has no label, as the controller's pass reads
        them (docs/fabric.md)."""
        levels, fill = self.reconciler.fabric_sources()
        return levels.levels, {
            n.name: node_labels(n.labels, n.name, fill)[0] for n in self.cache.nodes.values()
        }

    def live_pods(self) -> list[PodRecord]:
        """The pods that have not terminated, in the listing's order."""
        return [p for p in self.cache.pods.values() if not p.terminated]

    def modelled_pods(self) -> list[PodRecord]:
        """The live pods whose shape the core can model (the others are left out)."""
        return [p for p in self.live_pods() if self.reconciler.modelled(p)]

    def shapes(self, gpu_only: bool = False) -> list[Shape]:
        """The shapes of the modelled live pods (the GPU and MIG ones with `gpu_only`)."""
        out = []
        for p in self.live_pods():
            s = self.reconciler.modelled_shape(p)
            if s is not None and not (gpu_only and s.is_cpu_only):
                out.append(s)
        return out

    def snapshot(self) -> Snapshot:
        """Every node the controller models, in the listing's order."""
        models = self.reconciler.models
        return Snapshot(tuple(models[n] for n in self.cache.nodes if n in models))

    def left_out(self) -> list[Ignored]:
        """Every object left out, with the controller's reason, in the order found."""
        return self.ignored.current()

    def dra_report(self) -> JsonObject | None:
        """What the DRA objects say besides the score (None without DRA objects): per node, how
        its zones were found and what pyctl could not use; the pods whose claims pyctl cannot
        tell, with why; the running pods whose allocated devices span NUMA nodes."""
        if not self.has_dra:
            return None
        dra = self.cache.dra
        out_nodes: JsonObject = {}
        for n in self.cache.nodes.values():
            nd = dra.node(n.name)
            if nd is None:
                continue
            dm = model_gpus(nd, n.gpu_model)
            out_nodes[n.name] = {
                "zones_by": dm.basis,
                "links_by": dm.links,
                "gpus": sum(1 for g in dm.gpus if g.whole),
                "dynamic_mig_gpus": sum(1 for g in dm.gpus if g.dynamic),
                "static_mig_gpus": sum(1 for g in dm.gpus if not g.whole and not g.dynamic),
                "both_ways": bool(dm.gpus and (n.gpus or n.mig)),
                "notes": list(dm.notes),
            }
        unknown: JsonObject = {}
        for p in self.live_pods():
            if p.claims:
                need = dra.need(p.namespace, p.claims)
                if need.unknown:
                    unknown[p.key] = need.unknown
        running = {p.key for p in self.cache.pods.values() if p.node and p.phase == "Running"}
        return {
            "nodes": out_nodes,
            "unknown_requests": unknown,
            "pods_spanning_numa_nodes": [
                {
                    "pod": x.pod,
                    "node": x.node,
                    "devices": list(x.devices),
                    "numa": [list(v) for v in x.numa],
                }
                for x in misaligned_pods(dra)
                if x.pod in running
            ],
        }


def view_of(
    listed: Listed,
    *,
    workload: Workload | None = None,
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
    scope: WorkloadScope | None = None,
) -> ListedView:
    """The controller's view of `listed`: M is `workload`, or derived from the pods as the
    controller derives it (`Reconciler.refresh_workload`, within `scope`); every node is
    translated and scored under it; every live pod's shape is checked. What is left out is in
    `left_out()`, nothing is logged."""
    ignored = IgnoredObjects(Metrics(), CLUSTER, logged=False)
    for lo in listed.left_out:
        ignored.report(lo.kind, lo.reason, lo.message, lo.ref)
    cache = ClusterCache()
    for kind in KINDS:
        cache.replace(kind, listed.of(kind))
    reconciler = Reconciler(
        cache, Metrics(), CLUSTER, workload, default_policy, scope, ignored=ignored
    )
    reconciler.refresh_workload()
    view = ListedView(cache, reconciler, ignored, listed.dra() is not None)
    view.shapes()  # every live pod checked (and left out when the core cannot model it)
    for name in cache.nodes:
        reconciler.reconcile(name)
    return view


def left_out_json(items: list[Ignored]) -> JsonObject:
    """The objects left out, as `--json` outputs show them."""
    return {
        "count": len(items),
        "objects": [
            {
                "kind": i.kind,
                "name": i.ref.key if i.ref is not None else "",
                "reason": i.reason,
                "message": i.message,
            }
            for i in items
        ],
    }


def left_out_line(i: Ignored) -> str:
    """One object left out, as a command says it on stderr (one line)."""
    who = f"{i.kind} {i.ref.key}" if i.ref is not None else i.kind
    return " ".join(f"left out: {who} ({i.reason}): {i.message}".split())


__all__ = ["ListedView", "left_out_json", "left_out_line", "view_of"]
