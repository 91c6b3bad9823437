"""`/metrics`, `/healthz` and `/readyz` on one port; `/federation` too when given a callback (the
view across clusters, `pyctl.federation.federation_status`). Served on the controller's event
loop (so `/healthz` answers only while that loop turns, which is what liveness should mean)
within the bounds of `pyctl.serve.http`: a few connections, small bodies, read timeouts. The
exposition of `/metrics` is generated on a worker thread (it grows with the nodes: 360-420 ms
at 5,000 nodes, bench/metrics_exposition.py), one scrape at a time. The scheduler
extender is not served here: it has its own server (`pyctl.serve.extender_server`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pyctl.serve.http import HttpServer, Limits, Request, Response, Route


@dataclass(frozen=True)
class MetricsOptions:
    """`/metrics`, `/healthz`, `/readyz` (and `/federation`); port 0: no server."""

    host: str = "127.0.0.1"
    port: int = 0
    #: connections open at once (Prometheus, the kubelet's probes, `/federation` readers)
    max_connections: int = 32
    #: seconds for a request to arrive, and for an answer to be taken
    read_timeout: float = 5.0

    def limits(self) -> Limits:
        return Limits(
            max_connections=self.max_connections,
            read_timeout=self.read_timeout,
            idle_timeout=max(30.0, self.read_timeout),
            max_header_bytes=8 << 10,
            # GETs: nothing to read
            max_body_bytes=1 << 10,
        )


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1",
        port: int = 0,
        federation: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
        limits: Limits | None = None,
        on_reject: Callable[[str], None] | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.federation = federation
        self.limits = limits or MetricsOptions().limits()
        self.on_reject = on_reject
        self._server: HttpServer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._scrape = asyncio.Lock()

    async def _metrics(self, _req: Request) -> Response:
        assert self._pool is not None
        async with self._scrape:  # one exposition at a time, off the event loop
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._pool, generate_latest, self.registry)
        return Response(body=body, content_type=CONTENT_TYPE_LATEST)

    async def _healthz(self, _req: Request) -> Response:
        return Response(body=b"ok\n")

    async def _readyz(self, _req: Request) -> Response:
        ok, why = self.ready()
        return Response(200 if ok else 503, f"{why}\n".encode())

    async def _federation(self, _req: Request) -> Response:
        if self.federation is None:
            return Response(404, b"federation is not configured (no shared Redis)\n")
        try:
            view = await self.federation()
        except Exception as e:  # the store is unreachable, or anything else: say so, stay up
            body = {"error": f"{type(e).__name__}: {e}"}
            return Response(503, _json(body), "application/json")
        return Response(200, _json(view), "application/json")

    async def start(self) -> int:
        """Start serving; returns the bound port (useful with port 0)."""
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pyctl-metrics")
        routes = {
            "/metrics": Route(self._metrics),
            "/healthz": Route(self._healthz),
            "/readyz": Route(self._readyz),
            "/federation": Route(self._federation),
        }
        self._server = HttpServer(
            "metrics", routes, self.host, self.port, self.limits, on_reject=self.on_reject
        )
        self.port = await self._server.start()
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _json(obj: Any) -> bytes:
    return (json.dumps(obj) + "\n").encode()
