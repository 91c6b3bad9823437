"""A small mixed cluster as `kubectl get nodes,pods,replicasets -o json` shows it, for the
`pyctl recommend` tests: A100-40GB nodes with MIG (mixed strategy) and whole GPUs, an L40S node,
a CPU node, and Deployments (pods owned by ReplicaSets) of several GPU sizes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

PRODUCT = "NVIDIA-A100-SXM4-40GB"


def node(
    name: str,
    *,
    product: str = PRODUCT,
    whole: int = 8,
    mig: Mapping[str, int] | None = None,
    gpu_count: int | None = None,
    memory_mib: int | None = None,
    mig_config: str = "",
) -> dict[str, Any]:
    alloc = {"cpu": "128", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(whole)}
    for p, n in (mig or {}).items():
        alloc[f"nvidia.com/mig-{p}"] = str(n)
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels["nvidia.com/gpu.product"] = product
        labels["nvidia.com/gpu.count"] = str(whole if gpu_count is None else gpu_count)
    if memory_mib:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    if mig_config:
        labels["nvidia.com/mig.config"] = mig_config
    if not product:
        alloc.pop("nvidia.com/gpu")
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": alloc,
            "allocatable": dict(alloc),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def replicaset(ns: str, deployment: str, h: str) -> dict[str, Any]:
    return {
        "kind": "ReplicaSet",
        "apiVersion": "apps/v1",
        "metadata": {
            "name": f"{deployment}-{h}",
            "namespace": ns,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": deployment,
                    "controller": True,
                    "uid": "x",
                }
            ],
        },
    }


def pod(
    ns: str,
    deployment: str,
    i: int,
    node_name: str | None,
    resource: str | None,
    count: int = 1,
    *,
    h: str = "7c9f",
    cpu: str = "2",
    limits_only: bool = True,
    owner_kind: str = "ReplicaSet",
) -> dict[str, Any]:
    gpu = {resource: str(count)} if resource else {}
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": "4Gi"}}
    if limits_only:
        resources["limits"] = dict(gpu)
    else:
        resources["requests"].update(gpu)
        resources["limits"] = dict(gpu)
    owner = f"{deployment}-{h}" if owner_kind == "ReplicaSet" else deployment
    meta: dict[str, Any] = {
        "name": f"{owner}-{i:05d}" if owner_kind == "ReplicaSet" else f"{deployment}-{i}",
        "namespace": ns,
        "labels": {"app": deployment, "pod-template-hash": h},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": owner_kind,
                "name": owner,
                "controller": True,
                "uid": "y",
            }
        ],
    }
    spec: dict[str, Any] = {
        "containers": [
            {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}}},
            {"name": "server", "resources": resources},
        ]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


#: (deployment, MIG profile or "gpu", GPUs, replicas, node)
DEPLOYMENTS: tuple[tuple[str, str, int, int, str], ...] = (
    ("bert", "1g.5gb", 1, 6, "a100-a"),
    ("embed", "1g.10gb", 1, 2, "a100-a"),
    ("resnet", "2g.10gb", 1, 3, "a100-a"),
    ("vision", "3g.20gb", 1, 1, "a100-a"),
    ("llm", "gpu", 1, 3, "a100-b"),
    ("trainer", "gpu", 2, 1, "a100-b"),
    ("l40s-app", "gpu", 1, 2, "l40s-a"),
)


def cluster(
    deployments: Sequence[tuple[str, str, int, int, str]] = DEPLOYMENTS,
    *,
    ns: str = "serving",
    extra: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The dump: MIG on a100-a (4 MIG GPUs: 1g.5gb x7, 1g.10gb x4, 2g.10gb x3 + 1g.5gb,
    3g.20gb x2; 4 whole GPUs), a100-b (8 whole GPUs), an L40S node, a CPU node."""
    mig = Counter({"1g.5gb": 8, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2})
    items: list[dict[str, Any]] = [
        node("a100-a", whole=4, mig=mig, gpu_count=8, mig_config="custom"),
        node("a100-b", whole=8, mig_config="all-disabled"),
        node("l40s-a", product="NVIDIA-L40S", whole=4, memory_mib=46068),
        node("cpu-a", product="", whole=0),
    ]
    for name, size, gpus, replicas, where in deployments:
        items.append(replicaset(ns, name, "7c9f"))
        resource = "nvidia.com/gpu" if size == "gpu" else f"nvidia.com/mig-{size}"
        for i in range(replicas):
            items.append(pod(ns, name, i, where, resource, gpus))
    items.append(replicaset(ns, "frontend", "7c9f"))
    for i in range(2):
        items.append(pod(ns, "frontend", i, "cpu-a", None))
    items.extend(extra)
    return {"apiVersion": "v1", "kind": "List", "items": items}
