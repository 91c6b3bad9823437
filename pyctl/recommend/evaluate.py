"""Normalization evaluated by replay, on the product's code.

(a) The seed's deployment case (`pyctl.replay.seed_case`): the replicas and their usage (the
case's per-kind compute and GPU memory) go through `recommend` like a cluster's would; the
recommended sizes and resource classes (gpu-large nodes with MIG off, mig nodes with the
planner's layouts) are applied to the case's cluster, and the case's arrivals are replayed on
that fixed layout (and on it with pyctl's MIG re-partitioning when a replica finds no instance),
against the article's hand-picked layout (7 x 1g.5gb everywhere, with pyctl's re-partitioning and
compaction: `seed_case.run_mig`) and whole-GPU mode (`seed_case.run_exclusive`). Everything runs
through seed_case's public pieces (`Case`, `Kind`, `run_mig` with starting layouts, `ModeResult`).

(b) The openb traces (`pyctl.replay.trace`): the menu is chosen for the trace's GPU requests
(one pool of the trace's GPUs, shares on a grid); each GPU-share request is rounded up to it.
Both traces replay in the same arrival order (the order a normal replay of the original trace
draws: resampled to 1.3x capacity and shuffled by the seed), so they differ only by the sizes.
At 100% arrived (the arrivals until the original requests reach the cluster's GPU capacity),
per run: demand served (the original request of the placed tasks), unallocated GPU, and the
rounding waste of the placed tasks, each as % of the GPU capacity.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from pyctl.cluster.records import NodeRecord
from pyctl.core.fragmentation import derive_workload
from pyctl.core.types import ReplayRaw
from pyctl.model import Shape
from pyctl.recommend.inventory import Inventory, Owner, Replica, from_records
from pyctl.recommend.menu import Evaluator, Item, Tradeoff, tradeoff
from pyctl.recommend.prometheus import ContainerUsage, UsageReport
from pyctl.recommend.report import Options, Report, recommend
from pyctl.recommend.sizes import Need, Pool, smallest_holding
from pyctl.replay import seed_case as sc
from pyctl.replay.trace import SEEDS, Trace, TraceTasks, replay, task_shapes

MIB_PER_GB = Fraction(10**9, 2**20)

# ---- (a) the seed's deployment case ----------------------------------------------------------


#: A variant of the case (ours): the same replicas, requested one size too big (BERT on 2g.10gb,
#: ResNet on 3g.20gb), as an operator's first guess would; right-sizing from usage fixes it.
OVERSIZED: tuple[sc.Kind, ...] = tuple(
    dataclasses.replace(
        k, profile={"1g.5gb": "2g.10gb", "2g.10gb": "3g.20gb"}.get(k.profile, k.profile)
    )
    for k in sc.KINDS
)


def seed_inventory(case: sc.Case) -> tuple[Inventory, UsageReport]:
    """The case as pyctl would read it: its GPU nodes with the article's layout (7 x 1g.5gb on
    every GPU), its CPU nodes, one Deployment per kind with the article's profile, and usage
    series saying what each replica uses (the case's compute and GPU memory per kind)."""
    nodes = [
        NodeRecord(
            name=f"a100-{n}",
            gpu_model=sc.GPU_MODEL,
            cpu_milli=case.node_cpu_milli,
            memory_mib=case.node_memory_mib,
            mig=(("1g.5gb", 7 * case.gpus_per_node),),
            gpu_count_label=case.gpus_per_node,
            mig_config="all-1g.5gb",
        )
        for n in range(case.gpu_nodes)
    ] + [
        NodeRecord(name=f"cpu-{n}", cpu_milli=32000, memory_mib=256 * 1024)
        for n in range(case.cpu_nodes)
    ]
    inv = from_records(nodes, [])
    slices = {p: int(p.split("g.", 1)[0]) for p in {k.profile for k in case.kinds}}
    replicas = []
    usage = UsageReport("seed-case", 3600.0, 0.0, 60.0, util_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE")

    for k in case.kinds:
        owner = Owner("Deployment", "seed", k.name)
        share = Fraction(slices[k.profile], 7)
        for i in range(k.count):
            pod = f"{k.name}-7c9f-{i:05d}"
            shape = Shape(cpu_milli=k.cpu_milli, memory_mib=k.memory_mib, mig_profile=k.profile)
            replicas.append(Replica("seed", pod, owner, f"{k.name}-7c9f", "", shape, None))
            usage.containers[("seed", pod, "server")] = ContainerUsage(
                "seed",
                pod,
                "server",
                float(Fraction(str(k.memory_gb)) * MIB_PER_GB),
                min(1.0, k.compute / float(share)),
                (k.profile,),
                1,
                60,
            )
    return dataclasses.replace(inv, replicas=tuple(replicas)), usage


def normalized_case(case: sc.Case, report: Report) -> sc.Case:
    """The case with each kind's profile replaced by the size recommended for it."""
    by = {w.workload.owner.name: w for w in report.workloads}
    kinds = []
    for k in case.kinds:
        rec = by[k.name].recommended or k.profile
        kinds.append(dataclasses.replace(k, profile=sc.WHOLE if rec == "gpu" else rec))
    return dataclasses.replace(case, kinds=tuple(kinds))


def class_layouts(case: sc.Case, report: Report) -> dict[str, list[list[tuple[str, int]]]]:
    """Node -> per GPU the (profile, start) of its instances under the recommended classes:
    gpu-large GPUs hold one full-GPU instance, mig nodes the planner's layout; nodes no class
    needs keep the article's layout."""
    out: dict[str, list[list[tuple[str, int]]]] = {}
    for rc in report.classes.classes:
        if rc.name == "gpu-large":
            for n in rc.nodes:
                out[n] = [[(sc.WHOLE, 0)] for _ in range(case.gpus_per_node)]
    for np_ in report.classes.node_plans:
        gpus = sorted(np_.plan["gpus"], key=lambda g: g["gpu"])
        out[np_.node] = [[(i["profile"], int(i["start"])) for i in g["layout"]] for g in gpus]
    return out


def run_classes(
    case: sc.Case,
    layouts: dict[str, list[list[tuple[str, int]]]],
    seed: int,
    repartition: bool,
) -> sc.ModeResult:
    """The case's arrivals on the class layouts; with ``repartition``, a replica that finds no
    instance gets pyctl's planner as in `seed_case.run_mig`."""
    mode = "normalized+repartition" if repartition else "normalized"
    return sc.run_mig(case, seed, layouts=layouts, repartition=repartition, mode=mode)


@dataclass(frozen=True)
class SeedEvaluation:
    report: Report
    case: sc.Case
    normalized: sc.Case
    modes: dict[str, list[sc.ModeResult]]

    def rows(self) -> list[tuple[str, dict[str, str]]]:
        """(metric, mode -> median over the seeds)."""

        def med(f: Any) -> dict[str, str]:
            return {
                m: f"{statistics.median(f(r) for r in rs):.0f}%" for m, rs in self.modes.items()
            }

        def rpn(rs: Sequence[sc.ModeResult]) -> str:
            lo = min(min(r.per_node) for r in rs)
            hi = max(max(r.per_node) for r in rs)
            return f"{statistics.median(r.replicas_per_node for r in rs):.1f} ({lo}-{hi})"

        return [
            ("GPU compute utilisation", med(lambda r: r.compute_util_pct)),
            ("GPU memory utilisation", med(lambda r: r.memory_util_pct)),
            ("replicas per GPU node", {m: rpn(rs) for m, rs in self.modes.items()}),
            ("scheduling success", med(lambda r: r.success_pct)),
            ("GPU compute allocated", med(lambda r: r.compute_alloc_pct)),
            (
                "re-partitions / evictions",
                {
                    m: f"{statistics.median(r.repartitions for r in rs):.0f} / "
                    f"{statistics.median(r.evictions for r in rs):.0f}"
                    for m, rs in self.modes.items()
                },
            ),
        ]


def evaluate_seed_case(
    case: sc.Case | None = None,
    seeds: Sequence[int] = SEEDS,
    headroom: float = 0.2,
) -> SeedEvaluation:
    c = case or sc.Case()
    inv, usage = seed_inventory(c)
    report = recommend(inv, usage, Options(headroom=headroom))
    norm = normalized_case(c, report)
    layouts = class_layouts(c, report)
    modes = {
        "exclusive": [sc.run_exclusive(c, s) for s in seeds],
        "hand-picked": [sc.run_mig(c, s) for s in seeds],
        "normalized": [run_classes(norm, layouts, s, False) for s in seeds],
        "normalized+repartition": [run_classes(norm, layouts, s, True) for s in seeds],
    }
    return SeedEvaluation(report, c, norm, modes)


# ---- (b) the openb traces -----------------------------------------------------------------------


def trace_pool(trace: Trace, grid: int = 10) -> Pool:
    n = trace.nodes
    return Pool(
        f"trace:{trace.name}",
        tuple((name, g) for name, g in zip(n["name"], n["gpu"], strict=True) if g > 0),
        shares=True,
        grid=grid,
    )


def trace_groups(trace: Trace, pool: Pool) -> list[Item]:
    """The trace's GPU tasks as (need, request size, tasks)."""
    counts: dict[tuple[int, int], int] = {}
    for num, milli in zip(trace.tasks["num_gpu"], trace.tasks["gpu_milli"], strict=True):
        if num > 0:
            counts[(num, milli)] = counts.get((num, milli), 0) + 1
    out: list[Item] = []
    for (num, milli), c in sorted(counts.items()):
        size, need = pool.request_size(num, milli, None)
        out.append((need, size, c))
    return out


def trace_tradeoff(
    trace: Trace, max_k: int = 5, tolerance_pct: float = 1.0, grid: int = 10
) -> Tradeoff:
    pool = trace_pool(trace, grid)
    return tradeoff(Evaluator(pool, trace_groups(trace, pool)), max_k, tolerance_pct)


def normalize_milli(milli: int, menu: Sequence[str], pool: Pool) -> int:
    """A share request rounded up to the menu (unchanged when no menu size holds it)."""
    sizes = tuple(pool.size(n) for n in menu)
    s = smallest_holding(sizes, Need(1, Fraction(milli, 1000), None))
    return milli if s is None else s.milli


_T = TypeVar("_T")


def in_order(trace: Trace, order: Sequence[int], milli: Sequence[int] | None = None) -> Trace:
    """The trace's tasks in this arrival order (task indices; repeats are clones), with their
    GPU share replaced by ``milli`` (per task index) when given."""
    t = trace.tasks

    def pick(column: Sequence[_T]) -> list[_T]:
        return [column[i] for i in order]

    tasks = TraceTasks(
        name=pick(t["name"]),
        cpu_milli=pick(t["cpu_milli"]),
        memory_mib=pick(t["memory_mib"]),
        num_gpu=pick(t["num_gpu"]),
        gpu_milli=pick(t["gpu_milli"] if milli is None else milli),
    )
    if "gpu_models" in t:
        tasks["gpu_models"] = pick(t["gpu_models"])
    if "rdma" in t:
        tasks["rdma"] = pick(t["rdma"])
    return Trace(trace.name, trace.nodes, tasks, derive_workload(task_shapes(tasks)))


@dataclass(frozen=True)
class TraceRun:
    policy: str
    seed: int
    served_pct: float
    unallocated_pct: float
    waste_pct: float
    failed: int


def _at_100(trace: Trace, order_milli: Sequence[int], raw: ReplayRaw, n: int) -> TraceRun:
    cap = float(raw["gpu_capacity_milli"])
    num = trace.tasks["num_gpu"]
    served = allocated = 0.0
    failed = 0
    for slot in range(n):
        placed = raw.get("node_of", [])[slot] >= 0
        if not placed:
            failed += 1
            continue
        allocated += num[slot] * trace.tasks["gpu_milli"][slot]
        served += num[slot] * order_milli[slot]
    return TraceRun(
        "",
        0,
        100.0 * served / cap,
        100.0 - 100.0 * allocated / cap,
        100.0 * (allocated - served) / cap,
        failed,
    )


def replay_normalized(
    trace: Trace, menu: Sequence[str], policy: str, seed: int, grid: int = 10
) -> tuple[TraceRun, TraceRun]:
    """(as requested, normalized) at 100% arrived, in the same arrival order."""
    pool = trace_pool(trace, grid)
    first = replay(trace, policy, seed, placements=True)
    order = [int(i) for i in first.raw["task_of"]]
    n100 = next(
        (int(c["arrived_tasks"]) for c in first.raw["checkpoints"] if c["arrived_pct"] == 100),
        len(order),
    )
    original = trace.tasks["gpu_milli"]
    nums = trace.tasks["num_gpu"]
    rounded = [
        normalize_milli(m, menu, pool) if g == 1 and 0 < m < 1000 else m
        for g, m in zip(nums, original, strict=True)
    ]
    orig_in_order = [original[i] for i in order]
    out = []
    for milli in (None, rounded):
        t = in_order(trace, order, milli)
        r = replay(t, policy, seed, tune=0.0, shuffle=False, placements=True)
        run = _at_100(t, orig_in_order, r.raw, n100)
        out.append(dataclasses.replace(run, policy=policy, seed=seed))
    return out[0], out[1]
