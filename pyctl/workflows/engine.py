"""Workflows as persisted state machines.

A workflow is a record (kind, node, current step, data) in the workflow store. Advancing it runs
the current step's handler and writes the next step with compare-and-set, so two replicas never
both advance the same workflow, and a controller killed at any point resumes from the last written
step. Steps are idempotent: a step that acts first checks whether its action already happened
(e.g. an evicting step whose pod is gone or terminating is done, not repeated).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec

from pyctl.cluster.records import PodRecord
from pyctl.state.workflows import ConflictError, WorkflowStore
from pyctl.workflows.gate import Gate

log = logging.getLogger("pyctl.workflows")

FINISHED = ("done", "dry-run", "failed", "abandoned")


class Workflow(msgspec.Struct):
    id: str
    kind: str
    node: str
    step: str
    created: float
    updated: float = 0.0
    attempts: int = 0
    #: wall-clock time before which the step is not retried (rate limits, PDB refusals)
    not_before: float = 0.0
    data: dict[str, str] = {}
    result: str = ""
    #: a replica is running this step until then (others leave it alone; a crashed replica's
    #: claim expires and the idempotent step is run again)
    claimed_until: float = 0.0

    @property
    def finished(self) -> bool:
        return self.step in FINISHED


_ENC = msgspec.json.Encoder()
_DEC = msgspec.json.Decoder(Workflow)


@dataclass
class Context:
    gate: Gate
    #: the pod as the controller sees it now (None: gone)
    pod: Callable[[str, str], PodRecord | None]
    clock: Callable[[], float] = time.time


Handler = Callable[[Context, Workflow], Awaitable[Workflow]]


async def _compaction_evicting(ctx: Context, wf: Workflow) -> Workflow:
    ns, name, uid = wf.data["namespace"], wf.data["pod"], wf.data["uid"]
    pod = ctx.pod(ns, name)
    if pod is None or pod.uid != uid or pod.deleting or pod.node != wf.node:
        # the eviction already happened (or the pod moved on by itself): never evict twice
        return msgspec.structs.replace(wf, step="done", result="pod already gone")
    r = await ctx.gate.evict(wf.node, ns, name, wf.data.get("workload", ""), uid)
    now = ctx.clock()
    if r.outcome == "done":
        return msgspec.structs.replace(wf, step="done", result="evicted")
    if r.outcome == "dry-run":
        return msgspec.structs.replace(wf, step="dry-run", result="observe mode")
    attempts = wf.attempts + 1
    if attempts >= int(wf.data.get("max_attempts", "20")):
        return msgspec.structs.replace(wf, step="abandoned", attempts=attempts, result=r.reason)
    return msgspec.structs.replace(
        wf, attempts=attempts, not_before=now + max(r.retry_after, 1.0), result=r.reason
    )


HANDLERS: dict[tuple[str, str], Handler] = {
    ("compaction", "evicting"): _compaction_evicting,
}


class Engine:
    def __init__(
        self,
        store: WorkflowStore,
        ctx: Context,
        retention_seconds: float = 600.0,
        kinds: tuple[str, ...] | None = None,
        claim_ttl: float = 60.0,
    ) -> None:
        self.store = store
        self.ctx = ctx
        self.retention = retention_seconds
        #: the workflow kinds this engine advances (several engines may share one store)
        self.kinds = kinds
        #: how long a claimed step is left to the replica that claimed it
        self.claim_ttl = claim_ttl

    async def start(self, wf: Workflow) -> bool:
        """Create the workflow unless one with its id exists (then False: idempotent)."""
        try:
            await self.store.put(wf.id, _ENC.encode(wf), 0)
        except ConflictError:
            return False
        log.info("workflow started", extra={"workflow": wf.id, "kind": wf.kind, "node": wf.node})
        return True

    async def advance_all(self) -> Counter[tuple[str, str]]:
        """Advance every due workflow by one step; forget finished ones past the retention.
        Returns the count of workflows by (kind, step) afterwards."""
        now = self.ctx.clock()
        counts: Counter[tuple[str, str]] = Counter()
        for wid, rec in sorted((await self.store.list()).items()):
            wf = _DEC.decode(rec.data)
            if self.kinds is not None and wf.kind not in self.kinds:
                continue
            if wf.finished:
                if now - wf.updated > self.retention:
                    with contextlib.suppress(ConflictError):
                        await self.store.delete(wid, rec.version)
                    continue
            elif wf.not_before <= now and wf.claimed_until <= now:
                handler = HANDLERS.get((wf.kind, wf.step))
                # claim the step first (compare-and-set): only the replica whose claim is
                # written acts, so two replicas never both run a step
                claim = msgspec.structs.replace(wf, claimed_until=now + self.claim_ttl)
                try:
                    version = await self.store.put(wid, _ENC.encode(claim), rec.version)
                except ConflictError:
                    continue
                if handler is None:
                    new = msgspec.structs.replace(wf, step="failed", result=f"no step {wf.step!r}")
                else:
                    new = await handler(self.ctx, claim)
                new = msgspec.structs.replace(new, updated=self.ctx.clock(), claimed_until=0.0)
                try:
                    await self.store.put(wid, _ENC.encode(new), version)
                    wf = new
                except ConflictError:
                    continue
                if wf.finished:
                    log.info("workflow finished", extra={"workflow": wid, "result": wf.result})
            counts[(wf.kind, wf.step)] += 1
        return counts

    async def get(self, wid: str) -> Workflow | None:
        rec = await self.store.get(wid)
        return None if rec is None else _DEC.decode(rec.data)
