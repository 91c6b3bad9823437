"""Each workflow kind's data is a typed, versioned record (`WorkflowData`): decoded by msgspec with
the records' bounds; a record of another data version, of another kind's data, beyond a bound, or
with a field its version does not hold is quarantined with the reason and counted; a record in
the shape written before the data was typed (an object of strings) is read through
`base.legacy_data` and written back typed at its next step."""

from __future__ import annotations

import json

import msgspec
import pytest

from pyctl.cluster.records import PodRecord
from pyctl.core import mig
from pyctl.workflows.base import Workflow, legacy_data, of_kind
from pyctl.workflows.compaction import CompactionData
from pyctl.workflows.engine import decode
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_reconfig import MigData, MigPod, expected_capacity, workflow_for
from pyctl.workflows.rescue import PlannedEviction, RescueData
from pyctl.workflows.rescue import workflow_for as rescue_for
from tests.unit.test_mig_reconfig import a_plan
from tests.unit.test_records_isolation import quarantined
from tests.unit.test_workflows import move, setup

REGISTRY = builtin_registry()


def envelope(kind: str, data: object, wid: str = "w1", step: str = "evicting") -> bytes:
    return json.dumps(
        {"id": wid, "kind": kind, "node": "n1", "step": step, "created": 1.0, "data": data}
    ).encode()


def test_every_kind_round_trips_through_its_type() -> None:
    pending = PodRecord("serving", "big", "uid-big", gpus=4, unschedulable=True)
    moved = PodRecord("serving", "a0", "uid-a0", node="n1", owner_kind="ReplicaSet", owner_name="a")
    for wf in (
        move(0),
        rescue_for(pending, "n1", [(moved, "n2")], 100.0),
        workflow_for(a_plan(), {}, 5.0),
    ):
        raw = msgspec.json.encode(wf)
        assert decode(raw, REGISTRY) == wf
        tag = json.loads(raw)["data"]["schema"]
        assert tag == f"{wf.kind}/1"


def test_the_stored_shape_of_a_rescue() -> None:
    pending = PodRecord("serving", "big", "uid-big", gpus=4, unschedulable=True)
    moved = PodRecord("serving", "a0", "uid-a0", node="n1", owner_kind="ReplicaSet", owner_name="a")
    wf = rescue_for(pending, "n1", [(moved, "n2")], 100.0)
    data = json.loads(msgspec.json.encode(wf))["data"]
    assert data == {
        "schema": "rescue/1",
        "namespace": "serving",
        "pod": "big",
        "uid": "uid-big",
        "pods": [["serving", "a0", "uid-a0", "ReplicaSet/a", "n2"]],
        "deadline": 1000.0,
        "evicted": [],
        "untainted": False,
        "outcome": "",
        "reason": "",
        "refused": "",
    }


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"schema": "compaction/2", "namespace": "ns", "pod": "p"}, "data version 'compaction/2'"),
        ({"schema": "rescue/1", "namespace": "ns", "pod": "p"}, "missing required field"),
        (
            {"schema": "mig-reconfigure/1", "config": "c", "entries": [], "expected": {}},
            "kind 'compaction' holds the data of mig-reconfigure/1",
        ),
        ({"schema": "compaction/1", "namespace": "n" * 64, "pod": "p"}, "length <= 63"),
        ({"schema": "compaction/1", "namespace": "ns", "pod": "p", "x": "1"}, "unknown field"),
        ({"schema": "compaction/1", "namespace": "ns", "pod": "p", "uid": 3}, "Expected `str`"),
        (["ns", "p"], "Expected `object`"),
        ({"namespace": "ns", "pod": "p", "max_attempts": "many"}, "'max_attempts' is not"),
        ({"namespace": "ns", "pod": "p", "surprise": "1"}, "unknown field `surprise`"),
    ],
)
def test_a_record_whose_data_is_not_its_kinds_does_not_decode(data: object, why: str) -> None:
    with pytest.raises(ValueError, match=r"^(not a )?workflow record") as e:
        decode(envelope("compaction", data), REGISTRY)
    assert why in str(e.value)


def test_a_rescue_beyond_its_bounds_does_not_decode() -> None:
    pod = ["ns", "p", "u", "ReplicaSet/x", "n2"]
    data = {"schema": "rescue/1", "namespace": "ns", "pod": "p", "uid": "u", "deadline": 1.0}
    decode(envelope("rescue", {**data, "pods": [pod] * 1024}), REGISTRY)
    with pytest.raises(ValueError, match=r"length <= 1024 - at `\$.data.pods`"):
        decode(envelope("rescue", {**data, "pods": [pod] * 1025}), REGISTRY)
    huge = envelope("rescue", {**data, "pods": []}).replace(
        b'"deadline": 1.0', b'"deadline": 1e400'
    )
    with pytest.raises(ValueError, match=r"Number out of range - at `\$.data.deadline`"):
        decode(huge, REGISTRY)


def test_legacy_records_of_every_kind_are_read_as_their_type() -> None:
    """The untyped shape each kind wrote: lists, maps and numbers as JSON text, flags "1"."""
    compaction = {
        "namespace": "ns",
        "pod": "p0",
        "uid": "u0",
        "workload": "ReplicaSet/x",
        "to": "n2",
        "gain_gpu_milli": "1000.0",
    }
    assert decode(envelope("compaction", compaction), REGISTRY).data == CompactionData(
        "ns", "p0", "u0", "ReplicaSet/x", "n2", 1000.0
    )
    rescue = {
        "namespace": "serving",
        "pod": "big",
        "uid": "uid-big",
        "pods": json.dumps([["serving", "a0", "uid-a0", "ReplicaSet/a", "n2"]]),
        "evicted": json.dumps(["serving/a0"]),
        "deadline": "1000.5",
        "untainted": "1",
        "outcome": "abandoned",
        "reason": "deadline",
        "refused": "serving/a0",
    }
    assert decode(envelope("rescue", rescue, step="releasing"), REGISTRY).data == RescueData(
        "serving",
        "big",
        "uid-big",
        (PlannedEviction("serving", "a0", "uid-a0", "ReplicaSet/a", "n2"),),
        1000.5,
        ("serving/a0",),
        True,
        "abandoned",
        "deadline",
        "serving/a0",
    )
    entries = mig.mig_parted_entries(a_plan().plan)
    legacy_mig = {
        "config": mig.config_name(entries),
        "entries": json.dumps(entries, sort_keys=True),
        "expected": json.dumps(expected_capacity(entries), sort_keys=True),
        "pods": json.dumps([["ns", "b", ""]]),
        "evicted": "[]",
        "gpu_model": "A100-SXM4-40GB",
        "previous": "all-1g.5gb",
        "was_unschedulable": "",
        "capacity_before": json.dumps({"1g.5gb": 14}),
        "drain_deadline": "900.0",
        "state_before": "",
        "deadline": "1800.0",
        "seen_pending": "1",
    }
    got = decode(envelope("mig-reconfigure", legacy_mig, step="waiting"), REGISTRY)
    d = of_kind(got, MigData)
    assert d is not None
    want = workflow_for(a_plan(), {}, 0.0).data
    assert d.data == msgspec.structs.replace(
        want,
        gpu_model="A100-SXM4-40GB",
        previous="all-1g.5gb",
        capacity_before={"1g.5gb": 14},
        drain_deadline=900.0,
        state_before="",
        deadline=1800.0,
        seen_pending=True,
    )
    assert d.data.pods == (MigPod("ns", "b", ""),)
    # a field a step had not set yet stays unset (the step sets it then)
    assert legacy_data(MigData, {k: legacy_mig[k] for k in ("config", "entries", "expected")}) == (
        msgspec.structs.replace(want, pods=(), gpu_model="")
    )


def test_a_legacy_record_that_does_not_convert_says_why() -> None:
    with pytest.raises(ValueError, match="untyped shape: data field 'pods' is not"):
        decode(envelope("rescue", {"namespace": "ns", "pod": "p", "pods": "[oops"}), REGISTRY)
    with pytest.raises(ValueError, match=r"untyped shape: data: .*length <= 63"):
        decode(envelope("compaction", {"namespace": "n" * 64, "pod": "p"}), REGISTRY)
    with pytest.raises(ValueError, match="unknown kind 'other'"):
        decode(envelope("other", {"namespace": "ns"}), REGISTRY)


@pytest.mark.anyio
async def test_a_legacy_record_advances_and_is_written_back_typed() -> None:
    cluster, engine, store = setup()
    legacy = {"namespace": "ns", "pod": "p0", "uid": "u0", "workload": "ReplicaSet/x"}
    await store.put("compaction-u0", envelope("compaction", legacy, "compaction-u0"), 0)
    await engine.advance_all()
    await engine.advance_all()
    assert cluster.evictions == ["ns/p0"]
    rec = await store.get("compaction-u0")
    assert rec is not None
    assert json.loads(rec.data)["data"]["schema"] == "compaction/1"
    wf = decode(rec.data, REGISTRY)
    assert (wf.step, wf.result) == ("done", "evicted")
    assert await store.quarantined() == {}


@pytest.mark.anyio
async def test_unknown_versions_and_mismatched_data_are_quarantined_and_counted() -> None:
    cluster, engine, store = setup()
    newer = {"schema": "compaction/9", "namespace": "ns", "pod": "p1", "uid": "u1"}
    await store.put("compaction-newer", envelope("compaction", newer, "compaction-newer"), 0)
    pending = PodRecord("serving", "big", "uid-big", gpus=4, unschedulable=True)
    rescue = msgspec.json.encode(rescue_for(pending, "n1", [], 0.0))
    await store.put(
        "compaction-swapped", rescue.replace(b'"kind":"rescue"', b'"kind":"compaction"'), 0
    )
    await store.put(
        "compaction-legacy-bad", envelope("compaction", {"pod": "p2"}, "compaction-legacy-bad"), 0
    )
    await engine.start(move(0))
    counts = await engine.advance_all()
    assert counts == {("compaction", "done"): 1}  # the good one, beside them
    assert cluster.evictions == ["ns/p0"]
    q = await store.quarantined()
    assert set(q) == {"compaction-newer", "compaction-swapped", "compaction-legacy-bad"}
    assert q["compaction-newer"].reason == (
        "workflow record: data version 'compaction/9' is not one pyctl reads "
        "(compaction/1, mig-reconfigure/1, rescue/1)"
    )
    assert q["compaction-swapped"].reason.startswith(
        "workflow record: kind 'compaction' holds the data of rescue/1"
    )
    assert "missing required field `namespace`" in q["compaction-legacy-bad"].reason
    assert quarantined(engine.ctx.gate.metrics, "workflows") == 3


def test_a_registry_refuses_one_data_type_for_two_kinds() -> None:
    from pyctl.workflows.base import Registry, WorkflowKind

    r = Registry()
    r.add(WorkflowKind("a", CompactionData, {}))
    with pytest.raises(ValueError, match="another kind's"):
        r.add(WorkflowKind("b", CompactionData, {}))


def test_a_workflow_of_one_kind_is_not_narrowed_to_another() -> None:
    wf: Workflow[CompactionData] = move(0)
    assert of_kind(wf, RescueData) is None
    assert of_kind(wf, CompactionData) is wf


def test_a_record_nested_past_the_decoders_depth_is_refused_not_raised() -> None:
    """Found by the fuzz tier: a record whose id is a list nested 10,000 deep made msgspec raise
    RecursionError out of the engine's decode; it is a record that does not decode."""
    from pyctl.workflows.engine import decode
    from pyctl.workflows.kinds import builtin_registry

    deep = b'{"id": ' + b"[" * 10_000 + b"]" * 10_000 + b', "kind": "compaction"}'
    with pytest.raises(ValueError, match="nested too deeply"):
        decode(deep, builtin_registry())
