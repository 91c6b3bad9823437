"""The trace replay with a fabric (issue 33, part 6; docs/topology-replay.md): the default openb
trace's nodes in NVLink cliques and leaves, gangs added to its arrivals, replayed under
topology-blind FGD, Kueue TAS BestFit, Kueue TAS with LeastFreeCapacity for pods without a
topology request, KAI/Volcano domain bin-packing, pyctl (placement only) and pyctl-repair (pending
gangs repaired by moving single pods out of the clique the controller chooses, within an eviction
budget of --evict-pct of the pods arrived), one run per policy and seed, seeds 42.. .

Usage: python bench/topology_replay.py TRACE_DIR [--seeds N] [--gang-share F] [--policies A,B]
       [--csv PATH] [--png PATH]
Per policy (medians over the seeds, at 100% arrived): unallocated GPU %, gang GPU demand served
% (GPUs of the gangs placed / GPUs of the gangs arrived), gangs pending, whole cliques, pods
evicted %. The whole cliques at each percent arrived (median over the seeds) go to --csv and,
plotted, to --png. Last line: `topology_replay: at 100% arrived (median of N seeds), unallocated
GPU / gang demand served: fgd U% / G%, ..., pyctl-repair U% / G%; evicted E%` (E: the most of
any policy).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from _common import REPO

from pyctl.replay.topology import POLICY_NAMES, RepairBudget, TopologyRun, Variant, run
from pyctl.replay.trace import TraceError, load_trace


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def write_series(path: Path, runs: dict[str, list[TopologyRun]]) -> list[str]:
    """The whole cliques at each percent arrived, median over the seeds, one column a policy."""
    pcts = sorted({c.arrived_pct for rs in runs.values() for r in rs for c in r.checkpoints})
    rows = []
    for pct in pcts:
        row: list[str] = [str(pct)]
        for rs in runs.values():
            vals = [
                float(c.whole_cliques) for r in rs for c in r.checkpoints if c.arrived_pct == pct
            ]
            row.append(f"{_median(vals):g}")
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_pct", *runs])
        w.writerows(rows)
    return [str(path)]


def plot_series(csv_path: Path, png: Path, cliques: int, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open(newline="") as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    x = [int(r[0]) for r in body]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for k, name in enumerate(head[1:], start=1):
        ax.plot(
            x, [float(r[k]) for r in body], label=name, lw=2 if name.startswith("pyctl") else 1.2
        )
    ax.set_xlabel("GPU request arrived, % of capacity")
    ax.set_ylabel(f"whole cliques (of {cliques})")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds from 42 (default 10)")
    ap.add_argument("--gang-share", type=float, default=Variant().gang_share)
    ap.add_argument("--domain-nodes", type=int, default=Variant().domain_nodes)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument(
        "--evict-pct",
        type=float,
        default=RepairBudget().evict_pct,
        help="pyctl-repair's eviction budget, %% of the pods arrived (default 2)",
    )
    ap.add_argument("--csv", default=str(REPO / "docs" / "img" / "topology-replay.csv"))
    ap.add_argument("--png", default=str(REPO / "docs" / "img" / "topology-replay.png"))
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    try:
        trace = load_trace(args.trace_dir)
    except TraceError as e:
        print(f"topology_replay: {e}", file=sys.stderr)
        return 2
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in POLICY_NAMES]
    if unknown:
        print(
            f"topology_replay: unknown policies {unknown} (known: {POLICY_NAMES})", file=sys.stderr
        )
        return 2
    v = Variant(gang_share=args.gang_share, domain_nodes=args.domain_nodes)
    budget = RepairBudget(evict_pct=args.evict_pct)
    seeds = list(range(42, 42 + args.seeds))
    runs: dict[str, list[TopologyRun]] = {}
    for p in policies:
        runs[p] = [run(trace, p, s, v, budget) for s in seeds]
    first = runs[policies[0]][0]
    print(
        f"trace default: {trace.node_count} nodes, {trace.gpu_count} GPUs, {first.cliques} cliques"
        f" of up to {v.domain_nodes} nodes, leaves of {v.leaf_domains}; gangs {v.gang_share:.0%} of"
        f" the GPU request; seeds {seeds[0]}..{seeds[-1]}"
    )
    print(
        "policy          unalloc%  gang served%  gangs pending  whole cliques  failed  "
        "evicted%  s/run"
    )
    med: dict[str, tuple[float, float]] = {}
    for p, rs in runs.items():
        u = _median([r.unallocated_pct() for r in rs])
        g = _median([r.gang_served_pct() for r in rs])
        pend = _median([float(r.gangs_pending()) for r in rs])
        arrived = _median([float(r.last.gangs_arrived) for r in rs])
        whole = _median([float(r.last.whole_cliques) for r in rs])
        failed = _median([float(r.tasks_failed) for r in rs])
        ev = _median([r.evicted_pct() for r in rs])
        t = _median([r.seconds for r in rs])
        med[p] = (u, g)
        print(
            f"{p:15s} {u:8.2f}  {g:12.1f}  {pend:6.1f} of {arrived:4.0f}  {whole:13.1f}  "
            f"{failed:6.0f}  {ev:8.2f}  {t:5.1f}"
        )
    csv_path = Path(args.csv)
    write_series(csv_path, runs)
    if not args.no_plot:
        plot_series(
            csv_path,
            Path(args.png),
            first.cliques,
            f"openb default with a fabric: whole NVLink cliques, median of {len(seeds)} seeds",
        )
    ev_all = max(_median([r.evicted_pct() for r in rs]) for rs in runs.values())
    cells = ", ".join(f"{p} {u:.2f}% / {g:.1f}%" for p, (u, g) in med.items())
    print(
        f"topology_replay: at 100% arrived (median of {len(seeds)} seeds), unallocated GPU / gang"
        f" demand served: {cells}; evicted {ev_all:.2f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
