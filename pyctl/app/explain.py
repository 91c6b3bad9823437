"""`pyctl explain POD`: why a pod is where it is, or why it is pending, from the state its
controller stored (`pyctl.app.state`), answered by the product's own decisions:

- its shape: the controller's translation (`Reconciler.shape_of`, DRA claims resolved);
- every node: NodeFit (`pyctl.cluster.nodefit`: the scheduler's filters besides resources), and
  the placement policy's rank of the pod's shape there (`pyctl.core.policy`). For a pending pod,
  through the scheduler extender's own code (`PlacementAdvisor.filter` and `prioritize`, with
  the nodes kept for rescues in progress and recent departures, read from the stored
  workflows): what pyctl answers the kube-scheduler for it now. For a running pod, with the pod
  counted out of its node (`attribute_pods`, then the core removes its assignment), as
  compaction weighs a move: is its node the policy's choice for it now?
- whether it is blocked by fragmentation, and by which category (`fragmentation.blocked_by`);
- the compaction plan of this state (`compactor.plan_round`, the controller's round): a rescue
  for a pending pod, or a move of a running one, or why not; the evictor's rules on it
  (`pyctl.workflows.evictor.Evictor`);
- the stored workflows about it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyctl.app.config import Config
from pyctl.app.state import StoredView
from pyctl.cluster.nodefit import Fit
from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import attribute_pods
from pyctl.controller.placement import PlacementAdvisor
from pyctl.core import policy
from pyctl.core.fragmentation import FragmentationModel, blocked_by, shape_dict
from pyctl.core.inputs import ShapeInput
from pyctl.jsontypes import JsonObject, plain
from pyctl.model import Shape, Snapshot
from pyctl.workflows.compaction import CompactionPlan
from pyctl.workflows.compactor import abandoned, plan_round, too_young
from pyctl.workflows.engine import Workflow, WorkflowData
from pyctl.workflows.evictor import Evictor


@dataclass(frozen=True)
class NodeAnswer:
    """One node, for the pod."""

    node: str
    #: why NodeFit keeps the pod off the node (None: the scheduler's filters pass)
    fit: str | None
    #: a pending pod: why the extender removes the node (None: kept)
    filtered: str | None
    #: the node is modelled and its model admits the pod's shape (None: not modelled)
    admits: bool | None
    #: the policy's rank in words (`Ranked.explain`), or why there is none
    explain: str
    #: the policy's rank (lower is better) and the node's fragment increase (milli-GPU)
    rank: tuple[int, int, int] | None = None
    inc_gpu_milli: float | None = None
    #: the extender's score among the candidates (0..10; None: not a candidate)
    score: int | None = None

    @property
    def candidate(self) -> bool:
        return self.fit is None and self.filtered is None and bool(self.admits)

    def to_json(self) -> JsonObject:
        return {
            "node": self.node,
            "fit": self.fit,
            "filtered": self.filtered,
            "admits": self.admits,
            "explain": self.explain,
            "rank": list(self.rank) if self.rank is not None else None,
            "inc_gpu_milli": self.inc_gpu_milli,
            "score": self.score,
        }


@dataclass(frozen=True)
class RescueMove:
    pod: str
    from_node: str
    to_node: str

    def to_json(self) -> JsonObject:
        return {"pod": self.pod, "from": self.from_node, "to": self.to_node}


@dataclass(frozen=True)
class RescueAnswer:
    """The rescue the plan makes for a pending pod: the node it frees, by which moves."""

    node: str
    moves: tuple[RescueMove, ...]
    #: evictions that wait for an earlier one's replacement (PodDisruptionBudgets)
    waits: int
    delta_gpu_milli: float

    def to_json(self) -> JsonObject:
        return {
            "node": self.node,
            "moves": [m.to_json() for m in self.moves],
            "waits": self.waits,
            "delta_gpu_milli": self.delta_gpu_milli,
        }


@dataclass(frozen=True)
class MoveAnswer:
    """The planned move of a running pod."""

    to: str
    gain_gpu_milli: float
    #: the pending pod whose rescue it is part of
    rescue_of: str | None

    def to_json(self) -> JsonObject:
        return {"to": self.to, "gain_gpu_milli": self.gain_gpu_milli, "rescue_of": self.rescue_of}


@dataclass(frozen=True)
class WorkflowAbout:
    """A stored workflow about the pod: one that names it, or one that moves it."""

    id: str
    kind: str
    node: str
    step: str
    finished: bool
    updated: float
    result: str
    #: "named" or "moves"
    role: str

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "kind": self.kind,
            "node": self.node,
            "step": self.step,
            "finished": self.finished,
            "updated": self.updated,
            "result": self.result,
            "role": self.role,
        }


@dataclass(frozen=True)
class Explanation:
    pod: str
    found: bool
    #: pending, running (bound to a node), terminated, deleting, or missing
    state: str
    phase: str = ""
    node: str = ""
    #: the scheduler marked it unschedulable, with its message (what the kube-scheduler said)
    unschedulable: bool = False
    scheduler_message: str = ""
    scheduler: str = ""
    shape: ShapeInput | None = None
    #: why its shape cannot be told (DRA claims pyctl does not understand)
    shape_unknown: str = ""
    workload_source: str = ""
    nodes: list[NodeAnswer] = field(default_factory=list)
    #: the policy's choice among the candidates (the extender's score 10)
    choice: list[str] = field(default_factory=list)
    #: the category of fragmentation that blocks it (`blocked_by`), None: not blocked
    blocked: str | None = None
    blocked_note: str = ""
    #: a rescue planned for it
    rescue: RescueAnswer | None = None
    #: a running pod: the planned move of it
    move: MoveAnswer | None = None
    #: why the plan has no rescue or move for it ("" when it has one)
    plan_note: str = ""
    #: a pending pod of a gang none of whose pods runs yet: the domain its rescue makes room in,
    #: and why that one (`gang_domain`; "" when none)
    gang_domain: str = ""
    #: a running pod: why the evictor's rules keep it (None: it may be moved)
    evictor: str | None = None
    pdb_headroom: int | None = None
    workflows: list[WorkflowAbout] = field(default_factory=list)
    verdict: str = ""

    def to_json(self) -> JsonObject:
        return {
            "pod": self.pod,
            "found": self.found,
            "state": self.state,
            "phase": self.phase,
            "node": self.node or None,
            "unschedulable": self.unschedulable,
            "scheduler_message": self.scheduler_message,
            "scheduler": self.scheduler or None,
            "shape": plain(self.shape),
            "shape_unknown": self.shape_unknown or None,
            "workload_source": self.workload_source,
            "verdict": self.verdict,
            "choice": list(self.choice),
            "blocked": self.blocked,
            "blocked_note": self.blocked_note,
            "rescue": self.rescue.to_json() if self.rescue is not None else None,
            "move": self.move.to_json() if self.move is not None else None,
            "plan_note": self.plan_note,
            "gang_domain": self.gang_domain or None,
            "evictor": self.evictor,
            "pdb_headroom": self.pdb_headroom,
            "nodes": [n.to_json() for n in self.nodes],
            "workflows": [w.to_json() for w in self.workflows],
        }


def describe(s: Shape) -> str:
    """A shape in words."""
    if s.mig_profile:
        gpu = f"one MIG {s.mig_profile} instance"
    elif s.gpus and s.gpu_milli == 0:
        gpu = f"{s.gpus} replica{'s' if s.gpus != 1 else ''} of a shared GPU"
    elif s.gpus and s.gpu_milli < 1000:
        gpu = f"{s.gpus} x {s.gpu_milli / 1000:g} GPU"
    elif s.gpus:
        gpu = f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}"
    else:
        gpu = "no GPU"
    parts = [gpu, f"{s.cpu_milli / 1000:g} CPU", f"{s.memory_mib} MiB"]
    if s.dra:
        parts.append("through DRA claims" + (", NUMA-aligned" if s.numa_aligned else ""))
    if s.link_group:
        parts.append("its GPUs in one link group")
    return ", ".join(parts)


def _pods_named(wf: Workflow[WorkflowData]) -> set[str]:
    """The pods a workflow is about: the one it names, and those it moves (rescue, MIG)."""
    named = wf.data.named()
    return {named, *wf.data.moves()} if named else set(wf.data.moves())


def _workflows_about(view: StoredView, key: str) -> list[WorkflowAbout]:
    out = [
        WorkflowAbout(
            wf.id,
            wf.kind,
            wf.node,
            wf.step,
            wf.finished,
            wf.updated,
            wf.result,
            "named" if wf.data.named() == key else "moves",
        )
        for wf in view.workflows
        if key in _pods_named(wf)
    ]
    return sorted(out, key=lambda w: (w.updated, w.id))


def _ranked(
    r: policy.Ranked | str | None, shape: Shape, bad: Mapping[str, str], name: str
) -> tuple[bool | None, str, tuple[int, int, int] | None, float | None]:
    if isinstance(r, policy.Ranked):
        return True, r.explain(shape), r.rank, r.inc
    if r == "unknown" or (r is None and name in bad):
        return None, f"not modelled: {bad.get(name, 'no model of this node')}", None, None
    return False, "does not admit its shape (no placement the kubelet would admit)", None, None


def _pending_nodes(
    view: StoredView, cfg: Config, p: PodRecord, shape: Shape, names: Sequence[str]
) -> list[NodeAnswer]:
    """What the scheduler extender answers for the pod now, node by node, with NodeFit."""
    r = view.reconciler
    reservations = view.reservations()
    departures = view.departures(cfg)
    advisor = PlacementAdvisor(
        r.models, lambda: r.workload, lambda: reservations, lambda: departures, r.shape_of
    )
    fit = Fit(view.cache.nodes, [q for q in view.cache.pods.values() if q.node])
    filtered = advisor.filter(p, tuple(names))
    ranks = advisor.rank(shape, tuple(names))
    bad = {**r.bad_nodes, **view.failed_nodes}
    answers = []
    for n in names:
        admits, text, rank, inc = _ranked(ranks.get(n), shape, bad, n)
        answers.append(NodeAnswer(n, fit.why_not(p, n), filtered.get(n), admits, text, rank, inc))
    candidates = tuple(a.node for a in answers if a.fit is None and a.filtered is None)
    scores = advisor.prioritize(p, candidates) if candidates else {}
    return [
        NodeAnswer(a.node, a.fit, a.filtered, a.admits, a.explain, a.rank, a.inc_gpu_milli, s)
        if (s := scores.get(a.node)) is not None
        else a
        for a in answers
    ]


def _running_nodes(
    view: StoredView, p: PodRecord, shape: Shape, names: Sequence[str]
) -> tuple[list[NodeAnswer], str]:
    """The policy's rank of the pod's shape on every node with the pod counted out of its
    node (as compaction weighs moving it); and a note when that cannot be done."""
    r = view.reconciler
    models = r.models
    if p.node not in models:
        return [], f"its node {p.node} is not modelled, so pyctl does not rank it"
    order = sorted(models)
    model = FragmentationModel(Snapshot(tuple(models[n] for n in order)))
    where = attribute_pods(models[p.node], view.cache.pods_on(p.node), r.dra_positions.get(p.node))
    asg = where.get(p.key)
    if asg is None:
        return [], "the pod holds nothing pyctl attributes on its node"
    model.apply(p.node, asg, place=False)
    fit = Fit(view.cache.nodes, [q for q in view.cache.pods.values() if q.node])
    known = [n for n in names if n in models]
    ranked = dict(zip(known, policy.rank(model, shape, r.workload, known), strict=True))
    bad = {**r.bad_nodes, **view.failed_nodes}
    answers = []
    for n in names:
        admits, text, rank, inc = _ranked(ranked.get(n, "unknown"), shape, bad, n)
        answers.append(NodeAnswer(n, fit.why_not(p, n, p.node), None, admits, text, rank, inc))
    candidates = [a for a in answers if a.candidate]
    scores = policy.extender_scores([ranked[a.node] for a in candidates])
    by_node = dict(zip((a.node for a in candidates), scores, strict=True))
    return [
        NodeAnswer(a.node, a.fit, a.filtered, a.admits, a.explain, a.rank, a.inc_gpu_milli, s)
        if (s := by_node.get(a.node)) is not None
        else a
        for a in answers
    ], ""


def _blocked(view: StoredView, shape: Shape) -> tuple[str | None, str]:
    models = view.reconciler.models
    if shape.is_cpu_only:
        return None, "CPU-only: not a question of GPU fragmentation"
    if not models:
        return None, "no node is modelled"
    model = FragmentationModel(Snapshot(tuple(models[n] for n in sorted(models))))
    got = blocked_by(model, [shape])
    if got:
        cat = next(iter(got))
        return cat, (
            f"the idle capacity could hold it in total but no node admits it; {cat} strands "
            "the most capacity for its shape"
        )
    return None, (
        "not blocked by fragmentation: some node admits its shape, or the idle capacity is too "
        "small for it in total"
    )


def _plan(view: StoredView, cfg: Config, now: float) -> CompactionPlan:
    return plan_round(
        view.cache,
        view.reconciler,
        cfg.evictor,
        cfg.workflow.plan_limits(),
        view.reservations(),
        abandoned(view.workflows),
        cfg.workflow.rescue_after,
        now,
    )


def explain(view: StoredView, cfg: Config, key: str) -> Explanation:
    """Why the pod `key` ("namespace/name") is where it is, or pending."""
    r = view.reconciler
    p = view.cache.pods.get(key)
    if p is None:
        why = next((w for k, kk, w in view.state.skipped if k == "Pod" and kk == key), "")
        note = (
            f"its stored record does not decode: {why}"
            if why
            else f"no such pod among the {len(view.cache.pods)} pods stored"
        )
        return Explanation(key, False, "missing", verdict=note)
    if p.terminated:
        state = "terminated"
    elif p.deleting:
        state = "deleting"
    elif p.node:
        state = "running"
    else:
        state = "pending"
    shape = r.shape_of(p)
    base = Explanation(
        key,
        True,
        state,
        phase=p.phase,
        node=p.node,
        unschedulable=p.unschedulable,
        scheduler_message=p.unschedulable_message,
        scheduler=p.scheduler,
        shape=shape_dict(shape) if shape is not None else None,
        shape_unknown=r.unknown.get(p.key, "") if shape is None else "",
        workload_source=view.workload_source,
        workflows=_workflows_about(view, key),
    )
    if shape is None:
        return replace(base, verdict=f"pyctl cannot tell its shape: {base.shape_unknown}")
    names = sorted(view.cache.nodes)
    if state == "pending":
        return _explain_pending(view, cfg, p, shape, names, base)
    if state == "running":
        return _explain_running(view, cfg, p, shape, names, base)
    return replace(base, verdict=f"{state} (phase {p.phase or 'unknown'})")


def _explain_pending(
    view: StoredView,
    cfg: Config,
    p: PodRecord,
    shape: Shape,
    names: Sequence[str],
    base: Explanation,
) -> Explanation:
    nodes = _pending_nodes(view, cfg, p, shape, names)
    choice = [a.node for a in nodes if a.score == policy.MAX_EXTENDER_PRIORITY]
    blocked, note = _blocked(view, shape)
    held = [n for n, holder in view.reservations().items() if holder == p.key]
    rescue: RescueAnswer | None = None
    plan_note = domain = ""
    now = time.time()
    if held:
        plan_note = f"a rescue in progress keeps node {', '.join(sorted(held))} for it"
    else:
        plan = _plan(view, cfg, now)
        domain = plan.gang_domains.get(p.key, "")
        got = next((x for x in plan.rescues if x.pending == p.key), None)
        if got is not None:
            rescue = RescueAnswer(
                got.node,
                tuple(RescueMove(m.pod, m.from_node, m.to_node) for m in got.moves),
                got.waits,
                got.delta_gpu_milli,
            )
        elif p.key in plan.unrescued:
            plan_note = f"no rescue: {plan.unrescued[p.key]}"
        elif not p.unschedulable:
            plan_note = "no rescue planned: the scheduler has not marked it unschedulable"
        elif p.key in (why_held := view.cache.held()):
            plan_note = f"no rescue planned: {why_held[p.key]}"
        elif too_young(p, cfg.workflow.rescue_after, now):
            plan_note = (
                f"no rescue yet: it is {now - p.created:.0f} s old, rescued from "
                f"{cfg.workflow.rescue_after:g} s (workflow.rescue_after)"
            )
        elif shape.is_cpu_only:
            plan_note = "no rescue planned: CPU-only pods are the scheduler's business"
        else:
            plan_note = "no rescue planned"
    if p.unschedulable:
        said = f"the scheduler marked it unschedulable: {p.unschedulable_message or '(no message)'}"
    else:
        said = "not scheduled yet (the scheduler has not marked it unschedulable)"
    if choice:
        where = f"pyctl's extender would choose {', '.join(choice)} among the nodes it may use"
    elif any(a.admits for a in nodes):
        where = "the nodes whose model admits its shape are kept from it (NodeFit or the extender)"
    else:
        where = "no node's model admits its shape"
    verdict = f"pending: {said}; {where}"
    if blocked:
        verdict += f"; blocked by fragmentation ({blocked})"
    return replace(
        base,
        nodes=nodes,
        choice=choice,
        blocked=blocked,
        blocked_note=note,
        rescue=rescue,
        plan_note=plan_note,
        gang_domain=domain,
        verdict=verdict,
    )


def _explain_running(
    view: StoredView,
    cfg: Config,
    p: PodRecord,
    shape: Shape,
    names: Sequence[str],
    base: Explanation,
) -> Explanation:
    nodes, note = _running_nodes(view, p, shape, names)
    choice = [a.node for a in nodes if a.score == policy.MAX_EXTENDER_PRIORITY]
    evictor = Evictor(cfg.evictor, view.cache.pods.values(), view.cache.pdbs.values())
    why_not = evictor.why_not(p)
    plan = _plan(view, cfg, time.time())
    mv = next((m for m in plan.moves if m.pod == p.key), None)
    move: MoveAnswer | None = None
    plan_note = ""
    if mv is not None:
        move = MoveAnswer(
            mv.to_node,
            mv.gain_gpu_milli,
            plan.rescues[mv.rescue].pending if mv.rescue is not None else None,
        )
    elif p.key in plan.refused:
        plan_note = f"not moved: {plan.refused[p.key]}"
    else:
        plan_note = "no move of it is planned"
    if note:
        verdict = f"runs on {p.node}; {note}"
    elif p.node in choice:
        others = [c for c in choice if c != p.node]
        tie = f" (tied with {', '.join(others)})" if others else ""
        verdict = (
            f"runs on {p.node}, the placement policy's choice for its shape with the pod "
            f"counted out{tie}"
        )
    elif (
        choice
        and (mine := next((a for a in nodes if a.node == p.node), None)) is not None
        and mine.fit is None
        and mine.rank is not None
        and mine.rank == next(a for a in nodes if a.node == choice[0]).rank
    ):
        verdict = (
            f"runs on {p.node}, ranked as well as the placement policy's choice for its shape "
            f"with the pod counted out ({mine.explain}); ties go to the first node by name, "
            f"{', '.join(choice)}"
        )
    elif choice:
        mine = next((a for a in nodes if a.node == p.node), None)
        best = next(a for a in nodes if a.node == choice[0])
        here = mine.explain if mine is not None else "not ranked"
        if mine is not None and mine.fit is not None:
            here = f"NodeFit keeps it off now: {mine.fit}"
        verdict = (
            f"runs on {p.node}, not the policy's choice now: it prefers {', '.join(choice)} "
            f"({best.explain}); on {p.node}: {here}. The cluster changed since it was placed, "
            "or it was placed without pyctl's extender"
        )
    else:
        verdict = f"runs on {p.node}; with it counted out, no node the pod may use admits it"
    return replace(
        base,
        nodes=nodes,
        choice=choice,
        move=move,
        plan_note=plan_note,
        evictor=why_not,
        pdb_headroom=evictor.pdb_headroom(p),
        verdict=verdict,
    )


__all__ = [
    "Explanation",
    "MoveAnswer",
    "NodeAnswer",
    "RescueAnswer",
    "RescueMove",
    "WorkflowAbout",
    "describe",
    "explain",
]
