"""The Actuator of the simulated cluster: evictions go to the simulation (whose ReplicaSets
recreate the pods and whose scheduler places them); cordons, labels and Events are recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyctl.cluster.sim.source import SimClusterSource


@dataclass
class SimActuator:
    source: SimClusterSource
    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    async def cordon(self, node: str, on: bool) -> None:
        self.calls.append(("cordon", (node, on)))

    async def evict(self, namespace: str, pod: str) -> bool:
        self.calls.append(("evict", (namespace, pod)))
        return await self.source.evict(namespace, pod)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.calls.append(("label_node", (node, dict(labels))))

    async def event(self, kind: str, namespace: str, name: str, reason: str, message: str) -> None:
        self.calls.append(("event", (kind, namespace, name, reason, message)))
