"""Workflows as persisted state machines.

A workflow is a record (kind, node, current step, data) in the workflow store. Advancing it runs
the current step's handler (looked up in the `Registry` the engine was built with) and writes the
next step with compare-and-set, so two replicas never both advance the same workflow, and a
controller killed at any point resumes from the last written step.

Only the leader advances workflows. A step is claimed (compare-and-set) before it runs, with the
process's identity (`INSTANCE`) and a deadline. A claim of another process can only have been
made while that process led, so it has lost the Lease since (it was killed, or partitioned from
the API server): the leader takes it over at once instead of waiting out the deadline. Should
the other process still be running the step, the gate refuses its mutations (it is no longer
the leader) and its write of the step's result fails the compare-and-set; steps are idempotent.
The leader's own claims are left alone until their deadline. Steps are idempotent: a step
that acts first checks whether its action already happened (e.g. an evicting step whose pod is
gone or terminating is done, not repeated).

One bad item never stops the others: records are decoded one at a time and one that does not
decode is quarantined (moved aside in the store, counted, logged); a step that raises is counted,
retried with backoff, and after its kind's `max_errors` goes where the kind's `give_up` says
(abandoned, with an Event and a metric, unless the kind must first undo what it did).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import uuid
from collections import Counter

import msgspec

from pyctl.cluster.bounds import MAX_NAME_CHARS, MAX_TEXT_CHARS
from pyctl.state.workflows import ConflictError, WorkflowRecord, WorkflowStore
from pyctl.workflows.base import (
    FINISHED,
    Context,
    Registry,
    Workflow,
    WorkflowData,
    legacy_data,
    tag_of,
)

log = logging.getLogger("pyctl.workflows")

__all__ = ["FINISHED", "Context", "Engine", "Workflow", "WorkflowData"]

_ENC = msgspec.json.Encoder()
#: this process, as it signs its claims (a restarted controller is another process)
INSTANCE = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
#: a step's `not_before` is never further away than this (a rate limit's wait is capped there)
MAX_WAIT = 3600.0


class _Legacy(msgspec.Struct):
    """A record as written before each kind's data was typed: the data an object of strings."""

    id: str
    kind: str
    node: str
    step: str
    created: float
    updated: float = 0.0
    attempts: int = 0
    not_before: float = 0.0
    data: dict[str, str] = {}
    result: str = ""
    claimed_until: float = 0.0
    claimed_by: str = ""


class _Schema(msgspec.Struct):
    schema: str | None = None


class _Tagged(msgspec.Struct):
    data: _Schema | None = None


_LEGACY = msgspec.json.Decoder(_Legacy)
_TAGGED = msgspec.json.Decoder(_Tagged)


def _read(data: bytes, registry: Registry) -> Workflow[WorkflowData]:
    """The record as the registry's kinds read it; one in the shape written before the data was
    typed (no ``schema`` in its data) through `legacy_data`."""
    try:
        return registry.decoder.decode(data)
    except msgspec.DecodeError as e:
        error = e
    try:
        tagged = _TAGGED.decode(data)
    except msgspec.DecodeError:
        tagged = None
    if tagged is not None and tagged.data is not None and tagged.data.schema is not None:
        tag = tagged.data.schema
        if tag not in registry.tags():
            raise ValueError(
                f"workflow record: data version {tag[:100]!r} is not one pyctl reads "
                f"({', '.join(registry.tags())})"
            ) from None
        raise ValueError(f"not a workflow record: {error}") from None
    try:
        old = _LEGACY.decode(data)
    except msgspec.DecodeError:
        raise ValueError(f"not a workflow record: {error}") from None
    kind = registry.get(old.kind)
    if kind is None:
        raise ValueError(f"workflow record: unknown kind {old.kind[:100]!r}")
    try:
        typed = legacy_data(kind.data, old.data)
    except ValueError as e:
        raise ValueError(f"workflow record in the untyped shape: {e}") from None
    fields = msgspec.structs.asdict(old)
    fields["data"] = typed
    return Workflow(**fields)


def decode(data: bytes, registry: Registry) -> Workflow[WorkflowData]:
    """A stored workflow of one of the `registry`'s kinds; raises ValueError when it is not one
    (or holds a non-finite time, a string beyond its bound: a node's name beyond 253
    characters, a kind that is none of the registry's: no engine would ever advance or forget
    it, data of another kind's type or of a version pyctl does not read). A record written
    before each kind's data was typed is read through `base.legacy_data`."""
    try:
        wf = _read(data, registry)
    except RecursionError:  # msgspec's decoders refuse JSON nested past their depth this way
        raise ValueError("workflow record: nested too deeply") from None
    for name in ("created", "updated", "not_before", "claimed_until"):
        if not math.isfinite(getattr(wf, name)):
            raise ValueError(f"workflow record: {name} is not a finite number")
    if not wf.id or not wf.kind or wf.attempts < 0:
        raise ValueError("workflow record: empty id or kind, or negative attempts")
    for name, high in (
        ("node", MAX_NAME_CHARS),
        ("id", MAX_TEXT_CHARS),
        ("kind", MAX_TEXT_CHARS),
        ("step", MAX_TEXT_CHARS),
        ("claimed_by", MAX_TEXT_CHARS),
    ):
        n = len(getattr(wf, name))
        if n > high:
            raise ValueError(f"workflow record: {name} of {n} characters, more than {high}")
    kind = registry.get(wf.kind)
    if kind is None:
        raise ValueError(f"workflow record: unknown kind {wf.kind[:100]!r}")
    if type(wf.data) is not kind.data:
        raise ValueError(
            f"workflow record: kind {wf.kind[:100]!r} holds the data of {tag_of(type(wf.data))}"
        )
    return wf


def _finite(wf: Workflow[WorkflowData], now: float) -> Workflow[WorkflowData]:
    """Every time written is finite, and a wait is at most `MAX_WAIT`."""
    nb = wf.not_before
    if not math.isfinite(nb) or nb > now + MAX_WAIT:
        nb = now + MAX_WAIT if nb == nb else now
    claimed = wf.claimed_until if math.isfinite(wf.claimed_until) else 0.0
    if nb != wf.not_before or claimed != wf.claimed_until:
        wf = msgspec.structs.replace(wf, not_before=nb, claimed_until=claimed)
    return wf


class Engine:
    def __init__(
        self,
        store: WorkflowStore,
        ctx: Context,
        registry: Registry,
        retention_seconds: float = 600.0,
        kinds: tuple[str, ...] | None = None,
        claim_ttl: float = 60.0,
        instance: str = INSTANCE,
    ) -> None:
        self.store = store
        self.ctx = ctx
        self.registry = registry
        self.retention = retention_seconds
        #: the workflow kinds this engine advances (several engines may share one store)
        self.kinds = kinds
        #: how long a claimed step is left to the process that claimed it
        self.claim_ttl = claim_ttl
        #: the process the claims of this engine are signed with
        self.instance = instance

    def now(self) -> float:
        """The engine's clock (wall-clock seconds)."""
        return self.ctx.clock()

    async def start(self, wf: Workflow[WorkflowData]) -> bool:
        """Create the workflow unless one with its id exists (then False: idempotent)."""
        try:
            await self.store.put(wf.id, _ENC.encode(_finite(wf, self.ctx.clock())), 0)
        except ConflictError:
            return False
        log.info("workflow started", extra={"workflow": wf.id, "kind": wf.kind, "node": wf.node})
        return True

    async def workflows(self) -> list[Workflow[WorkflowData]]:
        """Every stored workflow that decodes (of every kind); the others are quarantined."""
        out = []
        for wid, rec in sorted((await self.store.list()).items()):
            wf = await self._decode(wid, rec)
            if wf is not None:
                out.append(wf)
        return out

    async def _decode(self, wid: str, rec: WorkflowRecord) -> Workflow[WorkflowData] | None:
        try:
            wf = decode(rec.data, self.registry)
            if wf.id != wid:
                raise ValueError(f"record under {wid!r} names the workflow {wf.id!r}")
            return wf
        except ValueError as e:
            why = str(e)
        gate = self.ctx.gate
        try:
            await self.store.quarantine(wid, rec.version, why[:1000])
        except ConflictError:  # another engine (or replica) moved it first, or it changed
            return None
        # counted and logged by whoever moved it aside: once per record
        log.error(
            "workflow record does not decode; quarantined",
            extra={"workflow": wid, "error": why[:300]},
        )
        gate.metrics.workflow.quarantined.labels(gate.cluster, "workflows").inc()
        return None

    async def advance_all(self) -> Counter[tuple[str, str]]:
        """Advance every due workflow of this engine's kinds by one step; forget finished ones
        past the retention. Returns the count of workflows by (kind, step) afterwards."""
        now = self.ctx.clock()
        counts: Counter[tuple[str, str]] = Counter()
        for wid, rec in sorted((await self.store.list()).items()):
            wf = await self._decode(wid, rec)
            if wf is None or (self.kinds is not None and wf.kind not in self.kinds):
                continue
            if wf.finished:
                if now - wf.updated > self.retention:
                    with contextlib.suppress(ConflictError):
                        await self.store.delete(wid, rec.version)
                    continue
            elif wf.not_before <= now and not self._claimed(wf, now):
                wf = await self._advance(wf, rec.version, now)
            counts[(wf.kind, wf.step)] += 1
        return counts

    def _claimed(self, wf: Workflow[WorkflowData], now: float) -> bool:
        """Whether the step is left alone now: claimed by this process, until its deadline. (A
        claim of another process is taken over: see the module's doc; the engine is advanced
        by the leader only.)"""
        return wf.claimed_until > now and wf.claimed_by == self.instance

    async def _advance(
        self, wf: Workflow[WorkflowData], version: int, now: float
    ) -> Workflow[WorkflowData]:
        # claim the step first (compare-and-set): only the replica whose claim is written acts,
        # so two replicas never both run a step
        if wf.claimed_until > now:
            log.info(
                "taking over a step claimed by a process that no longer leads",
                extra={"workflow": wf.id, "step": wf.step, "claimed_by": wf.claimed_by},
            )
        claim = msgspec.structs.replace(
            wf, claimed_until=now + self.claim_ttl, claimed_by=self.instance
        )
        try:
            version = await self.store.put(wf.id, _ENC.encode(claim), version)
        except ConflictError:
            return wf
        new = await self._run_step(claim)
        new = _finite(
            msgspec.structs.replace(
                new, updated=self.ctx.clock(), claimed_until=0.0, claimed_by=""
            ),
            self.ctx.clock(),
        )
        try:
            await self.store.put(wf.id, _ENC.encode(new), version)
        except ConflictError:
            return wf
        if new.finished and not wf.finished:
            log.info("workflow finished", extra={"workflow": wf.id, "result": new.result})
            if new.step == "abandoned":
                await self._announce_abandoned(new)
        return new

    async def _run_step(self, wf: Workflow[WorkflowData]) -> Workflow[WorkflowData]:
        kind = self.registry.get(wf.kind)
        handler = kind.steps.get(wf.step) if kind is not None else None
        if kind is None or handler is None:
            return msgspec.structs.replace(
                wf, step="abandoned", result=f"no step {wf.step!r} of kind {wf.kind!r}"
            )
        gate = self.ctx.gate
        try:
            return await handler(self.ctx, wf)
        except Exception as e:  # one failing step never stops the others
            error = f"{type(e).__name__}: {e}"[:500]
            gate.metrics.workflow.step_errors.labels(gate.cluster, wf.kind, wf.step).inc()
            log.warning(
                "workflow step failed; will retry",
                extra={"workflow": wf.id, "step": wf.step, "error": error},
            )
            attempts = wf.attempts + 1
            new = msgspec.structs.replace(
                wf,
                attempts=attempts,
                not_before=self.ctx.clock() + min(kind.backoff_max, kind.backoff**attempts),
                result=error,
            )
            if attempts >= kind.max_errors:
                new = kind.give_up(new, error)
            return new

    async def _announce_abandoned(self, wf: Workflow[WorkflowData]) -> None:
        gate = self.ctx.gate
        gate.metrics.workflow.abandoned.labels(gate.cluster, wf.kind).inc()
        await gate.event(
            "Node",
            "",
            wf.node,
            "PyctlWorkflowAbandoned",
            f"pyctl gave up workflow {wf.id} ({wf.kind}, step {wf.step}): {wf.result}"[:1000],
            warning=True,
        )

    async def get(self, wid: str) -> Workflow[WorkflowData] | None:
        rec = await self.store.get(wid)
        if rec is None:
            return None
        return await self._decode(wid, rec)
