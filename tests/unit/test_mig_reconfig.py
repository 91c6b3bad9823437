"""The MIG reconfiguration workflow as a state machine, against a fake cluster that plays the
API server and the mig-manager label protocol: the happy path; `failed` and a timeout roll the
label back and leave the node schedulable; a controller killed after any action (before the step
is persisted) or between any two steps resumes without a second eviction and without leaving the
node tainted."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest

from pyctl.cluster.records import NodeRecord, PodRecord, Taint
from pyctl.cluster.source import EvictionOutcome
from pyctl.controller.cache import ClusterCache
from pyctl.core import mig
from pyctl.core.inputs import MigGpuInput, MigLimitsInput
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import MemoryRateLimiter
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows import mig_loop, mig_reconfig
from pyctl.workflows.base import of_kind
from pyctl.workflows.engine import Engine, Workflow, decode
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.mig_loop import MigLoop, fresh_id, pending_demand
from pyctl.workflows.mig_reconfig import (
    KIND,
    TAINT_KEY,
    MigContext,
    MigData,
    MigOptions,
    expected_capacity,
    workflow_for,
)
from tests.limits import global_only
from tests.models import CacheModels

MODEL = "A100-SXM4-40GB"
NS, CM, KEY = "gpu-operator", "pyctl-mig-parted-config", "config.yaml"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Killed(BaseException):
    """The controller killed right after an action, before its step was persisted."""


@dataclass
class Clock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class FakeMigCluster:
    """The API server (nodes, pods, ConfigMaps, DeviceTaintRules, evictions) and a mig-manager
    that follows the label protocol: on a new `nvidia.com/mig.config`, `pending`, then the
    config applied (the node's MIG capacity changes) and `success`; or `failed` (mode "fail":
    any config but the node's first, which re-applies fine; mode "fail-all": every config, the
    rollback's too; or an unknown config); or nothing at all (mode "silent")."""

    nodes: dict[str, NodeRecord]
    pods: dict[str, PodRecord]
    configmaps: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    evictions: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    manager: str = "success"
    refuse: int = 0
    retry_after: float | None = None
    #: raise Killed after the n-th action (0-based); None: never
    kill_at: int | None = None
    applied: dict[str, str] = field(default_factory=dict)
    initial: dict[str, str] = field(default_factory=dict)
    device_rules: dict[str, dict[str, object]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.initial = {name: n.mig_config for name, n in self.nodes.items()}

    def _act(self, what: str) -> None:
        self.actions.append(what)
        if self.kill_at is not None and len(self.actions) - 1 == self.kill_at:
            self.kill_at = None
            raise Killed(what)

    def _node(self, name: str, **changes: object) -> None:
        self.nodes[name] = msgspec.structs.replace(self.nodes[name], **changes)

    async def cordon(self, node: str, on: bool) -> None:
        self._node(node, unschedulable=on)
        self._act(f"cordon {node} {on}")

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        taints = {t.key: t for t in self.nodes[node].taints}
        before = dict(taints)
        if on:
            taints[key] = Taint(key, value, effect)
        else:
            taints.pop(key, None)
        self._node(node, taints=tuple(taints[k] for k in sorted(taints)))
        self._act(f"taint {node} {key} {on}")
        return taints != before

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        if self.refuse > 0:
            self.refuse -= 1
            return EvictionOutcome(False, 429, retry_after=self.retry_after)
        key = f"{namespace}/{pod}"
        self.evictions.append(key)
        if key in self.pods:
            self.pods[key] = msgspec.structs.replace(self.pods[key], deleting=True)
        self._act(f"evict {key}")
        return EvictionOutcome(True, 201)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        if mig.MIG_CONFIG_LABEL in labels:
            self._node(node, mig_config=labels[mig.MIG_CONFIG_LABEL] or "")
        self._act(f"label {node} {dict(labels)}")

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        got = self.configmaps.get((namespace, name))
        return None if got is None else dict(got)

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.configmaps.setdefault((namespace, name), {}).update(data)
        self._act(f"configmap {namespace}/{name}")

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        return dict(self.device_rules)

    async def put_device_taint_rule(self, manifest: Mapping[str, object], on: bool) -> None:
        meta = manifest.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError("DeviceTaintRule without metadata.name")
        if on:
            self.device_rules.setdefault(name, dict(manifest))  # exists already: 409, kept
        else:
            self.device_rules.pop(name, None)  # gone already: 404, fine
        self._act(f"devicetaintrule {name} {on}")

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None:
        self.events.append((kind, name, reason))

    def settle(self) -> None:
        """Evicted pods terminate; mig-manager makes one move per node."""
        for k in [k for k, p in self.pods.items() if p.deleting]:
            del self.pods[k]
        for name, node in list(self.nodes.items()):
            want = node.mig_config
            if self.applied.get(name) == want or self.manager == "silent":
                continue
            if node.mig_config_state != "pending":
                self._node(name, mig_config_state="pending")
                continue
            text = (self.configmaps.get((NS, CM)) or {}).get(KEY, "")
            configs = mig.parse_mig_parted(text) if text else {}
            fails = self.manager == "fail-all" or (
                self.manager == "fail" and want != self.initial.get(name)
            )
            if fails or want not in configs:
                self._node(name, mig_config_state="failed")
            else:
                cap = expected_capacity(configs[want], gpus=2)
                self._node(name, mig_config_state="success", mig=tuple(sorted(cap.items())))
            self.applied[name] = want


LOOSE = global_only(100, 100.0)


def a_plan() -> mig.NodePlan:
    """GPU 0: 7 x 1g.5gb, two used (ns/a0, ns/a1); GPU 1: 7 x 1g.5gb, one used (ns/b); two
    3g.20gb pending. The plan re-partitions GPU 1 (ns/b must move)."""
    gpus: list[MigGpuInput] = [
        {
            "gpu": g,
            "instances": [
                {
                    "profile": "1g.5gb",
                    "start": i,
                    "used": i < used,
                    "pod": pods[i] if i < used else None,
                }
                for i in range(7)
            ],
        }
        for g, used, pods in ((0, 2, ["ns/a0", "ns/a1"]), (1, 1, ["ns/b"]))
    ]
    limits: MigLimitsInput = {"executor": "mig-parted", "max_used_destroyed": 1}
    p = mig.plan(MODEL, gpus, {"3g.20gb": 2}, None, limits)
    assert [g["pods_to_move"] for g in p["gpus"] if g["changed"]] == [["ns/b"]]
    return mig.NodePlan("n1", MODEL, False, p)


def a_cluster() -> FakeMigCluster:
    node = NodeRecord(
        "n1",
        gpu_model=MODEL,
        mig=(("1g.5gb", 14),),
        gpu_count_label=2,
        mig_config="all-1g.5gb",
        mig_config_state="success",
        mig_strategy="mixed",
    )
    pods = {
        k: PodRecord("ns", k.split("/")[1], uid=f"u-{k}", node="n1", mig=(("1g.5gb", 1),))
        for k in ("ns/a0", "ns/a1", "ns/b")
    }
    base = {"all-1g.5gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}]}
    cm = {KEY: mig.to_yaml({"version": "v1", "mig-configs": base})}
    return FakeMigCluster({"n1": node}, pods, {(NS, CM): cm})


OPTIONS = MigOptions(apply_timeout=60.0, drain_timeout=60.0, poll=1.0)


class Harness:
    def __init__(
        self,
        cluster: FakeMigCluster,
        mode: str = "enforce",
        options: MigOptions = OPTIONS,
        leader: bool = True,
        demand: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.demand = demand
        self.clock = Clock()
        self.store = MemoryWorkflowStore()
        self.limiter = MemoryRateLimiter(clock=self.clock)
        self.metrics = Metrics()
        self.mode, self.options, self.leader = mode, options, leader
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        """A (re)started controller: new engine and gate over the same store and limiter."""
        c = self.cluster
        gate = Gate(self.mode, lambda: self.leader, self.limiter, LOOSE, c, self.metrics, "c")
        self.gate = gate
        ctx = MigContext(
            gate,
            lambda ns, name: c.pods.get(f"{ns}/{name}"),
            clock=self.clock,
            node=c.nodes.get,
            options=self.options,
            demand=self.demand,
        )
        return Engine(self.store, ctx, builtin_registry())

    async def wf(self) -> Workflow[MigData]:
        got = await self.engine.get(WF_ID)
        assert got is not None
        mine = of_kind(got, MigData)
        assert mine is not None, got
        return mine

    async def run(self, steps: int = 200, restart_every_step: bool = False) -> Workflow[MigData]:
        for _ in range(steps):
            try:
                await self.engine.advance_all()
            except Killed:
                self.engine = self.new_engine()
            if restart_every_step:
                self.engine = self.new_engine()
            wf = await self.wf()
            if wf.finished:
                return wf
            self.cluster.settle()
            self.clock.t += 1.0
        raise AssertionError(f"not finished: {await self.wf()}")

    def count(self, result: str) -> float:
        v = self.metrics.registry.get_sample_value(
            "pyctl_mig_reconfigurations_total", {"cluster": "c", "node": "n1", "result": result}
        )
        return v or 0.0


WF_ID = "mig-test"


async def started(h: Harness) -> None:
    wf = workflow_for(a_plan(), h.cluster.pods, h.clock(), workflow_id=WF_ID)
    assert wf.kind == KIND
    assert await h.engine.start(wf)


def assert_restored(c: FakeMigCluster) -> None:
    n = c.nodes["n1"]
    assert not n.has_taint(TAINT_KEY)
    assert not n.unschedulable


@pytest.mark.anyio
async def test_happy_path() -> None:
    h = Harness(a_cluster())
    await started(h)
    wf = await h.run()
    c = h.cluster
    assert wf.step == "done", wf
    assert wf.result.startswith("succeeded"), wf
    assert c.evictions == ["ns/b"]  # only the pod on the GPU that changes
    node = c.nodes["n1"]
    assert node.mig_config == wf.data.config
    assert node.mig_config_state == "success"
    assert dict(node.mig) == {"1g.5gb": 7, "3g.20gb": 2}
    assert_restored(c)
    # the ConfigMap keeps the previous config and gains the new one
    configs = mig.parse_mig_parted(c.configmaps[(NS, CM)][KEY])
    assert set(configs) == {"all-1g.5gb", wf.data.config}
    # order: isolate, evict, publish, label, restore
    kinds = [a.split()[0] for a in c.actions]
    assert kinds == ["taint", "evict", "configmap", "label", "taint"]
    assert h.count("succeeded") == 1
    assert h.count("rolled_back") == 0
    g = h.metrics.registry.get_sample_value(
        "pyctl_mig_reconfiguration_in_progress", {"cluster": "c", "node": "n1"}
    )
    assert g == 0
    assert ("Pod", "b", "PyctlMigReconfiguration") in c.events


@pytest.mark.anyio
async def test_failed_rolls_back_and_leaves_node_schedulable() -> None:
    c = a_cluster()
    c.manager = "fail"
    h = Harness(c)
    await started(h)
    wf = await h.run()
    assert wf.step == "failed", wf
    assert wf.result.startswith("rolled_back"), wf
    assert "mig-manager: failed" in wf.result
    assert c.nodes["n1"].mig_config == "all-1g.5gb"  # label rolled back
    labels = [a for a in c.actions if a.startswith("label")]
    assert len(labels) == 2
    assert "all-1g.5gb" in labels[-1]
    assert_restored(c)
    assert h.count("rolled_back") == 1
    assert h.count("succeeded") == 0
    assert ("Node", "n1", "PyctlMigReconfigurationFailed") in c.events


@pytest.mark.anyio
async def test_timeout_rolls_back() -> None:
    c = a_cluster()
    c.manager = "silent"
    h = Harness(c)
    await started(h)
    wf = await h.run()
    assert wf.step == "failed", wf
    assert wf.result.startswith("rolled_back"), wf
    assert "no success within 60 s" in wf.result
    assert c.nodes["n1"].mig_config == "all-1g.5gb"
    assert_restored(c)
    assert h.count("rolled_back") == 1


@pytest.mark.anyio
async def test_stale_success_is_not_taken_for_the_new_config() -> None:
    """Right after the label is set the node still says `success` (of the previous config) with
    the previous capacity: the workflow waits for the new capacity."""
    c = a_cluster()
    c.manager = "silent"
    h = Harness(c, options=MigOptions(apply_timeout=5.0, drain_timeout=60.0, poll=1.0))
    await started(h)
    wf = await h.run()
    assert c.nodes["n1"].mig_config_state == "success"
    assert wf.result.startswith("rolled_back"), wf


@pytest.mark.anyio
async def test_pdb_refusals_wait_then_proceed() -> None:
    c = a_cluster()
    c.refuse = 2
    h = Harness(c, options=MigOptions(apply_timeout=60.0, drain_timeout=300.0, poll=1.0))
    await started(h)
    await h.engine.advance_all()  # acquiring
    await h.engine.advance_all()  # isolating
    await h.engine.advance_all()  # evicting: 429
    wf = await h.wf()
    assert wf.step == "evicting"
    assert "429" in wf.result
    assert wf.not_before > h.clock()
    h.clock.t += 31
    wf = await h.run()
    assert wf.step == "done"
    assert c.evictions == ["ns/b"]


@pytest.mark.anyio
async def test_a_refusal_waits_as_long_as_the_api_server_asks() -> None:
    c = a_cluster()
    c.refuse, c.retry_after = 1, 5.0
    h = Harness(c, options=MigOptions(apply_timeout=60.0, drain_timeout=300.0, poll=1.0))
    await started(h)
    for _ in range(3):  # acquiring, isolating, evicting: 429
        await h.engine.advance_all()
    wf = await h.wf()
    assert wf.step == "evicting", wf
    assert wf.not_before == pytest.approx(h.clock() + 5.0), wf
    h.clock.t += 5
    wf = await h.run()
    assert wf.step == "done"
    assert c.evictions == ["ns/b"]


@pytest.mark.anyio
async def test_drain_timeout_restores_without_touching_the_label() -> None:
    c = a_cluster()
    c.refuse = 10**6
    h = Harness(c, options=MigOptions(apply_timeout=60.0, drain_timeout=40.0, poll=1.0))
    await started(h)
    for _ in range(10):
        await h.engine.advance_all()
        h.clock.t += 31
    wf = await h.wf()
    assert wf.step == "failed", wf
    assert wf.result.startswith("failed: drain timed out"), wf
    assert c.nodes["n1"].mig_config == "all-1g.5gb"
    assert not [a for a in c.actions if a.startswith("label")]
    assert_restored(c)
    assert h.count("failed") == 1


@pytest.mark.anyio
async def test_observe_mode_and_followers_change_nothing() -> None:
    h = Harness(a_cluster(), mode="observe")
    await started(h)
    await h.engine.advance_all()
    wf = await h.wf()
    assert wf.step == "dry-run"
    assert h.cluster.actions == []
    h2 = Harness(a_cluster(), leader=False)
    await started(h2)
    for _ in range(5):
        await h2.engine.advance_all()
        h2.clock.t += 5
    assert (await h2.wf()).step == "acquiring"
    assert h2.cluster.actions == []


@pytest.mark.anyio
async def test_missing_rollback_target_abandons_before_touching_the_node() -> None:
    c = a_cluster()
    c.nodes["n1"] = msgspec.structs.replace(c.nodes["n1"], mig_config="custom-unknown")
    h = Harness(c)
    await started(h)
    wf = await h.run()
    assert wf.step == "abandoned"
    assert c.actions == []


@pytest.mark.anyio
async def test_mig_slot_holds_a_second_node_back() -> None:
    c = a_cluster()
    c.nodes["n2"] = msgspec.structs.replace(c.nodes["n1"], name="n2")
    h = Harness(c)
    await started(h)
    plan2 = a_plan()
    other = workflow_for(mig.NodePlan("n2", MODEL, False, plan2.plan), c.pods, h.clock())
    assert await h.engine.start(other)
    await h.engine.advance_all()
    steps = {
        wf.node: wf.step for wf in [await h.engine.get(WF_ID), await h.engine.get(other.id)] if wf
    }
    assert sorted(steps.values()) == ["acquiring", "isolating"]  # one slot (mig_concurrency=1)


@pytest.mark.anyio
async def test_a_workflow_that_cannot_start_is_abandoned_at_its_acquire_timeout() -> None:
    """The MIG slot held (mig-manager never answers the first node's reconfiguration), the
    second node's workflow waits in `acquiring`, then is abandoned at `acquire_timeout` with the
    limit that bound, having touched nothing on its node (the soak found such workflows waiting
    forever)."""
    c = a_cluster()
    c.manager = "silent"
    c.nodes["n2"] = msgspec.structs.replace(c.nodes["n1"], name="n2")
    opts = MigOptions(acquire_timeout=30.0, apply_timeout=600.0, drain_timeout=60.0, poll=1.0)
    h = Harness(c, options=opts)
    await started(h)
    await h.engine.advance_all()  # the first takes the slot
    assert (await h.wf()).step == "isolating"
    other = workflow_for(mig.NodePlan("n2", MODEL, False, a_plan().plan), c.pods, h.clock())
    assert await h.engine.start(other)
    seen = []
    last = None
    for _ in range(60):
        await h.engine.advance_all()
        last = await h.engine.get(other.id)
        assert last is not None
        seen.append(last.step)
        if last.finished:
            break
        c.settle()
        h.clock.t += 1.0
    assert last is not None
    assert seen[0] == "acquiring"
    assert seen[-1] == "abandoned"
    assert 29 <= seen.count("acquiring") <= 32  # about acquire_timeout at one advance a second
    done = of_kind(last, MigData)
    assert done is not None
    assert done.data.reason.startswith("waited 31 s (acquire_timeout 30 s) to start: limit ")
    assert "binds" in done.data.reason
    n2 = c.nodes["n2"]
    assert (n2.mig_config, n2.has_taint(TAINT_KEY), n2.unschedulable) == (
        "all-1g.5gb",
        False,
        False,
    )
    assert not [a for a in c.actions if "n2" in a]
    first = await h.wf()
    assert first.step == "waiting"  # the first still holds the slot


@pytest.mark.anyio
async def test_a_workflow_whose_demand_is_gone_is_abandoned_before_it_starts() -> None:
    """Waiting for the MIG slot, the second node's workflow is abandoned once no pending pod
    asks for a profile it would add (the soak found such workflows waiting on with their
    demand withdrawn); while one does, it waits."""
    c = a_cluster()
    c.manager = "silent"
    c.nodes["n2"] = msgspec.structs.replace(c.nodes["n1"], name="n2")
    demand = {"3g.20gb": 1}
    h = Harness(c, demand=lambda: demand)
    await started(h)
    await h.engine.advance_all()
    assert (await h.wf()).step == "isolating"
    other = workflow_for(mig.NodePlan("n2", MODEL, False, a_plan().plan), c.pods, h.clock())
    adds = sorted(
        p for p, n in other.data.expected.items() if n > dict(c.nodes["n2"].mig).get(p, 0)
    )
    assert adds  # not vacuous: the plan adds profiles the node has not
    demand.clear()
    demand.update(dict.fromkeys(adds, 1))
    assert await h.engine.start(other)
    for _ in range(5):
        await h.engine.advance_all()
        h.clock.t += 1.0
    waiting = await h.engine.get(other.id)
    assert waiting is not None
    assert waiting.step == "acquiring"  # its demand is there: it waits for the slot
    demand.clear()  # the pods were bound elsewhere, or deleted
    h.clock.t += 60.0
    await h.engine.advance_all()
    gone = await h.engine.get(other.id)
    assert gone is not None
    assert gone.step == "abandoned"
    mine = of_kind(gone, MigData)
    assert mine is not None
    assert mine.data.reason == (
        f"no pending pod asks for {', '.join(adds)} any more: the demand it served is gone"
    )
    assert not [a for a in c.actions if "n2" in a]


@pytest.mark.anyio
@pytest.mark.parametrize("manager", ["success", "fail"])
@pytest.mark.parametrize("kill_at", range(7))
async def test_killed_after_any_action_resumes(manager: str, kill_at: int) -> None:
    """Killed right after the n-th action, before the step that did it was persisted; then
    restarted: converges, one eviction, node restored."""
    c = a_cluster()
    c.manager, c.kill_at = manager, kill_at
    h = Harness(c)
    await started(h)
    wf = await h.run()
    assert c.kill_at is None or kill_at >= len(c.actions)  # the kill happened, if it could
    assert wf.result.startswith("succeeded" if manager == "success" else "rolled_back"), wf
    assert c.evictions == ["ns/b"]
    assert_restored(c)
    want = wf.data.config if manager == "success" else "all-1g.5gb"
    assert c.nodes["n1"].mig_config == want


@pytest.mark.anyio
@pytest.mark.parametrize("manager", ["success", "fail", "silent"])
async def test_restart_at_every_step_boundary(manager: str) -> None:
    c = a_cluster()
    c.manager = manager
    h = Harness(c)
    await started(h)
    seen_steps: list[str] = []
    for _ in range(200):
        await h.engine.advance_all()
        h.engine = h.new_engine()  # persisted, then the controller stops and a new one starts
        wf = await h.wf()
        if not seen_steps or seen_steps[-1] != wf.step:
            seen_steps.append(wf.step)
        if wf.finished:
            break
        c.settle()
        h.clock.t += 1.0
    assert wf.finished
    assert c.evictions == ["ns/b"]
    assert_restored(c)
    assert seen_steps[:4] == ["isolating", "evicting", "publishing", "waiting"]
    assert seen_steps[-1] == ("done" if manager == "success" else "failed")
    if manager != "success":
        assert "rolling-back" in seen_steps
        assert "confirming-rollback" in seen_steps
        assert c.nodes["n1"].mig_config == "all-1g.5gb"


@pytest.mark.anyio
async def test_the_node_stays_isolated_until_the_rollback_is_applied() -> None:
    c = a_cluster()
    c.manager = "fail"
    h = Harness(c)
    await started(h)
    states = []
    for _ in range(200):
        await h.engine.advance_all()
        wf = await h.wf()
        n = c.nodes["n1"]
        states.append((wf.step, n.mig_config, n.mig_config_state, n.has_taint(TAINT_KEY)))
        if wf.finished:
            break
        c.settle()
        h.clock.t += 1.0
    assert wf.result.startswith("rolled_back"), wf
    # the taint comes off only after mig-manager reported the previous config applied
    tainted = next(i for i, s in enumerate(states) if s[3])
    untainted = next(i for i in range(tainted, len(states)) if not states[i][3])
    assert states[untainted][0] == "failed", states
    assert states[untainted - 1][:3] == ("restoring", "all-1g.5gb", "success"), states
    assert any(s[0] == "confirming-rollback" and s[2] == "pending" for s in states), states
    assert_restored(c)


@pytest.mark.anyio
async def test_a_rollback_that_fails_too_restores_the_node_as_failed() -> None:
    c = a_cluster()
    c.manager = "fail-all"
    h = Harness(c)
    await started(h)
    wf = await h.run()
    assert wf.step == "failed", wf
    assert wf.result.startswith("failed: mig-manager: failed; rollback to all-1g.5gb failed"), wf
    assert c.nodes["n1"].mig_config == "all-1g.5gb"
    assert_restored(c)
    assert (h.count("rolled_back"), h.count("failed")) == (0, 1)


@pytest.mark.anyio
async def test_api_errors_retry_then_restore() -> None:
    """An actuator that keeps failing while labelling: the workflow gives up on the change, rolls
    back and restores the node (errors are retried with backoff, never left tainted)."""
    c = a_cluster()
    h = Harness(c)
    real = c.label_node
    calls = {"n": 0}

    async def broken(node: str, labels: Mapping[str, str | None]) -> None:
        calls["n"] += 1
        if labels.get(mig.MIG_CONFIG_LABEL) != "all-1g.5gb":
            raise RuntimeError("apiserver unavailable")
        await real(node, labels)

    c.label_node = broken  # type: ignore[method-assign]
    await started(h)
    for _ in range(400):
        await h.engine.advance_all()
        wf = await h.wf()
        if wf.finished:
            break
        c.settle()
        h.clock.t += 10.0
    assert wf.finished, wf
    assert wf.result.startswith("rolled_back"), wf
    assert_restored(c)
    assert calls["n"] >= mig_reconfig.workflow_kind().max_errors


def test_expected_capacity_and_workflow_data() -> None:
    p = a_plan()
    wf = workflow_for(p, {}, 0.0)
    assert wf.data.expected == {"1g.5gb": 7, "3g.20gb": 2}
    assert wf.data.pods == (mig_reconfig.MigPod("ns", "b", ""),)
    assert wf.data.config == mig.config_name(mig.mig_parted_entries(p.plan))
    assert [e.to_config() for e in wf.data.entries] == mig.mig_parted_entries(p.plan)
    assert expected_capacity(
        [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}], gpus=2
    ) == {"1g.5gb": 14}


# ---- the MIG loop --------------------------------------------------------------------------------


def loop_setup(c: FakeMigCluster) -> tuple[Harness, MigLoop, ClusterCache]:
    h = Harness(c)
    cache = ClusterCache()
    loop = MigLoop(cache, CacheModels(cache), h.engine, h.gate, h.metrics, "c")
    return h, loop, cache


def sync(cache: ClusterCache, c: FakeMigCluster) -> None:
    cache.replace("Node", list(c.nodes.values()))
    cache.replace("Pod", list(c.pods.values()))


def blocked_cluster() -> FakeMigCluster:
    """`a_cluster` where only free slices change: ns/b gone, two pending 3g.20gb pods."""
    c = a_cluster()
    del c.pods["ns/b"]
    for i in range(2):
        c.pods[f"ns/big{i}"] = PodRecord(
            "ns", f"big{i}", uid=f"ub{i}", mig=(("3g.20gb", 1),), unschedulable=True
        )
    return c


@pytest.mark.anyio
async def test_loop_starts_a_reconfiguration_for_blocked_mig_pods() -> None:
    c = blocked_cluster()
    h, loop, cache = loop_setup(c)
    sync(cache, c)
    assert pending_demand(cache) == {"3g.20gb": 2}
    await loop.tick(leader=False)
    assert len(loop.last_plans) == 1
    assert c.actions == []
    assert await h.store.list() == {}  # followers plan, never start
    for _ in range(40):
        sync(cache, c)
        await loop.tick(leader=True)
        c.settle()
        h.clock.t += 1.0
    wfs = [decode(r.data, builtin_registry()) for r in (await h.store.list()).values()]
    assert [(w.kind, w.step) for w in wfs] == [(KIND, "done")]
    assert c.evictions == []  # max_used_destroyed=0: only free slices
    assert dict(c.nodes["n1"].mig) == {"1g.5gb": 7, "3g.20gb": 2}
    assert_restored(c)


@pytest.mark.anyio
async def test_loop_plans_in_a_worker_thread_on_inputs_taken_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The round runs in a worker thread while the event loop goes on; events that arrive in
    the meantime (here: every node and pod gone) do not change what it plans, and `tick`
    returns only once the round is done."""
    c = blocked_cluster()
    h, loop, cache = loop_setup(c)
    sync(cache, c)
    want = mig_loop.plan_nodes(**mig_loop.round_inputs(cache, loop.models, (), loop.options))
    assert len(want) == 1
    started, changed = threading.Event(), threading.Event()
    threads: list[int] = []
    real = mig_loop.plan_nodes

    def planning(**inputs: Any) -> list[mig.NodePlan]:
        threads.append(threading.get_ident())
        started.set()
        assert changed.wait(10)  # the loop runs on while the round waits here
        return real(**inputs)

    monkeypatch.setattr(mig_loop, "plan_nodes", planning)

    async def events_meanwhile() -> None:
        assert await anyio.to_thread.run_sync(started.wait, 10)
        cache.replace("Pod", [])
        cache.replace("Node", [])
        changed.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(events_meanwhile)
        await loop.tick(leader=False)
        assert changed.is_set()
    assert len(threads) == 1
    assert threads[0] != threading.get_ident()
    assert [(p.node, p.plan) for p in loop.last_plans] == [(p.node, p.plan) for p in want]
    assert h.metrics.workflow.plan_duration.labels("c", "mig")._value.get() > 0


@pytest.mark.anyio
@pytest.mark.parametrize(("holdoff", "starts"), [(600.0, False), (5.0, True)])
async def test_loop_holds_a_node_off_after_its_last_reconfiguration(
    holdoff: float, starts: bool
) -> None:
    c = blocked_cluster()
    h = Harness(c)
    cache = ClusterCache()
    loop = MigLoop(
        cache,
        CacheModels(cache),
        h.engine,
        h.gate,
        h.metrics,
        "c",
        options=MigOptions(node_holdoff_seconds=holdoff),
    )
    sync(cache, c)
    # n1's previous reconfiguration ended 10 s ago
    old = workflow_for(a_plan(), {}, h.clock.t - 60)
    done = msgspec.structs.replace(
        old, id="mig-old", node="n1", step="done", updated=h.clock.t - 10
    )
    await h.store.put(done.id, msgspec.json.encode(done), 0)
    await loop.tick(leader=True)
    started = [w for w in (await h.store.list()) if w != done.id]
    assert bool(started) == starts, started
    assert bool(loop.last_plans) == starts


def test_a_repeated_reconfiguration_gets_a_new_id() -> None:
    assert fresh_id("mig-reconfigure-n1-pyctl-ab", set()) == "mig-reconfigure-n1-pyctl-ab"
    taken = {"mig-reconfigure-n1-pyctl-ab", "mig-reconfigure-n1-pyctl-ab-2"}
    assert fresh_id("mig-reconfigure-n1-pyctl-ab", taken) == "mig-reconfigure-n1-pyctl-ab-3"


@pytest.mark.anyio
async def test_loop_clears_an_orphaned_taint() -> None:
    c = a_cluster()
    await c.taint("n1", TAINT_KEY)
    _, loop, cache = loop_setup(c)
    sync(cache, c)
    await loop.tick(leader=True)
    assert_restored(c)
