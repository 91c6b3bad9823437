"""Crash safety of MIG reconfiguration end to end (issue 7): the controller, run as deployed (the
same subprocess as test_crash_e2e.py), is killed with SIGKILL at random points while it
re-partitions a kwok A100 node through the simulated mig-manager (`mig_manager_sim.py`, in the
test process, never killed), then started once more: it converges (the pods of the current
demand are served, the node carries no pyctl taint and is schedulable, mig-manager's state is
`success` on a config the published ConfigMap holds, every workflow record in Redis is
finished), and mig-manager never saw a config it could not apply.

A driver keeps it supplying work: the node's two GPUs are asked for, in turn, four
`3g.20gb` instances (both GPUs as 2 x 3g) and fourteen `1g.5gb` (both as 7 x 1g); once the
pods of one demand are all bound, they are deleted and the other demand is created, so each
round of demand needs a re-partition. Kills land as in test_crash_e2e.py: after a random delay
once the process is leader, or as soon as Redis shows an unfinished workflow.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from pyctl.core import mig
from pyctl.dev.control_plane import ControlPlane, free_port
from pyctl.dev.gpu_nodes import body
from pyctl.dev.mig_manager import (
    STATE_LABEL,
    MigManagerSim,
    a100_all_1g,
    create_mig_node,
    mig_pod,
)
from pyctl.state.redis_client import RedisConfig, close_client, connect
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.mig_reconfig import TAINT_KEY, MigOptions
from tests.e2e.conftest import if_present, wait_until
from tests.e2e.test_crash_e2e import (
    CLUSTER,
    ControllerProcess,
    kill_at_a_random_point,
    workflows,
)
from tests.e2e.test_placement_e2e import delete_nodes
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

ROUNDS = 15
SEED = 20241129
NS = "crash-mig"
NODE = "crash-mig-a100"
APP = "crash-mig"
#: where the deployed controller publishes its mig-parted configs (MigOptions' defaults)
GPU_NS = MigOptions().configmap_namespace
CONFIGMAP = MigOptions().configmap_name
#: profile -> pods of one demand: the whole node in that profile
DEMANDS = (("3g.20gb", 4), ("1g.5gb", 14))


class MigDemand:
    """The driver: one demand at a time, served only by re-partitioning both GPUs."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.round = 0
        self.served = 0  # demands fully bound
        self.current: list[str] = []

    async def pods(self) -> list[Any]:
        got = await self.core.list_namespaced_pod(NS, label_selector=f"app={APP}")
        return list(got.items)

    async def bound(self) -> bool:
        got = {p.metadata.name: p for p in await self.pods()}
        return bool(self.current) and all(
            n in got and got[n].spec.node_name == NODE for n in self.current
        )

    async def create(self) -> None:
        profile, count = DEMANDS[self.round % 2]
        short = profile.split(".")[0]
        self.current = [f"d{self.round}-{short}-{i}" for i in range(count)]
        for name in self.current:
            await self.core.create_namespaced_pod(NS, body(mig_pod(name, NODE, profile, APP)))

    async def clear(self) -> None:
        for name in self.current:
            await if_present(self.core.delete_namespaced_pod(name, NS, grace_period_seconds=0))
        while await self.pods():  # noqa: ASYNC110
            await anyio.sleep(0.1)

    async def drive(self) -> None:
        while True:
            await self.create()
            while not await self.bound():  # noqa: ASYNC110
                await anyio.sleep(0.1)
            self.served += 1
            await self.clear()
            self.round += 1


@pytest.mark.anyio
async def test_sigkill_during_mig_reconfiguration_always_converges(
    control_plane: ControlPlane,
    api: client.ApiClient,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    core = client.CoreV1Api(api)
    spec = a100_all_1g(NODE)
    port = free_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    # re-partition the node again as soon as the demand changes (the default holds it off 10 min)
    pyctl = ControllerProcess(
        control_plane.kubeconfig,
        redis_server.url,
        port,
        logs,
        extra_env={"PYCTL_MIG_NODE_HOLDOFF_SECONDS": "0"},
    )
    rc = RedisConfig(url=redis_server.url)
    redis = connect(rc)
    store = RedisWorkflowStore(redis, rc, CLUSTER)
    demand = MigDemand(api)
    mgr = MigManagerSim(api, [spec], namespace=GPU_NS, configmap=CONFIGMAP, delay=0.5)
    kills: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        await create_mig_node(api, spec, CONFIGMAP, GPU_NS)
        await core.create_namespace(body({"metadata": {"name": NS}}))
        async with anyio.create_task_group() as tg:
            tg.start_soon(mgr.run)
            await mgr.ready.wait()
            driver = anyio.CancelScope()

            async def drive() -> None:
                with driver:
                    await demand.drive()

            tg.start_soon(drive)
            # -- the crash loop ---------------------------------------------------------------
            for i in range(ROUNDS):
                how, open_, _, _ = await kill_at_a_random_point(pyctl, store, rng, i, linger=1.0)
                kills.append({"round": i, "how": how, "steps": [w.step for w in open_]})

            # -- the last start: convergence --------------------------------------------------
            # the driver stops where it is; one last demand, which needs one more re-partition
            driver.cancel()
            await demand.clear()
            demand.round += 1
            await demand.create()
            pyctl.start("pyctl-final")
            await wait_until(pyctl.is_leader, "pyctl leader (final)", within=30)

            why = ["not checked yet"]

            async def converged() -> bool:
                if not await demand.bound():
                    pods = await demand.pods()
                    unbound = [p.metadata.name for p in pods if not p.spec.node_name]
                    node = await core.read_node(NODE)
                    conds = [
                        (c.type, c.reason, c.message)
                        for p in pods[:1]
                        for c in (p.status.conditions if p.status else None) or []
                    ]
                    why[0] = (
                        f"demand round {demand.round} not served; unbound: {unbound}; "
                        f"first pod's conditions {conds}; node allocatable "
                        f"{node.status.allocatable}; labels {node.metadata.labels}"
                    )
                    return False
                node = await core.read_node(NODE)
                labels = node.metadata.labels or {}
                taints = [t.key for t in node.spec.taints or []]
                if node.spec.unschedulable or TAINT_KEY in taints:
                    why[0] = f"node not schedulable (cordoned {node.spec.unschedulable}, {taints})"
                    return False
                if labels.get(STATE_LABEL) != "success":
                    why[0] = f"mig-manager state {labels.get(STATE_LABEL)}"
                    return False
                open_ = [w.step for w in await workflows(store) if not w.finished]
                why[0] = f"workflows not finished: {open_}"
                return not open_

            # a step claimed by a killed process is taken over by the new leader at once; the
            # rest is the mig-manager's re-partitioning
            with anyio.move_on_after(90):
                while not await converged():  # noqa: ASYNC110
                    await anyio.sleep(0.2)
            await anyio.sleep(2.0)  # nothing moves once converged
            if not await converged():
                pytest.fail(
                    f"no convergence after the last restart: {why[0]}; mig-manager "
                    f"{mgr.history[-6:]}; kills {kills}; logs {logs}",
                    pytrace=False,
                )
            tg.cancel_scope.cancel()
        node = await core.read_node(NODE)
        cm = await core.read_namespaced_config_map(CONFIGMAP, GPU_NS)
        assert node.metadata.labels[mig.MIG_CONFIG_LABEL] in mig.parse_mig_parted(
            cm.data["config.yaml"]
        )
        states = Counter(st for n, _, st in mgr.history if n == NODE)
        assert states["failed"] == 0, f"mig-manager could not apply a config: {mgr.history}"
        in_flight = [k for k in kills if k["steps"]]
        steps = Counter(s for k in in_flight for s in k["steps"])
        print(
            f"\ncrash mig e2e: {len(kills)} SIGKILLs in {time.monotonic() - started:.0f} s; "
            f"{len(in_flight)} with a workflow in flight (steps {dict(steps)}); "
            f"{demand.served} demands served, {states['success']} re-partitions applied; "
            f"workflows in Redis: {Counter(w.step for w in await workflows(store))}"
        )
        assert len(kills) == ROUNDS
        assert demand.served >= 3, "the scenario supplied too little work"
    finally:
        pyctl.kill()
        await close_client(redis)
        await if_present(core.delete_namespace(NS))
        await if_present(core.delete_namespaced_config_map(CONFIGMAP, GPU_NS))
        await delete_nodes(api, [spec])
