"""The demo and the simulated cluster's figures: measured on the cluster's own state, weighted by
virtual time, the same at every playback speed; enforce against observe on the built-in
scenario (issue 23)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

from pyctl.app.config import Config, load_config
from pyctl.app.demo import DemoRun, compare, play
from pyctl.cli import demo as demo_cli
from pyctl.cluster.sim.cluster import SimCluster, SimPod
from pyctl.cluster.sim.record import Recorder
from pyctl.cluster.sim.scenario import inference_day
from pyctl.model import Gpu, Node, Shape, Workload, Zone

SEED = 7


def config(**flags: Any) -> Config:
    return load_config(None, {}, {"sim_seed": SEED, "sim_speed": 0, **flags})


@pytest.fixture(scope="module")
def runs() -> tuple[DemoRun, DemoRun]:
    async def both() -> tuple[DemoRun, DemoRun]:
        cfg = config()
        return await play(cfg, "observe"), await play(cfg, "enforce")

    return anyio.run(both)


def test_the_recorder_weights_every_state_by_the_virtual_time_it_lasted() -> None:
    node = Node("n", "H100-SXM5-80GB", "none", zones=(Zone(0, 8000, 0, 8192, 0, (Gpu(0),)),))
    one = Shape(cpu_milli=1000, memory_mib=0, gpus=1, gpu_milli=1000)
    c = SimCluster((node,), Workload((one,)))
    rec = Recorder(c, window=3600.0)
    a, b = SimPod("a", one), SimPod("b", one)
    c.pods.update({"a": a, "b": b})
    assert c.schedule(a)
    assert not c.schedule(b)
    rec.arrival(0.0, True)
    rec.arrival(0.0, False)
    rec.observe(0.0)  # a runs, b waits: the GPU is taken, nothing idle
    c.remove(a)
    del c.pods["a"]
    rec.observe(3600.0)  # a left: one idle GPU, b still waits (the scheduler has not retried)
    assert c.schedule(b)
    rec.observe(5400.0)  # b runs
    rec.finish(7200.0)
    s = rec.stats()
    assert s.duration_hours == 2.0
    assert s.pending_hours == 1.5  # b waited from 0 to 5400 s
    assert s.idle_gpu_hours == 0.5  # the GPU was idle from 3600 to 5400 s
    assert s.served == 2
    assert s.arrived == 2
    assert s.success_mean == 0.5
    assert s.success_worst == 0.5
    # b was not blocked by fragmentation: first the cluster was full, then a node admitted it
    assert s.blocked_hours == {}
    assert [p.t for p in s.points] == [0.0, 3600.0, 5400.0]


def test_the_figures_come_from_the_whole_run_at_full_speed(runs: tuple[DemoRun, DemoRun]) -> None:
    observe, enforce = runs
    sc = inference_day(seed=SEED)
    for r in runs:
        s = r.stats
        assert s.duration_hours == sc.duration / 3600
        assert s.arrived == sum(1 for a in sc.arrivals if a.t <= sc.duration)
        assert s.points
        assert s.points[-1].t <= sc.duration
        assert s.idle_gpu_hours > s.stranded_gpu_hours > 0
        assert 0 < s.mean_fragmentation_rate < 1
    # observe changes nothing: no eviction, no MIG re-partition; its rounds ran (dry runs)
    assert observe.actions.evictions == 0
    assert observe.actions.mig == {}
    assert observe.stats.evictions == 0
    assert enforce.stats.evictions == enforce.actions.evictions


def test_enforce_serves_the_workload_better_than_observe(runs: tuple[DemoRun, DemoRun]) -> None:
    observe, enforce = runs
    o, e = observe.stats, enforce.stats
    assert e.served > o.served
    assert e.pending_hours < o.pending_hours
    assert e.blocked_total_hours < o.blocked_total_hours
    assert e.stranded_gpu_hours < o.stranded_gpu_hours
    assert e.success_mean > o.success_mean
    assert e.success_worst >= o.success_worst
    # and it says what it did to get there
    assert enforce.actions.mig.get("succeeded", 0) > 0
    assert enforce.actions.advised > 0
    rows = {x.label.strip(): x for x in compare([observe], [enforce])}
    assert rows["replicas served"].verdict is True
    assert rows["replica-hours pending"].verdict is True


def test_a_run_is_the_same_at_any_speed(runs: tuple[DemoRun, DemoRun]) -> None:
    """Lockstep: the controller's rounds, clocks and limits follow virtual time, so playing the
    day in ~3 wall seconds of pacing gives the run played as fast as possible."""
    _, enforce = runs
    paced = anyio.run(play, config(sim_speed=10000), "enforce")
    assert paced.stats == enforce.stats
    assert paced.actions == enforce.actions


def test_the_report_writes_the_table_and_the_plot(
    runs: tuple[DemoRun, DemoRun], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    observe, enforce = runs
    args = argparse.Namespace(out=str(tmp_path / "out"), json=True)
    assert demo_cli._report(config(), args, Console(), [observe], [enforce]) == 0
    got = json.loads(capsys.readouterr().out)
    figures = {f["figure"]: f for f in got["figures"]}
    assert figures["replicas served"]["observe"] == observe.stats.served
    assert figures["replicas served"]["enforce"] == enforce.stats.served
    assert figures["replicas served"]["enforce_better"] is True
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "| replicas served |" in md
    assert "Enforcing, pyctl evicted" in md
    png = (tmp_path / "out" / "demo.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_pyctl_run_summarizes_the_same_run(runs: tuple[DemoRun, DemoRun]) -> None:
    """`pyctl run` at full speed (no live view) prints the figures the demo measured."""
    _, enforce = runs
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyctl.cli.main",
            "run",
            "--mode",
            "enforce",
            "--speed",
            "0",
            "--seed",
            str(SEED),
            "--no-live",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    ).stdout
    s = enforce.stats
    assert f"{s.served} of {s.arrived} replicas served" in out, out
    assert f"{s.pending_hours:.1f} replica-hours pending" in out
    assert f"Enforcing, pyctl evicted {enforce.actions.evictions} replicas" in out


def test_seeds_must_be_sane(capsys: pytest.CaptureFixture[str]) -> None:
    from pyctl.cli.main import main

    assert main(["demo", "--seeds", "0"]) == 2
    assert "--seeds must be 1..100" in capsys.readouterr().err
