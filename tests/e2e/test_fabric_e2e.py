"""The three cliques, end to end on the real control plane (docs/fabric.md):

- twelve kwok nodes of 4 GPUs in three NVLink cliques (`nvidia.com/gpu.clique`), 24 one-GPU
  replicas of a Deployment filling two nodes of each clique, under a PodDisruptionBudget with
  ``maxUnavailable: 2``; two empty nodes per clique, 24 idle GPUs;
- a group of 4 pods x 4 GPUs with required pod affinity on the clique key (all in one clique);
- ``pyctl run --mode enforce`` as deployed (a subprocess, a real Redis, the extender) and a real
  kube-scheduler configured with the extender.

The real scheduler places two pods of the group on the empty nodes of one clique and leaves two
pending (no other node of that clique has room). pyctl reports the idle GPUs the group cannot use
as `domain_split`, rescues the pending pods inside their clique (NodeFit confines them to it),
evicting replicas through the Eviction API, and the group runs whole in one clique. Checked
against the API server: every pod of the group runs in one clique, all 24 replicas run again, and
never were fewer than 22 replicas up; no pyctl taint is left.
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
from tests.e2e.test_state_e2e import samples
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e]

LABEL = "fabric-e2e"
SEL = {"pyctl.e2e/fabric": "true"}
CLIQUE = "nvidia.com/gpu.clique"
NODES = tuple(f"f-{i:02}" for i in range(12))
FULL = ("f-00", "f-01", "f-04", "f-05", "f-08", "f-09")


def clique_of(node: str) -> str:
    return f"3f1c2a.{int(node[2:]) // 4}"


def deployment(name: str, replicas: int, gpus: int, tier: str) -> dict[str, Any]:
    d = gpu_deployment(name, replicas, gpus, tier, label=LABEL, selector=SEL)
    d["spec"]["template"]["spec"]["schedulerName"] = "pyctl-e2e"
    return d


def gang(name: str) -> dict[str, Any]:
    d = deployment(name, 4, 4, "g")
    d["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": LABEL, "tier": "g"}},
                    "topologyKey": CLIQUE,
                }
            ]
        }
    }
    return d


async def tier_pods(core: client.CoreV1Api, tier: str) -> list[Any]:
    got = await core.list_namespaced_pod("default", label_selector=f"app={LABEL},tier={tier}")
    return list(got.items)


def running(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp]


def gauge(text: str, name: str, **labels: str) -> float | None:
    """One sample of pyctl's /metrics (parsed by prometheus_client, `test_state_e2e.samples`)."""
    return samples(text, name).get(tuple(sorted(labels.items())))


async def replicas_on_full_nodes(
    api: client.ApiClient, nodes: tuple[str, ...], full: tuple[str, ...]
) -> None:
    """24 one-GPU replicas (tier `s`) on the four-GPU nodes `full` (the others cordoned
    meanwhile, then uncordoned), under a PodDisruptionBudget of `maxUnavailable: 2`."""
    core, apps, policy = client.CoreV1Api(api), client.AppsV1Api(api), client.PolicyV1Api(api)
    for n in nodes:
        if n not in full:
            await core.patch_node(n, body({"spec": {"unschedulable": True}}))
    await apps.create_namespaced_deployment("default", body(deployment("small", 24, 1, "s")))

    async def placed() -> bool:
        pods = running(await tier_pods(core, "s"))
        return len(pods) == 24 and {p.spec.node_name for p in pods} == set(full)

    await wait_until(placed, "24 replicas on the six full nodes", within=120)
    for n in nodes:
        await core.patch_node(n, body({"spec": {"unschedulable": None}}))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "small", "namespace": "default"},
        "spec": {"maxUnavailable": 2, "selector": {"matchLabels": {"app": LABEL, "tier": "s"}}},
    }
    await policy.create_namespaced_pod_disruption_budget("default", body(pdb))

    async def pdb_ready() -> bool:
        got = await policy.read_namespaced_pod_disruption_budget("small", "default")
        return bool(got.status and got.status.disruptions_allowed == 2)

    await wait_until(pdb_ready, "the PDB to allow two disruptions", within=60)


@pytest.mark.anyio
async def test_pyctl_frees_one_clique_for_a_group_that_must_share_one(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    specs = [
        GpuNodeSpec(n, numa_zones=1, gpus_per_zone=4, labels={**SEL, CLIQUE: clique_of(n)})
        for n in NODES
    ]
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
            "PYCTL_LEASE_NAME": "pyctl-fabric-e2e",
            "PYCTL_WORKFLOW_RESCUE_DEADLINE": "240",
            # freeing a node of four replicas takes four evictions in one rescue and one round
            "PYCTL_WORKFLOW_RESCUE_DEPTH": "4",
            "PYCTL_WORKFLOW_MAX_MOVES": "4",
            "PYCTL_FABRIC_INTERVAL": "1",
            "PYCTL_WORKLOAD_INTERVAL": "1",
        },
    )
    sched = ExtraScheduler(
        control_plane,
        "pyctl-fabric",
        strict_config(f"http://127.0.0.1:{port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    lowest = [99]
    split_seen = [0.0]
    try:
        pyctl.start("f0")
        sched.start()
        # -- 24 replicas on the two first nodes of each clique (the others cordoned) ----------
        await replicas_on_full_nodes(api, NODES, FULL)

        async def domains_seen() -> bool:
            return gauge(pyctl.metrics(), "pyctl_level_domains", cluster="e2e", level=CLIQUE) == 3

        await wait_until(domains_seen, "pyctl to see three cliques", within=60)

        async def none_whole() -> bool:
            # every clique has two full nodes (pyctl's view follows the pods' events)
            m = pyctl.metrics()
            return gauge(m, "pyctl_level_whole_domains", cluster="e2e", level=CLIQUE) == 0

        await wait_until(none_whole, "pyctl to see no clique whole", within=60)

        async def watch() -> None:
            while True:
                lowest[0] = min(lowest[0], len(running(await tier_pods(core, "s"))))
                v = gauge(
                    pyctl.metrics(),
                    "pyctl_gpu_fragment_by_category_gpus",
                    cluster="e2e",
                    category="domain_split",
                )
                split_seen[0] = max(split_seen[0], v or 0.0)
                await anyio.sleep(0.1)

        # -- the group: two run at once, two wait for pyctl -------------------------------------
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await apps.create_namespaced_deployment("default", body(gang("group")))

            async def group_runs() -> bool:
                return len(running(await tier_pods(core, "g"))) == 4

            await wait_until(group_runs, "all four pods of the group running", within=480)

            async def smalls_back() -> bool:
                return len(running(await tier_pods(core, "s"))) == 24

            await wait_until(smalls_back, "all 24 replicas running again", within=120)
            tg.cancel_scope.cancel()

        group = running(await tier_pods(core, "g"))
        cliques = {clique_of(p.spec.node_name) for p in group}
        assert len(cliques) == 1, [p.spec.node_name for p in group]
        assert len({p.spec.node_name for p in group}) == 4
        # M holds the group as a gang of four (derived from its pods); no clique has room for
        # another such gang, so the idle GPUs of the other cliques are domain_split

        async def split_reported() -> bool:
            v = gauge(
                pyctl.metrics(),
                "pyctl_gpu_fragment_by_category_gpus",
                cluster="e2e",
                category="domain_split",
            )
            return (v or 0.0) > 0 or split_seen[0] > 0

        await wait_until(split_reported, "pyctl to report domain_split", within=60)
        largest = gauge(
            pyctl.metrics(),
            "pyctl_level_largest_gang_pods",
            cluster="e2e",
            level=CLIQUE,
            gpus_per_pod="4",
        )
        assert largest is not None
        assert largest < 4
        assert lowest[0] >= 22, f"the PDB was violated: {lowest[0]} replicas up at one time"
        for n in NODES:
            node = await core.read_node(n)
            assert not any((t.key or "").startswith("pyctl.io/") for t in node.spec.taints or [])
    finally:
        pyctl.kill()
        sched.stop()
        for name in ("small", "group"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await if_present(policy.delete_namespaced_pod_disruption_budget("small", "default"))
        for n in NODES:
            await if_present(core.delete_node(n))
