"""Input isolation in the controller: a pod the core cannot model, a node that cannot be
translated, an object that does not decode, and a tenant flooding pending pods are each left out,
counted and reported, and never change what happens to the good items (the workload M, every
other node's score, the compaction plan, the workflows already running)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import anyio
import msgspec
import pytest
from msgspec.structs import replace

from pyctl.app.config import ConfigError, load_config
from pyctl.app.wiring import workload_scope
from pyctl.cluster.nodefit import static_fit
from pyctl.cluster.records import (
    Constraints,
    Event,
    NrtRecord,
    ObjectRef,
    PodRecord,
    Record,
    Taint,
    Toleration,
)
from pyctl.cluster.selectors import parse_selector
from pyctl.controller.cache import ClusterCache
from pyctl.controller.controller import Controller
from pyctl.controller.ignored import EVENT_REASON, IgnoredObjects
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.workload import WorkloadScope, cap_weights
from pyctl.metrics import Metrics
from pyctl.model import Shape
from pyctl.state.memory import MemoryStore
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.compaction import CompactionData
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.engine import Engine, Workflow
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry
from pyctl.workflows.rescue import CompactionContext, RescueData, RescueOptions
from tests.unit.test_compaction import fragmented

CLUSTER = "t"

HOSTILE = {
    "huge": PodRecord("team", "huge", "uid-huge", gpus=1 << 32, unschedulable=True),
    "gpu+mig": PodRecord(
        "team", "both", "uid-both", gpus=2, mig=(("1g.10gb", 1),), unschedulable=True
    ),
    "unknown-mig": PodRecord("team", "odd", "uid-odd", mig=(("9g.1tb", 1),), unschedulable=True),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def ignored(m: Metrics, kind: str, reason: str) -> float:
    v = m.registry.get_sample_value(
        "pyctl_ignored_objects_total", {"cluster": CLUSTER, "kind": kind, "reason": reason}
    )
    return float(v or 0.0)


def cluster(extra: Iterable[PodRecord] = ()) -> ClusterCache:
    nodes, nrts, pods = fragmented()
    c = ClusterCache()
    records: list[Record] = [*nodes.values(), *nrts.values(), *pods, *extra]
    events = [Event("ADDED", r) for r in records]
    c.apply(events)
    return c


def reconciled(cache: ClusterCache, scope: WorkloadScope | None = None) -> Reconciler:
    r = Reconciler(cache, Metrics(), CLUSTER, scope=scope)
    r.refresh_workload()
    for n in cache.nodes:
        r.reconcile(n)
    return r


@pytest.mark.parametrize("shape", ["gpu+mig", "unknown-mig"])
def test_a_pod_the_core_cannot_model_changes_no_score(shape: str) -> None:
    good = reconciled(cluster())
    hostile = HOSTILE[shape]
    r = reconciled(cluster([hostile]))
    assert r.workload == good.workload  # the pod is not part of M
    assert set(r.scores) == set(good.scores) == {"a", "b"}  # every node still scored
    assert r.scores == good.scores
    assert not r.bad_nodes
    s = r.summary()  # the pending analysis skips it too (it used to raise)
    assert s.nodes == 2
    assert ignored(r.metrics, "Pod", "shape_rejected") == 1
    assert r.ignored.queued_events == 1
    r.refresh_workload()
    r.summary()  # seen again: counted and told once
    assert ignored(r.metrics, "Pod", "shape_rejected") == 1
    assert r.ignored.queued_events == 1


def test_the_event_names_the_mistake_and_is_sent_once_at_a_bounded_rate() -> None:
    sent: list[tuple[ObjectRef, str, str]] = []

    async def send(ref: ObjectRef, reason: str, message: str) -> None:
        sent.append((ref, reason, message))

    tracker = IgnoredObjects(Metrics(), CLUSTER, events_per_second=1.0, burst=2)
    r = reconciled(cluster([HOSTILE["gpu+mig"]]))
    r.ignored = tracker
    r.refresh_workload()
    for i in range(5):
        tracker.report("Pod", "out_of_bounds", "x", ObjectRef("Pod", "team", f"p{i}", f"u{i}"))
    tracker.report("Pod", "out_of_bounds", "x", ObjectRef("Pod", "team", "p0", "u0"))  # again

    async def main() -> None:
        assert await tracker.send_events(send, 100.0) == 2  # the burst
        assert await tracker.send_events(send, 100.5) == 0
        assert await tracker.send_events(send, 101.5) == 1  # 1 per second
        assert await tracker.send_events(send, 200.0) == 2  # never more than the burst
        assert await tracker.send_events(send, 300.0) == 1

    anyio.run(main)
    assert len(sent) == 6  # one per pod uid
    ref, reason, message = sent[0]
    assert ref == ObjectRef("Pod", "team", "both", "uid-both")
    assert reason == EVENT_REASON
    assert message == (
        "pyctl ignores this pod: requests both nvidia.com/gpu and a MIG profile "
        "(nvidia.com/mig-1g.10gb)"
    )


def test_an_untranslatable_node_touches_no_other_node() -> None:
    good = reconciled(cluster())
    bad_nrt = NrtRecord("a", policy="bogus-policy", zones=fragmented()[1]["a"].zones)
    c = cluster()
    c.apply([Event("MODIFIED", bad_nrt)])
    r = reconciled(c)
    assert set(r.scores) == {"b"}
    assert r.scores["b"] == good.scores["b"]
    assert "unknown Topology Manager policy" in r.bad_nodes["a"]
    assert ignored(r.metrics, "Node", "untranslatable") == 1
    c.apply([Event("MODIFIED", fragmented()[1]["a"])])  # fixed: scored again
    r.reconcile("a")
    assert r.scores["a"] == good.scores["a"]
    assert not r.ignored.is_ignored("Node", "a")


def test_workload_scope_namespaces_selector_and_cap() -> None:
    tenant = [
        PodRecord("tenant", f"t{i}", gpus=1, cpu_milli=7000, labels=(("team", "x"),))
        for i in range(1000)
    ]
    system = [PodRecord("kube-system", f"s{i}", gpus=8, cpu_milli=1000) for i in range(50)]
    c = cluster([*tenant, *system])
    r = reconciled(c, WorkloadScope(excluded_namespaces=frozenset({"kube-system"})))
    shapes = {(s.gpus, s.cpu_milli): s.weight for s in r.workload.shapes}
    assert (8, 1000) not in shapes  # kube-system is left out
    assert shapes[(1, 7000)] == pytest.approx(1.0)  # one shape only: it is M
    r = reconciled(c, WorkloadScope(max_shape_weight=0.5))
    weights = {(s.gpus, s.cpu_milli): s.weight for s in r.workload.shapes}
    assert weights[(1, 7000)] == pytest.approx(0.5)  # 1000 of 1056 pods, capped at half
    assert sum(weights.values()) == pytest.approx(1.0)
    sel = WorkloadScope(selector=parse_selector("team!=x"), max_shape_weight=0.5)
    r = reconciled(c, sel)
    assert (1, 7000) not in {(s.gpus, s.cpu_milli) for s in r.workload.shapes}
    only = WorkloadScope(namespaces=frozenset({"tenant"}))
    assert {(s.gpus, s.cpu_milli) for s in reconciled(c, only).workload.shapes} == {(1, 7000)}


@pytest.mark.parametrize(
    ("weights", "cap", "want"),
    [
        ((0.9, 0.05, 0.05), 0.5, (0.5, 0.25, 0.25)),
        ((0.6, 0.3, 0.1), 0.5, (0.5, 0.375, 0.125)),
        ((0.7, 0.3), 0.5, (0.5, 0.5)),
        ((1.0,), 0.5, (1.0,)),
        ((3.0, 1.0), 1.0, (0.75, 0.25)),
        ((0.45, 0.45, 0.05, 0.05), 0.4, (0.4, 0.4, 0.1, 0.1)),
    ],
)
def test_cap_weights(weights: tuple[float, ...], cap: float, want: tuple[float, ...]) -> None:
    got = cap_weights([Shape(gpus=1, gpu_milli=1000, weight=w) for w in weights], cap)
    assert [s.weight for s in got] == pytest.approx(list(want))


def test_decode_errors_are_ignored_objects_and_drop_nothing_else() -> None:
    ctl = Controller(CLUSTER, None, MemoryStore(CLUSTER))  # type: ignore[arg-type]
    ref = ObjectRef("Pod", "team", "huge", "uid-huge")
    for _ in range(3):  # the same object, three watch events
        ctl.decode_error("Pod", "pod team/huge nvidia.com/gpu is 4294967296", ref=ref)
    ctl.decode_error("Node", "Node: broken JSON", reason="malformed")
    m = ctl.metrics
    assert ignored(m, "Pod", "malformed") == 1
    assert ignored(m, "Node", "malformed") == 1
    v = m.registry.get_sample_value(
        "pyctl_decode_errors_total", {"cluster": CLUSTER, "kind": "Pod"}
    )
    assert v == 3
    assert ctl.ignored.queued_events == 1


def test_pyctl_taints_are_exported_from_the_nodes() -> None:
    c = cluster()
    r = reconciled(c)
    key = "pyctl.io/mig-reconfiguration"

    def taint() -> float | None:
        return r.metrics.registry.get_sample_value(
            "pyctl_node_taint", {"cluster": CLUSTER, "node": "a", "key": key}
        )

    assert taint() is None
    tainted = replace(c.nodes["a"], taints=(Taint(key, "", "NoSchedule"), Taint("other", "")))
    c.apply([Event("MODIFIED", tainted)])
    r.reconcile("a")
    assert taint() == 1
    assert (
        r.metrics.registry.get_sample_value(
            "pyctl_node_taint", {"cluster": CLUSTER, "node": "a", "key": "other"}
        )
        is None
    )  # only pyctl's own
    c.apply([Event("DELETED", tainted)])
    r.reconcile("a")
    assert taint() is None


#: a 4-GPU replica no node has room for (the fragmented cluster can free a zone for it)
PENDING_FOUR = PodRecord(
    "serving",
    "big",
    "uid-big",
    cpu_milli=4000,
    gpus=4,
    unschedulable=True,
    owner_kind="ReplicaSet",
    owner_name="big",
)


def compactor(
    cache: ClusterCache,
    r: Reconciler,
    rescue: RescueOptions | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[Compactor, MemoryWorkflowStore]:
    """An observing compactor on `cache`'s pods, its rescues set by `rescue`, its time `clock`."""
    from pyctl.cluster.source import NullActuator
    from pyctl.state.ratelimit import MemoryRateLimiter, SafetyLimits

    gate = Gate(
        "observe",
        lambda: True,
        MemoryRateLimiter(),
        SafetyLimits(),
        NullActuator(),
        r.metrics,
        CLUSTER,
    )
    store = MemoryWorkflowStore()
    rescue = rescue or RescueOptions()
    ctx = CompactionContext(gate, lambda ns, n: cache.pods.get(f"{ns}/{n}"), clock, rescue)
    engine = Engine(store, ctx, builtin_registry())
    return Compactor(
        cache, r, engine, r.metrics, CLUSTER, "observe", max_moves=3, rescue_options=rescue
    ), store


def test_compaction_plans_around_hostile_pods() -> None:
    four = PENDING_FOUR
    good_cache = cluster([four])
    good = reconciled(good_cache)
    want = Compactor.plan(compactor(good_cache, good)[0])
    assert want.moves  # the fragmented cluster: a 4-GPU zone can be freed
    # a bound pod whose shape the core cannot model stays (its usage counts), and pending
    # hostile pods change nothing
    bound = replace(
        HOSTILE["gpu+mig"],
        name="bound",
        uid="uid-bound",
        node="b",
        phase="Running",
        unschedulable=False,
        gpus=0,
        mig=(("9g.1tb", 1),),
        owner_kind="ReplicaSet",
        owner_name="odd",
    )
    c = cluster([four, *HOSTILE.values(), bound])
    c.apply([Event("DELETED", PodRecord("team", "huge"))])  # out of bounds: never decoded
    r = reconciled(c)
    got = Compactor.plan(compactor(c, r)[0])
    assert [m.pod for m in got.moves] == [m.pod for m in want.moves]
    assert "team/bound" not in {m.pod for m in got.moves}


def test_pending_pods_outside_the_scope_or_unmodellable_are_never_rescued() -> None:
    """Only pending pods in the workload's scope, of a shape the core can model, are pods the
    planner makes room for: a tenant's pod pyctl ignores, or one in kube-system, never makes it
    evict."""
    inside = PodRecord("serving", "in", "u-in", cpu_milli=100, gpus=1, unschedulable=True)
    system = PodRecord("kube-system", "sys", "u-sys", cpu_milli=100, gpus=1, unschedulable=True)
    c = cluster([inside, system, *HOSTILE.values()])
    scope = WorkloadScope(excluded_namespaces=frozenset({"kube-system"}))  # the config's default
    cp, _ = compactor(c, reconciled(c, scope))
    assert [p.key for p in cp.pending()] == ["serving/in"]
    r = reconciled(c, WorkloadScope(namespaces=frozenset({"other"})))
    assert compactor(c, r)[0].pending() == []


@pytest.mark.anyio
async def test_a_failing_plan_never_stops_the_workflows() -> None:
    c = cluster()
    r = reconciled(c)
    cp, _store = compactor(c, r)
    wf = Workflow(
        id="w1",
        kind="compaction",
        node="a",
        step="evicting",
        created=0.0,
        updated=0.0,
        data=CompactionData("serving", "a0", "", ""),
    )
    await cp.engine.start(wf)

    def boom(inputs: object) -> None:
        raise RuntimeError("planner bug")

    # the round the compactor runs (in a worker thread) fails
    cp._plan = boom  # type: ignore[assignment,method-assign]
    await cp.tick(True)
    got = await cp.engine.get("w1")
    assert got is not None
    assert got.finished  # advanced (a dry run: the pod's uid does not match, already gone)
    assert (
        r.metrics.registry.get_sample_value("pyctl_reconcile_errors_total", {"cluster": CLUSTER})
        == 1
    )


@pytest.mark.anyio
async def test_an_abandoned_move_is_not_planned_again_and_another_is() -> None:
    four = PENDING_FOUR
    c = cluster([four])
    r = reconciled(c)
    cp, store = compactor(c, r)
    first = cp.plan().moves[0]
    ns, name = first.pod.split("/")
    denied = Workflow(
        id="compaction-denied",
        kind="compaction",
        node=first.from_node,
        step="abandoned",
        created=0.0,
        updated=time.time(),
        data=CompactionData(ns, name, ""),
        result="admission refused the eviction of serving/x (403)",
    )
    await store.put(denied.id, msgspec.json.encode(denied), 0)
    await cp.tick(False)
    plan = cp.last_plan
    assert plan is not None
    assert first.pod not in {m.pod for m in plan.moves}
    assert plan.refused[first.pod].startswith("its last move was abandoned: admission refused")
    assert plan.moves  # the next best move instead


@pytest.mark.anyio
async def test_a_pod_a_rescue_could_not_evict_is_left_where_it_is() -> None:
    """A rescue that could not evict one of its pods (denied by admission) records which: the
    next plans make room without that pod."""
    four = PENDING_FOUR
    c = cluster([four])
    cp, store = compactor(c, reconciled(c))
    first = cp.plan().moves[0]
    denied = Workflow(
        id="rescue-denied",
        kind="rescue",
        node=first.from_node,
        step="abandoned",
        created=0.0,
        updated=time.time(),
        data=RescueData("serving", "big", "uid-big", (), 0.0, refused=first.pod),
        result=f"abandoned: cannot evict {first.pod}: admission refused the eviction (422)",
    )
    await store.put(denied.id, msgspec.json.encode(denied), 0)
    await cp.tick(False)
    plan = cp.last_plan
    assert plan is not None
    assert first.pod not in {m.pod for m in plan.moves}
    assert plan.refused[first.pod].startswith("a rescue could not evict it: abandoned: cannot")


def test_the_workload_section_is_checked_and_wired() -> None:
    with pytest.raises(ConfigError, match="workload_label_selector"):
        load_config(env={}, flags={"workload_label_selector": "team in (a"})
    cfg = load_config(
        env={"PYCTL_WORKLOAD_NAMESPACES": "a,b", "PYCTL_WORKLOAD_LABEL_SELECTOR": "tier!=batch"},
        flags={"workload_max_shape_weight": 0.4},
    )
    scope = workload_scope(cfg)
    assert scope.namespaces == frozenset({"a", "b"})
    assert scope.excluded_namespaces == frozenset({"kube-system"})  # the default
    assert scope.max_shape_weight == 0.4
    assert scope.admits(PodRecord("a", "p", labels=(("tier", "web"),)))
    assert not scope.admits(PodRecord("a", "p", labels=(("tier", "batch"),)))
    assert not scope.admits(PodRecord("c", "p"))
    assert not workload_scope(load_config(env={})).admits(PodRecord("kube-system", "p"))


def test_no_move_toward_a_node_the_scheduler_would_not_use() -> None:
    """A move whose target is cordoned, or tainted against the pod, would only recreate the pod
    where it was, to be planned and evicted again (an eviction loop): it is not made."""
    four = PENDING_FOUR
    c = cluster([four])
    r = reconciled(c)
    cp, _ = compactor(c, r)
    first = cp.plan().moves[0]
    target = c.nodes[first.to_node]
    for changed, why in (
        (replace(target, unschedulable=True), "cordoned"),
        (replace(target, taints=(Taint("gpu", "x", "NoSchedule"),)), "taint gpu:NoSchedule"),
    ):
        c.apply([Event("MODIFIED", changed)])
        plan = cp.plan()
        assert first.to_node not in {m.to_node for m in plan.moves}, why
        assert static_fit(c.pods[first.pod], c.nodes[first.to_node]) is not None
    # a taint the pod tolerates is no reason
    c.apply([Event("MODIFIED", replace(target, taints=(Taint("gpu", "x", "NoSchedule"),)))])
    pod = c.pods[first.pod]
    tolerant = replace(
        pod, constraints=Constraints(tolerations=(Toleration("gpu", "Exists", "", "NoSchedule"),))
    )
    c.apply([Event("MODIFIED", tolerant)])
    assert static_fit(tolerant, c.nodes[first.to_node]) is None
