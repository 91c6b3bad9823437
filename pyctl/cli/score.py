"""`pyctl score SNAPSHOT.json --workload WORKLOAD.json [--json]`: how much idle GPU is stranded,
where, and why. SNAPSHOT may be pyctl's format or a `kubectl get nodes,pods -o json` dump; with a
dump and no --workload, the workload is derived from the dump's pods as FGD does."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cli.inputs import load_cluster
from pyctl.cluster.kube.dump import dra_report, is_dump, pod_shapes
from pyctl.core.fragmentation import (
    CATEGORIES,
    ClusterScore,
    FragmentationModel,
    derive_workload,
    worst_nodes,
)
from pyctl.model import Workload
from pyctl.snapshot import load_workload


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("score", help="score a cluster snapshot's GPU fragmentation")
    p.add_argument(
        "snapshot", help="snapshot JSON (pyctl format or kubectl get nodes,pods -o json)"
    )
    add_options(p)
    p.set_defaults(handler=run)


def add_options(p: argparse.ArgumentParser) -> None:
    """`score`'s options besides its input (shared with `kubectl pyctl score`)."""
    p.add_argument("--workload", help="workload JSON: {shapes: [...]} (default: derived from pods)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--top", type=int, default=20, help="nodes to show in the table (default 20)")


def _workload(args: argparse.Namespace, raw: object) -> Workload:
    if args.workload:
        return load_workload(load_json(args.workload))
    if is_dump(raw):
        shapes = pod_shapes(raw)  # type: ignore[arg-type]
        if not shapes:
            raise UserError(f"{args.snapshot}: no pods to derive a workload from; give --workload")
        return derive_workload(shapes)
    raise UserError("a pyctl snapshot needs --workload WORKLOAD.json")


def run(args: argparse.Namespace) -> int:
    raw = load_json(args.snapshot)
    snapshot = load_cluster(raw)
    workload = _workload(args, raw)
    result = FragmentationModel(snapshot).score(workload)
    dra = dra_report(raw) if is_dump(raw) else None
    if args.json:
        out = result.to_json()
        if dra is not None:
            out["dra"] = dra
        print(json.dumps(out, indent=1))
    else:
        print_table(result, args.top)
        if dra is not None:
            print_dra(dra)
    return 0


def print_dra(report: dict[str, object]) -> None:
    """The DRA part of `pyctl score` on a dump (docs/dra.md)."""
    console = Console()
    nodes = report["nodes"]
    assert isinstance(nodes, dict)
    for name, n in sorted(nodes.items()):
        kinds = f"{n['gpus']} GPUs"
        if n["dynamic_mig_gpus"]:
            kinds += f", {n['dynamic_mig_gpus']} DynamicMIG"
        if n["static_mig_gpus"]:
            kinds += f", {n['static_mig_gpus']} MIG"
        console.print(f"DRA {name}: {kinds}; zones by {n['zones_by']}")
        if n["both_ways"]:
            console.print(f"  {name}: GPUs managed both by the device plugin and by a DRA driver")
        for note in n["notes"]:
            console.print(f"  {note}")
    unknown = report["unknown_requests"]
    assert isinstance(unknown, dict)
    for pod, why in sorted(unknown.items()):
        console.print(f"DRA unknown: {pod}: {why}")
    spans = report["pods_spanning_numa_nodes"]
    assert isinstance(spans, list)
    for x in spans:
        numa = " ".join("/".join(str(i) for i in v) for v in x["numa"])
        console.print(
            f"DRA pod {x['pod']} on {x['node']}: its devices span NUMA nodes ({numa}): "
            "it pays the cross-NUMA penalty; a candidate for compaction into one zone"
        )
    console.print(
        f"DRA: {len(unknown)} pods with claims pyctl cannot tell, "
        f"{len(spans)} running pods whose devices span NUMA nodes"
    )


def _top_categories(cats: dict[str, float], n: int = 2) -> str:
    ranked = sorted(((v, k) for k, v in cats.items() if v > 0.5), reverse=True)[:n]
    return ", ".join(f"{k} {v:.0f}" for v, k in ranked) or "-"


def print_table(result: ClusterScore, top: int) -> None:
    console = Console()
    t = Table(title="GPU fragmentation, worst nodes first (milli-GPU; MIG in compute slices)")
    for col in (
        "node",
        "idle",
        "fragment",
        "why (GPU)",
        "zones idle/fragment",
        "MIG idle/frag/recoverable",
    ):
        t.add_column(col, justify="right" if col in ("idle", "fragment") else "left")
    for n in worst_nodes(result, top):
        zones = " ".join(
            f"{z.numa}:{z.idle_gpu_milli:.0f}/{z.fragment_gpu_milli:.0f}" for z in n.zones
        )
        mig = (
            f"{n.idle_mig_slices:.0f}/{n.fragment_mig_slices:.1f}/{n.recoverable_mig_slices:.0f}"
            if n.idle_mig_slices
            else "-"
        )
        t.add_row(
            n.name,
            f"{n.idle_gpu_milli:.0f}",
            f"{n.fragment_gpu_milli:.0f}",
            _top_categories(n.categories),
            zones,
            mig,
        )
    console.print(t)
    for n in worst_nodes(result, top):
        if n.sharing:
            gpus = " ".join(f"{gid}:{used}" for _, gid, used, _ in n.shares)
            console.print(f"{n.name}: shared GPUs ({n.sharing}); used milli per GPU {gpus}")
        if n.gpu_source:
            console.print(f"{n.name}: GPUs attributed by {n.gpu_source}")
    cats = ", ".join(
        f"{c} {result.categories[c]:.0f}" for c in CATEGORIES if result.categories[c] > 0.5
    )
    console.print(
        f"cluster: idle {result.idle_gpu_milli:.0f} milli-GPU, "
        f"fragment {result.fragment_gpu_milli:.0f} "
        f"({result.fragmentation_rate:.1%}); by category: {cats or 'none'}"
    )
    if result.idle_mig_slices:
        console.print(
            f"MIG: idle {result.idle_mig_slices:.0f} slices, "
            f"fragment {result.fragment_mig_slices:.1f}, "
            f"recoverable by re-partitioning {result.recoverable_mig_slices:.0f}"
        )
