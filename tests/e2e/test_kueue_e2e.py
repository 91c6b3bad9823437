"""A Kueue pod group admitted by the real Kueue's Topology Aware Scheduling once pyctl has freed a
clique, not before (docs/fabric.md, "Kueue").

The cluster of the fabric e2e (tests/e2e/test_fabric_e2e.py): twelve kwok nodes of 4 GPUs in
three NVLink cliques (`nvidia.com/gpu.clique`), 24 one-GPU replicas filling two nodes of each
clique under a PodDisruptionBudget of ``maxUnavailable: 2``, so no clique has 16 GPUs free. Next
to the control plane, Kueue v0.17.0's manager (`pyctl.dev.kueue`): a `Topology` of two levels
(the clique, then the hostname), a ResourceFlavor on it, a ClusterQueue with GPU quota for all
48 GPUs and a LocalQueue. Then a Kueue pod group of 4 pods x 4 GPUs with
``kueue.x-k8s.io/podset-required-topology: nvidia.com/gpu.clique``.

Checked against the real components: with pyctl not running, Kueue keeps the group's Workload
unadmitted and its pods gated for 10 s (quota is there; the topology has no room). Then
``pyctl run --mode enforce`` as deployed sees the gated pods as a pending gang, frees the clique
cheapest to free (evictions through the Eviction API, the replicas' replacements steered to the
other cliques by its extender), Kueue admits the Workload with a topology assignment inside that
clique, ungates the pods, and the real kube-scheduler binds them there. The replicas never fall
below their budget (22 of 24).

The same with the ClusterQueue's GPU quota first below the group's 16 GPUs: Kueue's Workload
says it lacks quota, and pyctl, reading the Workload, makes no room (no eviction, no rescue)
while it runs; once the quota is raised, Kueue's Workload says the topology has no room, and
pyctl makes it as above. And the same with the ClusterQueue first inactive (its ResourceFlavor
not created yet): Kueue's Workload says so, pyctl makes no room; once the flavor exists, as
above.
"""

from __future__ import annotations

import contextlib
import urllib.error
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.dev.control_plane import Binaries, ControlPlane, ExtraScheduler, free_port
from pyctl.dev.extender import strict_config
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest, wait_nodes_ready
from pyctl.dev.kueue import QUEUE_LABEL, KueueManager
from tests.e2e.conftest import WaitTimeout, if_present, wait_until
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.e2e.test_fabric_e2e import replicas_on_full_nodes, running, tier_pods
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e]

LABEL = "fabric-e2e"  # the replicas of test_fabric_e2e's `deployment`
CLIQUE = "nvidia.com/gpu.clique"
HOSTNAME = "kubernetes.io/hostname"
FLAVOR_LABEL = "pyctl.e2e/kueue"
NODES = tuple(f"k-{i:02}" for i in range(12))
FULL = ("k-00", "k-01", "k-04", "k-05", "k-08", "k-09")
GROUP = "tp"
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
WINDOW = 10.0  # how long Kueue must keep the group out while pyctl does not run


def clique_of(node: str) -> str:
    return f"3f1c2a.{int(node[2:]) // 4}"


def kueue_objects(gpu_quota: int = 48) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): the Topology, ResourceFlavor, ClusterQueue (`gpu_quota` GPUs)
    and LocalQueue."""
    meta = {"labels": {"app": LABEL}}
    return [
        (
            f"{KUEUE_API}/topologies",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Topology",
                "metadata": {"name": "cliques", **meta},
                "spec": {"levels": [{"nodeLabel": CLIQUE}, {"nodeLabel": HOSTNAME}]},
            },
        ),
        (
            f"{KUEUE_API}/resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "gpu", **meta},
                "spec": {"nodeLabels": {FLAVOR_LABEL: "true"}, "topologyName": "cliques"},
            },
        ),
        (
            f"{KUEUE_API}/clusterqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": "gpus", **meta},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "gpu",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": "1000"},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": str(gpu_quota)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
        (
            f"{KUEUE_API}/namespaces/default/localqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "gpus", "namespace": "default", **meta},
                "spec": {"clusterQueue": "gpus"},
            },
        ),
    ]


def group_pod(i: int) -> dict[str, Any]:
    """A pod of the Kueue pod group: 4 GPUs, required topology the clique; the default
    scheduler binds it where Kueue's topology assignment says (its nodeSelector)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{GROUP}-{i}",
            "namespace": "default",
            "labels": {
                "app": LABEL,
                "tier": "g",
                QUEUE_LABEL: "gpus",
                "kueue.x-k8s.io/pod-group-name": GROUP,
            },
            "annotations": {
                "kueue.x-k8s.io/pod-group-total-count": "4",
                "kueue.x-k8s.io/podset-required-topology": CLIQUE,
            },
        },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/llm:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "4"},
                        "limits": {"nvidia.com/gpu": "4"},
                    },
                }
            ],
        },
    }


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def assigned_domains(wl: Mapping[str, Any]) -> list[tuple[dict[str, str], int]]:
    """A Workload's topology assignment (v1beta2's compressed slices) as (level -> value, pods)
    per domain of its lowest level, over all pod sets."""
    out: list[tuple[dict[str, str], int]] = []
    admission = (wl.get("status") or {}).get("admission") or {}
    for ps in admission.get("podSetAssignments") or []:
        ta = ps.get("topologyAssignment") or {}
        levels: list[str] = ta.get("levels") or []
        for sl in ta.get("slices") or []:
            n = int(sl.get("domainCount") or 0)
            columns: list[list[str]] = []
            for v in sl.get("valuesPerLevel") or []:
                if v.get("universal") is not None:
                    columns.append([v["universal"]] * n)
                else:
                    ind = v.get("individual") or {}
                    pre, suf = ind.get("prefix") or "", ind.get("suffix") or ""
                    columns.append([f"{pre}{r}{suf}" for r in ind.get("roots") or []])
            counts = sl.get("podCounts") or {}
            per = counts.get("individual") or [counts.get("universal") or 0] * n
            for d in range(n):
                out.append(({lv: col[d] for lv, col in zip(levels, columns, strict=True)}, per[d]))
    return out


@pytest.fixture
def kueue(control_plane: ControlPlane, control_plane_binaries: Binaries) -> Iterator[KueueManager]:
    manager = KueueManager(control_plane, control_plane_binaries)
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()


HELD_WINDOW = 15.0  # how long pyctl runs while Kueue holds the group back for something else
FLAVORS = f"{KUEUE_API}/resourceflavors"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "held_by", ["", "quota", "inactive"], ids=["room", "quota-then-room", "inactive-then-room"]
)
async def test_kueue_admits_the_group_once_pyctl_has_freed_a_clique(
    held_by: str,
    control_plane: ControlPlane,
    kueue: KueueManager,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    plane = control_plane

    async def req(method: str, path: str, obj: Any = None) -> dict[str, Any]:
        return dict(await anyio.to_thread.run_sync(plane.request, method, path, obj))

    async def workloads() -> list[dict[str, Any]]:
        got = await req("GET", f"{KUEUE_API}/namespaces/default/workloads")
        return [w for w in got.get("items") or [] if w["metadata"]["name"].startswith(GROUP)]

    sel = {"pyctl.e2e/fabric": "true", FLAVOR_LABEL: "true"}
    for n in NODES:
        spec = GpuNodeSpec(n, numa_zones=1, gpus_per_zone=4, labels={**sel, CLIQUE: clique_of(n)})
        await core.create_node(body(node_manifest(spec)))
    await wait_nodes_ready(api, list(NODES))
    flavor: dict[str, Any] = {}
    for path, obj in kueue_objects(8 if held_by == "quota" else 48):
        if held_by == "inactive" and path == FLAVORS:
            flavor = obj  # the ClusterQueue names a flavor that does not exist yet
            continue
        await req("POST", path, obj)

    async def queue_active() -> bool:
        cq = await req("GET", f"{KUEUE_API}/clusterqueues/gpus")
        return condition(cq, "Active").get("status") == "True"

    if held_by == "inactive":

        async def queue_inactive() -> bool:
            cq = await req("GET", f"{KUEUE_API}/clusterqueues/gpus")
            return condition(cq, "Active").get("status") == "False"

        await wait_until(queue_inactive, "Kueue to mark the ClusterQueue inactive", within=30)
    else:
        await wait_until(queue_active, "the ClusterQueue to be active", within=30)
    port = free_port()
    pyctl = ControllerProcess(
        plane.kubeconfig,
        redis_server.url,
        free_port(),
        tmp_path,
        extender_port=port,
        extra_env={
            "PYCTL_LEASE_NAME": "pyctl-kueue-e2e",
            "PYCTL_WORKFLOW_RESCUE_DEADLINE": "240",
            # freeing a node of four replicas takes four evictions in one rescue and one round
            "PYCTL_WORKFLOW_RESCUE_DEPTH": "4",
            "PYCTL_WORKFLOW_MAX_MOVES": "4",
            "PYCTL_FABRIC_INTERVAL": "1",
            "PYCTL_WORKLOAD_INTERVAL": "1",
        },
    )
    sched = ExtraScheduler(
        plane,
        "pyctl-kueue",
        strict_config(f"http://127.0.0.1:{port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    lowest = [99]
    try:
        # -- 24 replicas on the two first nodes of each clique, placed through pyctl's extender --
        pyctl.start("k0")
        sched.start()
        await replicas_on_full_nodes(api, NODES, FULL)
        # -- without pyctl: Kueue keeps the group out ------------------------------------------
        assert pyctl.kill() is None, f"pyctl exited by itself: see {tmp_path}"
        for i in range(4):
            got = await core.create_namespaced_pod("default", body(group_pod(i)))
            gates = {g.name for g in got.spec.scheduling_gates or []}
            assert "kueue.x-k8s.io/admission" in gates, gates  # Kueue's webhook gated it

        async def tried() -> bool:
            wls = await workloads()
            return len(wls) == 1 and condition(wls[0], "QuotaReserved").get("status") == "False"

        await wait_until(tried, "Kueue to try the group's Workload", within=30)
        why = ""
        with anyio.move_on_after(WINDOW):
            while True:
                [wl] = await workloads()
                assert condition(wl, "Admitted").get("status") != "True", wl.get("status")
                assert not (wl.get("status") or {}).get("admission"), wl["status"]
                why = condition(wl, "QuotaReserved").get("message", "")
                for p in await tier_pods(core, "g"):
                    assert not p.spec.node_name, p.metadata.name
                    assert p.spec.scheduling_gates, p.metadata.name
                await anyio.sleep(0.5)
        print(f"\n[kueue e2e] before pyctl, the Workload waits: {why}")
        if held_by:
            if held_by == "quota":
                assert "insufficient quota for nvidia.com/gpu" in why, why
            else:
                assert "ClusterQueue gpus is inactive" in why, why
            await no_room_while_held(core, pyctl, workloads, tmp_path)
            if held_by == "quota":
                await raise_quota(req)
            else:
                await req("POST", FLAVORS, flavor)
                await wait_until(queue_active, "the ClusterQueue to be active", within=30)
            await wait_for_room(workloads)
            assert pyctl.kill() is None, f"pyctl exited by itself: see {tmp_path}"
        else:
            assert "topology" in why.lower(), why

        # -- pyctl run --mode enforce: a clique freed, the group admitted there ----------------
        async def watch() -> None:
            while True:
                lowest[0] = min(lowest[0], len(running(await tier_pods(core, "s"))))
                await anyio.sleep(0.1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            t0 = anyio.current_time()
            pyctl.start("k1")

            async def admitted() -> bool:
                if pyctl.proc is None or pyctl.proc.poll() is not None:
                    raise AssertionError(f"pyctl exited by itself: see {tmp_path}")
                [wl] = await workloads()
                return condition(wl, "Admitted").get("status") == "True"

            await wait_until(admitted, "Kueue to admit the group", within=240)
            took = anyio.current_time() - t0
            print(f"[kueue e2e] admitted {took:.1f} s after pyctl started")

            async def group_runs() -> bool:
                return len(running(await tier_pods(core, "g"))) == 4

            await wait_until(group_runs, "all four pods of the group bound", within=60)

            async def smalls_back() -> bool:
                return len(running(await tier_pods(core, "s"))) == 24

            await wait_until(smalls_back, "all 24 replicas running again", within=120)
            tg.cancel_scope.cancel()

        [wl] = await workloads()
        domains = assigned_domains(wl)
        hosts = {d[HOSTNAME] for d, _ in domains}
        assert sum(c for _, c in domains) == 4, domains
        assert len({clique_of(h) for h in hosts}) == 1, domains
        group = running(await tier_pods(core, "g"))
        nodes = {p.spec.node_name for p in group}
        assert nodes <= hosts, (nodes, domains)  # bound where Kueue's assignment said
        assert len({clique_of(n) for n in nodes}) == 1, nodes
        assert lowest[0] >= 22, f"the PDB was violated: {lowest[0]} replicas up at one time"
        # pyctl made the room: its rescue events name the group's pods and the clique's nodes
        # (evictions on the nodes it freed; no eviction on those it kept for a pod that fits)
        events = await core.list_namespaced_event("default", field_selector="reason=PyctlRescue")
        uids = {p.metadata.uid for p in group}
        said = [e.message for e in events.items if e.involved_object.uid in uids]
        assert any("making room" in m for m in said), said
        for msg in said:
            assert any(f" {n}" in msg for n in nodes), msg
        print(f"[kueue e2e] rescues: {sorted(said)}; Workload: {domains}")
    finally:
        pyctl.kill()
        sched.stop()
        await cleanup(core, apps, policy, req)


async def no_room_while_held(
    core: client.CoreV1Api, pyctl: ControllerProcess, workloads: Any, tmp_path: Path
) -> None:
    """pyctl runs for `HELD_WINDOW` while Kueue says the group waits for something room does not
    give (quota, an active queue): it makes no room (every replica stays on its node, no rescue
    event) and the group stays out. Without the Workload read, pyctl takes the gated pods with a
    required topology for a gang waiting for room and starts freeing a clique within its first
    rounds (the case above)."""
    before = {p.metadata.name: p.spec.node_name for p in running(await tier_pods(core, "s"))}
    assert len(before) == 24
    pyctl.start("kq")
    await wait_until(pyctl.is_leader, "pyctl to lead", within=60)
    await anyio.sleep(HELD_WINDOW)
    if pyctl.proc is None or pyctl.proc.poll() is not None:
        raise AssertionError(f"pyctl exited by itself: see {tmp_path}")
    after = {p.metadata.name: p.spec.node_name for p in running(await tier_pods(core, "s"))}
    assert after == before, "pyctl moved replicas for a group that Kueue holds back"
    events = await core.list_namespaced_event("default", field_selector="reason=PyctlRescue")
    group = {p.metadata.uid for p in await tier_pods(core, "g")}
    said = [e.message for e in events.items if e.involved_object.uid in group]
    assert not said, said
    [wl] = await workloads()
    assert condition(wl, "Admitted").get("status") != "True", wl.get("status")
    print(f"[kueue e2e] pyctl ran {HELD_WINDOW:.0f} s beside the held-back group: no room made")


async def raise_quota(req: Any) -> None:
    """The ClusterQueue's GPU quota raised to all 48 GPUs."""
    for attempt in range(5):  # Kueue writes the queue's status meanwhile: 409 on a stale version
        cq = await req("GET", f"{KUEUE_API}/clusterqueues/gpus")
        for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
            if r["name"] == "nvidia.com/gpu":
                r["nominalQuota"] = "48"
        try:
            await req("PUT", f"{KUEUE_API}/clusterqueues/gpus", cq)
            break
        except urllib.error.HTTPError as exc:
            if exc.code != 409 or attempt == 4:
                raise


async def wait_for_room(workloads: Any) -> None:
    """Until Kueue's Workload says the group waits for room in a clique."""

    async def for_room() -> bool:
        [wl] = await workloads()
        return "topology" in condition(wl, "QuotaReserved").get("message", "")

    await wait_until(for_room, "Kueue to say the group waits for room", within=60)


async def cleanup(
    core: client.CoreV1Api, apps: client.AppsV1Api, policy: client.PolicyV1Api, req: Any
) -> None:
    """Delete what the test made, the group's pods while Kueue still runs (it removes their
    finalizers)."""
    for i in range(4):
        await if_present(core.delete_namespaced_pod(f"{GROUP}-{i}", "default"))
    await if_present(apps.delete_namespaced_deployment("small", "default"))
    await if_present(policy.delete_namespaced_pod_disruption_budget("small", "default"))

    async def group_gone() -> bool:
        return not await tier_pods(core, "g")

    try:
        await wait_until(group_gone, "the group's pods to go", within=30)
    except WaitTimeout:
        for p in await tier_pods(core, "g"):
            await if_present(
                core.patch_namespaced_pod(
                    p.metadata.name, "default", body({"metadata": {"finalizers": None}})
                )
            )
    for path, obj in reversed(kueue_objects()):
        with contextlib.suppress(OSError):  # already gone (urllib's HTTPError is an OSError)
            await req("DELETE", f"{path}/{obj['metadata']['name']}")

    async def queues_gone() -> bool:
        # Kueue's finalizers keep a ClusterQueue (and its flavor) until nothing uses them: the
        # next test creates them again under the same names
        for path, obj in kueue_objects():
            try:
                await req("GET", f"{path}/{obj['metadata']['name']}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    continue
                raise
            return False
        return True

    await wait_until(queues_gone, "Kueue's objects to go", within=60)
    for n in NODES:
        await if_present(core.delete_node(n))
