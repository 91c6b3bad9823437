"""The bound on unallocated GPU (pyctl/replay/bound.py) against brute force: on tiny instances
every assignment of every task (unplaced, or a node and the GPUs it takes) is enumerated with the
replay's rules written out again here, independently of the model (state.rs `fits` and
`admit_whole`: CPU, memory, model, a share on one GPU with other shares up to 1000 milli, whole
GPUs that nothing else uses, under NUMA a whole-GPU task's GPUs in one zone of g//2 | g - g//2).
The bound's allocation must never be below the most any assignment allocates, and the best
placement it reports must be a real one (never above it)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyctl.core.inputs import ReplayNodes
from pyctl.replay import bound
from pyctl.replay.trace import TraceTasks, load_trace, replay

TINY = Path(__file__).resolve().parent.parent / "data" / "replay_tiny"

pytest.importorskip("highspy")

Node = tuple[int, int, int, str]  # cpu, mem, gpus, model
Task = tuple[int, int, int, int, tuple[str, ...]]  # cpu, mem, num_gpu, gpu_milli, models


def columns(nodes: Sequence[Node], tasks: Sequence[Task]) -> tuple[ReplayNodes, TraceTasks]:
    nc: ReplayNodes = {
        "name": [f"n{i}" for i in range(len(nodes))],
        "cpu_milli": [n[0] for n in nodes],
        "memory_mib": [n[1] for n in nodes],
        "gpu": [n[2] for n in nodes],
        "model": [n[3] for n in nodes],
    }
    tc: TraceTasks = {
        "name": [f"t{i}" for i in range(len(tasks))],
        "cpu_milli": [t[0] for t in tasks],
        "memory_mib": [t[1] for t in tasks],
        "num_gpu": [t[2] for t in tasks],
        "gpu_milli": [t[3] if t[2] else 0 for t in tasks],
        "gpu_models": [list(t[4]) for t in tasks],
    }
    return nc, tc


def brute_force(
    nodes: Sequence[Node], tasks: Sequence[Task], numa: bool, keep: frozenset[int] = frozenset()
) -> int:
    """The most GPU milli any placement of a subset of the tasks that holds every task in `keep`
    allocates (-1: no placement holds them)."""
    cpu = [n[0] for n in nodes]
    mem = [n[1] for n in nodes]
    load = [[0] * n[2] for n in nodes]  # milli used per GPU
    whole = [[False] * n[2] for n in nodes]  # GPU given to a whole-GPU task

    def options(t: Task) -> list[tuple[int, tuple[int, ...]]]:
        out: list[tuple[int, tuple[int, ...]]] = []
        _, _, num, milli, models = t
        if num == 0:
            return out
        for i, (_, _, g, model) in enumerate(nodes):
            if models and model.lower() not in {x.lower() for x in models}:
                continue
            if num == 1 and milli < 1000:
                out.extend((i, (x,)) for x in range(g))
                continue
            split = g // 2 if numa and g >= 2 else 0
            zones = [range(split), range(split, g)] if split else [range(g)]
            for z in zones:
                out.extend((i, gs) for gs in combinations(z, num))
        return out

    opts = [options(t) for t in tasks]
    best = -1

    def rec(j: int, total: int) -> None:
        nonlocal best
        if j == len(tasks):
            best = max(best, total)
            return
        if j not in keep:
            rec(j + 1, total)  # task j not placed
        c, m, num, milli, _ = tasks[j]
        for i, gs in opts[j]:
            if cpu[i] < c or mem[i] < m:
                continue
            if num == 1 and milli < 1000:
                x = gs[0]
                if whole[i][x] or load[i][x] + milli > 1000:
                    continue
            elif any(load[i][x] or whole[i][x] for x in gs):
                continue
            cpu[i] -= c
            mem[i] -= m
            for x in gs:
                load[i][x] += milli
                if not (num == 1 and milli < 1000):
                    whole[i][x] = True
            rec(j + 1, total + num * milli)
            cpu[i] += c
            mem[i] += m
            for x in gs:
                load[i][x] -= milli
                whole[i][x] = False

    rec(0, 0)
    return best


def solve(nodes: Sequence[Node], tasks: Sequence[Task], numa: bool) -> tuple[bound.Bound, int]:
    nc, tc = columns(nodes, tasks)
    p = bound.make_problem(nc, tc, numa=numa)
    b = bound.solve(p)
    placed = bound.check_placement(nc, tc, list(range(len(tasks))), b.placement, numa=numa)
    assert placed == b.best_alloc_milli
    return b, brute_force(nodes, tasks, numa)


def test_slivers_two_halves_beat_one_large_share() -> None:
    # one GPU: 0.81 alone strands 0.19; the two 0.47 shares together leave 0.06
    tasks = [(1000, 0, 1, 810, ()), (1000, 0, 1, 470, ())] * 2
    b, best = solve([(8000, 8192, 1, "G")], tasks, False)
    assert best == 940
    assert b.max_alloc_milli == b.best_alloc_milli == 940
    assert b.closed


def test_numa_zone_rule_refuses_a_task_spanning_zones() -> None:
    node = [(64000, 65536, 4, "G")]
    four = [(4000, 0, 4, 1000, ())]
    b, best = solve(node, four, True)
    assert best == 0
    assert b.max_alloc_milli == 0
    b, best = solve(node, four, False)
    assert best == b.max_alloc_milli == b.best_alloc_milli == 4000
    # two 2-GPU tasks fit one zone each; a third one does not
    b, best = solve(node, [(4000, 0, 2, 1000, ())] * 3, True)
    assert best == b.max_alloc_milli == b.best_alloc_milli == 4000
    # a share on one zone's GPU leaves that zone one whole GPU, not two
    tasks = [(1000, 0, 1, 300, ()), (1000, 0, 2, 1000, ()), (1000, 0, 2, 1000, ())]
    b, best = solve(node, tasks, True)
    assert best == 4000
    assert b.max_alloc_milli >= best >= b.best_alloc_milli


def test_models_and_case() -> None:
    nodes = [(8000, 8192, 1, "T4"), (8000, 8192, 1, "V100")]
    tasks = [(1000, 0, 1, 1000, ("t4",)), (1000, 0, 1, 1000, ("t4",)), (1000, 0, 1, 600, ("P100",))]
    b, best = solve(nodes, tasks, False)
    assert best == 1000
    assert b.max_alloc_milli == b.best_alloc_milli == 1000


def test_cpu_per_node_is_where_the_relaxation_is_weaker() -> None:
    # two 1-GPU nodes with 10 cores; three shares with 7 cores: one per node (1010 milli), but
    # the model counts CPU per node type (20 cores for the two): 20/7 shares' worth
    nodes = [(10000, 8192, 1, "G")] * 2
    tasks = [(7000, 0, 1, 500, ()), (7000, 0, 1, 500, ()), (7000, 0, 1, 510, ())]
    b, best = solve(nodes, tasks, False)
    assert best == 1010
    assert b.best_alloc_milli == 1010
    assert b.max_alloc_milli > best  # the relaxation, as the docs say
    assert not b.closed


def test_cpu_only_and_unfittable_tasks_are_left_out() -> None:
    nc, tc = columns(
        [(8000, 8192, 2, "G")],
        [(1000, 0, 0, 0, ()), (99000, 0, 1, 1000, ()), (1000, 0, 1, 1000, ("other",))],
    )
    p = bound.make_problem(nc, tc)
    assert p.task_types == ()
    assert p.left_out == 3
    assert p.arrived_milli == 2000
    b = bound.solve(p)
    assert b.max_alloc_milli == 0
    assert b.bound_pct == 100.0


GPU_REQUEST = st.sampled_from(
    [(0, 0), (1, 1000), (1, 1000), (1, 250), (1, 300), (1, 470), (1, 500), (1, 810), (2, 1000)]
)
TASK = st.tuples(
    st.sampled_from([0, 1000, 2000, 3000, 5000]),
    st.sampled_from([0, 1024, 4096]),
    GPU_REQUEST,
    st.sampled_from([(), ("A",), ("b",), ("A", "B")]),
).map(lambda x: (x[0], x[1], x[2][0], x[2][1], x[3]))
NODE = st.tuples(
    st.sampled_from([4000, 6000, 16000]),
    st.sampled_from([4096, 8192, 65536]),
    st.integers(1, 3),
    st.sampled_from(["A", "B"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(NODE, min_size=1, max_size=2),
    tasks=st.lists(TASK, min_size=1, max_size=6),
    numa=st.booleans(),
)
def test_bound_is_never_below_the_brute_force_optimum(
    nodes: list[Node], tasks: list[Task], numa: bool
) -> None:
    b, best = solve(nodes, tasks, numa)
    assert b.max_alloc_milli >= best >= b.best_alloc_milli
    assert b.bound_pct <= b.best_pct
    if b.closed:
        assert b.best_alloc_milli == best


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.integers(1, 4), min_size=1, max_size=2),
    tasks=st.lists(GPU_REQUEST.filter(lambda r: r[0] > 0), min_size=1, max_size=6),
    numa=st.booleans(),
)
def test_exact_when_cpu_and_memory_do_not_bind(
    gpus: list[int], tasks: list[tuple[int, int]], numa: bool
) -> None:
    # no CPU or memory asked: the GPU side of the model is exact per GPU and per zone; the
    # placement built from the integer program is then the optimum
    b, best = solve(
        [(1000, 1024, g, "A") for g in gpus], [(0, 0, n, m, ()) for n, m in tasks], numa
    )
    assert b.max_alloc_milli >= best == b.best_alloc_milli


def test_keeping_a_large_share_costs_its_sliver() -> None:
    # one GPU: the two 0.47 shares allocate 940; a replay that placed the 0.81 first has kept
    # it, and nothing re-packing the same tasks does better than 810
    nc, tc = columns([(8000, 8192, 1, "G")], [(1000, 0, 1, 810, ()), *[(1000, 0, 1, 470, ())] * 2])
    p = bound.make_problem(nc, tc)
    assert bound.bound_keeping(p, []) == bound.solve(p).max_alloc_milli == 940
    assert bound.bound_keeping(p, [0]) == 810
    assert bound.bound_keeping(p, [1]) == 940
    two = bound.make_problem(nc, tc, [0, 0])  # two 0.81 shares on one GPU: none holds both
    with pytest.raises(bound.BoundError):
        bound.bound_keeping(two, [0, 1])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(NODE, min_size=1, max_size=2),
    tasks=st.lists(TASK, min_size=1, max_size=6),
    numa=st.booleans(),
    kept=st.sets(st.integers(0, 5)),
)
def test_bound_keeping_is_never_below_the_brute_force_optimum_that_keeps(
    nodes: list[Node], tasks: list[Task], numa: bool, kept: set[int]
) -> None:
    keep = frozenset(k for k in kept if k < len(tasks))
    best = brute_force(nodes, tasks, numa, keep)
    nc, tc = columns(nodes, tasks)
    p = bound.make_problem(nc, tc, numa=numa)
    plain = bound.solve(p).max_alloc_milli
    if best < 0:  # no placement holds them: the relaxation may or may not find one
        return
    got = bound.bound_keeping(p, sorted(keep))
    assert plain >= got >= best
    if not keep:
        assert got == plain


def test_replays_never_beat_the_bound_on_the_tiny_trace() -> None:
    tr = load_trace(TINY)
    for numa in (False, True):
        for policy in ("bestfit", "fgd", "pyctl", "random"):
            r = replay(tr, policy, 43, placements=True, numa=numa)
            for pct in (90, 100, 110):
                arrived = r.arrived_task_indices(pct)
                assert arrived is not None
                p = bound.make_problem(tr.nodes, tr.tasks, arrived, numa=numa)
                b = bound.solve(p)
                got = bound.check_placement(tr.nodes, tr.tasks, arrived, b.placement, numa=numa)
                assert got == b.best_alloc_milli
                assert r.unallocated_pct(pct) >= b.bound_pct - 1e-9, (policy, numa, pct)
                # with the tasks it placed kept, between the two
                placed = r.placed_positions(pct)
                assert placed is not None
                kept = p.unallocated_pct(bound.bound_keeping(p, placed))
                assert r.unallocated_pct(pct) >= kept - 1e-9 >= b.bound_pct - 2e-9


def brute_force_rule(nodes: Sequence[Node], tasks: Sequence[Task], numa: bool) -> int:
    """The work-conserving rule written out: each task in order placed if some placement holds
    it with every task placed before it (brute force), refused otherwise; GPU milli placed."""
    placed: set[int] = set()
    for j, t in enumerate(tasks):
        if t[2] and brute_force(nodes, tasks[: j + 1], numa, frozenset(placed | {j})) >= 0:
            placed.add(j)
    return sum(tasks[j][2] * tasks[j][3] for j in placed)


def test_the_work_conserving_rule_re_places_freely_and_never_refuses_what_fits() -> None:
    # two GPUs: 0.4 and 0.4 on one GPU (best fit), 0.6 on the other; the second 0.6 fits
    # nowhere as they stand, but with the two 0.4s apart it does: the rule places all four
    node: list[Node] = [(16000, 8192, 2, "G")]
    shares: list[Task] = [(1000, 0, 1, m, ()) for m in (400, 400, 600, 600)]
    p = bound.make_problem(*columns(node, shares))
    for integer in (False, True):
        a = bound.work_conserving(p, integer=integer)
        assert (a.alloc_milli, a.placed, a.refused) == (2000, (0, 1, 2, 3), {})
        assert a.unallocated_pct == 0.0
    assert brute_force_rule(node, shares, False) == 2000
    # two 0.81 shares first take both GPUs: the whole GPU that follows is refused, though the
    # bound (free choice of which tasks to place) places it in place of one of them
    nc, tc = columns(
        [(16000, 8192, 2, "G")],
        [(1000, 0, 1, 810, ()), (1000, 0, 1, 810, ()), (1000, 0, 1, 1000, ())],
    )
    p = bound.make_problem(nc, tc)
    a = bound.work_conserving(p)
    assert (a.alloc_milli, a.placed, a.refused) == (1620, (0, 1), {(1, 1000): 1})
    assert bound.solve(p).max_alloc_milli == 1810
    # CPU-only and unfittable tasks are never placed
    nc, tc = columns(
        [(8000, 8192, 2, "G")],
        [(1000, 0, 0, 0, ()), (99000, 0, 1, 1000, ()), (1000, 0, 1, 1000, ())],
    )
    a = bound.work_conserving(bound.make_problem(nc, tc))
    assert (a.alloc_milli, a.placed) == (1000, (2,))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(NODE, min_size=1, max_size=2, unique=True),
    tasks=st.lists(TASK, min_size=1, max_size=6),
    numa=st.booleans(),
)
def test_the_work_conserving_rule_matches_brute_force(
    nodes: list[Node], tasks: list[Task], numa: bool
) -> None:
    # every node a type of its own: the integer program is exact, so the rule run on it places
    # exactly what the rule written out with brute force places; the LP rule's placed tasks fit
    # the relaxation, so it never allocates more than the bound
    nc, tc = columns(nodes, tasks)
    p = bound.make_problem(nc, tc, numa=numa)
    exact = bound.work_conserving(p, integer=True)
    assert exact.alloc_milli == brute_force_rule(nodes, tasks, numa)
    relaxed = bound.work_conserving(p)
    assert relaxed.alloc_milli <= bound.solve(p).max_alloc_milli
    assert sum(relaxed.refused.values()) + len(relaxed.placed) == p.arrived_tasks - p.left_out


Inst = tuple[int, int, int, int, int]  # cpu, mem, rdma, app, cap: one GPU each
PER_NODE_KEYS = ("num_gpu", "cpu_milli", "memory_mib", "rdma")


def least_stranded(
    nodes: int, per: dict[str, int], running: list[Inst], shapes: list[dict[str, Any]]
) -> float | None:
    """The least F(M) of any placement of `running`, every assignment enumerated (None: none
    is valid); each placement judged by `stranded_of`, whose rules are checked below."""
    best: float | None = None

    def rec(k: int, node_of: list[int]) -> None:
        nonlocal best
        if k == len(running):
            try:
                f = bound.stranded_of(nodes, per, running, shapes, node_of)
            except ValueError:
                return
            best = f if best is None else min(best, f)
            return
        for j in range(nodes):
            rec(k + 1, [*node_of, j])

    rec(0, [])
    return best


def test_stranded_of_counts_idle_gpus_where_a_shape_no_longer_fits() -> None:
    per = {"num_gpu": 2, "cpu_milli": 16000, "memory_mib": 1024, "rdma": 100}
    shapes = [{"cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "rdma": 50, "weight": 1.0}]
    heavy: Inst = (1000, 0, 75, 0, 0)
    # one node, one instance leaving 25 RDMA: its idle GPU is stranded, and nothing goes lower
    assert bound.stranded_of(1, per, [heavy], shapes, [0]) == 1000.0
    assert bound.stranded_bound(1, per, [heavy], shapes) == pytest.approx(1000.0)
    assert bound.stranded_repack(1, per, [heavy], shapes) == (1000.0, [0])
    with pytest.raises(ValueError, match="over its capacity"):
        bound.stranded_of(1, per, [heavy, heavy], shapes, [0, 0])
    with pytest.raises(ValueError, match="no node"):
        bound.stranded_of(1, per, [heavy], shapes, [1])
    # two instances of 30 RDMA, a shape asking for 80: together on one node they fill it and
    # strand nothing; with their app capped at one a node, each node keeps one idle GPU that
    # the shape cannot use, and the bound sees the cap
    two: list[Inst] = [(1000, 0, 30, 7, 0), (1000, 0, 30, 7, 0)]
    wide = [{**shapes[0], "rdma": 80}]
    assert least_stranded(2, per, two, wide) == 0.0
    capped: list[Inst] = [(1000, 0, 30, 7, 1), (1000, 0, 30, 7, 1)]
    with pytest.raises(ValueError, match=r"app 7.s instances beyond their caps \[1, 1\]"):
        bound.stranded_of(2, per, capped, wide, [0, 0])
    assert least_stranded(2, per, capped, wide) == 2000.0
    assert bound.stranded_bound(2, per, capped, wide) == pytest.approx(2000.0)
    assert bound.stranded_bound(2, per, two, wide) == pytest.approx(0.0, abs=1e-6)


INST = st.tuples(
    st.sampled_from([1000, 4000, 8000]),
    st.sampled_from([0, 512]),
    st.sampled_from([0, 10, 25, 50, 75]),
    st.integers(0, 2),
    st.integers(0, 2),
)
SHAPE = st.fixed_dictionaries(
    {
        "cpu_milli": st.sampled_from([0, 2000, 8000]),
        "gpus": st.just(1),
        "gpu_milli": st.just(1000),
        "rdma": st.sampled_from([0, 25, 50]),
        "weight": st.sampled_from([0.25, 0.5, 1.0]),
    }
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(1, 3),
    gpus=st.integers(1, 3),
    cpu=st.sampled_from([8000, 16000]),
    rdma=st.sampled_from([50, 100, 200]),
    running=st.lists(INST, max_size=5),
    shapes=st.lists(SHAPE, min_size=1, max_size=2),
)
def test_the_stranded_bound_and_repack_bracket_the_brute_force_least(
    nodes: int, gpus: int, cpu: int, rdma: int, running: list[Inst], shapes: list[dict[str, Any]]
) -> None:
    per = {"num_gpu": gpus, "cpu_milli": cpu, "memory_mib": 1024, "rdma": rdma}
    least = least_stranded(nodes, per, running, shapes)
    if least is None:  # no placement holds them: not an instant a replay can reach
        return
    lower = bound.stranded_bound(nodes, per, running, shapes)
    assert lower <= least + 1e-6
    found = bound.stranded_repack(nodes, per, running, shapes)
    if found is not None:
        f, node_of = found
        assert f == bound.stranded_of(nodes, per, running, shapes, node_of) >= least - 1e-6


def test_check_placement_names_violations() -> None:
    nc, tc = columns([(4000, 4096, 2, "A")], [(1000, 0, 1, 600, ()), (1000, 0, 1, 600, ("b",))])
    assert bound.check_placement(nc, tc, [0, 0], [(0, 0, (0,)), (1, 0, (1,))]) == 1200
    with pytest.raises(ValueError, match="milli placed"):
        bound.check_placement(nc, tc, [0, 0], [(0, 0, (0,)), (1, 0, (0,))])
    with pytest.raises(ValueError, match="may not run"):
        bound.check_placement(nc, tc, [1], [(0, 0, (0,))])
    nc, tc = columns([(4000, 4096, 4, "A")], [(1000, 0, 2, 1000, ())])
    with pytest.raises(ValueError, match="span zones"):
        bound.check_placement(nc, tc, [0], [(0, 0, (1, 2))], numa=True)
    assert bound.check_placement(nc, tc, [0], [(0, 0, (1, 2))], numa=False) == 2000


def test_without_highspy_the_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, *a: Any) -> Any:
        if name == "highspy":
            raise ImportError("no highspy")
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    nc, tc = columns([(4000, 4096, 1, "A")], [(1000, 0, 1, 600, ())])
    with pytest.raises(bound.BoundError, match=r"pyctl\[bound\]"):
        bound.solve(bound.make_problem(nc, tc))
