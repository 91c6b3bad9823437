"""Fragmentation scoring: how much idle GPU capacity is stranded, where, and why.

A thin facade over the Rust core (`pyctl._core.FragmentModel`): it flattens a `Snapshot` into
columns once, then scores it against workloads and answers "what if" questions (the fragment delta
of placing or removing one task on one node). Definitions: docs/fragmentation.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from pyctl import _core
from pyctl.core.inputs import AssignmentInput, ClusterColumns, ShapeInput
from pyctl.core.types import Assignment
from pyctl.model import Gpu, Shape, Snapshot, Workload

CATEGORIES: tuple[str, ...] = tuple(_core.CATEGORY_NAMES)


def snapshot_columns(s: Snapshot) -> ClusterColumns:
    """The flat arrays the core builds its cluster model from."""
    c = ClusterColumns(
        node_names=[],
        node_models=[],
        node_policies=[],
        node_cpu_static=[],
        node_memory_static=[],
        zone_offsets=[0],
        zone_numa=[],
        zone_cpu_milli=[],
        zone_cpu_used=[],
        zone_memory_mib=[],
        zone_memory_used=[],
        gpu_offsets=[0],
        gpu_ids=[],
        gpu_used_milli=[],
        gpu_link_groups=[],
        node_link_offsets=[0],
        link_sizes=[],
        link_gpu_ids=[],
        link_groups=[],
        mig_offsets=[0],
        mig_gpu_ids=[],
        instance_offsets=[0],
        instance_profiles=[],
        instance_starts=[],
        instance_used=[],
        dra_gpu_offsets=[0],
        dra_gpu_ids=[],
        dra_gpu_used_milli=[],
        mig_dra=[],
        mig_dynamic=[],
        mig_free_slices=[],
        node_gpu_pools=[],
        node_gpu_replicas=[],
        node_gpu_memory_mib=[],
    )
    rdma = any(n.rdma or n.rdma_used for n in s.nodes)
    if rdma:
        c["node_rdma"] = [n.rdma for n in s.nodes]
        c["node_rdma_used"] = [n.rdma_used for n in s.nodes]
    for n in s.nodes:
        c["node_names"].append(n.name)
        c["node_models"].append(n.gpu_model)
        c["node_policies"].append(n.topology_policy)
        c["node_cpu_static"].append(n.cpu_manager_policy == "static")
        c["node_memory_static"].append(n.memory_manager_policy == "static")
        c["node_gpu_pools"].append(n.gpu_pool)
        c["node_gpu_replicas"].append(n.gpu_replicas)
        c["node_gpu_memory_mib"].append(n.gpu_memory_mib)
        for z in n.zones:
            c["zone_numa"].append(z.numa)
            c["zone_cpu_milli"].append(z.cpu_milli)
            c["zone_cpu_used"].append(z.cpu_milli_used)
            c["zone_memory_mib"].append(z.memory_mib)
            c["zone_memory_used"].append(z.memory_mib_used)
            for g in z.gpus:
                c["gpu_ids"].append(g.id)
                c["gpu_used_milli"].append(g.used_milli)
                c["gpu_link_groups"].append(-1 if g.link is None else g.link)
                _link_entries(c, g, False)
            c["gpu_offsets"].append(len(c["gpu_ids"]))
            for g in z.dra_gpus:
                c["dra_gpu_ids"].append(g.id)
                c["dra_gpu_used_milli"].append(g.used_milli)
                _link_entries(c, g, True)
            c["dra_gpu_offsets"].append(len(c["dra_gpu_ids"]))
            for m in z.mig:
                c["mig_gpu_ids"].append(m.gpu)
                c["mig_dra"].append(m.dra)
                c["mig_dynamic"].append(m.dynamic)
                c["mig_free_slices"].append(-1 if m.free_slices is None else m.free_slices)
                for i in m.instances:
                    c["instance_profiles"].append(i.profile)
                    c["instance_starts"].append(i.start)
                    c["instance_used"].append(i.used)
                c["instance_offsets"].append(len(c["instance_profiles"]))
            c["mig_offsets"].append(len(c["mig_gpu_ids"]))
        c["zone_offsets"].append(len(c["zone_numa"]))
        c["node_link_offsets"].append(len(c["link_gpu_ids"]))
    return c


def _link_entries(c: ClusterColumns, g: Gpu, dra: bool) -> None:
    """A whole GPU's link groups at given sizes as the node's link entries, and for a DRA GPU
    its group of any size too (size 0; a device-plugin GPU's is in `gpu_link_groups`)."""
    levels = [(0, g.link)] if dra and g.link is not None else []
    for size, group in (*levels, *g.link_levels):
        c["link_sizes"].append(size)
        c["link_gpu_ids"].append(g.id)
        c["link_groups"].append(group)


#: the last workload's shapes as the core reads them (M is the same object for many calls: every
#: node's score, every rank), shared by the threads that read it (replaced whole)
_last_workload: tuple[Workload, list[ShapeInput]] | None = None


def workload_dicts(workload: Workload) -> list[ShapeInput]:
    """`workload`'s shapes as the core reads them (`shape_dict`), made once per workload object;
    the core only reads them, and so must every caller."""
    global _last_workload
    hit = _last_workload
    if hit is not None and hit[0] is workload:
        return hit[1]
    dicts = [shape_dict(s) for s in workload.shapes]
    _last_workload = (workload, dicts)
    return dicts


def shape_dict(s: Shape) -> ShapeInput:
    """`s` as the core reads it (`ShapeInput`)."""
    d: ShapeInput = {
        "cpu_milli": s.cpu_milli,
        "memory_mib": s.memory_mib,
        "gpus": s.gpus,
        "gpu_milli": s.gpu_milli,
        "mig_profile": s.mig_profile,
        "gpu_models": list(s.gpu_models),
        "weight": s.weight,
        "gpu_pool": s.gpu_pool,
        "gpu_memory_mib": s.gpu_memory_mib,
    }
    if s.dra:
        d["dra"] = True
        d["numa_aligned"] = s.numa_aligned
    if s.link_group:
        d["link_group"] = True
    if s.rdma:
        d["rdma"] = s.rdma
    return d


@dataclass(frozen=True, slots=True)
class ZoneScore:
    numa: int
    idle_gpu_milli: float
    fragment_gpu_milli: float
    idle_mig_slices: float
    fragment_mig_slices: float


@dataclass(frozen=True, slots=True)
class NodeScore:
    name: str
    idle_gpu_milli: float
    fragment_gpu_milli: float
    categories: dict[str, float]
    idle_mig_slices: float
    fragment_mig_slices: float
    mig_categories: dict[str, float]
    recoverable_mig_slices: float
    zones: tuple[ZoneScore, ...]
    #: on a node whose GPUs are shared: how the shares were read (docs/sharing.md) and, per GPU,
    #: (NUMA id, GPU id, used milli, ((pod, milli), ...))
    sharing: str = ""
    shares: tuple[tuple[int, int, int, tuple[tuple[str, int], ...]], ...] = ()
    #: how the pods' GPUs were attributed (`Node.gpu_source`): "agent (exact ...)" or "rules (why)"
    gpu_source: str = ""


@dataclass(frozen=True, slots=True)
class ClusterScore:
    nodes: tuple[NodeScore, ...]
    idle_gpu_milli: float = 0.0
    fragment_gpu_milli: float = 0.0
    categories: dict[str, float] = field(default_factory=dict)
    idle_mig_slices: float = 0.0
    fragment_mig_slices: float = 0.0
    mig_categories: dict[str, float] = field(default_factory=dict)
    recoverable_mig_slices: float = 0.0

    @property
    def fragmentation_rate(self) -> float:
        """Cluster fragment / cluster idle GPU (0 when nothing is idle)."""
        return self.fragment_gpu_milli / self.idle_gpu_milli if self.idle_gpu_milli else 0.0

    def to_json(self) -> dict[str, Any]:
        r = 6
        return {
            "cluster": {
                "idle_gpu_milli": round(self.idle_gpu_milli, r),
                "fragment_gpu_milli": round(self.fragment_gpu_milli, r),
                "fragmentation_rate": round(self.fragmentation_rate, r),
                "idle_mig_slices": round(self.idle_mig_slices, r),
                "fragment_mig_slices": round(self.fragment_mig_slices, r),
                "recoverable_mig_slices": round(self.recoverable_mig_slices, r),
                "categories": {k: round(v, r) for k, v in self.categories.items()},
                "mig_categories": {k: round(v, r) for k, v in self.mig_categories.items()},
            },
            "nodes": [
                {
                    "name": n.name,
                    "idle_gpu_milli": round(n.idle_gpu_milli, r),
                    "fragment_gpu_milli": round(n.fragment_gpu_milli, r),
                    "categories": {k: round(v, r) for k, v in n.categories.items()},
                    "idle_mig_slices": round(n.idle_mig_slices, r),
                    "fragment_mig_slices": round(n.fragment_mig_slices, r),
                    "mig_categories": {k: round(v, r) for k, v in n.mig_categories.items()},
                    "recoverable_mig_slices": round(n.recoverable_mig_slices, r),
                    **_sharing_json(n),
                    **({"gpu_source": n.gpu_source} if n.gpu_source else {}),
                    "zones": [
                        {
                            "numa": z.numa,
                            "idle_gpu_milli": round(z.idle_gpu_milli, r),
                            "fragment_gpu_milli": round(z.fragment_gpu_milli, r),
                            "idle_mig_slices": round(z.idle_mig_slices, r),
                            "fragment_mig_slices": round(z.fragment_mig_slices, r),
                        }
                        for z in n.zones
                    ],
                }
                for n in self.nodes
            ],
        }


def _sharing_json(n: NodeScore) -> dict[str, Any]:
    if not n.sharing:
        return {}
    return {
        "sharing": n.sharing,
        "gpus": [
            {"numa": numa, "id": gid, "used_milli": used, "pods": dict(holders)}
            for numa, gid, used, holders in n.shares
        ],
    }


@dataclass(frozen=True, slots=True)
class Delta:
    """Fragment after minus fragment before (negative: the change reduces fragmentation), and
    where the task sits (zone positions on the node; see `Assignment` in rust/src/fragment)."""

    fragment_gpu_milli: float
    fragment_mig_slices: float
    assignment: Assignment


class FragmentationModel:
    """A snapshot prepared for scoring: build once, then score and ask for deltas."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        #: the core's model (used by the facades of this package: `pyctl.core.policy`)
        self.core = _core.FragmentModel(snapshot_columns(snapshot))
        #: node name -> position in the snapshot
        self.index = {n.name: i for i, n in enumerate(snapshot.nodes)}

    def _node(self, name: str) -> int:
        try:
            return self.index[name]
        except KeyError:
            raise ValueError(f"node {name!r} is not in the snapshot") from None

    def score(self, workload: Workload) -> ClusterScore:
        raw = self.core.score(workload_dicts(workload))
        cat_rows = zip(*(raw["categories"][c] for c in CATEGORIES), strict=True)
        mig_rows = zip(*(raw["mig_categories"][c] for c in CATEGORIES), strict=True)
        zone_rows = iter(
            zip(
                raw["zone_idle_gpu_milli"],
                raw["zone_fragment_gpu_milli"],
                raw["zone_idle_mig_slices"],
                raw["zone_fragment_mig_slices"],
                strict=True,
            )
        )
        nodes = []
        for n, idle, frag, cats, imig, fmig, mcats, rec in zip(
            self.snapshot.nodes,
            raw["idle_gpu_milli"],
            raw["fragment_gpu_milli"],
            cat_rows,
            raw["idle_mig_slices"],
            raw["fragment_mig_slices"],
            mig_rows,
            raw["recoverable_mig_slices"],
            strict=True,
        ):
            zones = tuple(ZoneScore(z.numa, *next(zone_rows)) for z in n.zones)
            nodes.append(
                NodeScore(
                    n.name,
                    idle,
                    frag,
                    dict(zip(CATEGORIES, cats, strict=True)),
                    imig,
                    fmig,
                    dict(zip(CATEGORIES, mcats, strict=True)),
                    rec,
                    zones,
                    n.sharing,
                    tuple(
                        (z.numa, g.id, g.used_milli, g.holders)
                        for z in n.zones
                        for g in (*z.gpus, *z.dra_gpus)
                    )
                    if n.sharing
                    else (),
                    n.gpu_source,
                )
            )
        return ClusterScore(
            nodes=tuple(nodes),
            idle_gpu_milli=sum(raw["idle_gpu_milli"]),
            fragment_gpu_milli=sum(raw["fragment_gpu_milli"]),
            categories={c: sum(raw["categories"][c]) for c in CATEGORIES},
            idle_mig_slices=sum(raw["idle_mig_slices"]),
            fragment_mig_slices=sum(raw["fragment_mig_slices"]),
            mig_categories={c: sum(raw["mig_categories"][c]) for c in CATEGORIES},
            recoverable_mig_slices=sum(raw["recoverable_mig_slices"]),
        )

    def place_delta(self, node: str, task: Shape, workload: Workload) -> Delta | None:
        """The fragment delta of placing `task` on `node` where it grows fragment least, or None
        if the node cannot admit it."""
        shapes = workload_dicts(workload)
        d = self.core.place_delta(self._node(node), shape_dict(task), shapes)
        return None if d is None else Delta(**d)

    def remove_delta(
        self, node: str, assignment: Assignment | AssignmentInput, workload: Workload
    ) -> Delta:
        shapes = workload_dicts(workload)
        return Delta(**self.core.remove_delta(self._node(node), assignment, shapes))

    def apply(
        self, node: str, assignment: Assignment | AssignmentInput, place: bool = True
    ) -> None:
        """Place (or remove) a task at `assignment` on `node` in this model."""
        self.core.apply(self._node(node), assignment, place)


_EMPTY: FragmentationModel | None = None


@lru_cache(maxsize=4096)
def check_shape(shape: Shape) -> str | None:
    """Why the core refuses `shape` as a task of the workload M (its own message, without the
    field's position), or None if it takes it. Cached: pods repeat a few shapes."""
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = FragmentationModel(Snapshot(()))
    try:
        _EMPTY.core.score([shape_dict(replace(shape, weight=1.0))])
    except ValueError as e:
        return str(e).removeprefix("shapes[0].")
    return None


def score(snapshot: Snapshot, workload: Workload) -> ClusterScore:
    return FragmentationModel(snapshot).score(workload)


def derive_workload(tasks: Iterable[Shape], coverage: float = 0.95) -> Workload:
    """FGD's target workload from observed tasks: the most frequent shapes (by count, ignoring
    memory) until they cover at least `coverage` of the tasks, with renormalised weights."""
    counts: Counter[tuple[Any, ...]] = Counter()
    first: dict[tuple[Any, ...], Shape] = {}
    total = 0
    for t in tasks:
        k = t.key()
        counts[k] += 1
        first.setdefault(k, t)
        total += 1
    if total == 0:
        raise ValueError("cannot derive a workload from no tasks")
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], repr(kv[0])))
    chosen: list[tuple[tuple[Any, ...], int]] = []
    covered = 0
    for k, n in ordered:
        chosen.append((k, n))
        covered += n
        if covered >= coverage * total:
            break
    # each shape as first seen, without its memory (FGD's M keys shapes by CPU and GPU)
    return Workload(tuple(replace(first[k], memory_mib=0, weight=n / covered) for k, n in chosen))


def admits(n: NodeScore) -> bool:
    """Whether a node scored for one shape alone admits it (a part of its idle capacity is not
    fragment for that shape)."""
    return (
        n.fragment_gpu_milli < n.idle_gpu_milli - 1e-9
        or n.fragment_mig_slices < n.idle_mig_slices - 1e-9
    )


def too_full_for(shape: Shape, idle_gpu_milli: float, idle_mig_slices: float) -> bool:
    """Whether the cluster's idle capacity could not hold the shape even unfragmented."""
    if shape.mig_profile is None:
        return shape.gpus * shape.gpu_milli > idle_gpu_milli
    return idle_mig_slices == 0


def blocked_by(model: FragmentationModel, shapes: Iterable[Shape]) -> dict[str, int]:
    """Pending pods (their shapes, one per pod) that the idle capacity could hold in total but no
    node admits, counted by the category that strands the most capacity for their shape; a pod
    the cluster is too full for, or that some node admits (waiting, not blocked), is not
    counted. GPU and MIG shapes only."""
    out: Counter[str] = Counter()
    by_shape: dict[Shape, str | None] = {}
    idle: tuple[float, float] | None = None
    for shape in shapes:
        if shape.is_cpu_only:
            continue
        key = replace(shape, weight=1.0)
        if key not in by_shape:
            r = model.score(Workload((key,)))
            if idle is None:
                idle = (
                    sum(n.idle_gpu_milli for n in r.nodes),
                    sum(n.idle_mig_slices for n in r.nodes),
                )
            if too_full_for(key, *idle):
                by_shape[key] = None  # the cluster is full, not fragmented
            elif any(admits(n) for n in r.nodes):
                by_shape[key] = None  # a node admits it: waiting, not blocked
            else:
                cats = r.mig_categories if key.mig_profile else r.categories
                by_shape[key] = max(CATEGORIES, key=lambda c: cats[c])
        reason = by_shape[key]
        if reason is not None:
            out[reason] += 1
    return dict(out)


def worst_nodes(result: ClusterScore, limit: int | None = None) -> Sequence[NodeScore]:
    """Nodes by fragment, worst first (then by name)."""
    ranked = sorted(
        result.nodes, key=lambda n: (-(n.fragment_gpu_milli + n.fragment_mig_slices), n.name)
    )
    return ranked if limit is None else ranked[:limit]
