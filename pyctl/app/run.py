"""Running the controller: on a real cluster until stopped (`run_kube`), or on the built-in
simulated cluster (`SimRun`, which the CLI drives with its live view)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from pyctl.app.config import Config
from pyctl.app.wiring import (
    Workflows,
    attach_workflows,
    make_store,
    sim_limits,
    start_server,
    workload_scope,
)
from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.cluster.sim.actuator import SimActuator
from pyctl.cluster.sim.scenario import Scenario, inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.cluster.source import Actuator, NullActuator
from pyctl.controller.controller import Controller
from pyctl.controller.summary import Summary
from pyctl.federation import watch_members
from pyctl.metrics import Metrics
from pyctl.model import Workload


async def run_kube(cfg: Config, workload: Workload | None) -> int:
    """Follow a real cluster until cancelled: reflectors, the Lease (only the leader acts),
    the state store, metrics and health on the metrics port, the workflows."""
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
    actuator: Actuator = (
        KubeActuator(kube, instance=identity) if cfg.mode == "enforce" else NullActuator()
    )
    attach_workflows(ctl, cfg, actuator=actuator)
    server = await start_server(ctl, cfg)
    if cfg.redis.url:
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


@dataclass
class SimRun:
    """The controller on the built-in simulated cluster: in enforce mode evictions and MIG
    re-partitions really happen there (and its scheduler takes pyctl's placement advice); in
    observe mode they are counted as dry runs."""

    cfg: Config
    scenario: Scenario
    source: SimClusterSource
    controller: Controller
    workflows: Workflows

    async def run(self) -> None:
        server = await start_server(self.controller, self.cfg)
        try:
            await self.controller.run(until_source_ends=not self.cfg.sim.forever)
        finally:
            if server is not None:
                await server.stop()


def build_sim(
    cfg: Config,
    workload: Workload | None = None,
    on_summary: Callable[[Summary], None] | None = None,
    interval: float = 0.5,
) -> SimRun:
    """The simulated cluster of `cfg.sim` and the controller watching it."""
    scenario = inference_day(seed=cfg.sim.seed)
    source = SimClusterSource(scenario, speed=cfg.sim.speed or None, forever=cfg.sim.forever)
    metrics = Metrics()
    ctl = Controller(
        cfg.cluster,
        source,
        make_store(cfg, metrics),
        metrics,
        workload=workload,
        summary_interval=cfg.summary_interval,
        default_policy=cfg.default_topology_policy,
        on_summary=on_summary,
        scope=workload_scope(cfg),
    )
    enforce = cfg.mode == "enforce"
    actuator: Actuator = SimActuator(source) if enforce else NullActuator()
    if enforce:
        source.cluster.advice = True
    flows = attach_workflows(ctl, cfg, actuator=actuator, limits=sim_limits(), interval=interval)
    return SimRun(cfg, scenario, source, ctl, flows)


__all__ = ["SimRun", "Summary", "build_sim", "run_kube"]
