"""The HTTP servers' bounds (pyctl/serve/http.py, extender_server.py, health.py), each limit on
its own, over real sockets: body limits (from Content-Length, and while reading a chunked body),
the body budget, read timeouts (slow headers, slow bodies), idle kept-alive connections, the
connection limit, the extender's concurrency bound and deadline ("no advice", never late), TLS,
mutual TLS and bearer tokens with real certificates (trustme), token rotation, certificate
rotation, and a disconnecting client as one debug line."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from prometheus_client import CollectorRegistry

from pyctl.app.config import ConfigError, load_config
from pyctl.controller.placement import PlacementAdvisor
from pyctl.log import JsonFormatter
from pyctl.model import Workload
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer, HttpMetrics
from pyctl.serve.health import HealthServer, MetricsOptions
from pyctl.serve.http import _TRIM, HttpServer, Limits, Request, Response, Route, _Trim

pytestmark = pytest.mark.anyio

POD = {
    "metadata": {"name": "p", "namespace": "default", "uid": "u"},
    "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]},
}


def body(names: list[str] | None = None) -> bytes:
    return json.dumps({"Pod": POD, "NodeNames": names or ["a", "b"]}).encode()


class SlowHandler(ExtenderHandler):
    """The real handler (no models: every node passes), `delay` seconds slower. Its answers
    need work on a worker (as if a rank had to be computed), but for candidate lists naming a
    node "warm": those it answers from what it keeps, on the server's thread."""

    def __init__(self, delay: float) -> None:
        super().__init__(PlacementAdvisor({}, lambda: Workload(())))
        self.delay = delay
        self.threads: list[str] = []

    def answer(self, verb: str, body: bytes) -> tuple[bytes, str]:
        time.sleep(self.delay)
        self.threads.append(threading.current_thread().name)
        return super().answer(verb, body)

    def answer_kept(self, verb: str, body: bytes) -> tuple[bytes, str] | None:
        if b'"warm"' not in body:
            return None
        self.threads.append(threading.current_thread().name)
        return super().answer_kept(verb, body)


class Served:
    def __init__(
        self, server: ExtenderServer, registry: CollectorRegistry, handlers: list[SlowHandler]
    ) -> None:
        self.server = server
        self.registry = registry
        self.port = server.port
        #: the handlers made, one per thread that answered
        self.handlers = handlers

    def work(self, verb: str, thread: str) -> float:
        v = self.registry.get_sample_value(
            "pyctl_extender_work_seconds_count", {"cluster": "t", "verb": verb, "thread": thread}
        )
        return v or 0.0

    def count(self, verb: str, outcome: str) -> float:
        v = self.registry.get_sample_value(
            "pyctl_extender_requests_total", {"cluster": "t", "verb": verb, "outcome": outcome}
        )
        return v or 0.0

    def refused(self, reason: str) -> float:
        v = self.registry.get_sample_value(
            "pyctl_http_refused_total", {"cluster": "t", "server": "extender", "reason": reason}
        )
        return v or 0.0


async def serve(delay: float = 0.0, **options: Any) -> Served:
    registry = CollectorRegistry()
    handlers: list[SlowHandler] = []

    def handler() -> SlowHandler:
        handlers.append(SlowHandler(delay))
        return handlers[-1]

    server = ExtenderServer(handler, ExtenderOptions(**options), HttpMetrics(registry, "t"))
    await server.start()
    return Served(server, registry, handlers)


@pytest.fixture
async def served() -> AsyncIterator[Callable[..., Any]]:
    started: list[Served] = []

    async def make(delay: float = 0.0, **options: Any) -> Served:
        s = await serve(delay, **options)
        started.append(s)
        return s

    yield make
    for s in started:
        await s.server.stop()


def request(
    path: str = "/scheduler/filter", data: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: pyctl", f"Content-Length: {len(data)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


async def exchange(
    port: int,
    data: bytes,
    ssl_ctx: ssl.SSLContext | None = None,
    wait: float = 10.0,
) -> tuple[int, bytes]:
    """Send `data`, read until the server closes or answers one response; (status, body)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ssl_ctx, server_hostname="localhost" if ssl_ctx else None
    )
    try:
        writer.write(data)
        await writer.drain()
        return await read_response(reader, wait)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader, wait: float = 10.0) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await asyncio.wait_for(reader.readexactly(length), wait)


# ---- the extender: answers, concurrency, deadline ---------------------------------------------


async def test_answers_and_counts(served: Callable[..., Any]) -> None:
    s = await served()
    status, out = await exchange(s.port, request(data=body(["a", "a", "b"])))
    assert status == 200
    assert json.loads(out)["NodeNames"] == ["a", "a", "b"]  # the list as sent
    status, out = await exchange(s.port, request("/scheduler/prioritize", body()))
    assert (status, json.loads(out)) == (
        200,
        [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 0}],
    )
    status, out = await exchange(s.port, request(data=b"[1, 2"))
    assert status == 200
    assert json.loads(out)["Error"].startswith("pyctl: request body is not JSON")
    assert (s.count("filter", "ok"), s.count("prioritize", "ok")) == (1, 1)
    assert s.count("filter", "bad-request") == 1


async def test_deadline_answers_no_advice_on_time(served: Callable[..., Any]) -> None:
    s = await served(delay=1.0, deadline=0.3, max_concurrency=1)
    t0 = time.monotonic()
    status, out = await exchange(s.port, request(data=body()))
    took = time.monotonic() - t0
    assert status == 200
    assert json.loads(out)["Error"] == "pyctl: no advice: deadline of 0.3s passed"
    assert 0.25 < took < 0.9, took  # the deadline, not the 1 s of work
    status, out = await exchange(s.port, request("/scheduler/prioritize", body()))
    assert json.loads(out) == []  # no score from pyctl
    assert s.count("filter", "deadline") == 1
    # the first request's worker was still busy (1 s of work): the second found no free worker
    assert s.count("prioritize", "overload") + s.count("prioritize", "deadline") == 1


async def test_concurrency_is_bounded_and_excess_waits_then_gets_no_advice(
    served: Callable[..., Any],
) -> None:
    s = await served(delay=0.4, deadline=1.0, max_concurrency=2)
    t0 = time.monotonic()
    got = await asyncio.gather(*(exchange(s.port, request(data=body())) for _ in range(6)))
    took = time.monotonic() - t0
    errors = [json.loads(b)["Error"] for _, b in got]
    # 2 workers x 1 s deadline / 0.4 s per request: 4 answered (two rounds), 2 past the deadline
    assert sorted(e == "" for e in errors) == [False, False, True, True, True, True], errors
    assert took < 1.6, took
    assert s.count("filter", "ok") == 4
    assert s.count("filter", "overload") + s.count("filter", "deadline") == 2


async def test_answers_from_kept_ranks_on_the_servers_thread_while_workers_are_busy(
    served: Callable[..., Any],
) -> None:
    """A request every rank of which is kept is answered on the server's own thread, without a
    worker: even while the only worker is busy with a request that needs ranks computed."""
    s = await served(delay=1.0, deadline=3.0, max_concurrency=1)
    cold = asyncio.create_task(exchange(s.port, request(data=body(["a", "b"]))))
    await asyncio.sleep(0.2)  # the cold request holds the only worker
    t0 = time.monotonic()
    status, out = await exchange(s.port, request("/scheduler/prioritize", body(["warm", "b"])))
    took = time.monotonic() - t0
    assert status == 200
    assert json.loads(out) == [{"Host": "warm", "Score": 0}, {"Host": "b", "Score": 0}]
    assert took < 0.6, took  # not after the worker's 1 s
    assert not cold.done()
    status, out = await cold
    assert (status, json.loads(out)["Error"]) == (200, "")
    threads = sorted(t for h in s.handlers for t in h.threads)
    assert threads == ["pyctl-extender", "pyctl-extender-worker_0"], threads
    assert (s.work("prioritize", "server"), s.work("prioritize", "worker")) == (1, 0)
    assert (s.work("filter", "server"), s.work("filter", "worker")) == (0, 1)
    assert (s.count("filter", "ok"), s.count("prioritize", "ok")) == (1, 1)


async def test_answering_from_kept_ranks_can_be_turned_off(served: Callable[..., Any]) -> None:
    s = await served(answer_kept=False)
    status, _ = await exchange(s.port, request(data=body(["warm", "b"])))
    assert status == 200
    assert (s.work("filter", "server"), s.work("filter", "worker")) == (0, 1)


# ---- limits on reading ----------------------------------------------------------------------


async def test_body_limit_from_content_length_before_reading(served: Callable[..., Any]) -> None:
    s = await served(max_body_bytes=4096)
    head = request(data=b"").replace(b"Content-Length: 0", b"Content-Length: 999999")
    t0 = time.monotonic()
    status, _ = await exchange(s.port, head)  # the body never comes: refused from the header
    assert status == 413
    assert time.monotonic() - t0 < 1.0
    assert s.refused("body-too-large") == 1


async def test_body_limit_while_reading_a_chunked_body(served: Callable[..., Any]) -> None:
    s = await served(max_body_bytes=4096)
    head = (
        b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"400\r\n" + b"x" * 1024 + b"\r\n" for _ in range(5))
    )
    status, _ = await exchange(s.port, head)
    assert status == 413


async def test_body_budget_refuses_bodies_past_it(served: Callable[..., Any]) -> None:
    # budget: 2 x max_concurrency x max_body_bytes = 2 x 1 x 4096
    s = await served(max_body_bytes=4096, max_concurrency=1)
    head = request(data=b"").replace(b"Content-Length: 0", b"Content-Length: 4096")
    held = []
    for _ in range(2):  # two bodies announced and not sent: the budget is taken
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(head)
        held.append((r, w))
    await asyncio.sleep(0.3)
    status, _ = await exchange(s.port, head)
    assert status == 503
    assert s.refused("body-budget") == 1
    for _, w in held:
        w.close()


async def test_slow_headers_and_slow_bodies_time_out(served: Callable[..., Any]) -> None:
    s = await served(read_timeout=0.5)
    cases = (
        (b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n"),  # headers
        (request(data=body())[:-20], b"x"),  # the body, a byte now and then
    )
    for partial, drip in cases:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
        t0 = time.monotonic()
        writer.write(partial)
        for _ in range(4):  # dripping does not keep it open
            await asyncio.sleep(0.2)
            with contextlib.suppress(OSError):
                writer.write(drip)
        status, _ = await read_response(reader, 5.0)
        took = time.monotonic() - t0
        writer.close()
        assert status == 408
        assert took < 1.5, took
    assert s.refused("read-timeout") == 2


async def test_connection_limit_closes_idle_then_slow_ones_then_refuses(
    served: Callable[..., Any],
) -> None:
    s = await served(delay=1.0, deadline=3.0, max_connections=3, max_concurrency=3)
    # three kept-alive idle connections (each answered once... after 1 s of work)
    idle = []
    for _ in range(3):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(request(data=body()))
        idle.append((r, w))
    for r, _ in idle:
        assert (await read_response(r))[0] == 200
    # three connections in the middle of a request: each closes the idle one waiting longest
    slow = []
    for _ in range(3):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(b"POST /scheduler/filter HTTP/1.1\r\n")
        slow.append((r, w))
        await asyncio.sleep(0.05)
    for r, _ in idle:
        assert await asyncio.wait_for(r.read(), 2.0) == b""  # closed to make room
    # a whole request still gets in: the slow connection arriving longest is closed for it
    assert (await exchange(s.port, request(data=body())))[0] == 200
    assert await asyncio.wait_for(slow[0][0].read(), 2.0) == b""
    assert s.refused("evicted") == 4
    # every connection holding a request being answered: the next one is refused
    busy = []
    for _ in range(3):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(request(data=body()))
        busy.append((r, w))
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert (await exchange(s.port, request(data=body()), wait=2.0))[0] == 503
    assert s.refused("connections") == 1
    for r, _ in busy:
        assert (await read_response(r))[0] == 200
    for _, w in idle + slow + busy:
        w.close()


async def test_a_client_opening_many_connections_cannot_push_out_one_opening_few(
    served: Callable[..., Any],
) -> None:
    s = await served(max_connections=4, read_timeout=3.0)
    # one slow connection from 127.0.0.2 (opened first: the oldest), then a flood from 127.0.0.1
    lone_r, lone_w = await asyncio.open_connection("127.0.0.1", s.port, local_addr=("127.0.0.2", 0))
    lone_w.write(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\n")
    flood = []
    for _ in range(10):
        r, w = await asyncio.open_connection("127.0.0.1", s.port)
        w.write(b"POST /scheduler/filter HTTP/1.1\r\n")
        flood.append((r, w))
        await asyncio.sleep(0.02)
    assert s.refused("evicted") >= 7
    # the lone client's request completes: it was never the one closed
    rest = request(data=body()).split(b"Host: pyctl\r\n", 1)[1]
    lone_w.write(rest)
    assert (await read_response(lone_r))[0] == 200
    for _, w in [*flood, (lone_r, lone_w)]:
        w.close()


async def test_idle_connections_are_closed() -> None:
    async def ok(_req: Request) -> Response:
        return Response(body=b"ok")

    server = HttpServer("t", {"/": Route(ok)}, limits=Limits(idle_timeout=0.3))
    port = await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert await read_response(reader) == (200, b"ok")
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 3.0) == b""  # closed by the server
        assert 0.2 < time.monotonic() - t0 < 1.5
        writer.close()
        assert server.connections == 0
    finally:
        await server.stop()


async def test_a_client_that_disconnects_is_one_debug_line(
    served: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    s = await served(delay=0.3)
    caplog.set_level(logging.DEBUG)
    whole = request(data=body())
    # inside the headers, inside the body, while the extender works on the answer
    for cut in (10, 120, len(whole)):
        _, writer = await asyncio.open_connection("127.0.0.1", s.port)
        writer.write(whole[:cut])
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.transport.abort()
    await asyncio.sleep(0.5)
    gone = [r for r in caplog.records if r.name == "pyctl.http"]
    assert len(gone) == 3, [r.getMessage() for r in caplog.records]
    for r in gone:
        assert r.levelno == logging.DEBUG
        assert r.exc_info is None
        line = JsonFormatter().format(r)
        assert "\n" not in line
        assert json.loads(line)["msg"] == "http: client gone"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- TLS, mutual TLS, tokens --------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Any]:
    ca = trustme.CA()
    other = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("kube-scheduler")
    stranger = other.issue_cert("kube-scheduler")
    files = {
        "ca": tmp_path / "ca.pem",
        "cert": tmp_path / "tls.crt",
        "key": tmp_path / "tls.key",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    server.cert_chain_pems[0].write_to_path(str(files["cert"]))
    server.private_key_pem.write_to_path(str(files["key"]))
    return {"ca": ca, "client": client, "stranger": stranger, "files": files}


def client_ctx(pki: dict[str, Any], cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    pki["ca"].configure_trust(ctx)
    if cert is not None:
        cert.configure_cert(ctx)
    return ctx


async def test_tls(served: Callable[..., Any], pki: dict[str, Any]) -> None:
    f = pki["files"]
    s = await served(tls_cert_file=str(f["cert"]), tls_key_file=str(f["key"]))
    status, _ = await exchange(s.port, request(data=body()), client_ctx(pki))
    assert status == 200
    # plain HTTP to the TLS port: no answer, the connection is closed
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    writer.write(request(data=body()))
    assert b"HTTP/1.1 200" not in await asyncio.wait_for(reader.read(), 5.0)
    writer.close()


async def test_mutual_tls(served: Callable[..., Any], pki: dict[str, Any]) -> None:
    f = pki["files"]
    s = await served(
        tls_cert_file=str(f["cert"]), tls_key_file=str(f["key"]), client_ca_file=str(f["ca"])
    )
    status, _ = await exchange(s.port, request(data=body()), client_ctx(pki, pki["client"]))
    assert status == 200
    for cert in (None, pki["stranger"]):  # no client certificate; one from another CA
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await exchange(s.port, request(data=body()), client_ctx(pki, cert))
    assert s.refused("tls") >= 1
    assert s.count("filter", "ok") == 1


async def test_certificate_files_are_re_read_when_they_change(
    served: Callable[..., Any], pki: dict[str, Any], tmp_path: Path
) -> None:
    f = pki["files"]
    s = await served(tls_cert_file=str(f["cert"]), tls_key_file=str(f["key"]))

    async def served_serial() -> int:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", s.port, ssl=client_ctx(pki), server_hostname="localhost"
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        from cryptography import x509

        return int(x509.load_der_x509_certificate(der).serial_number)

    first = await served_serial()
    renewed = pki["ca"].issue_cert("localhost", "127.0.0.1")
    for src, dst in ((renewed.cert_chain_pems[0], "cert"), (renewed.private_key_pem, "key")):
        tmp = tmp_path / f"new-{dst}"
        src.write_to_path(str(tmp))
        os.replace(tmp, f[dst])
    await asyncio.sleep(1.1)  # checked at most once a second
    assert await served_serial() != first


async def test_bearer_token_constant_time_and_rotated(
    served: Callable[..., Any], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-one\n")
    s = await served(token_file=str(token))
    ok = {"Authorization": "Bearer s3cret-one"}
    assert (await exchange(s.port, request(data=body(), headers=ok)))[0] == 200
    for bad in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-one"}):
        status, why = await exchange(s.port, request(data=body(), headers=bad))
        assert status == 401, why
    assert s.refused("unauthorized") == 3
    assert s.count("filter", "ok") == 1  # refused requests never reach the extender
    # a projected token rotates: the file is replaced
    new = tmp_path / "token.new"
    new.write_text("s3cret-two")
    os.replace(new, token)
    assert (await exchange(s.port, request(data=body(), headers=ok)))[0] == 401
    two = {"Authorization": "Bearer s3cret-two"}
    assert (await exchange(s.port, request(data=body(), headers=two)))[0] == 200
    token.unlink()  # no token: nothing is let in
    assert (await exchange(s.port, request(data=body(), headers=two)))[0] == 401


async def test_tls_files_that_cannot_be_read_stop_the_start(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    server = ExtenderServer(
        lambda: SlowHandler(0), ExtenderOptions(tls_cert_file=missing, tls_key_file=missing)
    )
    with pytest.raises(FileNotFoundError):
        await server.start()


# ---- the metrics server -------------------------------------------------------------------


async def test_metrics_server_bounds(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    opts = MetricsOptions(max_connections=4, read_timeout=0.5)
    server = HealthServer(registry, lambda: (True, "ok"), limits=opts.limits())
    port = await server.start()
    try:
        # slow clients cannot lock the probe out: at the limit, the slowest is closed for it
        slow = []
        for _ in range(4):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /healthz HTTP/1.1\r\n")
            slow.append((r, w))
        await asyncio.sleep(0.1)
        get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        assert (await exchange(port, get)) == (200, b"ok\n")
        assert await asyncio.wait_for(slow[0][0].read(), 2.0) == b""
        await asyncio.sleep(0.7)  # the others timed out
        assert server._server is not None
        assert server._server.connections == 0
        for _, w in slow:
            w.close()
        # a body on a GET: small limit
        big = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
        assert (await exchange(port, big))[0] == 413
        assert (await exchange(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
        assert (await exchange(port, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 404
        assert (await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 200
    finally:
        await server.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PYCTL_EXTENDER_MAX_CONCURRENCY": "0"}, "extender_max_concurrency"),
        ({"PYCTL_EXTENDER_DEADLINE": "inf"}, "must be finite"),
        ({"PYCTL_EXTENDER_MAX_BODY_BYTES": "10"}, "extender_max_body_bytes"),
        ({"PYCTL_EXTENDER_MAX_CONNECTIONS": "0"}, "extender_max_connections"),
        ({"PYCTL_METRICS_READ_TIMEOUT": "0"}, "metrics_read_timeout"),
        ({"PYCTL_EXTENDER_TLS_CERT_FILE": "/x.pem"}, "go together"),
        ({"PYCTL_EXTENDER_PORT": "8081", "PYCTL_METRICS_PORT": "8081"}, "must differ"),
    ],
)
def test_bad_server_settings_are_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env)


def test_extender_files_are_checked_when_the_extender_is_served(
    pki: dict[str, Any], tmp_path: Path
) -> None:
    f = pki["files"]
    tls = {
        "PYCTL_EXTENDER_PORT": "8081",
        "PYCTL_EXTENDER_TLS_CERT_FILE": str(f["cert"]),
        "PYCTL_EXTENDER_TLS_KEY_FILE": str(f["key"]),
        "PYCTL_EXTENDER_CLIENT_CA_FILE": str(f["ca"]),
    }
    assert load_config(None, tls).extender.client_ca_file == str(f["ca"])
    missing = {**tls, "PYCTL_EXTENDER_CLIENT_CA_FILE": str(tmp_path / "nope.pem")}
    with pytest.raises(ConfigError, match=r"config extender_tls: cannot load .*nope\.pem"):
        load_config(None, missing)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match="config extender_tls: cannot load"):
        load_config(None, {**tls, "PYCTL_EXTENDER_TLS_CERT_FILE": str(garbage)})
    token = tmp_path / "token"
    token.write_text("")
    with pytest.raises(ConfigError, match=r"extender_token_file: .* is empty"):
        load_config(None, {"PYCTL_EXTENDER_PORT": "8081", "PYCTL_EXTENDER_TOKEN_FILE": str(token)})
    with pytest.raises(ConfigError, match="No such file"):
        load_config(None, {"PYCTL_EXTENDER_PORT": "8081", "PYCTL_EXTENDER_TOKEN_FILE": "/nope"})
    token.write_text("s3cret\n")
    cfg = load_config(
        None, {"PYCTL_EXTENDER_PORT": "8081", "PYCTL_EXTENDER_TOKEN_FILE": str(token)}
    )
    assert "s3cret" not in repr(cfg)  # the file's name is configured, never its content
    # not served: not checked
    assert load_config(None, {"PYCTL_EXTENDER_TOKEN_FILE": "/nope"}).extender.port == 0


async def test_closed_connections_leave_no_reference_cycles(served: Callable[..., Any]) -> None:
    """Thousands of short connections must be freed as they close, not left for a full garbage
    collection (which comes rarely with the controller's large heap). Plain HTTP: asyncio's TLS
    transports (Python 3.11) hold cycles of their own, which the collector frees."""
    s = await served()
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            assert (await exchange(s.port, request(data=body())))[0] == 200
            _, w = await asyncio.open_connection("127.0.0.1", s.port)  # gone mid-request
            w.write(b"POST /sched")
            await w.drain()
            w.transport.abort()
        await asyncio.sleep(0.5)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()

        def local_port(o: Any) -> int | None:
            try:
                return int(o.get_extra_info("sockname")[1])
            except Exception:
                return None

        transports = [o for o in gc.garbage if type(o).__name__ == "_SelectorSocketTransport"]
        server_side = [o for o in transports if local_port(o) == s.port]
        # this test's own client transports are left in asyncio's cycle: the control
        assert transports, "no cycle at all: the test does not see what it looks for"
        assert server_side == [], f"{len(server_side)} of the server's transports in cycles"
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def test_expect_100_continue_is_answered(served: Callable[..., Any]) -> None:
    """curl sends `Expect: 100-continue` with a body over 1 KiB and waits a second for it."""
    s = await served()
    data = body()
    head = request(data=b"", headers={"Expect": "100-continue"}).replace(
        b"Content-Length: 0", f"Content-Length: {len(data)}".encode()
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", s.port)
    writer.write(head)
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.5)
    assert interim.startswith(b"HTTP/1.1 100 ")
    writer.write(data)
    assert (await read_response(reader))[0] == 200
    writer.close()


def test_memory_is_released_after_every_burst() -> None:
    """_Trim's decision at the end of each interval, from the bytes received in it: a trim while
    a burst goes on, a collection and a trim once it is over (nothing, or next to nothing after
    a burst, came in the interval), and after a megabyte of requests followed by quiet; nothing
    while quiet or after a few small requests; steady traffic is trimmed, and collected only
    once it stops."""
    trim = _Trim()
    mb = 1 << 20

    def steps(*received: int) -> list[bool | None]:
        out = []
        for n in received:
            trim.received += n
            out.append(trim.step())
        return out

    # a burst over three intervals, a tail of 3 MB, then quiet: released after the tail
    assert steps(40 * mb, 60 * mb, 30 * mb, 3 * mb, 0, 0) == [False, False, False, None, True, None]
    # a burst over two intervals that thins out to 200 KB: released as it thins out
    assert steps(40 * mb, 60 * mb, mb // 5, 0) == [False, False, True, None]
    # a burst that stops dead at the end of an interval: released in the next (quiet) one
    assert steps(40 * mb, 0, 0) == [False, True, None]
    # a burst of less than the threshold per interval, then quiet
    assert steps(5 * mb, 5 * mb, 0) == [None, False, True]
    # a few small requests (probes, scrapes), then quiet: not worth a full collection, which
    # stalls every thread for as long as it walks the heap
    assert steps(20_000, 0, 0) == [None, None, None]
    # ... nor a trickle of them; a megabyte of them is
    assert steps(*[300, 0] * 20) == [None] * 40
    assert steps(mb - 40 * 300 // 2, 0) == [None, True]
    # the scheduler's steady traffic (5 MB per interval): a trim every other interval, no
    # collection while it goes on
    assert steps(*[5 * mb] * 6) == [None, False, None, False, None, False]
    assert steps(0) == [True]
    # light steady traffic (the extender's probes, 0.5 MiB per interval): a trim each time
    # 8 MiB have come (every 16 intervals), never a collection
    trim_every_16 = ([None] * 15 + [False]) * 2 + [None] * 8
    assert steps(*[mb // 2] * 40) == trim_every_16


_HELD = """
import sys, threading
from pyctl.serve import http

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

if sys.argv[1] == "tuned":
    assert http.tune_malloc()
out = {}
def work():
    big = bytearray(16 << 20)  # mapped on its own: freeing it raises glibc's thresholds
    del big
    r0 = rss()
    blocks = [bytearray(1 << 20) for _ in range(20)]  # 20 MiB from this thread's arena
    del blocks
    http._TRIM()
    out["held"] = rss() - r0
t = threading.Thread(target=work)
t.start()
t.join()
print(out["held"])
"""


@pytest.mark.skipif(_TRIM is None, reason="glibc only (malloc_trim, mallopt)")
def test_tuned_malloc_gives_freed_blocks_back_from_a_threads_arena() -> None:
    """The reason for tune_malloc: with glibc's default (dynamic) thresholds, 20 MiB freed in
    a thread's arena after a large block was freed stay resident even after malloc_trim(0)
    (which shrinks the top of the main arena only); with the thresholds fixed they go back.
    Each in a fresh interpreter (mallopt is for the whole process)."""

    def held(mode: str) -> float:
        got = subprocess.run(
            [sys.executable, "-c", _HELD, mode], capture_output=True, text=True, check=True
        )
        return float(got.stdout)

    assert held("default") > 15.0
    assert held("tuned") < 5.0


# ---- header limits, however the header arrives ------------------------------------------------


async def header_statuses(port: int, method: str, path: str, limit: int) -> dict[str, int]:
    """Status of a request whose line and headers are just under `limit`, then 65,000 bytes
    (sent in one write, then dribbled 1 KiB at a time) and just over `limit` (in one write)."""

    def head(size: int) -> bytes:
        start = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nX-Pad: ".encode()
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    async def send(data: bytes, piece: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(0, len(data), piece):
                writer.write(data[i : i + piece])
                await writer.drain()
                if piece < len(data):
                    await asyncio.sleep(0.001)
            return (await read_response(reader))[0]
        except (ConnectionResetError, asyncio.IncompleteReadError):
            return -1  # closed without an answer
        finally:
            writer.close()

    assert len(head(limit)) == limit
    return {
        "under": await send(head(limit - 16) + b"{}", 1 << 20),
        "65000 at once": await send(head(65_000) + b"{}", 1 << 20),
        "65000 dribbled": await send(head(65_000) + b"{}", 1024),
        "over by 1": await send(head(limit + 1) + b"{}", 1 << 20),
    }


REFUSED = {"65000 at once": 431, "65000 dribbled": 431, "over by 1": 431}


async def test_header_limits_are_enforced_however_the_header_arrives(
    served: Callable[..., Any],
) -> None:
    """docs/http.md: 8 KiB on the metrics server, 16 KiB on the extender (request line and
    headers). Before, 65,000 bytes in one write were answered 200 on both: h11 bounds only
    headers still incomplete."""
    s = await served()
    got = await header_statuses(s.port, "POST", "/scheduler/filter", 16 << 10)
    assert got == {"under": 200, **REFUSED}
    assert s.refused("header-too-large") == 3

    registry = CollectorRegistry()
    health = HealthServer(registry, lambda: (True, "ok"), limits=MetricsOptions().limits())
    port = await health.start()
    try:
        got = await header_statuses(port, "GET", "/healthz", 8 << 10)
    finally:
        await health.stop()
    assert got == {"under": 200, **REFUSED}
