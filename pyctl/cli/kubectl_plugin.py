"""`kubectl pyctl ...`: pyctl's read-only commands on the cluster of the current kubeconfig
context (kubectl finds the `kubectl-pyctl` console script on PATH).

    kubectl pyctl score [--json] [--workload W.json] [--top N]
    kubectl pyctl plan  [--json] [--workload W.json] [--max-moves N] [--rescue-depth N]
    kubectl pyctl status  --redis URL [--cluster NAME]
    kubectl pyctl explain POD --redis URL [--cluster NAME]

It lists every kind the controller watches by the controller's own reflectors (Nodes, Pods,
PodDisruptionBudgets, and where their APIs are served NodeResourceTopology objects and the
`resource.k8s.io` kinds of Dynamic Resource Allocation), decodes them as the controller does, and
runs `pyctl score` / `pyctl plan` on them: the same output as for a `kubectl get ... -A -o json`
dump of those kinds, and each object the controller would leave out left out here, named on
stderr (`pyctl.cluster.kube.dump`). Nothing in the cluster is changed; it needs list on those
kinds. `--kubeconfig` and `--context` (after the
command) choose another kubeconfig or context; otherwise $KUBECONFIG or ~/.kube/config and its
current context, as kubectl. `status` and `explain` are `pyctl status` / `pyctl explain`: they
read a running controller's state from Redis, not the API server.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from pyctl.cli.errors import EXIT_BAD_INPUT, UserError
from pyctl.cli.inputs import rdma_resource
from pyctl.cluster.kube.client import CONNECTION_ERRORS, KubeApiError
from pyctl.cluster.kube.dump import Listed, list_cluster


def default_kubeconfig() -> str:
    """$KUBECONFIG's first file, or ~/.kube/config (as kubectl)."""
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return first or str(Path.home() / ".kube" / "config")


async def listing(kubeconfig: str, context: str | None, rdma: str = "") -> Listed:
    """One list of the cluster, by the controller's reflectors (`dump.list_cluster`; `rdma`:
    their RDMA resource)."""
    from pyctl.cluster.kube.client import connect
    from pyctl.cluster.kube.reflector import ReflectorOptions

    kube = await connect(kubeconfig=kubeconfig, context=context)
    try:
        return await list_cluster(kube, options=ReflectorOptions(rdma_resource=rdma))
    finally:
        await kube.close()


def build_parser() -> argparse.ArgumentParser:
    """`pyctl score` and `pyctl plan`'s options, without their dump argument (the cluster is)."""
    from pyctl.cli import plan, score

    parser = argparse.ArgumentParser(
        prog="kubectl pyctl",
        description="pyctl's read-only commands on the current kubeconfig context's cluster.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sc = sub.add_parser("score", help="the cluster's GPU fragmentation (as pyctl score)")
    score.add_options(sc)
    sc.set_defaults(handler=score.run, source_arg="snapshot")
    pl = sub.add_parser("plan", help="the compaction pyctl would do now (as pyctl plan)")
    plan.add_options(pl)
    pl.set_defaults(handler=plan.run, source_arg="dump")
    for p in (sc, pl):
        p.add_argument(
            "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
        )
        p.add_argument("--context", help="kubeconfig context (default: its current context)")
    from pyctl.cli import explain, status

    # from a controller's stored state (Redis), as `pyctl status` / `pyctl explain`
    status.register(sub)
    explain.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not hasattr(args, "source_arg"):  # status, explain: the stored state, not the API
            code: int = args.handler(args)
            return code
        kubeconfig = args.kubeconfig or default_kubeconfig()
        if not Path(kubeconfig).is_file():
            raise UserError(f"no kubeconfig at {kubeconfig} (set KUBECONFIG or --kubeconfig)")
        from kubernetes_asyncio.config import ConfigException

        try:
            listed = anyio.run(listing, kubeconfig, args.context, rdma_resource(args))
        except (*CONNECTION_ERRORS, KubeApiError, ValueError, ConfigException) as e:
            raise UserError(f"cannot list the cluster's objects: {e}") from e
        args.listed = listed
        setattr(args, args.source_arg, None)
        out: int = args.handler(args)
        return out
    except (UserError, ValueError) as e:
        print(f"kubectl pyctl: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
