"""KubeClusterSource against the real API server: what is created appears in a ClusterCache,
what is deleted disappears; an optional kind (a CRD) is discovered, followed and forgotten."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import KubeClient, connect
from pyctl.cluster.kube.reflector import Reflector, ReflectorOptions, Resource
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.dev.control_plane import ControlPlane
from pyctl.dev.gpu_nodes import (
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
    node_manifest,
    nrt_crd_manifest,
    nrt_manifest,
    wait_nodes_ready,
)

from .conftest import CacheSink, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(90, func_only=True)]

TEST_LABEL = "pyctl.e2e/kube-test"
FAST = ReflectorOptions(
    watch_timeout=20, batch_delay=0.002, backoff_initial=0.05, backoff_max=0.5, recheck_absent=0.3
)


@pytest.fixture
async def kube(control_plane: ControlPlane) -> Any:
    """The reflectors' client; building kubernetes-asyncio model objects with it is an error
    (the watch path reads raw bytes)."""

    def no_models(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a kubernetes-asyncio model object was built")

    async with await connect(kubeconfig=control_plane.kubeconfig) as k:
        k.api.deserialize = no_models
        yield k


def pod_manifest(name: str, node: str, gpus: int = 1, labels: dict[str, str] | None = None) -> Any:
    return body(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": "infer"}},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.invalid/infer:1",
                        "resources": {
                            "requests": {"cpu": "500m", "memory": "1Gi"},
                            "limits": {"nvidia.com/gpu": str(gpus)},
                        },
                    }
                ],
            },
        }
    )


async def test_source_follows_nodes_pods_pdbs_and_nrts(
    api: client.ApiClient, kube: KubeClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    ns = f"kube-src-{tag}"
    core = client.CoreV1Api(api)
    policy = client.PolicyV1Api(api)
    custom = client.CustomObjectsApi(api)
    await apply_nrt_crd(api)
    await core.create_namespace(body({"metadata": {"name": ns}}))
    specs = [GpuNodeSpec(f"kube-src-{tag}-{i}", labels={TEST_LABEL: tag}) for i in range(3)]
    names = {s.name for s in specs}

    source = KubeClusterSource(
        kube,
        options=FAST,
        per_kind={
            "Node": dataclasses.replace(FAST, label_selector=f"{TEST_LABEL}={tag}"),
            "Pod": dataclasses.replace(FAST, namespace=ns),
            "PodDisruptionBudget": dataclasses.replace(FAST, namespace=ns),
        },
    )
    sink = CacheSink()
    cache = sink.cache
    async with anyio.create_task_group() as tg:
        tg.start_soon(source.run, sink)
        await wait_until(lambda: source.synced, "the first list of every kind")
        assert sink.replaced["NodeResourceTopology"] == 1
        assert not any(n in cache.nodes for n in names)

        # Nodes (and their NodeResourceTopology objects) appear, as records.
        await create_gpu_nodes(api, specs)
        await wait_until(lambda: names <= cache.nodes.keys(), "the nodes in the cache")
        await wait_until(lambda: names <= cache.nrts.keys(), "the NRTs in the cache")
        node = cache.nodes[specs[0].name]
        assert (node.gpus, node.cpu_milli, node.gpu_model) == (8, 128_000, specs[0].product)
        assert [z.gpus for z in cache.nrts[specs[0].name].zones] == [4, 4]
        assert cache.nrts[specs[0].name].policy == "single-numa-node"

        # Pods bound to a kwok node appear on that node and become Running (once kwok has taken
        # the node on, which it reports as Ready: it skips pods that come before).
        target = specs[1].name
        await wait_nodes_ready(api, [target])
        for i in range(3):
            await core.create_namespaced_pod(ns, pod_manifest(f"p{i}", target, gpus=2))
        await wait_until(
            lambda: (
                len(cache.pods_on(target)) == 3
                and all(p.phase == "Running" for p in cache.pods_on(target))
            ),
            "3 running pods on the node",
        )
        assert {p.gpus for p in cache.pods_on(target)} == {2}
        assert cache.pods[f"{ns}/p0"].cpu_milli == 500

        await policy.create_namespaced_pod_disruption_budget(
            ns,
            body(
                {
                    "metadata": {"name": "infer"},
                    "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "infer"}}},
                }
            ),
        )
        # The disruption controller fills the status in: 3 healthy, 1 disruption allowed.
        await wait_until(
            lambda: (
                f"{ns}/infer" in cache.pdbs and cache.pdbs[f"{ns}/infer"].disruptions_allowed == 1
            ),
            "the PDB with its status",
        )

        # Deleting makes them disappear.
        for i in range(3):
            await core.delete_namespaced_pod(f"p{i}", ns, grace_period_seconds=0)
        await wait_until(lambda: not cache.pods_on(target), "the pods gone from the cache")
        await policy.delete_namespaced_pod_disruption_budget("infer", ns)
        await core.delete_collection_node(label_selector=f"{TEST_LABEL}={tag}")
        for s in specs:
            await custom.delete_cluster_custom_object(NRT_GROUP, NRT_VERSION, NRT_PLURAL, s.name)
        await wait_until(
            lambda: (
                not (names & cache.nodes.keys())
                and not (names & cache.nrts.keys())
                and not cache.pdbs
            ),
            "nodes, NRTs and the PDB gone from the cache",
        )
        tg.cancel_scope.cancel()

    stats = source.stats
    # every kind listed once; an optional kind this control plane does not serve (the fabric
    # sources' CRDs, unless another test left them) not at all
    assert {k: s.lists for k, s in stats.items()} == {
        k: 0 if s.present is False else 1 for k, s in stats.items()
    }
    assert all(stats[k].lists == 1 for k in ("Node", "Pod", "NodeResourceTopology"))
    assert all(s.relists == 0 for s in stats.values())
    assert stats["Node"].events_by_type["DELETED"] == 3
    assert stats["Pod"].events_by_type["ADDED"] == 3
    assert stats["Pod"].resource_version == sink.rv["Pod"]
    assert not sink.decode_errors
    await core.delete_namespace(ns)


async def test_optional_kind_is_discovered_followed_and_forgotten(
    api: client.ApiClient, kube: KubeClient
) -> None:
    """A CRD that is not served yet: the sink is told there is none, the reflector looks again,
    follows it once served, reports undecodable objects, and forgets it when it goes away."""
    tag = uuid.uuid4().hex[:8]
    group = f"t{tag}.pyctl.e2e"
    crd: Any = nrt_crd_manifest()
    crd["metadata"] = {"name": f"{NRT_PLURAL}.{group}"}  # no API-approval annotation: not k8s.io
    crd["spec"]["group"] = group
    resource = Resource(
        "NodeResourceTopology",
        f"{group}/{NRT_VERSION}",
        NRT_PLURAL,
        namespaced=False,
        optional=True,
    )
    reflector = Reflector(kube, "NodeResourceTopology", FAST, resource=resource)
    sink = CacheSink()
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run, sink)
        await wait_until(lambda: reflector.stats.present is False, "the CRD found absent")
        assert sink.replaced["NodeResourceTopology"] == 1
        assert reflector.stats.synced

        await ext.create_custom_resource_definition(body(crd))
        await wait_until(lambda: reflector.stats.present is True, "the CRD found served", 20)
        good: Any = nrt_manifest(GpuNodeSpec(f"opt-{tag}"))
        good["apiVersion"] = f"{group}/{NRT_VERSION}"
        bad = copy.deepcopy(good)
        bad["metadata"]["name"] = f"opt-{tag}-bad"
        bad["zones"][0]["name"] = "socket-a"  # no NUMA id: pyctl cannot use it

        async def create(obj: dict[str, Any]) -> bool:
            try:
                await custom.create_cluster_custom_object(group, NRT_VERSION, NRT_PLURAL, obj)
            except client.ApiException as exc:
                if exc.status == 404:  # the new resource is not routed yet
                    return False
                raise
            return True

        await wait_until(lambda: create(good), "the first object created")
        await create(bad)
        await wait_until(lambda: f"opt-{tag}" in sink.cache.nrts, "the object in the cache")
        await wait_until(lambda: bool(sink.decode_errors), "the decode error reported")
        assert "no NUMA id" in sink.decode_errors[0][1]
        assert reflector.stats.decode_errors == 1
        assert f"opt-{tag}-bad" not in sink.cache.nrts

        await ext.delete_custom_resource_definition(crd["metadata"]["name"])
        await wait_until(
            lambda: reflector.stats.present is False and not sink.cache.nrts,
            "the CRD found gone and its objects forgotten",
            30,
        )
        tg.cancel_scope.cancel()


async def test_watch_restarts_after_server_timeouts_without_relisting(
    api: client.ApiClient, kube: KubeClient
) -> None:
    """Watches the server ends (timeoutSeconds 1-2 s) are resumed from their resourceVersion."""
    tag = uuid.uuid4().hex[:8]
    opts = dataclasses.replace(FAST, watch_timeout=1, label_selector=f"{TEST_LABEL}={tag}")
    reflector = Reflector(kube, "Node", opts)
    sink = CacheSink()
    core = client.CoreV1Api(api)
    name = f"kube-restart-{tag}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run, sink)
        await wait_until(lambda: reflector.stats.synced, "the list")
        await wait_until(lambda: reflector.stats.watches >= 2, "a second watch")
        await core.create_node(body(node_manifest(GpuNodeSpec(name, labels={TEST_LABEL: tag}))))
        await wait_until(lambda: reflector.stats.watches >= 4, "two more watches")
        await core.delete_node(name)
        await wait_until(lambda: not sink.cache.nodes, "the deletion in the cache")
        tg.cancel_scope.cancel()
    s = reflector.stats
    assert (s.lists, s.relists, s.error_count) == (1, 0, 0), s
    assert (s.events_by_type["ADDED"], s.events_by_type["DELETED"]) == (1, 1)


class FlakySink(CacheSink):
    """Fails its first `apply` (a state store that is briefly down)."""

    failures = 1

    async def apply(self, events: Any, resource_versions: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store down")
        await super().apply(events, resource_versions)


async def test_a_failing_sink_gets_a_relist(api: client.ApiClient, kube: KubeClient) -> None:
    tag = uuid.uuid4().hex[:8]
    opts = dataclasses.replace(FAST, label_selector=f"{TEST_LABEL}={tag}")
    reflector = Reflector(kube, "Node", opts)
    sink = FlakySink()
    core = client.CoreV1Api(api)
    names = [f"kube-flaky-{tag}-{i}" for i in range(2)]
    async with anyio.create_task_group() as tg:
        tg.start_soon(reflector.run, sink)
        await wait_until(lambda: reflector.stats.synced, "the list")
        for n in names:
            await core.create_node(body(node_manifest(GpuNodeSpec(n, labels={TEST_LABEL: tag}))))
        # The first batch is lost by the sink; the reflector backs off and relists.
        await wait_until(lambda: set(sink.cache.nodes) == set(names), "the nodes, after a relist")
        tg.cancel_scope.cancel()
    await core.delete_collection_node(label_selector=f"{TEST_LABEL}={tag}")
    s = reflector.stats
    assert s.errors["sink"] == 1, s
    assert (s.lists, sink.replaced["Node"]) == (2, 2), s
    assert s.synced
