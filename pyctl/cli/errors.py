"""How the command line reports bad input: one line on stderr, exit code 2, never a traceback,
never a secret (a URL's password is masked in every message)."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyctl.cluster.bounds import MAX_INPUT_BYTES

EXIT_BAD_INPUT = 2
#: output to a pipe whose reader went away (`pyctl score --json | head`): quietly, with the code
#: Python's documentation recommends (and rich uses when a table meets a closed pipe)
EXIT_BROKEN_PIPE = 1
#: a failure that is pyctl's own (a bug): one line, and the traceback with PYCTL_DEBUG=1
EXIT_INTERNAL = 70
#: the longest message printed (a message is one line)
MAX_MESSAGE_CHARS = 2000

_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@/\s]+@")


def debug_requested(environ: Mapping[str, str] | None = None) -> bool:
    """`PYCTL_DEBUG` is set to anything but empty, 0, false, no or off: a failure that is pyctl's
    own shows its traceback instead of one line."""
    value = (os.environ if environ is None else environ).get("PYCTL_DEBUG", "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


class UserError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def one_line(message: str) -> str:
    """`message` as one line, a URL's password masked, at most `MAX_MESSAGE_CHARS`."""
    text = " ".join(str(message).split())
    text = _URL_PASSWORD.sub(r"\1***@", text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 3] + "..."
    return text


def read_input(path: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """A file's bytes (`-`: stdin), at most `limit` of them; `UserError` naming the file."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            p = Path(path)
            if p.is_dir():
                raise UserError(f"{path}: cannot read: is a directory")
            with p.open("rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > limit:
        raise UserError(f"{path}: larger than {limit} bytes (pyctl reads at most that)")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(path: str) -> Any:
    """Read a JSON file, turning I/O, encoding, syntax and nesting errors into a `UserError`
    that names the file."""
    data = read_input(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}: broken JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except RecursionError:
        raise UserError(f"{path}: JSON nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, an integer of more than 4300 digits
        raise UserError(f"{path}: not valid JSON: {e}") from None
