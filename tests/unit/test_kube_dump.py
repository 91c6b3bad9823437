"""Scoring a live cluster from `kubectl get nodes,pods -o json` (with NodeResourceTopology), read
the controller's way: a hostile object is left out with the controller's reason, the rest is
scored."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pyctl.cli.main import main
from pyctl.cluster.kube.dump import DumpError, read_dump
from pyctl.controller.view import view_of
from pyctl.core.fragmentation import score
from pyctl.model import Shape, Snapshot, Workload


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


def snapshot_from_dump(data: dict[str, Any]) -> Snapshot:
    return view_of(read_dump(data)).snapshot()


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


def _score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: dict[str, Any]
) -> tuple[int, dict[str, Any], str]:
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(data))
    code = main(["score", str(f), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


def test_malformed_quantity_leaves_the_pod_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = dump()
    d["items"].append(pod("bad", "a", cpu="two"))
    code, out, err = _score(tmp_path, capsys, d)
    assert code == 0
    assert [n["name"] for n in out["nodes"]] == ["a", "b", "m"]
    assert out["left_out"]["count"] == 1
    (lo,) = out["left_out"]["objects"]
    assert (lo["kind"], lo["name"], lo["reason"]) == ("Pod", "serving/bad", "bad_quantity")
    assert "cpu: malformed quantity 'two'" in lo["message"]
    assert err.count("\n") == 1
    assert "left out: Pod serving/bad (bad_quantity)" in err


@pytest.mark.parametrize(
    ("resource", "value"),
    [("nvidia.com/gpu", "4294967296"), ("nvidia.com/gpu", "-3"), ("cpu", "1e30")],
)
def test_one_hostile_pod_is_left_out_and_every_node_scored(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], resource: str, value: str
) -> None:
    """The issue's case: a tenant's pod the API server accepts, with an absurd request, on node
    a. It is left out (named, with the controller's reason); every node is scored, and node a
    as if the pod did not exist."""
    clean = _score(tmp_path, capsys, dump())[1]
    d = dump()
    evil = pod("evil", "a", extra={resource: value})
    evil["metadata"]["namespace"] = "tenant-x"
    d["items"].insert(5, evil)
    code, out, err = _score(tmp_path, capsys, d)
    assert code == 0, err
    assert [n["name"] for n in out["nodes"]] == ["a", "b", "m"]
    assert out["nodes"] == clean["nodes"]
    assert out["left_out"]["count"] == 1
    (lo,) = out["left_out"]["objects"]
    assert (lo["kind"], lo["name"], lo["reason"]) == ("Pod", "tenant-x/evil", "out_of_bounds")
    assert lo["message"].startswith("items[5]: ")
    assert resource in lo["message"]
    (line,) = err.splitlines()
    assert line.startswith("pyctl: left out: Pod tenant-x/evil (out_of_bounds): items[5]: ")
    # the table view says the same on stderr, and the count on stdout
    f = tmp_path / "dump.json"
    assert main(["score", str(f)]) == 0
    out_text, err_text = capsys.readouterr()
    assert err_text == err
    assert "left out: 1 objects" in out_text


def test_a_file_that_is_not_a_dump_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "dump.json"
    for body in ('{"kind": "List", "items": {"a": 1}}', "[1, 2]", "{not json"):
        f.write_text(body)
        assert main(["score", str(f), "--json"]) == 2
        out, err = capsys.readouterr()
        assert out == "", body
        assert err.count("\n") == 1, (body, err)
    with pytest.raises(DumpError, match="'items' must be a list"):
        read_dump({"kind": "List", "items": {"a": 1}})


def test_mig_that_cannot_fit_leaves_the_node_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = dump()
    d["items"][3] = node("m", 0, {"nvidia.com/gpu.count": "1"}, **{"nvidia.com/mig-7g.40gb": "2"})
    assert [n.name for n in snapshot_from_dump(d).nodes] == ["a", "b"]
    code, out, err = _score(tmp_path, capsys, d)
    assert code == 0
    assert [n["name"] for n in out["nodes"]] == ["a", "b"]
    (lo,) = out["left_out"]["objects"]
    assert (lo["kind"], lo["name"], lo["reason"]) == ("Node", "m", "untranslatable")
    assert "do not fit on 1" in lo["message"]
    assert "left out: Node m (untranslatable)" in err


def test_a_command_that_fails_after_leaving_objects_out_says_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The only GPU pod is hostile: no M can be derived, exit 2, and one line (which counts the
    objects left out); the objects are named only by a command that has its result."""
    d = {"kind": "List", "items": [node("a", 8), pod("evil", "a", gpus=0, extra={"cpu": "1e30"})]}
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(d))
    for argv in (["score", str(f)], ["plan", str(f), "--json"]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == ""
        (line,) = err.splitlines()
        assert "no GPU pods to derive a workload from (1 objects left out)" in line
