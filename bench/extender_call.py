"""One scheduler extender call, offline: the ``choose`` answer (`ExtenderHandler.answer_kept`, the
code the extender's process runs for each call it answers from kept ranks) on the synthetic
cluster of `bench/compaction_round.py` (NODES GPU nodes of 8 GPUs in 2 NUMA zones, 10 pods each),
for a 1-GPU pod as the kube-scheduler sends it (the whole Pod) with CANDIDATES of the nodes (the
scheduler sends about 10% of 5,000 nodes: `percentageOfNodesToScore`), every rank kept, as the
extender's process keeps them ahead of the calls.

Prints the time per call (median and p99 of CALLS calls, each on a new random set of
candidates), then the same for calls after one node of each call's candidates changed its model
(its rank computed during the call, as after a bind), and last the median of two parts of a call
from kept ranks: reading the request and the advice (`PlacementAdvisor.choose`, with the
topology domains' tie order as the controller wires it: `--clique-size N` puts every N nodes in
one `nvidia.com/gpu.clique`, 0 none):

    python bench/extender_call.py [--nodes 5000] [--candidates 500] [--calls 2000] [--clique-size 0]

This is pyctl's own part of a call on an idle process; at the scheduler a call also pays for
encoding the Pod, the HTTP round trip and decoding the answer (docs/scale.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time

from _common import REPO  # noqa: F401  (puts the repository on sys.path)
from compaction_round import round_inputs
from scale import pod_manifest

from pyctl.cluster.kube.extender import parse_args
from pyctl.controller.domains import DomainIdle
from pyctl.controller.placement import PlacementAdvisor
from pyctl.serve.extender import ExtenderHandler


def body(names: list[str]) -> bytes:
    pod = pod_manifest("serve-0", gpus=1, cpu_milli=1000, mem_gib=1, owner="ReplicaSet/serve")
    pod["metadata"]["uid"] = "0b1c2d3e-0000-4000-8000-000000000000"
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--clique-size", type=int, default=0, help="nodes per clique (0: no cliques)")
    args = ap.parse_args(argv)
    models, _nodes, _pods, _pending, _pdbs, workload = round_inputs(args.nodes, args.seed)
    index = DomainIdle(("nvidia.com/gpu.clique",))
    for i, (name, node) in enumerate(sorted(models.items())):
        clique = {"nvidia.com/gpu.clique": f"c.{i // args.clique_size}"} if args.clique_size else {}
        idle = sum(1000 - g.used_milli for z in node.zones for g in z.gpus if g.used_milli == 0)
        index.update(name, clique, idle)
    advisor = PlacementAdvisor(models, lambda: workload, domains=lambda: index)
    handler = ExtenderHandler(advisor)
    rng = random.Random(args.seed)
    names = sorted(models)
    handler.answer("choose", body(names))  # every rank kept, as ranked ahead
    bodies = [body(rng.sample(names, args.candidates)) for _ in range(args.calls)]

    def run(change: bool) -> dict[str, list[float]]:
        got: dict[str, list[float]] = {"call": [], "read": [], "advice": []}
        for b in bodies:
            if change:  # a bind re-scored one of the candidates: a new model object
                name = json.loads(b)["NodeNames"][0]
                models[name] = dataclasses.replace(models[name])
            t0 = time.perf_counter()
            answer = handler.answer("choose", b) if change else handler.answer_kept("choose", b)
            t1 = time.perf_counter()
            if answer is None or answer[1] != "ok":
                raise SystemExit(f"extender call: no answer from kept ranks: {answer}")
            got["call"].append(t1 - t0)
            # the parts, again on the same request (every rank kept now)
            a = parse_args(b)
            t2 = time.perf_counter()
            advisor.choose(a.pod, tuple(dict.fromkeys(a.names)), False)
            got["advice"].append(time.perf_counter() - t2)
            t3 = time.perf_counter()
            parse_args(b)
            got["read"].append(time.perf_counter() - t3)
        return got

    for label, change in (("every rank kept", False), ("one candidate re-scored", True)):
        got = run(change)
        call = got["call"]
        print(
            f"{label}: per call median {statistics.median(call) * 1e3:.3f} ms, p99 "
            f"{pct(call, 0.99) * 1e3:.3f} ms"
        )
    print(
        f"extender call: {args.nodes} nodes, {args.candidates} candidates"
        f"{f', cliques of {args.clique_size}' if args.clique_size else ''}, median "
        f"{statistics.median(got['call']) * 1e3:.3f} ms with one re-scored; kept: reading the "
        f"request {statistics.median(got['read']) * 1e3:.3f} ms, the advice "
        f"{statistics.median(got['advice']) * 1e3:.3f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
