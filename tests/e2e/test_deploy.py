"""The in-cluster deployment (deploy/): the overlays render (deploy/kustomize.py, a minimal
kustomize of the features used there), the manifests say what the house rules require, the
Dockerfile is a multi-stage maturin build running as non-root (checked statically: there is no
container engine here, and hadolint is not used), and, on the real control plane (e2e): both
overlays are admitted by the API server in a namespace that enforces the `restricted` Pod
Security Standard (the Deployment's pods are created by the real controller-manager), and with
the ServiceAccount's own token, SelfSubjectAccessReview allows what the controller needs and
forbids secrets, deleting nodes and other namespaces' configmaps."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import re
import uuid
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from pyctl.app.config import load_config
from tests.paths import REPO

from .conftest import wait_until
from .control_plane import ControlPlane

DEPLOY = REPO / "deploy"
OVERLAYS = ("observe", "enforce")


def _kustomize() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pyctl_deploy_kustomize", DEPLOY / "kustomize.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render(overlay: str, namespace: str | None = None) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = _kustomize().build(DEPLOY / "overlays" / overlay, namespace)
    return objs


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in _by_kind(objs, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


# -- static: rendering, manifests, Dockerfile ----------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_everything(overlay: str) -> None:
    objs = render(overlay)
    kinds = sorted(o["kind"] for o in objs)
    for kind in (
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "StatefulSet",
        "ServiceMonitor",
        "PrometheusRule",
        "CustomResourceDefinition",
    ):
        assert kind in kinds, kind
    config = _one(objs, "ConfigMap", "pyctl-config")["data"]
    assert config["PYCTL_MODE"] == overlay
    # every key is a setting of pyctl/app/config.py, and the whole validates
    cfg = load_config(None, config, {})
    assert cfg.mode == overlay
    assert cfg.source == "kube"
    assert cfg.metrics.port == 8080
    for o in objs:
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pyctl"
        if o["kind"] not in (
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
        ):
            assert o["metadata"]["namespace"] == "pyctl-system", o["kind"]
    ns = _one(objs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    dash = _one(objs, "ConfigMap", "pyctl-grafana-dashboard")
    assert json.loads(dash["data"]["pyctl.json"])["panels"]


def _pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")
    ]


def test_pods_are_restricted_and_probed() -> None:
    objs = render("enforce")
    dep = _one(objs, "Deployment", "pyctl")
    assert dep["spec"]["replicas"] == 2
    for spec in _pod_specs(objs):
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"]
            assert c["resources"]["limits"]
    (ctl,) = dep["spec"]["template"]["spec"]["containers"]
    assert ctl["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert ctl["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = {e["name"]: e for e in ctl["env"]}
    assert env["PYCTL_LEASE_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    sts = _one(objs, "StatefulSet", "pyctl-redis")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]


#: exactly what the controller uses (the brief of issue 9)
EXPECTED_CLUSTER_RULES = {
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "pods/eviction"): {"create"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch"},
    ("topology.node.k8s.io", "noderesourcetopologies"): {"get", "list", "watch"},
    ("", "events"): {"create"},
    ("events.k8s.io", "events"): {"create"},
}
EXPECTED_NAMESPACE_RULES = {
    ("coordination.k8s.io", "leases"): {"get", "create", "update"},
    ("", "configmaps"): {"create", "update"},
}


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "resourceNames" not in rule or rule["resourceNames"]
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                out.setdefault((g, r), set()).update(rule["verbs"])
    return out


def test_rbac_is_exactly_what_the_controller_uses() -> None:
    objs = render("observe")
    assert _rules(_one(objs, "ClusterRole", "pyctl")) == EXPECTED_CLUSTER_RULES
    assert _rules(_one(objs, "Role", "pyctl")) == EXPECTED_NAMESPACE_RULES
    for binding in ("ClusterRoleBinding", "RoleBinding"):
        (subject,) = _one(objs, binding, "pyctl")["subjects"]
        assert subject == {"kind": "ServiceAccount", "name": "pyctl", "namespace": "pyctl-system"}


def test_namespace_override_follows_everywhere() -> None:
    objs = render("observe", "elsewhere")
    assert _one(objs, "Namespace")["metadata"]["name"] == "elsewhere"
    (subject,) = _one(objs, "ClusterRoleBinding", "pyctl")["subjects"]
    assert subject["namespace"] == "elsewhere"


def test_dockerfile_is_a_multistage_maturin_build_running_as_non_root() -> None:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(stages) == 2, stages
    assert stages[0].endswith("AS builder")
    assert re.match(r"FROM python:\$\{PYTHON_VERSION\}-slim", stages[1])
    builder = text.split(stages[1])[0]
    assert "maturin build --release" in builder
    runtime = text.split(stages[1])[1]
    assert "COPY --from=builder /dist" in runtime
    users = [ln.split()[1] for ln in runtime.splitlines() if ln.startswith("USER ")]
    assert users, "no USER in the runtime stage"
    uid = users[-1].split(":")[0]
    assert uid.isdigit()
    assert int(uid) != 0  # numeric, non-root: runAsNonRoot can verify it
    dep = _one(render("observe"), "Deployment", "pyctl")
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert 'ENTRYPOINT ["pyctl"]' in runtime
    assert '"run"' in runtime
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8")
    for needed in ("Cargo.toml", "Cargo.lock", "pyproject.toml", "rust/", "pyctl/"):
        assert f"!{needed}" in ignore


# -- e2e: apply to the real API server ------------------------------------------------------------

PLURALS = {
    "Namespace": ("namespaces", False),
    "ServiceAccount": ("serviceaccounts", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "ConfigMap": ("configmaps", True),
    "Deployment": ("deployments", True),
    "Service": ("services", True),
    "NetworkPolicy": ("networkpolicies", True),
    "StatefulSet": ("statefulsets", True),
    "ServiceMonitor": ("servicemonitors", True),
    "PrometheusRule": ("prometheusrules", True),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
}


def _path(obj: dict[str, Any], name: str | None = None) -> str:
    plural, namespaced = PLURALS[obj["kind"]]
    av = obj["apiVersion"]
    base = "/api/v1" if av == "v1" else f"/apis/{av}"
    if namespaced:
        base += f"/namespaces/{obj['metadata']['namespace']}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


async def _request(
    api: client.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    query: dict[str, str] | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    headers = {"Content-Type": content_type, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    host = api.configuration.host
    assert host is not None
    r = await api.rest_client.request(
        method, host + path, query_params=query, headers=headers, body=body
    )
    data: dict[str, Any] = json.loads(r.data)
    return data


async def _apply(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply (force: the NRT CRD may have been applied by another test)."""
    return await _request(
        api,
        "PATCH",
        _path(obj, obj["metadata"]["name"]),
        obj,
        content_type="application/apply-patch+yaml",
        query={"fieldManager": "pyctl-e2e-deploy", "force": "true"},
    )


def _monitoring_crd(kind: str, plural: str) -> dict[str, Any]:
    """A minimal stand-in for the Prometheus Operator's CRD (absent from the test server)."""
    return {
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


async def _crd_established(api: client.ApiClient, name: str) -> bool:
    crd = await _request(
        api, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    )
    conds = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conds)


async def _can(api: client.ApiClient, token: str, **attrs: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attrs},
    }
    r = await _request(
        api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review, token=token
    )
    return bool(r["status"].get("allowed"))


@pytest.fixture
async def sa_api(control_plane: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """A client with no credentials of its own (the test adds the ServiceAccount's token)."""
    cfg = client.Configuration(host=control_plane.server)
    cfg.ssl_ca_cert = str(control_plane.pki / "ca.crt")
    async with client.ApiClient(cfg) as c:
        yield c


@pytest.mark.e2e
@pytest.mark.anyio
@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_overlay_is_admitted_and_least_privilege(
    api: client.ApiClient, sa_api: client.ApiClient, overlay: str
) -> None:
    ns = f"pyctl-{overlay}-{uuid.uuid4().hex[:6]}"
    objs = render(overlay, ns)
    await _apply(api, _monitoring_crd("ServiceMonitor", "servicemonitors"))
    await _apply(api, _monitoring_crd("PrometheusRule", "prometheusrules"))
    crds = _by_kind(objs, "CustomResourceDefinition")
    for crd in crds:
        await _apply(api, crd)
    for name in [c["metadata"]["name"] for c in crds] + [
        "servicemonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    ]:
        await wait_until(functools.partial(_crd_established, api, name), f"CRD {name} established")

    try:
        await _apply(api, _one(objs, "Namespace"))
        created = await _request(api, "GET", f"/api/v1/namespaces/{ns}")
        assert created["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
        for obj in objs:
            if obj["kind"] not in ("Namespace", "CustomResourceDefinition"):
                got = await _apply(api, obj)  # raises ApiException if not admitted
                assert got["metadata"]["name"] == obj["metadata"]["name"]

        # PodSecurity is enforced here (a privileged pod is refused) ...
        bad_pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "privileged", "namespace": ns},
            "spec": {
                "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]
            },
        }
        with pytest.raises(ApiException) as refused:
            await _request(
                api, "POST", f"/api/v1/namespaces/{ns}/pods", bad_pod, query={"dryRun": "All"}
            )
        assert refused.value.status == 403
        assert "restricted" in str(refused.value.body)
        # ... and the pods of both workloads pass it (server-side dry run through admission)
        for wl in _by_kind(objs, "Deployment") + _by_kind(objs, "StatefulSet"):
            spec = dict(wl["spec"]["template"]["spec"])
            # as the StatefulSet controller does: a volume per claim template
            spec["volumes"] = list(spec.get("volumes", [])) + [
                {
                    "name": t["metadata"]["name"],
                    "persistentVolumeClaim": {
                        "claimName": f"{t['metadata']['name']}-{wl['metadata']['name']}-0"
                    },
                }
                for t in wl["spec"].get("volumeClaimTemplates", [])
            ]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": "dry-", "namespace": ns},
                "spec": spec,
            }
            await _request(
                api, "POST", f"/api/v1/namespaces/{ns}/pods", pod, query={"dryRun": "All"}
            )

        # the real controller-manager creates the Deployment's two pods: admitted
        async def two_pods() -> bool:
            pods = await _request(
                api,
                "GET",
                f"/api/v1/namespaces/{ns}/pods",
                query={"labelSelector": "app.kubernetes.io/component=controller"},
            )
            return len(pods["items"]) == 2

        await wait_until(two_pods, "the Deployment's 2 pods created (PodSecurity admitted)", 30)
        rs = await _request(api, "GET", f"/apis/apps/v1/namespaces/{ns}/replicasets")
        for r in rs["items"]:
            conds = (r.get("status") or {}).get("conditions") or []
            assert not [c for c in conds if c["type"] == "ReplicaFailure"], conds

        # the ServiceAccount's own credentials (TokenRequest)
        tr = await _request(
            api,
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/pyctl/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 600},
            },
        )
        token = tr["status"]["token"]

        allowed = [
            {"verb": v, "resource": "nodes"} for v in ("get", "list", "watch", "patch")
        ] + [
            {"verb": v, "resource": "pods"} for v in ("get", "list", "watch")
        ] + [
            {"verb": "create", "resource": "pods", "subresource": "eviction",
             "namespace": "default"},
            {"verb": "watch", "resource": "poddisruptionbudgets", "group": "policy"},
            {"verb": "list", "resource": "noderesourcetopologies", "group": "topology.node.k8s.io"},
            {"verb": "create", "resource": "events", "namespace": "default"},
            {"verb": "create", "resource": "events", "group": "events.k8s.io", "namespace": ns},
        ] + [
            {"verb": v, "resource": "leases", "group": "coordination.k8s.io", "namespace": ns}
            for v in ("get", "create", "update")
        ] + [
            {"verb": v, "resource": "configmaps", "namespace": ns} for v in ("create", "update")
        ]  # fmt: skip
        forbidden = [
            {"verb": "get", "resource": "secrets", "namespace": ns},
            {"verb": "list", "resource": "secrets"},
            {"verb": "delete", "resource": "nodes"},
            {"verb": "create", "resource": "configmaps", "namespace": "default"},
            {"verb": "update", "resource": "configmaps", "namespace": "kube-system"},
            {"verb": "delete", "resource": "pods", "namespace": "default"},
            {"verb": "create", "resource": "pods", "namespace": ns},
            {"verb": "update", "resource": "leases", "group": "coordination.k8s.io",
             "namespace": "default"},
            {"verb": "delete", "resource": "leases", "group": "coordination.k8s.io",
             "namespace": ns},
            {"verb": "update", "resource": "nodes"},
        ]  # fmt: skip
        wrong = []
        for attrs in allowed:
            if not await _can(sa_api, token, **attrs):
                wrong.append(("should be allowed", attrs))
        for attrs in forbidden:
            if await _can(sa_api, token, **attrs):
                wrong.append(("should be forbidden", attrs))
        assert wrong == []
    finally:
        with contextlib.suppress(ApiException):
            await _request(api, "DELETE", f"/api/v1/namespaces/{ns}")


def test_external_redis_is_documented() -> None:
    doc = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "external Redis" in doc
    assert "PYCTL_REDIS_URL" in doc
