"""Small record factories for the state tests."""

from __future__ import annotations

from pyctl.cluster.records import (
    Constraints,
    Event,
    EventType,
    NodeRecord,
    NrtRecord,
    PdbRecord,
    PodRecord,
    PodTerm,
    Record,
    Selector,
    Taint,
    Toleration,
    ZoneRecord,
)


def node(name: str, rv: str = "1", gpus: int = 8) -> NodeRecord:
    return NodeRecord(
        name=name,
        resource_version=rv,
        gpu_model="NVIDIA-H100-80GB-HBM3",
        cpu_milli=96_000,
        memory_mib=1_048_576,
        gpus=gpus,
        mig=(("1g.10gb", 7),),
        gpu_numa=((0, 0), (1, 1)),
        topology_policy="single-numa-node",
        taints=(Taint("nvidia.com/gpu", "present", "NoSchedule"),),
        labels=(("kubernetes.io/hostname", name), ("nvidia.com/gpu.product", "H100")),
    )


def pod(namespace: str, name: str, node_name: str = "", rv: str = "1", gpus: int = 1) -> PodRecord:
    return PodRecord(
        namespace=namespace,
        name=name,
        uid=f"uid-{namespace}-{name}",
        resource_version=rv,
        node=node_name,
        phase="Running" if node_name else "Pending",
        gpus=gpus,
        labels=(("app", name.rsplit("-", 1)[0]),),
        owner_kind="ReplicaSet",
        owner_name=f"{name}-rs",
        created=1_700_000_000.0,
        constraints=Constraints(
            node_selector=(("gpu-type", "a100"),),
            tolerations=(Toleration("nvidia.com/gpu", "Exists"),),
            anti_affinity=(
                PodTerm("kubernetes.io/hostname", Selector((("app", name.rsplit("-", 1)[0]),))),
            ),
        ),
    )


def pdb(namespace: str, name: str, allowed: int = 1) -> PdbRecord:
    return PdbRecord(
        namespace=namespace,
        name=name,
        match_labels=(("app", name),),
        min_available="50%",
        disruptions_allowed=allowed,
    )


def nrt(name: str) -> NrtRecord:
    zones = tuple(ZoneRecord(numa=i, gpus=4, gpus_available=4 - i) for i in range(2))
    return NrtRecord(name=name, policy="single-numa-node", scope="container", zones=zones)


def ev(kind: EventType, record: Record) -> Event:
    return Event(type=kind, record=record)
