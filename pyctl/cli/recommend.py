"""`pyctl recommend`: resource normalization — standard sizes per GPU model, right-sized replicas
and node resource classes, from a `kubectl get nodes,pods,replicasets,noderesourcetopologies -o
json` dump or a live cluster (`--kubeconfig`), with GPU usage from Prometheus (`--prometheus`,
dcgm-exporter's series). Nothing is changed: patches and labels are printed (or written) for a
person to apply. Method: docs/normalization.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pyctl.cli.errors import UserError, load_json
from pyctl.cluster.kube.dump import DumpError, dump_items
from pyctl.cluster.kube.reflector import RESOURCES
from pyctl.cluster.selectors import parse_selector
from pyctl.jsontypes import as_object
from pyctl.recommend.inventory import Inventory, from_objects
from pyctl.recommend.prometheus import PrometheusClient, PrometheusError, parse_duration, read_usage
from pyctl.recommend.report import Options, PoolReport, Report, recommend

#: What the live listing reads: (path, kind of its items, optional: a CRD that may be absent);
#: the controller's kinds where the controller's reflectors find them, and the ReplicaSets
LIVE: tuple[tuple[str, str, bool], ...] = (
    *((RESOURCES[k].path(), k, RESOURCES[k].optional) for k in ("Node", "Pod")),
    ("/apis/apps/v1/replicasets", "ReplicaSet", False),
    *((RESOURCES[k].path(), k, RESOURCES[k].optional) for k in ("NodeResourceTopology",)),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recommend",
        help="standard GPU sizes, right-sized replicas and node classes (nothing is changed)",
    )
    p.add_argument(
        "dump",
        nargs="?",
        help="kubectl get nodes,pods,replicasets,noderesourcetopologies -o json (or --kubeconfig)",
    )
    p.add_argument("--kubeconfig", help="read the cluster of this kubeconfig instead of a dump")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--prometheus", help="Prometheus URL with dcgm-exporter's series")
    p.add_argument("--window", default="7d", help="usage window (Prometheus duration, default 7d)")
    p.add_argument(
        "--headroom", type=float, default=0.2, help="memory headroom over the peak (default 0.2)"
    )
    p.add_argument("--max-k", type=int, default=5, help="compare menus of 1..K sizes (default 5)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=1.0,
        help="recommend the fewest sizes within this many points of the best (default 1)",
    )
    p.add_argument("--grid", type=int, default=10, help="GPU shares: sizes in 1/GRID (default 10)")
    p.add_argument(
        "--namespace", action="append", default=[], help="only these namespaces (repeatable)"
    )
    p.add_argument(
        "--node-selector",
        help="only the nodes these labels select (kubectl -l syntax: key=value,key in (a,b),...)",
    )
    p.add_argument(
        "--class-selector",
        action="store_true",
        help="the patches also set the nodeSelector pyctl.io/resource-class",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", help="write the k-vs-benefit curve to this PNG")
    p.add_argument("--patches", help="write kustomize patch files and a kustomization here")
    p.add_argument("--mig-parted", help="write the MIG layouts as a mig-parted config here")
    p.set_defaults(handler=run)


async def list_cluster(
    kubeconfig: str,
    context: str | None,
    node_selector: str = "",
    namespaces: tuple[str, ...] = (),
) -> list[Any]:
    """Nodes (those matching ``node_selector``), Pods and ReplicaSets (of ``namespaces``, or
    all), and (when the CRD is served) NodeResourceTopologies, read with pyctl's Kubernetes
    client, pages of 500."""
    from pyctl.cluster.kube.client import CONNECTION_ERRORS, connect, path_part

    kube = await connect(kubeconfig=kubeconfig, context=context)
    items: list[Any] = []
    paths: list[tuple[str, str, bool]] = []
    for path, kind, optional in LIVE:
        if namespaces and kind in ("Pod", "ReplicaSet"):
            base, plural = path.rsplit("/", 1)
            paths += [
                (f"{base}/namespaces/{path_part(ns)}/{plural}", kind, optional) for ns in namespaces
            ]
        else:
            paths.append((path, kind, optional))
    try:
        for path, kind, optional in paths:
            cont = ""
            while True:
                query = [("limit", "500")] + ([("continue", cont)] if cont else [])
                if kind == "Node" and node_selector:
                    query.append(("labelSelector", node_selector))
                try:
                    resp = await kube.request("GET", path, query=query)
                except CONNECTION_ERRORS as e:
                    raise UserError(f"{kubeconfig}: cannot reach the API server: {e}") from None
                if resp.status == 404 and optional:
                    break
                if not resp.ok:
                    raise UserError(f"GET {path}: {resp.error()}")
                doc = resp.json()
                for o in doc.get("items") or []:
                    if isinstance(o, dict):
                        o.setdefault("kind", kind)
                    items.append(o)
                cont = (doc.get("metadata") or {}).get("continue") or ""
                if not cont:
                    break
    finally:
        await kube.close()
    return items


def load_inventory(args: argparse.Namespace) -> Inventory:
    ns = tuple(args.namespace)
    try:
        selector = parse_selector(args.node_selector) if args.node_selector else None
    except ValueError as e:
        raise UserError(str(e)) from None
    if args.kubeconfig:
        if args.dump:
            raise UserError("give a dump file or --kubeconfig, not both")
        import anyio

        items = anyio.run(list_cluster, args.kubeconfig, args.context, args.node_selector or "", ns)
        return from_objects(items, namespaces=ns, node_selector=selector)
    if not args.dump:
        raise UserError("give a kubectl dump file, or --kubeconfig PATH for a live cluster")
    try:
        items = dump_items(load_json(args.dump), args.dump)
    except DumpError as e:
        raise UserError(str(e)) from None
    return from_objects(items, namespaces=ns, node_selector=selector)


def run(args: argparse.Namespace) -> int:
    try:
        options = Options(
            max_k=args.max_k,
            headroom=args.headroom,
            tolerance_pct=args.tolerance,
            grid=args.grid,
            class_selector=args.class_selector,
            namespaces=tuple(args.namespace),
        )
        window = parse_duration(args.window)
    except ValueError as e:
        raise UserError(str(e)) from None
    inv = load_inventory(args)
    usage = None
    if args.prometheus:
        try:
            usage = read_usage(
                PrometheusClient(args.prometheus), window, namespaces=options.namespaces or None
            )
        except PrometheusError as e:
            raise UserError(str(e)) from None
    report = recommend(inv, usage, options)
    if args.plot:
        write_plot(report, Path(args.plot))
    if args.patches:
        out = Path(args.patches)
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, body in report.patch_files().items():
                (out / name).write_text(body, encoding="utf-8")
        except OSError as e:
            raise UserError(f"{out}: cannot write: {e.strerror or e}") from None
    if args.mig_parted:
        parted = report.mig_parted_yaml()
        if parted is None:
            raise UserError("--mig-parted: no MIG class in the recommendation (no MIG pool)")
        try:
            Path(args.mig_parted).write_text(parted, encoding="utf-8")
        except OSError as e:
            raise UserError(f"{args.mig_parted}: cannot write: {e.strerror or e}") from None
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_report(Console(), report)
    return 0


# ---- output -------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{x:.1f}%"


def pool_table(p: PoolReport) -> Table:
    t = p.tradeoff
    pool = p.pool
    kind = "MIG" if pool.mig else ("GPU shares" if pool.shares else "whole GPUs")
    table = Table(
        title=f"{pool.gpu_model} ({kind}; {len(pool.nodes)} node(s), {pool.gpus} GPUs, "
        f"{sum(n for _, _, n in p.groups)} GPU replicas): standard sizes, at 100% of capacity"
    )
    for col in ("k", "menu", "served", "rounding waste", "unallocated", "F(M') now"):
        table.add_column(col, justify="left" if col == "menu" else "right")
    b = t.baseline
    table.add_row(
        "-",
        "as requested (" + ", ".join(sorted(b.counts)) + ")",
        _pct(b.served_pct),
        _pct(b.waste_pct),
        _pct(b.unallocated_pct),
        _pct(100 * b.fragmentation_rate),
    )
    for k, r in enumerate(t.rows, 1):
        mark = " <- recommended" if r is t.recommended else ""
        table.add_row(
            str(k),
            ", ".join(r.menu or ()) + mark,
            _pct(r.served_pct),
            _pct(r.waste_pct),
            _pct(r.unallocated_pct),
            _pct(100 * r.fragmentation_rate),
        )
    return table


def print_report(c: Console, report: Report) -> None:
    if not report.pools:
        c.print("No GPU replicas on GPU nodes: nothing to normalize.")
    for p in report.pools:
        c.print(pool_table(p))
        rec = p.tradeoff.recommended
        if rec is not None:
            n = len(rec.menu or ())
            b = p.tradeoff.baseline
            cost = b.served_pct - rec.served_pct
            c.print(
                f"recommended menu ({n} size{'s' if n != 1 else ''}, the fewest within "
                f"{p.tradeoff.tolerance_pct:g} point(s) of the best menu): "
                f"{', '.join(rec.menu or ())}; against the requests as they are: demand served "
                f"{'-' if cost > 0 else '+'}{abs(cost):.1f} points, unallocated "
                f"{b.unallocated_pct:.1f}% -> {rec.unallocated_pct:.1f}%; rounding waste of the "
                f"replicas running now {rec.observed_waste_pct:.1f}% of their need"
            )
    if report.workloads:
        t = Table(title="Workloads: current request and the recommended standard size")
        for col in ("workload", "replicas", "current", "recommended", "class", "why"):
            t.add_column(col)
        for w in report.workloads:
            o = w.workload.owner
            t.add_row(
                f"{o.namespace}/{o.kind}/{o.name}",
                str(len(w.workload.replicas)),
                w.current,
                (w.recommended or "-") + (" (change)" if w.change else ""),
                w.klass or "-",
                w.why,
            )
        c.print(t)
    if report.classes.classes:
        t = Table(
            title="Resource classes for the normalized demand (label pyctl.io/resource-class)"
        )
        for col in ("class", "GPU model", "nodes needed", "nodes", "demand", "short"):
            t.add_column(col)
        for rc in report.classes.classes:
            t.add_row(
                rc.name,
                rc.pool or "-",
                str(len(rc.nodes)),
                ", ".join(rc.nodes) or "-",
                ", ".join(f"{k} x{v}" for k, v in rc.demand.items()),
                ", ".join(f"{k} x{v}" for k, v in rc.shortfall.items()) or "-",
            )
        c.print(t)
        spare = {k: v for k, v in report.classes.spare.items() if v}
        for model, nodes in spare.items():
            c.print(f"{model}: {len(nodes)} node(s) no class needs: {', '.join(nodes)}")
    patches = report.patches()
    if patches:
        c.print("[bold]Patches[/] (not applied; label the class nodes first when they select one):")
        for pt in patches:
            c.print(pt.command, soft_wrap=True, highlight=False)
    for w in report.changes:
        if w.patch is None:
            c.print(f"no patch for {w.workload.owner}: {w.no_patch}")
    cmds = [cmd for rc in report.classes.classes for cmd in rc.label_commands()]
    if cmds:
        c.print("[bold]Node labels[/] (not applied):")
        for cmd in cmds:
            c.print(cmd, soft_wrap=True, highlight=False)
    if report.classes.mig_parted is not None:
        names = sorted(as_object(report.classes.mig_parted["mig-configs"], "mig-configs"))
        c.print(
            f"MIG layouts: {len(names)} mig-parted config(s) ({', '.join(names)}); "
            "write them with --mig-parted FILE for the mig-manager's ConfigMap."
        )
    if report.usage is not None:
        u = report.usage
        a = report.attribution
        bad = sum(u.bad_points.values())
        c.print(
            f"Usage from {u.source} over {u.window_seconds / 86400:g} d: {u.series} series, "
            f"{len(u.containers)} containers, {u.unattributed_series} series without a pod, "
            f"{bad} bad points left out"
            + (f" ({', '.join(f'{k} {v}' for k, v in u.bad_points.items())})" if bad else "")
            + (f", {len(a.stale_series_pods)} stale pods" if a else "")
            + (f", {len(a.profile_mismatches)} MIG profile mismatches" if a else "")
            + f"; utilization from {u.util_metric or 'none'}."
        )
        for ex in u.examples:
            c.print(f"  bad point: {ex}", highlight=False)
    for pr in report.problems:
        c.print(f"[yellow]{pr}[/yellow]", highlight=False)


def write_plot(report: Report, path: Path) -> None:
    """Per pool, demand served, rounding waste and unallocated GPU against k."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--plot needs matplotlib (pip install 'pyctl[plots]')") from None
    pools = [p for p in report.pools if p.tradeoff.rows]
    if not pools:
        raise UserError("--plot: no GPU pool with replicas to plot")
    fig, axes = plt.subplots(1, len(pools), figsize=(5.5 * len(pools), 4.2), squeeze=False)
    for ax, p in zip(axes[0], pools, strict=True):
        rows = p.tradeoff.rows
        ks = list(range(1, len(rows) + 1))
        ax.plot(ks, [r.served_pct for r in rows], marker="o", label="demand served")
        ax.plot(ks, [r.waste_pct for r in rows], marker="s", label="rounding waste")
        ax.plot(ks, [r.unallocated_pct for r in rows], marker="^", label="unallocated")
        ax.axhline(p.tradeoff.baseline.served_pct, ls="--", c="grey", label="served as requested")
        if p.tradeoff.recommended is not None:
            k = rows.index(p.tradeoff.recommended) + 1
            ax.axvline(k, ls=":", c="black", label=f"recommended k={k}")
        ax.set_xticks(ks)
        ax.set_xlabel("standard sizes (k)")
        ax.set_ylabel("% of the pool's GPUs at 100% arrived")
        ax.set_ylim(0, 105)
        ax.set_title(p.pool.gpu_model)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror or e}") from None
    finally:
        plt.close(fig)


def print_seed_evaluation(c: Console, seeds: list[int], headroom: float = 0.2) -> None:
    """`pyctl simulate --seed-case --normalize`: the seed case (and its oversized variant) with
    the normalization pyctl recommends applied, against the article's hand-picked layout and
    whole-GPU mode (`pyctl.recommend.evaluate`)."""
    from pyctl.recommend.evaluate import OVERSIZED, evaluate_seed_case
    from pyctl.replay import seed_case as sc

    for label, case in (
        ("the article's requests", sc.Case()),
        ("requested one size too big (our variant)", sc.Case(kinds=OVERSIZED)),
    ):
        ev = evaluate_seed_case(case, seeds, headroom)
        mix = ", ".join(f"{k.count} {k.name} {k.profile}" for k in case.kinds)
        recs = ", ".join(
            f"{w.workload.owner.name} {w.current} -> {w.recommended}" for w in ev.report.workloads
        )
        classes = ", ".join(f"{rc.name} x{len(rc.nodes)}" for rc in ev.report.classes.classes)
        t = Table(
            title=f"seed case, {label}: {mix}; median of {len(seeds)} arrival order(s)",
        )
        t.add_column("metric")
        for m in ev.modes:
            t.add_column(m, justify="right")
        for metric, row in ev.rows():
            t.add_row(metric, *(row[m] for m in ev.modes))
        c.print(t)
        c.print(
            f"recommended (headroom {headroom:.0%}): {recs}; classes: {classes}",
            highlight=False,
        )
    c.print(
        "exclusive: whole GPUs, MIG off; hand-picked: the article's 7 x 1g.5gb on every GPU, "
        "re-partitioned by pyctl's planner (and compaction) when a replica finds no instance; "
        "normalized: the recommended sizes on the recommended classes (gpu-large nodes with MIG "
        "off, mig nodes with the planner's layouts), no re-partitioning; "
        "normalized+repartition: the same, re-partitioned as hand-picked when needed."
    )
