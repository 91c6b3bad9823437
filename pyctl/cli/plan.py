"""`pyctl plan DUMP.json`: what the controller would do now, and why, with the expected gain —
the compaction moves (evict which pod, where it lands) for a `kubectl get
nodes,pods,poddisruptionbudgets,noderesourcetopologies -o json` dump (with the
`resource.k8s.io` objects when DRA is used: DRA pods move by their claims, and the DeviceTaintRules
pyctl would use to steer the allocator are listed). Nothing is changed."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cluster.dra import DraModel
from pyctl.cluster.kube.dump import dra_context, is_dump, records
from pyctl.cluster.translate import model_of, shape_of
from pyctl.core.fragmentation import derive_workload
from pyctl.model import Node
from pyctl.snapshot import load_workload
from pyctl.workflows.compaction import plan_compaction
from pyctl.workflows.dra_taints import describe, steering_rules


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="print what the controller would do now (nothing is changed)")
    p.add_argument("dump", help="kubectl get nodes,pods,pdb,noderesourcetopologies -o json")
    p.add_argument("--workload", help="workload JSON (default: derived from the GPU pods)")
    p.add_argument("--max-moves", type=int, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--no-device-taint-rules",
        action="store_true",
        help="the API server does not serve DeviceTaintRules (say what pyctl would do there)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    raw = load_json(args.dump)
    if not is_dump(raw):
        raise UserError(f"{args.dump}: expected a kubectl -o json dump (kind: List)")
    nodes, pods, nrts, pdbs = records(raw)
    dra = dra_context(raw)
    live = [p for p in pods if not p.terminated]
    if args.workload:
        workload = load_workload(load_json(args.workload))
    else:
        got = [shape_of(p, dra) for p in live]
        shapes = [s for s in got if s is not None and not s.is_cpu_only]
        if not shapes:
            raise UserError(f"{args.dump}: no GPU pods to derive a workload from; give --workload")
        workload = derive_workload(shapes)
    pending_got = [shape_of(p, dra) for p in live if not p.node and p.unschedulable]
    pending = [s for s in pending_got if s is not None]
    plan = plan_compaction(
        {n.name: n for n in nodes},
        {t.name: t for t in nrts},
        live,
        pdbs,
        workload,
        pending=[s for s in pending if not s.is_cpu_only],
        max_moves=args.max_moves,
        dra=dra,
    )
    dra_lines: list[str] = []
    if dra is not None:
        nrt = {t.name: t for t in nrts}
        models: dict[str, Node] = {}
        dra_models: dict[str, DraModel] = {}
        for n in nodes:
            node_pods = [p for p in live if p.node == n.name]
            node_model, dm = model_of(n, nrt.get(n.name), node_pods, dra=dra)
            models[n.name] = node_model
            if dm is not None:
                dra_models[n.name] = dm
                if dm.gpus and (n.gpus or n.mig):
                    dra_lines.append(
                        f"{n.name}: GPUs managed both by the device plugin and by a DRA driver: "
                        "pyctl moves no pod there and never re-partitions it"
                    )
                dra_lines += [f"{n.name}: {note}" for note in dm.notes]
        rules = steering_rules(models, dra_models, workload)
        dra_lines += describe(rules, served=not args.no_device_taint_rules)
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
                    "dra": dra_lines,
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
    for line in dra_lines:
        c.print(f"DRA: {line}" if not line.startswith("  ") else line)
    return 0
