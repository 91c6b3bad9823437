"""`/metrics` at 5,000 nodes: how long the Prometheus exposition takes to generate, and what a
scrape does to `/healthz` on the same server (pyctl/serve/health.py generates the exposition on a
worker thread, so that the controller's event loop, which answers `/healthz` and renews the
Lease, keeps turning).

The registry is the controller's (`pyctl.metrics.Metrics`) with the series the reconciler writes
for every node (idle and fragment GPU per node and per NUMA zone, 2 zones a node). One run:
the exposition's size and generation time (best of 5), then `/healthz` latency (p50, max) while
scrapes run back to back, against `/healthz` with no scrape.
For comparison, the same with the exposition generated on the event loop.
Last line: `metrics: <N> nodes, <S> series, <B> MB, <T> ms to generate; healthz p50 <a> ms
(<b> ms idle), max <c> ms under scrapes (generated on the loop instead: p50 .., max ..)`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import urllib.request

from _common import REPO, best_of  # noqa: F401
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pyctl.metrics import Metrics
from pyctl.serve.health import HealthServer
from pyctl.serve.http import Request, Response

NODES = int(sys.argv[1]) if len(sys.argv) > 1 else 5000


def fill(m: Metrics, nodes: int) -> None:
    for i in range(nodes):
        name = f"gpu-node-{i:05d}"
        m.node_idle.labels("bench", name).set(i % 8)
        m.node_fragment.labels("bench", name).set(i % 3)
        for z in range(2):
            m.zone_idle.labels("bench", name, str(z)).set(i % 4)
            m.zone_fragment.labels("bench", name, str(z)).set(i % 2)


def get(url: str) -> float:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0 = time.perf_counter()
    with opener.open(url, timeout=10) as r:
        r.read()
    return time.perf_counter() - t0


async def healthz_latencies(port: int, scraping: bool, seconds: float = 3.0) -> list[float]:
    base = f"http://127.0.0.1:{port}"
    stop = time.monotonic() + seconds
    out: list[float] = []

    async def scrape() -> None:
        while time.monotonic() < stop:
            await asyncio.to_thread(get, f"{base}/metrics")

    task = asyncio.create_task(scrape()) if scraping else None
    while time.monotonic() < stop:
        out.append(await asyncio.to_thread(get, f"{base}/healthz"))
        await asyncio.sleep(0.02)
    if task is not None:
        await task
    return out


class OnTheLoop(HealthServer):
    """For comparison: the exposition generated on the event loop."""

    async def _metrics(self, _req: Request) -> Response:
        return Response(body=generate_latest(self.registry), content_type=CONTENT_TYPE_LATEST)


async def main() -> None:
    m = Metrics()
    fill(m, NODES)
    body = generate_latest(m.registry)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    took = best_of(lambda: generate_latest(m.registry), repeat=5)
    server = HealthServer(m.registry, lambda: (True, "ok"))
    port = await server.start()
    try:
        idle = await healthz_latencies(port, scraping=False)
        busy = await healthz_latencies(port, scraping=True)
    finally:
        await server.stop()
    loop_server = OnTheLoop(m.registry, lambda: (True, "ok"))
    port = await loop_server.start()
    try:
        on_loop = await healthz_latencies(port, scraping=True)
    finally:
        await loop_server.stop()
    print(
        f"metrics: {NODES} nodes, {series} series, {len(body) / 1e6:.1f} MB, "
        f"{took * 1000:.0f} ms to generate; healthz p50 {statistics.median(busy) * 1000:.1f} ms "
        f"({statistics.median(idle) * 1000:.1f} ms idle), max {max(busy) * 1000:.0f} ms "
        f"under scrapes (generated on the loop instead: p50 {statistics.median(on_loop) * 1000:.0f}"
        f" ms, max {max(on_loop) * 1000:.0f} ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
