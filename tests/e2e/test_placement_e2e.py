"""Placement advice with the REAL kube-scheduler: a second kube-scheduler whose profile
(``schedulerName: pyctl-e2e``) calls pyctl's extender (served by an in-process controller on
127.0.0.1) for `choose` (as shipped) or `filter` and `prioritize`.

NodeResourceTopology is static in the e2e cluster (no topology-updater runs there), so the test
plays NFD's topology-updater itself (`TopologyUpdater`): each bound pod is given the first NUMA
zone that fits it, as the kubelet's Topology Manager does under ``single-numa-node`` (the narrowest
hint, lowest NUMA id first), and the node's NRT ``available`` is rewritten from that. pyctl then
sees exact per-zone usage instead of its in-order top-up."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.controller.placement import PlacementAdvisor
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.extender import TEST_SCHEDULER, LocalExtender
from pyctl.dev.gpu_nodes import (
    GPU,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    node_manifest,
    nrt_manifest,
    wait_nodes_ready,
)
from pyctl.dev.topology import TopologyUpdater
from pyctl.model import Shape, Workload
from pyctl.serve.extender import ExtenderHandler
from pyctl.state.memory import MemoryStore
from tests.e2e.conftest import if_present, wait_until

pytestmark = [pytest.mark.e2e]

#: M for these tests: single GPUs and 4-GPU (one whole NUMA zone) replicas, half and half
WORKLOAD = Workload(
    (
        Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
        Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, weight=0.5),
    )
)


def gpu_pod(
    name: str,
    gpus: int,
    *,
    label: str,
    node: str | None = None,
    cpu: int = 1,
    selector: Mapping[str, str] | None = None,
    scheduler: str = TEST_SCHEDULER,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": "registry.example/llm:1",
                "resources": {
                    "requests": {"cpu": str(cpu), "memory": "1Gi", GPU: str(gpus)},
                    "limits": {GPU: str(gpus)},
                },
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = dict(selector)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": label}},
        "spec": spec,
    }


def gpu_deployment(
    name: str, replicas: int, gpus: int, tier: str, *, label: str, selector: Mapping[str, str]
) -> dict[str, Any]:
    """A Deployment of `gpu_pod`s (the replicas the controller-manager recreates after eviction)."""
    pod = gpu_pod("x", gpus, label=label, selector=selector)
    pod["metadata"] = {"labels": {"app": label, "tier": tier}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": label}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": label, "tier": tier}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def model_gpus_used(ctl: Controller, node: str) -> list[int] | None:
    m = ctl.reconciler.models.get(node)
    if m is None:
        return None
    return [sum(1 for g in z.gpus if g.used_milli) for z in m.zones]


async def create_nodes(
    api: client.ApiClient, specs: list[GpuNodeSpec], within: float = 60.0
) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for s in specs:
        await core.create_node(body(node_manifest(s)))
        await custom.create_cluster_custom_object(
            NRT_GROUP, NRT_VERSION, NRT_PLURAL, body(nrt_manifest(s))
        )
    await wait_nodes_ready(api, [s.name for s in specs], within=within)


async def delete_nodes(api: client.ApiClient, specs: list[GpuNodeSpec]) -> None:
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    for s in specs:
        for call in (
            core.delete_node(s.name),
            custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, s.name),
        ):
            await if_present(call)


async def pod_node(core: client.CoreV1Api, name: str) -> str:
    p = await core.read_namespaced_pod(name, "default")
    return str(p.spec.node_name or "")


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["choose", "rank"])
async def test_real_scheduler_with_the_extender_aligns_and_packs(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any, mode: str
) -> None:
    """`mode`: the chart's `extender.mode` (the scheduler asks `choose` once per pod, or
    `filter` and `prioritize`): the same placements either way."""
    label = "pl-e2e"
    sel = {"pyctl.e2e/placement": "true"}
    specs = [GpuNodeSpec(f"pl-{x}", labels=sel) for x in ("split", "three", "empty")]
    core = client.CoreV1Api(api)
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    updater = TopologyUpdater(api, specs, label)
    # pl-split: 2 + 2 GPUs used (4 free, no whole zone); pl-three: 3 + 0 (zone 1 free) and most
    # of its CPU taken, so the scheduler's own LeastAllocated scoring would prefer the others
    pinned = [
        ("pin-split-0", "pl-split", 2, 0, 1),
        ("pin-split-1", "pl-split", 2, 1, 1),
        ("pin-three-0", "pl-three", 3, 0, 40),
    ]
    for name, node, gpus, zone, cpu in pinned:
        updater.pinned[f"default/{name}"] = zone
        await core.create_namespaced_pod(
            "default", body(gpu_pod(name, gpus, label=label, node=node, cpu=cpu))
        )
    ctl = Controller(
        "e2e-placement",
        KubeClusterSource(kube),
        MemoryStore("e2e-placement"),
        workload=WORKLOAD,
        summary_interval=0.5,
    )
    ext = ExtenderHandler(PlacementAdvisor.for_reconciler(ctl.reconciler))
    # the workers' handlers are separate, as in `pyctl run` (`ext` asks the same question here)
    local = LocalExtender(control_plane, ctl.reconciler, f"pyctl-e2e-{mode}", flags=(), mode=mode)
    await local.start()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(updater.run)

            def model_is(want: Mapping[str, list[int]]) -> bool:
                return all(model_gpus_used(ctl, n) == u for n, u in want.items())

            def model_current() -> bool:
                return model_is({s.name: updater.gpus_used(s.name) for s in specs})

            await wait_until(
                lambda: model_is({"pl-split": [2, 2], "pl-three": [3, 0], "pl-empty": [0, 0]}),
                "the controller's models of the test nodes",
                within=30,
            )
            local.scheduler.start()

            # 1. a 4-GPU pod: only nodes with a whole free zone; never the 2 + 2 node
            aligned = {"pl-three", "pl-empty"}
            await core.create_namespaced_pod(
                "default", body(gpu_pod("big-1", 4, label=label, selector=sel))
            )
            await wait_until(lambda: _bound(core, "big-1"), "big-1 scheduled", within=30)
            got = await pod_node(core, "big-1")
            assert got in aligned, f"big-1 went to {got}"
            await wait_until(
                lambda: updater.where.get("default/big-1") is not None and model_current(),
                "the controller to see big-1",
                within=30,
            )

            # 2. a 4-GPU pod that only fits 4 free GPUs split over two zones stays pending, with
            # the extender's reason in the scheduler's message
            await core.create_namespaced_pod(
                "default",
                body(
                    gpu_pod(
                        "big-split",
                        4,
                        label=label,
                        selector={"kubernetes.io/hostname": "pl-split"},
                    )
                ),
            )

            async def rejected() -> bool:
                p = await core.read_namespaced_pod("big-split", "default")
                for c in p.status.conditions or []:
                    if c.type == "PodScheduled" and c.status == "False":
                        return "pyctl" in (c.message or "")
                return False

            await wait_until(rejected, "big-split unschedulable by the extender", within=30)
            assert await pod_node(core, "big-split") == ""
            await core.delete_namespaced_pod("big-split", "default", grace_period_seconds=0)
            # 3. single GPUs, one at a time: each goes where the fragment grows least
            for i in range(3):
                names = tuple(s.name for s in specs)
                args = {
                    "Pod": gpu_pod(f"one-{i}", 1, label=label, selector=sel),
                    "NodeNames": list(names),
                }
                answer = json.loads(ext.handle("prioritize", json.dumps(args).encode()))
                scores = {h["Host"]: h["Score"] for h in answer}
                best = {n for n, s in scores.items() if s == max(scores.values())}
                await core.create_namespaced_pod(
                    "default", body(gpu_pod(f"one-{i}", 1, label=label, selector=sel))
                )
                await wait_until(functools.partial(_bound, core, f"one-{i}"), f"one-{i} bound", 30)
                got = await pod_node(core, f"one-{i}")
                assert got in best, f"one-{i} went to {got}; extender scores {scores}"
                if i == 0:
                    # the first single GPU fills a stranded GPU, not the emptiest node
                    assert got != "pl-empty", scores

                def seen(i: int = i) -> bool:
                    return updater.where.get(f"default/one-{i}") is not None and model_current()

                await wait_until(
                    seen,
                    f"the controller to see one-{i}",
                    within=30,
                )

            assert updater.misaligned == []  # no pod would have failed kubelet admission
            tg.cancel_scope.cancel()
    finally:
        await local.stop()
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={label}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)

        async def gone() -> bool:  # the next mode's run reuses the names
            return not (
                await core.list_namespaced_pod("default", label_selector=f"app={label}")
            ).items

        await wait_until(gone, "the test's pods deleted", within=60)


async def _bound(core: client.CoreV1Api, name: str) -> bool:
    return bool(await pod_node(core, name))
