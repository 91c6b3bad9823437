"""Hand-worked fragmentation cases (issue 3's contract), through the public Python API."""

from __future__ import annotations

from typing import Any

import pytest

from pyctl.core.fragmentation import FragmentationModel, score
from pyctl.model import Gpu, Node, Shape, Snapshot, Workload, Zone
from pyctl.snapshot import load_snapshot


def gpus(first: int, used: list[int]) -> tuple[Gpu, ...]:
    return tuple(Gpu(first + i, u) for i, u in enumerate(used))


def two_zone_node(
    policy: str,
    zone0_used: list[int],
    zone1_used: list[int],
    cpu_used: tuple[int, int] = (0, 0),
    name: str = "n",
) -> Node:
    return Node(
        name=name,
        gpu_model="A100-SXM4-80GB",
        topology_policy=policy,  # type: ignore[arg-type]
        zones=(
            Zone(0, 32000, cpu_used[0], 262144, 0, gpus(0, zone0_used)),
            Zone(1, 32000, cpu_used[1], 262144, 0, gpus(4, zone1_used)),
        ),
    )


TWO_GPU = Workload((Shape(cpu_milli=8000, gpus=2, gpu_milli=1000, weight=1.0),))
FULL, FREE = 1000, 0


def test_single_numa_node_strands_the_lone_free_gpu() -> None:
    # zone 0: 1 GPU free, zone 1: 2 GPUs free; a 2-GPU task fits only in zone 1
    node = two_zone_node("single-numa-node", [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE])
    r = score(Snapshot((node,)), TWO_GPU)
    assert r.idle_gpu_milli == 3000
    assert r.fragment_gpu_milli == 1000
    assert r.categories["numa_split"] == 1000
    assert [z.fragment_gpu_milli for z in r.nodes[0].zones] == [1000, 0]
    assert r.fragmentation_rate == pytest.approx(1 / 3)


def test_same_node_under_none_has_no_fragment() -> None:
    node = two_zone_node("none", [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE])
    r = score(Snapshot((node,)), TWO_GPU)
    assert (r.idle_gpu_milli, r.fragment_gpu_milli) == (3000, 0)


def test_single_numa_node_when_zone1_lacks_cpu() -> None:
    # zone 1 has the GPUs but only 4 free CPUs; zone 0 has CPUs but one GPU: nothing aligns
    node = two_zone_node(
        "single-numa-node", [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE], (0, 28000)
    )
    r = score(Snapshot((node,)), TWO_GPU)
    assert r.fragment_gpu_milli == 3000
    assert r.categories["numa_split"] == 3000
    # the CPU fits node-wide, so under none nothing is stranded
    r_none = score(Snapshot((two_zone_node("none", *_same_used(), (0, 28000)),)), TWO_GPU)
    assert r_none.fragment_gpu_milli == 0


def _same_used() -> tuple[list[int], list[int]]:
    return [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE]


def test_six_gpus_under_restricted_with_whole_cpus_is_never_admitted() -> None:
    node = two_zone_node("restricted", [FREE] * 4, [FREE] * 4)
    whole = Workload((Shape(cpu_milli=4000, gpus=6, gpu_milli=1000, weight=1.0),))
    r = score(Snapshot((node,)), whole)
    # the CPUs' narrowest width is 1 zone, the GPUs' is 2: the kubelet never aligns them
    assert r.fragment_gpu_milli == 8000
    assert r.categories["numa_split"] == 8000


def test_six_gpus_under_restricted_with_a_fractional_cpu_is_admitted() -> None:
    node = two_zone_node("restricted", [FREE] * 4, [FREE] * 4)
    frac = Workload((Shape(cpu_milli=4500, gpus=6, gpu_milli=1000, weight=1.0),))
    r = score(Snapshot((node,)), frac)
    assert r.fragment_gpu_milli == 0


def test_cpu_manager_none_makes_cpu_no_provider() -> None:
    node = two_zone_node("restricted", [FREE] * 4, [FREE] * 4)
    node = Node(**{**_fields(node), "cpu_manager_policy": "none"})
    whole = Workload((Shape(cpu_milli=4000, gpus=6, gpu_milli=1000, weight=1.0),))
    assert score(Snapshot((node,)), whole).fragment_gpu_milli == 0


def _fields(n: Node) -> dict[str, Any]:
    return {f: getattr(n, f) for f in n.__slots__}


def test_fgd_quadrants_under_none() -> None:
    shared = Workload((Shape(cpu_milli=2000, gpus=1, gpu_milli=500, weight=1.0),))
    # one GPU with 300 free (below 500: stranded), one with 800 free (usable)
    node = Node("n", "V100", "none", zones=(Zone(0, 8000, 0, 0, 0, (Gpu(0, 700), Gpu(1, 200))),))
    r = score(Snapshot((node,)), shared)
    assert (r.fragment_gpu_milli, r.categories["stranded"]) == (300, 300)
    # no CPU left: everything idle is fragment, for lack of CPU
    node = Node("n", "V100", "none", zones=(Zone(0, 8000, 7000, 0, 0, (Gpu(0, 700), Gpu(1, 200))),))
    r = score(Snapshot((node,)), shared)
    assert (r.fragment_gpu_milli, r.categories["lack_cpu"]) == (1100, 1100)
    # a CPU-only task: all idle GPU is fragment (FGD's XL)
    cpu_only = Workload((Shape(cpu_milli=1000, weight=1.0),))
    node = Node("n", "V100", "none", zones=(Zone(0, 8000, 0, 0, 0, (Gpu(0, 700),)),))
    assert score(Snapshot((node,)), cpu_only).categories["stranded"] == 300
    # a model the task does not accept
    picky = Workload((Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, gpu_models=("T4",)),))
    assert score(Snapshot((node,)), picky).categories["no_access"] == 300


def test_weights_mix_shape_fragments() -> None:
    node = two_zone_node("single-numa-node", [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE])
    mixed = Workload(
        (
            Shape(cpu_milli=8000, gpus=2, gpu_milli=1000, weight=3),
            Shape(cpu_milli=8000, gpus=1, gpu_milli=1000, weight=1),
        )
    )
    # 2-GPU shape: 1000 fragment; 1-GPU shape: none. Weights normalise to 0.75 / 0.25.
    assert score(Snapshot((node,)), mixed).fragment_gpu_milli == pytest.approx(750)


MIG_NODE = {
    "nodes": [
        {
            "name": "mig-a",
            "gpu_model": "A100-SXM4-40GB",
            "zones": [
                {
                    "numa": 0,
                    "cpu_milli": 64000,
                    "memory_mib": 262144,
                    "mig": [
                        {
                            "gpu": 0,
                            "instances": [
                                # 1g.5gb free at 0, 3 and 6, used 1g.5gb at 1, 2, used 2g at 4:
                                # the free 1-slices are scattered; no 3g.20gb can be placed
                                {"profile": "1g.5gb", "start": 0, "used": False},
                                {"profile": "1g.5gb", "start": 1, "used": True},
                                {"profile": "1g.5gb", "start": 2, "used": True},
                                {"profile": "1g.5gb", "start": 3, "used": False},
                                {"profile": "2g.10gb", "start": 4, "used": True},
                                {"profile": "1g.5gb", "start": 6, "used": False},
                            ],
                        }
                    ],
                }
            ],
        }
    ]
}


def test_mig_free_slices_that_cannot_host_the_wanted_profile() -> None:
    snap = load_snapshot(MIG_NODE)
    want_3g = Workload((Shape(cpu_milli=1000, mig_profile="3g.20gb", weight=1.0),))
    r = score(snap, want_3g)
    assert r.idle_mig_slices == 3
    assert r.fragment_mig_slices == 3
    assert r.mig_categories["mig_geometry"] == 3
    assert r.recoverable_mig_slices == 0  # used instances pin the layout: no 3g fits
    want_1g = Workload((Shape(cpu_milli=1000, mig_profile="1g.5gb", weight=1.0),))
    r = score(snap, want_1g)
    assert (r.fragment_mig_slices, r.recoverable_mig_slices) == (0, 0)


def test_mig_recoverable_after_repartitioning_free_instances() -> None:
    # four free 1g.5gb at 0..3 and a used 3g.20gb at 4: the free half can become one 3g.20gb
    snap = load_snapshot(
        {
            "nodes": [
                {
                    "name": "m",
                    "gpu_model": "A100-SXM4-40GB",
                    "zones": [
                        {
                            "numa": 0,
                            "cpu_milli": 8000,
                            "mig": [
                                {
                                    "gpu": 0,
                                    "instances": [
                                        {"profile": "1g.5gb", "start": s, "used": False}
                                        for s in range(4)
                                    ]
                                    + [{"profile": "3g.20gb", "start": 4, "used": True}],
                                }
                            ],
                        }
                    ],
                }
            ]
        }
    )
    r = score(snap, Workload((Shape(cpu_milli=1000, mig_profile="3g.20gb", weight=1),)))
    assert (r.idle_mig_slices, r.fragment_mig_slices) == (4, 4)
    assert r.recoverable_mig_slices == 3


def test_place_then_remove_delta_is_zero() -> None:
    node = two_zone_node("single-numa-node", [FULL, FULL, FULL, FREE], [FULL, FULL, FREE, FREE])
    m = FragmentationModel(Snapshot((node,)))
    task = Shape(cpu_milli=8000, gpus=1, gpu_milli=1000)
    d = m.place_delta("n", task, TWO_GPU)
    assert d is not None
    # placing the 1-GPU task on the lone zone-0 GPU removes the stranded 1000
    assert d.fragment_gpu_milli == -1000
    m.apply("n", d.assignment)
    back = m.remove_delta("n", d.assignment, TWO_GPU)
    assert back.fragment_gpu_milli == -d.fragment_gpu_milli
