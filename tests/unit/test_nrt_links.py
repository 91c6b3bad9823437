"""Link groups from NodeResourceTopology zones that nest (docs/fabric.md, "Link groups inside a
node"): a zone whose `parent` is a NUMA zone and that holds `nvidia.com/gpu` is one link group of
that NUMA node's GPUs, with its own allocatable and available counts."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import NodeRecord, NrtRecord
from pyctl.cluster.translate import node_from_records
from pyctl.core.fragmentation import score
from pyctl.model import Shape, Snapshot, Workload

GPU = "nvidia.com/gpu"


def res(name: str, capacity: int | str, available: int | str) -> dict[str, Any]:
    return {"name": name, "capacity": capacity, "allocatable": capacity, "available": available}


def nrt(zones: list[dict[str, Any]]) -> NrtRecord:
    obj = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "gpu-0", "resourceVersion": "1"},
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "zones": zones,
    }
    rec = decode_object("NodeResourceTopology", obj)
    assert isinstance(rec, NrtRecord)
    return rec


def numa(i: int, gpus: int, available: int) -> dict[str, Any]:
    return {
        "name": f"node-{i}",
        "type": "Node",
        "resources": [
            res("cpu", 32, 32),
            res("memory", "256Gi", "256Gi"),
            res(GPU, gpus, available),
        ],
    }


def pair(name: str, parent: str, available: int | str, gpus: int = 2) -> dict[str, Any]:
    return {
        "name": name,
        "type": "NVLink",
        "parent": parent,
        "resources": [res(GPU, gpus, available)],
    }


NODE = NodeRecord("gpu-0", gpu_model="H100-PCIE-80GB", cpu_milli=64000, memory_mib=1 << 19, gpus=8)
PAIR = Workload((Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, link_group=True),))


def test_nested_zones_are_link_groups_with_their_own_usage() -> None:
    """Two NUMA nodes of four GPUs, each two NVLink pairs (nested zones); one GPU of each pair of
    NUMA 0 is in use, NUMA 1 is idle. For a pair shape, NUMA 0's two idle GPUs are link_split
    (their pairs are broken); NUMA 1's four serve two pairs."""
    rec = nrt(
        [
            numa(0, 4, 2),
            numa(1, 4, 4),
            pair("nvlink-a", "node-0", 1),
            pair("nvlink-b", "node-0", 1),
            pair("nvlink-c", "node-1", 2),
            pair("nvlink-d", "node-1", 2),
        ]
    )
    assert [z.links for z in rec.zones] == [((2, 1), (2, 1)), ((2, 2), (2, 2))]
    node = node_from_records(NODE, rec, [])
    got = [(g.used_milli, g.link) for z in node.zones for g in z.gpus]
    assert got == [(1000, 0), (0, 0), (1000, 1), (0, 1), (0, 2), (0, 2), (0, 3), (0, 3)]
    s = score(Snapshot((node,)), PAIR).nodes[0]
    assert s.idle_gpu_milli == 6000
    assert s.categories["link_split"] == pytest.approx(2000.0)
    # the same node without the nested zones: any two idle GPUs of a NUMA node make a pair
    flat = nrt([numa(0, 4, 2), numa(1, 4, 4)])
    s = score(Snapshot((node_from_records(NODE, flat, []),)), PAIR).nodes[0]
    assert s.categories["link_split"] == 0.0


def test_groups_that_do_not_hold_the_zones_gpus_are_not_read() -> None:
    """Nested zones of 2 + 1 GPUs under a NUMA zone of 4, a zone nested in a zone that is not a
    NUMA node, and one without GPUs: no link groups."""
    rec = nrt(
        [
            numa(0, 4, 4),
            pair("a", "node-0", 2),
            pair("b", "node-0", 1, gpus=1),
            pair("c", "nowhere", 2),
            {"name": "cache", "type": "L3Cache", "parent": "node-0", "resources": []},
        ]
    )
    assert rec.zones[0].links == ()
    node = node_from_records(NODE, rec, [])
    assert {g.link for z in node.zones for g in z.gpus} == {None}


def test_usage_the_groups_do_not_show_yet_fills_free_gpus_in_order() -> None:
    """NodeResourceTopology lags: the zone says 1 of 4 used (its pairs say the same), the
    kubelet has bound three one-GPU pods there (CPU pods' GPUs counted as the rules count them):
    the two more go to the first free GPUs, group by group."""
    from pyctl.cluster.records import PodRecord

    rec = nrt([numa(0, 4, 3), pair("a", "node-0", 1), pair("b", "node-0", 2)])
    pods = [
        PodRecord("ns", f"p{i}", f"u{i}", node="gpu-0", phase="Running", cpu_milli=100, gpus=1)
        for i in range(3)
    ]
    node = node_from_records(NODE, rec, pods)
    got = [(g.used_milli, g.link) for z in node.zones for g in z.gpus]
    assert got == [(1000, 0), (1000, 0), (1000, 1), (0, 1)]


def test_a_bad_nested_zone_quantity_is_the_objects_decode_error() -> None:
    from pyctl.cluster.kube.decode import DecodeError

    with pytest.raises(DecodeError, match=re.escape("zone a: nvidia.com/gpu")):
        nrt([numa(0, 4, 4), pair("a", "node-0", "lots")])
