"""Entry point of the `pyctl` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from pyctl import __version__
from pyctl.cli import (
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
from pyctl.cli.errors import EXIT_BAD_INPUT, UserError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pyctl",
        description="NUMA- and MIG-aware GPU fragmentation controller for Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"pyctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (UserError, ValueError) as e:
        print(f"pyctl: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
