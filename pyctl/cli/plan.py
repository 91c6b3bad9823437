"""`pyctl plan DUMP.json`: what the controller would do now, and why, with the expected gain —
the rescues of pending pods (several evictions that make room for one) and the compaction moves
(evict which pod, where it lands), which pods may not move and which rule refused each, for a
`kubectl get nodes,pods,poddisruptionbudgets,noderesourcetopologies -o json` dump (with the
`resource.k8s.io` objects when DRA is used: DRA pods move by their claims, and the
DeviceTaintRules pyctl would use to steer the allocator are listed). Nothing is changed."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cli.inputs import (
    add_rdma_option,
    cluster_view,
    derived_workload,
    read_listed,
    say_left_out,
)
from pyctl.cluster.dra.zones import DraModel
from pyctl.cluster.records import NodeRecord
from pyctl.controller.ignored import Ignored
from pyctl.controller.view import left_out_json
from pyctl.core.policy import PlanLimits
from pyctl.jsontypes import JsonObject
from pyctl.model import Node, Workload
from pyctl.snapshot import load_workload
from pyctl.workflows.compaction import CompactionPlan, plan_compaction
from pyctl.workflows.dra_taints import describe, steering_rules


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="print what the controller would do now (nothing is changed)")
    p.add_argument("dump", help="kubectl get nodes,pods,pdb,noderesourcetopologies -o json")
    add_options(p)
    p.set_defaults(handler=run)


def add_options(p: argparse.ArgumentParser) -> None:
    """`plan`'s options besides its input (shared with `kubectl pyctl plan`)."""
    p.add_argument("--workload", help="workload JSON (default: derived from the GPU pods)")
    add_rdma_option(p)
    d = PlanLimits()
    p.add_argument(
        "--max-moves",
        type=int,
        default=d.max_moves,
        help="most evictions planned (the controller's)",
    )
    p.add_argument(
        "--rescue-depth", type=int, default=d.rescue_depth, help="most evictions per rescue"
    )
    p.add_argument(
        "--min-gain",
        type=float,
        default=d.min_gain,
        help="smallest fall of fragment (milli-GPU) a defragmentation move must bring",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--no-device-taint-rules",
        action="store_true",
        help="the API server does not serve DeviceTaintRules (say what pyctl would do there)",
    )


def _json(
    plan: CompactionPlan, dra_lines: list[str], left_out: list[Ignored], held: dict[str, str]
) -> JsonObject:
    def move(m: Any) -> JsonObject:
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
        "held": dict(held),
        "gang_domains": dict(plan.gang_domains),
        "dra": list(dra_lines),
        "left_out": left_out_json(left_out),
    }


def run(args: argparse.Namespace) -> int:
    if not (0 <= args.max_moves <= 1000 and 0 <= args.rescue_depth <= 8):
        raise UserError("--max-moves must be 0..1000 and --rescue-depth 0..8")
    if not 0 <= args.min_gain <= 1e9:
        raise UserError("--min-gain must be 0..1e9 milli-GPU")
    listed = read_listed(args, "dump")
    fixed = load_workload(load_json(args.workload)) if args.workload else None
    # as the controller does: an object that does not decode, a pod the core cannot model and a
    # node that cannot be translated are left out (and said), the rest is planned
    view = cluster_view(listed, fixed)
    workload = derived_workload(view, args.dump or "the cluster")
    rec = view.reconciler
    modelled = view.modelled_pods()
    why_held = view.cache.held()
    pending = [p for p in modelled if not p.node and p.unschedulable and p.key not in why_held]
    # the pending pods pyctl makes no room for, and why (Kueue's reason, a Volcano sub-group)
    held = {p.key: why_held[p.key] for p in modelled if not p.node and p.key in why_held}
    dra = view.cache.dra if view.has_dra else None
    plan = plan_compaction(
        rec.models,
        view.cache.nodes,
        view.live_pods(),
        list(view.cache.pdbs.values()),
        workload,
        pending=pending,
        limits=PlanLimits(
            max_moves=args.max_moves, min_gain=args.min_gain, rescue_depth=args.rescue_depth
        ),
        dra=dra,
        dra_positions=rec.dra_positions,
    )
    dra_lines: list[str] = []
    if dra is not None:
        nodes = list(view.cache.nodes.values())
        dra_lines = _dra_lines(
            nodes, rec.models, rec.dra_models, workload, not args.no_device_taint_rules
        )
    left_out = view.left_out()
    if args.json:
        print(json.dumps(_json(plan, dra_lines, left_out, held), indent=1))
        say_left_out(view)
        return 0
    _print(plan, len(pending))
    c = Console()
    for pod, why in sorted(held.items()):
        c.print(f"pending pod {pod}: no room made: {why}")
    for line in dra_lines:
        c.print(f"DRA: {line}" if not line.startswith("  ") else line)
    if left_out:
        c.print(f"left out: {len(left_out)} objects (named on stderr)")
    say_left_out(view)
    return 0


def _dra_lines(
    nodes: list[NodeRecord],
    models: dict[str, Node],
    dra_models: dict[str, DraModel],
    workload: Workload,
    served: bool,
) -> list[str]:
    """What DRA changes in the plan: nodes pyctl leaves alone, notes, the steering rules."""
    lines: list[str] = []
    for n in nodes:
        dm = dra_models.get(n.name)
        if dm is None:
            continue
        if dm.gpus and (n.gpus or n.mig):
            lines.append(
                f"{n.name}: GPUs managed both by the device plugin and by a DRA driver: "
                "pyctl moves no pod there and never re-partitions it"
            )
        lines += [f"{n.name}: {note}" for note in dm.notes]
    return lines + describe(steering_rules(models, dra_models, workload), served=served)


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
    for pod, why in sorted(plan.gang_domains.items()):
        c.print(f"pending pod {pod}: {why}")
    for pod, why in sorted(plan.unrescued.items()):
        c.print(f"pending pod {pod}: no rescue ({why})")
    c.print(
        f"{len(plan.moves)} moves of {plan.considered} movable pods ({len(plan.rescues)} "
        f"rescue(s)), expected fragment reduction {plan.gain_gpu_milli / 1000:.2f} GPUs; "
        f"{len(plan.refused)} pods may not move; {pending} pending pods considered."
    )
