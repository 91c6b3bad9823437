"""The menu of standard sizes (pyctl/recommend/menu.py): hand-worked cases, and by brute force that
row k of the trade-off is never beaten by any menu of at most k of the pool's sizes."""

from __future__ import annotations

import itertools
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyctl.model import Gpu, Node, Snapshot, Zone
from pyctl.recommend.menu import Evaluator, Item, scale, tradeoff
from pyctl.recommend.sizes import Need, Pool


def share_groups(pool: Pool, spec: list[tuple[int, int, int]]) -> list[Item]:
    """(GPUs, milli per GPU, replicas) -> groups of (need, request size, replicas)."""
    out: list[Item] = []
    for gpus, milli, n in spec:
        size, need = pool.request_size(gpus, milli, None)
        out.append((need, size, n))
    return out


def mig_groups(pool: Pool, spec: list[tuple[str, int]]) -> list[Item]:
    out: list[Item] = []
    for profile, n in spec:
        size, need = pool.request_size(1, 0, profile)
        out.append((need, size, n))
    return out


def test_shares_hand_worked() -> None:
    # One node, 2 GPUs; 2 x 0.45 and 2 x 0.25 GPU (1.4 GPUs) scale to 2 GPUs of demand:
    # raw 2.86 + 2.86 -> 3 x 0.45 and 3 x 0.25 (rounded to 6 replicas).
    pool = Pool("T4", (("n1", 2),), shares=True, grid=10)
    ev = Evaluator(pool, share_groups(pool, [(1, 450, 2), (1, 250, 2)]))
    assert [n for _, _, n in ev.scaled] == [3, 3]
    # menu {0.5}: 6 x 0.5, two per GPU: 4 placed, each with the average need 0.35 -> 1.4 of 2
    e = ev.evaluate([pool.size("0.5gpu")])
    assert (e.served_gpus, e.allocated_gpus) == (Fraction(7, 5), 2)
    assert (e.served_pct, e.waste_pct, e.unallocated_pct) == (70.0, 30.0, 0.0)
    # menu {0.3, 0.5}: 0.5 x3 fill GPU 1 and half of GPU 2; one 0.3 joins it (0.8), two fail:
    # served 3 x 0.45 + 0.25 = 1.6, allocated 1.8
    e = ev.evaluate([pool.size("0.3gpu"), pool.size("0.5gpu")])
    assert (e.served_gpus, e.allocated_gpus) == (Fraction(8, 5), Fraction(9, 5))
    assert e.placed == {"0.5gpu": 3, "0.3gpu": 1}
    # as requested: 0.45 x2 on GPU 1 (0.9), 0.45 + 0.25 x2 on GPU 2 (0.95), one 0.25 fails
    b = ev.as_requested()
    assert b.served_gpus == Fraction(37, 20)
    assert b.waste_pct == 0.0
    t = tradeoff(ev, max_k=3, tolerance_pct=1.0)
    # k=1: {0.5} (70%) beats {0.6}..{gpu}; k=2: {0.3, 0.5} and {0.4, 0.5} both serve 80%,
    # {0.3, 0.5} wastes less; nothing but 0.3/0.4/0.5 holds the needs more tightly, so k=3 adds
    # nothing
    assert [r.menu for r in t.rows] == [("0.5gpu",), ("0.3gpu", "0.5gpu"), ("0.3gpu", "0.5gpu")]
    assert t.recommended is not None
    assert t.recommended.menu == ("0.3gpu", "0.5gpu")


def test_mig_hand_worked() -> None:
    # One A100-40GB: 4 x 1g.5gb + 1 x 2g.10gb (6 of 7 slices) scale to 7 slices: 5 + 1.
    pool = Pool("A100-SXM4-40GB", (("n1", 1),), mig=True)
    ev = Evaluator(pool, mig_groups(pool, [("1g.5gb", 4), ("2g.10gb", 1)]))
    assert [n for _, _, n in ev.scaled] == [5, 1]
    served = {
        m: ev.evaluate([pool.size(x) for x in m.split("+")]).served_gpus
        for m in ("1g.5gb", "2g.10gb", "3g.20gb", "gpu", "1g.10gb", "1g.5gb+2g.10gb")
    }
    assert served["1g.5gb"] == Fraction(5, 7)  # the 2g need is held by no size: uncovered
    assert served["2g.10gb"] == Fraction(1, 2)  # 6 x 2g, 3 fit, each with the average need 1/6
    assert served["3g.20gb"] == Fraction(1, 3)  # 2 fit
    assert served["gpu"] == Fraction(1, 6)  # 1 fits
    assert served["1g.10gb"] == Fraction(4, 7)  # holds the 1g.5gb needs, at most 4 per GPU
    assert served["1g.5gb+2g.10gb"] == 1  # 2g.10gb + 5 x 1g.5gb is a valid layout
    t = tradeoff(ev, max_k=2)
    assert [r.menu for r in t.rows] == [("1g.5gb",), ("1g.5gb", "2g.10gb")]
    assert t.baseline.served_pct == 100.0


def test_full_profile_request_is_the_whole_gpu_and_multi_gpu_is_kept() -> None:
    pool = Pool("A100-SXM4-40GB", (("n1", 8), ("n2", 8)), mig=True)
    size, need = pool.request_size(1, 0, "7g.40gb")
    assert size is not None
    assert size.name == "gpu"
    assert need.compute == 1
    size, need = pool.request_size(4, 1000, None)
    assert size is None
    assert need == Need(4)
    ev = Evaluator(pool, [(need, None, 3), *mig_groups(pool, [("1g.5gb", 7)])])
    # 3 x 4 GPUs + 7 x 1g (1 GPU) = 13 GPUs scale to 16: multi-GPU placed whole on the nodes
    e = ev.evaluate([pool.size("1g.5gb")])
    assert e.placed["4 gpus"] == sum(n for nd, _, n in ev.scaled if nd.gpus == 4)


def test_scale_keeps_the_mix() -> None:
    pool = Pool("T4", (("n", 4),), shares=True)
    groups = share_groups(pool, [(1, 500, 1), (1, 1000, 1)])
    got = scale(pool, groups)
    # 1.5 GPUs -> 4: x 8/3 = 2.67 + 2.67 -> 3 + 2 (largest remainder, ties to the first)
    assert [n for _, _, n in got] == [3, 2]


def _snapshot(used: list[list[int]]) -> Snapshot:
    return Snapshot(
        tuple(
            Node(
                f"n{i}",
                "T4",
                zones=(Zone(0, 64000, 0, 262144, 0, tuple(Gpu(g, u) for g, u in enumerate(node))),),
            )
            for i, node in enumerate(used)
        )
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.lists(
        st.lists(st.sampled_from([0, 200, 400, 600, 1000]), min_size=1, max_size=3),
        min_size=1,
        max_size=3,
    ),
    spec=st.lists(
        st.tuples(
            st.sampled_from([1, 1, 1, 2]),
            st.integers(1, 20).map(lambda x: 50 * x),
            st.integers(1, 6),
        ),
        min_size=1,
        max_size=4,
    ),
    max_k=st.integers(1, 3),
)
def test_shares_row_k_is_never_beaten(
    nodes: list[list[int]], spec: list[tuple[int, int, int]], max_k: int
) -> None:
    pool = Pool("T4", tuple((f"n{i}", len(g)) for i, g in enumerate(nodes)), shares=True, grid=5)
    groups = share_groups(pool, [(g, m if g == 1 else 1000, n) for g, m, n in spec])
    ev = Evaluator(pool, groups, _snapshot(nodes))
    t = tradeoff(ev, max_k=max_k)
    sizes = pool.sizes()
    assert len(sizes) == 5
    for k, row in enumerate(t.rows, 1):
        for j in range(1, k + 1):
            for menu in itertools.combinations(sizes, j):
                assert ev.evaluate(menu).key() <= row.key(), (k, menu, row.menu)
    # rows never get worse as k grows, and the recommended one is within the tolerance
    keys = [r.key() for r in t.rows]
    assert keys == sorted(keys)
    if t.recommended is not None:
        assert t.recommended.served_pct >= max(r.served_pct for r in t.rows) - t.tolerance_pct


MIG_PROFILES = ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    spec=st.lists(
        st.tuples(st.sampled_from(MIG_PROFILES), st.integers(1, 5)), min_size=1, max_size=4
    ),
    max_k=st.integers(1, 3),
)
def test_mig_row_k_is_never_beaten(
    gpus: list[int], spec: list[tuple[str, int]], max_k: int
) -> None:
    pool = Pool("A100-SXM4-40GB", tuple((f"n{i}", g) for i, g in enumerate(gpus)), mig=True)
    ev = Evaluator(pool, mig_groups(pool, spec))
    t = tradeoff(ev, max_k=max_k)
    sizes = pool.sizes()
    assert [s.name for s in sizes] == ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "gpu"]
    for k, row in enumerate(t.rows, 1):
        for j in range(1, k + 1):
            for menu in itertools.combinations(sizes, j):
                assert ev.evaluate(menu).key() <= row.key(), (k, menu, row.menu)
