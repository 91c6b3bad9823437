"""The trace replay engine (rust/src/replay): one replay of a trace under one policy and seed.
The trace reading, the workload M and the metrics live in `pyctl.replay.trace`."""

from __future__ import annotations

from collections.abc import Sequence

from pyctl import _core
from pyctl.core.inputs import (
    EventCompaction,
    ReplayCompaction,
    ReplayInstances,
    ReplayNodes,
    ReplayTasks,
    ShapeInput,
)
from pyctl.core.types import EventsRaw, ReplayRaw

#: the placement policies the engine knows (the artifact's six, pyctl's)
POLICIES: tuple[str, ...] = tuple(_core.REPLAY_POLICIES)


def run(
    nodes: ReplayNodes,
    tasks: ReplayTasks,
    shapes: Sequence[ShapeInput],
    *,
    policy: str,
    seed: int,
    tune: float = 1.3,
    shuffle: bool = True,
    numa: bool = False,
    compaction: ReplayCompaction | None = None,
    max_pct: int = 130,
    placements: bool = False,
) -> ReplayRaw:
    """One replay: the nodes and tasks in columns, M's shapes; raises ValueError naming the field
    on bad input."""
    return _core.replay_run(
        nodes,
        tasks,
        shapes,
        policy=policy,
        seed=seed,
        tune=tune,
        shuffle=shuffle,
        numa=numa,
        compaction=compaction,
        max_pct=max_pct,
        placements=placements,
    )


def run_events(
    nodes: ReplayNodes,
    instances: ReplayInstances,
    shapes: Sequence[ShapeInput],
    *,
    policy: str,
    seed: int,
    end: float,
    shuffle: bool = True,
    compaction: EventCompaction | None = None,
    sample_every: float = 0.0,
    log: bool = False,
) -> EventsRaw:
    """The inference replay: instances (the tasks' columns plus app, max_per_node, arrive,
    depart) arriving and leaving in time order; raises ValueError naming the field on bad
    input."""
    return _core.replay_events(
        nodes,
        instances,
        shapes,
        policy=policy,
        seed=seed,
        end=end,
        shuffle=shuffle,
        compaction=compaction,
        sample_every=sample_every,
        log=log,
    )


__all__ = ["POLICIES", "EventsRaw", "ReplayRaw", "run", "run_events"]
