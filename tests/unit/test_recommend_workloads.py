"""`pyctl recommend` on a kubectl dump: inventory (owners, pools, hostile objects), right-sizing
from usage (attribution of series, stale pods, MIG profiles), recommendations, patches (checked
with a real `kubectl patch --local` and `kubectl kustomize` when kubectl is on PATH), and the
resource classes with the MIG planner's layouts."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pyctl.cluster.selectors import parse_selector
from pyctl.core import mig
from pyctl.recommend.inventory import Owner, from_objects, mig_gpus_needed, pools
from pyctl.recommend.prometheus import ContainerUsage, UsageReport
from pyctl.recommend.report import Options, Report, recommend

from .recommend_cluster import cluster, pod, replicaset


def usage(entries: dict[tuple[str, str], tuple[float, float | None, str]]) -> UsageReport:
    """(namespace, pod) -> (peak MiB, p95 utilization, GPU_I_PROFILE) as read from Prometheus."""
    u = UsageReport("test", 86400.0, 0.0, 60.0, util_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    for (ns, p), (peak, util, prof) in entries.items():
        u.containers[(ns, p, "server")] = ContainerUsage(
            ns, p, "server", peak, util, (prof,), 1, 10
        )
    return u


def by_name(r: Report) -> dict[str, Any]:
    return {w.workload.owner.name: w for w in r.workloads}


def test_inventory_owners_pools_and_gpu_counts() -> None:
    inv = from_objects(cluster()["items"])
    assert not inv.problems
    owners = {r.owner for r in inv.replicas}
    assert Owner("Deployment", "serving", "bert") in owners  # via the ReplicaSet object
    assert Owner("Deployment", "serving", "frontend") in owners  # CPU-only replicas count too
    nodes = {n.name: n for n in inv.nodes}
    # a100-a: 4 whole GPUs + the MIG GPUs that hold 8 x 1g.5gb, 4 x 1g.10gb, 3 x 2g.10gb and
    # 2 x 3g.20gb; nvidia.com/gpu.count says 8
    assert nodes["a100-a"].gpus == 8
    assert mig_gpus_needed("NVIDIA-A100-SXM4-40GB", [("1g.5gb", 8)]) == 2  # 7 per GPU
    # 4 x 1g.10gb take all 8 memory slices of a GPU; 1g.5gb cannot use slice 7: 3 GPUs
    assert mig_gpus_needed("NVIDIA-A100-SXM4-40GB", [("1g.5gb", 8), ("1g.10gb", 4)]) == 3
    assert nodes["l40s-a"].gpu_memory_mib == 46068  # from nvidia.com/gpu.memory
    ps = pools(inv)
    assert set(ps) == {"NVIDIA-A100-SXM4-40GB", "NVIDIA-L40S"}
    assert ps["NVIDIA-A100-SXM4-40GB"].mig
    assert ps["NVIDIA-A100-SXM4-40GB"].gpus == 16
    assert not ps["NVIDIA-L40S"].mig
    assert not ps["NVIDIA-L40S"].shares


def test_owner_from_the_template_hash_without_replicasets() -> None:
    items = [o for o in cluster()["items"] if o["kind"] != "ReplicaSet"]
    inv = from_objects(items)
    assert Owner("Deployment", "serving", "bert") in {r.owner for r in inv.replicas}


def test_hostile_objects_are_isolated_and_named() -> None:
    bad_pod = pod("serving", "bert", 99, "a100-a", "nvidia.com/mig-1g.5gb")
    bad_pod["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/mig-1g.5gb"] = "1.5"
    items = [*cluster()["items"], bad_pod, "not an object", {"kind": "Pod", "spec": 7}]
    inv = from_objects(items)
    assert len(inv.problems) == 3
    assert any("bert-7c9f-00099" in p for p in inv.problems)
    good = from_objects(cluster()["items"])
    assert len(inv.replicas) == len(good.replicas)  # the good ones are all there


def test_recommend_without_usage_rounds_requests_up_to_the_menu() -> None:
    r = recommend(from_objects(cluster()["items"]), None, Options(tolerance_pct=10.0))
    a100 = r.pool("NVIDIA-A100-SXM4-40GB")
    menu = [s.name for s in a100.menu]
    rec = a100.tradeoff.recommended
    assert rec is not None
    best = max(x.served_pct for x in a100.tradeoff.rows)
    assert rec.served_pct >= best - 10.0
    assert len(menu) <= len(a100.tradeoff.candidates)
    w = by_name(r)
    # every replica's recommended size is the smallest menu size holding its request
    for name, want in (("bert", "1g.5gb"), ("resnet", "2g.10gb"), ("llm", "gpu")):
        got = w[name].recommended
        assert got in menu
        pool = a100.pool
        need = pool.request_size(1, 0, want if want != "gpu" else None)[1]
        holding = sorted((s for s in a100.menu if s.holds(need)), key=lambda s: s.order())
        assert got == holding[0].name
    assert w["trainer"].recommended == "2 gpus"
    assert not w["trainer"].change
    assert w["l40s-app"].recommended == "gpu"


def test_usage_right_sizes_and_attributes_series() -> None:
    dump = cluster()
    # usage: embed (1g.10gb) peaks at 2 GiB -> 2.4 GiB fits 1g.5gb; bert peaks at 4.5 GiB ->
    # 5.4 GiB needs 1g.10gb or more; resnet's series come from an earlier ReplicaSet's pod and
    # from a pod of an earlier revision; a pod of a deleted workload is stale
    u = usage(
        {
            ("serving", "embed-7c9f-00000"): (2048.0, 0.5, "1g.10gb"),
            ("serving", "bert-7c9f-00001"): (4608.0, 0.6, "1g.5gb"),
            ("serving", "resnet-7c9f-00077"): (3000.0, 0.4, "2g.10gb"),
            ("serving", "resnet-5b6d8-abcde"): (3500.0, 0.9, "3g.20gb"),
            ("serving", "gone-6f7d8-zzzzz"): (9000.0, 0.9, ""),
        }
    )
    r = recommend(from_objects(dump["items"]), u, Options(headroom=0.2, tolerance_pct=100.0))
    a = r.attribution
    assert a is not None
    assert a.stale_series_pods == ["serving/gone-6f7d8-zzzzz"]
    assert a.profile_mismatches == [
        "serving/resnet-5b6d8-abcde: usage on a 3g.20gb instance, the workload requests 2g.10gb"
    ]
    res = a.usage[Owner("Deployment", "serving", "resnet")]
    assert res.pods == 0
    assert res.earlier_pods == 2
    assert res.peak_memory_mib == 3500.0
    # compute floor: 0.9 x 3/7 (the 3g instance) beats 0.4 x 2/7
    assert res.compute_floor is not None
    assert abs(float(res.compute_floor) - 0.9 * 3 / 7) < 1e-9
    w = by_name(r)
    emb = w["embed"]
    assert emb.need.memory_mib == 2458  # ceil(2048 x 1.2)
    bert = w["bert"]
    assert bert.need.memory_mib == 5530
    # the menu's smallest sizes holding the needs
    pool = r.pool("NVIDIA-A100-SXM4-40GB")
    for rec in (emb, bert):
        held = [s for s in pool.menu if s.holds(rec.need)]
        assert rec.recommended == min(held, key=lambda s: s.order()).name
    assert "peak 4.50 GiB +20% = 5.40 GiB" in bert.why
    assert w["llm"].why.startswith("no usage data")


def test_patch_changes_only_the_gpu_container(tmp_path: Path) -> None:
    # embed requests 1g.10gb; with a menu without it (tolerance 100: the fewest sizes) it moves
    u = usage({("serving", "embed-7c9f-00000"): (2048.0, 0.2, "1g.10gb")})
    r = recommend(from_objects(cluster()["items"]), u, Options(tolerance_pct=100.0))
    emb = by_name(r)["embed"]
    assert emb.change
    assert emb.patch is not None
    body = emb.patch.body
    (c,) = body["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "server"
    new = f"nvidia.com/mig-{emb.recommended}" if emb.recommended != "gpu" else "nvidia.com/gpu"
    assert c["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": None, new: "1"}}
    assert emb.patch.command.startswith(
        "kubectl -n serving patch deployment embed --type strategic"
    )
    files = r.patch_files()
    assert set(files) == {p.file_name for p in r.patches()} | {"kustomization.yaml"}
    assert "serving.deployment.embed.yaml" in files
    doc = yaml.safe_load(files["serving.deployment.embed.yaml"])
    assert doc["kind"] == "Deployment"
    assert doc["metadata"] == {"name": "embed", "namespace": "serving"}
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: the patch was not checked by a real kubectl")
    base = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "embed", "namespace": "serving"},
        "spec": {
            "selector": {"matchLabels": {"app": "embed"}},
            "template": {
                "metadata": {"labels": {"app": "embed"}},
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "x"},
                        {
                            "name": "server",
                            "image": "y",
                            "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
                        },
                    ]
                },
            },
        },
    }
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(base))
    out = subprocess.run(
        [
            kubectl,
            "patch",
            "--local",
            "--kubeconfig",
            "/dev/null",
            "-f",
            str(tmp_path / "deploy.yaml"),
            "--type",
            "strategic",
            "-p",
            json.dumps(body),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)["spec"]["template"]["spec"]["containers"]
    assert got[0] == {"name": "sidecar", "image": "x"}
    assert got[1]["resources"] == {"limits": {new: "1"}}
    # the kustomize files: the patch applied by kubectl's kustomize to the same base
    kdir = tmp_path / "k"
    kdir.mkdir()
    (kdir / "deploy.yaml").write_text(yaml.safe_dump(base))
    (kdir / emb.patch.file_name).write_text(files[emb.patch.file_name])
    k = yaml.safe_load(files["kustomization.yaml"])
    # the base here holds only the embed Deployment: only its patch
    k["patches"] = [p for p in k["patches"] if p["path"] == emb.patch.file_name]
    k["resources"] = ["deploy.yaml"]
    (kdir / "kustomization.yaml").write_text(yaml.safe_dump(k))
    out = subprocess.run(
        [kubectl, "kustomize", str(kdir)], capture_output=True, text=True, timeout=60, check=True
    )
    got = yaml.safe_load(out.stdout)["spec"]["template"]["spec"]["containers"]
    named = {c["name"]: c for c in got}
    assert named["server"]["resources"] == {"limits": {new: "1"}}
    assert "resources" not in named["sidecar"]


def test_no_patch_for_a_bare_pod_or_an_unknown_container() -> None:
    bare = pod("serving", "solo", 0, "a100-a", "nvidia.com/mig-1g.10gb", owner_kind="")
    bare["metadata"]["ownerReferences"] = []
    two = pod("serving", "twin", 0, "a100-a", "nvidia.com/mig-1g.10gb")
    two["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    dump = cluster(extra=[bare, two, replicaset("serving", "twin", "7c9f")])
    u = usage(
        {
            ("serving", "solo-0"): (1000.0, 0.1, "1g.10gb"),
            ("serving", "twin-7c9f-00000"): (1000.0, 0.1, "1g.10gb"),
            ("serving", "embed-7c9f-00000"): (1000.0, 0.1, "1g.10gb"),
        }
    )
    r = recommend(from_objects(dump["items"]), u, Options(tolerance_pct=100.0))
    w = by_name(r)
    solo, twin = w["solo-0"], w["twin"]
    assert solo.workload.owner.kind == "Pod"
    if solo.change:
        assert solo.patch is None
        assert "without a controller" in solo.no_patch
    if twin.change:
        assert twin.patch is None
        assert "2 containers request" in twin.no_patch


def test_classes_and_mig_parted_config() -> None:
    r = recommend(from_objects(cluster()["items"]), None, Options())
    names = [(c.name, c.pool) for c in r.classes.classes]
    assert ("gpu-large", "NVIDIA-A100-SXM4-40GB") in names
    assert ("mig", "NVIDIA-A100-SXM4-40GB") in names
    assert ("gpu-large", "NVIDIA-L40S") in names
    assert ("cpu-micro", "") in names
    mig_class = next(c for c in r.classes.classes if c.name == "mig")
    # the MIG class gets the node that has MIG now; gpu-large the one without
    assert mig_class.nodes == ("a100-a",)
    large = next(c for c in r.classes.classes if c.name == "gpu-large" and "A100" in c.pool)
    assert large.nodes == ("a100-b",)
    assert not large.reconfigure
    text = r.mig_parted_yaml()
    assert text is not None
    configs = mig.parse_mig_parted(text)
    (name,) = configs
    assert mig_class.node_configs == {"a100-a": name}
    served: dict[str, int] = {}
    for entry in configs[name]:
        assert mig.validate(
            "A100-SXM4-40GB", [p for p, n in entry["mig-devices"].items() for _ in range(n)]
        )
        for p, n in entry["mig-devices"].items():
            served[p] = served.get(p, 0) + n
    for p, n in mig_class.demand.items():
        assert served.get(p, 0) >= n
    assert any(f"nvidia.com/mig.config={name}" in c for c in mig_class.label_commands())


def test_classes_report_a_shortfall() -> None:
    many = [("bert", "1g.5gb", 1, 60, ""), ("llm", "gpu", 1, 12, "")]
    r = recommend(from_objects(cluster(many)["items"]), None, Options())
    by = {c.name: c for c in r.classes.classes if "A100" in c.pool}
    # 12 whole GPUs take both A100 nodes (8 + 4 of the next): no node is left for 60 x 1g.5gb
    assert by["gpu-large"].nodes == ("a100-b", "a100-a")
    assert by["mig"].nodes == ()
    assert by["mig"].shortfall == {"1g.5gb": 60}


def test_a_request_the_model_does_not_have_is_isolated() -> None:
    odd = pod("serving", "odd", 0, "a100-a", "nvidia.com/mig-9g.99gb")
    dump = cluster(extra=[odd, replicaset("serving", "odd", "7c9f")])
    r = recommend(from_objects(dump["items"]), None, Options())
    assert r.skipped == {"bad request": 1}
    assert any(p.startswith("Deployment/serving/odd: left out") for p in r.problems)
    assert "odd" not in by_name(r)
    good = recommend(from_objects(cluster()["items"]), None, Options())
    assert [p.to_json() for p in r.pools] == [p.to_json() for p in good.pools]


def test_objects_are_read_the_controllers_way() -> None:
    """recommend reads the controller's kinds through the cluster layer (`read_dump`): a pod
    whose request no machine has is left out with the controller's reason, not taken; and its
    node selector is the cluster layer's (`kubectl -l` syntax, set-based included)."""
    hostile = pod("serving", "bert", 98, "a100-a", "nvidia.com/gpu")
    hostile["spec"]["containers"][-1]["resources"]["limits"]["nvidia.com/gpu"] = "4294967296"
    inv = from_objects([*cluster()["items"], hostile])
    (problem,) = inv.problems
    assert problem.startswith("left out: items[")
    assert "bert-7c9f-00098 nvidia.com/gpu is 4294967296, outside 0..1024" in problem
    good = from_objects(cluster()["items"])
    assert inv.replicas == good.replicas
    sel = parse_selector("nvidia.com/gpu.product in (NVIDIA-L40S),kubernetes.io/hostname")
    picked = from_objects(cluster()["items"], node_selector=sel)
    assert {n.name for n in picked.nodes} == {
        n.name for n in good.nodes if n.gpu_model == "NVIDIA-L40S"
    }
    assert picked.nodes
