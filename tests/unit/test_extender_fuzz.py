"""Fuzz: random and mutated request bodies through the scheduler extender's handler (the code
each worker of pyctl/serve/extender_server.py runs). Whatever the body, the handler answers:
never raises, never logs a traceback, and always returns JSON of the verb's shape
(``ExtenderFilterResult`` or ``HostPriorityList``), with an outcome the request counter knows.

The budget fits `make test` (FUZZ_EXAMPLES, default 300 per strategy); a longer run:
``FUZZ_EXAMPLES=20000 .venv/bin/pytest -q tests/unit/test_extender_fuzz.py``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyctl.cluster.kube.extender import MAX_EXTENDER_PRIORITY
from pyctl.controller.placement import PlacementAdvisor
from pyctl.serve.extender import OUTCOMES, VERBS, ExtenderHandler
from tests.unit.test_placement import W, node, pod

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "300"))
NAMES = ["empty", "three", "split", "loose"]
HANDLER = ExtenderHandler(
    PlacementAdvisor(
        {
            "empty": node("empty", 0, 0),
            "three": node("three", 3, 0),
            "split": node("split", 2, 2),
            "loose": node("loose", 2, 2, policy="none"),
        },
        lambda: W,
    )
)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    # caplog is cleared for each example (check())
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=30,
)
names = st.lists(st.sampled_from(NAMES) | st.text(max_size=12), max_size=20)
quantities = st.sampled_from(
    ["1", "4", "0", "-1", "4294967296", "1e400", "2Gi", "100m", "abc", "", "9" * 40]
) | st.integers().map(str)


@st.composite
def pods(draw: st.DrawFn) -> Any:
    """A valid pod, then fields replaced by anything."""
    p: dict[str, Any] = pod(draw(st.integers(0, 9)))
    requests = p["spec"]["containers"][0]["resources"]["requests"]
    for res in draw(
        st.lists(st.sampled_from(["nvidia.com/gpu", "cpu", "memory", "nvidia.com/mig-1g.5gb"]))
    ):
        requests[res] = draw(quantities)
    if draw(st.booleans()):
        path = draw(
            st.sampled_from(
                [("metadata",), ("spec",), ("spec", "containers"), ("metadata", "name")]
            )
        )
        target = p
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = draw(json_values)
    return p


@st.composite
def args(draw: st.DrawFn) -> Any:
    body: dict[str, Any] = {"Pod": draw(pods() | json_values)}
    form = draw(st.sampled_from(["names", "nodes", "both", "neither", "junk"]))
    if form in ("names", "both"):
        body["NodeNames"] = draw(names)
    if form in ("nodes", "both"):
        body["Nodes"] = {"items": [{"metadata": {"name": n}} for n in draw(names)]}
    if form == "junk":
        body[draw(st.sampled_from(["NodeNames", "Nodes", "nodenames", "pod"]))] = draw(json_values)
    return body


def bodies() -> st.SearchStrategy[bytes]:
    as_json = args().map(lambda a: json.dumps(a).encode())
    deep = st.integers(1, 100_000).map(lambda n: b"[" * n + b"]" * n)
    deep_pod = st.integers(500, 50_000).map(
        lambda n: b'{"Pod": ' + b'{"a":' * n + b"1" + b"}" * n + b', "NodeNames": []}'
    )
    return st.one_of(
        as_json,
        st.binary(max_size=200),
        deep,
        deep_pod,
        json_values.map(lambda v: json.dumps(v).encode()),
    )


def check(verb: str, raw: bytes, caplog: pytest.LogCaptureFixture) -> None:
    caplog.clear()
    out, outcome = HANDLER.answer(verb, raw)
    assert outcome in OUTCOMES
    got = json.loads(out)
    if verb != "prioritize":  # filter, and choose: a filter that also decides
        assert set(got) == {
            "Nodes",
            "NodeNames",
            "FailedNodes",
            "FailedAndUnresolvableNodes",
            "Error",
        }
        assert isinstance(got["Error"], str)
        assert isinstance(got["FailedNodes"], dict)
        assert (got["Error"] == "") == (outcome == "ok")
        if outcome == "ok":
            assert (got["NodeNames"] is None) != (got["Nodes"] is None)
    else:
        assert isinstance(got, list)
        for h in got:
            assert set(h) == {"Host", "Score"}
            assert isinstance(h["Host"], str)
            assert 0 <= h["Score"] <= MAX_EXTENDER_PRIORITY
    for r in caplog.records:  # one line each, never a traceback
        assert r.exc_info is None
        assert "\n" not in r.getMessage()


@pytest.mark.parametrize("verb", VERBS)
@FUZZ
@given(raw=bodies())
def test_random_bodies_get_an_answer_of_the_right_shape(
    verb: str, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    check(verb, raw, caplog)


@FUZZ
@given(raw=bodies(), cut=st.integers(0, 10_000), flip=st.integers(0, 255))
def test_mutated_bodies_get_an_answer(
    raw: bytes, cut: int, flip: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    if raw:
        i = cut % len(raw)
        raw = raw[:i] + bytes([raw[i] ^ flip]) + raw[i + 1 :]
    for verb in VERBS:
        check(verb, raw, caplog)


def test_a_valid_request_is_ok() -> None:  # the fuzz's shape checks accept real answers
    raw = json.dumps({"Pod": pod(4), "NodeNames": NAMES}).encode()
    out, outcome = HANDLER.answer("filter", raw)
    assert outcome == "ok"
    assert json.loads(out)["NodeNames"] == ["empty", "three", "loose"]


def test_a_pod_name_with_a_newline_is_one_line_in_the_answer_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Found by the fuzz tier: a pod named "\\n" whose request the core refuses logged a message
    of two lines (the core's message quotes the pod)."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "\n", "namespace": "default", "uid": "u-1"},
           "spec": {"schedulerName": "pyctl", "containers": [{"name": "c", "image": "x",
                    "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "-1"}}}]},
           "status": {"phase": "Pending"}}  # fmt: skip
    raw = json.dumps({"Pod": pod, "NodeNames": []}).encode()
    for verb in VERBS:
        check(verb, raw, caplog)
    assert any("outside 0..1024" in r.getMessage() for r in caplog.records)
