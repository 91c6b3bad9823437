"""Rust MIG partition planner vs. the pure-Python reference planner, measured in one run.

1,000 nodes of 8 MIG GPUs (A100-40GB, H100-80GB, A100-80GB, H200), each GPU in a random layout with
some instances used, against a mixed demand: 0-4 pending requests per node over the 1g/2g/3g
profiles, a workload M of MIG shapes, and one used instance that may be destroyed per node.
Rust plans every node (argument conversion included); the reference plans a sample of them, and
the two must give the same plan on that sample. Also measured, not in the headline: a
move-heavy variant (6 pending pods of each workload profile, 2 used instances may be destroyed),
where the no-move plan cannot serve everything and the planner searches which pods to move.
Last line:
`mig_plan: <N> us per node, speedup <X>x vs python reference`.
"""

from __future__ import annotations

import random
import time
from typing import Any

from _common import best_of

from pyctl.core import mig
from pyctl.core.types import MigPlanRaw
from tests.reference import mig as reference

MODELS = ["A100-SXM4-40GB", "H100-80GB", "A100-80GB", "H200-141GB"]
NODES = 1000
GPUS = 8
SAMPLE = 20


def random_gpu(rnd: random.Random, model: str, gpu: int, node: int) -> dict[str, Any]:
    m = reference.MODELS[model]
    pins: list[tuple[int, int]] = []
    instances = []
    for _ in range(rnd.randint(0, 9)):
        p = rnd.randrange(len(m.profiles))
        s = rnd.choice(m.profiles[p].starts)
        if reference.valid(m, [*pins, (p, s)], []):
            pins.append((p, s))
            used = rnd.random() < 0.5
            instances.append(
                {
                    "profile": m.profiles[p].name,
                    "start": s,
                    "used": used,
                    "pod": f"ns/n{node}-g{gpu}-{s}" if used else None,
                }
            )
    return {"gpu": gpu, "instances": instances}


def random_node(rnd: random.Random, i: int) -> dict[str, Any]:
    model = rnd.choice(MODELS)
    m = reference.MODELS[model]
    small = [p.name for p in m.profiles if p.compute <= 3 and not p.media_extensions]
    pending = [
        {"profile": rnd.choice(small), "count": rnd.randint(1, 2)} for _ in range(rnd.randint(0, 4))
    ]
    workload = [
        {"profile": name, "weight": w}
        for name, w in zip(rnd.sample(small, 3), (0.5, 0.3, 0.2), strict=True)
    ]
    return {
        "gpu_model": model,
        "gpus": [random_gpu(rnd, model, g, i) for g in range(GPUS)],
        "pending": pending,
        "workload": workload,
        "limits": {"max_used_destroyed": 1},
    }


def _comparable(plan: MigPlanRaw) -> dict[str, object]:
    """The plan without `placements_inferred` (the reference planner does not say it)."""
    return {k: v for k, v in plan.items() if k != "placements_inferred"}


def main() -> None:
    rnd = random.Random(4)
    nodes = [random_node(rnd, i) for i in range(NODES)]

    def rust_all() -> None:
        for n in nodes:
            mig.plan(**n)

    sample = nodes[:SAMPLE]
    for n in sample:
        assert _comparable(mig.plan(**n)) == reference.plan(**n), n
    t_rust = best_of(rust_all, repeat=3, number=1) / NODES
    t0 = time.perf_counter()
    for n in sample:
        reference.plan(**n)
    t_ref = (time.perf_counter() - t0) / SAMPLE

    plans = [mig.plan(**n) for n in nodes]
    changed = sum(p["changed_gpus"] for p in plans)
    moved = sum(p["used_destroyed"] for p in plans)
    pending = sum(d["pending"] for p in plans for d in p["demand"])
    before = sum(d["served_before"] for p in plans for d in p["demand"])
    after = sum(d["served_after"] for p in plans for d in p["demand"])
    frag_b = sum(p["fragment_before"] for p in plans)
    frag_a = sum(p["fragment_after"] for p in plans)
    print(
        f"{NODES} nodes x {GPUS} MIG GPUs: pending {pending} requests, served {before} before, "
        f"{after} after; {changed} GPUs re-partitioned, {moved} pods moved; "
        f"fragment {frag_b:.0f} -> {frag_a:.0f} compute slices"
    )
    print(
        f"rust {t_rust * 1e6:.0f} us/node (all {NODES} nodes, conversion included), "
        f"python reference {t_ref * 1e3:.0f} ms/node ({SAMPLE} nodes, same plans)"
    )

    heavy = [
        {
            **n,
            "pending": [{"profile": w["profile"], "count": 6} for w in n["workload"]],
            "limits": {"max_used_destroyed": 2},
        }
        for n in nodes[:200]
    ]
    for n in heavy[:3]:
        assert _comparable(mig.plan(**n)) == reference.plan(**n), n
    t_heavy = best_of(lambda: [mig.plan(**n) for n in heavy], repeat=3, number=1) / len(heavy)
    moved_h = sum(mig.plan(**n)["used_destroyed"] for n in heavy)
    print(
        f"move-heavy ({len(heavy)} nodes, 6 pending per profile, up to 2 pods moved per node): "
        f"rust {t_heavy * 1e6:.0f} us/node, {moved_h} pods moved"
    )
    # a node's plan costs more the more is pending, up to what its GPUs could serve: the MIG
    # round of bench/scale.py, whose pending 7g pods grow with the cluster (docs/scale.md)
    h100 = [[random_gpu(rnd, "H100-80GB", g, i) for g in range(GPUS)] for i in range(200)]
    cost = []
    for count in (0, 2, 5, 12, 25):
        args = [
            {
                "gpu_model": "H100-80GB",
                "gpus": gpus,
                "pending": [{"profile": "7g.80gb", "count": count}] if count else [],
                "workload": [{"profile": "1g.10gb", "weight": 1.0}],
                "limits": {"max_used_destroyed": 1},
            }
            for gpus in h100
        ]

        def run(a: list[dict[str, Any]] = args) -> None:
            for n in a:
                mig.plan(**n)

        t = best_of(run, repeat=3, number=1) / len(args)
        cost.append(f"{count} {t * 1e6:.0f}")
    print(f"by pending 7g.80gb pods (H100 nodes): {', '.join(cost)} us/node")
    speedup = t_ref / t_rust
    print(f"mig_plan: {t_rust * 1e6:.0f} us per node, speedup {speedup:.0f}x vs python reference")


if __name__ == "__main__":
    main()
