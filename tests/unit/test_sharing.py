"""Shared GPUs (docs/sharing.md): `pyctl score` on kubectl dumps of time-slicing, MPS and HAMi
clusters (tests/data/sharing, with the exact label and annotation formats of the NVIDIA device
plugin, GPU Feature Discovery and HAMi) against values worked out by hand; the readers of those
formats, the device plugin's attribution of replicas, and hostile input."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.cluster import sharing
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.kube.dump import read_dump
from pyctl.cluster.kube.sharing import hami_allocation, hami_devices
from pyctl.cluster.records import (
    HamiDevice,
    HamiShare,
    NodeRecord,
    NodeSharing,
    PodRecord,
    PodSharing,
)
from pyctl.cluster.translate import attribute_pods, models_of, node_from_records, pod_shape
from pyctl.controller.placement import PlacementAdvisor
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.policy import PlanLimits
from pyctl.model import Shape, Snapshot, Workload
from pyctl.workflows.compaction import plan_compaction
from tests.dumps import pod_shapes, records, snapshot_from_dump
from tests.paths import REPO

DATA = REPO / "tests" / "data" / "sharing"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def score_json(
    capsys: pytest.CaptureFixture[str], dump: str, workload: str | None
) -> dict[str, Any]:
    argv = ["score", str(DATA / dump), "--json"]
    if workload:
        argv += ["--workload", str(DATA / workload)]
    assert main(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def by_name(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in out["nodes"]}


def nonzero(cats: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in cats.items() if v}


S = "serving/"


# ---- pyctl score on the dumps, worked by hand -------------------------------------------------


def test_score_time_slicing(capsys: pytest.CaptureFixture[str]) -> None:
    """ts-a10g-0: 4 A10G, `nvidia.com/gpu.shared` 16 (renameByDefault), 4 replicas per GPU:
    250 milli each. Pods in creation order: qwen 4tq2x (1), qwen 9wz7k (1), phi (2), qwen r5m8p
    (1), qwen hx6dn (1). The device plugin's distributed policy: 4tq2x -> GPU 0, 9wz7k -> 1,
    phi -> 2 then 3 (fewest allocated), r5m8p -> 0 (all at 1: lowest index), hx6dn -> 1. Used
    500, 500, 250, 250; idle 2500.
    ts-t4-0: 2 T4, 3 replicas: 333 milli each, the remainder 1000 - 3 x 333 = 1 counted used;
    bge on GPU 0: used 1000 - 2 x 333 = 334, GPU 1: 1; idle 666 + 999 = 1665.
    gpu-l40s-0: 2 L40S, not shared; llama-8b holds GPU 0; idle 1000.
    Workload: one replica of nvidia.com/gpu.shared (0.5), two replicas (0.25), a whole
    nvidia.com/gpu (0.25). Replicas fit wherever a replica is free: no fragment on the
    time-sliced nodes but the whole-GPU shape's no_access (its pool is nvidia.com/gpu):
    ts-a10g-0 0.25 x 2500 = 625; ts-t4-0 0.25 x 1665 = 416.25. On gpu-l40s-0 the replica
    shapes have no access (0.75 x 1000 = 750); the whole GPU fits GPU 1.
    Cluster: idle 5165, fragment 1791.25."""
    out = score_json(capsys, "time-slicing.json", "time-slicing-workload.json")
    assert out["cluster"]["idle_gpu_milli"] == 5165
    assert out["cluster"]["fragment_gpu_milli"] == 1791.25
    assert nonzero(out["cluster"]["categories"]) == {"no_access": 1791.25}
    nodes = by_name(out)
    a10 = nodes["ts-a10g-0"]
    assert (a10["idle_gpu_milli"], a10["fragment_gpu_milli"]) == (2500, 625)
    assert a10["sharing"] == "time-slicing x4 (nvidia.com/gpu.shared), attributed"
    assert [(g["id"], g["used_milli"], g["pods"]) for g in a10["gpus"]] == [
        (0, 500, {S + "qwen-1p5b-6c8f9d7b4d-4tq2x": 250, S + "qwen-1p5b-6c8f9d7b4d-r5m8p": 250}),
        (1, 500, {S + "qwen-1p5b-6c8f9d7b4d-9wz7k": 250, S + "qwen-1p5b-6c8f9d7b4d-hx6dn": 250}),
        (2, 250, {S + "phi-3-mini-5b9c7d8f6-jx2lm": 250}),
        (3, 250, {S + "phi-3-mini-5b9c7d8f6-jx2lm": 250}),
    ]
    t4 = nodes["ts-t4-0"]
    assert (t4["idle_gpu_milli"], t4["fragment_gpu_milli"]) == (1665, 416.25)
    assert [(g["used_milli"], g["pods"]) for g in t4["gpus"]] == [
        (334, {S + "bge-small-7f6d5c4b3-kq9vt": 333}),
        (1, {}),
    ]
    l40s = nodes["gpu-l40s-0"]
    assert (l40s["idle_gpu_milli"], l40s["fragment_gpu_milli"]) == (1000, 750)
    assert "sharing" not in l40s


def test_score_mps(capsys: pytest.CaptureFixture[str]) -> None:
    """mps-h100-0: 4 H100 under MPS, 2 replicas per GPU, not renamed: `nvidia.com/gpu` 8 and
    GFD's product `...-SHARED`; GPUs 0, 1 on NUMA 0 and 2, 3 on NUMA 1; single-numa-node. A
    replica is 500 milli (MPS caps its memory at half the GPU's too). The kubelet aligns each
    1-replica request to NUMA 0 while it has a free replica; the plugin picks the GPU with the
    fewest: mistral 2kxvq -> 0, 8hn4w -> 1, tz7rd -> 0. Used 1000, 500, 0, 0; idle 2500.
    gpu-h100-1: 4 H100, not shared, llama-70b holds GPUs 0, 1; idle 2000.
    Workload: one replica of nvidia.com/gpu (0.5; on mps-h100-0 500 milli, on gpu-h100-1 a
    whole GPU) and two whole GPUs (0.5). The replica fits everywhere. Two whole GPUs on
    mps-h100-0: only NUMA 1 has two free GPUs, so GPU 1 (500 free) is stranded: 0.5 x 500 =
    250 in zone 0. gpu-h100-1 has GPUs 2, 3 free: no fragment. Cluster: idle 4500, fragment
    250, all stranded."""
    out = score_json(capsys, "mps.json", "mps-workload.json")
    assert out["cluster"]["idle_gpu_milli"] == 4500
    assert out["cluster"]["fragment_gpu_milli"] == 250
    assert nonzero(out["cluster"]["categories"]) == {"stranded": 250}
    mps = by_name(out)["mps-h100-0"]
    assert mps["sharing"] == "mps x2 (nvidia.com/gpu), attributed"
    assert [(z["numa"], z["idle_gpu_milli"], z["fragment_gpu_milli"]) for z in mps["zones"]] == [
        (0, 500, 250),
        (1, 2000, 0),
    ]
    assert [(g["numa"], g["id"], g["used_milli"], sorted(g["pods"])) for g in mps["gpus"]] == [
        (0, 0, 1000, [S + "mistral-7b-6f5d4c3b2-2kxvq", S + "mistral-7b-6f5d4c3b2-tz7rd"]),
        (0, 1, 500, [S + "mistral-7b-6f5d4c3b2-8hn4w"]),
        (1, 2, 0, []),
        (1, 3, 0, []),
    ]
    assert by_name(out)["gpu-h100-1"]["fragment_gpu_milli"] == 0


def test_score_hami(capsys: pytest.CaptureFixture[str]) -> None:
    """hami-a100-0: two A100-80GB registered by HAMi v2.8+ (JSON; devmem 81920, devcore 100,
    count 10), GPU 0 on NUMA 0, GPU 1 on NUMA 1. From hami.io/vgpu-devices-allocated:
    GPU 0: qwen 20000 MiB / 30 cores, sd-xl 49152 MiB (60 %) / 0 cores: memory 69152 / 81920
    = 844.1 -> 845 milli, cores 300: used 845. Holdings: qwen max(ceil(244.1), 300) = 300, sd-xl
    600, 900 in all, scaled to 845: 281.67 -> 282, 563.33 -> 563.
    GPU 1: whisper 10000 MiB / 10 cores, rag two containers of 8000 MiB / 20 cores (collapsed:
    16000 / 40): memory 26000 -> 318, cores 50 -> 500: used 500. Holdings 123 and 400, scaled
    to 500: 117.6 -> 118, 382.4 -> 382. Idle 155 + 500 = 655.
    hami-a10-1: one A10 registered in HAMi's older format (23028 MiB); ocr 12000 MiB, no core
    limit: ceil(1000 x 12000 / 23028) = 522; idle 478.
    Workload: 20000 MiB of one GPU (0.5: 245 milli of an A100, 869 of an A10), half a GPU
    (0.25), a whole nvidia.com/gpu (0.25, no access to HAMi's GPUs).
    hami-a100-0: 20000 MiB: GPU 0's 155 free are stranded (0.5 x 155 = 77.5); half a GPU: GPU 1
    has 500: GPU 0 stranded again (0.25 x 155 = 38.75); whole GPU: no_access 0.25 x 655 =
    163.75; 280, zone 0 155, zone 1 125.
    hami-a10-1: 869 > 478: lack_gpu 0.5 x 478 = 239; half: lack_gpu 119.5; whole: no_access
    119.5; 478. Cluster: idle 1133, fragment 758."""
    out = score_json(capsys, "hami.json", "hami-workload.json")
    assert out["cluster"]["idle_gpu_milli"] == 1133
    assert out["cluster"]["fragment_gpu_milli"] == 758
    assert nonzero(out["cluster"]["categories"]) == {
        "lack_gpu": 358.5,
        "no_access": 163.75 + 119.5,
        "stranded": 116.25,
    }
    nodes = by_name(out)
    a100 = nodes["hami-a100-0"]
    assert (a100["idle_gpu_milli"], a100["fragment_gpu_milli"]) == (655, 280)
    assert nonzero(a100["categories"]) == {"no_access": 163.75, "stranded": 116.25}
    assert a100["sharing"] == "hami, exact"
    assert [(z["numa"], z["fragment_gpu_milli"]) for z in a100["zones"]] == [(0, 155), (1, 125)]
    assert [(g["numa"], g["used_milli"], g["pods"]) for g in a100["gpus"]] == [
        (0, 845, {S + "qwen-7b-5c4b3a2d1-v8k2m": 282, S + "sd-xl-6d5c4b3a2-q7w3e": 563}),
        (1, 500, {S + "rag-8f7e6d5c4-x2c6v": 382, S + "whisper-7e6d5c4b3-n4b8t": 118}),
    ]
    a10 = nodes["hami-a10-1"]
    assert (a10["idle_gpu_milli"], a10["fragment_gpu_milli"]) == (478, 478)
    assert nonzero(a10["categories"]) == {"lack_gpu": 358.5, "no_access": 119.5}
    assert a10["gpus"] == [
        {"numa": 0, "id": 0, "used_milli": 522, "pods": {S + "ocr-9a8f7e6d5-m5z1p": 522}}
    ]


def test_models_and_pools_from_the_dumps() -> None:
    ts = {n.name: n for n in snapshot_from_dump(load("time-slicing.json")).nodes}
    assert (ts["ts-a10g-0"].gpu_pool, ts["ts-a10g-0"].gpu_replicas) == ("nvidia.com/gpu.shared", 4)
    assert (ts["gpu-l40s-0"].gpu_pool, ts["gpu-l40s-0"].gpu_replicas) == ("", 1)
    mps = {n.name: n for n in snapshot_from_dump(load("mps.json")).nodes}
    # GFD appends -SHARED to the product when replicas keep the name nvidia.com/gpu
    assert mps["mps-h100-0"].gpu_model == "NVIDIA-H100-80GB-HBM3"
    assert (mps["mps-h100-0"].gpu_pool, mps["mps-h100-0"].gpu_replicas) == ("", 2)
    hami = {n.name: n for n in snapshot_from_dump(load("hami.json")).nodes}
    # no GFD on these nodes: the model is HAMi's device type
    assert hami["hami-a100-0"].gpu_model == "NVIDIA-A100-SXM4-80GB"
    assert hami["hami-a10-1"].gpu_model == "NVIDIA-A10"
    assert (hami["hami-a100-0"].gpu_pool, hami["hami-a100-0"].gpu_memory_mib) == ("hami", 81920)


def test_derived_workload_keeps_pools(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --workload, M comes from the pods: replicas stay replicas of their pool."""
    shapes = {(s.gpus, s.gpu_milli, s.gpu_pool) for s in pod_shapes(load("time-slicing.json"))}
    assert shapes == {
        (1, 0, "nvidia.com/gpu.shared"),
        (2, 0, "nvidia.com/gpu.shared"),
        (1, 1000, ""),
    }
    # a pod asking nvidia.com/gpu on a node that replicates it holds a replica
    assert {(s.gpus, s.gpu_milli) for s in pod_shapes(load("mps.json"))} == {(1, 0), (2, 1000)}
    hami = {
        (s.gpus, s.gpu_milli, s.gpu_memory_mib, s.gpu_pool) for s in pod_shapes(load("hami.json"))
    }
    assert hami == {
        (1, 300, 20000, "hami"),
        (1, 1, 49152, "hami"),
        (1, 100, 10000, "hami"),
        (1, 400, 16000, "hami"),  # rag: two containers on one GPU, collapsed
        (1, 1, 12000, "hami"),
    }
    out = score_json(capsys, "hami.json", None)
    assert out["cluster"]["idle_gpu_milli"] == 1133


# ---- the readers -------------------------------------------------------------------------------


def test_hami_registration_formats() -> None:
    legacy = (
        "GPU-a,10,23028,100,NVIDIA-NVIDIA A10,1,true,3,hami-core:"
        "GPU-b,10,23028,100,NVIDIA-NVIDIA A10,0,false:"
    )
    a, b = hami_devices(legacy)
    assert a == HamiDevice("GPU-a", 3, 10, 23028, 100, "NVIDIA-NVIDIA A10", 1, True, "hami-core")
    assert (b.healthy, b.index, b.mode) == (False, 0, "hami-core")
    # JSON (v2.8+) leaves out zero and false fields: no "health" is unhealthy
    (c, d) = hami_devices(
        '[{"id":"GPU-c","count":10,"devmem":81920,"devcore":100,"type":"NVIDIA A100",'
        '"health":true},'
        '{"id":"GPU-d","index":1,"count":10,"devmem":81920,"devcore":100,"numa":1,"mode":"mps"}]'
    )
    assert (c.index, c.numa, c.healthy, c.mode) == (0, 0, True, "hami-core")
    assert (d.index, d.numa, d.healthy, d.mode) == (1, 1, False, "mps")


def test_unhealthy_hami_devices_are_left_out() -> None:
    node = NodeRecord(
        "n",
        cpu_milli=8000,
        sharing=NodeSharing(
            hami=(
                HamiDevice("GPU-a", 0, 10, 1000, 100, "NVIDIA A10", 0, True, "hami-core"),
                HamiDevice("GPU-b", 1, 10, 1000, 100, "NVIDIA A10", 0, False, "hami-core"),
            )
        ),
    )
    m = node_from_records(node, None, [])
    assert [g.id for z in m.zones for g in z.gpus] == [0]
    assert m.sharing == "hami, exact; 1 unhealthy or MIG-mode devices left out"


def test_hami_allocation_collapses_containers_as_hami_does() -> None:
    # one init container (peak), two app containers on the same device (summed, two tasks)
    raw = "GPU-a,NVIDIA,30000,50:;GPU-a,NVIDIA,8000,20:;GPU-a,NVIDIA,8000,20:GPU-b,NVIDIA,100,0:;"
    assert hami_allocation(raw, init_containers=1) == (
        HamiShare("GPU-a", 30000, 50, 2),
        HamiShare("GPU-b", 100, 0, 1),
    )
    # older HAMi wrote app containers only: then nothing is an init entry
    assert hami_allocation("GPU-a,NVIDIA,8000,20:;", init_containers=1) == (
        HamiShare("GPU-a", 8000, 20, 1),
    )


def _pod(name: str, node: str, created: float, **kw: Any) -> PodRecord:
    return PodRecord("ns", name, node=node, phase="Running", created=created, cpu_milli=1000, **kw)


def test_replicas_are_attributed_as_the_distributed_policy() -> None:
    """3 GPUs, 2 replicas each, not renamed; a 3-replica pod spreads over the three GPUs, the
    next pods go to the GPUs with the fewest, and a replica beyond 2 x 3 is reported."""
    node = NodeRecord(
        "n", cpu_milli=32000, gpus=6, gpu_count_label=3, sharing=NodeSharing("time-slicing", 2)
    )
    pods = [
        _pod("a", "n", 1.0, gpus=3),
        _pod("b", "n", 2.0, gpus=1),
        _pod("c", "n", 3.0, gpus=1),
        _pod("d", "n", 4.0, gpus=2),
    ]
    m = node_from_records(node, None, pods)
    gpus = [g for z in m.zones for g in z.gpus]
    assert [(g.used_milli, dict(g.holders)) for g in gpus] == [
        (1000, {"ns/a": 500, "ns/b": 500}),
        (1000, {"ns/a": 500, "ns/c": 500}),
        (1000, {"ns/a": 500, "ns/d": 500}),
    ]
    assert (
        m.sharing
        == "time-slicing x2 (nvidia.com/gpu), attributed; 1 replicas asked for beyond the 2 per GPU"
    )
    where = attribute_pods(m, pods)
    assert where["ns/a"]["gpus"] == [(0, 0, 500), (0, 1, 500), (0, 2, 500)]
    assert where["ns/d"]["gpus"] == [(0, 2, 500)]


def test_replicas_follow_the_topology_managers_alignment() -> None:
    """single-numa-node: the kubelet hands the plugin the replicas of the lowest NUMA zone with
    enough free; a 3-replica request that no single zone holds spans both."""
    node = NodeRecord(
        "n",
        cpu_milli=32000,
        gpu_count_label=4,
        gpu_numa=((0, 0), (1, 0), (2, 1), (3, 1)),
        topology_policy="single-numa-node",
        sharing=NodeSharing("time-slicing", 2, shared=8),
    )

    def shared(name: str, t: float, k: int) -> PodRecord:
        return _pod(name, "n", t, sharing=PodSharing(shared=k))

    pods = [shared("a", 1, 2), shared("b", 2, 1), shared("c", 3, 1), shared("d", 4, 3)]
    m = node_from_records(node, None, pods)
    used = [[dict(g.holders) for g in z.gpus] for z in m.zones]
    # a: zone 0, GPUs 0 and 1; b, c: zone 0 is full after one more -> b GPU 0, c zone 1 (GPU 2)
    # d: 3 replicas: no zone has 3 free (zone 0: 0, zone 1: 3 -> yes, zone 1)
    assert used == [
        [{"ns/a": 500, "ns/b": 500}, {"ns/a": 500, "ns/c": 500}],
        [{"ns/d": 1000}, {"ns/d": 500}],
    ]


def test_pod_shapes() -> None:
    ts_node = NodeRecord("n", gpus=8, gpu_count_label=4, sharing=NodeSharing("time-slicing", 2))
    plain = _pod("p", "n", 0, gpus=1)
    assert pod_shape(plain, ts_node) == Shape(1000, 0, 1, 0)
    assert pod_shape(plain) == Shape(1000, 0, 1, 1000)  # pending: node unknown, whole GPU
    shared = _pod("s", "", 0, sharing=PodSharing(shared=1))
    assert pod_shape(shared) == Shape(1000, 0, 1, 0, gpu_pool="nvidia.com/gpu.shared")
    pending_hami = _pod(
        "h", "", 0, gpus=2, sharing=PodSharing(hami=True, memory_mib=8000, cores=25)
    )
    assert pod_shape(pending_hami) == Shape(1000, 0, 2, 250, gpu_pool="hami", gpu_memory_mib=8000)
    percent = _pod("h", "", 0, gpus=1, sharing=PodSharing(hami=True, memory_percent=30))
    assert pod_shape(percent) == Shape(1000, 0, 1, 300, gpu_pool="hami")
    default = _pod("h", "", 0, gpus=1, sharing=PodSharing(hami=True))
    assert pod_shape(default) == Shape(1000, 0, 1, 1000, gpu_pool="hami")


# ---- placement and compaction keep pods in their pool -------------------------------------------


def test_extender_filters_nodes_of_another_pool() -> None:
    nodes, pods, _, _ = records(load("time-slicing.json"))
    by_node: dict[str, list[PodRecord]] = {}
    for p in pods:
        by_node.setdefault(p.node, []).append(p)
    models = {n.name: node_from_records(n, None, by_node.get(n.name, [])) for n in nodes}
    w = Workload((Shape(2000, 0, 1, 0, gpu_pool="nvidia.com/gpu.shared"),))
    adv = PlacementAdvisor(models, lambda: w)
    pending = PodRecord("serving", "new", cpu_milli=2000, sharing=PodSharing(shared=1))
    failed = adv.filter(pending, ("ts-a10g-0", "ts-t4-0", "gpu-l40s-0"))
    assert failed == {
        "gpu-l40s-0": "pyctl: the pod asks for GPUs of nvidia.com/gpu.shared, the node shares "
        "its GPUs as nvidia.com/gpu"
    }
    whole = PodRecord("serving", "big", cpu_milli=2000, gpus=1)
    assert set(adv.filter(whole, ("ts-a10g-0", "ts-t4-0", "gpu-l40s-0"))) == {
        "ts-a10g-0",
        "ts-t4-0",
    }
    scores = adv.prioritize(pending, ("ts-a10g-0", "ts-t4-0", "gpu-l40s-0"))
    assert scores["gpu-l40s-0"] == 0
    assert scores["ts-a10g-0"] > 0


def test_compaction_moves_a_shared_pod_only_within_its_pool() -> None:
    """Two HAMi nodes, one A100-80GB each, holding half a GPU each (40960 MiB); M wants 60 % of
    a GPU: neither GPU has room (lack_gpu 2 x 500). Moving one half onto the other node's GPU
    frees a whole GPU: gain 1000. An exclusive node with a free GPU would gain as much by the
    numbers, but a HAMi pod cannot go there (its pool is not HAMi's)."""

    def hami_node(name: str) -> NodeRecord:
        dev = HamiDevice(
            f"GPU-{name}", 0, 10, 81920, 100, "NVIDIA A100-SXM4-80GB", 0, True, "hami-core"
        )
        return NodeRecord(
            name, cpu_milli=32000, memory_mib=65536, gpus=10, sharing=NodeSharing(hami=(dev,))
        )

    def hami_pod(name: str, node: str, t: float) -> PodRecord:
        return PodRecord(
            "ns",
            name,
            f"u-{name}",
            node=node,
            phase="Running",
            cpu_milli=1000,
            gpus=1,
            owner_kind="ReplicaSet",
            owner_name="r",
            created=t,
            sharing=PodSharing(
                hami=True, memory_percent=50, devices=(HamiShare(f"GPU-{node}", 40960, 0),)
            ),
        )

    nodes = {
        "h-0": hami_node("h-0"),
        "h-1": hami_node("h-1"),
        "x-0": NodeRecord(
            "x-0", gpu_model="NVIDIA-A100-SXM4-80GB", cpu_milli=32000, memory_mib=65536, gpus=1
        ),
    }
    pods = [hami_pod("a", "h-0", 1.0), hami_pod("b", "h-1", 2.0)]
    w = Workload((Shape(1000, 0, 1, 600, gpu_pool="hami"),))
    models = models_of(nodes.values(), [], pods)
    plan = plan_compaction(models, nodes, pods, [], w, limits=PlanLimits(max_moves=3))
    assert [(m.pod, m.from_node, m.to_node, m.gain_gpu_milli) for m in plan.moves] == [
        ("ns/a", "h-0", "h-1", 1000.0)
    ]
    assert plan.moves[0].assignment["gpus"] == [(0, 0, 500)]
    model = FragmentationModel(Snapshot((node_from_records(nodes["x-0"], None, []),)))
    assert model.place_delta("x-0", pod_shape(pods[0], nodes["h-0"]), w) is None


# ---- hostile input ------------------------------------------------------------------------------


def _node_obj(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": "bad", "labels": labels, "annotations": annotations or {}},
        "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}},
    }


@pytest.mark.parametrize(
    ("labels", "annotations", "message"),
    [
        (
            {"nvidia.com/gpu.replicas": "four"},
            None,
            "label nvidia.com/gpu.replicas: expected an integer",
        ),
        ({"nvidia.com/gpu.replicas": "99999"}, None, "99999 is outside 0..1000"),
        ({"nvidia.com/gpu.sharing-strategy": "magic"}, None, "unknown strategy 'magic'"),
        ({}, {"hami.io/node-nvidia-register": "[{"}, "broken JSON"),
        ({}, {"hami.io/node-nvidia-register": "garbage"}, "neither JSON nor"),
        (
            {},
            {"hami.io/node-nvidia-register": '[{"id": "GPU-a", "devmem": -5}]'},
            "devmem: -5 is outside",
        ),
        (
            {},
            {"hami.io/node-nvidia-register": "GPU-a,10,x,100,T,0,true:"},
            "[0].devmem: expected an integer",
        ),
        ({}, {"hami.io/node-nvidia-register": "GPU-a,10:"}, "expected 7 or 9 fields"),
        ({}, {"hami.io/node-nvidia-register": "G,1,1,1,T,0,true:" * 65}, "more than 64 devices"),
        ({}, {"hami.io/node-nvidia-register": "x" * 70000}, "longer than 65536"),
    ],
)
def test_bad_node_sharing_is_a_one_line_decode_error(
    labels: dict[str, str], annotations: dict[str, str] | None, message: str
) -> None:
    with pytest.raises(DecodeError, match=r"^node bad: .*") as e:
        decode_object("Node", _node_obj(labels, annotations))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        ("GPU-a,NVIDIA,lots,0:;", "usedmem: expected an integer"),
        ("GPU-a,NVIDIA:;", "expected uuid,type,usedmem,usedcores"),
        ("GPU-a,NVIDIA,1,99999:;", "usedcores: 99999 is outside"),
        (",NVIDIA,1,1:;", "bad device id"),
        ("GPU-a,NVIDIA,1,1:" * 65, "more than 64 devices"),
    ],
)
def test_bad_hami_allocation_is_a_one_line_decode_error(annotation: str, message: str) -> None:
    obj = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "annotations": {"hami.io/vgpu-devices-allocated": annotation},
        },
        "spec": {
            "nodeName": "n",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
    }
    with pytest.raises(DecodeError, match=r"^pod ns/p: ") as e:
        decode_object("Pod", obj)
    assert message in str(e.value)


def test_a_bad_object_in_a_dump_is_left_out_naming_its_item() -> None:
    bad = copy.deepcopy(load("hami.json"))
    bad["items"][0]["metadata"]["annotations"]["hami.io/node-nvidia-register"] = "[{]"
    listed = read_dump(bad)
    (lo,) = listed.left_out
    assert (lo.kind, lo.reason, lo.ref and lo.ref.key) == ("Node", "malformed", "hami-a100-0")
    assert re.match(
        r"^items\[0\]: node hami-a100-0: annotation hami.io/node-nvidia-register: broken",
        lo.message,
    )
    good = {n.name for n in snapshot_from_dump(load("hami.json")).nodes}
    assert {n.name for n in snapshot_from_dump(bad).nodes} == good - {"hami-a100-0"}


def test_replicas_beyond_the_core_limit_are_refused_by_the_reader() -> None:
    """The core takes at most 1000 replicas per GPU (a replica is at least 1 milli)."""
    with pytest.raises(DecodeError, match=r"1001 is outside 0\.\.1000"):
        decode_object("Node", _node_obj({"nvidia.com/gpu.replicas": "1001"}))
    node = decode_object(
        "Node", _node_obj({"nvidia.com/gpu.replicas": "1000", "nvidia.com/gpu.count": "1"})
    )
    assert isinstance(node, NodeRecord)
    pl = sharing.plan(node)
    assert pl is not None
    assert pl.unit == 1


def test_followed_live_replicas_stay_where_the_device_plugin_put_them() -> None:
    """4 GPUs x 4 replicas: a, b, c, d, e go to GPUs 0, 1, 2, 3, 0. b leaves and f comes: the
    device plugin gives f GPU 1 (fewest allocated). With the node's previous layout pyctl keeps
    a, c, d, e where they were and puts f on GPU 1 too; from the pods alone (a dump) it replays
    a, c, d, e, f in creation order: a 0, c 1, d 2, e 3, f 0."""
    node = NodeRecord(
        "n", cpu_milli=32000, gpu_count_label=4, sharing=NodeSharing("time-slicing", 4, shared=16)
    )

    def shared(name: str, t: float) -> PodRecord:
        return _pod(name, "n", t, sharing=PodSharing(shared=1))

    first = [shared(x, i) for i, x in enumerate("abcde")]
    before = node_from_records(node, None, first)
    assert [dict(g.holders) for z in before.zones for g in z.gpus] == [
        {"ns/a": 250, "ns/e": 250},
        {"ns/b": 250},
        {"ns/c": 250},
        {"ns/d": 250},
    ]
    now = [p for p in first if p.name != "b"] + [shared("f", 9)]
    live = node_from_records(node, None, now, previous=before)
    assert [dict(g.holders) for z in live.zones for g in z.gpus] == [
        {"ns/a": 250, "ns/e": 250},
        {"ns/f": 250},
        {"ns/c": 250},
        {"ns/d": 250},
    ]
    replayed = node_from_records(node, None, now)
    assert [dict(g.holders) for z in replayed.zones for g in z.gpus] == [
        {"ns/a": 250, "ns/f": 250},
        {"ns/c": 250},
        {"ns/d": 250},
        {"ns/e": 250},
    ]


def test_shared_nodes_round_trip_through_the_snapshot_format() -> None:
    """pyctl's snapshot format (and the federation summary built on it) keeps pools, replicas,
    GPU memory and holders; the score is the same from either."""
    from pyctl.snapshot import load_snapshot, load_workload, snapshot_to_json

    for name in ("time-slicing", "mps", "hami"):
        snap = snapshot_from_dump(load(f"{name}.json"))
        back = load_snapshot(json.loads(json.dumps(snapshot_to_json(snap))))
        assert back == snap
        w = load_workload(load(f"{name}-workload.json"))
        a = FragmentationModel(snap).score(w).to_json()
        b = FragmentationModel(back).score(w).to_json()
        assert a == b


def test_holders_cannot_add_up_to_more_than_the_used_share() -> None:
    from pyctl.snapshot import SnapshotError, load_snapshot

    bad: dict[str, Any] = {
        "nodes": [
            {
                "name": "n",
                "gpu_pool": "hami",
                "zones": [
                    {"numa": 0, "gpus": [{"id": 0, "used_milli": 300, "pods": {"a/b": 400}}]}
                ],
            }
        ]
    }
    with pytest.raises(SnapshotError, match=r"gpus\[id=0\]\.pods: the pods' shares add up"):
        load_snapshot(bad)
    bad["nodes"][0]["zones"][0]["gpus"][0]["pods"] = {"a/b": 300}
    assert load_snapshot(bad).nodes[0].zones[0].gpus[0].holders == (("a/b", 300),)
    bad["nodes"][0]["gpu_replicas"] = 0
    with pytest.raises(SnapshotError, match=r"gpu_replicas: 0 is outside 1\.\.1000"):
        load_snapshot(bad)
