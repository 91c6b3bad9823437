"""The shapes of what the Rust core returns (`pyctl._core`, typed in `pyctl/_core.pyi`)."""

from __future__ import annotations

from typing import Any, TypedDict


class Checkpoint(TypedDict):
    """The replay's state when the arrived GPU request reached `arrived_pct`% of capacity."""

    arrived_pct: int
    arrived_milli: int
    allocated_milli: int
    frag_milli: float
    idle_milli: int
    numa_split_milli: float
    arrived_tasks: int
    failed_tasks: int
    evictions: int


class _ReplayRequired(TypedDict):
    policy: str
    seed: int
    gpu_capacity_milli: int
    tasks: int
    placed: int
    failed: int
    failed_admission: int
    evictions: int
    compaction_rounds: int
    checkpoints: list[Checkpoint]


class ReplayRaw(_ReplayRequired, total=False):
    """One replay's result; `node_of` and `task_of` only when placements were asked for."""

    node_of: list[int]
    task_of: list[int]


class RankedRaw(TypedDict):
    """The policy's best placement on one node (`rust/src/placement`)."""

    node: int
    rank: tuple[int, int, int]
    inc: float
    cpu_short: bool
    left: int
    idle: int
    assignment: dict[str, Any]


class RescueRaw(TypedDict):
    pending: int
    node: int
    assignment: dict[str, Any]
    moves: list[int]
    waits: int
    delta: float


#: a planned move's source node is under the key "from" (a Python keyword)
PlanMove = dict[str, Any]


class PlanRaw(TypedDict):
    """A compaction plan (`rust/src/compaction`)."""

    moves: list[PlanMove]
    rescues: list[RescueRaw]
    unrescued: list[int]
    truncated: bool
