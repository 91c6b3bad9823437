"""pyctl's placement policy and compaction planner (rust/src/placement, rust/src/compaction):
one ranking of a task's feasible placements, used by the scheduler extender, the simulated
cluster and the trace replay alike, and one planner (multi-move rescues of pending pods, then
defragmentation), used by the controller and the replay alike.

Nodes are named here (the core works with indices into a `FragmentationModel`'s snapshot).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from pyctl import _core
from pyctl.core.fragmentation import FragmentationModel, shape_dict, workload_dicts
from pyctl.core.inputs import (
    AssignmentInput,
    MovableInput,
    PendingInput,
    PlanLimitsInput,
    ShapeInput,
)
from pyctl.core.types import Assignment, PlanRaw, RankedRaw
from pyctl.model import Shape, Workload

Rank = tuple[int, int, int]
#: the kube-scheduler extender's MaxExtenderPriority
MAX_EXTENDER_PRIORITY = 10


@dataclass(frozen=True, slots=True)
class Ranked:
    """The policy's best placement of a task on one node, and why it ranks where it does."""

    node: str
    rank: Rank
    #: the node's fragment increase, milli-GPU
    inc: float
    cpu_short: bool
    #: free share left on the GPU a sharing task takes
    left: int
    #: the node's idle GPU before, milli-GPU
    idle: int
    assignment: Assignment

    def explain(self, shape: Shape) -> str:
        """The rank in words (for `pyctl explain` and the extender's logs)."""
        if shape.is_cpu_only:
            return f"CPU-only: {self.idle / 1000:.2f} idle GPUs on the node (fewer is better)"
        parts = [f"fragment {self.inc / 1000:+.2f} GPU (FGD score {-self.rank[0]})"]
        what = "CPU or RDMA" if shape.rdma else "CPU"
        keeps = "CPU and RDMA" if shape.rdma else "CPU"
        parts.append(
            f"leaves the node short of {what}" if self.cpu_short else f"keeps {keeps} for its GPUs"
        )
        if self.left:
            parts.append(f"best fit leaves {self.left / 1000:.2f} of the GPU")
        return ", ".join(parts)


def _ranked(names: Sequence[str], raw: RankedRaw) -> Ranked:
    r = raw["rank"]
    return Ranked(
        names[int(raw["node"])],
        (int(r[0]), int(r[1]), int(r[2])),
        float(raw["inc"]),
        bool(raw["cpu_short"]),
        int(raw["left"]),
        int(raw["idle"]),
        raw["assignment"],
    )


def _indices(model: FragmentationModel, nodes: Iterable[str] | None) -> list[int] | None:
    if nodes is None:
        return None
    idx = model.index
    return [idx[n] for n in nodes if n in idx]


def rank(
    model: FragmentationModel, shape: Shape, workload: Workload, nodes: Sequence[str] | None = None
) -> list[Ranked | None]:
    """The best placement of `shape` on each of `nodes` (default: every node of the model),
    None where the node does not admit it (or is not in the model)."""
    names = [n.name for n in model.snapshot.nodes]
    wanted = list(nodes) if nodes is not None else names
    idx = model.index
    known = [n for n in wanted if n in idx]
    raw = model.core.rank(shape_dict(shape), workload_dicts(workload), [idx[n] for n in known])
    by_name = {
        n: (None if r is None else _ranked(names, r)) for n, r in zip(known, raw, strict=True)
    }
    return [by_name.get(n) for n in wanted]


def choose(
    model: FragmentationModel, shape: Shape, workload: Workload, nodes: Iterable[str] | None = None
) -> Ranked | None:
    """The policy's choice among `nodes` (default: every node): the best rank, ties to the first
    node of the model's order."""
    names = [n.name for n in model.snapshot.nodes]
    raw = model.core.choose(shape_dict(shape), workload_dicts(workload), _indices(model, nodes))
    return None if raw is None else _ranked(names, raw)


def extender_scores(ranks: Sequence[Ranked | None]) -> list[int]:
    """The extender's 0..10 per node: 10 for the best rank, 1..9 by fragment score for the
    others, 0 where the node does not admit the pod."""
    return list(_core.extender_scores([None if r is None else r.rank for r in ranks]))


def extender_choice(ranks: Sequence[Ranked | None]) -> int | None:
    """The index of the node `extender_scores` gives 10 (the first with the best rank): the
    policy's choice; None when no node admits the pod."""
    return _core.extender_choice([None if r is None else r.rank for r in ranks])


def kube_default_scores(
    cpu_cap: int, cpu_left: int, mem_cap: int, mem_left: int, cpu: int, memory: int
) -> int:
    """kube-scheduler's NodeResourcesFit (LeastAllocated) + BalancedAllocation for a pod of
    `cpu` milli and `memory` MiB on a node, as the replay's `pyctl-deployed` policy scores."""
    return int(_core.kube_default_scores(cpu_cap, cpu_left, mem_cap, mem_left, cpu, memory))


#: the extender's weight in deploy/scheduler/extender-config.yaml (a test pins the two)
EXTENDER_WEIGHT: int = int(_core.EXTENDER_WEIGHT)


# ---- the compaction planner --------------------------------------------------------------------


class MovablePod(msgspec.Struct, frozen=True, gc=False):
    """A pod the planner may move: where it is (`assignment` on `node`), its shape, and where it
        may go (`allowed`: node names, None for any). (A Struct: one is made per pod per round; it
    holds no cycle, so the cycle collector does not track it, `gc=False`.)"""

    key: str
    node: str
    assignment: Assignment | AssignmentInput
    shape: Shape
    allowed: frozenset[str] | None = None
    #: its PodDisruptionBudget (key) and the disruptions it allows now
    pdb: str | None = None
    pdb_headroom: int = 0
    #: pods of one group never move in the same plan (inter-pod constraints)
    group: str | None = None


@dataclass(frozen=True)
class PendingPod:
    key: str
    shape: Shape
    allowed: frozenset[str] | None = None


@dataclass(frozen=True)
class PlanLimits:
    """A planning round's limits. The defaults are the controller's (its configuration's
    `workflow.max_moves`, `workflow.min_gain`, `workflow.rescue_depth` refer to them), so a
    plan made without limits (`pyctl plan`) is the one the controller would make."""

    #: most evictions one round plans (a rescue's included)
    max_moves: int = 3
    #: smallest fall of fragment (milli-GPU) a defragmentation move must bring (rescues of
    #: pending pods are not held to it)
    min_gain: float = 1000.0
    max_moves_per_node: int | None = None
    #: most evictions one rescue takes (0: no rescues)
    rescue_depth: int = 3
    max_rescues: int = 1
    rescue_budget: int = 4096
    defragment: bool = True


@dataclass(frozen=True)
class Move:
    pod: str
    from_node: str
    to_node: str
    #: fall of F(M), milli-GPU, by this move alone
    gain: float
    assignment: Assignment
    #: index of the rescue it belongs to
    rescue: int | None = None


@dataclass(frozen=True)
class Rescue:
    pending: str
    node: str
    assignment: Assignment
    moves: tuple[Move, ...]
    #: evictions that wait for an earlier one's replacement (PodDisruptionBudgets)
    waits: int
    #: change of F(M) by the rescue, the pending pod placed, milli-GPU
    delta: float


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...] = ()
    rescues: tuple[Rescue, ...] = ()
    unrescued: tuple[str, ...] = ()
    truncated: bool = False
    refused: Mapping[str, str] = field(default_factory=dict)

    @property
    def gain_gpu_milli(self) -> float:
        return sum(m.gain for m in self.moves)


class _Inputs:
    """A plan's inputs as the core reads them: the pods by node index, each distinct shape once
    (`ShapeInput`, shared), destination sets, budgets and groups by index."""

    def __init__(self, idx: Mapping[str, int]) -> None:
        self.idx = idx
        self.sets: dict[frozenset[str], int] = {}
        self.groups: dict[str, int] = {}
        self.pdbs: dict[str, int] = {}
        self.headroom: list[int] = []
        self.shapes: dict[Shape, ShapeInput] = {}  # one dict per distinct shape, shared
        # the same Shape object for most pods (translation shares them): looked up by identity
        # first, which is safe while `movable` and `pending` hold every one of them (this call)
        self.by_id: dict[int, ShapeInput] = {}

    def set_of(self, allowed: frozenset[str] | None) -> int | None:
        if allowed is None:
            return None
        sets = self.sets
        if allowed not in sets:
            sets[allowed] = len(sets)
        return sets[allowed]

    def shape_of(self, s: Shape) -> ShapeInput:
        d = self.by_id.get(id(s))
        if d is None:
            d = self.shapes.get(s)
            if d is None:
                d = self.shapes[s] = shape_dict(s)
            self.by_id[id(s)] = d
        return d

    def movable(self, movable: Sequence[MovablePod]) -> tuple[list[MovableInput], list[MovablePod]]:
        """The pods on nodes of the model, and those pods (the plan's "pod" indexes them)."""
        idx, pdbs, groups = self.idx, self.pdbs, self.groups
        items: list[MovableInput] = []
        kept: list[MovablePod] = []
        for m in movable:
            if m.node not in idx:
                continue
            pdb = None
            if m.pdb is not None:
                if m.pdb not in pdbs:
                    pdbs[m.pdb] = len(pdbs)
                    self.headroom.append(max(0, m.pdb_headroom))
                pdb = pdbs[m.pdb]
            group = None
            if m.group is not None:
                group = groups.setdefault(m.group, len(groups))
            items.append(
                {
                    "node": idx[m.node],
                    "assignment": m.assignment,
                    "shape": self.shape_of(m.shape),
                    "allowed": self.set_of(m.allowed),
                    "pdb": pdb,
                    "group": group,
                }
            )
            kept.append(m)
        return items, kept

    def pending(self, pending: Sequence[PendingPod]) -> list[PendingInput]:
        return [
            {"shape": self.shape_of(p.shape), "allowed": self.set_of(p.allowed)} for p in pending
        ]

    def node_sets(self) -> list[list[int]]:
        """The destination sets, in the order of their indices."""
        idx = self.idx
        return [
            [idx[n] for n in s if n in idx] for s in sorted(self.sets, key=self.sets.__getitem__)
        ]


def _limits(lim: PlanLimits) -> PlanLimitsInput:
    return {
        "max_moves": lim.max_moves,
        "min_gain": lim.min_gain,
        "max_moves_per_node": lim.max_moves_per_node,
        "rescue_depth": lim.rescue_depth,
        "max_rescues": lim.max_rescues,
        "rescue_budget": lim.rescue_budget,
        "defragment": lim.defragment,
    }


def _plan_of(
    raw: PlanRaw, names: Sequence[str], kept: Sequence[MovablePod], pending: Sequence[PendingPod]
) -> Plan:
    """The core's plan with pods and nodes by name."""
    moves = tuple(
        Move(
            kept[int(m["pod"])].key,
            names[int(m["from"])],
            names[int(m["to"])],
            float(m["gain"]),
            m["assignment"],
            None if m["rescue"] is None else int(m["rescue"]),
        )
        for m in raw["moves"]
    )
    rescues = tuple(
        Rescue(
            pending[int(r["pending"])].key,
            names[int(r["node"])],
            r["assignment"],
            tuple(moves[int(i)] for i in r["moves"]),
            int(r["waits"]),
            float(r["delta"]),
        )
        for r in raw["rescues"]
    )
    return Plan(
        moves,
        rescues,
        tuple(pending[int(i)].key for i in raw["unrescued"]),
        bool(raw["truncated"]),
    )


def plan(
    model: FragmentationModel,
    movable: Sequence[MovablePod],
    pending: Sequence[PendingPod],
    workload: Workload,
    limits: PlanLimits | None = None,
) -> Plan:
    """The planner on `model`'s cluster (it is not changed)."""
    inputs = _Inputs(model.index)
    items, kept = inputs.movable(movable)
    pend = inputs.pending(pending)
    raw = model.core.plan(
        items,
        pend,
        workload_dicts(workload),
        inputs.node_sets(),
        inputs.headroom,
        _limits(limits or PlanLimits()),
    )
    return _plan_of(raw, [n.name for n in model.snapshot.nodes], kept, pending)
