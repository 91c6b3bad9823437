"""The chart's `pyctl agent` (agent.enabled, off by default) with the real helm: a DaemonSet that
reads the node through read-only hostPath mounts without privilege, RBAC of nodes get/patch, and
the ValidatingAdmissionPolicy that keeps each agent to its own Node and its one annotation. The
API server's word on the policy is tests/e2e/test_agent_admission.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.paths import REPO

from .tools import ToolError, one, template

NAME = "pyctl-agent"


def _agent_objects(objs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted(
        (o["kind"], o["metadata"]["name"])
        for o in objs
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "agent"
    )


def test_off_by_default() -> None:
    assert _agent_objects(template()) == []


def test_agent_renders_least_privilege() -> None:
    objs = template({"agent.enabled": True})
    assert _agent_objects(objs) == [
        ("ClusterRole", NAME),
        ("ClusterRoleBinding", NAME),
        ("DaemonSet", NAME),
        ("Role", f"{NAME}-node-events"),
        ("RoleBinding", f"{NAME}-node-events"),
        ("ServiceAccount", NAME),
        ("ValidatingAdmissionPolicy", f"{NAME}-own-node"),
        ("ValidatingAdmissionPolicy", f"{NAME}-own-node-events"),
        ("ValidatingAdmissionPolicyBinding", f"{NAME}-own-node"),
        ("ValidatingAdmissionPolicyBinding", f"{NAME}-own-node-events"),
    ]
    role = one(objs, "ClusterRole", NAME)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    # Events about a Node live in the namespace default: create there, and only that
    events = one(objs, "Role", f"{NAME}-node-events")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    ev_policy = one(objs, "ValidatingAdmissionPolicy", f"{NAME}-own-node-events")
    [rule] = ev_policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["events"], ["CREATE"])
    [check] = ev_policy["spec"]["validations"]
    assert "involvedObject.?name.orValue('') == variables.nodeClaim[0]" in check["expression"]
    ds = one(objs, "DaemonSet", NAME)
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == NAME
    assert pod["runtimeClassName"] == "nvidia"
    assert "hostNetwork" not in pod
    assert "hostPID" not in pod
    [c] = pod["containers"]
    assert c["args"][:2] == ["agent", "--in-cluster"]
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in sc["capabilities"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # every hostPath is mounted read-only, and there are only these two
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host == {"sys": "/sys", "pod-resources": "/var/lib/kubelet/pod-resources"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert all(mounts[n].get("readOnly") is True for n in host)
    vap = one(objs, "ValidatingAdmissionPolicy", f"{NAME}-own-node")
    [cond] = vap["spec"]["matchConditions"]
    assert cond["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:pyctl-system:pyctl-agent'"
    )
    exprs = " ".join(v["expression"] for v in vap["spec"]["validations"])
    assert "variables.nodeClaim[0] == object.metadata.name" in exprs
    variables = " ".join(v["expression"] for v in vap["spec"]["variables"])
    assert "authentication.kubernetes.io/node-name" in variables
    binding = one(objs, "ValidatingAdmissionPolicyBinding", f"{NAME}-own-node")
    assert binding["spec"]["validationActions"] == ["Deny"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"agent.enabled": True, "agent.interval": 0}, "/agent/interval"),
        ({"agent.enabled": True, "agent.unknown": 1}, "unknown"),
    ],
)
def test_the_schema_refuses_bad_agent_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolError) as err:
        template(values)
    assert message in str(err.value)


def test_the_image_carries_the_agents_extra() -> None:
    """The DaemonSet runs the chart's one image: its runtime stage installs pyctl[agent]."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    runtime = text.split("AS runtime", 1)[1]
    assert 'pip install "$(ls /tmp/dist/*.whl)[agent]"' in runtime
