"""Random and mutated stored records: workflow records through the engine (beside good ones that
must still finish), object records through the state store's load, federation summaries through
`/federation`'s view and placement. Nothing raises; bad records are moved aside or skipped and
counted; nothing shown is a bare NaN."""

from __future__ import annotations

import json
import math
from typing import Any

import anyio
import msgspec
from hypothesis import given
from hypothesis import strategies as st

from pyctl.cluster.bounds import MAX_SUMMARY_TTL_SECONDS
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import KINDS, Kind, check_record, decode_record, encode_record
from pyctl.controller.summary import Summary, federation_summary_bytes
from pyctl.federation import decode_member, federation_status, place, read_members
from pyctl.metrics import Metrics
from pyctl.model import Gpu, Node, Shape, Workload, Zone
from pyctl.state.memory import MemoryStore
from pyctl.state.redis_store import stored_member
from tests.integration.records import node, nrt, pdb, pod
from tests.unit.test_workflows import move, setup

from . import gen
from .conftest import CASES, FUZZ

WORKFLOW = msgspec.to_builtins(move(9))


@FUZZ
@given(bad=st.lists(gen.document(WORKFLOW), min_size=1, max_size=5))
def test_workflow_records_through_the_engine(bad: list[bytes]) -> None:
    CASES["workflow records"] += 1
    cluster, engine, store = setup()

    async def main() -> None:
        for i, data in enumerate(bad):
            await store.put(f"bad-{i}", data, 0)
        await engine.start(move(0))
        await engine.start(move(1))
        for _ in range(3):
            await engine.advance_all()  # never raises
        for good in ("compaction-u0", "compaction-u1"):
            wf = await engine.get(good)
            assert wf is not None
            assert wf.step == "done"  # the good ones advanced as if the others were not there
        left = await store.list()
        q = await store.quarantined()
        assert set(left) | set(q) == {f"bad-{i}" for i in range(len(bad))} | {
            "compaction-u0",
            "compaction-u1",
        }

    anyio.run(main)
    assert cluster.evictions[:2] == ["ns/p0", "ns/p1"]


RECORDS: dict[Kind, Any] = {
    "Node": node("gpu-1"),
    "Pod": pod("ml", "p", "gpu-1"),
    "PodDisruptionBudget": pdb("ml", "llm"),
    "NodeResourceTopology": nrt("gpu-1"),
    # DRA records, decoded from the fuzz tier's templates (the simulated NVIDIA driver's
    # objects), and the fabric's sources
    **{
        k: decode_object(k, json.dumps(gen.TEMPLATES[k][-1]).encode())
        for k in (
            *("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate"),
            *("KueueTopology", "KaiTopology", "ComputeDomainClique", "HyperNode", "PodGroup"),
            "KueueWorkload",
        )
    },
}
ENCODED = st.sampled_from(KINDS).flatmap(
    lambda k: gen.document(json.loads(encode_record(RECORDS[k]))).map(lambda d: (k, d))
)


@FUZZ
@given(records=st.lists(ENCODED, min_size=1, max_size=6))
def test_object_records_through_the_store(records: list[tuple[Kind, bytes]]) -> None:
    CASES["object records"] += 1
    store = MemoryStore("f")

    async def main() -> None:
        await store.open()
        for kind, data in records:
            try:
                rec = decode_record(kind, data)
            except ValueError:
                continue
            check_record(rec)
        for i, (kind, data) in enumerate(records):
            store._objects[kind][f"k{i}"] = data  # written by anyone
        for kind in KINDS:
            got, _ = await store.load(kind)  # never raises
            q = await store.quarantined(kind)
            assert len(got) + len(q) == sum(1 for k, _ in records if k == kind)

    anyio.run(main)


def _summary() -> dict[str, Any]:
    s = Summary("m", 1, 1000.0, 0.0, {"lack_gpu": 0.0}, 0.0, 0.0, 0.0, 0, {}, 1.0)
    n = Node("n", "H100", zones=(Zone(0, 8000, 0, 1000, 0, (Gpu(0), Gpu(1))),))
    w = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000),))
    d: dict[str, Any] = json.loads(federation_summary_bytes(s, {"n": n}, w, now=1.0))
    return d


@FUZZ
@given(summaries=st.lists(gen.document(_summary()), min_size=1, max_size=4))
def test_summaries_through_federation(summaries: list[bytes]) -> None:
    CASES["federation summaries"] += 1
    store = MemoryStore("me")
    now = store._clock()
    for i, data in enumerate(summaries):
        store._summaries[f"m{i}"] = (data, now, 60)
    store._summaries["good"] = (json.dumps(_summary()).encode(), now, 60)
    m = Metrics()

    async def main() -> None:
        await store.open()
        view = await federation_status(store, m, "me")  # never raises
        json.dumps(view, allow_nan=False)  # never a NaN or an infinity
        members = await read_members(store)
        ranks = place(members, Shape(cpu_milli=1000, gpus=1, gpu_milli=1000))
        assert any(r.cluster == "good" and not r.skipped for r in ranks)
        json.dumps([r.delta_gpus for r in ranks], allow_nan=False)

    anyio.run(main)


STORED_FIELD = st.one_of(
    st.sampled_from(["", "nan", "inf", "-inf", "-1", "0", "1e308", "abc", "60", "1.5"]),
    st.floats().map(repr),
    st.integers(-(10**20), 10**20).map(str),
    st.text(max_size=12),
    st.binary(max_size=12),
)


@FUZZ
@given(
    published=STORED_FIELD,
    ttl=STORED_FIELD,
    typ=st.sampled_from(["hash", "hash", "list", "string", "zset", "stream"]),
)
def test_stored_summary_fields_through_federation(
    published: str | bytes, ttl: str | bytes, typ: str
) -> None:
    """A member's stored publication time and TTL as anyone may write them in Redis
    (`redis_store.stored_member`): a member is either invalid, with its reason, or has a finite
    age and a TTL within its bound, so that no member looks fresh for ever."""
    CASES["federation stored fields"] += 1
    now = 1_800_000_000.25
    m = stored_member("pyctl:{m}:summary", [b"{}", published, ttl, repr(now).encode(), typ])
    if m.error:
        assert m.summary == b""
        assert not m.fresh
        decoded = decode_member("m", m)
        assert decoded.summary is None
        assert decoded.error == m.error
        json.dumps(decoded.to_json(), allow_nan=False)
    else:
        assert typ == "hash"
        assert math.isfinite(m.age_seconds)
        assert m.age_seconds >= 0
        assert 1 <= m.ttl_seconds <= MAX_SUMMARY_TTL_SECONDS


def _string_paths(v: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(v, str):
        return [path]
    items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
    return [p for k, x in items for p in _string_paths(x, (*path, k))]


@st.composite
def long_strings(draw: st.DrawFn) -> tuple[Kind, bytes, int]:
    """A stored record of any kind with one of its strings made 64 characters to 1 MiB long."""
    kind = draw(st.sampled_from(KINDS))
    doc = json.loads(encode_record(RECORDS[kind]))
    *where, last = draw(st.sampled_from(_string_paths(doc)))
    n = draw(st.sampled_from([64, 129, 254, 318, 1025, 10 * 1024 + 1, 1 << 20]))
    parent = doc
    for k in where:
        parent = parent[k]
    parent[last] = "x" * n
    return kind, json.dumps(doc).encode(), n


@FUZZ
@given(case=long_strings())
def test_no_string_beyond_every_bound_survives_a_stored_record(
    case: tuple[Kind, bytes, int],
) -> None:
    """Whatever string of a stored record is made long, the record is refused once the string
    is longer than the longest bound (a CEL selector's 10 KiB); shorter, it is refused or read,
    never anything else."""
    CASES["long strings"] += 1
    kind, data, n = case
    try:
        rec = decode_record(kind, data)
    except ValueError:  # its length, or another reason (a quantity, an enum) named
        return
    assert n <= 10 * 1024, (kind, n)
    check_record(rec)
