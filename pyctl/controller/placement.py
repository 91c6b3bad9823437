"""Placement advice: which of the scheduler's candidate nodes a pod should not go to, and how
much pyctl prefers each of the others. Decisions come from the controller's current per-node
models (`Reconciler.models`) and workload M; the wire format is the Kubernetes adapter's
(`pyctl.cluster.kube.extender`), the HTTP server `pyctl.serve.extender`.

- filter: a node is removed when the core says the Topology Manager would not admit the pod there
  (`FragmentationModel.place_delta` is None: e.g. no NUMA zone with enough free GPUs under
  ``single-numa-node``), so pods stop failing kubelet admission with TopologyAffinityError. Nodes
  pyctl does not model (not seen yet, or not understood) pass: the extender only removes nodes it
  knows to be wrong. CPU-only pods pass everywhere (their placement is the scheduler's business).
- prioritize: the fragment delta of placing the pod on each node (FGD): the lowest growth scores
  10, the highest 1, linear in between; equal growth goes to the fuller node (its idle capacity
  weighs ``TIE_BREAK`` per unit), so that an evicted replica does not bounce back to the node it
  left; nodes that do not admit it, or that pyctl does not model, score 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import pod_shape
from pyctl.controller.reconcile import Reconciler
from pyctl.core.fragmentation import Delta, FragmentationModel
from pyctl.model import Node, Shape, Snapshot, Workload

MAX_EXTENDER_PRIORITY = 10
#: weight of a node's idle capacity in the ranking: it only breaks ties of the fragment delta
TIE_BREAK = 1e-3


class PlacementAdvisor:
    """Answers from a live view of the cluster: `models` (node name → model node, replaced
    whenever a node is re-translated, as `Reconciler.models` is) and `workload` (a callable,
    since the controller re-derives M). One `FragmentationModel` is kept per node and rebuilt
    only when that node's model object changes."""

    def __init__(self, models: Mapping[str, Node], workload: Callable[[], Workload]) -> None:
        self._models = models
        self._workload = workload
        self._cache: dict[str, tuple[Node, FragmentationModel]] = {}

    @classmethod
    def for_reconciler(cls, reconciler: Reconciler) -> PlacementAdvisor:
        return cls(reconciler.models, lambda: reconciler.workload)

    def _model(self, name: str) -> FragmentationModel | None:
        node = self._models.get(name)
        if node is None:
            self._cache.pop(name, None)
            return None
        hit = self._cache.get(name)
        if hit is not None and hit[0] is node:
            return hit[1]
        model = FragmentationModel(Snapshot((node,)))
        self._cache[name] = (node, model)
        if len(self._cache) > 2 * len(self._models) + 16:  # nodes gone: forget their models
            for gone in [n for n in self._cache if n not in self._models]:
                del self._cache[gone]
        return model

    def delta(self, name: str, shape: Shape, workload: Workload) -> Delta | str | None:
        """The fragment delta of placing `shape` on node `name`; None if the node would not admit
        it; "unknown" if pyctl has no model of the node."""
        model = self._model(name)
        if model is None:
            return "unknown"
        return model.place_delta(name, shape, workload)

    def filter(self, pod: PodRecord, names: tuple[str, ...]) -> dict[str, str]:
        """The candidate nodes `pod` must not go to, with why."""
        shape = pod_shape(pod)
        failed: dict[str, str] = {}
        if not shape.is_cpu_only:
            workload = self._workload()
            for name in names:
                if self.delta(name, shape, workload) is None:
                    node = self._models[name]
                    if shape.mig_profile is None and node.gpu_pool != shape.gpu_pool:
                        failed[name] = (
                            f"pyctl: the pod asks for GPUs of {_pool(shape.gpu_pool)}, the "
                            f"node shares its GPUs as {_pool(node.gpu_pool)}"
                        )
                        continue
                    failed[name] = (
                        f"pyctl: cannot place {_describe(shape)} within the node's free NUMA "
                        f"resources (Topology Manager policy {node.topology_policy})"
                    )
        return failed

    def prioritize(self, pod: PodRecord, names: tuple[str, ...]) -> dict[str, int]:
        """A score 0..MAX_EXTENDER_PRIORITY per candidate node."""
        shape = pod_shape(pod)
        if shape.is_cpu_only:
            return dict.fromkeys(names, 0)
        workload = self._workload()
        growth: dict[str, float] = {}
        for name in names:
            d = self.delta(name, shape, workload)
            if isinstance(d, Delta):
                g = d.fragment_mig_slices if shape.mig_profile else d.fragment_gpu_milli
                # equal growth: the fuller node wins (bin packing), so that a replica evicted by
                # compaction does not bounce back to the node it left while that node still
                # looks as it did
                growth[name] = g + TIE_BREAK * idle_units(self._models[name], shape)
        return scores(names, growth)


def scores(names: tuple[str, ...], growth: Mapping[str, float]) -> dict[str, int]:
    """Fragment growth per admitting node → 1..MaxExtenderPriority: the least growth scores 10,
    the most 1, linear in between; nodes without a growth (not admitting, not modelled) score 0."""
    out = dict.fromkeys(names, 0)
    if not growth:
        return out
    lo, hi = min(growth.values()), max(growth.values())
    for n, g in growth.items():
        if hi - lo <= 1e-9:
            out[n] = MAX_EXTENDER_PRIORITY
        else:
            out[n] = 1 + round((MAX_EXTENDER_PRIORITY - 1) * (hi - g) / (hi - lo))
    return out


def idle_units(node: Node, shape: Shape) -> float:
    """Idle capacity of `node` in the unit of `shape`'s fragment: free MIG instances' slices for
    a MIG shape, idle GPU milli otherwise."""
    if shape.mig_profile:
        return float(
            sum(
                1
                for z in node.zones
                for m in z.mig
                for i in m.instances
                if not i.used and i.profile == shape.mig_profile
            )
        )
    return float(sum(1000 - min(g.used_milli, 1000) for z in node.zones for g in z.gpus))


def _describe(s: Shape) -> str:
    if s.mig_profile:
        return f"one MIG {s.mig_profile} instance"
    if s.gpu_milli == 0 and s.gpus:
        return f"{s.gpus} replica{'s' if s.gpus != 1 else ''} of {_pool(s.gpu_pool)}"
    return f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}"


def _pool(pool: str) -> str:
    """A GPU sharing pool by name (docs/sharing.md)."""
    return {"": "nvidia.com/gpu", "hami": "HAMi"}.get(pool, pool)
