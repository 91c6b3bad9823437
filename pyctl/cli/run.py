"""`pyctl run`: the controller. With no cluster configured it plays the built-in simulated
cluster with the in-memory store (about a minute, with a live view, then a summary); with a
kubeconfig or in-cluster it follows the real cluster until stopped."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import anyio
from rich.console import Console
from rich.live import Live

from pyctl.cli.errors import UserError, load_json
from pyctl.cli.live import RunTracker, render
from pyctl.config import Config, ConfigError, load_config
from pyctl.controller.controller import Controller
from pyctl.controller.http import HealthServer
from pyctl.controller.reconcile import Summary
from pyctl.log import setup_logging
from pyctl.model import Workload
from pyctl.snapshot import load_workload
from pyctl.state.memory import MemoryStore
from pyctl.state.store import StateStore


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
    flags: dict[str, Any] = {
        k: getattr(args, k, None)
        for k in (
            "cluster",
            "kubeconfig",
            "in_cluster",
            "redis_url",
            "mode",
            "metrics_port",
            "workload_file",
            "sim_forever",
            "sim_speed",
            "sim_seed",
        )
    }
    if args.kubeconfig or args.in_cluster:
        flags["source"] = "kube"
    try:
        return load_config(args.config, os.environ, flags)
    except ConfigError as e:
        raise UserError(str(e)) from None


def make_store(cfg: Config) -> StateStore:
    if not cfg.redis_url:
        return MemoryStore(cfg.cluster)
    from pyctl.state.redis_client import RedisConfig
    from pyctl.state.redis_store import RedisStore

    return RedisStore(
        RedisConfig(
            url=cfg.redis_url, cluster=cfg.redis_cluster, password=cfg.redis_password or None
        ),
        cfg.cluster,
    )


def safety_limits(cfg: Config) -> Any:
    """The configured safety limits (`pyctl/config.py`, `limit_*` and friends)."""
    from pyctl.state.ratelimit import BucketLimit, SafetyLimits

    def bucket(burst: int, per_minute: float) -> BucketLimit:
        return BucketLimit(capacity=burst, per_second=per_minute / 60.0)

    return SafetyLimits(
        global_bucket=bucket(cfg.limit_global_burst, cfg.limit_global_per_minute),
        node_bucket=bucket(cfg.limit_node_burst, cfg.limit_node_per_minute),
        namespace_bucket=bucket(cfg.limit_namespace_burst, cfg.limit_namespace_per_minute),
        workload_bucket=bucket(cfg.limit_workload_burst, cfg.limit_workload_per_minute),
        node_cooldown_seconds=cfg.node_cooldown_seconds,
        mig_concurrency=cfg.mig_concurrency,
        disruptions_per_hour=cfg.disruptions_per_hour or None,
    )


def sim_limits() -> Any:
    """Limits for a simulated day played in about a minute: per wall second, not per hour."""
    from pyctl.state.ratelimit import BucketLimit, SafetyLimits

    return SafetyLimits(
        global_bucket=BucketLimit(capacity=5, per_second=2.0),
        node_bucket=BucketLimit(capacity=2, per_second=0.5),
        namespace_bucket=None,
        workload_bucket=BucketLimit(capacity=2, per_second=1.0),
        node_cooldown_seconds=0.0,
        disruptions_per_hour=None,
    )


def workflow_backends(cfg: Config) -> tuple[Any, Any]:
    """Where workflows and rate limits live: in the shared Redis when one is configured (so a
    restarted controller or a new leader resumes the workflows, and replicas and clusters
    sharing the Redis share the limits), else in memory."""
    if not cfg.redis_url:
        from pyctl.state.ratelimit import MemoryRateLimiter
        from pyctl.state.workflows import MemoryWorkflowStore

        return MemoryWorkflowStore(), MemoryRateLimiter()
    from pyctl.state.redis_client import RedisConfig, connect
    from pyctl.state.redis_ratelimit import RedisRateLimiter
    from pyctl.state.redis_workflows import RedisWorkflowStore

    rc = RedisConfig(
        url=cfg.redis_url, cluster=cfg.redis_cluster, password=cfg.redis_password or None
    )
    client = connect(rc)
    return RedisWorkflowStore(client, rc, cfg.cluster), RedisRateLimiter(client, rc, cfg.cluster)


def attach_workflows(
    ctl: Controller,
    cfg: Config,
    source: Any = None,
    actuator: Any = None,
    limits: Any = None,
    interval: float = 0.5,
) -> Any:
    """The compaction loop, with the gate in front of the actuator. On the simulated cluster in
    enforce mode evictions really happen there (and its scheduler takes pyctl's placement
    advice); in observe mode they are counted as dry runs."""
    from pyctl.cluster.sim.actuator import SimActuator
    from pyctl.cluster.source import NullActuator
    from pyctl.workflows.compactor import Compactor
    from pyctl.workflows.engine import Context, Engine
    from pyctl.workflows.gate import Gate

    enforce = cfg.mode == "enforce"
    if actuator is None:
        actuator = SimActuator(source) if enforce and source is not None else NullActuator()
    if enforce and source is not None and hasattr(source, "cluster"):
        source.cluster.advice = True
    limits = limits if limits is not None else sim_limits()
    workflows, limiter = workflow_backends(cfg)
    gate = Gate(cfg.mode, ctl.is_leader, limiter, limits, actuator, ctl.metrics, cfg.cluster)
    pods = ctl.cache.pods
    engine = Engine(
        workflows,
        Context(gate, lambda ns, name: pods.get(f"{ns}/{name}")),
        kinds=("compaction",),
    )
    compactor = Compactor(
        ctl.cache,
        ctl.reconciler,
        engine,
        ctl.metrics,
        cfg.cluster,
        cfg.mode,
        interval,
        max_moves=3,
        options=cfg.evictor_options(),
    )
    ctl.background.append(lambda: compactor.run(ctl.is_leader))
    # -- MIG reconfiguration (pyctl/workflows/mig_loop.py, mig_reconfig.py) ---------------------
    from pyctl.workflows.mig_loop import MigLoop, MigLoopOptions
    from pyctl.workflows.mig_reconfig import KIND as MIG_KIND
    from pyctl.workflows.mig_reconfig import MigContext, MigOptions

    mig_ctx = MigContext(
        gate,
        lambda ns, name: pods.get(f"{ns}/{name}"),
        node=ctl.cache.nodes.get,
        options=MigOptions(
            configmap_namespace=cfg.mig_configmap_namespace,
            configmap_name=cfg.mig_configmap_name,
            poll=interval,
        ),
    )
    holdoff = cfg.mig_node_holdoff_seconds
    mig_loop = MigLoop(
        ctl.cache,
        # finished records are kept at least as long as the hold-off reads them
        Engine(workflows, mig_ctx, kinds=(MIG_KIND,), retention_seconds=max(600.0, holdoff)),
        ctl.metrics,
        cfg.cluster,
        interval,
        options=MigLoopOptions(holdoff=holdoff),
    )
    ctl.background.append(lambda: mig_loop.run(ctl.is_leader))
    # -- end MIG reconfiguration ------------------------------------------------------------------
    return compactor


async def start_server(ctl: Controller, cfg: Config) -> HealthServer | None:
    """/metrics, /healthz, /readyz (and /federation with a shared Redis) on `metrics_port`, with
    the kube-scheduler extender (/scheduler/filter, /scheduler/prioritize)."""
    if not cfg.metrics_port:
        return None
    federation = None
    if cfg.redis_url:
        from pyctl.federation import federation_status

        store = ctl.store

        async def federation() -> Any:
            return await federation_status(store, ctl.metrics, cfg.cluster)

    # placement advice: the kube-scheduler extender on the same port (docs/placement.md)
    from pyctl.placement import PlacementExtender

    extender = PlacementExtender.for_reconciler(ctl.reconciler)
    server = HealthServer(
        ctl.metrics.registry,
        ctl.ready,
        cfg.metrics_host,
        cfg.metrics_port,
        federation=federation,
        extender=extender,
    )
    await server.start()
    return server


async def run_kube(cfg: Config, workload: Workload | None) -> int:
    """Follow a real cluster until cancelled: reflectors, the Lease (only the leader acts),
    the state store, metrics and health on `metrics_port`."""
    import socket

    from pyctl.cluster.kube.actuator import KubeActuator
    from pyctl.cluster.kube.client import connect
    from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
    from pyctl.cluster.kube.source import KubeClusterSource
    from pyctl.cluster.source import NullActuator

    kube = await connect(kubeconfig=cfg.kubeconfig or None, in_cluster=cfg.in_cluster)
    identity = cfg.identity or f"{socket.gethostname()}-{os.getpid()}"
    d = cfg.lease_duration
    elector = LeaderElector(
        kube,
        LeaseConfig(
            cfg.lease_namespace,
            cfg.lease_name,
            identity,
            d,
            renew_deadline=d * 2 / 3,
            retry_period=d / 6,
        ),
    )
    ctl = Controller(
        cfg.cluster,
        KubeClusterSource(kube),
        make_store(cfg),
        workload=workload,
        summary_interval=cfg.summary_interval,
        default_policy=cfg.default_topology_policy,
        is_leader=elector.still_leader,
    )
    actuator = KubeActuator(kube, instance=identity) if cfg.mode == "enforce" else NullActuator()
    attach_workflows(
        ctl, cfg, actuator=actuator, limits=safety_limits(cfg), interval=cfg.workflow_interval
    )
    server = await start_server(ctl, cfg)
    if cfg.redis_url:
        from pyctl.federation import watch_members

        ctl.background.append(lambda: watch_members(ctl.store, ctl.metrics, cfg.cluster, 10.0))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(elector.run)
            await ctl.run()
    finally:
        if server is not None:
            await server.stop()
        await kube.close()
    return 0


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    workload: Workload | None = (
        load_workload(load_json(cfg.workload_file)) if cfg.workload_file else None
    )
    live = not args.no_live and cfg.source == "sim"
    setup_logging(cfg.log_format, "warning" if live else cfg.log_level)
    if cfg.source == "kube":
        if not (cfg.kubeconfig or cfg.in_cluster):
            raise UserError("source kube needs --kubeconfig PATH or --in-cluster")
        try:
            return anyio.run(run_kube, cfg, workload)
        except KeyboardInterrupt:
            return 0
    return anyio.run(_run_sim, cfg, workload, live)


async def _run_sim(cfg: Config, workload: Workload | None, live: bool) -> int:
    from pyctl.cluster.sim.scenario import inference_day
    from pyctl.cluster.sim.source import SimClusterSource

    scenario = inference_day(seed=cfg.sim_seed)
    source = SimClusterSource(scenario, speed=cfg.sim_speed or None, forever=cfg.sim_forever)
    tracker = RunTracker()
    console = Console()
    t0 = time.monotonic()
    last_events = [0, t0]
    rate = [0.0]

    def on_summary(s: Summary) -> None:
        tracker.observe(s)

    ctl = Controller(
        cfg.cluster,
        source,
        make_store(cfg),
        workload=workload,
        summary_interval=cfg.summary_interval,
        default_policy=cfg.default_topology_policy,
        on_summary=on_summary,
    )
    compactor = attach_workflows(ctl, cfg, source)
    server = await start_server(ctl, cfg)

    def view() -> Any:
        now = time.monotonic()
        if now - last_events[1] >= 0.5:
            rate[0] = (ctl.stats.events - last_events[0]) / (now - last_events[1])
            last_events[0], last_events[1] = ctl.stats.events, now
        return render(ctl.last_summary, source.stats, scenario.duration, rate[0])

    try:
        if live:
            with Live(view(), console=console, refresh_per_second=4, transient=False) as lv:
                async with anyio.create_task_group() as tg:

                    async def refresh() -> None:
                        while True:
                            lv.update(view())
                            await anyio.sleep(0.25)

                    tg.start_soon(refresh)
                    await ctl.run(until_source_ends=not cfg.sim_forever)
                    lv.update(view())
                    tg.cancel_scope.cancel()
        else:
            await ctl.run(until_source_ends=not cfg.sim_forever)
    finally:
        if server is not None:
            await server.stop()
    wall = time.monotonic() - t0
    st = source.stats
    console.print(
        f"\n[bold]Summary[/] of scenario {scenario.name!r} "
        f"({scenario.duration / 3600:.0f} simulated hours "
        f"in {wall:.1f} s): {st.arrived} replicas arrived, {st.bound} bindings, "
        f"{st.unschedulable} marked unschedulable on arrival; "
        f"{ctl.stats.events} watch events, {ctl.stats.reconciles} node reconciles."
    )
    console.print(
        f"Fragmentation rate: mean {tracker.mean_rate:.1%}, peak {tracker.peak_rate:.1%} "
        f"(at most {tracker.peak_fragment_gpus:.1f} idle GPUs stranded); "
        f"pods blocked by fragmentation at peak: {tracker.peak_blocked} "
        f"({', '.join(f'{k} {v}' for k, v in tracker.blocked_reasons.items()) or 'none'}); "
        f"lowest scheduling success over the 5-minute window: {tracker.min_success:.1%}."
    )
    if cfg.mode == "enforce":
        console.print(
            f"Mode enforce: {source.evicted} replicas evicted by compaction through the gate "
            "(rate limits, lease); the simulated scheduler took pyctl's placement advice."
        )
    else:
        planned = compactor.last_plan.moves if compactor.last_plan else ()
        console.print(
            f"Mode observe: nothing was changed; the last compaction plan proposed {len(planned)} "
            "evictions (see pyctl_compaction_planned_moves). Run with --mode enforce to act."
        )
    return 0
