"""Running the controller: on a real cluster until stopped (`run_kube`), or on the built-in
simulated cluster (`SimRun`, which the CLI drives with its live view)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from pyctl.app.collector import full_collections, take_over_full_collections
from pyctl.app.config import Config
from pyctl.app.wiring import (
    Workflows,
    advisor,
    attach_recommender,
    attach_workflows,
    make_store,
    sim_limits,
    start_servers,
    workload_scope,
)
from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.cluster.sim.actuator import SimActuator
from pyctl.cluster.sim.scenario import Scenario, inference_day
from pyctl.cluster.sim.source import Lockstep, SimClusterSource
from pyctl.cluster.source import Actuator, NullActuator
from pyctl.controller.controller import Controller
from pyctl.controller.placement import PlacementAdvisor
from pyctl.controller.summary import Summary
from pyctl.federation import watch_members
from pyctl.metrics import Metrics
from pyctl.model import Workload
from pyctl.serve.http import tune_malloc
from pyctl.workflows.loop import guarded


async def run_kube(cfg: Config, workload: Workload | None) -> int:
    """Follow a real cluster until cancelled: reflectors, the Lease (only the leader acts),
    the state store, metrics and health on the metrics port, the workflows."""
    tune_malloc()  # request bodies' memory goes back to the system when freed (docs/http.md)
    kube = await connect(kubeconfig=cfg.kubeconfig or None, in_cluster=cfg.in_cluster)
    identity = cfg.lease.identity or f"{socket.gethostname()}-{os.getpid()}"
    d = cfg.lease.duration
    elector = LeaderElector(
        kube,
        LeaseConfig(
            cfg.lease.namespace,
            cfg.lease.name,
            identity,
            d,
            renew_deadline=d * 2 / 3,
            retry_period=d / 6,
        ),
    )
    metrics = Metrics()
    metrics.watch_collections(cfg.cluster)
    take_over_full_collections()  # pyctl runs them (pyctl/app/collector.py)
    ctl = Controller(
        cfg.cluster,
        KubeClusterSource(kube, options=cfg.reflector),
        make_store(cfg, metrics),
        metrics,
        workload=workload,
        summary_interval=cfg.summary_interval,
        default_policy=cfg.default_topology_policy,
        is_leader=elector.still_leader,
        workload_interval=cfg.workload.interval,
        scope=workload_scope(cfg),
    )
    ctl.reconciler.fabric_levels = cfg.fabric.levels
    ctl.reconciler.fabric_interval = cfg.fabric.interval
    actuator: Actuator = (
        KubeActuator(kube, instance=identity, still_leader=elector.still_leader)
        if cfg.mode == "enforce"
        else NullActuator()
    )
    flows = attach_workflows(ctl, cfg, actuator=actuator)
    attach_recommender(ctl, cfg)
    servers = await start_servers(ctl, cfg, flows)
    ctl.background.append(full_collections)
    if cfg.redis.url:
        ctl.background.append(lambda: watch_members(ctl.store, ctl.metrics, cfg.cluster))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(elector.run)
            await ctl.run()
    finally:
        await servers.stop()
        await kube.close()
    return 0


@dataclass
class SimRun:
    """The controller on the built-in simulated cluster: in enforce mode evictions and MIG
    re-partitions really happen there (and its scheduler takes pyctl's placement advice); in
    observe mode they are counted as dry runs. The controller follows the cluster's virtual
    time in lockstep (`pyctl.cluster.sim.source.Lockstep`): its planning rounds every
    `workflow_interval` virtual seconds, its clocks and rate limits virtual, so a run is the same
    at any speed."""

    cfg: Config
    scenario: Scenario
    source: SimClusterSource
    controller: Controller
    workflows: Workflows
    advisor: PlacementAdvisor | None = None

    async def run(self) -> None:
        servers = await start_servers(self.controller, self.cfg, self.workflows)
        try:
            await self.controller.run(until_source_ends=not self.cfg.sim.forever)
        finally:
            await servers.stop()


def build_sim(
    cfg: Config,
    workload: Workload | None = None,
    on_summary: Callable[[Summary], None] | None = None,
) -> SimRun:
    """The simulated cluster of `cfg.sim` and the controller watching it, in lockstep.

    The safety limits are the configured ones, on the virtual clock. With a shared Redis the
    rate limits run on Redis's clock (wall time), so the limits of `sim_limits` (per wall
    second) are used instead and the run depends on the playback speed."""
    scenario = inference_day(seed=cfg.sim.seed)
    source = SimClusterSource(scenario, speed=cfg.sim.speed or None, forever=cfg.sim.forever)
    metrics = Metrics()
    ctl = Controller(
        cfg.cluster,
        source,
        make_store(cfg, metrics),
        metrics,
        workload=workload,
        summary_interval=0.0,  # summaries come with the virtual ticks
        default_policy=cfg.default_topology_policy,
        on_summary=on_summary,
        workload_interval=cfg.workload.interval,
        clock=source.now,
        scope=workload_scope(cfg),
    )
    ctl.reconciler.fabric_levels = cfg.fabric.levels
    ctl.reconciler.fabric_interval = cfg.fabric.interval
    enforce = cfg.mode == "enforce"
    actuator: Actuator = SimActuator(source) if enforce else NullActuator()
    flows = attach_workflows(
        ctl,
        cfg,
        actuator=actuator,
        limits=sim_limits() if cfg.redis.url else None,
        clock=source.now,
        loops=False,
    )
    attach_recommender(ctl, cfg)

    async def tick(now: float) -> None:
        s = ctl.summarize()
        if on_summary is not None:
            on_summary(s)
        await ctl.publish(s)  # the heartbeat `pyctl status` reads (with a shared Redis)
        leader = ctl.is_leader()
        # as the Kubernetes path's loops (`run_every`): a failing round (the store gone, a key of
        # the wrong type) is logged and retried at the next tick; the store's health says it
        await guarded("compaction", lambda: flows.compactor.tick(leader))
        await guarded("MIG loop", lambda: flows.mig_loop.tick(leader))

    source.lockstep = Lockstep(ctl.drain, tick, every=cfg.workflow.interval)
    adv: PlacementAdvisor | None = None
    if enforce:
        # the simulated scheduler asks pyctl's extender, as a configured kube-scheduler does
        adv = advisor(ctl, flows)
        extender = adv
        source.cluster.extender = lambda pod, names: (
            extender.filter(pod, names),
            extender.prioritize(pod, names),
        )
    return SimRun(cfg, scenario, source, ctl, flows, adv)


__all__ = ["SimRun", "Summary", "build_sim", "run_kube"]
