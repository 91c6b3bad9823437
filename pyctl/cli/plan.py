"""`pyctl plan DUMP.json`: what the controller would do now, and why, with the expected gain —
the compaction moves (evict which pod, where it lands) for a `kubectl get
nodes,pods,poddisruptionbudgets,noderesourcetopologies -o json` dump. Nothing is changed."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cluster.kube.dump import is_dump, records
from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import node_from_records, pod_shape, pod_shape_problem
from pyctl.core.fragmentation import derive_workload
from pyctl.snapshot import load_workload
from pyctl.workflows.compaction import plan_compaction
from pyctl.workflows.compactor import without_unusable_targets


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="print what the controller would do now (nothing is changed)")
    p.add_argument("dump", help="kubectl get nodes,pods,pdb,noderesourcetopologies -o json")
    p.add_argument("--workload", help="workload JSON (default: derived from the GPU pods)")
    p.add_argument("--max-moves", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raw = load_json(args.dump)
    if not is_dump(raw):
        raise UserError(f"{args.dump}: expected a kubectl -o json dump (kind: List)")
    nodes, pods, nrts, pdbs = records(raw)
    live = [p for p in pods if not p.terminated]
    # as the controller does: a pod the core cannot model and a node that cannot be translated
    # are left out (and said), the rest is planned
    ignored: dict[str, str] = {}
    modelled = []
    for p in live:
        why = pod_shape_problem(p) if (p.gpus or p.mig) else None
        if why is None:
            modelled.append(p)
        else:
            ignored[f"pod {p.key}"] = why
    nrt_of = {t.name: t for t in nrts}
    on_node: dict[str, list[PodRecord]] = {}
    for p in live:
        on_node.setdefault(p.node, []).append(p)
    usable = {}
    for n in nodes:
        try:
            node_from_records(n, nrt_of.get(n.name), on_node.get(n.name, []))
        except ValueError as e:
            ignored[f"node {n.name}"] = str(e)
            continue
        usable[n.name] = n
    if args.workload:
        workload = load_workload(load_json(args.workload))
    else:
        shapes = [pod_shape(p) for p in modelled if not pod_shape(p).is_cpu_only]
        if not shapes:
            raise UserError(f"{args.dump}: no GPU pods to derive a workload from; give --workload")
        workload = derive_workload(shapes)
    pending = [pod_shape(p) for p in modelled if not p.node and p.unschedulable]
    plan = plan_compaction(
        usable,
        nrt_of,
        live,
        pdbs,
        workload,
        pending=[s for s in pending if not s.is_cpu_only],
        max_moves=args.max_moves,
    )
    plan = without_unusable_targets(plan, {p.key: p for p in live}, usable)
    if args.json:
        print(
            json.dumps(
                {
                    "moves": [
                        {
                            "pod": m.pod,
                            "from": m.from_node,
                            "to": m.to_node,
                            "gain_gpu_milli": m.gain_gpu_milli,
                        }
                        for m in plan.moves
                    ],
                    "gain_gpu_milli": plan.gain_gpu_milli,
                    "considered": plan.considered,
                    "refused": dict(plan.refused),
                    "ignored": ignored,
                },
                indent=1,
            )
        )
        return 0
    c = Console()
    t = Table(title="Compaction: evictions the controller would make now (observe mode: none made)")
    for col in ("#", "pod", "from", "to", "fragment reduction (GPU)"):
        t.add_column(col)
    for i, m in enumerate(plan.moves, 1):
        t.add_row(str(i), m.pod, m.from_node, m.to_node, f"{m.gain_gpu_milli / 1000:.2f}")
    c.print(t)
    c.print(
        f"{len(plan.moves)} moves of {plan.considered} movable pods, expected fragment reduction "
        f"{plan.gain_gpu_milli / 1000:.2f} GPUs; {len(plan.refused)} pods may not move"
        + (f" (e.g. {next(iter(plan.refused.items()))})" if plan.refused else "")
        + f"; {len(pending)} pending pods considered."
    )
    for what, why in ignored.items():
        c.print(f"left out: {what}: {why}")
    return 0
