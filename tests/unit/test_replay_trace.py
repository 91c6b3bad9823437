"""Trace reading and the `pyctl simulate` command (tests/data/replay_tiny is a made-up trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyctl.cli.main import main
from pyctl.replay.trace import TraceError, load_trace, replay

TINY = Path(__file__).resolve().parent.parent / "data" / "replay_tiny"


def test_load_tiny_trace_and_replay() -> None:
    tr = load_trace(TINY)
    assert tr.node_count == 10
    assert tr.gpu_count == 44
    assert tr.task_count == 80
    assert tr.tasks["name"] == sorted(tr.tasks["name"])
    assert abs(sum(s.weight for s in tr.workload.shapes) - 1.0) < 1e-9
    r = replay(tr, "fgd", 42)
    assert 0.0 <= r.unallocated_pct(100) <= 100.0
    assert r.frag_rate(90) >= 0.0


def test_missing_and_broken_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace directory not found"):
        load_trace(tmp_path / "nope")
    with pytest.raises(TraceError, match=r"openb_node_list_gpu_node\.csv"):
        load_trace(tmp_path)
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,1024,eight,G2\n"
    )
    with pytest.raises(TraceError, match=r"row 2, column 'gpu'"):
        load_trace(tmp_path)
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,1024,8,G2\n"
    )
    with pytest.raises(TraceError, match=r"openb_pod_list_default\.csv"):
        load_trace(tmp_path)
    (tmp_path / "openb_pod_list_default.csv").write_text("name,cpu_milli\np0,1000\n")
    with pytest.raises(TraceError, match="missing column"):
        load_trace(tmp_path)


def test_simulate_cli_builtin_and_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["simulate", "--policy", "fgd", "pyctl", "--seeds", "42", "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "fgd" in out
    assert "pyctl" in out
    assert (tmp_path / "report.md").exists()
    assert (tmp_path / "results.csv").exists()


def test_simulate_cli_bad_trace_is_a_user_error(tmp_path: Path) -> None:
    assert main(["simulate", "--trace", str(tmp_path / "missing")]) != 0
