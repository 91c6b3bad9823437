"""Building the controller from the configuration: the state store, the workflow backends, the
gate, the workflow loops and the HTTP servers. Every part is made here and handed to the parts
that use it; nothing below the application layer builds its own collaborators."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyctl.app.config import Config
from pyctl.cluster.records import ObjectRef, PodRecord
from pyctl.cluster.selectors import parse_selector
from pyctl.cluster.source import Actuator, NullActuator
from pyctl.controller.controller import Controller
from pyctl.controller.placement import PlacementAdvisor, RankTable, no_reservations
from pyctl.controller.workload import WorkloadScope
from pyctl.metrics import Metrics
from pyctl.recommend.recommender import attach_from_config
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_process import ExtenderProcess, Publisher
from pyctl.serve.extender_server import ExtenderServer, HttpMetrics
from pyctl.serve.health import HealthServer
from pyctl.state.health import MonitoredRateLimiter, MonitoredWorkflowStore
from pyctl.state.memory import MemoryStore
from pyctl.state.ratelimit import BucketLimit, MemoryRateLimiter, RateLimiter, SafetyLimits
from pyctl.state.store import StateStore
from pyctl.state.workflows import MemoryWorkflowStore, WorkflowStore
from pyctl.workflows.compaction import KIND as COMPACTION_KIND
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.dra_steering import DraSteering
from pyctl.workflows.engine import Engine
from pyctl.workflows.evictor import Evictor
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_loop import MigLoop, pending_demand
from pyctl.workflows.mig_reconfig import KIND as MIG_KIND
from pyctl.workflows.mig_reconfig import MigContext
from pyctl.workflows.rescue import KIND as RESCUE_KIND
from pyctl.workflows.rescue import CompactionContext, RescueOptions


def workload_scope(cfg: Config) -> WorkloadScope:
    """Which pods shape the workload M (the configuration's `workload` section)."""
    w = cfg.workload
    return WorkloadScope(
        namespaces=frozenset(w.namespaces),
        excluded_namespaces=frozenset(w.excluded_namespaces),
        selector=parse_selector(w.label_selector) if w.label_selector.strip() else None,
        max_shape_weight=w.max_shape_weight,
    )


def make_store(cfg: Config, metrics: Metrics | None = None) -> StateStore:
    """Where the cluster's records are kept: Redis when configured, else memory (`metrics`
    counts the stored records that do not decode)."""
    if not cfg.redis.url:
        return MemoryStore(cfg.cluster)
    from pyctl.state.redis_store import RedisStore

    return RedisStore(cfg.redis.client_config(), cfg.cluster, metrics=metrics)


def release_after_resync(ctl: Controller, *backends: object) -> None:
    """The Redis clients of the controller's store and of `backends` (the workflow store: the
    rate limits share its client) drop the idle connections an outage left open once the store
    is written whole again (`Controller.after_resync`, `redis_client.release_idle`)."""
    from pyctl.state.redis_store import RedisStore
    from pyctl.state.redis_workflows import RedisWorkflowStore

    for backend in (ctl.store, *backends):
        if isinstance(backend, RedisStore | RedisWorkflowStore):
            ctl.after_resync.append(backend.release_idle)


def workflow_backends(
    cfg: Config, clock: Callable[[], float] = time.monotonic
) -> tuple[WorkflowStore, RateLimiter]:
    """Where workflows and rate limits live: in the shared Redis when one is configured (so a
    restarted controller or a new leader resumes the workflows, and replicas and clusters
    sharing the Redis share the limits; their clock is Redis's), else in memory (on `clock`)."""
    if not cfg.redis.url:
        return MemoryWorkflowStore(), MemoryRateLimiter(clock)
    from pyctl.state.redis_client import connect
    from pyctl.state.redis_ratelimit import RedisRateLimiter
    from pyctl.state.redis_workflows import RedisWorkflowStore

    rc = cfg.redis.client_config()
    client = connect(rc)
    return RedisWorkflowStore(client, rc, cfg.cluster), RedisRateLimiter(client, rc, cfg.cluster)


def sim_limits() -> SafetyLimits:
    """Limits for a simulated day played in about a minute: per wall second, not per hour."""
    return SafetyLimits(
        global_bucket=BucketLimit(capacity=5, per_second=2.0),
        node_bucket=BucketLimit(capacity=2, per_second=0.5),
        namespace_bucket=None,
        workload_bucket=BucketLimit(capacity=2, per_second=1.0),
        node_cooldown_seconds=0.0,
        disruptions_per_hour=None,
    )


@dataclass
class Workflows:
    """The acting side of one controller."""

    gate: Gate
    actuator: Actuator
    compactor: Compactor
    mig_loop: MigLoop
    dra_steering: DraSteering


def protection(cfg: Config, pods: Mapping[str, PodRecord]) -> Callable[[PodRecord], str | None]:
    """The evictor's rules on a live pod, as the gate checks them before every eviction."""

    def protected(pod: PodRecord) -> str | None:
        return Evictor(cfg.evictor, pods.values()).why_not(pod)

    return protected


def _controller_backends(
    ctl: Controller, cfg: Config, clock: Callable[[], float]
) -> tuple[WorkflowStore, RateLimiter]:
    """`workflow_backends` as the controller uses them: with Redis, every call reports to the
    one place that knows the store's health (/readyz), and after an outage the Redis clients
    (the store's, the workflows' and so the rate limits') drop the connections it left
    (`release_after_resync`)."""
    workflows, limiter = workflow_backends(cfg, clock)
    if not cfg.redis.url:
        return workflows, limiter
    release_after_resync(ctl, workflows)
    return (
        MonitoredWorkflowStore(workflows, ctl.store_health),
        MonitoredRateLimiter(limiter, ctl.store_health),
    )


def attach_workflows(
    ctl: Controller,
    cfg: Config,
    actuator: Actuator | None = None,
    limits: SafetyLimits | None = None,
    interval: float | None = None,
    clock: Callable[[], float] | None = None,
    loops: bool = True,
) -> Workflows:
    """The compaction and MIG loops, with the gate in front of the actuator (observe mode:
    `NullActuator` unless one is given), registered as the controller's background loops
    (`loops`; else the caller ticks them, as the simulated cluster does in virtual time).
    `clock`: the workflows' and rate limits' clock (epoch seconds; default the wall clock)."""
    interval = cfg.workflow.interval if interval is None else interval
    actuator = actuator if actuator is not None else NullActuator()
    workflows, limiter = _controller_backends(ctl, cfg, clock or time.monotonic)
    wall = clock or time.time
    pods = ctl.cache.pods
    gate = Gate(
        cfg.mode,
        ctl.is_leader,
        limiter,
        limits if limits is not None else cfg.safety_limits(),
        actuator,
        ctl.metrics,
        cfg.cluster,
        protected=protection(cfg, pods),
    )
    registry = builtin_registry()

    async def tell(ref: ObjectRef, reason: str, message: str) -> None:
        await gate.event("Pod", ref.namespace, ref.name, reason, message, uid=ref.uid, warning=True)

    # Events on the pods pyctl ignores (enforce mode: the gate writes nothing in observe mode)
    ctl.event_sender = tell

    def pod(ns: str, name: str) -> PodRecord | None:
        return pods.get(f"{ns}/{name}")

    rescue_options = RescueOptions(
        deadline=cfg.workflow.rescue_deadline,
        poll=min(2.0, interval),
        after=cfg.workflow.rescue_after,
    )
    compactor = Compactor(
        ctl.cache,
        ctl.reconciler,
        Engine(
            workflows,
            CompactionContext(gate, pod, wall, rescue=rescue_options),
            registry,
            kinds=(COMPACTION_KIND, RESCUE_KIND),
        ),
        ctl.metrics,
        cfg.cluster,
        cfg.mode,
        interval,
        options=cfg.evictor,
        gate=gate,
        limits=cfg.workflow.plan_limits(),
        rescue_options=rescue_options,
    )

    def admit(p: PodRecord) -> bool:
        return ctl.reconciler.scope.admits(p) and ctl.reconciler.modelled(p)

    mig_ctx = MigContext(
        gate,
        pod,
        wall,
        node=ctl.cache.nodes.get,
        options=cfg.mig,
        demand=lambda: pending_demand(ctl.cache, admit),
    )
    holdoff = cfg.mig.node_holdoff_seconds
    mig_loop = MigLoop(
        ctl.cache,
        ctl.reconciler.models,
        # finished records are kept at least as long as the hold-off reads them
        Engine(
            workflows, mig_ctx, registry, kinds=(MIG_KIND,), retention_seconds=max(600.0, holdoff)
        ),
        gate,
        ctl.metrics,
        cfg.cluster,
        interval,
        options=cfg.mig,
        admit=admit,
    )
    dra_steering = DraSteering(ctl.reconciler, gate, interval)
    if loops:
        ctl.background += [
            ctl.after_scored(lambda: compactor.run(ctl.is_leader)),
            ctl.after_scored(lambda: mig_loop.run(ctl.is_leader)),
            ctl.after_scored(lambda: dra_steering.run(ctl.is_leader)),
        ]
    return Workflows(gate, actuator, compactor, mig_loop, dra_steering)


def attach_recommender(ctl: Controller, cfg: Config) -> None:
    """The periodic resource normalization report, in observe mode (pyctl/recommend)."""
    if cfg.mode == "observe" and cfg.recommend.interval > 0:
        attach_from_config(ctl, cfg.recommend)


def _rescues(
    flows: Workflows | None,
) -> tuple[Callable[[], Mapping[str, str]], Callable[[], Mapping[str, str]]]:
    """The nodes the rescues in progress keep for their pending pods, and the nodes compaction
    just moved a workload's pod off (none without workflows)."""
    if flows is None:
        return no_reservations, no_reservations
    compactor = flows.compactor
    return (lambda: compactor.reservations), (lambda: compactor.departures)


def advisor(
    ctl: Controller, flows: Workflows | None = None, ranks: RankTable | None = None
) -> PlacementAdvisor:
    """The scheduler extender's decisions, on the controller's models, keeping the nodes of the
    rescues in progress for their pending pods (`ranks`: the table of kept ranks to share)."""
    reserved, departed = _rescues(flows)
    return PlacementAdvisor.for_reconciler(ctl.reconciler, reserved, departed, ranks)


@dataclass
class Servers:
    """The HTTP servers of one controller (each None when its port is 0)."""

    health: HealthServer | None = None
    extender: ExtenderServer | ExtenderProcess | None = None

    async def stop(self) -> None:
        if self.extender is not None:
            await self.extender.stop()
        if self.health is not None:
            await self.health.stop()


async def start_servers(ctl: Controller, cfg: Config, flows: Workflows | None = None) -> Servers:
    """/metrics, /healthz, /readyz (and /federation with a shared Redis) on the metrics port;
    the kube-scheduler extender (/scheduler/choose, /scheduler/filter, /scheduler/prioritize) on
    the extender port, on its own server and threads. Raises (after stopping what it started)
    when a server cannot start: a port in use, TLS files that cannot be read."""
    servers = Servers()
    metrics = HttpMetrics(ctl.metrics.registry, cfg.cluster)

    def ready() -> tuple[bool, str]:
        """The controller's readiness, and the extender's process serving (when it has one)."""
        ok, why = ctl.ready()
        ext = servers.extender
        if ok and isinstance(ext, ExtenderProcess) and not ext.serving:
            return False, "the scheduler extender's process is not serving (being started again)"
        return ok, why

    try:
        if cfg.metrics.port:
            federation: Callable[[], Awaitable[Mapping[str, Any]]] | None = None
            if cfg.redis.url:
                from pyctl.federation import MemberDecoder, federation_status

                store = ctl.store
                decoder = MemberDecoder()

                async def status() -> Mapping[str, Any]:
                    return await federation_status(store, ctl.metrics, cfg.cluster, decoder)

                federation = status
            servers.health = HealthServer(
                ctl.metrics.registry,
                ready,
                cfg.metrics.host,
                cfg.metrics.port,
                federation=federation,
                limits=cfg.metrics.limits(),
                on_reject=metrics.on_reject("metrics"),
            )
            await servers.health.start()
        if cfg.extender.port:
            # one advisor per worker thread, all on one table of kept ranks, which the
            # reconciler keeps fresh for the shapes asked about recently and those of the
            # pending pods; each keeps the nodes of the rescues in progress for their pods
            r = ctl.reconciler
            ranks = RankTable(r.models, lambda: r.workload, ctl.metrics, cfg.cluster)
            r.on_scored.append(ranks.refreshed)
            rdma = cfg.reflector.rdma_resource
            handler = lambda: ExtenderHandler(advisor(ctl, flows, ranks), rdma)  # noqa: E731
            if cfg.extender.process:
                # a process of its own, fed the models; it forwards here what it cannot
                # answer alone (pods with DRA claims), and ranks ahead itself
                reserved, departed = _rescues(flows)
                proc = ExtenderProcess(
                    Publisher(r, reserved, departed),
                    handler,
                    cfg.extender,
                    metrics,
                    ctl.metrics,
                    cfg.cluster,
                    rdma,
                )
                servers.extender = proc
                ctl.background.append(proc.keep_pending)
            else:
                # and ahead of the scheduler's first call for a new shape (its pods pending)
                ctl.background.append(
                    lambda: ranks.keep_warm(r.pending_shapes, lambda: len(ctl.queue) > 0)
                )
                servers.extender = ExtenderServer(handler, cfg.extender, metrics)
            await servers.extender.start()
    except BaseException:
        await servers.stop()
        raise
    return servers
