"""The offline benchmarks whose figures docs/scale.md quotes run, on a small cluster, and print
their last line in the form the docs quote (the figures themselves are measured, not checked)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


def test_the_compaction_round_bench_runs() -> None:
    lines = _run("bench/compaction_round.py", "--nodes", "60", "--rounds", "2", "--changed", "0.3")
    assert len(lines) == 3
    assert re.fullmatch(
        r"compaction round: 60 nodes, 600 pods, median \d+\.\d\d s after the first "
        r"\(\d+\.\d\d s\); 30% of the nodes changed before each",
        lines[-1],
    ), lines[-1]


def test_the_extender_call_bench_runs() -> None:
    lines = _run("bench/extender_call.py", "--nodes", "60", "--candidates", "20", "--calls", "50")
    assert len(lines) == 3
    assert lines[0].startswith("every rank kept: per call median ")
    assert lines[1].startswith("one candidate re-scored: per call median ")
    assert re.fullmatch(
        r"extender call: 60 nodes, 20 candidates, median \d+\.\d{3} ms with one re-scored; "
        r"kept: reading the request \d+\.\d{3} ms, the advice \d+\.\d{3} ms",
        lines[-1],
    ), lines[-1]


def test_the_loop_stalls_bench_runs() -> None:
    lines = _run("bench/loop_stalls.py", "--nodes", "60", "--seconds", "1")
    assert len(lines) == 3
    assert lines[0].startswith("without the pause: ")
    assert lines[1].startswith("collector paused: ")
    assert re.fullmatch(
        r"loop stalls: 60 nodes, longest wait \d+ ms without the pause, \d+ ms with it "
        r"\(\d+\.\dx shorter\); p99 \d+\.\d -> \d+\.\d ms",
        lines[-1],
    ), lines[-1]


def test_the_fabric_pass_bench_runs() -> None:
    lines = _run("bench/fabric_pass.py", "--nodes", "60")
    assert len(lines) == 2
    # 60 nodes, 18 per clique: 4 domains (the last of 6 nodes)
    assert lines[0] == "domains 4, levels ['nvidia.com/gpu.clique']", lines[0]
    assert re.fullmatch(
        r"fabric_pass: 60 nodes, \d+\.\d ms per pass \(model \d+\.\d \+ fabric \d+\.\d\), "
        r"\d+\.\d\d% of the 10 s interval",
        lines[-1],
    ), lines[-1]


def _scale_module() -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("scale", REPO / "bench" / "scale.py")
        assert spec is not None
        assert spec.loader is not None
        scale = importlib.util.module_from_spec(spec)
        sys.modules["scale"] = scale  # its dataclasses look their module up
        spec.loader.exec_module(scale)
    finally:
        sys.path.remove(str(REPO / "bench"))
        sys.modules.pop("scale", None)
    return scale


def test_the_scale_bench_judges_cpu_work_in_units_of_the_reference_and_the_rest_in_seconds() -> (
    None
):
    scale = _scale_module()
    sizes = (1000, 2000, 5000)
    # the start-up linear in the nodes, measured at 5,000 nodes on a machine a quarter slower
    slow = (1.0, 1.0, 1.25)
    results = []
    for n, f in zip(sizes, slow, strict=True):
        r = scale.SizeResult(n, 10 * n, 4, n // 5)
        for attr, _, _ in scale.COSTS:
            setattr(r, attr, 1.0)
        r.first_score_after_list_s = r.first_score_after_list_cpu_s = n * 4e-4 * f
        r.references = [0.4 * f, 0.5 * f]
        r.reference_s = 0.4 * f
        results.append(r)
    raw, per_ref = scale.growth(results)
    assert raw["first_score_after_list_s"] > scale.NLOGN  # in seconds: over n log n
    assert abs(per_ref["first_score_after_list_s"] - 1.0) < 1e-9  # per reference: linear
    assert set(per_ref) == set(scale.PER_REFERENCE)
    assert abs(scale.judged(raw, per_ref) - 1.0) < 1e-9
    # a cost judged in seconds decides when it grows more
    results[-1].rss_peak_mib = 9.0
    raw, per_ref = scale.growth(results)
    assert scale.judged(raw, per_ref) == raw["rss_peak_mib"] > scale.NLOGN
    # without a reference at every size, every cost is judged in seconds
    results[0].reference_s = float("nan")
    raw, per_ref = scale.growth(results)
    assert per_ref == {}
    assert scale.judged(raw, per_ref) == raw["rss_peak_mib"]
    results[-1].rss_peak_mib = 1.0
    assert scale.judged(*scale.growth(results)) == raw["first_score_after_list_s"]


def test_the_scale_bench_splits_the_cores_for_the_bursts_and_gives_them_back() -> None:
    scale = _scale_module()
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip("one core: nothing to split")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        plane = types.SimpleNamespace(started=[])
        with scale.split_cores(plane, [child.pid], enabled=True) as how:
            last = max(every)
            assert how.startswith(f"pyctl and its Redis on core {last}"), how
            assert os.sched_getaffinity(child.pid) == {last}
            assert os.sched_getaffinity(0) == every - {last}
        assert os.sched_getaffinity(child.pid) == every
        assert os.sched_getaffinity(0) == every
        with scale.split_cores(plane, [child.pid], enabled=False) as how:
            assert how == "not split"
            assert os.sched_getaffinity(child.pid) == every
    finally:
        child.kill()
        child.wait()


def test_the_scale_bench_reads_quantiles_from_histogram_buckets_as_prometheus_does() -> None:
    scale = _scale_module()
    inf = float("inf")
    before = {0.001: 5.0, 0.002: 5.0, 0.005: 5.0, inf: 5.0}
    # 100 observations since: 50 in (0, 1 ms], 40 in (1, 2], 9 in (2, 5], 1 above 5 ms
    after = {0.001: 55.0, 0.002: 95.0, 0.005: 104.0, inf: 105.0}
    q = scale.bucket_quantile
    assert q(before, after, 0.5) == 0.001
    assert abs(q(before, after, 0.7) - 0.0015) < 1e-12
    assert abs(q(before, after, 0.99) - 0.005) < 1e-12
    assert q(before, after, 1.0) == 0.005  # the +Inf bucket: its lower bound, as Prometheus
    assert q(after, after, 0.5) != q(after, after, 0.5)  # nothing observed: NaN


def test_the_topology_replay_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "whole.csv"
    lines = _run(
        "bench/topology_replay.py",
        "tests/data/replay_tiny",
        "--seeds",
        "2",
        "--domain-nodes",
        "5",
        "--gang-share",
        "0.5",
        "--csv",
        str(out),
        "--png",
        str(tmp_path / "whole.png"),
    )
    # 4 G2 nodes of 8 GPUs and 6 T4 nodes of 2, cliques of at most 5 of one kind: 1 + 2
    assert lines[0].startswith("trace default: 10 nodes, 44 GPUs, 3 cliques of up to 5 nodes")
    cell = r"\d+\.\d\d% / \d+\.\d%"
    assert re.fullmatch(
        r"topology_replay: at 100% arrived \(median of 2 seeds\), unallocated GPU / gang demand "
        rf"served: fgd {cell}, kueue-bestfit {cell}, kueue-lfc {cell}, kai-binpack {cell}, "
        rf"pyctl {cell}, pyctl-repair {cell}, pyctl-compact {cell}; evicted \d\.\d\d%",
        lines[-1],
    ), lines[-1]
    rows = out.read_text().splitlines()
    assert rows[0] == (
        "arrived_pct,fgd,kueue-bestfit,kueue-lfc,kai-binpack,pyctl,pyctl-repair,pyctl-compact"
    )
    assert [r.split(",")[0] for r in rows[1:]] == [str(p) for p in range(1, 101)]
    assert (tmp_path / "whole.png").stat().st_size > 0


def test_the_soak_plot_draws_a_report(tmp_path: Path) -> None:
    """`bench/soak_plot.py` on a report of two replicas (one killed once), a Redis outage window
    without freshness figures and two faults."""
    import json

    series = []
    for i in range(12):
        for name, life in (("pyctl-a", 1 if i < 6 else 2), ("pyctl-b", 1)):
            row = {"t": 10.0 * i, "replica": name, "life": life, "redis_mib": 4.0 + i / 10}
            row |= {"rss_mib": 190.0 + i, "fds": 35.0, "threads": 16.0, "queue": float(i % 3)}
            if name == "pyctl-b" and i:
                row |= {"lag_p99_ms": float("nan") if i == 4 else 50.0 + i, "reconcile_p99_ms": 4.0}
            series.append(row)
    report = {
        "nodes": 10,
        "duration": 120.0,
        "seed": 1,
        "series": series,
        "fault_log": [[30.0, "kill", "pyctl-a killed"], [40.0, "redis-empty", "gone 30 s"]],
    }
    src = tmp_path / "report.json"
    src.write_text(json.dumps(report))
    out = tmp_path / "soak.png"
    assert _run("bench/soak_plot.py", str(src), str(out)) == [f"soak_plot: {out}"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_bound_bench_runs_on_the_tiny_trace() -> None:
    lines = _run("bench/fgd_bound.py", "tests/data/replay_tiny", "--seeds", "2")
    m = re.fullmatch(
        r"fgd_bound: default trace, bound (\d+\.\d\d)% \(LP\), optimum (\d+\.\d\d)% \(gap "
        r"\d+\.\d\d%\), pyctl (\d+\.\d\d)%, FGD \d+\.\d\d%; with pyctl's placed tasks kept, "
        r"bound (\d+\.\d\d)%; placing every task that any re-placement makes room for, "
        r"(\d+\.\d\d)%",
        lines[-1],
    )
    assert m is not None, lines[-1]
    b, o, p, k, w = (float(x) for x in m.groups())
    assert b <= o
    assert b <= k <= p
    assert b <= w


def test_the_inference_replay_bench_runs_with_its_bound(tmp_path: Path) -> None:
    png = tmp_path / "plot.png"
    lines = _run(
        "bench/inference_replay.py",
        "tests/data/inference_tiny",
        "--seeds",
        "42",
        "--bound",
        "--plot",
        str(png),
    )
    assert re.fullmatch(
        r"inference_replay: stranded GPU-hours pyctl \d+, FGD \d+; pending instance-hours pyctl "
        r"\d+\.\d, FGD \d+\.\d; pyctl \d+\.\d evictions/day \(\d+\.\d\d% of running instances "
        r"per day\)",
        lines[-1],
    ), lines[-1]
    brackets = [x for x in lines if "the optimum repacking of what it ran then between" in x]
    assert [x.split(":")[0].split()[-1] for x in brackets] == ["pyctl", "fgd"]
    assert png.stat().st_size > 0
