"""The `pyctl` command line for the topology merge: output, exit codes, bad files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyctl import __version__
from pyctl.cli.main import main
from tests.paths import TOPOLOGY_CORPUS


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"pyctl {__version__}"


def test_conformance_command_passes_the_corpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "conformance", str(TOPOLOGY_CORPUS)]) == 0
    assert capsys.readouterr().out.strip().endswith("145 passed, 0 failed")


def test_conformance_command_fails_on_a_wrong_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = json.loads(TOPOLOGY_CORPUS.read_text())
    corpus["cases"] = corpus["cases"][:3]
    corpus["cases"][1]["expected"]["preferred"] = not corpus["cases"][1]["expected"]["preferred"]
    f = tmp_path / "c.json"
    f.write_text(json.dumps(corpus))
    assert main(["topology", "conformance", str(f)]) == 1
    assert "2 passed, 1 failed" in capsys.readouterr().out


def test_conformance_command_refuses_a_case_without_its_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = json.loads(TOPOLOGY_CORPUS.read_text())
    corpus["cases"] = corpus["cases"][:3]
    del corpus["cases"][2]["expected"]  # found by tests/fuzz/test_fuzz_cli.py
    f = tmp_path / "c.json"
    f.write_text(json.dumps(corpus))
    assert main(["topology", "conformance", str(f)]) == 2
    assert "'expected' must be an object" in capsys.readouterr().err


def test_merge_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = {
        "policy": "single-numa-node",
        "numa_nodes": [0, 1],
        "providers": [{"gpu": [{"affinity": [1], "preferred": True}]}],
    }
    f = tmp_path / "case.json"
    f.write_text(json.dumps(case))
    assert main(["topology", "merge", str(f), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {"affinity": [1], "preferred": True, "admit": True}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "broken JSON at line 1"),
        ("[]", "expected a JSON object"),
        ('{"numa_nodes": [0]}', "missing 'providers'"),
        ('{"numa_nodes": [0], "providers": [], "policy": "bogus"}', "unknown policy"),
    ],
)
def test_bad_files_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    assert main(["topology", "merge", str(f)]) == 2
    assert message in capsys.readouterr().err


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topology", "merge", "/nonexistent/case.json"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_console_script_topology_demo_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pyctl.cli.main", "topology", "demo"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "single-numa-node" in out
    assert "reject" in out
    assert "admit" in out
