"""The federation summary without re-doing what did not change: the publisher encodes only the
node models that changed since its last publish (`FederationEncoder`), a reader decodes only the
members' summaries whose bytes changed (`MemberDecoder`). Differential tests against the
definitions (`federation_summary_bytes`, `decode_member`), byte for byte and field for field."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import msgspec
import pytest

from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller import summary
from pyctl.controller.controller import Controller
from pyctl.controller.summary import FederationEncoder, Summary, federation_summary_bytes
from pyctl.federation import MemberDecoder, decode_member
from pyctl.model import Gpu, Node, Shape, Workload, Zone
from pyctl.state.memory import MemoryStore
from pyctl.state.store import MemberSummary


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_encoder_publishes_the_same_bytes_over_a_day() -> None:
    """Every summary of a simulated day (nodes re-scored between them, M re-derived): the
    encoder's bytes are `federation_summary_bytes`'s, and it encodes only the changed nodes."""
    enc = FederationEncoder()
    seen: list[tuple[bytes, bytes, int, int]] = []
    ctl: Controller | None = None

    def check(s: Summary) -> None:
        assert ctl is not None
        r = ctl.reconciler
        want = federation_summary_bytes(s, r.models, r.workload, now=12.5)
        got = enc.encode(s, r.models, r.workload, now=12.5)
        seen.append((got, want, enc.encoded, len(r.models)))

    src = SimClusterSource(inference_day(), speed=None)
    ctl = Controller("sim", src, MemoryStore(), summary_interval=0.02, on_summary=check)
    await ctl.run(until_source_ends=True)
    assert len(seen) > 20
    for got, want, _, _ in seen:
        assert got == want
    # it does keep what did not change (some publishes re-encode only part of the nodes) ...
    assert any(0 < encoded < nodes for _, _, encoded, nodes in seen[1:])
    # ... and the summaries were rich ones with every node
    d = msgspec.json.decode(seen[-1][0])
    assert len(d["snapshot"]["nodes"]) == seen[-1][3] > 0


@pytest.mark.anyio
async def test_the_encoder_follows_nodes_that_come_change_and_go() -> None:
    src = SimClusterSource(inference_day(duration=600.0), speed=None)
    ctl = Controller("sim", src, MemoryStore(), summary_interval=0)
    await ctl.run(until_source_ends=True)
    s = ctl.summarize()
    r = ctl.reconciler
    models = dict(r.models)
    names = sorted(models)
    enc = FederationEncoder()

    def same(m: Mapping[str, Node]) -> None:
        got = enc.encode(s, m, r.workload, now=1.0)
        assert got == federation_summary_bytes(s, m, r.workload, now=1.0)
        # without `now`: summary_bytes' own wall-clock heartbeat, the rest the same
        want = msgspec.json.decode(federation_summary_bytes(s, m, r.workload))
        got_d = msgspec.json.decode(enc.encode(s, m, r.workload))
        want["heartbeat"] = got_d["heartbeat"] = 0
        assert got_d == want

    same(models)
    enc.encode(s, models, r.workload, now=1.0)
    assert enc.encoded == 0
    gone = {n: models[n] for n in names[1:]}
    same(gone)
    back = dict(gone) | {names[0]: models[names[1]]}  # a node's model replaced by another
    same(back)
    enc.encode(s, back, r.workload, now=1.0)
    assert enc.encoded == 0
    same({})


def member(data: bytes, age: float = 1.0, ttl: int = 30) -> MemberSummary:
    return MemberSummary(data, age, ttl)


def test_the_decoder_decodes_only_changed_summaries_and_says_the_same() -> None:
    dec = MemberDecoder()
    a1 = msgspec.json.encode({"cluster": "a", "nodes": 3, "pending": 1, "blocked": {"numa": 2}})
    a2 = msgspec.json.encode({"cluster": "a", "nodes": 4, "pending": 0, "blocked": {}})
    bad = b'{"cluster": "b", "pending": [], "nodes": 3}'
    rounds = [
        {"a": member(a1), "b": member(bad)},
        {"a": member(a1, age=11.0), "b": member(bad, age=40.0)},  # unchanged; b now stale
        {"a": member(a2, age=0.5), "b": member(b"not json")},
        {"a": member(a2, age=45.0)},  # b is gone, a stale
        {"a": member(a2, age=2.0), "b": member(bad)},
    ]
    decoded = []
    for members in rounds:
        got = dec.decode_all(members)
        want = [decode_member(c, members[c]) for c in sorted(members)]
        assert got == want
        decoded.append(dec.decoded)
    assert decoded == [2, 0, 2, 0, 1]
    assert [m.stale for m in dec.decode_all(rounds[1])] == [False, True]
    # not vacuous: good summaries decoded, bad ones said
    assert [(m.summary is not None, bool(m.error)) for m in dec.decode_all(rounds[0])] == [
        (True, False),
        (False, True),
    ]


def test_the_encoder_refuses_what_federation_summary_bytes_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A value out of its bounds, or a summary too big: the same ValueError, the same words."""
    node = Node("n", "H100-SXM5-80GB", "none", zones=(Zone(0, 8000, 0, 8192, 0, (Gpu(0),)),))
    models = {"n": node}
    w = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000),))
    s = Summary("c", 1, 1000.0, 0.0, {}, 0.0, 0.0, 0.0, 0, {}, 1.0)
    assert FederationEncoder().encode(s, models, w, now=1.0) == federation_summary_bytes(
        s, models, w, now=1.0
    )
    bad = [
        replace(s, idle_gpu_milli=-1.0),
        replace(s, scheduling_success=2.0),
        replace(s, fragment_gpu_milli=float("nan")),
        replace(s, blocked={"x" * 10_000: 1}),
    ]
    for b in bad:
        want = refusal(partial(federation_summary_bytes, b, models, w, now=1.0))
        assert refusal(partial(FederationEncoder().encode, b, models, w, now=1.0)) == want
    monkeypatch.setattr(summary, "MAX_SUMMARY_BYTES", 400)
    want = refusal(lambda: federation_summary_bytes(s, models, w, now=1.0))
    assert refusal(lambda: FederationEncoder().encode(s, models, w, now=1.0)) == want
    assert "more than 400" in want


def refusal(publish: Callable[[], bytes]) -> str:
    try:
        publish()
    except ValueError as e:
        return str(e)
    raise AssertionError("published")


def test_a_head_only_read_takes_and_refuses_what_the_whole_read_does() -> None:
    """The controller's watcher reads members' summaries for their head (`MemberDecoder(
    head_only=True)`: the snapshot's parts stay raw JSON). It must count as bad exactly the
    summaries the whole read refuses, and read the same totals from the good ones."""
    node = Node("n", "H100-SXM5-80GB", "none", zones=(Zone(0, 8000, 0, 8192, 0, (Gpu(0),)),))
    w = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000),))
    s = Summary("c", 1, 1000.0, 0.0, {}, 0.0, 0.0, 0.0, 2, {"numa": 1}, 1.0)
    rich = federation_summary_bytes(s, {"n": node}, w, now=1.0)
    head = rich[: rich.index(b',"snapshot"')]
    cases = {
        "rich": rich,
        "basic": head + b"}",
        "snapshot not an object": head + b',"snapshot":[1,2]}',
        "snapshot not JSON": head + b',"snapshot":{"nodes":[1,}}',
        "snapshot null": head + b',"snapshot":null}',
        "bad head": rich.replace(b'"pending":2', b'"pending":-2'),
        "not JSON": b"{not json",
        "truncated": rich[:-3],
    }
    ok = []
    for what, data in cases.items():
        m = MemberSummary(data, 1.0, 30)
        whole, part = decode_member("c", m), decode_member("c", m, head_only=True)
        assert (whole.summary is None) == (part.summary is None), what
        assert whole.error == part.error, what
        if whole.summary is not None and part.summary is not None:
            ok.append(what)
            for f in whole.summary.__struct_fields__:
                if f != "snapshot":
                    assert getattr(whole.summary, f) == getattr(part.summary, f), (what, f)
            assert (whole.summary.snapshot is None) == (part.summary.snapshot is None)
            assert whole.rich == part.rich
    # not vacuous: good and bad summaries both met
    assert ok == ["rich", "basic", "snapshot null"]
    dec = MemberDecoder(head_only=True)
    got = dec.decode_all({"c": MemberSummary(rich, 1.0, 30)})
    assert got[0].summary is not None
    assert (got[0].nodes, got[0].pending) == (1, 2)
