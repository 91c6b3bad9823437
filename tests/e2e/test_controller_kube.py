"""The controller on the real control plane with a real Redis: nodes and pods created there
appear in the Redis state and the metrics; two replicas elect one leader; Redis going away makes
the controller not ready without losing anything, and it catches up when Redis returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.controller.controller import Controller
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
)
from pyctl.state.redis_client import RedisConfig
from pyctl.state.redis_store import RedisStore
from tests.e2e.conftest import wait_until
from tests.redis_servers import RedisServer, find_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.redis]


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(find_binaries(), tmp_path_factory.mktemp("redis-ctl"), name="ctl")
    server.start()
    yield server
    server.stop()


def _gauge(ctl: Controller, name: str, **labels: str) -> float | None:
    v = ctl.metrics.registry.get_sample_value(name, {"cluster": ctl.cluster, **labels})
    return None if v is None else float(v)


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[Any]:
    k = await connect(kubeconfig=control_plane.kubeconfig)
    yield k
    await k.close()


def _pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "ctl-e2e"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/llm:1",
                    "resources": {
                        "requests": {"cpu": "2", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


@pytest.mark.anyio
async def test_controller_follows_the_cluster_into_redis_with_one_leader(
    control_plane: ControlPlane, api: client.ApiClient, kube: Any, redis: RedisServer
) -> None:
    await apply_nrt_crd(api)
    specs = [GpuNodeSpec(f"ctl-gpu-{i}") for i in range(3)]
    await create_gpu_nodes(api, specs)
    core = client.CoreV1Api(api)
    for i in range(3):
        await core.create_namespaced_pod("default", body(_pod(f"ctl-llm-{i}", "ctl-gpu-0", 1)))

    stores = [RedisStore(RedisConfig(url=redis.url), "e2e") for _ in range(2)]
    electors = [
        LeaderElector(kube, LeaseConfig("default", "pyctl-e2e", f"replica-{i}", 4.0, 2.5, 0.5))
        for i in range(2)
    ]
    ctls = [
        Controller(
            "e2e",
            KubeClusterSource(kube),
            stores[i],
            summary_interval=0.2,
            is_leader=electors[i].still_leader,
        )
        for i in range(2)
    ]
    try:
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(electors[i].run)
                tg.start_soon(ctls[i].run)

            def nodes_in_redis_state() -> bool:
                return all(ctl.ready()[0] for ctl in ctls)

            await wait_until(nodes_in_redis_state, "both replicas ready", within=30)
            reader = RedisStore(RedisConfig(url=redis.url), "e2e")
            await reader.open()

            async def state_has_everything() -> bool:
                nodes, _ = await reader.load("Node")
                pods, _ = await reader.load("Pod")
                return {s.name for s in specs} <= set(nodes) and {
                    f"default/ctl-llm-{i}" for i in range(3)
                } <= set(pods)

            await wait_until(state_has_everything, "nodes and pods in the Redis state", within=30)
            nrts, _ = await reader.load("NodeResourceTopology")
            assert {s.name for s in specs} <= set(nrts)

            def scored() -> bool:
                v = _gauge(ctls[0], "pyctl_node_gpu_idle_gpus", node="ctl-gpu-0")
                return v is not None and v == 5.0  # 8 GPUs, 3 used

            await wait_until(scored, "node ctl-gpu-0 scored with 5 idle GPUs", within=30)
            assert _gauge(ctls[0], "pyctl_zone_gpu_idle_gpus", node="ctl-gpu-1", numa="1") == 4.0

            await wait_until(lambda: any(e.is_leader for e in electors), "a leader", within=15)
            await anyio.sleep(1.0)
            assert sum(e.is_leader for e in electors) == 1

            # Redis goes away: not ready (seen with no event to write: issue 36, /readyz said 200
            # through a 20 s outage), nothing lost; back (empty): re-synced, ready again
            redis.kill()
            await wait_until(lambda: not ctls[0].ready()[0], "not ready without Redis", within=10)
            assert ctls[0].ready()[1].startswith("state store unavailable"), ctls[0].ready()
            await core.create_namespaced_pod("default", body(_pod("ctl-llm-late", "ctl-gpu-1", 2)))
            await wait_until(
                lambda: "default/ctl-llm-late" in ctls[0].cache.pods, "watched without Redis"
            )
            redis.start()
            await wait_until(
                lambda: ctls[0].ready()[0], "ready again after Redis returns", within=30
            )
            reader2 = RedisStore(RedisConfig(url=redis.url), "e2e")
            await reader2.open()
            pods, _ = await reader2.load("Pod")
            assert "default/ctl-llm-late" in pods
            await reader.close()
            await reader2.close()
            tg.cancel_scope.cancel()
    finally:
        for s in stores:
            await s.close()
        await core.delete_collection_namespaced_pod("default", label_selector="app=ctl-e2e")
        custom = client.CustomObjectsApi(api)
        for spec in specs:
            await core.delete_node(spec.name)
            await custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, spec.name)
