"""The invariant checks of bench/soak.py on hand-made histories: each catches what it is for
(a write after another replica took the Lease, a write after the replica's own Lease ran out, a
burst beyond a token bucket, too many evictions in an hour) and passes a history that keeps
them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("soak", REPO / "bench" / "soak.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["soak"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "bench"))


def write(soak: ModuleType, t: float, user: str) -> object:
    return soak.Write(t, user, "patch", "nodes", "", "gpu-0001", 200)


def test_a_write_by_the_holder_within_its_lease_passes(soak: ModuleType) -> None:
    leases = [(0.0, "a"), (1.0, "a"), (2.0, "a")]
    assert soak.lease_violations(leases, [write(soak, 2.5, "a"), write(soak, 7.9, "a")], 6.0) == []


def test_a_write_after_another_replica_took_the_lease_is_caught(soak: ModuleType) -> None:
    leases = [(0.0, "a"), (1.0, "a"), (8.0, "b"), (9.0, "b")]
    got = soak.lease_violations(leases, [write(soak, 8.5, "a"), write(soak, 8.6, "b")], 6.0)
    assert len(got) == 1
    assert got[0].startswith("a patch nodes /gpu-0001")
    assert "last written by b" in got[0]


def test_a_write_after_the_replicas_own_lease_ran_out_is_caught(soak: ModuleType) -> None:
    # paused past its Lease, nobody else took it: the write is still made without a Lease
    got = soak.lease_violations([(0.0, "a")], [write(soak, 6.5, "a")], 6.0)
    assert len(got) == 1
    assert "6.5 s before" in got[0]


def test_a_write_before_any_lease_write_is_caught(soak: ModuleType) -> None:
    assert len(soak.lease_violations([(5.0, "a")], [write(soak, 4.0, "a")], 6.0)) == 1


def test_a_token_bucket_is_kept_or_exceeded(soak: ModuleType) -> None:
    # burst 2, 6 per minute (one every 10 s), with the 2 s of slack
    kept = [0.0, 0.1, 12.0, 22.0, 32.0]
    assert soak.bucket_violations(kept, 2, 6.0, "node n") == []
    over = [0.0, 0.1, 0.2]
    got = soak.bucket_violations(over, 2, 6.0, "node n")
    assert len(got) == 1
    assert got[0].startswith("rate limit node n: 3 evictions in 0.2 s")
    slow_over = [0.0, 0.1, 5.0, 9.0]
    assert len(soak.bucket_violations(slow_over, 2, 6.0, "node n")) == 1


def test_disruptions_per_hour_are_counted_in_a_sliding_hour(soak: ModuleType) -> None:
    assert soak.window_violations([0.0, 1800.0, 3600.0], 2, 3600, "per hour") == []
    got = soak.window_violations([0.0, 1800.0, 3599.0], 2, 3600, "per hour")
    assert got == ["per hour: 3 evictions within 3600 s (limit 2)"]


def test_rescues_bound_elsewhere_are_told_apart_by_where_they_went(soak: ModuleType) -> None:
    w = soak.WorkflowSeen
    elsewhere = "bound_elsewhere: the pending pod was bound to "
    history = [
        # two rescues at the same time, each pod landing on the other's node
        w("a", "rescue", "n1", 0.0, "done", 100.0, result=elsewhere + "n2"),
        w("b", "rescue", "n2", 50.0, "done", 120.0, result=elsewhere + "n1"),
        # bound to n3, whose rescue ended before this one began: a departure's room
        w("c", "rescue", "n4", 200.0, "done", 210.0, result=elsewhere + "n3"),
        w("d", "rescue", "n3", 0.0, "done", 20.0, result="done: soak/big-1 runs on n3"),
        w("e", "rescue", "n5", 0.0, "abandoned", 900.0, result="abandoned: deadline passed"),
        w("f", "rescue", "n6", 0.0, "evicting", 10.0),  # unfinished: not counted
        w("g", "compaction", "n7", 0.0, "done", 10.0, result="evicted"),
    ]
    assert soak.rescue_outcomes(history) == {
        "bound_elsewhere (to a node another rescue freed)": 2,
        "bound_elsewhere (to another node)": 1,
        "done": 1,
        "abandoned": 1,
    }


def samples(
    replica: str, life: int, start: float, end: float, fds: float, grow: float = 0.0
) -> list[dict[str, float | str]]:
    """A replica's samples every 10 s over one life; file descriptors `fds` rising by `grow`
    over it."""
    n = int((end - start) // 10) + 1
    return [
        {
            "t": start + 10 * i,
            "replica": replica,
            "life": life,
            "rss_mib": 200.0,
            "fds": fds + grow * i / max(1, n - 1),
            "threads": 17.0,
        }
        for i in range(n)
    ]


def test_resources_are_judged_over_each_life_of_a_replica(soak: ModuleType) -> None:
    series = [
        *samples("a", 1, 0, 1200, 40),  # flat, then killed
        *samples("a", 2, 1210, 1500, 40, grow=30),  # too short to judge
        *samples("a", 3, 1510, 3600, 40, grow=10),  # rising: 40 -> 50 (limit 46)
        *samples("b", 1, 0, 3600, 40, grow=4),  # within 10% and 2
    ]
    flat = soak.resource_checks(series, 3600.0)
    assert flat.violations == ["a#3 fds: 41.8 at 1870 s, 50.0 at 3600 s"]
    assert flat.unchecked == ["resources of a#2: lived 290 s, less than 720 s"]
    assert flat.levels["b fds"] == [40.4, 44.0]
    assert set(flat.levels) == {
        f"{n} {k}" for n in ("a#1", "a#3", "b") for k in ("rss_mib", "fds", "threads")
    }


def test_a_saved_report_is_judged_again_by_the_current_check(
    soak: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {
        "duration": 3600.0,
        "nodes": 20,
        "faults": {"kill": 1},
        "workflows": {"started": 1, "done": 1},
        "checks": {"resources": 0},
        "violations": [],
        # judged by the check of its day: the only replica never killed had none
        "unchecked": ["resources of a: started again after a tenth of the run (killed)"],
        "series": [*samples("a", 1, 0, 1500, 40, grow=10), *samples("a", 2, 1510, 3600, 40)],
    }
    report = tmp_path / "report.json"
    report.write_text(json.dumps(old))
    assert soak.main(["--rejudge", str(report)]) == 1
    last = capsys.readouterr().out.splitlines()[-1]
    assert "invariant violations 1, rss at 10% 200 MiB at end 200 MiB" in last
    old["series"] = [*samples("a", 1, 0, 1500, 40), *samples("a", 2, 1510, 3600, 40)]
    report.write_text(json.dumps(old))
    assert soak.main(["--rejudge", str(report)]) == 0
    assert "invariant violations 0" in capsys.readouterr().out.splitlines()[-1]


def test_a_short_run_gives_each_life_a_minute_to_settle(soak: ModuleType) -> None:
    # the e2e soak (200 s): a replica killed at 82 s and started again, its descriptors rising
    # while it connects and takes the Lease; the one never killed, flat after its first minute
    series = [
        *samples("a", 1, 0, 80, 38),
        *samples("a", 2, 82, 200, 33, grow=7),
        *samples("b", 1, 0, 200, 38),
    ]
    flat = soak.resource_checks(series, 200.0)
    assert flat.violations == []
    assert flat.unchecked == [
        "resources of a#1: lived 80 s, less than 120 s",
        "resources of a#2: lived 110 s, less than 120 s",
    ]
    assert flat.levels["b fds"] == [38.0, 38.0]
