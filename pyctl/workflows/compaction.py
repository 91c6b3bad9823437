"""Replica compaction planning from the controller's view: which pods to evict and where each
would land, and which evictions make room for a pending pod (a rescue). The decisions are the
core's planner (`pyctl.core.policy.plan`, rust/src/compaction); this module gathers its inputs
from the controller's one translation of the cluster (the reconciler's node models, where each
pod sits), the evictor's rules and budgets, and each pod's NodeFit (`pyctl.cluster.nodefit`),
then checks the plan's moves one after another against NodeFit (a move whose pod cannot land
where planned is not made; a rescue that loses a move is dropped whole)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from pyctl.cluster.dra import DraContext
from pyctl.cluster.nodefit import Fit, grouped, node_labels
from pyctl.cluster.records import NodeRecord, PdbRecord, PodRecord
from pyctl.cluster.translate import (
    DraPositions,
    attribute_pods,
    pod_shape,
    pod_shape_problem,
    shape_of,
)
from pyctl.core import policy
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Node, Shape, Snapshot, Workload
from pyctl.workflows.base import Context, Workflow, WorkflowKind
from pyctl.workflows.evictor import Evictor, EvictorOptions

KIND = "compaction"
#: the Event reason of a compaction's eviction
REASON = "PyctlCompaction"


@dataclass(frozen=True)
class PlannedMove:
    pod: str
    from_node: str
    to_node: str
    gain_gpu_milli: float
    assignment: Mapping[str, Any]
    #: index into `CompactionPlan.rescues`, when the move makes room for a pending pod
    rescue: int | None = None


@dataclass(frozen=True)
class PlannedRescue:
    """Room made on `node` for the pending pod `pending` by `moves`, in order."""

    pending: str
    node: str
    moves: tuple[PlannedMove, ...]
    #: evictions that wait for an earlier one's replacement (PodDisruptionBudgets)
    waits: int
    delta_gpu_milli: float


@dataclass(frozen=True)
class CompactionPlan:
    moves: tuple[PlannedMove, ...]
    refused: Mapping[str, str]
    considered: int
    rescues: tuple[PlannedRescue, ...] = ()
    #: pending pods no rescue within the limits could place, with why
    unrescued: Mapping[str, str] = field(default_factory=dict)

    @property
    def gain_gpu_milli(self) -> float:
        return sum(m.gain_gpu_milli for m in self.moves)


def _group(p: PodRecord) -> str | None:
    """Pods whose NodeFit depends on other pods: one group per owner (its replicas carry the
    same terms)."""
    if not grouped(p):
        return None
    return f"{p.namespace}/{p.owner_kind}/{p.owner_name}" if p.owner_name else p.key


class _Allowed:
    """Allowed destinations per pod, computed once per distinct set of constraints."""

    def __init__(self, fit: Fit, reserved: frozenset[str]) -> None:
        self.fit = fit
        self.reserved = reserved
        self._cache: dict[Any, frozenset[str]] = {}

    def __call__(self, p: PodRecord) -> frozenset[str] | None:
        inter = grouped(p) or bool(self.fit.repelling)
        key: Any = p.key if inter else p.constraints
        hit = self._cache.get(key)
        if hit is None:
            hit = self.fit.allowed(p) - self.reserved
            self._cache[key] = hit
        return hit


class RoundCache:
    """What a planning round derives per node and per pod, kept between rounds while its inputs
    are the same objects (records and models are replaced, never changed in place):

    - where each pod sits on each node (`attribute_pods`), for as long as the node's model is
      the same object: the reconciler replaces a node's model whenever the node, its pods or
      its DRA devices change;
    - each pod's shape as the planner moves it, for as long as the pod's record and its node's
      record are the same objects (pods without claims: a claim's shape depends on the DRA
      objects, derived every round);
    - each node's labels as NodeFit matches them, for as long as its record is the same object."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[Node, object, dict[str, dict[str, Any]]]] = {}
        self._shapes: dict[str, tuple[PodRecord, NodeRecord | None, Shape | None]] = {}
        self._next_shapes: dict[str, tuple[PodRecord, NodeRecord | None, Shape | None]] = {}
        self._labels: dict[str, tuple[NodeRecord, dict[str, str]]] = {}

    def shape(
        self, key: str, p: PodRecord, node: NodeRecord | None, dra: DraContext | None
    ) -> Shape | None:
        """The shape `p` (whose key is `key`) moves as (None: one the core cannot model, the pod
        stays)."""
        hit = self._shapes.get(key)
        if hit is not None and hit[0] is p and hit[1] is node:
            self._next_shapes[key] = hit
            return hit[2]
        got = shape_of(p, dra, node)
        shape: Shape | None = got if got is not None else pod_shape(p, node)
        if pod_shape_problem(p, shape) is not None:
            shape = None
        if not p.claims:
            self._next_shapes[key] = (p, node, shape)
        return shape

    def labels(self, nodes: Mapping[str, NodeRecord]) -> dict[str, dict[str, str]]:
        """Each of `nodes`' labels (`node_labels`); the nodes not asked for are forgotten."""
        kept, self._labels = self._labels, {}
        for name, rec in nodes.items():
            hit = kept.get(name)
            if hit is None or hit[0] is not rec:
                hit = (rec, node_labels(rec))
            self._labels[name] = hit
        return {name: hit[1] for name, hit in self._labels.items()}

    def end_round(self) -> None:
        """Forget the pods this round did not ask about."""
        self._shapes, self._next_shapes = self._next_shapes, {}

    def of(
        self,
        name: str,
        model: Node,
        pods: Sequence[PodRecord],
        positions: DraPositions | None,
    ) -> dict[str, dict[str, Any]]:
        hit = self._by_node.get(name)
        if hit is not None and hit[0] is model and hit[1] is positions:
            return hit[2]
        got = {key: _frozen(a) for key, a in attribute_pods(model, pods, positions).items()}
        self._by_node[name] = (model, positions, got)
        return got

    def keep_only(self, names: Iterable[str]) -> None:
        keep = set(names)
        for gone in [n for n in self._by_node if n not in keep]:
            del self._by_node[gone]


def _frozen(assignment: dict[str, Any]) -> dict[str, Any]:
    """An assignment as the cache keeps it: its lists as tuples. Kept for every pod between
    rounds (50,000 and more), lists would stay tracked by the cycle collector for good; tuples
    of numbers, and then the dicts holding only them, are untracked by its next passes."""
    return {k: tuple(v) if type(v) is list else v for k, v in assignment.items()}


def plan_compaction(
    models: Mapping[str, Node],
    nodes: Mapping[str, NodeRecord],
    pods: Iterable[PodRecord],
    pdbs: Iterable[PdbRecord],
    workload: Workload,
    pending: Sequence[PodRecord] = (),
    options: EvictorOptions | None = None,
    limits: policy.PlanLimits | None = None,
    reserved: Iterable[str] = (),
    dra: DraContext | None = None,
    dra_positions: Mapping[str, DraPositions] | None = None,
    round_cache: RoundCache | None = None,
    exclude: Mapping[str, str] | None = None,
) -> CompactionPlan:
    """Plan evictions on the cluster the reconciler modelled (`models`, by node name; nodes it
    could not model are left out). `pending`: unschedulable pods to make room for; `reserved`:
    nodes whose room is promised to a rescue in progress (nothing else goes there, and nothing
    is moved off them but by that rescue).

    With `dra` (the cluster's DRA objects) and `dra_positions` (per node, where each pod's DRA
    devices sit, as translation found them), pods whose GPUs come from claims are placed exactly
    where their allocation results say and move as DRA shapes; a pod with a standalone claim is
    not movable (its replacement would wait for the same devices), nor one whose claims pyctl
    cannot tell, nor a pod on a node whose GPUs are managed both by the device plugin and by a
    DRA driver. `round_cache`: what the last round derived per node and pod, kept (see
    `RoundCache`).

    `exclude`: pod key -> why it is not to be moved now (e.g. its last move was abandoned; listed
    in `refused`). A pod whose shape the core cannot model stays where it is (its usage still
    counts) and is never a pending pod to make room for."""
    all_pods = [p for p in pods if not p.terminated]
    names = sorted(n for n in models if n in nodes)
    by_node: dict[str, list[PodRecord]] = {}
    for p in all_pods:
        if p.node:
            by_node.setdefault(p.node, []).append(p)
    where: dict[str, dict[str, Any]] = {}
    both_ways: dict[str, str] = {}
    attributed = round_cache if round_cache is not None else RoundCache()
    for name in names:
        where.update(
            attributed.of(
                name, models[name], by_node.get(name, []), (dra_positions or {}).get(name)
            )
        )
        if _both_ways(models[name], nodes[name]):
            both_ways[name] = (
                f"node {name}: its GPUs are managed both by the device plugin and by a DRA "
                "driver (pyctl does not move pods there)"
            )
    pdb_list = list(pdbs)
    evictor = Evictor(options or EvictorOptions(), all_pods, pdb_list)
    movable, refused_by_rules = evictor.movable([p for p in all_pods if p.node in models])
    refused = dict(refused_by_rules)
    if exclude:  # pods not to plan again now (e.g. their eviction was denied for good)
        refused.update({p.key: exclude[p.key] for p in movable if p.key in exclude})
        movable = [p for p in movable if p.key not in exclude]
    # a node a rescue in progress holds is that rescue's: it evicts what its plan needs there,
    # and nothing else moves pods off it meanwhile (no eviction beyond the plan, none twice)
    held = frozenset(reserved)
    refused.update(
        {p.key: f"node {p.node} is held by a rescue in progress" for p in movable if p.node in held}
    )
    movable = [p for p in movable if p.node not in held]
    fit_nodes = {n: nodes[n] for n in names}
    fit = Fit(fit_nodes, all_pods, attributed.labels(fit_nodes))
    allowed = _Allowed(fit, held)
    items: list[policy.MovablePod] = []
    for p in movable:
        key = p.key
        assignment = where.get(key)
        if assignment is None:
            continue
        why = _unmovable_dra(p, dra, both_ways)
        if why is not None:
            refused[key] = why
            continue
        shape = attributed.shape(key, p, nodes.get(p.node), dra)
        if shape is None:
            continue
        pdb = next(iter(evictor.covering(p)), None)
        items.append(
            policy.MovablePod(
                key=key,
                node=p.node,
                assignment=assignment,
                shape=shape,
                allowed=allowed(p),
                pdb=pdb.key if pdb is not None else None,
                pdb_headroom=evictor.pdb_headroom(p) or 0,
                group=_group(p),
            )
        )
    pend: list[policy.PendingPod] = []
    for p in pending:
        want = shape_of(p, dra) if not p.node else None
        if want is not None and not want.is_cpu_only and pod_shape_problem(p, want) is None:
            pend.append(policy.PendingPod(p.key, want, allowed(p)))
    model = FragmentationModel(Snapshot(tuple(models[n] for n in names)))
    raw = policy.plan(model, items, pend, workload, limits)
    attributed.keep_only(names)
    attributed.end_round()

    def pod_of(key: str, node: str) -> PodRecord | None:
        return next((p for p in by_node.get(node, ()) if p.key == key), None)

    moves, rescues, dropped = _verified(raw, fit, pod_of)
    unrescued = dict.fromkeys(raw.unrescued, "no set of moves within the limits makes room")
    unrescued.update(dropped)
    return CompactionPlan(moves, refused, len(items), rescues, unrescued)


def _both_ways(model: Node, rec: NodeRecord) -> bool:
    """Whether the node's GPUs are managed both by the device plugin and by a DRA driver."""
    dra_gpus = any(z.dra_gpus or any(m.dra for m in z.mig) for z in model.zones)
    return dra_gpus and bool(rec.gpus or rec.mig)


def _unmovable_dra(
    p: PodRecord, dra: DraContext | None, both_ways: Mapping[str, str]
) -> str | None:
    """Why a pod's DRA claims keep it where it is (None: they do not)."""
    if p.node in both_ways:
        return both_ways[p.node]
    if not p.claims or dra is None:
        return None
    need = dra.need(p.namespace, p.claims)
    if need.unknown:
        return f"its claims are unknown to pyctl: {need.unknown}"
    if not need.movable:
        return "it uses a standalone ResourceClaim (a replacement would wait for the same devices)"
    return None


def _verified(
    raw: policy.Plan, fit: Fit, pod_of: Callable[[str, str], PodRecord | None]
) -> tuple[tuple[PlannedMove, ...], tuple[PlannedRescue, ...], dict[str, str]]:
    """The plan's moves checked in order against NodeFit as they would leave the cluster
    (`pod_of(key, node)`: the record of the pod `key` on `node`). A pod whose fit depends on no
    other pod, on a cluster where no pod repels others, is checked on `fit` itself (its answer
    is the same whatever pods run where); otherwise on the cluster with the moves before it."""
    moved: dict[str, PodRecord] = {}
    running: dict[str, PodRecord] | None = None  # every running pod, made on first need
    bad_rescues: dict[int, str] = {}
    ok_moves: list[policy.Move] = []
    for mv in raw.moves:
        p = moved.get(mv.pod) or pod_of(mv.pod, mv.from_node)
        if p is None:
            continue
        view = fit
        if grouped(p) or fit.repelling:
            if running is None:
                running = {q.key: q for q in fit.running}
                running.update(moved)
            view = fit.with_pods(running.values())
        why = view.why_not(p, mv.to_node, mv.from_node)
        if why is not None:
            if mv.rescue is not None:
                bad_rescues[mv.rescue] = f"{mv.pod} cannot land on {mv.to_node}: {why}"
            continue
        landed = msgspec.structs.replace(p, node=mv.to_node)
        moved[p.key] = landed
        if running is not None:
            running[p.key] = landed
        ok_moves.append(mv)
    index: dict[int, int] = {}
    rescues: list[PlannedRescue] = []
    for i, r in enumerate(raw.rescues):
        if i in bad_rescues:
            continue
        index[i] = len(rescues)
        rescues.append(PlannedRescue(r.pending, r.node, (), r.waits, r.delta))
    moves: list[PlannedMove] = []
    for mv in ok_moves:
        if mv.rescue is not None and mv.rescue in bad_rescues:
            continue
        ri = None if mv.rescue is None else index[mv.rescue]
        moves.append(PlannedMove(mv.pod, mv.from_node, mv.to_node, mv.gain, mv.assignment, ri))
    rescues = [
        replace(r, moves=tuple(m for m in moves if m.rescue == i)) for i, r in enumerate(rescues)
    ]
    dropped = {raw.rescues[i].pending: why for i, why in bad_rescues.items()}
    return tuple(moves), tuple(rescues), dropped


# ---- the workflow: one planned move, evicted through the gate -----------------------------------


async def _evicting(ctx: Context, wf: Workflow) -> Workflow:
    ns, name, uid = wf.data["namespace"], wf.data["pod"], wf.data["uid"]
    pod = ctx.pod(ns, name)
    if pod is None or pod.uid != uid or pod.deleting or pod.node != wf.node:
        # the eviction already happened (or the pod moved on by itself): never evict twice
        return msgspec.structs.replace(wf, step="done", result="pod already gone")
    r = await ctx.gate.evict(pod, wf.node, workload=wf.data.get("workload", ""), reason=REASON)
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
