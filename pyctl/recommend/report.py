"""`recommend`: the whole answer for one inventory (and optional usage) — per pool the trade-off of
k standard sizes and the menu recommended, per workload its current and recommended request with
the reason and the patch, and the node resource classes with their MIG layouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from pyctl.core import mig
from pyctl.jsontypes import JsonObject
from pyctl.recommend.classes import ClassPlan, plan_classes
from pyctl.recommend.inventory import Inventory, pool_of, pools
from pyctl.recommend.menu import Evaluator, Item, Tradeoff, tradeoff
from pyctl.recommend.prometheus import UsageReport
from pyctl.recommend.rightsize import (
    Attribution,
    Patch,
    Recommendation,
    Workload,
    attribute,
    group,
    need_of,
    recommend_workload,
)
from pyctl.recommend.sizes import Pool, Size

__all__ = ["Options", "PoolReport", "Report", "recommend"]


@dataclass(frozen=True)
class Options:
    #: menus of 1..max_k sizes are compared
    max_k: int = 5
    #: right-sizing: memory need = observed peak x (1 + headroom)
    headroom: float = 0.2
    #: the recommended k: the fewest sizes within this many points of the best demand served
    tolerance_pct: float = 1.0
    #: share pools: sizes are multiples of 1/grid of a GPU
    grid: int = 10
    #: the patches also set the class node selector
    class_selector: bool = False
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.max_k <= 8:
            raise ValueError(f"max k {self.max_k}: must be 1..8")
        if not 0.0 <= self.headroom <= 10.0:
            raise ValueError(f"headroom {self.headroom}: must be a fraction in 0..10")
        if not 0.0 <= self.tolerance_pct <= 100.0:
            raise ValueError(f"tolerance {self.tolerance_pct}: must be 0..100 points")
        if not 1 <= self.grid <= 20:
            raise ValueError(f"grid {self.grid}: must be 1..20")


@dataclass(frozen=True)
class PoolReport:
    pool: Pool
    tradeoff: Tradeoff
    menu: tuple[Size, ...]
    #: the observed replicas: (need, current request size, replicas)
    groups: tuple[Item, ...]

    def to_json(self) -> JsonObject:
        t = self.tradeoff
        rec = t.recommended
        return {
            "gpu_model": self.pool.gpu_model,
            "mig": self.pool.mig,
            "shares": self.pool.shares,
            "nodes": len(self.pool.nodes),
            "gpus": self.pool.gpus,
            "gpu_memory_mib": self.pool.gpu_memory_mib,
            "replicas": sum(n for _, _, n in self.groups),
            "candidates": list(t.candidates),
            "exhaustive": t.exhaustive,
            "recommended_k": 0 if rec is None else rec.sizes,
            "menu": [s.name for s in self.menu],
            # demand served at 100% given up against the requests as they are (points)
            "cost_vs_requested_pct": None
            if rec is None
            else round(t.baseline.served_pct - rec.served_pct, 3),
            "as_requested": t.baseline.to_json(),
            "tradeoff": [{"k": k, **r.to_json()} for k, r in enumerate(t.rows, 1)],
        }


@dataclass(frozen=True)
class Report:
    options: Options
    pools: tuple[PoolReport, ...]
    workloads: tuple[Recommendation, ...]
    classes: ClassPlan
    usage: UsageReport | None = None
    attribution: Attribution | None = None
    problems: tuple[str, ...] = ()
    cpu_replicas: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def pool(self, gpu_model: str) -> PoolReport:
        for p in self.pools:
            if p.pool.gpu_model == gpu_model:
                return p
        raise KeyError(gpu_model)

    @property
    def changes(self) -> list[Recommendation]:
        return [w for w in self.workloads if w.change]

    def patches(self) -> list[Patch]:
        return [w.patch for w in self.workloads if w.patch is not None]

    def mig_parted_yaml(self) -> str | None:
        c = self.classes.mig_parted
        return None if c is None else mig.to_yaml(c)

    def kustomization(self) -> JsonObject:
        return {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "patches": [{"path": p.file_name} for p in self.patches()],
        }

    def patch_files(self) -> dict[str, str]:
        """File name -> YAML: one strategic-merge patch per workload, and a kustomization."""
        out = {p.file_name: yaml.safe_dump(p.kustomize(), sort_keys=False) for p in self.patches()}
        if out:
            out["kustomization.yaml"] = yaml.safe_dump(self.kustomization(), sort_keys=False)
        return out

    def to_json(self) -> JsonObject:
        o = self.options
        a = self.attribution
        return {
            "options": {
                "max_k": o.max_k,
                "headroom": o.headroom,
                "tolerance_pct": o.tolerance_pct,
                "grid": o.grid,
                "namespaces": list(o.namespaces),
            },
            "pools": [p.to_json() for p in self.pools],
            "workloads": [w.to_json() for w in self.workloads],
            "classes": [c.to_json() for c in self.classes.classes],
            "spare_nodes": {k: list(v) for k, v in self.classes.spare.items()},
            "mig_parted": self.classes.mig_parted,
            "cpu_replicas": self.cpu_replicas,
            "usage": None
            if self.usage is None
            else {
                **self.usage.to_json(),
                "stale_series_pods": [] if a is None else list(a.stale_series_pods),
                "profile_mismatches": [] if a is None else list(a.profile_mismatches),
            },
            "problems": list(self.problems),
            "skipped": dict(self.skipped),
        }


def recommend(
    inv: Inventory, usage: UsageReport | None = None, options: Options | None = None
) -> Report:
    opts = options or Options()
    problems = list(inv.problems)
    ps = pools(inv, opts.grid)
    nodes = {n.name: n for n in inv.nodes}
    replicas = [r for r in inv.replicas if not opts.namespaces or r.namespace in opts.namespaces]
    where = {r.key: pool_of(r, nodes, ps) for r in replicas if r.is_gpu}
    skipped: dict[str, int] = {}
    for r in replicas:
        if r.is_gpu and where[r.key] is None:
            skipped["no pool"] = skipped.get("no pool", 0) + 1
    workloads = group(replicas, where)
    attribution = attribute(usage, workloads, ps) if usage is not None else None
    got_usage = attribution.usage if attribution else {}
    groups: dict[str, list[Item]] = {name: [] for name in ps}
    needed: list[tuple[Workload, Any]] = []
    for w in workloads:
        if w.pool is None:
            continue
        pool = ps[w.pool]
        try:
            size, _ = pool.request_size(w.request.gpus, w.request.gpu_milli, w.request.mig_profile)
            need, _src = need_of(w, pool, got_usage.get(w.owner), opts.headroom)
        except ValueError as e:
            problems.append(f"{w.owner}: left out: {e}")
            skipped["bad request"] = skipped.get("bad request", 0) + 1
            continue
        groups[w.pool].append((need, size, len(w.replicas)))
        needed.append((w, need))
    reports: list[PoolReport] = []
    menus: dict[str, tuple[Size, ...]] = {}
    for name, pool in ps.items():
        if not groups[name]:
            continue
        try:
            ev = Evaluator(pool, groups[name], inv.snapshot(n for n, _ in pool.nodes))
        except ValueError as e:  # the core refused the nodes as they are: no F(M') for them
            problems.append(f"pool {name}: the fragment of the current nodes is left out: {e}")
            ev = Evaluator(pool, groups[name])
        t = tradeoff(ev, opts.max_k, opts.tolerance_pct)
        menu = tuple(pool.size(s) for s in (t.recommended.menu or ())) if t.recommended else ()
        menus[name] = menu
        reports.append(PoolReport(pool, t, menu, tuple(groups[name])))
    recs: list[Recommendation] = []
    items: dict[str, list[Item]] = {name: [] for name in ps}
    for w, need in needed:
        assert w.pool is not None
        pool = ps[w.pool]
        rec = recommend_workload(
            w,
            pool,
            menus.get(w.pool, ()),
            got_usage.get(w.owner),
            opts.headroom,
            opts.class_selector,
        )
        size = pool.size(rec.recommended) if rec.recommended and need.gpus == 1 else None
        if size is None and need.gpus == 1:
            size, _ = pool.request_size(w.request.gpus, w.request.gpu_milli, w.request.mig_profile)
        recs.append(rec)
        items[w.pool].append((need, size, len(w.replicas)))
    cpu = [(r.shape.cpu_milli, r.shape.memory_mib) for r in replicas if not r.is_gpu]
    classes = plan_classes(ps, inv.nodes, items, cpu)
    return Report(
        opts,
        tuple(reports),
        tuple(recs),
        classes,
        usage,
        attribution,
        tuple(problems) + (tuple(usage.problems) if usage else ()),
        len(cpu),
        skipped,
    )
