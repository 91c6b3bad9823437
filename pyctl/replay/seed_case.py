"""The seed article's deployment case (issue 8; `shared/seeds/004_*.txt` §6), simulated.

Cluster: 5 A100 nodes (8 x A100-SXM4-40GB each) and 3 CPU nodes (32 cores, 256 GiB). Replicas:
BERT-base on ``1g.5gb``, ResNet-152 on ``2g.10gb``, GPT-2 on a whole GPU. Two modes:

- ``exclusive``: MIG off, every replica takes one whole GPU (``nvidia.com/gpu: 1``).
- ``mig``: MIG on, every GPU starts as the article's 7 x ``1g.5gb``; BERT takes a ``1g.5gb``,
  ResNet a ``2g.10gb``, GPT-2 the full-GPU instance ``7g.40gb``. When a replica finds no free
  instance of its profile, pyctl's controller re-partitions free slices with the MIG planner
  (`pyctl.core.mig.plan_snapshot`, ``max_used_destroyed = 0``: only free instances change). If that
  cannot serve it, compaction: the planner may destroy up to ``move_budget`` used instances on a
  node; their replicas move to free instances of their profile (same node first), counted as
  evictions.

Where §6 is silent the figures are ours (`KINDS`, documented in `docs/simulator.md`): replica mix,
per-replica GPU compute (fraction of one A100's SMs a replica keeps busy at its load) and GPU
memory, CPU/memory requests. A replica's need is absolute: it uses the same compute and memory on
a whole GPU as on its MIG instance. Replicas arrive one by one in a seeded random order; one that
fits nowhere (after re-partitioning and compaction) fails and is not retried.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyctl.core import mig
from pyctl.model import MigGpu, MigInstance, Node, Shape, Snapshot, Zone

GPU_MODEL = "A100-SXM4-40GB"
WHOLE = "7g.40gb"  # a whole A100 under MIG: the full-GPU instance
GPU_MEMORY_GB = 40.0


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


class _Host:
    def __init__(self, case: Case) -> None:
        self.cpu = [0] * case.gpu_nodes
        self.mem = [0] * case.gpu_nodes
        self.case = case

    def fits(self, n: int, k: Kind) -> bool:
        c = self.case
        return (
            self.cpu[n] + k.cpu_milli <= c.node_cpu_milli
            and self.mem[n] + k.memory_mib <= c.node_memory_mib
        )

    def take(self, n: int, k: Kind, sign: int = 1) -> None:
        self.cpu[n] += sign * k.cpu_milli
        self.mem[n] += sign * k.memory_mib


def run_exclusive(case: Case, seed: int) -> ModeResult:
    """Every replica takes one whole GPU; first node (in order) with a free GPU, CPU and memory."""
    free = [case.gpus_per_node] * case.gpu_nodes
    host = _Host(case)
    per_node = [0] * case.gpu_nodes
    placed = 0
    compute = memory = 0.0
    failed: dict[str, int] = {}
    for _, k in arrivals(case, seed):
        n = next((n for n in range(case.gpu_nodes) if free[n] > 0 and host.fits(n, k)), None)
        if n is None:
            failed[k.name] = failed.get(k.name, 0) + 1
            continue
        free[n] -= 1
        host.take(n, k)
        per_node[n] += 1
        placed += 1
        compute += k.compute
        memory += k.memory_gb
    gpus = case.gpu_nodes * case.gpus_per_node
    return ModeResult(
        "exclusive",
        seed,
        sum(k.count for k in case.kinds),
        placed,
        per_node,
        compute,
        memory,
        gpus,
        placed,
        7 * placed,
        failed=failed,
    )


@dataclass
class _Inst:
    profile: str
    start: int
    pod: str | None = None


class MigCluster:
    """MIG state of the GPU nodes: per node, per GPU, its instances."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.gpus: list[list[list[_Inst]]] = [
            [[_Inst("1g.5gb", s) for s in range(7)] for _ in range(case.gpus_per_node)]
            for _ in range(case.gpu_nodes)
        ]
        self.where: dict[str, tuple[int, Kind]] = {}
        self.host = _Host(case)
        self.slices = {p.name: p.compute_slices for p in mig.model(GPU_MODEL).profiles}

    def node_name(self, n: int) -> str:
        return f"a100-{n}"

    def _used_slices(self, gpu: list[_Inst]) -> int:
        return sum(self.slices[i.profile] for i in gpu if i.pod is not None)

    def place(self, pod: str, k: Kind, *, prefer: int | None = None) -> bool:
        """Pack: the free instance of the profile on the GPU with the most used slices, the
        node with the most replicas; ties to the first. ``prefer`` is tried first."""
        best: tuple[tuple[int, int, int], int, _Inst] | None = None
        for n, node in enumerate(self.gpus):
            if not self.host.fits(n, k):
                continue
            used_node = sum(self._used_slices(g) for g in node)
            for g in node:
                for inst in g:
                    if inst.pod is None and inst.profile == k.profile:
                        key = (int(n == prefer), self._used_slices(g), used_node)
                        if best is None or key > best[0]:
                            best = (key, n, inst)
        if best is None:
            return False
        _, n, inst = best
        inst.pod = pod
        self.where[pod] = (n, k)
        self.host.take(n, k)
        return True

    def remove(self, pod: str) -> Kind:
        n, k = self.where.pop(pod)
        self.host.take(n, k, -1)
        return k

    def snapshot(self) -> Snapshot:
        nodes = []
        for n, node in enumerate(self.gpus):
            migs = tuple(
                MigGpu(
                    gi,
                    tuple(MigInstance(i.profile, i.start, i.pod is not None, i.pod) for i in g),
                )
                for gi, g in enumerate(node)
            )
            nodes.append(Node(self.node_name(n), GPU_MODEL, zones=(Zone(0, mig=migs),)))
        return Snapshot(tuple(nodes))

    def workload(self) -> tuple[Shape, ...]:
        total = sum(k.count for k in self.case.kinds)
        return tuple(
            Shape(mig_profile=k.profile, gpu_models=(GPU_MODEL,), weight=k.count / total)
            for k in self.case.kinds
        )

    def repartition(self, profile: str, move_budget: int) -> tuple[bool, int, int]:
        """Run the planner for one pending ``profile``; apply the first node plan that serves it.
        Returns (served, plans applied, pods evicted)."""
        demand = mig.Demand(
            pending=(mig.Pending(profile, 1),),
            shapes=self.workload(),
            limits=mig.Limits(max_used_destroyed=move_budget),
        )
        for np_ in mig.plan_snapshot(self.snapshot(), demand):
            served = {d["profile"]: d["served_after"] for d in np_.plan["demand"]}
            if served.get(profile, 0) < 1:
                continue
            n = int(np_.node.rsplit("-", 1)[1])
            moved: list[str] = []
            for g in np_.plan["gpus"]:
                if not g["changed"]:
                    continue
                moved += g["pods_to_move"]
                self.gpus[n][g["gpu"]] = [
                    _Inst(i["profile"], i["start"], i["pod"]) for i in g["layout"]
                ]
            for pod in moved:  # rehouse: same node first, then anywhere
                k = self.remove(pod)
                if not self.place(pod, k, prefer=n):
                    raise AssertionError(f"planner moved {pod} with nowhere to go")
            return True, 1, len(moved)
        return False, 0, 0

    def result(self, seed: int, failed: dict[str, int], reparts: int, evictions: int) -> ModeResult:
        c = self.case
        per_node = [0] * c.gpu_nodes
        compute = memory = 0.0
        for n, k in self.where.values():
            per_node[n] += 1
            compute += k.compute
            memory += k.memory_gb
        busy = sum(1 for node in self.gpus for g in node if any(i.pod for i in g))
        alloc = sum(self._used_slices(g) for node in self.gpus for g in node)
        return ModeResult(
            "mig",
            seed,
            sum(k.count for k in c.kinds),
            len(self.where),
            per_node,
            compute,
            memory,
            c.gpu_nodes * c.gpus_per_node,
            busy,
            alloc,
            reparts,
            evictions,
            failed,
        )


def run_mig(case: Case, seed: int) -> ModeResult:
    cl = MigCluster(case)
    failed: dict[str, int] = {}
    reparts = evictions = 0
    for pod, k in arrivals(case, seed):
        if cl.place(pod, k):
            continue
        ok = False
        for budget in (0, case.move_budget) if case.move_budget else (0,):
            ok, r, e = cl.repartition(k.profile, budget)
            reparts += r
            evictions += e
            if ok:
                break
        if not (ok and cl.place(pod, k)):
            failed[k.name] = failed.get(k.name, 0) + 1
    return cl.result(seed, failed, reparts, evictions)


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
