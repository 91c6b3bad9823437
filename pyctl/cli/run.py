"""`pyctl run`: the controller. With no cluster configured it plays the built-in simulated
cluster with the in-memory store (about a minute, with a live view, then a summary); with a
kubeconfig or in-cluster it follows the real cluster until stopped. This module parses arguments
and presents; the application is built by `pyctl.app`."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import anyio
from rich.console import Console
from rich.live import Live

from pyctl.app.config import Config, ConfigError, load_config
from pyctl.app.demo import actions_of, describe
from pyctl.app.run import SimRun, build_sim, run_kube
from pyctl.cli.errors import UserError, load_json
from pyctl.cli.live import render
from pyctl.log import setup_logging
from pyctl.model import Workload
from pyctl.snapshot import load_workload

#: flags of `pyctl run`, by setting name (pyctl/app/config.py)
_FLAGS = (
    "cluster",
    "kubeconfig",
    "in_cluster",
    "redis_url",
    "mode",
    "metrics_port",
    "extender_port",
    "workload_file",
    "sim_forever",
    "sim_speed",
    "sim_seed",
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run the controller (default: the built-in simulated cluster)")
    p.add_argument("--config", help="configuration file (YAML or JSON)")
    p.add_argument("--cluster", help="cluster name")
    p.add_argument("--kubeconfig", help="follow the cluster of this kubeconfig")
    p.add_argument(
        "--in-cluster", action="store_const", const=True, help="follow the cluster pyctl runs in"
    )
    p.add_argument("--redis", dest="redis_url", help="redis://host:port (default: in-memory state)")
    p.add_argument("--mode", choices=["observe", "enforce"])
    p.add_argument(
        "--metrics-port", type=int, help="serve /metrics, /healthz, /readyz on this port"
    )
    p.add_argument("--extender-port", type=int, help="serve the scheduler extender on this port")
    p.add_argument(
        "--workload", dest="workload_file", help="workload JSON (default: derived from pods)"
    )
    p.add_argument(
        "--forever", dest="sim_forever", action="store_const", const=True, help="keep running"
    )
    p.add_argument(
        "--speed", dest="sim_speed", type=float, help="simulated seconds per second (0 = max)"
    )
    p.add_argument("--seed", dest="sim_seed", type=int, help="simulated scenario seed")
    p.add_argument("--no-live", action="store_true", help="no live view (logs only)")
    p.set_defaults(handler=run)


def config_from_args(args: argparse.Namespace) -> Config:
    flags: dict[str, str | int | float | bool | None] = {k: getattr(args, k, None) for k in _FLAGS}
    if args.kubeconfig or args.in_cluster:
        flags["source"] = "kube"
    try:
        return load_config(args.config, os.environ, flags)
    except ConfigError as e:
        raise UserError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    workload: Workload | None = (
        load_workload(load_json(cfg.workload.file)) if cfg.workload.file else None
    )
    live = not args.no_live and cfg.source == "sim"
    setup_logging(cfg.log.format, "warning" if live else cfg.log.level)
    if cfg.source == "kube":
        if not (cfg.kubeconfig or cfg.in_cluster):
            raise UserError("source kube needs --kubeconfig PATH or --in-cluster")
        try:
            return anyio.run(run_kube, cfg, workload)
        except KeyboardInterrupt:
            return 0
    return anyio.run(_run_sim, cfg, workload, live)


async def _run_sim(cfg: Config, workload: Workload | None, live: bool) -> int:
    console = Console()
    sim = build_sim(cfg, workload)
    ctl, source, scenario = sim.controller, sim.source, sim.scenario
    t0 = time.monotonic()
    last_events = [0, t0]
    rate = [0.0]

    def view() -> Any:
        now = time.monotonic()
        if now - last_events[1] >= 0.5:
            rate[0] = (ctl.stats.events - last_events[0]) / (now - last_events[1])
            last_events[0], last_events[1] = ctl.stats.events, now
        return render(ctl.last_summary, source.stats, scenario.duration, rate[0])

    if live:
        with Live(view(), console=console, refresh_per_second=4, transient=False) as lv:
            async with anyio.create_task_group() as tg:

                async def refresh() -> None:
                    while True:
                        lv.update(view())
                        await anyio.sleep(0.25)

                tg.start_soon(refresh)
                await sim.run()
                lv.update(view())
                tg.cancel_scope.cancel()
    else:
        await sim.run()
    _print_summary(console, sim, time.monotonic() - t0)
    return 0


def _print_summary(console: Console, sim: SimRun, wall: float) -> None:
    """The run in figures from the simulated cluster's own state, weighted by virtual time
    (`pyctl.cluster.sim.record`), and what pyctl did."""
    st, ctl, scenario = sim.source.recorder.stats(), sim.controller, sim.scenario
    blocked = ", ".join(f"{c} {h:.1f}" for c, h in sorted(st.blocked_hours.items()))
    console.print(
        f"\n[bold]Summary[/] of scenario {scenario.name!r}, seed {sim.cfg.sim.seed}, mode "
        f"{sim.cfg.mode} ({st.duration_hours:.0f} simulated hours in {wall:.1f} s; "
        f"{ctl.stats.events} watch events, {ctl.stats.reconciles} node reconciles): "
        f"{st.served} of {st.arrived} replicas served; {st.pending_hours:.1f} replica-hours "
        f"pending, {st.blocked_total_hours:.1f} of them blocked by fragmentation"
        + (f" ({blocked})" if blocked else "")
        + f"; {st.stranded_gpu_hours:.1f} GPU-hours stranded (fragmentation rate "
        f"{st.mean_fragmentation_rate:.1%} on average) and {st.stranded_mig_slice_hours:.1f} "
        f"MIG slice-hours; scheduling success on arrival {st.success_mean:.1%} "
        f"(worst 30 minutes {st.success_worst:.1%})."
    )
    console.print(describe(actions_of(sim), sim.cfg.mode))
    if sim.cfg.mode == "observe":
        console.print("`pyctl demo` plays this scenario observing and enforcing, side by side.")
