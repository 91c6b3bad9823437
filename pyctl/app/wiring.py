"""Building the controller from the configuration: the state store, the workflow backends, the
gate, the workflow loops and the HTTP servers. Every part is made here and handed to the parts
that use it; nothing below the application layer builds its own collaborators."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyctl.app.config import Config
from pyctl.cluster.records import ObjectRef, PodRecord
from pyctl.cluster.selectors import parse_selector
from pyctl.cluster.source import Actuator, NullActuator
from pyctl.controller.controller import Controller
from pyctl.controller.placement import PlacementAdvisor
from pyctl.controller.workload import WorkloadScope
from pyctl.metrics import Metrics
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.health import HealthServer
from pyctl.state.memory import MemoryStore
from pyctl.state.ratelimit import BucketLimit, MemoryRateLimiter, RateLimiter, SafetyLimits
from pyctl.state.store import StateStore
from pyctl.state.workflows import MemoryWorkflowStore, WorkflowStore
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.engine import Context, Engine
from pyctl.workflows.evictor import Evictor
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_loop import MigLoop
from pyctl.workflows.mig_reconfig import KIND as MIG_KIND
from pyctl.workflows.mig_reconfig import MigContext


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


def workflow_backends(cfg: Config) -> tuple[WorkflowStore, RateLimiter]:
    """Where workflows and rate limits live: in the shared Redis when one is configured (so a
    restarted controller or a new leader resumes the workflows, and replicas and clusters
    sharing the Redis share the limits), else in memory."""
    if not cfg.redis.url:
        return MemoryWorkflowStore(), MemoryRateLimiter()
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


def protection(cfg: Config, pods: Mapping[str, PodRecord]) -> Callable[[PodRecord], str | None]:
    """The evictor's rules on a live pod, as the gate checks them before every eviction."""

    def protected(pod: PodRecord) -> str | None:
        return Evictor(cfg.evictor, pods.values()).why_not(pod)

    return protected


def attach_workflows(
    ctl: Controller,
    cfg: Config,
    actuator: Actuator | None = None,
    limits: SafetyLimits | None = None,
    interval: float | None = None,
) -> Workflows:
    """The compaction and MIG loops, with the gate in front of the actuator (observe mode:
    `NullActuator` unless one is given), registered as the controller's background loops."""
    interval = cfg.workflow.interval if interval is None else interval
    actuator = actuator if actuator is not None else NullActuator()
    workflows, limiter = workflow_backends(cfg)
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

    compactor = Compactor(
        ctl.cache,
        ctl.reconciler,
        Engine(workflows, Context(gate, pod), registry, kinds=("compaction",)),
        ctl.metrics,
        cfg.cluster,
        cfg.mode,
        interval,
        max_moves=cfg.workflow.max_moves,
        options=cfg.evictor,
    )
    mig_ctx = MigContext(gate, pod, node=ctl.cache.nodes.get, options=cfg.mig)
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
        admit=lambda p: ctl.reconciler.scope.admits(p) and ctl.reconciler.modelled(p),
    )
    ctl.background.append(lambda: compactor.run(ctl.is_leader))
    ctl.background.append(lambda: mig_loop.run(ctl.is_leader))
    return Workflows(gate, actuator, compactor, mig_loop)


async def start_server(ctl: Controller, cfg: Config) -> HealthServer | None:
    """/metrics, /healthz, /readyz (and /federation with a shared Redis) on the metrics port,
    with the kube-scheduler extender (/scheduler/filter, /scheduler/prioritize)."""
    if not cfg.metrics.port:
        return None
    federation: Callable[[], Awaitable[Mapping[str, Any]]] | None = None
    if cfg.redis.url:
        from pyctl.federation import federation_status

        store = ctl.store

        async def status() -> Mapping[str, Any]:
            return await federation_status(store, ctl.metrics, cfg.cluster)

        federation = status
    server = HealthServer(
        ctl.metrics.registry,
        ctl.ready,
        cfg.metrics.host,
        cfg.metrics.port,
        federation=federation,
        extender=ExtenderHandler(PlacementAdvisor.for_reconciler(ctl.reconciler)),
    )
    await server.start()
    return server
