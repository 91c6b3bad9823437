"""FGD paper reproduction: replay the Alibaba 2023 default trace (1213 nodes, 6212 GPUs, tasks
resampled to 1.3x GPU capacity, arrival only, no retries) under the artifact's six policies and
pyctl's (FGD-style placement plus compaction within a 2% eviction budget), one run per policy and
seed, seeds 42..51. Reports the median unallocated GPU % at arrived = 100% of capacity and the
fragmentation rate at 90%, beside the published medians (fgd-atc23-expected-results).

Usage: python bench/fgd_replay.py TRACE_DIR [--seeds N] [--workload NAME] [--every K]
Last line: `fgd_replay: unallocated GPU at 100% arrived: pyctl <A>%, FGD <B>%, BestFit <C>%
(median of N seeds), <E>% of pods evicted, <T> s per run`.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import REPO  # noqa: F401  (puts the repository on sys.path)

from pyctl.cluster.sim.trace import Compaction, TraceError, load_trace, median, replay

PAPER = {  # default trace, median unallocated GPU % at 100% arrived; frag rate % at 90%
    "random": (13.75, 96.7),
    "dotprod": (9.44, 94.4),
    "clustering": (8.42, 84.5),
    "packing": (8.19, 83.4),
    "bestfit": (7.09, 73.6),
    "fgd": (4.77, 49.9),
}
ORDER = ["random", "dotprod", "clustering", "packing", "bestfit", "fgd", "pyctl"]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace_dir")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds from 42 (default 10)")
    ap.add_argument("--workload", default="default")
    ap.add_argument("--every", type=int, default=20, help="pyctl compaction every K arrivals")
    ap.add_argument("--budget", type=float, default=2.0, help="pyctl eviction budget, %% of pods")
    args = ap.parse_args(argv)
    try:
        trace = load_trace(args.trace_dir, args.workload)
    except TraceError as e:
        print(f"fgd_replay: {e}", file=sys.stderr)
        return 2
    seeds = list(range(42, 42 + args.seeds))
    comp = Compaction(every=args.every, budget=args.budget / 100.0, max_moves=20)
    print(
        f"trace {args.workload}: {trace.node_count} nodes, {trace.gpu_count} GPUs, "
        f"{trace.task_count} tasks, M = {len(trace.workload.shapes)} shapes; seeds {seeds[0]}.."
        f"{seeds[-1]}; one core"
    )
    med: dict[str, tuple[float, float, float, float]] = {}
    all_times: list[float] = []
    for p in ORDER:
        rs = []
        for s in seeds:
            t0 = time.process_time()
            rs.append(replay(trace, p, s, compaction=comp if p == "pyctl" else None))
            all_times.append(time.process_time() - t0)
        u = median(r.unallocated_pct(100) for r in rs)
        fr = median(r.frag_rate(90) for r in rs)
        ev = median(r.evicted_pct() for r in rs)
        t = median(r.seconds for r in rs)
        med[p] = (u, fr, ev, t)
        ref = PAPER.get(p)
        paper = (
            f" (paper {ref[0]:.2f}%, {ref[1]:.1f}%)" if ref and args.workload == "default" else ""
        )
        us = [r.unallocated_pct(100) for r in rs]
        spread = f"{min(us):.2f}..{max(us):.2f}"
        extra = f", {ev:.2f}% of pods evicted" if p == "pyctl" else ""
        print(
            f"{p:10s} unallocated GPU @100%: {u:5.2f}% [{spread}], frag rate @90%: {fr:5.1f}%"
            f"{paper}{extra}, {t:.2f} s/run"
        )
    per_run = max(all_times)
    print(
        f"fgd_replay: unallocated GPU at 100% arrived: pyctl {med['pyctl'][0]:.2f}%, "
        f"FGD {med['fgd'][0]:.2f}%, BestFit {med['bestfit'][0]:.2f}% "
        f"(median of {len(seeds)} seeds), "
        f"{med['pyctl'][2]:.2f}% of pods evicted, {per_run:.2f} s per run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
