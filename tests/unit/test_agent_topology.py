"""The node annotation `pyctl.io/node-topology`: the agent writes it from its view, the
controller's decode reads it with bounds and isolation, and translate uses the agent's exact
attribution where the agent speaks and today's rules where it does not, saying which per node.
The hand-worked case: 8 GPUs on two NUMA nodes (0-3, 4-7), single-numa-node, two 1-GPU pods the
kubelet put on GPU 0 and GPU 4, the workload one 4-GPU shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.publish import annotation
from pyctl.agent.view import read_node, view_json
from pyctl.cli.main import main
from pyctl.cluster import agent_topology as at
from pyctl.cluster.kube.decode import decode_watch_line
from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.cluster.translate import attribute_pods, node_from_records
from pyctl.core.fragmentation import score
from pyctl.model import Shape, Snapshot, Workload

from . import agent_boards as boards

UUIDS = [f"GPU-{i}" for i in range(8)]


def _value(pods: dict[str, list[int]] | None, numa: list[int] | None = None) -> str:
    numa = numa if numa is not None else [0, 0, 0, 0, 1, 1, 1, 1]
    return at.encode([(u, n, None) for u, n in zip(UUIDS, numa, strict=True)], [], pods, 0)


def test_round_trip() -> None:
    v = at.encode(
        [("GPU-a", 0, "c0ffee.3"), ("GPU-b", None, None)], [[0, 1]], {"ns/p": [1, 0, 1]}, 2
    )
    got = at.decode(v)
    assert got.gpus == (at.AgentGpu("GPU-a", 0, "c0ffee.3"), at.AgentGpu("GPU-b", -1, ""))
    assert got.nvlink == ((0, 1),)
    assert got.pods == (("ns/p", (0, 1)),)
    assert got.catalog_disagreements == 2
    assert got.numa_of() == {0: 0}
    assert json.loads(v)["v"] == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{", "not JSON"),
        ('{"v": 2, "gpus": []}', "version 2 is not 1"),
        ("[1]", "version None"),
        ('{"v": 1, "gpus": [{"u": "a", "n": 5000}]}', "<= 1023"),
        ('{"v": 1, "gpus": [{"u": "a"}], "nvlink": [[0, 1]]}', "beyond the 1 listed"),
        ('{"v": 1, "gpus": [{"u": "a"}], "pods": {"ns/p": [3]}}', "beyond the 1 listed"),
        ('{"v": 1, "gpus": [{"u": ""}]}', "length >= 1"),
        ('{"v": 1, "gpus": "x"}', "Expected `array`"),
        ('{"v": 1, "gpus": [{"u": "' + "x" * 40000 + '"}]}', "larger than 32768 bytes"),
    ],
)
def test_hostile_annotations_are_errors_naming_why(value: str, message: str) -> None:
    with pytest.raises(at.AgentTopologyError, match=message.replace("[", r"\[")):
        at.decode(value)


def test_pods_that_do_not_fit_are_left_out() -> None:
    pods = {f"ns/pod-{i:05d}-{'x' * 200}": [0] for i in range(200)}
    v = at.encode([("GPU-a", 0, None)], [], pods, 0)
    assert len(v) <= at.MAX_ANNOTATION_BYTES
    assert at.decode(v).pods is None  # as not read: the controller's rules apply


def _node(annotations: dict[str, str]) -> NodeRecord:
    obj = {
        "kind": "Node",
        "metadata": {"name": "g1", "resourceVersion": "1", "annotations": annotations,
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H200",
                                **{f"nvidia.com/gpu-{i}-numa": str(i // 4) for i in range(8)}}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}},
    }  # fmt: skip
    _, rec, _ = decode_watch_line("Node", json.dumps({"type": "ADDED", "object": obj}).encode())
    assert isinstance(rec, NodeRecord)
    return rec


def test_decode_reads_the_annotation_and_isolates_a_bad_one() -> None:
    plain = _node({})
    good = _node({at.ANNOTATION: _value({"ns/a": [0]})})
    bad = _node({at.ANNOTATION: '{"v": 1, "gpus": [{"u": "a", "n": -7}]}'})
    assert plain.agent is None
    assert plain.agent_error == ""
    assert good.agent is not None
    assert good.agent.pods == (("ns/a", (0,)),)
    assert bad.agent is None
    assert bad.agent_error.startswith("pyctl.io/node-topology: ")
    assert ">= -1" in bad.agent_error
    # the bad annotation changes nothing else on the node
    assert bad.__struct_fields__ == plain.__struct_fields__
    for f in plain.__struct_fields__:
        if f != "agent_error":
            assert getattr(bad, f) == getattr(plain, f), f


PODS = [
    PodRecord("ns", "a", node="g1", cpu_milli=1000, memory_mib=1024, gpus=1),
    PodRecord("ns", "b", node="g1", cpu_milli=1000, memory_mib=1024, gpus=1),
]
M = Workload((Shape(cpu_milli=1000, memory_mib=1024, gpus=4),))


def _score(rec: NodeRecord) -> tuple[dict[str, Any], Any]:
    node = node_from_records(rec, None, PODS, "single-numa-node")
    result = score(Snapshot((node,)), M).to_json()["nodes"][0]
    return result, node


def test_the_agent_changes_the_score_as_worked_by_hand() -> None:
    # rules: the two used GPUs are handed out in order, both in zone 0 (2 free there, 4 in
    # zone 1): the 4-GPU shape fits in zone 1, zone 0's 2 free GPUs are the fragment
    rules, rules_node = _score(_node({}))
    assert [z["idle_gpu_milli"] for z in rules["zones"]] == [2000, 4000]
    assert rules["fragment_gpu_milli"] == 2000
    assert "gpu_source" not in rules
    # exact: the kubelet put them on GPU 0 and GPU 4, one in each zone: 3 free in each, the
    # 4-GPU shape fits nowhere under single-numa-node: all 6 idle GPUs are fragment
    rec = _node({at.ANNOTATION: _value({"ns/a": [0], "ns/b": [4], "other/gone": [5]})})
    exact, node = _score(rec)
    assert [z["idle_gpu_milli"] for z in exact["zones"]] == [3000, 3000]
    assert exact["fragment_gpu_milli"] == 6000
    assert exact["gpu_source"].startswith("agent (exact")
    # and each pod sits on its own GPU: zone 0 GPU id 0, zone 1 GPU id 4
    where = attribute_pods(node, PODS)
    held = {
        k: [node.zones[z].gpus[g].id for z, g, _ in cast(list[tuple[int, int, int]], v["gpus"])]
        for k, v in where.items()
    }
    assert held == {"ns/a": [0], "ns/b": [4]}
    assert [g.id for g in rules_node.zones[0].gpus] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("pods", "why"),
    [
        (None, "the agent did not read the kubelet's PodResources"),
        ({"ns/a": [0]}, "the agent's attribution (1 GPUs) and the pods bound (2 GPUs) disagree"),
        ({"ns/a": [0, 1], "ns/b": [4]}, "disagree"),
    ],
)
def test_where_the_agent_cannot_be_used_the_rules_apply_and_say_why(
    pods: dict[str, list[int]] | None, why: str
) -> None:
    got, _ = _score(_node({at.ANNOTATION: _value(pods)}))
    assert [z["idle_gpu_milli"] for z in got["zones"]] == [2000, 4000]
    assert got["gpu_source"].startswith("rules (")
    assert why in got["gpu_source"]


def test_a_bad_annotation_is_shown_and_the_rules_apply() -> None:
    got, _ = _score(_node({at.ANNOTATION: "{"}))
    assert [z["idle_gpu_milli"] for z in got["zones"]] == [2000, 4000]
    assert got["gpu_source"].startswith("rules (the agent's annotation is left out: ")


def test_the_agents_numa_where_the_labels_say_nothing() -> None:
    rec = _node({at.ANNOTATION: _value({"ns/a": [0], "ns/b": [4]})})
    rec = NodeRecord(**{f: getattr(rec, f) for f in rec.__struct_fields__ if f != "gpu_numa"})
    got, _ = _score(rec)
    assert [z["numa"] for z in got["zones"]] == [0, 1]
    assert got["fragment_gpu_milli"] == 6000


def test_the_published_annotation_from_the_agents_view(tmp_path: Any) -> None:
    b = boards.nvlink_pairs()
    root = boards.sysfs(tmp_path / "sys", b, [0, 0, 0, 0, 1, 1, 1, 1])
    doc = view_json(read_node(FixtureNvml(b), root), "g1")
    uuid = b["devices"]
    doc["pod_resources"] = {
        "containers": [
            {"namespace": "ns", "pod": "a", "container": "c",
             "devices": [{"gpu_index": 0, "mig_profile_id": None},
                         {"gpu_index": 1, "mig_profile_id": None}]},
            {"namespace": "ns", "pod": "m", "container": "c",
             "devices": [{"gpu_index": 3, "mig_profile_id": 9}]},
        ]
    }  # fmt: skip
    got = at.decode(annotation(doc))
    assert [g.uuid for g in got.gpus] == [d["uuid"] for d in uuid]
    assert got.numa_of() == {i: i // 4 for i in range(8)}
    assert got.nvlink == ((0, 1), (2, 3), (4, 5), (6, 7))
    # a MIG instance is not a whole GPU: not in the GPU attribution
    assert got.pods == (("ns/a", (0, 1)),)


@pytest.mark.parametrize(
    "doc",
    [
        {"gpus": {}},
        {"gpus": [{"uuid": "u", "numa": {"node": "0"}, "index": 0}]},
        {"gpus": [{"uuid": "u", "numa": [], "index": 0}]},
        {"gpus": [{"uuid": "u", "numa": {"node": 0}, "index": 0, "clique": 1}]},
        {"gpus": [], "nvlink_groups": [[0, 1]], "catalog_disagreements": "2"},
    ],
)
def test_a_document_that_is_not_the_agents_view_is_refused(doc: Any) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each says its own field)
        annotation(doc)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries(
        {"v": st.sampled_from([1, 1, 1, 2, "1", None])},
        optional={"gpus": _json, "nvlink": _json, "pods": _json, "cd": _json},
    )
    | _json
)
def test_any_json_is_a_topology_or_a_clear_error(value: Any) -> None:
    try:
        got = at.decode(json.dumps(value))
    except at.AgentTopologyError as e:
        message = str(e)
        got = None
    if got is None:
        assert message
        return
    for g in got.gpus:
        assert -1 <= g.numa <= 1023
    for _, held in got.pods or ():
        assert all(0 <= i < len(got.gpus) for i in held)


def test_pyctl_score_shows_the_source_and_the_catalog_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pyctl score` of a `kubectl get nodes,pods -o json` dump with an annotated node."""
    value = at.encode(
        [(u, i // 4, None) for i, u in enumerate(UUIDS)], [], {"ns/a": [0], "ns/b": [4]}, 2
    )
    labels = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    items: list[dict[str, Any]] = [
        {
            "kind": "Node",
            "metadata": {"name": "g1", "labels": labels, "annotations": {at.ANNOTATION: value}},
            "status": {"capacity": alloc, "allocatable": alloc},
        },
        *(
            {
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {
                    "nodeName": "g1",
                    "containers": [
                        {
                            "name": "c",
                            "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}},
                        }
                    ],
                },
                "status": {"phase": "Running"},
            }
            for name in ("a", "b")
        ),
    ]
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["score", str(f), "--json"]) == 0
    [n] = json.loads(capsys.readouterr().out)["nodes"]
    assert n["gpu_source"] == (
        "agent (exact: the kubelet's PodResources and sysfs NUMA); "
        "the agent found 2 MIG catalog disagreement(s), the device wins"
    )
    assert [z["numa"] for z in n["zones"]] == [0, 1]
    assert main(["score", str(f)]) == 0
    assert "g1: GPUs attributed by agent (exact" in capsys.readouterr().out
