"""The inference replay (issue 35): Alibaba's GPU-disaggregated DLRM serving trace (NSDI '25,
`disaggregated_DLRM_trace.csv`), instances arriving **and leaving** in time order, on a stated
cluster inventory, under one policy and seed (`pyctl.core.replay.run_events`; the engine is
`rust/src/replay/events.rs`).

What is replayed: the trace's HN instances (one GPU each) on the GPU nodes. CN instances run on
the CPU nodes, which hold no GPU: they cannot strand a GPU and are left out (counted). Arrival
is `creation_time` (empty: present at the start), departure `deletion_time` (empty: after the
end); `max_instance_per_node` is the app's anti-affinity cap on a node (-1: none); `rdma_request`
is a share of one RNIC (percent). Memory is a node resource (GiB -> MiB); disk is not modelled.
A row that cannot be read (a missing or non-numeric field, a negative request, a GPU request
other than 0 or 1, a time beyond `MAX_TIME`, a deletion before the creation) is left out,
counted and reported with its row number; it never stops the replay. An instance larger than
a node waits until it leaves and does not size the inventory (`InferenceTrace.oversized`).
"""

from __future__ import annotations

import csv
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from pyctl.core import replay as engine
from pyctl.core.fragmentation import derive_workload
from pyctl.core.inputs import EventCompaction, ReplayInstances, ReplayNodes, ShapeInput
from pyctl.core.types import EventsRaw
from pyctl.model import Shape

TRACE_FILE = "disaggregated_DLRM_trace.csv"
COLUMNS = (
    "instance_sn",
    "role",
    "app_name",
    "cpu_request",
    "gpu_request",
    "rdma_request",
    "memory_request",
    "max_instance_per_node",
    "creation_time",
    "deletion_time",
)
#: the policies of the inference replay: pyctl's (with its planner), pyctl's placement alone,
#: FGD and BestFit
POLICIES: tuple[str, ...] = ("pyctl", "pyctl-place", "fgd", "bestfit")
SEEDS: tuple[int, ...] = (42, 43, 44)
HOUR = 3600.0
DAY = 86400.0
#: Seconds between a replay's samples of its state (`replay`'s default).
SAMPLE_EVERY = 6 * HOUR
#: the resources an instance requests (its columns) and a node has
Resource = Literal["num_gpu", "cpu_milli", "memory_mib", "rdma"]
RESOURCES: tuple[Resource, ...] = ("num_gpu", "cpu_milli", "memory_mib", "rdma")


class InferenceTraceError(ValueError):
    """The trace file is missing, unreadable or has no usable GPU instance."""


@dataclass(frozen=True)
class Inventory:
    """The GPU nodes, all alike: `gpus` GPUs, `cpu` vCPU, `memory_gib` and `rnics` RNICs (100%
    RDMA each) per node. As many nodes as the trace's peak needs in its tightest resource with
    `headroom` to spare (0.05: the peak of each of GPU, CPU, memory and RDMA requested at once
    fills at most 1/1.05 of the cluster's), rounded up to whole nodes; `nodes` overrides."""

    gpus: int = 8
    cpu: int = 96
    memory_gib: int = 768
    rnics: int = 2
    headroom: float = 0.05
    nodes: int | None = None

    def per_node(self) -> dict[Resource, int]:
        """Capacity of one node in the instances' units (as `InferenceTrace.peaks`)."""
        return {
            "num_gpu": self.gpus,
            "cpu_milli": self.cpu * 1000,
            "memory_mib": self.memory_gib * 1024,
            "rdma": 100 * self.rnics,
        }

    def node_count(self, peaks: Mapping[str, int]) -> int:
        if self.nodes is not None:
            return self.nodes
        need = [
            math.ceil(peaks.get(k, 0) * (1.0 + self.headroom) / cap)
            for k, cap in self.per_node().items()
            if cap > 0
        ]
        return max([1, *need])

    def columns(self, peaks: Mapping[str, int]) -> ReplayNodes:
        n = self.node_count(peaks)
        return {
            "name": [f"hn-{i:04d}" for i in range(n)],
            "cpu_milli": [self.cpu * 1000] * n,
            "memory_mib": [self.memory_gib * 1024] * n,
            "gpu": [self.gpus] * n,
            "model": ["GPU"] * n,
            "rdma": [100 * self.rnics] * n,
        }


@dataclass(frozen=True)
class Compaction:
    """pyctl's planner in the inference replay: a round every `interval` seconds of trace time
    (rescue of the oldest waiting instance, then defragmentation: up to `max_moves` moves, each
    lowering F(M) by more than `min_gain` milli-GPU), evictions never above `budget_per_day` x
    the instance-days run so far; an arrival nothing takes is rescued with up to `rescue_depth`
    evictions (at most `rescue_budget` candidate sets). Like the controller's evictor, it moves
    no pod younger than `min_pod_age` seconds (placed or last moved since)."""

    interval: float = 3600.0
    budget_per_day: float = 0.01
    max_moves: int = 20
    min_gain: float = 1.0
    rescue_depth: int = 2
    rescue_budget: int = 64
    #: the controller's `evictor_min_pod_age_seconds` (its default, 0): no instance placed or
    #: last moved less than this many seconds ago is moved
    min_pod_age: float = 0.0

    def as_dict(self) -> EventCompaction:
        return EventCompaction(
            interval=self.interval,
            budget_per_day=self.budget_per_day,
            max_moves=self.max_moves,
            min_gain=self.min_gain,
            rescue_depth=self.rescue_depth,
            rescue_budget=self.rescue_budget,
            min_pod_age=self.min_pod_age,
        )


class TraceInstances(ReplayInstances):
    """The trace's instances: the core's columns and each instance's name (not read by it)."""

    name: list[str]


@dataclass(frozen=True)
class InferenceTrace:
    instances: TraceInstances
    end: float
    #: (row, reason) of each row left out
    skipped: list[tuple[int, str]] = field(default_factory=list)
    #: CPU-node (CN) instances, not replayed
    cpu_instances: int = 0

    @property
    def count(self) -> int:
        return len(self.instances["app"])

    def oversized(self, inventory: Inventory) -> list[int]:
        """The instances (indices) that ask for more of a resource than one node of `inventory`
        has: no node ever takes them (they wait until they leave), and they do not size the
        inventory."""
        cap = inventory.per_node()
        cols = self.instances
        return [i for i in range(self.count) if any(cols[k][i] > c for k, c in cap.items())]

    def peaks(self, inventory: Inventory | None = None) -> dict[str, int]:
        """The most of each resource (num_gpu, cpu_milli, memory_mib, rdma) requested at once
        (instances from their creation to their deletion; at one instant departures first),
        without the instances larger than a node of `inventory` (`oversized`)."""
        cols = self.instances
        skip = set(self.oversized(inventory)) if inventory is not None else set()
        out: dict[str, int] = {}
        for key in RESOURCES:
            ev: list[tuple[float, int, int]] = []
            for i, (a, d, v) in enumerate(
                zip(cols["arrive"], cols["depart"], cols[key], strict=True)
            ):
                if i in skip:
                    continue
                ev.append((a if a is not None else 0.0, 1, v))
                if d is not None:
                    ev.append((d, 0, -v))
            ev.sort()
            cur = peak = 0
            for _, _, v in ev:
                cur += v
                peak = max(peak, cur)
            out[key] = peak
        return out

    def workload(self) -> list[ShapeInput]:
        """M: FGD's typical shapes of the instances (`derive_workload`: the most frequent CPU
        and GPU requests covering 95%), each with the RDMA share most instances of that shape
        ask for."""
        cols = self.instances
        shapes = [
            Shape(cpu_milli=c, gpus=n, gpu_milli=m)
            for c, n, m in zip(cols["cpu_milli"], cols["num_gpu"], cols["gpu_milli"], strict=True)
        ]
        rdma: dict[tuple[Any, ...], Counter[int]] = {}
        for s, r in zip(shapes, cols["rdma"], strict=True):
            rdma.setdefault(s.key(), Counter())[r] += 1
        out: list[ShapeInput] = []
        for s in derive_workload(shapes).shapes:
            counts = rdma[s.key()]
            mode = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]
            out.append(
                {
                    "cpu_milli": s.cpu_milli,
                    "gpus": s.gpus,
                    "gpu_milli": s.gpu_milli,
                    "weight": s.weight,
                    "rdma": mode,
                }
            )
        return out


def _number(r: Mapping[str, str], col: str, *, negative: bool = False) -> float:
    """A finite number (non-negative unless `negative`); the error names the column."""
    try:
        v = float(r[col])
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or (v < 0 and not negative):
        raise ValueError(f"{col} is {r[col]!r}")
    return v


#: latest time a row may give (s): about 31 years, far beyond any trace
MAX_TIME = 1e9


def _time(r: Mapping[str, str], col: str) -> float | None:
    text = (r[col] or "").strip()
    if not text or text.lower() == "nan":
        return None
    v = _number(r, col)
    if v > MAX_TIME:
        raise ValueError(f"{col} {v} is beyond {MAX_TIME:.0e} s")
    return v


def load(path: str | Path) -> InferenceTrace:
    """Reads the trace (a directory holding `disaggregated_DLRM_trace.csv`, or the file)."""
    p = Path(path)
    if p.is_dir():
        p = p / TRACE_FILE
    if not p.is_file():
        raise InferenceTraceError(f"trace file not found: {p}")
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "rdma",
            "app",
            "max_per_node",
            "arrive",
            "depart",
        )
    }
    apps: dict[str, int] = {}
    skipped: list[tuple[int, str]] = []
    cpu_instances = 0
    end = 0.0
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InferenceTraceError(f"{p}: missing column(s) {missing}")
            for row, r in enumerate(reader, start=2):
                try:
                    if None in r or any(r[c] is None for c in COLUMNS):
                        raise ValueError("the row does not have the header's columns")
                    role = r["role"].strip()
                    if role not in ("HN", "CN"):
                        raise ValueError(f"role is {r['role']!r}, not HN or CN")
                    gpu = _number(r, "gpu_request")
                    if gpu not in (0.0, 1.0):
                        raise ValueError(f"gpu_request is {r['gpu_request']!r}, not 0 or 1")
                    cpu = _number(r, "cpu_request")
                    mem = _number(r, "memory_request")
                    rdma = _number(r, "rdma_request")
                    cap = int(_number(r, "max_instance_per_node", negative=True))
                    arrive = _time(r, "creation_time")
                    depart = _time(r, "deletion_time")
                    if arrive is not None and depart is not None and depart < arrive:
                        raise ValueError(f"deletion_time {depart} is before creation_time {arrive}")
                except (ValueError, TypeError, AttributeError) as e:
                    skipped.append((row, str(e)))
                    continue
                end = max(end, arrive or 0.0, depart or 0.0)
                if role == "CN" or gpu == 0.0:
                    cpu_instances += 1
                    continue
                cols["name"].append(r["instance_sn"])
                cols["cpu_milli"].append(round(cpu * 1000))
                cols["memory_mib"].append(round(mem * 1024))
                cols["num_gpu"].append(1)
                cols["gpu_milli"].append(1000)
                cols["rdma"].append(round(rdma))
                cols["app"].append(apps.setdefault(r["app_name"], len(apps)))
                cols["max_per_node"].append(max(cap, 0))
                cols["arrive"].append(arrive)
                cols["depart"].append(depart)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise InferenceTraceError(f"{p}: cannot read: {e}") from None
    if not cols["app"]:
        raise InferenceTraceError(f"{p}: no GPU (HN) instance could be read")
    # the columns named above: `TraceInstances`' keys
    return InferenceTrace(cast(TraceInstances, cols), end, skipped, cpu_instances)


@dataclass(frozen=True)
class InferenceResult:
    policy: str
    seed: int
    raw: EventsRaw = field(repr=False)
    seconds: float = 0.0

    @property
    def days(self) -> float:
        return self.raw["end"] / DAY

    @property
    def stranded_gpu_hours(self) -> float:
        """Idle GPU the workload's shapes cannot use (F(M)), integrated over the trace."""
        return self.raw["frag_milli_s"] / 1000.0 / HOUR

    @property
    def idle_gpu_hours(self) -> float:
        return self.raw["idle_milli_s"] / 1000.0 / HOUR

    @property
    def frag_rate(self) -> float:
        """Time-weighted fragmentation rate: integral of F(M) over integral of idle GPU, %."""
        idle = self.raw["idle_milli_s"]
        return 100.0 * self.raw["frag_milli_s"] / idle if idle > 0 else float("nan")

    @property
    def allocated_pct(self) -> float:
        cap = self.raw["gpu_capacity_milli"] * self.raw["end"]
        return 100.0 * self.raw["allocated_milli_s"] / cap if cap > 0 else float("nan")

    @property
    def pending_hours(self) -> float:
        return self.raw["pending_s"] / HOUR

    @property
    def success_pct(self) -> float:
        """Instances placed when they arrived, % of those that arrived."""
        a = self.raw["arrived"]
        return 100.0 * self.raw["placed_on_arrival"] / a if a else float("nan")

    @property
    def evictions_per_day(self) -> float:
        return self.raw["evictions"] / self.days if self.days > 0 else 0.0

    @property
    def evicted_pct_per_day(self) -> float:
        """Evictions per day, % of the instances running on average."""
        running = self.raw["running_s"] / self.raw["end"] if self.raw["end"] > 0 else 0.0
        return 100.0 * self.evictions_per_day / running if running > 0 else 0.0


def replay(
    trace: InferenceTrace,
    policy: str,
    seed: int,
    *,
    inventory: Inventory | None = None,
    compaction: Compaction | None = None,
    sample_every: float = SAMPLE_EVERY,
    log: bool = False,
    shuffle: bool = True,
) -> InferenceResult:
    """One inference replay. `policy` is one of `POLICIES` ("pyctl-place": pyctl's placement
    without its planner) or any engine policy; pyctl compacts with `compaction` (default
    `Compaction()`)."""
    inv = inventory or Inventory()
    engine_policy = "pyctl" if policy == "pyctl-place" else policy
    comp = None
    if policy == "pyctl":
        comp = (compaction or Compaction()).as_dict()
    t0 = time.perf_counter()
    raw = engine.run_events(
        inv.columns(trace.peaks(inv)),
        trace.instances,
        trace.workload(),
        policy=engine_policy,
        seed=seed,
        end=trace.end,
        shuffle=shuffle,
        compaction=comp,
        sample_every=sample_every,
        log=log,
    )
    return InferenceResult(policy, seed, raw, time.perf_counter() - t0)


def running_at_samples(result: InferenceResult) -> list[dict[int, int]]:
    """Where each instance running at each of `result`'s samples ran (instance -> node; a
    replay made with `log=True`): placed before the sample's instant, moved as the log says,
    not gone before it (a sample sees the state before the events of its instant). Each count
    is checked against the sample's own."""
    log = result.raw["log"]
    if not log and any(s["running"] for s in result.raw["samples"]):
        raise ValueError("running_at_samples needs a replay made with log=True")
    node_of: dict[int, int] = {}
    out: list[dict[int, int]] = []
    k = 0
    for s in result.raw["samples"]:
        while k < len(log) and log[k][0] < s["t"]:
            _, kind, i, node, to = log[k]
            if kind == "place":
                node_of[i] = node
            elif kind == "move":
                node_of[i] = to
            elif kind == "depart":
                node_of.pop(i, None)
            k += 1
        if len(node_of) != s["running"]:
            raise ValueError(
                f"the log gives {len(node_of)} instances running at t={s['t']}, the sample "
                f"{s['running']}"
            )
        out.append(dict(node_of))
    return out


@dataclass(frozen=True)
class Repacking:
    """The optimum repacking of what one sample's replay was running, bracketed (milli-GPU of
    F(M)): no repacking goes below `lower` (`bound.stranded_bound`); `own` is the replay's own
    placement (`bound.stranded_of`: the sample's F(M)) and `found` the greedy repacking
    (`bound.stranded_repack`; None if it placed not every instance), so the optimum is at most
    `best`."""

    t: float
    lower: float
    own: float
    found: float | None

    @property
    def best(self) -> float:
        return self.own if self.found is None else min(self.own, self.found)


def repack_at_samples(
    trace: InferenceTrace, result: InferenceResult, inventory: Inventory | None = None
) -> list[Repacking]:
    """At each of `result`'s samples, the least F(M) any repacking of the instances it was
    running then could reach, bracketed. `result` must come from a replay made with `log=True`
    on this trace and inventory."""
    from pyctl.replay import bound

    inv = inventory or Inventory()
    n = inv.node_count(trace.peaks(inv))
    cols = trace.instances
    shapes = trace.workload()
    per: dict[str, int] = {str(k): v for k, v in inv.per_node().items()}
    out = []
    for s, at in zip(result.raw["samples"], running_at_samples(result), strict=True):
        ids = sorted(at)
        running = [
            (
                cols["cpu_milli"][i],
                cols["memory_mib"][i],
                cols["rdma"][i],
                cols["app"][i],
                cols["max_per_node"][i],
            )
            for i in ids
        ]
        found = bound.stranded_repack(n, per, running, shapes)
        out.append(
            Repacking(
                s["t"],
                bound.stranded_bound(n, per, running, shapes),
                bound.stranded_of(n, per, running, shapes, [at[i] for i in ids]),
                None if found is None else found[0],
            )
        )
    return out


#: the figures of a run: column title, `InferenceResult` attribute, format
FIGURES: tuple[tuple[str, str, str], ...] = (
    ("stranded GPU-h", "stranded_gpu_hours", "{:.0f}"),
    ("frag. rate %", "frag_rate", "{:.2f}"),
    ("allocated %", "allocated_pct", "{:.2f}"),
    ("pending inst.-h", "pending_hours", "{:.1f}"),
    ("placed on arrival %", "success_pct", "{:.2f}"),
    ("evictions/day", "evictions_per_day", "{:.1f}"),
    ("% evicted/day", "evicted_pct_per_day", "{:.2f}"),
)


def table_rows(results: Sequence[InferenceResult]) -> list[list[str]]:
    """Per policy (in `POLICIES` order, then any other): its name, the median of each figure
    over its seeds (`FIGURES`) and the median seconds per run."""
    import statistics

    names = list(dict.fromkeys([*POLICIES, *(r.policy for r in results)]))
    rows = []
    for p in names:
        rs = [r for r in results if r.policy == p]
        if rs:
            cells = [
                fmt.format(statistics.median(float(getattr(r, attr)) for r in rs))
                for _, attr, fmt in FIGURES
            ]
            rows.append([p, *cells, f"{statistics.median(r.seconds for r in rs):.1f}"])
    return rows


def summary_line(results: Sequence[InferenceResult]) -> str:
    """The bench's last line: pyctl's and FGD's stranded GPU-hours and pending instance-hours
    (medians over the seeds) and pyctl's evictions per day."""
    import statistics

    def med(policy: str, attr: str) -> float:
        v = [float(getattr(r, attr)) for r in results if r.policy == policy]
        return statistics.median(v) if v else float("nan")

    return (
        "inference_replay: stranded GPU-hours pyctl {:.0f}, FGD {:.0f}; pending instance-hours "
        "pyctl {:.1f}, FGD {:.1f}; pyctl {:.1f} evictions/day ({:.2f}% of running instances "
        "per day)".format(
            med("pyctl", "stranded_gpu_hours"),
            med("fgd", "stranded_gpu_hours"),
            med("pyctl", "pending_hours"),
            med("fgd", "pending_hours"),
            med("pyctl", "evictions_per_day"),
            med("pyctl", "evicted_pct_per_day"),
        )
    )
