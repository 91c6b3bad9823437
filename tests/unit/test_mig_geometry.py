"""MIG geometry: every documented example of shared/docs/mig.md holds (valid and invalid
combinations, the 4g+3g case, the 7th slice, order insensitivity, the counts of maximal layouts,
the GPU Operator's default configs), plus model resolution and the inferred markers."""

from __future__ import annotations

import itertools
import re

import pytest

from pyctl.core import mig
from tests.reference import mig as reference

A100 = "A100-SXM4-40GB"


@pytest.mark.parametrize(
    ("model", "instances"),
    [
        # MIG User Guide, Getting Started: the 4-2-1, 3-2-1-1 and 2-1-1-1-1-1 examples.
        (A100, ["4g.20gb", "2g.10gb", "1g.5gb"]),
        (A100, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]),
        (A100, ["2g.10gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"]),
        # 4g + 3g: valid from driver R510.
        (A100, ["4g.20gb", "3g.20gb"]),
        (A100, ["1g.5gb"] * 7),
        (A100, ["7g.40gb"]),
        (A100, ["3g.20gb", "3g.20gb"]),
        # R525+ 1g.10gb: the 2-slice 1g profile.
        (A100, ["1g.10gb"] * 4),
        (A100, ["4g.20gb", "1g.10gb", "1g.10gb"]),
        (A100, ["1g.5gb+me", "1g.5gb", "3g.20gb", "2g.10gb"]),
        # Slice 7 is reachable only by 1g.10gb@6, 3g@4 and 7g@0.
        (A100, ["1g.10gb@6"]),
        (A100, ["3g.20gb@4"]),
        (A100, ["7g.40gb@0"]),
        (A100, ["4g.20gb@0", "2g.10gb@4", "1g.5gb@6"]),
        # Scaleway H100 PCIe: -cgi 9,19,19,19 -> 0:1, 1:1, 2:1, 4:4.
        ("H100-80GB", ["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]),
        ("H100-80GB", ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "3g.40gb@4"]),
        # A30: 4 memory and 4 compute slices.
        ("A30-24GB", ["4g.24gb"]),
        ("A30-24GB", ["2g.12gb", "2g.12gb"]),
        ("A30-24GB", ["2g.12gb", "1g.6gb", "1g.6gb"]),
        ("A30-24GB", ["1g.6gb"] * 4),
        ("A30-24GB", ["2g.12gb+me", "2g.12gb"]),
    ],
)
def test_documented_valid_combinations(model: str, instances: list[str]) -> None:
    result = mig.check(model, instances)
    assert result.valid, result.reason
    assert mig.validate(model, instances)
    assert reference.validate(model, instances)
    # The placement returned is itself a valid pinned layout.
    pinned = [f"{n}@{s}" for n, s in result.placements]
    assert mig.validate(model, pinned)


@pytest.mark.parametrize(
    ("model", "instances", "why"),
    [
        (A100, ["1g.5gb"] * 8, "at most 7"),
        (A100, ["7g.40gb", "1g.5gb"], "compute"),
        (A100, ["4g.20gb", "4g.20gb"], "at most 1"),
        (A100, ["3g.20gb", "3g.20gb", "1g.5gb"], "no placement"),  # 7 compute, 9 memory
        (A100, ["4g.20gb", "2g.10gb", "2g.10gb"], "compute"),
        (A100, ["1g.10gb"] * 5, "at most 4"),
        (A100, ["1g.5gb+me", "1g.5gb+me"], "at most 1"),
        # 1g.5gb can start at 0..6, never at 7.
        (A100, ["1g.5gb@7"], "cannot start at memory slice 7"),
        (A100, ["3g.20gb@2"], "cannot start"),
        (A100, ["2g.10gb@6"], "cannot start"),
        (A100, ["4g.20gb@4"], "cannot start"),
        # Pins that leave no 4-slice window: the defragmentation case.
        (A100, ["1g.5gb@1", "1g.5gb@5", "3g.20gb"], "no placement"),
        (A100, ["1g.10gb@2", "3g.20gb", "3g.20gb"], "no placement"),
        (A100, ["1g.5gb@3", "4g.20gb"], "no placement"),
        ("A30-24GB", ["4g.24gb", "1g.6gb"], "compute"),
        ("A30-24GB", ["1g.6gb@1", "1g.6gb@2", "2g.12gb"], "no placement"),
        ("H100-80GB", ["7g.80gb", "1g.10gb"], "compute"),
    ],
)
def test_documented_invalid_combinations(model: str, instances: list[str], why: str) -> None:
    result = mig.check(model, instances)
    assert not result.valid
    assert why in result.reason
    assert not reference.validate(model, instances)


def test_4g_plus_3g_needs_r510() -> None:
    assert mig.validate(A100, ["4g.20gb", "3g.20gb"])
    assert not mig.validate(A100, ["4g.20gb", "3g.20gb"], pre_r510=True)
    assert "R510" in mig.check(A100, ["4g.20gb", "3g.20gb"], pre_r510=True).reason
    assert mig.validate(A100, ["3g.20gb", "3g.20gb"], pre_r510=True)
    assert mig.validate(A100, ["4g.20gb", "2g.10gb", "1g.5gb"], pre_r510=True)
    assert not mig.validate("H100-80GB", ["4g.40gb", "3g.40gb"], pre_r510=True)


def test_creation_order_does_not_matter() -> None:
    # The guide's -cgi 19,19,14,9 fails on the driver and 9,19,14,19 works: as a set, both are
    # valid; the planner and mig-parted create large profiles first.
    for order in itertools.permutations(["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]):
        assert mig.validate(A100, list(order))


def test_the_guide_places_4_2_1_at_0_4_6() -> None:
    got = mig.check(A100, ["1g.5gb", "2g.10gb", "4g.20gb"]).placements
    assert sorted(got, key=lambda x: x[1]) == [("4g.20gb", 0), ("2g.10gb", 4), ("1g.5gb", 6)]


@pytest.mark.parametrize(
    ("model", "instances"),
    [  # the GPU Operator's all-balanced configs
        (A100, ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]),
        ("H100-80GB", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        ("H200-141GB", ["1g.18gb", "1g.18gb", "2g.35gb", "3g.71gb"]),
        ("B200-180GB", ["1g.23gb", "1g.23gb", "2g.45gb", "3g.90gb"]),
        ("A30-24GB", ["1g.6gb", "1g.6gb", "2g.12gb"]),
    ],
)
def test_all_balanced_is_valid(model: str, instances: list[str]) -> None:
    assert mig.validate(model, instances)


def test_all_profile_at_max_count_is_valid_and_one_more_is_not() -> None:
    for m in mig.models():
        for p in m.profiles:
            assert mig.validate(m.name, [p.name] * p.max_count), (m.name, p.name)
            assert not mig.validate(m.name, [p.name] * (p.max_count + 1)), (m.name, p.name)
    # all-1g.10gb: 7 on the 80GB parts, 4 on A100-40GB (where 1g.10gb is the 2-slice profile).
    assert mig.model("A100-80GB").profile("1g.10gb").max_count == 7
    assert mig.model(A100).profile("1g.10gb").max_count == 4


@pytest.mark.parametrize("model", [A100, "H100-80GB", "A30-24GB"])
def test_unpinned_validity_is_the_three_aggregate_limits(model: str) -> None:
    """mig.md: on the documented tables an unpinned multiset is valid exactly when counts,
    compute and memory fit (placement binds only once instances are pinned)."""
    m = mig.model(model)
    ranges = [range(p.max_count + 1) for p in m.profiles]
    for counts in itertools.product(*ranges):
        names = [p.name for p, c in zip(m.profiles, counts, strict=True) for _ in range(c)]
        compute = sum(p.compute_slices * c for p, c in zip(m.profiles, counts, strict=True))
        memory = sum(p.memory_slices * c for p, c in zip(m.profiles, counts, strict=True))
        aggregate = compute <= m.compute_slices and memory <= m.memory_slices
        assert mig.validate(model, names) == aggregate, names


def test_maximal_layout_counts() -> None:
    base = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert (mig.count_valid(A100, base), len(mig.layouts(A100, base))) == (37, 12)
    full = [lay for lay in mig.layouts(A100, base) if _compute(A100, lay) == 7]
    assert len(full) == 11
    assert len(mig.layouts(A100, base, pre_r510=True)) == 11
    # R525+: adds 1g.10gb. The default leaves +me out (same geometry as 1g.5gb).
    assert (mig.count_valid(A100), len(mig.layouts(A100))) == (77, 28)
    full = [lay for lay in mig.layouts(A100) if _compute(A100, lay) == 7]
    assert len(full) == 17
    # With +me as one more profile of max count 1.
    assert mig.count_valid(A100, media_extensions=True) == 127
    assert len(mig.layouts(A100, media_extensions=True)) == 44
    assert (mig.count_valid("H100-80GB"), len(mig.layouts("H100-80GB"))) == (77, 28)


def _compute(model: str, lay: mig.Layout) -> int:
    m = mig.model(model)
    return sum(m.profile(n).compute_slices for n, _ in lay.instances)


def test_the_twelve_base_layouts() -> None:
    base = ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    got = {tuple(sorted(lay.counts.items())) for lay in mig.layouts(A100, base)}
    short = {"7g": "7g.40gb", "4g": "4g.20gb", "3g": "3g.20gb", "2g": "2g.10gb", "1g": "1g.5gb"}
    want = set()
    for text in [
        "7g",
        "4g+3g",
        "4g+2g+1g",
        "4g+3x1g",
        "2x3g",
        "3g+2x2g",
        "3g+2g+2x1g",
        "3g+4x1g",
        "3x2g+1g",
        "2x2g+3x1g",
        "2g+5x1g",
        "7x1g",
    ]:
        counts: dict[str, int] = {}
        for part in text.split("+"):
            n, _, name = part.rpartition("x")
            counts[short[name]] = int(n or 1)
        want.add(tuple(sorted(counts.items())))
    assert got == want
    # nebuly-ai/nos omits 4g+3g and 3g+4x1g; both are maximal.
    assert (("3g.20gb", 1), ("4g.20gb", 1)) in got
    assert (("1g.5gb", 4), ("3g.20gb", 1)) in got
    # Its non-maximal 3g+2g+1g is not.
    assert (("1g.5gb", 1), ("2g.10gb", 1), ("3g.20gb", 1)) not in got


@pytest.mark.parametrize("model", [m.name for m in mig.models()])
def test_layouts_agree_with_the_reference(model: str) -> None:
    n_valid, maximal = reference.layouts(model)
    ours = mig.layouts(model)
    assert mig.count_valid(model) == n_valid
    assert sorted(sorted(x.counts.items()) for x in ours) == sorted(
        sorted(x.items()) for x in maximal
    )
    for lay in ours:  # every layout's placement is a valid pinned layout
        assert mig.validate(model, [f"{n}@{s}" for n, s in lay.instances])


@pytest.mark.parametrize(
    ("label", "name"),
    [
        ("NVIDIA-A100-SXM4-40GB", A100),
        ("A100-PCIE-40GB", A100),
        ("nvidia-a100-sxm4-40gb", A100),
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", A100),
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
        ("NVIDIA-A30", "A30-24GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-H100-PCIe", "H100-80GB"),
        ("NVIDIA-H100-NVL", "H100-94GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("NVIDIA-GH200-480GB", "H100-96GB"),
        ("NVIDIA-GH200-144G-HBM3e", "GH200-144GB"),
        ("NVIDIA-B200", "B200-180GB"),
        ("0x20B010DE", A100),
    ],
)
def test_kubernetes_product_labels_resolve(label: str, name: str) -> None:
    assert mig.model(label).name == name


def test_inferred_placements_are_marked() -> None:
    inferred = {m.name for m in mig.models() if m.placements_inferred}
    assert inferred == {"A100-80GB", "H100-96GB", "GH200-144GB", "B200-180GB"}
    assert mig.inferred_note(mig.model(A100)) is None
    note = mig.inferred_note(mig.model("B200-180GB"))
    assert note is not None
    assert "inferred" in note


@pytest.mark.parametrize(
    ("model", "instances", "message"),
    [
        ("T4", ["1g.5gb"], 'gpu_model: unknown MIG-capable GPU model "T4"'),
        (A100, ["5g.25gb"], 'instances[0]: unknown MIG profile "5g.25gb" for A100-SXM4-40GB'),
        (A100, ["3g.40gb"], 'unknown MIG profile "3g.40gb"'),
        (A100, ["3g.20gb", "1g.10gb@7"], 'instances[1]: "1g.10gb@7" is outside the GPU'),
        (A100, ["7g.40gb@1"], "outside the GPU"),
        ("A30-24GB", ["1g.6gb@4"], "outside the GPU"),
        (A100, ["3g.20gb@0", "1g.5gb@3"], "instances[1]: 1g.5gb@3 overlaps instances[0]"),
        (A100, ["1g.5gb@x"], "memory-slice index"),
        (A100, ["1g.5gb@-1"], "memory-slice index"),
    ],
)
def test_bad_input_raises_naming_it(model: str, instances: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        mig.validate(model, instances)


def test_place_is_the_exact_search() -> None:
    assert mig.place(A100, [("1g.5gb", 1)], ["3g.20gb"]) == [4]
    assert mig.place(A100, [("1g.5gb", 1), ("1g.5gb", 5)], ["3g.20gb"]) is None
    assert mig.place(A100, [("3g.20gb", 0), ("1g.5gb", 2)], []) is None  # overlapping pins
    assert mig.place(A100, [], []) == []
