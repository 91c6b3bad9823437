"""The real kubectl and helm that `scripts/control-plane build` made (KUBECTL, HELM of
`scripts/control-plane env`), and the chart rendered with them."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.paths import REPO

CHART = REPO / "deploy" / "helm" / "pyctl"
OVERLAYS = REPO / "deploy" / "overlays"
SCRIPT = REPO / "scripts" / "control-plane"


class ToolError(AssertionError):
    pass


@functools.cache
def tool(name: str) -> Path:
    """The path of KUBECTL or HELM; builds them (a few minutes, once) when missing."""
    for attempt in range(2):
        proc = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            key, _, value = line.partition("=")
            if key == name and Path(shlex.split(value)[0]).is_file():
                return Path(shlex.split(value)[0])
        if attempt == 0:
            print(
                f"\n[deploy] kubectl/helm missing: running {SCRIPT} tools (a few minutes, once)",
                file=sys.__stderr__,
                flush=True,
            )
            subprocess.run(["bash", str(SCRIPT), "tools"], capture_output=True, check=False)
    raise ToolError(f"{name} not built: run scripts/control-plane build")


def run(name: str, *args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(tool(name)), *args], capture_output=True, text=True, check=False, **kw
    )
    if check and proc.returncode != 0:
        what = f"{name.lower()} {shlex.join(args)} exited {proc.returncode}"
        raise ToolError(f"{what}:\n{proc.stderr}{proc.stdout}")
    return proc


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("HELM", *args, check=check)


def kubectl(
    kubeconfig: Path | None, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    pre = ["--kubeconfig", str(kubeconfig)] if kubeconfig else []
    return run("KUBECTL", *pre, *args, check=check)


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def sets(values: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in values.items():
        out += ["--set-json", f"{k}={json.dumps(v)}"]
    return out


def template(
    values: Mapping[str, Any] | None = None,
    *,
    namespace: str = "pyctl-system",
    extra: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart with `values` (dotted keys, JSON values)."""
    args = ["template", "pyctl", str(CHART), "--namespace", namespace, *sets(values or {}), *extra]
    return docs(helm(*args).stdout)


def one(objs: Sequence[Mapping[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, (kind, name, len(found))
    return dict(found[0])


def monitoring_crds() -> str:
    """Minimal stand-ins for the Prometheus Operator's CRDs (ServiceMonitor, PrometheusRule),
    which the test API server does not have: any object of those kinds is accepted."""
    out = []
    for kind, plural in (
        ("ServiceMonitor", "servicemonitors"),
        ("PrometheusRule", "prometheusrules"),
    ):
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.monitoring.coreos.com"},
                "spec": {
                    "group": "monitoring.coreos.com",
                    "scope": "Namespaced",
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    ],
                },
            }
        )
    return yaml.safe_dump_all(out)


def apply_monitoring_crds(kubeconfig: Path, work: Path) -> None:
    path = work / "monitoring-crds.yaml"
    path.write_text(monitoring_crds())
    kubectl(kubeconfig, "apply", "--server-side", "-f", str(path))
    kubectl(
        kubeconfig,
        "wait",
        "--for=condition=Established",
        "crd/servicemonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
        "--timeout=30s",
    )


def restricted_namespace(kubeconfig: Path, name: str) -> None:
    """A namespace that enforces the restricted Pod Security Standard (as docs/deploy.md says)."""
    kubectl(kubeconfig, "create", "namespace", name)
    kubectl(
        kubeconfig,
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )


def token_kubeconfig(admin: Path, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount, with a token from the TokenRequest
    API (`kubectl create token`), and nothing else of the admin's."""
    token = kubectl(
        admin, "create", "token", account, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    cfg = yaml.safe_load(admin.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cluster}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": account}}],
                "current-context": "sa",
            }
        )
    )
    return path
