"""Running `pyctl agent`: open NVML (nvidia-ml-py, or the captured-device double for tests),
read the node every `interval` seconds, keep the agent's metrics, serve `/metrics`, `/healthz`
and `/readyz`, and hand each view to a publisher. A read that fails as a whole (NVML missing or
failing to list its GPUs) is counted and logged, and the next one tries again; one GPU failing
is that GPU's alone (`pyctl.agent.view`)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from pyctl.agent.events import DisagreementEvents
from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.kubelet import (
    PodResourcesError,
    attribute,
    pod_resources_json,
    read_pod_resources,
)
from pyctl.agent.metrics import AgentMetrics
from pyctl.agent.nvml import Nvml, NvmlError, PynvmlBackend
from pyctl.agent.publish import NodeAnnotationPublisher
from pyctl.agent.view import NodeView, disagreements, read_node, view_json
from pyctl.cluster.bounds import MAX_OBJECT_BYTES
from pyctl.cluster.kube.client import connect
from pyctl.jsontypes import JsonObject
from pyctl.serve.health import HealthServer

log = logging.getLogger("pyctl.agent")

Publish = Callable[[JsonObject], Awaitable[None]]
#: told each view (the catalog's disagreements as Events on the Node: `pyctl.agent.events`)
Announce = Callable[[NodeView], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class AgentOptions:
    #: the node the agent runs on (the Downward API's spec.nodeName)
    node: str | None = None
    sysfs_root: Path = Path("/sys")
    #: seconds between reads
    interval: float = 60.0
    metrics_host: str = "127.0.0.1"
    #: None: no server; 0: any free port
    metrics_port: int | None = None
    #: for tests only: a captured-device file (pyctl/agent/fixture.py) instead of NVML
    nvml_fixture: Path | None = None
    #: the kubelet's PodResources socket; None: not read
    pod_resources_socket: Path | None = None


def open_nvml(fixture: Path | None) -> Nvml:
    """The real NVML, or for tests the double driven by a captured-device file."""
    if fixture is None:
        return PynvmlBackend()
    with fixture.open("rb") as f:
        raw = f.read(MAX_OBJECT_BYTES + 1)
    if len(raw) > MAX_OBJECT_BYTES:
        raise ValueError(f"{fixture}: larger than {MAX_OBJECT_BYTES} bytes")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{fixture}: not a JSON object")
    return FixtureNvml(data)


async def read_view(nv: Nvml, opts: AgentOptions) -> tuple[NodeView, JsonObject]:
    """The node's view, and as JSON with the kubelet's pod-to-GPU attribution when its socket
    is given (`pod_resources`: the attribution, or `{"error": ...}` when it cannot be read)."""
    view = await asyncio.to_thread(read_node, nv, opts.sysfs_root)
    doc = view_json(view, opts.node)
    if opts.pod_resources_socket is not None:
        try:
            listed, alloc = await read_pod_resources(opts.pod_resources_socket)
        except PodResourcesError as e:
            doc["pod_resources"] = {"error": str(e)[:1024]}
        else:
            doc["pod_resources"] = pod_resources_json(attribute(listed, alloc, view.gpus))
    return view, doc


async def read_once(opts: AgentOptions) -> JsonObject:
    nv = await asyncio.to_thread(open_nvml, opts.nvml_fixture)
    try:
        return (await read_view(nv, opts))[1]
    finally:
        nv.close()


class Agent:
    def __init__(
        self, opts: AgentOptions, publish: Publish | None = None, announce: Announce | None = None
    ) -> None:
        self.opts = opts
        self.publish = publish
        self.announce = announce
        self.metrics = AgentMetrics()
        self.last: JsonObject | None = None
        self._nv: Nvml | None = None
        self._server: HealthServer | None = None

    def _ready(self) -> tuple[bool, str]:
        if self.last is None:
            return False, "the node has not been read yet"
        return True, "ok"

    async def start(self) -> int | None:
        """Serve the metrics (when a port is set); returns the bound port."""
        if self.opts.metrics_port is None:
            return None
        self._server = HealthServer(
            self.metrics.registry, self._ready, self.opts.metrics_host, self.opts.metrics_port
        )
        return await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
        if self._nv is not None:
            nv, self._nv = self._nv, None
            try:
                nv.close()
            except NvmlError as e:
                log.warning("NVML shutdown failed", extra={"error": str(e)})

    async def read(self) -> JsonObject | None:
        """One read of the node, published; None when NVML could not be read at all."""
        try:
            if self._nv is None:
                self._nv = await asyncio.to_thread(open_nvml, self.opts.nvml_fixture)
            view, doc = await read_view(self._nv, self.opts)
        except (NvmlError, OSError, ValueError) as e:
            self.metrics.read_errors.inc()
            self._nv = None
            log.warning("the node could not be read", extra={"error": str(e)[:1024]})
            return None
        self.metrics.update(view, time.time())
        self.last = doc
        log.info(
            "node read",
            extra={
                "gpus": len(view.gpus),
                "failed": len(view.failed),
                "catalog_disagreements": disagreements(view),
            },
        )
        if self.publish is not None:
            try:
                await self.publish(doc)
            except Exception as e:  # a failed publication is logged; the next read retries
                log.warning("publishing failed", extra={"error": f"{type(e).__name__}: {e}"})
        if self.announce is not None:
            try:
                await self.announce(view)
            except Exception as e:  # logged; the next read retries
                log.warning("posting the Event failed", extra={"error": f"{type(e).__name__}: {e}"})
        return doc

    async def run(self, iterations: int | None = None) -> None:
        """Read every `interval` seconds (`iterations` reads, or until cancelled)."""
        done = 0
        while iterations is None or done < iterations:
            await self.read()
            done += 1
            if iterations is None or done < iterations:
                await asyncio.sleep(self.opts.interval)


async def run_agent(
    opts: AgentOptions, kubeconfig: str | None = None, in_cluster: bool = False
) -> None:
    """The agent's loop; with a kubeconfig or in the cluster, publishing the node's topology
    annotation on its own node (`pyctl.agent.publish`) and an Event on it when the MIG catalog
    disagrees with the device (`pyctl.agent.events`)."""
    kube = None
    publish = None
    announce = None
    if kubeconfig or in_cluster:
        kube = await connect(kubeconfig=kubeconfig, in_cluster=in_cluster)
        publish = NodeAnnotationPublisher(kube, opts.node or "")
        announce = DisagreementEvents(kube, opts.node or "")
    agent = Agent(opts, publish, announce)
    await agent.start()
    try:
        await agent.run()
    finally:
        await agent.stop()
        if kube is not None:
            await kube.close()
