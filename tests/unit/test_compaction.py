"""Compaction planning from records: frees an aligned zone for a pending replica, never moves a
pod back where it came from, and respects the evictor rules and PodDisruptionBudgets."""

from __future__ import annotations

from pyctl.cluster.records import NodeRecord, NrtRecord, PdbRecord, PodRecord, ZoneRecord
from pyctl.model import Shape, Workload
from pyctl.workflows.compaction import plan_compaction
from pyctl.workflows.evictor import Evictor, EvictorOptions


def node(name: str) -> NodeRecord:
    return NodeRecord(
        name, gpu_model="NVIDIA-H100-80GB-HBM3", cpu_milli=64000, memory_mib=1 << 20, gpus=8
    )


def nrt(name: str, used: tuple[int, int]) -> NrtRecord:
    return NrtRecord(
        name,
        policy="single-numa-node",
        zones=tuple(
            ZoneRecord(z, 32000, 32000 - 1000 * used[z], 1 << 19, 1 << 19, 4, 4 - used[z])
            for z in range(2)
        ),
    )


def pod(name: str, node_name: str, gpus: int = 1, **kw: object) -> PodRecord:
    base: dict[str, object] = {
        "node": node_name,
        "phase": "Running",
        "cpu_milli": 1000 * gpus,
        "gpus": gpus,
        "owner_kind": "ReplicaSet",
        "owner_name": "llm",
        "labels": (("app", "llm"),),
    }
    base.update(kw)
    return PodRecord("serving", name, **base)  # type: ignore[arg-type]


def fragmented() -> tuple[dict[str, NodeRecord], dict[str, NrtRecord], list[PodRecord]]:
    # a: one pod in each zone; b: zone 0 has 3 pods, zone 1 has 1. No zone has 4 free GPUs.
    nodes = {"a": node("a"), "b": node("b")}
    nrts = {"a": nrt("a", (1, 1)), "b": nrt("b", (3, 1))}
    pods = [
        pod("a0", "a"),
        pod("a1", "a"),
        pod("b0", "b"),
        pod("b1", "b"),
        pod("b2", "b"),
        pod("b3", "b"),
    ]
    return nodes, nrts, pods


FOUR = Shape(cpu_milli=4000, gpus=4, gpu_milli=1000)
ONE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000)


def test_compaction_frees_a_zone_for_the_pending_four_gpu_replica() -> None:
    nodes, nrts, pods = fragmented()
    plan = plan_compaction(nodes, nrts, pods, [], Workload((ONE,)), pending=[FOUR], max_moves=3)
    assert plan.moves, plan
    first = plan.moves[0]
    # an evicted replica lands on the fuller node, never back where it was
    assert first.from_node == "a"
    assert first.to_node == "b"
    assert first.gain_gpu_milli > 0
    assert all(m.from_node != m.to_node for m in plan.moves)
    assert len({m.pod for m in plan.moves}) == len(plan.moves)


def test_a_pdb_without_budget_holds_compaction_back() -> None:
    nodes, nrts, pods = fragmented()
    pdb = PdbRecord("serving", "llm", match_labels=(("app", "llm"),), disruptions_allowed=0)
    plan = plan_compaction(nodes, nrts, pods, [pdb], Workload((ONE,)), pending=[FOUR])
    assert plan.moves == ()
    assert plan.refused["serving/a0"] == "PodDisruptionBudget has no budget left"


def test_evictor_rules() -> None:
    pods = [
        pod("ok", "a"),
        pod("ds", "a", owner_kind="DaemonSet"),
        pod("bare", "a", owner_kind="", owner_name=""),
        pod("mirror", "a", mirror=True),
        pod("crit", "a", priority=2_000_001_000),
        pod("local", "a", local_storage=True),
        pod("keep", "a", evict_annotation="false"),
        pod("pending", ""),
    ]
    ev = Evictor(EvictorOptions(), pods)
    why = {p.name: ev.why_not(p) for p in pods}
    assert why == {
        "ok": None,
        "ds": "DaemonSet pod",
        "bare": "bare pod (no controller would recreate it)",
        "mirror": "mirror (static) pod",
        "crit": "system-critical pod",
        "local": "uses local storage",
        "keep": "annotated not to be evicted",
        "pending": "not running on a node",
    }
    loose = Evictor(
        EvictorOptions(evict_local_storage_pods=True, evict_system_critical_pods=True), pods
    )
    assert loose.why_not(pods[4]) is None
    assert loose.why_not(pods[5]) is None
    strict = Evictor(EvictorOptions(min_replicas=20, priority_threshold=0), pods)
    assert strict.why_not(pods[0]) == "priority 0 at or above the threshold"
