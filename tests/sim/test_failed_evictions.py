"""Fault: failed evictions spent the limits (issue 36). On the simulated cluster, with the
configured limits on its virtual clock: one pod's eviction keeps failing with 500 and two other
moves off the same node must still be made at once, not held back by "limit bucket binds" for
25 simulated minutes as they were when every failed try kept its tokens."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from pyctl.app.config import Config, SimSection
from pyctl.app.run import build_sim
from pyctl.cluster.records import PodRecord
from pyctl.cluster.sim.actuator import SimActuator
from pyctl.cluster.sim.source import EPOCH
from pyctl.workflows.compaction import KIND, CompactionData
from pyctl.workflows.engine import Workflow

#: virtual seconds after which the failing move starts (the cluster is full of running pods)
START = 3600.0
#: the other two moves start a minute later, once the failing one has tried twice
LATER = 60.0
#: how long they stayed blocked before the fix
BLOCKED = 25 * 60.0


def move(p: PodRecord, now: float) -> Workflow[CompactionData]:
    """A compaction move of `p` off its node, as the compactor starts one."""
    return Workflow(
        id=f"{KIND}-{p.uid}",
        kind=KIND,
        node=p.node,
        step="evicting",
        created=now,
        updated=now,
        data=CompactionData(
            p.namespace, p.name, p.uid, f"{p.owner_kind}/{p.owner_name}", "", 1000.0
        ),
    )


def three_pods_of_one_node(pods: dict[str, PodRecord], leaves: dict[str, float]) -> list[PodRecord]:
    """Three running pods of three workloads on one node that stay past the test's window (by
    the scenario: `leaves`, virtual seconds), in the order of their moves' ids (so that the
    first, whose eviction fails, goes first in every round)."""
    by_node: dict[str, dict[str, PodRecord]] = {}
    for p in pods.values():
        stays = leaves.get(p.name, 0.0) > START + LATER + BLOCKED + 600
        if stays and p.node and p.phase == "Running" and not p.deleting:
            by_node.setdefault(p.node, {}).setdefault(p.owner_name, p)
    for node in sorted(by_node):
        if len(by_node[node]) >= 3:
            return sorted(list(by_node[node].values())[:3], key=lambda p: p.uid)
    raise AssertionError("no node runs pods of three workloads")


@pytest.mark.anyio
async def test_failed_evictions_spend_no_limits() -> None:
    cfg = Config(mode="enforce", sim=SimSection(speed=0))
    sim = build_sim(cfg)
    src, ctl = sim.source, sim.controller
    actuator = sim.workflows.actuator
    assert isinstance(actuator, SimActuator)
    engine = sim.workflows.compactor.engine
    assert src.lockstep is not None
    chosen: list[PodRecord] = []
    started: dict[str, float] = {}
    done_at: dict[str, float] = {}
    results: dict[str, list[str]] = {}
    leaves = {a.pod: a.t + a.life for a in sim.scenario.arrivals}

    async def tick(now: float) -> None:
        # only the three moves of the test advance: no planning round starts others
        if not chosen and now - EPOCH >= START:
            chosen.extend(three_pods_of_one_node(ctl.cache.pods, leaves))
            actuator.fail_evictions[chosen[0].key] = 500
            await engine.start(move(chosen[0], now))
            started[chosen[0].key] = now
        elif chosen and len(started) == 1 and now >= started[chosen[0].key] + LATER:
            for p in chosen[1:]:
                await engine.start(move(p, now))
                started[p.key] = now
        await engine.advance_all()
        for p in chosen:
            wf = await engine.get(f"{KIND}-{p.uid}")
            if wf is None:
                continue
            results.setdefault(p.key, []).append(wf.result)
            if wf.step == "done" and p.key not in done_at:
                done_at[p.key] = now

    src.lockstep = replace(src.lockstep, tick=tick)
    with anyio.fail_after(300):
        await sim.run()

    failing, others = chosen[0], chosen[1:]
    assert {p.node for p in chosen} == {failing.node}
    tries = [
        a
        for name, a in actuator.calls
        if name == "evict" and a == (failing.namespace, failing.name)
    ]
    assert len(tries) >= 3, results[failing.key][:8]
    assert failing.key not in done_at
    for p in others:
        waited = done_at.get(p.key, float("inf")) - started[p.key]
        assert waited <= 30.0, (
            f"{p.key} waited {waited:g} s for its eviction beside a failing one on "
            f"{p.node} (before the fix: about {BLOCKED:g} s); results: {results[p.key][:5]}"
        )
    assert ("evicted", "PyctlCompaction") in sim.workflows.gate.evictions
    refunds = ctl.metrics.workflow.refunds.labels(cfg.cluster, "failed")._value.get()
    assert refunds == len(tries)
