"""Reading a cluster's state back from a real Redis (single and Cluster): nothing is written,
hostile records are skipped one at a time and named, a cluster with no state says so, and the
application's view (`pyctl.app.state`) reports a summary or workflow records it cannot read
instead of failing."""

from __future__ import annotations

import json

import msgspec
import pytest

from pyctl.app.config import load_config
from pyctl.app.state import NoStateError, read_stored
from pyctl.app.status import status_of
from pyctl.cluster.records import encode_record
from pyctl.metrics import Metrics
from pyctl.state.keys import Keys
from pyctl.state.redis_store import RedisStore
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.state.store import SCHEMA_VERSION, SchemaError, StateLostError

from .conftest import RedisConn
from .records import ev, node, pod

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


async def _dump(conn: RedisConn, keys: Keys) -> dict[bytes, object]:
    """Every key of the cluster and its content (the reader must leave it as it was)."""
    r = conn.client
    out: dict[bytes, object] = {}
    for name in (
        keys.schema,
        keys.resource_versions,
        keys.written,
        keys.summary,
        keys.workflow_data,
        keys.workflow_versions,
        keys.objects("Node"),
        keys.objects("Pod"),
    ):
        raw = await r.type(name)
        typ = raw.decode() if isinstance(raw, bytes) else str(raw)
        if typ == "hash":
            out[name.encode()] = await r.hgetall(name)
        elif typ == "string":
            out[name.encode()] = await r.get(name)
        else:
            out[name.encode()] = typ
    return out


async def test_no_state_is_said_and_nothing_written(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    with pytest.raises(StateLostError):
        await st.read()
    assert await st.read_summary() is None
    assert await redis_conn.client.exists(Keys(cluster_name).schema) == 0
    cfg = load_config(None, {}, {"cluster": cluster_name})
    with pytest.raises(NoStateError, match=f"no pyctl state of cluster '{cluster_name}'"):
        await read_stored(cfg, st, None, "redis under test")


async def test_other_schema_is_refused(redis_conn: RedisConn, cluster_name: str) -> None:
    await redis_conn.client.set(Keys(cluster_name).schema, str(SCHEMA_VERSION + 1))
    st = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    with pytest.raises(SchemaError, match=f"schema version {SCHEMA_VERSION + 1}"):
        await st.read()


async def test_hostile_records_are_skipped_one_at_a_time(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    keys = Keys(cluster_name)
    writer = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    await writer.open()
    good = [pod("ml", f"p-{i}", "gpu-1") for i in range(5)]
    await writer.apply(
        [ev("ADDED", node("gpu-1")), *(ev("ADDED", p) for p in good)], {"Node": "5", "Pod": "6"}
    )
    r = redis_conn.client
    await r.hset(keys.objects("Pod"), b"ml/\xff\xfe", b"\x00\x01garbage")  # not UTF-8 either
    await r.hset(keys.objects("Pod"), "ml/nested", b"[" * 200_000)
    await r.hset(keys.objects("Pod"), "ml/typed", b'["ml","typed","u","1","n","Running","x"]')
    await r.hset(keys.objects("Pod"), "ml/other", await r.hget(keys.objects("Pod"), "ml/p-0"))
    await r.hset(keys.objects("Node"), "gpu-2", b'["gpu-2","1","A100",1e999]')
    await r.hset(keys.written, "Pod", "not a time")
    await r.set(keys.objects("ResourceClaim"), "a string where a hash belongs")

    before = await _dump(redis_conn, keys)
    reader = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    state = await reader.read()
    assert await _dump(redis_conn, keys) == before  # a reader writes nothing

    assert state.records("Pod") == {p.key: p for p in good}
    assert state.records("Node") == {"gpu-1": node("gpu-1")}
    skipped = {(kind, key): why for kind, key, why in state.skipped}
    assert set(skipped) == {
        ("Pod", "ml/\ufffd\ufffd"),
        ("Pod", "ml/nested"),
        ("Pod", "ml/typed"),
        ("Pod", "ml/other"),
        ("Node", "gpu-2"),
        ("ResourceClaim", keys.objects("ResourceClaim")),
    }
    for why in skipped.values():
        assert "\n" not in why
        assert len(why) <= 300
    assert skipped[("Pod", "ml/typed")].startswith(
        "does not decode as a Pod record: Expected `int`"
    )
    assert skipped[("Pod", "ml/other")] == "stored under 'ml/other' but names 'ml/p-0'"
    assert skipped[("ResourceClaim", keys.objects("ResourceClaim"))].endswith(
        "holds a string, not a hash: not read"
    )
    assert state.kinds["Pod"].written is None  # not a time: unknown, not fatal
    assert state.kinds["Node"].written is not None

    # the application's view: records skipped, the rest modelled, a broken summary and
    # workflow records said
    await r.hset(keys.summary, mapping={"data": b"{", "published": "yesterday", "ttl": "30"})
    await r.hset(keys.workflow_data, "wf-1", b"\xff")
    await r.hset(keys.workflow_versions, "wf-1", 1)
    cfg = load_config(None, {}, {"cluster": cluster_name})
    flows = RedisWorkflowStore(redis_conn.client, redis_conn.config, cluster_name)
    view = await read_stored(cfg, reader, flows, "redis under test")
    st = status_of(view)
    assert "is invalid: published time 'yesterday' is not a time" in view.summary_error
    assert st.heartbeat.published is False
    assert st.workflows_undecodable.keys() == {"wf-1"}
    assert st.summary is not None
    assert st.summary.nodes == 1
    assert len(st.skipped) == 6
    assert view.workload_source == "derived"


async def test_a_record_with_a_string_beyond_its_bound_is_left_out_and_quarantined(
    redis_conn: RedisConn, cluster_name: str
) -> None:
    """A stored pod whose uid is 10 MiB (or a label value beyond 63 characters): skipped by
    the reader, named, and `pyctl status --json` stays small; moved aside (and counted) when
    the store loads it. Before, it was read and processed: `status --json` was 10.5 MB."""
    keys = Keys(cluster_name)
    metrics = Metrics()
    writer = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client, metrics=metrics)
    await writer.open()
    good = [pod("ml", f"p-{i}", "gpu-1") for i in range(3)]
    await writer.apply(
        [ev("ADDED", node("gpu-1")), *(ev("ADDED", p) for p in good)], {"Node": "5", "Pod": "6"}
    )
    r = redis_conn.client
    huge_uid = msgspec.structs.replace(pod("ml", "huge", "gpu-1"), uid="u" * (10 << 20))
    long_label = msgspec.structs.replace(pod("ml", "label", "gpu-1"), labels=(("app", "v" * 64),))
    await r.hset(keys.objects("Pod"), "ml/huge", encode_record(huge_uid))
    await r.hset(keys.objects("Pod"), "ml/label", encode_record(long_label))

    cfg = load_config(None, {}, {"cluster": cluster_name})
    reader = RedisStore(redis_conn.config, cluster_name, client=redis_conn.client)
    view = await read_stored(cfg, reader, None, "redis under test")
    st = status_of(view)
    skipped = {(kind, key): why for kind, key, why in st.skipped}
    assert skipped.keys() == {("Pod", "ml/huge"), ("Pod", "ml/label")}
    assert "uid: 10485760 characters, more than 128" in skipped[("Pod", "ml/huge")]
    assert "labels entry: 64 characters, more than 63" in skipped[("Pod", "ml/label")]
    assert len(json.dumps(st.to_json())) < 100_000

    records, _ = await writer.load("Pod")
    assert records == {p.key: p for p in good}
    assert set(await writer.quarantined("Pod")) == {"ml/huge", "ml/label"}
    counted = metrics.registry.get_sample_value(
        "pyctl_quarantined_records_total", {"cluster": cluster_name, "store": "objects"}
    )
    assert counted == 2
