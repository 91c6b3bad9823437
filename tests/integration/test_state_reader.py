"""`pyctl status` and `pyctl explain` against the truth: the controller's own numbers.

The controller runs on the built-in simulated cluster with a real redis-server as its store (what
`pyctl run --redis` builds: `build_sim`), in virtual time. At a chosen planning round, with the
simulation paused inside the round (lockstep), the controller flushes its store and publishes its
summary; then its state is read back from Redis, by the reader in process and by the CLI as
subprocesses, and compared with what the controller itself holds at that moment: its
reconciler's node models and scores, its summary, its workflow records, what its scheduler
extender answers for each pending pod, its compaction plan, and the gate's evictor check.

Then hostile records are written into the same Redis (garbage bytes in a record hash, a record
stored under another object's key, a key of the wrong type, a garbage workflow record): status
still reads everything else, identically, and names each skipped record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from pyctl.app.config import Config, load_config
from pyctl.app.explain import Explanation, explain
from pyctl.app.run import SimRun, build_sim
from pyctl.app.state import StoredView, read_view
from pyctl.app.status import Status, status_of
from pyctl.app.wiring import advisor, protection
from pyctl.cluster.records import PodRecord
from pyctl.cluster.sim.source import Lockstep
from pyctl.controller.summary import Summary
from pyctl.core.fragmentation import NodeScore
from pyctl.model import Node, Workload
from pyctl.state.keys import Keys
from pyctl.workflows.compaction import CompactionPlan
from pyctl.workflows.engine import Workflow, WorkflowData
from tests.redis_servers import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

#: planning rounds (30 virtual seconds each) before the check: observe mode has pods blocked
#: by fragmentation in two categories there (seed 7); enforce mode has MIG workflows running
#: (one re-partitioning a node, others waiting for the MIG slot; once the first has served the
#: demand, those waiting are abandoned: no workflow runs after round 20)
OBSERVE_ROUND = 480
ENFORCE_ROUND = 4


def _config(url: str, cluster: str, mode: str) -> Config:
    return load_config(
        None, {}, {"cluster": cluster, "redis_url": url, "mode": mode, "sim_speed": 0}
    )


def _pyctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    return subprocess.run(
        [sys.executable, "-m", "pyctl.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@dataclass
class Truth:
    """The controller's own state at the check, and what was read back."""

    models: dict[str, Node]
    scores: dict[str, NodeScore]
    summary: Summary
    workload: Workload
    workflows: list[Workflow[WorkflowData]]
    pods: dict[str, PodRecord]
    #: pending pod -> (the extender's filter, its prioritize scores on the nodes it keeps)
    extender: dict[str, tuple[dict[str, str], dict[str, int]]]
    plan: CompactionPlan
    #: running pod -> the gate's evictor check (None: may be evicted)
    protected: dict[str, str | None]
    view: StoredView
    status: Status
    cli: dict[str, Any] = field(default_factory=dict)


async def run_to(
    cfg: Config,
    round_no: int,
    more: Callable[[SimRun, Truth], Awaitable[None]] | None = None,
) -> Truth:
    """Run the controller on the simulated cluster until planning round `round_no`; capture its
    state and read the stored one back there (the simulation waits: lockstep), then stop."""
    sim = build_sim(cfg)
    ctl = sim.controller
    ctl.federation_interval = 0.0  # publish whenever asked
    lockstep = sim.source.lockstep
    assert lockstep is not None
    rounds = 0
    got: list[Truth] = []

    with anyio.CancelScope() as scope:

        async def tick(now: float) -> None:
            nonlocal rounds
            await lockstep.tick(now)
            rounds += 1
            if rounds != round_no:
                return
            await ctl.drain()
            s = ctl.summarize()
            await ctl.drain()
            assert ctl.queue.idle
            assert await ctl.publish(s)
            flows = sim.workflows
            names = tuple(sorted(ctl.cache.nodes))
            adv = advisor(ctl, flows)
            extender = {}
            for p in ctl.cache.pending_pods():
                filtered = adv.filter(p, names)
                kept = tuple(n for n in names if n not in filtered)
                extender[p.key] = (filtered, adv.prioritize(p, kept) if kept else {})
            protected_by = protection(cfg, ctl.cache.pods)
            view = await read_view(cfg)
            truth = Truth(
                models=dict(ctl.reconciler.models),
                scores=dict(ctl.reconciler.scores),
                summary=s,
                workload=ctl.reconciler.workload,
                workflows=await flows.compactor.engine.workflows(),
                pods=dict(ctl.cache.pods),
                extender=extender,
                plan=flows.compactor.plan(),
                protected={k: protected_by(p) for k, p in ctl.cache.pods.items() if p.node},
                view=view,
                status=status_of(view),
            )
            if more is not None:
                await more(sim, truth)
            got.append(truth)
            scope.cancel()

        sim.source.lockstep = Lockstep(lockstep.settle, tick, lockstep.every)
        await sim.run()
    (truth,) = got
    return truth


def _close(a: Any, b: Any) -> bool:
    """Equal, floats within 1e-12 relative (sums over nodes taken in another order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        return bool(a == pytest.approx(b, rel=1e-12, abs=1e-9))
    return bool(a == b)


def check_status_is_the_controllers(t: Truth) -> None:
    view, st, s = t.view, t.status, t.summary
    # the same models and scores, node by node, from the stored records
    assert view.reconciler.models == t.models
    assert view.reconciler.scores == t.scores
    assert view.workload_source == "published"
    assert view.reconciler.workload == t.workload
    assert not st.unmodelled
    assert not st.skipped
    # the summary: every figure but the scheduling success, which is published
    got = st.summary
    assert got is not None
    for name in (
        "nodes",
        "idle_gpu_milli",
        "fragment_gpu_milli",
        "categories",
        "idle_mig_slices",
        "fragment_mig_slices",
        "recoverable_mig_slices",
        "pending",
        "blocked",
        "by_model",
        "shared_gpus",
        "shared_used_milli",
        "shared_pods",
    ):
        # totals are sums over nodes: equal up to the order of summation (the controller sums
        # in the order it reconciled, the reader in name order)
        assert _close(getattr(got, name), getattr(s, name)), name
    assert st.scheduling_success == s.scheduling_success
    assert [(n.name, n.idle_gpu_milli, n.fragment_gpu_milli) for n in st.worst(10)] == s.worst
    # the heartbeat: published just now by the leader
    assert st.heartbeat.published
    assert st.heartbeat.fresh
    assert st.heartbeat.age_seconds is not None
    assert st.heartbeat.age_seconds < 30
    # the mirror: every pod, written within the run
    fresh = {f.kind: f for f in st.freshness}
    assert fresh["Pod"].records == len(t.pods)
    assert fresh["Node"].records == len(t.models)
    for kind in ("Node", "Pod", "NodeResourceTopology"):
        f = fresh[kind]
        assert f.resource_version
        assert f.written_age_seconds is not None
        assert f.written_age_seconds < 300
        assert f.newest_object
        assert int(f.newest_object) <= int(f.resource_version)
    # the workflow records: the engine's, every one
    assert st.workflows_total == len(t.workflows)
    active = {(w.id, w.step) for w in t.workflows if not w.finished}
    assert {(w.id, w.step) for w in st.workflows_active} == active
    finished = {(w.id, w.step) for w in t.workflows if w.finished}
    assert {(w.id, w.step) for w in st.workflows_recent} <= finished
    assert len(st.workflows_recent) == min(10, len(finished))


def check_explanations(t: Truth, cfg: Config) -> dict[str, Explanation]:
    out: dict[str, Explanation] = {}
    blocked: Counter[str] = Counter()
    for key, p in t.pods.items():
        e = explain(t.view, cfg, key)
        out[key] = e
        assert e.found
        assert e.pod == key
        if not p.node and not p.terminated and not p.deleting:
            assert e.state == "pending"
            filtered, scores = t.extender[key]
            # what the controller's own scheduler extender answers for the pod, node by node
            assert {a.node: a.filtered for a in e.nodes if a.filtered} == filtered
            assert {a.node: a.score for a in e.nodes if a.score is not None} == scores
            assert e.choice == sorted(n for n, v in scores.items() if v == 10)
            rescue = next((r for r in t.plan.rescues if r.pending == key), None)
            assert (e.rescue is None) == (rescue is None)
            if rescue is not None and e.rescue is not None:
                assert e.rescue.node == rescue.node
                assert [m.pod for m in e.rescue.moves] == [m.pod for m in rescue.moves]
            elif key in t.plan.unrescued:
                assert e.plan_note == f"no rescue: {t.plan.unrescued[key]}"
            # why its gang's domain, as the controller's plan says it (none while a rescue in
            # progress holds a node for it: then no plan is made for it)
            if not e.plan_note.startswith("a rescue in progress"):
                assert e.gang_domain == t.plan.gang_domains.get(key, "")
            if p.unschedulable and e.blocked:
                blocked[e.blocked] += 1
            assert e.unschedulable == p.unschedulable
            assert e.scheduler_message == p.unschedulable_message
        elif p.node and not p.terminated and not p.deleting:
            assert e.state == "running"
            assert e.node == p.node
            # the gate's evictor check, and the controller's compaction plan for it
            assert e.evictor == t.protected[key]
            move = next((m for m in t.plan.moves if m.pod == key), None)
            assert (e.move is None) == (move is None)
            if move is not None and e.move is not None:
                assert e.move.to == move.to_node
            elif key in t.plan.refused:
                assert e.plan_note == f"not moved: {t.plan.refused[key]}"
            # its node is among the ranked ones, with the pod counted out of it
            mine = [a for a in e.nodes if a.node == p.node]
            assert len(mine) == 1, (key, e.verdict)
            assert mine[0].admits, (key, e.verdict)
            # the verdict follows the ranks: the choice, a tie with it, or a worse rank
            best = min((a.rank for a in e.nodes if a.candidate and a.rank), default=None)
            if p.node in e.choice:
                assert "the placement policy's choice" in e.verdict, e.verdict
            elif mine[0].fit is None and mine[0].rank == best:
                assert "ranked as well as the placement policy's choice" in e.verdict, e.verdict
            elif e.choice:
                assert "not the policy's choice now" in e.verdict, e.verdict
    # pending pods blocked by fragmentation, pod by pod, add up to the controller's summary
    assert dict(blocked) == t.summary.blocked
    return out


async def test_status_and_explain_equal_the_controller_observing(
    redis_server: RedisServer, cluster_name: str
) -> None:
    cfg = _config(redis_server.url, cluster_name, "observe")

    async def cli(sim: SimRun, t: Truth) -> None:
        base = ["--redis", redis_server.url, "--cluster", cluster_name]
        pending = sorted(
            k for k, p in t.pods.items() if not p.node and p.unschedulable and not p.terminated
        )
        t.cli["status"] = await anyio.to_thread.run_sync(lambda: _pyctl("status", "--json", *base))
        t.cli["text"] = await anyio.to_thread.run_sync(lambda: _pyctl("status", *base))
        t.cli["explain"] = await anyio.to_thread.run_sync(
            lambda: _pyctl("explain", pending[0], "--json", *base)
        )
        t.cli["pending"] = pending[0]

    t = await run_to(cfg, OBSERVE_ROUND, cli)
    check_status_is_the_controllers(t)
    assert len(t.summary.blocked) >= 2, t.summary.blocked  # the round was chosen for this
    explained = check_explanations(t, cfg)

    done = t.cli["status"]
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == json.loads(json.dumps(t.status.to_json())) | {
        "read_at": out["read_at"],
        "controller": out["controller"],
        "mirror": out["mirror"],
    }
    assert out["summary"]["blocked"] == t.summary.blocked
    assert out["controller"]["fresh"] is True
    text = t.cli["text"]
    assert text.returncode == 0, text.stderr
    assert "the replica holding the Lease is publishing" in " ".join(text.stdout.split())
    assert f"Pending pods: {t.summary.pending}" in text.stdout

    done = t.cli["explain"]
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == json.loads(json.dumps(explained[t.cli["pending"]].to_json()))
    assert got["state"] == "pending"
    assert got["unschedulable"] is True


async def test_status_and_explain_equal_the_controller_enforcing_then_hostile_records(
    redis_server: RedisServer, cluster_name: str
) -> None:
    cfg = _config(redis_server.url, cluster_name, "enforce")
    keys = Keys(cluster_name)

    async def hostile(sim: SimRun, t: Truth) -> None:
        r = sim.controller.store.client  # type: ignore[attr-defined]
        victim = next(k for k, p in sorted(t.pods.items()) if p.node)
        good = await r.hget(keys.objects("Pod"), victim)
        await r.hset(keys.objects("Pod"), "inference/garbage", b"\xff\x00\x9c garbage")
        await r.hset(keys.objects("Pod"), "inference/deep", b"[" * 100_000)
        await r.hset(keys.objects("Pod"), "inference/elsewhere", good)  # another pod's record
        await r.hset(keys.objects("Node"), "gpu-x", b'["gpu-x","1","A100",-1.5e999]')
        await r.set(keys.objects("DeviceClass"), "someone else's string")
        await r.hset(keys.workflow_data, "compaction-bogus", b"\x00not json")
        await r.hset(keys.workflow_versions, "compaction-bogus", 1)
        view = await read_view(cfg)
        t.cli["hostile"] = (view, status_of(view))
        base = ["--redis", redis_server.url, "--cluster", cluster_name]
        t.cli["text"] = await anyio.to_thread.run_sync(lambda: _pyctl("status", *base))
        t.cli["explain"] = await anyio.to_thread.run_sync(
            lambda: _pyctl("explain", "inference/garbage", *base)
        )

    t = await run_to(cfg, ENFORCE_ROUND, hostile)
    check_status_is_the_controllers(t)
    assert t.status.workflows_active, "the round was chosen for workflows in progress"
    check_explanations(t, cfg)
    # a workflow in progress is about a node; explain shows it for the pods it moves
    view, st = t.cli["hostile"]
    assert isinstance(view, StoredView)
    assert isinstance(st, Status)
    skipped = {(k, key): why for k, key, why in st.skipped}
    assert set(skipped) == {
        ("Pod", "inference/garbage"),
        ("Pod", "inference/deep"),
        ("Pod", "inference/elsewhere"),
        ("Node", "gpu-x"),
        ("DeviceClass", keys.objects("DeviceClass")),
    }
    assert "does not decode as a Pod record" in skipped[("Pod", "inference/garbage")]
    assert "stored under 'inference/elsewhere' but names" in skipped[("Pod", "inference/elsewhere")]
    assert "holds a string, not a hash" in skipped[("DeviceClass", keys.objects("DeviceClass"))]
    assert st.workflows_undecodable.keys() == {"compaction-bogus"}
    # everything else reads as before, figure for figure
    assert view.reconciler.scores == t.scores
    assert st.summary is not None
    assert t.status.summary is not None
    assert st.summary == t.status.summary
    assert {w.id for w in st.workflows_active} == {w.id for w in t.status.workflows_active}
    assert len(view.cache.pods) == len(t.pods)
    e = explain(view, cfg, "inference/garbage")
    assert not e.found
    assert "does not decode" in e.verdict

    text = t.cli["text"]
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "Skipped 5 stored record(s) (left in place)" in flat
    assert "Pod inference/garbage: does not decode as a Pod record" in flat
    assert "1 workflow record(s) do not decode" in flat
    done = t.cli["explain"]
    assert done.returncode == 1
    assert "its stored record does not decode" in " ".join(done.stdout.split())
