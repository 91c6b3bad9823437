"""Compaction planning from records: rescues a pending replica by freeing an aligned zone, never
moves a pod back where it came from, respects the evictor rules and PodDisruptionBudgets, and
plans no move whose pod could not land where planned (NodeFit)."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from pyctl.cluster.records import (
    Constraints,
    NodeRecord,
    NrtRecord,
    PdbRecord,
    PodRecord,
    PodTerm,
    Selector,
    Taint,
    Toleration,
    ZoneRecord,
)
from pyctl.cluster.translate import models_of
from pyctl.model import Node, Shape, Workload
from pyctl.workflows.compaction import (
    CompactionPlan,
    PlannedMove,
    PlannedRescue,
    RoundCache,
    plan_compaction,
)
from pyctl.workflows.compactor import this_round
from pyctl.workflows.evictor import Evictor, EvictorOptions


def node(name: str, **kw: object) -> NodeRecord:
    return NodeRecord(
        name,
        gpu_model="NVIDIA-H100-80GB-HBM3",
        cpu_milli=64000,
        memory_mib=1 << 20,
        gpus=8,
        **kw,  # type: ignore[arg-type]
    )


def nrt(name: str, used: tuple[int, int]) -> NrtRecord:
    return NrtRecord(
        name,
        policy="single-numa-node",
        zones=tuple(
            ZoneRecord(z, 32000, 32000 - 1000 * used[z], 1 << 19, 1 << 19, 4, 4 - used[z])
            for z in range(2)
        ),
    )


def pod(name: str, node_name: str, gpus: int = 1, **kw: object) -> PodRecord:
    base: dict[str, object] = {
        "node": node_name,
        "phase": "Running",
        "cpu_milli": 1000 * gpus,
        "gpus": gpus,
        "owner_kind": "ReplicaSet",
        "owner_name": "llm",
        "labels": (("app", "llm"),),
    }
    base.update(kw)
    return PodRecord("serving", name, **base)  # type: ignore[arg-type]


def fragmented() -> tuple[dict[str, NodeRecord], dict[str, NrtRecord], list[PodRecord]]:
    # a: one pod in each zone; b: zone 0 has 3 pods, zone 1 has 1. No zone has 4 free GPUs.
    nodes = {"a": node("a"), "b": node("b")}
    nrts = {"a": nrt("a", (1, 1)), "b": nrt("b", (3, 1))}
    pods = [
        pod("a0", "a"),
        pod("a1", "a"),
        pod("b0", "b"),
        pod("b1", "b"),
        pod("b2", "b"),
        pod("b3", "b"),
    ]
    return nodes, nrts, pods


ONE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000)
BIG = PodRecord(
    "serving",
    "big",
    phase="Pending",
    cpu_milli=4000,
    gpus=4,
    owner_kind="ReplicaSet",
    owner_name="big",
    unschedulable=True,
)


def plan(
    nodes: dict[str, NodeRecord],
    nrts: dict[str, NrtRecord],
    pods: Sequence[PodRecord],
    pdbs: Sequence[PdbRecord] = (),
    pending: Sequence[PodRecord] = (BIG,),
) -> CompactionPlan:
    models = models_of(nodes.values(), nrts.values(), pods)
    return plan_compaction(models, nodes, pods, pdbs, Workload((ONE,)), pending=pending)


def test_a_rescue_frees_a_zone_for_the_pending_four_gpu_replica() -> None:
    nodes, nrts, pods = fragmented()
    p = plan(nodes, nrts, pods)
    assert len(p.rescues) == 1, p
    r = p.rescues[0]
    assert (r.pending, r.node) == ("serving/big", "a")
    # one move frees a zone: the replica goes to b's free GPU, never back where it was
    assert [(m.from_node, m.to_node) for m in r.moves] == [("a", "b")]
    assert all(m.from_node != m.to_node for m in p.moves)
    assert len({m.pod for m in p.moves}) == len(p.moves)
    assert all(m.rescue == 0 for m in r.moves)


def test_a_node_held_by_a_rescue_in_progress_is_left_to_it() -> None:
    """While a rescue holds node a (its evictions in flight), plain compaction neither moves
    pods off a (only the rescue evicts there: no eviction beyond its plan, none twice) nor
    sends pods to it. Without the hold, the same round moves a pod off a."""
    nodes, nrts, pods = fragmented()
    models = models_of(nodes.values(), nrts.values(), pods)
    w = Workload((ONE, Shape(cpu_milli=4000, gpus=4, gpu_milli=1000)))
    free = plan_compaction(models, nodes, pods, (), w)
    assert any(m.from_node == "a" for m in free.moves), free
    held = plan_compaction(models, nodes, pods, (), w, reserved=("a",))
    assert all("a" not in (m.from_node, m.to_node) for m in held.moves), held
    assert held.refused["serving/a0"] == "node a is held by a rescue in progress"


def test_a_pdb_without_budget_holds_compaction_back() -> None:
    nodes, nrts, pods = fragmented()
    pdb = PdbRecord("serving", "llm", match_labels=(("app", "llm"),), disruptions_allowed=0)
    p = plan(nodes, nrts, pods, [pdb])
    assert p.moves == ()
    assert p.refused["serving/a0"] == "PodDisruptionBudget has no budget left"
    assert "serving/big" in p.unrescued


def test_moves_respect_node_selectors_and_taints() -> None:
    nodes, nrts, pods = fragmented()
    # b refuses the replicas (a taint they do not tolerate): no room can be made
    nodes["b"] = node("b", taints=(Taint("dedicated", "training", "NoSchedule"),))
    p = plan(nodes, nrts, pods)
    assert p.rescues == ()
    # tolerating it, they may go there again
    tol = Constraints(tolerations=(Toleration("dedicated", "Equal", "training", "NoSchedule"),))
    pods = [pod(x.name, x.node, constraints=tol) for x in pods]
    assert plan(nodes, nrts, pods).rescues
    # a node selector only b's labels satisfy: still fine; one nothing satisfies: no rescue
    sel = Constraints(node_selector=(("gpu-type", "a100"),), tolerations=tol.tolerations)
    nodes["b"] = node("b", labels=(("gpu-type", "a100"),), taints=nodes["b"].taints)
    pods = [pod(x.name, x.node, constraints=sel) for x in pods]
    assert plan(nodes, nrts, pods).rescues
    nodes["b"] = node("b", taints=nodes["b"].taints)
    assert plan(nodes, nrts, pods).rescues == ()


def test_a_move_into_an_anti_affinity_domain_is_not_planned() -> None:
    nodes, nrts, pods = fragmented()
    # a's replicas repel each other per node: either may go to b only if no other replica of
    # the group is there; b runs one already (b0 carries the label)
    anti = Constraints(
        anti_affinity=(PodTerm("kubernetes.io/hostname", Selector((("app", "llm"),))),)
    )
    pods = [pod(x.name, x.node, constraints=anti) for x in pods]
    p = plan(nodes, nrts, pods)
    assert p.rescues == ()
    assert p.moves == ()


def test_evictor_rules() -> None:
    pods = [
        pod("ok", "a"),
        pod("ds", "a", owner_kind="DaemonSet"),
        pod("bare", "a", owner_kind="", owner_name=""),
        pod("mirror", "a", mirror=True),
        pod("crit", "a", priority=2_000_001_000),
        pod("local", "a", local_storage=True),
        pod("keep", "a", evict_annotation="false"),
        pod("pending", ""),
    ]
    ev = Evictor(EvictorOptions(), pods)
    why = {p.name: ev.why_not(p) for p in pods}
    assert why == {
        "ok": None,
        "ds": "DaemonSet pod",
        "bare": "bare pod (no controller would recreate it)",
        "mirror": "mirror (static) pod",
        "crit": "system-critical pod",
        "local": "uses local storage",
        "keep": "annotated not to be evicted",
        "pending": "not running on a node",
    }
    loose = Evictor(
        EvictorOptions(evict_local_storage_pods=True, evict_system_critical_pods=True), pods
    )
    assert loose.why_not(pods[4]) is None
    assert loose.why_not(pods[5]) is None
    strict = Evictor(EvictorOptions(min_replicas=20, priority_threshold=0), pods)
    assert strict.why_not(pods[0]) == "priority 0 at or above the threshold"


def test_pod_shapes_are_kept_between_rounds_while_their_records_are_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyctl.cluster.translate import shape_of as real

    calls: list[str] = []

    def counting(p: PodRecord, *a: object) -> Shape | None:
        if p.node:  # the pending pod's shape is not kept (it is derived once a round)
            calls.append(p.name)
        return real(p, *a)  # type: ignore[arg-type]

    monkeypatch.setattr("pyctl.workflows.compaction.shape_of", counting)
    nodes, nrts, pods = fragmented()
    kept = RoundCache()

    def round_(pods: list[PodRecord], cache: RoundCache) -> CompactionPlan:
        models = models_of(nodes.values(), nrts.values(), pods)
        return plan_compaction(
            models, nodes, pods, (), Workload((ONE,)), pending=(BIG,), round_cache=cache
        )

    first = round_(pods, kept)
    assert sorted(calls) == sorted(p.name for p in pods)
    calls.clear()
    assert round_(pods, kept) == first
    assert calls == []  # nothing changed: no pod's shape derived again
    # a replaced record is derived again (and only it), and the plan is a fresh round's
    changed = [msgspec.structs.replace(p, cpu_milli=2000) if p.name == "b3" else p for p in pods]
    again = round_(changed, kept)
    assert calls == ["b3"]
    assert again == round_(changed, RoundCache())
    b3 = kept.shape("serving/b3", changed[-1], nodes["b"], None)
    assert b3 is not None
    assert b3.cpu_milli == 2000
    # a replaced node record: its pods are derived again
    calls.clear()
    nodes["a"] = msgspec.structs.replace(nodes["a"], labels=(("zone", "z1"),))
    round_(changed, kept)
    assert sorted(calls) == ["a0", "a1"]


def test_node_labels_are_kept_between_rounds_while_the_record_is_the_same() -> None:
    nodes, _, _ = fragmented()
    kept = RoundCache()
    first = kept.labels(nodes)
    assert first["a"]["kubernetes.io/hostname"] == "a"  # NodeFit's default hostname label
    assert kept.labels(nodes)["a"] is first["a"]
    nodes["a"] = msgspec.structs.replace(nodes["a"], labels=(("zone", "z1"),))
    again = kept.labels(nodes)
    assert again["a"] is not first["a"]
    assert again["a"]["zone"] == "z1"
    assert again["b"] is first["b"]
    assert set(kept.labels({"b": nodes["b"]})) == {"b"}  # nodes gone are forgotten


def test_each_move_is_checked_on_the_cluster_the_moves_before_it_leave() -> None:
    """The planner's moves are checked in order against NodeFit: a replica whose anti-affinity
    an earlier move's replica now violates is not moved, and its rescue is dropped whole; a
    move a taint forbids is not made, whether or not any pod's fit depends on others."""
    from pyctl.cluster.nodefit import Fit
    from pyctl.core import policy
    from pyctl.core.types import Assignment
    from pyctl.workflows.compaction import _verified

    at: Assignment = {"cpu": [], "memory": [], "gpus": [], "mig": None}

    nodes = {"a": node("a"), "b": node("b"), "c": node("c")}
    anti = Constraints(
        anti_affinity=(PodTerm("kubernetes.io/hostname", Selector((("app", "llm"),))),)
    )
    pods = [pod("a0", "a", constraints=anti), pod("b0", "b", constraints=anti)]
    by_node = {p.node: [p] for p in pods}

    def pod_of(key: str, node_name: str) -> PodRecord | None:
        return next((p for p in by_node.get(node_name, ()) if p.key == key), None)

    fit = Fit(nodes, pods)
    assert fit.why_not(pods[0], "c", "a") is None  # each alone may go to c
    assert fit.why_not(pods[1], "c", "b") is None
    moves = (
        policy.Move("serving/a0", "a", "c", 1.0, at),
        policy.Move("serving/b0", "b", "c", 1.0, at, rescue=0),
    )
    raw = policy.Plan(moves, (policy.Rescue("serving/big", "b", at, moves[1:], 0, -1.0),))
    ok, rescues, dropped = _verified(raw, fit, pod_of)
    assert [m.pod for m in ok] == ["serving/a0"]
    assert rescues == ()
    assert dropped == {
        "serving/big": "serving/b0 cannot land on c: pod anti-affinity with serving/a0"
    }
    # no pod depends on others: a taint still stops a move, the next one goes on
    nodes["c"] = node("c", taints=(Taint("gpu", "busy", "NoSchedule"),))
    plain = [pod("a0", "a"), pod("b0", "b")]
    by_node = {p.node: [p] for p in plain}
    fit = Fit(nodes, plain)
    assert not fit.repelling
    two = (
        policy.Move("serving/a0", "a", "c", 1.0, at),
        policy.Move("serving/b0", "b", "a", 1.0, at),
    )
    ok, _, _ = _verified(policy.Plan(two), fit, pod_of)
    assert [m.pod for m in ok] == ["serving/b0"]


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_round_with_the_cache_plans_what_a_fresh_round_plans(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache keeps each node's derived pods (`RoundCache`) while that node's inputs are the
    same: across rounds that change pods, budgets, node records, held nodes, excluded pods,
    the evictor's options, the clock (pods coming of age) and pods that repel others, every
    round with the cache kept plans exactly what a round with a fresh cache plans; and the
    cache is used (a node whose inputs did not change is not derived again)."""
    import random

    from pyctl.workflows import compaction

    rng = random.Random(seed)
    now = [1_000_000.0]
    monkeypatch.setattr(
        compaction,
        "Evictor",
        lambda o, pods, pdbs: Evictor(o, pods, pdbs, clock=lambda: now[0]),
    )
    derived: list[str] = []
    real_derive = compaction._Round._derive

    def counting(self: compaction._Round, name: str, *a: object) -> compaction._Block:
        derived.append(name)
        return real_derive(self, name, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction._Round, "_derive", counting)
    names = [f"n{i}" for i in range(10)]
    nodes = {n: node(n, labels=(("pool", "a" if i % 3 else "b"),)) for i, n in enumerate(names)}
    nrts = {n: nrt(n, (2, 2)) for n in names}
    owners = ["llm", "emb", "asr"]
    pick = Constraints(node_selector=(("pool", "a"),))
    tolerate = Constraints(tolerations=(Toleration("gpu", "Exists"),))
    repel = Constraints(
        anti_affinity=(PodTerm("kubernetes.io/hostname", Selector((("app", "llm"),))),)
    )
    counter = [0]

    def new_pod(n: str) -> PodRecord:
        counter[0] += 1
        owner = rng.choice(owners)
        return pod(
            f"p{counter[0]}",
            n,
            gpus=rng.choice([0, 1, 1, 2]),
            owner_name=owner,
            labels=(("app", owner),),
            constraints=rng.choice([None, None, pick, tolerate]),
            created=now[0] - rng.choice([5.0, 50.0, 500.0]),
            evict_annotation=rng.choice(["", "", "", "false"]),
        )

    on = {n: [new_pod(n) for _ in range(rng.randint(1, 4))] for n in names}
    models: dict[str, Node] = {}

    def remodel(n: str) -> None:  # as the reconciler replaces a node's model
        models[n] = models_of([nodes[n]], [nrts[n]], on[n])[n]

    for n in names:
        remodel(n)
    pdbs = [
        PdbRecord("serving", o, match_labels=(("app", o),), disruptions_allowed=1) for o in owners
    ]
    options = EvictorOptions()
    held: set[str] = set()
    exclude: dict[str, str] = {}
    kept = RoundCache()
    planned = 0
    reused = 0
    for _ in range(40):
        for n in names:  # the pods that repel others go after a round or two
            if rng.random() < 0.5 and any(p.constraints == repel for p in on[n]):
                on[n] = [p for p in on[n] if p.constraints != repel]
                remodel(n)
        for _ in range(rng.randint(0, 3)):
            what = rng.randrange(10)
            n = rng.choice(names)
            if what == 0 and on[n]:  # a pod goes
                on[n].pop(rng.randrange(len(on[n])))
            elif what == 1:  # a pod comes
                on[n].append(new_pod(n))
            elif what == 2 and on[n]:  # a pod's record is replaced
                i = rng.randrange(len(on[n]))
                on[n][i] = msgspec.structs.replace(on[n][i], priority=rng.randint(0, 5))
            elif what == 3:  # a budget's disruptions change
                j = rng.randrange(len(pdbs))
                pdbs[j] = msgspec.structs.replace(pdbs[j], disruptions_allowed=rng.randint(0, 2))
            elif what == 4:  # a node is tainted or labelled again
                nodes[n] = msgspec.structs.replace(
                    nodes[n],
                    labels=(("pool", rng.choice("ab")),),
                    taints=rng.choice([(), (Taint("gpu", "x", "NoSchedule"),)]),
                )
            elif what == 5:  # a rescue holds a node, or lets it go
                held ^= {n}
            elif what == 6 and on[n]:  # a pod's move was abandoned, or forgotten
                key = rng.choice(on[n]).key
                if exclude.pop(key, None) is None:
                    exclude[key] = "its last move was abandoned"
            elif what == 7:
                options = EvictorOptions(min_replicas=rng.choice([1, 1, 6]), min_pod_age_seconds=30)
            elif what == 8:  # a pod that keeps llm replicas off its node comes (for a while)
                on[n].append(msgspec.structs.replace(new_pod(n), constraints=repel))
            else:
                now[0] += rng.choice([10.0, 30.0])
            if what in (0, 1, 2, 4, 8):
                remodel(n)
        pods = [p for n in names for p in on[n]]

        plans = []
        for cache in (kept, RoundCache()):
            derived.clear()
            plans.append(
                plan_compaction(
                    models,
                    nodes,
                    pods,
                    pdbs,
                    Workload((ONE,)),
                    pending=(BIG,),
                    options=options,
                    reserved=held,
                    round_cache=cache,
                    exclude=exclude,
                )
            )
            if cache is kept:
                reused += len(names) - len(derived)
        with_cache, fresh = plans
        assert with_cache == fresh
        planned += bool(with_cache.moves or with_cache.rescues)
    assert reused > 100  # the cache was used
    assert planned > 0  # and the plans were not all empty


def _move(pod: str, src: str, dst: str, rescue: int | None = None) -> PlannedMove:
    return PlannedMove(pod, src, dst, 1000.0, {}, rescue)


def test_a_move_into_a_node_this_round_evicts_from_waits_for_the_next_round() -> None:
    """Planned in order, evicted at once: a move whose destination an earlier move of the round
    leaves (a swap; a chain) may need the room that eviction frees, which the scheduler sees only
    once the pod is gone (seen on the real control plane: tests/e2e/test_rdma_e2e.py's cluster,
    planned before the 4-GPU replica was pending, swapped two replicas and the second went back)."""
    swap = (_move("ns/bee", "rb", "ra"), _move("ns/small", "ra", "rb"))
    now, later = this_round(CompactionPlan(swap, {}, 2))
    assert (now, later) == ([swap[0]], [swap[1]])
    chain = (_move("ns/a", "n1", "n2"), _move("ns/b", "n3", "n1"), _move("ns/c", "n4", "n5"))
    now, later = this_round(CompactionPlan(chain, {}, 3))
    assert (now, later) == ([chain[0], chain[2]], [chain[1]])
    # independent moves (even into the same node) all start
    apart = (_move("ns/a", "n1", "n9"), _move("ns/b", "n2", "n9"))
    assert this_round(CompactionPlan(apart, {}, 2)) == (list(apart), [])
    # a rescue's moves are its workflow's; a move into a node the rescue evicts from waits
    saved = _move("ns/r", "n7", "n8", rescue=0)
    rescue = PlannedRescue("ns/pending", "n7", (saved,), 0, -4000.0)
    plan = CompactionPlan((saved, _move("ns/d", "n6", "n7")), {}, 2, rescues=(rescue,))
    assert this_round(plan) == ([], [plan.moves[1]])
