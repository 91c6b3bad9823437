"""Property tests: the Rust placement search agrees with the brute-force rule of
`tests/reference/mig.py` on random instance lists for every model, and the Rust planner agrees
with the reference planner (same dynamic programme, options by brute force; and on small nodes
every combination of options)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyctl.core import mig
from tests.reference import mig as reference

MODELS = sorted(reference.MODELS)


@st.composite
def instance_lists(draw: st.DrawFn) -> tuple[str, list[str]]:
    name = draw(st.sampled_from(MODELS))
    m = reference.MODELS[name]
    out = []
    for _ in range(draw(st.integers(0, 9))):
        p = m.profiles[draw(st.integers(0, len(m.profiles) - 1))]
        kind = draw(st.integers(0, 9))
        if kind < 5:
            out.append(p.name)
        elif kind < 9:
            out.append(f"{p.name}@{draw(st.sampled_from(p.starts))}")
        else:  # any start inside the GPU, often not one of the profile's placements
            out.append(f"{p.name}@{draw(st.integers(0, m.memory_slices - p.memory))}")
    return name, out


def _outcome(fn: Any, *args: Any, **kw: Any) -> bool | str:
    try:
        return bool(fn(*args, **kw))
    except ValueError:
        return "error"


@settings(max_examples=3000, deadline=None)
@given(instance_lists(), st.booleans())
def test_validity_agrees_with_brute_force(case: tuple[str, list[str]], pre_r510: bool) -> None:
    name, instances = case
    want = _outcome(reference.validate, name, instances, pre_r510)
    assert _outcome(mig.validate, name, instances, pre_r510=pre_r510) == want


@st.composite
def nodes(draw: st.DrawFn, max_gpus: int) -> dict[str, Any]:
    name = draw(st.sampled_from(MODELS))
    m = reference.MODELS[name]
    gpus = []
    for g in range(draw(st.integers(1, max_gpus))):
        pins: list[tuple[int, int]] = []
        instances = []
        for _ in range(draw(st.integers(0, 8))):
            p = draw(st.integers(0, len(m.profiles) - 1))
            s = draw(st.sampled_from(m.profiles[p].starts))
            if reference.valid(m, [*pins, (p, s)], []):
                pins.append((p, s))
                used = draw(st.booleans())
                instances.append(
                    {
                        "profile": m.profiles[p].name,
                        "start": s,
                        "used": used,
                        "pod": f"ns/p{g}-{s}" if used and draw(st.booleans()) else None,
                    }
                )
        gpus.append({"gpu": g, "instances": instances})
    names = [p.name for p in m.profiles]
    pending = [
        {"profile": draw(st.sampled_from(names)), "count": draw(st.integers(1, 3))}
        for _ in range(draw(st.integers(0, 3)))
    ]
    workload = [
        {"profile": draw(st.sampled_from(names)), "weight": draw(st.sampled_from([0.1, 0.5, 2]))}
        for _ in range(draw(st.integers(0, 3)))
    ]
    limits = {
        "gpus": draw(st.one_of(st.none(), st.just([0]))),
        "max_used_destroyed": draw(st.integers(0, 3)),
        "executor": draw(st.sampled_from(mig.EXECUTORS)),
    }
    return {
        "gpu_model": name,
        "gpus": gpus,
        "pending": pending,
        "workload": workload,
        "limits": limits,
    }


def _rust(case: dict[str, Any]) -> dict[str, Any]:
    # the reference planner does not say whether the model's placements were inferred
    return {k: v for k, v in mig.plan(**case).items() if k != "placements_inferred"}


@settings(max_examples=150, deadline=None)
@given(nodes(max_gpus=4))
def test_planner_agrees_with_the_reference(case: dict[str, Any]) -> None:
    want = reference.plan(**case)
    got = _rust(case)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    for g in got["gpus"]:
        assert mig.validate(
            case["gpu_model"], [f"{x['profile']}@{x['start']}" for x in g["layout"]]
        )
    assert got["used_destroyed"] <= case["limits"]["max_used_destroyed"]


@settings(max_examples=60, deadline=None)
@given(nodes(max_gpus=2))
def test_the_programme_finds_the_best_combination(case: dict[str, Any]) -> None:
    assert reference.plan(**case) == reference.plan(**case, exhaustive=True)
