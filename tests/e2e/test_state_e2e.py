"""`pyctl status` and `pyctl explain` on the real control plane, read from the Redis of a running
controller, checked against what the real components did and what the controller itself says:

- ``pyctl run --kubeconfig ... --redis ... --mode observe`` as deployed (a subprocess, a real
  redis-server, the scheduler extender on its own port), and a second real kube-scheduler
  configured with that extender (deploy/scheduler/extender-config.yaml), which the test pods use;
  NodeResourceTopology kept current by the test (`TopologyUpdater`, as NFD's topology-updater);
- two kwok nodes of two NUMA zones of 4 GPUs under ``single-numa-node``: a Deployment's two 2-GPU
  replicas split over the zones of one node, 1 + 3 GPUs taken on the other by bare pods;
- a 1-GPU pod placed by the real scheduler: `pyctl explain` says its node is the placement
  policy's choice for it (with the pod counted out of its node), and names that node;
- a 4-GPU pod: 6 GPUs are free but no NUMA zone holds 4, so the real scheduler leaves it pending
  with the extender's reason in its message. `pyctl explain` reads it pending with that same
  message, each node removed by the extender for the reason the scheduler quotes, blocked by
  fragmentation in the category the controller's own metric counts it under, and the rescue the
  controller's planner counts (one move of a replica to the other node);
- `pyctl status --json`: every node's idle and stranded GPUs, the pending and blocked pods as the
  controller's /metrics report them, and its heartbeat fresh.

`pyctl status` and `pyctl explain` run as subprocesses with only the Redis URL and the cluster
name: no kubeconfig, so they cannot have asked the API server.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from pyctl.app.config import Config, load_config
from pyctl.app.state import StoredView, read_view
from pyctl.core.fragmentation import shape_dict
from pyctl.dev.control_plane import ControlPlane, ExtraScheduler, free_port
from pyctl.dev.extender import strict_config
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from pyctl.dev.topology import TopologyUpdater
from tests.e2e.conftest import if_present, not_scheduled, wait_until
from tests.e2e.test_crash_e2e import ControllerProcess
from tests.e2e.test_placement_e2e import (
    WORKLOAD,
    create_nodes,
    delete_nodes,
    gpu_deployment,
    gpu_pod,
    pod_node,
)
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

LABEL = "state-e2e"
SEL = {"pyctl.e2e/state": "true"}
CLUSTER = "e2e-state"
NODES = ("st-0", "st-1")


def used_gpus(view: StoredView, node: str) -> list[int] | None:
    m = view.reconciler.models.get(node)
    if m is None:
        return None
    return [sum(1 for g in z.gpus if g.used_milli) for z in m.zones]


async def pyctl(*args: str) -> tuple[int, str, str]:
    """`pyctl` as a subprocess, with no PYCTL_* settings and no kubeconfig in its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    env.pop("KUBECONFIG", None)
    done = await anyio.run_process(
        [sys.executable, "-m", "pyctl.cli.main", *args], env=env, check=False
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric family in a /metrics page, by their sorted labels."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def gauge(text: str, name: str, **labels: str) -> float | None:
    want = tuple(sorted({"cluster": CLUSTER, **labels}.items()))
    return samples(text, name).get(want)


async def scheduled_message(core: client.CoreV1Api, name: str) -> str | None:
    """The PodScheduled=False condition's message (None while the pod has none)."""
    c = not_scheduled(await core.read_namespaced_pod(name, "default"))
    return None if c is None else str(c.message or "")


@pytest.mark.anyio
async def test_status_and_explain_read_from_redis_agree_with_the_cluster(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    await apply_nrt_crd(api)
    specs = [GpuNodeSpec(n, labels=SEL) for n in NODES]
    await create_nodes(api, specs)
    updater = TopologyUpdater(api, specs, LABEL)
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps({"shapes": [shape_dict(s) for s in WORKLOAD.shapes]}))
    port = free_port()
    controller = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        free_port(),
        tmp_path,
        extender_port=port,
        extra_env={"PYCTL_LEASE_NAME": "pyctl-state-e2e", "PYCTL_WORKLOAD_FILE": str(workload)},
        cluster=CLUSTER,
        mode="observe",
    )
    sched = ExtraScheduler(
        control_plane,
        "pyctl-state",
        strict_config(f"http://127.0.0.1:{port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    cfg: Config = load_config(None, {}, {"cluster": CLUSTER, "redis_url": redis_server.url})
    base = ["--redis", redis_server.url, "--cluster", CLUSTER, "--json"]
    view: list[StoredView] = []

    async def stored(check: Any) -> bool:
        try:
            v = await read_view(cfg)
        except Exception:  # no state yet
            return False
        view[:] = [v]
        return bool(check(v))

    def leader(text: str) -> bool:
        return gauge(text, "pyctl_leader") == 1.0

    try:
        controller.start("st-0")
        sched.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater.run)
            # -- the fragmented pair: replicas on zones 0 and 1 of st-0; 1 + 3 GPUs on st-1 ----
            await core.patch_node("st-1", body({"spec": {"unschedulable": True}}))
            updater.hints["st-frag"] = [0, 1]
            dep = gpu_deployment("st-frag", 2, 2, "frag", label=LABEL, selector=SEL)
            await apps.create_namespaced_deployment("default", body(dep))

            async def frag_placed() -> bool:
                got = await core.list_namespaced_pod(
                    "default", label_selector=f"app={LABEL},tier=frag"
                )
                return sum(p.spec.node_name == "st-0" for p in got.items) == 2

            await wait_until(frag_placed, "two replicas on st-0", within=60)
            for name, gpus, zone in (("st-pin-a", 1, 0), ("st-pin-b", 3, 1)):
                updater.pinned[f"default/{name}"] = zone
                pod = gpu_pod(name, gpus, label=LABEL, node="st-1")
                await core.create_namespaced_pod("default", body(pod))
            await core.patch_node("st-1", body({"spec": {"unschedulable": None}}))

            def fragmented(v: StoredView) -> bool:
                return (
                    used_gpus(v, "st-0") == [2, 2]
                    and used_gpus(v, "st-1") == [1, 3]
                    and v.published is not None
                    and v.published.fresh
                )

            await wait_until(lambda: stored(fragmented), "the fragmented nodes in Redis", within=90)
            await wait_until(
                lambda: anyio.to_thread.run_sync(lambda: leader(controller.metrics())),
                "the controller to lead",
                within=30,
            )

            # -- a 1-GPU pod placed by the real scheduler with pyctl's extender --------------
            # (its name sorts before the others: translation attributes used GPUs to pods in
            # name order, zone by zone, and the kubelet gives it the first zone that fits, so
            # the model holds it where it is)
            await core.create_namespaced_pod(
                "default", body(gpu_pod("st-a-one", 1, label=LABEL, selector=SEL))
            )
            await wait_until(
                lambda: _bound(core, "st-a-one"), "st-a-one bound by the scheduler", within=30
            )
            placed = await pod_node(core, "st-a-one")
            before = {"st-0": [2, 2], "st-1": [1, 3]}[placed]

            def one_stored(v: StoredView) -> bool:
                p = v.cache.pods.get("default/st-a-one")
                got = used_gpus(v, placed)
                return p is not None and p.node == placed and sum(got or []) == sum(before) + 1

            await wait_until(lambda: stored(one_stored), "st-a-one in Redis", within=60)
            rc, out, err = await pyctl("explain", "default/st-a-one", *base)
            assert rc == 0, err
            one = json.loads(out)
            assert one["state"] == "running"
            assert one["node"] == placed
            assert placed in one["choice"], one
            assert "the placement policy's choice" in one["verdict"], one["verdict"]

            # -- a 4-GPU pod: 7 GPUs free, no NUMA zone with 4 --------------------------------
            await core.create_namespaced_pod(
                "default", body(gpu_pod("st-big", 4, label=LABEL, selector=SEL))
            )

            async def rejected() -> bool:
                return "pyctl" in (await scheduled_message(core, "st-big") or "")

            await wait_until(rejected, "st-big unschedulable by the extender", within=60)
            assert await pod_node(core, "st-big") == ""

            async def explained() -> dict[str, Any] | None:
                message = await scheduled_message(core, "st-big")
                rc, out, err = await pyctl("explain", "default/st-big", *base)
                assert rc == 0, err
                got: dict[str, Any] = json.loads(out)
                # the controller stores the first 200 characters of it (cluster/kube/decode.py)
                if message is None or got["scheduler_message"] != message[:200]:
                    return None
                got["api_message"] = message
                return got

            big: list[dict[str, Any]] = []

            async def big_explained() -> bool:
                got = await explained()
                big[:] = [got] if got is not None else []
                return got is not None

            await wait_until(big_explained, "the scheduler's message in Redis", within=60)
            (e,) = big
            message = e.pop("api_message")
            assert e["state"] == "pending"
            assert e["unschedulable"] is True
            assert e["choice"] == []
            nodes = {a["node"]: a for a in e["nodes"]}
            for n in NODES:
                why = nodes[n]["filtered"]
                assert why
                assert "cannot place 4 GPUs within the node's free NUMA resources" in why
                assert "single-numa-node" in why
                assert why in message, (why, message)  # the real scheduler quotes the extender
                assert nodes[n]["fit"] is None
            # blocked by fragmentation in the category the controller counts it under, and the
            # rescue its planner counts
            metrics = await anyio.to_thread.run_sync(controller.metrics)
            blocked = {
                dict(k)["reason"]: v
                for k, v in samples(metrics, "pyctl_pending_pods_blocked_by_fragmentation").items()
                if dict(k)["cluster"] == CLUSTER and v
            }
            assert blocked == {e["blocked"]: 1.0}, (blocked, e["blocked"])
            planned = gauge(metrics, "pyctl_compaction_planned_rescues")
            assert planned == 1.0, (e["rescue"], e["plan_note"], e["workflows"])
            assert e["rescue"] is not None, e["plan_note"]
            assert e["rescue"]["node"] == "st-0"
            (move,) = e["rescue"]["moves"]
            assert move["pod"].startswith("default/st-frag-")
            assert move["to"] == "st-1"
            assert any(w["kind"] == "rescue" and w["role"] == "named" for w in e["workflows"])

            # -- pyctl status: the controller's own figures ------------------------------------
            async def status_agrees() -> bool:
                rc, out, err = await pyctl("status", *base)
                assert rc == 0, err
                st = json.loads(out)
                text = await anyio.to_thread.run_sync(controller.metrics)
                by_node = {n["name"]: n for n in st["nodes"]}
                for n in NODES:
                    idle = gauge(text, "pyctl_node_gpu_idle_gpus", node=n)
                    frag = gauge(text, "pyctl_node_gpu_fragment_gpus", node=n)
                    if n not in by_node or idle is None or frag is None:
                        return False
                    if by_node[n]["idle_gpu_milli"] / 1000 != idle:
                        return False
                    if by_node[n]["fragment_gpu_milli"] / 1000 != pytest.approx(frag):
                        return False
                s = st["summary"]
                return bool(
                    s["pending"] == gauge(text, "pyctl_pending_pods")
                    and s["blocked"] == {e["blocked"]: 1}
                    and st["controller"]["fresh"]
                    and not st["skipped"]
                )

            await wait_until(status_agrees, "status to agree with the controller", within=60)
            tg.cancel_scope.cancel()
    finally:
        controller.kill()
        sched.stop()
        await if_present(apps.delete_namespaced_deployment("st-frag", "default"))
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)


async def _bound(core: client.CoreV1Api, name: str) -> bool:
    return bool(await pod_node(core, name))
