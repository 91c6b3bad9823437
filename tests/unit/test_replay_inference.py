"""The inference replay (pyctl.replay.inference, rust/src/replay/events.rs) on
tests/data/inference_tiny: a slice of the DLRM trace worked out by hand in its README."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyctl.cli.main import main
from pyctl.replay.inference import (
    POLICIES,
    RESOURCES,
    Compaction,
    InferenceResult,
    InferenceTrace,
    InferenceTraceError,
    Inventory,
    load,
    repack_at_samples,
    replay,
    running_at_samples,
    summary_line,
)
from tests.paths import DATA

TINY = DATA / "inference_tiny"
#: 2 nodes x 4 GPUs, 32 vCPU, 512 GiB, one RNIC: the README's cluster
SMALL = Inventory(gpus=4, cpu=32, memory_gib=512, rnics=1, nodes=2)


def test_reading_keeps_the_good_rows_and_reports_the_bad() -> None:
    tr = load(TINY)
    assert tr.count == 8
    assert tr.cpu_instances == 3
    assert [row for row, _ in tr.skipped] == [13, 14, 15]
    reasons = " ".join(why for _, why in tr.skipped)
    assert "gpu_request" in reasons
    assert "before creation_time" in reasons
    assert "rdma_request" in reasons
    assert tr.end == 7200.0
    # empty creation: present at the start; empty deletion: after the end
    assert tr.instances["arrive"][:5] == [None, None, None, None, 60.0]
    assert tr.instances["depart"][0] == 3600.0
    assert tr.instances["depart"][1] is None
    assert tr.instances["max_per_node"][:5] == [2] * 5
    assert tr.instances["rdma"] == [25] * 5 + [50] * 3
    # one shape: 8 vCPU and a GPU, with the RDMA most of its instances ask for (25%)
    assert tr.workload() == [
        {"cpu_milli": 8000, "gpus": 1, "gpu_milli": 1000, "weight": 1.0, "rdma": 25}
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_the_hand_worked_slice(policy: str) -> None:
    r = replay(load(TINY), policy, 42, inventory=SMALL, log=True, sample_every=600.0)
    raw = r.raw
    assert (raw["arrived"], raw["placed_on_arrival"]) == (8, 6)
    assert (raw["placed_after_wait"], raw["never_placed"]) == (1, 1)
    assert raw["evictions"] == 0
    assert r.stranded_gpu_hours == pytest.approx(3.5)
    assert r.idle_gpu_hours == pytest.approx(4.5)
    assert r.frag_rate == pytest.approx(100 * 12600 / 16200)
    assert r.pending_hours == pytest.approx(8940 / 3600)
    assert r.success_pct == pytest.approx(75.0)
    # departures free capacity: instance_499 (the 5th) placed when instance_495 leaves
    placed = {i: t for t, kind, i, _, _ in raw["log"] if kind == "place"}
    assert placed[4] == 3600.0
    # the anti-affinity cap and RDMA made them wait with GPUs free
    waits = [(t, i) for t, kind, i, _, _ in raw["log"] if kind == "wait"]
    assert waits == [(60.0, 4), (1800.0, 7)]
    by_t = {s["t"]: s for s in raw["samples"]}
    assert by_t[1200.0]["idle_milli"] == 3000  # before instance_650 arrives at 1200
    assert by_t[1800.0]["frag_milli"] == pytest.approx(2000.0)
    assert by_t[2400.0]["pending"] == 2
    assert by_t[4200.0]["pending"] == 1
    assert by_t[7200.0]["pending"] == 1  # the last sample sees the state before its departure


def _check_log(trace: InferenceTrace, inv: Inventory, r: InferenceResult) -> int:
    """Replays the log on books of its own: every node within its GPUs, CPU, memory, RDMA and
    every app's cap at every step. Returns the moves seen."""
    cols = trace.instances
    n = inv.node_count(trace.peaks(inv))
    use = [[0, 0, 0, 0] for _ in range(n)]
    apps: list[dict[int, int]] = [{} for _ in range(n)]
    at: dict[int, int] = {}
    moves = 0

    def add(node: int, i: int, sign: int) -> None:
        for k, col in enumerate(RESOURCES):
            use[node][k] += sign * cols[col][i]
        a = cols["app"][i]
        apps[node][a] = apps[node].get(a, 0) + sign
        assert use[node][0] <= inv.gpus
        assert use[node][1] <= inv.cpu * 1000
        assert use[node][2] <= inv.memory_gib * 1024
        assert use[node][3] <= 100 * inv.rnics
        cap = cols["max_per_node"][i]
        assert cap == 0 or apps[node][a] <= cap, (node, a, apps[node][a], cap)

    for _, kind, i, node, to in r.raw["log"]:
        if kind == "place":
            add(node, i, 1)
            at[i] = node
        elif kind == "depart" and i in at:
            add(at.pop(i), i, -1)
        elif kind == "move":
            assert at[i] == node
            add(node, i, -1)
            add(to, i, 1)
            at[i] = to
            moves += 1
    return moves


def _crowded(tmp_path: Path) -> InferenceTrace:
    """The tiny slice's apps, many times over, arriving and leaving through a day."""
    rows = (TINY / "disaggregated_DLRM_trace.csv").read_text().splitlines()
    header, body = rows[0], rows[1:9]
    out = [header]
    for k in range(40):
        for j, line in enumerate(body):
            f = line.split(",")
            f[0] = f"i{k}_{j}"
            f[2] = f"app_{(k + j) % 6}"
            f[13] = str([2, 3, 4, -1][(k + j) % 6 % 4])
            f[14] = "" if k < 6 else str(1800.0 * k + 97 * j)
            f[15] = f[14]
            f[16] = str(1800.0 * k + 97 * j + 3600.0 * (1 + (k * 7 + j) % 9)) if k >= 6 else ""
            out.append(",".join(f))
    (tmp_path / "disaggregated_DLRM_trace.csv").write_text("\n".join(out) + "\n")
    return load(tmp_path)


#: a crowded cluster for `_crowded`
CROWDED = Inventory(gpus=8, cpu=48, memory_gib=512, rnics=2, headroom=0.0)


def test_a_day_of_the_real_shapes_keeps_every_constraint(tmp_path: Path) -> None:
    # on a crowded cluster pyctl with its planner and a generous budget moves instances; the
    # log must keep every constraint
    tr, inv = _crowded(tmp_path), CROWDED
    comp = Compaction(interval=900.0, budget_per_day=0.2)
    r = replay(tr, "pyctl", 7, inventory=inv, compaction=comp, log=True)
    moves = _check_log(tr, inv, r)
    assert moves == r.raw["evictions"] > 0
    assert r.raw["evictions"] <= 0.2 * r.raw["running_s"] / 86400.0
    for p in ("fgd", "bestfit", "pyctl-place"):
        assert _check_log(tr, inv, replay(tr, p, 7, inventory=inv, log=True)) == 0


def test_the_optimum_repacking_at_each_sample_is_bracketed(tmp_path: Path) -> None:
    # at every sample of each policy's replay, what it was running (read back from its log)
    # repacked: the lower bound never above the F(M) the replay's kernel measured then, and the
    # repacking found never below the bound
    tr, inv = _crowded(tmp_path), CROWDED
    positive = 0
    for p in ("pyctl", "fgd", "bestfit"):
        r = replay(tr, p, 7, inventory=inv, log=True, sample_every=1800.0)
        at = repack_at_samples(tr, r, inv)
        assert len(at) == len(r.raw["samples"]) > 40
        for s, x in zip(r.raw["samples"], at, strict=True):
            assert x.t == s["t"]
            # the placement the log gives, judged by `stranded_of`, is what the kernel measured
            assert x.own == pytest.approx(s["frag_milli"], abs=1e-6), (p, s["t"])
            assert 0.0 <= x.lower <= x.best + 1e-6 <= s["frag_milli"] + 2e-6, (p, s["t"])
            assert x.found is None or x.found >= x.lower - 1e-6
            positive += x.lower > 0
    assert positive > 0  # the crowded cluster strands GPUs that no repacking frees
    with pytest.raises(ValueError, match="log=True"):
        running_at_samples(replay(tr, "fgd", 7, inventory=inv))


def test_missing_or_empty_trace_is_named(tmp_path: Path) -> None:
    with pytest.raises(InferenceTraceError, match="not found"):
        load(tmp_path)
    (tmp_path / "disaggregated_DLRM_trace.csv").write_text("instance_sn,role\n")
    with pytest.raises(InferenceTraceError, match="missing column"):
        load(tmp_path)


def test_pyctl_simulate_inference(capsys: pytest.CaptureFixture[str]) -> None:
    # the CLI runs the same replay (same inventory and seeds): its last line is the bench's
    assert main(["simulate", "--inference", str(TINY), "--seeds", "42", "--policy", "fgd"]) == 0
    out = capsys.readouterr().out
    assert "row 13 left out: gpu_request is 'x'" in out
    tr = load(TINY)
    want = summary_line([replay(tr, "fgd", 42, inventory=Inventory())])
    assert " ".join(want.split()) in " ".join(out.split())
    assert main(["simulate", "--inference", str(TINY / "nope")]) != 0
    capsys.readouterr()
    # the evictor's minimum pod age reaches the replay; a bad one is refused by name
    args = ["simulate", "--inference", str(TINY), "--seeds", "42", "--policy", "pyctl"]
    assert main([*args, "--min-pod-age", "21600"]) == 0
    comp = Compaction(min_pod_age=21600.0)
    want = summary_line(
        [
            replay(tr, p, 42, inventory=Inventory(), compaction=comp)
            for p in ("pyctl", "pyctl-place")
        ]
    )
    assert " ".join(want.split()) in " ".join(capsys.readouterr().out.split())
    assert main([*args, "--min-pod-age", "nan"]) != 0
    assert "--min-pod-age" in capsys.readouterr().err


def test_an_instance_larger_than_a_node_waits_and_does_not_size_the_cluster(
    tmp_path: Path,
) -> None:
    text = (TINY / "disaggregated_DLRM_trace.csv").read_text()
    huge = "huge,HN,app_9,99999999,99999999,1,1,25,25,40.0,40.0,85.0,100.0,-1,100.0,100.0,\n"
    (tmp_path / "disaggregated_DLRM_trace.csv").write_text(text + huge)
    tr = load(tmp_path)
    inv = Inventory()
    assert [tr.instances["name"][i] for i in tr.oversized(inv)] == ["huge"]
    assert tr.peaks(inv) == load(TINY).peaks(inv)
    r = replay(tr, "fgd", 42, inventory=inv)
    assert (
        r.raw["never_placed"]
        == replay(load(TINY), "fgd", 42, inventory=inv).raw["never_placed"] + 1
    )
