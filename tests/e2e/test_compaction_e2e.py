"""Replica compaction end to end on the real control plane (issue 7, "Must show"):

- a fragmented cluster (2-NUMA 8-GPU kwok nodes under ``single-numa-node``): ``c-frag`` holds two
  1-GPU replicas of a Deployment, one in each NUMA zone (6 GPUs free, no whole zone), ``c-full``
  holds 3 + 3 GPUs of pods that may not move (2 GPUs stranded); a 4-GPU replica is pending;
- the controller in enforce mode (in process: `Controller` + `KubeClusterSource` + `LeaderElector`
  + `KubeActuator` + gate + workflow engine + `Compactor`, wired as `pyctl run` wires them, with
  loose rate limits) evicts through the Eviction API;
- a PodDisruptionBudget with no budget holds it back (pyctl reads its selector, matchExpressions
  included, and plans no eviction under it; the API server would answer 429) until the budget
  returns;
- the real kube-controller-manager recreates the evicted replicas and the real kube-scheduler with
  pyctl's extender places them on the node that was already fuller, not back where they were; the
  pending 4-GPU replica gets the NUMA zone compaction freed.

NodeResourceTopology is static in the e2e cluster: the test plays the topology-updater
(`TopologyUpdater`, see test_placement_e2e.py) so that pyctl sees each pod in the zone the kubelet
would have given it. The PDB selects the replicas with ``matchExpressions``. The second scheduler
runs with ``--pod-max-in-unschedulable-pods-duration=5s`` so that a pod the extender rejected
before pyctl's view caught up with an eviction is retried within the test's time (the default is
5 minutes).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.extender import LocalExtender
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from pyctl.dev.topology import TopologyUpdater
from pyctl.state.memory import MemoryStore
from pyctl.state.ratelimit import BucketLimit, MemoryRateLimiter, SafetyLimits
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.engine import Context, Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from tests.e2e.conftest import if_present, not_scheduled, wait_until
from tests.e2e.test_placement_e2e import (
    WORKLOAD,
    create_nodes,
    delete_nodes,
    gpu_deployment,
    gpu_pod,
    kube,
    model_gpus_used,
)

pytestmark = [pytest.mark.e2e]

__all__ = ["kube"]  # the fixture, shared with the placement test

LABEL = "cmp-e2e"
SEL = {"pyctl.e2e/compaction": "true"}
CLUSTER = "e2e-compaction"


def deployment(name: str, replicas: int, gpus: int, tier: str) -> dict[str, Any]:
    return gpu_deployment(name, replicas, gpus, tier, label=LABEL, selector=SEL)


async def tier_pods(core: client.CoreV1Api, tier: str) -> list[Any]:
    got = await core.list_namespaced_pod("default", label_selector=f"app={LABEL},tier={tier}")
    return list(got.items)


def evictions(ctl: Controller, result: str) -> float:
    v = ctl.metrics.registry.get_sample_value(
        "pyctl_evictions_total", {"cluster": CLUSTER, "result": result}
    )
    return float(v or 0.0)


def enforcing_gate(
    ctl: Controller, kube: Any, cluster: str, lease: str, namespace: str = "default"
) -> tuple[LeaderElector, Gate]:
    """The enforce-mode gate as `pyctl run` wires it: its Lease `lease` (in `namespace`), loose
    rate limits, the Kubernetes actuator."""
    elector = LeaderElector(kube, LeaseConfig(namespace, lease, "r0", 4, 2.5, 0.5))
    loose = BucketLimit(capacity=10, per_second=10.0)
    gate = Gate(
        "enforce",
        elector.still_leader,
        MemoryRateLimiter(),
        SafetyLimits(loose, loose, loose, loose, 0.0, disruptions_per_hour=None),
        KubeActuator(kube, instance="r0"),
        ctl.metrics,
        cluster,
    )
    return elector, gate


def enforcing(
    ctl: Controller,
    kube: Any,
    cluster: str,
    lease: str,
    namespace: str = "default",
    max_moves: int = 3,
) -> tuple[LeaderElector, Compactor]:
    """The controller's compaction in enforce mode, wired as `pyctl run` wires it (the gate of
    `enforcing_gate`, the Eviction API, the workflow engine)."""
    elector, gate = enforcing_gate(ctl, kube, cluster, lease, namespace)
    pods = ctl.cache.pods
    engine = Engine(
        MemoryWorkflowStore(),
        Context(gate, lambda ns, n: pods.get(f"{ns}/{n}")),
        builtin_registry(),
    )
    compactor = Compactor(
        ctl.cache, ctl.reconciler, engine, ctl.metrics, cluster, "enforce", 0.5, max_moves=max_moves
    )
    return elector, compactor


@pytest.mark.anyio
async def test_compaction_frees_a_zone_for_the_pending_replica_respecting_the_pdb(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    policy = client.PolicyV1Api(api)
    specs = [GpuNodeSpec(n, labels=SEL) for n in ("c-frag", "c-full")]
    await apply_nrt_crd(api)
    await create_nodes(api, specs)
    updater = TopologyUpdater(api, specs, LABEL)

    ctl = Controller(
        CLUSTER,
        KubeClusterSource(kube),
        MemoryStore(CLUSTER),
        workload=WORKLOAD,
        summary_interval=0.5,
    )
    local = LocalExtender(control_plane, ctl.reconciler, "pyctl-compaction")
    await local.start()
    elector, compactor = enforcing(ctl, kube, CLUSTER, "pyctl-compaction-e2e")
    #: (min available small replicas while the PDB allowed none, ... while it allowed one)
    lowest = {"no-budget": 99, "budget": 99}
    phase = ["setup"]
    # the session's control plane keeps the Events of earlier tests: only this test's count
    seen_before: set[str] = set()
    for reason in ("PyctlCompaction", "PyctlRescue"):
        earlier = await core.list_namespaced_event("default", field_selector=f"reason={reason}")
        seen_before |= {e.metadata.uid for e in earlier.items}
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

            # -- the history that fragmented c-frag: two 1-GPU replicas, one per NUMA zone -----
            await core.patch_node("c-full", body({"spec": {"unschedulable": True}}))
            updater.hints["small-"] = [0, 1]
            await apps.create_namespaced_deployment("default", body(deployment("small", 2, 1, "s")))

            async def smalls_bound() -> bool:
                got = await tier_pods(core, "s")
                return len(got) == 2 and all(p.spec.node_name == "c-frag" for p in got)

            await wait_until(smalls_bound, "the small replicas on c-frag", within=30)
            await core.patch_node("c-full", body({"spec": {"unschedulable": None}}))
            for name, zone in (("fill-0", 0), ("fill-1", 1)):  # bare pods: never evicted
                updater.pinned[f"default/{name}"] = zone
                pod = gpu_pod(name, 3, label=LABEL, node="c-full")
                await core.create_namespaced_pod("default", body(pod))
            want = {"c-frag": [1, 1], "c-full": [3, 3]}
            await wait_until(
                lambda: all(model_gpus_used(ctl, n) == u for n, u in want.items()),
                "the fragmented cluster in the controller's models",
                within=30,
            )
            original = {p.metadata.uid: p.metadata.name for p in await tier_pods(core, "s")}

            # -- a PodDisruptionBudget with no budget left ------------------------------------
            pdb = {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "small", "namespace": "default"},
                "spec": {
                    "maxUnavailable": 0,
                    "selector": {
                        "matchExpressions": [
                            {"key": "tier", "operator": "In", "values": ["s"]},
                            {"key": "app", "operator": "In", "values": [LABEL]},
                        ]
                    },
                },
            }
            await policy.create_namespaced_pod_disruption_budget("default", body(pdb))

            async def pdb_computed() -> bool:
                got = await policy.read_namespaced_pod_disruption_budget("small", "default")
                st = got.status
                return bool(
                    st and st.observed_generation == got.metadata.generation and st.expected_pods
                )

            await wait_until(pdb_computed, "the PDB's status", within=30)

            # -- the pending 4-GPU replica -----------------------------------------------------
            await apps.create_namespaced_deployment("default", body(deployment("big", 1, 4, "b")))

            async def big_unschedulable() -> bool:
                return any(not_scheduled(p) for p in await tier_pods(core, "b"))

            await wait_until(big_unschedulable, "the 4-GPU replica unschedulable", within=30)

            async def watch_budget() -> None:
                while True:
                    got = await tier_pods(core, "s")
                    up = sum(
                        1 for p in got if p.spec.node_name and not p.metadata.deletion_timestamp
                    )
                    if phase[0] in lowest:
                        lowest[phase[0]] = min(lowest[phase[0]], up)
                    await anyio.sleep(0.05)

            tg.start_soon(watch_budget)

            # -- compaction starts: the PDB holds it back, nothing is evicted -------------------
            phase[0] = "no-budget"
            await wait_until(lambda: elector.is_leader, "the Lease", within=15)
            tg.start_soon(compactor.run, elector.still_leader)

            def held_back() -> bool:
                plan = compactor.last_plan
                return plan is not None and any(
                    why == "PodDisruptionBudget has no budget left" for why in plan.refused.values()
                )

            await wait_until(held_back, "the plan to name the PDB", within=30)
            await anyio.sleep(3.0)  # held back: planned again every tick, never worked around
            now = {p.metadata.uid: p.spec.node_name for p in await tier_pods(core, "s")}
            assert set(now) == set(original), "a replica was evicted despite the PDB"
            assert evictions(ctl, "evicted") == 0
            assert not any(p.spec.node_name for p in await tier_pods(core, "b"))

            # -- the budget returns: compaction proceeds ---------------------------------------
            phase[0] = "budget"
            await policy.patch_namespaced_pod_disruption_budget(
                "small", "default", body({"spec": {"maxUnavailable": 1}})
            )

            async def big_bound() -> bool:
                got = await tier_pods(core, "b")
                return len(got) == 1 and bool(got[0].spec.node_name)

            await wait_until(big_bound, "the 4-GPU replica scheduled", within=120)
            (big,) = await tier_pods(core, "b")
            assert big.spec.node_name == "c-frag"
            assert evictions(ctl, "evicted") >= 1

            async def smalls_settled() -> bool:
                got = await tier_pods(core, "s")
                return len(got) == 2 and all(
                    p.spec.node_name and not p.metadata.deletion_timestamp for p in got
                )

            await wait_until(smalls_settled, "the small replicas running again", within=30)
            smalls = await tier_pods(core, "s")
            moved = [p for p in smalls if p.metadata.uid not in original]
            assert moved, "no replica was recreated"
            for p in moved:  # recreated on the node that was already fuller, not sent back
                assert p.spec.node_name == "c-full", (p.metadata.name, p.spec.node_name)
            await wait_until(
                lambda: updater.where.get(f"default/{big.metadata.name}") is not None,
                "the topology-updater to see the 4-GPU replica",
            )
            assert updater.where[f"default/{big.metadata.name}"][0] == "c-frag"
            assert updater.misaligned == []  # every pod NUMA-aligned: no TopologyAffinityError
            assert lowest["no-budget"] == 2, lowest  # nothing evicted while the PDB said no
            assert lowest["budget"] >= 1, lowest  # at most one replica down at a time
            # the evictions are the rescue's (the node it holds is its alone) or compaction's
            events_now = []
            for reason in ("PyctlCompaction", "PyctlRescue"):
                got = await core.list_namespaced_event("default", field_selector=f"reason={reason}")
                events_now += [
                    e
                    for e in got.items
                    if e.metadata.uid not in seen_before and e.message.startswith("evicted")
                ]
            # one Event per eviction, on the evicted pod, named by its uid (the pod is gone by
            # the time the Event is written: the uid comes from the workflow, not a read)
            assert {e.involved_object.name for e in events_now} & set(original.values())
            uids = {e.involved_object.uid for e in events_now}
            assert uids, "no eviction Event"
            assert uids <= set(original), (uids, original)
            tg.cancel_scope.cancel()
    finally:
        await local.stop()
        for name in ("small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await if_present(policy.delete_namespaced_pod_disruption_budget("small", "default"))
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)
