"""The import contract names every module: each module under `pyctl/` is in a layer of
`[tool.importlinter]`'s layers contract (`pyproject.toml`), itself or a package above it. A module
the contract does not name is free to import anything and to be imported by anything: the layers
say nothing about it, so `lint-imports` stays green whatever it does."""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pyctl"


def layer_names(pyproject: str) -> set[str]:
    """The modules the root layers contract names (`a | b` independent, `a : b` not; `(a)`
    optional); a contract over one package's own modules (`containers`) binds only that package
    inside, so the root one must name the package."""
    config = tomllib.loads(pyproject)["tool"]["importlinter"]
    (layers,) = [
        c for c in config["contracts"] if c["type"] == "layers" and not c.get("containers")
    ]
    return {
        name.strip().strip("()")
        for layer in layers["layers"]
        for name in re.split(r"[|:]", layer)
        if name.strip()
    }


def modules(package: Path) -> Iterable[tuple[str, Path]]:
    """Every Python module of the package: its dotted name and its file."""
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def holds_nothing(init: Path) -> bool:
    """A package's `__init__.py` that is a docstring at most: the package only contains modules
    (which the contract names one by one), it has no code of its own to put in a layer."""
    body = ast.parse(init.read_text()).body
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) for s in body)


def unnamed(names: set[str], package: Path) -> list[str]:
    """The modules of `package` that no layer names, neither themselves nor a package above."""
    root = package.name
    out = []
    for module, path in modules(package):
        parts = module.split(".")
        if any(".".join(parts[:i]) in names for i in range(len(parts), 1, -1)):
            continue
        if module == root:
            continue  # the contract's root_package: every layer is inside it
        if path.name == "__init__.py" and holds_nothing(path):
            continue
        out.append(module)
    return out


def test_every_module_is_named_by_the_layers_contract() -> None:
    names = layer_names((ROOT / "pyproject.toml").read_text())
    missing = unnamed(names, PACKAGE)
    assert not missing, f"not in a layer of [tool.importlinter] (pyproject.toml): {missing}"


def test_a_module_left_out_of_the_contract_is_named(tmp_path: Path) -> None:
    """The check itself: a package entry covers its submodules; a container package (docstring
    only) needs no entry; a module nobody names is reported by its name."""
    pkg = tmp_path / "pkg"
    for rel, text in {
        "__init__.py": "",
        "low.py": "X = 1\n",
        "cluster/__init__.py": '"""Only modules."""\n',
        "cluster/kube/__init__.py": "from pkg.low import X\n",
        "cluster/kube/wire.py": "",
        "cluster/records.py": "",
        "cluster/stray.py": "",
        "app/__init__.py": "import os\n",
        "app/config.py": "",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    contract = """
[tool.importlinter]
root_package = "pkg"

[[tool.importlinter.contracts]]
name = "layers"
type = "layers"
layers = ["pkg.app", "pkg.cluster.kube | (pkg.cluster.records)", "pkg.low"]
"""
    names = layer_names(contract)
    assert names == {"pkg.app", "pkg.cluster.kube", "pkg.cluster.records", "pkg.low"}
    assert unnamed(names, pkg) == ["pkg.cluster.stray"]
    # a package whose __init__ has code of its own needs an entry
    assert unnamed(names - {"pkg.app"}, pkg) == ["pkg.app", "pkg.app.config", "pkg.cluster.stray"]
