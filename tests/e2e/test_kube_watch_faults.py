"""The reflectors under faults, on a real kube-apiserver without watch cache (its watches read
etcd): the server restarting drops every watch (resume from the last resourceVersion, no relist,
nothing lost), and a restart after etcd compacted the history makes the resumed watch 410 Gone
(relist, and the cache converges to a fresh list)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.cluster.kube.client import connect
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.cluster.kube.source import KubeClusterSource
from pyctl.cluster.records import Kind
from pyctl.dev.control_plane import ControlPlane, ExtraApiserver, etcd_compact, etcd_revision
from pyctl.dev.gpu_nodes import GpuNodeSpec, body, node_manifest

from .conftest import CacheSink, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(120, func_only=True)]

TEST_LABEL = "pyctl.e2e/kube-fault"
FAST = ReflectorOptions(watch_timeout=60, backoff_initial=0.05, backoff_max=0.5)


def pod(name: str) -> Any:
    return body(
        {
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
        }
    )


async def _fresh(plane: ControlPlane, kind: Kind, path: str) -> dict[str, Any]:
    """A fresh list (through the shared apiserver), as records by key."""
    got: Any = await anyio.to_thread.run_sync(plane.request, "GET", path)
    recs = [decode_object(kind, json.dumps(o).encode()) for o in got["items"]]
    return {(f"{r.namespace}/{r.name}" if kind == "Pod" else r.name): r for r in recs}  # type: ignore[union-attr]


async def _scenario(
    api: client.ApiClient,
    plane: ControlPlane,
    server: ExtraApiserver,
    *,
    compact: bool,
) -> tuple[KubeClusterSource, CacheSink, str, str]:
    """Follow nodes and pods through `server`; stop it, change things through the shared
    apiserver (optionally compacting etcd), start it again; wait for the cache to converge."""
    tag = uuid.uuid4().hex[:8]
    ns = f"kube-fault-{tag}"
    selector = f"{TEST_LABEL}={tag}"
    core = client.CoreV1Api(api)
    await core.create_namespace(body({"metadata": {"name": ns}}))

    def spec(i: int) -> GpuNodeSpec:
        return GpuNodeSpec(f"kube-fault-{tag}-{i}", labels={TEST_LABEL: tag})

    for i in range(3):
        await core.create_node(body(node_manifest(spec(i))))
        await core.create_namespaced_pod(ns, pod(f"p{i}"))

    source = KubeClusterSource(
        await connect(kubeconfig=server.kubeconfig),
        kinds=("Node", "Pod"),
        per_kind={
            "Node": dataclasses.replace(FAST, label_selector=selector),
            "Pod": dataclasses.replace(FAST, namespace=ns),
        },
    )
    kube = source.reflectors["Node"].kube
    sink = CacheSink()
    nodes_path = f"/api/v1/nodes?labelSelector={selector}"
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(source.run, sink)
            await wait_until(
                lambda: len(sink.cache.nodes) == 3 and len(sink.cache.pods) == 3, "the first list"
            )
            await core.delete_node(spec(0).name)  # seen live, before the outage
            await wait_until(lambda: len(sink.cache.nodes) == 2, "a live deletion")

            server.kill()
            try:
                await wait_until(
                    lambda: all(s.error_count > 0 for s in source.stats.values()),
                    "both reflectors to notice the outage",
                )
                # Meanwhile, through the shared apiserver: a deletion, a change, a creation.
                await core.delete_node(spec(1).name)
                await core.patch_node(spec(2).name, {"metadata": {"labels": {"changed": "yes"}}})
                await core.create_node(body(node_manifest(spec(3))))
                await core.delete_namespaced_pod("p0", ns, grace_period_seconds=0)
                await core.create_namespaced_pod(ns, pod("p3"))
                if compact:
                    await anyio.to_thread.run_sync(etcd_compact, plane, etcd_revision(plane))
            finally:
                # In this (the main) thread: the component dies with the thread that started it
                # (PR_SET_PDEATHSIG), and anyio's worker threads come and go. It blocks the loop
                # for the few seconds the apiserver takes to start; the reflectors just wait.
                server.start()

            want_nodes = await _fresh(plane, "Node", nodes_path)
            want_pods = await _fresh(plane, "Pod", pods_path)
            assert set(want_nodes) == {spec(2).name, spec(3).name}
            assert set(want_pods) == {f"{ns}/p1", f"{ns}/p2", f"{ns}/p3"}
            await wait_until(
                lambda: sink.cache.nodes == want_nodes and sink.cache.pods == want_pods,
                "the cache to equal a fresh list",
                30,
            )
            tg.cancel_scope.cancel()
    finally:
        await kube.close()
        await core.delete_collection_node(label_selector=selector)
    return source, sink, ns, selector


async def test_watch_resumes_after_the_apiserver_drops_connections(
    api: client.ApiClient, control_plane: ControlPlane, nocache_apiserver: ExtraApiserver
) -> None:
    source, sink, _, _ = await _scenario(api, control_plane, nocache_apiserver, compact=False)
    for kind, s in source.stats.items():
        assert (s.lists, s.relists) == (1, 0), (kind, s)  # resumed from its resourceVersion
        assert s.error_count > 0, (kind, s)
        assert sink.replaced[kind] == 1
    # The changes made while the server was down came as events, none lost, none doubled:
    # 1 live + 1 missed node deletion, 1 missed pod deletion; 1 node and 1 pod creation.
    node, pods = source.stats["Node"].events_by_type, source.stats["Pod"].events_by_type
    assert (node["DELETED"], node["ADDED"]) == (2, 1), "\n".join(map(str, sink.log))
    assert (pods["DELETED"], pods["ADDED"]) == (1, 1)


async def test_relist_after_410_gone_converges(
    api: client.ApiClient, control_plane: ControlPlane, nocache_apiserver: ExtraApiserver
) -> None:
    source, sink, _, _ = await _scenario(api, control_plane, nocache_apiserver, compact=True)
    for kind, s in source.stats.items():
        # The resumed watch found its resourceVersion compacted: one 410, one relist.
        assert (s.lists, s.relists) == (2, 1), (kind, s)
        assert sink.replaced[kind] == 2
    # The missed deletion came through the relist, not as an event.
    assert source.stats["Node"].events_by_type["DELETED"] == 1
    assert source.stats["Pod"].events_by_type["DELETED"] == 0
