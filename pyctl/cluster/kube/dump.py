"""Import of `kubectl get nodes,pods -o json` dumps (with NodeResourceTopology objects when
present): the objects are decoded into records exactly as watch events are, then translated into
the model (`pyctl.cluster.translate`), so a user can score a live cluster without installing
anything in it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import KINDS, Kind, NodeRecord, NrtRecord, PdbRecord, PodRecord
from pyctl.cluster.translate import TranslateError, node_from_records, pod_shape, pod_shape_problem
from pyctl.model import Shape, Snapshot


class DumpError(ValueError):
    """A dump pyctl cannot understand; the message names the object."""


def is_dump(data: Any) -> bool:
    """A `kubectl get ... -o json` answer: a List of Kubernetes objects."""
    return isinstance(data, Mapping) and data.get("kind") == "List" and "items" in data


def records(
    data: Mapping[str, Any],
) -> tuple[list[NodeRecord], list[PodRecord], list[NrtRecord], list[PdbRecord]]:
    """Every Node, Pod, NodeResourceTopology and PodDisruptionBudget of a dump, as records."""
    nodes, pods, nrts = _records(data)
    pdbs = []
    for i, o in enumerate(data.get("items") or []):
        if isinstance(o, Mapping) and o.get("kind") == "PodDisruptionBudget":
            try:
                r = decode_object("PodDisruptionBudget", o)
            except DecodeError as e:
                raise DumpError(f"items[{i}]: {e}") from None
            if isinstance(r, PdbRecord):
                pdbs.append(r)
    return nodes, pods, nrts, pdbs


def _records(data: Mapping[str, Any]) -> tuple[list[NodeRecord], list[PodRecord], list[NrtRecord]]:
    items = data.get("items")
    if not isinstance(items, list):
        raise DumpError("kubectl dump: 'items' must be a list")
    nodes: list[NodeRecord] = []
    pods: list[PodRecord] = []
    nrts: list[NrtRecord] = []
    for i, o in enumerate(items):
        if not isinstance(o, Mapping) or o.get("kind") not in KINDS:
            continue
        kind: Kind = o["kind"]
        try:
            r = decode_object(kind, o)
        except DecodeError as e:
            raise DumpError(f"items[{i}]: {e}") from None
        if isinstance(r, NodeRecord):
            nodes.append(r)
        elif isinstance(r, PodRecord):
            pods.append(r)
        elif isinstance(r, NrtRecord):
            nrts.append(r)
    return nodes, pods, nrts


def snapshot_from_dump(data: Mapping[str, Any]) -> Snapshot:
    nodes, pods, nrts = _records(data)
    by_node: dict[str, list[PodRecord]] = defaultdict(list)
    for p in pods:
        if p.node and not p.terminated:
            by_node[p.node].append(p)
    nrt = {t.name: t for t in nrts}
    try:
        return Snapshot(
            tuple(node_from_records(n, nrt.get(n.name), by_node[n.name]) for n in nodes)
        )
    except TranslateError as e:
        raise DumpError(str(e)) from None


def pod_shapes(data: Mapping[str, Any]) -> list[Shape]:
    """The task shapes of every pod in a dump that has not terminated (for deriving M), as the
    controller takes them: a pod whose shape the core cannot model is left out."""
    _, pods, _ = _records(data)
    return [pod_shape(p) for p in pods if not p.terminated and pod_shape_problem(p) is None]
