"""`bench/fgd_replay.py --all-variants` on the made-up tiny trace with a made-up paper CSV."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
TINY = REPO / "tests" / "data" / "replay_tiny"


def _bench() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("fgd_replay", REPO / "bench" / "fgd_replay.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_all_variants_writes_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "expected"
    exp.mkdir()
    (exp / "summary_by_workload_policy.csv").write_text(
        "workload,policy,n_seeds,unalloc_gpu_pct_median@100\n"
        "openb_pod_list_default,06-FGD,10,4.77\n"
        "openb_pod_list_default,05-BestFit,10,7.09\n"
        "openb_pod_list_nosuch,06-FGD,10,1.0\n"
    )
    bench = _bench()
    assert bench.paper_by_variant(exp) == {
        "default": {"fgd": 4.77, "bestfit": 7.09},
        "nosuch": {"fgd": 1.0},
    }
    md = tmp_path / "variants.md"
    rc = bench.main(
        [
            str(TINY),
            "--all-variants",
            "--variant-seeds",
            "1",
            "--expected",
            str(exp),
            "--md",
            str(md),
        ]
    )
    assert rc == 0
    text = md.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| default |")]
    assert len(rows) == 1
    assert "/ 4.77 (" in rows[0]
    assert "/ 7.09 (" in rows[0]
    assert "nosuch" not in text  # a variant without a pod list is skipped, with a message
    out = capsys.readouterr()
    assert "nosuch" in out.err
    assert "wrote" in out.out
