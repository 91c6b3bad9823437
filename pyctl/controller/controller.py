"""The controller: the `EventSink` that watch events flow into, and the loops that turn them into
state and scores.

  source ─events─▶ cache (+ store writer) ─dirty nodes─▶ work queue ─▶ reconcile (core)
                                                   summary (bounded rate) ─▶ metrics, federation

The store is written in batches by one task; when it fails the controller keeps serving from
memory, reports not ready, and re-syncs the whole cache once the store answers again. Whether the
store works is known in one place, `store_health` (pyctl/state/health.py): the store loop, the
summary, the workflows and rate limits (wired by the application) and a probe that pings the
store every `store_probe_interval` seconds report to it; `/readyz` and `pyctl_store_up` read it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.lowlevel

from pyctl.cluster.records import (
    KINDS,
    Event,
    Kind,
    ObjectRef,
    PodRecord,
    Record,
    record_key,
    record_kind,
)
from pyctl.cluster.source import ClusterSource
from pyctl.controller.cache import ClusterCache
from pyctl.controller.ignored import EventSender, IgnoredObjects
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import FederationEncoder, Summary
from pyctl.controller.workload import WorkloadScope
from pyctl.controller.workqueue import WorkQueue
from pyctl.metrics import Metrics
from pyctl.model import DEFAULT_TOPOLOGY_POLICY, Workload
from pyctl.state.health import StoreHealth
from pyctl.state.store import StateLostError, StateStore, StoreError, StoreUnreachable

log = logging.getLogger("pyctl.controller")

#: seconds between two summaries (metrics, the store); the `summary_interval` setting's default
SUMMARY_INTERVAL: Final = 1.0
#: seconds between two derivations of the workload M; the `workload_interval` setting's default
WORKLOAD_INTERVAL: Final = 30.0
#: seconds between two federation summaries (they hold every node's model); members are read
#: (`pyctl.federation.watch_members`) at the same interval
FEDERATION_INTERVAL: Final = 10.0


@dataclass
class ControllerStats:
    events: int = 0
    reconciles: int = 0
    store_writes: int = 0
    lags: list[float] = field(default_factory=list)
    keep_lags: bool = False


class Controller:
    def __init__(
        self,
        cluster: str,
        source: ClusterSource,
        store: StateStore,
        metrics: Metrics | None = None,
        workload: Workload | None = None,
        summary_interval: float = SUMMARY_INTERVAL,
        default_policy: str = DEFAULT_TOPOLOGY_POLICY,
        is_leader: Callable[[], bool] = lambda: True,
        on_summary: Callable[[Summary], None] | None = None,
        flush_interval: float = 0.005,
        flush_events: int = 2000,
        workload_interval: float = WORKLOAD_INTERVAL,
        scope: WorkloadScope | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.source = source
        self.store = store
        self.metrics = metrics or Metrics()
        self.cache = ClusterCache()
        self.queue = WorkQueue()
        #: objects left out of the view (counted, logged, an Event on an ignored pod)
        self.ignored = IgnoredObjects(self.metrics, cluster)
        self.reconciler = Reconciler(
            self.cache, self.metrics, cluster, workload, default_policy, scope, self.ignored
        )
        #: how Events on ignored pods are written (set by the application in enforce mode; only
        #: the leader sends them)
        self.event_sender: EventSender | None = None
        self.summary_interval = summary_interval
        self.is_leader = is_leader
        self.on_summary = on_summary
        self.flush_interval = flush_interval
        self.flush_events = flush_events
        self.stats = ControllerStats()
        self.workload_interval = workload_interval
        #: the clock of the summary's and the workload's intervals (virtual on the simulated
        #: cluster; watch-event lags are always wall-clock)
        self.clock = clock
        self._workload_at = -math.inf
        #: seconds between two federation summaries (they hold every node's model)
        self.federation_interval = FEDERATION_INTERVAL
        self._published_at = -1e9
        #: the federation summary's encoder (keeps each node's encoded model between publishes)
        self.federation = FederationEncoder()
        self.synced: set[Kind] = set()
        #: when every node known at the initial sync had been scored (monotonic; None: not yet)
        self.scored_at: float | None = None
        #: set (in `run`) once every kind has been listed, and once every node of those lists
        #: is scored: the worker starts at the first, the loops that act at the second
        self._listed: anyio.Event | None = None
        self._scored: anyio.Event | None = None
        self._started = time.monotonic()
        #: the mirror's own last write succeeded (see `store_health` for the whole store)
        self.store_ok = False
        #: whether the store works, for every part of this controller that uses it
        self.store_health = StoreHealth(self.metrics, cluster)
        self.store_health.on_change.append(self._store_changed)
        #: seconds between two pings of the store (an outage is seen while nothing else calls)
        self.store_probe_interval = 2.0
        self._resync = True
        self._reopen = False
        #: called once the store is written whole again (at start, and after an outage): the
        #: Redis clients drop the idle connections an outage left open (`release_idle`)
        self.after_resync: list[Callable[[], Awaitable[None]]] = []
        self._pending_events: list[Event] = []
        self._pending_rv: dict[Kind, str] = {}
        self._pending_replace: dict[Kind, tuple[list[Record], str]] = {}
        #: the last resourceVersion seen per kind (what a re-sync writes with the records)
        self._seen_rv: dict[Kind, str] = {}
        self._store_wakeup = anyio.Event()
        self.last_summary: Summary | None = None
        self._counters: dict[tuple[str, str], Any] = {}
        #: more loops to run beside the controller's own (e.g. the compaction loop)
        self.background: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._lag = self.metrics.event_lag.labels(cluster)
        for kind in KINDS:
            self.metrics.kind_listed.labels(cluster, kind).set(0)

    # -- EventSink -------------------------------------------------------------------------
    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        now = self.clock()
        if kind == "Pod":
            for r in records:
                self.reconciler.window.observe(self.cache.pods.get(record_key(r)), r, now)  # type: ignore[arg-type]
        for n in self.cache.replace(kind, records):
            self.queue.add(n)
        first_sync = kind not in self.synced and all(k in self.synced or k == kind for k in KINDS)
        self.synced.add(kind)
        if first_sync:
            if self._listed is not None:
                self._listed.set()
            # every kind is listed: derive M from the pods now, before the nodes are scored
            # with the default one (scoring them again when the summary derives it)
            self._workload_at = now
            if self.reconciler.refresh_workload():
                for n in self.cache.nodes:
                    self.queue.add(n)
            if not len(self.queue):
                self._initial_scores()
        self.metrics.relists.labels(self.cluster, kind).inc()
        self.metrics.kind_listed.labels(self.cluster, kind).set(1)
        self._pending_replace[kind] = (list(records), resource_version)
        self._seen_rv[kind] = resource_version
        self._pending_events = [e for e in self._pending_events if record_kind(e.record) != kind]
        self._store_wakeup.set()

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        now = self.clock()
        window = self.reconciler.window
        counts: dict[tuple[str, str], int] = {}
        pods = self.cache.pods
        for ev in events:
            rec = ev.record
            if isinstance(rec, PodRecord):
                kind = "Pod"
                window.observe(pods.get(rec.key), None if ev.type == "DELETED" else rec, now)
            else:
                kind = record_kind(rec)
            counts[(kind, ev.type)] = counts.get((kind, ev.type), 0) + 1
        for (kind, typ), count in counts.items():
            self._event_counter(kind, typ).inc(count)
        for node in self.cache.apply(events):
            self.queue.add(node)
        self.stats.events += len(events)
        self._pending_events.extend(events)
        self._pending_rv.update(resource_versions)
        self._seen_rv.update(resource_versions)
        if len(self._pending_events) >= self.flush_events:
            self._store_wakeup.set()

    def _event_counter(self, kind: str, typ: str) -> Any:
        c = self._counters.get((kind, typ))
        if c is None:
            c = self._counters[(kind, typ)] = self.metrics.watch_events.labels(
                self.cluster, kind, typ
            )
        return c

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        """An object the source could not decode: counted (`pyctl_decode_errors_total` per
        occurrence), and left out as an ignored object (counted once, logged once, an Event on
        a pod); the source drops its previous version from the view."""
        self.metrics.decode_errors.labels(self.cluster, kind).inc()
        self.ignored.report(kind, reason, message, ref)

    # -- readiness -------------------------------------------------------------------------
    def ready(self) -> tuple[bool, str]:
        missing = [k for k in KINDS if k not in self.synced]
        if missing:
            return False, f"not synced: {', '.join(missing)}"
        if not self.store_health.available:
            return False, self.store_health.reason
        if not self.store_ok or self._resync:
            return False, "state store: re-syncing the mirror from memory"
        return True, "ok"

    def _store_changed(self, available: bool) -> None:
        """The store became unavailable: it may come back without what was written (a Redis
        restarted empty) or without the writes missed meanwhile, so everything is written again
        once it answers; it became available: do so now."""
        if not available:
            self._resync = True
        self._store_wakeup.set()

    @property
    def store_synced(self) -> bool:
        """The store holds every kind as the cache does (written since the last re-sync)."""
        return self.store_ok and not self._resync

    # -- loops -----------------------------------------------------------------------------
    async def _flush(self) -> None:
        replaces, self._pending_replace = self._pending_replace, {}
        events, self._pending_events = self._pending_events, []
        rvs, self._pending_rv = self._pending_rv, {}
        if self._resync:
            # re-sync everything from the cache (at start, and after the store was unreachable)
            replaces = {}
            for kind in KINDS:
                if kind in self.synced:
                    replaces[kind] = (self.cache.records(kind), self._seen_rv.get(kind, ""))
            events = []
        try:
            if self._reopen:
                # the store lost its state (e.g. Redis restarted empty): open it again, re-sync
                await self.store.open()
                self._reopen = False
            for kind, (records, rv) in replaces.items():
                await self.store.replace(kind, records, rv)
            if events or rvs:
                await self.store.apply(events, rvs)
        except StoreError as e:
            self.metrics.store_errors.labels(self.cluster).inc()
            if isinstance(e, StateLostError):
                self._reopen = True
            self.store_ok = False
            self._resync = True
            self.store_health.failed("mirror", e)
            return
        if self._resync and all(k in self.synced for k in KINDS):
            if replaces:
                log.info("state store re-synced", extra={"kinds": len(replaces)})
            self._resync = False
            for release in self.after_resync:
                try:
                    await release()
                except Exception:  # housekeeping: never stops the store loop
                    log.exception("releasing the store's idle connections failed")
        self.store_ok = True
        self.store_health.ok("mirror")
        self.stats.store_writes += 1
        now = time.monotonic()
        lag = self._lag
        keep = self.stats.lags if self.stats.keep_lags else None
        for ev in events:
            if ev.received:
                lag.observe(now - ev.received)
                if keep is not None:
                    keep.append(now - ev.received)

    async def _probe_loop(self) -> None:
        """Ping the store every `store_probe_interval` seconds: an outage is seen (and its end)
        even when no event, summary or workflow calls it."""
        while True:
            await anyio.sleep(self.store_probe_interval)
            if await self.store.ping():
                self.store_health.ok("probe")
            else:
                self.store_health.failed("probe", StoreUnreachable("it does not answer a ping"))

    async def _store_loop(self) -> None:
        while True:
            with anyio.move_on_after(self.flush_interval if self.store_ok else 1.0):
                await self._store_wakeup.wait()
            self._store_wakeup = anyio.Event()
            if self._pending_events or self._pending_replace or self._pending_rv or self._resync:
                await self._flush()

    async def _worker(self, tg: anyio.abc.TaskGroup) -> None:
        # as client-go's controllers wait for their informers' sync: a node is modelled on
        # every kind's list, never on the nodes without their pods (scored as empty, advised
        # on, re-scored a moment later)
        assert self._listed is not None
        await self._listed.wait()
        while (key := await self.queue.get()) is not None:
            try:
                self.reconciler.reconcile(key)
                self.stats.reconciles += 1
                self.queue.forget(key)
            except Exception:
                log.exception("reconcile failed; will retry", extra={"node": key})
                self.metrics.reconcile_errors.labels(self.cluster).inc()
                tg.start_soon(self.queue.add_rate_limited, key)
            finally:
                self.queue.done(key)
            self.metrics.workqueue_depth.labels(self.cluster).set(len(self.queue))
            if self.scored_at is None and not len(self.queue):
                self._initial_scores()
            await anyio.lowlevel.checkpoint()

    def _initial_scores(self) -> None:
        """Log once when every kind has been listed and the queue has drained since: each node
        of the initial lists has a score (or is counted as not understood)."""
        if any(k not in self.synced for k in KINDS):
            return
        self.scored_at = time.monotonic()
        if self._scored is not None:
            self._scored.set()
        r = self.reconciler
        log.info(
            "every node scored",
            extra={
                "nodes": len(r.scores),
                "bad_nodes": len(r.bad_nodes),
                "pods": len(self.cache.pods),
                # reconciles beyond the nodes are rework: events during the start-up, M changed
                "reconciles": self.stats.reconciles,
                "events": self.stats.events,
                "seconds": round(self.scored_at - self._started, 3),
            },
        )

    def summarize(self) -> Summary:
        # M is a slowly varying distribution: re-derive it at a slow rate, since a change means
        # re-scoring every node
        now = self.clock()
        if now - self._workload_at >= self.workload_interval or self.reconciler.workload_unset:
            self._workload_at = now
            if self.reconciler.refresh_workload():
                log.info(
                    "workload M changed; every node is re-scored",
                    extra={
                        "shapes": len(self.reconciler.workload.shapes),
                        "nodes": len(self.cache.nodes),
                    },
                )
                for n in self.cache.nodes:
                    self.queue.add(n)
        s = self.reconciler.summary(now)
        self.last_summary = s
        self._export_leader()
        return s

    def _export_leader(self) -> None:
        self.metrics.leader.labels(self.cluster).set(1 if self.is_leader() else 0)

    async def publish(self, s: Summary) -> bool:
        """Publish the federation summary (with every node's model, M and a heartbeat) when the
        store works, this replica holds the Lease and `federation_interval` has passed (wall
        clock) since the last, once every node of the initial lists is scored; True if it was
        published. Only the leader publishes: a fresh heartbeat says the replica that acts is
        alive, has the whole view and its writes to the store succeed (`pyctl status`,
        docs/state.md)."""
        now = time.monotonic()
        if not self.store_ok or now - self._published_at < self.federation_interval:
            return False
        if self.scored_at is None:  # a partial view would replace the last whole one
            return False
        if not self.is_leader():
            return False
        # the federation summary carries every node's model: published at a slow rate
        self._published_at = now
        try:
            data = self.federation.encode(s, self.reconciler.models, self.reconciler.workload)
        except ValueError as e:  # a value out of its bounds: not published
            log.error("summary not published", extra={"error": str(e)[:300]})
            return False
        try:
            await self.store.put_summary(data, int(max(30, 3 * self.federation_interval)))
        except StoreError as e:
            self.metrics.store_errors.labels(self.cluster).inc()
            self.store_health.failed("summary", e)
            return False
        self.store_health.ok("summary")
        return True

    async def _send_events(self) -> None:
        if self.event_sender is not None and self.ignored.queued_events and self.is_leader():
            await self.ignored.send_events(self.event_sender, time.monotonic())

    async def _summary_loop(self) -> None:
        while True:
            await anyio.sleep(self.summary_interval)
            if self._scored is not None and not self._scored.is_set():
                # no summary until every node of the initial lists is scored: one before would
                # total part of the cluster (the metrics, the pending pods' reasons) and take
                # the event loop from the scoring it waits for; who holds the Lease is known
                self._export_leader()
                continue
            try:
                s = self.summarize()
                await self._send_events()
            except Exception:  # never fatal: the next interval tries again
                log.exception("summary failed; will retry")
                self.metrics.reconcile_errors.labels(self.cluster).inc()
                continue
            if self.on_summary:
                self.on_summary(s)
            await self.publish(s)

    async def drain(self) -> None:
        """Process everything queued now (tests, finite runs, the simulated cluster's lockstep)."""
        spins = 0
        while not self.queue.idle:
            if self._listed is not None and not self._listed.is_set():
                break  # the worker waits for every kind's list: nothing is reconciled before
            spins += 1
            if spins < 200:
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.sleep(0.001)
        await self._flush()

    def after_scored(
        self, loop: Callable[[], Coroutine[Any, Any, None]]
    ) -> Callable[[], Coroutine[Any, Any, None]]:
        """`loop` as a loop of `background` that starts once every node of the initial lists
        is scored: the loops that plan, act or report, never on nodes without their pods (a
        MIG GPU whose pods are not listed yet looks free), however long the lists take."""

        async def started() -> None:
            assert self._scored is not None  # set by `run`, which starts the loop
            await self._scored.wait()
            await loop()

        return started

    async def run(self, until_source_ends: bool = False) -> None:
        self._listed, self._scored = anyio.Event(), anyio.Event()
        if all(k in self.synced for k in KINDS):  # listed before it ran (tests)
            self._listed.set()
        if self.scored_at is not None:
            self._scored.set()
        try:
            await self.store.open()
            self.store_ok = True
            self.store_health.ok("mirror")
        except StoreError as e:
            log.error(
                "state store unavailable at start; serving from memory", extra={"error": str(e)}
            )
            self._reopen = True  # opened (the schema checked or written) once it answers
            self.store_health.failed("mirror", e)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._worker, tg)
            tg.start_soon(self._store_loop)
            if self.store_probe_interval > 0:
                tg.start_soon(self._probe_loop)
            if self.summary_interval > 0:
                tg.start_soon(self._summary_loop)
            for task in self.background:
                tg.start_soon(task)
            await self.source.run(self)
            if until_source_ends:
                await self.drain()
                s = self.summarize()
                if self.on_summary:
                    self.on_summary(s)
                self.queue.shutdown()
                tg.cancel_scope.cancel()
            else:
                await anyio.sleep_forever()
