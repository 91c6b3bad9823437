"""Property tests: the Rust merge agrees with the pure-Python kubelet walk on random inputs."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyctl.core.topology import merge_hints
from pyctl.model import TOPOLOGY_POLICIES
from tests.reference import topology as reference


@st.composite
def machines(draw: st.DrawFn) -> tuple[list[int], dict[int, list[int]]]:
    n = draw(st.integers(1, 8))
    # mostly contiguous ids, sometimes a sparse set (distance rows are indexed by id)
    space = n if draw(st.booleans()) else n + draw(st.integers(0, 3))
    nodes = sorted(draw(st.lists(st.integers(0, space - 1), min_size=n, max_size=n, unique=True)))
    width = max(nodes) + 1
    dist = st.integers(10, 40)
    distances = {i: [10 if i == j else draw(dist) for j in range(width)] for i in nodes}
    return nodes, distances


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    nodes, distances = draw(machines())
    affinity: st.SearchStrategy[list[int] | None] = st.one_of(
        st.none(),
        st.just([]),
        st.lists(st.sampled_from(nodes), min_size=1, max_size=len(nodes), unique=True),
    )
    hint = st.fixed_dictionaries({"affinity": affinity, "preferred": st.booleans()})
    resource_hints = st.one_of(st.none(), st.lists(hint, min_size=0, max_size=4))
    provider = st.one_of(
        st.none(),
        st.dictionaries(
            st.sampled_from(["cpu", "memory", "gpu", "mig"]), resource_hints, max_size=3
        ),
    )
    return {
        "providers": draw(st.lists(provider, min_size=1, max_size=5)),
        "policy": draw(st.sampled_from(TOPOLOGY_POLICIES)),
        "numa_nodes": nodes,
        "options": {
            "prefer-closest-numa-nodes": draw(st.booleans()),
            "max-allowable-numa-nodes": 8,
        },
        "distances": distances,
    }


def _rust(case: dict[str, Any]) -> tuple[Any, ...]:
    r = merge_hints(**case)
    return (r.affinity, r.preferred, r.admit)


def _ref(case: dict[str, Any]) -> tuple[Any, ...]:
    r = reference.merge_hints(**case)
    return (r.affinity, r.preferred, r.admit)


@settings(max_examples=2000, deadline=None)
@given(cases())
def test_rust_agrees_with_the_reference(case: dict[str, Any]) -> None:
    assert _rust(case) == _ref(case)


@settings(max_examples=500, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_order_does_not_matter(case: dict[str, Any], rnd: random.Random) -> None:
    want = _rust(case)
    providers: list[dict[str, Any] | None] = []
    for p in case["providers"]:
        if p is None:
            providers.append(None)
            continue
        items = list(p.items())
        rnd.shuffle(items)
        providers.append({r: (None if h is None else rnd.sample(h, len(h))) for r, h in items})
    rnd.shuffle(providers)
    assert _rust({**case, "providers": providers}) == want


@settings(max_examples=300, deadline=None)
@given(cases())
def test_admit_follows_the_policy_rule(case: dict[str, Any]) -> None:
    affinity, preferred, admit = _rust(case)
    if case["policy"] in ("none", "best-effort"):
        assert admit
    else:
        assert admit == preferred
    if case["policy"] == "single-numa-node" and affinity is not None:
        assert len(affinity) == 1
