"""The RDMA resource against the real kube-scheduler: kwok nodes that advertise an RDMA device
plugin's shared HCA devices (`rdma/hca_shared_devices_a`, 200 on one node, 800 on another, none on
a third), pods that request some, and a controller whose reflectors are told the resource's name
(`reflector_rdma_resource`). The controller reads each node's allocatable and its pods' requests as
the API server holds them, and for each pod, before it is created, pyctl's placement says whether
the node admits it; the real scheduler (its NodeResourcesFit) then binds it or leaves it
Unschedulable. The two must agree on every pod, and the idle GPUs no RDMA is left for are counted
as fragment."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.policy import rank
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.extender import LocalExtender
from pyctl.dev.gpu_nodes import (
    GPU,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    node_manifest,
    wait_nodes_ready,
)
from pyctl.dev.topology import TopologyUpdater
from pyctl.model import Shape, Snapshot, Workload
from pyctl.state.memory import MemoryStore
from tests.e2e.conftest import if_present, not_scheduled, wait_until
from tests.e2e.test_compaction_e2e import enforcing
from tests.e2e.test_placement_e2e import WORKLOAD as PLACEMENT_WORKLOAD
from tests.e2e.test_placement_e2e import (
    create_nodes,
    delete_nodes,
    gpu_deployment,
    model_gpus_used,
)

pytestmark = [pytest.mark.e2e]

RDMA = "rdma/hca_shared_devices_a"
LABEL = "rdma-e2e"
CMP_LABEL = "rdma-cmp-e2e"
CMP_SEL = {"pyctl.e2e/rdma-compaction": "true"}
#: M: single GPUs with 100 of RDMA each
SHAPE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, rdma=100)
WORKLOAD = Workload((SHAPE,))
NODES = [
    GpuNodeSpec("rdma-a", extra={RDMA: 200}),
    GpuNodeSpec("rdma-b", extra={RDMA: 800}),
    GpuNodeSpec("rdma-c"),
]


def rdma_pod(name: str, node: str) -> dict[str, Any]:
    """One GPU and 100 of RDMA (a limit only, as device-plugin resources often are), on `node`
    by its hostname label (the default scheduler decides whether it fits)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": LABEL}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/dlrm:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", GPU: "1"},
                        "limits": {GPU: "1", RDMA: "100"},
                    },
                }
            ],
        },
    }


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


async def _outcome(core: client.CoreV1Api, name: str) -> str | None:
    """ "bound", "unschedulable" (with the scheduler's reason), or None while undecided."""
    p = await core.read_namespaced_pod(name, "default")
    if p.spec.node_name:
        return "bound"
    c = not_scheduled(p)
    if c is not None and c.reason == "Unschedulable":
        return f"unschedulable: {c.message}"
    return None


@pytest.mark.anyio
async def test_pyctl_admits_exactly_what_the_real_scheduler_binds(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    core = client.CoreV1Api(api)
    for s in NODES:
        await core.create_node(body(node_manifest(s)))
    await wait_nodes_ready(api, [s.name for s in NODES], within=60)
    ctl = Controller(
        "e2e-rdma",
        KubeClusterSource(kube, options=ReflectorOptions(rdma_resource=RDMA)),
        MemoryStore("e2e-rdma"),
        workload=WORKLOAD,
        summary_interval=0.5,
    )
    # what the API server holds: each node's allocatable, and the requests of its bound pods
    bound: dict[str, int] = {s.name: 0 for s in NODES}

    def model_current() -> bool:
        models = ctl.reconciler.models
        return all(
            (m := models.get(s.name)) is not None
            and (m.rdma, m.rdma_used) == (s.extra.get(RDMA, 0), bound[s.name])
            for s in NODES
        )

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await wait_until(model_current, "the controller's models of the nodes", within=30)
            # a fills after two, b takes more, c has no RDMA at all
            asked = ["rdma-a", "rdma-a", "rdma-a", "rdma-b", "rdma-c", "rdma-b"]
            seen: list[tuple[str, bool, str]] = []
            for i, node in enumerate(asked):
                model = FragmentationModel(Snapshot((ctl.reconciler.models[node],)))
                (best,) = rank(model, SHAPE, WORKLOAD)
                name = f"rdma-{i}"
                await core.create_namespaced_pod("default", body(rdma_pod(name, node)))
                outcome: list[str] = []

                async def decided(name: str = name, outcome: list[str] = outcome) -> bool:
                    got = await _outcome(core, name)
                    if got is not None:
                        outcome.append(got)
                    return got is not None

                await wait_until(decided, f"the scheduler's decision on {name}", within=30)
                seen.append((node, best is not None, outcome[0]))
                if outcome[0] == "bound":
                    bound[node] += 100
                    await wait_until(model_current, f"the controller to see {name}", within=30)
            for _, admitted, got in seen:
                assert admitted == (got == "bound"), seen
            # the scheduler said why: the resource, not the GPUs
            assert [got.startswith("unschedulable") for _, _, got in seen] == [
                False, False, True, False, True, False,
            ], seen  # fmt: skip
            assert all(RDMA in got for _, _, got in seen if got != "bound"), seen
            # the measure: a's 6 idle GPUs and c's 8 have no RDMA left for M's shape
            models = ctl.reconciler.models
            snap = Snapshot(tuple(models[s.name] for s in NODES))
            scores = {n.name: n for n in FragmentationModel(snap).score(WORKLOAD).nodes}
            assert scores["rdma-a"].fragment_gpu_milli == 6000.0
            assert scores["rdma-a"].categories["lack_cpu"] == 6000.0
            assert scores["rdma-c"].fragment_gpu_milli == 8000.0
            assert scores["rdma-b"].fragment_gpu_milli == 0.0
            tg.cancel_scope.cancel()
    finally:
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        for s in NODES:
            await if_present(core.delete_node(s.name))


def rdma_deployment(name: str, replicas: int, gpus: int, rdma: int) -> dict[str, Any]:
    """A Deployment of `gpu_pod`s (`gpus` GPUs, `rdma` of the RDMA resource as a limit) on the
    compaction test's nodes."""
    d = gpu_deployment(name, replicas, gpus, name, label=CMP_LABEL, selector=CMP_SEL)
    if rdma:
        c = d["spec"]["template"]["spec"]["containers"][0]
        c["resources"]["limits"][RDMA] = str(rdma)
    return d


@pytest.mark.anyio
async def test_compaction_rescues_through_the_node_with_rdma_to_spare(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    """Two 8-GPU kwok nodes under single-numa-node, each with 400 shared HCA devices. ``rb``:
    four 1-GPU replicas of ``bee`` (100 each: its RDMA used up), three in NUMA zone 0, one in
    zone 1; ``ra``: two of ``small`` (100 each), one per zone. A 4-GPU replica of ``big`` (no
    RDMA) is pending: no zone has 4 free GPUs. Freeing a zone of ``ra`` would send a small
    replica to ``rb``, where the real scheduler cannot bind it (no RDMA left); pyctl, reading the
    RDMA, rescues through ``rb`` instead: it evicts the bee replica of ``rb``'s zone 1 expecting
    it on ``ra``, and the real scheduler (with pyctl's extender) binds it there and the big
    replica in the zone it freed. (Blind to RDMA, run by hand: the rescue evicts a small replica
    of ``ra`` "expected to land on rb", the scheduler puts it back on ``ra``, more evictions
    follow and the big replica ends on ``ra``: this test fails at its first assertion.)"""
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    specs = [GpuNodeSpec(n, labels=CMP_SEL, extra={RDMA: 400}) for n in ("ra", "rb")]
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    updater = TopologyUpdater(api, specs, CMP_LABEL)
    cluster = "e2e-rdma-compaction"
    ctl = Controller(
        cluster,
        KubeClusterSource(kube, options=ReflectorOptions(rdma_resource=RDMA)),
        MemoryStore(cluster),
        workload=PLACEMENT_WORKLOAD,
        summary_interval=0.5,
    )
    local = LocalExtender(control_plane, ctl.reconciler, "pyctl-rdma", rdma_resource=RDMA)
    await local.start()
    elector, compactor = enforcing(ctl, kube, cluster, "pyctl-rdma-e2e")

    async def tier(name: str) -> list[Any]:
        got = await core.list_namespaced_pod(
            "default", label_selector=f"app={CMP_LABEL},tier={name}"
        )
        return [p for p in got.items if not p.metadata.deletion_timestamp]

    async def placed(name: str, count: int, node: str) -> bool:
        got = await tier(name)
        return len(got) == count and all(p.spec.node_name == node for p in got)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(updater.run)
            tg.start_soon(elector.run)
            await wait_until(
                lambda: all(model_gpus_used(ctl, s.name) == [0, 0] for s in specs),
                "the controller's models of the test nodes",
                within=30,
            )
            local.scheduler.start()
            # the history: bee on rb (3 + 1), small on ra (1 + 1)
            for name, replicas, node, other, zones in (
                ("bee", 4, "rb", "ra", [0, 0, 0, 1]),
                ("small", 2, "ra", "rb", [0, 1]),
            ):
                await core.patch_node(other, body({"spec": {"unschedulable": True}}))
                updater.hints[f"{name}-"] = list(zones)
                await apps.create_namespaced_deployment(
                    "default", body(rdma_deployment(name, replicas, 1, 100))
                )
                await wait_until(
                    functools.partial(placed, name, replicas, node), f"{name} on {node}", 30
                )
                await core.patch_node(other, body({"spec": {"unschedulable": None}}))
            await wait_until(
                lambda: (
                    model_gpus_used(ctl, "ra") == [1, 1]
                    and model_gpus_used(ctl, "rb") == [3, 1]
                    and ctl.reconciler.models["rb"].rdma_used == 400
                ),
                "the fragmented cluster in the controller's models",
                within=30,
            )
            smalls = {p.metadata.uid for p in await tier("small")}
            bees = {p.metadata.uid for p in await tier("bee")}
            await apps.create_namespaced_deployment(
                "default", body(rdma_deployment("big", 1, 4, 0))
            )

            async def big_unschedulable() -> bool:
                return any(not_scheduled(p) for p in await tier("big"))

            async def big_bound() -> bool:
                got = await tier("big")
                return len(got) == 1 and bool(got[0].spec.node_name)

            await wait_until(big_unschedulable, "the 4-GPU replica unschedulable", within=30)
            await wait_until(lambda: elector.is_leader, "the Lease", within=15)
            tg.start_soon(compactor.run, elector.still_leader)
            await wait_until(big_bound, "the 4-GPU replica scheduled", within=120)
            (big,) = await tier("big")
            assert big.spec.node_name == "rb"
            await wait_until(
                lambda: updater.where.get(f"default/{big.metadata.name}") is not None,
                "the topology-updater to see the 4-GPU replica",
            )
            assert updater.where[f"default/{big.metadata.name}"][:2] == ("rb", 1)
            # no small replica was evicted; one bee replica was, and runs again on ra
            assert {p.metadata.uid for p in await tier("small")} == smalls
            await wait_until(lambda: _bees_settled(core, bees), "bee running again", 30)
            moved = [p for p in await tier("bee") if p.metadata.uid not in bees]
            assert [p.spec.node_name for p in moved] == ["ra"], moved
            assert updater.misaligned == []
            # what the scheduler bound is what pyctl accounts: no node over its RDMA
            for s in specs:
                m = ctl.reconciler.models[s.name]
                assert m.rdma_used <= m.rdma == 400
            tg.cancel_scope.cancel()
    finally:
        await local.stop()
        for name in ("bee", "small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={CMP_LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)


async def _bees_settled(core: client.CoreV1Api, before: set[str]) -> bool:
    got = await core.list_namespaced_pod("default", label_selector=f"app={CMP_LABEL},tier=bee")
    live = [p for p in got.items if not p.metadata.deletion_timestamp]
    return (
        len(live) == 4
        and all(p.spec.node_name for p in live)
        and len({p.metadata.uid for p in live} - before) == 1
    )
