"""Trace replay engine (pyctl._core.replay_run) on small generated traces: each policy's placement
rule, and the metric (unallocated GPU and fragmentation at arrived-% checkpoints)."""

from __future__ import annotations

from typing import Any

import pytest

from pyctl import _core
from pyctl.core.inputs import ReplayNodes, ReplayTasks, ShapeInput
from pyctl.core.types import ReplayRaw
from pyctl.replay.trace import RunResult


def nodes(*specs: tuple[int, int, str]) -> ReplayNodes:
    return {
        "name": [f"n{i}" for i in range(len(specs))],
        "cpu_milli": [s[0] for s in specs],
        "memory_mib": [1 << 20 for _ in specs],
        "gpu": [s[1] for s in specs],
        "model": [s[2] for s in specs],
    }


def tasks(*specs: tuple[int, int, int]) -> ReplayTasks:
    return {
        "cpu_milli": [s[0] for s in specs],
        "memory_mib": [0 for _ in specs],
        "num_gpu": [s[1] for s in specs],
        "gpu_milli": [s[2] for s in specs],
    }


WHOLE: list[ShapeInput] = [{"cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "weight": 1.0}]


def play(n: ReplayNodes, t: ReplayTasks, policy: str, **kw: Any) -> ReplayRaw:
    kw.setdefault("shapes", WHOLE)
    shapes = kw.pop("shapes")
    return _core.replay_run(
        n, t, shapes, policy=policy, tune=0.0, shuffle=False, placements=True, **kw
    )


def test_bestfit_stacks_on_the_fuller_node() -> None:
    r = play(
        nodes((32000, 2, "G2"), (32000, 2, "G2")),
        tasks((1000, 1, 1000), (1000, 1, 1000)),
        "bestfit",
    )
    assert r["node_of"][0] == r["node_of"][1]


def test_packing_prefers_a_partly_used_gpu() -> None:
    r = play(
        nodes((32000, 2, "G2"), (32000, 2, "G2")), tasks((1000, 1, 500), (1000, 1, 300)), "packing"
    )
    assert r["node_of"][0] == r["node_of"][1]
    assert r["checkpoints"][-1]["allocated_milli"] == 800


def test_clustering_groups_tasks_of_the_same_affinity() -> None:
    n = nodes((32000, 4, "G2"), (32000, 4, "G2"), (32000, 4, "G2"))
    r = play(n, tasks((1000, 1, 300), (1000, 2, 1000), (1000, 1, 300)), "clustering")
    assert r["node_of"][0] == r["node_of"][2] != r["node_of"][1]


@pytest.mark.parametrize("policy", ["fgd", "pyctl"])
def test_fgd_fills_the_stranded_half_gpu(policy: str) -> None:
    shapes = [
        {"cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "weight": 0.5},
        {"cpu_milli": 1000, "gpus": 1, "gpu_milli": 500, "weight": 0.5},
    ]
    n = nodes((32000, 2, "G2"), (32000, 2, "G2"))
    r = play(n, tasks((1000, 1, 500), (1000, 1, 500)), policy, shapes=shapes)
    assert r["node_of"][0] == r["node_of"][1]
    assert r["checkpoints"][-1]["frag_milli"] == pytest.approx(0.0)


def test_pyctl_avoids_making_a_node_cpu_short() -> None:
    # A 1-GPU task with 40 cores: on the 8-GPU/96-core node it would leave 58% of the CPU for
    # 88% of the GPUs (the rest would strand for want of CPU); the 2-GPU/104-core node keeps
    # 62% of the CPU for 50% of the GPUs. FGD sees no fragment either way and takes the first.
    n = nodes((96000, 8, "G2"), (104000, 2, "G2"))
    t = tasks((40000, 1, 1000))
    assert play(n, t, "fgd")["node_of"] == [0]
    assert play(n, t, "pyctl")["node_of"] == [1]
    # A light task strands nothing: both keep the packing bias (first node).
    light = tasks((4000, 1, 1000))
    assert play(n, light, "pyctl")["node_of"] == [0]


def test_pyctl_puts_cpu_only_tasks_where_the_gpus_are_used_up() -> None:
    n = nodes((96000, 2, "G2"), (96000, 2, "T4"))
    t = tasks((1000, 2, 1000), (8000, 0, 0))
    t["gpu_models"] = [["T4"], []]
    assert play(n, t, "fgd")["node_of"] == [1, 0]
    assert play(n, t, "pyctl")["node_of"] == [1, 1]


def test_pyctl_shares_the_gpu_that_fits_best() -> None:
    # GPUs with 550 and 400 milli free: a 300 task goes on the 400 one (FGD's score ties and
    # it takes the first GPU), so the 550 task that follows still fits.
    n = nodes((96000, 2, "G2"))
    t = tasks((1000, 1, 450), (1000, 1, 600), (1000, 1, 300), (1000, 1, 550))
    shapes = [{"cpu_milli": 1000, "gpus": 1, "gpu_milli": 100, "weight": 1.0}]
    assert play(n, t, "fgd", shapes=shapes)["node_of"] == [0, 0, 0, -1]
    assert play(n, t, "pyctl", shapes=shapes)["node_of"] == [0, 0, 0, 0]


def test_gpu_model_constraint_is_respected() -> None:
    t = tasks((1000, 1, 1000))
    t["gpu_models"] = [["T4"]]
    for policy in _core.REPLAY_POLICIES:
        r = play(nodes((32000, 2, "G2"), (32000, 2, "T4")), t, policy)
        assert r["node_of"] == [1], policy


def test_random_and_dotprod_place_what_fits_and_fail_the_rest() -> None:
    for policy in ("random", "dotprod"):
        r = play(nodes((32000, 2, "G2")), tasks(*[(1000, 1, 1000)] * 3), policy)
        assert (r["placed"], r["failed"]) == (2, 1)
        assert r["node_of"][2] == -1


def test_metric_samples_each_arrived_percent() -> None:
    r = play(nodes((4000, 1, "G2")), tasks((1000, 1, 600), (1000, 1, 600), (1000, 1, 400)), "fgd")
    at = {c["arrived_pct"]: c for c in r["checkpoints"]}
    assert at[60]["allocated_milli"] == 600
    assert at[120]["allocated_milli"] == 600  # the second task failed and is not retried
    assert at[121]["allocated_milli"] == 1000
    assert max(at) == 130
    # one GPU, 400 idle at 60%: the 1-GPU shape cannot use it -> all of it is fragment
    assert at[60]["frag_milli"] == pytest.approx(400.0)
    assert at[60]["idle_milli"] == 400


def test_numa_split_blind_scheduler_is_refused_by_the_kubelet() -> None:
    n = nodes((64000, 8, "G2"), (64000, 8, "G2"))
    t = tasks((1000, 5, 1000), (1000, 4, 1000))
    blind = play(n, t, "fgd", numa=True)
    aware = play(n, t, "pyctl", numa=True)
    assert blind["failed_admission"] == 1
    assert aware["failed_admission"] == 0


def test_compaction_respects_the_budget() -> None:
    n = nodes((64000, 2, "G2"), (64000, 2, "G2"))
    t = tasks(*[(1000, 1, 500)] * 3)
    r = play(n, t, "pyctl", compaction={"every": 1, "budget": 0.0, "max_moves": 4})
    assert r["evictions"] == 0


def test_compaction_makes_a_move_that_pays_off_only_across_two_nodes() -> None:
    # 0.47 then 0.32 share node 0's GPU (0.21 left); 0.65 takes node 1 (0.35 left). Moving the
    # 0.32 beside the 0.65 raises node 0's fragment (0.53 left, too small for a whole GPU) and
    # lowers the cluster's: 472.5 -> 295 milli-GPU.
    shapes = [
        {"cpu_milli": 1000, "gpus": 1, "gpu_milli": m, "weight": w}
        for m, w in ((1000, 0.5), (470, 0.25), (320, 0.25))
    ]
    n = nodes(*[(64000, 1, "G2")] * 3)
    t = tasks((1000, 1, 470), (1000, 1, 320), (1000, 1, 650))
    still = play(n, t, "pyctl", shapes=shapes)
    moved = play(n, t, "pyctl", shapes=shapes, compaction={"every": 3, "budget": 1.0})
    assert still["node_of"] == moved["node_of"] == [0, 0, 1]
    assert (still["evictions"], moved["evictions"]) == (0, 1)
    assert still["checkpoints"][-1]["frag_milli"] == pytest.approx(472.5)
    assert moved["checkpoints"][-1]["frag_milli"] == pytest.approx(295.0)
    run = RunResult(trace="t", policy="pyctl", seed=0, numa=False, raw=moved)
    assert moved["checkpoints"][-1]["arrived_pct"] == 48
    assert run.evicted_pct(48) == pytest.approx(100 / 3)  # by 48% arrived: 1 of 3 pods
    assert run.evicted_pct(100) == run.evicted_pct(None)  # never reached: the whole run
    with pytest.raises(ValueError, match=r"compaction\.reserve"):
        play(n, t, "pyctl", compaction={"reserve": 2.0})


def test_resampling_is_seeded() -> None:
    n = nodes(*[(96000, 8, "G2")] * 4)
    t = tasks(*[(1000, 1, 100 + 50 * i) for i in range(10)])
    a = _core.replay_run(n, t, WHOLE, policy="bestfit", seed=1, placements=True)
    b = _core.replay_run(n, t, WHOLE, policy="bestfit", seed=1, placements=True)
    c = _core.replay_run(n, t, WHOLE, policy="bestfit", seed=2, placements=True)
    assert a == b
    assert a["task_of"] != c["task_of"]
    total = sum(t["num_gpu"][j] * t["gpu_milli"][j] for j in a["task_of"])
    assert 1.3 * 32000 - 1000 < total <= 1.3 * 32000


def test_bad_input_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"tasks\[0\]\.gpu_milli"):
        play(nodes((32000, 2, "G2")), tasks((1000, 2, 500)), "fgd")
    with pytest.raises(ValueError, match="policy"):
        play(nodes((32000, 2, "G2")), tasks((1000, 1, 500)), "nope")
    bad = nodes((32000, 2, "G2"))
    bad["gpu"] = []
    with pytest.raises(ValueError, match=r"nodes\.gpu"):
        play(bad, tasks((1000, 1, 500)), "fgd")
