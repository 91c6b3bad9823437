"""The plot of one `bench/soak.py --json F` run: per replica its RSS and work queue depth, Redis'
memory, and the leader's freshness (per sample window: the p99 of the watch event to the cache,
`pyctl_event_to_state_seconds`, and of a node's model and score, `pyctl_reconcile_duration_seconds`,
from their buckets), with the faults as grey lines.

    python bench/soak_plot.py REPORT.json OUT.png
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def plot(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: list[dict[str, Any]] = report["series"]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    rss, queue, redis, fresh = axes
    for name in sorted({s["replica"] for s in series}):
        # a line per life of the replica (a kill breaks it)
        for life in sorted({s["life"] for s in series if s["replica"] == name}):
            rows = [s for s in series if s["replica"] == name and s["life"] == life]
            t = [s["t"] / 60 for s in rows if "rss_mib" in s]
            color = "C0" if name.endswith("a") else "C1"
            label = name if life == 1 else None
            rss.plot(t, [s["rss_mib"] for s in rows if "rss_mib" in s], color=color, label=label)
            q = [(s["t"] / 60, s["queue"]) for s in rows if s.get("queue") is not None]
            queue.plot([x for x, _ in q], [y for _, y in q], color=color, label=label)
    # one point per sample (each replica's row repeats it)
    red = sorted(
        {s["t"] / 60: s["redis_mib"] for s in series if not math.isnan(s["redis_mib"])}.items()
    )
    redis.plot([t for t, _ in red], [m for _, m in red], color="C2")
    lag = [(s["t"] / 60, s["lag_p99_ms"]) for s in series if s.get("lag_p99_ms") is not None]
    rec = [(s["t"] / 60, s["reconcile_p99_ms"]) for s in series if "reconcile_p99_ms" in s]
    fresh.plot([t for t, _ in lag], [v for _, v in lag], color="C3", label="event to state")
    fresh.plot([t for t, _ in rec], [v for _, v in rec], color="C4", label="reconcile")
    fresh.axhline(1000, color="k", linestyle=":", linewidth=1, label="1 s")
    fresh.set_yscale("log")
    for ax in axes:
        for t, _kind, _what in report["fault_log"]:
            ax.axvline(t / 60, color="0.85", linewidth=0.8, zorder=0)
    rss.set_ylabel("RSS (MiB)")
    queue.set_ylabel("work queue depth")
    redis.set_ylabel("Redis used (MiB)")
    fresh.set_ylabel("leader p99 per window (ms)")
    rss.legend(loc="lower right")
    fresh.legend(loc="upper right", fontsize="small")
    fresh.set_xlabel(f"minutes (grey lines: the {len(report['fault_log'])} faults)")
    rss.set_title(
        f"bench/soak.py --nodes {report['nodes']} --duration {round(report['duration'], -1):.0f}"
        f" --seed {report['seed']}"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=80)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="the run's --json report")
    ap.add_argument("out", type=Path, help="the PNG to write")
    args = ap.parse_args()
    plot(json.loads(args.report.read_text()), args.out)
    print(f"soak_plot: {args.out}")


if __name__ == "__main__":
    main()
