"""Fragmentation scoring: Rust core vs. the pure-Python reference, measured in one run.

10,000 nodes of 8 GPUs over 2-8 NUMA zones (a fifth with MIG GPUs, mixed Topology Manager
policies, random usage) scored against 35 task shapes: FGD's typical shapes of the Alibaba default
trace when its folder is given (`--trace DIR`, e.g. the shared `alibaba-gpu-2023`), else 35
synthetic ones. The
reference is timed on a random sample of the nodes (it is slow) and compared per node-shape.
Also: the delta of placing one task on one node, for 35 shapes.
`--dra`: the same measurement on a DRA snapshot of the same size (GPUs published by a DRA driver:
whole GPUs, and a fifth of the nodes with DynamicMIG GPUs holding random allocated placements;
the shapes are asked through claims, multi-GPU ones NUMA-aligned).
Last line: `fragmentation_score: <N> ns per node-shape, speedup <X>x vs python reference`.
"""

from __future__ import annotations

import argparse
import csv
import random
import time
from dataclasses import replace
from pathlib import Path

from _common import best_of

from pyctl.core.fragmentation import FragmentationModel, derive_workload, shape_dict
from pyctl.model import (
    TOPOLOGY_POLICIES,
    Gpu,
    MigGpu,
    MigInstance,
    Node,
    Shape,
    Snapshot,
    Workload,
    Zone,
)
from tests.reference import fragmentation as ref

TRACE_FILE = "openb_pod_list_default.csv"
MIG_LAYOUTS = [
    [("3g.20gb", 0, True), ("3g.20gb", 4, False)],
    [("1g.5gb", s, s % 3 == 0) for s in range(7)],
    [("2g.10gb", 0, True), ("2g.10gb", 2, False), ("1g.5gb", 4, False), ("1g.5gb", 6, True)],
    [("4g.20gb", 0, False), ("2g.10gb", 4, True)],
    [("7g.40gb", 0, False)],
]


def workload(trace_dir: str | None) -> tuple[Workload, str]:
    trace = Path(trace_dir) / TRACE_FILE if trace_dir else None
    if trace is not None and trace.exists():
        with trace.open() as f:
            tasks = [
                Shape(
                    cpu_milli=int(r["cpu_milli"]),
                    gpus=int(r["num_gpu"]),
                    gpu_milli=int(r["gpu_milli"]) if int(r["num_gpu"]) else 0,
                )
                for r in csv.DictReader(f)
            ]
        w = derive_workload(tasks)
        if len(w.shapes) >= 35:
            return Workload(w.shapes[:35]), "FGD typical shapes of the Alibaba default trace"
    rnd = random.Random(5)
    shapes = []
    for i in range(35):
        kind = i % 5
        if kind == 0:
            shapes.append(Shape(cpu_milli=rnd.choice([1000, 4000, 8000]), weight=1))
        elif kind == 4:
            shapes.append(
                Shape(cpu_milli=2000, mig_profile=rnd.choice(["1g.5gb", "3g.20gb"]), weight=1)
            )
        else:
            g = rnd.choice([1, 1, 2, 4, 8])
            shapes.append(
                Shape(
                    cpu_milli=rnd.choice([2000, 6000, 12000, 16500]),
                    gpus=g,
                    gpu_milli=1000 if g > 1 else rnd.choice([250, 500, 1000]),
                    weight=rnd.randint(1, 10),
                )
            )
    return Workload(tuple(shapes)), "35 synthetic shapes"


def cluster(n: int, seed: int = 1) -> Snapshot:
    rnd = random.Random(seed)
    nodes = []
    for i in range(n):
        zcount = rnd.choice([2, 2, 2, 4, 8])
        mig = rnd.random() < 0.2
        zones = []
        gid = 0
        for z in range(zcount):
            per = 8 // zcount if z < 8 % zcount or True else 0
            cpu = 96000 // zcount
            gpus = []
            migs = []
            for _ in range(per):
                if mig and rnd.random() < 0.5:
                    lay = rnd.choice(MIG_LAYOUTS)
                    migs.append(MigGpu(gid, tuple(MigInstance(p, s, u) for p, s, u in lay)))
                else:
                    gpus.append(Gpu(gid, rnd.choice([0, 0, 0, 1000, 1000, 500, 250, 750])))
                gid += 1
            zones.append(
                Zone(
                    z, cpu, rnd.randint(0, cpu // 1000) * 1000, 1 << 18, 0, tuple(gpus), tuple(migs)
                )
            )
        nodes.append(
            Node(
                f"node-{i:05d}", "A100-SXM4-40GB", rnd.choice(TOPOLOGY_POLICIES), zones=tuple(zones)
            )
        )
    return Snapshot(tuple(nodes))


DYNAMIC_ALLOCATIONS = [
    [("3g.20gb", 4)],
    [("1g.5gb", 0), ("1g.5gb", 3)],
    [("2g.10gb", 2), ("1g.10gb", 6)],
    [],
    [("4g.20gb", 0), ("1g.5gb", 5)],
]


def dra_cluster(n: int, seed: int = 1) -> Snapshot:
    """The DRA twin of `cluster`: the same sizes, every GPU published by a DRA driver; a fifth
    of the nodes have DynamicMIG GPUs with allocated placements."""
    rnd = random.Random(seed)
    nodes = []
    for i in range(n):
        zcount = rnd.choice([2, 2, 2, 4, 8])
        dynamic = rnd.random() < 0.2
        zones = []
        gid = 0
        for z in range(zcount):
            cpu = 96000 // zcount
            gpus = []
            migs = []
            for _ in range(8 // zcount):
                if dynamic and rnd.random() < 0.5:
                    lay = rnd.choice(DYNAMIC_ALLOCATIONS)
                    insts = tuple(MigInstance(p, s, True) for p, s in lay)
                    migs.append(MigGpu(gid, insts, dra=True, dynamic=True))
                else:
                    gpus.append(Gpu(gid, rnd.choice([0, 0, 0, 1000, 1000])))
                gid += 1
            zones.append(
                Zone(
                    z,
                    cpu,
                    rnd.randint(0, cpu // 1000) * 1000,
                    1 << 18,
                    0,
                    (),
                    tuple(migs),
                    tuple(gpus),
                )
            )
        nodes.append(Node(f"node-{i:05d}", "A100-SXM4-40GB", "none", zones=tuple(zones)))
    return Snapshot(tuple(nodes))


def dra_workload(w: Workload) -> Workload:
    """The same shapes asked through DRA claims: whole GPUs (a share below one GPU becomes a
    whole GPU: DRA allocates devices), multi-GPU claims NUMA-aligned."""
    return Workload(
        tuple(
            replace(
                s,
                gpu_milli=1000 if s.gpus and not s.mig_profile else s.gpu_milli,
                dra=not s.is_cpu_only,
                numa_aligned=s.gpus > 1 and not s.mig_profile,
            )
            for s in w.shapes
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nodes", nargs="?", type=int, default=10_000)
    ap.add_argument("--trace", help="folder with openb_pod_list_default.csv (FGD's shapes)")
    ap.add_argument("--dra", action="store_true", help="a DRA snapshot of the same size")
    args = ap.parse_args()
    n_nodes = args.nodes
    w, source = workload(args.trace)
    if args.dra:
        w, source = dra_workload(w), source + ", asked through DRA claims"
        snap = dra_cluster(n_nodes)
    else:
        snap = cluster(n_nodes)
    t0 = time.perf_counter()
    model = FragmentationModel(snap)
    build = time.perf_counter() - t0
    shapes = [shape_dict(s) for s in w.shapes]
    t_rust = best_of(lambda: model.core.score(shapes), repeat=5)
    t_facade = best_of(lambda: model.score(w), repeat=3)
    res = model.score(w)
    pairs = n_nodes * len(w.shapes)
    print(
        f"workload: {len(w.shapes)} shapes ({source}); "
        f"cluster: {n_nodes} nodes, built in {build:.2f} s"
    )
    print(
        f"rust core: {t_rust * 1e3:.1f} ms for {pairs} node-shapes, result columns included "
        f"(one core; the GIL is released while scoring); "
        f"fragmentation rate {res.fragmentation_rate:.1%}"
    )
    print(f"python facade (core + per-node result records): {t_facade * 1e3:.1f} ms")
    sample = random.Random(2).sample(range(n_nodes), min(300, n_nodes))
    t0 = time.perf_counter()
    for i in sample:
        ref.score_node(snap.nodes[i], w)
    t_ref = (time.perf_counter() - t0) / len(sample) * n_nodes
    print(f"python reference: {t_ref:.1f} s for the same (extrapolated from {len(sample)} nodes)")
    node = snap.nodes[0].name
    task = Shape(cpu_milli=8000, gpus=1, gpu_milli=1000, dra=args.dra)
    t_delta = best_of(lambda: model.place_delta(node, task, w), repeat=5, number=50)
    print(
        f"delta of placing one task on one node for {len(w.shapes)} shapes: {t_delta * 1e6:.1f} us"
    )
    ns = t_rust / pairs * 1e9
    print(
        f"fragmentation_score: {ns:.0f} ns per node-shape, "
        f"speedup {t_ref / t_rust:.0f}x vs python reference"
    )


if __name__ == "__main__":
    main()
