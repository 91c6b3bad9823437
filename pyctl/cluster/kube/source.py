"""`KubeClusterSource`: the `ClusterSource` of a real cluster, one reflector per kind (Nodes, Pods,
PodDisruptionBudgets, and NodeResourceTopology objects while their CRD is served), all feeding one
`EventSink`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio

from pyctl.cluster.kube.client import KubeClient
from pyctl.cluster.kube.reflector import Reflector, ReflectorOptions, ReflectorStats
from pyctl.cluster.records import KINDS, Kind
from pyctl.cluster.source import EventSink


class KubeClusterSource:
    """List and watch a cluster until cancelled.

    `options` applies to every kind; `per_kind` replaces them for some kinds (e.g. a label
    selector on Nodes, a namespace for Pods: `dataclasses.replace(options, namespace=...)`).
    Reflectors survive API server restarts and 410s on their own; `stats` is what the
    controller exports as metrics."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str = "kube",
        kinds: Sequence[Kind] = KINDS,
        options: ReflectorOptions | None = None,
        per_kind: Mapping[Kind, ReflectorOptions] | None = None,
    ) -> None:
        self.name = name
        base = options or ReflectorOptions()
        per_kind = per_kind or {}
        unknown = set(per_kind) - set(kinds)
        if unknown:
            raise ValueError(f"KubeClusterSource: per_kind names kinds not watched: {unknown}")
        self.reflectors: dict[Kind, Reflector] = {
            k: Reflector(kube, k, per_kind.get(k, base)) for k in kinds
        }

    @property
    def stats(self) -> Mapping[Kind, ReflectorStats]:
        return {k: r.stats for k, r in self.reflectors.items()}

    @property
    def synced(self) -> bool:
        """Every kind has been listed into the sink at least once (or found absent)."""
        return all(r.stats.synced for r in self.reflectors.values())

    async def run(self, sink: EventSink) -> None:
        async with anyio.create_task_group() as tg:
            for r in self.reflectors.values():
                tg.start_soon(r.run, sink, name=f"reflector {r.kind}")
