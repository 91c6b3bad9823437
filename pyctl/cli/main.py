"""Entry point of the `pyctl` console script.

Whatever a command is given, it ends in one of these ways: its result (exit 0), one line on
stderr for bad input (exit 2: unreadable, too large, not UTF-8, broken or too deeply nested JSON,
values out of their bounds), quietly when its output pipe closes (exit 1), or, for a failure
that is pyctl's own, one line saying so (exit 70; `PYCTL_DEBUG=1` shows the traceback)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from pyctl import __version__
from pyctl.cli import (
    agent,
    demo,
    dev,
    explain,
    federation,
    mig,
    plan,
    recommend,
    run,
    score,
    simulate,
    status,
    topology,
)
from pyctl.cli.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    UserError,
    debug_requested,
    one_line,
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyctl",
        description="NUMA- and MIG-aware GPU fragmentation controller for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"pyctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
        agent,
        demo,
        dev,
        explain,
        federation,
        mig,
        plan,
        recommend,
        run,
        score,
        simulate,
        status,
        topology,
    ):
        module.register(sub)
    return parser


def _quiet_stdout() -> None:
    """The reader of stdout went away: send what is still buffered nowhere (else the
    interpreter's final flush prints a BrokenPipeError)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _error(message: str) -> None:
    with contextlib.suppress(OSError):  # stderr is gone too: nothing left to tell
        print(f"pyctl: error: {one_line(message)}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        code = handler(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except (UserError, ValueError) as e:
        _error(str(e))
        return EXIT_BAD_INPUT
    except RecursionError:
        _error("input nested too deeply")
        return EXIT_BAD_INPUT
    except MemoryError:
        _error("out of memory reading the input")
        return EXIT_BAD_INPUT
    except Exception as e:  # pyctl's own failure: one line, the traceback on request
        if debug_requested():
            raise
        _error(
            f"internal error (a bug in pyctl; PYCTL_DEBUG=1 shows where): {type(e).__name__}: {e}"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
