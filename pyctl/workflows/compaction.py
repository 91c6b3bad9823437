"""Replica compaction planning from the controller's view: which pods to evict and where each
would land, with the expected fragment reduction. The choice is the Rust core's
(`rust/src/compaction`); this module gathers its inputs (the model of every node, where each
pod sits, the evictable pods) and names the result."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from pyctl.cluster.records import NodeRecord, NrtRecord, PdbRecord, PodRecord
from pyctl.cluster.translate import (
    attribute_pods,
    node_from_records,
    pod_shape,
    pod_shape_problem,
)
from pyctl.core.fragmentation import FragmentationModel, shape_dict
from pyctl.model import Node, Shape, Snapshot, Workload
from pyctl.workflows.base import Context, Workflow, WorkflowKind
from pyctl.workflows.evictor import Evictor, EvictorOptions

KIND = "compaction"


@dataclass(frozen=True)
class PlannedMove:
    pod: str
    from_node: str
    to_node: str
    gain_gpu_milli: float
    assignment: Mapping[str, Any]


@dataclass(frozen=True)
class CompactionPlan:
    moves: tuple[PlannedMove, ...]
    refused: Mapping[str, str]
    considered: int

    @property
    def gain_gpu_milli(self) -> float:
        return sum(m.gain_gpu_milli for m in self.moves)


def plan_compaction(
    nodes: Mapping[str, NodeRecord],
    nrts: Mapping[str, NrtRecord],
    pods: Iterable[PodRecord],
    pdbs: Iterable[PdbRecord],
    workload: Workload,
    pending: Sequence[Shape] = (),
    options: EvictorOptions | None = None,
    max_moves: int = 10,
    pending_weight: float = 1.0,
    default_policy: str = "none",
    exclude: Mapping[str, str] | None = None,
) -> CompactionPlan:
    """Plan up to `max_moves` evictions. Pending shapes join the workload (with `pending_weight`
    in total) so that moves which make them admissible count. `exclude`: pod key -> why it is
    not to be moved now (listed in `refused`)."""
    all_pods = [p for p in pods if not p.terminated]
    by_node: dict[str, list[PodRecord]] = {}
    for p in all_pods:
        if p.node:
            by_node.setdefault(p.node, []).append(p)
    names = sorted(nodes)
    models: list[Node] = []
    where: dict[str, dict[str, Any]] = {}
    for name in names:
        node = node_from_records(nodes[name], nrts.get(name), by_node.get(name, []), default_policy)
        models.append(node)
        where.update(attribute_pods(node, by_node.get(name, [])))
    evictor = Evictor(options or EvictorOptions(), all_pods, pdbs)
    movable, refused = evictor.movable([p for p in all_pods if p.node in nodes])
    if exclude:  # pods not to plan again now (e.g. their eviction was denied for good)
        refused = {**refused, **{p.key: exclude[p.key] for p in movable if p.key in exclude}}
        movable = [p for p in movable if p.key not in exclude]
    shapes = list(workload.shapes)
    if pending:
        total = sum(s.weight for s in shapes)
        per = pending_weight * total / len(pending)
        shapes += [replace(s, weight=per) for s in pending]
    model = FragmentationModel(Snapshot(tuple(models)))
    index = {n: i for i, n in enumerate(names)}
    # a pod whose shape the core cannot model stays where it is (its usage still counts)
    placed = [p for p in movable if p.key in where and pod_shape_problem(p) is None]
    items = [
        {"node": index[p.node], "assignment": where[p.key], "shape": shape_dict(pod_shape(p))}
        for p in placed
    ]
    raw = model._core.plan_compaction(items, [shape_dict(s) for s in shapes], max_moves)
    moves = tuple(
        PlannedMove(
            pod=placed[m["pod"]].key,
            from_node=names[m["from"]],
            to_node=names[m["to"]],
            gain_gpu_milli=float(m["gain"]),
            assignment=m["assignment"],
        )
        for m in raw
    )
    return CompactionPlan(moves, refused, len(items))


# ---- the workflow: one planned move, evicted through the gate -----------------------------------


async def _evicting(ctx: Context, wf: Workflow) -> Workflow:
    ns, name, uid = wf.data["namespace"], wf.data["pod"], wf.data["uid"]
    pod = ctx.pod(ns, name)
    if pod is None or pod.uid != uid or pod.deleting or pod.node != wf.node:
        # the eviction already happened (or the pod moved on by itself): never evict twice
        return msgspec.structs.replace(wf, step="done", result="pod already gone")
    r = await ctx.gate.evict(pod, wf.node, workload=wf.data.get("workload", ""))
    if r.outcome == "done":
        return msgspec.structs.replace(wf, step="done", result="evicted")
    if r.outcome == "dry-run":
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    if not r.retriable:
        # protected by the evictor's rules, or denied by admission: this move is not made
        return msgspec.structs.replace(wf, step="abandoned", result=r.reason)
    attempts = wf.attempts + 1
    if attempts >= int(wf.data.get("max_attempts", "20")):
        return msgspec.structs.replace(wf, step="abandoned", attempts=attempts, result=r.reason)
    return msgspec.structs.replace(
        wf, attempts=attempts, not_before=ctx.clock() + max(r.retry_after, 1.0), result=r.reason
    )


def workflow_kind() -> WorkflowKind:
    """Compaction: one step, `evicting` (evict the planned pod; its controller recreates it and
    the scheduler, with pyctl's extender, places the replacement)."""
    return WorkflowKind(KIND, {"evicting": _evicting})
