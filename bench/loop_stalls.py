"""How long an event loop waits while compaction planning rounds run beside it, as they do in
the controller: `Compactor._plan` (the cycle collector paused, `collector_paused`, then
`plan_compaction`) back to back in a worker thread on the synthetic cluster of
`bench/compaction_round.py`, while the loop sleeps 2 ms again and again and records how late
each wake-up is. The same run is made with the rounds calling `plan_compaction` without the
pause, and the two are printed with their ratio, together with the cycle collections of each
generation that happened (count, longest, total).

A late wake-up is time the loop could not run: the GIL was held by the round's thread (Python
hands it over every switch interval, 1 ms as the extender's server sets it, but not in the
middle of a C call such as a full collection over everything the process holds).

    python bench/loop_stalls.py [--nodes 5000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from _common import REPO  # noqa: F401  (puts the repository on sys.path)
from compaction_round import round_inputs

from pyctl.workflows.compaction import RoundCache, plan_compaction
from pyctl.workflows.loop import collector_paused


class Collections:
    """Every cycle collection's duration, by generation."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((int(info["generation"]), time.perf_counter() - self._t0))


async def measure(round_: Callable[[], None], seconds: float) -> tuple[list[float], int]:
    """Wake-up delays (s) of a loop sleeping 2 ms, while `round_` runs again and again in a
    worker thread; and how many rounds ran."""
    rounds = 0

    async def planner() -> None:
        nonlocal rounds
        while True:
            await anyio.to_thread.run_sync(round_)
            rounds += 1

    task = asyncio.create_task(planner())
    lags: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        await asyncio.sleep(0.002)
        lags.append(time.perf_counter() - t0 - 0.002)
    task.cancel()
    lags.sort()
    return lags, rounds


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args(argv)
    models, nodes, pods, pending, pdbs, workload = round_inputs(args.nodes, 1)
    kept = RoundCache()

    def plan() -> None:
        plan_compaction(models, nodes, pods + pending, pdbs, workload, pending, round_cache=kept)

    def paused() -> None:
        with collector_paused():
            plan()

    plan()  # the first round fills the per-round cache, as a controller's first round does
    sys.setswitchinterval(0.001)  # as the extender's server sets it
    results: dict[str, tuple[list[float], int, Collections]] = {}
    for name, round_ in (("without the pause", plan), ("collector paused", paused)):
        gc.collect()
        seen = Collections()
        gc.callbacks.append(seen)
        try:
            lags, rounds = asyncio.run(measure(round_, args.seconds))
        finally:
            gc.callbacks.remove(seen)
        results[name] = (lags, rounds, seen)
        n = len(lags)
        per_gen = "; ".join(
            f"gen{g} {len(ps)} (longest {max(ps, default=0) * 1000:.0f} ms, "
            f"total {sum(ps) * 1000:.0f} ms)"
            for g in range(3)
            for ps in [[p for gg, p in seen.pauses if gg == g]]
        )
        print(
            f"{name}: {rounds} rounds in {args.seconds:.0f} s; loop wake-up delay p50 "
            f"{lags[n // 2] * 1000:.2f} ms, p99 {lags[int(n * 0.99)] * 1000:.2f} ms, longest "
            f"{lags[-1] * 1000:.1f} ms; collections: {per_gen}"
        )
    a, b = results["without the pause"][0], results["collector paused"][0]
    print(
        f"loop stalls: {args.nodes} nodes, longest wait {a[-1] * 1000:.0f} ms without the "
        f"pause, {b[-1] * 1000:.0f} ms with it ({a[-1] / b[-1]:.1f}x shorter); p99 "
        f"{a[int(len(a) * 0.99)] * 1000:.1f} -> {b[int(len(b) * 0.99)] * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
