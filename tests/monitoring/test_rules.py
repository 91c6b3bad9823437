"""The alerting rules: `promtool check rules` and `promtool test rules` (every alert has a unit
test that fires it and one where it stays silent), the chart's copies of the rules and the
dashboard are up to date (deploy/render.py), and every metric the rules and the dashboard read is
one pyctl exports (or one listed below as to be exported by the MIG workflow)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from pyctl.metrics import Metrics
from pyctl.serve.extender_server import HttpMetrics

from .promtool import DASHBOARD, MONITORING, RULES, RULES_TEST, binary

#: metrics the alerts use that the MIG reconfiguration workflow is to export (not yet in
#: pyctl/metrics.py): a counter by result (succeeded, failed, rolled_back) and a 0/1 gauge per node
PLANNED = {"pyctl_mig_reconfigurations_total", "pyctl_mig_reconfiguration_in_progress"}
#: Prometheus's own series
PROMETHEUS = {"up"}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [r for g in groups for r in g["rules"]]


def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_test_rules() -> None:
    r = _promtool("test", "rules", str(RULES_TEST))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))["tests"]
    firing: set[str] = set()
    silent: set[str] = set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    alerts = {r["alert"] for r in _rules()}
    assert alerts - firing == set(), "alerts without a firing test"
    assert alerts - silent == set(), "alerts without a not-firing test"


def test_every_alert_has_runbook_text() -> None:
    for r in _rules():
        ann = r.get("annotations", {})
        for key in ("summary", "description", "runbook"):
            assert ann.get(key, "").strip(), f"{r['alert']}: no {key}"
        assert r.get("labels", {}).get("severity") in ("warning", "critical"), r["alert"]
        anchor = r["alert"].lower()
        assert f"docs/alerts.md#{anchor}" in ann["runbook"], r["alert"]


def test_alerts_doc_covers_every_alert() -> None:
    doc = (MONITORING.parent.parent / "docs" / "alerts.md").read_text(encoding="utf-8")
    for r in _rules():
        assert f"## {r['alert']}" in doc, r["alert"]


def test_chart_is_rendered_from_the_sources() -> None:
    r = subprocess.run(
        [sys.executable, str(MONITORING.parent / "render.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _exported() -> set[str]:
    reg = CollectorRegistry()
    Metrics(reg)
    HttpMetrics(reg, "c")
    names: set[str] = set()
    for fam in reg.collect():
        for s in fam.samples:
            names.add(s.name)
        names.add(fam.name)
        if fam.type == "counter":
            names.add(fam.name + "_total")
        if fam.type == "histogram":
            names |= {fam.name + x for x in ("_bucket", "_count", "_sum")}
    return names


def _dashboard_exprs() -> list[str]:
    d = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in d["panels"] for t in p["targets"]]


def test_rules_and_dashboard_read_exported_metrics() -> None:
    exported = _exported() | PLANNED | PROMETHEUS
    used: set[str] = set()
    for expr in [r["expr"] for r in _rules()] + _dashboard_exprs():
        used |= set(re.findall(r"\bpyctl_[a-z_]+\b", expr))
    assert used, "no metric found"
    unknown = used - exported
    assert unknown == set(), f"not exported by pyctl.metrics: {sorted(unknown)}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool parses every dashboard query (as recording rules, Grafana variables replaced)."""
    exprs = [
        e.replace("$__rate_interval", "5m").replace("$cluster", ".*") for e in _dashboard_exprs()
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yaml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    r = _promtool("check", "rules", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
