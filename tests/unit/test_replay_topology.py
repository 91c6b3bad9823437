"""The trace replay with a fabric (pyctl/replay/topology.py, docs/topology-replay.md): the variant's
construction, and the policies on a hand-made case of 12 four-GPU nodes in three cliques."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import pytest

from pyctl.cluster.records import NodeRecord
from pyctl.model import Gang, Gpu, Node, Shape, Workload, Zone
from pyctl.replay import topology as T
from pyctl.replay.trace import load_trace
from pyctl.workflows.compaction import gang_domain

TINY = Path(__file__).resolve().parents[1] / "data" / "replay_tiny"

ONE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000)
FOUR = Shape(cpu_milli=4000, gpus=4, gpu_milli=1000)
M = Workload((Shape(1000, 0, 1, 1000, weight=0.5), Shape(4000, 0, 4, 1000, weight=0.5)))


def three_cliques() -> T.Fabric:
    """12 nodes of 4 GPUs; node i is in clique c{i % 3}, so the tie order (node order)
    alternates the cliques; one leaf."""
    nodes = []
    clique_of = []
    for i in range(12):
        c = f"c{i % 3}"
        clique_of.append(c)
        zone = Zone(0, 64000, 0, 262144, 0, gpus=tuple(Gpu(g) for g in range(4)))
        labels = ((T.CLIQUE, c), (T.LEAF, "leaf-0"))
        nodes.append(Node(f"n{i:02d}", "G2", "none", "none", zones=(zone,), labels=labels))
    cliques = {c: [i for i in range(12) if clique_of[i] == c] for c in ("c0", "c1", "c2")}
    return T.Fabric(tuple(nodes), tuple(clique_of), ("leaf-0",) * 12, cliques, {"leaf-0": ["c0"]})


def fill(c: T.Cluster, choose: T.Chooser, shape: Shape, n: int) -> list[int]:
    where = []
    for _ in range(n):
        got = choose(c, shape, None)
        assert got is not None
        c.apply(got[0], got[1]["assignment"])
        where.append(got[0])
    return where


def test_the_variant_puts_each_node_in_one_clique_of_one_kind_and_is_seeded() -> None:
    trace = load_trace(TINY)
    v = T.Variant(domain_nodes=3, leaf_domains=2)
    f = T.build_fabric(trace, v, 7)
    assert sorted(n.name for n in f.nodes) == sorted(trace.nodes["name"])
    seen = Counter(i for members in f.cliques.values() for i in members)
    assert set(seen.values()) == {1}
    assert len(seen) == len(f.nodes)
    for name, members in f.cliques.items():
        assert 1 <= len(members) <= 3
        kinds = {(f.nodes[i].gpu_model, len(f.nodes[i].zones[0].gpus)) for i in members}
        assert len(kinds) == 1, name  # an NVLink domain is one kind of machine
        assert all(dict(f.nodes[i].labels)[T.CLIQUE] == name for i in members)
    assert all(len(cs) <= 2 for cs in f.leaves.values())
    assert T.build_fabric(trace, v, 7) == f
    assert [n.name for n in T.build_fabric(trace, v, 8).nodes] != [n.name for n in f.nodes]


def test_the_gang_rate_makes_gangs_their_share_of_the_gpu_request() -> None:
    # trace tasks of 1 GPU on average, gangs of 9: p 9 / (p 9 + (1 - p) 1) = 0.25
    p = T.gang_probability(1000.0, 9000.0, 0.25)
    assert p == pytest.approx(1 / 28)
    assert p * 9 / (p * 9 + (1 - p) * 1) == pytest.approx(0.25)
    assert T.gang_probability(1000.0, 9000.0, 0.0) == 0.0


def test_the_arrivals_end_once_the_request_reaches_capacity() -> None:
    trace = load_trace(TINY)
    stream = T.arrivals(trace, T.Variant(gang_share=0.5), 3)
    total = sum(T._request(a) for a in stream)
    cap = trace.gpu_count * 1000
    assert total >= cap > total - T._request(stream[-1])
    assert any(isinstance(a, T.GangArrival) for a in stream)
    assert stream == T.arrivals(trace, T.Variant(gang_share=0.5), 3)


def test_pyctl_fills_the_broken_clique_and_the_gang_runs_where_fgd_leaves_it_pending() -> None:
    # 12 one-GPU pods: FGD packs each node (its score) and breaks ties by node order, which
    # alternates cliques: n00, n01, n02 full, no clique whole, and no clique has four empty
    # nodes for a gang of 4 pods x 4 GPUs. pyctl's ties go to the clique with the least idle
    # GPU: n00, n03, n06 (all c0); c1 and c2 stay whole and the gang runs in c1.
    fgd = T.Cluster(three_cliques(), M)
    assert fill(fgd, T.choose_fgd, ONE, 12) == [0] * 4 + [1] * 4 + [2] * 4
    assert fgd.whole_cliques() == 0
    gang = T.GangArrival("lws", 4, Shape(4000, 0, 4, 1000, gang=Gang(4, T.CLIQUE)))
    before = (fgd.allocated, list(fgd.keys))
    assert T.gang_first_fit(fgd, gang) is None
    assert (fgd.allocated, fgd.keys) == before  # all or nothing: a failed trial is undone

    py = T.Cluster(three_cliques(), M)
    assert fill(py, T.choose_pyctl, ONE, 12) == [0] * 4 + [3] * 4 + [6] * 4
    assert py.whole_cliques() == 2
    done = T.gang_pyctl(py, gang)
    assert done is not None
    assert sorted(i for i, _ in done) == [1, 4, 7, 10]
    assert py.whole_cliques() == 1
    assert py.allocated == 28_000


def test_bestfit_and_binpack_take_the_tightest_clique_first_fit_breaks_a_whole_one() -> None:
    # one 4-GPU pod on n01 (c1): for a gang of 3 pods x 4 GPUs, c1 holds 3, c0 and c2 hold 4
    gang = T.GangArrival("lws", 3, Shape(4000, 0, 4, 1000, gang=Gang(3, T.CLIQUE)))
    whole = {}
    for name, policy in (
        ("first", T.gang_first_fit),
        ("bestfit", T.gang_kueue_bestfit),
        ("binpack", T.gang_binpack),
        ("pyctl", T.gang_pyctl),
    ):
        c = T.Cluster(three_cliques(), M)
        r = c.ranks(FOUR, [1])[0]
        assert r is not None
        c.apply(1, r["assignment"])
        done = policy(c, gang)
        assert done is not None
        assert len(done) == 3
        whole[name] = c.whole_cliques()
        assert len({c.fabric.clique_of[i] for i, _ in done}) == 1
    assert whole == {"first": 1, "bestfit": 2, "binpack": 2, "pyctl": 2}


def test_least_free_capacity_goes_to_the_tightest_leaf_then_clique_then_node() -> None:
    c = T.Cluster(three_cliques(), M)
    r = c.ranks(FOUR, [4])[0]  # n04 (c1) full: c1 holds the fewest one-GPU pods
    assert r is not None
    c.apply(4, r["assignment"])
    got = T.choose_lfc(c, ONE, None)
    assert got is not None
    assert got[0] == 1


def test_a_run_of_the_tiny_trace_is_seeded_and_reads_to_100_percent() -> None:
    trace = load_trace(TINY)
    v = T.Variant(domain_nodes=5, gang_share=0.5)
    a = T.run(trace, "pyctl", 5, v)
    b = T.run(trace, "pyctl", 5, v)
    assert a.checkpoints == b.checkpoints
    assert [c.arrived_pct for c in a.checkpoints] == list(range(1, 101))
    last = a.last
    assert last.gangs_arrived > 0
    assert 0 <= last.gang_milli_placed <= last.gang_milli_arrived
    assert 0.0 <= a.unallocated_pct() <= 100.0
    assert a.evictions == 0


# ---- pyctl with repair -------------------------------------------------------------------------

GANG4 = T.GangArrival("lws", 4, Shape(4000, 0, 4, 1000, gang=Gang(4, T.CLIQUE)))


def _place(c: T.Cluster, fix: T.Repair, key: str, i: int, shape: Shape) -> None:
    r = c.ranks(shape, [i])[0]
    assert r is not None
    c.apply(i, r["assignment"])
    fix.placed(key, i, r["assignment"], shape)


def test_a_pending_gang_is_rescued_by_moving_one_single_pod_out_of_the_cheapest_clique() -> None:
    # c0 (n00 n03 n06 n09) holds a placed gang of 4 x 4 GPUs (gang pods never move); c1 has
    # one 1-GPU pod on n01 (15 GPUs idle, 1 to free for 4 x 4), c2 two on n02 and n05 (14
    # idle, 2 to free). A second gang of 4 x 4 finds no clique; the repair chooses c1 (the
    # controller's rule), the planner moves the pod off n01 (to n02, which FGD packs), and the
    # gang lands whole in c1.
    c = T.Cluster(three_cliques(), M)
    fix = T.Repair(c)
    assert T.gang_pyctl(c, GANG4) is not None  # c0: all three cliques were whole
    assert {c.fabric.clique_of[i] for i in range(12) if c.idle(i) == 0} == {"c0"}
    _place(c, fix, "one-a", 1, ONE)
    _place(c, fix, "one-b", 2, ONE)
    _place(c, fix, "one-c", 5, ONE)
    before = c.allocated
    assert T.gang_pyctl(c, GANG4) is None
    assert fix.clique_for(GANG4) == "c1"
    got = fix.repair(GANG4, 10, "g")
    assert got is not None
    assert got.clique == "c1"
    assert got.moves == (("one-a", 1, 2),)
    assert sorted(i for i, _ in got.placed) == [1, 4, 7, 10]  # whole, inside c1
    assert all(len(a["gpus"]) == 4 for _, a in got.placed)
    assert fix.evictions == 1
    assert fix.pods["one-a"][0] == 2
    assert c.allocated == before + 16_000
    assert [c.idle(i) for i in (0, 3, 6, 9)] == [0, 0, 0, 0]  # the other gang untouched


def test_a_repair_moves_nothing_without_budget_or_when_it_cannot_make_room_for_all() -> None:
    c = T.Cluster(three_cliques(), M)
    fix = T.Repair(c)
    for k, i in enumerate(range(12)):
        _place(c, fix, f"p{k}", i, ONE)  # one pod on every node: every clique 4 short
    keys = list(c.keys)
    assert fix.repair(GANG4, 0, "g") is None
    # the rescue depth is 3 evictions a node and each node has one pod: a plan exists, but an
    # allowance of 2 evictions cannot free the 4 nodes the gang needs: nothing moves
    assert fix.repair(GANG4, 2, "g") is None
    assert c.keys == keys
    assert fix.evictions == 0
    got = fix.repair(GANG4, 4, "g")
    assert got is not None
    assert len(got.moves) == 4
    assert len(got.placed) == 4
    assert len({c.fabric.clique_of[i] for i, _ in got.placed}) == 1


def _controller_view(c: T.Cluster) -> tuple[dict[str, Node], dict[str, NodeRecord]]:
    """The replay's cluster as the controller's models and node records."""
    models: dict[str, Node] = {}
    records: dict[str, NodeRecord] = {}
    for i, n in enumerate(c.fabric.nodes):
        z = n.zones[0]
        gpus = tuple(Gpu(g, used_milli=u) for g, u in enumerate(c.used[i]))
        models[n.name] = dataclasses.replace(n, zones=(dataclasses.replace(z, gpus=gpus),))
        records[n.name] = NodeRecord(n.name, gpus=len(gpus), labels=n.labels)
    return models, records


@pytest.mark.parametrize("seed", range(6))
def test_the_replays_clique_is_the_controllers_gang_domain_decision(seed: int) -> None:
    rng = random.Random(seed)
    c = T.Cluster(three_cliques(), M)
    fix = T.Repair(c)
    for k in range(rng.randint(0, 30)):
        shape = rng.choice((ONE, ONE, FOUR, Shape(1000, 0, 1, 500)))
        nodes = [i for i, r in enumerate(c.ranks(shape, range(12))) if r is not None]
        if nodes:
            _place(c, fix, f"p{k}", rng.choice(nodes), shape)
    models, records = _controller_view(c)
    for pods in (2, 3, 4, 6, 13):
        shape = Shape(4000, 0, rng.choice((1, 2, 4)), 1000, gang=Gang(pods, T.CLIQUE))
        g = T.GangArrival("lws", pods, shape)
        dest = frozenset(records)
        assert shape.gang is not None
        where, why = gang_domain(shape.gang, shape, dest, models, records)
        clique = fix.clique_for(g)
        if clique is None:
            assert (where, why) == (dest, "")
        else:
            assert where == frozenset(c.names[i] for i in c.fabric.cliques[clique]), why


def test_defragmentation_moves_single_pods_within_the_budget_and_never_a_gangs() -> None:
    # a gang of 4 x 4 in c0, one 1-GPU pod on each of n01 and n04: for M's 4-GPU shape, one of
    # them moved beside the other frees a whole node (F(M) falls by 3 GPUs' worth)
    c = T.Cluster(three_cliques(), M)
    fix = T.Repair(c)
    assert T.gang_pyctl(c, GANG4) is not None
    _place(c, fix, "a", 1, ONE)
    _place(c, fix, "b", 4, ONE)
    assert fix.defragment(0) == 0
    assert fix.defragment(4) == 1  # one move suffices; then no move lowers F(M)
    assert fix.evictions == 1
    assert {fix.pods["a"][0], fix.pods["b"][0]} in ({1}, {4})
    assert [c.idle(i) for i in (0, 3, 6, 9)] == [0, 0, 0, 0]
    assert fix.defragment(4) == 0


def test_a_repairing_run_keeps_its_evictions_within_the_budget() -> None:
    trace = load_trace(TINY)
    v = T.Variant(domain_nodes=5, gang_share=0.5)
    for policy in ("pyctl-repair", "pyctl-compact"):
        r = T.run(trace, policy, 5, v)
        assert r.evictions <= 0.02 * r.pods_arrived  # 2% of 39 pods: none here
        assert r.last.gangs_placed <= r.last.gangs_arrived
    loose = T.run(trace, "pyctl-compact", 1, v, T.RepairBudget(evict_pct=20.0))
    assert 0 < loose.evictions <= 0.20 * loose.pods_arrived
    assert loose.unallocated_pct() < T.run(trace, "pyctl", 1, v).unallocated_pct()
    tight = T.run(trace, "pyctl-compact", 1, v, T.RepairBudget(evict_pct=0.0))
    assert tight.evictions == 0
