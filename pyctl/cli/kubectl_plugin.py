"""`kubectl pyctl ...`: pyctl's read-only commands on the cluster of the current kubeconfig
context (kubectl finds the `kubectl-pyctl` console script on PATH).

    kubectl pyctl score [--json] [--workload W.json] [--top N]
    kubectl pyctl plan  [--json] [--workload W.json] [--max-moves N] [--rescue-depth N]
    kubectl pyctl status  --redis URL [--cluster NAME]
    kubectl pyctl explain POD --redis URL [--cluster NAME]

It lists the objects live (Nodes, Pods, PodDisruptionBudgets, and NodeResourceTopology objects when
their CRD is served) the way `kubectl get nodes,pods,poddisruptionbudgets,noderesourcetopologies -o
json` dumps them, and runs `pyctl score` / `pyctl plan` on that dump: the same output. Nothing in
the cluster is changed; it needs list on those kinds. `--kubeconfig` and `--context` (after the
command) choose another kubeconfig or context; otherwise $KUBECONFIG or ~/.kube/config and its
current context, as kubectl. `status` and `explain` are `pyctl status` / `pyctl explain`: they
read a running controller's state from Redis, not the API server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from pyctl.cli.errors import EXIT_BAD_INPUT, UserError

#: what is listed: (path, kind, apiVersion, optional: absent when its API is not served)
LISTS = (
    ("/api/v1/nodes", "Node", "v1", False),
    ("/api/v1/pods", "Pod", "v1", False),
    ("/apis/policy/v1/poddisruptionbudgets", "PodDisruptionBudget", "policy/v1", False),
    (
        "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies",
        "NodeResourceTopology",
        "topology.node.k8s.io/v1alpha2",
        True,
    ),
)


def default_kubeconfig() -> str:
    """$KUBECONFIG's first file, or ~/.kube/config (as kubectl)."""
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return first or str(Path.home() / ".kube" / "config")


async def dump(kubeconfig: str, context: str | None) -> dict[str, Any]:
    """The cluster's objects as a `kubectl get ... -o json` List (each item with its kind)."""
    from pyctl.cluster.kube.client import connect

    kube = await connect(kubeconfig=kubeconfig, context=context)
    items: list[dict[str, Any]] = []
    try:
        for path, kind, api_version, optional in LISTS:
            resp = await kube.request("GET", path)
            if resp.status == 404 and optional:
                continue
            body = resp.check().json()
            for obj in body.get("items") or []:
                items.append({"apiVersion": api_version, "kind": kind, **obj})
    finally:
        await kube.close()
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


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
            data = anyio.run(dump, kubeconfig, args.context)
        except (OSError, ValueError, ConfigException) as e:
            raise UserError(f"cannot list the cluster's objects: {e}") from e
        with tempfile.TemporaryDirectory(prefix="kubectl-pyctl-") as tmp:
            path = Path(tmp) / "cluster.json"
            path.write_text(json.dumps(data), encoding="utf-8")
            setattr(args, args.source_arg, str(path))
            out: int = args.handler(args)
            return out
    except (UserError, ValueError) as e:
        print(f"kubectl pyctl: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
