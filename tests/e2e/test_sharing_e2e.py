"""GPU sharing on the real control plane (docs/sharing.md): kwok nodes advertise time-sliced
replicas or HAMi's devices, the real kube-scheduler places the pods, and the per-GPU shares pyctl
reports equal the assignments.

kwok runs no device plugin and there is no HAMi scheduler here; `tests/e2e/sharing_sim.py`
stands in for both, following their documented protocols: the NVIDIA device plugin's replica
allocation (its `distributed` policy) as the kubelet admits bound pods, and HAMi's scheduler
extender, called by a real kube-scheduler profile `hami-scheduler` configured as HAMi's chart
does, which writes HAMi's pod annotations (the real kube-scheduler never writes them)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.dev.control_plane import ControlPlane, ExtraScheduler
from pyctl.dev.gpu_nodes import body, wait_nodes_ready
from pyctl.state.memory import MemoryStore
from tests.e2e.conftest import WaitTimeout, if_present, wait_until
from tests.e2e.sharing_sim import (
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENT,
    HAMI_SCHEDULER,
    SHARED,
    HamiScheduler,
    ReplicaAllocator,
    exclusive_node,
    hami_devices,
    hami_node,
    time_sliced_node,
)

pytestmark = [pytest.mark.e2e]

NS = "default"


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


def pod(
    name: str,
    label: str,
    selector: dict[str, str],
    containers: list[dict[str, str]],
    scheduler: str = "default-scheduler",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": label}},
        "spec": {
            "schedulerName": scheduler,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": selector,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "registry.example/model:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", **extra},
                        "limits": dict(extra),
                    },
                }
                for i, extra in enumerate(containers)
            ],
        },
    }


async def cleanup(core: client.CoreV1Api, label: str, nodes: list[str]) -> None:
    await core.delete_collection_namespaced_pod(
        NS, label_selector=f"app={label}", grace_period_seconds=0
    )
    for n in nodes:
        await if_present(core.delete_node(n))


async def bound_or_refused(core: client.CoreV1Api, name: str) -> str:
    """The pod's node, or "" once the scheduler said it cannot place it."""
    with anyio.fail_after(60):
        while True:
            p = await core.read_namespaced_pod(name, NS)
            if p.spec.node_name:
                return str(p.spec.node_name)
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                    return ""
            await anyio.sleep(0.1)


def holders(ctl: Controller, node: str) -> list[dict[str, int]] | None:
    m = ctl.reconciler.models.get(node)
    if m is None:
        return None
    return [dict(g.holders) for z in m.zones for g in z.gpus]


@pytest.mark.anyio
async def test_time_sliced_replicas_are_where_the_device_plugin_puts_them(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    label = "ts-e2e"
    sel = {"pyctl.e2e/sharing": "time-slicing"}
    ts = ["ts-e2e-0", "ts-e2e-1"]
    core = client.CoreV1Api(api)
    for n in ts:
        await core.create_node(body(time_sliced_node(n, gpus=4, replicas=4, labels=sel)))
    await core.create_node(body(exclusive_node("ex-e2e-0", 2, labels=sel)))
    nodes = [*ts, "ex-e2e-0"]
    await wait_nodes_ready(api, nodes)
    alloc = ReplicaAllocator(dict.fromkeys(ts, 4), replicas=4)
    ctl = Controller("e2e-ts", KubeClusterSource(kube), MemoryStore("e2e-ts"), summary_interval=0.5)
    seq = 0

    async def create(replicas: int = 0, gpus: int = 0) -> str:
        nonlocal seq
        name = f"ts-{seq:03d}"
        seq += 1
        extra = {SHARED: str(replicas)} if replicas else {GPU: str(gpus)}
        await core.create_namespaced_pod(NS, body(pod(name, label, sel, [extra])))
        return name

    def expected(node: str) -> list[dict[str, int]]:
        return [{p: 250 * k for p, k in g.items()} for g in alloc.held[node]]

    def agrees() -> bool:
        return all(holders(ctl, n) == expected(n) for n in ts)

    async def follow() -> None:
        while True:
            await alloc.sync(core, NS, label)
            await anyio.sleep(0.2)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(follow)
            # 14 pods of one replica, 3 of two, 2 asking whole nvidia.com/gpu, one at a time
            # (the kubelet admits them in the order they are bound)
            where: dict[str, str] = {}
            for replicas, gpus in [(1, 0)] * 7 + [(2, 0), (0, 1)] + [(1, 0)] * 7 + [(2, 0)] * 2:
                name = await create(replicas, gpus)
                where[name] = await bound_or_refused(core, name)
            assert all(where.values()), where
            # the real scheduler keeps nvidia.com/gpu.shared on the nodes advertising it
            assert where["ts-008"] == "ex-e2e-0"
            assert {n for k, n in where.items() if k != "ts-008"} <= set(ts)
            await wait_until(agrees, "pyctl's per-GPU shares = the device plugin's", within=30)
            for n in ts:
                m = ctl.reconciler.models[n]
                assert m.sharing == "time-slicing x4 (nvidia.com/gpu.shared), attributed"
                assert m.gpu_pool == SHARED
            # more replicas than any node advertises: the real scheduler refuses it
            big = await create(replicas=17)
            assert await bound_or_refused(core, big) == ""
            p = await core.read_namespaced_pod(big, NS)
            (cond,) = [c for c in p.status.conditions if c.type == "PodScheduled"]
            assert f"Insufficient {SHARED}" in cond.message
            await core.delete_namespaced_pod(big, NS, grace_period_seconds=0)
            # half a GPU cannot be asked for (the seed's "nvidia.com/gpu: 0.5"): the API server
            # refuses fractional extended resources
            half = pod("ts-half", label, sel, [{GPU: "0.5"}])
            with pytest.raises(client.ApiException) as refused:
                await core.create_namespaced_pod(NS, body(half))
            assert refused.value.status == 422
            assert "must be an integer" in str(refused.value.body)
            # churn: pods go, new ones come; the device plugin fills the freed replicas first,
            # and pyctl, following the cluster, keeps every other replica where it was
            gone = ["ts-002", "ts-005", "ts-011"]
            for name in gone:
                await core.delete_namespaced_pod(name, NS, grace_period_seconds=0)

            async def all_gone() -> bool:
                pods = await core.list_namespaced_pod(NS, label_selector=f"app={label}")
                return not {p.metadata.name for p in pods.items} & set(gone)

            await wait_until(all_gone, "the deleted pods gone", within=30)
            try:
                await wait_until(agrees, "shares after the deletions", within=30)
            except WaitTimeout as e:  # say what each side holds
                seen = {n: (holders(ctl, n), expected(n)) for n in ts}
                raise WaitTimeout(f"{e}: (pyctl, device plugin) per node {seen}") from None
            for _ in range(3):
                name = await create(1)
                assert await bound_or_refused(core, name) in ts
            await wait_until(agrees, "pyctl's shares = the device plugin's after churn", within=30)
            # every GPU's replicas are accounted: the scheduler's count of bound replicas
            for n in ts:
                m = ctl.reconciler.models[n]
                held = sum(v for z in m.zones for g in z.gpus for _, v in g.holders)
                asked = sum(sum(g.values()) for g in alloc.held[n])
                assert held == 250 * asked
            tg.cancel_scope.cancel()
    finally:
        await cleanup(core, label, nodes)


def share(mem: int, cores: int, devmem: int = 81920) -> int:
    """docs/sharing.md: the larger of the memory and the core fraction, at least 1 milli."""
    return max(1, math.ceil(1000 * mem / devmem), math.ceil(1000 * cores / 100))


@pytest.mark.anyio
async def test_hami_shares_are_read_from_its_annotations(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    label = "hami-e2e"
    sel = {"pyctl.e2e/sharing": "hami"}
    core = client.CoreV1Api(api)
    devices = {n: hami_devices(n, 2) for n in ("hami-e2e-0", "hami-e2e-1")}
    for n, devs in devices.items():
        manifest = hami_node(n, devs)
        manifest["metadata"]["labels"].update(sel)
        await core.create_node(body(manifest))
    await wait_nodes_ready(api, list(devices))
    sim = HamiScheduler(api, devices)
    await sim.start()
    sched = ExtraScheduler(control_plane, "hami", sim.config())
    ctl = Controller(
        "e2e-hami", KubeClusterSource(kube), MemoryStore("e2e-hami"), summary_interval=0.5
    )
    requests: list[tuple[str, list[dict[str, str]]]] = [
        ("h-qwen", [{GPU: "1", GPUMEM: "20000", GPUCORES: "30"}]),
        ("h-sdxl", [{GPU: "1", GPUMEM_PERCENT: "50"}]),
        ("h-llm2", [{GPU: "2", GPUMEM: "30000", GPUCORES: "20"}]),
        ("h-rag", [{GPU: "1", GPUMEM: "8000", GPUCORES: "20"}] * 2),
        ("h-excl", [{GPU: "1", GPUCORES: "100"}]),
        # bound by its cores (60 %), not its memory (5 %)
        ("h-compute", [{GPU: "1", GPUMEM: "4000", GPUCORES: "60"}]),
        ("h-huge", [{GPU: "1", GPUMEM: "90000"}]),
        ("h-asr", [{GPU: "1", GPUMEM: "10000"}]),
    ]
    try:
        sched.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            where = {}
            for name, ctrs in requests:
                await core.create_namespaced_pod(
                    NS, body(pod(name, label, sel, ctrs, scheduler=HAMI_SCHEDULER))
                )
                where[name] = await bound_or_refused(core, name)
            # 90000 MiB fits no 80 GiB GPU: HAMi's extender leaves no node
            assert where.pop("h-huge") == ""
            assert all(where.values()), where
            for name, node in where.items():
                assert sim.assigned[f"{NS}/{name}"][0] == node
            # the truth: what the extender assigned, per node and device index: the pods, and
            # memory and cores in use
            index = {d.uuid: (n, d.index) for n, devs in devices.items() for d in devs}
            pods_on: dict[tuple[str, int], dict[str, int]] = {
                (n, d.index): {} for n, devs in devices.items() for d in devs
            }
            use: dict[tuple[str, int], list[int]] = {k: [0, 0] for k in pods_on}
            for key, (node, held) in sim.assigned.items():
                if key == f"{NS}/h-huge":
                    continue
                per: dict[str, list[int]] = {}
                for ctr in held:
                    for uuid, mem, cores in ctr:
                        acc = per.setdefault(uuid, [0, 0])
                        acc[0] += mem
                        acc[1] += cores
                for uuid, (mem, cores) in per.items():
                    assert index[uuid][0] == node
                    pods_on[index[uuid]][key] = share(mem, cores)
                    use[index[uuid]][0] += mem
                    use[index[uuid]][1] += cores

            def reported(node: str) -> dict[int, tuple[int, set[str]]] | None:
                m = ctl.reconciler.models.get(node)
                if m is None:
                    return None
                return {
                    g.id: (g.used_milli, {p for p, _ in g.holders}) for z in m.zones for g in z.gpus
                }

            def truth(node: str) -> dict[int, tuple[int, set[str]]]:
                # docs/sharing.md: the larger of the memory and the core fraction in use
                return {
                    i: (share(*use[(n, i)]) if pods else 0, set(pods))
                    for (n, i), pods in pods_on.items()
                    if n == node
                }

            try:
                await wait_until(
                    lambda: all(reported(n) == truth(n) for n in devices),
                    "pyctl's per-GPU shares = HAMi's assignments",
                    within=30,
                )
            except BaseException:
                for n in devices:  # say what differs
                    assert reported(n) == truth(n), n
                raise
            for n in devices:
                m = ctl.reconciler.models[n]
                assert m.sharing == "hami, exact"
                assert (m.gpu_pool, m.gpu_memory_mib) == ("hami", 81920)
                # GPU 0 on NUMA 0, GPU 1 on NUMA 1, as HAMi registered them
                assert [(z.numa, [g.id for g in z.gpus]) for z in m.zones] == [(0, [0]), (1, [1])]
                for z in m.zones:
                    for g in z.gpus:
                        # a pod holds its own share, scaled down to the GPU's when they overlap
                        own = pods_on[(n, g.id)]
                        assert sum(v for _, v in g.holders) == g.used_milli
                        assert all(v <= own[p] for p, v in g.holders)
            # the exclusive pod holds its GPU alone
            _, excl_ctrs = sim.assigned[f"{NS}/h-excl"]
            ((excl_uuid, _, _),) = excl_ctrs[0]
            assert pods_on[index[excl_uuid]] == {f"{NS}/h-excl": 1000}
            tg.cancel_scope.cancel()
    finally:
        sched.stop()
        await sim.stop()
        await cleanup(core, label, list(devices))
