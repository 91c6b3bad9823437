"""A small HTTP/1.1 server with bounds (asyncio streams, HTTP parsing by h11), under both of
pyctl's servers (`pyctl.serve.health`, `pyctl.serve.extender_server`).

Every resource a client can hold is bounded, so that no client, slow or hostile, can hold the
process:

- open connections (`Limits.max_connections`): when full, a connection of the client address
  holding the most is closed to make room (the one idle longest, else the one whose request has
  been arriving longest), so that slow clients cannot lock new ones out; only when every
  connection holds a request being answered is the new one answered 503 and closed;
- the time a request may take to arrive (`Limits.read_timeout`, headers and body together, from
  its first byte; a new connection's first request from the connection): 408;
- the time a kept-alive connection may wait for its next request (`Limits.idle_timeout`);
- the size of the headers (`Limits.max_header_bytes`, 431) and of the body
  (`Route.max_body_bytes`: refused from Content-Length before reading, or while reading a chunked
  body, 413);
- the request-body bytes held at once over all connections (`Limits.body_budget`, 503);
- the time a client may take to read an answer (`Limits.read_timeout` again).

TLS (optionally with client certificates) comes from mounted files, re-read when they change
(`TlsFiles`); a request is authorized from its headers (`Authorize`, e.g. `BearerToken`) before
its body is read. A client that disconnects, times out or speaks broken HTTP is one debug line in
the (JSON) log; each refusal is counted through `on_reject(reason)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import hmac
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import h11

log = logging.getLogger("pyctl.http")

#: bytes read from a socket at once
_CHUNK = 64 << 10


@dataclass(frozen=True)
class Limits:
    #: connections open at once
    max_connections: int = 64
    #: seconds for a request's headers and body to arrive (from its first byte), and for an
    #: answer to be taken by the client
    read_timeout: float = 5.0
    #: seconds a kept-alive connection may wait for its next request
    idle_timeout: float = 30.0
    #: the request line and headers
    max_header_bytes: int = 16 << 10
    #: the largest body of a route that does not say
    max_body_bytes: int = 4 << 10
    #: request-body bytes held at once over all connections (None: max_connections x the body
    #: limit, i.e. no budget beyond the per-request limit)
    body_budget: int | None = None


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    #: header names in lower case
    headers: Mapping[str, str]
    body: bytes
    #: `time.monotonic()` when the request's first byte arrived
    started: float
    peer: str


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Awaitable[Response]]
#: a request's headers (lower-case names) → None to go on, or why it is refused (401)
Authorize = Callable[[Mapping[str, str]], "str | None"]


@dataclass(frozen=True)
class Route:
    handler: Handler
    methods: frozenset[str] = frozenset({"GET"})
    #: None: `Limits.max_body_bytes`
    max_body_bytes: int | None = None


class _Refused(Exception):
    """A request answered with an error status before reaching its handler."""

    def __init__(self, status: int, reason: str, message: str, close: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.close = close


class _Gone(Exception):
    """The connection ends: the client closed it (mid-request when `why` says so), or let it
    idle past `idle_timeout`."""

    def __init__(self, why: str = "") -> None:
        super().__init__(why)
        self.why = why


class _Budget:
    """Request-body bytes held at once, over every connection."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)


def _signature(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class TlsFiles:
    """A server TLS context from mounted PEM files: the certificate and key, and optionally a CA
    bundle whose certificates clients must present (mutual TLS). The files are checked at most
    once a second and the context rebuilt when one changed (cert-manager and projected volumes
    replace them in place); a rebuild that fails (a half-written file) keeps the last context."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "") -> None:
        self.files = tuple(f for f in (cert_file, key_file, client_ca_file) if f)
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self._checked = 0.0
        self._seen = self._signatures()
        self._context = self._build()  # raises at start: a server that cannot serve TLS stops

    def _signatures(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(_signature(f) for f in self.files)

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=self.client_ca_file)
        return ctx

    def context(self) -> ssl.SSLContext:
        now = time.monotonic()
        if now - self._checked >= 1.0:
            self._checked = now
            seen = self._signatures()
            if seen != self._seen:
                self._seen = seen
                try:
                    self._context = self._build()
                    log.info("tls: certificate files re-read", extra={"files": list(self.files)})
                except (OSError, ssl.SSLError, ValueError) as e:
                    log.warning(
                        "tls: certificate files changed but cannot be read; keeping the last ones",
                        extra={"files": list(self.files), "error": f"{type(e).__name__}: {e}"},
                    )
        return self._context


class BearerToken:
    """Clients must send ``Authorization: Bearer <the token in the file>``; the file is re-read
    when it changes (projected service-account tokens rotate), compared in constant time. A
    missing or empty file refuses every request."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | bool | None = False  # False: never read
        self._token = b""

    def _current(self) -> bytes:
        sig = _signature(self.path)
        if sig != self._seen:
            self._seen = sig
            try:
                with open(self.path, "rb") as f:
                    self._token = f.read(64 << 10).strip()
            except OSError as e:
                self._token = b""
                log.warning("token file unreadable", extra={"file": self.path, "error": str(e)})
        return self._token

    def __call__(self, headers: Mapping[str, str]) -> str | None:
        token = self._current()
        if not token:
            return "no token configured (token file missing or empty)"
        got = headers.get("authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer":
            return "missing bearer token"
        if not hmac.compare_digest(value.strip().encode("utf-8", "replace"), token):
            return "wrong bearer token"
        return None


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    #: "reading" (a new connection, or a request arriving), "idle" (kept alive after an answer,
    #: waiting for the next request) or "busy" (a request read, being answered)
    state: str
    #: `time.monotonic()` when it entered that state
    since: float
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    #: the client's address (without the port)
    host: str = ""

    def enter(self, state: str, at: float | None = None) -> None:
        self.state = state
        self.since = time.monotonic() if at is None else at


class _Events:
    """The h11 events of one request as they arrive on a connection, within its bounds: the
    first byte within `idle_timeout` (a connection's first request: within `read_timeout` of
    `opened`), the whole request within `read_timeout` of its first byte, its request line and
    headers within `max_header_bytes`."""

    def __init__(
        self,
        conn: _Conn,
        h: h11.Connection,
        reader: asyncio.StreamReader,
        limits: Limits,
        trim: _Trim,
        opened: float | None,
    ) -> None:
        self.conn, self.h, self.reader, self.limits, self.trim = conn, h, reader, limits, trim
        #: when the request began (its first event or byte; the connection's opening for its
        #: first request) and when it is due
        self.started = opened
        self.until = opened + limits.read_timeout if opened is not None else 0.0
        self.seen = False  # a byte of this request
        # bytes given to h11 for this request, those of it already received (pipelined)
        # included: h11 bounds only headers still incomplete (`max_incomplete_event_size`), so
        # headers that arrive whole in one read are measured here, when their event comes
        self.fed = len(h.trailing_data[0])

    async def next(self) -> h11.Event | type[h11.PAUSED]:
        """The next event, reading from the connection while h11 needs data."""
        while True:
            ev = self._parse()
            if ev is not h11.NEED_DATA:
                if self.started is None:
                    self._start()
                return cast("h11.Event | type[h11.PAUSED]", ev)
            await self._receive()

    def _parse(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """h11's next event; bad HTTP, or a request line and headers too large, refused."""
        lim, h = self.limits, self.h
        try:
            ev = h.next_event()
        except h11.RemoteProtocolError as e:
            if "too long" in str(e) or "exceeds" in str(e):
                raise _Refused(431, "header-too-large", f"bad HTTP: {e}") from None
            raise _Refused(400, "bad-request", f"bad HTTP: {e}") from None
        if isinstance(ev, h11.Request):
            head = self.fed - len(h.trailing_data[0])
            if head > lim.max_header_bytes:
                raise _Refused(
                    431,
                    "header-too-large",
                    f"request line and headers of {head} bytes over {lim.max_header_bytes}",
                )
        return ev

    def _start(self) -> None:
        """The request begins now: it is due within `read_timeout`."""
        self.started = time.monotonic()
        self.until = self.started + self.limits.read_timeout
        self.conn.enter("reading", self.started)

    async def _receive(self) -> None:
        """The next bytes from the connection, given to h11, before the request's deadline."""
        if self.started is None:
            timeout, why = self.limits.idle_timeout, None
        else:
            timeout, why = self.until - time.monotonic(), "read-timeout"
        if timeout <= 0:
            raise _Refused(408, "read-timeout", "request not received in time")
        try:
            async with asyncio.timeout(timeout):  # (wait_for would make a task a read)
                data = await self.reader.read(_CHUNK)
            self.trim.received += len(data)
        except TimeoutError:
            if why is None:
                raise _Gone() from None
            raise _Refused(408, why, "request not received in time") from None
        if self.started is None and data:
            self._start()
        if not data:
            raise _Gone("closed mid-request" if self.seen else "")
        self.seen = True
        self.fed += len(data)
        self.h.receive_data(data)


_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class HttpServer:
    """Serves `routes` (exact paths) on host:port within `limits`; see the module's docstring."""

    def __init__(
        self,
        name: str,
        routes: Mapping[str, Route],
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        tls: TlsFiles | None = None,
        authorize: Authorize | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.name = name
        self.routes = dict(routes)
        self.host = host
        self.port = port
        self.limits = limits or Limits()
        self.tls = tls
        self.authorize = authorize
        self.on_reject = on_reject
        biggest = max(
            [self.limits.max_body_bytes]
            + [r.max_body_bytes for r in self.routes.values() if r.max_body_bytes is not None]
        )
        budget = self.limits.body_budget
        if budget is None:
            budget = self.limits.max_connections * biggest
        self._budget = _Budget(budget)
        self._conns: set[_Conn] = set()
        self._server: asyncio.Server | None = None
        self._trim = _Trim()
        self._trimmer: asyncio.Task[None] | None = None

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def start(self) -> int:
        """Start serving; returns the bound port (useful with port 0)."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=_CHUNK, backlog=1024
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._trimmer = asyncio.create_task(self._trim.run())
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        if self._trimmer is not None:
            self._trimmer.cancel()
            self._trimmer = None
        self._server.close()
        for c in list(self._conns):
            if c.task is not None:
                c.task.cancel()
        tasks = [c.task for c in self._conns if c.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    def _reject(self, reason: str) -> None:
        if self.on_reject is not None:
            self.on_reject(reason)

    # -- a connection ------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        conn = _Conn(
            writer, "reading", time.monotonic(), asyncio.current_task(), peer.rpartition(":")[0]
        )
        if len(self._conns) >= self.limits.max_connections and not self._make_room(peer):
            self._reject("connections")
            log.debug(
                "http: too many connections; refused",
                extra={"server": self.name, "peer": peer, "open": len(self._conns)},
            )
            with contextlib.suppress(Exception):
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n"
                    b"Content-Length: 0\r\n\r\n"
                )
                await self._linger(reader, writer)
            _abort(writer)
            return
        self._conns.add(conn)
        try:
            await self._connection(conn, reader, writer, peer)
        except _Gone as g:
            if g.why:
                log.debug(
                    "http: client gone", extra={"server": self.name, "peer": peer, "error": g.why}
                )
        except asyncio.CancelledError:
            # the server stops: this task ends quietly (asyncio's stream callback would log the
            # traceback of a cancelled connection task)
            pass
        except (TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError) as e:
            # a client that went away, or stalled a TLS handshake: one quiet line
            if isinstance(e, ssl.SSLError | TimeoutError):
                self._reject("tls" if isinstance(e, ssl.SSLError) else "read-timeout")
            log.debug(
                "http: client gone",
                extra={"server": self.name, "peer": peer, "error": _short(e)},
            )
        except Exception as e:  # a bug here must not kill the server: one JSON line
            log.error(
                "http: connection failed",
                extra={"server": self.name, "peer": peer, "error": _short(e)},
            )
        finally:
            self._conns.discard(conn)
            _abort(writer)

    def _make_room(self, peer: str) -> bool:
        """At the connection limit, close a connection that holds no request being answered:
        of the client address with the most connections, the one that has waited longest for a
        request (kept alive after an answer), else the one whose request has been arriving
        longest (a slow or stalled client: well-behaved clients send a request in
        milliseconds). So slow connections cannot lock new ones out, and a client that opens
        many cannot push out one that opens a few. False when every connection holds a request
        being answered."""
        per_host: dict[str, int] = {}
        for c in self._conns:
            per_host[c.host] = per_host.get(c.host, 0) + 1
        victim: _Conn | None = None
        best: tuple[int, str, float] | None = None
        for c in self._conns:
            if c.state == "busy":
                continue
            key = (-per_host[c.host], c.state, c.since)  # "idle" sorts before "reading"
            if best is None or key < best:
                victim, best = c, key
        if victim is None:
            return False
        self._conns.discard(victim)
        self._reject("evicted")
        log.debug(
            "http: connection closed to make room",
            extra={"server": self.name, "peer": _peer(victim.writer), "for": peer},
        )
        with contextlib.suppress(Exception):
            victim.writer.transport.abort()
        return True

    async def _connection(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: str,
    ) -> None:
        lim = self.limits
        if self.tls is not None:
            await writer.start_tls(self.tls.context(), ssl_handshake_timeout=lim.read_timeout)
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=lim.max_header_bytes)
        opened: float | None = time.monotonic()  # the first request is due from here
        while True:
            try:
                req = await self._read_request(conn, h, reader, opened)
            except _Refused as r:
                self._reject(r.reason)
                log.debug(
                    "http: request refused",
                    extra={"server": self.name, "peer": peer, "status": r.status, "why": r.message},
                )
                if h.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self._send(h, writer, _error(r.status, r.message), close=True)
                    self._conns.discard(conn)  # lingering does not count as open
                    await self._linger(reader, writer)
                return
            try:
                resp = await self.routes[req.path].handler(req)
            except Exception as e:
                log.error(
                    "http: handler failed",
                    extra={"server": self.name, "path": req.path, "error": _short(e)},
                )
                resp = _error(500, "internal error")
            await self._send(h, writer, resp, close=False)
            if reader.at_eof():
                raise _Gone("closed before its answer")
            opened = None
            conn.enter("idle")
            if h.our_state is h11.MUST_CLOSE or h.their_state is h11.MUST_CLOSE:
                return
            try:
                h.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _read_request(
        self,
        conn: _Conn,
        h: h11.Connection,
        reader: asyncio.StreamReader,
        opened: float | None,
    ) -> Request:
        """The next request on the connection: the first one due within `read_timeout` of
        `opened`, a later one within `idle_timeout` of the last answer (then `read_timeout` from
        its first byte)."""
        events = _Events(conn, h, reader, self.limits, self._trim, opened)
        ev = await events.next()
        if isinstance(ev, h11.ConnectionClosed) or ev is h11.PAUSED:
            raise _Gone()
        if not isinstance(ev, h11.Request):
            raise _Refused(400, "bad-request", "expected a request")
        assert events.started is not None
        method = ev.method.decode("ascii", "replace")
        target = ev.target.decode("ascii", "replace")
        path = target.split("?", 1)[0]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in ev.headers}
        route = self._admit(method, path, headers)
        body = await self._read_body(conn, events, route, headers)
        conn.enter("busy")
        return Request(method, path, headers, body, events.started, _peer(conn.writer))

    def _admit(self, method: str, path: str, headers: Mapping[str, str]) -> Route:
        """The route of a request, refused if there is none, the method not its or unauthorized."""
        route = self.routes.get(path)
        if route is None:
            raise _Refused(404, "not-found", f"no such path {path[:100]!r}")
        if method not in route.methods:
            raise _Refused(405, "method", f"{method[:20]} not allowed on {path}")
        if self.authorize is not None:
            why = self.authorize(headers)
            if why is not None:
                raise _Refused(401, "unauthorized", why)
        return route

    async def _read_body(
        self, conn: _Conn, events: _Events, route: Route, headers: Mapping[str, str]
    ) -> bytes:
        """The request's body, within the route's limit and the body budget (held meanwhile)."""
        lim, h = self.limits, events.h
        limit = route.max_body_bytes if route.max_body_bytes is not None else lim.max_body_bytes
        length = headers.get("content-length")
        declared = 0
        if length is not None:
            declared = int(length)  # h11 checked it is a number
            if declared > limit:
                raise _Refused(413, "body-too-large", f"body of {declared} bytes over {limit}")
        if not self._budget.take(declared):
            raise _Refused(503, "body-budget", "too many request bodies in flight")
        held = declared
        if h.they_are_waiting_for_100_continue:  # curl's `Expect: 100-continue`: go on
            conn.writer.write(h.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                ev = await events.next()
                if isinstance(ev, h11.Data):
                    size += len(ev.data)
                    if size > limit:
                        raise _Refused(413, "body-too-large", f"body over {limit} bytes")
                    if size > held:  # a chunked body: take from the budget as it comes
                        if not self._budget.take(size - held):
                            raise _Refused(503, "body-budget", "too many request bodies in flight")
                        held = size
                    chunks.append(ev.data)
                elif isinstance(ev, h11.EndOfMessage):
                    break
                elif isinstance(ev, h11.ConnectionClosed):
                    raise _Gone("closed mid-request")
                else:
                    raise _Refused(400, "bad-request", "unexpected HTTP event")
            return b"".join(chunks)
        finally:
            chunks.clear()
            self._budget.give(held)

    async def _send(
        self, h: h11.Connection, writer: asyncio.StreamWriter, resp: Response, close: bool
    ) -> None:
        headers = [
            ("Content-Type", resp.content_type),
            ("Content-Length", str(len(resp.body))),
            *resp.headers,
        ]
        if close:
            headers.append(("Connection", "close"))
        reason = _REASONS.get(resp.status, "")
        try:
            out = h.send(h11.Response(status_code=resp.status, headers=headers, reason=reason))
            out = (out or b"") + (h.send(h11.Data(data=resp.body)) or b"")
            out += h.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            raise _Gone() from None
        writer.write(out)
        try:
            async with asyncio.timeout(self.limits.read_timeout):
                await writer.drain()
        except TimeoutError:
            self._reject("write-timeout")
            raise _Gone("did not read the answer in time") from None

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """After an error answer sent before the request was read: stop sending, and read (and
        drop) what the client still sends for a moment, so that closing does not reset the
        connection before the client has read the answer."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.drain(), 0.5)
            if writer.can_write_eof():
                writer.write_eof()
            until = time.monotonic() + min(0.5, self.limits.read_timeout)
            got = 0
            while got < _CHUNK and (left := until - time.monotonic()) > 0:
                data = await asyncio.wait_for(reader.read(_CHUNK), left)
                self._trim.received += len(data)
                if not data:
                    break
                got += len(data)


def _glibc() -> ctypes.CDLL | None:
    """glibc, or None (another C library: musl has neither malloc_trim nor mallopt)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc


_LIBC = _glibc()

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: allocations from this size on are mapped on their own and unmapped when freed; free memory
#: at the top of an arena beyond it is given back when a free merges into it (glibc's initial
#: values of both thresholds, here kept fixed)
MALLOC_THRESHOLD = 128 << 10


def tune_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds at `MALLOC_THRESHOLD` (what `pyctl run` does at
    start). By default glibc raises both each time a mapped block is freed (up to 32 MiB and
    64 MiB): after the first 1 MiB request bodies, bodies and parse buffers come from the
    per-thread arenas (the extender's server thread, its workers, the executors' threads), and
    the free memory at the top of a thread's arena, up to the raised trim threshold, stays
    resident: malloc_trim(0) gives back free pages inside every arena but shrinks the top of
    the main one only. With the thresholds fixed, a large block goes back to the system when
    it is freed, whenever that is. False: not glibc, nothing changed."""
    if _LIBC is None:
        return False
    mapped = int(_LIBC.mallopt(_M_MMAP_THRESHOLD, MALLOC_THRESHOLD))
    trimmed = int(_LIBC.mallopt(_M_TRIM_THRESHOLD, MALLOC_THRESHOLD))
    return mapped == 1 and trimmed == 1


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None (another C library)."""
    libc = _LIBC
    if libc is None:
        return None
    return lambda: libc.malloc_trim(0)


_TRIM = _malloc_trim()


class _Trim:
    """Gives the memory of request bodies back to the system after a burst. CPython keeps
    reference cycles (asyncio's timeouts and closed connections make some, holding buffers)
    until a full collection, which with a large heap comes rarely, and glibc keeps freed heap
    memory in its arenas, so after a burst of 1 MB bodies the process's RSS would stay high
    though nothing holds it. Every `INTERVAL` seconds, with the bytes received in that interval
    (`recent`):

    - a full garbage collection, then malloc_trim(0), when traffic is over: nothing came in the
      interval after at least `QUIET` since the last collection, or less than `QUIET` came
      after an interval of `THRESHOLD` or more (a burst) since the last collection;
    - else malloc_trim(0) alone, once `THRESHOLD` bytes came since the last trim (a burst, or
      steady traffic such as the scheduler's, goes on). Steady traffic alone never costs a
      collection: a full collection holds the GIL while it walks the controller's whole heap,
      and the extender's answers wait for it. Nor do a few small requests: the probes and
      scrapes of the metrics port (a few hundred bytes every few seconds) would otherwise set
      off a full collection every other interval, for memory they never held.

    So the release follows every burst within two intervals of its last byte. On a worker
    thread (ctypes releases the GIL for malloc_trim).
    Measured by tests/e2e/test_http_load_e2e.py: docs/http.md."""

    THRESHOLD = 8 << 20
    QUIET = THRESHOLD // 8
    INTERVAL = 5.0

    def __init__(self) -> None:
        self.received = 0  # bytes in the current interval
        self.since_collect = 0  # bytes since the last collection
        self.since_trim = 0  # bytes since the last trim
        self.burst = False  # an interval of THRESHOLD bytes or more since the last collection

    def step(self) -> bool | None:
        """The end of an interval: None (nothing to do), False (trim), True (collect and
        trim)."""
        recent, self.received = self.received, 0
        self.since_collect += recent
        self.since_trim += recent
        self.burst = self.burst or recent >= self.THRESHOLD
        over = recent == 0 and self.since_collect >= self.QUIET
        if over or (self.burst and recent < self.QUIET):
            self.since_collect = self.since_trim = 0
            self.burst = False
            return True
        if self.since_trim >= self.THRESHOLD:
            self.since_trim = 0
            return False
        return None

    async def run(self) -> None:
        trim = _TRIM
        while True:
            await asyncio.sleep(self.INTERVAL)
            collect = self.step()
            if collect is not None:
                await asyncio.get_running_loop().run_in_executor(None, _release, collect, trim)


def _release(collect: bool, trim: Callable[[], object] | None) -> None:
    if collect:
        gc.collect()
    if trim is not None:
        trim()


def _error(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode())


def _peer(writer: asyncio.StreamWriter) -> str:
    p = writer.get_extra_info("peername")
    if isinstance(p, tuple) and len(p) >= 2:
        return f"{p[0]}:{p[1]}"
    return str(p)


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close without waiting for the client (a stalled client cannot hold the close)."""
    with contextlib.suppress(Exception):
        transport = writer.transport
        if not transport.is_closing():
            if isinstance(transport, asyncio.Transport) and not transport.get_write_buffer_size():
                writer.close()
            else:
                transport.abort()
    _unlink(writer.transport)


def _unlink(transport: asyncio.BaseTransport, tries: int = 40) -> None:
    """Break the reference cycle of a closed socket transport: asyncio's (Python 3.11) refers to
    itself through its read callback, a cycle that only a full garbage collection frees, which
    with a large heap comes rarely; thousands of short connections would pile up meanwhile. A
    closed transport reads no more (its socket left the selector when it was closed). Under TLS
    the socket's transport closes after the TLS shutdown: it is looked at again each second."""
    inner = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)
    for t in (transport, inner):
        if t is None or getattr(t, "_read_ready_cb", None) is None:
            continue
        if t.is_closing():
            setattr(t, "_read_ready_cb", None)  # noqa: B010 (a private attribute of asyncio)
        elif tries > 0:
            with contextlib.suppress(RuntimeError):  # no running loop: the server stopped
                asyncio.get_running_loop().call_later(1.0, _unlink, t, tries - 1)
