"""`pyctl dev up`: a local Kubernetes cluster (the real control plane, kwok GPU nodes) with pyctl
and its scheduler extender acting on a fragmenting workload, in the foreground with a live view,
until Ctrl-C (`pyctl/dev/cluster.py`). Needs a checkout of the repository (the control plane is
built by its scripts/control-plane, once)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("dev", help="a local cluster to try pyctl on (dev up)")
    dsub = p.add_subparsers(dest="dev_command", metavar="COMMAND", required=True)
    up = dsub.add_parser(
        "up", help="start a local control plane with GPU nodes and pyctl; Ctrl-C stops it"
    )
    up.add_argument("--nodes", type=int, default=3, help="8-GPU H100 nodes (default 3)")
    up.add_argument(
        "--work-dir",
        type=Path,
        help="where its certificates, kubeconfig and logs go (default ~/.cache/pyctl/dev-cluster)",
    )
    up.add_argument("--no-live", action="store_true", help="print the workload's steps instead")
    up.add_argument(
        "--duration", type=float, default=0.0, help="stop after this many seconds (default: never)"
    )
    up.add_argument(
        "--pause", type=float, default=20.0, help="seconds between workload cycles (default 20)"
    )
    up.add_argument("--redis", dest="redis_url", default="", help="pyctl's Redis (default: memory)")
    up.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pyctl.cli.errors import UserError
    from pyctl.dev.cluster import Options, up

    if args.nodes < 1:
        raise UserError("--nodes must be at least 1")
    opts = Options(
        nodes=args.nodes,
        live=not args.no_live,
        duration=args.duration,
        pause=args.pause,
        redis_url=args.redis_url,
    )
    if args.work_dir is not None:
        opts = Options(**{**opts.__dict__, "work_dir": args.work_dir})
    return up(opts)
