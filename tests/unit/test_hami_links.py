"""HAMi's link scores as link groups (docs/fabric.md, "Link groups inside a node"): the device
plugin's `hami.io/node-nvidia-score` (pairwise scores: 10-60 for the PCIe path plus 100 per
NVLink) read into NVLink groups of the node's GPUs, the measure's `link_split` on them, the
pods that ask HAMi's `topology-aware` policy for several GPUs, and hostile annotations."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.kube.sharing import (
    HAMI_POLICY,
    HAMI_REGISTER,
    HAMI_SCORE,
    MAX_SCORE_ANNOTATION,
    hami_links,
    node_sharing,
    pod_sharing,
)
from pyctl.cluster.records import NodeRecord, PodRecord, PodSharing
from pyctl.cluster.sharing import HAMI, shared_shape
from pyctl.cluster.translate import node_from_records
from pyctl.core.fragmentation import score
from pyctl.model import Node, Shape, Snapshot, Workload

N = 8


def register(n: int = N) -> str:
    """HAMi v2.8+'s registration of `n` A100s on NUMA 0, GPU-i at index i."""
    return json.dumps(
        [
            {"id": f"GPU-{i}", "index": i, "count": 10, "devmem": 81920, "devcore": 100}
            | {"type": "NVIDIA A100", "health": True}
            for i in range(n)
        ]
    )


def scores(pairs: set[frozenset[int]], n: int = N) -> str:
    """HAMi's pair scores: 50 (one PCIe switch) for every pair, plus 100 per NVLink on `pairs`."""
    return json.dumps(
        [
            {
                "uuid": f"GPU-{i}",
                "score": {
                    f"GPU-{j}": 50 + (100 if frozenset((i, j)) in pairs else 0)
                    for j in range(n)
                    if j != i
                },
            }
            for i in range(n)
        ]
    )


PAIRS = {frozenset((i, i + 1)) for i in range(0, N, 2)}


def hami_node(annotations: dict[str, str]) -> NodeRecord:
    sharing = node_sharing({}, annotations, {})
    return NodeRecord("hami-0", cpu_milli=64000, memory_mib=512 * 1024, sharing=sharing)


def test_nvlink_pairs_are_link_groups_named_by_their_first_gpu() -> None:
    devices = node_sharing({}, {HAMI_REGISTER: register()}, {})
    assert devices is not None
    got = hami_links(scores(PAIRS), devices.hami)
    assert got == {f"GPU-{i}": i - i % 2 for i in range(N)}
    # joined through others: 0-1 and 1-2 make one group of three
    chain = hami_links(scores({frozenset((0, 1)), frozenset((1, 2))}), devices.hami)
    assert [chain[f"GPU-{i}"] for i in range(4)] == [0, 0, 0, 3]


def test_no_nvlink_pair_is_no_link_known() -> None:
    """HAMi before its PR #2103 scored no link through an NVSwitch (every pair PCIe-only): a
    board that shows no NVLink at all is unknown (any GPUs serve any shape), not 8 singles."""
    devices = node_sharing({}, {HAMI_REGISTER: register()}, {})
    assert devices is not None
    assert hami_links(scores(set()), devices.hami) == {}
    node = node_from_records(
        hami_node({HAMI_REGISTER: register(), HAMI_SCORE: scores(set())}), None, []
    )
    assert {g.link for z in node.zones for g in z.gpus} == {None}


def test_hami_links_make_link_split_of_broken_pairs() -> None:
    """8 A100s in four NVLink pairs, one GPU of each pair held by a pod (GPUs 0, 2, 4, 6): for
    a HAMi pod of 2 whole GPUs that needs a pair, the 4 idle GPUs are link_split (4,000
    milli-GPU) and nothing can run; without the scores, the same node has no link_split."""
    node = node_from_records(
        hami_node({HAMI_REGISTER: register(), HAMI_SCORE: scores(PAIRS)}), None, []
    )
    assert [(g.id, g.link) for z in node.zones for g in z.gpus] == [
        (i, i - i % 2) for i in range(N)
    ]

    def held(n: Node) -> Node:
        """`n` with a pod on each even GPU."""
        z = n.zones[0]
        gpus = tuple(
            replace(g, used_milli=1000, holders=((f"ns/p{g.id}", 1000),)) if g.id % 2 == 0 else g
            for g in z.gpus
        )
        return replace(n, zones=(replace(z, gpus=gpus),))

    pair = Workload(
        (Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, gpu_pool=HAMI, link_group=True),)
    )
    got = score(Snapshot((held(node),)), pair).nodes[0]
    assert got.idle_gpu_milli == 4000
    assert got.categories["link_split"] == pytest.approx(4000.0)
    plain = node_from_records(hami_node({HAMI_REGISTER: register()}), None, [])
    got = score(Snapshot((held(plain),)), pair).nodes[0]
    assert got.categories["link_split"] == 0.0


def test_a_topology_aware_pod_of_several_gpus_wants_them_linked() -> None:
    def shape(gpus: int, policy: str | None) -> Shape | None:
        ann = {HAMI_POLICY: policy} if policy is not None else {}
        s = pod_sharing({"nvidia.com/gpumem": 20000}, ann, "hami-scheduler", 0, gpus)
        assert s is not None
        return shared_shape(PodRecord("ns", "p", gpus=gpus, sharing=s), None)

    two = shape(2, "topology-aware")
    assert two is not None
    assert (two.link_group, two.gpu_pool) == (True, HAMI)
    wants = [shape(g, p) for g, p in ((1, "topology-aware"), (2, "binpack"), (2, None))]
    assert [s.link_group if s is not None else None for s in wants] == [False, False, False]
    chained = shape(2, "binpack, topology-aware")
    assert chained is not None
    assert chained.link_group
    assert PodSharing().topology is False


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("{not json", "broken JSON"),
        ('{"uuid": "GPU-0"}', "expected a list"),
        ('[{"uuid": "GPU-0", "score": [1]}]', 'expected {"uuid"'),
        ('[{"uuid": "GPU-0", "score": {"GPU-1": "lots"}}]', "expected an integer"),
        ('[{"uuid": "GPU-0", "score": {"GPU-1": -5}}]', "outside 0..1000000"),
        ('[{"uuid": 7, "score": {}}]', "bad device id"),
        ("[" + ",".join(["{}"] * 65) + "]", "at most 64 devices"),
        (" " * (MAX_SCORE_ANNOTATION + 1), "longer than"),
    ],
)
def test_a_bad_score_annotation_leaves_the_links_out_not_the_node(value: str, reason: str) -> None:
    """The node is read and scored as if the annotation were absent (no link groups); why the
    scores were left out is in its sharing note."""
    obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "hami-0",
            "resourceVersion": "1",
            "annotations": {HAMI_REGISTER: register(), HAMI_SCORE: value},
        },
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}},
    }
    rec = decode_object("Node", obj)
    assert isinstance(rec, NodeRecord)
    assert rec.sharing is not None
    assert reason in rec.sharing.links_error
    assert all(d.link == -1 for d in rec.sharing.hami)
    node = node_from_records(rec, None, [])
    assert {g.link for z in node.zones for g in z.gpus} == {None}
    assert "link scores left out" in node.sharing
