"""The one gate every mutation of a cluster passes: dry-run (observe mode), the Lease (only the
leader acts, checked right before the call), the shared rate limits, then the Actuator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pyctl.cluster.source import Actuator, EvictionOutcome
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import RateLimiter, SafetyLimits

log = logging.getLogger("pyctl.gate")

Outcome = Literal["done", "dry-run", "not-leader", "rate-limited", "refused"]

#: wait after a 429 that names no Retry-After (a PodDisruptionBudget with no disruption allowed)
REFUSED_WAIT = 30.0
#: bounds on the wait a 429's Retry-After sets (a zero is not a reason to hammer the API server,
#: and a huge one must not park a workflow for hours)
REFUSED_WAIT_MIN, REFUSED_WAIT_MAX = 1.0, 300.0


def refusal(outcome: EvictionOutcome, what: str) -> tuple[float, str]:
    """How long to wait after a refused eviction, and why it was refused (for the workflow's
    result): the API server's Retry-After when it gives one, else `REFUSED_WAIT`."""
    wait = REFUSED_WAIT if outcome.retry_after is None else outcome.retry_after
    wait = min(max(wait, REFUSED_WAIT_MIN), REFUSED_WAIT_MAX)
    who = f"PodDisruptionBudget {outcome.budget}" if outcome.budget else "the API server"
    detail = f": {outcome.message}" if outcome.message else ""
    return wait, f"{who} refused the eviction of {what} ({outcome.status}){detail}"


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

    async def evict(
        self, node: str, namespace: str, pod: str, workload: str, uid: str = ""
    ) -> GateResult:
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
        outcome = await self.actuator.try_evict(namespace, pod)
        if not outcome.allowed:
            m.evictions.labels(self.cluster, "refused").inc()
            wait, why = refusal(outcome, f"{namespace}/{pod}")
            return GateResult("refused", wait, why)
        m.evictions.labels(self.cluster, "evicted").inc()
        await self.actuator.event(
            "Pod",
            namespace,
            pod,
            "PyctlCompaction",
            f"evicted from {node} to reduce GPU fragmentation",
            uid=uid,
        )
        return GateResult("done")
