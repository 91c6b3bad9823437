"""The RDMA resource (`reflector_rdma_resource`): a node's allocatable and its pods' requests of the
extended resource that meters RDMA, read into the records, carried by the model as a node-level
resource and honoured by the score, the placement and the compaction plan, on the controller's
one path in (a dump read by `pyctl score` / `pyctl plan` is read as the reflector reads objects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from pyctl.app.config import ConfigError, load_config
from pyctl.cli.inputs import cluster_view, listed_of
from pyctl.cli.main import main
from pyctl.cluster.kube.decode import DecodeError, decode_object, decode_watch_line
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.cluster.translate import attribute_pods, node_from_records, pod_shape
from pyctl.controller.placement import PlacementAdvisor
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.policy import rank
from pyctl.model import Shape, Snapshot, Workload
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_process import ExtenderProcess, Publisher
from pyctl.serve.extender_server import ExtenderOptions, HttpMetrics
from tests.unit.test_cli_plan import _nrt
from tests.unit.test_cli_plan import _pod as _plain_pod

RDMA = "rdma/hca_shared_devices_a"


def _node(name: str, rdma: int | str | None = None) -> dict[str, Any]:
    alloc: dict[str, Any] = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    if rdma is not None:
        alloc[RDMA] = rdma
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": alloc},
    }


def _pod(name: str, node: str | None, gpus: int = 1, rdma: int = 0) -> dict[str, Any]:
    """test_cli_plan's pod, with `rdma` of the resource as a limit only (its request equals it,
    as for any extended resource)."""
    pod = _plain_pod(name, node, gpus)
    if rdma:
        pod["spec"]["containers"][0]["resources"]["limits"] = {RDMA: str(rdma)}
    return pod


# -- reading ---------------------------------------------------------------------------------------


def test_records_carry_the_named_resource_only_when_told_its_name() -> None:
    node = decode_object("Node", _node("a", "400"), RDMA)
    pod = decode_object("Pod", _pod("p", "a", rdma=150), RDMA)
    assert isinstance(node, NodeRecord)
    assert isinstance(pod, PodRecord)
    assert (node.rdma, pod.rdma) == (400, 150)
    # not told: the resource is not read (the records are what they were)
    assert decode_object("Node", _node("a", "400")) == decode_object("Node", _node("a"))
    plain = decode_object("Pod", _pod("p", "a", rdma=150))
    assert isinstance(plain, PodRecord)
    assert plain.rdma == 0
    # another name: nothing of this one
    other = decode_object("Node", _node("a", "400"), "example.com/rdma")
    assert isinstance(other, NodeRecord)
    assert other.rdma == 0
    # a watch line reads it the same way
    line = json.dumps({"type": "ADDED", "object": _pod("p", "a", rdma=150)}).encode()
    _, rec, _ = decode_watch_line("Pod", line, RDMA)
    assert rec == pod


@pytest.mark.parametrize(
    ("obj", "reason", "says"),
    [
        (_node("a", "1.5"), "bad_quantity", "whole number"),
        (_node("a", "lots"), "bad_quantity", RDMA),
        (_node("a", "-4"), "out_of_bounds", "RDMA resource"),
        (_node("a", str(2**41)), "out_of_bounds", "RDMA resource"),
    ],
)
def test_a_node_with_an_unreadable_amount_is_refused_with_its_reason(
    obj: dict[str, Any], reason: str, says: str
) -> None:
    with pytest.raises(DecodeError) as e:
        decode_object("Node", obj, RDMA)
    assert e.value.reason == reason
    assert says in str(e.value)


def test_a_pod_with_an_unreadable_request_is_refused() -> None:
    pod = _pod("p", "a")
    pod["spec"]["containers"][0]["resources"]["limits"] = {RDMA: "-3"}
    with pytest.raises(DecodeError) as e:
        decode_object("Pod", pod, RDMA)
    assert e.value.reason == "out_of_bounds"
    assert "RDMA request" in str(e.value)


@pytest.mark.parametrize(
    "name",
    ["rdma", "nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "kubernetes.io/rdma", "Rdma/hca", "a/b/c"],
)
def test_only_an_extended_resource_can_be_named(name: str) -> None:
    with pytest.raises(ValueError, match="not an extended resource name"):
        ReflectorOptions(rdma_resource=name)
    with pytest.raises(ConfigError, match="rdma_resource"):
        load_config(None, {"PYCTL_REFLECTOR_RDMA_RESOURCE": name})


def test_the_setting_reaches_the_reflectors() -> None:
    cfg = load_config(None, {"PYCTL_REFLECTOR_RDMA_RESOURCE": RDMA})
    assert cfg.reflector.rdma_resource == RDMA
    assert load_config(None, {}).reflector.rdma_resource == ""


# -- the model -------------------------------------------------------------------------------------


def _running(name: str, node: str, rdma: int) -> PodRecord:
    return PodRecord("serving", name, node=node, phase="Running", cpu_milli=1000, gpus=1, rdma=rdma)


def test_the_node_model_holds_what_the_pods_request() -> None:
    rec = NodeRecord("a", cpu_milli=64000, memory_mib=1 << 19, gpus=8, rdma=400)
    pods = [_running("p0", "a", 150), _running("p1", "a", 100), _running("p2", "a", 0)]
    node = node_from_records(rec, None, pods)
    assert (node.rdma, node.rdma_used) == (400, 250)
    where = attribute_pods(node, pods)
    assert [where[f"serving/p{i}"].get("rdma", 0) for i in range(3)] == [150, 100, 0]
    # a device plugin that restarted publishes less than its pods hold: none is free, and the
    # pods are attributed what there is
    small = node_from_records(NodeRecord("a", cpu_milli=64000, gpus=8, rdma=200), None, pods)
    assert (small.rdma, small.rdma_used) == (200, 200)
    assert sum(a.get("rdma", 0) for a in attribute_pods(small, pods).values()) == 200
    # the pod's shape asks for it
    assert pod_shape(pods[0]).rdma == 150
    assert pod_shape(pods[2]).rdma == 0


def test_a_node_short_of_rdma_strands_its_idle_gpus_for_shapes_that_need_it() -> None:
    pods = [_running(f"p{i}", "a", 100) for i in range(4)]
    full = node_from_records(NodeRecord("a", cpu_milli=64000, gpus=8, rdma=400), None, pods)
    roomy = node_from_records(NodeRecord("b", cpu_milli=64000, gpus=8, rdma=800), None, pods)
    needs = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=100),))
    plain = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000),))
    for node, workload, stranded in [
        (full, needs, 4000.0),  # 4 idle GPUs, no RDMA left for any of them
        (roomy, needs, 0.0),
        (full, plain, 0.0),  # a shape without RDMA uses them
    ]:
        (score,) = FragmentationModel(Snapshot((node,))).score(workload).nodes
        assert score.idle_gpu_milli == 4000.0
        assert score.fragment_gpu_milli == stranded
        assert score.categories["lack_cpu"] == stranded
    # the placement: a task that needs more than is free does not fit; one that does takes it
    model = FragmentationModel(Snapshot((full, roomy)))
    task = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=100)
    short, room = rank(model, task, needs)
    assert short is None
    assert room is not None
    assert room.assignment.get("rdma") == 100
    assert "RDMA" in room.explain(task)
    # taken and given back: the node's RDMA moves with the task
    model.core.apply(1, room.assignment, True)
    assert rank(model, Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=400), needs)[1] is None
    model.core.apply(1, room.assignment, False)
    assert rank(model, Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=400), needs)[1]


# -- the controller's path in: a dump read as the reflector reads it ------------------------------


def _dump(tmp_path: Path) -> Path:
    """Node a: one GPU used in each NUMA zone (by a0 and a1, 100 of RDMA each); node b: 4 of its
    8 GPUs used (3 in one zone) by pods that hold all of its RDMA; a 4-GPU pod pending
    (single-numa-node). Blind to RDMA, one of a's pods would move to b to free a zone of a: the
    real scheduler would not bind it there (b has none of the RDMA it asks for)."""
    items = [_node("a", "400"), _node("b", "400"), _nrt("a", (3, 3)), _nrt("b", (1, 3))]
    items += [_pod("a0", "a", rdma=100), _pod("a1", "a", rdma=100)]
    items += [_pod(f"b{i}", "b", rdma=100) for i in range(4)]
    items.append(_pod("big", None, gpus=4))
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    return f


def test_plan_moves_no_pod_to_a_node_without_its_rdma(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _dump(tmp_path)
    assert main(["plan", str(f), "--json"]) == 0
    blind = json.loads(capsys.readouterr().out)
    assert [(m["from"], m["to"]) for m in blind["moves"]] == [("a", "b")]
    assert main(["plan", str(f), "--json", "--rdma-resource", RDMA]) == 0
    told = json.loads(capsys.readouterr().out)
    # told: the rescue goes the other way, one of b's pods to a, which has the RDMA for it
    assert [(m["pod"], m["from"], m["to"]) for m in told["moves"]] == [("serving/b3", "b", "a")]
    (rescue,) = told["rescues"]
    assert (rescue["pending"], rescue["node"]) == ("serving/big", "b")


def test_score_counts_the_gpus_no_rdma_is_left_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = _dump(tmp_path)

    def lack(*extra: str) -> dict[str, float]:
        assert main(["score", str(f), "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        return {n["name"]: n["categories"]["lack_cpu"] for n in out["nodes"]}

    # M is derived from the pods: 1-GPU pods with 100 of RDMA (and the pending 4-GPU one)
    assert lack() == {"a": 0.0, "b": 0.0}
    told = lack("--rdma-resource", RDMA)
    assert told["a"] == 0.0  # a has 200 of RDMA free: its idle GPUs are usable
    assert told["b"] > 0.0  # b's 4 idle GPUs have no RDMA left for the 1-GPU shape


def test_a_bad_name_on_the_command_line_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(_dump(tmp_path)), "--rdma-resource", "nvidia.com/gpu"]) == 2
    assert "--rdma-resource" in capsys.readouterr().err


# -- the extender: the scheduler's pod read as the reflector reads it, in both processes ----------


@pytest.mark.anyio
async def test_the_extender_reads_the_schedulers_pod_with_its_rdma() -> None:
    """A pod that asks for 100 of RDMA, offered nodes a (200 free) and b (none free): the
    extender keeps a and removes b, in the controller's process and in its own (the child is
    told the resource's name when it starts); told nothing, it keeps both."""
    items = [_node("a", "400"), _node("b", "400")]
    items += [_pod("a0", "a", rdma=100), _pod("a1", "a", rdma=100)]
    items += [_pod(f"b{i}", "b", rdma=100) for i in range(4)]
    r = cluster_view(listed_of({"kind": "List", "items": items}, "dump", RDMA)).reconciler
    assert (r.models["a"].rdma_used, r.models["b"].rdma_used) == (200, 400)
    pod = _pod("one", None, rdma=100)
    body = json.dumps({"Pod": pod, "NodeNames": ["a", "b"]}).encode()

    def handler(rdma: str) -> ExtenderHandler:
        return ExtenderHandler(PlacementAdvisor.for_reconciler(r), rdma)

    def kept(answer: bytes) -> list[str]:
        got = json.loads(answer)
        assert not got["Error"], got
        return list(got["NodeNames"])

    assert kept(handler(RDMA).handle("filter", body)) == ["a"]
    assert kept(handler("").handle("filter", body)) == ["a", "b"]
    child = ExtenderProcess(
        Publisher(r, dict, dict),
        lambda: handler(RDMA),
        ExtenderOptions(port=0),
        HttpMetrics(CollectorRegistry(), "t"),
        rdma_resource=RDMA,
    )
    port = await child.start()
    try:
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}/scheduler/filter"
            async with s.post(url, data=body) as resp:
                assert resp.status == 200
                assert kept(await resp.read()) == ["a"]
        assert child.forwarded == 0  # answered by the child itself
    finally:
        await child.stop()
