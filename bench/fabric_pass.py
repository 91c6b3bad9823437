"""The controller's fabric pass at scale, measured in one run.

What `Reconciler.fabric` does every `fabric.interval` seconds (default 10) while nodes carry a
level's label or M has a gang: a snapshot of every node's model, the core's model of it, and the
fabric pass (`pyctl.core.fabric.fabric_score`) with the nodes' level labels. Nodes of 8 GPUs in
2 NUMA zones with random use, 18 nodes per `nvidia.com/gpu.clique` domain (an NVL72 rack's trays
are 18 nodes), M of 4 single-node shapes and one gang of 4 pods x 4 GPUs in one clique.
Last line: `fabric_pass: <N> nodes, <ms> ms per pass (model <ms> + fabric <ms>), <p>% of the
<s> s interval`.
"""

from __future__ import annotations

import argparse
import random

from _common import best_of

from pyctl.core.fabric import fabric_score
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Gang, Gpu, Node, Shape, Snapshot, Workload, Zone

CLIQUE = "nvidia.com/gpu.clique"


def nodes(n: int, seed: int) -> tuple[Node, ...]:
    rnd = random.Random(seed)

    def node(i: int) -> Node:
        zones = tuple(
            Zone(
                numa=z,
                cpu_milli=64_000,
                cpu_milli_used=rnd.randrange(0, 64_000, 1000),
                memory_mib=512_000,
                gpus=tuple(
                    Gpu(id=z * 4 + g, used_milli=rnd.choice((0, 0, 1000))) for g in range(4)
                ),
            )
            for z in range(2)
        )
        return Node(
            name=f"node-{i:05d}",
            topology_policy="best-effort",
            zones=zones,
            labels=((CLIQUE, f"cluster-a.{i // 18}"),),
        )

    return tuple(node(i) for i in range(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--interval", type=float, default=10.0, help="the fabric pass's interval, s")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    ns = nodes(args.nodes, args.seed)
    labels = {x.name: dict(x.labels) for x in ns}
    shapes = [Shape(cpu_milli=4000 * k, gpus=k) for k in (1, 2, 4, 8)]
    shapes.append(Shape(cpu_milli=8000, gpus=4, gang=Gang(4, CLIQUE)))
    workload = Workload(tuple(shapes))
    model = FragmentationModel(Snapshot(ns))
    score = fabric_score(model, workload, labels=labels)
    t_model = best_of(lambda: FragmentationModel(Snapshot(ns)))
    t_fabric = best_of(lambda: fabric_score(model, workload, labels=labels))
    total = t_model + t_fabric
    print(f"domains {len(score.domains)}, levels {[lv.level for lv in score.levels]}")
    print(
        f"fabric_pass: {args.nodes} nodes, {total * 1e3:.1f} ms per pass "
        f"(model {t_model * 1e3:.1f} + fabric {t_fabric * 1e3:.1f}), "
        f"{100 * total / args.interval:.2f}% of the {args.interval:g} s interval"
    )


if __name__ == "__main__":
    main()
