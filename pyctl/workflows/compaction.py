"""Replica compaction planning from the controller's view: which pods to evict and where each
would land, and which evictions make room for a pending pod (a rescue). The decisions are the
core's planner (`pyctl.core.policy.plan`, rust/src/compaction); this module gathers its inputs
from the controller's one translation of the cluster (the reconciler's node models, where each
pod sits), the evictor's rules and budgets, and each pod's NodeFit (`pyctl.cluster.nodefit`),
then checks the plan's moves one after another against NodeFit (a move whose pod cannot land
where planned is not made; a rescue that loses a move is dropped whole)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from pyctl.cluster.bounds import Name, Text
from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.gangs import VolcanoGang, gangs_of, gangs_with_outer
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
from pyctl.core.fabric import cheapest_domain, valid_domain
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.inputs import AssignmentInput
from pyctl.model import Gang, Node, Shape, Snapshot, Workload
from pyctl.workflows.base import Context, Namespace, Uid, Workflow, WorkflowData, WorkflowKind
from pyctl.workflows.evictor import Evictor, EvictorOptions

KIND = "compaction"
#: the Event reason of a compaction's eviction
REASON = "PyctlCompaction"


class CompactionData(WorkflowData, frozen=True, tag=f"{KIND}/1"):
    """A compaction workflow's data: the pod it evicts off the workflow's node."""

    namespace: Namespace
    pod: Name
    #: the pod's uid when the move was planned (a pod recreated under its name is not evicted)
    uid: Uid = ""
    #: "kind/name" of the pod's owner
    workload: Text = ""
    #: where the plan expects its replacement to land
    to: Name = ""
    gain_gpu_milli: float = 0.0
    #: evictions tried (refused by a budget, say) before the move is abandoned
    max_attempts: int = 20

    def named(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.namespace and self.pod else ""


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
    #: pending pods of a gang none of whose pods runs yet: the domain their rescue makes room
    #: in, and why that one (`gang_domain`)
    gang_domains: Mapping[str, str] = field(default_factory=dict)
    #: nodes whose pods the round derived (the others' it kept from the round before,
    #: `RoundCache`); not part of the plan
    derived: int = field(default=0, compare=False)

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
    """Allowed destinations per pod, computed once per distinct set of constraints per round,
    and each set the same object as the round before's when it is the same (`intern`), so that
    a block's check (`_Block`) compares them by identity."""

    def __init__(
        self, fit: Fit, reserved: frozenset[str], intern: Callable[[frozenset[str]], frozenset[str]]
    ) -> None:
        self.fit = fit
        self.reserved = reserved
        self.intern = intern
        self._cache: dict[Any, frozenset[str]] = {}

    def inter(self, p: PodRecord) -> bool:
        """Whether `p`'s destinations depend on where the other pods are."""
        return grouped(p) or bool(self.fit.repelling)

    def __call__(self, p: PodRecord) -> frozenset[str] | None:
        key: Any = p.key if self.inter(p) else p.constraints
        hit = self._cache.get(key)
        if hit is None:
            hit = self.intern(self.fit.allowed(p) - self.reserved)
            self._cache[key] = hit
        return hit


@dataclass(slots=True)
class _Block:
    """What a round derived from one node's pods: the pods it may move (each with its record,
    in the order given) and why the others may not. Used again by a later round while its
    inputs are the same: the pod records and the node's record, model and DRA positions (the
    same objects), whether the node is held and `exclude` names none of its pods, the
    evictor's round-wide facts of one pod per kind (`reps`: pods of one owner, labels and
    constraints share them), the allowed destinations of one pod that may move per set of
    constraints (`movers`), and the clock before `until`. A node with a pod whose input is the
    whole cluster's (claims: the DRA objects; inter-pod constraints: every pod) is derived again
    every round (`reps` None). Tuples, not lists: kept for every node between rounds, they
    (their items are untracked records) drop out of the cycle collector's passes."""

    #: the pods' identities (the block holds `pods`, so no other object can take their ids)
    ids: tuple[int, ...]
    pods: tuple[PodRecord, ...]
    model: Node
    rec: NodeRecord | None
    positions: DraPositions | None
    held: bool
    reps: tuple[PodRecord, ...] | None
    #: one pod that may move per set of constraints (their allowed destinations are shared)
    movers: tuple[PodRecord, ...]
    facts: tuple[Any, ...]
    until: float
    items: tuple[tuple[PodRecord, policy.MovablePod], ...]
    refused: dict[str, str]


class RoundCache:
    """What a planning round derives per node and per pod, kept between rounds while its inputs
    are the same objects (records and models are replaced, never changed in place):

    - each node's movable pods as the planner takes them, and why the others may not move
      (`_Block`), while the node's inputs are the same;
    - where each pod sits on each node (`attribute_pods`), for as long as the node's model is
      the same object: the reconciler replaces a node's model whenever the node, its pods or
      its DRA devices change;
    - each pod's shape as the planner moves it, for as long as the pod's record and its node's
      record are the same objects (pods without claims: a claim's shape depends on the DRA
      objects, derived every round);
    - each node's labels as NodeFit matches them, for as long as its record is the same object.

    A round with a cache plans exactly what it would plan without one (tests/unit/
    test_compaction.py changes the cluster between rounds and compares)."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[Node, object, dict[str, AssignmentInput]]] = {}
        self._shapes: dict[str, tuple[PodRecord, NodeRecord | None, Shape | None]] = {}
        self._next_shapes: dict[str, tuple[PodRecord, NodeRecord | None, Shape | None]] = {}
        self._labels: dict[str, tuple[NodeRecord, dict[str, str]]] = {}
        self._blocks: dict[str, _Block] = {}
        self._next_blocks: dict[str, _Block] = {}
        self._options: EvictorOptions | None = None
        self._sets: dict[frozenset[str], frozenset[str]] = {}
        self._next_sets: dict[frozenset[str], frozenset[str]] = {}

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

    def interned(self, allowed: frozenset[str]) -> frozenset[str]:
        """`allowed`, as the object the last round had when it was equal."""
        got = self._sets.get(allowed)
        if got is None:
            got = self._next_sets.get(allowed, allowed)
        self._next_sets[got] = got
        return got

    def start_round(self, options: EvictorOptions) -> None:
        """Blocks derived under other evictor options are not used; nor is what a round that
        did not end (it raised) kept for the next."""
        self._next_blocks, self._next_sets = {}, {}
        if options != self._options:
            self._blocks = {}
            self._options = options

    def block(self, name: str) -> _Block | None:
        return self._blocks.get(name)

    def keep(self, name: str, block: _Block) -> None:
        self._next_blocks[name] = block

    def end_round(self) -> None:
        """Forget the pods, nodes and destination sets this round did not ask about."""
        self._shapes, self._next_shapes = self._next_shapes, {}
        self._blocks, self._next_blocks = self._next_blocks, {}
        self._sets, self._next_sets = self._next_sets, {}

    def of(
        self,
        name: str,
        model: Node,
        pods: Sequence[PodRecord],
        positions: DraPositions | None,
    ) -> dict[str, AssignmentInput]:
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


def _frozen(assignment: AssignmentInput) -> AssignmentInput:
    """An assignment as the cache keeps it: its lists as tuples. Kept for every pod between
    rounds (50,000 and more), lists would stay tracked by the cycle collector for good; tuples
    of numbers, and then the dicts holding only them, are untracked by its next passes."""
    a = assignment.copy()
    if "cpu" in a:
        a["cpu"] = tuple(a["cpu"])
    if "memory" in a:
        a["memory"] = tuple(a["memory"])
    if "gpus" in a:
        a["gpus"] = tuple(a["gpus"])
    if "dra_gpus" in a:
        a["dra_gpus"] = tuple(a["dra_gpus"])
    if "dyn_whole" in a:
        a["dyn_whole"] = tuple(a["dyn_whole"])
    return a


@dataclass
class _Round:
    """One round's inputs, and the derivation of a node's block from them."""

    cache: RoundCache
    models: Mapping[str, Node]
    nodes: Mapping[str, NodeRecord]
    evictor: Evictor
    allowed: _Allowed
    held: frozenset[str]
    exclude: Mapping[str, str]
    #: nodes with a pod `exclude` names
    excluded: frozenset[str]
    dra: DraContext | None
    positions: Mapping[str, DraPositions]

    def block(self, name: str, on: list[PodRecord]) -> _Block:
        """Node `name`'s block for its pods `on` (running, in their order): the last round's
        if its inputs are the same (`_Block`), else derived now."""
        model, rec, positions = self.models[name], self.nodes.get(name), self.positions.get(name)
        held = name in self.held
        last = self.cache.block(name)
        if (
            last is not None
            and last.reps is not None
            and last.model is model
            and last.rec is rec
            and last.positions is positions
            and last.held is held
            and name not in self.excluded
            and not self.allowed.fit.repelling
            and last.ids == tuple(map(id, on))
            and self.evictor.clock() < last.until
            and self._facts(last.reps, last.movers) == last.facts
        ):
            self.cache.keep(name, last)
            return last
        got = self._derive(name, on, model, rec, positions, held)
        if name not in self.excluded:
            self.cache.keep(name, got)
        return got

    def _facts(self, reps: tuple[PodRecord, ...], movers: tuple[PodRecord, ...]) -> tuple[Any, ...]:
        """The round-wide values the block's pods were judged on: the evictor's facts per kind
        of pod, then the allowed destinations of the pods that may move, per set of constraints
        (only theirs: a NodeFit pass over every node for each pod kept in place, a DaemonSet's
        pinned to its node, would cost more than the block saves)."""
        return tuple(self.evictor.facts(r) for r in reps) + tuple(self.allowed(m) for m in movers)

    def _derive(
        self,
        name: str,
        on: list[PodRecord],
        model: Node,
        rec: NodeRecord | None,
        positions: DraPositions | None,
        held: bool,
    ) -> _Block:
        ev = self.evictor
        movable, by_rules = ev.movable(on)
        refused = dict(by_rules)
        if self.exclude:  # pods not to plan again now (e.g. their eviction was denied for good)
            refused.update({p.key: self.exclude[p.key] for p in movable if p.key in self.exclude})
            movable = [p for p in movable if p.key not in self.exclude]
        # a node a rescue in progress holds is that rescue's: it evicts what its plan needs
        # there, and nothing else moves pods off it meanwhile (no eviction beyond the plan, none
        # twice)
        if held:
            refused.update({p.key: f"node {name} is held by a rescue in progress" for p in movable})
            movable = []
        where = self.cache.of(name, model, on, positions) if rec is not None else {}
        both = rec is not None and _both_ways(model, rec)
        items: list[tuple[PodRecord, policy.MovablePod]] = []
        for p in movable:
            key = p.key
            assignment = where.get(key)
            if assignment is None:
                continue
            why = _unmovable_dra(p, self.dra, name if both else None)
            if why is not None:
                refused[key] = why
                continue
            shape = self.cache.shape(key, p, rec, self.dra)
            if shape is None:
                continue
            pdb = next(iter(ev.covering(p)), None)
            mp = policy.MovablePod(
                key=key,
                node=name,
                assignment=assignment,
                shape=shape,
                allowed=self.allowed(p),
                pdb=pdb.key if pdb is not None else None,
                pdb_headroom=ev.pdb_headroom(p) or 0,
                group=_group(p),
            )
            items.append((p, mp))
        # one pod per kind, unless a pod's input is the whole cluster's
        reps: tuple[PodRecord, ...] | None = None
        movers: tuple[PodRecord, ...] = ()
        if not any(p.claims or self.allowed.inter(p) for p in on):
            movers = tuple({p.constraints: p for p, _ in items}.values())
            kinds: dict[Any, PodRecord] = {}
            for p in on:
                kinds.setdefault(
                    (p.namespace, p.owner_kind, p.owner_name, p.labels, p.constraints), p
                )
            reps = tuple(kinds.values())
        until = min((ev.holds_until(p) for p in on), default=math.inf)
        facts = self._facts(reps, movers) if reps is not None else ()
        return _Block(
            tuple(map(id, on)), tuple(on), model, rec, positions, held, reps, movers, facts,
            until, tuple(items), refused,
        )  # fmt: skip


GANG_KEPT = "a running pod of a gang that must share one domain (moving it could break the domain)"


def _keep_gangs_whole(
    pods: Sequence[PodRecord],
    chosen: dict[int, policy.MovablePod],
    refused: dict[str, str],
    pod_groups: Mapping[str, VolcanoGang] | None = None,
) -> None:
    """Moves never break a gang's domain: a running pod that says its gang (Kueue's or KAI's
    required topology, a LeaderWorkerSet group: `PodRecord.gang`; a Volcano PodGroup that is a
    gang, `pod_groups`) is not moved. (A gang of required pod affinity needs no rule here:
    NodeFit keeps its pods' destinations in the domain of the others.)"""
    said = [p for p in pods if p.node and (p.gang is not None or (pod_groups and p.pod_group))]
    if not said:
        return
    members = gangs_of(said, pod_groups)
    for p in said:
        if p.key in members and id(p) in chosen:
            del chosen[id(p)]
            refused[p.key] = GANG_KEPT


def _nodes_of(pods: Iterable[PodRecord], keys: Mapping[str, str]) -> frozenset[str]:
    if not keys:
        return frozenset()
    return frozenset(p.node for p in pods if p.key in keys)


def plan_compaction(
    models: Mapping[str, Node],
    nodes: Mapping[str, NodeRecord],
    pods: Iterable[PodRecord],
    pdbs: Iterable[PdbRecord],
    workload: Workload,
    pending: Sequence[PodRecord] = (),
    options: EvictorOptions | None = None,
    limits: policy.PlanLimits | None = None,
    reserved: Iterable[str] | Mapping[str, str] = (),
    dra: DraContext | None = None,
    pod_groups: Mapping[str, VolcanoGang] | None = None,
    domain_labels: Mapping[str, Mapping[str, str]] | None = None,
    dra_positions: Mapping[str, DraPositions] | None = None,
    round_cache: RoundCache | None = None,
    exclude: Mapping[str, str] | None = None,
) -> CompactionPlan:
    """Plan evictions on the cluster the reconciler modelled (`models`, by node name; nodes it
    could not model are left out). `pending`: unschedulable pods to make room for; `reserved`:
    nodes whose room is promised to a rescue in progress (nothing else goes there, and nothing
    is moved off them but by that rescue); as a mapping, node -> the pending pod's key (the
    nodes kept for a pod of a gang still count for that gang's domain: `_pending`).

    With `dra` (the cluster's DRA objects) and `dra_positions` (per node, where each pod's DRA
    devices sit, as translation found them), pods whose GPUs come from claims are placed exactly
    where their allocation results say and move as DRA shapes; a pod with a standalone claim is
    not movable (its replacement would wait for the same devices), nor one whose claims pyctl
    cannot tell, nor a pod on a node whose GPUs are managed both by the device plugin and by a
    DRA driver. `round_cache`: what the last round derived per node and pod, kept (see
    `RoundCache`).

    `exclude`: pod key -> why it is not to be moved now (e.g. its last move was abandoned; listed
    in `refused`). A pod whose shape the core cannot model stays where it is (its usage still
    counts) and is never a pending pod to make room for.

    `pod_groups`: Volcano's PodGroups that are gangs or hold some (`namespace/name` ->
    `VolcanoGang`: `fabric_sources.volcano_gangs`), and `domain_labels` each node's domains at
    levels no node label says (node -> level key -> domain: the HyperNodes' tiers), so a Volcano
    gang is rescued in one domain and its running pods are not moved, as any gang's."""
    all_pods = [p for p in pods if not p.terminated]
    names = sorted(n for n in models if n in nodes)
    by_node: dict[str, list[PodRecord]] = {}
    for p in all_pods:
        if p.node:
            by_node.setdefault(p.node, []).append(p)
    cache = round_cache if round_cache is not None else RoundCache()
    evictor = Evictor(options or EvictorOptions(), all_pods, list(pdbs))
    cache.start_round(evictor.options)
    held = frozenset(reserved)
    fit_nodes = {n: nodes[n] for n in names}
    fit = Fit(fit_nodes, all_pods, cache.labels(fit_nodes))
    allowed = _Allowed(fit, held, cache.interned)
    excluded = exclude or {}
    rnd = _Round(
        cache, models, nodes, evictor, allowed, held, excluded, _nodes_of(all_pods, excluded),
        dra, dra_positions or {},
    )  # fmt: skip
    refused: dict[str, str] = {}
    chosen: dict[int, policy.MovablePod] = {}
    derived = 0
    for name, on in by_node.items():
        if name not in models:
            continue
        block = rnd.block(name, on)
        derived += block is not cache.block(name)
        refused.update(block.refused)
        for p, item in block.items:
            chosen[id(p)] = item
    _keep_gangs_whole(all_pods, chosen, refused, pod_groups)
    # in the order the pods were given (the planner breaks ties by it)
    items = [mp for p in all_pods if (mp := chosen.get(id(p))) is not None]
    holders = dict(reserved) if isinstance(reserved, Mapping) else {}
    pend, domains = _pending(
        pending, all_pods, allowed, models, nodes, dra, holders, pod_groups, domain_labels
    )
    model = FragmentationModel(Snapshot(tuple(models[n] for n in names)))
    raw = policy.plan(model, items, pend, workload, limits)
    cache.keep_only(names)
    cache.end_round()

    def pod_of(key: str, node: str) -> PodRecord | None:
        return next((p for p in by_node.get(node, ()) if p.key == key), None)

    moves, rescues, dropped = _verified(raw, fit, pod_of)
    rescues += _holds(pending, pend, raw, rescues, models)
    unrescued = dict.fromkeys(raw.unrescued, "no set of moves within the limits makes room")
    unrescued.update(dropped)
    return CompactionPlan(moves, refused, len(items), rescues, unrescued, domains, derived)


def _pending(
    pending: Sequence[PodRecord],
    all_pods: Sequence[PodRecord],
    allowed: _Allowed,
    models: Mapping[str, Node],
    nodes: Mapping[str, NodeRecord],
    dra: DraContext | None,
    holders: Mapping[str, str],
    pod_groups: Mapping[str, VolcanoGang] | None = None,
    domain_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[list[policy.PendingPod], dict[str, str]]:
    """The pending pods to make room for, each with where the room may be (NodeFit; for a pod
    of a gang, one domain: where its gang's running pods are, `_running_domain`, or for a gang
    none of whose pods runs yet the one `gang_domain` chooses), and why that domain, by pod.

    `holders`: the nodes rescues keep (node -> the pod they are kept for). They are no pod's
    destination, but a node kept for a pod of the same gang still counts for the gang's domain:
    until the gang's first pod lands (a Kueue pod group is admitted only whole), each round
    keeps to the domain the earlier rounds began to free."""
    pend: list[policy.PendingPod] = []
    gangs: dict[str, Gang] = {}
    outer: dict[str, Gang] = {}
    if pending:
        keys = {p.key for p in all_pods}
        fresh = [p for p in pending if p.key not in keys and not p.terminated]
        gangs, outer = gangs_with_outer([*all_pods, *fresh], pod_groups)
    # the gangs with a pod on a node, and those pods' nodes: the others go to their domain
    running: dict[int, set[str]] = {}
    for p in all_pods if gangs else ():
        for g in (gangs.get(p.key), outer.get(p.key)):
            if p.node and not p.terminated and g is not None:
                running.setdefault(id(g), set()).add(p.node)

    def where(
        g: Gang, want: Shape, dest: frozenset[str], on: set[str] | None, kept: frozenset[str]
    ) -> tuple[frozenset[str], str]:
        return _gang_dest(g, want, dest, on, kept, models, nodes, domain_labels)

    # one gang's pods share their constraints: their domain is chosen once
    chosen_domain: dict[tuple[int, frozenset[str]], tuple[frozenset[str], str]] = {}
    domains: dict[str, str] = {}
    for p in pending:
        want = shape_of(p, dra) if not p.node else None
        if want is not None and not want.is_cpu_only and pod_shape_problem(p, want) is None:
            dest = allowed(p)
            gang = gangs.get(p.key)
            said = ""
            whole = outer.get(p.key)
            if whole is not None and dest is not None:
                # a Volcano sub-group's pod: inside its PodGroup's domain first
                kept = frozenset(n for n, q in holders.items() if outer.get(q) is whole)
                dest, said = where(whole, want, dest, running.get(id(whole)), kept)
                if said:
                    domains[p.key] = said
            if gang is not None and dest is not None:
                k = (id(gang), dest)
                if k not in chosen_domain:
                    kept = frozenset(n for n, q in holders.items() if gangs.get(q) is gang)
                    chosen_domain[k] = where(gang, want, dest, running.get(id(gang)), kept)
                dest, why = chosen_domain[k]
                if why:
                    domains[p.key] = f"{said}; {why}" if said else why
            pend.append(policy.PendingPod(p.key, want, dest))
    return pend, domains


def _gang_dest(
    gang: Gang,
    want: Shape,
    dest: frozenset[str],
    on: set[str] | None,
    kept: frozenset[str],
    models: Mapping[str, Node],
    nodes: Mapping[str, NodeRecord],
    domains: Mapping[str, Mapping[str, str]] | None,
) -> tuple[frozenset[str], str]:
    """Where a rescue makes room for a pod of `gang` among `dest`, and why: the domain of its
    running pods (on the nodes `on`, `_running_domain`), or, none running, the one
    `gang_domain` chooses, counting the nodes rescues keep for the gang (`kept`: no
    destination, but part of the domain the earlier rounds began to free)."""
    if on:
        return _running_domain(gang, dest, on, nodes, domains)
    d, why = gang_domain(gang, want, dest | kept, models, nodes, domains)
    return d - kept, why


def _domain_of(
    node: str,
    key: str,
    nodes: Mapping[str, NodeRecord],
    domains: Mapping[str, Mapping[str, str]] | None,
) -> str | None:
    """A node's domain at the level `key`: its label, else its domain there in `domains` (node
    -> level key -> domain: Volcano's HyperNode tiers); None if neither says a valid one."""
    rec = nodes.get(node)
    v = dict(rec.labels).get(key) if rec is not None else None
    if v is None and domains:
        v = domains.get(node, {}).get(key)
    return v if v is not None and valid_domain(v) else None


def _running_domain(
    gang: Gang,
    dest: frozenset[str],
    on: set[str],
    nodes: Mapping[str, NodeRecord],
    domains: Mapping[str, Mapping[str, str]] | None,
) -> tuple[frozenset[str], str]:
    """Where a rescue makes room for a pod of `gang` while others of it run (on the nodes
    `on`): the nodes of `dest` in their domain of the gang's level, the only place the gang's
    scheduler puts it (NodeFit already says so for a gang of required pod affinity; a Volcano
    PodGroup's, KAI's or Kueue's topology is not a pod constraint NodeFit reads). Nowhere, with
    why, when the running pods are in no domain or in several (the gang is already split: no
    eviction joins it again)."""
    where = {_domain_of(n, gang.key, nodes, domains) for n in on}
    what = f"gang of {gang.pods} pods in one {gang.key} domain"
    if len(where) != 1 or None in where:
        said = ", ".join(sorted(d or "none" for d in where))
        return frozenset(), f"{what}: its running pods are in domains {said}; no room made"
    [domain] = where
    inside = frozenset(n for n in dest if _domain_of(n, gang.key, nodes, domains) == domain)
    return inside, f"{what}, {len(on)} running in {domain}: room made there only"


def _holds(
    pending: Sequence[PodRecord],
    pend: Sequence[policy.PendingPod],
    raw: policy.Plan,
    rescues: Sequence[PlannedRescue],
    models: Mapping[str, Node],
) -> tuple[PlannedRescue, ...]:
    """Room kept for the gated pending pods that fit now: a rescue with no evictions each, on
    the first node by name among the pod's destinations with idle GPUs enough, one per node,
    none on a node of another rescue. A scheduling gate holds such a pod back until its whole
    group fits (Kueue admits a pod group only whole), so, unlike an unschedulable pod, it does
    not take the room it fits in now; the rescue's reservation keeps that room (the extender
    sends no other pod there) while the rounds make the rest of the group's."""
    gated = {p.key for p in pending if p.gated}
    if not gated:
        return ()
    settled = {r.pending for r in raw.rescues} | set(raw.unrescued)
    taken = {r.node for r in rescues}
    out: list[PlannedRescue] = []
    for pp in pend:
        if pp.key not in gated or pp.key in settled:
            continue
        for n in sorted(pp.allowed if pp.allowed is not None else models):
            if n not in taken and n in models and _idle_gpus(models[n]) >= pp.shape.gpus:
                taken.add(n)
                out.append(PlannedRescue(pp.key, n, (), 0, 0.0))
                break
    return tuple(out)


def _idle_gpus(n: Node) -> int:
    """Whole GPUs of the node no pod uses (device plugin and DRA)."""
    return sum(1 for z in n.zones for g in (*z.gpus, *z.dra_gpus) if g.used_milli == 0)


def _all_gpus(n: Node) -> int:
    return sum(len(z.gpus) + len(z.dra_gpus) for z in n.zones)


def gang_domain(
    gang: Gang,
    want: Shape,
    dest: frozenset[str],
    models: Mapping[str, Node],
    nodes: Mapping[str, NodeRecord],
    domains: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[frozenset[str], str]:
    """Where a rescue makes room for a pod of `gang` none of whose pods runs yet: the nodes of
    one domain of its level among `dest` (the scheduler's filters), the one cheapest to free
    for the whole gang (`pyctl.core.fabric.cheapest_domain`: the fewest GPUs to free, its
    `pods` x `want.gpus` less the domain's idle GPUs; ties to the one with the least idle GPU,
    then by name; only domains with GPUs enough for the gang). So each round frees room in the
    same domain until the gang's first pod lands there (then `_running_domain` confines the
    others to it). A node's domain: `_domain_of`. Returns `dest` and "" when no domain of `dest`
    can hold the gang."""
    need = gang.pods * want.gpus
    per: dict[str, list[str]] = {}
    for n in sorted(dest):
        if n not in models or n not in nodes:
            continue
        v = _domain_of(n, gang.key, nodes, domains)
        if v is not None:
            per.setdefault(v, []).append(n)
    gpus = {
        domain: (
            sum(_idle_gpus(models[n]) for n in members),
            sum(_all_gpus(models[n]) for n in members),
        )
        for domain, members in per.items()
    }
    best = cheapest_domain(need, gpus)
    if best is None:
        return dest, ""
    why = (
        f"gang of {gang.pods} x {want.gpus} GPUs in one {gang.key} domain, none running yet: "
        f"room made in {best.domain} ({best.idle} GPUs idle, {best.to_free} to free; the "
        f"cheapest of {len(per)} domain(s) to free for the whole gang)"
    )
    return frozenset(per[best.domain]), why


def _both_ways(model: Node, rec: NodeRecord) -> bool:
    """Whether the node's GPUs are managed both by the device plugin and by a DRA driver."""
    dra_gpus = any(z.dra_gpus or any(m.dra for m in z.mig) for z in model.zones)
    return dra_gpus and bool(rec.gpus or rec.mig)


def _unmovable_dra(p: PodRecord, dra: DraContext | None, both_ways: str | None) -> str | None:
    """Why a pod's DRA claims keep it where it is (None: they do not); `both_ways`: its node,
    if its GPUs are managed both by the device plugin and by a DRA driver."""
    if both_ways is not None:
        return (
            f"node {both_ways}: its GPUs are managed both by the device plugin and by a DRA "
            "driver (pyctl does not move pods there)"
        )
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


async def _evicting(ctx: Context, wf: Workflow[CompactionData]) -> Workflow[CompactionData]:
    d = wf.data
    ns, name, uid = d.namespace, d.pod, d.uid
    pod = ctx.pod(ns, name)
    if pod is None or pod.uid != uid or pod.deleting or pod.node != wf.node:
        # the eviction already happened (or the pod moved on by itself): never evict twice
        return msgspec.structs.replace(wf, step="done", result="pod already gone")
    r = await ctx.gate.evict(pod, wf.node, workload=d.workload, reason=REASON)
    if r.outcome == "done":
        return msgspec.structs.replace(wf, step="done", result="evicted")
    if r.outcome == "dry-run":
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    if not r.retriable:
        # protected by the evictor's rules, or denied by admission: this move is not made
        return msgspec.structs.replace(wf, step="abandoned", result=r.reason)
    attempts = wf.attempts + 1
    if attempts >= d.max_attempts:
        return msgspec.structs.replace(wf, step="abandoned", attempts=attempts, result=r.reason)
    return msgspec.structs.replace(
        wf, attempts=attempts, not_before=ctx.clock() + max(r.retry_after, 1.0), result=r.reason
    )


def workflow_kind() -> WorkflowKind[CompactionData]:
    """Compaction: one step, `evicting` (evict the planned pod; its controller recreates it and
    the scheduler, with pyctl's extender, places the replacement)."""
    return WorkflowKind(KIND, CompactionData, {"evicting": _evicting})
