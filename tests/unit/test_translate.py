"""Records -> the core's node model (pyctl/cluster/translate.py): MIG instances when
NodeResourceTopology and the node's allocatable agree, and when the topology agent lags a
re-partition."""

from __future__ import annotations

from collections import Counter

from pyctl.cluster.records import NodeRecord, NrtRecord, PodRecord, ZoneRecord
from pyctl.cluster.translate import node_from_records
from pyctl.model import Node

A100 = "NVIDIA-A100-SXM4-40GB"


def a100(mig: dict[str, int]) -> NodeRecord:
    return NodeRecord(
        "m",
        gpu_model=A100,
        cpu_milli=64000,
        memory_mib=1 << 19,
        mig=tuple(sorted(mig.items())),
        gpu_count_label=2,
    )


def zone(numa: int, mig: dict[str, int]) -> ZoneRecord:
    return ZoneRecord(
        numa,
        cpu_milli=32000,
        cpu_available=32000,
        memory_mib=1 << 18,
        memory_available=1 << 18,
        mig=tuple((p, n, n) for p, n in sorted(mig.items())),
    )


def instances(node: Node) -> list[Counter[str]]:
    """Per zone, the MIG instances by profile."""
    return [Counter(i.profile for m in z.mig for i in m.instances) for z in node.zones]


def test_agreeing_topology_keeps_its_zone_split() -> None:
    nrt = NrtRecord(
        "m", policy="single-numa-node", zones=(zone(0, {"1g.5gb": 7}), zone(1, {"1g.5gb": 7}))
    )
    node = node_from_records(a100({"1g.5gb": 14}), nrt, [])
    assert instances(node) == [Counter({"1g.5gb": 7}), Counter({"1g.5gb": 7})]


def test_allocatable_wins_over_a_topology_that_lags_a_repartition() -> None:
    # mig-manager made both GPUs 2 x 3g.20gb; the agent still reports 7 x 1g.5gb per zone
    nrt = NrtRecord(
        "m", policy="single-numa-node", zones=(zone(0, {"1g.5gb": 7}), zone(1, {"1g.5gb": 7}))
    )
    used = PodRecord("ns", "p", node="m", mig=(("3g.20gb", 1),))
    node = node_from_records(a100({"3g.20gb": 4}), nrt, [used])
    assert instances(node) == [Counter({"3g.20gb": 4}), Counter()]
    assert sum(i.used for z in node.zones for m in z.mig for i in m.instances) == 1
    assert node.topology_policy == "single-numa-node"  # the rest of the topology still counts
