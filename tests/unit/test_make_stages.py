"""`make test` is a sequence of stages (Makefile `TEST_STAGES`, each a `test-<stage>` target run by
scripts/stage): every directory of tests/ that holds tests is some stage's, and a pytest stage
that collects nothing fails instead of passing silently."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = (ROOT / "Makefile").read_text()


def _stages(var: str) -> list[str]:
    m = re.search(rf"^{var} := (.+)$", MAKEFILE, re.MULTILINE)
    assert m, var
    return m.group(1).split()


def test_every_test_directory_is_a_stage() -> None:
    stages = _stages("TEST_STAGES")
    dirs = sorted(d.name for d in (ROOT / "tests").iterdir() if any(d.glob("test_*.py")))
    assert dirs  # not vacuous
    for d in dirs:
        assert d in stages, f"tests/{d} is in no stage of make test"
        recipe = re.search(rf"^test-{d}:.*\n\t(.+)$", MAKEFILE, re.MULTILINE)
        assert recipe, d
        assert f"scripts/stage {d} $(PYTEST) tests/{d}" in recipe.group(1)
    assert {"lint", "rust"} <= set(stages)
    assert set(_stages("TEST_FAST_STAGES")) <= set(stages)


def _stage(tmp_path: Path, *argv: str) -> tuple[int, str]:
    env = {**os.environ, "STAGE_SUMMARY_FILE": str(tmp_path / "summary.txt")}
    p = subprocess.run(
        [str(ROOT / "scripts/stage"), *argv], env=env, capture_output=True, text=True, check=False
    )
    return p.returncode, p.stdout


def test_a_stage_that_collects_no_tests_fails(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    code, out = _stage(tmp_path, "none", *pytest, str(empty))
    assert code == 5
    assert re.search(r"== stage none +FAILED \(no tests collected\) +[0-9.]+s", out)
    (tmp_path / "test_one.py").write_text("def test_one() -> None:\n    pass\n")
    code, out = _stage(tmp_path, "one", *pytest, str(tmp_path / "test_one.py"))
    assert code == 0
    assert re.search(r"== stage one +passed +[0-9.]+s +1 passed", out)
    code, out = _stage(tmp_path, "summary")
    assert code == 1  # a stage failed
    lines = out.splitlines()
    assert lines[0] == "== make test: one line per stage"
    assert [line.split()[0] for line in lines[1:]] == ["none", "one"]
    _stage(tmp_path, "reset")
    _stage(tmp_path, "one", *pytest, str(tmp_path / "test_one.py"))
    assert _stage(tmp_path, "summary")[0] == 0
