"""The controller's parts: work queue, cache, reconcile, configuration, a whole simulated run."""

from __future__ import annotations

import logging
import urllib.request
from typing import Any

import anyio
import pytest

from pyctl.app.config import ConfigError, load_config
from pyctl.cluster.records import (
    DRA_KINDS,
    FABRIC_KINDS,
    KINDS,
    Event,
    Kind,
    NodeRecord,
    PodRecord,
    Record,
)
from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.cluster.source import EventSink
from pyctl.controller.cache import ClusterCache
from pyctl.controller.controller import Controller
from pyctl.controller.reconcile import SchedulingWindow
from pyctl.controller.workqueue import WorkQueue
from pyctl.serve.health import HealthServer
from pyctl.state.memory import MemoryStore
from pyctl.state.store import StoreUnreachable


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_workqueue_coalesces_and_redoes() -> None:
    q = WorkQueue()
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.coalesced == 4
    k = await q.get()
    assert k == "a"
    q.add("a")  # while processing: redo once after
    q.add("a")
    assert len(q) == 1
    q.done("a")
    assert [await q.get(), await q.get()] == ["b", "a"]
    q.done("b")
    q.done("a")
    assert len(q) == 0


@pytest.mark.anyio
async def test_workqueue_backoff_doubles_until_forget() -> None:
    q = WorkQueue(base_delay=0.001, max_delay=0.004)
    delays = []
    for _ in range(4):
        delays.append(q.backoff("n"))
        await q.add_rate_limited("n")
        assert await q.get() == "n"
        q.done("n")
    assert delays == [0.001, 0.002, 0.004, 0.004]
    q.forget("n")
    assert q.backoff("n") == 0.001
    q.shutdown()
    assert await q.get() is None


def test_cache_tracks_pods_by_node_and_dirty_nodes() -> None:
    c = ClusterCache()
    dirty = c.apply([Event("ADDED", NodeRecord("n1")), Event("ADDED", NodeRecord("n2"))])
    assert dirty == {"n1", "n2"}
    p = PodRecord("ns", "p", node="n1")
    assert c.apply([Event("ADDED", p)]) == {"n1"}
    moved = PodRecord("ns", "p", node="n2")
    assert c.apply([Event("MODIFIED", moved)]) == {"n1", "n2"}
    assert c.pods_on("n1") == []
    assert c.pods_on("n2") == [moved]
    assert c.apply([Event("DELETED", moved)]) == {"n2"}
    # a relist that lost n1 and kept n2 unchanged dirties only n1
    assert c.replace("Node", [NodeRecord("n2")]) == {"n1"}
    assert set(c.nodes) == {"n2"}


def test_scheduling_window() -> None:
    w = SchedulingWindow(seconds=10)
    pending = PodRecord("ns", "a", unschedulable=True)
    w.observe(None, pending, 0)
    w.observe(pending, pending, 1)  # counted once
    w.observe(pending, PodRecord("ns", "a", node="n"), 2)
    w.observe(None, PodRecord("ns", "b", node="n"), 3)
    assert w.ratio(4) == pytest.approx(2 / 3)
    assert w.ratio(20) == 1.0  # all outside the window


def test_config_precedence_and_errors(tmp_path: Any) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("cluster: from-file\nmetrics-port: 9000\nmode: observe\n")
    cfg = load_config(str(f), {"PYCTL_METRICS_PORT": "9100"}, {"mode": "enforce"})
    assert (cfg.cluster, cfg.metrics.port, cfg.mode) == ("from-file", 9100, "enforce")
    f.write_text("colour: blue\n")
    with pytest.raises(ConfigError, match="unknown setting 'colour'"):
        load_config(str(f), {})
    with pytest.raises(
        ConfigError, match=r"config metrics_port \(environment PYCTL_METRICS_PORT\)"
    ):
        load_config(None, {"PYCTL_METRICS_PORT": "ninety"})
    with pytest.raises(ConfigError, match="config mode: 'yolo' is not one of observe, enforce"):
        load_config(None, {}, {"mode": "yolo"})
    with pytest.raises(ConfigError, match="must be a DNS label"):
        load_config(None, {}, {"cluster": "Bad_Name"})
    f.write_text("a: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(f), {})


@pytest.mark.anyio
async def test_simulated_run_end_to_end() -> None:
    sc = inference_day()
    src = SimClusterSource(sc, speed=None)
    store = MemoryStore()
    ctl = Controller("sim", src, store, summary_interval=0.05)
    await ctl.run(until_source_ends=True)
    st = src.stats
    assert st.arrived == len(sc.arrivals) > 500
    assert st.bound > 0
    assert st.unschedulable > 0
    assert ctl.stats.events == st.events
    assert len(ctl.cache.nodes) == len(sc.nodes)
    # every node was understood and scored
    assert ctl.reconciler.bad_nodes == {}
    assert len(ctl.reconciler.scores) == len(sc.nodes)
    # the store holds what the cache holds
    nodes, _ = await store.load("Node")
    pods, _ = await store.load("Pod")
    assert set(nodes) == set(ctl.cache.nodes)
    assert set(pods) == set(ctl.cache.pods)
    assert ctl.ready() == (True, "ok")


class FlakyStore(MemoryStore):
    """A memory store that can be made to fail, like a Redis that goes away."""

    down = False

    async def apply(self, events: Any, resource_versions: Any) -> None:
        if self.down:
            raise StoreUnreachable("connection refused")
        await super().apply(events, resource_versions)

    async def replace(self, kind: Any, records: Any, resource_version: str) -> None:
        if self.down:
            raise StoreUnreachable("connection refused")
        await super().replace(kind, records, resource_version)


@pytest.mark.anyio
async def test_store_outage_keeps_serving_then_catches_up() -> None:
    store = FlakyStore()
    src = SimClusterSource(inference_day(), speed=None)
    ctl = Controller("sim", src, store, summary_interval=0.05)
    await store.open()
    ctl.store_ok = True
    # list everything, then the store goes away while events keep coming
    await ctl.replace("Node", [NodeRecord("n1", gpus=8)], "1")
    for kind in ("Pod", "PodDisruptionBudget", "NodeResourceTopology", *DRA_KINDS, *FABRIC_KINDS):
        await ctl.replace(kind, [], "1")
    await ctl._flush()
    assert ctl.ready() == (True, "ok")
    store.down = True
    await ctl.apply([Event("ADDED", PodRecord("ns", "p", node="n1", gpus=1))], {"Pod": "2"})
    await ctl._flush()
    assert ctl.ready() == (False, "state store unavailable (mirror): connection refused")
    assert ctl.cache.pods_on("n1")  # memory keeps serving
    await ctl.apply([Event("ADDED", PodRecord("ns", "q", node="n1", gpus=1))], {"Pod": "3"})
    await ctl._flush()
    store.down = False
    await ctl._flush()  # catches up with a full re-sync
    assert ctl.ready() == (True, "ok")
    pods, rv = await store.load("Pod")
    assert set(pods) == {"ns/p", "ns/q"}
    # the re-sync writes every kind at the resourceVersion last seen, not ""
    assert rv == "3"
    assert (await store.load("Node"))[1] == "1"


@pytest.mark.anyio
async def test_only_the_leader_publishes_its_summary_and_only_on_the_whole_view() -> None:
    store = MemoryStore("sim")
    await store.open()
    leader = [True]
    source = _SlowLists({"Node": [NodeRecord("n1", gpus=8)]})
    ctl = Controller("sim", source, store, is_leader=lambda: leader[0], summary_interval=0)
    ctl.federation_interval = 0.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await _until(lambda: "n1" in ctl.cache.nodes)
        # the leader, but only the nodes are listed: a partial view is not published
        assert await ctl.publish(ctl.summarize()) is False
        source.rest.set()
        await _until(lambda: ctl.scored_at is not None)
        leader[0] = False
        assert await ctl.publish(ctl.summarize()) is False
        assert await store.read_summary() is None
        leader[0] = True
        assert await ctl.publish(ctl.summarize()) is True
        tg.cancel_scope.cancel()
    got = await store.read_summary()
    assert got is not None
    assert b'"nodes":1' in got.summary


@pytest.mark.anyio
async def test_health_endpoints_and_metrics() -> None:
    src = SimClusterSource(inference_day(), speed=None)
    ctl = Controller("sim", src, MemoryStore(), summary_interval=0.05)
    server = HealthServer(ctl.metrics.registry, ctl.ready, "127.0.0.1", 0)
    port = await server.start()

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        assert (await anyio.to_thread.run_sync(get, "/healthz"))[0] == 200
        code, body = await anyio.to_thread.run_sync(get, "/readyz")
        assert code == 503
        assert "not synced" in body
        await ctl.run(until_source_ends=True)
        assert (await anyio.to_thread.run_sync(get, "/readyz"))[0] == 200
        code, text = await anyio.to_thread.run_sync(get, "/metrics")
        assert code == 200
        for name in (
            "pyctl_fragmentation_ratio",
            "pyctl_gpu_idle_gpus",
            "pyctl_zone_gpu_fragment_gpus",
            "pyctl_gpu_fragment_by_category_gpus",
            "pyctl_mig_recoverable_slices",
            "pyctl_pending_pods_blocked_by_fragmentation",
            "pyctl_scheduling_success_ratio",
            "pyctl_watch_events_total",
            "pyctl_event_to_state_seconds_bucket",
            "pyctl_reconcile_duration_seconds_bucket",
        ):
            assert name in text, name
    finally:
        await server.stop()


def test_safety_limits_are_configuration() -> None:
    cfg = load_config(
        None,
        {"PYCTL_LIMIT_GLOBAL_BURST": "3", "PYCTL_LIMIT_DISRUPTIONS_PER_HOUR": "0"},
        {"limit_node_per_minute": 6.0, "mig_concurrency": 2},
    )
    limits = cfg.safety_limits()
    assert limits.global_bucket is not None
    assert limits.global_bucket.capacity == 3
    assert limits.node_bucket is not None
    assert limits.node_bucket.per_second == pytest.approx(0.1)
    assert limits.mig_concurrency == 2
    assert limits.disruptions_per_hour is None
    with pytest.raises(ConfigError, match=r"limit_node_burst: 0 is outside 1\.\.1e\+06"):
        load_config(None, {"PYCTL_LIMIT_NODE_BURST": "0"})


@pytest.mark.anyio
async def test_a_node_reconciled_again_unchanged_keeps_its_model_object() -> None:
    """What is kept per model object (the extender's ranks, the planning rounds' attributions,
    the federation encoder's bytes) survives a re-score that changed nothing, e.g. under a new
    M; a change of the node gives a new model, and a new M a new score either way."""
    ctl = Controller("sim", SimClusterSource(inference_day()), MemoryStore("sim"))
    await ctl.replace("Node", [NodeRecord("n1", gpus=8, cpu_milli=64000)], "1")
    r = ctl.reconciler
    r.reconcile("n1")
    first = r.models["n1"]
    r.reconcile("n1")
    assert r.models["n1"] is first
    await ctl.apply([Event("ADDED", PodRecord("ns", "p", node="n1", gpus=1))], {"Pod": "2"})
    r.reconcile("n1")
    second = r.models["n1"]
    assert second is not first
    assert second != first
    # a new record of the same node, no new fact: the model object stays
    await ctl.apply([Event("MODIFIED", NodeRecord("n1", gpus=8, cpu_milli=64000))], {"Node": "3"})
    r.reconcile("n1")
    assert r.models["n1"] is second


async def _until(cond: Any, seconds: float = 10.0) -> None:
    with anyio.fail_after(seconds):
        while not cond():  # noqa: ASYNC110 (a condition of plain attributes)
            await anyio.sleep(0.01)


class _SlowLists:
    """Lists the nodes at once and the other kinds when `rest` is set (a Pod list that takes
    long: a big cluster, a slow API server, a list that fails and is retried)."""

    name = "slow"

    def __init__(self, lists: dict[Kind, list[Record]]) -> None:
        self.lists = lists
        self.rest = anyio.Event()

    async def run(self, sink: EventSink) -> None:
        await sink.replace("Node", self.lists.get("Node", []), "1")
        await self.rest.wait()
        for kind in KINDS[1:]:
            await sink.replace(kind, self.lists.get(kind, []), "2")
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_no_node_is_scored_and_no_loop_plans_before_every_kind_is_listed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As client-go's controllers wait for their informers: the nodes are listed, their pods
    not yet; a node is not modelled without its pods (it would look empty: scored, advised on
    and planned on as free), the workflow loops do not plan and no summary reports (its
    metrics would total part of the cluster), however long the Pod list takes; once it lands
    every node is scored with its pods and the loops run."""
    from pyctl.app.config import Config
    from pyctl.app.wiring import attach_workflows

    caplog.set_level(logging.INFO, logger="pyctl.controller")
    nodes: list[Record] = [NodeRecord(f"n{i}", gpus=8) for i in range(3)]
    pods: list[Record] = [PodRecord("ns", f"p{i}", node=f"n{i}", gpus=4) for i in range(3)]
    source = _SlowLists({"Node": nodes, "Pod": pods})
    summaries: list[Any] = []
    ctl = Controller(
        "t", source, MemoryStore("t"), summary_interval=0.02, on_summary=summaries.append
    )
    flows = attach_workflows(ctl, Config(), interval=0.02)
    ticks = {"compaction": 0, "mig": 0}

    def counted(name: str, tick: Any) -> Any:
        async def run(leader: bool) -> None:
            ticks[name] += 1
            await tick(leader)

        return run

    flows.compactor.tick = counted("compaction", flows.compactor.tick)  # type: ignore[method-assign]
    flows.mig_loop.tick = counted("mig", flows.mig_loop.tick)  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(ctl.run)
        await _until(lambda: len(ctl.cache.nodes) == 3)
        await anyio.sleep(0.5)  # 25 planning intervals
        assert ctl.stats.reconciles == 0
        assert not ctl.reconciler.scores
        assert ticks == {"compaction": 0, "mig": 0}
        assert summaries == []
        # who holds the Lease is exported meanwhile (PyctlNoLeader reads it)
        leader = ctl.metrics.registry.get_sample_value("pyctl_leader", {"cluster": "t"})
        assert leader == 1.0
        assert ctl.ready()[0] is False
        with anyio.fail_after(5):  # nothing can be drained yet: it returns
            await ctl.drain()
        assert len(ctl.queue) == 3

        def listed(kind: str) -> float | None:
            return ctl.metrics.registry.get_sample_value(
                "pyctl_kind_listed", {"cluster": "t", "kind": kind}
            )

        assert (listed("Node"), listed("Pod")) == (1.0, 0.0)  # what PyctlKindNotListed reads
        source.rest.set()
        await _until(lambda: ctl.scored_at is not None and all(ticks.values()) and summaries)
        tg.cancel_scope.cancel()
    assert summaries[0].nodes == 3  # the first summary is of the whole cluster
    # the start-up's log line counts what it took: each node reconciled once, no event
    (line,) = [r for r in caplog.records if r.getMessage() == "every node scored"]
    assert (line.__dict__["reconciles"], line.__dict__["events"]) == (3, 0)
    assert {listed(k) for k in KINDS} == {1.0}
    # each node scored once, with its pod: 4 of its 8 GPUs in use
    assert ctl.stats.reconciles == 3
    assert {n: s.idle_gpu_milli for n, s in ctl.reconciler.scores.items()} == {
        f"n{i}": 4000 for i in range(3)
    }
