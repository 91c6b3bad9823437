"""`pyctl score` and `pyctl plan` on a kubectl dump with `resource.k8s.io` objects, and the
DeviceTaintRules pyctl would use to steer the allocator on a DynamicMIG GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.cluster.translate import model_of
from pyctl.model import Shape, Workload
from pyctl.workflows.dra_taints import STEER_KEY, steering_rules
from tests.dumps import dra_context, records
from tests.e2e.dra_driver_sim import SimGpu, SimNode, device_classes, slices_for
from tests.unit.test_dra import ALIGNED, claim_json, gpus, mig_request

NS = "ns"


def node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi"}
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": alloc},
    }


def pod(name: str, node: str | None, claims: dict[str, str], owner: str = "rs") -> dict[str, Any]:
    rcs = [{"name": k, "resourceClaimName": v} for k, v in claims.items() if not v.startswith("t:")]
    rcs += [
        {"name": k, "resourceClaimTemplateName": v[2:]}
        for k, v in claims.items()
        if v.startswith("t:")
    ]
    statuses = [
        {"name": k, "resourceClaimName": f"{name}-{k}"}
        for k, v in claims.items()
        if v.startswith("t:")
    ]
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "controller": True}],
        },
        "spec": {
            **({"nodeName": node} if node else {}),
            "resourceClaims": rcs,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
        "status": {
            "phase": "Running" if node else "Pending",
            "resourceClaimStatuses": statuses,
            "conditions": [
                {"type": "PodScheduled", "status": "True"}
                if node
                else {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            ],
        },
    }


def dump(tmp_path: Path) -> Path:
    eight = SimNode("n8", [SimGpu(i, i // 4) for i in range(8)])
    items: list[dict[str, Any]] = [node("n8"), *device_classes(), *slices_for(eight)]
    # one replica in each zone (generated claims), a pending 4-GPU aligned claim, a pod whose
    # 2 unconstrained GPUs span the zones, and one whose selector pyctl cannot evaluate
    for i, dev in ((0, "gpu-0"), (1, "gpu-4")):
        items.append(
            claim_json(f"small-{i}-gpus", [gpus(1)], None, [("gpus", "", dev)], "n8", f"small-{i}")
        )
        items.append(pod(f"small-{i}", "n8", {"gpus": "t:one"}))
    items.append(claim_json("big-0-gpus", [gpus(4)], ALIGNED))
    items.append(pod("big-0", None, {"gpus": "t:four"}))
    items.append(
        claim_json(
            "spread",
            [gpus(2)],
            None,
            [("gpus", "", "gpu-1"), ("gpus", "", "gpu-5")],
            "n8",
            "spread",
        )
    )
    items.append(pod("spread", "n8", {"gpus": "spread"}))
    items.append(claim_json("odd", [gpus(1, ("cel.bind(x, 1, x == 1)",))]))
    items.append(pod("odd", None, {"gpus": "odd"}))
    for c in items:
        if c.get("kind") == "ResourceClaim":
            c["apiVersion"] = "resource.k8s.io/v1"
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def test_score_on_a_dra_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = dump(tmp_path)
    assert main(["score", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (n8,) = out["nodes"]
    assert n8["idle_gpu_milli"] == 4000  # 8 DRA GPUs, 4 allocated
    assert [z["idle_gpu_milli"] for z in n8["zones"]] == [2000, 2000]
    dra = out["dra"]
    assert dra["nodes"]["n8"]["zones_by"] == "numaNode"
    assert [x["pod"] for x in dra["pods_spanning_numa_nodes"]] == [f"{NS}/spread"]
    assert list(dra["unknown_requests"]) == [f"{NS}/odd"]
    assert "CEL" in dra["unknown_requests"][f"{NS}/odd"]
    # the workload derived from the pods includes the 4-aligned claim (from its claim's spec):
    # the 4 idle GPUs (2 + 2) are numa_split for it
    assert out["cluster"]["categories"]["numa_split"] > 0
    assert main(["score", str(path)]) == 0
    text = capsys.readouterr().out
    assert "its devices span NUMA nodes" in text
    assert "DRA unknown: ns/odd" in text


def test_plan_on_a_dra_dump_moves_template_pods_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = dump(tmp_path)
    assert main(["plan", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "standalone ResourceClaim" in out["refused"][f"{NS}/spread"]
    assert all(
        m["pod"].startswith(f"{NS}/small-") or m["pod"] == f"{NS}/spread" for m in out["moves"]
    )
    assert not any(m["pod"] == f"{NS}/spread" for m in out["moves"])


def test_steering_taints_the_placements_that_strand_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an empty DynamicMIG H100; M: 1g.10gb and 4g.40gb through DRA. 4g.40gb has one placement
    # (slices 0-3): a 1g.10gb at slices 0-3 strands it, at 4-6 it does not
    m = SimNode("m", [SimGpu(0, 0, dynamic_mig=True)])
    items: list[dict[str, Any]] = [node("m"), *device_classes(), *slices_for(m)]
    items.append(claim_json("c1", [mig_request("1g.10gb")]))
    items.append(pod("p1", None, {"part": "c1"}))
    data = {"apiVersion": "v1", "kind": "List", "items": items}
    dra = dra_context(data)
    nodes, _, _, _ = records(data)
    model, dm = model_of(nodes[0], None, [], dra=dra)
    assert dm is not None
    w = Workload(
        (
            Shape(gpus=1, mig_profile="1g.10gb", dra=True, weight=0.5),
            Shape(gpus=1, mig_profile="4g.40gb", dra=True, weight=0.5),
        )
    )
    rules = steering_rules({"m": model}, {"m": dm}, w)
    tainted = sorted(r.device for r in rules)
    assert tainted == [f"gpu-0-mig-1g10gb-19-{s}" for s in range(4)]
    assert all(r.key == STEER_KEY and r.value == "1g.10gb" for r in rules)
    spec = rules[0].manifest()["spec"]
    assert spec["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": "m",
        "device": rules[0].device,
    }
    assert spec["taint"]["effect"] == "NoSchedule"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data))
    wpath = tmp_path / "w.json"
    wpath.write_text(
        json.dumps(
            {
                "shapes": [
                    {"gpus": 1, "mig_profile": "1g.10gb", "dra": True, "weight": 1},
                    {"gpus": 1, "mig_profile": "4g.40gb", "dra": True, "weight": 1},
                ]
            }
        )
    )
    assert main(["plan", str(path), "--workload", str(wpath), "--no-device-taint-rules"]) == 0
    text = capsys.readouterr().out
    assert "does not serve DeviceTaintRules" in text
    assert "gpu-0-mig-1g10gb-19-0" in text
