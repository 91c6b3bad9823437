"""How far from the limit (issue 21): a lower bound on the unallocated GPU of a trace replay, and
the best placement found, for the tasks that had arrived at a checkpoint, packed onto the trace's
nodes with free choice of placement (as if every task could be moved).

Constraints are the replay's (`rust/src/replay/state.rs`, `State::fits` and `admit_whole`): per
node CPU milli, memory MiB, GPU count and GPU model (a task may list allowed models, compared
without case; an empty list allows any); a task takes `num_gpu` whole GPUs (gpu_milli 1000: GPUs
nothing else uses) or one share `gpu_milli` < 1000 of ONE GPU, which it shares with other shares
up to 1000 milli; with `numa=True` a node of g >= 2 GPUs has zones of g//2 and g - g//2 GPUs and
a whole-GPU task's GPUs lie in one zone (shares and CPU are not zone-bound). The replay's
"unallocated GPU" is capacity minus the GPU milli of the placed tasks, so its least value is
capacity minus the most GPU milli that any placement of a subset of the arrived tasks reaches.

The model (an integer program with identical nodes and identical tasks aggregated into types):
node types = equal (CPU, memory, GPUs, model); task types = equal (CPU, memory, GPU request,
allowed models among the cluster's). CPU-only tasks are left out (they place no GPU and only take
room), as are tasks that fit on no empty node. Per node type k:
- v[k, L]: nodes of type k with layout L. A layout gives each zone's GPUs to whole-GPU tasks
  (how many of each size) and leaves the rest to shares; sum_L v[k, L] <= nodes of type k.
- z[k, p]: GPUs of type k that carry share pattern p, a maximal multiset of share sizes that
  fits in 1000 milli; sum_p z[k, p] <= sum_L (share GPUs of L) v[k, L].
- x[t, k]: tasks of type t placed on type k. Shares of size m: sum_t x[t, k] <= sum_p
  (slots of size m in p) z[k, p]; whole-GPU tasks of size s: sum_t x[t, k] <= sum_L (slots of
  size s in L) v[k, L]; CPU: sum_t cpu_t x[t, k] <= nodes x CPU of a node; memory likewise;
  per task type sum_k x[t, k] <= arrived tasks of type t.
Maximise sum value_t x[t, k], value = GPU milli. Any placement gives a solution of the same
value (per node its layout, per GPU a maximal pattern that contains its shares' sizes, per node
type the sums), so the optimum of the LP relaxation is at least the most GPU any placement
allocates: capacity minus it is a valid lower bound on unallocated GPU. The GPU side is exact
(per GPU through the patterns, per zone through the layouts); the relaxation is in CPU and
memory, counted per node type instead of per node, and in the LP's fractional counts. The bound
is rounded down to a multiple of the gcd of the task types' GPU milli (an allocation is a sum of
them) after a relative safety margin of 1e-6 for floating point.

The best placement: the integer program, with the share patterns the LP uses, is solved with
HiGHS (each node type's CPU and memory scaled by 1 - slack, a few slacks tried), its solution is
split over the nodes of each type (layouts and patterns to nodes, tasks to slots, most CPU and
memory first, to the node with the most room left), and what is left on the nodes is filled
with unplaced arrived tasks. The result is checked by `check_placement` against the replay's
rules; when it reaches the bound, it is the optimum.

`work_conserving` runs the arrivals in order through the same model: each task is placed if
some placement holds it with every task placed before it, refused otherwise (what a scheduler
that places every pod that fits reaches with free, unlimited moves).

HiGHS comes from the `highspy` package (`pip install 'pyctl[bound]'`); it is imported when a
bound is solved, so pyctl works without it.
"""

from __future__ import annotations

import importlib
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

from pyctl.core.inputs import ReplayNodes, ReplayTasks

GPU_MILLI = 1000
#: Relative safety margin added to the floating-point bound before rounding it down.
SAFETY = 1e-6


class BoundError(RuntimeError):
    """The bound cannot be computed (HiGHS missing, or a solver failure; the message says)."""


def _highspy() -> Any:
    try:
        return importlib.import_module("highspy")
    except ImportError:
        raise BoundError(
            "the bound needs HiGHS: install pyctl's 'bound' extra (pip install 'pyctl[bound]')"
        ) from None


# -- the instance ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeType:
    cpu_milli: int
    memory_mib: int
    gpus: int
    #: GPU model, lower-cased (the replay compares models without case).
    model: str
    #: GPUs per zone that a whole-GPU task must fit within (one zone unless NUMA).
    zones: tuple[int, ...]
    #: The trace's node indices of this type.
    nodes: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class TaskType:
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    #: Allowed node models (lower-cased, among the cluster's); None = any.
    models: frozenset[str] | None
    #: Positions in the arrived task list of the tasks of this type.
    slots: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.slots)

    @property
    def value(self) -> int:
        """GPU milli the task places."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_share(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < GPU_MILLI


@dataclass(frozen=True)
class Problem:
    node_types: tuple[NodeType, ...]
    task_types: tuple[TaskType, ...]
    numa: bool
    capacity_milli: int
    #: GPU milli of every arrived task (also those left out).
    arrived_milli: int
    arrived_tasks: int
    #: Arrived tasks left out: CPU-only, or fitting on no empty node.
    left_out: int

    def unallocated_pct(self, alloc_milli: float) -> float:
        """Unallocated GPU, % of capacity, when `alloc_milli` is allocated."""
        return unallocated_pct(self.capacity_milli, alloc_milli)

    def fits_empty(self, k: int, t: int) -> bool:
        """Whether one task of type t fits alone on an empty node of type k."""
        return _fits_empty(self.node_types[k], self.task_types[t])


def unallocated_pct(capacity_milli: int, alloc_milli: float) -> float:
    """Unallocated GPU, % of `capacity_milli` (0 for a cluster without GPUs)."""
    return 100.0 - 100.0 * alloc_milli / capacity_milli if capacity_milli else 0.0


def _fits_empty(n: NodeType, t: TaskType) -> bool:
    if t.cpu_milli > n.cpu_milli or t.memory_mib > n.memory_mib or t.num_gpu == 0:
        return False
    if t.models is not None and n.model not in t.models:
        return False
    if t.is_share:
        return n.gpus >= 1
    return any(z >= t.num_gpu for z in n.zones)


def zones_of(gpus: int, numa: bool) -> tuple[int, ...]:
    """GPUs per zone as the replay splits a node (`split = g / 2` for g >= 2 under NUMA)."""
    if numa and gpus >= 2:
        return (gpus // 2, gpus - gpus // 2)
    return (gpus,)


def _task_gpu(num: int, milli: int, where: str) -> tuple[int, int]:
    """The replay's rule for a task's GPU request (`gpu_request` in rust/src/replay/mod.rs)."""
    if num < 0 or num > 16:
        raise ValueError(f"{where}: num_gpu {num} is outside 0..=16")
    if num == 0:
        return 0, 0
    if not 1 <= milli <= GPU_MILLI:
        raise ValueError(f"{where}: gpu_milli {milli} is outside 1..=1000 for a GPU task")
    if num > 1 and milli != GPU_MILLI:
        raise ValueError(f"{where}: a task with {num} GPUs must take whole GPUs, got {milli}")
    return num, milli


def make_problem(
    nodes: ReplayNodes,
    tasks: ReplayTasks,
    arrived: Sequence[int] | None = None,
    *,
    numa: bool = False,
) -> Problem:
    """The instance for the tasks `arrived` (indices into the task columns, repeats allowed: the
    replay's resampled clones; None = every task once) on the nodes, in the columns of
    `pyctl.replay.trace` (`Trace.nodes`, `Trace.tasks`)."""
    models = {str(m).lower() for m in nodes["model"]}
    by_node: dict[tuple[int, int, int, str], list[int]] = {}
    capacity = 0
    for i, (cpu, mem, g, m) in enumerate(
        zip(nodes["cpu_milli"], nodes["memory_mib"], nodes["gpu"], nodes["model"], strict=True)
    ):
        if cpu < 0 or mem < 0 or not 0 <= g <= 16:
            raise ValueError(f"nodes[{i}]: negative resources or more than 16 GPUs")
        capacity += int(g) * GPU_MILLI
        by_node.setdefault((int(cpu), int(mem), int(g), str(m).lower()), []).append(i)
    node_types = tuple(
        NodeType(cpu, mem, g, m, zones_of(g, numa), tuple(ix))
        for (cpu, mem, g, m), ix in sorted(by_node.items(), key=lambda kv: kv[1][0])
    )
    order = list(range(len(tasks["cpu_milli"]))) if arrived is None else list(arrived)
    by_task: dict[tuple[int, int, int, int, frozenset[str] | None], list[int]] = {}
    arrived_milli = 0
    left_out = 0
    for slot, i in enumerate(order):
        num, milli = _task_gpu(int(tasks["num_gpu"][i]), int(tasks["gpu_milli"][i]), f"tasks[{i}]")
        cpu, mem = int(tasks["cpu_milli"][i]), int(tasks["memory_mib"][i])
        if cpu < 0 or mem < 0:
            raise ValueError(f"tasks[{i}]: negative CPU or memory")
        arrived_milli += num * milli
        spec = [str(x).lower() for x in (tasks.get("gpu_models") or [[]] * (i + 1))[i]]
        allowed = frozenset(m for m in models if m in spec) if spec else None
        by_task.setdefault((cpu, mem, num, milli, allowed), []).append(slot)
    task_types: list[TaskType] = []
    for (cpu, mem, num, milli, allowed), slots in by_task.items():
        t = TaskType(cpu, mem, num, milli, allowed, tuple(slots))
        if any(_fits_empty(n, t) for n in node_types):
            task_types.append(t)
        else:
            left_out += t.count
    task_types.sort(key=lambda t: (-t.value, t.cpu_milli, t.memory_mib, t.slots[0]))
    return Problem(
        node_types,
        tuple(task_types),
        numa,
        capacity,
        arrived_milli,
        len(order),
        left_out,
    )


# -- placements ------------------------------------------------------------------------------

#: One placed task: (position in the arrived list, node index, the node's GPUs it takes).
Placed = tuple[int, int, tuple[int, ...]]


def check_placement(
    nodes: ReplayNodes,
    tasks: ReplayTasks,
    arrived: Sequence[int],
    placement: Sequence[Placed],
    *,
    numa: bool = False,
) -> int:
    """The GPU milli a placement allocates, after checking it against the replay's rules
    (raises ValueError naming the first violation)."""
    models = nodes["model"]
    spec_col = tasks.get("gpu_models")
    cpu_used: Counter[int] = Counter()
    mem_used: Counter[int] = Counter()
    gpu_used: Counter[tuple[int, int]] = Counter()
    owned: set[tuple[int, int]] = set()
    seen: set[int] = set()
    total = 0
    for slot, node, gpus in placement:
        if slot in seen or not 0 <= slot < len(arrived):
            raise ValueError(f"slot {slot}: placed twice or out of range")
        seen.add(slot)
        i = arrived[slot]
        num, milli = _task_gpu(int(tasks["num_gpu"][i]), int(tasks["gpu_milli"][i]), f"tasks[{i}]")
        g = int(nodes["gpu"][node])
        if num == 0 or len(gpus) != num or len(set(gpus)) != num:
            raise ValueError(f"slot {slot}: task {i} needs {num} GPUs, given {gpus}")
        if any(not 0 <= x < g for x in gpus):
            raise ValueError(f"slot {slot}: node {node} has {g} GPUs, given {gpus}")
        spec = [str(x).lower() for x in spec_col[i]] if spec_col is not None else []
        if spec and str(models[node]).lower() not in spec:
            raise ValueError(f"slot {slot}: task {i} may not run on model {models[node]}")
        cpu_used[node] += int(tasks["cpu_milli"][i])
        mem_used[node] += int(tasks["memory_mib"][i])
        if num == 1 and milli < GPU_MILLI:
            gpu_used[node, gpus[0]] += milli
        else:
            if not any(
                lo <= min(gpus) and max(gpus) < lo + z for lo, z in _zone_ranges(zones_of(g, numa))
            ):
                raise ValueError(f"slot {slot}: GPUs {gpus} of node {node} span zones")
            for x in gpus:
                gpu_used[node, x] += GPU_MILLI
                owned.add((node, x))
        total += num * milli
    for (node, x), used in gpu_used.items():
        if used > GPU_MILLI:
            raise ValueError(f"node {node} GPU {x}: {used} milli placed")
    for node, used in cpu_used.items():
        if used > int(nodes["cpu_milli"][node]) or mem_used[node] > int(nodes["memory_mib"][node]):
            raise ValueError(f"node {node}: CPU or memory over capacity")
    return total


def _zone_ranges(zones: Sequence[int]) -> list[tuple[int, int]]:
    """(first GPU, GPUs) per zone."""
    out = []
    lo = 0
    for z in zones:
        out.append((lo, z))
        lo += z
    return out


# -- the model -------------------------------------------------------------------------------


def share_patterns(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """The maximal multisets of share sizes on one GPU (sum <= 1000 and no size can be added),
    as counts per size in the order of `sizes`."""
    sz = list(sizes)
    if not sz:
        return []
    smallest = min(sz)
    out: list[tuple[int, ...]] = []

    def rec(i: int, left: int, cur: list[int]) -> None:
        if i == len(sz):
            if left < smallest:
                out.append(tuple(cur))
            return
        for c in range(left // sz[i], -1, -1):
            cur.append(c)
            rec(i + 1, left - c * sz[i], cur)
            cur.pop()

    rec(0, GPU_MILLI, [])
    return out


def _zone_options(z: int, whole_sizes: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
    """(GPUs left for shares, whole tasks per size) for every way to fill a zone of z GPUs."""
    opts: list[tuple[int, tuple[int, ...]]] = []

    def rec(i: int, left: int, cur: list[int]) -> None:
        if i == len(whole_sizes):
            opts.append((left, tuple(cur)))
            return
        for c in range(left // whole_sizes[i] + 1):
            cur.append(c)
            rec(i + 1, left - c * whole_sizes[i], cur)
            cur.pop()

    rec(0, z, [])
    return opts


def node_layouts(
    zones: Sequence[int], whole_sizes: Sequence[int]
) -> list[tuple[tuple[int, tuple[int, ...]], ...]]:
    """The ways to give a node's zones to whole-GPU tasks: per zone (GPUs left for shares,
    counts of whole tasks per size in `whole_sizes` order). One layout per distinct node total
    (shares' GPUs, counts per size)."""
    per_zone = [_zone_options(z, whole_sizes) for z in zones]
    seen: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], ...]] = {}

    def combine(zi: int, acc: list[tuple[int, tuple[int, ...]]]) -> None:
        if zi == len(per_zone):
            key = (
                sum(a for a, _ in acc),
                tuple(sum(c[j] for _, c in acc) for j in range(len(whole_sizes))),
            )
            seen.setdefault(key, tuple(acc))
            return
        for o in per_zone[zi]:
            acc.append(o)
            combine(zi + 1, acc)
            acc.pop()

    combine(0, [])
    return list(seen.values())


@dataclass(frozen=True)
class Bound:
    """The result for one instance. Allocations are GPU milli."""

    capacity_milli: int
    arrived_milli: int
    #: Upper bound on the GPU that any placement of the arrived tasks allocates: the LP
    #: relaxation's optimum, rounded down to `granularity` after a 1e-6 safety margin.
    max_alloc_milli: int
    #: The best placement found (checked with `check_placement`) and what it allocates.
    placement: tuple[Placed, ...]
    best_alloc_milli: int
    granularity: int
    lp_seconds: float
    #: MILP solves and placement construction.
    place_seconds: float
    columns: int
    rows: int

    def _pct(self, alloc: float) -> float:
        return unallocated_pct(self.capacity_milli, alloc)

    @property
    def bound_pct(self) -> float:
        """Lower bound on unallocated GPU, % of capacity."""
        return self._pct(self.max_alloc_milli)

    @property
    def best_pct(self) -> float:
        """Unallocated GPU % of the best placement found (the optimum when `closed`)."""
        return self._pct(self.best_alloc_milli)

    @property
    def gap_pct(self) -> float:
        """Best placement against the bound, points of capacity."""
        return 100.0 * (self.max_alloc_milli - self.best_alloc_milli) / max(1, self.capacity_milli)

    @property
    def closed(self) -> bool:
        return self.best_alloc_milli >= self.max_alloc_milli


def _round_down(x: float, g: int) -> int:
    return math.floor((x + SAFETY * max(1.0, abs(x))) / g) * g


class _Model:
    """The aggregated MILP (see the module docstring), built column by column."""

    def __init__(self, hs: Any, p: Problem) -> None:
        self.hs = hs
        self.p = p
        h = hs.Highs()
        for opt, setting in (("output_flag", False), ("threads", 1), ("random_seed", 1)):
            h.setOptionValue(opt, setting)
        h.changeObjectiveSense(hs.ObjSense.kMaximize)
        self.h = h
        self.resource_rows: list[tuple[int, float]] = []
        self.nrow = 0
        #: the patterns `restrict_patterns` fixed to 0, with their bounds before
        self._released: tuple[list[int], list[float], list[float]] | None = None
        self.ncol = 0
        self.integer: list[int] = []
        inf = hs.kHighsInf
        tt = p.task_types
        # rows per task type: placed <= arrived
        self.task_row = [self._row(float(t.count)) for t in tt]
        # per node type
        self.v: list[list[tuple[int, tuple[tuple[int, tuple[int, ...]], ...]]]] = []
        self.z: list[list[tuple[int, tuple[int, ...]]]] = []
        self.x: dict[tuple[int, int], int] = {}
        self.sizes: list[list[int]] = []
        self.whole_sizes: list[list[int]] = []
        for k, n in enumerate(p.node_types):
            compat = [t for t in range(len(tt)) if p.fits_empty(k, t)]
            shares = [t for t in compat if tt[t].is_share]
            wholes = [t for t in compat if not tt[t].is_share]
            sizes = sorted({tt[t].gpu_milli for t in shares})
            wsizes = sorted({tt[t].num_gpu for t in wholes})
            self.sizes.append(sizes)
            self.whole_sizes.append(wsizes)
            if not compat:
                self.v.append([])
                self.z.append([])
                continue
            r_nodes = self._row(float(n.count))
            r_share_gpus = self._row(0.0)
            r_size = {m: self._row(0.0) for m in sizes}
            r_wsize = {s: self._row(0.0) for s in wsizes}
            r_cpu = self._row(float(n.count) * n.cpu_milli)
            r_mem = self._row(float(n.count) * n.memory_mib)
            self.resource_rows.append((r_cpu, float(n.count) * n.cpu_milli))
            self.resource_rows.append((r_mem, float(n.count) * n.memory_mib))
            layouts = node_layouts(n.zones, wsizes)
            vs = []
            for lay in layouts:
                idx = [r_nodes]
                val = [1.0]
                share_gpus = sum(x for x, _ in lay)
                if sizes and share_gpus:
                    idx.append(r_share_gpus)
                    val.append(-float(share_gpus))
                for j, s in enumerate(wsizes):
                    c = sum(cz[j] for _, cz in lay)
                    if c:
                        idx.append(r_wsize[s])
                        val.append(-float(c))
                vs.append((self._col(0.0, float(n.count), idx, val), lay))
            self.v.append(vs)
            zs = []
            for pat in share_patterns(sizes):
                idx = [r_share_gpus] + [r_size[m] for m, c in zip(sizes, pat, strict=True) if c]
                val = [1.0] + [-float(c) for c in pat if c]
                zs.append((self._col(0.0, inf, idx, val), pat))
            self.z.append(zs)
            for t in compat:
                a = tt[t]
                idx = [self.task_row[t]]
                val = [1.0]
                idx.append(r_size[a.gpu_milli] if a.is_share else r_wsize[a.num_gpu])
                val.append(1.0)
                if a.cpu_milli:
                    idx.append(r_cpu)
                    val.append(float(a.cpu_milli))
                if a.memory_mib:
                    idx.append(r_mem)
                    val.append(float(a.memory_mib))
                self.x[t, k] = self._col(float(a.value), float(a.count), idx, val)

    def _row(self, ub: float) -> int:
        self.h.addRow(-self.hs.kHighsInf, ub, 0, [], [])
        self.nrow += 1
        return self.nrow - 1

    def _col(self, cost: float, ub: float, idx: list[int], val: list[float]) -> int:
        self.h.addCol(cost, 0.0, ub, len(idx), idx, val)
        self.integer.append(self.ncol)
        self.ncol += 1
        return self.ncol - 1

    def solve_lp(self) -> float:
        self.h.setOptionValue("solver", "simplex")
        self.h.run()
        if self.h.getModelStatus() != self.hs.HighsModelStatus.kOptimal:
            raise BoundError(f"LP relaxation: HiGHS status {self.h.getModelStatus()}")
        return float(self.h.getInfo().objective_function_value)

    def restrict_patterns(self) -> int:
        """Fixes to 0 the share patterns the LP solution does not use; returns how many stay."""
        val = self.h.getSolution().col_value
        off = [c for zs in self.z for c, _ in zs if val[c] <= 1e-9]
        if off:
            lp = self.h.getLp()
            self._released = (
                off,
                [lp.col_lower_[c] for c in off],
                [lp.col_upper_[c] for c in off],
            )
            self.h.changeColsBounds(len(off), off, [0.0] * len(off), [0.0] * len(off))
        return sum(len(zs) for zs in self.z) - len(off)

    def release_patterns(self) -> bool:
        """Undoes `restrict_patterns` (every pattern allowed again); False if it fixed none."""
        released = self._released
        if not released:
            return False
        off, lower, upper = released
        self.h.changeColsBounds(len(off), off, lower, upper)
        self._released = None
        return True

    def scale_resources(self, factor: float) -> None:
        """Scales every node type's CPU and memory (the placement MILP leaves slack so that the
        per-node-type totals can be split over the nodes)."""
        for r, cap in self.resource_rows:
            self.h.changeRowBounds(r, -self.hs.kHighsInf, cap * factor)

    def solve_mip(self, time_limit: float) -> list[float] | None:
        """An integer solution (the best found within the time limit), or None."""
        hs = self.hs
        n = len(self.integer)
        self.h.changeColsIntegrality(n, self.integer, [hs.HighsVarType.kInteger] * n)
        self.h.setOptionValue("time_limit", float(time_limit))
        self.h.setOptionValue("mip_rel_gap", 1e-6)
        self.h.run()
        if self.h.getInfo().primal_solution_status == 0:
            return None
        return list(self.h.getSolution().col_value)


def bound_keeping(p: Problem, keep: Sequence[int]) -> int:
    """The most GPU milli any placement allocates that places every arrived task at the
    positions `keep` (positions in the arrived list: the tasks a policy's replay placed), as the
    LP bound of `solve` with each task type's placed count at least its kept tasks (kept tasks
    the problem left out, CPU-only ones, place no GPU). With a replay's placed tasks kept, the
    bound says how much of that replay's distance to `solve`'s bound is packing (what re-placing
    the same tasks could win, the replay's moves included) and how much is which tasks were
    placed at all (the rest: the bound also chooses which arrived tasks to leave out). Raises
    `BoundError` if no relaxed placement holds the kept tasks."""
    model = _Model(_highspy(), p)
    if model.ncol == 0:  # no task type fits any node: nothing to keep either
        return 0
    type_of = _type_of(p)
    need = Counter(type_of[s] for s in keep if s in type_of)
    for t, n in need.items():
        model.h.changeRowBounds(model.task_row[t], float(n), float(p.task_types[t].count))
    return _max_alloc(p, model)


@dataclass(frozen=True)
class Admitted:
    """A run of `work_conserving`: what the rule placed of the arrived tasks."""

    capacity_milli: int
    alloc_milli: int
    #: Positions in the arrived list of the tasks it placed, in arrival order.
    placed: tuple[int, ...]
    #: Tasks it could not place, by request (num_gpu, gpu_milli).
    refused: Mapping[tuple[int, int], int]
    #: Solver runs (an arrival the last solution already holds needs none).
    solves: int
    seconds: float

    @property
    def unallocated_pct(self) -> float:
        return unallocated_pct(self.capacity_milli, self.alloc_milli)


def work_conserving(p: Problem, *, integer: bool = False, time_limit: float = 60.0) -> Admitted:
    """The arrived tasks in arrival order (their positions in the arrived list), each placed if
    some placement holds it together with every task placed before it, and refused otherwise
    (refused tasks are never placed later, as in the replay): a scheduler that places every
    task for which any re-placement of the running ones makes room, with free and unlimited
    moves, and refuses none that way. Feasibility is the model's: its LP relaxation by default
    (CPU and memory per node type, fractional counts: it may place a task no real placement
    holds), the integer program with `integer=True` (exact on the GPU side; for small
    instances, each run within `time_limit` seconds). CPU-only tasks and tasks that fit on no
    empty node are never placed, and CPU-only tasks take no room (as in the bound).

    A reference for issue 35's target, not a bound over every policy: it says what placing
    every task that fits can reach when the packing of the placed tasks is as good as any;
    a scheduler that packs worse may refuse a share this rule places and then place a larger
    task, and end lower. Raises `BoundError` if the solver fails (not infeasible: fails)."""
    hs = _highspy()
    t0 = time.perf_counter()
    model = _Model(hs, p)
    h = model.h
    placed: list[int] = []
    refused: Counter[tuple[int, int]] = Counter()
    if model.ncol == 0:
        return Admitted(p.capacity_milli, 0, (), {}, 0, time.perf_counter() - t0)
    if integer:
        n = len(model.integer)
        h.changeColsIntegrality(n, model.integer, [hs.HighsVarType.kInteger] * n)
        h.setOptionValue("time_limit", float(time_limit))
    else:
        h.setOptionValue("solver", "simplex")
    cols: dict[int, list[int]] = {}
    for (tk, _), c in model.x.items():
        cols.setdefault(tk, []).append(c)
    type_of = _type_of(p)
    count = Counter[int]()
    solution: Sequence[float] = [0.0] * model.ncol
    solves = 0
    ok = hs.HighsModelStatus.kOptimal
    infeasible = hs.HighsModelStatus.kInfeasible
    for slot in range(p.arrived_tasks):
        t = type_of.get(slot)
        if t is None:
            continue
        need = count[t] + 1
        upper = float(p.task_types[t].count)
        h.changeRowBounds(model.task_row[t], float(need), upper)
        # the last solution holds every task placed so far: if it also holds this one, so
        # does the model with the new lower bound
        if sum(solution[c] for c in cols.get(t, [])) < need - 1e-7:
            h.run()
            solves += 1
            status = h.getModelStatus()
            if status == infeasible:
                h.changeRowBounds(model.task_row[t], float(count[t]), upper)
                tt = p.task_types[t]
                refused[tt.num_gpu, tt.gpu_milli] += 1
                continue
            if status != ok:
                raise BoundError(f"work-conserving rule, arrival {slot}: HiGHS status {status}")
            solution = list(h.getSolution().col_value)
        count[t] = need
        placed.append(slot)
    alloc = sum(p.task_types[k].value * c for k, c in count.items())
    return Admitted(
        p.capacity_milli, alloc, tuple(placed), dict(refused), solves, time.perf_counter() - t0
    )


#: One running one-GPU instance as `stranded_bound` reads it: (CPU milli, memory MiB, RDMA %,
#: app, most instances of its app on one node (0 or less: no limit)).
RunningInstance = tuple[int, int, int, int, int]


def stranded_bound(
    nodes: int,
    per_node: Mapping[str, int],
    running: Sequence[RunningInstance],
    shapes: Sequence[Mapping[str, Any]],
) -> float:
    """A lower bound on F(M), in milli-GPU, of any placement of the one-GPU instances
    `running` on `nodes` nodes alike (`per_node`: "num_gpu", "cpu_milli", "memory_mib", "rdma",
    as `inference.Inventory.per_node`), for the workload `shapes` (`ShapeInput`s with a
    weight): what the optimum repacking of the running instances cannot go below, at one
    instant of the inference replay.

    F_n(M), as the replay's kernel counts it for a whole one-GPU shape m, is m's weight times
    the node's idle GPUs when m does not fit there (its CPU or RDMA left below m's), 0 when it
    does. Per shape, the model chooses O nodes where m fits ("open") and how many instances of
    each kind (CPU, memory, RDMA, app) run on them, the rest running on the other N - O nodes:
    the open nodes hold their instances within O nodes' GPUs, memory, and CPU and RDMA less m's
    per node, and u idle GPUs; the others hold the rest within N - O nodes' resources; an app
    with a per-node cap has at most cap x O instances on the open nodes and cap x (N - O) on the
    others. Any placement is such a solution (O = the nodes where m fits, u = their idle GPUs),
    so the most u is at least the idle GPU where m fits, and the idle GPU less that most u is at
    most m's stranded GPU; the bound is the weighted sum (fractions of instances allowed, O
    integral: a mixed-integer program of a few hundred columns per shape, HiGHS). Shapes that
    are not one whole GPU count 0 (F is never negative). Raises `ValueError` for an input it
    cannot read and `BoundError` if the instances fit no such split (not a real placement)."""
    hs = _highspy()
    n = int(nodes)
    g, cpu, mem, rdma = _node_capacity(per_node)
    if n < 0:
        raise ValueError("stranded_bound: negative nodes")
    kinds: Counter[RunningInstance] = Counter()
    for inst in running:
        if len(inst) != 5 or any(not isinstance(x, int) for x in inst) or min(inst[:3]) < 0:
            raise ValueError(f"stranded_bound: not a running instance: {inst!r}")
        kinds[inst] += 1
    idle = g * n - len(running)
    if idle <= 0:
        return 0.0
    ts = sorted(kinds.items())
    total = 0.0
    for w, c_m, r_m in _whole_shapes(shapes):
        if w <= 0:
            continue
        if c_m > cpu or r_m > rdma:
            total += w * idle  # m fits no node
            continue
        u = _most_idle_where_fits(hs, n, (g, cpu, mem, rdma), ts, c_m, r_m)
        total += w * max(0.0, idle - u)
    return total * GPU_MILLI


def stranded_of(
    nodes: int,
    per_node: Mapping[str, int],
    running: Sequence[RunningInstance],
    shapes: Sequence[Mapping[str, Any]],
    node_of: Sequence[int],
) -> float:
    """F(M), milli-GPU, of the placement `node_of` (a node index per instance) of the one-GPU
    instances `running` (as `stranded_bound`), after checking it: every node within its GPUs,
    CPU, memory and RDMA, and its instances of each app within their caps (`_caps_hold`;
    ValueError naming the first violation). F as the replay's kernel counts it for whole
    one-GPU shapes: a shape's weight times a node's idle GPUs where the shape's CPU or RDMA no
    longer fits."""
    g, cpu, mem, rdma = _node_capacity(per_node)
    whole = _whole_shapes(shapes)
    if len(node_of) != len(running):
        raise ValueError("stranded_of: one node per instance")
    use = [[0, 0, 0, 0] for _ in range(nodes)]
    caps: dict[tuple[int, int], list[int]] = {}
    for k, (inst, j) in enumerate(zip(running, node_of, strict=True)):
        if not 0 <= j < nodes:
            raise ValueError(f"instance {k}: no node {j}")
        for r, v in enumerate((1, inst[0], inst[1], inst[2])):
            use[j][r] += v
        if inst[4] > 0:
            caps.setdefault((j, inst[3]), []).append(inst[4])
    for (j, app), cs in sorted(caps.items()):
        if not _caps_hold(cs):
            raise ValueError(f"node {j}: app {app}'s instances beyond their caps {sorted(cs)}")
    for j, (ug, uc, um, ur) in enumerate(use):
        if ug > g or uc > cpu or um > mem or ur > rdma:
            raise ValueError(f"node {j}: over its capacity ({ug}, {uc}, {um}, {ur})")
    total = 0.0
    for ug, uc, _, ur in use:
        for w, c_m, r_m in whole:
            if cpu - uc < c_m or rdma - ur < r_m:
                total += w * (g - ug)
    return total * GPU_MILLI


def _node_capacity(per_node: Mapping[str, int]) -> tuple[int, int, int, int]:
    """(GPUs, CPU milli, memory MiB, RDMA %) of one node (`inference.Inventory.per_node`)."""
    try:
        cap = tuple(int(per_node[k]) for k in ("num_gpu", "cpu_milli", "memory_mib", "rdma"))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"per-node capacity: {e}") from None
    if min(cap) < 0:
        raise ValueError(f"per-node capacity: negative {cap}")
    g, cpu, mem, rdma = cap
    return g, cpu, mem, rdma


def _whole_shapes(shapes: Sequence[Mapping[str, Any]]) -> list[tuple[float, int, int]]:
    """(weight, CPU milli, RDMA %) of each of M's shapes that is one whole GPU, the shapes the
    kernel's F_n(M) counts a node's idle GPUs for when their CPU or RDMA no longer fits."""
    return [
        (
            float(s.get("weight") or 0.0),
            int(s.get("cpu_milli") or 0),
            int(s.get("rdma") or 0),
        )
        for s in shapes
        if int(s.get("gpus") or 0) == 1 and int(s.get("gpu_milli") or 0) == GPU_MILLI
    ]


def _caps_hold(caps: Sequence[int]) -> bool:
    """Whether instances of one app with these (positive) caps may run on one node: for each
    cap c, at most c of them have a cap of c or less. That is what the replay leaves (an
    instance is placed only where fewer than its cap of its app run, so when the last one with a
    cap of c or less came, fewer than c were there), and any such set is reachable (placed in
    the order of their caps, smallest first)."""
    return all(k <= c for k, c in enumerate(sorted(caps), start=1))


def stranded_repack(
    nodes: int,
    per_node: Mapping[str, int],
    running: Sequence[RunningInstance],
    shapes: Sequence[Mapping[str, Any]],
) -> tuple[float, list[int]] | None:
    """A repacking of the one-GPU instances `running` (as `stranded_bound`) that strands
    little, built greedily: the instances by RDMA, CPU and memory, largest first, each to the
    fullest node where it either leaves the node room for every whole one-GPU shape of
    `shapes` (a GPU, the most CPU and RDMA any asks for) or fills the node's last GPU, a new
    node otherwise, and where neither exists the fullest node that takes it. Returns its F(M)
    (checked by `stranded_of`) and the node of each instance, or None if some instance found
    no node. An upper side for the optimum repacking, beside `stranded_bound`'s lower one."""
    g, cpu, mem, rdma = _node_capacity(per_node)
    whole = _whole_shapes(shapes)
    keep_cpu = max((c for _, c, _ in whole), default=0)
    keep_rdma = max((r for _, _, r in whole), default=0)
    order = sorted(
        range(len(running)), key=lambda k: (-running[k][2], -running[k][0], -running[k][1], k)
    )
    use: list[list[int]] = []
    apps: list[dict[int, list[int]]] = []
    by_used: list[list[int]] = [[] for _ in range(g + 1)]
    node_of = [-1] * len(running)

    def fits(j: int, k: int, gl: int, cl: int, rl: int) -> bool:
        u, (c, m, r, a, cap) = use[j], running[k]
        return (
            u[0] + 1 <= gl
            and u[1] + c <= cl
            and u[2] + m <= mem
            and u[3] + r <= rl
            and (cap <= 0 or _caps_hold([*apps[j].get(a, []), cap]))
        )

    def first(k: int, safe: bool) -> int | None:
        for used in range(g - 1, -1, -1):
            for j in by_used[used]:
                if not safe and fits(j, k, g, cpu, rdma):
                    return j
                if safe and (
                    fits(j, k, g - 1, cpu - keep_cpu, rdma - keep_rdma)
                    or (used == g - 1 and fits(j, k, g, cpu, rdma))
                ):
                    return j
        return None

    for k in order:
        j = first(k, True)
        if j is None and len(use) < nodes:
            use.append([0, 0, 0, 0])
            apps.append({})
            by_used[0].append(len(use) - 1)
            j = len(use) - 1 if fits(len(use) - 1, k, g, cpu, rdma) else None
        if j is None:
            j = first(k, False)
        if j is None:
            return None
        c, m, r, a = running[k][:4]
        by_used[use[j][0]].remove(j)
        use[j] = [use[j][0] + 1, use[j][1] + c, use[j][2] + m, use[j][3] + r]
        by_used[use[j][0]].append(j)
        c_k = running[k][4]
        if c_k > 0:
            apps[j].setdefault(a, []).append(c_k)
        node_of[k] = j
    return stranded_of(nodes, per_node, running, shapes, node_of), node_of


def _most_idle_where_fits(
    hs: Any,
    n: int,
    cap: tuple[int, int, int, int],
    kinds: Sequence[tuple[RunningInstance, int]],
    c_m: int,
    r_m: int,
) -> float:
    """`stranded_bound`'s program for one shape: the most idle GPUs on nodes where it fits."""
    g, cpu, mem, rdma = cap
    inf = hs.kHighsInf
    h = hs.Highs()
    for opt, setting in (("output_flag", False), ("threads", 1), ("random_seed", 1)):
        h.setOptionValue(opt, setting)
    h.changeObjectiveSense(hs.ObjSense.kMaximize)
    h.addCol(0.0, 0.0, float(n), 0, [], [])  # O
    h.changeColIntegrality(0, hs.HighsVarType.kInteger)
    h.addCol(1.0, 0.0, inf, 0, [], [])  # u
    xs = []
    for k, (_, count) in enumerate(kinds):
        h.addCol(0.0, 0.0, float(count), 0, [], [])
        xs.append(2 + k)
    # (capacity of a node, each kind's use, what an open node keeps for the shape, is the GPU)
    per = [
        (g, [1.0] * len(kinds), 0, True),
        (cpu, [float(t[0]) for t, _ in kinds], c_m, False),
        (mem, [float(t[1]) for t, _ in kinds], 0, False),
        (rdma, [float(t[2]) for t, _ in kinds], r_m, False),
    ]
    for size, use, keep, gpu in per:
        # on the open nodes: their use (and, of the GPUs, the idle ones) within (size - keep)
        extra = [1.0] if gpu else []
        cols = ([1] if gpu else []) + xs
        h.addRow(-inf, 0.0, len(cols) + 1, [0, *cols], [-float(size - keep), *extra, *use])
        # on the others: the rest within size each: -use.x + size O <= size N - use.n
        rest = sum(v * c for v, (_, c) in zip(use, kinds, strict=True))
        h.addRow(
            -inf, float(size) * n - rest, len(xs) + 1, [0, *xs], [float(size), *(-v for v in use)]
        )
    # an app's instances with caps at most c: at most c on a node, for each cap c (`_caps_hold`)
    apps: dict[tuple[int, int], list[int]] = {}
    for t, _ in kinds:
        if t[4] > 0:
            apps[t[3], t[4]] = [
                k for k, (u, _) in enumerate(kinds) if u[3] == t[3] and 0 < u[4] <= t[4]
            ]
    for (_, cap_a), ks in sorted(apps.items()):
        cnt = sum(kinds[k][1] for k in ks)
        idx = [xs[k] for k in ks]
        h.addRow(-inf, 0.0, len(idx) + 1, [0, *idx], [-float(cap_a), *([1.0] * len(idx))])
        h.addRow(
            -inf,
            float(cap_a) * n - cnt,
            len(idx) + 1,
            [0, *idx],
            [float(cap_a), *([-1.0] * len(idx))],
        )
    h.setOptionValue("mip_rel_gap", 0.0)
    h.run()
    if h.getModelStatus() != hs.HighsModelStatus.kOptimal:
        raise BoundError(f"stranded_bound: HiGHS status {h.getModelStatus()}")
    # the MILP's dual bound is at least the optimum: never above the most u (a safe side)
    info = h.getInfo()
    return float(max(info.objective_function_value, info.mip_dual_bound))


def _granularity(p: Problem) -> int:
    """The gcd of the task types' GPU milli: every allocation is a multiple of it."""
    return reduce(math.gcd, (t.value for t in p.task_types), 0) or 1


def _max_alloc(p: Problem, model: _Model) -> int:
    """The LP relaxation's optimum rounded down to the granularity, at most what the capacity
    and the tasks allow."""
    trivial = min(p.capacity_milli, sum(t.value * t.count for t in p.task_types))
    return min(_round_down(model.solve_lp(), _granularity(p)), trivial)


#: a model this small gets a last MILP over every share pattern when the restricted ones fall
#: short of the bound (what keeps tiny instances exact)
EXACT_COLUMNS = 5000


def solve(
    p: Problem,
    *,
    mip_time_limit: float = 20.0,
    slack: Sequence[float] = (0.0, 0.05, 0.1, 0.2),
) -> Bound:
    """The LP bound, and the best placement built from the MILP with each node type's CPU and
    memory scaled by 1 - s for s in `slack` (each MILP within `mip_time_limit` seconds; stops
    once a placement reaches the bound)."""
    hs = _highspy()
    gran = _granularity(p)
    t0 = time.perf_counter()
    model = _Model(hs, p)
    if model.ncol == 0:
        return Bound(p.capacity_milli, p.arrived_milli, 0, (), 0, gran, 0.0, 0.0, 0, model.nrow)
    max_alloc = _max_alloc(p, model)
    t1 = time.perf_counter()
    model.restrict_patterns()
    type_of = _type_of(p)
    best: list[Placed] = []
    best_alloc = 0
    for s in slack:
        model.scale_resources(1.0 - s)
        sol = model.solve_mip(mip_time_limit)
        if sol is None:
            continue
        placement = _place(p, model, sol)
        alloc = sum(p.task_types[type_of[slot]].value for slot, _, _ in placement)
        if alloc > best_alloc:
            best, best_alloc = placement, alloc
        if best_alloc >= max_alloc:
            break
    if best_alloc < max_alloc and model.ncol <= EXACT_COLUMNS and model.release_patterns():
        # a small model: the MILP over every pattern, so that its placement is the optimum
        model.scale_resources(1.0)
        sol = model.solve_mip(mip_time_limit)
        if sol is not None:
            placement = _place(p, model, sol)
            alloc = sum(p.task_types[type_of[slot]].value for slot, _, _ in placement)
            if alloc > best_alloc:
                best, best_alloc = placement, alloc
    return Bound(
        p.capacity_milli,
        p.arrived_milli,
        max_alloc,
        tuple(best),
        best_alloc,
        gran,
        t1 - t0,
        time.perf_counter() - t1,
        model.ncol,
        model.nrow,
    )


def _type_of(p: Problem) -> dict[int, int]:
    return {s: t for t, tt in enumerate(p.task_types) for s in tt.slots}


class _Free:
    """What is left on every node while a placement is built."""

    def __init__(self, p: Problem) -> None:
        self.cpu: dict[int, int] = {}
        self.mem: dict[int, int] = {}
        self.gpu: dict[int, list[int]] = {}
        self.type_of: dict[int, int] = {}
        for k, n in enumerate(p.node_types):
            for i in n.nodes:
                self.cpu[i] = n.cpu_milli
                self.mem[i] = n.memory_mib
                self.gpu[i] = [GPU_MILLI] * n.gpus
                self.type_of[i] = k

    def room(self, node: int, t: TaskType) -> bool:
        return self.cpu[node] >= t.cpu_milli and self.mem[node] >= t.memory_mib

    def take(self, node: int, t: TaskType, gpus: Sequence[int]) -> None:
        self.cpu[node] -= t.cpu_milli
        self.mem[node] -= t.memory_mib
        for g in gpus:
            self.gpu[node][g] -= t.gpu_milli


def _place(p: Problem, model: _Model, sol: Sequence[float]) -> list[Placed]:
    """A placement from the MILP's solution: per node type, layouts and share patterns go to the
    nodes of the type, then the tasks the MILP put on the type go, most CPU first, to the node
    with the most CPU left that has a slot of their size; what does not fit (the MILP counts CPU
    and memory per node type, not per node) is then placed first-fit anywhere it fits, or not."""
    r = [round(v) for v in sol]
    tt = p.task_types
    pools = [list(t.slots) for t in tt]
    free = _Free(p)
    placed: list[Placed] = []
    left: list[tuple[int, int]] = []  # (type, slot)
    for k, n in enumerate(p.node_types):
        if not model.v[k]:
            continue
        wsizes = model.whole_sizes[k]
        sizes = model.sizes[k]
        lays = [lay for col, lay in model.v[k] for _ in range(r[col])]
        default = tuple((z, (0,) * len(wsizes)) for z in n.zones)
        # slots: share GPUs per size (node -> list of GPUs with a free slot), whole GPU sets
        share_gpus: list[tuple[int, int]] = []
        whole_slots: dict[int, dict[int, list[tuple[int, ...]]]] = {s: {} for s in wsizes}
        per_node_share: list[list[tuple[int, int]]] = []
        for node, lay in zip(n.nodes, lays + [default] * (n.count - len(lays)), strict=False):
            mine: list[tuple[int, int]] = []
            for (lo, _), (for_shares, counts) in zip(_zone_ranges(n.zones), lay, strict=True):
                g = lo
                for s, c in zip(wsizes, counts, strict=True):
                    for _ in range(c):
                        whole_slots[s].setdefault(node, []).append(tuple(range(g, g + s)))
                        g += s
                mine.extend((node, x) for x in range(g, g + for_shares))
            per_node_share.append(mine)
        # interleave nodes so that consecutive patterns land on different nodes
        depth = max((len(m) for m in per_node_share), default=0)
        for d in range(depth):
            share_gpus.extend(m[d] for m in per_node_share if d < len(m))
        pats = [pat for col, pat in model.z[k] for _ in range(r[col])]
        slot_of: dict[int, dict[int, list[int]]] = {m: {} for m in sizes}  # size -> node -> GPUs
        for (node, g), pat in zip(share_gpus, pats, strict=False):
            for m, c in zip(sizes, pat, strict=True):
                slot_of[m].setdefault(node, []).extend([g] * c)
        mine_tasks: list[int] = []
        for t in range(len(tt)):
            col = model.x.get((t, k))
            if col is not None and r[col] > 0:
                take = min(r[col], len(pools[t]))
                mine_tasks.extend([t] * take)
        cpu_n = float(max(1, n.cpu_milli))
        mem_n = float(max(1, n.memory_mib))
        # most CPU or memory first (as a share of the node's), each to the node with the most
        # room left in its tighter resource
        mine_tasks.sort(key=lambda t: (-max(tt[t].cpu_milli / cpu_n, tt[t].memory_mib / mem_n), t))
        for t in mine_tasks:
            task = tt[t]
            slots: Mapping[int, Sequence[object]] = (
                slot_of[task.gpu_milli] if task.is_share else whole_slots[task.num_gpu]
            )
            best = -1
            best_room = -1.0
            for node, gs in slots.items():
                if gs and free.room(node, task):
                    rm = min(free.cpu[node] / cpu_n, free.mem[node] / mem_n)
                    if rm > best_room:
                        best, best_room = node, rm
            slot = pools[t].pop()
            if best < 0:
                left.append((t, slot))
                continue
            if task.is_share:
                gpus: tuple[int, ...] = (slot_of[task.gpu_milli][best].pop(),)
            else:
                gpus = whole_slots[task.num_gpu][best].pop()
            free.take(best, task, gpus)
            placed.append((slot, best, gpus))
    for t, slot in left:
        pools[t].append(slot)
    _fill(p, free, pools, placed)
    return placed


def _fill(p: Problem, free: _Free, pools: list[list[int]], placed: list[Placed]) -> None:
    """Fills what is left on every node with unplaced tasks (any arrived task, not only those the
    MILP chose): per node, the most GPU-valuable task type that still fits, until none does."""
    tt = p.task_types
    order = sorted(range(len(tt)), key=lambda t: (-tt[t].value, tt[t].cpu_milli, t))
    for k, n in enumerate(p.node_types):
        compat = [t for t in order if p.fits_empty(k, t)]
        for node in n.nodes:
            while True:
                gs = free.gpu[node]
                if not any(gs) or not compat:
                    break
                where = None
                for t in compat:
                    if not pools[t] or not free.room(node, tt[t]):
                        continue
                    where = _gpus_for(n, gs, tt[t])
                    if where is not None:
                        break
                if where is None:
                    break
                free.take(node, tt[t], where)
                placed.append((pools[t].pop(), node, where))


def _gpus_for(n: NodeType, gs: Sequence[int], t: TaskType) -> tuple[int, ...] | None:
    """The GPUs a task takes on a node with `gs` milli free per GPU (shares: the fullest GPU with
    room; whole tasks: the first zone with enough untouched GPUs), or None."""
    if t.is_share:
        fit = [g for g in range(n.gpus) if gs[g] >= t.gpu_milli]
        return (min(fit, key=lambda g: gs[g]),) if fit else None
    for lo, z in _zone_ranges(n.zones):
        whole = [g for g in range(lo, lo + z) if gs[g] == GPU_MILLI]
        if len(whole) >= t.num_gpu:
            return tuple(whole[: t.num_gpu])
    return None
