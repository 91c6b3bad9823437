"""Records → the core's cluster model: where what the NVIDIA stack shows becomes nodes, NUMA
zones, GPUs and MIG instances.

- GPUs: `nvidia.com/gpu` allocatable; the model from the GFD label `nvidia.com/gpu.product`.
- MIG (mixed strategy): `nvidia.com/mig-<profile>` allocatable, one instance per unit. Kubernetes
  does not show placements, so instances are packed onto the node's MIG GPUs by the exact
  placement search (a layout mig-parted could have made); pods' requests say which are in use.
- NUMA: per-zone resources from NodeResourceTopology, with its Topology Manager policy; otherwise
  the per-GPU labels `nvidia.com/gpu-<i>-numa` (CPU and memory then split evenly over the zones, an
  approximation); otherwise one zone.
  When NodeResourceTopology's MIG counts differ from the node's allocatable (the agent lags a
  re-partition), the allocatable's are taken.
- Used amounts: the requests of the pods bound to the node that have not terminated; with
  NodeResourceTopology, its per-zone usage, topped up with what the pods use and it does not
  show yet (the agent that writes it lags the scheduler).

Every count translate loops over (GPUs, MIG instances, NUMA zones) is first checked against
`pyctl.cluster.bounds` (`records.check_record`): a record beyond them is a `TranslateError`, never
a long loop.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from pyctl.cluster import bounds
from pyctl.cluster.records import NodeRecord, NrtRecord, PodRecord, check_record
from pyctl.core import mig
from pyctl.core.fragmentation import check_shape
from pyctl.model import TOPOLOGY_POLICIES, Gpu, MigGpu, MigInstance, Node, PolicyName, Shape, Zone


class TranslateError(ValueError):
    """A node whose resources cannot be turned into the model; the message names it."""


@dataclass
class _Draft:
    numa: int
    cpu: int = 0
    cpu_used: int = 0
    mem: int = 0
    mem_used: int = 0
    gpus: int = 0
    gpus_used: int = 0
    mig: dict[str, int] = field(default_factory=dict)


def pod_shape(p: PodRecord) -> Shape:
    profile = p.mig[0][0] if p.mig else None
    return Shape(
        cpu_milli=p.cpu_milli,
        memory_mib=p.memory_mib,
        gpus=p.gpus,
        gpu_milli=1000 if p.gpus else 0,
        mig_profile=profile,
    )


def pod_shape_problem(p: PodRecord) -> str | None:
    """Why pyctl cannot model `p`'s request as a task shape (so the pod is left out of the
    workload M, of the pending pods and of the compaction candidates), or None. The core decides
    (`check_shape`); the common mistake is named in the user's words."""
    if p.gpus and p.mig:
        return f"requests both nvidia.com/gpu and a MIG profile (nvidia.com/mig-{p.mig[0][0]})"
    why = check_shape(pod_shape(p))
    return None if why is None else f"its GPU request is not one pyctl can model: {why}"


def _top_up(drafts: list[_Draft], used_cpu: int, used_mem: int, used_gpus: int) -> None:
    for attr, cap, total in (
        ("cpu_used", "cpu", used_cpu),
        ("mem_used", "mem", used_mem),
        ("gpus_used", "gpus", used_gpus),
    ):
        missing = total - sum(getattr(d, attr) for d in drafts)
        for d in drafts:
            if missing <= 0:
                break
            room = getattr(d, cap) - getattr(d, attr)
            add = min(max(room, 0), missing)
            setattr(d, attr, getattr(d, attr) + add)
            missing -= add


def _spread(drafts: list[_Draft], used_cpu: int, used_mem: int, used_gpus: int) -> None:
    for d in drafts:
        d.cpu_used = min(d.cpu, used_cpu)
        d.mem_used = min(d.mem, used_mem)
        d.gpus_used = min(d.gpus, used_gpus)
        used_cpu -= d.cpu_used
        used_mem -= d.mem_used
        used_gpus -= d.gpus_used


def _mig_from_allocatable(drafts: list[_Draft], node: NodeRecord) -> None:
    """After a re-partition the node's allocatable (the device plugin, via the kubelet) shows
    the new MIG instances before the topology agent rewrites NodeResourceTopology. The scheduler
    goes by the allocatable, so when the two disagree the allocatable's counts are taken, on the
    first zone that had MIG instances (the split over zones is unknown until the agent catches
    up)."""
    counts = Counter[str]()
    for d in drafts:
        counts.update({p: n for p, n in d.mig.items() if n > 0})
    want = {p: n for p, n in node.mig if n > 0}
    if dict(counts) == want:
        return
    home = next((d for d in drafts if any(d.mig.values())), drafts[0])
    for d in drafts:
        d.mig = {}
    home.mig = dict(want)


def node_from_records(
    node: NodeRecord, nrt: NrtRecord | None, pods: Iterable[PodRecord], default_policy: str = "none"
) -> Node:
    where = f"node {node.name[:253]}"
    live = [p for p in pods if not p.terminated]
    try:
        check_record(node)
        if nrt is not None:
            check_record(nrt)
        for p in live:
            bounds.check(f"pod {p.key[:300]} nvidia.com/gpu", p.gpus, bounds.MAX_GPUS_PER_POD)
            for prof, n in p.mig[: bounds.MAX_MIG_PROFILES + 1]:
                bounds.check(f"pod {p.key[:300]} MIG {prof[:40]}", n, bounds.MAX_MIG_PER_POD)
            bounds.check_len(f"pod {p.key[:300]} MIG", len(p.mig), bounds.MAX_MIG_PROFILES)
    except bounds.BoundsError as e:
        raise TranslateError(f"{where}: {e}") from None
    used_cpu = sum(p.cpu_milli for p in live)
    used_mem = sum(p.memory_mib for p in live)
    used_gpus = sum(p.gpus for p in live)
    used_mig: dict[str, list[str]] = defaultdict(list)
    for p in live:
        for prof, n in p.mig:
            used_mig[prof].extend([p.key] * n)
    policy = node.topology_policy or default_policy
    if nrt is not None and nrt.zones:
        policy = nrt.policy or policy
        drafts = [
            _Draft(
                z.numa,
                z.cpu_milli,
                z.cpu_milli - z.cpu_available,
                z.memory_mib,
                z.memory_mib - z.memory_available,
                z.gpus,
                z.gpus - z.gpus_available,
                {p: n for p, n, _ in z.mig},
            )
            for z in nrt.zones
        ]
        # NodeResourceTopology is written by an agent on the node and can lag the pods bound
        # there: usage it does not show yet goes to the zones with room, in order
        _top_up(drafts, used_cpu, used_mem, used_gpus)
        _mig_from_allocatable(drafts, node)
    else:
        numa_of = dict(node.gpu_numa)
        per_numa = Counter(numa_of.values())
        ids = sorted(per_numa) or [0]
        drafts = [_Draft(i) for i in ids]
        k = len(drafts)
        for i, d in enumerate(drafts):
            d.cpu = node.cpu_milli // k + (node.cpu_milli % k if i == 0 else 0)
            d.mem = node.memory_mib // k + (node.memory_mib % k if i == 0 else 0)
            d.gpus = per_numa[d.numa] if numa_of else node.gpus
        if numa_of and sum(d.gpus for d in drafts) != node.gpus:
            drafts[0].gpus = max(0, drafts[0].gpus + node.gpus - sum(d.gpus for d in drafts))
        drafts[0].mig = dict(node.mig)
        _spread(drafts, used_cpu, used_mem, used_gpus)
    if policy not in TOPOLOGY_POLICIES:
        raise TranslateError(f"{where}: unknown Topology Manager policy {policy!r}")
    mig_gpus = max(0, node.gpu_count_label - node.gpus) if node.mig else 0
    mig_zones = sum(1 for d in drafts if any(d.mig.values()))
    zones = []
    gid = 0
    for d in sorted(drafts, key=lambda d: d.numa):
        gpus = []
        for j in range(max(d.gpus, 0)):
            gpus.append(Gpu(gid, 1000 if j < d.gpus_used else 0))
            gid += 1
        migs = []
        if any(d.mig.values()):
            if not node.gpu_model:
                raise TranslateError(f"{where}: MIG resources but no nvidia.com/gpu.product label")
            # the node's MIG GPUs, shared out over the zones that have MIG instances
            per_zone = max(1, -(-mig_gpus // max(1, mig_zones)))
            try:
                layouts = mig.pack(node.gpu_model, sorted(d.mig.items()), per_zone)
            except ValueError as e:
                raise TranslateError(f"{where}: {e}") from None
            for layout in layouts:
                insts = []
                for prof, start in layout:
                    users = used_mig.get(prof) or []
                    pod = users.pop(0) if users else None
                    insts.append(MigInstance(prof, int(start), pod is not None, pod))
                migs.append(MigGpu(gid, tuple(insts)))
                gid += 1
        zones.append(
            Zone(
                d.numa,
                d.cpu,
                min(max(d.cpu_used, 0), d.cpu),
                d.mem,
                min(max(d.mem_used, 0), d.mem),
                tuple(gpus),
                tuple(migs),
            )
        )
    return Node(
        name=node.name,
        gpu_model=node.gpu_model,
        topology_policy=cast(PolicyName, policy),
        zones=tuple(zones),
    )


def attribute_pods(
    node: Node, pods: Iterable[PodRecord]
) -> dict[str, dict[str, list[object] | object]]:
    """Where each pod sits on `node`, as a core assignment (zone positions, GPU positions, MIG
    instance). Kubernetes shows per-zone usage (NodeResourceTopology) but not which pod holds which
    device, so pods are attributed in order: a MIG pod to the instance translate gave it, a GPU pod
    to the next used GPUs, zone by zone, and its CPU and memory to the zones with used CPU and
    memory left, its GPUs' zone first. The amounts always add up to the node's usage."""
    used_gpus = [
        (zi, gi) for zi, z in enumerate(node.zones) for gi, g in enumerate(z.gpus) if g.used_milli
    ]
    cpu_left = [z.cpu_milli_used for z in node.zones]
    mem_left = [z.memory_mib_used for z in node.zones]
    mig_of: dict[str, tuple[int, int, int]] = {}
    for zi, z in enumerate(node.zones):
        for mi, m in enumerate(z.mig):
            for ii, inst in enumerate(m.instances):
                if inst.pod and inst.pod not in mig_of:
                    mig_of[inst.pod] = (zi, mi, ii)
    out: dict[str, dict[str, list[object] | object]] = {}
    for p in sorted((p for p in pods if not p.terminated), key=lambda p: p.key):
        gpus = [(zi, gi, 1000) for zi, gi in used_gpus[: p.gpus]]
        used_gpus = used_gpus[p.gpus :]
        mig = mig_of.get(p.key)
        home = gpus[0][0] if gpus else (mig[0] if mig else 0)
        order = [home] + [i for i in range(len(node.zones)) if i != home]

        def take(left: list[int], amount: int, order: list[int] = order) -> list[tuple[int, int]]:
            taken = []
            for zi in order:
                if amount <= 0:
                    break
                t = min(left[zi], amount)
                if t > 0:
                    taken.append((zi, t))
                    left[zi] -= t
                    amount -= t
            return taken

        out[p.key] = {
            "cpu": take(cpu_left, p.cpu_milli),
            "memory": take(mem_left, p.memory_mib),
            "gpus": gpus,
            "mig": mig,
        }
    return out
