"""The inference replay (issue 35): Alibaba's 2025 GPU-disaggregated DLRM serving trace, instances
arriving and leaving over about 31 days, on the documented GPU-node inventory
(`pyctl.replay.inference.Inventory`), under pyctl (its placement policy and its planner within
1% of the running instances evicted per day), pyctl's placement alone, FGD and BestFit; one
replay per policy and seed. Prints a table of time-weighted figures (medians over the seeds)
and, with --plot, pyctl against FGD over time (sampled every 6 hours).

With --bound, at every sample of pyctl's and FGD's replays the optimum repacking of what each
was running then is bracketed (`pyctl.replay.inference.repack_at_samples`: a lower bound and a
repacking found) and summed over the samples beside the policy's own sampled F(M).

Usage: python bench/inference_replay.py DATA_DIR [--seeds 42,43,44] [--json F] [--plot PNG]
                                        [--bound] [--min-pod-age S] [--headroom P] [--budget P]
Last line: `inference_replay: stranded GPU-hours pyctl <A>, FGD <B>; pending instance-hours pyctl
<C>, FGD <D>; pyctl <E> evictions/day (<F>% of running instances per day)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _common import REPO  # noqa: F401  (puts the repository on sys.path)

from pyctl.replay.inference import (
    FIGURES,
    POLICIES,
    SAMPLE_EVERY,
    SEEDS,
    InferenceResult,
    InferenceTraceError,
    Inventory,
    Repacking,
    load,
    repack_at_samples,
    replay,
    summary_line,
    table_rows,
)


def _seeds(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def table(results: list[InferenceResult]) -> list[str]:
    lines = [
        "| policy | " + " | ".join(h for h, _, _ in FIGURES) + " | s per run |",
        "|---|" + "---:|" * (len(FIGURES) + 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    return lines


#: the policies whose sampled instants are bracketed with --bound
BOUNDED = ("pyctl", "fgd")


def sampled_gpu_hours(milli: list[float], step_s: float) -> float:
    """A sum over samples every `step_s` seconds of F(M) in milli-GPU, in GPU-hours."""
    return sum(milli) / 1000.0 * step_s / 3600.0


def bound_lines(
    results: list[InferenceResult], repacks: dict[tuple[str, int], list[Repacking]], step: float
) -> list[str]:
    lines = []
    for r in results:
        rp = repacks.get((r.policy, r.seed))
        if rp is None:
            continue
        own = sampled_gpu_hours([x.own for x in rp], step)
        low = sampled_gpu_hours([x.lower for x in rp], step)
        best = sampled_gpu_hours([x.best for x in rp], step)
        lines.append(
            f"  seed {r.seed} {r.policy}: at the {len(rp)} sampled instants {own:.0f} GPU-h "
            f"stranded; the optimum repacking of what it ran then between {low:.0f} and "
            f"{best:.0f} GPU-h (the better of its own placement and the greedy repacking; "
            f"{sum(x.found is None for x in rp)} instants where the greedy one placed not all)"
        )
    return lines


def plot(
    results: list[InferenceResult],
    out: Path,
    repacks: dict[tuple[str, int], list[Repacking]] | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for policy, color in (("pyctl", "tab:blue"), ("fgd", "tab:orange")):
        rs = [r for r in results if r.policy == policy]
        if not rs:
            continue
        r = rs[0]
        days = [s["t"] / 86400.0 for s in r.raw["samples"]]
        a1.plot(
            days, [s["frag_milli"] / 1000.0 for s in r.raw["samples"]], color=color, label=policy
        )
        a2.plot(days, [s["pending"] for s in r.raw["samples"]], color=color, label=policy)
        rp = (repacks or {}).get((policy, r.seed))
        if rp is not None:
            a1.plot(
                days,
                [x.lower / 1000.0 for x in rp],
                color=color,
                linestyle=":",
                label=f"{policy}'s running instances repacked: lower bound",
            )
    a1.set_ylabel("stranded GPUs (F(M))")
    a2.set_ylabel("waiting instances")
    a2.set_xlabel(
        f"day of the trace (seed {results[0].seed}, sampled every {SAMPLE_EVERY / 3600:g} h)"
    )
    a1.legend()
    a1.set_title("DLRM inference trace: pyctl against FGD")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("data_dir", help="the folder of disaggregated_DLRM_trace.csv")
    ap.add_argument("--seeds", type=_seeds, default=list(SEEDS), help="default 42,43,44")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", help="write every run's figures and samples here")
    ap.add_argument("--plot", help="write pyctl against FGD over time (PNG) here")
    ap.add_argument(
        "--bound",
        action="store_true",
        help="bracket the optimum repacking at each sample of pyctl's and FGD's replays",
    )
    ap.add_argument(
        "--min-pod-age",
        type=float,
        default=0.0,
        help="pyctl: seconds a pod runs before it may be moved (the controller's "
        "evictor_min_pod_age_seconds; default 0)",
    )
    ap.add_argument("--budget", type=float, default=1.0, help="pyctl: %% evicted per day")
    ap.add_argument(
        "--headroom", type=float, default=5.0, help="%% of the peak the inventory adds (default 5)"
    )
    args = ap.parse_args()
    try:
        trace = load(args.data_dir)
    except InferenceTraceError as e:
        print(f"inference_replay: {e}", file=sys.stderr)
        return 2
    inv = Inventory(headroom=args.headroom / 100.0)
    peaks = trace.peaks(inv)
    print(
        f"trace: {trace.count} GPU instances replayed, {trace.cpu_instances} CPU-node instances "
        f"left out, {len(trace.skipped)} rows unreadable; {trace.end / 86400:.1f} days; "
        f"peak {peaks['num_gpu']} GPUs, {peaks['cpu_milli'] / 1000:.0f} vCPU, "
        f"{peaks['memory_mib'] / 1024:.0f} GiB, {peaks['rdma']}% RDMA; inventory "
        f"{inv.node_count(peaks)} nodes x {inv.gpus} GPUs, {inv.cpu} vCPU, {inv.memory_gib} GiB, "
        f"{inv.rnics} RNICs ({inv.headroom:.0%} headroom)"
    )
    big = trace.oversized(inv)
    if big:
        print(f"  {len(big)} instance(s) larger than a node (they wait until they leave)")
    for row, why in trace.skipped[:5]:
        print(f"  row {row} left out: {why}")
    from pyctl.replay.inference import Compaction

    comp = Compaction(budget_per_day=args.budget / 100.0, min_pod_age=args.min_pod_age)
    results: list[InferenceResult] = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        for p in args.policies.split(","):
            log = args.bound and p in BOUNDED
            r = replay(trace, p, seed, inventory=inv, compaction=comp, log=log)
            results.append(r)
            print(
                f"  seed {seed} {p}: stranded {r.stranded_gpu_hours:.0f} GPU-h, pending "
                f"{r.pending_hours:.1f} inst.-h, evictions {r.raw['evictions']} "
                f"({r.seconds:.1f} s)",
                flush=True,
            )
    print(f"total {time.perf_counter() - t0:.0f} s")
    print("\n".join(table(results)))
    repacks: dict[tuple[str, int], list[Repacking]] = {}
    if args.bound:
        t1 = time.perf_counter()
        for r in results:
            if r.policy in BOUNDED:
                repacks[r.policy, r.seed] = repack_at_samples(trace, r, inv)
        print(f"the optimum repacking at each sample ({time.perf_counter() - t1:.0f} s):")
        print("\n".join(bound_lines(results, repacks, SAMPLE_EVERY)))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                [
                    {
                        "policy": r.policy,
                        "seed": r.seed,
                        "seconds": r.seconds,
                        **{attr: getattr(r, attr) for _, attr, _ in FIGURES},
                        "raw": {k: v for k, v in r.raw.items() if k != "log"},
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    if args.plot:
        plot(results, Path(args.plot), repacks)
    print(summary_line(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
