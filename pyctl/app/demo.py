"""The demo: the built-in simulated cluster played twice on the same scenario (same seed, same
arrivals), once with pyctl observing and once with it enforcing, and what differs.

Each run is the product as `pyctl run` builds it (`build_sim`: the controller in lockstep with the
cluster's virtual time, its configured safety limits on the virtual clock), measured on the
cluster's own state (`pyctl.cluster.sim.record`), with what the controller did (or in observe mode
would have done) taken from its gate, its metrics and its scheduler extender."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any

from pyctl.app.config import Config
from pyctl.app.run import SimRun, build_sim
from pyctl.cluster.sim.record import RunStats
from pyctl.workflows import mig_reconfig, rescue
from pyctl.workflows.compaction import REASON as COMPACTION_REASON

#: the gate's eviction reasons (Event reasons) in words
REASONS = {
    COMPACTION_REASON: "defragmentation",
    rescue.REASON: "rescue",
    mig_reconfig.REASON: "MIG drain",
}


@dataclass(frozen=True)
class Actions:
    """What the controller did (enforce) or would have done (observe: dry runs)."""

    #: evictions made, by reason
    evicted: dict[str, int]
    #: evictions observe mode would have made, by reason
    dry_run: dict[str, int]
    #: rescues of pending pods by outcome (done, abandoned)
    rescues: dict[str, int]
    #: finished MIG reconfigurations by result (succeeded, failed, rolled_back)
    mig: dict[str, int]
    #: scheduler extender answers that preferred a node / removed one
    advised: int
    filtered: int

    @property
    def evictions(self) -> int:
        return sum(self.evicted.values())


@dataclass(frozen=True)
class DemoRun:
    mode: str
    seed: int
    stats: RunStats
    actions: Actions
    wall_seconds: float


def _counts(counter: Any, label: str) -> dict[str, int]:
    """A prometheus Counter's totals by one label."""
    out: dict[str, int] = {}
    for metric in counter.collect():
        for s in metric.samples:
            if s.name.endswith("_total"):
                k = s.labels[label]
                out[k] = out.get(k, 0) + int(s.value)
    return {k: v for k, v in out.items() if v}


def actions_of(sim: SimRun) -> Actions:
    gate = sim.workflows.gate
    w = sim.controller.metrics.workflow

    def by(outcome: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for (o, reason), n in gate.evictions.items():
            if o == outcome:
                k = REASONS.get(reason, reason)
                out[k] = out.get(k, 0) + n
        return out

    adv = sim.advisor
    return Actions(
        evicted=by("evicted"),
        dry_run=by("dry-run"),
        rescues=_counts(w.rescues, "outcome"),
        mig=_counts(w.mig_reconfigurations, "result"),
        advised=adv.advised if adv is not None else 0,
        filtered=adv.filtered if adv is not None else 0,
    )


async def play(cfg: Config, mode: str) -> DemoRun:
    """One run of the built-in scenario in `mode`."""
    run_cfg = replace(cfg, mode=mode)
    sim = build_sim(run_cfg)
    t0 = time.monotonic()
    await sim.run()
    return DemoRun(
        mode,
        cfg.sim.seed,
        sim.source.recorder.stats(),
        actions_of(sim),
        time.monotonic() - t0,
    )


def _words(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def describe(a: Actions, mode: str) -> str:
    """What pyctl did in a run, in a sentence."""
    if mode == "observe":
        return (
            f"Observing, pyctl changed nothing; its rounds made {sum(a.dry_run.values())} "
            f"dry-run evictions ({_words(a.dry_run)}; a pod proposed again in a later round "
            "counts again)."
        )
    mig_ok = a.mig.get("succeeded", 0)
    mig_back = a.mig.get("rolled_back", 0) + a.mig.get("failed", 0)
    return (
        f"Enforcing, pyctl evicted {a.evictions} replicas ({_words(a.evicted)}), "
        f"re-partitioned {mig_ok} MIG nodes ({mig_back} rolled back or failed), "
        f"rescued {a.rescues.get('done', 0)} pending replicas "
        f"({a.rescues.get('abandoned', 0)} rescues abandoned), and as the scheduler's extender "
        f"preferred a node for {a.advised} placements and removed nodes for {a.filtered}."
    )


# ---- the comparison ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One row of the comparison: `better` is +1 where more is better, -1 where less is, 0 for
    what is a cost or a count of actions (no direction); `integer` for counts."""

    label: str
    observe: float
    enforce: float
    better: int = 0
    integer: bool = False

    @property
    def verdict(self) -> bool | None:
        """Whether enforce is better (None: equal, or no direction)."""
        if self.better == 0 or abs(self.enforce - self.observe) < 1e-9:
            return None
        return (self.enforce - self.observe) * self.better > 0


def _figures(r: DemoRun) -> list[Figure]:
    """A run's figures (`observe` holds the value; `compare` pairs two runs)."""
    s, a = r.stats, r.actions

    def f(label: str, v: float, better: int = 0, integer: bool = False) -> Figure:
        return Figure(label, v, v, better, integer)

    out = [
        f("replicas served", s.served, +1, True),
        f("replica-hours pending", s.pending_hours, -1),
        f("  of which blocked by fragmentation", s.blocked_total_hours, -1),
    ]
    for c, h in sorted(s.blocked_hours.items()):
        out.append(f(f"    {c}", h, -1))
    out += [
        f("GPU-hours stranded", s.stranded_gpu_hours, -1),
        f("MIG slice-hours stranded", s.stranded_mig_slice_hours, -1),
        f("fragmentation rate, mean %", 100 * s.mean_fragmentation_rate, -1),
        f("scheduling success, mean %", 100 * s.success_mean, +1),
        f("scheduling success, worst 30 min %", 100 * s.success_worst, +1),
        f("evictions", a.evictions, 0, True),
        f("MIG re-partitions applied", a.mig.get(mig_reconfig.SUCCEEDED, 0), 0, True),
        f(
            "MIG re-partitions rolled back/failed",
            a.mig.get(mig_reconfig.ROLLED_BACK, 0) + a.mig.get(mig_reconfig.FAILED, 0),
            0,
            True,
        ),
        f("rescues of pending replicas", a.rescues.get("done", 0), 0, True),
    ]
    return out


def compare(observe: list[DemoRun], enforce: list[DemoRun]) -> list[Figure]:
    """Side by side: each figure's median over the runs (one per seed) of both modes."""
    obs = [{x.label: x for x in _figures(r)} for r in observe]
    enf = [{x.label: x for x in _figures(r)} for r in enforce]
    proto: dict[str, Figure] = {}
    for figs in obs + enf:
        for k, x in figs.items():
            proto.setdefault(k, x)
    # the blocked categories (indented) under their heading, by name
    cats = sorted(k for k in proto if k.startswith("    "))
    head = [k for k in proto if not k.startswith("    ")]
    at = head.index("  of which blocked by fragmentation") + 1
    rows = []
    for k in head[:at] + cats + head[at:]:
        x = proto[k]
        o = median(f[k].observe if k in f else 0.0 for f in obs)
        e = median(f[k].observe if k in f else 0.0 for f in enf)
        # as shown: counts whole, the rest to a tenth (a difference below that is no difference)
        digits = 0 if x.integer else 1
        rows.append(Figure(k, round(o, digits), round(e, digits), x.better, x.integer))
    return rows


def plot(observe: DemoRun, enforce: DemoRun, path: Path) -> str | None:
    """The fragmentation rate and the pending replicas over virtual time for both runs, as a
    PNG; None if matplotlib is not installed (else the path written)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r, color in ((observe, "tab:red"), (enforce, "tab:blue")):
        pts = r.stats.points
        ts = [p.t / 3600 for p in pts]
        top.step(
            ts,
            [100 * p.fragmentation_rate for p in pts],
            where="post",
            color=color,
            lw=0.9,
            label=f"{r.mode} (mean {100 * r.stats.mean_fragmentation_rate:.1f}%)",
        )
        bottom.step(
            ts,
            [p.pending for p in pts],
            where="post",
            color=color,
            lw=0.9,
            label=f"{r.mode} ({r.stats.pending_hours:.1f} replica-hours)",
        )
    top.set_ylabel("fragmentation rate (%)\nstranded / idle GPU")
    bottom.set_ylabel("pending replicas")
    bottom.set_xlabel("simulated hours")
    top.legend(loc="upper right", fontsize=8)
    bottom.legend(loc="upper right", fontsize=8)
    top.set_title(f"pyctl demo: the built-in scenario, seed {observe.seed}, observe vs enforce")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
