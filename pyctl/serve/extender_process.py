"""The kube-scheduler extender in a process of its own, fed the node models by the controller.

Threads of one Python process share one GIL: while the controller decodes events, scores nodes
and plans, the extender's threads wait for the GIL at each of their steps, and the scheduler
waits for them (docs/scale.md). So by default (`extender_process`) the extender's server runs in
a child process (`front_main`), with its own GIL, and the controller feeds it:

- the per-node models as the reconciler scores them (`Reconciler.on_scored`; only a model object
  the child has not been sent), the nodes gone, the workload M, the nodes the rescues reserved
  and the nodes compaction moved a workload off (`reservations`, `departures`), and the shapes of
  the pods waiting for the scheduler. A node scored is sent within `PUBLISH_SECONDS`, M and the
  rescues' nodes within `POLL_SECONDS`, the nodes gone and the pending pods' shapes once a
  second.
- The child answers with the same `PlacementAdvisor` and `RankTable` on its copy of those views:
  it keeps the ranks of the hot shapes fresh itself (when a node's model arrives, and in the
  background), so ranking costs the controller nothing.
- A request the child cannot answer alone is forwarded to the controller, which answers it with
  its own `ExtenderHandler` (on a thread of its own): a pod with DRA claims (their shape needs the
  controller's view of claims, slices and classes) or one that names a node. The child waits for
  that answer until the request's deadline (then: "no advice", outcome ``deadline``).
- The child's counts (requests, their latencies, refusals, ranks computed, its cycle
  collections) are sent back every
  `FLUSH_SECONDS` and added to the controller's metrics, so `/metrics` reads as with the
  extender in the controller's process.
- Every message on the two pipes is one of the typed messages below (`Hello`, `Update`, `Call`,
  `Answer`, `Ready`, `Failed`, `Counts`), each with the version of the messages (`VERSION`). A
  message of another version, of another type, or that does not unpickle is refused, logged and
  counted (`pyctl_extender_messages_refused_total{side,reason}`); the side that read it goes on.
- The child ends when the controller's end of its pipes closes (the controller exited, however).
  A child that exits while the controller runs is started again (after `RESTART_SECONDS`, on the
  same port; counted in `pyctl_extender_process_restarts_total`, logged) and sent the whole view.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import multiprocessing
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Final, TypeAlias

import msgspec

from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import pod_shape
from pyctl.controller.domains import DomainIdle, DomainRow
from pyctl.controller.placement import NotKept, PlacementAdvisor, RankTable
from pyctl.controller.reconcile import Reconciler
from pyctl.core.fragmentation import FragmentationModel
from pyctl.log import JsonFormatter, setup_logging
from pyctl.metrics import Metrics, time_collections
from pyctl.model import Node, Shape, Snapshot, Workload
from pyctl.serve.extender import ExtenderHandler, no_advice
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer, HttpMetrics
from pyctl.serve.http import tune_malloc

log = logging.getLogger("pyctl.placement")

#: seconds between the controller's sends of what changed (models, M, reservations)
PUBLISH_SECONDS = 0.005
#: seconds within which a change that is not a node scored (M, reservations) is sent
POLL_SECONDS = 0.05
#: seconds between the child's sends of its counts
FLUSH_SECONDS = 0.25
#: seconds before a child that exited is started again
RESTART_SECONDS = 1.0
#: seconds the controller waits for a child to start serving
START_SECONDS = 60.0
#: nodes per message (pickling a node model takes ~15 us with the GIL held: one message of
#: 5,000 would hold it ~75 ms)
CHUNK = 256


#: the version of the messages between the controller and the extender's process
VERSION: Final = 1


class Hello(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's first message to a new child: its options and how it logs."""

    options: ExtenderOptions
    log_format: str
    log_level: str
    #: the extended resource a pod's RDMA is read from (the reflector's `rdma_resource`)
    rdma_resource: str = ""
    v: int = VERSION


class Update(msgspec.Struct, kw_only=True):
    """The controller's view, or what changed in it (a field left None, or empty, did not):
    models by node, nodes gone, M, the rescues' nodes, the departures, the pending pods' shapes.
    `more`: a part of a whole view whose next part follows (`chunks`)."""

    nodes: dict[str, Node] = msgspec.field(default_factory=dict)
    gone: tuple[str, ...] = ()
    workload: Workload | None = None
    reservations: Mapping[str, str] | None = None
    departures: Mapping[str, str] | None = None
    pending: tuple[Shape, ...] | None = None
    #: the topology domains' index (`pyctl.controller.domains`): its levels when they change
    #: (then `domain_rows` holds every node's row), the rows that changed, the nodes gone
    domain_levels: tuple[str, ...] | None = None
    domain_rows: dict[str, DomainRow] = msgspec.field(default_factory=dict)
    domain_gone: tuple[str, ...] = ()
    more: bool = False
    v: int = VERSION


class Call(msgspec.Struct, frozen=True, kw_only=True):
    """A request the child forwards to the controller."""

    key: int
    verb: str
    body: bytes
    v: int = VERSION


class Answer(msgspec.Struct, frozen=True, kw_only=True):
    """The controller's answer to a `Call`."""

    key: int
    answer: bytes
    outcome: str
    v: int = VERSION


class Ready(msgspec.Struct, frozen=True, kw_only=True):
    """The child serves, on `port`."""

    port: int
    v: int = VERSION


class Failed(msgspec.Struct, frozen=True, kw_only=True):
    """The child could not serve, and why."""

    why: str
    v: int = VERSION


# -- the child's counts, added to the controller's metrics ------------------------------------
class Request(msgspec.Struct, frozen=True):
    verb: str
    outcome: str
    seconds: float | None


class Work(msgspec.Struct, frozen=True):
    verb: str
    seconds: float
    thread: str


class Refused(msgspec.Struct, frozen=True):
    """A connection or request the child's server refused before a handler."""

    server: str
    reason: str


class Collection(msgspec.Struct, frozen=True):
    generation: int
    seconds: float


class Ranks(msgspec.Struct, frozen=True):
    request: int
    ahead: int


class MessageRefused(msgspec.Struct, frozen=True):
    """A message of the controller's the child refused (`refusal`)."""

    reason: str


Event: TypeAlias = Request | Work | Refused | Collection | Ranks | MessageRefused


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    events: tuple[Event, ...]
    v: int = VERSION


def refusal(msg: object, *types: type[msgspec.Struct]) -> tuple[str, str] | None:
    """Why `msg` is refused where one of `types` is expected: ("version" | "unexpected", the
    detail), None if it is taken."""
    if not isinstance(msg, types):
        return (
            "unexpected",
            f"a {type(msg).__name__}, not a {' or '.join(t.__name__ for t in types)}",
        )
    v = getattr(msg, "v", None)
    if v != VERSION:
        return "version", f"a {type(msg).__name__} of version {v!r}, not {VERSION}"
    return None


class Forward(NotKept):
    """The child cannot answer this request alone: the controller answers it."""


def local_shape(p: PodRecord) -> Shape | None:
    """The pod's shape as `Reconciler.shape_of` tells it, for a pod without claims that names no
    node (what a scheduler asks about); any other pod is `Forward`ed."""
    if p.claims or p.node:
        raise Forward(p.key)
    return pod_shape(p, None)


# -- the child --------------------------------------------------------------------------------


@dataclass
class Replica:
    """The child's copy of the controller's views (written by one thread, read by the others:
    whole values replaced, as the reconciler replaces them)."""

    models: dict[str, Node] = field(default_factory=dict)
    workload: Workload = field(default_factory=Workload)
    reservations: Mapping[str, str] = field(default_factory=dict)
    departures: Mapping[str, str] = field(default_factory=dict)
    pending: tuple[Shape, ...] = ()
    #: the topology domains' idle GPU, as the controller's reconciler keeps it
    domains: DomainIdle = field(default_factory=DomainIdle)

    def apply(self, msg: Update, ranks: RankTable | None = None) -> None:
        """One message of the controller's (`Publisher`): its nodes replace the kept ones, and
        each one's kept ranks of the hot shapes are computed again (`RankTable.refreshed`)."""
        if msg.workload is not None:
            self.workload = msg.workload
        for name in msg.gone:
            self.models.pop(name, None)
        if msg.reservations is not None:
            self.reservations = msg.reservations
        if msg.departures is not None:
            self.departures = msg.departures
        if msg.pending is not None:
            self.pending = msg.pending
        if msg.domain_levels is not None or msg.domain_rows or msg.domain_gone:
            self.domains.apply_rows(msg.domain_levels, msg.domain_rows, msg.domain_gone)
        nodes = msg.nodes
        for name, node in nodes.items():
            self.models[name] = node
        if ranks is not None and nodes and ranks.hot():
            for name, node in nodes.items():
                ranks.refreshed(name, node, FragmentationModel(Snapshot((node,))))

    def advisor(self, ranks: RankTable) -> PlacementAdvisor:
        return PlacementAdvisor(
            self.models,
            lambda: self.workload,
            lambda: self.reservations,
            lambda: self.departures,
            local_shape,
            ranks,
            lambda: self.domains,
        )


class Recorder:
    """The child's counts, kept until the next flush (the server's metrics interface). A deque,
    not a lock: a cycle collection's callback adds to it, and a collection can start inside any
    allocation, also one made while another count is being added or taken."""

    def __init__(self) -> None:
        self._events: deque[Event] = deque()

    def request(self, verb: str, outcome: str, seconds: float | None = None) -> None:
        self._events.append(Request(verb, outcome, seconds))

    def work(self, verb: str, seconds: float, thread: str = "worker") -> None:
        self._events.append(Work(verb, seconds, thread))

    def on_reject(self, server: str) -> Callable[[str], None]:
        def count(reason: str) -> None:
            self._events.append(Refused(server, reason))

        return count

    def refused_message(self, reason: str) -> None:
        self._events.append(MessageRefused(reason))

    def collections(self) -> Callable[[], None]:
        """Time this process's cycle collections (`pyctl_gc_pause_seconds` in the controller);
        returns the function that stops it."""
        return time_collections(lambda g, seconds: self._events.append(Collection(g, seconds)))

    def take(self) -> list[Event]:
        out: list[Event] = []
        with contextlib.suppress(IndexError):  # empty: taken
            while True:
                out.append(self._events.popleft())
        return out


class FrontHandler(ExtenderHandler):
    """`ExtenderHandler` on the child's views; what it cannot answer alone (`Forward`) goes to
    the controller (`forward`)."""

    def __init__(
        self,
        advisor: PlacementAdvisor,
        forward: Callable[[str, bytes], tuple[bytes, str]],
        rdma_resource: str = "",
    ) -> None:
        super().__init__(advisor, rdma_resource)
        self.forward = forward

    def answer(self, verb: str, body: bytes) -> tuple[bytes, str]:
        got = self._answer(verb, body, True)
        return got if got is not None else self.forward(verb, body)


class _Child:
    def __init__(
        self,
        options: ExtenderOptions,
        updates: Connection,
        calls: Connection,
        rdma_resource: str = "",
    ) -> None:
        self.options = options
        self.rdma_resource = rdma_resource
        self.updates = updates
        self.calls = calls
        self.replica = Replica()
        self.ranks = RankTable(self.replica.models, lambda: self.replica.workload)
        self.recorder = Recorder()
        self.recorder.collections()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, Future[tuple[bytes, str]]] = {}
        self._inbox = 0  # messages read and not yet applied (keep_warm waits for them)
        self.done = threading.Event()

    def send(self, msg: Call | Ready | Failed | Counts) -> None:
        with self._send_lock:
            self.calls.send(msg)

    def refuse(self, reason: str, detail: str) -> None:
        """A message of the controller's not taken: logged, counted (sent with the counts)."""
        log.error(
            "the extender's process refused a message of the controller's",
            extra={"reason": reason, "error": detail[:300]},
        )
        self.recorder.refused_message(reason)

    def receive(self, conn: Connection, *types: type[msgspec.Struct]) -> object | None:
        """The next message on `conn` if it is one of `types` (else refused: None). Raises
        EOFError or OSError when the pipe is closed."""
        try:
            msg: object = conn.recv()
        except (EOFError, OSError):
            raise
        except Exception as e:  # did not unpickle
            self.refuse("malformed", f"{type(e).__name__}: {e}")
            return None
        why = refusal(msg, *types)
        if why is not None:
            self.refuse(*why)
            return None
        return msg

    def forward(self, verb: str, body: bytes) -> tuple[bytes, str]:
        """The controller's answer to a request (on a worker thread), or "no advice" past the
        deadline or when the controller cannot be reached."""
        key = next(self._ids)
        fut: Future[tuple[bytes, str]] = Future()
        self._waiting[key] = fut
        try:
            self.send(Call(key=key, verb=verb, body=body))
            return fut.result(timeout=self.options.deadline)
        except FutureTimeout:
            return no_advice(verb, "the controller did not answer in time"), "deadline"
        except (OSError, EOFError):
            return no_advice(verb, "the controller cannot be reached"), "error"
        finally:
            self._waiting.pop(key, None)

    def read_updates(self) -> None:
        try:
            while True:
                msg = self.receive(self.updates, Update)
                if not isinstance(msg, Update):
                    continue
                self._inbox += 1
                try:
                    self.replica.apply(msg, self.ranks)
                finally:
                    self._inbox -= 1
        except (EOFError, OSError):
            pass
        except Exception:  # the process ends; the controller starts another, sent everything
            log.exception("the extender's process could not apply the controller's message")
        finally:
            self.done.set()

    def read_answers(self) -> None:
        try:
            while True:
                msg = self.receive(self.calls, Answer)
                if not isinstance(msg, Answer):
                    continue
                fut = self._waiting.get(msg.key)
                if fut is not None and not fut.done():
                    fut.set_result((msg.answer, msg.outcome))
        except (EOFError, OSError):
            pass
        finally:
            self.done.set()

    def flush(self) -> None:
        sent = (0, 0)
        while not self.done.wait(FLUSH_SECONDS):
            computed, ahead = self.ranks.computed, self.ranks.ahead
            events = self.recorder.take()
            if computed != sent[0] or ahead != sent[1]:
                events.append(Ranks(computed - sent[0], ahead - sent[1]))
                sent = (computed, ahead)
            if events:
                with contextlib.suppress(OSError, ValueError):
                    self.send(Counts(events=tuple(events)))

    async def main(self) -> None:
        while True:  # the whole view, before the first request is answered
            msg = self.receive(self.updates, Update)
            if not isinstance(msg, Update):
                continue
            self.replica.apply(msg)
            if not msg.more:
                break
        server = ExtenderServer(
            lambda: FrontHandler(
                self.replica.advisor(self.ranks), self.forward, self.rdma_resource
            ),
            self.options,
            self.recorder,
        )
        try:
            port = await server.start()
        except Exception as e:
            self.send(Failed(why=f"{type(e).__name__}: {e}"))
            return
        for target in (self.read_updates, self.read_answers, self.flush):
            threading.Thread(
                target=target, daemon=True, name=f"pyctl-front-{target.__name__}"
            ).start()
        self.send(Ready(port=port))
        warm = asyncio.ensure_future(
            self.ranks.keep_warm(lambda: self.replica.pending, lambda: self._inbox > 0)
        )
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.done.wait)
        finally:
            warm.cancel()
            await server.stop()


def front_main(updates: Connection, calls: Connection) -> None:
    """The child's entry point: takes its options, then serves the extender until the
    controller's pipes close."""
    try:
        hello: object = updates.recv()
    except (EOFError, OSError):
        return
    except Exception as e:  # did not unpickle
        hello = f"{type(e).__name__}: {e}"
    why = refusal(hello, Hello)
    if why is not None or not isinstance(hello, Hello):  # it cannot serve: the controller says
        calls.send(Failed(why=f"its first message was refused ({why})"))
        return
    options = hello.options
    setup_logging(hello.log_format, hello.log_level)
    tune_malloc()  # the request bodies are read here: as in `pyctl run` (docs/http.md)
    # as in the controller (pyctl/app/collector.py): no automatic full collections, which walk
    # every node model while a request waits; the server runs one after each burst of requests
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 2**31 - 1)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_Child(options, updates, calls, hello.rdma_resource).main())


# -- the controller's side ---------------------------------------------------------------------


class Publisher:
    """What the controller sends the child: every model the reconciler scores that the child
    has not been sent (the same object: not sent again), M, the reservations and departures when
    they change, and once a second the nodes gone and the pending pods' shapes."""

    def __init__(
        self,
        reconciler: Reconciler,
        reservations: Callable[[], Mapping[str, str]],
        departures: Callable[[], Mapping[str, str]],
    ) -> None:
        self.reconciler = reconciler
        self.reservations = reservations
        self.departures = departures
        self._lock = threading.Lock()
        self._dirty: dict[str, Node] = {}
        self.changed = threading.Event()
        self._sent: dict[str, Node] = {}
        self._workload: Workload | None = None
        self._reserved: dict[str, str] | None = None
        self._departed: dict[str, str] | None = None
        self._slow = 0.0
        #: the domains' index as last sent (its levels and rows)
        self._domain_levels: tuple[str, ...] = ()
        self._domain_rows: dict[str, DomainRow] = {}
        #: the shapes of the pods waiting for the scheduler, set on the controller's event loop
        #: (`ExtenderProcess.keep_pending`: the cache is not read from another thread)
        self.pending: tuple[Shape, ...] = ()

    def scored(self, name: str, node: Node, _alone: FragmentationModel) -> None:
        """`Reconciler.on_scored`: on the reconciling thread; only notes the node."""
        if self._sent.get(name) is not node:
            with self._lock:
                self._dirty[name] = node
            self.changed.set()

    @property
    def sent_nodes(self) -> int:
        """How many nodes' current models the child has been sent."""
        return len(self._sent)

    def full(self, now: float) -> Update:
        """The whole view (a new child's first message), at `now` (`time.monotonic`)."""
        r = self.reconciler
        with self._lock:
            self._dirty.clear()
        models = dict(r.models)
        self._sent = dict(models)
        self._workload = r.workload
        self._reserved = dict(self.reservations())
        self._departed = dict(self.departures())
        self._slow = now
        index = r.domain_idle()
        self._domain_levels, self._domain_rows = index.levels, index.rows()
        return Update(
            nodes=models,
            workload=r.workload,
            reservations=self._reserved,
            departures=self._departed,
            pending=self.pending,
            domain_levels=self._domain_levels,
            domain_rows=dict(self._domain_rows),
        )

    def changes(self, now: float) -> Update | None:
        """What changed since the last message, None if nothing did."""
        r = self.reconciler
        msg = Update()
        changed = False
        with self._lock:
            dirty, self._dirty = self._dirty, {}
        nodes = {n: node for n, node in dirty.items() if self._sent.get(n) is not node}
        if r.workload is not self._workload:
            self._workload = msg.workload = r.workload
            changed = True
        reserved = self.reservations()
        if reserved != self._reserved:
            self._reserved = dict(reserved)
            msg.reservations = self._reserved
            changed = True
        departed = self.departures()
        if departed != self._departed:
            self._departed = dict(departed)
            msg.departures = self._departed
            changed = True
        if now - self._slow >= 1.0:
            self._slow = now
            models = dict(r.models)
            gone = [n for n in self._sent if n not in models]
            for n in gone:
                del self._sent[n]
                nodes.pop(n, None)  # scored, then gone before this message: gone
            msg.gone = tuple(gone)
            for n, node in models.items():  # a model replaced without a score (none today)
                if self._sent.get(n) is not node:
                    nodes[n] = node
            msg.pending = self.pending
            self._domains_changed(msg)
            changed = True
        if nodes:
            msg.nodes = nodes
            self._sent.update(nodes)
            changed = True
        return msg if changed else None

    def _domains_changed(self, msg: Update) -> None:
        """The domains' index's changes since the last message into `msg` (its rows follow
        the nodes' models by at most a second: a tie-break between equal ranks)."""
        index = self.reconciler.domain_idle()
        rows = index.rows()
        if index.levels != self._domain_levels:
            msg.domain_levels, msg.domain_rows = index.levels, rows
        else:
            sent = self._domain_rows
            msg.domain_rows = {n: row for n, row in rows.items() if sent.get(n) != row}
            msg.domain_gone = tuple(n for n in sent if n not in rows)
        self._domain_levels, self._domain_rows = index.levels, rows


def chunks(msg: Update) -> list[Update]:
    """`msg` as messages of at most `CHUNK` nodes each, all but the last marked ``more`` (the
    rest of `msg` goes with the first)."""
    nodes = list(msg.nodes.items())
    if len(nodes) <= CHUNK:
        return [msg]
    out = [Update(nodes=dict(nodes[i : i + CHUNK]), more=True) for i in range(0, len(nodes), CHUNK)]
    out[0] = msgspec.structs.replace(msg, nodes=out[0].nodes, more=True)
    out[-1].more = False
    return out


class ExtenderProcess:
    """The extender served by a child process (`front_main`), fed by the controller; the same
    `start`/`stop` as `ExtenderServer`. `handler` answers the requests the child forwards."""

    def __init__(
        self,
        publisher: Publisher,
        handler: Callable[[], ExtenderHandler],
        options: ExtenderOptions,
        metrics: HttpMetrics,
        core: Metrics | None = None,
        cluster: str = "",
        rdma_resource: str = "",
    ) -> None:
        self.publisher = publisher
        self.make_handler = handler
        self.options = options
        self.rdma_resource = rdma_resource
        self.metrics = metrics
        #: the child's ranks computed (`pyctl_extender_ranks_total`) and its cycle collections
        #: (`pyctl_gc_pause_seconds`), counted on the controller's metrics (`core`)
        self._ranks = (
            (
                core.extender_ranks.labels(cluster, "request"),
                core.extender_ranks.labels(cluster, "ahead"),
            )
            if core is not None
            else None
        )
        self._gc = [core.gc_pause.labels(cluster, str(g)) for g in range(3)] if core else None
        self.port = options.port
        #: times the child was started again; requests it forwarded
        self.restarts = 0
        self.forwarded = 0
        self._proc: subprocess.Popen[bytes] | None = None
        #: the pipe of models to the child; held with `_publishing` while a message is computed
        #: and sent, so that what `Publisher` marks as sent reached the child it is set to
        self._updates: Connection | None = None
        self._publishing = threading.Lock()
        self._calls: Connection | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._handler: ExtenderHandler | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id (None before it started)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def serving(self) -> bool:
        """A child is running and was started (False while it is being started again)."""
        proc = self._proc
        return self._calls is not None and proc is not None and proc.poll() is None

    # -- the child's life ---------------------------------------------------------------------
    def _spawn(self) -> int:
        """Start a child (`python -m pyctl.serve.extender_process`, its pipes inherited), send
        it its options and the whole view, wait for its port (raises if it failed)."""
        up_here, up_there = multiprocessing.Pipe(duplex=True)
        calls_here, calls_there = multiprocessing.Pipe(duplex=True)
        fds = (up_there.fileno(), calls_there.fileno())
        proc = subprocess.Popen(
            [sys.executable, "-m", "pyctl.serve.extender_process", *map(str, fds)],
            pass_fds=fds,
            start_new_session=True,  # a terminal's Ctrl-C stops the controller, which stops it
        )
        up_there.close()
        calls_there.close()
        root = logging.getLogger("pyctl")
        fmt = (
            "json" if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers) else "text"
        )
        level = logging.getLevelName(root.getEffectiveLevel()).lower()
        try:
            up_here.send(
                Hello(
                    options=replace(self.options, port=self.port),
                    log_format=fmt,
                    log_level=level,
                    rdma_resource=self.rdma_resource,
                )
            )
            with self._publishing:  # the whole view; what changes after it is published to it
                for part in chunks(self.publisher.full(time.monotonic())):
                    up_here.send(part)
                self._updates = up_here
            if not calls_here.poll(START_SECONDS):
                raise RuntimeError("the extender's process did not start in time")
            got = calls_here.recv()
        except (EOFError, OSError):
            got = Failed(why=f"it exited (code {proc.poll()}) before it served")
        except BaseException:
            proc.kill()
            raise
        why = refusal(got, Ready, Failed)
        if why is not None:
            self._refuse(*why)
            got = Failed(why=f"its first message was refused ({why[1]})")
        if not isinstance(got, Ready):
            proc.kill()
            proc.wait(5)
            with self._publishing:
                self._updates = None
            up_here.close()
            calls_here.close()
            why_not = got.why if isinstance(got, Failed) else "no answer"
            raise RuntimeError(f"the extender's process could not serve: {why_not}")
        self._proc, self._calls = proc, calls_here
        return got.port

    async def start(self) -> int:
        """Start the child; returns the bound port. Raises what the child's server raised."""
        self._handler = self.make_handler()
        self.publisher.pending = tuple(self.publisher.reconciler.pending_shapes())
        self.publisher.reconciler.on_scored.append(self.publisher.scored)
        try:
            self.port = await asyncio.get_running_loop().run_in_executor(None, self._spawn)
        except BaseException:
            self.publisher.reconciler.on_scored.remove(self.publisher.scored)
            raise
        for target in (self._publish, self._serve):
            t = threading.Thread(
                target=target, daemon=True, name=f"pyctl-extender-{target.__name__}"
            )
            t.start()
            self._threads.append(t)
        return self.port

    async def keep_pending(self, interval: float = 1.0) -> None:
        """On the controller's event loop: the pending pods' shapes, once a second, for the
        child to rank ahead (`RankTable.keep_warm` there)."""
        while not self._stopping.is_set():
            await asyncio.sleep(interval)
            try:
                self.publisher.pending = tuple(self.publisher.reconciler.pending_shapes())
            except Exception:  # never the end of the loop
                log.exception("the pending pods' shapes for the extender failed")

    async def stop(self) -> None:
        """The child ends when its pipe of models closes; the threads end with it."""
        self._stopping.set()
        self.publisher.changed.set()
        with contextlib.suppress(ValueError):
            self.publisher.reconciler.on_scored.remove(self.publisher.scored)
        with self._publishing:
            if self._updates is not None:
                self._updates.close()
                self._updates = None
        loop = asyncio.get_running_loop()
        proc = self._proc
        if proc is not None:
            try:
                await loop.run_in_executor(None, proc.wait, 10.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                await loop.run_in_executor(None, proc.wait, 5.0)
        for t in self._threads:
            await loop.run_in_executor(None, t.join, 5.0)
        if self._calls is not None:
            self._calls.close()

    # -- the controller's threads -------------------------------------------------------------
    def _publish(self) -> None:
        """Sends what changed, at most every `PUBLISH_SECONDS`."""
        while not self._stopping.is_set():
            self.publisher.changed.wait(POLL_SECONDS)
            self.publisher.changed.clear()
            if self._stopping.is_set():
                return
            try:
                with self._publishing:
                    conn = self._updates
                    if conn is not None:  # else a child is being started: it gets everything
                        msg = self.publisher.changes(time.monotonic())
                        for part in chunks(msg) if msg is not None else ():
                            conn.send(part)
            except (OSError, ValueError):
                pass  # the child is gone: `_serve` starts another, which is sent everything
            except Exception:
                log.exception("sending the extender's process the models failed")
            time.sleep(PUBLISH_SECONDS)

    def _serve(self) -> None:
        """Answers the child's forwarded requests and takes its counts; starts it again if it
        exits."""
        while not self._stopping.is_set():
            conn = self._calls
            try:
                assert conn is not None
                msg = conn.recv()
            except (EOFError, OSError, AssertionError):
                if self._stopping.is_set():
                    return
                self._restart()
                continue
            except Exception as e:  # did not unpickle: the pipe goes on
                self._refuse("malformed", f"{type(e).__name__}: {e}")
                continue
            try:
                self._take(conn, msg)
            except (OSError, ValueError):
                continue  # the child is gone: the next recv says so
            except Exception:
                log.exception("a message of the extender's process failed")

    def _refuse(self, reason: str, detail: str, side: str = "controller") -> None:
        """A message not taken (by the controller, or by the child: `side`): logged there,
        counted here."""
        if side == "controller":
            log.error(
                "the controller refused a message of the extender's process",
                extra={"reason": reason, "error": detail[:300]},
            )
        self.metrics.messages_refused.labels(self.metrics.cluster, side, reason).inc()

    def _take(self, conn: Connection, msg: object) -> None:
        why = refusal(msg, Call, Counts)
        if why is not None:
            self._refuse(*why)
        elif isinstance(msg, Call):
            assert self._handler is not None
            self.forwarded += 1
            answer, outcome = self._handler.answer(msg.verb, msg.body)
            conn.send(Answer(key=msg.key, answer=answer, outcome=outcome))
        elif isinstance(msg, Counts):
            for event in msg.events:
                self._count(event)

    def _count(self, event: Event) -> None:
        if isinstance(event, Request):
            self.metrics.request(event.verb, event.outcome, event.seconds)
        elif isinstance(event, Work):
            self.metrics.work(event.verb, event.seconds, event.thread)
        elif isinstance(event, Refused):
            self.metrics.on_reject(event.server)(event.reason)
        elif isinstance(event, MessageRefused):
            self._refuse(event.reason[:30], "", side="process")
        elif isinstance(event, Collection) and self._gc is not None:
            self._gc[min(max(int(event.generation), 0), 2)].observe(event.seconds)
        elif isinstance(event, Ranks) and self._ranks is not None:
            if event.request:
                self._ranks[0].inc(event.request)
            if event.ahead:
                self._ranks[1].inc(event.ahead)

    def _restart(self) -> None:
        proc = self._proc
        code = proc.poll() if proc is not None else None
        log.error(
            "the extender's process exited; starting it again",
            extra={"exit_code": code, "restarts": self.restarts + 1},
        )
        with self._publishing:
            updates, self._updates = self._updates, None
        for conn in (updates, self._calls):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self._calls = None
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        while not self._stopping.wait(RESTART_SECONDS):
            self.restarts += 1
            self.metrics.restarts.labels(self.metrics.cluster).inc()
            try:
                self._spawn()
                return
            except Exception as e:
                log.error("the extender's process did not start", extra={"error": str(e)[:300]})


def _main(argv: list[str]) -> None:
    """`python -m pyctl.serve.extender_process UPDATES_FD CALLS_FD` (started by
    `ExtenderProcess`)."""
    updates, calls = (Connection(int(fd)) for fd in argv[:2])
    front_main(updates, calls)


if __name__ == "__main__":
    # the module by its name, not as __main__: its messages pickle as the controller's classes
    from pyctl.serve import extender_process

    extender_process._main(sys.argv[1:])
