"""Dynamic Resource Allocation end to end on the real control plane (issue 18, "Must show").

A simulated NVIDIA DRA driver (`dra_driver_sim`, which says why it is simulated) publishes
ResourceSlices for kwok nodes: whole H100 GPUs with `resource.kubernetes.io/numaNode`, and an
H100 in DynamicMIG mode (every profile at every placement, with counters). Pods ask for devices
through ResourceClaimTemplates; the real kube-controller-manager makes their claims and the real
kube-scheduler allocates them. pyctl watches it all (resource.k8s.io/v1 through its reflectors)
and must show:

- per NUMA zone, exactly the devices of the claims' allocation results (whole GPUs and the
  `3g.40gb` placement the scheduler picked), and a pod whose unconstrained devices span NUMA nodes
  reported as such (metric per namespace and workload);
- a 4-GPU claim with `matchAttribute: resource.kubernetes.io/numaNode` that no zone can satisfy
  (6 GPUs free on the node, 3 + 3) reported as pending because of `numa_split`;
- compaction in enforce mode evicting a template-claim replica (never the pods of standalone
  claims) so that a zone frees up, and the real scheduler then allocating the pending claim there.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.dra.devices import NUMA_ATTRIBUTE
from pyctl.cluster.dra.search import allocate
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.cluster.quantity import parse_quantity
from pyctl.cluster.translate import shape_of
from pyctl.controller.controller import Controller
from pyctl.core import mig
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.extender import TEST_SCHEDULER, LocalExtender
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest, wait_nodes_ready
from pyctl.jsontypes import as_object
from pyctl.model import Shape, Workload
from pyctl.state.memory import MemoryStore
from pyctl.workflows.dra_steering import DraSteering
from tests.e2e.conftest import if_present, not_scheduled, wait_until
from tests.e2e.dra_driver_sim import (
    GPU_CLASS,
    GROUP,
    MIG_CLASS,
    PRODUCTS,
    VERSION,
    SimDraDriver,
    SimGpu,
    SimNode,
    slices_for,
)
from tests.e2e.test_compaction_e2e import enforcing, enforcing_gate
from tests.e2e.test_placement_e2e import kube

pytestmark = [pytest.mark.e2e]

__all__ = ["kube"]

NS = "default"
H100 = "NVIDIA-H100-80GB-HBM3"


def dra_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A kwok node whose GPUs come only from the DRA driver (no nvidia.com/gpu resources)."""
    spec = GpuNodeSpec(name, product=H100, numa_zones=2, gpus_per_zone=0, labels=labels or {})
    m = node_manifest(spec)
    status = as_object(m["status"], "status")
    for key in ("capacity", "allocatable"):
        as_object(status[key], key).pop("nvidia.com/gpu", None)
    return m


def template(name: str, request: dict[str, Any], constraints: list[Any] | None = None) -> Any:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [request], "constraints": constraints or []}}},
    }


def gpus_request(count: int) -> dict[str, Any]:
    return {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": count}}


ALIGNED = [{"requests": ["gpus"], "matchAttribute": NUMA_ATTRIBUTE}]


def claim_pod(
    name: str,
    claims: dict[str, str],
    *,
    node: str | None = None,
    scheduler: str = "",
    labels: dict[str, str] | None = None,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod whose GPUs come from claims: {pod claim name: "template:<t>" | "claim:<c>"}."""
    rcs = []
    for cname, src in claims.items():
        kind, _, ref = src.partition(":")
        key = "resourceClaimTemplateName" if kind == "template" else "resourceClaimName"
        rcs.append({"name": cname, key: ref})
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "c",
                "image": "registry.example/llm:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    "claims": [{"name": c} for c in claims],
                },
            }
        ],
        "resourceClaims": rcs,
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    sel = dict(selector or {})
    if node:
        sel["kubernetes.io/hostname"] = node
    if sel:
        spec["nodeSelector"] = sel
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": spec,
    }


class Dra:
    """The DRA objects of the test, through the real API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def create(self, plural: str, obj: dict[str, Any]) -> None:
        await self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, body(obj))

    async def claims(self) -> list[dict[str, Any]]:
        got = await self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "resourceclaims")
        return list(got["items"])

    async def claims_of(self, pod: str) -> list[dict[str, Any]]:
        p = await self.core.read_namespaced_pod(pod, NS)
        names = {s.resource_claim_name for s in (p.status.resource_claim_statuses or [])}
        names |= {
            c.resource_claim_name for c in p.spec.resource_claims or [] if c.resource_claim_name
        }
        return [c for c in await self.claims() if c["metadata"]["name"] in names]

    async def allocated(self, pod: str) -> list[dict[str, Any]]:
        """The allocation results of the pod's claims (empty until all are allocated)."""
        out = []
        claims = await self.claims_of(pod)
        if not claims:
            return []
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation")
            if not alloc:
                return []
            out += alloc["devices"]["results"]
        return out

    async def is_allocated(self, pod: str) -> bool:
        """All of the pod's claims are allocated (a predicate for `wait_until`)."""
        return bool(await self.allocated(pod))

    async def bound(self, pod: str) -> str:
        try:
            p = await self.core.read_namespaced_pod(pod, NS)
        except client.ApiException as exc:
            if exc.status == 404:
                return ""
            raise
        return str(p.spec.node_name or "")

    async def cleanup(self, pods: list[str], names: dict[str, list[str]]) -> None:
        for p in pods:
            await if_present(self.core.delete_namespaced_pod(p, NS, grace_period_seconds=0))
        for plural, items in names.items():
            for n in items:
                await if_present(
                    self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, plural, n)
                )


async def remove(driver: SimDraDriver, core: client.CoreV1Api, nodes: list[SimNode]) -> None:
    """A test's clean-up: the simulated driver's slices withdrawn, its nodes deleted."""
    await driver.withdraw()
    for n in nodes:
        await if_present(core.delete_node(n.name))


def published_numa(nodes: list[SimNode]) -> dict[tuple[str, str], int]:
    """(pool, device) -> the numaNode the simulated driver published for it."""
    out = {}
    for n in nodes:
        for s in slices_for(n):
            for d in s["spec"].get("devices", []):
                numa = d["attributes"]["resource.kubernetes.io/numaNode"]["int"]
                out[(n.name, d["name"])] = numa
    return out


def pyctl_used(ctl: Controller, node: str) -> dict[int, set[str]] | None:
    """The devices pyctl's model of `node` shows in use, per NUMA zone (device names)."""
    dm = ctl.reconciler.dra_models.get(node)
    model = ctl.reconciler.models.get(node)
    if dm is None or model is None:
        return None
    out: dict[int, set[str]] = {}
    for g in dm.gpus:
        zone = out.setdefault(g.zone, set())
        if g.whole and g.used_milli and g.gpu.whole is not None:
            zone.add(g.gpu.whole.id.device)
        minor = g.gpu.key.rsplit("gpu-", 1)[-1]
        for prof, start, used, _ in g.instances:
            if used:
                p = mig.model(H100).profile(prof)
                zone.add(f"gpu-{minor}-mig-{prof.replace('.', '')}-{p.id}-{start}")
    # the core's input agrees: used DRA GPUs and MIG instances per zone
    for z in model.zones:
        whole = sum(1 for g in z.dra_gpus if g.used_milli)
        parts = sum(1 for m in z.mig if m.dra for i in m.instances if i.used)
        if whole + parts != len(out.get(z.numa, set())):
            return None
    return {z: s for z, s in out.items() if s}


async def api_used(dra: Dra, pods: list[str], numa: dict[tuple[str, str], int]) -> dict[str, Any]:
    """node -> zone -> devices, from the claims' allocation results."""
    out: dict[str, dict[int, set[str]]] = {}
    for pod in pods:
        for r in await dra.allocated(pod):
            node = r["pool"]
            out.setdefault(node, {}).setdefault(numa[(node, r["device"])], set()).add(r["device"])
    return out


@pytest.mark.anyio
async def test_allocations_by_the_real_scheduler_are_read_device_by_device(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    core = client.CoreV1Api(api)
    driver = SimDraDriver(api)
    dra = Dra(api)
    # dra-x: 2 NUMA zones of 4 whole GPUs; dra-m: an H100 in DynamicMIG mode (zone 0) and a whole
    # GPU (zone 1)
    nodes = [
        SimNode("dra-x", [SimGpu(i, i // 4) for i in range(8)]),
        SimNode("dra-m", [SimGpu(0, 0, dynamic_mig=True), SimGpu(1, 1)]),
    ]
    for n in nodes:
        await core.create_node(body(dra_node(n.name)))
    await wait_nodes_ready(api, [n.name for n in nodes])
    await driver.install_classes()
    await driver.publish(nodes)
    numa = published_numa(nodes)
    await dra.create("resourceclaimtemplates", template("x-two-aligned", gpus_request(2), ALIGNED))
    await dra.create("resourceclaimtemplates", template("x-three", gpus_request(3)))
    mig_req = {
        "name": "part",
        "exactly": {
            "deviceClassName": MIG_CLASS,
            "selectors": [
                {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"}}
            ],
        },
    }
    await dra.create("resourceclaimtemplates", template("x-mig-3g", mig_req))
    ctl = Controller(
        "e2e-dra",
        KubeClusterSource(kube),
        MemoryStore("e2e-dra"),
        workload=Workload(
            (Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, dra=True, numa_aligned=True),)
        ),
        summary_interval=0.3,
    )
    pods = ["x-pair", "x-three", "x-part"]
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await wait_until(
                lambda: pyctl_used(ctl, "dra-x") == {} and pyctl_used(ctl, "dra-m") == {},
                "pyctl's models of the DRA nodes",
                within=30,
            )
            m = ctl.reconciler.dra_models["dra-m"]
            assert m.basis == "numaNode"
            assert [g.dynamic for g in m.gpus] == [True, False]
            assert m.notes == [], m.notes  # the published counters agree with the catalog
            # allocated by the real kube-scheduler (the fixture's default one)
            await core.create_namespaced_pod(
                NS, body(claim_pod("x-pair", {"gpus": "template:x-two-aligned"}, node="dra-x"))
            )
            await core.create_namespaced_pod(
                NS, body(claim_pod("x-part", {"mig": "template:x-mig-3g"}, node="dra-m"))
            )

            async def allocated(*names: str) -> bool:
                for n in names:
                    if not await dra.bound(n) or not await dra.allocated(n):
                        return False
                return True

            await wait_until(lambda: allocated("x-pair", "x-part"), "claims allocated", within=60)
            # the unconstrained 3-GPU claim after the pair: the allocator takes the next devices
            await core.create_namespaced_pod(
                NS, body(claim_pod("x-three", {"gpus": "template:x-three"}, node="dra-x"))
            )
            await wait_until(lambda: allocated("x-three"), "the 3-GPU claim allocated", within=60)
            want = await api_used(dra, pods, numa)
            pair = await dra.allocated("x-pair")
            assert len({numa[("dra-x", r["device"])] for r in pair}) == 1  # aligned
            (part,) = await dra.allocated("x-part")
            assert part["device"].startswith("gpu-0-mig-3g40gb-9-"), part

            def agrees() -> bool:
                return all(pyctl_used(ctl, n) == want.get(n, {}) for n in ("dra-x", "dra-m"))

            await wait_until(agrees, f"pyctl's per-zone usage to equal {want}", within=30)
            # the dynamic GPU: the 3g.40gb placement's memory slices are taken, the rest free
            start = int(part["device"].rsplit("-", 1)[1])
            (g,) = [g for g in ctl.reconciler.dra_models["dra-m"].gpus if g.dynamic]
            assert g.free_slices == 0xFF & ~(0xF << start)
            # x-three got the devices after the pair's, in slice order: 2 in zone 0, 1 in zone 1
            three_zones = sorted(
                numa[("dra-x", r["device"])] for r in await dra.allocated("x-three")
            )
            assert three_zones == [0, 0, 1], three_zones

            def misaligned() -> bool:
                ctl.summarize()
                return [x.pod for x in ctl.reconciler.misaligned] == [f"{NS}/x-three"]

            await wait_until(misaligned, "the pod spanning NUMA nodes reported", within=30)
            v = ctl.metrics.registry.get_sample_value(
                "pyctl_pods_devices_span_numa_nodes",
                {"cluster": "e2e-dra", "namespace": NS, "workload": "Pod/x-three"},
            )
            assert v == 1.0
            assert ctl.reconciler.unknown == {}
            tg.cancel_scope.cancel()
    finally:
        await dra.cleanup(
            pods, {"resourceclaimtemplates": ["x-two-aligned", "x-three", "x-mig-3g"]}
        )
        await remove(driver, core, nodes)


def claim(name: str, request: dict[str, Any], constraints: list[Any] | None = None) -> Any:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [request], "constraints": constraints or []}},
    }


def deployment(
    name: str, replicas: int, source: str, sel: dict[str, str], node: str | None = None
) -> dict[str, Any]:
    """Replicas whose GPUs come from `source` ("template:<t>", or "claim:<c>": a standalone
    claim), scheduled by the scheduler with pyctl's extender."""
    pod = claim_pod("x", {"gpus": source}, scheduler=TEST_SCHEDULER, selector=sel, node=node)
    labels = {"app": "dra-cmp", "tier": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod["spec"]},
        },
    }


@pytest.mark.anyio
async def test_numa_split_claim_then_compaction_frees_a_zone_for_the_real_scheduler(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    driver = SimDraDriver(api)
    dra = Dra(api)
    sel = {"pyctl.e2e/dra-compaction": "true"}
    nodes = [SimNode(n, [SimGpu(i, i // 4) for i in range(8)]) for n in ("dc-frag", "dc-full")]
    for n in nodes:
        await core.create_node(body(dra_node(n.name, sel)))
    await wait_nodes_ready(api, [n.name for n in nodes])
    await driver.install_classes()
    await driver.publish(nodes)
    numa = published_numa(nodes)
    for name, count, aligned in (("dc-one", 1, False), ("dc-three", 3, True), ("dc-four", 4, True)):
        await dra.create(
            "resourceclaimtemplates",
            template(name, gpus_request(count), ALIGNED if aligned else None),
        )
    four = Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, dra=True, numa_aligned=True)
    one = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, dra=True)
    ctl = Controller(
        "e2e-dra-cmp",
        KubeClusterSource(kube),
        MemoryStore("e2e-dra-cmp"),
        workload=Workload((one, four)),
        summary_interval=0.3,
    )
    local = LocalExtender(control_plane, ctl.reconciler, "pyctl-dra")
    await local.start()
    elector, compactor = enforcing(ctl, kube, "e2e-dra-cmp", "pyctl-dra-e2e", NS, max_moves=2)
    bare = ["dc-hold"]

    async def tier(name: str) -> list[Any]:
        got = await core.list_namespaced_pod(NS, label_selector=f"app=dra-cmp,tier={name}")
        return [p for p in got.items if not p.metadata.deletion_timestamp]

    async def zones_of(pod: str) -> list[int]:
        return sorted(numa[(r["pool"], r["device"])] for r in await dra.allocated(pod))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(elector.run)
            await wait_until(
                lambda: all(pyctl_used(ctl, n.name) == {} for n in nodes),
                "pyctl's models of the DRA nodes",
                within=30,
            )
            local.scheduler.start()
            # dc-full: replicas using two standalone claims of 3 aligned GPUs, one per zone (the
            # evictor's rules would let them move; their claims do not)
            fills = []
            for i in range(2):
                await dra.create("resourceclaims", claim(f"dc-fill-{i}", gpus_request(3), ALIGNED))
                d = deployment(f"fill-{i}", 1, f"claim:dc-fill-{i}", sel, node="dc-full")
                await apps.create_namespaced_deployment(NS, body(d))

                async def fill_allocated(i: int = i) -> bool:
                    got = await tier(f"fill-{i}")
                    return len(got) == 1 and bool(await dra.allocated(got[0].metadata.name))

                await wait_until(fill_allocated, f"the replica of claim dc-fill-{i}", within=60)
                fills.append((await tier(f"fill-{i}"))[0].metadata.name)
            assert [await zones_of(fills[0]), await zones_of(fills[1])] == [[0, 0, 0], [1, 1, 1]]
            # dc-frag: the history that fragmented it, one 1-GPU replica in each zone
            await core.patch_node("dc-full", body({"spec": {"unschedulable": True}}))
            await apps.create_namespaced_deployment(
                NS, body(deployment("small", 1, "template:dc-one", sel))
            )

            async def smalls_allocated(n: int) -> bool:
                got = await tier("small")
                return len(got) == n and all([await dra.allocated(p.metadata.name) for p in got])

            await wait_until(lambda: smalls_allocated(1), "the first small replica", within=60)
            await core.create_namespaced_pod(
                NS, body(claim_pod("dc-hold", {"gpus": "template:dc-three"}, node="dc-frag"))
            )
            await wait_until(lambda: dra.is_allocated("dc-hold"), "the holding pod", within=60)
            await apps.patch_namespaced_deployment_scale(
                "small", NS, body({"spec": {"replicas": 2}})
            )
            await wait_until(lambda: smalls_allocated(2), "the second small replica", within=60)
            await core.delete_namespaced_pod("dc-hold", NS, grace_period_seconds=0)
            await core.patch_node("dc-full", body({"spec": {"unschedulable": None}}))
            smalls = {p.metadata.name: await zones_of(p.metadata.name) for p in await tier("small")}
            assert sorted(smalls.values()) == [[0], [1]], smalls
            await wait_until(
                lambda: (
                    pyctl_used(ctl, "dc-frag") is not None
                    and sorted(len(v) for v in (pyctl_used(ctl, "dc-frag") or {}).values())
                    == [1, 1]
                ),
                "pyctl's view of the fragmented node",
                within=30,
            )

            # -- the 4-GPU aligned claim: 6 GPUs free on dc-frag, no zone with 4 ---------------
            await apps.create_namespaced_deployment(
                NS, body(deployment("big", 1, "template:dc-four", sel))
            )

            async def big_unschedulable() -> bool:
                return any(not_scheduled(p) for p in await tier("big"))

            await wait_until(big_unschedulable, "the 4-GPU claim's pod unschedulable", within=60)

            def blocked_numa_split() -> bool:
                s = ctl.summarize()
                return s.blocked.get("numa_split", 0) == 1

            await wait_until(
                blocked_numa_split, "the pending claim reported as numa_split", within=30
            )
            v = ctl.metrics.registry.get_sample_value(
                "pyctl_pending_pods_blocked_by_fragmentation",
                {"cluster": "e2e-dra-cmp", "reason": "numa_split"},
            )
            assert v == 1.0
            frag = ctl.reconciler.scores["dc-frag"]
            assert frag.categories["numa_split"] > 0  # the 4-aligned shape cannot use its GPUs

            # -- compaction in enforce mode ----------------------------------------------------
            await wait_until(lambda: elector.is_leader, "the Lease", within=15)
            tg.start_soon(compactor.run, elector.still_leader)

            async def big_bound() -> bool:
                got = await tier("big")
                return len(got) == 1 and bool(await dra.allocated(got[0].metadata.name))

            await wait_until(big_bound, "the 4-GPU claim allocated", within=120)
            (big,) = await tier("big")
            assert big.spec.node_name == "dc-frag"
            zones = await zones_of(big.metadata.name)
            assert len(zones) == 4, zones
            assert len(set(zones)) == 1, zones
            plan = compactor.last_plan
            assert plan is not None
            for f in fills:  # pods of standalone claims are never moved
                assert "standalone ResourceClaim" in plan.refused.get(f"{NS}/{f}", ""), plan.refused
                assert await dra.bound(f) == "dc-full"
            evicted = ctl.metrics.registry.get_sample_value(
                "pyctl_evictions_total", {"cluster": "e2e-dra-cmp", "result": "evicted"}
            )
            assert (evicted or 0) >= 1
            tg.cancel_scope.cancel()
    finally:
        await local.stop()
        for name in ("small", "big", "fill-0", "fill-1"):
            await if_present(apps.delete_namespaced_deployment(name, NS))
        await core.delete_collection_namespaced_pod(
            NS, label_selector="app=dra-cmp", grace_period_seconds=0
        )
        await dra.cleanup(
            bare,
            {
                "resourceclaims": ["dc-fill-0", "dc-fill-1"],
                "resourceclaimtemplates": ["dc-one", "dc-three", "dc-four"],
            },
        )
        await remove(driver, core, nodes)


@pytest.mark.anyio
async def test_device_taint_rules_steer_the_real_allocator_off_stranding_placements(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    """On an empty DynamicMIG H100 the allocator takes the first free 1g.10gb placement (memory
    slice 0), which strands the only 4g.40gb placement (slices 0-3). With M = {1g.10gb, 4g.40gb}
    pyctl taints the 1g.10gb placements at slices 0-3 through DeviceTaintRules (served by the
    v1.37 API server), and the real scheduler then allocates one that strands nothing."""
    core = client.CoreV1Api(api)
    driver = SimDraDriver(api)
    dra = Dra(api)
    node = SimNode("ds-m", [SimGpu(0, 0, dynamic_mig=True)])
    await core.create_node(body(dra_node(node.name)))
    await wait_nodes_ready(api, [node.name])
    await driver.install_classes()
    await driver.publish([node])
    one = {**mig_request_1g(), "name": "part"}
    await dra.create("resourceclaimtemplates", template("ds-1g", one))
    w = Workload(
        (
            Shape(cpu_milli=1000, gpus=1, mig_profile="1g.10gb", dra=True),
            Shape(cpu_milli=1000, gpus=1, mig_profile="4g.40gb", dra=True),
        )
    )
    ctl = Controller("e2e-dra-steer", KubeClusterSource(kube), MemoryStore("s"), workload=w)
    elector, gate = enforcing_gate(ctl, kube, "e2e-dra-steer", "pyctl-dra-steer", NS)
    steering = DraSteering(ctl.reconciler, gate, interval=0.5)
    custom = client.CustomObjectsApi(api)

    async def start_of(pod: str) -> int | None:
        got = await dra.allocated(pod)
        return int(got[0]["device"].rsplit("-", 1)[1]) if got else None

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(elector.run)
            await wait_until(lambda: pyctl_used(ctl, node.name) == {}, "pyctl's model", within=30)
            # without steering: the first placement in the driver's order, slice 0
            await core.create_namespaced_pod(
                NS, body(claim_pod("ds-before", {"part": "template:ds-1g"}, node=node.name))
            )
            await wait_until(
                lambda: dra.is_allocated("ds-before"), "the first allocation", within=60
            )
            assert await start_of("ds-before") == 0
            await core.delete_namespaced_pod("ds-before", NS, grace_period_seconds=0)

            async def released() -> bool:
                return not [
                    c for c in await dra.claims() if c["metadata"]["name"].startswith("ds-before")
                ]

            await wait_until(released, "the first claim released", within=60)
            await wait_until(lambda: pyctl_used(ctl, node.name) == {}, "pyctl's model", within=30)
            # steering: pyctl's rules, through the gate, as the leader
            await wait_until(lambda: elector.is_leader, "the Lease", within=15)
            await steering.tick(True)
            assert steering.served is True
            assert sorted(r.device for r in steering.desired) == [
                f"gpu-0-mig-1g10gb-19-{s}" for s in range(4)
            ]
            rules = await custom.list_cluster_custom_object(
                GROUP,
                VERSION,
                "devicetaintrules",
                label_selector="app.kubernetes.io/managed-by=pyctl",
            )
            assert sorted(r["spec"]["deviceSelector"]["device"] for r in rules["items"]) == [
                f"gpu-0-mig-1g10gb-19-{s}" for s in range(4)
            ]
            await anyio.sleep(3.0)  # the scheduler's informer picks the rules up
            await core.create_namespaced_pod(
                NS, body(claim_pod("ds-after", {"part": "template:ds-1g"}, node=node.name))
            )
            await wait_until(
                lambda: dra.is_allocated("ds-after"), "the steered allocation", within=60
            )
            start = await start_of("ds-after")
            assert start is not None
            assert start >= 4, f"1g.10gb allocated at slice {start}: strands the 4g.40gb window"
            # once allocated, the view changes and the rules follow it (a tick deletes stale ones)
            await wait_until(lambda: pyctl_used(ctl, node.name) != {}, "pyctl's model", within=30)
            await steering.tick(True)
            tg.cancel_scope.cancel()
    finally:
        await dra.cleanup(["ds-before", "ds-after"], {"resourceclaimtemplates": ["ds-1g"]})
        await custom.delete_collection_cluster_custom_object(
            GROUP, VERSION, "devicetaintrules", label_selector="app.kubernetes.io/managed-by=pyctl"
        )
        await remove(driver, core, [node])


def mig_request_1g() -> dict[str, Any]:
    expr = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    return {"exactly": {"deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": expr}}]}}


# ---- consumable capacity: GPUs several claims share ------------------------------------------


def share_template(name: str, asked: dict[str, str]) -> Any:
    """A claim template asking a share of one GPU by capacity (`asked`: capacity -> quantity)."""
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS}
    if asked:
        exactly["capacity"] = {"requests": asked}
    return template(name, {"name": "gpu", "exactly": exactly})


def milli(amount: str, value: str) -> Fraction:
    return Fraction(1000) * parse_quantity(amount) / parse_quantity(value)


@pytest.mark.anyio
async def test_shares_of_gpus_allocated_by_capacity_are_read_as_the_scheduler_wrote_them(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    """Two H100s published with `allowMultipleAllocations` and `memory`/`compute` capacities with
    request policies (dra_driver_sim.SHARED_POLICIES). Pods ask shares through claim templates;
    the real kube-scheduler allocates them (DRAConsumableCapacity, beta and on in v1.37) and
    writes each result's `consumedCapacity` and `shareID`. pyctl must show:

    - each request consumes what pyctl's arithmetic says (33Gi stays 33Gi, compute 30 rounds up
      to 50, what a claim does not ask is the policy's default): equal to the scheduler's
      `consumedCapacity`;
    - each GPU's used share and each pod's share equal to those computed from the allocation
      results (largest fraction over the capacities, rounded up; docs/sharing.md);
    - a pod asking more memory than any one GPU has left stays pending for the real scheduler,
      and pyctl's allocation check refuses it too, while its shape is the share it asks;
    - a deleted pod's share is released in pyctl's model."""
    core = client.CoreV1Api(api)
    driver = SimDraDriver(api)
    dra = Dra(api)
    node = SimNode("dra-s", [SimGpu(0, 0, shared=True), SimGpu(1, 1, shared=True)])
    await core.create_node(body(dra_node(node.name)))
    await wait_nodes_ready(api, [node.name])
    await driver.install_classes()
    await driver.publish([node])
    asks = {
        "s-20": {"memory": "20Gi", "compute": "25"},
        "s-33": {"memory": "33Gi"},
        "s-c30": {"compute": "30"},
    }
    # what each consumes by the policies (memory: steps of 1Gi, default 8Gi; compute: 10, 25,
    # 50, 100, default 10)
    consumed = {
        "s-20": {"memory": "20Gi", "compute": "25"},
        "s-33": {"memory": "33Gi", "compute": "10"},
        "s-c30": {"memory": "8Gi", "compute": "50"},
    }
    templates = [*asks, "s-big"]
    for name, asked in asks.items():
        await dra.create("resourceclaimtemplates", share_template(name, asked))
    # compute asked in all: 25 + 25 + 10 + 50 = 110 of the two GPUs' 200
    pods = ["s-20-0", "s-20-1", "s-33-0", "s-c30-0"]
    w = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=500, dra=True),))
    ctl = Controller(
        "e2e-dra-share", KubeClusterSource(kube), MemoryStore("e2e-dra-share"), workload=w
    )
    _, _, _, mem_mib = PRODUCTS["H100-80GB"]
    value = {"memory": f"{mem_mib}Mi", "compute": "100"}

    def share_of(amounts: dict[str, Fraction]) -> int:
        return min(1000, max(math.ceil(v) for v in amounts.values()))

    async def truth() -> dict[int, tuple[int, dict[str, int]]]:
        """GPU minor -> (used share, pod -> share), from the claims' allocation results."""
        used: dict[int, dict[str, Fraction]] = {}
        holders: dict[int, dict[str, int]] = {}
        for p in pods:
            for r in await dra.allocated(p):
                gpu = int(r["device"].rsplit("-", 1)[1])
                got = {c: milli(v, value[c]) for c, v in r["consumedCapacity"].items()}
                for c, v in got.items():
                    used.setdefault(gpu, {}).setdefault(c, Fraction(0))
                    used[gpu][c] += v
                holders.setdefault(gpu, {})[f"{NS}/{p}"] = share_of(got)
        out = {}
        for g in used:
            total, own = share_of(used[g]), holders[g]
            if sum(own.values()) > total:
                # own shares, each rounded up, may add up to more than the GPU's: scaled down
                # to it by largest remainder (docs/sharing.md)
                exact = {k: Fraction(v * total, sum(own.values())) for k, v in own.items()}
                own = {k: math.floor(v) for k, v in exact.items()}
                order = sorted(exact, key=lambda k: (-(exact[k] - own[k]), k))
                for k in order[: total - sum(own.values())]:
                    own[k] += 1
            out[g] = (total, own)
        return out

    def reported() -> dict[int, tuple[int, dict[str, int]]] | None:
        dm = ctl.reconciler.dra_models.get(node.name)
        model = ctl.reconciler.models.get(node.name)
        if dm is None or model is None:
            return None
        shown = [g for z in model.zones for g in z.dra_gpus]
        if [g.used_milli for g in shown] != [g.used_milli for g in dm.gpus]:
            return None  # the core's input agrees with the DRA view
        out = {}
        for g in dm.gpus:
            assert g.shared
            if g.holders:
                out[int(g.gpu.key.rsplit("gpu-", 1)[1])] = (g.used_milli, dict(g.holders))
        return out

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await wait_until(
                lambda: reported() == {}, "pyctl's model of the shared GPUs", within=30
            )
            for p in pods:
                t = p.rsplit("-", 1)[0]
                await core.create_namespaced_pod(
                    NS, body(claim_pod(p, {"gpu": f"template:{t}"}, node=node.name))
                )
                await wait_until(partial(dra.is_allocated, p), f"{p} allocated", within=60)
            # what the scheduler recorded: the rounding pyctl computes, a share id per result
            per_device: dict[str, int] = {}
            for p in pods:
                (r,) = await dra.allocated(p)
                want = consumed[p.rsplit("-", 1)[0]]
                assert {c: parse_quantity(v) for c, v in r["consumedCapacity"].items()} == {
                    c: parse_quantity(v) for c, v in want.items()
                }, (p, r)
                assert r.get("shareID"), r
                per_device[r["device"]] = per_device.get(r["device"], 0) + 1
            assert max(per_device.values()) >= 2, per_device  # GPUs really are shared
            want_shares = await truth()
            await wait_until(
                lambda: reported() == want_shares,
                f"pyctl's shares to equal the allocation results' {want_shares}",
                within=30,
            )
            ctl.summarize()
            score = ctl.reconciler.scores[node.name]
            assert score.sharing == "dra consumable capacity (2 shared GPUs), exact"
            # a pod asking 1Gi more than the emptiest GPU has left: pending for both
            left = {0: Fraction(mem_mib * 2**20), 1: Fraction(mem_mib * 2**20)}
            for p in pods:
                for r in await dra.allocated(p):
                    g = int(r["device"].rsplit("-", 1)[1])
                    left[g] -= parse_quantity(r["consumedCapacity"]["memory"])
            big = math.floor(max(left.values()) / 2**30) + 1
            await dra.create(
                "resourceclaimtemplates", share_template("s-big", {"memory": f"{big}Gi"})
            )
            await core.create_namespaced_pod(
                NS, body(claim_pod("s-big-0", {"gpu": "template:s-big"}, node=node.name))
            )

            async def refused() -> bool:
                return not_scheduled(await core.read_namespaced_pod("s-big-0", NS)) is not None

            await wait_until(refused, "the real scheduler to leave s-big-0 pending", within=60)
            assert not await dra.is_allocated("s-big-0")
            ctx = ctl.reconciler.cache.dra
            nd = ctx.node(node.name)
            assert nd is not None

            def big_claim() -> Any:
                recs = [c for c in ctx.cat.claims.values() if c.owner_pod == "s-big-0"]
                return recs[0] if recs else None

            await wait_until(lambda: big_claim() is not None, "pyctl sees s-big-0's claim", 30)
            assert allocate([("s-big", big_claim().spec)], nd, ctx.cat).ok is False
            pending = ctl.cache.pods.get(f"{NS}/s-big-0")
            assert pending is not None
            shape = shape_of(pending, ctx)
            assert shape is not None
            assert (shape.gpus, shape.dra) == (1, True)
            assert shape.gpu_milli == math.ceil(milli(f"{big}Gi", value["memory"]))
            # a pod goes: its share is released
            gone = pods[0]
            await core.delete_namespaced_pod(gone, NS, grace_period_seconds=0)

            async def released() -> bool:
                return not any(
                    gone in str(c["metadata"].get("ownerReferences")) for c in await dra.claims()
                )

            await wait_until(released, f"{gone}'s claim released", within=60)
            pods.remove(gone)
            after = await truth()
            await wait_until(lambda: reported() == after, f"pyctl's shares {after}", within=30)
            assert ctl.reconciler.unknown == {}
            tg.cancel_scope.cancel()
    finally:
        await dra.cleanup([*pods, "s-big-0"], {"resourceclaimtemplates": templates})
        await remove(driver, core, [node])
