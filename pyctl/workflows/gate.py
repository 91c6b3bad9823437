"""The one gate every mutation of a cluster passes: dry-run (observe mode), the Lease (only the
leader acts, checked right before the call), the shared rate limits, then the Actuator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pyctl.cluster.source import Actuator
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import RateLimiter, SafetyLimits

log = logging.getLogger("pyctl.gate")

Outcome = Literal["done", "dry-run", "not-leader", "rate-limited", "refused"]


@dataclass(frozen=True)
class GateResult:
    outcome: Outcome
    #: seconds to wait before trying again (rate limits, a PDB's 429)
    retry_after: float = 0.0
    reason: str = ""


class Gate:
    def __init__(
        self,
        mode: str,
        still_leader: Callable[[], bool],
        limiter: RateLimiter,
        limits: SafetyLimits,
        actuator: Actuator,
        metrics: Metrics,
        cluster: str,
    ) -> None:
        self.mode = mode
        self.still_leader = still_leader
        self.limiter = limiter
        self.limits = limits
        self.actuator = actuator
        self.metrics = metrics
        self.cluster = cluster

    async def evict(self, node: str, namespace: str, pod: str, workload: str) -> GateResult:
        m = self.metrics.workflow
        if self.mode != "enforce":
            m.evictions.labels(self.cluster, "dry-run").inc()
            log.info(
                "would evict (observe mode)", extra={"pod": f"{namespace}/{pod}", "node": node}
            )
            return GateResult("dry-run")
        if not self.still_leader():
            return GateResult("not-leader", reason="this replica does not hold the Lease")
        decision = await self.limiter.acquire(self.limits.eviction(node, namespace, workload))
        if not decision.allowed:
            m.rate_limited.labels(self.cluster, str(decision.limit)).inc()
            return GateResult("rate-limited", decision.retry_after, f"limit {decision.limit} binds")
        if not self.still_leader():  # the acquire awaited: check again right before acting
            return GateResult("not-leader", reason="lost the Lease")
        ok = await self.actuator.evict(namespace, pod)
        if not ok:
            m.evictions.labels(self.cluster, "refused").inc()
            return GateResult("refused", 30.0, "a PodDisruptionBudget refused the eviction (429)")
        m.evictions.labels(self.cluster, "evicted").inc()
        await self.actuator.event(
            "Pod",
            namespace,
            pod,
            "PyctlCompaction",
            f"evicted from {node} to reduce GPU fragmentation",
        )
        return GateResult("done")
