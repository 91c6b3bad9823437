"""The agent's Prometheus metrics, on a registry of its own (`/metrics` of `pyctl agent`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from pyctl.agent.view import NodeView


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.gpus = Gauge("pyctl_agent_gpus", "GPUs read from NVML in the last read", registry=r)
        self.gpus_failed = Gauge(
            "pyctl_agent_gpus_failed",
            "GPUs left out of the last read: an NVML call other than Not Supported failed",
            registry=r,
        )
        self.disagreements = Gauge(
            "pyctl_agent_catalog_disagreements",
            "Where pyctl's MIG catalog disagrees with the device (the device wins), per GPU "
            "model, profile id and what differs",
            ["model", "profile_id", "what"],
            registry=r,
        )
        self.reads = Counter("pyctl_agent_reads_total", "Reads of the node", registry=r)
        self.read_errors = Counter(
            "pyctl_agent_read_errors_total",
            "Reads that failed as a whole (NVML could not be initialised or listed)",
            registry=r,
        )
        self.last_read = Gauge(
            "pyctl_agent_last_read_timestamp_seconds",
            "Unix time of the last successful read",
            registry=r,
        )

    def update(self, view: NodeView, now: float) -> None:
        self.reads.inc()
        self.gpus.set(len(view.gpus))
        self.gpus_failed.set(len(view.failed))
        self.disagreements.clear()
        for g in view.gpus:
            for d in g.disagreements:
                self.disagreements.labels(g.model or "", str(d.profile_id), d.what).inc()
        self.last_read.set(now)
