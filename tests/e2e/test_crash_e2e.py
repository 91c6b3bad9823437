"""Crash safety end to end (issue 7): the controller, run as deployed (``python -m pyctl.cli.main
run --kubeconfig ... --redis ... --mode enforce``, a subprocess), is killed with SIGKILL at 30
random points while it compacts a fragmented cluster, then started once more: it converges (the
pending 4-GPU replica is placed, no node is left unschedulable or carrying pyctl's taint, every
workflow record in Redis is finished) and no pod was evicted twice.

The cluster is test_compaction_e2e.py's (2-NUMA 8-GPU kwok nodes under ``single-numa-node``,
`TopologyUpdater` playing NFD's topology-updater, a second kube-scheduler calling pyctl's extender
on the controller's extender port). A driver keeps it supplying work across the rounds: each time
compaction has placed the 4-GPU replica, it scales that replica to 0, re-fragments ``c-frag`` (one
1-GPU replica in each NUMA zone, with ``c-full`` cordoned by the test meanwhile) and scales the
4-GPU replica back to 1.

Kills land at two kinds of points, chosen by a seeded RNG: after a random delay once the process
is leader, or as soon as Redis shows an unfinished workflow (inside a step: claimed, evicting,
or waiting for its retry). Evictions are counted from the API server: pyctl's eviction Events
(``PyctlCompaction`` and ``PyctlRescue``, per pod uid, ``involvedObject.uid``) and the
``DisruptionTarget`` condition the API server puts on a pod it evicts (seen through a watch).
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client, watch

from pyctl.dev.control_plane import ControlPlane, ExtraScheduler, free_port
from pyctl.dev.extender import strict_config
from pyctl.dev.gpu_nodes import GpuNodeSpec, apply_nrt_crd, body
from pyctl.dev.topology import TopologyUpdater
from pyctl.state.redis_client import RedisConfig, close_client, connect
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.engine import Workflow, WorkflowData, decode
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_reconfig import TAINT_KEY
from tests.e2e.conftest import WaitTimeout, if_present, wait_until
from tests.e2e.test_placement_e2e import (
    create_nodes,
    delete_nodes,
    gpu_deployment,
    gpu_pod,
)
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

LABEL = "crash-e2e"
SEL = {"pyctl.e2e/crash": "true"}
CLUSTER = "e2e"
ROUNDS = 30
SEED = 20240607
LEASE = "pyctl-crash-e2e"
LEADER = re.compile(r'^pyctl_leader\{cluster="e2e"\} 1(\.0)?$', re.M)
#: how long a started process may take to lead (start-up, then the killed holder's Lease expiring)
LEADER_WITHIN = 30.0
#: how long the last start may take to converge: a step a killed process claimed is taken over
#: by the next leader at once (it does not wait out Engine.claim_ttl, 60 s)
CONVERGE_WITHIN = 45.0


def deployment(name: str, replicas: int, gpus: int, tier: str) -> dict[str, Any]:
    return gpu_deployment(name, replicas, gpus, tier, label=LABEL, selector=SEL)


class ControllerProcess:
    """`pyctl run` as deployed, one process at a time; SIGKILLed, never stopped gracefully."""

    def __init__(
        self,
        kubeconfig: Path,
        redis_url: str,
        port: int,
        logs: Path,
        extender_port: int = 0,
        extra_env: dict[str, str] | None = None,
        cluster: str = CLUSTER,
        mode: str = "enforce",
    ) -> None:
        self.port = port
        self.logs = logs
        self.argv = [
            sys.executable,
            "-m",
            "pyctl.cli.main",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--redis",
            redis_url,
            "--cluster",
            cluster,
            "--mode",
            mode,
            "--metrics-port",
            str(port),
            "--extender-port",
            str(extender_port),
            "--no-live",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
        env.update(
            PYCTL_LEASE_NAMESPACE="default",
            PYCTL_LEASE_NAME=LEASE,
            PYCTL_LEASE_DURATION="3",
            PYCTL_WORKFLOW_INTERVAL="0.5",
            PYCTL_SUMMARY_INTERVAL="0.5",
            PYCTL_LIMIT_GLOBAL_BURST="100",
            PYCTL_LIMIT_GLOBAL_PER_MINUTE="600",
            PYCTL_LIMIT_NODE_BURST="100",
            PYCTL_LIMIT_NODE_PER_MINUTE="600",
            PYCTL_LIMIT_NAMESPACE_BURST="100",
            PYCTL_LIMIT_NAMESPACE_PER_MINUTE="600",
            PYCTL_LIMIT_WORKLOAD_BURST="100",
            PYCTL_LIMIT_WORKLOAD_PER_MINUTE="600",
            PYCTL_LIMIT_NODE_COOLDOWN_SECONDS="0",
            PYCTL_LIMIT_DISRUPTIONS_PER_HOUR="0",
            PYCTL_LOG_LEVEL="info",
        )
        env.update(extra_env or {})
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self, identity: str) -> None:
        assert self.proc is None
        self.starts += 1
        log = (self.logs / f"pyctl-{self.starts:02d}.log").open("wb")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env={**self.env, "PYCTL_LEASE_IDENTITY": identity},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()

    def kill(self) -> int | None:
        """SIGKILL; the exit code it already had if it had died by itself."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        early = proc.poll()
        if early is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        return early

    def metrics(self) -> str:
        try:
            with self._opener.open(f"http://127.0.0.1:{self.port}/metrics", timeout=1.0) as r:
                return str(r.read().decode())
        except OSError:
            return ""

    async def is_leader(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"pyctl exited by itself: see {self.logs}")
        return bool(LEADER.search(await anyio.to_thread.run_sync(self.metrics)))


class Scenario:
    """The fragmented cluster, and the driver that re-fragments it after each compaction."""

    def __init__(self, api: client.ApiClient, specs: list[GpuNodeSpec]) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.updater = TopologyUpdater(api, specs, LABEL)
        self.cycles = 0  # compactions completed (the 4-GPU replica placed on c-frag)
        self.refragmented = 0
        #: pod uid -> name of every pod the API server evicted (DisruptionTarget condition)
        self.evicted: dict[str, str] = {}
        #: pod name -> uid of every pod seen
        self.uids: dict[str, str] = {}

    async def tier(self, tier: str) -> list[Any]:
        got = await self.core.list_namespaced_pod(
            "default", label_selector=f"app={LABEL},tier={tier}"
        )
        return list(got.items)

    async def scale(self, name: str, replicas: int) -> None:
        await self.apps.patch_namespaced_deployment_scale(
            name, "default", body({"spec": {"replicas": replicas}})
        )

    async def cordon(self, node: str, on: bool) -> None:
        await self.core.patch_node(node, body({"spec": {"unschedulable": True if on else None}}))

    async def state(self) -> str:
        """The test pods as the API server and the test's topology-updater see them."""
        pods = await self.core.list_namespaced_pod("default", label_selector=f"app={LABEL}")
        api = [
            (p.metadata.name, p.spec.node_name, p.status.phase, bool(p.metadata.deletion_timestamp))
            for p in pods.items
        ]
        used = {n: self.updater.gpus_used(n) for n in self.updater.specs}
        return f"API {api}; GPUs used per zone {used}; placed {self.updater.where}"

    async def big_bound(self) -> bool:
        got = await self.tier("b")
        return len(got) == 1 and bool(got[0].spec.node_name)

    async def settled(self) -> bool:
        smalls = await self.tier("s")
        return await self.big_bound() and (
            len(smalls) == 2
            and all(p.spec.node_name and not p.metadata.deletion_timestamp for p in smalls)
        )

    def zones_on_frag(self, smalls: list[Any]) -> dict[str, int]:
        out = {}
        for p in smalls:
            got = self.updater.where.get(f"default/{p.metadata.name}")
            if got and got[0] == "c-frag" and not p.metadata.deletion_timestamp:
                out[p.metadata.name] = got[1]
        return out

    async def fragment(self) -> bool:
        """Both small replicas on c-frag, one per NUMA zone (c-full cordoned meanwhile)."""
        await self.cordon("c-full", True)
        try:
            with anyio.move_on_after(60):
                while True:
                    smalls = await self.tier("s")
                    zones = self.zones_on_frag(smalls)
                    if len(zones) == 2 and len(set(zones.values())) == 2 and len(smalls) == 2:
                        return True
                    if len(zones) == 2:  # both in one zone: move one
                        victims = [sorted(zones)[0]]
                    else:
                        victims = [
                            p.metadata.name
                            for p in smalls
                            if p.metadata.name not in zones
                            and not p.metadata.deletion_timestamp
                            and p.spec.node_name
                        ]
                    keep = {z for n, z in zones.items() if n not in victims}
                    self.updater.hints["small-"] = [z for z in (0, 1) if z not in keep]
                    for name in victims:
                        await if_present(
                            self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
                        )
                    with anyio.move_on_after(15):
                        while not await self._victims_replaced(victims):  # noqa: ASYNC110
                            await anyio.sleep(0.1)
            return False
        finally:
            await self.cordon("c-full", False)

    async def _victims_replaced(self, victims: list[str]) -> bool:
        smalls = await self.tier("s")
        names = {p.metadata.name for p in smalls}
        return (
            not names & set(victims) and len(smalls) == 2 and len(self.zones_on_frag(smalls)) == 2
        )

    async def drive(self) -> None:
        while True:
            while not await self.settled():  # noqa: ASYNC110
                await anyio.sleep(0.1)
            (big,) = await self.tier("b")
            if big.spec.node_name == "c-frag":
                self.cycles += 1
            await self.scale("big", 0)
            while await self.tier("b"):  # noqa: ASYNC110
                await anyio.sleep(0.1)
            if await self.fragment():
                self.refragmented += 1
            await self.scale("big", 1)

    async def watch_evictions(self) -> None:
        """Pods the API server evicted (the Eviction API sets a DisruptionTarget condition)."""
        while True:
            w = watch.Watch()
            async with w.stream(
                self.core.list_namespaced_pod,
                "default",
                label_selector=f"app={LABEL}",
                timeout_seconds=30,
            ) as stream:
                async for ev in stream:
                    p = ev["object"]
                    self.uids[p.metadata.name] = p.metadata.uid
                    for c in (p.status.conditions if p.status else None) or []:
                        if c.type == "DisruptionTarget" and c.reason == "EvictionByEvictionAPI":
                            self.evicted[p.metadata.uid] = p.metadata.name


async def workflows(store: RedisWorkflowStore) -> list[Workflow[WorkflowData]]:
    recs = await store.list()
    registry = builtin_registry()
    return [decode(r.data, registry) for r in recs.values()]


async def abandoned_of(store: RedisWorkflowStore) -> list[Workflow[WorkflowData]]:
    return [w for w in await workflows(store) if w.step == "abandoned"]


async def kill_at_a_random_point(
    pyctl: ControllerProcess,
    store: RedisWorkflowStore,
    rng: random.Random,
    i: int,
    linger: float,
) -> tuple[str, list[Workflow[WorkflowData]], float, float]:
    """One round of a crash loop: start pyctl (a restart, or the other replica), wait until it
    leads, then SIGKILL it after a random delay, or as soon as Redis shows an unfinished workflow
    and up to `linger` s more (bounded). Returns how, the workflows in flight, when, and how
    long the new process took to lead."""
    pyctl.start(rng.choice(["pyctl-a", "pyctl-b"]))
    t0 = time.monotonic()
    await wait_until(pyctl.is_leader, f"pyctl leader (round {i})", within=LEADER_WITHIN)
    to_lead = time.monotonic() - t0
    how = rng.choice(["delay", "in-flight"])
    delay = rng.uniform(0.0, 3.0)
    if how == "in-flight":
        with anyio.move_on_after(delay + 3.0):
            while not [w for w in await workflows(store) if not w.finished]:  # noqa: ASYNC110
                await anyio.sleep(0.005)
            await anyio.sleep(rng.uniform(0.0, linger))
    else:
        await anyio.sleep(delay)
    open_ = [w for w in await workflows(store) if not w.finished]
    now = time.time()
    early = pyctl.kill()
    assert early is None, f"pyctl exited by itself ({early}) in round {i}: see {pyctl.logs}"
    return how, open_, now, to_lead


@pytest.mark.anyio
async def test_sigkill_at_random_points_always_converges(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    core = client.CoreV1Api(api)
    apps = client.AppsV1Api(api)
    specs = [GpuNodeSpec(n, labels=SEL) for n in ("c-frag", "c-full")]
    scenario = Scenario(api, specs)
    updater = scenario.updater
    port, extender_port = free_port(), free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    pyctl = ControllerProcess(
        control_plane.kubeconfig, redis_server.url, port, logs, extender_port=extender_port
    )
    rc = RedisConfig(url=redis_server.url)
    redis = connect(rc)
    store = RedisWorkflowStore(redis, rc, CLUSTER)
    sched = ExtraScheduler(
        control_plane,
        "pyctl-crash",
        strict_config(f"http://127.0.0.1:{extender_port}/scheduler"),
        ["--pod-max-in-unschedulable-pods-duration=5s"],
    )
    kills: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        await apply_nrt_crd(api)
        await create_nodes(api, specs)
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater.run)
            tg.start_soon(scenario.watch_evictions)
            sched.start()
            pyctl.start("pyctl-setup")
            await wait_until(pyctl.is_leader, "pyctl leader (setup)", within=60)

            # -- the fragmented cluster, as in test_compaction_e2e --------------------------------
            await scenario.cordon("c-full", True)
            updater.hints["small-"] = [0, 1]
            await apps.create_namespaced_deployment("default", body(deployment("small", 2, 1, "s")))

            async def smalls_on_frag() -> bool:
                got = await scenario.tier("s")
                return len(got) == 2 and len(scenario.zones_on_frag(got)) == 2

            await wait_until(smalls_on_frag, "the small replicas on c-frag", within=60)
            await scenario.cordon("c-full", False)
            for name, zone in (("fill-0", 0), ("fill-1", 1)):  # bare pods: never evicted
                updater.pinned[f"default/{name}"] = zone
                pod = gpu_pod(name, 3, label=LABEL, node="c-full")
                await core.create_namespaced_pod("default", body(pod))
            try:
                await wait_until(
                    lambda: updater.gpus_used("c-full") == [3, 3], "the fill pods", within=60
                )
            except WaitTimeout as e:  # say what the test's topology-updater and the API saw
                raise WaitTimeout(f"{e}: {await scenario.state()}") from None
            pyctl.kill()  # the crash loop starts with the work
            await apps.create_namespaced_deployment("default", body(deployment("big", 1, 4, "b")))
            tg.start_soon(scenario.drive)

            # -- the crash loop -----------------------------------------------------------------
            for i in range(ROUNDS):
                how, open_, now, to_lead = await kill_at_a_random_point(
                    pyctl, store, rng, i, linger=0.03
                )
                kills.append(
                    {
                        "round": i,
                        "how": how,
                        "to_lead": to_lead,
                        "in_flight": len(open_),
                        "claimed": sum(1 for w in open_ if w.claimed_until > now),
                        "cycles": scenario.cycles,
                    }
                )

            # -- the last start: convergence ------------------------------------------------------
            tg.cancel_scope.cancel()
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater.run)
            tg.start_soon(scenario.watch_evictions)
            await scenario.cordon("c-full", False)  # the driver may have stopped in fragment()
            await scenario.scale("big", 1)
            pyctl.start("pyctl-final")
            final_start = time.monotonic()
            await wait_until(pyctl.is_leader, "pyctl leader (final)", within=LEADER_WITHIN)

            async def converged() -> bool:
                if not await scenario.settled():
                    return False
                for n in (await core.list_node()).items:
                    if n.metadata.name not in ("c-frag", "c-full"):
                        continue
                    if n.spec.unschedulable:
                        return False
                    if any(t.key == TAINT_KEY for t in n.spec.taints or []):
                        return False
                return all(w.finished for w in await workflows(store))

            # a step claimed by a killed process is taken over by the new leader at once
            await wait_until(
                converged, "convergence after the last restart", within=CONVERGE_WITHIN
            )
            converged_after = time.monotonic() - final_start
            await anyio.sleep(2.0)  # a late eviction would show up here
            assert await converged()
            pyctl.kill()
            tg.cancel_scope.cancel()

        # -- no pod evicted twice ---------------------------------------------------------------
        # evictions by compaction and by rescues (a pod evicted by both is evicted twice)
        evicting = []
        for reason in ("PyctlCompaction", "PyctlRescue"):
            got = await core.list_namespaced_event("default", field_selector=f"reason={reason}")
            evicting += [e for e in got.items if e.message.startswith("evicted")]
        # the Event names the evicted pod by uid (from the workflow: the pod is usually gone
        # by the time the Event is written)
        assert all(e.involved_object.uid for e in evicting), "an Event without a pod uid"
        per_uid = Counter(e.involved_object.uid for e in evicting)
        twice = {uid: n for uid, n in per_uid.items() if n > 1}
        assert not twice, f"pods evicted more than once: {twice}"
        assert not set(scenario.evicted.values()) & {"fill-0", "fill-1"}
        leads = [float(k["to_lead"]) for k in kills]
        in_flight = [k for k in kills if k["in_flight"]]
        claimed = [k for k in kills if k["claimed"]]
        print(
            f"\ncrash e2e: {len(kills)} SIGKILLs in {time.monotonic() - started:.0f} s; "
            f"{len(in_flight)} with a workflow in flight, {len(claimed)} inside a claimed step; "
            f"{scenario.cycles} compactions completed, {scenario.refragmented} re-fragmentations; "
            f"{len(per_uid)} pods evicted per Events, {len(scenario.evicted)} per the API server's "
            f"DisruptionTarget ({len(set(scenario.evicted) - set(per_uid))} without an Event: "
            "killed between the eviction and its Event); workflows in Redis: "
            f"{Counter(w.step for w in await workflows(store))} "
            f"{[(w.kind, w.data.named(), w.result) for w in await abandoned_of(store)]}"
            "; a started process led after "
            f"{statistics.median(leads):.1f} s (median), {max(leads):.1f} s (max; allowed "
            f"{LEADER_WITHIN:.0f}); the last start converged after {converged_after:.0f} s "
            f"(allowed {CONVERGE_WITHIN:.0f})"
        )
        assert len(kills) == ROUNDS
        assert scenario.cycles >= 2, "the scenario supplied too little work"
    finally:
        pyctl.kill()
        sched.stop()
        await close_client(redis)
        for name in ("small", "big"):
            await if_present(apps.delete_namespaced_deployment(name, "default"))
        await core.delete_collection_namespaced_pod(
            "default", label_selector=f"app={LABEL}", grace_period_seconds=0
        )
        await delete_nodes(api, specs)
