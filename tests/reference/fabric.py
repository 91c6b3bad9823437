"""Pure-Python twin of the fabric pass (docs/fabric.md), written literally for nodes of whole
GPUs under policy `none` or `single-numa-node` with no CPU or memory manager (the hint provider is
the GPUs alone): a node hosts `sum over zones of free // g` pods of a g-GPU shape under
`single-numa-node`, `free // g` under `none`, at most what its CPU and memory allow. For tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyctl.model import Node, Shape, Workload
from tests.reference import fragmentation as ref


def pods_that_fit(node: Node, s: Shape) -> int:
    assert node.cpu_manager_policy == "none"
    assert node.memory_manager_policy == "none"
    assert s.gpu_milli == 1000
    assert s.gpus >= 1
    assert s.mig_profile is None
    free = [sum(1 for g in z.gpus if g.used_milli == 0) for z in node.zones]
    if node.topology_policy == "single-numa-node":
        by_gpu = sum(f // s.gpus for f in free)
    else:
        assert node.topology_policy == "none"
        by_gpu = sum(free) // s.gpus
    cpu = sum(z.cpu_milli - z.cpu_milli_used for z in node.zones)
    mem = sum(z.memory_mib - z.memory_mib_used for z in node.zones)
    by_cpu = cpu // s.cpu_milli if s.cpu_milli else by_gpu
    by_mem = mem // s.memory_mib if s.memory_mib else by_gpu
    return max(0, min(by_gpu, by_cpu, by_mem))


@dataclass
class Fabric:
    #: (level, domain) -> [idle milli, fragment milli, capacity per gang]
    domains: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    capacity: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    node_domain_split: dict[str, float] = field(default_factory=dict)
    node_no_domain: dict[str, float] = field(default_factory=dict)


def fabric(
    nodes: Sequence[Node],
    workload: Workload,
    levels: Sequence[str],
    labels: Mapping[str, Mapping[str, str]],
) -> Fabric:
    total = sum(s.weight for s in workload.shapes)
    gangs = [s for s in workload.shapes if s.gang is not None]
    out = Fabric()
    for n in nodes:
        for lv in levels:
            d = labels[n.name].get(lv)
            if d is None:
                continue
            idle = sum(1000 - g.used_milli for z in n.zones for g in z.gpus)
            row = out.domains.setdefault((lv, d), [0.0, 0.0])
            row[0] += idle
            caps = out.capacity.setdefault((lv, d), [0] * len(gangs))
            for gi, g in enumerate(gangs):
                assert g.gang is not None
                if g.gang.key == lv:
                    caps[gi] += pods_that_fit(n, g)
    for gi, g in enumerate(gangs):
        assert g.gang is not None
        w = g.weight / total
        for n in nodes:
            sc = ref.score_node(n, Workload((replace(g, weight=1.0),)))
            usable = max(0.0, sc.idle_gpu - sc.frag_gpu)
            if usable == 0:
                continue
            d = labels[n.name].get(g.gang.key)
            if d is None:
                out.node_no_domain[n.name] = out.node_no_domain.get(n.name, 0.0) + w * usable
            elif out.capacity[(g.gang.key, d)][gi] < g.gang.pods:
                out.domains[(g.gang.key, d)][1] += w * usable
                out.node_domain_split[n.name] = out.node_domain_split.get(n.name, 0.0) + w * usable
    return out
