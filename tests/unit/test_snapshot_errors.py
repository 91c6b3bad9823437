"""Bad snapshots and workloads: a clear error naming the node, zone and field; CLI exit code 2."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.core.fragmentation import score
from pyctl.snapshot import load_snapshot, load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
SNAP: dict[str, Any] = json.loads((EXAMPLES / "snapshot.json").read_text())
WORK: dict[str, Any] = json.loads((EXAMPLES / "workload.json").read_text())


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    s = copy.deepcopy(SNAP)
    obj: Any = s
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return s


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ["nodes", 0, "zones", 0, "cpu_milli_used"],
            40000,
            "nodes['gpu-a'].zones[numa=0].cpu_milli_used: 40000 is above capacity 32000",
        ),
        (
            ["nodes", 0, "zones", 1, "memory_mib"],
            -1,
            "nodes['gpu-a'].zones[numa=1].memory_mib: must not be negative",
        ),
        (
            ["nodes", 0, "zones", 0, "gpus", 0, "used_milli"],
            1200,
            "nodes['gpu-a'].zones[numa=0].gpus[id=0].used_milli: 1200 is above 1000",
        ),
        (["nodes", 1, "name"], "gpu-a", "nodes['gpu-a']: duplicate node name"),
        (["nodes", 0, "zones", 1, "numa"], 0, "nodes['gpu-a'].zones[numa=0]: duplicate NUMA id"),
        (["nodes", 0, "zones", 1, "gpus", 0, "id"], 1, "GPU id 1 appears twice"),
        (["nodes", 0, "topology_policy"], "strict", "topology_policy: 'strict' is not one of"),
        (["nodes", 0, "zones", 0, "cpu_milli"], "32", "cpu_milli: expected a number, got str"),
        (["nodes", 0, "zones", 0, "cores"], 32, "unknown field(s) cores"),
        (["nodes", 0, "zones"], [], "a node needs at least one NUMA zone"),
        (
            ["nodes", 0, "zones", 0, "gpus", 0, "link_levels"],
            {"two": 0},
            "gpus[id=0].link_levels['two']: expected a size of 1..1024 GPUs",
        ),
        (
            ["nodes", 0, "zones", 0, "gpus", 0, "link_levels"],
            {"2": -1},
            "gpus[id=0].link_levels.2: must not be negative",
        ),
        (
            ["nodes", 0, "zones", 0, "gpus", 0, "link_levels"],
            {str(k): 0 for k in range(1, 18)},
            "gpus[id=0].link_levels: 17 levels, more than 16",
        ),
        (
            ["nodes", 0, "zones", 0, "gpus"],
            [{"id": i, "used_milli": 0, "link_levels": {"1": 5}} for i in range(2)],
            "nodes['gpu-a']: link group 5 of level 1 holds 2 GPUs, more than 1",
        ),
    ],
)
def test_snapshot_errors(path: list[Any], value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        load_snapshot(_mutate(path, value))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ["nodes", 0, "gpu_model"],
            "Z9000-XL",
            'nodes["gpu-a"].gpu_model: unknown MIG-capable GPU model "Z9000-XL"',
        ),
        (
            ["nodes", 0, "zones", 0, "mig", 0, "instances", 1, "profile"],
            "3g.99gb",
            'nodes["gpu-a"].zones[numa=0].mig[gpu=2].instances[1]: unknown MIG profile',
        ),
        (
            ["nodes", 0, "zones", 0, "mig", 0, "instances", 1, "start"],
            2,
            "3g.20gb cannot start at memory slice 2",
        ),
        (
            ["nodes", 0, "zones", 0, "mig", 0, "instances", 1],
            {"profile": "4g.20gb", "start": 0, "used": False},
            "these instances overlap or exceed the GPU",
        ),
    ],
)
def test_snapshot_errors_found_by_the_core(path: list[Any], value: Any, message: str) -> None:
    snap = load_snapshot(_mutate(path, value))
    with pytest.raises(ValueError, match=re.escape(message)):
        score(snap, load_workload(WORK))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"gpus": 1, "gpu_milli": 500, "weight": 0}, "shapes[0].weight: must be positive"),
        ({"gpus": 1, "gpu_milli": 500, "weight": -1}, "shapes[0].weight: must be positive"),
        ({"gpus": 1, "gpu_milli": 500}, "shapes[0].weight: expected a positive number"),
        ({"gpus": 1, "gpu_milli": 1500, "weight": 1}, "must be in 0..=1000"),
        ({"gpu_memory_mib": 1000, "weight": 1}, "shapes[0].gpu_memory_mib: only a shape"),
        (
            {"mig_profile": "1g.5gb", "gpus": 1, "gpu_memory_mib": 10, "weight": 1},
            "shapes[0].gpu_memory_mib: only a shape",
        ),
        ({"gpus": 1, "gpu_pool": 3, "weight": 1}, "shapes[0].gpu_pool: expected a string"),
        ({"mig_profile": "5g.77gb", "weight": 1}, 'unknown MIG profile "5g.77gb"'),
        ({"cpu_milli": -5, "weight": 1}, "shapes[0].cpu_milli: must not be negative"),
    ],
)
def test_workload_errors(shape: dict[str, Any], message: str) -> None:
    snap = load_snapshot(SNAP)
    with pytest.raises(ValueError, match=re.escape(message)):
        score(snap, load_workload({"shapes": [shape]}))


def _write(tmp: Path, name: str, content: str) -> str:
    f = tmp / name
    f.write_text(content)
    return str(f)


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(EXAMPLES / "snapshot.json")
    work = str(EXAMPLES / "workload.json")
    assert main(["score", snap, "--workload", work]) == 0
    out = capsys.readouterr().out
    assert "gpu-a" in out
    assert "fragment" in out
    bad = _write(
        tmp_path, "bad.json", json.dumps(_mutate(["nodes", 0, "zones", 0, "cpu_milli"], -3))
    )
    assert main(["score", bad, "--workload", work]) == 2
    assert "must not be negative" in capsys.readouterr().err
    broken = _write(tmp_path, "broken.json", '{"nodes": [')
    assert main(["score", broken, "--workload", work]) == 2
    assert "broken JSON" in capsys.readouterr().err
    assert main(["score", snap]) == 2
    assert "needs --workload" in capsys.readouterr().err
    model = _write(tmp_path, "m.json", json.dumps(_mutate(["nodes", 0, "gpu_model"], "Z9000")))
    assert main(["score", model, "--workload", work]) == 2
    assert "unknown MIG-capable GPU model" in capsys.readouterr().err


def test_cli_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    snap = str(EXAMPLES / "snapshot.json")
    work = str(EXAMPLES / "workload.json")
    assert main(["score", snap, "--workload", work, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["cluster"]) >= {
        "idle_gpu_milli",
        "fragment_gpu_milli",
        "fragmentation_rate",
        "idle_mig_slices",
        "fragment_mig_slices",
        "recoverable_mig_slices",
        "categories",
    }
    node = out["nodes"][0]
    assert set(node) >= {"name", "idle_gpu_milli", "fragment_gpu_milli", "categories", "zones"}
    assert set(node["zones"][0]) >= {"numa", "idle_gpu_milli", "fragment_gpu_milli"}
    assert out["cluster"]["fragment_gpu_milli"] == sum(
        n["fragment_gpu_milli"] for n in out["nodes"]
    )


def test_link_levels_round_trip_on_both_kinds_of_gpu() -> None:
    from pyctl.snapshot import snapshot_to_json

    s = copy.deepcopy(SNAP)
    z = s["nodes"][0]["zones"][0]
    z["gpus"][0]["link_levels"] = {"2": 3, "1": 7}
    z["dra_gpus"] = [{"id": 99, "used_milli": 0, "link": 1, "link_levels": {"4": 1}}]
    snap = load_snapshot(s)
    zone = snap.nodes[0].zones[0]
    assert zone.gpus[0].link_levels == ((1, 7), (2, 3))
    assert (zone.dra_gpus[0].link, zone.dra_gpus[0].link_levels) == (1, ((4, 1),))
    assert load_snapshot(snapshot_to_json(snap)) == snap
