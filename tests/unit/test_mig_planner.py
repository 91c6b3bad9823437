"""The partition planner on hand-worked nodes, the limits, the snapshot/demand files, and the
mig-parted v1 config it emits (which must parse back as v1 and round-trip)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from pyctl.core import mig
from pyctl.core.inputs import MigGpuInput, MigInstanceInput, MigLimitsInput, MigPendingInput
from pyctl.core.types import DemandLineRaw, GpuPlanRaw, MigPlanRaw
from pyctl.snapshot import load_demand, load_snapshot
from tests.reference import mig as reference

A100 = "A100-SXM4-40GB"


def _inst(profile: str, start: int, pod: str | None = None) -> MigInstanceInput:
    return {"profile": profile, "start": start, "used": pod is not None, "pod": pod}


# A used 3g at 0; the other half cut into free 1g instances: no free 4-slice window.
FREE_SPLIT: list[MigGpuInput] = [
    {
        "gpu": 0,
        "instances": [
            _inst("3g.20gb", 0, "ns/a"),
            _inst("1g.5gb", 4),
            _inst("1g.5gb", 5),
            _inst("1g.10gb", 6),
        ],
    }
]
# Used 1g instances at slices 1 and 5 block both 4-slice windows.
BLOCKED: list[MigGpuInput] = [
    {
        "gpu": 3,
        "instances": [
            _inst("1g.5gb", 0),
            _inst("1g.5gb", 1, "ns/b"),
            _inst("1g.5gb", 2),
            _inst("1g.5gb", 5, "ns/c"),
            _inst("1g.5gb", 6),
        ],
    }
]
PENDING_3G: list[MigPendingInput] = [{"profile": "3g.20gb", "count": 1}]


def _layout(g: GpuPlanRaw) -> list[str]:
    return [f"{x['profile']}@{x['start']}:{x['state']}" for x in g["layout"]]


def _demand(plan: MigPlanRaw, profile: str) -> DemandLineRaw:
    return next(d for d in plan["demand"] if d["profile"] == profile)


def test_repartitioning_free_instances_serves_a_pending_3g() -> None:
    assert not mig.validate(A100, ["3g.20gb@0", "1g.5gb@4", "1g.5gb@5", "1g.10gb@6", "3g.20gb"])
    p = mig.plan(A100, FREE_SPLIT, PENDING_3G)
    g = p["gpus"][0]
    assert g["changed"]
    assert _layout(g) == ["3g.20gb@0:kept-used", "3g.20gb@4:new"]
    assert g["layout"][0]["pod"] == "ns/a"
    assert [(x["profile"], x["start"]) for x in g["destroyed"]] == [
        ("1g.5gb", 4),
        ("1g.5gb", 5),
        ("1g.10gb", 6),
    ]
    assert g["pods_to_move"] == []
    assert p["used_destroyed"] == 0
    d = _demand(p, "3g.20gb")
    assert (d["pending"], d["served_before"], d["served_after"]) == (1, 0, 1)
    assert g["serves"] == [{"profile": "3g.20gb", "count": 1}]
    # Fragment: 4 idle compute slices, none in a 3g before; 1 (the 7th slice) after.
    assert (p["fragment_before"], p["fragment_after"]) == (4.0, 1.0)
    assert p == _with_inferred(reference.plan(A100, FREE_SPLIT, PENDING_3G))


def _with_inferred(ref: dict[str, Any]) -> dict[str, Any]:
    return {**ref, "placements_inferred": False}


def test_serving_needs_moving_one_pod_and_a_limit_forbids_it() -> None:
    # Forbidden (the default: no used instance destroyed): nothing is served.
    p = mig.plan(A100, BLOCKED, PENDING_3G)
    assert p["used_destroyed"] == 0
    assert _demand(p, "3g.20gb")["served_after"] == 0
    assert all(g["pods_to_move"] == [] for g in p["gpus"])
    # One allowed: pod c moves, the 3g takes slices 4..8, c gets a new 1g on the same GPU.
    p = mig.plan(A100, BLOCKED, PENDING_3G, limits={"max_used_destroyed": 1})
    g = p["gpus"][0]
    assert g["pods_to_move"] == ["ns/c"]
    assert _layout(g) == [
        "1g.5gb@0:kept-free",
        "1g.5gb@1:kept-used",
        "1g.5gb@2:kept-free",
        "1g.5gb@3:new",
        "3g.20gb@4:new",
    ]
    assert _demand(p, "3g.20gb")["served_after"] == 1
    back = _demand(p, "1g.5gb")
    assert (back["moved"], back["rehoused"]) == (1, 1)
    assert p["net_served"] == 1
    # The GPU may not be touched.
    p = mig.plan(A100, BLOCKED, PENDING_3G, limits={"max_used_destroyed": 1, "gpus": [0]})
    assert not p["gpus"][0]["changed"]
    # mig-parted re-creates every instance of a changed GPU: both pods, so 1 is not enough.
    lim: MigLimitsInput = {"max_used_destroyed": 1, "executor": "mig-parted"}
    assert not mig.plan(A100, BLOCKED, PENDING_3G, limits=lim)["gpus"][0]["changed"]
    lim["max_used_destroyed"] = 2
    p = mig.plan(A100, BLOCKED, PENDING_3G, limits=lim)
    assert p["gpus"][0]["pods_to_move"] == ["ns/b", "ns/c"]
    assert all(x["state"] == "new" for x in p["gpus"][0]["layout"])


def test_a_move_with_nowhere_to_go_is_not_worth_it() -> None:
    # Only destroying both b and d frees slices 4..8 for a 3g, and then neither pod has an
    # instance to go back to: serving 1 pending pod would evict 2 running ones. No move.
    gpus: list[MigGpuInput] = [
        {
            "gpu": 0,
            "instances": [
                _inst("3g.20gb", 0, "ns/a"),
                _inst("1g.5gb", 4, "ns/b"),
                _inst("1g.10gb", 6, "ns/d"),
            ],
        }
    ]
    p = mig.plan(A100, gpus, PENDING_3G, limits={"max_used_destroyed": 3})
    assert p["used_destroyed"] == 0
    assert p["net_served"] == 0


def test_demand_for_a_profile_the_model_lacks_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=re.escape('pending[0].profile: unknown MIG profile "3g.40gb"')
    ):
        mig.plan(A100, FREE_SPLIT, [{"profile": "3g.40gb"}])
    with pytest.raises(ValueError, match="overlaps another instance"):
        mig.plan(A100, [{"gpu": 0, "instances": [_inst("3g.20gb", 0), _inst("1g.5gb", 1)]}], [])
    with pytest.raises(ValueError, match=re.escape("gpus[0].instances[0].start")):
        mig.plan(A100, [{"gpu": 0, "instances": [_inst("3g.20gb", 2)]}], [])
    with pytest.raises(ValueError, match=re.escape("limits.executor")):
        mig.plan(A100, FREE_SPLIT, PENDING_3G, limits={"executor": "nvml"})
    with pytest.raises(ValueError, match=re.escape("workload[0].weight")):
        mig.plan(A100, FREE_SPLIT, [], workload=[{"profile": "1g.5gb", "weight": 0}])


def _snapshot(node_gpus: dict[str, list[MigGpuInput]], model: str = A100) -> Any:
    return load_snapshot(
        {
            "nodes": [
                {
                    "name": name,
                    "gpu_model": f"NVIDIA-{model}",
                    "zones": [{"numa": 0, "cpu_milli": 64000, "memory_mib": 1 << 20, "mig": gpus}],
                }
                for name, gpus in node_gpus.items()
            ]
        }
    )


def test_plan_snapshot_takes_served_demand_off_before_the_next_node() -> None:
    snap = _snapshot({"a": FREE_SPLIT, "b": FREE_SPLIT})
    demand = load_demand({"pending": [{"profile": "3g.20gb", "count": 1}]})
    plans = mig.plan_snapshot(snap, demand)
    assert [p.node for p in plans] == ["a", "b"]
    assert plans[0].plan["changed_gpus"] == 1
    assert plans[1].plan["changed_gpus"] == 0  # the 3g is served by node a already
    demand = load_demand({"pending": [{"profile": "3g.20gb", "count": 2}]})
    assert [p.plan["changed_gpus"] for p in mig.plan_snapshot(snap, demand)] == [1, 1]


def test_demand_file_errors() -> None:
    snap = _snapshot({"a": FREE_SPLIT})
    demand = load_demand({"pending": [{"profile": "3g.40gb"}]})
    with pytest.raises(ValueError, match=r"pending\[0\].profile: A100-SXM4-40GB \(node 'a'\)"):
        mig.plan_snapshot(snap, demand)
    # Aimed at another model: fine, this node ignores it.
    demand = load_demand({"pending": [{"profile": "3g.40gb", "gpu_model": "H100-80GB"}]})
    assert mig.plan_snapshot(snap, demand)[0].plan["changed_gpus"] == 0
    for bad, message in [
        ({"pending": [{"count": 1}]}, "pending[0]"),
        ({"pending": [{"profile": "3g.20gb", "count": -1}]}, "pending[0].count"),
        ({"limits": {"executor": "x"}}, "limits.executor"),
        ({"limits": {"gpus": "all"}}, "limits.gpus"),
        ({"limits": {"max_used_destroyed": -1}}, "limits.max_used_destroyed"),
        ({"extra": 1}, "unknown field"),
        ([], "expected a JSON object"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            load_demand(bad)


def test_workload_shapes_for_other_models_are_skipped() -> None:
    snap = _snapshot({"a": [{"gpu": 0, "instances": []}]})
    demand = load_demand(
        {
            "shapes": [
                {"cpu_milli": 1000, "mig_profile": "2g.10gb", "weight": 0.5},
                {"cpu_milli": 1000, "mig_profile": "3g.40gb", "weight": 0.3},
                {"gpus": 1, "gpu_milli": 1000, "weight": 0.2},
            ]
        }
    )
    p = mig.plan_snapshot(snap, demand)[0].plan
    assert p["wanted"] == [{"profile": "2g.10gb", "weight": 1.0}]
    assert [x["profile"] for x in p["gpus"][0]["layout"]] == ["2g.10gb"] * 3
    demand = load_demand(
        {
            "shapes": [
                {"mig_profile": "3g.40gb", "gpu_models": ["A100-SXM4-40GB"], "weight": 1},
            ]
        }
    )
    with pytest.raises(ValueError, match=re.escape("shapes[0].mig_profile")):
        mig.plan_snapshot(snap, demand)


def test_mig_parted_config_round_trips() -> None:
    snap = _snapshot({"gpu-a": FREE_SPLIT + BLOCKED, "gpu-b": FREE_SPLIT})
    demand = load_demand(
        {"pending": [{"profile": "3g.20gb", "count": 3}], "limits": {"max_used_destroyed": 1}}
    )
    plans = mig.plan_snapshot(snap, demand)
    config = mig.mig_parted_config(plans)
    text = mig.to_yaml(config)
    parsed = mig.parse_mig_parted(text)
    assert yaml.safe_load(text)["version"] == "v1"
    names = mig.node_config_names(plans)
    assert set(parsed) == set(names.values())
    for p in plans:
        entries = parsed[names[p.node]]
        assert entries == mig.mig_parted_entries(p.plan)
        for entry, g in zip(entries, p.plan["gpus"], strict=True):
            assert entry["devices"] == [g["gpu"]]
            assert entry["mig-enabled"] is True
            layout = [x["profile"] for x in g["layout"]]
            assert entry["mig-devices"] == {n: layout.count(n) for n in sorted(set(layout))}
            # Every emitted per-GPU config is a valid layout of the model.
            assert mig.validate(
                A100, [n for n, c in entry["mig-devices"].items() for _ in range(c)]
            )
        # The label value is derived from the content: emit again, same name.
        assert mig.config_name(entries) == names[p.node]
        assert re.fullmatch(r"pyctl-[0-9a-f]{12}", names[p.node])
    # A different layout gets a different name (mig-manager acts only on a label change).
    assert names["gpu-a"] != names["gpu-b"]
    assert mig.mig_parted_config(plans) == config  # deterministic


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: v2\nmig-configs: {a: []}", "version: v1"),
        ("version: v1\nmig-configs: {}", "at least one"),
        ("version: v1\nmig-configs: {a: [{devices: all}]}", "mig-enabled"),
        ("version: v1\nmig-configs: {a: [{devices: x, mig-enabled: false}]}", "devices"),
        (
            "version: v1\nmig-configs: {a: [{devices: all, mig-enabled: false, "
            "mig-devices: {1g.5gb: 1}}]}",
            "must be empty",
        ),
        ("version: v1\nmig-configs: {a: [{devices: all, mig-enabled: true, x: 1}]}", "unexpected"),
        (  # the same config name twice: not the last one silently
            "version: v1\nmig-configs:\n  a: [{devices: all, mig-enabled: false}]\n"
            "  a: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: 7}}]\n",
            "mig-parted config: line 4: key 'a' given twice",
        ),
        (
            "version: v1\nmig-configs:\n  a: [&e {devices: all, mig-enabled: false}]\n  b: [*e]\n",
            "mig-parted config: line 4: YAML aliases (*e) are not accepted",
        ),
    ],
)
def test_parse_mig_parted_checks_the_v1_spec(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        mig.parse_mig_parted(text)


def test_gpu_operator_style_config_parses() -> None:
    text = """
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - device-filter: ["0x20B010DE", "0x20B110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
"""
    parsed = mig.parse_mig_parted(text)
    assert parsed["all-balanced"][0]["mig-devices"]["3g.20gb"] == 1
