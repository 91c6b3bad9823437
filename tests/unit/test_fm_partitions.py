"""Link groups from the NVIDIA DRA driver's Fabric Manager partitions (docs/fabric.md): the
`partitionN` attributes read as levels of link groups (whole, or left out and said), a claim's
`matchAttribute` on `gpu.nvidia.com/partitionN` read as a link-group shape, and both through the
translation to the score."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.inputs import cluster_view, listed_of
from pyctl.cli.main import main
from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.dra.devices import device_view
from pyctl.cluster.dra.node import node_devices
from pyctl.cluster.dra.partitions import partition_size, read_partitions
from pyctl.cluster.dra.zones import model_gpus
from pyctl.cluster.dra_records import Attr, Device, PodClaim, SliceRecord
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import NodeRecord
from pyctl.cluster.translate import model_of
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Shape, Snapshot, Workload
from tests.e2e.dra_driver_sim import SimGpu, SimNode, device_classes, slices_for
from tests.unit.test_dra import claim, claim_json, classes, gpus
from tests.unit.test_dra_cli import node, pod

NS = "ns"
FM8 = SimNode("n8", [SimGpu(i, i // 4) for i in range(8)], fm_partitions=True)
PAIR = [{"matchAttribute": "gpu.nvidia.com/partition2"}]


def fm_slices(edit: Any = None, sim: SimNode = FM8) -> list[SliceRecord]:
    """The node's slices, `edit(devices)` applied to the whole GPUs' raw devices first."""
    raw = slices_for(sim)
    if edit is not None:
        raw = copy.deepcopy(raw)
        edit(raw[0]["spec"]["devices"])
    out = []
    for s in raw:
        rec = decode_object("ResourceSlice", json.dumps(s).encode())
        assert isinstance(rec, SliceRecord)
        out.append(rec)
    return out


def levels_of(recs: list[SliceRecord]) -> tuple[list[tuple[tuple[int, int], ...]], Any]:
    dm = model_gpus(node_devices(FM8.name, recs, []))
    return [g.link_levels for g in dm.gpus], dm


# ---- reading the attributes ------------------------------------------------------------------


def test_partitions_are_levels_of_link_groups_renumbered_by_id() -> None:
    levels, dm = levels_of(fm_slices())
    # partition8 1 -> group 0; partition4 2, 3 -> 0, 1; partition2 4..7 -> 0..3; partition1
    # 8..15 -> 0..7
    assert levels == [((1, i), (2, i // 2), (4, i // 4), (8, 0)) for i in range(8)]
    assert dm.links == "Fabric Manager partitions (partition1, partition2, partition4, partition8)"
    assert (dm.links_left_out, dm.notes) == ("", [])
    # a node without the gate publishes none, and nothing is said
    levels, dm = levels_of(fm_slices(sim=SimNode("n8", FM8.gpus)))
    assert levels == [()] * 8
    assert (dm.links, dm.links_left_out, dm.notes) == ("", "", [])


def test_the_qualified_attribute_names_are_the_drivers() -> None:
    def qualify(devices: list[dict[str, Any]]) -> None:
        for d in devices:
            a = d["attributes"]
            for k in [k for k in a if k.startswith("partition")]:
                a[f"gpu.nvidia.com/{k}"] = a.pop(k)

    assert levels_of(fm_slices(qualify))[0] == levels_of(fm_slices())[0]
    assert partition_size("gpu.nvidia.com/partition4") == 4
    assert partition_size("partition2") == 2
    assert partition_size("example.com/partition2") is None
    assert partition_size("gpu.nvidia.com/partition0") is None
    assert partition_size("resource.kubernetes.io/numaNode") is None


def _set(key: str, value: dict[str, Any], which: int = 3) -> Any:
    def edit(devices: list[dict[str, Any]]) -> None:
        devices[which]["attributes"][key] = value

    return edit


def _drop(key: str, which: int = 3) -> Any:
    def edit(devices: list[dict[str, Any]]) -> None:
        del devices[which]["attributes"][key]

    return edit


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (_set("partition2", {"string": "4"}), "1 of 8 GPUs publish a malformed partition"),
        (_set("partition2", {"bool": True}), "partition2 is 'True', not a partition id"),
        (_set("partition2", {"int": -1}), "partition2 is '-1', not a partition id"),
        (_set("partition0", {"int": 1}), "partition0: N is not in 1..1024"),
        (_set("partition02", {"int": 1}), "partition02: N is not in 1..1024"),
        (_set("partition2048", {"int": 1}), "partition2048: N is not in 1..1024"),
        (_drop("partition2"), "1 of 8 GPUs publish other partition sizes"),
        (_set("partition16", {"int": 99}), "1 of 8 GPUs publish other partition sizes"),
        # GPU 3 in GPU 0's pair: three GPUs in a partition of two
        (_set("partition2", {"int": 4}), "partition2 4 holds 3 of the node's GPUs, more than 2"),
        # an id of a partition of 4 named as a partition of 2
        (_set("partition2", {"int": 2}), "partition id 2 names partitions of 2 and 4 GPUs"),
    ],
)
def test_a_malformed_missing_or_inconsistent_value_leaves_the_nodes_levels_out(
    edit: Any, why: str
) -> None:
    levels, dm = levels_of(fm_slices(edit))
    assert levels == [()] * 8
    assert why in dm.links_left_out
    assert dm.links == ""
    # said once, in the node's notes
    assert [n for n in dm.notes if "Fabric Manager" in n] == [
        f"Fabric Manager partitions left out (no link groups): {dm.links_left_out}"
    ]


def test_attributes_that_only_look_like_partitions_are_not_read() -> None:
    levels, dm = levels_of(fm_slices(_set("partitionable", {"bool": True})))
    assert levels == levels_of(fm_slices())[0]
    assert dm.links_left_out == ""


def _views(n: int, attrs: Any) -> list[Any]:
    return [
        device_view("gpu.nvidia.com", "p", Device(f"gpu-{i}", attributes=tuple(attrs(i))), i)
        for i in range(n)
    ]


def test_hostile_counts_are_read_in_linear_time() -> None:
    # 10,000 devices, each in a partition of its own at two sizes: read, and fast
    views = _views(
        10_000,
        lambda i: [
            Attr("type", "string", "gpu"),
            Attr("partition1", "int", 2 * i + 1),
            Attr("partition2", "int", 2 * i + 2),
        ],
    )
    t0 = time.perf_counter()
    parts = read_partitions(views)
    assert time.perf_counter() - t0 < 2.0
    assert parts.sizes == (1, 2)
    assert not parts.left_out
    assert parts.levels[views[9_999].id] == ((1, 9_999), (2, 9_999))
    # the same devices all in one partition of 8: inconsistent, said with the count
    views = _views(10_000, lambda i: [Attr("partition8", "int", 7)])
    parts = read_partitions(views)
    assert parts.levels == {}
    assert parts.left_out == "partition8 7 holds 10000 of the node's GPUs, more than 8"
    # 17 sizes: beyond the bound of levels
    views = _views(2, lambda i: [Attr(f"partition{n}", "int", 100 * n + i) for n in range(1, 18)])
    assert read_partitions(views).left_out == "17 partition sizes, more than 16"
    # values of every wrong type: left out, never raised
    for v in ("x", 1.5, True, [1, 2], None, 1 << 64):
        views = _views(2, lambda i, v=v: [Attr("partition2", "int", v)])
        assert "not a partition id" in read_partitions(views).left_out


# ---- claims: matchAttribute on partitionN is a link-group shape ------------------------------


def _need(constraints: list[dict[str, Any]], count: int = 2) -> Any:
    c = claim("c", [gpus(count)], constraints)
    ctx = DraContext.of(classes(), fm_slices(), [c])
    return ctx.need(NS, [_claim_ref("c")])


def _claim_ref(name: str) -> PodClaim:
    return PodClaim("gpus", claim=name)


def test_a_match_attribute_on_a_partition_is_a_link_group_shape() -> None:
    assert _need(PAIR).link_group is True
    assert _need([{"matchAttribute": "partition4"}], 4).link_group is True
    assert _need([{"matchAttribute": "resource.kubernetes.io/numaNode"}]).link_group is False
    assert _need([]).link_group is False
    # a constraint over other requests only does not bind the GPUs
    other = [{"matchAttribute": "gpu.nvidia.com/partition2", "requests": ["nic"]}]
    assert _need(other).link_group is False
    # one GPU needs no group
    assert _need(PAIR, 1).link_group is False


def test_gpus_of_two_claims_are_not_one_group() -> None:
    a = claim("a", [gpus(1)], PAIR)
    b = claim("b", [gpus(1)], PAIR)
    ctx = DraContext.of(classes(), fm_slices(), [a, b])
    need = ctx.need(NS, [_claim_ref("a"), _claim_ref("b")])
    assert (need.gpus, need.link_group) == (2, False)


# ---- through the translation to the score ----------------------------------------------------


def test_one_idle_gpu_per_partition2_is_link_split_for_a_pair_claim() -> None:
    # GPUs 1, 3, 5, 7 allocated: the idle 0, 2, 4, 6 are one per partition of two
    held = [
        claim(f"h{i}", [gpus(1)], None, [("gpus", "", f"gpu-{i}")], "n8", f"p{i}")
        for i in (1, 3, 5, 7)
    ]
    ctx = DraContext.of(classes(), fm_slices(), held)
    rec = NodeRecord("n8", cpu_milli=64000, memory_mib=1 << 20, gpu_model="NVIDIA-H100-80GB-HBM3")
    model, dm = model_of(rec, None, [], dra=ctx)
    assert dm is not None
    assert dm.links.startswith("Fabric Manager partitions")
    dra_gpus = [g for z in model.zones for g in z.dra_gpus]
    assert [g.link_levels[1] for g in dra_gpus] == [(2, i // 2) for i in range(8)]
    pair = Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, dra=True, link_group=True)
    four = Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, dra=True, link_group=True)
    m = FragmentationModel(Snapshot((model,)))
    for s in (pair, four):
        got = m.score(Workload((s,))).nodes[0]
        assert got.categories["link_split"] == 4000, s
    # the same node link-blind: nothing is fragment for a pair
    blind = Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, dra=True)
    assert m.score(Workload((blind,))).fragment_gpu_milli == 0
    assert m.place_delta("n8", pair, Workload((pair,))) is None


def test_score_on_a_dump_with_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items: list[dict[str, Any]] = [node("n8"), *device_classes(), *slices_for(FM8)]
    for i in (1, 3, 5, 7):
        items.append(
            claim_json(f"one-{i}", [gpus(1)], None, [("gpus", "", f"gpu-{i}")], "n8", f"one-{i}")
        )
        items.append(pod(f"one-{i}", "n8", {"gpus": f"one-{i}"}))
    # a pending pod whose claim asks two GPUs of one partition of two
    items.append(claim_json("pair", [gpus(2)], PAIR))
    items.append(pod("pair", None, {"gpus": "pair"}))
    for c in items:
        if c.get("kind") == "ResourceClaim":
            c["apiVersion"] = "resource.k8s.io/v1"
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    assert main(["score", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (n8,) = out["nodes"]
    assert n8["idle_gpu_milli"] == 4000
    # M, derived from the pods as the controller derives it, holds the pair as a link-group
    # shape: its weight's share of the idle 4,000 milli-GPU is link_split
    view = cluster_view(listed_of(json.loads(path.read_text()), "dump"))
    (pair,) = [s for s in view.workload.shapes if s.link_group]
    assert (pair.gpus, pair.dra) == (2, True)
    total = sum(s.weight for s in view.workload.shapes)
    assert out["cluster"]["categories"]["link_split"] == pytest.approx(4000 * pair.weight / total)
    assert out["dra"]["nodes"]["n8"]["links_by"].startswith("Fabric Manager partitions")
    assert main(["score", str(path)]) == 0
    assert "link groups by Fabric Manager partitions" in capsys.readouterr().out


def test_nodes_whose_partitions_were_left_out_are_counted() -> None:
    """Two DRA nodes, one whose partitions read and one with a malformed value: the fabric
    pass counts one, and both are scored."""
    from pyctl.cluster.records import Event
    from pyctl.controller.cache import ClusterCache
    from pyctl.controller.reconcile import Reconciler
    from pyctl.metrics import Metrics

    good = SimNode("good", FM8.gpus, fm_partitions=True)
    bad = SimNode("bad", FM8.gpus, fm_partitions=True)
    cache = ClusterCache()
    events: list[Event] = [
        Event("ADDED", decode_object("DeviceClass", c)) for c in device_classes()
    ]
    for sim, edit in ((good, None), (bad, _set("partition4", {"string": "x"}))):
        rec = NodeRecord(sim.name, cpu_milli=64000, memory_mib=1 << 20)
        events.append(Event("ADDED", rec))
        events += [Event("ADDED", s) for s in fm_slices(edit, sim)]
    cache.apply(events)
    pair = Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, dra=True, link_group=True)
    r = Reconciler(cache, Metrics(), "t", workload=Workload((pair,)))
    for n in cache.nodes:
        r.reconcile(n)
    assert sorted(r.scores) == ["bad", "good"]
    r.fabric(60.0)
    sample = r.metrics.registry.get_sample_value(
        "pyctl_fabric_source_problems", {"cluster": "t", "problem": "fm_partitions_left_out"}
    )
    assert sample == 1
    assert "partition4 is 'x'" in r.dra_models["bad"].links_left_out
    assert r.dra_models["good"].links_left_out == ""
