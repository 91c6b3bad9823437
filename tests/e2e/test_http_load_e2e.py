"""Load on the HTTP servers (issue 16): `pyctl run` as deployed (a subprocess, the real API
server, a real Redis, 40 kwok GPU nodes) holds the Lease while this test drives its scheduler
extender with concurrent large and slow requests, ROUNDS rounds of LOAD_SECONDS each followed by
SETTLE seconds of quiet:

- BIG_CLIENTS clients posting 1 MB ``NodeNames`` bodies back to back (filter and prioritize);
- in the second half of each round, STALLED connections announcing a 1 MB body, sending half of
  it and stalling, and SLOWLORIS connections sending a header line a second (each re-opened as
  soon as the server closes it);
- one scheduler-like client asking for advice every 0.2 s with a normal body, from another
  address (127.0.0.2, as the scheduler's pod is not the attacker's).

Measured throughout, each from outside the process: the Lease's ``renewTime`` as the API server
has it (polled every 0.2 s), ``/healthz`` on the metrics port (a probe every 0.25 s with the
kubelet's default 1 s timeout, on its own thread), the VmRSS of the process and of its extender
process, which reads the bodies (/proc/<pid>/status).

It must show: the Lease renewed on time (holder unchanged, no transition, every gap between two
renewals shorter than the renew deadline), every probe of ``/healthz`` answered within 1 s, every
request of the scheduler-like client answered (advice, or an answer saying there is none) within
the extender's deadline plus 0.5 s of transport, the RSS back near its baseline after each round
(RSS_TOLERANCE_MB: see there), only JSON lines, no traceback, in pyctl's log, and the bounds
reached (`Load.held_bodies`: the body budget and the read timeout). The figures
are printed (``pytest -s``) and quoted in docs/http.md; a longer run: HTTP_LOAD_ROUNDS=8.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import statistics
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from pyctl.dev.control_plane import ControlPlane, free_port
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd
from pyctl.serve.extender_server import ExtenderOptions
from tests.e2e.conftest import wait_until
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.e2e.test_placement_e2e import create_nodes, delete_nodes, gpu_pod
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

LEASE = "pyctl-http-load"
#: the Lease's duration (seconds); the controller renews every duration/6 and gives up after
#: duration*2/3 without a renewal (pyctl/app/run.py)
LEASE_DURATION = 3.0
RENEW_DEADLINE = LEASE_DURATION * 2 / 3
LOAD_SECONDS = 15.0
#: rounds of load, each followed by SETTLE seconds of quiet: the server closes what is left
#: within its read timeout (5 s), and collects garbage and gives freed memory back within two
#: intervals of 5 s of a burst's last byte (pyctl/serve/http.py, _Trim)
ROUNDS = int(os.environ.get("HTTP_LOAD_ROUNDS", "3"))
SETTLE = 16.0
BIG_CLIENTS = 4
STALLED = 150
SLOWLORIS = 300
NODES = 40
#: connections with a half-sent 1 MB body at once, alone (`Load.held_bodies`): more than the
#: extender's body budget holds (16 MiB), fewer than its connection limit (64)
HELD_BODIES = 24
DEADLINE = 1.5  # the extender's default deadline (ExtenderOptions.deadline)
#: the scheduler-like client connects from another address than the flood (in a cluster: the
#: scheduler's pod and the attacker's); Linux routes all of 127.0.0.0/8 to the loopback
SCHEDULER_ADDRESS = "127.0.0.2"
#: after each round, RSS may stay this far above its baseline. What the load holds at its
#: peak (bodies in flight, the workers' parsed bodies: a 1 MB body is ~12 MB of Python objects,
#: connections) is freed: large blocks go back to the system when freed (pyctl run fixes glibc's
#: mmap and trim thresholds), and after each burst pyctl collects garbage and trims glibc's
#: arenas (pyctl/serve/http.py, tune_malloc and _Trim); glibc's arenas then hold ~1 MB more
#: than at the baseline (/proc/<pid>/smaps). What stays is CPython's allocator: it keeps each
#: 1 MiB arena that a surviving object still uses, a plateau measured at +14.5 to +23.7 MB over
#: three 3-round runs and +20.8 to +28.1 MB over 8 rounds (HTTP_LOAD_ROUNDS=8). Before the
#: thresholds were fixed, freed memory at the top of the threads' arenas (up to the raised trim
#: threshold each; malloc_trim(0) shrinks only the main arena's top) and reference cycles left
#: uncollected (the post-burst collection rarely ran) came on top, at random: rounds of
#: single runs measured +13 to +60 MB. What must not happen is memory kept per request or per
#: connection, which would grow round after round: before the bounds, 150 stalled 1 MB bodies
#: left +190 MB, never released; a reference cycle per connection (fixed: _unlink) added ~20 MB
#: a round. Each round sends hundreds of 1 MB bodies over ~15,000 connections. (The figures
#: above were measured with the extender in the controller's process; with its own process,
#: both measured together: +12.6, +10.0, +10.1 MB in one run, docs/http.md.)
RSS_TOLERANCE_MB = 40.0


def big_body(names: list[str], size: int = 1_000_000) -> bytes:
    """A ~1 MB ExtenderArgs: the real node names over and over, then names no node has."""
    pod = gpu_pod("load", 1, label="http-load")
    out: list[str] = []
    n = 0
    i = 0
    while n < size // 2:
        out.append(names[i % len(names)])
        n += len(out[-1]) + 3
        i += 1
    j = 0
    while n < size:
        out.append(f"no-such-node-{j:07d}")
        n += len(out[-1]) + 3
        j += 1
    return json.dumps({"Pod": pod, "NodeNames": out}).encode()


def post(path: str, data: bytes, content_length: int | None = None) -> bytes:
    length = len(data) if content_length is None else content_length
    head = f"POST {path} HTTP/1.1\r\nHost: pyctl\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {length}\r\n\r\n").encode() + data


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


def counter(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples of counter `name` with `labels` in a /metrics text."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` and of its children (the extender's own process, which reads the
    request bodies), in MB."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
    total = 0.0
    for p in pids:
        with contextlib.suppress(OSError):  # a child gone since (pyctl's own is checked below)
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
    return total


async def rss_median(pid: int) -> float:
    samples = []
    for _ in range(5):
        samples.append(rss_mb(pid))
        await asyncio.sleep(0.2)
    return statistics.median(samples)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Probes(threading.Thread):
    """The kubelet's liveness probe: GET /healthz every 0.25 s, 1 s timeout; on its own thread
    (so that the load this test makes on its event loop does not delay the probes)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.stop = threading.Event()
        self.took: list[float] = []  # seconds; inf: failed or timed out
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                with self.opener.open(self.url, timeout=1.0) as r:
                    ok = r.status == 200 and r.read() == b"ok\n"
            except OSError:
                ok = False
            self.took.append(time.monotonic() - t0 if ok else float("inf"))
            self.stop.wait(max(0.0, 0.25 - (time.monotonic() - t0)))


class Rss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.stop = threading.Event()
        self.samples: list[float] = []

    def run(self) -> None:
        while not self.stop.wait(0.25):
            self.samples.append(rss_mb(self.pid))


class Load:
    """The hostile and the scheduler-like clients, on this test's event loop."""

    def __init__(self, port: int, names: list[str]) -> None:
        self.port = port
        self.big = big_body(names)
        pod = gpu_pod("legit", 1, label="http-load")
        self.small = json.dumps({"Pod": pod, "NodeNames": names}).encode()
        self.until = 0.0
        self.big_answers: list[tuple[float, str]] = []  # (seconds, "advice"|"no advice"|status)
        self.legit: list[tuple[float, str]] = []
        self.opened = {"stalled": 0, "slowloris": 0}
        self.refused_at_connect = 0

    def running(self) -> bool:
        return time.monotonic() < self.until

    async def connect(
        self, source: str = "127.0.0.1"
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source, 0))

    @staticmethod
    def verdict(path: str, status: int, answer: bytes) -> str:
        if status == 503:  # refused (connections): an error, which the scheduler ignores
            return "refused"
        if status != 200:
            return f"HTTP {status}"
        got = json.loads(answer)
        if path.endswith("filter"):
            return "no advice" if got["Error"] else "advice"
        return "advice" if got else "no advice"

    async def ask(
        self, data: bytes, path: str, out: list[tuple[float, str]], source: str = "127.0.0.1"
    ) -> None:
        """One request on a new connection; the time from its first byte sent to its answer
        (what the extender's deadline bounds: a connection that waits in the kernel's queue
        under the flood is the machine's, not pyctl's)."""
        t0 = time.monotonic()
        try:
            reader, writer = await self.connect(source)
            t0 = time.monotonic()
            try:
                writer.write(post(path, data))
                await writer.drain()
                status, answer = await asyncio.wait_for(read_answer(reader), 30)
            finally:
                writer.close()
            out.append((time.monotonic() - t0, self.verdict(path, status, answer)))
        except (OSError, asyncio.IncompleteReadError):
            # refused at connect, or closed to make room for a new connection (docs/http.md)
            out.append((time.monotonic() - t0, "dropped"))

    async def big_client(self, k: int) -> None:
        verbs = ("/scheduler/filter", "/scheduler/prioritize")
        i = k
        while self.running():
            await self.ask(self.big, verbs[i % 2], self.big_answers)
            i += 1

    async def scheduler(self) -> None:
        i = 0
        while self.running():
            path = ("/scheduler/filter", "/scheduler/prioritize")[i % 2]
            await self.ask(self.small, path, self.legit, SCHEDULER_ADDRESS)
            i += 1
            await asyncio.sleep(0.2)

    async def stalled(self) -> None:
        half = self.big[: len(self.big) // 2]
        while self.running():
            try:
                reader, writer = await self.connect()
                self.opened["stalled"] += 1
                writer.write(post("/scheduler/filter", half, content_length=len(self.big)))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(reader.read(), max(0.1, self.until - time.monotonic()))
                writer.close()
            except OSError:
                self.refused_at_connect += 1
                await asyncio.sleep(0.1)

    async def slowloris(self) -> None:
        while self.running():
            try:
                reader, writer = await self.connect()
                self.opened["slowloris"] += 1
                writer.write(b"POST /scheduler/filter HTTP/1.1\r\nHost: pyctl\r\n")
                while self.running() and not reader.at_eof():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(reader.read(1 << 16), 1.0)
                    if not reader.at_eof():
                        writer.write(b"X-Slow: 1\r\n")
                writer.close()
            except OSError:
                self.refused_at_connect += 1
                await asyncio.sleep(0.1)

    async def held_bodies(self, n: int) -> Counter[int | str]:
        """With nothing else connected: `n` connections (under the connection limit, so none
        is closed to make room) each announce a 1 MB body and send half of it. What the bounds
        must answer: 503 to those past the body budget (the announced bytes are taken from it
        before the body is read), 408 to the others once the read timeout has passed."""
        half = self.big[: len(self.big) // 2]

        async def one() -> int | str:
            try:
                reader, writer = await self.connect()
                try:
                    writer.write(post("/scheduler/filter", half, content_length=len(self.big)))
                    await writer.drain()
                    status, _ = await asyncio.wait_for(read_answer(reader), 15)
                    return status
                finally:
                    writer.close()
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
                return type(e).__name__

        return Counter(await asyncio.gather(*(one() for _ in range(n))))

    async def run(self, seconds: float) -> None:
        """The 1 MB clients and the scheduler-like one throughout; the stalled and slowloris
        connections join for the second half (in the first, the 1 MB clients meet the workers'
        bound and the deadline; in the second, the connection flood meets the connection limit
        too, and most connections, the 1 MB clients' and the scheduler-like one's included,
        are refused: see docs/http.md)."""
        self.until = time.monotonic() + seconds
        async with asyncio.TaskGroup() as tg:
            for k in range(BIG_CLIENTS):
                tg.create_task(self.big_client(k))
            tg.create_task(self.scheduler())
            await asyncio.sleep(seconds / 2)
            for _ in range(STALLED):
                tg.create_task(self.stalled())
            for _ in range(SLOWLORIS):
                tg.create_task(self.slowloris())


async def lease_renewals(
    coord: client.CoordinationV1Api,
    stop: asyncio.Event,
    seen: list[tuple[Any, str, int]],
    api_latency: list[float],
) -> None:
    """Every distinct (renewTime, holder, transitions) the API server shows, polled at 5 Hz
    (and how long each read took: the API server's own latency on this loaded machine)."""
    last = None
    while not stop.is_set():
        t0 = time.monotonic()
        lease = await coord.read_namespaced_lease(LEASE, "default")
        api_latency.append(time.monotonic() - t0)
        got = (lease.spec.renew_time, lease.spec.holder_identity, lease.spec.lease_transitions)
        if got != last:
            seen.append(got)
            last = got
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


@pytest.mark.anyio
@pytest.mark.timeout(600)
async def test_extender_under_load_keeps_lease_health_and_memory(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    specs = [
        GpuNodeSpec(f"http-load-{i:02d}", labels={"pyctl.e2e/http-load": "true"})
        for i in range(NODES)
    ]
    names = [s.name for s in specs]
    port, extender_port = free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    pyctl = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        port,
        logs,
        extender_port=extender_port,
        extra_env={
            "PYCTL_LEASE_NAME": LEASE,
            "PYCTL_LEASE_DURATION": str(LEASE_DURATION),
        },
    )
    coord = client.CoordinationV1Api(api)
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    try:
        pyctl.start("load-0")
        assert pyctl.proc is not None
        pid = pyctl.proc.pid
        await wait_until(pyctl.is_leader, "pyctl leads", within=60)
        load = Load(extender_port, names)

        async def modelled() -> bool:  # the extender filters with the controller's models
            out: list[tuple[float, str]] = []
            await load.ask(load.small, "/scheduler/filter", out)
            return out[0][1] == "advice"

        await wait_until(modelled, "the extender answers", within=60)
        # warm up: the workers, their per-node models, one big request of each verb
        warm: list[tuple[float, str]] = []
        for path in ("/scheduler/filter", "/scheduler/prioritize") * 4:
            await load.ask(load.small, path, warm)
        for path in ("/scheduler/filter", "/scheduler/prioritize"):
            await load.ask(load.big, path, warm)
        await asyncio.sleep(3.0)
        baseline = await rss_median(pid)

        probes, rss = Probes(port), Rss(pid)
        stop = asyncio.Event()
        renewals: list[tuple[Any, str, int]] = []
        api_latency: list[float] = []
        probes.start()
        rss.start()
        poller = asyncio.create_task(lease_renewals(coord, stop, renewals, api_latency))
        loaded_for = 0.0
        afters: list[float] = []
        for _ in range(ROUNDS):
            t0 = time.monotonic()
            await load.run(LOAD_SECONDS)
            loaded_for += time.monotonic() - t0
            await asyncio.sleep(SETTLE)
            afters.append(await rss_median(pid))
        # in the flood, the connection limit closes the stalled bodies to make room, often
        # before they reach the body budget or the read timeout: those two are shown here
        held = await load.held_bodies(HELD_BODIES)

        async def counted() -> bool:  # the extender's process sends its counts every 0.25 s
            text = await asyncio.to_thread(pyctl.metrics)
            return (
                counter(text, "pyctl_http_refused_total", server="extender", reason="read-timeout")
                >= held[408]
            )

        await wait_until(counted, "the 408s counted in /metrics")
        stop.set()
        await poller
        probes.stop.set()
        rss.stop.set()
        probes.join()
        rss.join()
        exposition = pyctl.metrics()
        assert pyctl.proc.poll() is None, f"pyctl exited: see {logs}"
    finally:
        pyctl.kill()
        await delete_nodes(api, specs)
        with contextlib.suppress(client.ApiException):
            await coord.delete_namespaced_lease(LEASE, "default")

    # ---- the figures -----------------------------------------------------------------------
    times = [r[0] for r in renewals]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    healthz = [t for t in probes.took if t != float("inf")]
    legit_s = [t for t, _ in load.legit]
    big_s = [t for t, _ in load.big_answers]

    def share(rows: list[tuple[float, str]], what: str) -> str:
        return f"{sum(1 for _, v in rows if v == what)}/{len(rows)}"

    print(
        f"\nHTTP load, {ROUNDS} rounds, {loaded_for:.1f} s: {BIG_CLIENTS} clients of 1 MB bodies, "
        f"{STALLED} stalled 1 MB bodies ({load.opened['stalled']} opened), "
        f"{SLOWLORIS} slowloris ({load.opened['slowloris']} opened), "
        f"{load.refused_at_connect} connects refused"
    )
    print(
        f"  lease: {len(gaps)} renewals, gap p50 {pct(gaps, 0.5):.2f} s, max {max(gaps):.2f} s "
        f"(renew deadline {RENEW_DEADLINE:.1f} s), holders {sorted({r[1] for r in renewals})}, "
        f"transitions {sorted({r[2] for r in renewals})}; this test's reads of the Lease took "
        f"p50 {pct(api_latency, 0.5) * 1000:.0f} ms, max {max(api_latency) * 1000:.0f} ms"
    )
    print(
        f"  /healthz: {len(probes.took)} probes, failed or over 1 s "
        f"{len(probes.took) - len(healthz)}, p50 {pct(healthz, 0.5) * 1000:.0f} ms, "
        f"p99 {pct(healthz, 0.99) * 1000:.0f} ms, max {max(healthz) * 1000:.0f} ms"
    )
    print(
        f"  scheduler-like client: {len(legit_s)} requests, advice {share(load.legit, 'advice')}, "
        f"no advice {share(load.legit, 'no advice')}, refused {share(load.legit, 'refused')}, "
        f"dropped {share(load.legit, 'dropped')}, "
        f"p50 {pct(legit_s, 0.5) * 1000:.0f} ms, max {max(legit_s) * 1000:.0f} ms "
        f"(deadline {DEADLINE} s)"
    )
    print(
        f"  1 MB clients: {len(big_s)} answers, advice {share(load.big_answers, 'advice')}, "
        f"no advice {share(load.big_answers, 'no advice')}, "
        f"refused {share(load.big_answers, 'refused')}, "
        f"dropped {share(load.big_answers, 'dropped')}, "
        f"max {max(big_s) * 1000:.0f} ms"
    )
    print(
        f"  RSS: baseline {baseline:.1f} MB, peak {max(rss.samples):.1f} MB, after each round "
        + ", ".join(f"{a:.1f} MB (+{a - baseline:.1f})" for a in afters)
        + f" (tolerance +{RSS_TOLERANCE_MB:.0f} MB)"
    )
    outcomes = {
        o: counter(exposition, "pyctl_extender_requests_total", outcome=o)
        for o in ("ok", "bad-request", "deadline", "overload", "error")
    }
    refused = {
        r: counter(exposition, "pyctl_http_refused_total", server="extender", reason=r)
        for r in ("connections", "evicted", "read-timeout", "body-budget", "body-too-large")
    }
    print(f"  extender requests by outcome {outcomes}; refused by reason {refused}")
    print(f"  {HELD_BODIES} half-sent 1 MB bodies at once, alone: answers {dict(held)}")

    # ---- what must hold ----------------------------------------------------------------------
    assert {r[1] for r in renewals} == {"load-0"}
    assert len({r[2] for r in renewals}) == 1, "the Lease changed hands"
    assert len(gaps) >= ROUNDS * LOAD_SECONDS / (LEASE_DURATION / 6) / 2, "too few renewals seen"
    assert max(gaps) < RENEW_DEADLINE, f"a renewal came {max(gaps):.2f} s after the last"
    assert len(healthz) == len(probes.took), "a /healthz probe failed or took over 1 s"
    assert len(probes.took) >= LOAD_SECONDS * 2
    assert max(legit_s) < DEADLINE + 0.5, "an answer came later than the deadline"
    # the scheduler-like client is never pushed out by the flood from another address: every
    # request is answered, with advice or an answer that says there is none
    assert all(v in ("advice", "no advice") for _, v in load.legit), Counter(
        v for _, v in load.legit
    )
    assert sum(1 for _, v in load.legit if v == "advice") > 0
    assert max(afters) - baseline < RSS_TOLERANCE_MB
    # the load reached the bounds (else this test would prove nothing about them): the flood
    # the connection limit; the half-sent bodies the body budget, then the read timeout
    assert refused["evicted"] > 0
    budget = ExtenderOptions().limits().body_budget  # pyctl run's, by default
    assert budget is not None
    fit = budget // len(load.big)
    assert held[503] == HELD_BODIES - fit, held
    assert held[408] == fit, held
    assert refused["body-budget"] >= held[503]
    assert refused["read-timeout"] >= held[408]
    assert outcomes["ok"] > 0
    # the log: JSON lines only, no traceback
    lines = [line for f in logs.iterdir() for line in f.read_text().splitlines()]
    assert lines, "pyctl logged nothing"
    for line in lines:
        assert line.startswith("{"), line[:300]
        assert "Traceback" not in line, line[:300]
        json.loads(line)
