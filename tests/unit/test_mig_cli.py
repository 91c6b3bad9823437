"""`pyctl mig ...`: output, exit codes (0 valid, 1 invalid, 2 bad input) and the files it reads
and writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.core import mig

SNAPSHOT = {
    "nodes": [
        {
            "name": "gpu-a",
            "gpu_model": "NVIDIA-A100-SXM4-40GB",
            "topology_policy": "single-numa-node",
            "zones": [
                {
                    "numa": 0,
                    "cpu_milli": 32000,
                    "memory_mib": 262144,
                    "gpus": [{"id": 0, "used_milli": 1000}],
                    "mig": [
                        {
                            "gpu": 2,
                            "instances": [
                                {"profile": "3g.20gb", "start": 0, "used": True, "pod": "ns/a"},
                                {"profile": "1g.5gb", "start": 4, "used": False},
                                {"profile": "1g.5gb", "start": 5, "used": False},
                                {"profile": "1g.10gb", "start": 6, "used": False},
                            ],
                        }
                    ],
                }
            ],
        }
    ]
}
DEMAND = {"pending": [{"profile": "3g.20gb", "count": 1}]}


def _files(tmp_path: Path, snapshot: Any = SNAPSHOT, demand: Any = DEMAND) -> tuple[str, str]:
    s, d = tmp_path / "snap.json", tmp_path / "demand.json"
    s.write_text(json.dumps(snapshot))
    d.write_text(json.dumps(demand))
    return str(s), str(d)


def test_validate_valid_and_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "validate", "NVIDIA-A100-SXM4-40GB", "4g.20gb", "3g.20gb"]) == 0
    out = capsys.readouterr().out
    assert "valid on A100-SXM4-40GB: 4g.20gb@0 + 3g.20gb@4" in out
    assert main(["mig", "validate", "A100-SXM4-40GB", "4g.20gb", "3g.20gb", "--pre-r510"]) == 1
    assert "invalid on A100-SXM4-40GB" in capsys.readouterr().out
    assert main(["mig", "validate", "A100-SXM4-40GB", "1g.5gb@1", "1g.5gb@5", "3g.20gb"]) == 1
    assert "no placement" in capsys.readouterr().out


def test_validate_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "validate", "A30", "2g.12gb", "1g.6gb@2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == {
        "gpu_model": "A30-24GB",
        "valid": True,
        "placements": [{"profile": "2g.12gb", "start": 0}, {"profile": "1g.6gb", "start": 2}],
        "reason": None,
        "placements_inferred": False,
    }


def test_inferred_models_say_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mig", "validate", "NVIDIA-B200", "3g.90gb", "4g.90gb"]) == 0
    captured = capsys.readouterr()
    assert "placements of B200-180GB are inferred" in captured.err
    assert main(["mig", "layouts", "B200"]) == 0
    assert "inferred" in capsys.readouterr().err
    assert main(["mig", "layouts", "A100-SXM4-40GB"]) == 0
    assert "inferred" not in capsys.readouterr().err
    # captured on a real H200 (tests/data/gpu-probe): no longer said to be inferred
    assert main(["mig", "validate", "NVIDIA-H200", "3g.71gb", "4g.71gb"]) == 0
    assert "inferred" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["validate", "T4", "1g.5gb"], 'unknown MIG-capable GPU model "T4"'),
        (["validate", "A100-SXM4-40GB", "5g.25gb"], 'unknown MIG profile "5g.25gb"'),
        (["validate", "A100-SXM4-40GB", "1g.10gb@7"], "is outside the GPU"),
        (["validate", "A100-SXM4-40GB", "3g.20gb@0", "1g.5gb@2"], "overlaps instances[0]"),
        (["layouts", "A100-SXM4-40GB", "--profiles", "1g.5gb,9g.99gb"], '"9g.99gb"'),
        (["layouts", "L40S"], "unknown MIG-capable GPU model"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["mig", *argv]) == 2
    assert message in capsys.readouterr().err


def test_layouts_counts(capsys: pytest.CaptureFixture[str]) -> None:
    base = "1g.5gb,2g.10gb,3g.20gb,4g.20gb,7g.40gb"
    assert main(["mig", "layouts", "A100-SXM4-40GB", "--profiles", base]) == 0
    assert "12 maximal layouts (37 valid multisets)" in capsys.readouterr().out
    assert main(["mig", "layouts", "A100-SXM4-40GB", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["valid_multisets"], len(got["maximal"])) == (77, 28)
    assert main(["mig", "layouts", "A100-SXM4-40GB", "--media-extensions", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["maximal"]) == 44


def test_plan_readable_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap, demand = _files(tmp_path)
    out_yaml = tmp_path / "mig.yaml"
    assert main(["mig", "plan", snap, "--demand", demand, "--mig-parted", str(out_yaml)]) == 0
    text = capsys.readouterr().out
    assert "node gpu-a (A100-SXM4-40GB" in text
    assert "GPU 2: re-partition" in text
    assert "3g.20gb: 1 pending, served 0 now, 1 after the plan" in text
    assert "kubectl label node gpu-a nvidia.com/mig.config=pyctl-" in text
    configs = mig.parse_mig_parted(out_yaml.read_text())
    assert main(["mig", "plan", snap, "--demand", demand, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    node = got["nodes"][0]
    assert node["mig_config"] in configs
    assert got["mig_parted"]["mig-configs"] == configs
    assert configs[node["mig_config"]] == [
        {"devices": [2], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}
    ]
    assert node["gpus"][0]["pods_to_move"] == []


@pytest.mark.parametrize(
    ("demand", "message"),
    [
        ({"pending": [{"profile": "3g.40gb"}]}, "has no MIG profile '3g.40gb'"),
        ({"pending": [{"profile": "3g.20gb", "count": "two"}]}, "pending[0].count"),
        ({"limits": {"executor": "nvml"}}, "limits.executor"),
    ],
)
def test_plan_bad_demand_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], demand: Any, message: str
) -> None:
    snap, d = _files(tmp_path, demand=demand)
    assert main(["mig", "plan", snap, "--demand", d]) == 2
    assert message in capsys.readouterr().err


def test_plan_bad_snapshot_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = json.loads(json.dumps(SNAPSHOT))
    bad["nodes"][0]["zones"][0]["mig"][0]["instances"][1]["start"] = 1  # overlaps the 3g at 0
    snap, d = _files(tmp_path, snapshot=bad)
    assert main(["mig", "plan", snap, "--demand", d]) == 2
    assert "overlaps another instance" in capsys.readouterr().err
    unknown = json.loads(json.dumps(SNAPSHOT))
    unknown["nodes"][0]["gpu_model"] = "Tesla-T4"
    snap, d = _files(tmp_path, snapshot=unknown)
    assert main(["mig", "plan", snap, "--demand", d]) == 2
    assert "unknown MIG-capable GPU model" in capsys.readouterr().err
    assert main(["mig", "plan", "/nonexistent.json", "--demand", d]) == 2
