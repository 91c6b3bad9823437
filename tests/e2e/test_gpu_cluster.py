"""Smoke test of the e2e tier: 50 fake GPU nodes, the real scheduler, kwok, Eviction + PDB."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client

from pyctl.dev.gpu_nodes import (
    E2E_NODE_LABEL,
    GPU,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
    delete_gpu_nodes,
    mig_resource,
    wait_nodes_ready,
)
from tests.e2e.conftest import if_present

# func_only: the session fixture's first-time build (minutes) does not count against the test.
pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(300, func_only=True)]

T = TypeVar("T")

NODES = 50
MIG_NODES = 5  # the last ones: GPUs 6 and 7 (NUMA zone 1) split into 7 x 1g.10gb each
MIG_1G = mig_resource("1g.10gb")
TRAIN_GPUS = 4
# 45 nodes x 8 whole GPUs fit 2 train pods each, 5 nodes x 6 whole GPUs fit 1: 95 of 100 run.
TRAIN_REPLICAS = 100
TRAIN_FIT = (NODES - MIG_NODES) * 2 + MIG_NODES
MIG_REPLICAS = 20


def cluster_specs(prefix: str) -> list[GpuNodeSpec]:
    specs = []
    for i in range(NODES):
        if i >= NODES - MIG_NODES:
            spec = GpuNodeSpec(
                f"{prefix}-{i:02d}",
                mig={6: {"1g.10gb": 7}, 7: {"1g.10gb": 7}},
                mig_config="pyctl-e2e-2x-all-1g.10gb",
            )
        else:
            spec = GpuNodeSpec(f"{prefix}-{i:02d}")
        specs.append(spec)
    return specs


@dataclass(frozen=True)
class NotYet:
    why: str


async def eventually(
    probe: Callable[[], Awaitable[T | NotYet]], what: str, within: float = 60.0
) -> T:
    """Poll ``probe`` until it returns something other than :class:`NotYet`."""
    last = NotYet("not probed")
    try:
        async with asyncio.timeout(within):
            while True:
                got = await probe()
                if not isinstance(got, NotYet):
                    return got
                last = got
                await asyncio.sleep(0.2)
    except TimeoutError:
        pytest.fail(f"timed out after {within:.0f} s waiting for {what}; last: {last.why}")


def deployment(name: str, replicas: int, limits: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {E2E_NODE_LABEL: "true"},
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.invalid/pyctl-e2e:none",  # kwok pulls nothing
                            "resources": {
                                "limits": {"cpu": "1", "memory": "1Gi", **limits},
                                "requests": {"cpu": "1", "memory": "1Gi", **limits},
                            },
                        }
                    ],
                },
            },
        },
    }


def is_running_ready(pod: client.V1Pod) -> bool:
    if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def unschedulable_message(pod: client.V1Pod) -> str | None:
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


async def test_gpu_cluster_schedule_run_and_evict_under_pdb(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    custom = client.CustomObjectsApi(api)
    run = uuid.uuid4().hex[:6]
    ns = f"e2e-gpu-{run}"

    await apply_nrt_crd(api)
    specs = cluster_specs(f"gpu-{run}")
    await create_gpu_nodes(api, specs)
    try:
        await wait_nodes_ready(api, [s.name for s in specs])

        # -- the nodes look like GPU nodes, and each has a two-zone NodeResourceTopology -------
        nodes = {
            n.metadata.name: n
            for n in (await core.list_node(label_selector=f"{E2E_NODE_LABEL}=true")).items
        }
        assert len(nodes) == NODES
        for spec in specs:
            node = nodes[spec.name]
            assert node.spec.taints is None, "no not-ready taint (TaintNodesByCondition is off)"
            alloc = node.status.allocatable
            labels = node.metadata.labels
            assert labels["nvidia.com/mig.strategy"] == "mixed"
            assert labels["nvidia.com/mig.config.state"] == "success"
            if spec.mig:
                assert (alloc[GPU], alloc[MIG_1G]) == ("6", "14")
                assert labels["nvidia.com/mig-1g.10gb.count"] == "14"
            else:
                assert alloc[GPU] == "8"
                assert MIG_1G not in alloc
        nrts = await custom.list_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, label_selector=f"{E2E_NODE_LABEL}=true"
        )
        assert len(nrts["items"]) == NODES
        for nrt in nrts["items"]:
            zones = nrt["zones"]
            assert [z["name"] for z in zones] == ["node-0", "node-1"]
            gpus = [next(r for r in z["resources"] if r["name"] == GPU) for z in zones]
            assert gpus[0]["capacity"] == "4"
            total = sum(int(g["available"]) for g in gpus)
            assert str(total) == nodes[nrt["metadata"]["name"]].status.allocatable[GPU]

        await core.create_namespace(body({"metadata": {"name": ns}}))

        async def pods(app: str) -> list[client.V1Pod]:
            items: list[client.V1Pod] = (
                await core.list_namespaced_pod(ns, label_selector=f"app={app}")
            ).items
            return items

        # -- the real scheduler places pods by their GPU requests; kwok runs them --------------
        train_gpus = {GPU: str(TRAIN_GPUS)}
        await apps.create_namespaced_deployment(
            ns, body(deployment("train", TRAIN_REPLICAS, train_gpus))
        )

        async def train_settled() -> list[client.V1Pod] | NotYet:
            got = await pods("train")
            running = [p for p in got if is_running_ready(p)]
            pending = [p for p in got if unschedulable_message(p)]
            if (len(got), len(running), len(pending)) == (
                TRAIN_REPLICAS,
                TRAIN_FIT,
                TRAIN_REPLICAS - TRAIN_FIT,
            ):
                return got
            return NotYet(f"{len(got)} pods, {len(running)} Running, {len(pending)} unschedulable")

        train = await eventually(train_settled, f"{TRAIN_FIT} train pods Running, the rest Pending")
        for pod in train:
            message = unschedulable_message(pod)
            if message is not None:
                assert f"Insufficient {GPU}" in message, message

        await apps.create_namespaced_deployment(
            ns, body(deployment("mig", MIG_REPLICAS, {MIG_1G: "1"}))
        )

        async def mig_running() -> list[client.V1Pod] | NotYet:
            got = [p for p in await pods("mig") if is_running_ready(p)]
            return got if len(got) == MIG_REPLICAS else NotYet(f"{len(got)} Running")

        mig = await eventually(mig_running, f"{MIG_REPLICAS} MIG pods Running")

        used: defaultdict[str, Counter[str]] = defaultdict(Counter)
        for pod in train + mig:
            if pod.spec.node_name:
                for name, qty in pod.spec.containers[0].resources.limits.items():
                    if name.startswith("nvidia.com/"):
                        used[pod.spec.node_name][name] += int(qty)
        mig_nodes = {s.name for s in specs if s.mig}
        assert {p.spec.node_name for p in mig} <= mig_nodes
        for name, counts in used.items():
            alloc = nodes[name].status.allocatable
            for resource, amount in counts.items():
                assert amount <= int(alloc[resource]), (name, resource, amount)
        assert sum(c[GPU] for c in used.values()) == TRAIN_FIT * TRAIN_GPUS

        # -- Eviction API + PodDisruptionBudget, with the real disruption controller -----------
        await policy.create_namespaced_pod_disruption_budget(
            ns,
            body(
                {
                    "metadata": {"name": "serve"},
                    "spec": {"minAvailable": 3, "selector": {"matchLabels": {"app": "serve"}}},
                }
            ),
        )
        await apps.create_namespaced_deployment(ns, body(deployment("serve", 3, {GPU: "1"})))

        async def pdb_state(allowed: int) -> client.V1PodDisruptionBudget | NotYet:
            pdb = await policy.read_namespaced_pod_disruption_budget("serve", ns)
            st = pdb.status
            ok = (
                st is not None
                and st.observed_generation == pdb.metadata.generation
                and st.current_healthy == 3
                and st.disruptions_allowed == allowed
            )
            return pdb if ok else NotYet(f"generation {pdb.metadata.generation}, status {st}")

        await eventually(lambda: pdb_state(0), "PDB status: 3 healthy, 0 disruptions allowed")
        serve = [p for p in await pods("serve") if is_running_ready(p)]
        assert len(serve) == 3
        victim = serve[0].metadata.name
        eviction = body(
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": victim, "namespace": ns},
            }
        )
        with pytest.raises(client.ApiException) as refused:
            await core.create_namespaced_pod_eviction(victim, ns, eviction)
        assert refused.value.status == 429, refused.value
        # The cause comes from the status the disruption controller computed.
        assert "The disruption budget serve needs 3 healthy pods and has 3 currently" in str(
            refused.value.body
        )

        await policy.patch_namespaced_pod_disruption_budget(
            "serve", ns, {"spec": {"minAvailable": 2}}
        )
        await eventually(lambda: pdb_state(1), "PDB status: 1 disruption allowed after the patch")
        await core.create_namespaced_pod_eviction(victim, ns, eviction)

        async def replaced() -> list[client.V1Pod] | NotYet:
            got = await pods("serve")
            running = [p for p in got if is_running_ready(p)]
            names = {p.metadata.name for p in got}
            if victim not in names and len(running) == 3:
                return running
            return NotYet(f"pods {sorted(names)}, {len(running)} Running")

        await eventually(replaced, "evicted pod gone (kwok) and replaced (Deployment)")
        await eventually(lambda: pdb_state(1), "PDB budget back after the replacement is Ready")
    finally:
        await if_present(core.delete_namespace(ns))
        await delete_gpu_nodes(api)
