"""`/metrics`, `/healthz` and `/readyz` on one port (aiohttp); `/federation` too when given a
callback (the view across clusters, `pyctl.federation.federation_status`); the kube-scheduler
extender (`POST /scheduler/filter`, `POST /scheduler/prioritize`) when given one
(`pyctl.serve.extender.ExtenderHandler`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class Extender(Protocol):  # placement advice (pyctl.serve.extender.ExtenderHandler)
    def handle(self, verb: str, body: bytes) -> bytes: ...


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1",
        port: int = 0,
        federation: Callable[[], Awaitable[Mapping[str, Any]]] | None = None,
        extender: Extender | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        self.host = host
        self.port = port
        self.federation = federation
        self.extender = extender
        self._runner: web.AppRunner | None = None

    async def _metrics(self, _req: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _req: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _req: web.Request) -> web.Response:
        ok, why = self.ready()
        return web.Response(text=f"{why}\n", status=200 if ok else 503)

    async def _federation(self, _req: web.Request) -> web.Response:
        if self.federation is None:
            return web.Response(text="federation is not configured (no shared Redis)\n", status=404)
        try:
            view = await self.federation()
        except Exception as e:  # the store is unreachable, or anything else: say so, stay up
            body = {"error": f"{type(e).__name__}: {e}"}
            return web.Response(
                text=json.dumps(body) + "\n", status=503, content_type="application/json"
            )
        return web.Response(text=json.dumps(view) + "\n", content_type="application/json")

    # -- placement advice (kube-scheduler extender) -------------------------------------------
    async def _extender(self, req: web.Request) -> web.Response:
        if self.extender is None:
            return web.Response(text="scheduler extender is not configured\n", status=404)
        body = await req.read()
        out = self.extender.handle(req.match_info["verb"], body)
        return web.Response(body=out, content_type="application/json")

    # ------------------------------------------------------------------------------------------
    async def start(self) -> int:
        """Start serving; returns the bound port (useful with port 0)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/federation", self._federation)
        app.router.add_post("/scheduler/{verb:filter|prioritize}", self._extender)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
