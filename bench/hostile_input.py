"""Hostile input: what the bounds (pyctl/cluster/bounds.py) cost and what they save, measured in
one run.

- translate + score of one node: a typical 8-GPU node, a node at the bound (1,024 `nvidia.com/gpu`
  units), and the refusal of a node claiming 1,000,000 GPUs (before the bounds that count was a
  loop: 3.7 s per score, and "999999999999999999999" never finished);
- decode of one pod watch event: a good pod, a pod asking for 2**32 GPUs (refused), a pod with
  2,000 tolerations (refused while decoding);
- the controller's reconcile of one node beside a hostile pending pod (GPUs and a MIG profile at
  once), against the same reconcile without it.

Last line: `hostile_input: refusing 1e6 GPUs <R> us vs <T> us to translate+score an 8-GPU node;
at the bound (1024 GPUs) <B> ms`.
"""

from __future__ import annotations

import contextlib
import json
import logging

from _common import best_of

from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import Event, NodeRecord, PodRecord, Record
from pyctl.cluster.translate import TranslateError, node_from_records
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.core.fragmentation import FragmentationModel
from pyctl.metrics import Metrics
from pyctl.model import Shape, Snapshot, Workload

M = Workload((Shape(cpu_milli=4000, gpus=1, gpu_milli=1000),))


def node(gpus: int) -> NodeRecord:
    return NodeRecord(
        "n",
        gpu_model="NVIDIA-H100-80GB-HBM3",
        cpu_milli=256_000,
        memory_mib=2 << 20,
        gpus=gpus,
        gpu_numa=tuple((i, i * 2 // max(gpus, 1)) for i in range(min(gpus, 1024))),
    )


def translate_and_score(rec: NodeRecord) -> None:
    n = node_from_records(rec, None, [])
    FragmentationModel(Snapshot((n,))).score(M)


def refuse(rec: NodeRecord) -> None:
    try:
        node_from_records(rec, None, [])
    except TranslateError:
        return
    raise AssertionError("not refused")


def pod_json(**spec: object) -> bytes:
    return json.dumps(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "resources": {"requests": {"cpu": "4", "memory": "16Gi", **spec}},
                    }
                ]
            },
        }
    ).encode()


def decode(data: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode_object("Pod", data)


def reconcile_time(hostile: bool) -> float:
    cache = ClusterCache()
    pods = [PodRecord("ns", f"p{i}", f"u{i}", node="n", gpus=1, cpu_milli=4000) for i in range(4)]
    if hostile:
        pods.append(PodRecord("ns", "h", "uh", gpus=2, mig=(("1g.10gb", 1),), unschedulable=True))
    records: list[Record] = [node(8), *pods]
    cache.apply([Event("ADDED", r) for r in records])
    r = Reconciler(cache, Metrics(), "bench")

    def once() -> None:
        r.refresh_workload()
        r.reconcile("n")
        r.summary()

    return best_of(once, repeat=5, number=200)


def main() -> None:
    logging.disable(logging.WARNING)  # the hostile pod is reported on every run
    eight, bound, absurd = node(8), node(1024), node(1_000_000)
    typical = best_of(lambda: translate_and_score(eight), repeat=5, number=200)
    at_bound = best_of(lambda: translate_and_score(bound), repeat=5, number=5)
    refused = best_of(lambda: refuse(absurd), repeat=5, number=2000)
    print(f"translate+score, 8-GPU node:        {typical * 1e6:9.1f} us")
    print(f"translate+score, 1024 GPUs (bound): {at_bound * 1e6:9.1f} us")
    print(f"refuse a node of 1,000,000 GPUs:    {refused * 1e6:9.1f} us")
    good = pod_json(**{"nvidia.com/gpu": "1"})
    huge = pod_json(**{"nvidia.com/gpu": "4294967296"})
    many = json.loads(good)
    many["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}] * 2000
    many_b = json.dumps(many).encode()
    for label, data in (("good pod", good), ("2**32 GPUs", huge), ("2000 tolerations", many_b)):
        t = best_of(lambda d=data: decode(d), 5, 2000)  # type: ignore[misc]
        print(f"decode, {label + ':':27} {t * 1e6:9.1f} us")
    clean, dirty = reconcile_time(False), reconcile_time(True)
    print(f"refresh M + reconcile + summary:    {clean * 1e6:9.1f} us")
    print(f"  ... beside a hostile pending pod: {dirty * 1e6:9.1f} us ({dirty / clean:.2f}x)")
    print(
        f"hostile_input: refusing 1e6 GPUs {refused * 1e6:.1f} us vs {typical * 1e6:.1f} us to "
        f"translate+score an 8-GPU node; at the bound (1024 GPUs) {at_bound * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    main()
