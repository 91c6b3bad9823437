"""Stored records are decoded one at a time: a workflow record or a federation summary that does
not decode (garbage, an `inf`, a negative count, a bare NaN) is moved aside or skipped, counted and
logged, and the good ones go on as if it were not there."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import msgspec
import pytest

from pyctl.controller.summary import (
    Summary,
    decode_summary,
    federation_summary_bytes,
    summary_bytes,
)
from pyctl.federation import federation_status, read_members
from pyctl.metrics import Metrics
from pyctl.model import Gpu, Node, Shape, Workload, Zone
from pyctl.state.memory import MemoryStore
from pyctl.workflows.base import Registry, Workflow, WorkflowData, WorkflowKind
from pyctl.workflows.engine import MAX_WAIT, Context, decode
from pyctl.workflows.engine import Engine as _Engine
from pyctl.workflows.kinds import builtin_registry
from tests.unit.test_workflows import move, setup


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def quarantined(m: Metrics, store: str, cluster: str = "c") -> float:
    v = m.registry.get_sample_value(
        "pyctl_quarantined_records_total", {"cluster": cluster, "store": store}
    )
    return float(v or 0.0)


INF_RECORD = (
    b'{"id": "inf", "kind": "compaction", "node": "n1", "step": "evicting", "created": 0.0,'
    b' "not_before": 1e400}'
)
NULL_RECORD = INF_RECORD.replace(b"1e400", b"null")  # what an inf was once stored as


@pytest.mark.anyio
async def test_garbage_and_inf_records_are_quarantined_and_the_good_ones_advance() -> None:
    cluster, engine, store = setup()
    await store.put("garbage", b"\xff{not json", 0)
    await store.put("inf", INF_RECORD, 0)
    await store.put("null", NULL_RECORD.replace(b'"inf"', b'"null"'), 0)
    await store.put("other-id", msgspec.json.encode(move(2)), 0)  # names another workflow
    await engine.start(move(0))
    await engine.start(move(1))
    counts = await engine.advance_all()
    assert counts == {("compaction", "done"): 2}
    assert cluster.evictions == ["ns/p0", "ns/p1"]
    q = await store.quarantined()
    assert set(q) == {"garbage", "inf", "null", "other-id"}
    assert q["garbage"].data == b"\xff{not json"
    assert "$.not_before" in q["inf"].reason
    assert set(await store.list()) == {"compaction-u0", "compaction-u1"}
    assert quarantined(engine.ctx.gate.metrics, "workflows") == 4
    await engine.advance_all()  # nothing left to quarantine
    assert quarantined(engine.ctx.gate.metrics, "workflows") == 4


class Flaky(WorkflowData, frozen=True, tag="flaky/1"):
    pass


class Fine(WorkflowData, frozen=True, tag="fine/1"):
    pass


@pytest.mark.anyio
async def test_a_failing_step_is_retried_then_abandoned_and_never_blocks_the_next() -> None:
    cluster, engine, store = setup()
    calls: list[str] = []

    async def boom(ctx: Context, wf: Workflow[Flaky]) -> Workflow[Flaky]:
        calls.append(wf.id)
        raise RuntimeError("the API server said 500")

    async def ok(ctx: Context, wf: Workflow[Fine]) -> Workflow[Fine]:
        return msgspec.structs.replace(wf, step="done")

    reg = Registry()
    reg.add(WorkflowKind("flaky", Flaky, {"go": boom}, max_errors=3, backoff=0.0, backoff_max=0.0))
    reg.add(WorkflowKind("fine", Fine, {"go": ok}))
    eng = _Engine(store, engine.ctx, reg)
    await eng.start(Workflow("a-flaky", "flaky", "n1", "go", created=0.0, data=Flaky()))
    await eng.start(Workflow("b-fine", "fine", "n1", "go", created=0.0, data=Fine()))
    for _ in range(3):
        await eng.advance_all()
    a = await eng.get("a-flaky")
    b = await eng.get("b-fine")
    assert a is not None
    assert b is not None
    assert b.step == "done"  # advanced on the first tick, beside the failing one
    assert (a.step, a.attempts) == ("abandoned", 3)
    assert "RuntimeError: the API server said 500" in a.result
    m = engine.ctx.gate.metrics
    assert (
        m.registry.get_sample_value(
            "pyctl_workflows_abandoned_total", {"cluster": "c", "kind": "flaky"}
        )
        == 1
    )
    assert (
        m.registry.get_sample_value(
            "pyctl_workflow_step_errors_total", {"cluster": "c", "kind": "flaky", "step": "go"}
        )
        == 3
    )
    assert ("/n1", "") in cluster.events  # the Event on the node


@pytest.mark.anyio
async def test_every_time_written_is_finite_and_capped() -> None:
    _, engine, store = setup()
    wf = msgspec.structs.replace(move(0), not_before=math.inf)
    await engine.start(wf)
    rec = await store.get(wf.id)
    assert rec is not None
    stored = decode(rec.data, builtin_registry())
    assert math.isfinite(stored.not_before)
    assert stored.not_before <= engine.now() + MAX_WAIT


def summary(**kw: object) -> Summary:
    base: dict[str, object] = {
        "cluster": "a",
        "nodes": 2,
        "idle_gpu_milli": 4000.0,
        "fragment_gpu_milli": 1000.0,
        "categories": {"lack_gpu": 1000.0},
        "idle_mig_slices": 0.0,
        "fragment_mig_slices": 0.0,
        "recoverable_mig_slices": 0.0,
        "pending": 1,
        "blocked": {},
        "scheduling_success": 1.0,
        "by_model": {"H100": (4000.0, 1000.0)},
    }
    base.update(kw)
    return Summary(**base)  # type: ignore[arg-type]


def test_the_summary_round_trips_and_is_validated_by_the_publisher() -> None:
    s = summary()
    r = decode_summary(summary_bytes(s, now=1.0))
    assert (r.nodes, r.fragmentation_rate, r.rich) == (2, 0.25, False)
    node = Node("n", "H100", zones=(Zone(0, 1000, 0, 1000, 0, (Gpu(0),)),))
    w = Workload((Shape(gpus=1, gpu_milli=1000),))
    rich = decode_summary(federation_summary_bytes(s, {"n": node}, w, now=1.0))
    assert rich.rich
    for bad in (
        summary(idle_gpu_milli=math.nan),
        summary(fragment_gpu_milli=math.inf),
        summary(nodes=-5),
        summary(pending=-1),
        summary(categories={"x": -1.0}),
    ):
        with pytest.raises(ValueError, match=r"Expected|out of range"):
            summary_bytes(bad)


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ({"nodes": -5}, "Expected `int` >= 0 - at `$.nodes`"),
        ({"idle_gpu_milli": "NaN"}, "JSON is malformed"),
        ({"fragment_gpu_milli": "1e400"}, "out of range"),
        ({"scheduling_success": 7}, "<= 1.0"),
        ({"blocked": {"x": -1}}, "Expected `int` >= 0"),
        ({"snapshot": []}, "Expected `object | null`"),
    ],
)
def test_a_member_summary_out_of_bounds_is_skipped_counted_and_never_shown_as_nan(
    patch: dict[str, object], why: str
) -> None:
    store = MemoryStore("me")
    good = json.loads(summary_bytes(summary(cluster="good"), now=1.0))
    bad = json.loads(summary_bytes(summary(cluster="bad"), now=1.0))
    bad.update(patch)
    store._summaries["good"] = (json.dumps(good).encode(), 0.0, 60)
    # a bare NaN (as Python's json writes one) and a number beyond a float
    text = json.dumps(bad).replace('"NaN"', "NaN").replace('"1e400"', "1e400")
    store._summaries["bad"] = (text.encode(), 0.0, 60)
    m = Metrics()

    async def main() -> None:
        await store.open()
        view: Any = await federation_status(store, m, "me")
        out = json.dumps(view, allow_nan=False)  # /federation: never a bare NaN
        assert "NaN" not in out
        got = {x["cluster"]: x for x in view["members"]}
        assert got["good"]["nodes"] == 2
        assert got["good"]["error"] is None
        assert "nodes" not in got["bad"]  # an invalid member has no figures, not zeros
        assert why in got["bad"]["error"]
        await read_members(store, m, "me")  # the same bad summary again: counted once
        assert quarantined(m, "summaries", "me") == 1

    anyio.run(main)


def test_deep_and_huge_summaries_are_refused() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_summary(b'{"cluster": "a", "snapshot": ' + b'{"a": ' * 100_000)
    with pytest.raises(ValueError, match="more than"):
        decode_summary(b" " * (64 << 20) + b"{}")


@pytest.mark.anyio
async def test_a_workflow_of_an_unknown_kind_or_beyond_a_bound_is_quarantined() -> None:
    """Before, a record of a kind no engine runs stayed in the store for ever, never counted:
    each engine left it to the others."""
    from pyctl.app.state import decode_workflows

    cluster, engine, store = setup()
    unknown = msgspec.structs.replace(move(5), id="bogus-1", kind="bogus")
    long_node = msgspec.structs.replace(move(6), id="long-node", node="n" * 254)
    await store.put("bogus-1", msgspec.json.encode(unknown), 0)
    await store.put("long-node", msgspec.json.encode(long_node), 0)
    await engine.start(move(0))
    # what `pyctl status` reads lists them with why, as it lists every undecodable record
    _, bad = decode_workflows(await store.list())
    assert bad == {
        "bogus-1": "workflow record: unknown kind 'bogus'",
        "long-node": "workflow record: node of 254 characters, more than 253",
    }
    # an engine of one kind (as pyctl runs them, one per loop) moves them aside all the same
    only_mig = _Engine(store, engine.ctx, engine.registry, kinds=("mig-reconfigure",))
    await only_mig.advance_all()
    q = await store.quarantined()
    assert set(q) == {"bogus-1", "long-node"}
    assert "unknown kind 'bogus'" in q["bogus-1"].reason
    assert quarantined(engine.ctx.gate.metrics, "workflows") == 2
    assert await engine.advance_all() == {("compaction", "done"): 1}
    assert cluster.evictions == ["ns/p0"]
