"""client-go's reflector for one kind: list, then watch from the list's resourceVersion, forever.

    LIST (pages of `limit`, following `continue`) ─▶ sink.replace(kind, records, rv)
    WATCH ?resourceVersion=rv&allowWatchBookmarks=true&timeoutSeconds=T
        each line ─▶ decode_watch_line (raw bytes into records; no model classes)
        batches (every `batch_max` events, or `batch_delay` after the first) ─▶ sink.apply
        BOOKMARK ─▶ the resourceVersion only
        server closes the stream (timeoutSeconds) ─▶ watch again from the last rv
        410 Gone (an ERROR event, or the HTTP status) ─▶ relist (counted)
        connection dropped, timeout, ClientPayloadError, 5xx/429 ─▶ back off, watch from last rv
        an object that does not decode ─▶ sink.decode_error (its reason, and the object when its
            metadata reads), a DELETED event for it when named (its last good version leaves the
            view: an object pyctl cannot take is left out, not kept stale), go on
        the sink fails ─▶ back off, relist (the sink then gets a whole, consistent kind)

kubernetes-asyncio's `Watch` is not used: it builds model objects, retries a 410 with the same
stale resourceVersion and lets `ClientPayloadError` through (`shared/docs/control_plane.md` §11).
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, cast

import aiohttp
import anyio
import msgspec

from pyctl.cluster.kube.client import CONNECTION_ERRORS, KubeApiError, KubeClient, Query, api_error
from pyctl.cluster.kube.decode import (
    DecodeError,
    WatchError,
    decode_object,
    decode_watch_line,
    is_extended_resource,
)
from pyctl.cluster.records import Event, EventType, Kind, Record
from pyctl.cluster.source import EventSink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API."""

    kind: Kind
    group_version: str  # "v1" for the core group, else "group/version"
    plural: str
    namespaced: bool
    #: only watched when the API server serves it (a CRD): discovered, re-checked periodically
    optional: bool = False
    #: other group-versions of the same kind, of the same shape, tried in order when the API
    #: server does not serve `group_version` (an optional kind only)
    fallbacks: tuple[str, ...] = ()

    def path(self, namespace: str = "") -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if namespace and self.namespaced:
            return f"{base}/namespaces/{namespace}/{self.plural}"
        return f"{base}/{self.plural}"

    @property
    def discovery_path(self) -> str:
        return "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"

    def versions(self) -> tuple[Resource, ...]:
        """This resource, then its `fallbacks` as resources of their own."""
        return (self, *(replace(self, group_version=gv, fallbacks=()) for gv in self.fallbacks))


RESOURCES: Final[Mapping[Kind, Resource]] = {
    "Node": Resource("Node", "v1", "nodes", namespaced=False),
    "Pod": Resource("Pod", "v1", "pods", namespaced=True),
    "PodDisruptionBudget": Resource(
        "PodDisruptionBudget", "policy/v1", "poddisruptionbudgets", namespaced=True
    ),
    "NodeResourceTopology": Resource(
        "NodeResourceTopology",
        "topology.node.k8s.io/v1alpha2",
        "noderesourcetopologies",
        namespaced=False,
        optional=True,
    ),
    # Dynamic Resource Allocation: GA (resource.k8s.io/v1) since Kubernetes 1.34, watched where
    # the API server serves it
    "DeviceClass": Resource(
        "DeviceClass", "resource.k8s.io/v1", "deviceclasses", namespaced=False, optional=True
    ),
    "ResourceSlice": Resource(
        "ResourceSlice", "resource.k8s.io/v1", "resourceslices", namespaced=False, optional=True
    ),
    "ResourceClaim": Resource(
        "ResourceClaim", "resource.k8s.io/v1", "resourceclaims", namespaced=True, optional=True
    ),
    "ResourceClaimTemplate": Resource(
        "ResourceClaimTemplate",
        "resource.k8s.io/v1",
        "resourceclaimtemplates",
        namespaced=True,
        optional=True,
    ),
    # the fabric's sources (docs/fabric.md): the levels of Kueue's and KAI's Topology objects and
    # the NVIDIA DRA driver's cliques, watched where their CRDs are served
    # Kueue's storage version since v0.15, then the one older Kueues serve alone (the same
    # shape: `spec.levels[].nodeLabel`)
    "KueueTopology": Resource(
        "KueueTopology",
        "kueue.x-k8s.io/v1beta2",
        "topologies",
        namespaced=False,
        optional=True,
        fallbacks=("kueue.x-k8s.io/v1beta1",),
    ),
    "KaiTopology": Resource(
        "KaiTopology", "kai.scheduler/v1alpha1", "topologies", namespaced=False, optional=True
    ),
    "ComputeDomainClique": Resource(
        "ComputeDomainClique",
        "resource.nvidia.com/v1beta1",
        "computedomaincliques",
        namespaced=True,
        optional=True,
    ),
    # Volcano's HyperNode tree (levels) and its PodGroups (gangs of a hard networkTopology)
    "HyperNode": Resource(
        "HyperNode", "topology.volcano.sh/v1alpha1", "hypernodes", namespaced=False, optional=True
    ),
    "PodGroup": Resource(
        "PodGroup", "scheduling.volcano.sh/v1beta1", "podgroups", namespaced=True, optional=True
    ),
    # Kueue's Workloads: whether Kueue holds a gang back for what room does not give (quota)
    "KueueWorkload": Resource(
        "KueueWorkload",
        "kueue.x-k8s.io/v1beta2",
        "workloads",
        namespaced=True,
        optional=True,
        fallbacks=("kueue.x-k8s.io/v1beta1",),
    ),
}


@dataclass(frozen=True)
class ReflectorOptions:
    page_size: int = 500
    #: server-side watch duration; each watch asks for a random value in [T, 2T) (as client-go)
    watch_timeout: float = 300.0
    #: client-side read timeout beyond the server-side one (a silently dead connection)
    read_slack: float = 30.0
    batch_max: int = 512
    batch_delay: float = 0.005
    backoff_initial: float = 0.2
    backoff_max: float = 30.0
    #: how often an absent optional kind (the NodeResourceTopology CRD) is looked for again
    recheck_absent: float = 60.0
    namespace: str = ""
    label_selector: str = ""
    field_selector: str = ""
    #: the extended resource read as a node's and a pod's RDMA (`NodeRecord.rdma`: shared HCA
    #: devices such as `rdma/hca_shared_devices_a`, bandwidth shares); "": none
    rdma_resource: str = ""

    def __post_init__(self) -> None:
        if self.page_size < 0 or self.batch_max < 1:
            raise ValueError("reflector: page_size must be >= 0 and batch_max >= 1")
        for name in ("watch_timeout", "backoff_initial", "backoff_max", "recheck_absent"):
            if not getattr(self, name) > 0:
                raise ValueError(f"reflector: {name} must be > 0")
        if self.batch_delay < 0 or self.read_slack < 0:
            raise ValueError("reflector: batch_delay and read_slack must be >= 0")
        if self.rdma_resource and not is_extended_resource(self.rdma_resource):
            raise ValueError(
                f"reflector: rdma_resource {self.rdma_resource[:80]!r} is not an extended "
                "resource name (domain/name, outside kubernetes.io, not a GPU resource)"
            )


@dataclass
class ReflectorStats:
    """Counters for the controller's metrics (read them; the reflector writes them)."""

    #: full lists, including the first one (pyctl_watch_relists_total counts these)
    lists: int = 0
    #: lists caused by 410 Gone (the watch's resourceVersion was compacted away)
    relists: int = 0
    watches: int = 0
    events: int = 0
    events_by_type: Counter[str] = field(default_factory=Counter)
    bookmarks: int = 0
    batches: int = 0
    decode_errors: int = 0
    #: failures that made the reflector back off, by cause ("connection", "http_503", "sink", ...)
    errors: Counter[str] = field(default_factory=Counter)
    last_error: str = ""
    resource_version: str = ""
    #: the sink holds a whole list of the kind (False until the first replace, and while the kind
    #: is being relisted after a sink failure)
    synced: bool = False
    #: for an optional kind: whether the API server serves it (None: not looked yet)
    present: bool | None = None

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


class _Gone(Exception):
    """The resourceVersion is too old (410): list again."""


class _Absent(Exception):
    """The API server does not serve this resource (404 on an optional kind)."""


class _SinkFailed(Exception):
    pass


@dataclass
class _Batch:
    """A watch's events not yet handed to the sink, with the resourceVersion the watch reached
    (`rv`) and the one the sink has been told (`told`)."""

    sink: EventSink
    kind: Kind
    stats: ReflectorStats
    rv: str
    told: str
    events: list[Event] = field(default_factory=list)
    #: when the oldest event of the batch arrived
    first: float = 0.0

    def add(self, event: Event, now: float) -> None:
        if not self.events:
            self.first = now
        self.events.append(event)

    async def flush(self) -> None:
        """The events and the resourceVersion reached to the sink (nothing if neither is new)."""
        if not self.events and self.rv == self.told:
            return
        events, self.events = self.events, []
        try:
            await self.sink.apply(events, {self.kind: self.rv})
        except Exception as e:
            raise _sink_failed(e) from e
        self.told = self.rv
        self.stats.batches += 1
        self.stats.resource_version = self.rv


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    # `continue` is a Python keyword
    continue_: str = msgspec.field(default="", name="continue")


class _ListPage(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] = []


class _Discovery(msgspec.Struct):
    resources: list[_DiscoveredResource] = []


class _DiscoveredResource(msgspec.Struct):
    name: str = ""


_PAGE: Final = msgspec.json.Decoder(_ListPage)
_DISCOVERY: Final = msgspec.json.Decoder(_Discovery)


class Backoff:
    """Jittered exponential backoff: each delay is drawn from [d/2, d], d doubling up to `cap`."""

    def __init__(self, initial: float, cap: float, rng: random.Random | None = None) -> None:
        self.initial = initial
        self.cap = cap
        self._next = initial
        self._rng = rng or random.Random()

    def reset(self) -> None:
        self._next = self.initial

    def next_delay(self) -> float:
        d = self._next
        self._next = min(self._next * 2, self.cap)
        return d * (0.5 + 0.5 * self._rng.random())

    async def sleep(self) -> None:
        await anyio.sleep(self.next_delay())


class Reflector:
    """List-then-watch of one kind into an `EventSink`, until cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        kind: Kind,
        options: ReflectorOptions | None = None,
        *,
        resource: Resource | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        #: where the kind is served (`RESOURCES[kind]` unless given: another version, a test CRD)
        self.resource = resource or RESOURCES[kind]
        #: the versions looked for, in order (the one served is `resource`)
        self._versions = self.resource.versions()
        self.options = options or ReflectorOptions()
        self.stats = ReflectorStats()
        self._clock = clock
        self._rng = rng or random.Random()
        self._backoff = Backoff(self.options.backoff_initial, self.options.backoff_max, self._rng)
        self._path = self.resource.path(self.options.namespace)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self, sink: EventSink) -> None:
        while True:
            if self.resource.optional:
                present = await self._present(sink)
                if present is None:  # could not tell: try again soon
                    await self._backoff.sleep()
                    continue
                if not present:
                    await anyio.sleep(self.options.recheck_absent)
                    continue
            try:
                rv = await self._list(sink)
            except _Absent:
                await self._absent(sink)
                continue
            except (_SinkFailed, *CONNECTION_ERRORS, KubeApiError) as e:
                if isinstance(e, _SinkFailed):
                    self.stats.synced = False
                self._error(e)
                await self._backoff.sleep()
                continue
            self.stats.synced = True
            listed = self._clock()
            try:
                await self._watch_until_gone(sink, rv)
            except _Absent:
                await self._absent(sink)
                continue
            if self._clock() - listed < 1.0:
                await self._backoff.sleep()  # 410 right after a list: do not relist in a loop

    async def list_once(self, sink: EventSink) -> bool:
        """One list of the kind into `sink`, as the loop's first (for a command that reads the
        cluster once): False when the kind is optional and not served (the sink is told it
        holds none). Raises `KubeApiError` or a connection error when the API server fails."""
        if self.resource.optional:
            present = await self._present(sink)
            if present is None:
                raise KubeApiError(0, "Unavailable", f"{self.kind}: {self.stats.last_error}", {})
            if not present:
                return False
        try:
            await self._list(sink)
        except _Absent:
            await self._absent(sink, wait=False)
            return False
        except _SinkFailed as e:
            raise e.__cause__ or e from None
        self.stats.synced = True
        return True

    async def _watch_until_gone(self, sink: EventSink, rv: str) -> None:
        """Watch (again and again) from `rv`; returns when the kind must be listed again."""
        while True:
            try:
                rv = await self._watch(sink, rv)
            except _Gone as e:
                self.stats.relists += 1
                log.info("%s: watch from resourceVersion %s: %s; relisting", self.kind, rv, e)
                return
            except _SinkFailed as e:
                self._error(e)
                self.stats.synced = False
                await self._backoff.sleep()
                return
            except (*CONNECTION_ERRORS, KubeApiError, WatchError) as e:
                # Resume from what the sink was told: everything received was handed over.
                rv = self.stats.resource_version or rv
                self._error(e)
                await self._backoff.sleep()

    def _error(self, e: BaseException) -> None:
        if isinstance(e, _SinkFailed):
            cause = "sink"
            e = e.__cause__ or e
        elif isinstance(e, KubeApiError):
            cause = f"http_{e.status}"
        elif isinstance(e, WatchError):
            cause = f"watch_{e.code}"
        elif isinstance(e, TimeoutError):
            cause = "timeout"
        elif isinstance(e, msgspec.DecodeError):
            cause = "bad_response"
        else:
            cause = "connection"
        self.stats.errors[cause] += 1
        self.stats.last_error = f"{type(e).__name__}: {e}"
        log.warning("%s: %s (%s); backing off", self.kind, self.stats.last_error, cause)

    # -- an optional kind --------------------------------------------------------------------------

    async def _present(self, sink: EventSink) -> bool | None:
        """Whether the API server serves the resource now (its group-version's discovery, else
        that of each fallback version in turn: the first served is listed and watched);
        None if it could not say (unreachable, an error status)."""
        for version in self._versions:
            served = await self._serves(version)
            if served is None:
                return None
            if not served:
                continue
            if self.stats.present is not True or version != self.resource:
                log.info("%s: served by the API server as %s; watching it", self.kind,
                         version.group_version)  # fmt: skip
            if version != self.resource:
                self.resource = version
                self._path = version.path(self.options.namespace)
            self.stats.present = True
            return True
        await self._absent(sink, wait=False)
        return False

    async def _serves(self, version: Resource) -> bool | None:
        """Whether `version`'s discovery lists the kind's plural (None: could not say)."""
        try:
            resp = await self.kube.request("GET", version.discovery_path)
        except CONNECTION_ERRORS as e:
            self._error(e)
            return None
        if resp.status == 404:
            return False
        if not resp.ok:
            self._error(resp.error())
            return None
        try:
            served = _DISCOVERY.decode(resp.data).resources
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._error(e)
            return None
        return any(r.name == version.plural for r in served)

    async def _absent(self, sink: EventSink, wait: bool = True) -> None:
        """The kind is not served: the sink holds none of it (said once per absence)."""
        if self.stats.present is not False:
            log.info("%s: not served by the API server; looking again every %.0f s", self.kind,
                     self.options.recheck_absent)  # fmt: skip
            self.stats.present = False
            self.stats.resource_version = ""
            try:
                await sink.replace(self.kind, [], "")
            except Exception as e:  # the next absence check says it again
                self.stats.present = None
                self._error(_sink_failed(e))
            self.stats.synced = self.stats.present is False
        if wait:
            await anyio.sleep(self.options.recheck_absent)

    # -- list --------------------------------------------------------------------------------------

    def _selectors(self) -> list[tuple[str, str]]:
        q = []
        if self.options.label_selector:
            q.append(("labelSelector", self.options.label_selector))
        if self.options.field_selector:
            q.append(("fieldSelector", self.options.field_selector))
        return q

    async def _list(self, sink: EventSink) -> str:
        """A full list, handed to the sink; returns its resourceVersion."""
        records: list[Record] = []
        page_size = self.options.page_size
        cont = ""
        started = self._clock()
        pages = 0
        while True:
            query: Query = [*self._selectors()]
            if page_size:
                query = [*query, ("limit", str(page_size))]
            if cont:
                query = [*query, ("continue", cont)]
            resp = await self.kube.request("GET", self._path, query=query)
            if resp.status == 410 and cont:
                # The continue token expired between pages: one unpaginated list instead.
                log.info("%s: list continue token expired; listing in one piece", self.kind)
                records, page_size, cont = [], 0, ""
                continue
            if resp.status == 404 and self.resource.optional:
                raise _Absent
            resp.check()
            pages += 1
            try:
                page = _PAGE.decode(resp.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise KubeApiError(resp.status, "BadList", f"undecodable list: {e}", {}) from None
            for raw in page.items:
                try:
                    # memoryview: no copy (decode_object accepts any buffer)
                    records.append(
                        decode_object(
                            self.kind, cast(bytes, memoryview(raw)), self.options.rdma_resource
                        )
                    )
                except ValueError as e:  # DecodeError (and any ValueError of one object)
                    self._decode_error(sink, e)
            cont = page.metadata.continue_
            if not cont:
                rv = page.metadata.resourceVersion
                break
        self.stats.lists += 1
        log.info(
            "%s: listed %d in %.2f s",
            self.kind,
            len(records),
            self._clock() - started,
            extra={"kind": self.kind, "objects": len(records), "pages": pages, "rv": rv},
        )
        try:
            await sink.replace(self.kind, records, rv)
        except Exception as e:
            raise _sink_failed(e) from e
        self.stats.resource_version = rv
        return rv

    def _decode_error(self, sink: EventSink, e: ValueError) -> None:
        self.stats.decode_errors += 1
        if isinstance(e, DecodeError):
            sink.decode_error(self.kind, str(e), reason=e.reason, ref=e.ref)
        else:
            sink.decode_error(self.kind, str(e))

    # -- watch -------------------------------------------------------------------------------------

    async def _watch(self, sink: EventSink, rv: str) -> str:
        """One watch request from `rv`; returns the resourceVersion reached when the server ends
        it cleanly. Raises `_Gone`, `_Absent`, `_SinkFailed`, `WatchError`, `KubeApiError` or a
        connection error (anything already received has been handed to the sink)."""
        opts = self.options
        timeout = int(opts.watch_timeout * (1 + self._rng.random()))
        query: Query = [
            *self._selectors(),
            ("watch", "true"),
            ("resourceVersion", rv),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        self.stats.watches += 1
        started = self._clock()
        async with self.kube.stream(
            self._path, query=query, read_timeout=timeout + opts.read_slack
        ) as resp:
            if resp.status != 200:
                raise await self._watch_refused(resp)
            batch = _Batch(sink, self.kind, self.stats, rv, rv)
            try:
                received = await self._read_watch(resp.content, batch)
            except WatchError as e:
                await batch.flush()  # what came before the error is good
                if e.code == 410:
                    raise _Gone(str(e)) from None
                if e.code == 404 and self.resource.optional:
                    raise _Absent from None
                raise
            except CONNECTION_ERRORS:
                await batch.flush()
                raise
            await batch.flush()
        if received or self._clock() - started > 1.0:
            self._backoff.reset()
        else:
            # A watch that ends at once with nothing: do not spin.
            await self._backoff.sleep()
        return batch.rv

    async def _watch_refused(self, resp: aiohttp.ClientResponse) -> Exception:
        """What a watch answered with an HTTP error raises: `_Gone` (410), `_Absent` (404 on an
        optional kind), else the API's error."""
        err = api_error(resp.status, await resp.read())
        if resp.status == 410:
            return _Gone(str(err))
        if resp.status == 404 and self.resource.optional:
            return _Absent()
        return err

    async def _read_watch(self, content: aiohttp.StreamReader, batch: _Batch) -> int:
        """The watch's lines until the server ends it (timeoutSeconds), handed to the sink in
        batches of `batch_max` events at most, within `batch_delay`; returns how many came."""
        opts = self.options
        received = 0
        tail = b""
        while True:
            if batch.events:
                wait = batch.first + opts.batch_delay - self._clock()
                chunk = None
                if wait > 0:
                    # Cancelling readany() while it waits loses no data.
                    with anyio.move_on_after(wait):
                        chunk = await content.readany()
                if chunk is None:
                    await batch.flush()
                    continue
            else:
                chunk = await content.readany()
            if not chunk:
                return received  # the server ended the watch (timeoutSeconds)
            lines = (tail + chunk).split(b"\n")
            tail = lines.pop()
            now = self._clock()
            for line in lines:
                if not line or line.isspace():
                    continue
                received += 1
                if self._watch_line(batch, line, now) and len(batch.events) >= opts.batch_max:
                    await batch.flush()
            if not batch.events and batch.rv != batch.told:
                await batch.flush()  # a bookmark alone: the sink learns the rv now

    def _watch_line(self, batch: _Batch, line: bytes, now: float) -> bool:
        """One line of the watch into `batch`: an event, a bookmark (its resourceVersion), or an
        object that does not decode (counted; its deletion if named): False for the last."""
        try:
            typ, rec, new_rv = decode_watch_line(self.kind, line, self.options.rdma_resource)
        except ValueError as e:  # DecodeError, or msgspec's on a bad bookmark
            self._decode_error(batch.sink, e)
            gone = e.tombstone if isinstance(e, DecodeError) else None
            if gone is not None:
                # the object's previous version must not stay in the view
                batch.add(Event("DELETED", gone, now), now)
            return False
        if rec is None:  # BOOKMARK
            self.stats.bookmarks += 1
        else:
            batch.add(Event(cast(EventType, typ), rec, now), now)
            self.stats.events += 1
            self.stats.events_by_type[typ] += 1
        if new_rv:
            batch.rv = new_rv
        return True


def _sink_failed(e: BaseException) -> _SinkFailed:
    f = _SinkFailed(f"{type(e).__name__}: {e}")
    f.__cause__ = e
    return f
