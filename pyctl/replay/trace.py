"""Trace replay on the simulated cluster (issue 8): read an Alibaba-2023-style trace (node list +
pod list CSVs), derive FGD's target workload M, and replay it with the Rust engine under one
policy and seed (`pyctl.core.replay.run`).

Trace layout (the FGD artifact's): a directory with `openb_node_list_gpu_node.csv`
(`sn,cpu_milli,memory_mib,gpu,model`) and `openb_pod_list_<workload>.csv`
(`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`). Pods are sorted by name before the
seeded resample and shuffle, as the artifact does; ties between nodes follow a seeded random node
order, as the artifact's renamed nodes and its scheduler fork make them (see `node_order` in
`rust/src/replay/mod.rs`).
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyctl.core import replay as engine
from pyctl.core.fragmentation import derive_workload
from pyctl.core.inputs import ReplayCompaction, ReplayNodes, ReplayTasks, ShapeInput
from pyctl.core.types import Checkpoint, ReplayRaw
from pyctl.model import Shape, Workload

NODE_FILE = "openb_node_list_gpu_node.csv"
POD_PREFIX = "openb_pod_list_"
POLICIES: tuple[str, ...] = engine.POLICIES
SEEDS: tuple[int, ...] = tuple(range(42, 52))
#: pyctl's policy, and pyctl as deployed (the kube-scheduler with pyctl's extender): they compact
PYCTL_POLICIES: tuple[str, ...] = ("pyctl", "pyctl-deployed")
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceTasks(ReplayTasks):
    """The trace's tasks: the core's columns and each task's name (the core does not read it)."""

    name: list[str]


class TraceError(ValueError):
    """A trace file is missing or malformed (the message names the file, row and column)."""


@dataclass(frozen=True)
class Trace:
    name: str
    nodes: ReplayNodes
    tasks: TraceTasks
    workload: Workload

    @property
    def node_count(self) -> int:
        return len(self.nodes["name"])

    @property
    def task_count(self) -> int:
        return len(self.tasks["cpu_milli"])

    @property
    def gpu_count(self) -> int:
        return sum(self.nodes["gpu"])


def _int(value: str, path: Path, row: int, column: str) -> int:
    try:
        v = int(value) if value.strip() else 0
    except ValueError:
        raise TraceError(
            f"{path}: row {row}, column {column!r}: not an integer: {value!r}"
        ) from None
    if v < 0:
        raise TraceError(f"{path}: row {row}, column {column!r}: negative value {v}")
    return v


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise TraceError(f"{path}: missing column(s) {missing} (header: {header})")
            rows = list(enumerate(reader, start=2))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None
    for row, r in rows:
        # DictReader fills a short row's missing cells with None and keeps a long row's extra
        # cells under the key None
        if None in r or any(r[c] is None for c in required):
            raise TraceError(f"{path}: row {row} does not have the header's {len(header)} columns")
    return rows


def read_nodes(path: Path) -> ReplayNodes:
    cols: ReplayNodes = {
        "name": [],
        "cpu_milli": [],
        "memory_mib": [],
        "gpu": [],
        "model": [],
    }
    for row, r in _rows(path, NODE_COLUMNS):
        cols["name"].append(r["sn"])
        cols["cpu_milli"].append(_int(r["cpu_milli"], path, row, "cpu_milli"))
        cols["memory_mib"].append(_int(r["memory_mib"], path, row, "memory_mib"))
        cols["gpu"].append(_int(r["gpu"], path, row, "gpu"))
        cols["model"].append((r["model"] or "").strip())
    if not cols["name"]:
        raise TraceError(f"{path}: no nodes")
    return cols


def read_tasks(path: Path) -> TraceTasks:
    rows = []
    for row, r in _rows(path, POD_COLUMNS):
        num = _int(r["num_gpu"], path, row, "num_gpu")
        milli = _int(r["gpu_milli"], path, row, "gpu_milli")
        spec = (r.get("gpu_spec") or "").strip()
        models = tuple(m for m in spec.split("|") if m) if spec else ()
        rows.append(
            (
                r["name"],
                _int(r["cpu_milli"], path, row, "cpu_milli"),
                _int(r["memory_mib"], path, row, "memory_mib"),
                num,
                milli if num > 0 else 0,
                models,
            )
        )
    rows.sort(key=lambda x: x[0])
    return {
        "name": [x[0] for x in rows],
        "cpu_milli": [x[1] for x in rows],
        "memory_mib": [x[2] for x in rows],
        "num_gpu": [x[3] for x in rows],
        "gpu_milli": [x[4] for x in rows],
        "gpu_models": [list(x[5]) for x in rows],
    }


def task_shapes(tasks: ReplayTasks) -> list[Shape]:
    return [
        Shape(
            cpu_milli=c,
            gpus=n,
            gpu_milli=m,
            gpu_models=tuple(g),
        )
        for c, n, m, g in zip(
            tasks["cpu_milli"],
            tasks["num_gpu"],
            tasks["gpu_milli"],
            tasks["gpu_models"],
            strict=True,
        )
    ]


def load_trace(directory: str | Path, workload: str = "default") -> Trace:
    d = Path(directory)
    if not d.is_dir():
        raise TraceError(f"trace directory not found: {d}")
    nodes = read_nodes(d / NODE_FILE)
    tasks = read_tasks(d / f"{POD_PREFIX}{workload}.csv")
    if not tasks["name"]:
        raise TraceError(f"{d / f'{POD_PREFIX}{workload}.csv'}: no pods")
    return Trace(workload, nodes, tasks, derive_workload(task_shapes(tasks)))


def shape_dicts(workload: Workload) -> list[ShapeInput]:
    return [
        {
            "cpu_milli": s.cpu_milli,
            "gpus": s.gpus,
            "gpu_milli": s.gpu_milli,
            "gpu_models": list(s.gpu_models),
            "weight": s.weight,
        }
        for s in workload.shapes
    ]


@dataclass(frozen=True)
class Compaction:
    """pyctl's compaction as the controller runs it: a round every `every` arrivals, at most
    `max_moves` moves a round, each the move that lowers F(M) most and by more than `min_gain`
    milli-GPU (the controller's planner); evictions never above `budget` x arrived pods, of
    which periodic rounds use at most `1 - reserve` (the rest is kept for pods that would
    otherwise fail, once a task has failed). A task that fits nowhere is rescued by the
    planner with up to `rescue_depth` evictions, trying at most `rescue_budget` sets of pods."""

    every: int = 20
    budget: float = 0.02
    max_moves: int = 20
    min_gain: float = 1.0
    reserve: float = 0.25
    rescue_depth: int = 2
    rescue_budget: int = 64

    def as_dict(self) -> ReplayCompaction:
        return ReplayCompaction(
            every=self.every,
            budget=self.budget,
            max_moves=self.max_moves,
            min_gain=self.min_gain,
            reserve=self.reserve,
            rescue_depth=self.rescue_depth,
            rescue_budget=self.rescue_budget,
        )


@dataclass(frozen=True)
class RunResult:
    trace: str
    policy: str
    seed: int
    numa: bool
    raw: ReplayRaw = field(repr=False)
    seconds: float = 0.0

    def _at(self, pct: int) -> Checkpoint | None:
        for c in self.raw["checkpoints"]:
            if c["arrived_pct"] == pct:
                return c
        return None

    @property
    def capacity_milli(self) -> int:
        return int(self.raw["gpu_capacity_milli"])

    def unallocated_pct(self, pct: int = 100) -> float:
        c = self._at(pct)
        if c is None:
            return float("nan")
        return 100.0 - 100.0 * float(c["allocated_milli"]) / self.capacity_milli

    def frag_rate(self, pct: int = 90) -> float:
        c = self._at(pct)
        if c is None or c["idle_milli"] == 0:
            return float("nan")
        return 100.0 * float(c["frag_milli"]) / float(c["idle_milli"])

    def frag_amount_pct(self, pct: int = 90) -> float:
        c = self._at(pct)
        return float("nan") if c is None else 100.0 * c["frag_milli"] / self.capacity_milli

    def numa_split_gpus(self, pct: int = 100) -> float:
        c = self._at(pct)
        return float("nan") if c is None else float(c["numa_split_milli"]) / 1000.0

    def evicted_pct(self, pct: int | None = 100) -> float:
        """Evictions as a % of the pods arrived: by the time the arrived GPU request reaches
        `pct`% of capacity (where the headline metric is read), or over the whole run (None, or
        a run that never gets there)."""
        c = None if pct is None else self._at(pct)
        if c is None:
            return 100.0 * float(self.raw["evictions"]) / max(1, int(self.raw["tasks"]))
        return 100.0 * float(c["evictions"]) / max(1, int(c["arrived_tasks"]))

    def arrived_task_indices(self, pct: int = 100) -> list[int] | None:
        """The trace's task indices (into `Trace.tasks`, with repeats for resampled clones) of the
        tasks that had arrived when the arrived GPU request reached `pct`% of capacity, in arrival
        order; None if the run never got there. Needs a run made with `placements=True`."""
        order = self.raw.get("task_of")
        if order is None:
            raise ValueError("arrived_task_indices needs a replay run with placements=True")
        c = self._at(pct)
        return None if c is None else [int(i) for i in order[: int(c["arrived_tasks"])]]

    def placed_positions(self, pct: int = 100) -> list[int] | None:
        """Positions in `arrived_task_indices(pct)` of the tasks this run placed (failed tasks
        are never placed later; moved ones stay placed); None if the run never got there. Needs
        a run made with `placements=True`."""
        arrived = self.arrived_task_indices(pct)
        if arrived is None:
            return None
        return [s for s, node in enumerate(self.raw["node_of"][: len(arrived)]) if node >= 0]

    def curve(self) -> list[tuple[int, float]]:
        cap = self.capacity_milli
        return [
            (c["arrived_pct"], 100.0 - 100.0 * c["allocated_milli"] / cap)
            for c in self.raw["checkpoints"]
        ]


def replay(
    trace: Trace,
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    numa: bool = False,
    compaction: Compaction | None = None,
    shuffle: bool = True,
    placements: bool = False,
) -> RunResult:
    """One replay. ``shuffle=False, tune=0``: the tasks arrive in the order given (no resample,
    node ties in input order); ``placements``: ``raw`` also holds ``task_of`` (the task index of
    each arrival) and ``node_of`` (its node index, -1 = failed)."""
    import time

    acts = policy in PYCTL_POLICIES
    comp = compaction if compaction is not None else (Compaction() if acts else None)
    t0 = time.perf_counter()
    raw = engine.run(
        trace.nodes,
        trace.tasks,
        shape_dicts(trace.workload),
        policy=policy,
        seed=seed,
        tune=tune,
        shuffle=shuffle,
        numa=numa,
        compaction=comp.as_dict() if comp is not None and acts else None,
        placements=placements,
    )
    return RunResult(trace.name, policy, seed, numa, raw, time.perf_counter() - t0)


def median(values: Iterable[float]) -> float:
    v = [x for x in values if x == x]
    return statistics.median(v) if v else float("nan")
