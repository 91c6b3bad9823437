"""`pyctl plan` on a kubectl dump: prints the compaction it would do; changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main


def _node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": alloc},
    }


def _nrt(name: str, avail: tuple[int, int]) -> dict[str, Any]:
    return {
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"}],
        "zones": [
            {
                "name": f"node-{z}",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "32", "available": str(32 - (4 - avail[z]))},
                    {"name": "nvidia.com/gpu", "capacity": "4", "available": str(avail[z])},
                ],
            }
            for z in range(2)
        ],
    }


def _pod(name: str, node: str | None, gpus: int = 1) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "serving",
            "labels": {"app": "llm"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "llm-x", "controller": True}],
        },
        "spec": {
            **({"nodeName": node} if node else {}),
            "containers": [
                {
                    "name": "c",
                    "resources": {"requests": {"cpu": str(gpus), "nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": []
            if node
            else [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def test_plan_prints_moves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    items = [_node("a"), _node("b"), _nrt("a", (3, 3)), _nrt("b", (1, 3))]
    items += [_pod("a0", "a"), _pod("a1", "a")] + [_pod(f"b{i}", "b") for i in range(4)]
    items.append(_pod("big", None, gpus=4))
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["plan", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["moves"]
    assert out["moves"][0]["from"] == "a"
    assert out["moves"][0]["to"] == "b"
    (rescue,) = out["rescues"]
    assert rescue["pending"] == "serving/big"
    assert rescue["node"] == "a"
    assert [m["pod"] for m in rescue["moves"]] == [m["pod"] for m in out["moves"]]
    assert main(["plan", str(f)]) == 0
    text = capsys.readouterr().out
    assert "observe mode" in text
    assert "serving/big" in text


def test_plan_needs_a_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.json"
    f.write_text('{"nodes": []}')
    assert main(["plan", str(f)]) == 2
    assert "expected a kubectl -o json dump" in capsys.readouterr().err


def test_plan_leaves_out_what_the_controller_leaves_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [_node("a"), _node("b"), _nrt("a", (3, 3)), _nrt("b", (1, 3))]
    items += [_pod("a0", "a"), _pod("a1", "a")] + [_pod(f"b{i}", "b") for i in range(4)]
    items.append(_pod("big", None, gpus=4))
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["plan", str(f), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    # a pending pod asking for GPUs and a MIG instance at once, and a node whose NUMA zones
    # cannot be modelled (an unknown Topology Manager policy)
    both = _pod("both", None, gpus=2)
    both["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/mig-1g.10gb"] = "1"
    odd_node = _node("c")
    odd_node["metadata"]["labels"]["pyctl.io/topology-manager-policy"] = "bogus"
    items += [both, odd_node]
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["plan", str(f), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["moves"] == want["moves"]
    left = {(o["kind"], o["name"]): o for o in got["left_out"]["objects"]}
    assert got["left_out"]["count"] == len(left)
    both = left["Pod", "serving/both"]
    assert "requests both nvidia.com/gpu and a MIG profile" in both["message"]
    assert both["reason"] == "shape_rejected"
    assert "unknown Topology Manager policy" in left["Node", "c"]["message"]
    assert left["Node", "c"]["reason"] == "untranslatable"
