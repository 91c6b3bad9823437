"""A rescue that takes two moves, end to end on the real control plane (issue 14, "Must show"):

- three kwok nodes of 4 GPUs (one NUMA zone each), each running two 1-GPU replicas of one
  Deployment under a PodDisruptionBudget with ``maxUnavailable: 1``; a 4-GPU replica pending:
  no single move lowers F(M), and freeing a node takes two;
- ``pyctl run --mode enforce`` as deployed (a subprocess, a real Redis, the scheduler extender on
  its metrics port), and a second real kube-scheduler configured with that extender
  (deploy/scheduler/extender-config.yaml), which every test pod uses;
- pyctl plans the rescue, taints the node, evicts the two replicas one after the other through
  the Eviction API (the real PDB lets one go at a time), the real controller-manager recreates
  them and the real scheduler places them on the other nodes, the taint goes, and the scheduler
  binds the pending replica on the freed node (the extender keeps the room for it).

Checked against the API server: the pending replica runs on the node pyctl freed, all six
replicas run, the two moved ones elsewhere, and at no time were fewer than five replicas up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.dev.control_plane import ControlPlane, ExtraScheduler, free_port
from pyctl.dev.extender import strict_config
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest, wait_nodes_ready
from tests.e2e.conftest import if_present, wait_until
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.e2e.test_placement_e2e import gpu_deployment
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e]

LABEL = "rescue-e2e"
SEL = {"pyctl.e2e/rescue": "true"}
NODES = ("r-0", "r-1", "r-2")


def deployment(name: str, replicas: int, gpus: int, tier: str) -> dict[str, Any]:
    d = gpu_deployment(name, replicas, gpus, tier, label=LABEL, selector=SEL)
    d["spec"]["template"]["spec"]["schedulerName"] = "pyctl-e2e"
    return d


async def tier_pods(core: client.CoreV1Api, tier: str) -> list[Any]:
    got = await core.list_namespaced_pod("default", label_selector=f"app={LABEL},tier={tier}")
    return list(got.items)


def running(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]


@pytest.mark.anyio
async def test_a_rescue_of_two_moves_under_a_pdb_places_the_pending_replica(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    specs = [GpuNodeSpec(n, numa_zones=1, gpus_per_zone=4, labels=SEL) for n in NODES]
    for s in specs:
        await core.create_node(body(node_manifest(s)))
    await wait_nodes_ready(api, list(NODES))
    port = free_port()
    pyctl = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        free_port(),
        tmp_path,
        extender_port=port,
        extra_env={
            "PYCTL_LEASE_NAME": "pyctl-rescue-e2e",
            "PYCTL_WORKFLOW_RESCUE_DEADLINE": "120",
        },
    )
    sched = ExtraScheduler(
        control_plane,
        "pyctl-rescue",
        strict_config(f"http://127.0.0.1:{port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    lowest = [99]
    try:
        pyctl.start("r0")
        sched.start()

        # -- two replicas on each node: placed one node at a time (the others cordoned) --------
        async def cordon(only: str) -> None:
            for n in NODES:
                spec = {"unschedulable": None if n == only else True}
                await core.patch_node(n, body({"spec": spec}))

        for i, n in enumerate(NODES):
            await cordon(n)
            if i == 0:
                await apps.create_namespaced_deployment(
                    "default", body(deployment("small", 2, 1, "s"))
                )
            else:
                await apps.patch_namespaced_deployment_scale(
                    "small", "default", body({"spec": {"replicas": 2 * (i + 1)}})
                )

            async def placed(n: str = n, want: int = 2 * (i + 1)) -> bool:
                pods = running(await tier_pods(core, "s"))
                return len(pods) == want and sum(p.spec.node_name == n for p in pods) == 2

            await wait_until(placed, f"two replicas on {n}", within=60)
        for n in NODES:
            await core.patch_node(n, body({"spec": {"unschedulable": None}}))
        original = {p.metadata.uid: p.spec.node_name for p in await tier_pods(core, "s")}
        assert sorted(original.values()) == sorted(NODES * 2)

        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "small", "namespace": "default"},
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": {"app": LABEL, "tier": "s"}},
            },
        }
        await policy.create_namespaced_pod_disruption_budget("default", body(pdb))

        async def pdb_ready() -> bool:
            got = await policy.read_namespaced_pod_disruption_budget("small", "default")
            return bool(got.status and got.status.disruptions_allowed == 1)

        await wait_until(pdb_ready, "the PDB to allow one disruption", within=60)

        async def watch() -> None:
            while True:
                lowest[0] = min(lowest[0], len(running(await tier_pods(core, "s"))))
                await anyio.sleep(0.05)

        # -- the pending 4-GPU replica: pyctl rescues it ---------------------------------------
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await apps.create_namespaced_deployment("default", body(deployment("big", 1, 4, "b")))

            async def big_runs() -> bool:
                got = running(await tier_pods(core, "b"))
                return len(got) == 1

            await wait_until(big_runs, "the 4-GPU replica running", within=240)

            async def smalls_back() -> bool:
                return len(running(await tier_pods(core, "s"))) == 6

            await wait_until(smalls_back, "all six replicas running again", within=60)
            tg.cancel_scope.cancel()

        (big,) = running(await tier_pods(core, "b"))
        freed = big.spec.node_name
        smalls = running(await tier_pods(core, "s"))
        moved = [p for p in smalls if p.metadata.uid not in original]
        assert len(moved) == 2, [p.metadata.name for p in moved]
        assert all(p.spec.node_name != freed for p in moved), "a moved replica came back"
        assert all(p.spec.node_name != freed for p in smalls), "the freed node holds a replica"
        assert [n for n in original.values() if n == freed] == [freed, freed]
        assert lowest[0] >= 5, f"the PDB was violated: {lowest[0]} replicas up at one time"
        node = await core.read_node(freed)
        assert not any((t.key or "").startswith("pyctl.io/") for t in node.spec.taints or [])
        done = 'pyctl_rescues_total{cluster="e2e",outcome="done"} 1.0'
        await wait_until(lambda: done in pyctl.metrics(), "the rescue workflow done", within=30)
        events = await core.list_namespaced_event("default", field_selector="reason=PyctlRescue")
        assert any(e.involved_object.name == big.metadata.name for e in events.items)
    finally:
        pyctl.kill()
        sched.stop()
        for name in ("small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await if_present(policy.delete_namespaced_pod_disruption_budget("small", "default"))
        for n in NODES:
            await if_present(core.delete_node(n))
