"""`pyctl score SNAPSHOT.json --workload WORKLOAD.json [--json]`: how much idle GPU is stranded,
where, and why. SNAPSHOT may be pyctl's format or a `kubectl get nodes,pods -o json` dump, read
as the controller reads the cluster (`pyctl.cli.inputs`): objects it leaves out are named on
stderr and under `left_out` in `--json`; with a dump and no --workload, M is derived from the
dump's GPU and MIG pods as the controller derives it."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cli.inputs import (
    add_rdma_option,
    cluster_view,
    derived_workload,
    listed_of,
    rdma_resource,
    say_left_out,
)
from pyctl.cluster.kube.dump import Listed, is_dump
from pyctl.controller.view import left_out_json
from pyctl.core.fabric import DEFAULT_LEVELS, FabricScore, fabric_score
from pyctl.core.fragmentation import (
    CATEGORIES,
    ClusterScore,
    FragmentationModel,
    worst_nodes,
)
from pyctl.jsontypes import JsonObject, as_list, as_object
from pyctl.snapshot import load_snapshot, load_workload


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
    add_rdma_option(p)


def run(args: argparse.Namespace) -> int:
    listed = getattr(args, "listed", None)
    raw = None
    if not isinstance(listed, Listed):
        raw = load_json(args.snapshot)
        listed = listed_of(raw, args.snapshot, rdma_resource(args)) if is_dump(raw) else None
    fixed = load_workload(load_json(args.workload)) if args.workload else None
    left_out = None
    dra = None
    labels = None
    levels = DEFAULT_LEVELS
    view = None
    if listed is None:
        if fixed is None:
            raise UserError("a pyctl snapshot needs --workload WORKLOAD.json")
        model = FragmentationModel(load_snapshot(raw))
        workload = fixed
    else:
        view = cluster_view(listed, fixed)
        workload = derived_workload(view, args.snapshot or "the cluster")
        model = FragmentationModel(view.snapshot())
        # the node records' labels (cliques filled in from ComputeDomainClique objects) and the
        # levels with the Topology objects', as the controller passes them
        levels, labels = view.fabric_labels()
        dra = view.dra_report()
        left_out = view.left_out()
    result = model.score(workload)
    fabric = fabric_score(model, workload, levels, labels)
    if args.json:
        out = result.to_json()
        out["fabric"] = fabric_json(fabric)
        if dra is not None:
            out["dra"] = dra
        if left_out is not None:
            out["left_out"] = left_out_json(left_out)
        print(json.dumps(out, indent=1))
    else:
        print_table(result, args.top)
        print_fabric(fabric, args.top)
        if dra is not None:
            print_dra(dra)
        if left_out:
            Console().print(f"left out: {len(left_out)} objects (named on stderr)")
    say_left_out(view)
    return 0


def fabric_json(f: FabricScore) -> dict[str, object]:
    """The fabric part of `pyctl score --json` (docs/fabric.md)."""
    return {
        "domain_split_gpu_milli": f.domain_split_gpu_milli,
        "no_domain_gpu_milli": f.no_domain_gpu_milli,
        "gangs": [
            {"shape": g.shape, "pods": g.pods, "level": g.level, "gpus_per_pod": g.gpus_per_pod}
            for g in f.gangs
        ],
        "levels": [
            {
                "level": lv.level,
                "domains": lv.domains,
                "whole": lv.whole,
                "whole_fraction": lv.whole_fraction,
                "no_domain_nodes": lv.no_domain_nodes,
                "malformed": lv.malformed,
                "overflow": lv.overflow,
                "largest_gang": list(lv.largest),
            }
            for lv in f.levels
        ],
        "domains": [
            {
                "level": d.level,
                "domain": d.name,
                "nodes": d.nodes,
                "gpu_milli": d.gpu_milli,
                "idle_gpu_milli": d.idle_gpu_milli,
                "fragment_gpu_milli": d.fragment_gpu_milli,
                "whole": d.whole,
                "capacity": list(d.capacity),
            }
            for d in f.domains
        ],
        "node_domain_split": dict(f.node_domain_split),
        "node_no_domain": dict(f.node_no_domain),
    }


def print_fabric(f: FabricScore, top: int) -> None:
    """Topology domains: per level, and the domains with the most stranded GPU first."""
    if not f.levels:
        return
    console = Console()
    t = Table(title="Topology domains, most domain_split first (milli-GPU)")
    for col in ("level", "domain", "nodes", "idle", "domain_split", "whole", "gang pods it fits"):
        t.add_column(col, justify="right" if col in ("nodes", "idle", "domain_split") else "left")
    shown = sorted(f.domains, key=lambda d: (-d.fragment_gpu_milli, d.level, d.name))[:top]
    for d in shown:
        fits = " ".join(
            f"{c}/{g.pods}" for c, g in zip(d.capacity, f.gangs, strict=True) if g.level == d.level
        )
        t.add_row(
            d.level,
            d.name,
            str(d.nodes),
            f"{d.idle_gpu_milli:.0f}",
            f"{d.fragment_gpu_milli:.0f}",
            "yes" if d.whole else "no",
            fits or "-",
        )
    console.print(t)
    for lv in f.levels:
        extra = "".join(
            f"; {n} nodes {why}"
            for n, why in (
                (lv.no_domain_nodes, "in no domain"),
                (lv.malformed, "with a malformed value (no domain)"),
                (lv.overflow, "beyond the domain bound (no domain)"),
            )
            if n
        )
        gangs = ", ".join(
            f"largest gang of {g.gpus_per_pod}-GPU pods {n}"
            for g, n in zip(f.gangs, lv.largest, strict=True)
            if n is not None
        )
        console.print(
            f"level {lv.level}: {lv.domains} domains, {lv.whole} whole "
            f"({lv.whole_fraction:.0%}){'; ' + gangs if gangs else ''}{extra}"
        )
    console.print(
        f"fabric: domain_split {f.domain_split_gpu_milli:.0f} milli-GPU, "
        f"no_domain {f.no_domain_gpu_milli:.0f} (beside the node fragment above)"
    )


def print_dra(report: JsonObject) -> None:
    """The DRA part of `pyctl score` on a dump (docs/dra.md)."""
    console = Console()
    nodes = as_object(report["nodes"], "nodes")
    for name, nv in sorted(nodes.items()):
        n = as_object(nv, name)
        kinds = f"{n['gpus']} GPUs"
        if n["dynamic_mig_gpus"]:
            kinds += f", {n['dynamic_mig_gpus']} DynamicMIG"
        if n["static_mig_gpus"]:
            kinds += f", {n['static_mig_gpus']} MIG"
        links = f"; link groups by {n['links_by']}" if n.get("links_by") else ""
        console.print(f"DRA {name}: {kinds}; zones by {n['zones_by']}{links}")
        if n["both_ways"]:
            console.print(f"  {name}: GPUs managed both by the device plugin and by a DRA driver")
        for note in as_list(n["notes"], "notes"):
            console.print(f"  {note}")
    unknown = as_object(report["unknown_requests"], "unknown_requests")
    for pod, why in sorted(unknown.items()):
        console.print(f"DRA unknown: {pod}: {why}")
    spans = as_list(report["pods_spanning_numa_nodes"], "pods_spanning_numa_nodes")
    for xv in spans:
        x = as_object(xv, "pods_spanning_numa_nodes")
        numa = " ".join(
            "/".join(str(i) for i in as_list(v, "numa")) for v in as_list(x["numa"], "numa")
        )
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
