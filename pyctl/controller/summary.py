"""The cluster summary: what the live view, the metrics and federation see of the cluster at one
moment, and its wire format in the shared store (`summary_bytes`, and `federation_summary_bytes`
with the node models and the workload M, which `pyctl.federation` reads)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pyctl.core.fragmentation import shape_dict
from pyctl.model import Node, Snapshot, Workload
from pyctl.snapshot import node_to_json, snapshot_to_json

#: the version of the rich summary's extra keys (`format` in the summary)
RICH_FORMAT = 1


@dataclass(frozen=True)
class Summary:
    """The cluster at one moment, as the live view, the metrics and federation see it."""

    cluster: str
    nodes: int
    idle_gpu_milli: float
    fragment_gpu_milli: float
    categories: dict[str, float]
    idle_mig_slices: float
    fragment_mig_slices: float
    recoverable_mig_slices: float
    pending: int
    blocked: dict[str, int]
    scheduling_success: float
    worst: list[tuple[str, float, float]] = field(default_factory=list)
    by_model: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: shared GPUs (time-slicing, MPS, HAMi; docs/sharing.md): how many, their used share in
    #: milli-GPU, and the pods holding shares of them
    shared_gpus: int = 0
    shared_used_milli: float = 0.0
    shared_pods: int = 0

    @property
    def fragmentation_rate(self) -> float:
        return self.fragment_gpu_milli / self.idle_gpu_milli if self.idle_gpu_milli else 0.0


def summary_bytes(s: Summary) -> bytes:
    d: dict[str, Any] = {
        "cluster": s.cluster,
        "nodes": s.nodes,
        "idle_gpu_milli": s.idle_gpu_milli,
        "fragment_gpu_milli": s.fragment_gpu_milli,
        "fragmentation_rate": s.fragmentation_rate,
        "categories": s.categories,
        "idle_mig_slices": s.idle_mig_slices,
        "fragment_mig_slices": s.fragment_mig_slices,
        "recoverable_mig_slices": s.recoverable_mig_slices,
        "pending": s.pending,
        "blocked": s.blocked,
        "scheduling_success": s.scheduling_success,
        "by_model": {
            k: {"idle_gpu_milli": v[0], "fragment_gpu_milli": v[1]} for k, v in s.by_model.items()
        },
        "shared_gpus": s.shared_gpus,
        "shared_used_milli": s.shared_used_milli,
        "shared_pods": s.shared_pods,
        "heartbeat": time.time(),
    }
    return msgspec.json.encode(d)


def federation_summary_bytes(
    summary: Summary,
    models: Mapping[str, Node],
    workload: Workload,
    now: float | None = None,
) -> bytes:
    """The rich federation summary: every key of `summary_bytes`, plus the node models and the
    workload M (what `place` needs to rank this cluster's nodes). Call it where the controller
    publishes (`Controller._summary_loop`) with `self.reconciler.models` and
    `self.reconciler.workload` instead of `summary_bytes(s)`."""
    d = _federation_head(summary, workload, now)
    d["snapshot"] = snapshot_to_json(Snapshot(tuple(models[n] for n in sorted(models))))
    return msgspec.json.encode(d)


def _federation_head(summary: Summary, workload: Workload, now: float | None) -> dict[str, Any]:
    """The rich summary's keys before `snapshot` (its last key)."""
    d: dict[str, Any] = msgspec.json.decode(summary_bytes(summary))
    if now is not None:
        d["heartbeat"] = now
    d["format"] = RICH_FORMAT
    d["workload"] = [shape_dict(s) for s in workload.shapes]
    return d


class FederationEncoder:
    """`federation_summary_bytes`, byte for byte, with each node model's encoded form kept
    between publishes: a node whose model is the same object as at the last publish is not
    encoded again (the controller's models are immutable; a re-scored node gets a new one). The
    snapshot is the last key of the summary, so the summary is its head's JSON with the
    snapshot's nodes spliced in."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Node, bytes]] = {}
        #: nodes encoded at the last `encode` (the others were taken from the last publish)
        self.encoded = 0

    def encode(
        self,
        summary: Summary,
        models: Mapping[str, Node],
        workload: Workload,
        now: float | None = None,
    ) -> bytes:
        head = msgspec.json.encode(_federation_head(summary, workload, now))
        last, kept = self._nodes, {}
        self.encoded = 0
        for name in sorted(models):
            node = models[name]
            got = last.get(name)
            if got is None or got[0] is not node:
                got = (node, msgspec.json.encode(node_to_json(node)))
                self.encoded += 1
            kept[name] = got
        self._nodes = kept
        nodes = b",".join(b for _, b in kept.values())
        return head[:-1] + b',"snapshot":{"nodes":[' + nodes + b"]}}"
