"""`pyctl demo`: the main job on its embedded default. The built-in simulated cluster's scenario
is played twice on the same arrivals, pyctl observing and then enforcing (`pyctl.app.demo`), and
the two runs are set side by side: replicas served, replica-hours pending and blocked by
fragmentation, GPU-hours stranded, scheduling success, and what pyctl did. A plot of the
fragmentation rate and the pending replicas over time is written beside the table."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path

import anyio
from rich.console import Console
from rich.table import Table

from pyctl.app.config import Config, ConfigError, load_config
from pyctl.app.demo import DemoRun, Figure, compare, describe, play, plot
from pyctl.cli.errors import UserError
from pyctl.jsontypes import JsonObject
from pyctl.log import setup_logging


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo", help="the built-in simulated cluster, observe against enforce, side by side"
    )
    p.add_argument("--config", help="configuration file (YAML or JSON)")
    p.add_argument("--seed", type=int, help="the scenario's seed (default: the configured one)")
    p.add_argument("--seeds", type=int, default=1, help="play this many seeds; medians shown")
    p.add_argument("--out", default="pyctl-demo", help="where the table and the plot go")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.seeds <= 100:
        raise UserError("--seeds must be 1..100")
    flags: dict[str, int | bool] = {"sim_speed": 0, "sim_forever": False}
    if args.seed is not None:
        flags["sim_seed"] = args.seed
    try:
        cfg = load_config(args.config, os.environ, flags)
    except ConfigError as e:
        raise UserError(str(e)) from None
    setup_logging(cfg.log.format, "warning")
    console = Console(stderr=args.json)
    observe, enforce = anyio.run(_play_all, cfg, args.seeds, console)
    return _report(cfg, args, console, observe, enforce)


async def _play_all(
    cfg: Config, seeds: int, console: Console
) -> tuple[list[DemoRun], list[DemoRun]]:
    observe: list[DemoRun] = []
    enforce: list[DemoRun] = []
    for k in range(seeds):
        seed_cfg = replace(cfg, sim=replace(cfg.sim, seed=cfg.sim.seed + k))
        for mode, runs in (("observe", observe), ("enforce", enforce)):
            r = await play(seed_cfg, mode)
            runs.append(r)
            console.print(
                f"seed {r.seed} {mode}: {r.stats.duration_hours:.0f} simulated hours in "
                f"{r.wall_seconds:.1f} s; {r.stats.served}/{r.stats.arrived} replicas served, "
                f"{r.stats.pending_hours:.1f} replica-hours pending, "
                f"{r.actions.evictions} evictions"
            )
    return observe, enforce


def _report(
    cfg: Config,
    args: argparse.Namespace,
    console: Console,
    observe: list[DemoRun],
    enforce: list[DemoRun],
) -> int:
    rows = compare(observe, enforce)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(observe[0], enforce[0], out / "demo.png")
    md = _markdown(rows, observe, enforce, cfg)
    (out / "summary.md").write_text(md)
    if args.json:
        print(json.dumps(_json(rows, observe, enforce), indent=1))
        return 0
    _print(console, rows, observe, enforce)
    console.print(
        f"Table: {out / 'summary.md'}; plot: {png}"
        if png
        else f"Table: {out / 'summary.md'}; no plot (matplotlib is not installed: "
        "pip install 'pyctl[plots]')"
    )
    return 0


def _num(x: Figure, v: float) -> str:
    return f"{v:.0f}" if x.integer else f"{v:.1f}"


def _change(x: Figure) -> str:
    d = x.enforce - x.observe
    if abs(d) < 1e-9:
        return "="
    rel = f" ({d / x.observe:+.0%})" if abs(x.observe) > 1e-9 else ""
    return f"{'+' if d > 0 else '-'}{_num(x, abs(d))}{rel}"


def _mark(x: Figure, rich: bool) -> str:
    v = x.verdict
    if x.better == 0:
        return ""
    if v is None:
        return "same"
    if rich:
        return "[green]better[/]" if v else "[red]worse[/]"
    return "better" if v else "worse"


def _title(observe: list[DemoRun]) -> str:
    seeds = sorted({r.seed for r in observe})
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"median of seeds {seeds[0]}..{seeds[-1]}"
    return f"pyctl demo: observe against enforce on the built-in scenario ({which})"


def _print(
    console: Console,
    rows: list[Figure],
    observe: list[DemoRun],
    enforce: list[DemoRun],
) -> None:
    t = Table(title=_title(observe))
    for col in ("", "observe", "enforce", "enforce - observe", ""):
        t.add_column(col, justify="right" if col else "left")
    for x in rows:
        t.add_row(x.label, _num(x, x.observe), _num(x, x.enforce), _change(x), _mark(x, rich=True))
    console.print(t)
    for line in _what_pyctl_did(observe, enforce):
        console.print(line)


def _what_pyctl_did(observe: list[DemoRun], enforce: list[DemoRun]) -> list[str]:
    out = []
    for o, e in zip(observe, enforce, strict=True):
        head = f"Seed {e.seed}: " if len(enforce) > 1 else ""
        out += [head + describe(e.actions, "enforce"), head + describe(o.actions, "observe")]
    return out


def _markdown(
    rows: list[Figure],
    observe: list[DemoRun],
    enforce: list[DemoRun],
    cfg: Config,
) -> str:
    lines = [
        f"# {_title(observe)}",
        "",
        "Generated by `pyctl demo"
        + (f" --seeds {len(observe)}" if len(observe) > 1 else "")
        + f"` (scenario seed {observe[0].seed}; compaction and MIG rounds every "
        f"{cfg.workflow.interval:g} simulated seconds, the configured safety limits).",
        "",
        "| | observe | enforce | enforce - observe | |",
        "|---|---:|---:|---:|---|",
    ]
    for x in rows:
        label = x.label.replace("  ", "&nbsp;&nbsp;")
        lines.append(
            f"| {label} | {_num(x, x.observe)} | {_num(x, x.enforce)} | {_change(x)} "
            f"| {_mark(x, rich=False)} |"
        )
    for line in _what_pyctl_did(observe, enforce):
        lines += ["", line]
    lines.append("")
    return "\n".join(lines)


def _json(rows: list[Figure], observe: list[DemoRun], enforce: list[DemoRun]) -> JsonObject:
    def run(r: DemoRun) -> JsonObject:
        s, a = r.stats, r.actions
        return {
            "seed": r.seed,
            "mode": r.mode,
            "arrived": s.arrived,
            "served": s.served,
            "pending_hours": s.pending_hours,
            "blocked_hours": dict(s.blocked_hours),
            "stranded_gpu_hours": s.stranded_gpu_hours,
            "stranded_mig_slice_hours": s.stranded_mig_slice_hours,
            "mean_fragmentation_rate": s.mean_fragmentation_rate,
            "success_mean": s.success_mean,
            "success_worst": s.success_worst,
            "evicted": dict(a.evicted),
            "dry_run": dict(a.dry_run),
            "rescues": dict(a.rescues),
            "mig": dict(a.mig),
            "advised": a.advised,
            "filtered": a.filtered,
        }

    return {
        "figures": [
            {
                "figure": x.label.strip(),
                "observe": x.observe,
                "enforce": x.enforce,
                "enforce_better": x.verdict,
            }
            for x in rows
        ],
        "runs": [run(r) for r in observe + enforce],
    }
