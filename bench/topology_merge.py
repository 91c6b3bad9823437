"""Rust topology hint merge vs. the pure-Python reference, measured in one run.

Two workloads: the whole conformance corpus (small cases: the cost is mostly argument conversion),
and a heavy case (8 NUMA nodes, 4 providers with 6 resources of 8 hints each: 262,144
combinations for the kubelet's walk). Also checks that the merge releases the GIL: two threads
merging at once should take about as long as one thread doing half the work on 2 cores.
Last line: `topology_merge: speedup <X>x vs python reference` (heavy case).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

from _common import REPO, best_of

from pyctl.core.topology import merge_hints
from tests.reference import topology as reference

CORPUS = REPO / "tests" / "data" / "conformance" / "topology_hints.json"
EIGHT = {
    i: [10 if i == j else (11 if i // 4 == j // 4 else 30) for j in range(8)] for i in range(8)
}


def heavy_case(seed: int = 1) -> dict[str, Any]:
    rnd = random.Random(seed)
    nodes = list(range(8))

    def hints() -> list[dict[str, Any]]:
        out = []
        for _ in range(8):
            width = rnd.choice([1, 1, 2, 2, 4, 8])
            out.append({"affinity": sorted(rnd.sample(nodes, width)), "preferred": width <= 2})
        return out

    providers = [
        {"cpu": hints(), "memory": hints()},
        {"nvidia.com/gpu": hints(), "nvidia.com/mig-1g.10gb": hints()},
        {"hugepages-1Gi": hints()},
        {"example.com/nic": hints()},
    ]
    return {
        "providers": providers,
        "policy": "best-effort",
        "numa_nodes": nodes,
        "options": {"prefer-closest-numa-nodes": True},
        "distances": EIGHT,
    }


def main() -> None:
    cases = json.loads(CORPUS.read_text())["cases"]
    args = [
        (c["providers"], c["policy"], c["numa_nodes"], c["options"], c["distances"]) for c in cases
    ]

    def corpus_rust() -> None:
        for a in args:
            merge_hints(*a)

    def corpus_ref() -> None:
        for a in args:
            reference.merge_hints(*a)

    t_rust_c = best_of(corpus_rust, repeat=5, number=20)
    t_ref_c = best_of(corpus_ref, repeat=3, number=2)
    print(
        f"corpus ({len(cases)} cases): rust {t_rust_c / len(cases) * 1e6:.2f} us/case, "
        f"python {t_ref_c / len(cases) * 1e6:.1f} us/case, speedup {t_ref_c / t_rust_c:.0f}x"
    )

    heavy = heavy_case()
    r = merge_hints(**heavy)
    ref = reference.merge_hints(**heavy)
    assert (r.affinity, r.preferred, r.admit) == (ref.affinity, ref.preferred, ref.admit)
    t_rust = best_of(lambda: merge_hints(**heavy), repeat=5, number=200)
    t_ref = best_of(lambda: reference.merge_hints(**heavy), repeat=2, number=1)
    print(
        f"heavy (8 NUMA, 6 resources x 8 hints, 262144 combinations): "
        f"rust {t_rust * 1e6:.1f} us, python {t_ref * 1e3:.0f} ms, result {r.affinity}"
    )

    # GIL: N merges on one thread vs. the same N split over two threads, on a case where the
    # merge itself (not the argument conversion, which needs the GIL) dominates.
    rnd = random.Random(3)
    wide = {
        f"r{k}": [
            {"affinity": sorted(rnd.sample(range(8), rnd.randint(1, 7))), "preferred": False}
            for _ in range(48)
        ]
        for k in range(10)
    }
    gil_case = {**heavy, "providers": [wide]}
    t_gil = best_of(lambda: merge_hints(**gil_case), repeat=3, number=20)
    n = max(40, int(1.0 / t_gil))

    def work(k: int) -> None:
        for _ in range(k):
            merge_hints(**gil_case)

    t0 = time.perf_counter()
    work(n)
    one = time.perf_counter() - t0
    threads = [threading.Thread(target=work, args=(n // 2,)) for _ in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    two = time.perf_counter() - t0
    print(
        f"GIL released: {n} merges of 10 resources x 48 hints ({t_gil * 1e6:.0f} us each) "
        f"on 1 thread {one:.2f} s, on 2 threads {two:.2f} s: x{one / two:.2f} "
        f"on {os.cpu_count()} cores"
    )
    print(f"topology_merge: speedup {t_ref / t_rust:.0f}x vs python reference")


if __name__ == "__main__":
    main()
