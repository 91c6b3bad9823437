"""bench/scale.py kept from rotting: the whole benchmark (its own control plane, kwok GPU nodes,
pods, a redis-server, `pyctl run` as deployed, churn with extender probes, the scheduler bursts,
the planning rounds) at 20 nodes. It checks that every measurement was made and the output
has its format, never how fast anything was (a benchmark prints figures; tests do not time)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

from pyctl.dev.control_plane import REPO

LAST = re.compile(
    r"^scale: 20 nodes, first score [\d.]+ s, rss \d+ MiB, p99 event-to-score \d+ ms, "
    r"scheduler with extender [\d.]+x of without, growth exponent nan"
)


def test_scale_bench_runs_end_to_end_at_20_nodes(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    argv = [
        sys.executable, str(REPO / "bench" / "scale.py"), "--sizes", "20",
        "--churn-seconds", "4", "--churn-rate", "20", "--burst", "20", "--settle", "1",
        "--workflow-interval", "2", "--starts", "2", "--reference", "20", "--json", str(out),
        "--work-dir", str(tmp_path / "work"),
    ]  # fmt: skip
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith("size 20: 20 nodes"), lines
    assert LAST.match(lines[-1]), lines[-1]
    (r,) = json.loads(out.read_text())
    assert r["nodes"] == 20
    assert r["pods"] > 150
    assert r["pending"] == 4
    # every measurement was made
    for key in (
        "first_score_s", "ready_s", "rss_peak_mib", "rss_steady_mib", "redis_mib", "p50_ms",
        "p99_ms", "cpu_pct", "sched_without", "sched_with", "ext_p99_ms", "compaction_s",
        "mig_plan_s", "gc_full_s", "srv_p50_ms", "srv_p99_ms", "work_p50_ms", "work_p99_ms",
        "compaction_cpu_s", "first_score_after_list_s", "first_score_after_list_cpu_s",
        "others_cpu_after_list_s", "mig_plan_cpu_s",
    ):  # fmt: skip
        assert math.isfinite(r[key]), (key, r[key])
    # the start-up measured twice, the least of each kept
    assert len(r["starts"]) == 2, r["starts"]
    for i, key in enumerate(
        ("first_score_after_list_s", "first_score_after_list_cpu_s", "others_cpu_after_list_s")
    ):
        assert r[key] == min(s[i] for s in r["starts"]), (key, r)
    # the machine's speed measured before each start and at the end, the least kept
    assert len(r["references"]) == 3, r["references"]
    assert r["reference_s"] == min(r["references"]) > 0, r
    assert r["probes"] > 0
    assert r["probe_timeouts"] == 0
    # the probes saw pyctl's answer flip with every write, and the burst went through the
    # extender (as shipped, one `choose` call per pod at least); the planning rounds were read
    # from pyctl's log
    assert r["bound_without"] == r["bound_with"] == 20
    # two bursts each way, interleaved
    assert [len(r["rates"][m]) for m in ("without", "with")] == [2, 2]
    assert r["bound"] == {"without": [20, 20], "with": [20, 20]}
    # during the bursts pyctl and its Redis had a core of their own (on a machine of 2 or more)
    if len(os.sched_getaffinity(0)) >= 2:
        assert r["burst_split"].startswith("pyctl and its Redis on core"), r["burst_split"]
    # each burst's CPU accounting: the scheduler's CPU per pod, pyctl's, the machine's busy share
    for mode in ("without", "with"):
        assert len(r["burst_cpu"][mode]) == 2, r["burst_cpu"]
        for sched_ms, pyctl_s, busy in r["burst_cpu"][mode]:
            assert sched_ms > 0, r["burst_cpu"]
            assert pyctl_s >= 0, r["burst_cpu"]
            assert busy > 0, r["burst_cpu"]
    assert r["ext_calls"] >= 20
    assert r["compaction_rounds"] >= 1
    assert r["probe_no_advice"] == 0
