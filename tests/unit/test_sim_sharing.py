"""The simulated cluster of `make demo` has a time-sliced pool (docs/sharing.md): its nodes are
published as the NVIDIA device plugin (renameByDefault) and GPU Feature Discovery show them, its
small-model replicas ask `nvidia.com/gpu.shared`, and what pyctl reads back from those records
holds exactly the replicas the simulated scheduler bound there."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import pytest

from pyctl.cluster.records import (
    Event,
    Kind,
    NodeRecord,
    NrtRecord,
    ObjectRef,
    PodRecord,
    Record,
)
from pyctl.cluster.sim.scenario import SHARED, TIME_SLICES, inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.cluster.translate import node_from_records


class Sink:
    """Keeps the latest record of every object, as a watch cache would."""

    def __init__(self) -> None:
        self.objects: dict[tuple[Kind, str], Record] = {}
        self.checks = 0

    def _key(self, r: Record) -> tuple[Kind, str]:
        if isinstance(r, PodRecord):
            return "Pod", r.key
        if isinstance(r, NodeRecord):
            return "Node", r.name
        if isinstance(r, NrtRecord):
            return "NodeResourceTopology", r.name
        return "PodDisruptionBudget", ""

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        for k in [k for k in self.objects if k[0] == kind]:
            del self.objects[k]
        for r in records:
            self.objects[self._key(r)] = r

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        for e in events:
            if e.type == "DELETED":
                self.objects.pop(self._key(e.record), None)
            else:
                self.objects[self._key(e.record)] = e.record

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        raise AssertionError(message)


@pytest.mark.anyio
async def test_the_time_sliced_pool_reads_back_as_the_simulation_placed_it() -> None:
    sc = inference_day()
    shared_nodes = [n.name for n in sc.nodes if n.gpu_pool == SHARED]
    assert len(shared_nodes) == 2
    src = SimClusterSource(sc, speed=None)
    sink = Sink()
    peak = 0

    def check(_: object) -> None:
        nonlocal peak
        c = src.cluster
        pods = [r for r in sink.objects.values() if isinstance(r, PodRecord)]
        for name in shared_nodes:
            node = sink.objects[("Node", name)]
            nrt = sink.objects[("NodeResourceTopology", name)]
            assert isinstance(node, NodeRecord)
            assert isinstance(nrt, NrtRecord)
            assert node.sharing is not None
            assert (node.sharing.strategy, node.sharing.replicas, node.sharing.shared) == (
                "time-slicing",
                TIME_SLICES,
                4 * TIME_SLICES,
            )
            here = [p for p in pods if p.node == name]
            model = node_from_records(node, nrt, here)
            held = Counter(pod for z in model.zones for g in z.gpus for pod, _ in g.holders)
            # the simulation's truth: replicas bound to this node
            truth = {
                f"{c.namespace}/{p.name}": p.shape.gpus
                for p in c.pods.values()
                if p.node == name and p.shape.gpu_pool
            }
            assert dict(held) == truth
            used = sum(g.used_milli for z in model.zones for g in z.gpus)
            assert used == 250 * sum(truth.values())
            # NodeResourceTopology's free replicas agree
            assert sum(z.shared_available for z in nrt.zones) == 16 - sum(truth.values())
            peak = max(peak, sum(truth.values()))
        # nothing asking for shared replicas lands anywhere else
        for p in pods:
            if p.sharing is not None and p.node:
                assert p.node in shared_nodes
        sink.checks += 1

    src.on_tick = check
    await src.run(sink)
    assert sink.checks > 500
    assert peak >= 10  # the pool is used, not idle
