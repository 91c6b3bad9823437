"""How the command line reports bad input: a clear message and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def load_json(path: str) -> Any:
    """Read a JSON file, turning I/O and syntax errors into a `UserError` that names the file."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: broken JSON at line {e.lineno} column {e.colno}: {e.msg}") from e
