"""`pyctl plan DUMP.json`: what the controller would do now, and why, with the expected gain —
the rescues of pending pods (several evictions that make room for one) and the compaction moves
(evict which pod, where it lands), which pods may not move and which rule refused each, for a
`kubectl get nodes,pods,poddisruptionbudgets,noderesourcetopologies -o json` dump. Nothing is
changed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cluster.kube.dump import is_dump, records
from pyctl.cluster.translate import TranslateError, models_of, pod_shape
from pyctl.core.fragmentation import derive_workload
from pyctl.core.policy import PlanLimits
from pyctl.snapshot import load_workload
from pyctl.workflows.compaction import CompactionPlan, plan_compaction


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="print what the controller would do now (nothing is changed)")
    p.add_argument("dump", help="kubectl get nodes,pods,pdb,noderesourcetopologies -o json")
    p.add_argument("--workload", help="workload JSON (default: derived from the GPU pods)")
    p.add_argument("--max-moves", type=int, default=10)
    p.add_argument("--rescue-depth", type=int, default=3, help="most evictions per rescue")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def _json(plan: CompactionPlan) -> dict[str, Any]:
    def move(m: Any) -> dict[str, Any]:
        return {
            "pod": m.pod,
            "from": m.from_node,
            "to": m.to_node,
            "gain_gpu_milli": m.gain_gpu_milli,
            "rescue": m.rescue,
        }

    return {
        "rescues": [
            {
                "pending": r.pending,
                "node": r.node,
                "moves": [move(m) for m in r.moves],
                "waits": r.waits,
                "delta_gpu_milli": r.delta_gpu_milli,
            }
            for r in plan.rescues
        ],
        "moves": [move(m) for m in plan.moves],
        "gain_gpu_milli": plan.gain_gpu_milli,
        "considered": plan.considered,
        "refused": dict(plan.refused),
        "unrescued": dict(plan.unrescued),
    }


def run(args: argparse.Namespace) -> int:
    raw = load_json(args.dump)
    if not is_dump(raw):
        raise UserError(f"{args.dump}: expected a kubectl -o json dump (kind: List)")
    if not (0 <= args.max_moves <= 1000 and 0 <= args.rescue_depth <= 8):
        raise UserError("--max-moves must be 0..1000 and --rescue-depth 0..8")
    nodes, pods, nrts, pdbs = records(raw)
    live = [p for p in pods if not p.terminated]
    if args.workload:
        workload = load_workload(load_json(args.workload))
    else:
        shapes = [pod_shape(p) for p in live if not pod_shape(p).is_cpu_only]
        if not shapes:
            raise UserError(f"{args.dump}: no GPU pods to derive a workload from; give --workload")
        workload = derive_workload(shapes)
    try:
        models = models_of(nodes, nrts, live)
    except TranslateError as e:
        raise UserError(f"{args.dump}: {e}") from None
    pending = [p for p in live if not p.node and p.unschedulable]
    plan = plan_compaction(
        models,
        {n.name: n for n in nodes},
        live,
        pdbs,
        workload,
        pending=pending,
        limits=PlanLimits(max_moves=args.max_moves, rescue_depth=args.rescue_depth),
    )
    if args.json:
        print(json.dumps(_json(plan), indent=1))
        return 0
    _print(plan, len(pending))
    return 0


def _print(plan: CompactionPlan, pending: int) -> None:
    c = Console()
    if plan.rescues:
        t = Table(title="Rescues: room made for pending pods (observe mode: nothing done)")
        for col in ("pending pod", "node", "evictions (pod → where it lands)", "waits"):
            t.add_column(col)
        for r in plan.rescues:
            moves = "; ".join(f"{m.pod} → {m.to_node}" for m in r.moves)
            t.add_row(r.pending, r.node, moves, str(r.waits))
        c.print(t)
    t = Table(title="Compaction: evictions the controller would make now (observe mode: none made)")
    for col in ("#", "pod", "from", "to", "fragment reduction (GPU)", "for"):
        t.add_column(col)
    for i, m in enumerate(plan.moves, 1):
        why = plan.rescues[m.rescue].pending if m.rescue is not None else "defragmentation"
        t.add_row(str(i), m.pod, m.from_node, m.to_node, f"{m.gain_gpu_milli / 1000:.2f}", why)
    c.print(t)
    if plan.refused:
        t = Table(title="Pods that may not move, and the rule that says so")
        t.add_column("pod")
        t.add_column("why")
        for pod, why in sorted(plan.refused.items()):
            t.add_row(pod, why)
        c.print(t)
    for pod, why in sorted(plan.unrescued.items()):
        c.print(f"pending pod {pod}: no rescue ({why})")
    c.print(
        f"{len(plan.moves)} moves of {plan.considered} movable pods ({len(plan.rescues)} "
        f"rescue(s)), expected fragment reduction {plan.gain_gpu_milli / 1000:.2f} GPUs; "
        f"{len(plan.refused)} pods may not move; {pending} pending pods considered."
    )
