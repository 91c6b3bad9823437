"""One watch request of `Reflector` against a scripted API server response (no control plane):
the query it sends, lines split across reads, batches by size and by delay, bookmarks, objects
that do not decode, the ERROR event and HTTP status of 410 Gone, a 404 on an optional kind, a
sink that fails, and the backoff after a watch that brings nothing. tests/e2e runs the reflector
against a real API server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import pytest

from pyctl.cluster.kube import reflector as rf
from pyctl.cluster.kube.client import KubeApiError, KubeClient, Response
from pyctl.cluster.kube.decode import WatchError
from pyctl.cluster.kube.reflector import RESOURCES, Reflector, ReflectorOptions
from pyctl.cluster.records import Event, Kind, NodeRecord, ObjectRef, Record


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _node(name: str, rv: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "uid": f"u-{name}", "resourceVersion": rv}}


def _line(typ: str, obj: object) -> bytes:
    return json.dumps({"type": typ, "object": obj}).encode() + b"\n"


def _bookmark(rv: str) -> bytes:
    return _line("BOOKMARK", {"kind": "Node", "metadata": {"resourceVersion": rv}})


#: a read that arrives late (seconds), after the reflector's batch_delay
@dataclass
class Late:
    delay: float
    data: bytes


class _Content:
    """The body of the watch: each read returns the next scripted chunk, then b"" (the end)."""

    def __init__(self, chunks: Sequence[bytes | Late]) -> None:
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks[0]
        if isinstance(chunk, Late):
            await anyio.sleep(chunk.delay)  # cancelled: the chunk stays for the next read
            self.chunks.pop(0)
            return chunk.data
        self.chunks.pop(0)
        return chunk


@dataclass
class _Response:
    status: int
    content: _Content
    body: bytes = b""

    async def read(self) -> bytes:
        return self.body


@dataclass
class _Kube:
    response: _Response
    queries: list[tuple[str, list[tuple[str, str]], float]] = field(default_factory=list)

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Sequence[tuple[str, str]] = (), read_timeout: float
    ) -> AsyncIterator[_Response]:
        self.queries.append((path, list(query), read_timeout))
        yield self.response


@dataclass
class _Sink:
    fail: bool = False
    applied: list[tuple[list[tuple[str, str]], dict[Kind, str]]] = field(default_factory=list)
    errors: list[tuple[str, str | None]] = field(default_factory=list)

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        raise AssertionError("a watch does not list")

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        if self.fail:
            raise RuntimeError("store down")
        names = [(str(e.type), cast(NodeRecord, e.record).name) for e in events]
        self.applied.append((names, dict(resource_versions)))

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        self.errors.append((reason, ref.name if ref is not None else None))


class _Backoff:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def reset(self) -> None:
        self.calls.append("reset")

    async def sleep(self) -> None:
        self.calls.append("sleep")


def _reflector(
    chunks: Sequence[bytes | Late],
    status: int = 200,
    body: bytes = b"",
    optional: bool = False,
    **options: Any,
) -> tuple[Reflector, _Kube, _Backoff]:
    kube = _Kube(_Response(status, _Content(chunks), body))
    resource = RESOURCES["Node"]
    if optional:
        resource = rf.Resource("Node", "v1", "nodes", namespaced=False, optional=True)
    r = Reflector(cast(KubeClient, kube), "Node", ReflectorOptions(**options), resource=resource)
    backoff = _Backoff()
    r._backoff = cast(rf.Backoff, backoff)
    return r, kube, backoff


async def _watch(r: Reflector, sink: _Sink, rv: str = "10") -> str:
    return await r._watch(sink, rv)


@pytest.mark.anyio
async def test_the_query_asks_for_bookmarks_from_the_resource_version() -> None:
    r, kube, _ = _reflector([], watch_timeout=100, read_slack=5)
    assert await _watch(r, _Sink(), "10") == "10"
    [(path, query, read_timeout)] = kube.queries
    assert path == "/api/v1/nodes"
    q = dict(query)
    assert (q["watch"], q["resourceVersion"], q["allowWatchBookmarks"]) == ("true", "10", "true")
    # jittered: 100 to 200 seconds, read for 5 more
    assert 100 <= int(q["timeoutSeconds"]) <= 200
    assert read_timeout == int(q["timeoutSeconds"]) + 5
    assert r.stats.watches == 1


@pytest.mark.anyio
async def test_events_in_batches_of_batch_max_with_lines_split_across_reads() -> None:
    stream = (
        _line("ADDED", _node("a", "11"))
        + _line("MODIFIED", _node("b", "12"))
        + b"\n  \n"  # blank lines are not events
        + _line("DELETED", _node("a", "13"))
    )
    cut = len(_line("ADDED", _node("a", "11"))) + 7  # inside the second line
    r, _, backoff = _reflector([stream[:cut], stream[cut:]], batch_max=2, batch_delay=60)
    sink = _Sink()
    assert await _watch(r, sink) == "13"
    assert sink.applied == [
        ([("ADDED", "a"), ("MODIFIED", "b")], {"Node": "12"}),
        ([("DELETED", "a")], {"Node": "13"}),
    ]
    s = r.stats
    assert (s.events, s.batches, s.bookmarks, s.resource_version) == (3, 2, 0, "13")
    assert dict(s.events_by_type) == {"ADDED": 1, "MODIFIED": 1, "DELETED": 1}
    assert backoff.calls == ["reset"]


@pytest.mark.anyio
async def test_a_bookmark_alone_tells_the_sink_its_resource_version() -> None:
    r, _, _ = _reflector([_bookmark("20"), _bookmark("21")], batch_delay=60)
    sink = _Sink()
    assert await _watch(r, sink) == "21"
    assert sink.applied == [([], {"Node": "20"}), ([], {"Node": "21"})]
    assert (r.stats.bookmarks, r.stats.events, r.stats.resource_version) == (2, 0, "21")


@pytest.mark.anyio
async def test_a_batch_goes_to_the_sink_after_batch_delay() -> None:
    r, _, _ = _reflector(
        [_line("ADDED", _node("a", "11")), Late(0.3, _line("ADDED", _node("b", "12")))],
        batch_delay=0.05,
    )
    sink = _Sink()
    with anyio.fail_after(4):  # the late read is cut short by the delay, then read again
        assert await _watch(r, sink) == "12"
    assert sink.applied == [([("ADDED", "a")], {"Node": "11"}), ([("ADDED", "b")], {"Node": "12"})]


@pytest.mark.anyio
async def test_an_object_that_does_not_decode_is_counted_and_deleted() -> None:
    bad = _node("b", "12")
    bad["metadata"]["labels"] = "not a map"
    r, _, _ = _reflector(
        [_line("ADDED", _node("a", "11")) + _line("MODIFIED", bad) + b'{"type": "ADDED"\n'],
        batch_delay=60,
    )
    sink = _Sink()
    assert await _watch(r, sink) == "11"
    # its last good version leaves the view; a line that names nothing is only counted
    assert sink.applied == [([("ADDED", "a"), ("DELETED", "b")], {"Node": "11"})]
    assert [name for _, name in sink.errors] == ["b", None]
    assert r.stats.decode_errors == 2


@pytest.mark.anyio
async def test_a_410_event_hands_over_what_came_before_and_relists() -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    r, _, _ = _reflector([_line("ADDED", _node("a", "11")) + _line("ERROR", gone)], batch_delay=60)
    sink = _Sink()
    with pytest.raises(rf._Gone, match="410"):
        await _watch(r, sink)
    assert sink.applied == [([("ADDED", "a")], {"Node": "11"})]


@pytest.mark.anyio
async def test_another_error_event_is_raised() -> None:
    err = {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"}
    r, _, _ = _reflector([_line("ERROR", err)])
    with pytest.raises(WatchError, match="500"):
        await _watch(r, _Sink())


@pytest.mark.anyio
async def test_http_errors() -> None:
    status = json.dumps({"kind": "Status", "code": 410, "reason": "Expired"}).encode()
    r, _, _ = _reflector([], status=410, body=status)
    with pytest.raises(rf._Gone):
        await _watch(r, _Sink())
    r, _, _ = _reflector([], status=404, body=b"{}", optional=True)
    with pytest.raises(rf._Absent):
        await _watch(r, _Sink())
    r, _, _ = _reflector([], status=404, body=b"{}")
    with pytest.raises(KubeApiError):
        await _watch(r, _Sink())
    r, _, _ = _reflector([], status=503, body=b"{}")
    with pytest.raises(KubeApiError) as e:
        await _watch(r, _Sink())
    assert e.value.status == 503


@pytest.mark.anyio
async def test_a_sink_that_fails() -> None:
    r, _, _ = _reflector([_line("ADDED", _node("a", "11"))], batch_delay=60)
    with pytest.raises(rf._SinkFailed, match="RuntimeError: store down"):
        await _watch(r, _Sink(fail=True))


@pytest.mark.anyio
async def test_a_watch_that_ends_at_once_with_nothing_backs_off() -> None:
    r, _, backoff = _reflector([])
    assert await _watch(r, _Sink()) == "10"
    assert backoff.calls == ["sleep"]


@dataclass
class _Discovery:
    """An API server's discovery: group-version -> the plurals it serves (absent: 404)."""

    served: dict[str, list[str]]
    asked: list[str] = field(default_factory=list)

    async def request(self, method: str, path: str, **_: Any) -> Response:
        self.asked.append(path)
        gv = path.removeprefix("/apis/")
        if gv not in self.served:
            return Response(404, b"{}", {})
        body = {"resources": [{"name": p} for p in self.served[gv]]}
        return Response(200, json.dumps(body).encode(), {})


class _ReplaceSink(_Sink):
    def __init__(self) -> None:
        super().__init__()
        self.replaced: list[tuple[Kind, int]] = []

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        self.replaced.append((kind, len(records)))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("served", "version"),
    [
        ({"kueue.x-k8s.io/v1beta2": ["topologies"], "kueue.x-k8s.io/v1beta1": ["topologies"]},
         "kueue.x-k8s.io/v1beta2"),
        ({"kueue.x-k8s.io/v1beta1": ["topologies"]}, "kueue.x-k8s.io/v1beta1"),
        ({"kueue.x-k8s.io/v1beta2": ["topologies"]}, "kueue.x-k8s.io/v1beta2"),
        # v1beta2 served without the kind: the next version is looked at
        ({"kueue.x-k8s.io/v1beta2": ["workloads"], "kueue.x-k8s.io/v1beta1": ["topologies"]},
         "kueue.x-k8s.io/v1beta1"),
        ({"kueue.x-k8s.io/v1beta2": ["workloads"]}, None),
        ({}, None),
    ],
)  # fmt: skip
async def test_an_optional_kind_is_watched_at_the_first_version_served(
    served: dict[str, list[str]], version: str | None
) -> None:
    """Kueue's Topology: v1beta2 where served, else v1beta1 (a Kueue before v1beta2, or one past
    v1beta1); neither: absent, the sink told it holds none."""
    api = _Discovery(served)
    r = Reflector(cast(KubeClient, api), "KueueTopology", ReflectorOptions())
    sink = _ReplaceSink()
    present = await r._present(sink)
    assert present is (version is not None)
    assert r.stats.present is present
    if version is None:
        assert sink.replaced == [("KueueTopology", 0)]
        assert r.resource == RESOURCES["KueueTopology"]
    else:
        assert sink.replaced == []
        assert r.resource.group_version == version
        assert r._path == f"/apis/{version}/topologies"
    # the kind's versions looked at in order, each at most once
    assert (
        api.asked
        == [f"/apis/{gv}" for gv in ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")][
            : len(api.asked)
        ]
    )


@pytest.mark.anyio
async def test_a_version_that_goes_away_gives_way_to_the_next_and_back() -> None:
    """A Kueue upgraded past v1beta1 (or rolled back): the next look finds the other version."""
    api = _Discovery({"kueue.x-k8s.io/v1beta1": ["topologies"]})
    r = Reflector(cast(KubeClient, api), "KueueTopology", ReflectorOptions())
    sink = _ReplaceSink()
    assert await r._present(sink)
    assert r.resource.group_version == "kueue.x-k8s.io/v1beta1"
    api.served = {"kueue.x-k8s.io/v1beta2": ["topologies"]}
    assert await r._present(sink)
    assert r._path == "/apis/kueue.x-k8s.io/v1beta2/topologies"
    api.served = {}
    assert not await r._present(sink)
    assert sink.replaced == [("KueueTopology", 0)]
