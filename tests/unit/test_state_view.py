"""The stored view (`pyctl.app.state`) with a published summary that is hostile: a summary that
does not decode, or whose fields have the wrong types, is said in one line and the rest of the
view is built from the records; nothing raises."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from pyctl.app.config import load_config
from pyctl.app.state import build_view
from pyctl.app.status import status_of
from pyctl.cli.status import show
from pyctl.cluster.records import KINDS, NodeRecord, ObjectRef
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import MAX_LEFT_OUT, summary_bytes
from pyctl.federation import decode_member
from pyctl.metrics import Metrics
from pyctl.state.store import MemberSummary, StoredKind, StoredState

HOSTILE = [
    (b"\xff\x00", "summary does not decode: JSON is malformed"),
    (b"[1, 2]", "summary does not decode: Expected `object`, got `array`"),
    (b'{"cluster": "c"', "summary does not decode: Input data was truncated"),
    (b'{"nodes": 3}', "summary does not decode: Object missing required field `cluster`"),
    (b'{"cluster": "c", "nodes": "many"}', "summary does not decode: Expected `int`, got `str`"),
    (b'{"cluster": "c", "nodes": 1e999}', "summary does not decode: Number out of range"),
    (b'{"cluster": "c", "nodes": -1}', "summary does not decode: Expected `int` >= 0"),
    (
        b'{"cluster": "c", "idle_gpu_milli": "lots"}',
        "summary does not decode: Expected `float`, got `str`",
    ),
    (b'{"cluster": "c", "categories": [1]}', "summary does not decode: Expected `object`"),
    (
        b'{"cluster": "c", "blocked": {"lack_gpu": "x"}}',
        "summary does not decode: Expected `int`, got `str`",
    ),
    (b'{"cluster": "c", "workload": 5, "snapshot": "x"}', "summary does not decode: Expected"),
    (
        b'{"cluster": "c", "workload": [5], "snapshot": {"nodes": 3}}',
        "the published workload or node models do not decode",
    ),
    (
        b'{"cluster": "c", "workload": [], "snapshot": {"nodes": []}}',
        "the published workload or node models do not decode",
    ),
]


def _state() -> StoredState:
    kinds = {k: StoredKind(k, {}, "1", None, {}) for k in KINDS}
    kinds["Node"] = StoredKind("Node", {"n1": NodeRecord("n1", gpus=8)}, "7", 990.0, {})
    return StoredState("c", kinds, 1000.0)


@pytest.mark.parametrize(("data", "said"), HOSTILE)
def test_a_hostile_summary_is_said_and_the_records_still_read(data: bytes, said: str) -> None:
    cfg = load_config(None, {}, {"cluster": "c"})
    view = build_view(cfg, "test", _state(), MemberSummary(data, 1.0, 30))
    st = status_of(view)
    assert st.heartbeat.published
    assert st.heartbeat.error.startswith(said), st.heartbeat.error
    assert "\n" not in st.heartbeat.error
    # M comes from the records (no GPU pods: the default), the node is modelled and scored
    assert view.workload_source == "default"
    assert st.summary is not None
    assert st.summary.nodes == 1
    assert st.summary.idle_gpu_milli == 8000
    out = io.StringIO()
    show(Console(file=out, width=200), st)
    assert said in out.getvalue()
    controller = st.to_json()["controller"]
    assert isinstance(controller, dict)
    assert isinstance(controller["error"], str)
    assert controller["error"].startswith(said)


def test_decode_member_says_a_field_of_the_wrong_type() -> None:
    m = decode_member("c", MemberSummary(b'{"pending": [], "nodes": 3}', 1.0, 30))
    assert m.error.startswith("summary does not decode:")
    assert m.summary is None
    assert "nodes" not in m.to_json()  # an invalid member has no figures, not zeros
    good = decode_member("c", MemberSummary(b'{"cluster": "c", "pending": 2, "nodes": 3}', 1.0, 30))
    assert good.error == ""
    assert (good.pending, good.nodes) == (2, 3)


def test_the_objects_the_controller_leaves_out_reach_status() -> None:
    """The controller's summary names what it leaves out (a hostile pod never reaches the store,
    so `pyctl status` learns of it only from the published summary); status shows it, and a
    summary naming more than the bound does not decode."""
    rec = Reconciler(ClusterCache(), Metrics(), "c")
    why = "items[3]: pod tenant-x/evil nvidia.com/gpu is 4294967296, outside 0..1024"
    rec.ignored.report("Pod", "out_of_bounds", why, ObjectRef("Pod", "tenant-x", "evil", "u1"))
    data = summary_bytes(rec.summary(0.0), now=999.0)
    cfg = load_config(None, {}, {"cluster": "c"})
    st = status_of(build_view(cfg, "test", _state(), MemberSummary(data, 1.0, 30)))
    assert st.left_out is not None
    out = st.to_json()["left_out"]
    assert out == {
        "count": 1,
        "objects": [
            {"kind": "Pod", "name": "tenant-x/evil", "reason": "out_of_bounds", "message": why}
        ],
    }
    buf = io.StringIO()
    show(Console(file=buf, width=200), st)
    assert "Left out by the controller: 1 object(s)" in buf.getvalue()
    assert "Pod tenant-x/evil: out_of_bounds" in buf.getvalue()
    for i in range(MAX_LEFT_OUT + 5):
        rec.ignored.report("Pod", "bad_quantity", f"p{i}", ObjectRef("Pod", "ns", f"p{i}", ""))
    s = rec.summary(0.0)
    assert s.left_out_count == MAX_LEFT_OUT + 6
    assert len(s.left_out) == MAX_LEFT_OUT
    assert s.left_out[-1][1] == f"ns/p{MAX_LEFT_OUT + 4}"
    st = status_of(build_view(cfg, "test", _state(), MemberSummary(summary_bytes(s), 1.0, 30)))
    assert st.left_out is not None
    assert st.left_out.count == MAX_LEFT_OUT + 6
    too_many = (
        b'{"cluster": "c", "left_out": ['
        + b",".join([b'{"kind": "Pod"}'] * (MAX_LEFT_OUT + 1))
        + b"]}"
    )
    hostile = status_of(build_view(cfg, "test", _state(), MemberSummary(too_many, 1.0, 30)))
    assert hostile.left_out is None
    assert "summary does not decode" in hostile.heartbeat.error
