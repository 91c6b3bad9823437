"""Every third-party package that pyctl/, tests/ or bench/ imports is declared in pyproject.toml:
pyctl's imports in `dependencies` (or an optional extra, for the lazily imported ones), the
tests' and benchmarks' in those or the `test` extra. A package that is only there because
another one pulls it in (aiohttp, through kubernetes-asyncio) breaks the day that one stops."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: modules of this repository (bench's scripts import each other by their file names)
LOCAL = {"pyctl", "tests", "bench", "_common", "scale", "compaction_round"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    runtime = {_name(r) for r in project["dependencies"]}
    lazy = {_name(r) for k, reqs in extras.items() if k != "test" for r in reqs}
    test = {_name(r) for r in extras.get("test", [])}
    return runtime | lazy, runtime | lazy | test


def imported(root: Path) -> dict[str, str]:
    """Top-level third-party modules imported under `root` -> one file importing it."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in LOCAL and top != "__future__":
                    out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def undeclared(modules: dict[str, str], declared: set[str]) -> list[str]:
    dists = packages_distributions()
    missing = []
    for module, where in sorted(modules.items()):
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not names & declared:
            missing.append(f"{module} ({where}; distribution {', '.join(sorted(names))})")
    return missing


@pytest.mark.parametrize("tree", ["pyctl", "tests", "bench"])
def test_every_imported_package_is_declared(tree: str) -> None:
    for_pyctl, for_tests = _declared()
    modules = imported(ROOT / tree)
    assert modules  # the scan is not vacuous
    assert undeclared(modules, for_pyctl if tree == "pyctl" else for_tests) == []


def test_the_check_sees_an_undeclared_package() -> None:
    assert undeclared({"aiohttp": "x.py"}, {"kubernetes-asyncio"}) == [
        "aiohttp (x.py; distribution aiohttp)"
    ]
