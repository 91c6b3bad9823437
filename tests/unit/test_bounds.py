"""The bounds of pyctl.cluster.bounds at decode, on stored records and in translate: an object
beyond them is refused with its reason and its name (never a long loop, never a traceback), and
the objects around it are untouched."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import msgspec
import pytest

from pyctl.cluster import bounds
from pyctl.cluster.dra_records import (
    Attr,
    ClaimRecord,
    Device,
    DeviceClassRecord,
    PodClaim,
    SliceRecord,
)
from pyctl.cluster.kube.decode import DecodeError, decode_object, decode_watch_line
from pyctl.cluster.records import (
    Constraints,
    Kind,
    NodeRecord,
    NodeTerm,
    NrtRecord,
    ObjectRef,
    PdbRecord,
    PodRecord,
    Requirement,
    Spread,
    Taint,
    Toleration,
    ZoneRecord,
    check_record,
    decode_record,
    encode_record,
)
from pyctl.cluster.translate import TranslateError, node_from_records, pod_shape_problem


def pod(requests: dict[str, Any], name: str = "p", **spec: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": requests}}], **spec},
    }


def node(allocatable: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {"name": "n1", "uid": "uid-n1", "labels": labels or {}},
        "status": {"allocatable": allocatable},
    }


def refused(kind: Any, obj: Any) -> DecodeError:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(DecodeError) as e:
        decode_object(kind, data)
    return e.value


@pytest.mark.parametrize(
    ("requests", "needle"),
    [
        ({"nvidia.com/gpu": "4294967296"}, "nvidia.com/gpu is 4294967296, outside 0..1024"),
        ({"nvidia.com/gpu": "1025"}, "outside 0..1024"),
        ({"nvidia.com/mig-1g.5gb": "100000"}, "nvidia.com/mig-1g.5gb is 100000"),
        ({"cpu": "-1"}, "cpu request (millicores) is -1000"),
        ({"memory": "1e30"}, "memory request (MiB)"),
        ({"cpu": "1e30"}, "a 34-digit number"),
    ],
)
def test_a_pod_beyond_the_bounds_is_refused_by_name(requests: dict[str, Any], needle: str) -> None:
    e = refused("Pod", pod(requests))
    assert e.reason == "out_of_bounds"
    assert needle in str(e)
    assert e.ref == ObjectRef("Pod", "ns", "p", "uid-p")
    assert e.tombstone == PodRecord("ns", "p", "uid-p")


def test_a_node_with_an_absurd_gpu_count_is_refused_at_once() -> None:
    t = time.perf_counter()
    e = refused("Node", node({"nvidia.com/gpu": "999999999999999999999"}))
    assert time.perf_counter() - t < 1.0  # no loop over the count (it used to hang)
    assert e.reason == "out_of_bounds"
    assert "node n1 nvidia.com/gpu is 999999999999999999999, outside 0..1024" in str(e)
    assert e.tombstone == NodeRecord("n1")
    e = refused("Node", node({"nvidia.com/gpu": 10**30}))  # a JSON number, not a string
    assert e.reason == "out_of_bounds"


def test_node_labels_beyond_the_bounds() -> None:
    e = refused("Node", node({}, {"nvidia.com/gpu.count": "99999999999999999999999999"}))
    assert "nvidia.com/gpu.count" in str(e)
    e = refused("Node", node({}, {"nvidia.com/gpu-0-numa": "5000"}))
    assert "nvidia.com/gpu-0-numa is 5000" in str(e)
    # digits that are not ASCII are not a count (int() would refuse some of them)
    rec = decode_object("Node", json.dumps(node({}, {"nvidia.com/gpu.count": "²"})).encode())
    assert isinstance(rec, NodeRecord)
    assert rec.gpu_count_label == 0


def test_lists_and_strings_beyond_the_bounds_are_malformed_and_named() -> None:
    labels = {f"k{i}": "v" for i in range(bounds.MAX_LABELS + 1)}
    obj = pod({"cpu": "1"})
    obj["metadata"]["labels"] = labels
    e = refused("Pod", obj)
    assert e.reason == "malformed"
    assert "$.metadata.labels" in str(e)
    assert e.ref == ObjectRef("Pod", "ns", "p", "uid-p")
    tolerations = [{"key": "k"}] * (bounds.MAX_ITEMS + 1)
    e = refused("Pod", pod({"cpu": "1"}, tolerations=tolerations))
    assert e.reason == "malformed"
    assert "tolerations" in str(e)
    e = refused("Pod", pod({"cpu": "1"}, nodeName="x" * 254))
    assert e.reason == "malformed"
    e = refused("Pod", pod({"cpu": "1"}, priority=2**40))
    assert e.reason == "malformed"
    assert "priority" in str(e)


@pytest.mark.parametrize("length", [253, 254])
def test_a_node_affinity_value_is_held_to_the_records_bound_when_decoded(length: int) -> None:
    """A selector requirement's value longer than a node name is refused by the decoder, as
    `check_record` would refuse the record (the fuzz found a 254-character hostname value that
    decoded to a record the store then refused)."""
    term = {"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["x" * length, "b"]}
    ]}  # fmt: skip
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]
    }}}  # fmt: skip
    obj = pod({"cpu": "1"}, affinity=affinity)
    if length > bounds.MAX_NAME_CHARS:
        e = refused("Pod", obj)
        assert e.reason == "malformed"
        assert "values" in str(e)
    else:
        rec = decode_object("Pod", json.dumps(obj).encode())
        assert isinstance(rec, PodRecord)
        check_record(rec)


def test_too_large_and_too_deep_objects() -> None:
    obj = pod({"cpu": "1"})
    obj["metadata"]["annotations"] = {"big": "x" * bounds.MAX_OBJECT_BYTES}
    e = refused("Pod", obj)
    assert e.reason == "too_large"
    assert e.ref == ObjectRef("Pod", "ns", "p", "uid-p")
    # msgspec skips an unknown field by recursing into it: a RecursionError, unless caught
    deep = b'{"metadata": {"name": "d"}, "x": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    e = refused("Pod", deep + b"}")  # a DecodeError, not a RecursionError
    assert e.reason == "malformed"
    with pytest.raises(DecodeError):
        decode_watch_line("Pod", b'{"type": "ADDED", "object": ' + b"[" * 100_000)


def test_nrt_zones_beyond_the_bounds() -> None:
    def nrt(zones: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"name": "n1"}, "zones": zones}

    gpu = [{"name": "nvidia.com/gpu", "capacity": "4"}]
    e = refused("NodeResourceTopology", nrt([{"name": "node-99999", "resources": gpu}]))
    assert e.reason == "out_of_bounds"
    assert "NUMA id" in str(e)
    twice = [{"name": "node-0", "resources": gpu}, {"name": "node-00", "resources": gpu}]
    e = refused("NodeResourceTopology", nrt(twice))
    assert "NUMA id 0 appears twice" in str(e)
    many = [{"name": f"node-{i}", "resources": gpu} for i in range(300)]  # 1200 GPUs in all
    e = refused("NodeResourceTopology", nrt(many))
    assert "nvidia.com/gpu is 1200" in str(e)


def test_translate_refuses_records_beyond_the_bounds_without_looping() -> None:
    t = time.perf_counter()
    with pytest.raises(TranslateError, match=r"nvidia\.com/gpu is 1000000"):
        node_from_records(NodeRecord("n", gpus=1_000_000), None, [])
    big_zone = NrtRecord("n", zones=(ZoneRecord(0, gpus=10**9),))
    with pytest.raises(TranslateError, match="outside"):
        node_from_records(NodeRecord("n"), big_zone, [])
    greedy = PodRecord("ns", "p", node="n", mig=(("1g.5gb", 10**12),))
    with pytest.raises(TranslateError, match="pod ns/p MIG"):
        node_from_records(NodeRecord("n", gpus=1), None, [greedy])
    assert time.perf_counter() - t < 1.0
    # at the bound it is a model
    n = node_from_records(NodeRecord("n", gpus=bounds.MAX_GPUS_PER_NODE), None, [])
    assert sum(len(z.gpus) for z in n.zones) == bounds.MAX_GPUS_PER_NODE


def test_stored_records_are_held_to_the_same_bounds() -> None:
    good = PodRecord("ns", "p", gpus=2)
    assert decode_record("Pod", encode_record(good)) == good
    bad = encode_record(PodRecord("ns", "p", gpus=10**6))
    with pytest.raises(ValueError, match="outside"):
        decode_record("Pod", bad)
    every = msgspec.json.encode(msgspec.structs.astuple(good))  # every field, then a deep one
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_record("Pod", every[:-1] + b"," + b"[" * 100_000 + b"]" * 100_000 + b"]")
    with pytest.raises(msgspec.ValidationError):
        decode_record("Node", b'["n", "", "", 0, 0, "many"]')
    check_record(NodeRecord("n", gpus=8, mig=(("1g.5gb", 7),)))


@pytest.mark.parametrize(
    ("rec", "needle"),
    [
        (PodRecord("ns", "p", gpus=2, mig=(("1g.5gb", 1),)), "both nvidia.com/gpu and a MIG"),
        (PodRecord("ns", "p", mig=(("9g.1tb", 1),)), 'unknown MIG profile "9g.1tb"'),
        (PodRecord("ns", "p", gpus=1), None),
        (PodRecord("ns", "p", mig=(("1g.5gb", 1),)), None),
    ],
)
def test_pod_shape_problem(rec: PodRecord, needle: str | None) -> None:
    why = pod_shape_problem(rec)
    assert (why is None) if needle is None else (why is not None and needle in why)


BIG = "a" * (10 << 20)  # 10 MiB


@pytest.mark.parametrize(
    ("kind", "rec", "needle"),
    [
        ("Pod", PodRecord("ns", BIG), "name: 10485760 characters, more than 253"),
        ("Pod", PodRecord("ns", "p", uid=BIG), "uid: 10485760 characters, more than 128"),
        ("Pod", PodRecord("n" * 64, "p"), "namespace: 64 characters, more than 63"),
        ("Pod", PodRecord("ns", "p", labels=(("app", "v" * 64),)), "labels entry: 64 char"),
        ("Pod", PodRecord("ns", "p", labels=(("k" * 318, "v"),)), "labels entry: 318 char"),
        ("Pod", PodRecord("ns", "p", unschedulable_message=BIG), "unschedulable_message: 10485"),
        ("Pod", PodRecord("ns", "p", owner_name=BIG), "owner_name: 10485760 characters"),
        ("Pod", PodRecord("ns", "p", claims=(PodClaim(BIG),)), "name: 10485760 characters"),
        (
            "Pod",
            PodRecord(
                "ns", "p", constraints=Constraints(tolerations=(Toleration("k", value=BIG),))
            ),
            "value: 10485760 characters, more than 63",
        ),
        ("Node", NodeRecord("n", gpu_model=BIG), "gpu_model: 10485760 characters, more than 1024"),
        ("Node", NodeRecord("n", taints=(Taint("k", "v" * 64),)), "value: 64 characters"),
        ("PodDisruptionBudget", PdbRecord("ns", "p", match_labels=(("a", BIG),)), "match_labels"),
        ("NodeResourceTopology", NrtRecord("n", policy=BIG), "policy: 10485760 characters"),
        ("ResourceClaim", ClaimRecord("ns", "c", uid=BIG), "uid: 10485760 characters"),
        (
            "ResourceSlice",
            SliceRecord("s", devices=(Device("d", attributes=(Attr("a", "string", "x" * 65),)),)),
            "value: 65 characters, more than 64",
        ),
        ("DeviceClass", DeviceClassRecord("c", selectors=("x" * 10241,)), "selectors entry"),
    ],
)
def test_every_string_of_a_stored_record_is_bounded(kind: Kind, rec: Any, needle: str) -> None:
    """As the API server bounds them (names 253, namespaces 63, uids 128, label keys 317 and
    values 63, a CEL selector 10 KiB, other strings 1,024): before, a 10 MiB pod uid passed
    `check_record` and was processed (`pyctl status --json` 10.5 MB)."""
    with pytest.raises(bounds.BoundsError, match=re.escape(needle)):
        check_record(rec)
    with pytest.raises(ValueError, match=re.escape(needle)):
        decode_record(kind, encode_record(rec))


def test_strings_at_the_api_servers_bounds_pass() -> None:
    key = "k" * 253 + "/" + "n" * 63
    check_record(
        PodRecord(
            "n" * 63,
            "p" * 253,
            uid="u" * 36,
            node="x" * 253,
            labels=((key, "v" * 63),),
            constraints=Constraints(
                spread=(Spread(1, key),),
                node_affinity=(
                    NodeTerm(match_fields=(Requirement("metadata.name", "In", ("x" * 253,)),)),
                ),
            ),
        )
    )
    check_record(NodeRecord("x" * 253, labels=((key, "v" * 63),), taints=(Taint(key, "v" * 63),)))
    check_record(DeviceClassRecord("c", selectors=("x" * 10240,)))
    attr = Attr("a", "strings", ("x" * 64, "y" * 64))
    check_record(SliceRecord("s", devices=(Device("d", attributes=(attr,)),)))
