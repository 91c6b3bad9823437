"""The agent's least privilege on the real API server: the chart's agent objects (rendered with
the real helm, `agent.enabled=true`) applied, a pod of the agent's ServiceAccount on one kwok
node, and a token bound to that pod (TokenRequest): the API server puts the pod's node in the
token (`authentication.kubernetes.io/node-name`). With that token the product's publisher writes
the annotation on its own Node; the ValidatingAdmissionPolicy refuses the other Node, a label,
and another annotation; the audit log shows that every call the agent made is one the chart
grants (nodes get/patch), printed as a table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from kubernetes_asyncio import client

from pyctl.agent.events import DisagreementEvents
from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.publish import NodeAnnotationPublisher
from pyctl.agent.view import NodeView, read_node
from pyctl.cluster import agent_topology as at
from pyctl.cluster.kube.client import KubeApiError, connect
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest
from tests.deploy import audit
from tests.deploy.tools import kubectl, template
from tests.e2e.conftest import wait_until
from tests.e2e.test_least_privilege import rbac
from tests.unit import agent_boards as boards

pytestmark = [pytest.mark.e2e]

NS = "pyctl-agent-lp"
ACCOUNT = "pyctl-agent"
USER = f"system:serviceaccount:{NS}:{ACCOUNT}"
OWN, OTHER = "agent-lp-own", "agent-lp-other"

DOC: dict[str, Any] = {
    "gpus": [{"index": 0, "uuid": "GPU-0", "numa": {"node": 0}, "clique": None}],
    "nvlink_groups": [],
    "catalog_disagreements": 0,
}


def _disagreeing_view(tmp_path: Path) -> NodeView:
    """The captured H200 with the catalog disagreeing on one profile's count."""
    cap = boards.capture()
    profiles = cap["devices"][0]["gpu_instance_profiles"]
    next(p for p in profiles if p.get("id") == 9)["instanceCount"] = 1
    return read_node(FixtureNvml(cap), boards.sysfs(tmp_path / "sys", cap, [-1]))


def _kubeconfig(admin: Path, token: str, path: Path) -> Path:
    cfg = yaml.safe_load(admin.read_text())
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": cfg["clusters"][0]["cluster"]}],
                "users": [{"name": "agent", "user": {"token": token}}],
                "contexts": [{"name": "a", "context": {"cluster": "c", "user": "agent"}}],
                "current-context": "a",
            }
        )
    )
    return path


@pytest.mark.anyio
async def test_the_agent_may_write_only_its_own_nodes_annotation(
    control_plane: ControlPlane,
    api: client.ApiClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert control_plane.audit_log is not None
    admin = control_plane.kubeconfig
    core = client.CoreV1Api(api)
    objs = [
        o
        for o in template({"agent.enabled": True}, namespace=NS)
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "agent"
        and o["kind"] != "DaemonSet"
    ]
    manifest = tmp_path / "agent.yaml"
    manifest.write_text(yaml.safe_dump_all(objs))
    kubectl(admin, "create", "namespace", NS)
    try:
        kubectl(admin, "apply", "-f", str(manifest))
        for name in (OWN, OTHER):
            await core.create_node(body(node_manifest(GpuNodeSpec(name))))
        pod = await core.create_namespaced_pod(
            NS,
            body(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "agent"},
                    "spec": {
                        "nodeName": OWN,
                        "serviceAccountName": ACCOUNT,
                        "containers": [{"name": "a", "image": "registry.example/pyctl:1"}],
                    },
                }
            ),
        )
        req = await core.create_namespaced_service_account_token(
            ACCOUNT,
            NS,
            body(
                {
                    "spec": {
                        "expirationSeconds": 3600,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": "agent",
                            "uid": pod.metadata.uid,
                        },
                    }
                }
            ),
        )
        cfg = _kubeconfig(admin, req.status.token, tmp_path / "agent.kubeconfig")
        who = json.loads(kubectl(cfg, "auth", "whoami", "-o", "json").stdout)
        assert who["status"]["userInfo"]["username"] == USER
        assert who["status"]["userInfo"]["extra"]["authentication.kubernetes.io/node-name"] == [OWN]
        # the policy is in force once the API server has it: wait for the first refusal (the
        # probes before it succeed, so the audit window starts after it, and once the log has
        # had time to take the probes' events)
        async with await connect(kubeconfig=cfg) as kube:

            async def other_refused() -> bool:
                try:
                    await NodeAnnotationPublisher(kube, OTHER)(DOC)
                except KubeApiError as e:
                    return "only its own Node" in str(e)
                return False

            await wait_until(other_refused, "the policy refusing another Node", within=30)
            await anyio.sleep(1.0)
            start = control_plane.audit_log.stat().st_size
            with pytest.raises(KubeApiError, match="only its own Node"):
                await NodeAnnotationPublisher(kube, OTHER)(DOC)
            await NodeAnnotationPublisher(kube, OWN)(DOC)
            own = await core.read_node(OWN)
            assert at.decode(own.metadata.annotations[at.ANNOTATION]).gpus[0].uuid == "GPU-0"
            view = _disagreeing_view(tmp_path)
            with pytest.raises(KubeApiError, match="Events only about its own Node"):
                await DisagreementEvents(kube, OTHER)(view)
            await DisagreementEvents(kube, OWN)(view)
            posted = await core.list_namespaced_event(
                "default", field_selector=f"involvedObject.name={OWN}"
            )
            [event] = [e for e in posted.items if e.reason == "MigCatalogDisagrees"]
            assert (event.type, event.involved_object.kind) == ("Warning", "Node")
            assert "max_count device 1, catalog 2" in event.message
            path = f"/api/v1/nodes/{OWN}"
            ct = "application/merge-patch+json"
            for patch, message in (
                ({"metadata": {"labels": {"x": "y"}}}, "labels, finalizers"),
                ({"metadata": {"annotations": {"x": "y"}}}, "only the node annotation"),
                ({"spec": {"unschedulable": True}}, "spec"),
            ):
                resp = await kube.request("PATCH", path, body=patch, content_type=ct)
                assert resp.status == 403, (patch, resp.status)
                assert message in str(resp.error()), patch
        end = control_plane.audit_log.stat().st_size
        found = audit.calls(control_plane.audit_log, USER, start, end)
        granted = await rbac(api, NS, ACCOUNT)
        with capsys.disabled():
            print(f"\nagent least privilege: {len(found)} calls of {USER} (audit log)")
            print(audit.table(found, granted, {}))
        assert found
        assert all(any(g.covers(c) for g in granted) for c in found if not c.non_resource)
        assert {(c.verb, c.resource) for c in found if not c.non_resource} == {
            ("patch", "nodes"),
            ("create", "events"),
        }
        assert {c.name for c in found if c.code == 200 and c.resource == "nodes"} == {OWN}
        assert {c.namespace for c in found if c.resource == "events"} == {"default"}
    finally:
        kubectl(admin, "delete", "-f", str(manifest), "--ignore-not-found", check=False)
        kubectl(admin, "delete", "namespace", NS, "--wait=false", check=False)
        for name in (OWN, OTHER):
            kubectl(admin, "delete", "node", name, "--ignore-not-found", check=False)
