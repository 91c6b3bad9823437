"""No function in pyctl/ is longer than 100 lines (issue #32): a longer one is split into named
steps, each with one purpose. The length is that of the `def` through the last line of its body
(decorators and the blank lines after it not counted); methods and nested functions count alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the most lines one function may take
LIMIT = 100


def long_functions(source: str, where: str, limit: int = LIMIT) -> list[str]:
    """`where:line name (n lines)` for each function of `source` longer than `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source, filename=where)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                found.append((node.lineno, node.name, length))
    return [f"{where}:{line} {name} ({length} lines)" for line, name, length in sorted(found)]


def test_no_function_in_pyctl_is_over_100_lines() -> None:
    paths = sorted((ROOT / "pyctl").rglob("*.py"))
    assert len(paths) > 50  # the scan is not vacuous
    found = []
    for path in paths:
        where = str(path.relative_to(ROOT))
        found += long_functions(path.read_text(encoding="utf-8"), where)
    assert found == [], "functions over 100 lines:\n" + "\n".join(found)


def test_the_check_names_a_long_function_and_only_it() -> None:
    source = (
        "class C:\n"
        "    @staticmethod\n"
        "    async def long(a):\n"  # line 3: 5 lines, decorator not counted
        "        a += 1\n"
        "        a += 2\n"
        "        a += 3\n"
        "        return a\n"
        "\n"
        "\n"
        "def short():\n"  # line 10: 2 lines
        "    pass\n"
        "\n"
        "\n"
        "def outer():\n"  # line 14: 6 lines; its nested function counts alone
        "    def inner():\n"
        "        x = 1\n"
        "        y = 2\n"
        "        return x + y\n"
        "    return inner\n"
    )
    assert long_functions(source, "m.py", limit=6) == []
    assert long_functions(source, "m.py", limit=4) == [
        "m.py:3 long (5 lines)",
        "m.py:14 outer (6 lines)",
    ]
    assert long_functions(source, "m.py", limit=3) == [
        "m.py:3 long (5 lines)",
        "m.py:14 outer (6 lines)",
        "m.py:15 inner (4 lines)",
    ]
