"""Scoring a live cluster from `kubectl get nodes,pods -o json` (with NodeResourceTopology)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.cluster.kube.dump import DumpError, snapshot_from_dump
from pyctl.core.fragmentation import score
from pyctl.model import Shape, Workload


def node(
    name: str, gpus: int, labels: dict[str, str] | None = None, **extra: str
) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus), **extra}
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", **(labels or {})},
        },
        "status": {"capacity": alloc, "allocatable": alloc},
    }


def pod(
    name: str,
    node_name: str | None,
    gpus: int = 0,
    cpu: str = "1",
    extra: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": "1Gi", **(extra or {})}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "serving"},
        "spec": {
            **({"nodeName": node_name} if node_name else {}),
            "containers": [{"name": "c", "resources": {"requests": requests}}],
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def nrt(name: str, zone_gpus: list[tuple[int, int]], policy: str) -> dict[str, Any]:
    return {
        "kind": "NodeResourceTopology",
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "metadata": {"name": name},
        "attributes": [{"name": "topologyManagerPolicy", "value": policy}],
        "zones": [
            {
                "name": f"node-{i}",
                "type": "Node",
                "resources": [
                    {"name": "cpu", "capacity": "32", "allocatable": "32", "available": "24"},
                    {
                        "name": "memory",
                        "capacity": "128Gi",
                        "allocatable": "128Gi",
                        "available": "120Gi",
                    },
                    {
                        "name": "nvidia.com/gpu",
                        "capacity": str(cap),
                        "allocatable": str(cap),
                        "available": str(av),
                    },
                ],
            }
            for i, (cap, av) in enumerate(zone_gpus)
        ],
    }


def dump() -> dict[str, Any]:
    return {
        "kind": "List",
        "apiVersion": "v1",
        "items": [
            node("a", 8),
            nrt("a", [(4, 1), (4, 2)], "single-numa-node"),
            node("b", 4, {f"nvidia.com/gpu-{i}-numa": str(i // 2) for i in range(4)}),
            node(
                "m",
                0,
                {"nvidia.com/gpu.count": "1"},
                **{"nvidia.com/mig-1g.5gb": "4", "nvidia.com/mig-3g.20gb": "1"},
            ),
            pod("p1", "a", gpus=3),
            pod("p2", "a", gpus=2),
            pod("p3", "b", gpus=1),
            pod("p4", "m", extra={"nvidia.com/mig-3g.20gb": "1"}),
            pod("pending", None, gpus=2),
        ],
    }


def test_dump_becomes_a_snapshot() -> None:
    s = snapshot_from_dump(dump())
    a, b, m = s.nodes
    assert a.topology_policy == "single-numa-node"
    assert [len(z.gpus) for z in a.zones] == [4, 4]
    assert [sum(g.used_milli == 0 for g in z.gpus) for z in a.zones] == [1, 2]
    assert [z.cpu_milli_used for z in a.zones] == [8000, 8000]
    assert b.topology_policy == "none"
    assert [len(z.gpus) for z in b.zones] == [2, 2]
    assert [z.cpu_milli for z in b.zones] == [32000, 32000]
    insts = [i for z in m.zones for g in z.mig for i in g.instances]
    assert sorted(i.profile for i in insts) == ["1g.5gb"] * 4 + ["3g.20gb"]
    assert [i.pod for i in insts if i.used] == ["serving/p4"]


def test_issue_case_from_a_dump() -> None:
    r = score(
        snapshot_from_dump(dump()), Workload((Shape(cpu_milli=8000, gpus=2, gpu_milli=1000),))
    )
    a = r.nodes[0]
    assert (a.idle_gpu_milli, a.fragment_gpu_milli, a.categories["numa_split"]) == (
        3000,
        1000,
        1000,
    )


def test_cli_scores_a_dump_and_derives_the_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(dump()))
    assert main(["score", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in out["nodes"]] == ["a", "b", "m"]


def test_malformed_quantity_names_the_pod() -> None:
    d = dump()
    d["items"].append(pod("bad", "a", cpu="two"))
    with pytest.raises(
        DumpError, match=r"pod serving/bad: container c: cpu: malformed quantity .two."
    ):
        snapshot_from_dump(d)


def test_mig_that_cannot_fit_is_an_error() -> None:
    d = dump()
    d["items"][3] = node("m", 0, {"nvidia.com/gpu.count": "1"}, **{"nvidia.com/mig-7g.40gb": "2"})
    with pytest.raises(DumpError, match=r"node m: .*do not fit on 1"):
        snapshot_from_dump(d)
