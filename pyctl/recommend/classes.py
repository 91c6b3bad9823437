"""Node resource classes for the normalized demand (the seed's ``gpu-large`` / ``mig-medium`` /
``cpu-micro``): which nodes each class needs, their labels, and for MIG nodes their layout from
pyctl's MIG planner as a mig-parted config.

Classes, labelled ``pyctl.io/resource-class=<class>`` (replicas select theirs with a node
selector; the GPU model is GFD's ``nvidia.com/gpu.product``):

- ``gpu-large``: whole GPUs, MIG disabled (``nvidia.com/mig.config=all-disabled``), for replicas
  of one or more whole GPUs. Nodes without MIG first, then by name; each node is filled with the
  multi-GPU replicas (largest first) and then single GPUs.
- ``mig``: MIG GPUs for the MIG sizes. The demand is split over the fewest nodes whose GPUs can
  hold its compute slices, in proportion to their GPUs, and each node's layout is the planner's
  (`pyctl.core.mig.plan` on empty GPUs, executor ``mig-parted``) for its share plus what earlier
  nodes could not serve; nodes are added until everything is served or the pool has none left.
- ``gpu-shared``: time-sliced GPUs for sub-GPU shares (pools without MIG whose requests are
  shares): first fit, largest first.
- ``cpu-micro``: CPU-only nodes for CPU-only replicas: first fit by CPU, then memory.

Classes are node-granular; a node's spare capacity stays in its class. The placement of the
replicas running now is not considered: this is the target layout for the normalized demand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pyctl.core import mig
from pyctl.core.inputs import MigGpuInput, MigWorkloadInput
from pyctl.jsontypes import JsonObject
from pyctl.recommend.inventory import NodeInfo
from pyctl.recommend.menu import Item
from pyctl.recommend.rightsize import CLASS_LABEL, CPU_MICRO, GPU_LARGE, GPU_SHARED, MIG
from pyctl.recommend.sizes import Pool

MIG_DISABLED: Final = "all-disabled"
__all__ = ["CPU_MICRO", "GPU_LARGE", "GPU_SHARED", "MIG", "ClassPlan", "ResourceClass"]


@dataclass(frozen=True)
class ResourceClass:
    name: str
    pool: str
    #: size -> replicas of the normalized demand
    demand: dict[str, int]
    nodes: tuple[str, ...]
    gpus: int
    #: replicas the pool's nodes could not take
    shortfall: dict[str, int] = field(default_factory=dict)
    #: MIG nodes: node -> mig-parted config name (the nvidia.com/mig.config label value)
    node_configs: dict[str, str] = field(default_factory=dict)
    #: nodes that have MIG on now (gpu-large) or off now (mig): they must be re-partitioned
    reconfigure: tuple[str, ...] = ()

    def label_commands(self) -> list[str]:
        out = []
        for n in self.nodes:
            extra = ""
            if self.name == GPU_LARGE and n in self.reconfigure:
                extra = f" nvidia.com/mig.config={MIG_DISABLED}"
            elif n in self.node_configs:
                extra = f" nvidia.com/mig.config={self.node_configs[n]}"
            out.append(f"kubectl label node {n} {CLASS_LABEL}={self.name}{extra} --overwrite")
        return out

    def to_json(self) -> JsonObject:
        return {
            "class": self.name,
            "pool": self.pool,
            "label": {CLASS_LABEL: self.name},
            "demand": dict(self.demand),
            "nodes_needed": len(self.nodes),
            "nodes": list(self.nodes),
            "gpus": self.gpus,
            "shortfall": dict(self.shortfall),
            "mig_configs": dict(self.node_configs),
            "reconfigure": list(self.reconfigure),
            "commands": list(self.label_commands()),
        }


@dataclass(frozen=True)
class ClassPlan:
    classes: tuple[ResourceClass, ...]
    #: pool -> nodes no class needs
    spare: dict[str, tuple[str, ...]]
    #: the mig-parted config file holding every MIG node's layout (None: no MIG class)
    mig_parted: JsonObject | None
    node_plans: tuple[mig.NodePlan, ...] = ()


def _split(total: Mapping[str, int], weights: Sequence[int]) -> list[dict[str, int]]:
    """``total`` shared out in proportion to ``weights`` (largest remainder per key)."""
    out: list[dict[str, int]] = [{} for _ in weights]
    w = sum(weights)
    for key, n in total.items():
        raw = [n * x / w for x in weights]
        base = [int(r) for r in raw]
        for i in sorted(range(len(raw)), key=lambda i: (-(raw[i] - base[i]), i))[: n - sum(base)]:
            base[i] += 1
        for i, b in enumerate(base):
            if b:
                out[i][key] = b
    return out


def _gpu_large(
    pool: Pool, nodes: list[NodeInfo], whole: int, multi: Mapping[int, int]
) -> tuple[ResourceClass | None, list[NodeInfo]]:
    if not whole and not multi:
        return None, nodes
    order = sorted(nodes, key=lambda n: (n.mig_on, n.name))
    left_multi = Counter(multi)
    left = whole
    used: list[NodeInfo] = []
    for n in order:
        if left <= 0 and not +left_multi:
            break
        free = n.gpus
        took = False
        for g in sorted(left_multi, reverse=True):
            while left_multi[g] > 0 and free >= g:
                left_multi[g] -= 1
                free -= g
                took = True
        k = min(free, left)
        if k > 0:
            left -= k
            took = True
        if took:
            used.append(n)
    demand = {"gpu": whole} if whole else {}
    demand.update({f"{g} gpus": c for g, c in sorted(multi.items())})
    shortfall = {"gpu": left} if left > 0 else {}
    shortfall.update({f"{g} gpus": c for g, c in sorted(left_multi.items()) if c > 0})
    names = {n.name for n in used}
    rc = ResourceClass(
        GPU_LARGE,
        pool.gpu_model,
        demand,
        tuple(n.name for n in used),
        sum(n.gpus for n in used),
        shortfall,
        reconfigure=tuple(n.name for n in used if n.mig_on),
    )
    return rc, [n for n in nodes if n.name not in names]


def _mig(
    pool: Pool, nodes: list[NodeInfo], counts: Mapping[str, int]
) -> tuple[ResourceClass | None, list[NodeInfo], list[mig.NodePlan]]:
    if not counts or pool.mig_model is None:
        return None, nodes, []
    model = mig.model(pool.mig_model)
    slices = {p.name: p.compute_slices for p in model.profiles}
    need_slices = sum(slices[p] * n for p, n in counts.items())
    order = sorted(nodes, key=lambda n: (not n.mig_on, n.name))
    first: list[NodeInfo] = []
    for n in order:
        if sum(x.gpus for x in first) * model.compute_slices >= need_slices:
            break
        first.append(n)
    shares = _split(counts, [n.gpus for n in first]) if first else []
    total = sum(counts.values())
    weights: list[MigWorkloadInput] = [
        {"profile": p, "weight": c / total} for p, c in sorted(counts.items())
    ]
    carry: Counter[str] = Counter()
    plans: list[mig.NodePlan] = []
    for i, n in enumerate(order):
        pending = Counter(shares[i]) if i < len(shares) else Counter()
        pending += carry
        if not +pending:
            break
        gpus: list[MigGpuInput] = [{"gpu": g, "instances": []} for g in range(n.gpus)]
        plan = mig.plan(model.name, gpus, dict(+pending), weights, {"executor": "mig-parted"})
        got = {d["profile"]: d["served_after"] for d in plan["demand"]}
        carry = Counter({p: c - min(c, got.get(p, 0)) for p, c in pending.items()})
        if sum(got.values()):
            plans.append(mig.NodePlan(n.name, model.name, model.placements_inferred, plan))
    used = {p.node for p in plans}
    configs = mig.node_config_names(plans)
    served: Counter[str] = Counter()
    for np_ in plans:
        for d in np_.plan["demand"]:
            served[d["profile"]] += d["served_after"]
    rc = ResourceClass(
        MIG,
        pool.gpu_model,
        dict(sorted(counts.items())),
        tuple(p.node for p in plans),
        sum(n.gpus for n in nodes if n.name in used),
        {p: c - served[p] for p, c in sorted(counts.items()) if c > served[p]},
        configs,
        reconfigure=tuple(n.name for n in nodes if n.name in used and not n.mig_on),
    )
    return rc, [n for n in nodes if n.name not in used], plans


def _first_fit(
    bins: Sequence[tuple[str, list[int]]], items: Mapping[int, int]
) -> tuple[list[str], int]:
    """Items of one dimension (sizes -> counts) into bins (name, capacities per slot), largest
    first, bin by bin: (bins used, items left)."""
    left = Counter(items)
    used = []
    for name, slots in bins:
        if not +left:
            break
        free = list(slots)
        took = False
        for size in sorted(left, reverse=True):
            for i in range(len(free)):
                while left[size] > 0 and free[i] >= size:
                    free[i] -= size
                    left[size] -= 1
                    took = True
        if took:
            used.append(name)
    return used, sum(left.values())


def plan_classes(
    pools: Mapping[str, Pool],
    nodes: Sequence[NodeInfo],
    items: Mapping[str, Sequence[Item]],
    cpu_replicas: Sequence[tuple[int, int]] = (),
) -> ClassPlan:
    """Classes per pool for its normalized items (need, size, replicas), and ``cpu-micro`` for
    the CPU-only replicas ((cpu milli, memory MiB) each)."""
    info = {n.name: n for n in nodes}
    classes: list[ResourceClass] = []
    spare: dict[str, tuple[str, ...]] = {}
    all_plans: list[mig.NodePlan] = []
    for name, pool in pools.items():
        left = [info[n] for n, _ in pool.nodes if n in info and info[n].ready]
        whole = 0
        multi: Counter[int] = Counter()
        mig_counts: Counter[str] = Counter()
        share_counts: Counter[int] = Counter()
        for need, size, n in items.get(name, ()):
            if need.gpus != 1:
                multi[need.gpus] += n
            elif size is None:
                continue
            elif size.kind == "gpu":
                whole += n
            elif size.kind == "mig" and size.profile:
                mig_counts[size.profile] += n
            else:
                share_counts[size.milli] += n
        rc, left = _gpu_large(pool, left, whole, multi)
        if rc:
            classes.append(rc)
        rc, left, plans = _mig(pool, left, mig_counts)
        if rc:
            classes.append(rc)
            all_plans += plans
        if share_counts:
            used, short = _first_fit([(n.name, [1000] * n.gpus) for n in left], share_counts)
            classes.append(
                ResourceClass(
                    GPU_SHARED,
                    pool.gpu_model,
                    {f"{m / 1000:g}gpu": c for m, c in sorted(share_counts.items())},
                    tuple(used),
                    sum(info[u].gpus for u in used),
                    {"shares": short} if short else {},
                )
            )
            left = [n for n in left if n.name not in used]
        spare[name] = tuple(n.name for n in left)
    if cpu_replicas:
        cpu_nodes = sorted((n for n in nodes if n.gpus == 0 and n.ready), key=lambda n: n.name)
        left_cpu = Counter(cpu_replicas)
        used_cpu: list[str] = []
        for cn in cpu_nodes:
            if not +left_cpu:
                break
            cpu, mem = cn.cpu_milli, cn.memory_mib
            took = False
            for c, m in sorted(left_cpu, reverse=True):
                while left_cpu[(c, m)] > 0 and c <= cpu and m <= mem:
                    left_cpu[(c, m)] -= 1
                    cpu -= c
                    mem -= m
                    took = True
            if took:
                used_cpu.append(cn.name)
        short = sum(left_cpu.values())
        classes.append(
            ResourceClass(
                CPU_MICRO,
                "",
                {"cpu": len(cpu_replicas)},
                tuple(used_cpu),
                0,
                {"cpu": short} if short else {},
            )
        )
    config = mig.mig_parted_config(all_plans) if all_plans else None
    return ClassPlan(tuple(classes), spare, config, tuple(all_plans))
