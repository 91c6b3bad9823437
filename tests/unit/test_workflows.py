"""Workflows: persisted, idempotent steps behind the gate; a crash between acting and
persisting never repeats an eviction; two replicas never both act; limits and modes hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import anyio
import msgspec
import pytest

from pyctl.cluster.records import PodRecord
from pyctl.cluster.source import ActuatorError, EvictionOutcome
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import BucketLimit, MemoryRateLimiter, SafetyLimits
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.compaction import CompactionData
from pyctl.workflows.engine import Context, Engine, Workflow, decode
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from tests.limits import global_only


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class FakeCluster:
    """Pods the actuator can evict (standing in for the API server in unit tests); the MIG
    mutations are not used here (no-ops); DeviceTaintRules are kept as the API server keeps
    them (create and delete idempotent, by metadata.name)."""

    pods: dict[str, PodRecord] = field(default_factory=dict)
    evictions: list[str] = field(default_factory=list)
    refuse: bool = False
    retry_after: float | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    #: each Event's (reason, message, warning)
    told: list[tuple[str, str, bool]] = field(default_factory=list)
    #: the nodes carrying a taint pyctl put there
    tainted: set[str] = field(default_factory=set)
    device_rules: dict[str, dict[str, object]] = field(default_factory=dict)
    #: "namespace/pod" -> the error status its evictions are answered with
    fail: dict[str, int] = field(default_factory=dict)
    #: "namespace/pod" -> an exception its evictions raise without an answer (a timeout)
    lost: dict[str, Exception] = field(default_factory=dict)
    #: when set, an eviction waits for it before it is answered
    hold: anyio.Event | None = None
    tried: list[str] = field(default_factory=list)
    #: set once an eviction has been asked for
    asked: anyio.Event = field(default_factory=anyio.Event)

    async def cordon(self, node: str, on: bool) -> None: ...

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        key = f"{namespace}/{pod}"
        self.tried.append(key)
        self.asked.set()
        if self.hold is not None:
            await self.hold.wait()
        if key in self.fail:
            raise ActuatorError(self.fail[key], f"{self.fail[key]} InternalError")
        if key in self.lost:
            raise self.lost[key]
        if self.refuse:
            return EvictionOutcome(False, 429, "TooManyRequests", "no", self.retry_after, "pdb")
        self.evictions.append(f"{namespace}/{pod}")
        self.pods.pop(f"{namespace}/{pod}", None)
        return EvictionOutcome(True, 201)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None: ...

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
        self.events.append((f"{namespace}/{name}", uid))
        self.told.append((reason, message, warning))

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        changed = (node in self.tainted) != on
        (self.tainted.add if on else self.tainted.discard)(node)
        return changed

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        pass

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


LOOSE = global_only(100, 100.0)


def setup(
    mode: str = "enforce", limits: SafetyLimits = LOOSE, store: MemoryWorkflowStore | None = None
) -> tuple[FakeCluster, Engine, MemoryWorkflowStore]:
    cluster = FakeCluster(
        {f"ns/p{i}": PodRecord("ns", f"p{i}", uid=f"u{i}", node="n1") for i in range(3)}
    )
    gate = Gate(mode, lambda: True, MemoryRateLimiter(), limits, cluster, Metrics(), "c")
    store = store or MemoryWorkflowStore()
    ctx = Context(gate, lambda ns, name: cluster.pods.get(f"{ns}/{name}"))
    return cluster, Engine(store, ctx, builtin_registry()), store


def move(i: int) -> Workflow[CompactionData]:
    data = CompactionData("ns", f"p{i}", f"u{i}", "ReplicaSet/x")
    return Workflow(f"compaction-u{i}", "compaction", "n1", "evicting", created=0.0, data=data)


@pytest.mark.anyio
async def test_evicts_once_and_finishes() -> None:
    cluster, engine, _ = setup()
    assert await engine.start(move(0))
    assert not await engine.start(move(0))  # idempotent start
    await engine.advance_all()
    await engine.advance_all()
    assert cluster.evictions == ["ns/p0"]
    wf = await engine.get("compaction-u0")
    assert wf is not None
    assert (wf.step, wf.result) == ("done", "evicted")


@pytest.mark.anyio
async def test_a_crash_after_acting_does_not_repeat_the_eviction() -> None:
    cluster, engine, store = setup()
    await engine.start(move(1))
    # the controller evicts and is killed before it writes the next step
    await cluster.try_evict("ns", "p1")
    # a new controller (or leader) resumes from the store
    _, engine2, _ = setup(store=store)
    engine2.ctx = Context(engine.ctx.gate, lambda ns, name: cluster.pods.get(f"{ns}/{name}"))
    await engine2.advance_all()
    assert cluster.evictions == ["ns/p1"]
    wf = await engine2.get("compaction-u1")
    assert wf is not None
    assert (wf.step, wf.result) == ("done", "pod already gone")


@pytest.mark.anyio
async def test_two_replicas_never_both_act() -> None:
    cluster, engine_a, store = setup()
    _, engine_b, _ = setup(store=store)
    engine_b.ctx = Context(engine_a.ctx.gate, engine_a.ctx.pod)
    for i in range(3):
        await engine_a.start(move(i))
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(engine_a.advance_all)
            tg.start_soon(engine_b.advance_all)
    assert sorted(cluster.evictions) == ["ns/p0", "ns/p1", "ns/p2"]


async def claimed(store: MemoryWorkflowStore, wid: str, by: str, until: float) -> None:
    """Write the workflow back as claimed (`by` a process, until `until`)."""
    rec = (await store.list())[wid]
    wf = decode(rec.data, builtin_registry())
    wf = msgspec.structs.replace(wf, claimed_until=until, claimed_by=by)
    await store.put(wid, msgspec.json.encode(wf), rec.version)


@pytest.mark.anyio
@pytest.mark.parametrize("by", ["a-killed-process", ""])
async def test_the_leader_takes_over_a_step_another_process_claimed(by: str) -> None:
    """A claim of another process (one that led and no longer does: killed or partitioned) or
    of a record written before claims were signed is taken over at once, not after its 60 s;
    the step is idempotent, so the eviction is made once."""
    cluster, engine, store = setup()
    await engine.start(move(0))
    await claimed(store, "compaction-u0", by, engine.now() + 60.0)
    await engine.advance_all()
    assert cluster.evictions == ["ns/p0"]
    wf = await engine.get("compaction-u0")
    assert wf is not None
    assert (wf.step, wf.claimed_by, wf.claimed_until) == ("done", "", 0.0)


@pytest.mark.anyio
async def test_its_own_claim_is_left_until_its_deadline() -> None:
    cluster, engine, store = setup()
    await engine.start(move(0))
    await claimed(store, "compaction-u0", engine.instance, engine.now() + 60.0)
    await engine.advance_all()
    assert cluster.evictions == []
    await claimed(store, "compaction-u0", engine.instance, engine.now() - 1.0)
    await engine.advance_all()
    assert cluster.evictions == ["ns/p0"]


@pytest.mark.anyio
async def test_rate_limits_hold_actions_back() -> None:
    tight = global_only(1, 0.001)
    cluster, engine, _ = setup(limits=tight)
    for i in range(3):
        await engine.start(move(i))
    counts = await engine.advance_all()
    assert len(cluster.evictions) == 1
    assert counts[("compaction", "evicting")] == 2
    wf = await engine.get("compaction-u1")
    assert wf is not None
    assert wf.not_before > 0
    assert "limit" in wf.result


@pytest.mark.anyio
async def test_a_pdb_refusal_is_retried_later_never_worked_around() -> None:
    cluster, engine, _ = setup()
    cluster.refuse = True
    await engine.start(move(2))
    await engine.advance_all()
    wf = await engine.get("compaction-u2")
    assert wf is not None
    assert wf.step == "evicting"
    assert "PodDisruptionBudget pdb refused the eviction of ns/p2 (429)" in wf.result
    assert cluster.evictions == []


@pytest.mark.anyio
@pytest.mark.parametrize(("asked", "waits"), [(None, 30.0), (7.0, 7.0), (0.0, 1.0), (1e6, 300.0)])
async def test_a_refusal_waits_as_long_as_the_api_server_asks(
    asked: float | None, waits: float
) -> None:
    cluster, engine, _ = setup()
    now = 1000.0
    engine.ctx = Context(engine.ctx.gate, engine.ctx.pod, clock=lambda: now)
    cluster.refuse, cluster.retry_after = True, asked
    await engine.start(move(1))
    await engine.advance_all()
    wf = await engine.get("compaction-u1")
    assert wf is not None
    assert wf.not_before == pytest.approx(now + waits)


@pytest.mark.anyio
async def test_the_eviction_event_names_the_pod_uid() -> None:
    cluster, engine, _ = setup()
    await engine.start(move(2))
    await engine.advance_all()
    assert cluster.events == [("ns/p2", "u2")]


@pytest.mark.anyio
async def test_observe_mode_changes_nothing() -> None:
    cluster, engine, _ = setup(mode="observe")
    await engine.start(move(0))
    await engine.advance_all()
    wf = await engine.get("compaction-u0")
    assert wf is not None
    assert wf.step == "dry-run"
    assert cluster.evictions == []


@pytest.mark.anyio
async def test_enforce_on_the_simulated_cluster_evicts_through_the_gate() -> None:
    from pyctl.app.config import Config, SimSection
    from pyctl.app.run import build_sim
    from pyctl.cluster.sim.actuator import SimActuator

    cfg = Config(mode="enforce", sim=SimSection(speed=3000), summary_interval=0.2)
    sim = build_sim(cfg)
    src = sim.source
    await sim.run()
    assert isinstance(sim.workflows.actuator, SimActuator)
    calls = sim.workflows.actuator.calls
    evicted = [args for name, args in calls if name == "evict"]
    assert src.evicted > 0
    assert len(evicted) == len(set(evicted)), "a pod was evicted twice"


# ---- issue 36: failed evictions spent the limits --------------------------------------------

#: one eviction per node and one disruption in all, nothing refilling within a test
ONE_PER_NODE = SafetyLimits(
    global_bucket=BucketLimit(10, 1e-6),
    node_bucket=BucketLimit(1, 1e-6),
    namespace_bucket=None,
    workload_bucket=None,
    node_cooldown_seconds=0,
    disruptions_per_hour=1,
)


def one_node_gate(cluster: FakeCluster, leader: list[bool] | None = None) -> Gate:
    """The gate on `cluster` under `ONE_PER_NODE`; `leader`: the Lease's answers, in turn."""
    answers = iter(leader or [])

    def still_leader() -> bool:
        return next(answers, True)

    limiter = MemoryRateLimiter()
    return Gate("enforce", still_leader, limiter, ONE_PER_NODE, cluster, Metrics(), "c")


def three_pods() -> FakeCluster:
    return FakeCluster(
        {f"ns/p{i}": PodRecord("ns", f"p{i}", uid=f"u{i}", node="n1") for i in range(3)}
    )


async def bound(gate: Gate) -> list[tuple[str, str]]:
    """The limits an eviction off n1 meets now (what a grant drew is given back)."""
    d = await gate.limiter.acquire(ONE_PER_NODE.eviction("n1", "ns", ""))
    if d.receipt is not None:
        assert await gate.limiter.refund(d.receipt)
    return [(b.limit, b.name) for b in d.bound]


@pytest.mark.anyio
@pytest.mark.parametrize("fault", ["500", "503", "429", "lost-the-lease"])
async def test_failed_evictions_spend_no_limits(fault: str) -> None:
    """An eviction that did not happen gives back its node token and its disruption: the
    next eviction on the node is made, and it alone spends them."""
    cluster = three_pods()
    gate = one_node_gate(cluster, leader=[True, False] if fault == "lost-the-lease" else None)
    first = cluster.pods["ns/p0"]
    if fault.isdigit() and fault != "429":
        cluster.fail["ns/p0"] = int(fault)  # the API server answered with an error
        with pytest.raises(ActuatorError):
            await gate.evict(first, "n1")
    else:
        cluster.refuse = fault == "429"  # a PodDisruptionBudget
        r = await gate.evict(first, "n1")
        assert r.outcome == ("refused" if cluster.refuse else "not-leader")
        cluster.refuse = False
    assert await bound(gate) == []
    assert (await gate.evict(cluster.pods["ns/p1"], "n1")).done
    assert cluster.evictions == ["ns/p1"]
    assert await bound(gate) == [("bucket", "node/n1"), ("budget", "disruptions")]
    r = await gate.evict(cluster.pods["ns/p2"], "n1")
    assert (r.outcome, r.reason) == ("rate-limited", "limit bucket binds")


@pytest.mark.anyio
async def test_an_eviction_with_no_answer_keeps_its_charge() -> None:
    """A timeout says nothing about whether the pod was evicted: the limits stay spent."""
    cluster = three_pods()
    gate = one_node_gate(cluster)
    cluster.lost["ns/p0"] = TimeoutError("no answer")
    with pytest.raises(TimeoutError):
        await gate.evict(cluster.pods["ns/p0"], "n1")
    assert await bound(gate) == [("bucket", "node/n1"), ("budget", "disruptions")]


@pytest.mark.anyio
async def test_an_eviction_in_flight_holds_its_limits() -> None:
    """Reserved before the call: while one eviction waits for its answer, another on the same
    node does not pass; when the first fails, the second is made."""
    cluster = three_pods()
    gate = one_node_gate(cluster)
    cluster.hold = anyio.Event()
    cluster.fail["ns/p0"] = 500
    failed: list[BaseException] = []

    async def first() -> None:
        try:
            await gate.evict(cluster.pods["ns/p0"], "n1")
        except ActuatorError as e:
            failed.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await cluster.asked.wait()
        r = await gate.evict(cluster.pods["ns/p1"], "n1")
        assert r.outcome == "rate-limited"
        cluster.hold.set()
    assert len(failed) == 1
    cluster.hold = None
    assert (await gate.evict(cluster.pods["ns/p1"], "n1")).done
