"""Placement advice: a kube-scheduler extender (HTTP `filter` and `prioritize`).

The wire format is k8s.io/kube-scheduler/extender/v1 (Go structs without JSON tags, so the keys
are the Go field names):

- request, both verbs: ``ExtenderArgs`` ``{"Pod": <v1.Pod>, "Nodes": <v1.NodeList>|null,
  "NodeNames": [..]|null}`` (``NodeNames`` with ``nodeCacheCapable: true``, else ``Nodes``);
- filter answer: ``ExtenderFilterResult`` ``{"Nodes", "NodeNames", "FailedNodes": {name: reason},
  "FailedAndUnresolvableNodes": {..}, "Error": ""}``;
- prioritize answer: ``HostPriorityList`` ``[{"Host": name, "Score": 0..10}]``
  (``MaxExtenderPriority`` is 10; the scheduler multiplies by the extender's ``weight`` and by
  ``MaxNodeScore / MaxExtenderPriority``).

Decisions come from the controller's current per-node models (`Reconciler.models`) and workload M:

- filter: a node is removed when the core says the Topology Manager would not admit the pod there
  (`FragmentationModel.place_delta` is None: e.g. no NUMA zone with enough free GPUs under
  ``single-numa-node``), so pods stop failing kubelet admission with TopologyAffinityError. Nodes
  pyctl does not model (not seen yet, or not understood) pass: the extender only removes nodes it
  knows to be wrong. CPU-only pods pass everywhere (their placement is the scheduler's business).
- prioritize: the fragment delta of placing the pod on each node (FGD): the lowest growth scores
  10, the highest 1, linear in between; equal growth goes to the fuller node (its idle capacity
  weighs ``TIE_BREAK`` per unit), so that an evicted replica does not bounce back to the node it
  left; nodes that do not admit it, or that pyctl does not model, score 0.

A broken request never raises: the filter answers HTTP 200 with ``Error`` set (the scheduler then
applies the extender's ``ignorable`` setting); ``HostPriorityList`` has no error field, so a broken
prioritize request gets an empty list (no preference) and is logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import pod_shape
from pyctl.fragmentation import Delta, FragmentationModel
from pyctl.model import Node, Shape, Snapshot, Workload

log = logging.getLogger("pyctl.placement")

MAX_EXTENDER_PRIORITY = 10
#: weight of a node's idle capacity in the ranking: it only breaks ties of the fragment delta
TIE_BREAK = 1e-3


class ExtenderInputError(ValueError):
    """A request the extender cannot read; the message says why."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: PodRecord
    #: candidate node names, in the order the scheduler sent them
    names: tuple[str, ...]
    #: the NodeList items when the scheduler sent whole nodes (nodeCacheCapable: false)
    items: tuple[Mapping[str, Any], ...] | None


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct without JSON tags: its exact name, or any casing of it (Go's
    decoder matches case-insensitively, so other clients may send ``pod`` or ``nodenames``)."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


def parse_args(body: bytes | str | Mapping[str, Any]) -> ExtenderArgs:
    """`ExtenderArgs` from a request body; raises `ExtenderInputError` on anything unreadable."""
    if isinstance(body, bytes | str):
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ExtenderInputError(f"request body is not JSON: {e}") from None
    else:
        obj = body
    if not isinstance(obj, Mapping):
        raise ExtenderInputError("ExtenderArgs must be a JSON object")
    pod = _field(obj, "Pod")
    if not isinstance(pod, Mapping):
        raise ExtenderInputError("ExtenderArgs.Pod is missing")
    try:
        rec = decode_object("Pod", pod)
    except ValueError as e:
        raise ExtenderInputError(f"ExtenderArgs.Pod: {e}") from None
    if not isinstance(rec, PodRecord) or not rec.name:
        raise ExtenderInputError("ExtenderArgs.Pod has no metadata.name")
    names_raw = _field(obj, "NodeNames")
    nodes_raw = _field(obj, "Nodes")
    items: tuple[Mapping[str, Any], ...] | None = None
    if names_raw is not None:
        if not isinstance(names_raw, list) or not all(isinstance(n, str) for n in names_raw):
            raise ExtenderInputError("ExtenderArgs.NodeNames must be a list of strings")
        names = tuple(names_raw)
    elif nodes_raw is not None:
        raw_items = nodes_raw.get("items") if isinstance(nodes_raw, Mapping) else None
        if not isinstance(raw_items, list) or not all(isinstance(i, Mapping) for i in raw_items):
            raise ExtenderInputError("ExtenderArgs.Nodes must be a NodeList with items")
        items = tuple(raw_items)
        got = []
        for i in items:
            meta = i.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                raise ExtenderInputError("ExtenderArgs.Nodes has a node without metadata.name")
            got.append(name)
        names = tuple(got)
    else:
        raise ExtenderInputError("ExtenderArgs has neither NodeNames nor Nodes")
    return ExtenderArgs(rec, names, items)


class PlacementExtender:
    """Answers the scheduler from a live view of the cluster: `models` (node name → model node,
    replaced whenever a node is re-translated, as `Reconciler.models` is) and `workload` (a
    callable, since the controller re-derives M). One `FragmentationModel` is kept per node and
    rebuilt only when that node's model object changes (its snapshot generation)."""

    def __init__(self, models: Mapping[str, Node], workload: Any) -> None:
        self._models = models
        self._workload = workload
        self._cache: dict[str, tuple[Node, FragmentationModel]] = {}

    @classmethod
    def for_reconciler(cls, reconciler: Any) -> PlacementExtender:
        """Reads `reconciler.models` and `reconciler.workload` (a `Reconciler`)."""
        return cls(reconciler.models, lambda: reconciler.workload)

    def workload(self) -> Workload:
        w = self._workload() if callable(self._workload) else self._workload
        assert isinstance(w, Workload)
        return w

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

    # -- the two verbs, on parsed arguments -----------------------------------------------------
    def filter_args(self, args: ExtenderArgs) -> dict[str, Any]:
        shape = pod_shape(args.pod)
        failed: dict[str, str] = {}
        if not shape.is_cpu_only:
            workload = self.workload()
            policy_of = {n: m.topology_policy for n, m in self._models.items()}
            for name in args.names:
                if self.delta(name, shape, workload) is None:
                    failed[name] = (
                        f"pyctl: cannot place {_describe(shape)} within the node's free NUMA "
                        f"resources (Topology Manager policy {policy_of.get(name, '?')})"
                    )
        kept = [n for n in args.names if n not in failed]
        out: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        if args.items is not None:
            keep = set(kept)
            out["Nodes"] = {
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {},
                "items": [i for i in args.items if i["metadata"]["name"] in keep],
            }
        else:
            out["NodeNames"] = kept
        return out

    def prioritize_args(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        shape = pod_shape(args.pod)
        if shape.is_cpu_only:
            return [{"Host": n, "Score": 0} for n in args.names]
        workload = self.workload()
        growth: dict[str, float] = {}
        for name in args.names:
            d = self.delta(name, shape, workload)
            if isinstance(d, Delta):
                g = d.fragment_mig_slices if shape.mig_profile else d.fragment_gpu_milli
                # equal growth: the fuller node wins (bin packing), so that a replica evicted by
                # compaction does not bounce back to the node it left while that node still
                # looks as it did
                growth[name] = g + TIE_BREAK * idle_units(self._models[name], shape)
        return [{"Host": n, "Score": s} for n, s in scores(args.names, growth).items()]

    # -- the two verbs, on request bodies (never raise) -----------------------------------------
    def filter(self, body: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
        try:
            return self.filter_args(parse_args(body))
        except Exception as e:  # answer the scheduler, whatever went wrong
            msg = str(e) if isinstance(e, ExtenderInputError) else f"{type(e).__name__}: {e}"
            log.warning("scheduler extender filter: %s", msg)
            return {
                "Nodes": None,
                "NodeNames": None,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": f"pyctl: {msg}",
            }

    def prioritize(self, body: bytes | str | Mapping[str, Any]) -> list[dict[str, Any]]:
        try:
            return self.prioritize_args(parse_args(body))
        except Exception as e:  # answer the scheduler, whatever went wrong
            msg = str(e) if isinstance(e, ExtenderInputError) else f"{type(e).__name__}: {e}"
            log.warning("scheduler extender prioritize: %s (no preference given)", msg)
            return []

    def handle(self, verb: str, body: bytes) -> bytes:
        """The JSON answer to one POST on ``/scheduler/<verb>`` (``filter`` or ``prioritize``)."""
        result: Any
        if verb == "filter":
            result = self.filter(body)
        elif verb == "prioritize":
            result = self.prioritize(body)
        else:
            result = {"Error": f"pyctl: unknown extender verb {verb!r}"}
        return json.dumps(result, separators=(",", ":")).encode()


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
    return f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}"
