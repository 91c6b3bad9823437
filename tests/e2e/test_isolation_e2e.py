"""Input isolation on the real control plane (issue 16): a bad item is isolated, counted and
reported; it never stops the loop, and never changes what happens to the good items.

- Hostile pending pods (``nvidia.com/gpu: "4294967296"``; ``nvidia.com/gpu: 2`` plus
  ``nvidia.com/mig-1g.5gb: 1``; a MIG profile no GPU has) and a node whose labels claim an
  absurd GPU count: the controller (wired as `pyctl run` wires it: `attach_workflows`) scores
  every other node exactly as without them, keeps them out of the workload M, counts each once
  (`pyctl_ignored_objects_total`), puts a `PyctlIgnored` Event on each hostile pod, and compaction
  still completes (the pending 4-GPU replica gets the NUMA zone compaction frees).
- A ValidatingAdmissionPolicy on the real API server denies the eviction of some pods (CREATE on
  `pods/eviction`): compaction abandons those moves (403: a permanent refusal, an Event and
  `pyctl_workflows_abandoned_total`) and completes the others.
- An eviction carrying the uid of a pod that was deleted and recreated under the same name does
  not evict the new pod (`preconditions.uid`).

The cluster is test_compaction_e2e.py's: 2-NUMA 8-GPU kwok nodes under ``single-numa-node``, the
test playing NFD's topology-updater, a second kube-scheduler calling pyctl's extender.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.app.config import Config, WorkflowSection, WorkloadSection
from pyctl.app.wiring import Workflows, attach_workflows, workload_scope
from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import KubeClient
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.controller.placement import PlacementAdvisor
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.health import HealthServer
from pyctl.state.memory import MemoryStore
from pyctl.state.ratelimit import BucketLimit, SafetyLimits
from tests.e2e.conftest import wait_until
from tests.e2e.control_plane import ControlPlane, ExtraScheduler
from tests.e2e.gpu_nodes import GPU, GpuNodeSpec, apply_nrt_crd, body
from tests.e2e.test_placement_e2e import (
    TopologyUpdater,
    create_nodes,
    delete_nodes,
    extender_config,
    gpu_deployment,
    gpu_pod,
    kube,
    model_gpus_used,
)

pytestmark = [pytest.mark.e2e]

__all__ = ["kube"]  # the fixture

LOOSE = BucketLimit(capacity=100, per_second=100.0)
LIMITS = SafetyLimits(LOOSE, LOOSE, LOOSE, LOOSE, 0.0, disruptions_per_hour=None)


def hostile_pod(name: str, label: str, requests: dict[str, str]) -> dict[str, Any]:
    """A pending pod for the default scheduler (no node has what it asks for)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": label}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/x:1",
                    "resources": {"requests": {"cpu": "1", **requests}, "limits": requests},
                }
            ],
        },
    }


@dataclass
class Cluster:
    """The fragmented cluster and the controller watching it, wired as `pyctl run` wires it."""

    api: client.ApiClient
    label: str
    sel: dict[str, str]
    specs: list[GpuNodeSpec]
    ctl: Controller
    flows: Workflows
    updater: TopologyUpdater
    #: flipped by the test: compaction acts (and Events are sent) only while True
    leader: list[bool] = field(default_factory=lambda: [False])

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def tier(self, tier: str) -> list[Any]:
        got = await self.core.list_namespaced_pod(
            "default", label_selector=f"app={self.label},tier={tier}"
        )
        return list(got.items)

    def counter(self, name: str, **labels: str) -> float:
        v = self.ctl.metrics.registry.get_sample_value(name, {"cluster": "e2e-iso", **labels})
        return float(v or 0.0)

    async def fragment(self) -> dict[str, str]:
        """c-frag: two 1-GPU replicas, one per NUMA zone; c-full: 3 + 3 GPUs of bare pods.
        Returns the small replicas' uid -> name."""
        core, apps = self.core, client.AppsV1Api(self.api)
        await core.patch_node("c-full", body({"spec": {"unschedulable": True}}))
        self.updater.hints["small-"] = [0, 1]
        dep = gpu_deployment("small", 2, 1, "s", label=self.label, selector=self.sel)
        await apps.create_namespaced_deployment("default", body(dep))

        async def smalls_bound() -> bool:
            got = await self.tier("s")
            return len(got) == 2 and all(p.spec.node_name == "c-frag" for p in got)

        await wait_until(smalls_bound, "the small replicas on c-frag", within=60)
        await core.patch_node("c-full", body({"spec": {"unschedulable": None}}))
        for name, zone in (("fill-0", 0), ("fill-1", 1)):  # bare pods: never evicted
            self.updater.pinned[f"default/{name}"] = zone
            pod = gpu_pod(name, 3, label=self.label, node="c-full")
            await core.create_namespaced_pod("default", body(pod))
        want = {"c-frag": [1, 1], "c-full": [3, 3]}
        await wait_until(
            lambda: all(model_gpus_used(self.ctl, n) == u for n, u in want.items()),
            "the fragmented cluster in the controller's models",
            within=60,
        )
        return {p.metadata.uid: p.metadata.name for p in await self.tier("s")}

    async def big_bound_on(self, node: str) -> bool:
        got = await self.tier("b")
        return len(got) == 1 and got[0].spec.node_name == node


@asynccontextmanager
async def fragmented_cluster(
    control_plane: ControlPlane, api: client.ApiClient, kube: KubeClient, extra_nodes: int = 0
) -> AsyncIterator[tuple[Cluster, anyio.abc.TaskGroup]]:
    tag = uuid.uuid4().hex[:6]
    label = f"iso-{tag}"
    sel = {"pyctl.e2e/isolation": tag}
    specs = [GpuNodeSpec(n, labels=sel) for n in ("c-frag", "c-full")]
    specs += [GpuNodeSpec(f"c-odd-{i}", labels={"pyctl.e2e/odd": tag}) for i in range(extra_nodes)]
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    updater = TopologyUpdater(api, specs, label)
    cfg = Config(
        cluster="e2e-iso",
        mode="enforce",
        summary_interval=0.5,
        workload=WorkloadSection(interval=0.5),
        workflow=WorkflowSection(interval=0.5, max_moves=3),
    )
    leader = [False]
    ctl = Controller(
        cfg.cluster,
        KubeClusterSource(kube),
        MemoryStore(cfg.cluster),
        summary_interval=cfg.summary_interval,
        is_leader=lambda: leader[0],
        workload_interval=cfg.workload.interval,
        scope=workload_scope(cfg),  # M derived from the pods: kube-system left out, cap 0.5
    )
    flows = attach_workflows(ctl, cfg, actuator=KubeActuator(kube, instance="r0"), limits=LIMITS)
    ext = ExtenderHandler(PlacementAdvisor.for_reconciler(ctl.reconciler))
    server = HealthServer(ctl.metrics.registry, ctl.ready, "127.0.0.1", 0, extender=ext)
    port = await server.start()
    sched = ExtraScheduler(
        control_plane,
        f"pyctl-iso-{tag}",
        extender_config(f"http://127.0.0.1:{port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    c = Cluster(api, label, sel, specs, ctl, flows, updater, leader)
    core, apps = c.core, client.AppsV1Api(api)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(updater.run)
            await wait_until(
                lambda: all(model_gpus_used(ctl, s.name) == [0, 0] for s in specs),
                "the controller's models of the test nodes",
                within=60,
            )
            sched.start()
            yield c, tg
            tg.cancel_scope.cancel()
    finally:
        sched.stop()
        await server.stop()
        for name in ("small", "big"):
            try:
                await apps.delete_namespaced_deployment(name, "default")
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={label}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)


HOSTILE = {
    # out of bounds at decode: no machine has 2**32 GPUs
    "hostile-huge": ({GPU: "4294967296"}, "out_of_bounds", "nvidia.com/gpu is 4294967296"),
    # the plausible mistake: the core cannot model it
    "hostile-both": (
        {GPU: "2", "nvidia.com/mig-1g.5gb": "1"},
        "shape_rejected",
        "requests both nvidia.com/gpu and a MIG profile (nvidia.com/mig-1g.5gb)",
    ),
    "hostile-odd-mig": ({"nvidia.com/mig-9g.1tb": "1"}, "shape_rejected", "unknown MIG profile"),
}


@pytest.mark.anyio
async def test_hostile_pods_and_a_hostile_node_change_nothing_else(
    control_plane: ControlPlane, api: client.ApiClient, kube: KubeClient
) -> None:
    async with fragmented_cluster(control_plane, api, kube, extra_nodes=1) as (c, _tg):
        ctl, core, r = c.ctl, c.core, c.ctl.reconciler
        original = await c.fragment()
        await wait_until(lambda: not r.workload_unset, "M derived from the pods")
        await anyio.sleep(1.5)  # M re-derived and the nodes re-scored since the last change
        nodes = ("c-frag", "c-full")
        before = {n: r.scores[n] for n in nodes}
        m_before = r.workload
        assert {(s.gpus, s.mig_profile) for s in m_before.shapes} == {(1, None), (3, None)}

        # -- hostile pending pods, and a node claiming an absurd GPU count ------------------
        for name, (req, _, _) in HOSTILE.items():
            await core.create_namespaced_pod("default", body(hostile_pod(name, c.label, req)))
        await core.patch_node(
            "c-odd-0", body({"metadata": {"labels": {"nvidia.com/gpu.count": "9" * 30}}})
        )

        def counted() -> bool:
            return (
                c.counter("pyctl_ignored_objects_total", kind="Pod", reason="out_of_bounds") == 1
                and c.counter("pyctl_ignored_objects_total", kind="Pod", reason="shape_rejected")
                == 2
                and c.counter("pyctl_ignored_objects_total", kind="Node", reason="out_of_bounds")
                == 1
            )

        await wait_until(counted, "each hostile object counted", within=30)
        assert "c-odd-0" not in r.scores  # left out: its last good version left the view
        await anyio.sleep(2.0)  # several derivations of M and summaries with them present
        assert r.workload == m_before  # no hostile pod in M
        assert {n: r.scores[n] for n in nodes} == before  # every good node scored as before
        assert not r.bad_nodes
        assert ctl.last_summary is not None
        assert ctl.last_summary.nodes == len(r.scores)  # c-odd-0 is not counted

        # -- compaction still completes; the hostile pods get their Event ------------------
        c.leader[0] = True
        dep = gpu_deployment("big", 1, 4, "b", label=c.label, selector=c.sel)
        await client.AppsV1Api(api).create_namespaced_deployment("default", body(dep))
        await wait_until(lambda: c.big_bound_on("c-frag"), "the 4-GPU replica on c-frag", 120)
        evicted = set(original) - {p.metadata.uid for p in await c.tier("s")}
        assert evicted, "no small replica was moved"

        async def told() -> dict[str, str]:
            got = await core.list_namespaced_event("default", field_selector="reason=PyctlIgnored")
            return {e.involved_object.name: e.message for e in got.items}

        await wait_until(
            lambda: told_all(told, set(HOSTILE)), "a PyctlIgnored Event on each hostile pod", 30
        )
        events = await told()
        for name, (_, _, why) in HOSTILE.items():
            assert events[name].startswith("pyctl ignores this pod: "), events[name]
            assert why in events[name], (name, events[name])
        # counted once each, however many times they were seen
        assert counted()
        for name in HOSTILE:  # still there, still pending, never touched
            p = await core.read_namespaced_pod(name, "default")
            assert not p.spec.node_name


async def told_all(told: Callable[[], Any], names: set[str]) -> bool:
    return names <= set(await told())
