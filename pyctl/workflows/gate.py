"""The one gate every mutation of a cluster passes: dry-run (observe mode), the Lease (only the
leader acts, checked right before the call), the shared rate limits, then the Actuator.

An eviction's limits are reserved before the call and given back when the eviction did not
happen (refused, answered with an error, the Lease lost in between): they count evictions done,
not tried. A process that dies between the reservation and the call leaves them charged (they
refill, and the budget unit ages out of its window): the safe side.

Workflows never hold the actuator: they ask the gate to evict, taint, cordon, label, publish a
ConfigMap or record an Event, and read the answer (`GateResult`). Before every eviction the gate
checks the evictor's rules again against the pod as the controller sees it now (`protected`), so
a stale or tampered workflow record cannot evict what the rules protect, and the eviction names
the pod's uid as a precondition (a recreated pod with the same name is never evicted).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from pyctl.cluster.records import PodRecord
from pyctl.cluster.source import Actuator, ActuatorError, EvictionOutcome, LeaseLost
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import Decision, RateLimiter, Receipt, Request, SafetyLimits, Slot

log = logging.getLogger("pyctl.gate")

Outcome = Literal["done", "dry-run", "not-leader", "rate-limited", "refused", "protected"]

#: wait after a 429 that names no Retry-After (a PodDisruptionBudget with no disruption allowed)
REFUSED_WAIT = 30.0
#: bounds on the wait a 429's Retry-After sets (a zero is not a reason to hammer the API server,
#: and a huge one must not park a workflow for hours)
REFUSED_WAIT_MIN, REFUSED_WAIT_MAX = 1.0, 300.0
#: the longest wait a rate limit may ask for (an empty bucket that never refills asks forever)
LIMIT_WAIT_MAX = 3600.0


def refusal(outcome: EvictionOutcome, what: str) -> tuple[float, str]:
    """How long to wait after a refused eviction, and why it was refused (for the workflow's
    result): the API server's Retry-After when it gives one, else `REFUSED_WAIT`."""
    wait = REFUSED_WAIT if outcome.retry_after is None else outcome.retry_after
    if not math.isfinite(wait):
        wait = REFUSED_WAIT_MAX
    wait = min(max(wait, REFUSED_WAIT_MIN), REFUSED_WAIT_MAX)
    if outcome.budget:
        who = f"PodDisruptionBudget {outcome.budget}"
    elif outcome.status == 429:
        who = "the API server"
    else:
        who = "admission"
    detail = f": {outcome.message}" if outcome.message else ""
    return wait, f"{who} refused the eviction of {what} ({outcome.status}){detail}"


def limit_wait(decision: Decision) -> float:
    """The wait a refused rate limit asks for, finite and at most `LIMIT_WAIT_MAX`."""
    w = decision.retry_after
    if not math.isfinite(w) or w > LIMIT_WAIT_MAX:
        return LIMIT_WAIT_MAX
    return max(w, 0.0)


@dataclass(frozen=True)
class GateResult:
    outcome: Outcome
    #: seconds to wait before trying again (rate limits, a PDB's 429)
    retry_after: float = 0.0
    reason: str = ""
    #: on a refused eviction: whether trying again can help (429) or not (an admission denial)
    retriable: bool = True

    @property
    def done(self) -> bool:
        return self.outcome == "done"


def _never_protected(_pod: PodRecord) -> str | None:
    return None


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
        protected: Callable[[PodRecord], str | None] = _never_protected,
    ) -> None:
        self.mode = mode
        self.still_leader = still_leader
        self.limiter = limiter
        self.limits = limits
        self._actuator = actuator
        self.metrics = metrics
        self.cluster = cluster
        #: the evictor's rules on the live pod: None if it may be evicted, else why not
        self.protected = protected
        #: evictions through this gate by (outcome, reason): what this process did, or in
        #: observe mode would have done (the metrics count them across reasons)
        self.evictions: Counter[tuple[str, str]] = Counter()

    @property
    def enforce(self) -> bool:
        return self.mode == "enforce"

    # -- rate limits -------------------------------------------------------------------------
    async def acquire(self, request: Request) -> Decision:
        """Take the limits of a whole workflow at once (MIG reconfiguration); counted when
        refused."""
        decision = await self.limiter.acquire(request)
        if not decision.allowed:
            self.metrics.workflow.rate_limited.labels(self.cluster, str(decision.limit)).inc()
        return decision

    async def refund(self, receipt: Receipt | None, why: str) -> None:
        """Give back what `receipt` drew, for an action that did not happen (`why`: refused,
        failed, not-leader). Never raises: a refund that fails leaves the limits charged, the
        safe side, as a crash between the reservation and the call does."""
        if receipt is None:
            return
        try:
            await self.limiter.refund(receipt)
        except Exception as e:
            log.warning("rate limits not given back", extra={"error": str(e)[:300]})
            return
        self.metrics.workflow.refunds.labels(self.cluster, why).inc()

    async def renew_slot(self, slot: Slot) -> bool:
        return await self.limiter.renew_slot(slot)

    async def release_slot(self, name: str, holder: str) -> None:
        await self.limiter.release_slot(name, holder)

    # -- evictions ---------------------------------------------------------------------------
    async def evict(
        self,
        pod: PodRecord,
        node: str,
        *,
        workload: str = "",
        reason: str = "PyctlCompaction",
        message: str = "",
        limited: bool = True,
    ) -> GateResult:
        """Evict `pod` (as the controller sees it now) from `node` through the Eviction API.
        `limited`: take the eviction rate limits now (False when the workflow took its limits
        up front)."""
        m = self.metrics.workflow
        where = f"{pod.namespace}/{pod.name}"
        why_not = self.protected(pod)
        if why_not is not None:
            m.evictions.labels(self.cluster, "protected").inc()
            self.evictions[("protected", reason)] += 1
            log.warning(
                "eviction refused by the evictor rules", extra={"pod": where, "why": why_not}
            )
            return GateResult(
                "protected", reason=f"{where} is protected: {why_not}", retriable=False
            )
        if not self.enforce:
            m.evictions.labels(self.cluster, "dry-run").inc()
            self.evictions[("dry-run", reason)] += 1
            log.info("would evict (observe mode)", extra={"pod": where, "node": node})
            return GateResult("dry-run")
        if not self.still_leader():
            return GateResult("not-leader", reason="this replica does not hold the Lease")
        receipt: Receipt | None = None
        if limited:
            # reserved before the call (two callers cannot both pass), given back below when the
            # eviction did not happen: the limits count what was done, not what was tried
            decision = await self.acquire(self.limits.eviction(node, pod.namespace, workload))
            if not decision.allowed:
                return GateResult(
                    "rate-limited", limit_wait(decision), f"limit {decision.limit} binds"
                )
            receipt = decision.receipt
            if not self.still_leader():  # the acquire awaited: check again right before acting
                await self.refund(receipt, "not-leader")
                return GateResult("not-leader", reason="lost the Lease")
        try:
            outcome = await self._actuator.try_evict(pod.namespace, pod.name, pod.uid)
        except LeaseLost as e:  # the actuator's last check: nothing was sent
            await self.refund(receipt, "not-leader")
            return GateResult("not-leader", reason=str(e))
        except ActuatorError:
            # the API server answered with an error: nothing was evicted. (A failure with no
            # answer, a timeout, keeps the charge: the eviction may have happened.)
            await self.refund(receipt, "failed")
            raise
        if not outcome.allowed:
            await self.refund(receipt, "refused")
            m.evictions.labels(self.cluster, "refused").inc()
            self.evictions[("refused", reason)] += 1
            wait, why = refusal(outcome, where)
            return GateResult("refused", wait, why, retriable=outcome.status == 429)
        m.evictions.labels(self.cluster, "evicted").inc()
        self.evictions[("evicted", reason)] += 1
        await self.event(
            "Pod",
            pod.namespace,
            pod.name,
            reason,
            message or f"evicted from {node} to reduce GPU fragmentation",
            uid=pod.uid,
        )
        return GateResult("done")

    # -- other mutations ---------------------------------------------------------------------
    async def _act(self, what: str, call: Callable[[], Awaitable[object]]) -> GateResult:
        if not self.enforce:
            log.info("would %s (observe mode)", what)
            return GateResult("dry-run")
        if not self.still_leader():
            return GateResult("not-leader", reason="this replica does not hold the Lease")
        try:
            await call()
        except LeaseLost as e:  # the actuator's last check, right before the request
            return GateResult("not-leader", reason=str(e))
        return GateResult("done")

    async def taint(self, node: str, key: str, *, on: bool, value: str = "") -> GateResult:
        """Add (`on`) or remove pyctl's NoSchedule taint `key[=value]`."""
        verb = "taint" if on else "untaint"
        return await self._act(
            f"{verb} {node} ({key})",
            lambda: self._actuator.taint(node, key, "NoSchedule", value=value, on=on),
        )

    async def cordon(self, node: str, on: bool) -> GateResult:
        return await self._act(
            f"{'cordon' if on else 'uncordon'} {node}", lambda: self._actuator.cordon(node, on)
        )

    async def label(self, node: str, labels: Mapping[str, str | None]) -> GateResult:
        return await self._act(
            f"label {node} {dict(labels)}", lambda: self._actuator.label_node(node, labels)
        )

    async def publish_configmap(
        self, namespace: str, name: str, data: Mapping[str, str]
    ) -> GateResult:
        return await self._act(
            f"write ConfigMap {namespace}/{name}",
            lambda: self._actuator.apply_configmap(namespace, name, data),
        )

    async def device_taint_rule(self, manifest: Mapping[str, object], *, on: bool) -> GateResult:
        """Create (`on`) or delete one of pyctl's DeviceTaintRules (docs/dra.md)."""
        meta = manifest.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else "?"
        return await self._act(
            f"{'create' if on else 'delete'} DeviceTaintRule {name}",
            lambda: self._actuator.put_device_taint_rule(manifest, on),
        )

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        """A read (no gate needed): pyctl's DeviceTaintRules, None where they are not served."""
        return await self._actuator.device_taint_rules()

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """A read (no gate needed): the ConfigMap's data, None when absent."""
        return await self._actuator.read_configmap(namespace, name)

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None:
        """A core/v1 Event (enforce mode only). Never raises: an Event is worth trying, never
        worth failing a step for."""
        if not self.enforce:
            return
        try:
            await self._actuator.event(
                kind, namespace, name, reason, message, uid=uid, warning=warning
            )
        except Exception:
            log.warning("could not record an Event", extra={"object": name}, exc_info=True)
