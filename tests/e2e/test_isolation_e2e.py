"""Input isolation on the real control plane (issue 16): a bad item is isolated, counted and
reported; it never stops the loop, and never changes what happens to the good items.

- Hostile pending pods (``nvidia.com/gpu: "4294967296"``; ``nvidia.com/gpu: 2`` plus
  ``nvidia.com/mig-1g.5gb: 1``; a MIG profile no GPU has) and a node whose labels claim an
  absurd GPU count: the controller (wired as `pyctl run` wires it: `attach_workflows`) scores
  every other node exactly as without them, keeps them out of the workload M, counts each once
  (`pyctl_ignored_objects_total`), puts a `PyctlIgnored` Event on each hostile pod, and compaction
  still completes (the pending 4-GPU replica gets the NUMA zone compaction frees).
- A ValidatingAdmissionPolicy on the real API server denies the eviction of one pod (CREATE on
  `pods/eviction`; the API server answers 422 Invalid): compaction abandons that move (a
  permanent refusal, an Event and `pyctl_workflows_abandoned_total`), does not plan it again, and
  completes another.
- An eviction carrying the uid of a pod that was deleted and recreated under the same name does
  not evict the new pod (`preconditions.uid`).

The cluster is test_compaction_e2e.py's: 2-NUMA 8-GPU kwok nodes under ``single-numa-node``, the
test playing NFD's topology-updater, a second kube-scheduler calling pyctl's extender.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.app.config import Config, RedisSection, WorkflowSection, WorkloadSection
from pyctl.app.wiring import Workflows, attach_workflows, make_store, workload_scope
from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import KubeClient
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.extender import LocalExtender
from pyctl.dev.gpu_nodes import GPU, GpuNodeSpec, apply_nrt_crd, body
from pyctl.dev.mig_manager import MigManagerSim, a100_all_1g, create_mig_node, mig_pod
from pyctl.dev.topology import TopologyUpdater
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import BucketLimit, SafetyLimits
from pyctl.state.redis_store import RedisStore
from pyctl.workflows.base import Workflow, WorkflowData
from pyctl.workflows.compaction import CompactionData
from pyctl.workflows.mig_reconfig import MigOptions
from pyctl.workflows.rescue import RescueData
from tests.e2e.conftest import WaitTimeout, if_present, wait_until
from tests.e2e.test_placement_e2e import (
    create_nodes,
    delete_nodes,
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
    control_plane: ControlPlane,
    api: client.ApiClient,
    kube: KubeClient,
    extra_nodes: int = 0,
    **settings: Any,
) -> AsyncIterator[tuple[Cluster, anyio.abc.TaskGroup]]:
    """`settings`: Config fields to set (e.g. `redis=RedisSection(url=...)`, `mig=...`)."""
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
        # M from this test's pods only (the session's other tests leave theirs in 'default')
        workload=WorkloadSection(interval=0.5, label_selector=f"app={label}"),
        workflow=WorkflowSection(interval=0.5, max_moves=3),
        **settings,
    )
    leader = [False]
    metrics = Metrics()
    ctl = Controller(
        cfg.cluster,
        KubeClusterSource(kube),
        make_store(cfg, metrics),
        metrics,
        summary_interval=cfg.summary_interval,
        is_leader=lambda: leader[0],
        workload_interval=cfg.workload.interval,
        scope=workload_scope(cfg),  # M derived from the pods: kube-system left out, cap 0.5
    )
    flows = attach_workflows(ctl, cfg, actuator=KubeActuator(kube, instance="r0"), limits=LIMITS)
    local = LocalExtender(control_plane, ctl.reconciler, f"pyctl-iso-{tag}")
    await local.start()
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
            local.scheduler.start()
            yield c, tg
            tg.cancel_scope.cancel()
    finally:
        await local.stop()
        for name in ("small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
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


GPU_NS = "gpu-operator"
#: a workflow record whose time is beyond a float (once an `inf` was stored as null)
INF_WORKFLOW = (
    b'{"id": "inf", "kind": "compaction", "node": "c-frag", "step": "evicting", "created": 0.0,'
    b' "not_before": 1e400, "data": {"namespace": "default", "pod": "x", "uid": "u"}}'
)


@pytest.mark.anyio
@pytest.mark.redis
async def test_garbage_and_inf_records_in_redis_stop_neither_compaction_nor_mig(
    control_plane: ControlPlane, api: client.ApiClient, kube: KubeClient, redis_server: Any
) -> None:
    tag = uuid.uuid4().hex[:6]
    mig_node, cm, ns = f"iso-a100-{tag}", f"pyctl-mig-{tag}", f"iso-mig-{tag}"
    mig_spec = a100_all_1g(mig_node)
    await create_mig_node(api, mig_spec, cm, GPU_NS)
    core = client.CoreV1Api(api)
    await core.create_namespace(body({"metadata": {"name": ns}}))
    mgr = MigManagerSim(api, [mig_spec], namespace=GPU_NS, configmap=cm)
    mig_options = MigOptions(
        configmap_namespace=GPU_NS,
        configmap_name=cm,
        apply_timeout=60.0,
        drain_timeout=60.0,
        poll=0.2,
        nodes=(mig_node,),
    )
    try:
        async with fragmented_cluster(
            control_plane, api, kube, redis=RedisSection(url=redis_server.url), mig=mig_options
        ) as (c, tg):
            tg.start_soon(mgr.run)
            ctl = c.ctl
            wf_store = c.flows.compactor.engine.store
            # -- garbage and an inf in the workflow hash, before anything runs ---------------
            await wf_store.put("garbage", b"\xff{not a workflow", 0)
            await wf_store.put("inf", INF_WORKFLOW, 0)
            await wf_store.put("null", INF_WORKFLOW.replace(b"1e400", b"null"), 0)
            for i in range(2):  # MIG pods in use: some 1g.5gb instances are taken
                small = mig_pod(f"mig-small-{i}", mig_node, "1g.5gb", app=c.label)
                await core.create_namespaced_pod(ns, body(small))
            original = await c.fragment()
            # -- garbage and an inf in the object hashes, once the controller wrote them ------
            store = ctl.store
            assert isinstance(store, RedisStore)
            await wait_until(lambda: ctl.store_ok and not ctl._resync, "the store synced", 60)
            redis = store.client
            await redis.hset(store.keys.objects("Pod"), "default/garbage", b"\x00garbage")
            await redis.hset(store.keys.objects("Node"), "inf-node", b'["inf-node","","",1e400]')

            # -- the work: a pending 4-GPU replica and two pending 3g.20gb pods --------------
            c.leader[0] = True
            dep = gpu_deployment("big", 1, 4, "b", label=c.label, selector=c.sel)
            await client.AppsV1Api(api).create_namespaced_deployment("default", body(dep))
            for i in range(2):
                big = mig_pod(f"mig-big-{i}", mig_node, "3g.20gb", app=c.label)
                await core.create_namespaced_pod(ns, body(big))

            async def mig_served() -> bool:
                for i in range(2):
                    p = await core.read_namespaced_pod(f"mig-big-{i}", ns)
                    if p.spec.node_name != mig_node:
                        return False
                return True

            await wait_until(lambda: c.big_bound_on("c-frag"), "compaction done", 180)
            await wait_until(mig_served, "the 3g.20gb pods served after a re-partition", 180)
            assert set(original) - {p.metadata.uid for p in await c.tier("s")}
            assert c.counter("pyctl_mig_reconfigurations_total", node=mig_node, result="succeeded")
            # the bad workflow records were moved aside, counted once each
            q = await wf_store.quarantined()
            assert set(q) == {"garbage", "inf", "null"}
            assert q["garbage"].data == b"\xff{not a workflow"
            assert "$.not_before" in q["inf"].reason
            assert not {"garbage", "inf", "null"} & set(await wf_store.list())
            assert c.counter("pyctl_quarantined_records_total", store="workflows") == 3
            # the object records: whoever reads them back (a tool, a future warm start) gets
            # the good ones; the bad ones are moved aside and counted
            pods, _ = await store.load("Pod")
            nodes, _ = await store.load("Node")
            assert "default/garbage" not in pods
            assert "inf-node" not in nodes
            assert {"c-frag", "c-full", mig_node} <= set(nodes)
            assert set(await store.quarantined("Pod")) == {"default/garbage"}
            assert set(await store.quarantined("Node")) == {"inf-node"}
            assert c.counter("pyctl_quarantined_records_total", store="objects") == 2
    finally:
        await core.delete_namespace(ns)
        await core.delete_namespaced_config_map(cm, GPU_NS)
        await delete_nodes(api, [mig_spec])


def deny_eviction_policy(name: str, pod: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ValidatingAdmissionPolicy (and its binding) denying every eviction of `pod`."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods/eviction"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.metadata.name != '{pod}'",
                    "message": f"{pod} may not be evicted (e2e policy)",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return policy, binding


async def dry_run_evict(kube: KubeClient, pod: str) -> int:
    """The API server's answer to an eviction of `pod` in dry-run (admission runs, nothing is
    evicted)."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": "default"},
        "deleteOptions": {"dryRun": ["All"]},
    }
    path = f"/api/v1/namespaces/default/pods/{pod}/eviction"
    return (await kube.request("POST", path, body=eviction)).status


@pytest.mark.anyio
async def test_an_admission_policy_denying_one_eviction_abandons_that_move_only(
    control_plane: ControlPlane, api: client.ApiClient, kube: KubeClient
) -> None:
    adm = client.AdmissionregistrationV1Api(api)
    name = f"deny-evict-{uuid.uuid4().hex[:6]}"
    try:
        async with fragmented_cluster(control_plane, api, kube) as (c, _tg):
            original = await c.fragment()
            dep = gpu_deployment("big", 1, 4, "b", label=c.label, selector=c.sel)
            await client.AppsV1Api(api).create_namespaced_deployment("default", body(dep))
            comp = c.flows.compactor

            def planned() -> bool:
                return comp.last_plan is not None and bool(comp.last_plan.moves)

            await wait_until(planned, "a plan (not acted on: not the leader yet)", 60)
            assert comp.last_plan is not None
            first = comp.last_plan.moves[0].pod.split("/")[1]
            # the real API server denies every eviction of the pod the planner chose first
            policy, binding = deny_eviction_policy(name, first)
            await adm.create_validating_admission_policy(body(policy))
            await adm.create_validating_admission_policy_binding(body(binding))
            await wait_until(
                lambda: denied(kube, first), "the policy in force (a dry-run eviction denied)", 60
            )
            other = [n for n in original.values() if n != first]
            assert await dry_run_evict(kube, other[0]) in (200, 201)

            c.leader[0] = True
            try:
                await wait_until(lambda: c.big_bound_on("c-frag"), "compaction done anyway", 180)
            except WaitTimeout as e:  # say what the workflows and the last plan were
                got = await comp.engine.workflows()
                state = [(w.kind, w.step, w.data.named(), w.result) for w in got]
                raise WaitTimeout(f"{e}; workflows {state}; last plan {comp.last_plan}") from None

            async def finished() -> bool:  # a rescue is done once it has seen the pod bound
                return any(w.step == "done" for w in await comp.engine.workflows())

            await wait_until(finished, "the workflow that made room done", 60)
            # this test's workflows (the controller also sees the session's other pods)
            ours = {s.name for s in c.specs}
            wfs = [w for w in await comp.engine.workflows() if w.node in ours]
            # the denied move is given up: as a compaction workflow, as part of a rescue of the
            # pending replica, or both (a rescue may be planned with it before the compaction's
            # denial is recorded); nothing else is abandoned
            abandoned = [w for w in wfs if w.step == "abandoned"]
            assert abandoned, "the denied move was not abandoned"
            kinds = Counter(w.kind for w in abandoned)
            for kind, n in kinds.items():
                assert c.counter("pyctl_workflows_abandoned_total", kind=kind) == n
            events = await c.core.list_namespaced_event(
                "default", field_selector="reason=PyctlWorkflowAbandoned"
            )
            for gave_up in abandoned:
                if isinstance(gave_up.data, RescueData):
                    assert gave_up.data.refused == f"default/{first}", gave_up
                else:
                    assert isinstance(gave_up.data, CompactionData), gave_up
                    assert gave_up.data.pod == first, gave_up
                assert "admission refused the eviction" in gave_up.result
                # a ValidatingAdmissionPolicy denies with 422 Invalid (a webhook with 403): both
                # are final, never retried
                assert "(422)" in gave_up.result
                assert f"{first} may not be evicted" in gave_up.result
                assert any(gave_up.id in e.message for e in events.items)
            done = [w for w in wfs if w.step == "done"]
            assert sorted(n for w in done for n in evicted_by(w)) == sorted(other)  # the other move
            smalls = {p.metadata.name: p.metadata.uid for p in await c.tier("s")}
            assert first in smalls  # never evicted: the same pod, still running
            assert smalls[first] in original
    finally:
        for call in (
            adm.delete_validating_admission_policy_binding(name),
            adm.delete_validating_admission_policy(name),
        ):
            await if_present(call)


def evicted_by(wf: Workflow[WorkflowData]) -> list[str]:
    """The names of the pods a finished compaction or rescue workflow evicted."""
    if isinstance(wf.data, RescueData):
        return [key.split("/", 1)[1] for key in wf.data.evicted]
    assert isinstance(wf.data, CompactionData), wf
    return [wf.data.pod]


async def denied(kube: KubeClient, pod: str) -> bool:
    return await dry_run_evict(kube, pod) == 422


@pytest.mark.anyio
async def test_an_eviction_with_a_stale_uid_spares_a_recreated_pod(
    api: client.ApiClient, kube: KubeClient
) -> None:
    spec = GpuNodeSpec(f"iso-uid-{uuid.uuid4().hex[:6]}")
    await apply_nrt_crd(api)
    await create_nodes(api, [spec])
    core = client.CoreV1Api(api)
    name = f"reborn-{uuid.uuid4().hex[:6]}"
    try:
        pod = gpu_pod(name, 1, label="iso-uid", node=spec.name)
        old = (await core.create_namespaced_pod("default", body(pod))).metadata.uid
        await core.delete_namespaced_pod(name, "default", grace_period_seconds=0)

        async def gone() -> bool:
            try:
                await core.read_namespaced_pod(name, "default")
            except client.ApiException as exc:
                return exc.status == 404
            return False

        await wait_until(gone, "the first incarnation gone", 30)
        new = (await core.create_namespaced_pod("default", body(pod))).metadata.uid
        assert new != old
        out = await KubeActuator(kube).try_evict("default", name, uid=old)
        # the pod meant is gone (the API server refused the precondition: 409)
        assert (out.allowed, out.status) == (True, 409)
        await anyio.sleep(1.0)
        p = await core.read_namespaced_pod(name, "default")
        assert p.metadata.uid == new
        assert p.metadata.deletion_timestamp is None  # the new incarnation was not evicted
        assert not any(cond.type == "DisruptionTarget" for cond in (p.status.conditions or []))
        out = await KubeActuator(kube).try_evict("default", name, uid=new)
        assert (out.allowed, out.status) == (True, 201)  # the right uid: evicted
    finally:
        await core.delete_collection_namespaced_pod(
            "default", label_selector="app=iso-uid", grace_period_seconds=0
        )
        await delete_nodes(api, [spec])
