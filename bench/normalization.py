"""Resource normalization on the openb traces: GPU-share requests rounded up to the menu
`pyctl recommend` chooses for the trace (shares on a grid of tenths, the fewest sizes within one
point of the best demand served at 100% of capacity), against the requests as they are.

Per trace (default, and the variants gpushare40 and gpushare100) and policy (pyctl, FGD), per
seed: both traces replay in the same arrival order (what a normal replay of the original draws:
resampled to 1.3x capacity, shuffled by the seed); at 100% arrived (the arrivals until the
original requests reach the GPU capacity): demand served (the original requests of the placed
tasks), unallocated GPU and the rounding waste of the placed tasks, % of the GPU capacity, median
over the seeds. `pyctl.recommend.evaluate` holds the method.

Usage: python bench/normalization.py TRACE_DIR [--seeds N] [--workloads a,b,c] [--policies p,q]
Last line: `normalization: served normalized/as requested <r> (default) <r> (gpushare40) <r>
(gpushare100); unallocated <a>% -> <b>% ...` for the first policy; benches never assert.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import REPO

from pyctl.recommend.evaluate import replay_normalized, trace_tradeoff
from pyctl.replay.trace import TraceError, load_trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace_dir")
    ap.add_argument("--seeds", type=int, default=3, help="seeds from 42 (default 3)")
    ap.add_argument("--workloads", default="default,gpushare40,gpushare100")
    ap.add_argument("--policies", default="pyctl,fgd")
    args = ap.parse_args()
    seeds = list(range(42, 42 + args.seeds))
    policies = [p for p in args.policies.split(",") if p]
    last: list[str] = []
    t_start = time.perf_counter()
    print(f"repo {REPO.name}; seeds {seeds[0]}..{seeds[-1]}; policies {', '.join(policies)}")
    for w in [w for w in args.workloads.split(",") if w]:
        try:
            trace = load_trace(args.trace_dir, w)
        except TraceError as e:
            print(f"normalization: {e}", file=sys.stderr)
            return 2
        t = trace_tradeoff(trace)
        rec = t.recommended
        assert rec is not None
        menu = list(rec.menu or ())
        print(
            f"\n== {w}: {trace.task_count} tasks, {trace.gpu_count} GPUs; menu chosen "
            f"(k={len(menu)}): {', '.join(menu)}"
        )
        print("  offline packing at 100% (the menu objective): k, served %, waste %, unallocated %")
        b = t.baseline
        print(f"    as requested  {b.served_pct:6.2f} {b.waste_pct:6.2f} {b.unallocated_pct:6.2f}")
        for k, r in enumerate(t.rows, 1):
            print(
                f"    k={k} {', '.join(r.menu or ()):<38} {r.served_pct:6.2f} "
                f"{r.waste_pct:6.2f} {r.unallocated_pct:6.2f}"
            )
        print("  replay at 100% arrived (median of seeds): served %, unallocated %, waste %")
        for i, policy in enumerate(policies):
            pairs = [replay_normalized(trace, menu, policy, s) for s in seeds]
            base = [p[0] for p in pairs]
            norm = [p[1] for p in pairs]

            def med(rs: list, attr: str) -> float:  # type: ignore[type-arg]
                return statistics.median(getattr(r, attr) for r in rs)

            sb, sn = med(base, "served_pct"), med(norm, "served_pct")
            ub, un = med(base, "unallocated_pct"), med(norm, "unallocated_pct")
            wn = med(norm, "waste_pct")
            print(
                f"    {policy:<6} as requested {sb:6.2f} {ub:6.2f}   0.00 | normalized "
                f"{sn:6.2f} {un:6.2f} {wn:6.2f} | failed tasks {med(base, 'failed'):.0f} -> "
                f"{med(norm, 'failed'):.0f}"
            )
            if i == 0:
                last.append(
                    f"{sn / sb:.3f} ({w}; unallocated {ub:.2f}% -> {un:.2f}%, waste {wn:.2f}%)"
                )
    print(f"\n{time.perf_counter() - t_start:.0f} s")
    print(f"normalization: served normalized/as requested, {policies[0]}: " + "; ".join(last))
    return 0


if __name__ == "__main__":
    sys.exit(main())
