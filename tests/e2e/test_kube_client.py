"""The API client: in-cluster configuration (a service-account token) and client-side timeouts."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import KubeApiError, Timeouts, connect

from .conftest import wait_until
from .control_plane import ControlPlane
from .gpu_nodes import body

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(60, func_only=True)]


async def test_in_cluster_config_uses_the_service_account_token(
    api: client.ApiClient, control_plane: ControlPlane, tmp_path: Path
) -> None:
    ns = f"kube-client-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_namespace(body({"metadata": {"name": ns}}))
    await core.create_namespaced_service_account(ns, body({"metadata": {"name": "pyctl"}}))
    rbac = client.RbacAuthorizationV1Api(api)
    # An explicit Role: the aggregated ClusterRoles (view, edit) are filled in by a
    # kube-controller-manager controller this control plane does not run.
    rule = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    await rbac.create_namespaced_role(
        ns, body({"metadata": {"name": "pod-reader"}, "rules": [rule]})
    )
    await rbac.create_namespaced_role_binding(
        ns,
        body(
            {
                "metadata": {"name": "pyctl-pod-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "pyctl", "namespace": ns}],
            }
        ),
    )
    token = await core.create_namespaced_service_account_token(
        "pyctl", ns, body({"spec": {"expirationSeconds": 600}})
    )
    (tmp_path / "token").write_text(token.status.token)
    (tmp_path / "ca.crt").write_bytes((control_plane.pki / "ca.crt").read_bytes())
    port = str(control_plane.ports.apiserver)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}

    with pytest.raises(ValueError, match="exactly one"):
        await connect()
    async with await connect(
        in_cluster=True, token_file=tmp_path / "token", ca_file=tmp_path / "ca.crt", environ=env
    ) as kube:

        async def can_list_pods() -> bool:  # once RBAC has seen the new RoleBinding
            pods = await kube.request("GET", f"/api/v1/namespaces/{ns}/pods")
            return pods.status == 200 and pods.json()["items"] == []

        await wait_until(can_list_pods, "the service account to list pods in its namespace")
        with pytest.raises(KubeApiError) as err:
            (await kube.request("GET", "/api/v1/nodes")).check()
        assert err.value.status == 403
        assert err.value.reason == "Forbidden"
        assert f"system:serviceaccount:{ns}:pyctl" in err.value.message
    await core.delete_namespace(ns)


async def test_a_silent_connection_times_out(control_plane: ControlPlane) -> None:
    """A watch that receives nothing ends by the client's read timeout, not never: raw streams
    and the generated APIs (which get the client's default timeouts) alike."""
    quiet = [("watch", "true"), ("labelSelector", f"pyctl.e2e/none={uuid.uuid4().hex}")]
    timeouts = Timeouts(connect=2, read=0.5, total=30)
    async with await connect(kubeconfig=control_plane.kubeconfig, timeouts=timeouts) as kube:

        async def read_raw() -> None:
            query = [*quiet, ("timeoutSeconds", "30")]
            async with kube.stream("/api/v1/nodes", query=query, read_timeout=0.5) as resp:
                assert resp.status == 200
                await resp.content.read()

        async def read_generated() -> None:
            # with _preload_content=False the answer is the HTTP response, not a V1NodeList (the
            # package's type stubs say the latter)
            resp: Any = await client.CoreV1Api(kube.api).list_node(
                watch=True, label_selector=quiet[1][1], timeout_seconds=30, _preload_content=False
            )
            await resp.content.read()

        for read in (read_raw, read_generated):
            t = time.monotonic()
            with pytest.raises(TimeoutError):
                await read()
            assert time.monotonic() - t < 5, read
