"""The shapes of what the Rust core returns (`pyctl._core`, typed in `pyctl/_core.pyi`)."""

from __future__ import annotations

from typing import TypedDict


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
