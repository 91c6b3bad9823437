"""Import of `kubectl get nodes,pods -o json` dumps (with NodeResourceTopology objects when
present, and the `resource.k8s.io` objects of Dynamic Resource Allocation:
`kubectl get nodes,pods,deviceclasses,resourceslices,resourceclaims,resourceclaimtemplates -A -o
json`): the objects are decoded into records exactly as watch events are, then translated into
the model (`pyctl.cluster.translate`), so a user can score a live cluster without installing
anything in it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyctl.cluster.dra import DraContext
from pyctl.cluster.dra_records import (
    ClaimRecord,
    ClaimTemplateRecord,
    DeviceClassRecord,
    SliceRecord,
)
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import (
    DRA_KINDS,
    KINDS,
    Kind,
    NodeRecord,
    NrtRecord,
    PdbRecord,
    PodRecord,
)
from pyctl.cluster.translate import TranslateError, models_of, pod_shape_problem, shape_of
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


def dra_context(data: Mapping[str, Any]) -> DraContext | None:
    """The dump's DRA objects (None if it has none)."""
    classes: list[DeviceClassRecord] = []
    slices: list[SliceRecord] = []
    claims: list[ClaimRecord] = []
    templates: list[ClaimTemplateRecord] = []
    for i, o in enumerate(data.get("items") or []):
        if not isinstance(o, Mapping) or o.get("kind") not in DRA_KINDS:
            continue
        try:
            r = decode_object(o["kind"], o)
        except DecodeError as e:
            raise DumpError(f"items[{i}]: {e}") from None
        if isinstance(r, DeviceClassRecord):
            classes.append(r)
        elif isinstance(r, SliceRecord):
            slices.append(r)
        elif isinstance(r, ClaimRecord):
            claims.append(r)
        elif isinstance(r, ClaimTemplateRecord):
            templates.append(r)
    if not (classes or slices or claims or templates):
        return None
    return DraContext.of(classes, slices, claims, templates)


def snapshot_from_dump(data: Mapping[str, Any]) -> Snapshot:
    nodes, pods, nrts = _records(data)
    try:
        return Snapshot(tuple(models_of(nodes, nrts, pods, dra=dra_context(data)).values()))
    except TranslateError as e:
        raise DumpError(str(e)) from None


def pod_shapes(data: Mapping[str, Any]) -> list[Shape]:
    """The task shapes of every pod in a dump that has not terminated (for deriving M), as the
    controller takes them: pods whose claims pyctl cannot tell (`dra_report` shows them) and
    pods whose shape the core cannot model are left out."""
    nodes, pods, _ = _records(data)
    dra = dra_context(data)
    by_name = {n.name: n for n in nodes}
    out = []
    for p in pods:
        if p.terminated:
            continue
        s = shape_of(p, dra, by_name.get(p.node))
        if s is not None and pod_shape_problem(p, s) is None:
            out.append(s)
    return out


def dra_report(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the dump's DRA objects say besides the score (None without DRA objects): per node,
    how its zones were found and what pyctl could not use; the pods whose claims pyctl cannot
    tell, with why; the running pods whose allocated devices span NUMA nodes."""
    from pyctl.cluster.dra import misaligned_pods, model_gpus

    dra = dra_context(data)
    if dra is None:
        return None
    nodes, pods, _ = _records(data)
    out_nodes = {}
    for n in nodes:
        nd = dra.node(n.name)
        if nd is None:
            continue
        dm = model_gpus(nd, n.gpu_model)
        out_nodes[n.name] = {
            "zones_by": dm.basis,
            "gpus": sum(1 for g in dm.gpus if g.whole),
            "dynamic_mig_gpus": sum(1 for g in dm.gpus if g.dynamic),
            "static_mig_gpus": sum(1 for g in dm.gpus if not g.whole and not g.dynamic),
            "both_ways": bool(dm.gpus and (n.gpus or n.mig)),
            "notes": dm.notes,
        }
    unknown = {}
    for p in pods:
        if p.claims and not p.terminated:
            need = dra.need(p.namespace, p.claims)
            if need.unknown:
                unknown[p.key] = need.unknown
    running = {p.key for p in pods if p.node and p.phase == "Running"}
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
