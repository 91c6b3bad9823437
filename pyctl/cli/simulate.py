"""`pyctl simulate`: replay a GPU task trace under scheduling policies (the FGD artifact's protocol)
and report unallocated GPU and fragmentation. With no arguments it runs a built-in scenario (a
small generated trace shipped with pyctl); `--trace DIR` replays an Alibaba-2023-style trace."""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from pyctl.cli.errors import UserError
from pyctl.replay.trace import (
    POLICIES,
    SEEDS,
    Compaction,
    RunResult,
    Trace,
    TraceError,
    load_trace,
    median,
    replay,
)

CHECKPOINTS = (90, 100, 110, 120)


def _builtin_dir() -> Path:
    return Path(str(resources.files("pyctl.data").joinpath("replay_sample")))


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad seed list {text!r} (e.g. 42-51 or 42,43)") from None
    if not out:
        raise argparse.ArgumentTypeError("no seeds")
    return out


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="replay a task trace under scheduling policies")
    p.add_argument("--trace", help="trace directory (node list + pod list CSVs); default: built-in")
    p.add_argument(
        "--workload", default="default", help="pod list: openb_pod_list_<NAME>.csv (default)"
    )
    p.add_argument(
        "--policy",
        nargs="+",
        choices=POLICIES,
        default=None,
        help="one or several policies (default: all)",
    )
    p.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        help="seeds, e.g. 42-51 (default: 42-51; built-in 42-44)",
    )
    p.add_argument("--numa", action="store_true", help="split nodes 2 x NUMA, single-numa-node")
    p.add_argument(
        "--evictions",
        type=float,
        default=2.0,
        help="pyctl's eviction budget, %% of arrived pods (default 2)",
    )
    p.add_argument("--every", type=int, default=20, help="compaction every N arrivals (default 20)")
    p.add_argument("--tune", type=float, default=1.3, help="resample to this x GPU capacity")
    p.add_argument("--out", help="write report.md, plots (PNG) and results.csv to this directory")
    p.add_argument(
        "--seed-case",
        action="store_true",
        help="the seed article's deployment case (5 A100 MIG + 3 CPU nodes): exclusive whole-GPU "
        "mode against MIG + heterogeneous mode with re-partitioning and compaction",
    )
    p.add_argument(
        "--inference",
        metavar="DIR",
        help="replay the DLRM inference trace (disaggregated_DLRM_trace.csv in DIR): instances "
        "arriving and leaving over 31 days under pyctl, pyctl's placement alone, FGD and BestFit "
        "(docs/simulator.md, 'The inference replay'); seeds default 42-44",
    )
    p.add_argument(
        "--evictions-per-day",
        type=float,
        default=1.0,
        help="with --inference: pyctl's eviction budget, %% of the running instances per day",
    )
    p.add_argument(
        "--min-pod-age",
        type=float,
        default=0.0,
        help="with --inference: seconds a pod runs before pyctl may move it (the controller's "
        "evictor_min_pod_age_seconds; default 0)",
    )
    p.add_argument(
        "--headroom",
        type=float,
        default=5.0,
        help="with --inference: the inventory's room above the trace's peak, %% (default 5)",
    )
    p.add_argument(
        "--normalize",
        action="store_true",
        help="with --seed-case: also the normalization `pyctl recommend` recommends, applied",
    )
    p.set_defaults(handler=run)


def run_seed_case(console: Console, seeds: Sequence[int]) -> int:
    from pyctl.replay import seed_case

    case = seed_case.Case()
    rows = seed_case.run(case, seeds)
    mix = ", ".join(f"{k.count} {k.name} ({k.profile})" for k in case.kinds)
    t = Table(
        title=f"seed case: {case.gpu_nodes} x {case.gpus_per_node} A100-40GB + {case.cpu_nodes} "
        f"CPU nodes; {mix}; median of {len(seeds)} arrival order(s)"
    )
    for col in ("metric", "exclusive whole-GPU", "MIG + heterogeneous", "article (§6.3)"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for i, r in enumerate(rows, 1):
        art = f"{r.article[0]} -> {r.article[1]}" if r.article[0] else "-"
        t.add_row(f"{r.label} ({i})", r.exclusive, r.mig, art)
    console.print(t)
    for i, r in enumerate(rows, 1):
        console.print(f"({i}) {r.how}")
    console.print(
        "Per-replica compute/memory figures and the replica mix are ours (§6 gives only the "
        "profiles): see pyctl/replay/seed_case.py and docs/simulator.md."
    )
    return 0


def run_matrix(
    trace: Trace,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    numa: bool = False,
    compaction: Compaction | None = None,
    tune: float = 1.3,
    console: Console | None = None,
) -> list[RunResult]:
    results: list[RunResult] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=len(policies) * len(seeds))
        for policy in policies:
            for seed in seeds:
                progress.update(task, description=f"{policy} seed {seed}")
                results.append(
                    replay(trace, policy, seed, tune=tune, numa=numa, compaction=compaction)
                )
                progress.advance(task)
    return results


def summarize(
    results: Sequence[RunResult], policies: Sequence[str]
) -> list[dict[str, float | str]]:
    rows: list[dict[str, float | str]] = []
    for p in policies:
        rs = [r for r in results if r.policy == p]
        if not rs:
            continue
        row: dict[str, float | str] = {"policy": p}
        for k in CHECKPOINTS:
            row[f"unalloc_{k}"] = median(r.unallocated_pct(k) for r in rs)
        row["frag_rate_90"] = median(r.frag_rate(90) for r in rs)
        row["frag_amount_90"] = median(r.frag_amount_pct(90) for r in rs)
        row["numa_split_gpus_100"] = median(r.numa_split_gpus(100) for r in rs)
        row["failed_admission"] = median(float(r.raw["failed_admission"]) for r in rs)
        row["evicted_pct"] = median(r.evicted_pct() for r in rs)
        row["seconds"] = median(r.seconds for r in rs)
        rows.append(row)
    return rows


def _fmt(v: float | str) -> str:
    if isinstance(v, str):
        return v
    return "-" if math.isnan(v) else f"{v:.2f}"


def print_report(
    console: Console, trace: Trace, rows: Sequence[dict[str, float | str]], seeds: Sequence[int]
) -> None:
    t = Table(
        title=f"trace {trace.name}: {trace.node_count} nodes, {trace.gpu_count} GPUs, "
        f"{trace.task_count} tasks; median of {len(seeds)} seed(s)"
    )
    t.add_column("policy")
    for k in CHECKPOINTS:
        t.add_column(f"unalloc GPU % @{k}%", justify="right")
    t.add_column("frag rate @90%", justify="right")
    t.add_column("NUMA-split GPUs @100%", justify="right")
    t.add_column("evicted % @100%", justify="right")
    t.add_column("s/run", justify="right")
    for r in rows:
        t.add_row(
            str(r["policy"]),
            *(_fmt(r[f"unalloc_{k}"]) for k in CHECKPOINTS),
            _fmt(r["frag_rate_90"]),
            _fmt(r["numa_split_gpus_100"]),
            _fmt(r["evicted_pct"]),
            _fmt(r["seconds"]),
        )
    console.print(t)


def write_outputs(
    out: Path,
    trace: Trace,
    results: Sequence[RunResult],
    rows: Sequence[dict[str, float | str]],
    seeds: Sequence[int],
    numa: bool,
) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "trace",
                "policy",
                "seed",
                "numa",
                "arrived_pct",
                "unallocated_gpu_pct",
                "frag_rate_pct",
                "frag_amount_pct",
                "numa_split_gpus",
                "evictions",
            ]
        )
        for r in results:
            for c in r.raw["checkpoints"]:
                k = int(c["arrived_pct"])
                w.writerow(
                    [
                        r.trace,
                        r.policy,
                        r.seed,
                        int(numa),
                        k,
                        f"{r.unallocated_pct(k):.4f}",
                        f"{r.frag_rate(k):.4f}",
                        f"{r.frag_amount_pct(k):.4f}",
                        f"{r.numa_split_gpus(k):.3f}",
                        c["evictions"],
                    ]
                )
    plot = "unallocated.png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for p in dict.fromkeys(r.policy for r in results):
            rs = [r for r in results if r.policy == p]
            ks = sorted({k for r in rs for k, _ in r.curve()})
            ys = [median(r.unallocated_pct(k) for r in rs) for k in ks]
            ax.plot(ks, ys, label=p)
        ax.set_xlabel("arrived GPU request (% of capacity)")
        ax.set_ylabel("unallocated GPU (%)")
        ax.set_xlim(80, 130)
        ax.set_ylim(0, 30)
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title(f"{trace.name}: unallocated GPU vs arrived (median of {len(seeds)} seeds)")
        fig.tight_layout()
        fig.savefig(out / plot, dpi=120)
        plt.close(fig)
    except ImportError:
        plot = ""
        notes.append("matplotlib is not installed: no plot (pip install 'pyctl[plots]')")
    lines = [
        f"# pyctl simulate: {trace.name}",
        "",
        f"{trace.node_count} nodes, {trace.gpu_count} GPUs, {trace.task_count} tasks; "
        f"seeds {', '.join(map(str, seeds))}; NUMA split: {'yes' if numa else 'no'}.",
        "",
        "| policy | "
        + " | ".join(f"unalloc @{k}%" for k in CHECKPOINTS)
        + " | frag rate @90% | NUMA-split GPUs @100% | evicted % @100% |",
        "|---|" + "---:|" * (len(CHECKPOINTS) + 3),
    ]
    for row in rows:
        lines.append(
            f"| {row['policy']} | "
            + " | ".join(_fmt(row[f"unalloc_{k}"]) for k in CHECKPOINTS)
            + f" | {_fmt(row['frag_rate_90'])} | {_fmt(row['numa_split_gpus_100'])}"
            f" | {_fmt(row['evicted_pct'])} |"
        )
    if plot:
        lines += ["", f"![unallocated GPU vs arrived]({plot})"]
    lines += ["", "Raw per-seed checkpoints: [results.csv](results.csv)."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return notes


def run_inference(console: Console, args: argparse.Namespace) -> int:
    from pyctl.replay import inference

    if not 0.0 <= args.evictions_per_day <= 100.0:
        raise UserError("--evictions-per-day must be a percentage in 0..100")
    if not 0.0 <= args.min_pod_age <= 86400.0 * 365:
        raise UserError("--min-pod-age must be a number of seconds in 0..31536000")
    if not 0.0 <= args.headroom <= 1000.0:
        raise UserError("--headroom must be a percentage in 0..1000")
    try:
        trace = inference.load(args.inference)
    except inference.InferenceTraceError as e:
        raise UserError(str(e)) from None
    for row, why in trace.skipped[:10]:
        console.print(f"[yellow]row {row} left out: {why}[/yellow]")
    if len(trace.skipped) > 10:
        console.print(f"[yellow]... {len(trace.skipped)} rows left out in all[/yellow]")
    inv = inference.Inventory(headroom=args.headroom / 100.0)
    big = trace.oversized(inv)
    if big:
        console.print(
            f"[yellow]{len(big)} instance(s) ask for more than one node has (first: "
            f"{trace.instances['name'][big[0]]}): they wait until they leave[/yellow]"
        )
    comp = inference.Compaction(
        budget_per_day=args.evictions_per_day / 100.0, min_pod_age=args.min_pod_age
    )
    # --policy pyctl also runs pyctl's placement alone (pyctl-place)
    chosen = set(args.policy or inference.POLICIES)
    if "pyctl" in chosen:
        chosen.add("pyctl-place")
    policies = [p for p in inference.POLICIES if p in chosen]
    if not policies:
        raise UserError(f"--inference replays {', '.join(inference.POLICIES)}")
    seeds = args.seeds or list(inference.SEEDS)
    results = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("replaying", total=len(policies) * len(seeds))
        for seed in seeds:
            for policy in policies:
                progress.update(task, description=f"{policy} seed {seed}")
                try:
                    r = inference.replay(trace, policy, seed, inventory=inv, compaction=comp)
                except ValueError as e:  # the engine refuses an input, naming the field
                    raise UserError(f"inference replay: {e}") from None
                results.append(r)
                progress.advance(task)
    n = inv.node_count(trace.peaks(inv))
    t = Table(
        title=f"DLRM inference trace: {trace.count} GPU instances over {trace.end / 86400:.1f} "
        f"days on {n} nodes x {inv.gpus} GPUs ({inv.cpu} vCPU, {inv.memory_gib} GiB, "
        f"{inv.rnics} RNICs); median of {len(seeds)} seed(s)"
    )
    t.add_column("policy")
    for title, _, _ in inference.FIGURES:
        t.add_column(title, justify="right")
    t.add_column("s/run", justify="right")
    for cells in inference.table_rows(results):
        t.add_row(*cells)
    console.print(t)
    console.print(inference.summary_line(results))
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console()
    if args.inference:
        return run_inference(console, args)
    if args.seed_case:
        if args.normalize:  # resource normalization (pyctl/recommend/evaluate.py)
            from pyctl.cli.recommend import print_seed_evaluation

            print_seed_evaluation(console, args.seeds or list(SEEDS))
            return 0
        return run_seed_case(console, args.seeds or list(SEEDS))
    builtin = args.trace is None
    directory = _builtin_dir() if builtin else Path(args.trace)
    try:
        trace = load_trace(directory, args.workload)
    except TraceError as e:
        raise UserError(str(e)) from None
    policies = list(args.policy or POLICIES)
    seeds = args.seeds or ([42, 43, 44] if builtin else list(SEEDS))
    if not 0.0 <= args.evictions <= 100.0:
        raise UserError("--evictions must be a percentage in 0..100")
    if args.every < 1:
        raise UserError("--every must be at least 1")
    comp = Compaction(every=args.every, budget=args.evictions / 100.0, max_moves=20)
    if builtin:
        console.print("[dim]built-in scenario: a small generated trace (use --trace DIR)[/dim]")
    results = run_matrix(
        trace, policies, seeds, numa=args.numa, compaction=comp, tune=args.tune, console=console
    )
    rows = summarize(results, policies)
    print_report(console, trace, rows, seeds)
    if args.out:
        for note in write_outputs(Path(args.out), trace, results, rows, seeds, args.numa):
            console.print(f"[yellow]{note}[/yellow]")
        console.print(f"report: {Path(args.out) / 'report.md'}")
    return 0
