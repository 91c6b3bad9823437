"""KubeActuator against the real API server: idempotent cordon, labels and taints; eviction refused
(429) by a PodDisruptionBudget without budget, then allowed; Events on pods and nodes."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import KubeClient, connect
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest, wait_nodes_ready
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import MemoryRateLimiter, SafetyLimits
from pyctl.workflows.gate import Gate

from .conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(90, func_only=True)]


@pytest.fixture
async def kube(control_plane: ControlPlane) -> Any:
    async with await connect(kubeconfig=control_plane.kubeconfig) as k:
        yield k


@pytest.fixture
async def node(api: client.ApiClient) -> Any:
    name = f"kube-act-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    await core.create_node(body(node_manifest(GpuNodeSpec(name))))
    # kwok (v0.8.0) skips a pod that arrives before it holds the node's lease and has taken the
    # node on, and looks at the node's pods once, when it takes it on: a pod created in between
    # stays Pending. Ready means kwok has taken the node on.
    await wait_nodes_ready(api, [name])
    yield name
    await core.delete_node(name)


async def node_json(kube: KubeClient, name: str) -> dict[str, Any]:
    got: dict[str, Any] = (await kube.request("GET", f"/api/v1/nodes/{name}")).check().json()
    return got


async def test_cordon_labels_and_taints_are_idempotent(kube: KubeClient, node: str) -> None:
    act = KubeActuator(kube)

    async def rv() -> str:
        return str((await node_json(kube, node))["metadata"]["resourceVersion"])

    async def writes_nothing(call: Callable[[], Awaitable[None]]) -> bool:
        """True if doing `call` again leaves the node's resourceVersion as it was. Others write
        the node too (kwok keeps its status): a change seen once may be theirs, so it is tried
        three times; an actuator that writes fails every try."""
        for _ in range(3):
            before = await rv()
            await call()
            if await rv() == before:
                return True
            await anyio.sleep(0.2)
        return False

    await act.cordon(node, True)
    assert (await node_json(kube, node))["spec"]["unschedulable"] is True
    assert await writes_nothing(lambda: act.cordon(node, True))
    await act.cordon(node, False)
    assert "unschedulable" not in (await node_json(kube, node))["spec"]
    assert await writes_nothing(lambda: act.cordon(node, False))

    await act.label_node(node, {"pyctl.io/a": "1", "pyctl.io/b": "2"})
    labels = (await node_json(kube, node))["metadata"]["labels"]
    assert (labels["pyctl.io/a"], labels["pyctl.io/b"]) == ("1", "2")
    assert await writes_nothing(lambda: act.label_node(node, {"pyctl.io/a": "1"}))
    await act.label_node(node, {"pyctl.io/a": None})
    labels = (await node_json(kube, node))["metadata"]["labels"]
    assert "pyctl.io/a" not in labels
    assert labels["pyctl.io/b"] == "2"
    assert await writes_nothing(lambda: act.label_node(node, {"pyctl.io/a": None}))

    key = "pyctl.io/mig-reconfiguring"
    assert await act.taint(node, key, value="x") is True
    assert await act.taint(node, key, value="x") is False
    assert await act.taint(node, key, value="y") is True
    taints = (await node_json(kube, node))["spec"]["taints"]
    assert [(t["key"], t.get("value"), t["effect"]) for t in taints] == [(key, "y", "NoSchedule")]
    assert await act.taint(node, key, on=False) is True
    assert await act.taint(node, key, on=False) is False
    assert not (await node_json(kube, node))["spec"].get("taints")


async def test_eviction_respects_a_pdb_and_events_are_recorded(
    api: client.ApiClient, kube: KubeClient, node: str
) -> None:
    core = client.CoreV1Api(api)
    policy = client.PolicyV1Api(api)
    ns = f"kube-act-{uuid.uuid4().hex[:8]}"
    await core.create_namespace(body({"metadata": {"name": ns}}))
    for i in range(2):
        await core.create_namespaced_pod(
            ns,
            body(
                {
                    "metadata": {"name": f"p{i}", "labels": {"app": "infer"}},
                    "spec": {
                        "nodeName": node,
                        "containers": [{"name": "c", "image": "registry.invalid/infer:1"}],
                    },
                }
            ),
        )

    async def running() -> bool:
        pods = await core.list_namespaced_pod(ns)
        return len(pods.items) == 2 and all(p.status.phase == "Running" for p in pods.items)

    await wait_until(running, "both pods Running (kwok)")
    await policy.create_namespaced_pod_disruption_budget(
        ns,
        body(
            {
                "metadata": {"name": "infer-pdb"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "infer"}}},
            }
        ),
    )

    async def budget(allowed: int) -> bool:
        pdb = await policy.read_namespaced_pod_disruption_budget("infer-pdb", ns)
        st = pdb.status
        return bool(
            st
            and st.observed_generation == pdb.metadata.generation
            and st.current_healthy == 2
            and st.disruptions_allowed == allowed
        )

    await wait_until(lambda: budget(0), "the disruption controller to compute no budget")
    act = KubeActuator(kube, grace_period_seconds=0)
    refused = await act.try_evict(ns, "p0")
    assert (refused.allowed, refused.status) == (False, 429), refused
    assert refused.budget == "infer-pdb", refused
    assert any(reason == "DisruptionBudget" for reason, _ in refused.causes), refused
    assert not (await act.try_evict(ns, "p0")).allowed

    await policy.patch_namespaced_pod_disruption_budget(
        "infer-pdb", ns, {"spec": {"minAvailable": 1}}
    )
    await wait_until(lambda: budget(1), "the budget to allow one disruption")
    assert (await act.try_evict(ns, "p0")).allowed

    async def gone() -> bool:
        return [p.metadata.name for p in (await core.list_namespaced_pod(ns)).items] == ["p1"]

    await wait_until(gone, "the evicted pod to go")
    assert (await act.try_evict(ns, "p0")).allowed  # already gone: done, not an error

    await act.event("Pod", ns, "p1", "PyctlCompaction", "would move p1", warning=True)
    await act.event("Node", "", node, "PyctlMigReconfigure", "would re-partition")
    pod_events = await core.list_namespaced_event(
        ns, field_selector="involvedObject.name=p1,reason=PyctlCompaction"
    )
    assert [(e.type, e.message, e.source.component) for e in pod_events.items] == [
        ("Warning", "would move p1", "pyctl")
    ]
    pod_uid = (await core.read_namespaced_pod("p1", ns)).metadata.uid
    assert pod_events.items[0].involved_object.uid == pod_uid
    node_events = await core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={node},involvedObject.kind=Node"
    )
    assert [e.reason for e in node_events.items] == ["PyctlMigReconfigure"]
    assert (
        node_events.items[0].involved_object.uid == (await node_json(kube, node))["metadata"]["uid"]
    )
    await core.delete_namespace(ns)


async def test_a_paused_leader_does_not_write_after_losing_the_lease(
    kube: KubeClient, node: str
) -> None:
    """The soak's fault (docs/soak.md): a leader passes the gate's Lease check, is paused past its
    Lease (SIGSTOP, a noisy neighbour), and on waking sends the write it was about to send. Here
    the Lease holds at the gate's check and is gone after it: the actuator checks it again right
    before each mutation, so nothing reaches the API server (read back from it)."""
    checks: list[bool] = []

    def held() -> bool:
        # true at the gate's check, expired from then on (the pause fell in between)
        checks.append(not checks)
        return checks[-1]

    act = KubeActuator(kube, still_leader=held)
    gate = Gate("enforce", held, MemoryRateLimiter(), SafetyLimits(), act, Metrics(), "e2e")
    got = await gate.taint(node, "pyctl.io/rescue", on=True, value="x")
    assert got.outcome == "not-leader", got
    checks.clear()
    got = await gate.label(node, {"pyctl.io/mig-demand": "1"})
    assert got.outcome == "not-leader", got
    n = await node_json(kube, node)
    assert not n["spec"].get("taints")
    assert "pyctl.io/mig-demand" not in n["metadata"]["labels"]
    # holding the Lease all along, the same calls write
    act.still_leader = lambda: True
    gate.still_leader = lambda: True
    assert (await gate.taint(node, "pyctl.io/rescue", on=True, value="x")).outcome == "done"
    n = await node_json(kube, node)
    assert [t["key"] for t in n["spec"]["taints"]] == ["pyctl.io/rescue"]
