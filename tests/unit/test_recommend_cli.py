"""`pyctl recommend` (the command line), the controller's periodic report (`Recommender`), its
configuration, and the evaluation on the seed case and a small trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pyctl.app.config import ConfigError, load_config
from pyctl.cli.main import main
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import NodeRecord, PodRecord
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.core import mig
from pyctl.metrics import Metrics
from pyctl.recommend.evaluate import (
    OVERSIZED,
    evaluate_seed_case,
    replay_normalized,
    trace_tradeoff,
)
from pyctl.recommend.prometheus import PrometheusError, UsageReport, parse_duration
from pyctl.recommend.recommender import Recommender
from pyctl.replay import seed_case as sc
from pyctl.replay.trace import load_trace
from tests.paths import DATA

from .recommend_cluster import cluster


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    p = tmp_path / "dump.json"
    p.write_text(json.dumps(cluster()))
    return p


def test_json_output(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", str(dump), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pools = {p["gpu_model"]: p for p in out["pools"]}
    a100 = pools["NVIDIA-A100-SXM4-40GB"]
    assert a100["mig"] is True
    assert a100["gpus"] == 16
    assert [r["k"] for r in a100["tradeoff"]] == list(range(1, len(a100["tradeoff"]) + 1))
    assert a100["menu"] == a100["tradeoff"][a100["recommended_k"] - 1]["menu"]
    assert {w["workload"]["name"] for w in out["workloads"]} >= {"bert", "llm", "trainer"}
    assert {c["class"] for c in out["classes"]} == {"gpu-large", "mig", "cpu-micro"}
    assert out["mig_parted"]["version"] == "v1"
    assert out["usage"] is None


def test_tables_plot_patches_and_mig_parted(
    dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png, patches, parted = tmp_path / "k.png", tmp_path / "patches", tmp_path / "mig.yaml"
    code = main(
        [
            "recommend",
            str(dump),
            "--tolerance",
            "100",
            "--plot",
            str(png),
            "--patches",
            str(patches),
            "--mig-parted",
            str(parted),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "standard sizes" in text
    assert "<- recommended" in text
    assert "kubectl -n serving patch deployment" in text
    assert "kubectl label node a100-a pyctl.io/resource-class=mig" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    k = yaml.safe_load((patches / "kustomization.yaml").read_text())
    assert k["kind"] == "Kustomization"
    for entry in k["patches"]:
        assert (patches / entry["path"]).is_file()
    assert mig.parse_mig_parted(parted.read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["recommend"], "give a kubectl dump file"),
        (["recommend", "/nonexistent.json"], "cannot read"),
        (["recommend", "DUMP", "--window", "7days"], "is not a duration"),
        (["recommend", "DUMP", "--headroom", "-1"], "headroom"),
        (["recommend", "DUMP", "--max-k", "0"], "max k"),
        (["recommend", "DUMP", "--prometheus", "ftp://x"], "expected an http"),
        (["recommend", "DUMP", "--prometheus", "http://127.0.0.1:9"], "cannot reach Prometheus"),
        (["recommend", "NOTDUMP"], "expected a kubectl -o json dump"),
        # a List whose items are no list (found by tests/fuzz/test_fuzz_cli.py)
        (["recommend", "BADITEMS"], "'items' must be a list"),
        (["recommend", "DUMP", "--kubeconfig", "x"], "not both"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    dump: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"nodes": []}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "List", "items": 1}))
    files = {"DUMP": str(dump), "NOTDUMP": str(other), "BADITEMS": str(bad)}
    args = [files.get(a, a) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_parse_duration() -> None:
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("1h30m") == 5400
    for bad in ("", "7", "d", "1h 30m", "-1h", "0s"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


# ---- the controller's report -----------------------------------------------------------------


def _recommender(usage: object = None) -> tuple[Recommender, Metrics]:
    cache = ClusterCache()
    items = cluster()["items"]
    nodes = [decode_object("Node", o) for o in items if o["kind"] == "Node"]
    pods = [decode_object("Pod", o) for o in items if o["kind"] == "Pod"]
    cache.replace("Node", nodes)
    cache.replace("Pod", pods)
    metrics = Metrics()
    rec = Reconciler(cache, metrics, "c1")
    for n in cache.nodes:
        rec.reconcile(n)
    return Recommender(cache, rec, metrics, "c1", usage=usage), metrics  # type: ignore[arg-type]


def test_recommender_tick_exports_metrics() -> None:
    r, m = _recommender()
    report = r.tick()
    assert report is not None
    assert r.last_report is report
    v = m.registry.get_sample_value
    model = "NVIDIA-A100-SXM4-40GB"
    a100 = report.pool(model)
    assert a100.tradeoff.recommended is not None
    assert v("pyctl_recommend_menu_sizes", {"cluster": "c1", "gpu_model": model}) == len(a100.menu)
    for k, row in enumerate(a100.tradeoff.rows, 1):
        got = v(
            "pyctl_recommend_demand_served_ratio",
            {"cluster": "c1", "gpu_model": model, "k": str(k)},
        )
        assert got == pytest.approx(row.served_pct / 100)
    assert v("pyctl_recommend_runs_total", {"cluster": "c1", "result": "ok"}) == 1
    mig_nodes = v(
        "pyctl_recommend_class_nodes", {"cluster": "c1", "gpu_model": model, "class": "mig"}
    )
    assert mig_nodes == 1
    # containers are unknown from records: changes are reported without patches
    assert all(w.patch is None for w in report.workloads)
    # a pool that disappears is removed from the metrics
    cache = r.cache
    for name in [n for n in cache.nodes if n.startswith("l40s")]:
        cache.replace("Node", [x for x in cache.nodes.values() if x.name != name])
        r.reconciler.reconcile(name)
    for key in [k for k, p in cache.pods.items() if p.node.startswith("l40s")]:
        cache.replace("Pod", [p for p in cache.pods.values() if p.key != key])
    r.tick()
    assert v("pyctl_recommend_menu_sizes", {"cluster": "c1", "gpu_model": "NVIDIA-L40S"}) is None


def test_recommender_survives_usage_errors() -> None:
    def broken() -> UsageReport:
        raise PrometheusError("http://prom: cannot reach Prometheus: refused")

    r, m = _recommender(broken)
    report = r.tick()
    assert report is not None  # the report without usage
    assert report.usage is None
    assert "cannot reach Prometheus" in r.last_error
    assert (
        m.registry.get_sample_value("pyctl_recommend_runs_total", {"cluster": "c1", "result": "ok"})
        == 1
    )


def test_recommender_isolates_a_bad_node() -> None:
    r, _m = _recommender()
    bad = NodeRecord(name="weird", gpu_model="NVIDIA-A100-SXM4-40GB", gpus=1, mig=(("9g.99gb", 1),))
    r.cache.replace("Node", [*r.cache.nodes.values(), bad])
    r.cache.replace("Pod", [*r.cache.pods.values(), PodRecord("x", "y", node="weird", gpus=1)])
    report = r.tick()
    # the bad node is isolated: left out, named, the report computed for the others
    assert report is not None
    assert any(p.startswith("node weird: left out") for p in report.problems)
    assert report.pool("NVIDIA-A100-SXM4-40GB").pool.gpus == 16
    assert report.skipped == {"no pool": 1}


def test_recommender_counts_a_failed_report(monkeypatch: pytest.MonkeyPatch) -> None:
    r, m = _recommender()

    def boom(*_: object) -> None:
        raise RuntimeError("core said no")

    monkeypatch.setattr(r, "compute", boom)
    assert r.tick() is None
    assert r.last_error == "core said no"
    assert (
        m.registry.get_sample_value(
            "pyctl_recommend_runs_total", {"cluster": "c1", "result": "error"}
        )
        == 1
    )


def test_config_recommend_settings() -> None:
    cfg = load_config(None, {"PYCTL_RECOMMEND_INTERVAL": "60", "PYCTL_RECOMMEND_WINDOW": "2h"})
    assert cfg.recommend.interval == 60.0
    assert cfg.recommend.window == "2h"
    with pytest.raises(ConfigError, match="recommend_window"):
        load_config(None, {"PYCTL_RECOMMEND_WINDOW": "soon"})
    with pytest.raises(ConfigError, match="recommend_prometheus_url"):
        load_config(None, {"PYCTL_RECOMMEND_PROMETHEUS_URL": "prom:9090"})
    with pytest.raises(ConfigError, match="recommend_interval"):
        load_config(None, {"PYCTL_RECOMMEND_INTERVAL": "-1"})


# ---- evaluation ---------------------------------------------------------------------------------


def test_seed_case_normalization_applied() -> None:
    ev = evaluate_seed_case(sc.Case(), seeds=[42, 43])
    recs = {w.workload.owner.name: w.recommended for w in ev.report.workloads}
    # usage + 20%: BERT 3 GB -> 3.6 fits 1g.5gb (4.77 GB); ResNet 8 -> 9.6 fits 2g.10gb (9.54 GB)
    # and its 25% compute fits 2/7; GPT-2 20 -> 24 GB needs the whole GPU
    assert recs == {"bert-base": "1g.5gb", "resnet-152": "2g.10gb", "gpt-2": "gpu"}
    classes = {c.name: c.nodes for c in ev.report.classes.classes}
    # 20 whole GPUs: 3 nodes of 8; 50 x 1 + 30 x 2 slices = 110 <= 2 nodes x 8 GPUs x 7
    assert len(classes["gpu-large"]) == 3
    assert len(classes["mig"]) == 2
    for r in ev.modes["normalized"]:
        assert r.success_pct == 100.0
        assert r.repartitions == 0
    for r in ev.modes["exclusive"]:
        assert r.success_pct == 40.0


def test_seed_case_oversized_requests_are_right_sized() -> None:
    ev = evaluate_seed_case(sc.Case(kinds=OVERSIZED), seeds=[42])
    recs = {w.workload.owner.name: (w.current, w.recommended) for w in ev.report.workloads}
    assert recs["bert-base"] == ("2g.10gb", "1g.5gb")
    assert recs["resnet-152"] == ("3g.20gb", "2g.10gb")
    (hand,) = ev.modes["hand-picked"]
    (norm,) = ev.modes["normalized"]
    # 50 x 2 + 30 x 3 + 20 x 7 = 330 slices do not fit 280: the oversized requests fail
    assert hand.success_pct < 100.0
    assert norm.success_pct == 100.0


def test_trace_normalization_replays_in_the_same_order() -> None:
    trace = load_trace(DATA / "replay_tiny", "default")
    t = trace_tradeoff(trace, max_k=3)
    assert t.recommended is not None
    menu = list(t.recommended.menu or ())
    base, norm = replay_normalized(trace, menu, "fgd", 42)
    for r in (base, norm):
        assert r.served_pct + r.unallocated_pct + r.waste_pct == pytest.approx(100.0)
    assert base.waste_pct == 0.0
    assert norm.waste_pct >= 0.0
