"""MIG reconfiguration end to end on the real control plane: kwok A100 nodes full of free
`1g.5gb` instances, pending `nvidia.com/mig-3g.20gb` pods the real scheduler cannot place; the
controller (KubeClusterSource -> cache -> MigLoop -> workflow -> KubeActuator) taints the node,
publishes a mig-parted config, sets `nvidia.com/mig.config`; the simulated mig-manager
(`mig_manager_sim.py`) answers through the label protocol and changes the node's capacity; the
pods get served. A `failed` state rolls the label back and leaves the node schedulable."""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.actuator import KubeActuator
from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.core import mig
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import MemoryRateLimiter
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.engine import Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_loop import MigLoop
from pyctl.workflows.mig_reconfig import TAINT_KEY, MigContext, MigOptions
from tests.limits import global_only
from tests.models import CacheModels

from .conftest import CacheSink, wait_until
from .control_plane import ControlPlane
from .gpu_nodes import body
from .mig_manager_sim import STATE_LABEL, MigManagerSim, a100_all_1g, create_mig_node, mig_pod
from .test_placement_e2e import delete_nodes

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(180, func_only=True)]

GPU_NS = "gpu-operator"
LIMITS = global_only(100, 100.0)


def pod(name: str, node: str, profile: str) -> dict[str, Any]:
    return mig_pod(name, node, profile, app=name.rsplit("-", 1)[0])


@dataclass
class Setup:
    api: client.ApiClient
    core: client.CoreV1Api
    ns: str
    node: str
    configmap: str
    mgr: MigManagerSim
    metrics: Metrics
    loop: MigLoop

    async def node_obj(self) -> Any:
        return await self.core.read_node(self.node)

    async def bound(self, name: str) -> bool:
        p = await self.core.read_namespaced_pod(name, self.ns)
        return bool(p.spec.node_name == self.node)

    def count(self, result: str) -> float:
        v = self.metrics.registry.get_sample_value(
            "pyctl_mig_reconfigurations_total",
            {"cluster": "e2e", "node": self.node, "result": result},
        )
        return v or 0.0


@pytest.fixture
async def setup(control_plane: ControlPlane, api: client.ApiClient) -> AsyncIterator[Setup]:
    core = client.CoreV1Api(api)
    tag = uuid.uuid4().hex[:6]
    ns, node, cm = f"mig-{tag}", f"mig-a100-{tag}", f"pyctl-mig-{tag}"
    spec = a100_all_1g(node)
    await create_mig_node(api, spec, cm, GPU_NS)
    await core.create_namespace(body({"metadata": {"name": ns}}))
    # two running 1g.5gb pods: some instances are in use
    for i in range(2):
        await core.create_namespaced_pod(ns, body(pod(f"small-{i}", node, "1g.5gb")))
    mgr = MigManagerSim(api, [spec], namespace=GPU_NS, configmap=cm)
    metrics = Metrics()
    async with await connect(kubeconfig=control_plane.kubeconfig) as kube:
        sink = CacheSink()
        gate = Gate(
            "enforce",
            lambda: True,
            MemoryRateLimiter(),
            LIMITS,
            KubeActuator(kube),
            metrics,
            "e2e",
        )
        ctx = MigContext(
            gate,
            lambda ns_, name: sink.cache.pods.get(f"{ns_}/{name}"),
            node=sink.cache.nodes.get,
            options=MigOptions(
                configmap_namespace=GPU_NS,
                configmap_name=cm,
                apply_timeout=30.0,
                drain_timeout=30.0,
                poll=0.2,
                nodes=(node,),
            ),
        )
        loop = MigLoop(
            sink.cache,
            CacheModels(sink.cache),
            Engine(MemoryWorkflowStore(), ctx, builtin_registry()),
            gate,
            metrics,
            "e2e",
            interval=0.2,
            options=ctx.options,
        )
        s = Setup(api, core, ns, node, cm, mgr, metrics, loop)
        async with anyio.create_task_group() as tg:
            tg.start_soon(KubeClusterSource(kube).run, sink)
            tg.start_soon(mgr.run)
            await wait_until(lambda: node in sink.cache.nodes, "the node in the cache")
            for i in range(2):
                await wait_until(functools.partial(s.bound, f"small-{i}"), f"small-{i} bound", 60)
            try:
                yield s
            finally:
                tg.cancel_scope.cancel()
    await core.delete_namespace(ns)
    await core.delete_namespaced_config_map(cm, GPU_NS)
    await delete_nodes(api, [spec])  # the node and its NodeResourceTopology


async def pending_big(s: Setup) -> list[str]:
    names = [f"big-{i}" for i in range(2)]
    for n in names:
        await s.core.create_namespaced_pod(s.ns, body(pod(n, s.node, "3g.20gb")))

    async def unschedulable() -> bool:
        for n in names:
            p = await s.core.read_namespaced_pod(n, s.ns)
            conds = p.status.conditions or []
            if not any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds):
                return False
        return True

    await wait_until(unschedulable, "the 3g.20gb pods marked Unschedulable", 60)
    return names


async def test_pending_3g_pods_are_served_after_a_reconfiguration(setup: Setup) -> None:
    s = setup
    names = await pending_big(s)
    async with anyio.create_task_group() as tg:
        tg.start_soon(s.loop.run, lambda: True)
        for n in names:
            await wait_until(functools.partial(s.bound, n), f"{n} bound after the re-partition", 90)
        tg.cancel_scope.cancel()
    node = await s.node_obj()
    labels = node.metadata.labels
    cap = node.status.capacity
    assert labels[mig.MIG_CONFIG_LABEL].startswith("pyctl-")
    assert labels[STATE_LABEL] == "success"
    assert cap.get("nvidia.com/mig-3g.20gb") == "2"
    assert cap.get("nvidia.com/mig-1g.5gb") == "7"
    assert not any(t.key == TAINT_KEY for t in node.spec.taints or [])
    assert not node.spec.unschedulable
    assert [st for n, _, st in s.mgr.history if n == s.node] == ["pending", "success"]
    assert s.count("succeeded") == 1
    # the small pods were on GPU 0, which did not change: never evicted
    for i in range(2):
        assert await s.bound(f"small-{i}")
    # the published config keeps the rollback target
    cm = await s.core.read_namespaced_config_map(s.configmap, GPU_NS)
    configs = mig.parse_mig_parted(cm.data["config.yaml"])
    assert set(configs) == {"all-1g.5gb", labels[mig.MIG_CONFIG_LABEL]}


async def test_failed_state_rolls_back_and_leaves_node_schedulable(setup: Setup) -> None:
    s = setup
    s.mgr.fail_next = 1
    await pending_big(s)

    def rolled_back() -> bool:
        history = [st for n, _, st in s.mgr.history if n == s.node]
        return s.count("rolled_back") == 1 and len(history) >= 4

    async with anyio.create_task_group() as tg:
        tg.start_soon(s.loop.run, lambda: True)
        await wait_until(rolled_back, "the reconfiguration rolled back", 90)
        tg.cancel_scope.cancel()
    states = [(c, st) for n, c, st in s.mgr.history if n == s.node]
    assert [st for _, st in states] == ["pending", "failed", "pending", "success"]
    assert states[-1][0] == "all-1g.5gb"  # the label went back, mig-manager re-applied it
    node = await s.node_obj()
    assert node.metadata.labels[mig.MIG_CONFIG_LABEL] == "all-1g.5gb"
    assert not any(t.key == TAINT_KEY for t in node.spec.taints or [])
    assert not node.spec.unschedulable
    assert node.status.capacity.get("nvidia.com/mig-1g.5gb") == "14"
    # schedulable: a new 1g.5gb pod lands there
    await s.core.create_namespaced_pod(s.ns, body(pod("small-after", s.node, "1g.5gb")))
    await wait_until(lambda: s.bound("small-after"), "a new pod bound to the node", 60)
    assert s.count("succeeded") == 0
