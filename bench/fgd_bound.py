"""How far from the limit: a lower bound on unallocated GPU for the openb traces (issue 21), beside
pyctl, FGD and BestFit, and the eviction frontier.

Per seed, the tasks that had arrived when the arrived GPU request reached 90%, 100% and 110% of
capacity (the same tasks for every policy: the arrival order depends on the seed only) are packed
onto the trace's nodes with free choice of placement by `pyctl.replay.bound`: the LP relaxation
gives a lower bound on unallocated GPU, and the best placement built from the MILP (checked
against the replay's rules) an upper one; where the two meet, it is the optimum.

Usage: python bench/fgd_bound.py TRACE_DIR [--seeds N] [--points 90,100,110] [--variants LIST|all]
                                 [--variant-seeds N] [--numa] [--frontier PNG]
                                 [--frontier-seeds N] [--budgets LIST]
Prints per trace the medians over the seeds, then the last line
`fgd_bound: default trace, bound <B>% (LP), optimum <O>% (gap <G>%), pyctl <P>%, FGD <F>%;
with pyctl's placed tasks kept, bound <K>%; placing every task that any re-placement makes room
for, <W>%` (at 100% arrived, medians over the seeds; O is the best placement found: the optimum
where the gap is 0; K is the bound for placements that hold every task pyctl's replay placed,
`bound.bound_keeping`: P - K is what re-packing pyctl's tasks, with any number of moves, could
win, K - B what choosing other tasks to place wins; W is `bound.work_conserving`: the tasks in
arrival order, each placed if some re-placement of the ones placed before makes room for it,
never refused otherwise: what a scheduler that places every pod that fits reaches with free,
unlimited moves). With
--frontier, pyctl is replayed at each eviction budget and the frontier drawn (unallocated GPU at
100% arrived against the share of pods evicted by then, and beside each point the bound with the
tasks that replay placed kept), with FGD, BestFit and the bound as horizontal lines; its Markdown
table is printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import REPO  # noqa: F401  (puts the repository on sys.path)

from pyctl.replay import bound
from pyctl.replay.trace import POLICIES, Compaction, Trace, TraceError, load_trace, median, replay

POINTS = (90, 100, 110)
#: The variants of docs/fgd-variants.md.
VARIANTS = [
    *("cpu050", "cpu100", "cpu200", "cpu250"),
    *("gpushare20", "gpushare40", "gpushare60", "gpushare80", "gpushare100"),
    *("gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33"),
    *("multigpu20", "multigpu30", "multigpu50"),
]


@dataclass(frozen=True)
class FrontierPolicy:
    """One line of the frontier: a replay policy run at every eviction budget."""

    label: str
    policy: str


#: Adding a policy to the frontier is one entry here.
FRONTIER: list[FrontierPolicy] = [FrontierPolicy("pyctl", "pyctl")]
if "pyctl-deployed" in POLICIES:
    FRONTIER.append(FrontierPolicy("pyctl as deployed", "pyctl-deployed"))
BUDGETS = (0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0)


@dataclass
class SeedResult:
    seed: int
    policy: dict[str, float]  # unallocated % at 100% arrived
    bounds: dict[int, bound.Bound]
    evicted: float
    #: the bound with the tasks pyctl's replay placed kept (`bound.bound_keeping`), % unallocated
    kept: dict[int, float]
    #: `bound.work_conserving`: every task placed that a re-placement makes room for, %
    admitted: dict[int, float]


def run_seed(trace: Trace, seed: int, numa: bool, points: tuple[int, ...]) -> SeedResult:
    runs = {
        p: replay(trace, p, seed, numa=numa, placements=p in ("fgd", "pyctl"))
        for p in POLICY_COLUMNS
    }
    arrival = runs["fgd"]
    bounds = {}
    kept = {}
    admitted = {}
    for pct in points:
        arrived = arrival.arrived_task_indices(pct)
        if arrived is None:
            continue
        prob = bound.make_problem(trace.nodes, trace.tasks, arrived, numa=numa)
        b = bound.solve(prob)
        placed = bound.check_placement(trace.nodes, trace.tasks, arrived, b.placement, numa=numa)
        if placed != b.best_alloc_milli:
            raise SystemExit(
                f"fgd_bound: placement check disagrees ({placed} != {b.best_alloc_milli})"
            )
        for p, r in runs.items():
            if r.unallocated_pct(pct) < b.bound_pct - 1e-9:
                raise SystemExit(f"fgd_bound: {p} seed {seed} beats the bound at {pct}%: a bug")
        bounds[pct] = b
        # pyctl's placed tasks kept: its packing's share of the distance (the same arrivals)
        held = runs["pyctl"].placed_positions(pct) or []
        kept[pct] = prob.unallocated_pct(bound.bound_keeping(prob, held))
        if runs["pyctl"].unallocated_pct(pct) < kept[pct] - 1e-9:
            raise SystemExit(f"fgd_bound: pyctl seed {seed} beats its kept bound at {pct}%: a bug")
        admitted[pct] = bound.work_conserving(prob).unallocated_pct
        if admitted[pct] < b.bound_pct - 1e-9:
            raise SystemExit(
                f"fgd_bound: the work-conserving rule beats the bound at {pct}%: a bug"
            )
    return SeedResult(
        seed,
        {p: r.unallocated_pct(100) for p, r in runs.items()},
        bounds,
        runs["pyctl"].evicted_pct(),
        kept,
        admitted,
    )


POLICY_COLUMNS = ("fgd", "bestfit", "pyctl")


def report(name: str, results: list[SeedResult], points: tuple[int, ...]) -> dict[str, float]:
    def med(f: list[float]) -> float:
        return median(f)

    out: dict[str, float] = {}
    parts = []
    for pct in points:
        bs = [r.bounds[pct] for r in results if pct in r.bounds]
        if not bs:
            continue
        b, o, g = (
            med([x.bound_pct for x in bs]),
            med([x.best_pct for x in bs]),
            med([x.gap_pct for x in bs]),
        )
        closed = sum(x.closed for x in bs)
        secs = max(x.lp_seconds + x.place_seconds for x in bs)
        k = med([r.kept[pct] for r in results if pct in r.kept])
        w = med([r.admitted[pct] for r in results if pct in r.admitted])
        parts.append(
            f"@{pct}%: bound {b:.2f}%, best placement {o:.2f}% (gap {g:.2f}, closed {closed}/"
            f"{len(bs)}, LP {med([x.lp_seconds for x in bs]):.1f} s, up to {secs:.0f} s), "
            f"with pyctl's placed tasks kept {k:.2f}%, placing every task a re-placement makes "
            f"room for {w:.2f}%"
        )
        if pct == 100:
            out.update(bound=b, optimum=o, gap=g, kept=k, admitted=w)
    for p in POLICY_COLUMNS:
        out[p] = med([r.policy[p] for r in results])
    out["evicted"] = med([r.evicted for r in results])
    print(
        f"{name}: pyctl {out['pyctl']:.2f}% ({out['evicted']:.2f}% evicted), "
        f"FGD {out['fgd']:.2f}%, BestFit {out['bestfit']:.2f}% @100%; " + "; ".join(parts),
        flush=True,
    )
    return out


def frontier(
    trace: Trace, seeds: list[int], budgets: tuple[float, ...], lines: dict[str, float], png: Path
) -> None:
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    problems: dict[int, bound.Problem] = {}  # per seed: the arrivals are the policy's alike
    for fp in FRONTIER:
        for b in budgets:
            comp = Compaction(budget=b / 100.0)
            rs = [replay(trace, fp.policy, s, compaction=comp, placements=True) for s in seeds]
            kept = []
            for s, r in zip(seeds, rs, strict=True):
                arrived = r.arrived_task_indices(100)
                if arrived is None:
                    continue
                if s not in problems:
                    problems[s] = bound.make_problem(trace.nodes, trace.tasks, arrived)
                held = r.placed_positions(100) or []
                kept.append(problems[s].unallocated_pct(bound.bound_keeping(problems[s], held)))
            ev = median(r.evicted_pct() for r in rs)
            un = median(r.unallocated_pct(100) for r in rs)
            k = median(kept)
            rows.setdefault(fp.label, []).append((b, ev, un, k))
            print(
                f"frontier {fp.label} budget {b:g}%: {ev:.2f}% evicted, {un:.2f}% unallocated, "
                f"{k:.2f}% with its placed tasks kept"
            )
    print()
    print(
        "| eviction budget % | "
        + " | ".join(f"{k}: evicted % / unallocated % / its tasks kept, bound %" for k in rows)
        + " |"
    )
    print("|---:|" + "---:|" * len(rows))
    for i, b in enumerate(budgets):
        cells = [f"{v[i][1]:.2f} / {v[i][2]:.2f} / {v[i][3]:.2f}" for v in rows.values()]
        print(f"| {b:g} | " + " | ".join(cells) + " |")
    print(
        f"| horizontal lines | FGD {lines['fgd']:.2f}, BestFit {lines['bestfit']:.2f}, "
        f"bound (LP) {lines['bound']:.2f}, best placement {lines['optimum']:.2f} |"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, pts in rows.items():
        (line,) = ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=label)
        ax.plot(
            [p[1] for p in pts],
            [p[3] for p in pts],
            marker=".",
            linestyle=":",
            color=line.get_color(),
            label=f"{label}: bound with its placed tasks kept",
        )
    styles = [
        ("bestfit", "BestFit", "tab:gray", ":"),
        ("fgd", "FGD", "tab:red", "--"),
        ("optimum", "best placement found (no limit on moves)", "tab:green", "-."),
        ("bound", "lower bound (LP)", "black", "-"),
    ]
    for key, label, color, ls in styles:
        ax.axhline(
            lines[key], color=color, linestyle=ls, linewidth=1, label=f"{label} {lines[key]:.2f}%"
        )
    ax.set_xlabel("pods evicted by 100% arrived (% of pods arrived)")
    ax.set_ylabel("unallocated GPU at 100% arrived (%)")
    ax.set_title(f"Eviction frontier, openb default trace (median of {len(seeds)} seeds)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    print(f"fgd_bound: wrote {png}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir")
    ap.add_argument("--seeds", type=int, default=10, help="seeds from 42 for the default trace")
    ap.add_argument(
        "--variants",
        default="",
        help="comma-separated variants of docs/fgd-variants.md, or 'all' (default: none)",
    )
    ap.add_argument("--variant-seeds", type=int, default=1, help="seeds per variant (default 1)")
    ap.add_argument(
        "--points",
        default=",".join(str(x) for x in POINTS),
        help="arrived %% points for the default trace (100 among them)",
    )
    ap.add_argument("--variant-points", default="100", help="arrived %% points for variants")
    ap.add_argument("--numa", action="store_true", help="the NUMA variant of the replay")
    ap.add_argument("--frontier", type=Path, help="draw the eviction frontier into this PNG")
    ap.add_argument("--frontier-seeds", type=int, help="seeds for the frontier (default --seeds)")
    ap.add_argument("--budgets", default=",".join(f"{b:g}" for b in BUDGETS), help="%% of pods")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    variants = VARIANTS if args.variants == "all" else [v for v in args.variants.split(",") if v]
    out: dict[str, dict[str, float]] = {}
    for name in ["default", *variants]:
        try:
            trace = load_trace(args.trace_dir, name)
        except TraceError as e:
            print(f"fgd_bound: {name}: {e}", file=sys.stderr)
            if name == "default":
                return 2
            continue
        n = args.seeds if name == "default" else args.variant_seeds
        spec = args.points if name == "default" else args.variant_points
        points = tuple(int(x) for x in spec.split(","))
        t1 = time.perf_counter()
        results = [run_seed(trace, s, args.numa, points) for s in range(42, 42 + n)]
        out[name] = report(f"{name} ({n} seeds, {time.perf_counter() - t1:.0f} s)", results, points)
    d = out["default"]
    if args.frontier is not None:
        trace = load_trace(args.trace_dir, "default")
        seeds = list(range(42, 42 + (args.frontier_seeds or args.seeds)))
        budgets = tuple(float(x) for x in args.budgets.split(","))
        frontier(trace, seeds, budgets, d, args.frontier)
    print(f"fgd_bound: {time.perf_counter() - t0:.0f} s in all")
    print(
        f"fgd_bound: default trace, bound {d['bound']:.2f}% (LP), optimum {d['optimum']:.2f}% "
        f"(gap {d['gap']:.2f}%), pyctl {d['pyctl']:.2f}%, FGD {d['fgd']:.2f}%; "
        f"with pyctl's placed tasks kept, bound {d['kept']:.2f}%; placing every task that any "
        f"re-placement makes room for, {d['admitted']:.2f}%"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
