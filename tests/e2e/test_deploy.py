"""The deployment on the real API server, with the real tools (kubectl and helm built by
scripts/control-plane): both kustomize overlays pass `kubectl apply --dry-run=server -k` and are
then applied for real (`kubectl apply --server-side -k`), and the chart installs with `helm
install` into a namespace that enforces the restricted Pod Security Standard; in both cases the
real controller-manager creates the controller's pods (so PodSecurity admitted them), the Redis
pod template passes a server-side dry run, and a privileged pod is refused there.

Least privilege (the controller's calls against its RBAC) is tests/e2e/test_least_privilege.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.tools import (
    CHART,
    OVERLAYS,
    apply_monitoring_crds,
    docs,
    helm,
    kubectl,
    restricted_namespace,
)

from .control_plane import ControlPlane

pytestmark = [pytest.mark.e2e]


def _wait(what: str, check: Any, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within:.0f} s waiting for {what}", pytrace=False)
        time.sleep(0.25)


def _controller_pods(kubeconfig: Path, ns: str) -> list[dict[str, Any]]:
    out = kubectl(
        kubeconfig, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/component=controller",
        "-o", "yaml",
    ).stdout  # fmt: skip
    return list(docs(out)[0]["items"])


def _admitted_everywhere(kubeconfig: Path, ns: str, tmp: Path) -> None:
    """The Deployment's pods exist (the controller-manager's creation passed PodSecurity), the
    StatefulSet's pod template passes a server-side dry run, a privileged pod is refused."""
    _wait("the controller's 2 pods", lambda: len(_controller_pods(kubeconfig, ns)) == 2)
    rs = docs(kubectl(kubeconfig, "get", "replicasets", "-n", ns, "-o", "yaml").stdout)[0]
    for r in rs["items"]:
        conds = (r.get("status") or {}).get("conditions") or []
        assert not [c for c in conds if c["type"] == "ReplicaFailure"], conds
    sts = docs(
        kubectl(kubeconfig, "get", "statefulset", "pyctl-redis", "-n", ns, "-o", "yaml").stdout
    )[0]
    spec = dict(sts["spec"]["template"]["spec"])
    spec["volumes"] = [*spec.get("volumes", []), {"name": "data", "emptyDir": {}}]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "redis-dry-run", "namespace": ns},
        "spec": spec,
    }
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": ns},
        "spec": {
            "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]
        },
    }
    for name, obj in (("redis", pod), ("bad", bad)):
        (tmp / f"{name}.yaml").write_text(__import__("json").dumps(obj))
    kubectl(kubeconfig, "create", "--dry-run=server", "-f", str(tmp / "redis.yaml"))
    refused = kubectl(
        kubeconfig, "create", "--dry-run=server", "-f", str(tmp / "bad.yaml"), check=False
    )
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr


def _gone(kubeconfig: Path, ns: str) -> bool:
    return kubectl(kubeconfig, "get", "namespace", ns, check=False).returncode != 0


def test_overlays_dry_run_then_apply_with_kubectl(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    admin = control_plane.kubeconfig
    apply_monitoring_crds(admin, tmp_path)
    kubectl(admin, "create", "namespace", "gpu-operator", check=False)  # the GPU Operator's
    ns = "pyctl-system"  # the overlays' namespace
    for mode in ("observe", "enforce"):
        overlay = str(OVERLAYS / mode)
        # --dry-run=server: every object through admission, nothing stored. Namespaced objects
        # need their namespace first, so the first dry run goes after the namespace exists.
        kubectl(admin, "create", "namespace", ns)
        try:
            dry = kubectl(admin, "apply", "--server-side", "--dry-run=server", "-k", overlay)
            assert "serverside-applied (server dry run)" in dry.stdout, dry.stdout
            assert (
                "validatingadmissionpolicy.admissionregistration.k8s.io/pyctl-evictions"
                in dry.stdout
            )
            kubectl(admin, "apply", "--server-side", "--force-conflicts", "-k", overlay)
            got = docs(kubectl(admin, "get", "namespace", ns, "-o", "yaml").stdout)[0]
            assert got["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
            cm = docs(
                kubectl(admin, "get", "configmap", "pyctl-config", "-n", ns, "-o", "yaml").stdout
            )[0]
            assert cm["data"]["PYCTL_MODE"] == mode
            _admitted_everywhere(admin, ns, tmp_path)
        finally:
            kubectl(
                admin, "delete", "-k", overlay, "--wait=false", "--ignore-not-found", check=False
            )
            kubectl(
                admin, "delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False
            )
            _wait(f"namespace {ns} deleted", lambda: _gone(admin, ns), within=90)


def test_helm_install_under_restricted_pod_security(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    admin = control_plane.kubeconfig
    apply_monitoring_crds(admin, tmp_path)
    kubectl(admin, "create", "namespace", "gpu-operator", check=False)
    ns = "pyctl-helm"
    restricted_namespace(admin, ns)
    try:
        out = helm(
            "install", "pyctl", str(CHART), "--namespace", ns, "--kubeconfig", str(admin),
            "--set", "mode=enforce", "--set", "fullnameOverride=pyctl-h",
            "--set", "priorityClass.name=pyctl-h",
        ).stdout  # fmt: skip
        assert "STATUS: deployed" in out, out
        listed = helm("list", "-n", ns, "--kubeconfig", str(admin), "-o", "json").stdout
        assert '"status":"deployed"' in listed
        # the chart made the Redis password Secret; its pods read it
        secret = docs(
            kubectl(admin, "get", "secret", "pyctl-h-redis", "-n", ns, "-o", "yaml").stdout
        )[0]
        assert set(secret["data"]) == {"password"}
        _wait(
            "the controller's 2 pods",
            lambda: len(_controller_pods(admin, ns)) == 2,
        )
        (pod, _) = _controller_pods(admin, ns)
        assert pod["spec"]["priorityClassName"] == "pyctl-h"
        # an upgrade keeps the password (lookup)
        helm("upgrade", "pyctl", str(CHART), "--namespace", ns, "--kubeconfig", str(admin),
             "--reuse-values", "--set", "logLevel=debug")  # fmt: skip
        again = docs(
            kubectl(admin, "get", "secret", "pyctl-h-redis", "-n", ns, "-o", "yaml").stdout
        )[0]
        assert again["data"] == secret["data"]
    finally:
        helm("uninstall", "pyctl", "--namespace", ns, "--kubeconfig", str(admin), check=False)
        kubectl(admin, "delete", "namespace", ns, "--wait=false", check=False)
