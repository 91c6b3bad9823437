"""The kube-scheduler extender on its own port and server, away from the controller's event loop
(the one that renews the Lease and answers `/healthz`).

- The server (`pyctl.serve.http`: connection limit, read timeouts, body limit, TLS, client
  authentication) runs its own event loop on its own thread.
- A request every candidate rank of which is kept (`ExtenderHandler.answer_kept`: a lookup per
  node) is answered on the server's thread (`answer_kept`). Any other request's work (decoding,
  the placement advice) runs on a pool of `max_concurrency` worker threads, each with its own
  `ExtenderHandler` (the Rust core releases the GIL while it scores). A request that finds every
  worker busy waits for one until its deadline.
- Every request is answered within `deadline` seconds of its first byte: if no worker was free
  in time (outcome ``overload``) or the advice was not ready in time (``deadline``), the answer
  is "no advice" (`pyctl.serve.extender.no_advice`), never a late one. A late worker finishes
  its request (threads cannot be stopped) and only then takes another, so the work in flight
  never exceeds `max_concurrency`.
- Request bodies held at once are bounded too (`max_concurrency` x 2 x `max_body_bytes`): past
  that, a request is refused (503) before its body is read.

Requests are counted by verb and outcome (`pyctl_extender_requests_total`), refusals by reason
(`pyctl_http_refused_total{server="extender"}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from pyctl.serve.extender import OUTCOMES, VERBS, ExtenderHandler, no_advice
from pyctl.serve.http import (
    Authorize,
    BearerToken,
    HttpServer,
    Limits,
    Request,
    Response,
    Route,
    TlsFiles,
)

log = logging.getLogger("pyctl.placement")

_T = TypeVar("_T")

PREFIX = "/scheduler"
#: seconds a thread holds the GIL before handing it over when another waits (Python's default is
#: 5 ms): with the workers busy, the controller's event loop waits for the GIL at each of its
#: steps; a shorter interval shortens each wait (docs/http.md)
SWITCH_INTERVAL = 0.001


@dataclass(frozen=True)
class ExtenderOptions:
    """The kube-scheduler extender (`/scheduler/choose`, `/scheduler/filter`,
    `/scheduler/prioritize`) on its own server; port 0: not served."""

    host: str = "127.0.0.1"
    port: int = 0
    #: TLS: the server's certificate and key (mounted files); with `client_ca_file`, clients
    #: must present a certificate it signed (kube-scheduler's extender `tlsConfig` with
    #: `certFile`/`keyFile`)
    tls_cert_file: str = ""
    tls_key_file: str = ""
    client_ca_file: str = ""
    #: a file holding a bearer token clients must send (`Authorization: Bearer ...`)
    token_file: str = ""
    #: requests worked on at once (more wait for a free worker, up to the deadline)
    max_concurrency: int = 2
    #: the largest request body read (the scheduler's `NodeNames` for 5,000 nodes is ~0.3 MB)
    max_body_bytes: int = 4 << 20
    #: seconds for a request's headers and body to arrive (from its first byte)
    read_timeout: float = 5.0
    #: seconds from a request's first byte to its answer; later, the answer is "no advice"
    deadline: float = 1.5
    #: connections open at once
    max_connections: int = 64
    #: answer a request on the server's own thread when every candidate's rank is kept (a
    #: lookup per node: no hand-over to a worker and back, each a wait for the GIL); a request
    #: that needs ranks computed goes to a worker
    answer_kept: bool = True
    #: serve the extender from a process of its own, fed the node models by the controller
    #: (`pyctl.serve.extender_process`): its work then never waits for the controller's GIL
    process: bool = True

    def limits(self) -> Limits:
        return Limits(
            max_connections=self.max_connections,
            read_timeout=self.read_timeout,
            idle_timeout=max(60.0, self.read_timeout),
            max_header_bytes=16 << 10,
            max_body_bytes=self.max_body_bytes,
            body_budget=2 * self.max_concurrency * self.max_body_bytes,
        )


#: buckets of the extender's latency histograms (s): the scheduler waits for every call
_SECONDS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class ExtenderMetrics(Protocol):
    """What the extender's server counts (`HttpMetrics`; in the extender's own process, a
    recorder whose counts the controller adds to its `HttpMetrics`)."""

    def request(self, verb: str, outcome: str, seconds: float | None = None) -> None: ...

    def work(self, verb: str, seconds: float, thread: str = "worker") -> None: ...

    def on_reject(self, server: str) -> Callable[[str], None]: ...


class HttpMetrics:
    """The servers' counters, on the controller's registry."""

    def __init__(self, registry: CollectorRegistry, cluster: str) -> None:
        self.cluster = cluster
        self.extender_requests = Counter(
            "pyctl_extender_requests_total",
            "Scheduler extender requests by verb and outcome (ok, bad-request, deadline, "
            "overload, error); every outcome but ok is answered with no advice",
            ["cluster", "verb", "outcome"],
            registry=registry,
        )
        self.refused = Counter(
            "pyctl_http_refused_total",
            "Connections and requests refused before a handler, by server and reason "
            "(connections, read-timeout, header-too-large, body-too-large, body-budget, ...)",
            ["cluster", "server", "reason"],
            registry=registry,
        )
        self.extender_seconds = Histogram(
            "pyctl_extender_request_seconds",
            "Scheduler extender requests by verb: from the request's first byte to its answer "
            "(the scheduler waits this long, plus the network and its own encoding)",
            ["cluster", "verb"],
            buckets=_SECONDS,
            registry=registry,
        )
        self.extender_work = Histogram(
            "pyctl_extender_work_seconds",
            "Scheduler extender requests by verb and thread: the advice itself (decoding, "
            "ranking, encoding), on the server's own thread (`thread=server`: every rank it "
            "needed was kept) or on a worker; the rest of `pyctl_extender_request_seconds` is "
            "reading, waiting for a worker and for the GIL, and handing the answer back",
            ["cluster", "verb", "thread"],
            buckets=_SECONDS,
            registry=registry,
        )
        self.restarts = Counter(
            "pyctl_extender_process_restarts_total",
            "Times the extender's own process exited while the controller ran and was started "
            "again (`extender_process`)",
            ["cluster"],
            registry=registry,
        )
        self.messages_refused = Counter(
            "pyctl_extender_messages_refused_total",
            "Messages between the controller and the extender's own process refused by the side "
            "that read them (`controller`, `process`), by reason (version: another version of "
            "the messages; unexpected: another type; malformed: did not unpickle)",
            ["cluster", "side", "reason"],
            registry=registry,
        )
        self.restarts.labels(cluster)
        for verb in VERBS:
            self.extender_seconds.labels(cluster, verb)
            for thread in ("server", "worker"):
                self.extender_work.labels(cluster, verb, thread)
            for outcome in OUTCOMES:
                self.extender_requests.labels(cluster, verb, outcome)

    def request(self, verb: str, outcome: str, seconds: float | None = None) -> None:
        self.extender_requests.labels(self.cluster, verb, outcome).inc()
        if seconds is not None:
            self.extender_seconds.labels(self.cluster, verb).observe(seconds)

    def work(self, verb: str, seconds: float, thread: str = "worker") -> None:
        self.extender_work.labels(self.cluster, verb, thread).observe(seconds)

    def on_reject(self, server: str) -> Callable[[str], None]:
        def count(reason: str) -> None:
            self.refused.labels(self.cluster, server, reason).inc()

        return count


class ExtenderServer:
    """`handler` makes one `ExtenderHandler` per worker thread (the advisors it makes may share
    a table of kept ranks, `pyctl.controller.placement.RankTable`, as `pyctl run`'s do)."""

    def __init__(
        self,
        handler: Callable[[], ExtenderHandler],
        options: ExtenderOptions,
        metrics: ExtenderMetrics | None = None,
    ) -> None:
        self.make_handler = handler
        self.options = options
        self.metrics = metrics
        self.port = options.port
        self._local = threading.local()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        self.server: HttpServer | None = None

    # -- the work: on a worker thread, or on the server's own from kept ranks -----------------
    def _handler(self) -> ExtenderHandler:
        """This thread's handler."""
        handler: ExtenderHandler | None = getattr(self._local, "handler", None)
        if handler is None:
            handler = self._local.handler = self.make_handler()
        return handler

    def _timed(self, verb: str, thread: str, answer: Callable[[], _T]) -> _T:
        """`answer()`, its time counted as `thread`'s work on `verb` (when it answered)."""
        t0 = time.perf_counter()
        got = answer()
        if got is not None and self.metrics is not None and verb in VERBS:
            self.metrics.work(verb, time.perf_counter() - t0, thread)
        return got

    def _work(self, verb: str, body: bytes) -> tuple[bytes, str]:
        return self._timed(verb, "worker", lambda: self._handler().answer(verb, body))

    def _kept(self, verb: str, body: bytes) -> tuple[bytes, str] | None:
        """The answer from kept ranks, on the server's thread, or None (a worker computes it)."""
        return self._timed(verb, "server", lambda: self._handler().answer_kept(verb, body))

    # -- a request, on the server's loop ------------------------------------------------------
    async def _request(self, req: Request) -> Response:
        verb = req.path.rsplit("/", 1)[1]
        answer, outcome = await self._answer(verb, req)
        if self.metrics is not None:
            self.metrics.request(verb, outcome, time.monotonic() - req.started)
        if outcome in ("overload", "deadline"):
            log.info(
                "scheduler extender: no advice (%s)",
                outcome,
                extra={"verb": verb, "outcome": outcome, "peer": req.peer},
            )
        return Response(200, answer, "application/json")

    async def _answer(self, verb: str, req: Request) -> tuple[bytes, str]:
        assert self._slots is not None
        assert self._pool is not None
        assert self._loop is not None
        deadline = req.started + self.options.deadline
        left = deadline - time.monotonic()
        if left <= 0:
            return no_advice(verb, "deadline passed before the request was read"), "deadline"
        if self.options.answer_kept:
            got = self._kept(verb, req.body)
            if got is not None:
                return got
        try:
            async with asyncio.timeout(left):
                await self._slots.acquire()
        except TimeoutError:
            return no_advice(verb, "overloaded (every worker busy)"), "overload"
        loop, slots = self._loop, self._slots
        try:
            fut: Future[tuple[bytes, str]] = self._pool.submit(self._work, verb, req.body)
        except RuntimeError:  # the pool is shutting down
            slots.release()
            return no_advice(verb, "shutting down"), "overload"

        def release(_f: Future[tuple[bytes, str]]) -> None:
            # the slot is freed when the work ends, not when the answer was given
            with contextlib.suppress(RuntimeError):  # a closed loop: no one waits for the slot
                loop.call_soon_threadsafe(slots.release)

        fut.add_done_callback(release)
        waiter = asyncio.wrap_future(fut)
        try:
            # shielded: past the deadline the work goes on (threads cannot be stopped) and
            # its slot is freed when it ends; only the wait for it stops
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await asyncio.shield(waiter)
        except TimeoutError:
            waiter.add_done_callback(_retrieve)
            return no_advice(verb, f"deadline of {self.options.deadline:g}s passed"), "deadline"
        except Exception as e:  # ExtenderHandler.answer does not raise; if it did: no advice
            log.error("scheduler extender: worker failed", extra={"error": repr(e)[:300]})
            return no_advice(verb, "internal error"), "error"

    # -- the server's thread ------------------------------------------------------------------
    def _server_for(self) -> HttpServer:
        o = self.options
        tls = None
        if o.tls_cert_file:
            tls = TlsFiles(o.tls_cert_file, o.tls_key_file, o.client_ca_file)
        authorize: Authorize | None = BearerToken(o.token_file) if o.token_file else None
        route = Route(self._request, frozenset({"POST"}), o.max_body_bytes)
        return HttpServer(
            "extender",
            {f"{PREFIX}/{v}": route for v in VERBS},
            o.host,
            o.port,
            o.limits(),
            tls=tls,
            authorize=authorize,
            on_reject=self.metrics.on_reject("extender") if self.metrics else None,
        )

    async def _main(self, started: Future[int]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._slots = asyncio.Semaphore(self.options.max_concurrency)
        try:
            self.server = self._server_for()
            port = await self.server.start()
        except BaseException as e:
            started.set_exception(e)
            return
        started.set_result(port)
        try:
            await self._stop.wait()
        finally:
            await self.server.stop()

    async def start(self) -> int:
        """Start the server's thread; returns the bound port. Raises what the server raised
        (a port in use, unreadable certificate files)."""
        if sys.getswitchinterval() > SWITCH_INTERVAL:
            sys.setswitchinterval(SWITCH_INTERVAL)
        self._pool = ThreadPoolExecutor(
            self.options.max_concurrency, thread_name_prefix="pyctl-extender-worker"
        )
        started: Future[int] = Future()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._main(started)),
            name="pyctl-extender",
            daemon=True,
        )
        self._thread.start()
        try:
            self.port = await asyncio.wrap_future(started)
        except BaseException:
            await self.stop()
            raise
        return self.port

    async def stop(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # already closed
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 10.0)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._thread = self._loop = self._stop = self._pool = None


def _retrieve(f: asyncio.Future[tuple[bytes, str]]) -> None:
    """Take a late answer's result, so that nothing is reported about it."""
    if not f.cancelled():
        f.exception()
