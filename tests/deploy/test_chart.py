"""The Helm chart (deploy/helm/pyctl) with the real helm and kubectl (built by
scripts/control-plane): `helm lint`, `helm template` of the values users set, the values schema
refusing bad input, the kustomize overlays being the chart's fresh output (`kubectl kustomize`
renders them), the configuration being pyctl's own settings, and what the house rules require of
the manifests (restricted pods, probes, PDBs, priority class, digests, Redis limits). The API
server's word on all of it is tests/e2e/test_deploy.py and tests/e2e/test_least_privilege.py."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
import yaml

from pyctl.app.config import load_config
from pyctl.dev.extender import RANK_VERBS, extender_config
from pyctl.serve.extender import VERBS
from pyctl.state.redis_client import REDIS_COMMANDS
from tests.paths import REPO

from .tools import CHART, OVERLAYS, ToolError, docs, helm, kubectl, one, template

MODES = ("observe", "enforce")
DIGEST = "sha256:" + "ab" * 32
#: value sets a user would install with (each must lint and render)
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "enforce": {
        "mode": "enforce",
        "evictor.minPodAgeSeconds": 21600,
        "rdmaResource": "rdma/hca_shared_devices_a",
    },
    "external-redis-tls": {
        "mode": "enforce",
        "redis.bundled": False,
        "redis.external.url": "rediss://redis.example.internal:6380/0",
        "redis.external.caSecret": "redis-ca",
        "redis.external.cidrs": ["10.20.0.0/24"],
        "redis.external.port": 6380,
        "redis.auth.existingSecret": "shared-redis",
        "networkPolicy.apiServer.cidrs": ["10.0.0.1/32"],
    },
    "federation-hub": {"redis.federationMembers": ["east", "west"], "cluster": "east"},
    "release": {"image.digest": DIGEST, "redis.image.digest": DIGEST},
    "extender-rank": {"extender.mode": "rank", "extender.weight": 100},
    "minimal": {
        "monitoring.serviceMonitor.enabled": False,
        "monitoring.prometheusRule.enabled": False,
        "monitoring.dashboard.enabled": False,
        "extender.enabled": False,
        "admissionPolicy.enabled": False,
        "networkPolicy.enabled": False,
        "priorityClass.create": False,
        "mig.enabled": False,
    },
}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_strict(name: str) -> None:
    args = ["lint", "--strict", str(CHART)]
    for k, v in VALUE_SETS[name].items():
        args += ["--set-json", f"{k}={__import__('json').dumps(v)}"]
    out = helm(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_template_renders_valid_settings(name: str) -> None:
    objs = template(VALUE_SETS[name], namespace="gpu-infra")
    kinds = Counter(o["kind"] for o in objs)
    assert kinds["Deployment"] == 1
    config = one(objs, "ConfigMap", "pyctl-config")["data"]
    # every key is a setting of pyctl/app/config.py, and the whole validates (the Lease namespace
    # comes from the pod's own namespace through the downward API)
    cfg = load_config(None, {**config, "PYCTL_LEASE_NAMESPACE": "gpu-infra"}, {})
    assert cfg.mode == VALUE_SETS[name].get("mode", "observe")
    assert cfg.source == "kube"
    assert cfg.in_cluster
    assert cfg.redis.url
    assert cfg.evictor.min_pod_age_seconds == VALUE_SETS[name].get("evictor.minPodAgeSeconds", 0)
    assert cfg.reflector.rdma_resource == VALUE_SETS[name].get("rdmaResource", "")
    assert "gpu-infra" in cfg.evictor.excluded_namespaces
    assert "kube-system" in cfg.evictor.excluded_namespaces
    for o in objs:
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pyctl", o["kind"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "enforcing"}, "value must be one of 'observe', 'enforce'"),
        ({"image.digest": "sha256:abc"}, "/image/digest"),
        ({"cluster": "Not_A_Label"}, "/cluster"),
        ({"redis.bundled": False}, "/redis/external/url"),
        ({"redis.maxmemoryPolicy": "allkeys-lru"}, "/redis/maxmemoryPolicy"),
        ({"limits.nodeBurst": 0}, "/limits/nodeBurst"),
        ({"evictor.minReplicas": 0}, "/evictor/minReplicas"),
        ({"evictor.minPodAgeSeconds": -1}, "/evictor/minPodAgeSeconds"),
        ({"rdmaResource": "hca shared devices"}, "/rdmaResource"),
        ({"extender.mode": "score"}, "/extender/mode"),
    ],
)
def test_schema_refuses_bad_values_with_a_clear_message(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolError) as err:
        template(values)
    assert message in str(err.value)


@pytest.mark.parametrize("mode", ["choose", "rank"])
def test_the_scheduler_configuration_asks_once_or_twice_by_extender_mode(mode: str) -> None:
    objs = template({"extender.mode": mode})
    config = yaml.safe_load(one(objs, "ConfigMap", "pyctl-scheduler-config")["data"]["config.yaml"])
    (ext,) = config["extenders"]
    url = ext["urlPrefix"]
    verbs = {k: v for k, v in ext.items() if k in ("filterVerb", "prioritizeVerb", "weight")}
    # what the e2e tests run the real kube-scheduler with, for this mode
    (local,) = extender_config(url, mode=mode)["extenders"]
    assert ext == local
    if mode == "choose":
        assert verbs == {"filterVerb": "choose"}
    else:
        assert verbs == RANK_VERBS
    assert {v for k, v in verbs.items() if k.endswith("Verb")} <= set(VERBS)


def test_overlays_are_the_charts_fresh_output() -> None:
    r = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "render.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("mode", MODES)
def test_kubectl_kustomize_renders_the_overlay(mode: str) -> None:
    """kustomize (kubectl's own) renders exactly the chart's objects for the overlay."""
    got = docs(kubectl(None, "kustomize", str(OVERLAYS / mode)).stdout)
    want = docs((OVERLAYS / mode / "pyctl.yaml").read_text(encoding="utf-8"))

    def key(o: dict[str, Any]) -> tuple[str, str, str]:
        return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])

    assert sorted(map(key, got)) == sorted(map(key, want))
    assert {key(o): o for o in got} == {key(o): o for o in want}
    ns = one(got, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert one(got, "ConfigMap", "pyctl-config")["data"]["PYCTL_MODE"] == mode
    assert one(got, "CustomResourceDefinition")["spec"]["group"] == "topology.node.k8s.io"
    # no password in the repository: the overlays read the Secret pyctl-redis the user creates
    assert not [o for o in got if o["kind"] == "Secret"]


def _rules(objs: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    out = set()
    for o in objs:
        if o["kind"] not in ("ClusterRole", "Role"):
            continue
        ns = o["metadata"].get("namespace", "*")
        for rule in o["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        out.add((ns, g, r, v))
    return out


def test_observe_mode_grants_no_write_verb_and_enforce_adds_only_the_actions() -> None:
    observe = _rules(template({"mode": "observe"}))
    enforce = _rules(template({"mode": "enforce"}))
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    assert {r for r in observe if r[3] in writes} == {
        ("pyctl-system", "coordination.k8s.io", "leases", "create"),
        ("pyctl-system", "coordination.k8s.io", "leases", "update"),
    }
    assert observe < enforce
    assert {r for r in enforce - observe if r[3] in writes} == {
        ("*", "", "nodes", "patch"),
        ("*", "", "pods/eviction", "create"),
        ("*", "", "events", "create"),
        ("gpu-operator", "", "configmaps", "patch"),
        # DRA steering (docs/dra.md): pyctl's own DeviceTaintRules
        ("*", "resource.k8s.io", "devicetaintrules", "create"),
        ("*", "resource.k8s.io", "devicetaintrules", "delete"),
    }
    for verb in ("*", "delete", "escalate", "bind", "impersonate"):
        # delete: only pyctl's own DeviceTaintRules (an admission policy confines it to them)
        allowed = {("*", "resource.k8s.io", "devicetaintrules", "delete")}
        assert not [r for r in enforce if r[3] == verb and r not in allowed]
    assert not [r for r in enforce if r[2] in ("secrets", "*")]


def _pod_specs(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o["spec"]["template"]["spec"] for o in objs if o["kind"] in ("Deployment", "StatefulSet")
    ]


def test_pods_are_restricted_probed_prioritised_and_budgeted() -> None:
    objs = template({"mode": "enforce"})
    specs = _pod_specs(objs)
    assert len(specs) == 2
    for spec in specs:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["priorityClassName"] == "pyctl"
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"]
            assert c["resources"]["limits"]
            assert c["readinessProbe"]
            assert c["livenessProbe"]
    assert one(objs, "PriorityClass", "pyctl")["value"] < 2_000_000_000
    pdbs = {o["metadata"]["name"]: o["spec"] for o in objs if o["kind"] == "PodDisruptionBudget"}
    assert pdbs == {
        "pyctl": {"minAvailable": 1, "selector": pdbs["pyctl"]["selector"]},
        "pyctl-redis": {"minAvailable": 1, "selector": pdbs["pyctl-redis"]["selector"]},
    }
    dep = one(objs, "Deployment", "pyctl")
    assert dep["spec"]["replicas"] == 2
    assert pdbs["pyctl"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    (ctl,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in ctl["env"]}
    assert env["PYCTL_LEASE_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert (
        env["PYCTL_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    )
    ref = env["PYCTL_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "pyctl-redis", "key": "password"}
    assert ctl["image"] == "pyctl:0.1.0"


def test_images_by_digest_in_releases() -> None:
    objs = template({"image.digest": DIGEST, "redis.image.digest": DIGEST, "image.tag": "x"})
    images = [c["image"] for s in _pod_specs(objs) for c in s["containers"]]
    assert sorted(images) == sorted([f"pyctl@{DIGEST}", f"redis@{DIGEST}"])


def test_redis_has_a_password_maxmemory_and_refuses_writes_rather_than_evicting() -> None:
    objs = template({})
    secret = one(objs, "Secret", "pyctl-redis")
    assert set(secret["data"]) == {"password"}
    assert len(secret["data"]["password"]) >= 32
    conf = one(objs, "ConfigMap", "pyctl-redis")["data"]
    assert re.search(r"^maxmemory 768mb$", conf["redis.conf"], re.M)
    assert re.search(r"^maxmemory-policy noeviction$", conf["redis.conf"], re.M)
    sts = one(objs, "StatefulSet", "pyctl-redis")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    # 768 MiB of data under a 1 GiB limit: Redis says OOM before the kernel kills it
    assert c["resources"]["limits"]["memory"] == "1Gi"
    # the password never on a command line
    assert "password" not in " ".join(c.get("args", []) + c["command"])
    # the ACL users' commands are the ones pyctl sends
    values = docs((CHART / "values.yaml").read_text(encoding="utf-8"))[0]
    assert values["redis"]["commands"] == list(REDIS_COMMANDS)


def test_network_policies_limit_egress_to_dns_the_api_server_and_redis() -> None:
    objs = template(VALUE_SETS["external-redis-tls"])
    (np,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    egress = np["spec"]["egress"]
    assert len(egress) == 3
    dns, apiserver, redis = egress
    assert {p["port"] for p in dns["ports"]} == {53}
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "kube-system"
    }
    assert apiserver["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    assert redis == {
        "to": [{"ipBlock": {"cidr": "10.20.0.0/24"}}],
        "ports": [{"port": 6380, "protocol": "TCP"}],
    }
    bundled = template({})
    nps = {o["metadata"]["name"]: o["spec"] for o in bundled if o["kind"] == "NetworkPolicy"}
    assert nps["pyctl-redis"]["egress"] == []
    assert (
        nps["pyctl"]["egress"][2]["to"][0]["podSelector"]["matchLabels"][
            "app.kubernetes.io/component"
        ]
        == "redis"
    )


def test_admission_policies_name_the_service_account_and_the_excluded_namespaces() -> None:
    objs = template(
        {"mode": "enforce", "evictor.excludedNamespaces": ["kube-system", "batch"]}, namespace="ops"
    )
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    assert set(policies) == {"pyctl-node-changes", "pyctl-evictions", "pyctl-device-taint-rules"}
    for p in policies.values():
        (cond,) = p["spec"]["matchConditions"]
        assert (
            cond["expression"] == "request.userInfo.username == 'system:serviceaccount:ops:pyctl'"
        )
    (rule,) = policies["pyctl-evictions"]["spec"]["validations"]
    assert rule["expression"] == "!(request.namespace in ['kube-system','batch','ops'])"
    bindings = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert {b["spec"]["policyName"] for b in bindings} == set(policies)
    assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings)


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
    dep = one(template({}), "Deployment", "pyctl")
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert 'ENTRYPOINT ["pyctl"]' in runtime
    assert '"run"' in runtime
    ignore = (REPO / ".dockerignore").read_text(encoding="utf-8")
    for needed in ("Cargo.toml", "Cargo.lock", "pyproject.toml", "rust/", "pyctl/"):
        assert f"!{needed}" in ignore


def test_external_redis_password_only_when_a_secret_is_named() -> None:
    ext = {"redis.bundled": False, "redis.external.url": "redis://redis.example.internal:6379/0"}
    for secret, want in (("", None), ("shared-redis", "shared-redis")):
        objs = template({**ext, "redis.auth.existingSecret": secret})
        assert not [o for o in objs if o["kind"] == "Secret"]  # never a generated one
        (c,) = one(objs, "Deployment", "pyctl")["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in c["env"]}
        got = env.get("PYCTL_REDIS_PASSWORD")
        assert (got["valueFrom"]["secretKeyRef"]["name"] if got else None) == want
