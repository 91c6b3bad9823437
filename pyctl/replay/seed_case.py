"""The seed article's deployment case (issue 8; `shared/seeds/004_*.txt` §6), simulated.

Cluster: 5 A100 nodes (8 x A100-SXM4-40GB each) and 3 CPU nodes (32 cores, 256 GiB). Replicas:
BERT-base on ``1g.5gb``, ResNet-152 on ``2g.10gb``, GPT-2 on a whole GPU. Two modes:

- ``exclusive``: MIG off, every replica takes one whole GPU (``nvidia.com/gpu: 1``).
- ``mig``: MIG on, every GPU starts as the article's 7 x ``1g.5gb``; BERT takes a ``1g.5gb``,
  ResNet a ``2g.10gb``, GPT-2 the full-GPU instance ``7g.40gb``. When a replica finds no free
  instance of its profile, pyctl's controller re-partitions free slices with the MIG planner
  (`pyctl.core.mig.plan_snapshot`, ``max_used_destroyed = 0``: only free instances change). If that
  cannot serve it, compaction: the planner may destroy up to ``move_budget`` used instances on a
  node; their replicas are evicted and placed again by the scheduler, counted as evictions.

Both run on the product's code: the simulated cluster (`pyctl.cluster.sim.cluster.SimCluster`,
whose scheduler admits a pod only where the kubelet would and applies MIG layouts as mig-parted
does) with pyctl's placement policy as its scheduler's extender (`pyctl.core.policy`).

Where §6 is silent the figures are ours (`KINDS`, documented in `docs/simulator.md`): replica mix,
per-replica GPU compute (fraction of one A100's SMs a replica keeps busy at its load) and GPU
memory, CPU/memory requests. A replica's need is absolute: it uses the same compute and memory on
a whole GPU as on its MIG instance. Replicas arrive one by one in a seeded random order; one that
fits nowhere (after re-partitioning and compaction) fails and is not retried.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyctl.cluster.records import PodRecord
from pyctl.cluster.sim.cluster import Extender, SimCluster, SimPod
from pyctl.cluster.translate import pod_shape
from pyctl.core import mig
from pyctl.core.policy import extender_scores, rank
from pyctl.model import Gpu, MigGpu, MigInstance, Node, Shape, Snapshot, Workload, Zone

GPU_MODEL = "A100-SXM4-40GB"
WHOLE = "7g.40gb"  # a whole A100 under MIG: the full-GPU instance
GPU_MEMORY_GB = 40.0
#: per GPU of a node, its instances as (profile, start)
Layouts = list[list[tuple[str, int]]]


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    profile: str  # MIG profile in mig mode (whole GPU = 7g.40gb)
    count: int
    compute: float  # fraction of one A100's SMs kept busy
    memory_gb: float  # GPU memory used
    cpu_milli: int
    memory_mib: int


#: Our figures where §6 is silent (§6 gives only the profiles; §2.3 gives 2 CPU / 4 GiB).
KINDS: tuple[Kind, ...] = (
    # BERT-base (110 M params): weights + CUDA context + batch ~3 GB; its 1g slice (1/7 = 14.3%
    # of the SMs) ~85% busy.
    Kind("bert-base", "1g.5gb", 50, 0.12, 3.0, 2000, 4096),
    # ResNet-152, large-batch inference: ~8 GB of 9.75; its 2g slice (28.6%) ~87% busy.
    Kind("resnet-152", "2g.10gb", 30, 0.25, 8.0, 4000, 8192),
    # GPT-2 (1.5 B, FP16) online: weights 3 GB + KV cache and batches ~20 GB, ~55% of the SMs.
    Kind("gpt-2", WHOLE, 20, 0.55, 20.0, 8000, 32768),
)


@dataclass(frozen=True, slots=True)
class Case:
    gpu_nodes: int = 5
    gpus_per_node: int = 8
    node_cpu_milli: int = 128000
    node_memory_mib: int = 1024 * 1024
    cpu_nodes: int = 3
    kinds: tuple[Kind, ...] = KINDS
    move_budget: int = 2  # used instances a compaction plan may destroy per node


@dataclass
class ModeResult:
    mode: str
    seed: int
    requested: int
    placed: int
    per_node: list[int]
    compute_used: float  # sum of replica compute (in GPUs)
    memory_used_gb: float
    gpus: int
    busy_gpus: int  # GPUs with at least one replica
    compute_alloc_slices: int  # compute slices held by replicas (whole GPU = 7)
    repartitions: int = 0  # planner runs applied
    evictions: int = 0
    failed: dict[str, int] = field(default_factory=dict)

    @property
    def success_pct(self) -> float:
        return 100.0 * self.placed / self.requested if self.requested else 100.0

    @property
    def compute_util_pct(self) -> float:
        return 100.0 * self.compute_used / self.gpus

    @property
    def memory_util_pct(self) -> float:
        return 100.0 * self.memory_used_gb / (self.gpus * GPU_MEMORY_GB)

    @property
    def compute_util_busy_pct(self) -> float:
        return 100.0 * self.compute_used / self.busy_gpus if self.busy_gpus else 0.0

    @property
    def memory_util_busy_pct(self) -> float:
        b = self.busy_gpus
        return 100.0 * self.memory_used_gb / (b * GPU_MEMORY_GB) if b else 0.0

    @property
    def compute_alloc_pct(self) -> float:
        return 100.0 * self.compute_alloc_slices / (7 * self.gpus)

    @property
    def replicas_per_node(self) -> float:
        return statistics.fmean(self.per_node) if self.per_node else 0.0


def arrivals(case: Case, seed: int) -> list[tuple[str, Kind]]:
    out = [(f"{k.name}-{i}", k) for k in case.kinds for i in range(k.count)]
    random.Random(seed).shuffle(out)
    return out


def node_name(n: int) -> str:
    return f"a100-{n}"


def _nodes(case: Case, mode: str, layouts: Mapping[str, Layouts]) -> tuple[Node, ...]:
    """The case's GPU nodes (one NUMA zone each, as in the article) and CPU nodes."""
    nodes = []
    for n in range(case.gpu_nodes):
        name = node_name(n)
        if mode == "exclusive":
            zone = Zone(
                0,
                case.node_cpu_milli,
                0,
                case.node_memory_mib,
                0,
                gpus=tuple(Gpu(g) for g in range(case.gpus_per_node)),
            )
        else:
            lay = layouts.get(name) or [
                [("1g.5gb", s) for s in range(7)] for _ in range(case.gpus_per_node)
            ]
            migs = tuple(
                MigGpu(g, tuple(MigInstance(p, st) for p, st in insts))
                for g, insts in enumerate(lay)
            )
            zone = Zone(0, case.node_cpu_milli, 0, case.node_memory_mib, 0, mig=migs)
        nodes.append(Node(name, GPU_MODEL, "none", zones=(zone,)))
    for n in range(case.cpu_nodes):
        nodes.append(Node(f"cpu-{n}", "", "none", zones=(Zone(0, 32000, 0, 256 * 1024, 0),)))
    return tuple(nodes)


def _shape(k: Kind, mode: str) -> Shape:
    if mode == "exclusive":
        return Shape(cpu_milli=k.cpu_milli, memory_mib=k.memory_mib, gpus=1, gpu_milli=1000)
    return Shape(
        cpu_milli=k.cpu_milli,
        memory_mib=k.memory_mib,
        mig_profile=k.profile,
        gpu_models=(GPU_MODEL,),
    )


def _workload(case: Case, mode: str) -> Workload:
    total = sum(k.count for k in case.kinds)
    return Workload(tuple(replace(_shape(k, mode), weight=k.count / total) for k in case.kinds))


def _policy(c: SimCluster) -> Extender:
    """pyctl's placement policy as the scheduler extender of the simulated cluster, on the
    cluster's own state."""

    def advise(pod: PodRecord, names: tuple[str, ...]) -> tuple[dict[str, str], dict[str, int]]:
        ranks = rank(c.model, pod_shape(pod), c.workload, names)
        return {}, dict(zip(names, extender_scores(ranks), strict=True))

    return advise


class CaseRun:
    """One mode of the case on the simulated cluster (`pyctl.cluster.sim.cluster.SimCluster`)
    with pyctl's placement policy as its scheduler's extender."""

    def __init__(
        self, case: Case, seed: int, mode: str, layouts: Mapping[str, Layouts] | None = None
    ) -> None:
        self.case, self.mode = case, mode
        self.cluster = SimCluster(
            _nodes(case, mode, layouts or {}), _workload(case, mode), seed=seed
        )
        self.cluster.extender = _policy(self.cluster)
        self.kind: dict[str, Kind] = {}
        self.repartitions = self.evictions = 0
        self.failed: dict[str, int] = {}

    def place(self, name: str, k: Kind) -> bool:
        pod = SimPod(name, _shape(k, self.mode))
        self.cluster.pods[name] = pod
        if self.cluster.schedule(pod):
            self.kind[name] = k
            return True
        del self.cluster.pods[name]
        return False

    def repartition(self, k: Kind, budget: int) -> bool:
        """pyctl's MIG planner for one pending replica of `k` (used instances it may destroy:
        `budget` per node, their replicas moved); applies the first node plan that serves it
        as mig-parted would (GPUs whose layout changes are emptied first)."""
        c = self.cluster
        demand = mig.Demand(
            pending=(mig.Pending(k.profile, 1),),
            shapes=c.workload.shapes,
            limits=mig.Limits(max_used_destroyed=budget, executor="mig-parted"),
        )
        for np_ in mig.plan_snapshot(Snapshot(c.current_nodes()), demand):
            served = {d["profile"]: d["served_after"] for d in np_.plan["demand"]}
            if served.get(k.profile, 0) < 1:
                continue
            moved = [
                str(key).rsplit("/", 1)[-1]
                for g in np_.plan["gpus"]
                if g["changed"]
                for key in g.get("pods_to_move") or []
            ]
            for name in moved:
                c.remove(c.pods[name])
            order = [m.gpu for z in c.by_name[np_.node].zones for m in z.mig]
            layouts: list[dict[str, int] | None] = [None] * len(order)
            for g in np_.plan["gpus"]:
                if g["changed"]:
                    counts: dict[str, int] = {}
                    for inst in g["layout"]:
                        counts[inst["profile"]] = counts.get(inst["profile"], 0) + 1
                    layouts[order.index(g["gpu"])] = counts
            if not c.reconfigure_mig(np_.node, layouts):
                raise AssertionError(f"mig-parted could not apply the plan on {np_.node}")
            self.repartitions += 1
            for name in moved:  # their controllers recreate them; the scheduler places them
                pod = c.pods[name]
                if not c.schedule(pod):
                    raise AssertionError(f"planner moved {name} with nowhere to go")
                self.evictions += 1
            return True
        return False

    def result(self, seed: int) -> ModeResult:
        c, case = self.cluster, self.case
        per_node = [0] * case.gpu_nodes
        compute = memory = 0.0
        for name, k in self.kind.items():
            per_node[int(c.pods[name].node.rsplit("-", 1)[1])] += 1
            compute += k.compute
            memory += k.memory_gb
        busy = alloc = 0
        slices = {p.name: p.compute_slices for p in mig.model(GPU_MODEL).profiles}
        for n in range(case.gpu_nodes):
            for z in c.zones[node_name(n)]:
                busy += sum(1 for f in z.gpu_free if f < 1000)
                alloc += 7 * sum(1 for f in z.gpu_free if f < 1000)
                for g in z.mig:
                    used = [p for p, u in g if u]
                    busy += bool(used)
                    alloc += sum(slices[p] for p in used)
        return ModeResult(
            self.mode,
            seed,
            sum(k.count for k in case.kinds),
            len(self.kind),
            per_node,
            compute,
            memory,
            case.gpu_nodes * case.gpus_per_node,
            busy,
            alloc,
            self.repartitions,
            self.evictions,
            self.failed,
        )


def run_exclusive(case: Case, seed: int) -> ModeResult:
    """MIG off: every replica takes one whole GPU, where pyctl's policy places it."""
    r = CaseRun(case, seed, "exclusive")
    for name, k in arrivals(case, seed):
        if not r.place(name, k):
            r.failed[k.name] = r.failed.get(k.name, 0) + 1
    return r.result(seed)


def run_mig(
    case: Case,
    seed: int,
    *,
    layouts: Mapping[str, Layouts] | None = None,
    repartition: bool = True,
    mode: str = "mig",
) -> ModeResult:
    """MIG on: every GPU starts as the article's 7 x 1g.5gb (or as `layouts` gives, by node);
    a replica that finds no instance of its profile gets pyctl's MIG planner (free slices
    first, then up to `move_budget` used instances moved), unless `repartition` is off."""
    r = CaseRun(case, seed, "mig", layouts)
    for name, k in arrivals(case, seed):
        if r.place(name, k):
            continue
        ok = False
        if repartition:
            for budget in (0, case.move_budget) if case.move_budget else (0,):
                if r.repartition(k, budget):
                    ok = True
                    break
        if not (ok and r.place(name, k)):
            r.failed[k.name] = r.failed.get(k.name, 0) + 1
    res = r.result(seed)
    res.mode = mode
    return res


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    exclusive: str
    mig: str
    article: tuple[str, str]
    how: str


def _med(vals: Sequence[float]) -> float:
    return statistics.median(vals)


def table(ex: Sequence[ModeResult], mg: Sequence[ModeResult]) -> list[Row]:
    """The article's table (§6.3) with our numbers, median over the seeds."""

    def both(f: object) -> tuple[str, str]:
        assert callable(f)
        return (f"{_med([f(r) for r in ex]):.0f}%", f"{_med([f(r) for r in mg]):.0f}%")

    def rpn(rs: Sequence[ModeResult]) -> str:
        lo = min(min(r.per_node) for r in rs)
        hi = max(max(r.per_node) for r in rs)
        return f"{_med([r.replicas_per_node for r in rs]):.1f} ({lo}-{hi})"

    return [
        Row(
            "GPU compute utilisation",
            *both(lambda r: r.compute_util_pct),
            ("47%", "85%"),
            "sum of the placed replicas' compute (share of one A100's SMs) / all 40 GPUs",
        ),
        Row(
            "GPU memory utilisation",
            *both(lambda r: r.memory_util_pct),
            ("52%", "88%"),
            "sum of the placed replicas' GPU memory / 40 x 40 GB",
        ),
        Row(
            "replicas per GPU node",
            rpn(ex),
            rpn(mg),
            ("6", "20"),
            "placed replicas / 5 GPU nodes (min-max over nodes and seeds); CPU nodes host none",
        ),
        Row(
            "scheduling success rate",
            *both(lambda r: r.success_pct),
            ("", ""),
            "placed / requested replicas (a replica that fits nowhere is not retried)",
        ),
        Row(
            "compute util. of GPUs in use",
            *both(lambda r: r.compute_util_busy_pct),
            ("", ""),
            "as the first row, over the GPUs holding at least one replica",
        ),
        Row(
            "memory util. of GPUs in use",
            *both(lambda r: r.memory_util_busy_pct),
            ("", ""),
            "as the second row, over the GPUs holding at least one replica",
        ),
        Row(
            "GPU compute allocated",
            *both(lambda r: r.compute_alloc_pct),
            ("", ""),
            "compute slices held by replicas (whole GPU = 7) / 40 x 7",
        ),
        Row(
            "re-partitions / evictions",
            "-",
            f"{_med([r.repartitions for r in mg]):.0f} / {_med([r.evictions for r in mg]):.0f}",
            ("", ""),
            "planner runs applied / replicas moved by compaction (median per run)",
        ),
    ]


def run(case: Case | None = None, seeds: Sequence[int] = range(42, 52)) -> list[Row]:
    c = case or Case()
    return table([run_exclusive(c, s) for s in seeds], [run_mig(c, s) for s in seeds])
