"""Every case of the kubelet-derived conformance corpus, through the public Python API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pyctl.core.topology import TopologyHint, merge_hints
from tests.paths import TOPOLOGY_CORPUS
from tests.reference import topology as reference

CASES: list[dict[str, Any]] = json.loads(TOPOLOGY_CORPUS.read_text())["cases"]


def test_corpus_is_the_expected_one() -> None:
    # Guards against a silently empty or truncated corpus making the parametrised tests vacuous.
    assert len(CASES) == 145
    assert {c["policy"] for c in CASES} == {"none", "best-effort", "restricted", "single-numa-node"}


def _run(case: dict[str, Any], providers: Any) -> dict[str, Any]:
    r = merge_hints(
        providers,
        policy=case["policy"],
        numa_nodes=case["numa_nodes"],
        options=case["options"],
        distances=case["distances"],
    )
    return {"affinity": r.affinity, "preferred": r.preferred, "admit": r.admit}


def _expected(case: dict[str, Any]) -> dict[str, Any]:
    return {**case["expected"], "admit": case["admit"]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_plain_data(case: dict[str, Any]) -> None:
    got = _run(case, case["providers"])
    want = _expected(case)
    if want["admit"] is None:  # admit not asserted by the Go test
        got["admit"] = None
    assert got == want


def _typed(providers: Any) -> Any:
    out: list[dict[str, list[TopologyHint] | None] | None] = []
    for p in providers:
        if p is None:
            out.append(None)
            continue
        out.append(
            {
                r: None if hs is None else [TopologyHint(h["affinity"], h["preferred"]) for h in hs]
                for r, hs in p.items()
            }
        )
    return out


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case_typed_hints_and_reversed_order(case: dict[str, Any]) -> None:
    """Typed hint objects give the same answer, and so does any provider/resource/hint order."""
    want = _run(case, case["providers"])
    assert _run(case, _typed(case["providers"])) == want
    reordered = [
        None
        if p is None
        else {r: (None if hs is None else hs[::-1]) for r, hs in reversed(p.items())}
        for p in reversed(case["providers"])
    ]
    assert _run(case, reordered) == want


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_reference_passes_the_corpus_too(case: dict[str, Any]) -> None:
    r = reference.merge_hints(
        case["providers"], case["policy"], case["numa_nodes"], case["options"], case["distances"]
    )
    want = _expected(case)
    got = {"affinity": r.affinity, "preferred": r.preferred, "admit": r.admit}
    if want["admit"] is None:
        got["admit"] = None
    assert got == want
