"""One compaction planning round, offline: `plan_compaction` (the code the controller's compactor
runs each round) on a synthetic cluster of NODES GPU nodes (8 GPUs in 2 NUMA zones under
`single-numa-node`, 10 pods per node: CPU-only pods and 1- and 2-GPU replicas of 10 workloads,
each with a PodDisruptionBudget, and 25 pending 4-GPU replicas), ROUNDS rounds on the same
records with the per-round cache kept between rounds, as the controller keeps it (with
`--changed`, the pods' records and models of that share of the nodes are replaced before each
round, as binds, deletions and churn replace them in the controller). Prints each round's time,
the share of the core's planner (`FragmentModel.plan`, the Rust call) and the median of the
rounds after the first (the first one also derives every node's pods: where each sits on its
GPUs, the evictor's verdict, its shape and destinations; later ones derive again only the nodes
whose inputs changed).

This is the round's own cost on an idle process; in a controller the round runs in a worker
thread beside the event loop and takes longer under load (docs/scale.md).

    python bench/compaction_round.py [--nodes 5000] [--rounds 4] [--seed 1] [--changed 0.3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

import msgspec
from _common import REPO  # noqa: F401  (puts the repository on sys.path)

from pyctl.cluster.records import NodeRecord, NrtRecord, PdbRecord, PodRecord, ZoneRecord
from pyctl.cluster.translate import models_of
from pyctl.core import policy
from pyctl.model import Shape, Workload
from pyctl.workflows.compaction import RoundCache, plan_compaction
from pyctl.workflows.loop import collector_paused

WORKLOADS = 10


def cluster(
    n: int, seed: int
) -> tuple[dict[str, NodeRecord], list[NrtRecord], list[PodRecord], list[PodRecord]]:
    rng = random.Random(seed)
    nodes: dict[str, NodeRecord] = {}
    nrts: list[NrtRecord] = []
    pods: list[PodRecord] = []
    for i in range(n):
        name = f"n{i}"
        nodes[name] = NodeRecord(
            name,
            gpu_model="NVIDIA-H100-80GB-HBM3",
            cpu_milli=64000,
            memory_mib=1 << 20,
            gpus=8,
            labels=(("kubernetes.io/hostname", name),),
        )
        used = [0, 0]
        for j in range(WORKLOADS):
            gpus = rng.choice([0, 0, 0, 1, 1, 2])
            zone = rng.randrange(2)
            if used[zone] + gpus > 4:
                gpus = 0
            used[zone] += gpus
            pods.append(
                PodRecord(
                    "serving",
                    f"p{i}-{j}",
                    uid=f"u{i}-{j}",
                    node=name,
                    phase="Running",
                    cpu_milli=1000,
                    memory_mib=1024,
                    gpus=gpus,
                    owner_kind="ReplicaSet",
                    owner_name=f"w{j}",
                    labels=(("app", f"w{j}"),),
                )
            )
        nrts.append(
            NrtRecord(
                name,
                policy="single-numa-node",
                zones=tuple(
                    ZoneRecord(z, 32000, 32000 - 5000, 1 << 19, 1 << 19, 4, 4 - used[z])
                    for z in range(2)
                ),
            )
        )
    pending = [
        PodRecord(
            "serving",
            f"big{i}",
            uid=f"b{i}",
            phase="Pending",
            cpu_milli=4000,
            gpus=4,
            owner_kind="ReplicaSet",
            owner_name="big",
            unschedulable=True,
        )
        for i in range(25)
    ]
    return nodes, nrts, pods, pending


def round_inputs(n: int, seed: int) -> tuple[
    dict[str, Any], dict[str, NodeRecord], list[PodRecord], list[PodRecord], list[PdbRecord],
    Workload,
]:  # fmt: skip
    """The synthetic cluster's planning inputs: models, node records, running and pending pods,
    a PodDisruptionBudget per workload, and M (1- and 4-GPU replicas, half each)."""
    nodes, nrts, pods, pending = cluster(n, seed)
    models = models_of(nodes.values(), nrts, pods)
    pdbs = [
        PdbRecord("serving", f"w{j}", match_labels=(("app", f"w{j}"),), disruptions_allowed=5)
        for j in range(WORKLOADS)
    ]
    workload = Workload(
        (
            Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
            Shape(cpu_milli=4000, gpus=4, gpu_milli=1000, weight=0.5),
        )
    )
    return models, nodes, pods, pending, pdbs, workload


class _Timed:
    """The core's `plan` call of a `FragmentationModel`, timed."""

    def __init__(self, real: Any, spent: list[float]) -> None:
        self._real = real
        self._spent = spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def plan(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self._real.plan(*args, **kwargs)
        finally:
            self._spent.append(time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--changed",
        type=float,
        default=0.0,
        help="before each round after the first, replace the pods' records (and so the models) "
        "of this share of the nodes, as binds, deletions and churn do between rounds",
    )
    args = ap.parse_args(argv)
    models, nodes, pods, pending, pdbs, workload = round_inputs(args.nodes, args.seed)
    nrts = cluster(args.nodes, args.seed)[1]
    spent: list[float] = []
    real_plan = policy.plan

    def timed_plan(model: Any, *a: Any, **kw: Any) -> policy.Plan:
        model.core = _Timed(model.core, spent)
        return real_plan(model, *a, **kw)

    policy.plan = timed_plan
    kept = RoundCache()
    times: list[float] = []
    rng = random.Random(args.seed)
    names = sorted(nodes)
    nrt_of = {r.name: r for r in nrts}
    try:
        for r in range(args.rounds):
            if r and args.changed:  # the records of the pods on a share of the nodes replaced
                changed = set(rng.sample(names, round(args.changed * len(names))))
                pods = [
                    msgspec.structs.replace(p, resource_version=f"{r}") if p.node in changed else p
                    for p in pods
                ]
                on = [p for p in pods if p.node in changed]
                models.update(
                    models_of([nodes[n] for n in changed], [nrt_of[n] for n in changed], on)
                )
            t0 = time.perf_counter()
            with collector_paused():  # as the controller's compactor runs a round
                plan = plan_compaction(
                    models, nodes, pods + pending, pdbs, workload, pending=pending, round_cache=kept
                )
            times.append(time.perf_counter() - t0)
            print(
                f"round {r}: {times[-1]:.2f} s, of which the core's planner {spent[-1]:.2f} s; "
                f"{plan.considered} movable pods, {len(plan.moves)} moves, "
                f"{len(plan.rescues)} rescues"
            )
    finally:
        policy.plan = real_plan
    later = times[1:] or times
    print(
        f"compaction round: {args.nodes} nodes, {len(pods)} pods, median "
        f"{statistics.median(later):.2f} s after the first ({times[0]:.2f} s); "
        f"{args.changed:.0%} of the nodes changed before each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
