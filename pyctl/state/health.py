"""The state store's health, as every part of one controller that uses it last saw it.

One `StoreHealth` per controller. Its parts report each call to the store: the mirror of the
watched objects (the controller's store loop), the published summary, the workflow records and
the rate limits (through `MonitoredWorkflowStore` and `MonitoredRateLimiter`, which wrap them),
and a probe that pings the store every few seconds, so that an outage is seen even when nothing
else calls. `/readyz`, `pyctl_store_up` (and its alert, PyctlStoreDown) and
`pyctl_store_part_up{part}` read it; the simulated and the Kubernetes paths share it.

Two kinds of failure:

- the store does not answer (`StoreUnreachable`: a connection refused or lost, a timeout, a
  Redis still loading its data, a cluster down): the whole store is unavailable until any call
  to it succeeds (the probe's, at the latest a few seconds after it returns);
- the store answers but refuses one part (any other `StoreError`: a key of the wrong type, out
  of memory, a command the ACL denies): that part is unavailable until its own next call
  succeeds.

A `ConflictError` (a compare-and-set that found another version) is the store working as meant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyctl.metrics import Metrics
from pyctl.state.ratelimit import Decision, RateLimiter, Receipt, Request, Slot
from pyctl.state.store import StoreError, StoreUnreachable
from pyctl.state.workflows import ConflictError, Quarantined, WorkflowRecord, WorkflowStore

log = logging.getLogger("pyctl.state")

#: the longest reason kept for a failing part
_WHY = 300


class StoreHealth:
    def __init__(self, metrics: Metrics | None = None, cluster: str = "") -> None:
        self.metrics = metrics
        self.cluster = cluster
        #: (part, why) of the last call that found the store not answering; None: it answers
        self.unreachable: tuple[str, str] | None = None
        #: part -> why, for the parts the store refused on their last call
        self.refused: dict[str, str] = {}
        self._parts: set[str] = set()
        #: called with the new availability whenever it changes
        self.on_change: list[Callable[[bool], None]] = []
        self._available: bool | None = None

    @property
    def available(self) -> bool:
        return self.unreachable is None and not self.refused

    @property
    def reason(self) -> str:
        """Why the store is unavailable, in one line ("" when it is available)."""
        if self.unreachable is not None:
            part, why = self.unreachable
            return f"state store unavailable ({part}): {why}"
        if self.refused:
            return "state store refuses " + "; ".join(
                f"{part}: {why}" for part, why in sorted(self.refused.items())
            )
        return ""

    def ok(self, part: str) -> None:
        """A call of `part` succeeded: the store answers, and does not refuse `part`."""
        if self.unreachable is None and part not in self.refused and part in self._parts:
            return  # the common case, kept cheap
        self.unreachable = None
        self.refused.pop(part, None)
        self._changed(part)

    def failed(self, part: str, error: StoreError) -> None:
        """A call of `part` failed with `error` (a `ConflictError` is not a failure)."""
        if isinstance(error, ConflictError):
            self.ok(part)
            return
        why = " ".join(str(error).split())[:_WHY] or type(error).__name__
        if isinstance(error, StoreUnreachable):
            self.unreachable = (part, why)
        else:
            self.refused[part] = why
        self._changed(part)

    def _changed(self, part: str) -> None:
        if self.metrics is not None:
            gauge = self.metrics.store_part_up
            if part not in self._parts:
                self._parts.add(part)
            for p in self._parts:
                up = self.unreachable is None and p not in self.refused
                gauge.labels(self.cluster, p).set(1 if up else 0)
            self.metrics.store_up.labels(self.cluster).set(1 if self.available else 0)
        else:
            self._parts.add(part)
        now = self.available
        if now != self._available:
            if self._available is not None:
                if now:
                    log.info("state store available")
                else:
                    log.error(
                        "state store unavailable; serving from memory", extra={"why": self.reason}
                    )
            self._available = now
            for f in self.on_change:
                f(now)


class MonitoredWorkflowStore:
    """A `WorkflowStore` whose every call reports to `health` (part `workflows`)."""

    part = "workflows"

    def __init__(self, inner: WorkflowStore, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health

    def _failed(self, e: StoreError) -> None:
        self.health.failed(self.part, e)

    async def put(self, workflow_id: str, data: bytes, expected_version: int) -> int:
        try:
            v = await self.inner.put(workflow_id, data, expected_version)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return v

    async def get(self, workflow_id: str) -> WorkflowRecord | None:
        try:
            rec = await self.inner.get(workflow_id)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return rec

    async def list(self) -> dict[str, WorkflowRecord]:
        try:
            records = await self.inner.list()
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return records

    async def delete(self, workflow_id: str, expected_version: int) -> None:
        try:
            await self.inner.delete(workflow_id, expected_version)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)

    async def quarantine(self, workflow_id: str, expected_version: int, reason: str) -> None:
        try:
            await self.inner.quarantine(workflow_id, expected_version, reason)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)

    async def quarantined(self) -> dict[str, Quarantined]:
        try:
            records = await self.inner.quarantined()
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return records


class MonitoredRateLimiter:
    """A `RateLimiter` whose every call reports to `health` (part `rate limits`)."""

    part = "rate limits"

    def __init__(self, inner: RateLimiter, health: StoreHealth) -> None:
        self.inner = inner
        self.health = health

    def _failed(self, e: StoreError) -> None:
        self.health.failed(self.part, e)

    async def acquire(self, request: Request) -> Decision:
        try:
            d = await self.inner.acquire(request)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return d

    async def refund(self, receipt: Receipt) -> bool:
        try:
            done = await self.inner.refund(receipt)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return done

    async def start_cooldown(self, name: str, seconds: float) -> None:
        try:
            await self.inner.start_cooldown(name, seconds)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)

    async def cooldown_remaining(self, name: str) -> float:
        try:
            left = await self.inner.cooldown_remaining(name)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return left

    async def renew_slot(self, slot: Slot) -> bool:
        try:
            renewed = await self.inner.renew_slot(slot)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return renewed

    async def release_slot(self, name: str, holder: str) -> None:
        try:
            await self.inner.release_slot(name, holder)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)

    async def slot_holders(self, name: str) -> dict[str, float]:
        try:
            holders = await self.inner.slot_holders(name)
        except StoreError as e:
            self._failed(e)
            raise
        self.health.ok(self.part)
        return holders
