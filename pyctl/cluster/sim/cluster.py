"""The simulated cluster's truth: which pod sits where (zones, GPUs, MIG instances), with a
scheduler that behaves as kube-scheduler does here: it binds a pod only where the kubelet would
admit it, scores nodes with the default plugins that tell nodes apart by their resources
(NodeResourcesFit LeastAllocated and BalancedAllocation, `pyctl.core.policy.kube_default_scores`)
and, when one is configured, a scheduler extender at the weight of deploy/scheduler (pyctl's
advice, `extender`); ties are drawn at random (seeded). The GPUs a pod gets on its node are those
pyctl's policy picks there (the device plugin's own choice is not modelled).
Its state is published as the records a real cluster would show (Node, NodeResourceTopology as
the NFD topology-updater writes it, Pod)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyctl.cluster.records import (
    NodeRecord,
    NodeSharing,
    NrtRecord,
    PodRecord,
    PodSharing,
    Taint,
    ZoneRecord,
)
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.inputs import AssignmentInput
from pyctl.core.policy import (
    EXTENDER_WEIGHT,
    MAX_EXTENDER_PRIORITY,
    kube_default_scores,
    rank,
)
from pyctl.core.types import Assignment
from pyctl.model import Gpu, MigGpu, MigInstance, Node, Shape, Snapshot, Workload

#: (pod, candidate nodes) -> (nodes filtered out with why, scores 0..MAX_EXTENDER_PRIORITY)
Extender = Callable[[PodRecord, tuple[str, ...]], tuple[Mapping[str, str], Mapping[str, int]]]
#: an extender score's weight in the total: MaxNodeScore / MaxExtenderPriority x its weight
EXTENDER_SCALE = 100 // MAX_EXTENDER_PRIORITY * EXTENDER_WEIGHT


@dataclass
class _ZoneState:
    numa: int
    cpu: int
    cpu_free: int
    mem: int
    mem_free: int
    gpu_free: list[int]
    #: per MIG GPU: [(profile, used)]
    mig: list[list[list[Any]]]


@dataclass
class SimPod:
    name: str
    shape: Shape
    node: str = ""
    assignment: Assignment | AssignmentInput | None = None
    unschedulable: bool = False
    #: the replica it is an incarnation of (its first pod's name; evictions make new pods)
    root: str = ""

    def __post_init__(self) -> None:
        self.root = self.root or self.name


@dataclass
class SimCluster:
    nodes: tuple[Node, ...]
    workload: Workload
    namespace: str = "inference"
    pods: dict[str, SimPod] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    #: a scheduler extender (pyctl's placement advice, wired in enforce mode): (pod, candidate
    #: nodes) -> (nodes it filters out, scores 0..10)
    extender: Extender | None = None
    seed: int = 0
    _rv: int = 0
    #: MIG reconfiguration: node -> (nvidia.com/mig.config, nvidia.com/mig.config.state)
    mig_labels: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: node -> taint keys (NoSchedule); cordoned nodes
    taints: dict[str, set[str]] = field(default_factory=dict)
    cordoned: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.model = FragmentationModel(Snapshot(self.nodes))
        self.zones: dict[str, list[_ZoneState]] = {
            n.name: [
                _ZoneState(
                    z.numa,
                    z.cpu_milli,
                    z.cpu_milli - z.cpu_milli_used,
                    z.memory_mib,
                    z.memory_mib - z.memory_mib_used,
                    [1000 - g.used_milli for g in z.gpus],
                    [[[i.profile, i.used] for i in m.instances] for m in z.mig],
                )
                for z in n.zones
            ]
            for n in self.nodes
        }
        self.by_name = {n.name: n for n in self.nodes}
        for n in self.nodes:  # MIG nodes start as the GPU Operator's all-1g.5gb
            profiles = {i.profile for z in n.zones for m in z.mig for i in m.instances}
            if profiles == {"1g.5gb"}:
                self.mig_labels.setdefault(n.name, ("all-1g.5gb", "success"))

    def rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    # -- records --------------------------------------------------------------------------
    def node_record(self, n: Node) -> NodeRecord:
        mig: dict[str, int] = {}
        mig_gpus = 0
        for z in n.zones:
            for m in z.mig:
                mig_gpus += 1
                for i in m.instances:
                    mig[i.profile] = mig.get(i.profile, 0) + 1
        gpus = sum(len(z.gpus) for z in n.zones)
        # a time-sliced node as the device plugin (renameByDefault) and GFD show it
        shared = n.gpu_replicas > 1 and n.gpu_pool == "nvidia.com/gpu.shared"
        return NodeRecord(
            name=n.name,
            resource_version=self.rv(),
            gpu_model=n.gpu_model,
            cpu_milli=sum(z.cpu_milli for z in n.zones),
            memory_mib=sum(z.memory_mib for z in n.zones),
            gpus=0 if shared else gpus,
            sharing=NodeSharing(
                "time-slicing", n.gpu_replicas, gpus * n.gpu_replicas, n.gpu_memory_mib
            )
            if shared
            else None,
            mig=tuple(sorted(mig.items())),
            gpu_count_label=gpus + mig_gpus,
            mig_strategy="mixed" if mig else "",
            mig_config=self.mig_labels.get(n.name, ("", ""))[0],
            mig_config_state=self.mig_labels.get(n.name, ("", ""))[1],
            unschedulable=n.name in self.cordoned,
            taints=tuple(
                Taint(k, effect="NoSchedule") for k in sorted(self.taints.get(n.name, ()))
            ),
        )

    def nrt_record(self, name: str) -> NrtRecord:
        zones = []
        for z in self.zones[name]:
            mig: dict[str, list[int]] = {}
            for g in z.mig:
                for prof, used in g:
                    a = mig.setdefault(prof, [0, 0])
                    a[0] += 1
                    a[1] += 0 if used else 1
            n = self.by_name[name]
            if n.gpu_replicas > 1:  # time-sliced: the zone's replicas of nvidia.com/gpu.shared
                unit = 1000 // n.gpu_replicas
                replicas = (len(z.gpu_free) * n.gpu_replicas, sum(f // unit for f in z.gpu_free))
                zones.append(
                    ZoneRecord(z.numa, z.cpu, z.cpu_free, z.mem, z.mem_free, 0, 0, (), *replicas)
                )
                continue
            zones.append(
                ZoneRecord(
                    z.numa,
                    z.cpu,
                    z.cpu_free,
                    z.mem,
                    z.mem_free,
                    len(z.gpu_free),
                    sum(1 for f in z.gpu_free if f == 1000),
                    tuple(sorted((p, a, f) for p, (a, f) in mig.items())),
                )
            )
        return NrtRecord(
            name, self.rv(), self.by_name[name].topology_policy, "container", tuple(zones)
        )

    def pod_record(self, p: SimPod) -> PodRecord:
        s = p.shape
        return PodRecord(
            namespace=self.namespace,
            name=p.name,
            uid=f"uid-{p.name}",
            resource_version=self.rv(),
            node=p.node,
            phase="Running" if p.node else "Pending",
            cpu_milli=s.cpu_milli,
            memory_mib=s.memory_mib,
            gpus=0 if s.gpu_pool else s.gpus,
            mig=((s.mig_profile, 1),) if s.mig_profile else (),
            # a replica of the time-sliced pool asks nvidia.com/gpu.shared
            sharing=PodSharing(shared=s.gpus) if s.gpu_pool else None,
            owner_kind="ReplicaSet",
            owner_name=p.name.rsplit("-", 1)[0],
            labels=(("app", p.name.rsplit("-", 1)[0]),),
            unschedulable=p.unschedulable,
            unschedulable_message=(
                f"0/{len(self.nodes)} nodes are available: no NUMA-aligned placement"
                if p.unschedulable
                else ""
            ),
        )

    # -- placement ------------------------------------------------------------------------
    def _default_score(self, name: str, shape: Shape) -> int:
        zs = self.zones[name]
        return kube_default_scores(
            sum(z.cpu for z in zs),
            sum(z.cpu_free for z in zs),
            sum(z.mem for z in zs),
            sum(z.mem_free for z in zs),
            shape.cpu_milli,
            shape.memory_mib,
        )

    def schedule(self, pod: SimPod, only: str | None = None) -> bool:
        """Bind `pod` as the scheduler would (on `only`, when given), or mark it unschedulable."""
        names = [
            n.name
            for n in (self.nodes if only is None else (self.by_name[only],))
            if n.name not in self.cordoned and not self.taints.get(n.name)
        ]
        feasible = {
            r.node: r for r in rank(self.model, pod.shape, self.workload, names) if r is not None
        }
        scores: Mapping[str, int] = {}
        if feasible and self.extender is not None:
            failed, scores = self.extender(self.pod_record(pod), tuple(feasible))
            feasible = {n: r for n, r in feasible.items() if n not in failed}
        best: list[str] = []
        top = -1
        for name in feasible:
            total = self._default_score(name, pod.shape) + scores.get(name, 0) * EXTENDER_SCALE
            if total > top:
                best, top = [name], total
            elif total == top:
                best.append(name)
        if not best:
            pod.unschedulable = True
            return False
        name = best[0] if len(best) == 1 else self.rng.choice(best)
        assignment = feasible[name].assignment.copy()
        self._apply(name, assignment, True)
        pod.node, pod.assignment, pod.unschedulable = name, assignment, False
        return True

    def _apply(self, name: str, a: Assignment | AssignmentInput, place: bool) -> None:
        self.model.apply(name, a, place)
        sign = -1 if place else 1
        zs = self.zones[name]
        for zi, v in a.get("cpu", []):
            zs[zi].cpu_free += sign * v
        for zi, v in a.get("memory", []):
            zs[zi].mem_free += sign * v
        for zi, gi, v in a.get("gpus", []):
            zs[zi].gpu_free[gi] += sign * v
        if mig := a.get("mig"):
            zi, mi, ii = mig
            zs[zi].mig[mi][ii][1] = place

    def remove(self, pod: SimPod) -> str:
        node = pod.node
        if pod.assignment is not None:
            self._apply(node, pod.assignment, False)
        pod.node, pod.assignment = "", None
        return node

    def current_nodes(self) -> tuple[Node, ...]:
        """The nodes as the model sees them now, usage included (MIG instances name the pod
        that holds them)."""
        holder: dict[tuple[str, int, int, int], str] = {}
        for p in self.pods.values():
            if p.node and p.assignment is not None and (mig := p.assignment.get("mig")):
                zi, mi, ii = mig
                holder[(p.node, zi, mi, ii)] = p.name
        out = []
        for n in self.nodes:
            zones = []
            for zi, (z, st) in enumerate(zip(n.zones, self.zones[n.name], strict=True)):
                gpus = tuple(
                    Gpu(g.id, 1000 - free) for g, free in zip(z.gpus, st.gpu_free, strict=True)
                )
                migs = tuple(
                    MigGpu(
                        m.gpu,
                        tuple(
                            MigInstance(
                                i.profile, i.start, bool(used), holder.get((n.name, zi, mi, ii))
                            )
                            for ii, (i, (_, used)) in enumerate(
                                zip(m.instances, st.mig[mi], strict=True)
                            )
                        ),
                    )
                    for mi, m in enumerate(z.mig)
                )
                zones.append(
                    replace(
                        z,
                        cpu_milli_used=st.cpu - st.cpu_free,
                        memory_mib_used=st.mem - st.mem_free,
                        gpus=gpus,
                        mig=migs,
                    )
                )
            out.append(replace(n, zones=tuple(zones)))
        return tuple(out)

    # -- MIG reconfiguration (mig-parted apply, as the simulated mig-manager does it) -----------
    def reconfigure_mig(self, name: str, layouts: list[dict[str, int] | None]) -> bool:
        """Re-partition the node's MIG GPUs (in zone order; None: unchanged). A GPU whose layout
        changes is destroyed and re-created (mig-parted is not incremental): False, and nothing
        changes, if an instance of it is in use ("In use by another client") or the layout does
        not fit."""
        from pyctl.core import mig as mig_mod

        n = self.by_name[name]
        zs = self.zones[name]
        k = 0
        new_zones = []
        changes: list[tuple[int, int, list[list[Any]]]] = []
        for zi, z in enumerate(n.zones):
            migs = []
            for mi, m in enumerate(z.mig):
                want = layouts[k] if k < len(layouts) else None
                k += 1
                have: dict[str, int] = {}
                for i in m.instances:
                    have[i.profile] = have.get(i.profile, 0) + 1
                if want is None or {p: c for p, c in want.items() if c} == have:
                    migs.append(m)
                    continue
                if any(used for _, used in zs[zi].mig[mi]):
                    return False
                profiles = [p for p, c in sorted(want.items()) for _ in range(c)]
                starts = mig_mod.place(n.gpu_model, [], profiles)
                if starts is None:
                    return False
                insts = tuple(MigInstance(p, st) for p, st in zip(profiles, starts, strict=True))
                migs.append(MigGpu(m.gpu, insts))
                changes.append((zi, mi, [[p, False] for p in profiles]))
            new_zones.append(replace(z, mig=tuple(migs)))
        node = replace(n, zones=tuple(new_zones))
        self.nodes = tuple(node if x.name == name else x for x in self.nodes)
        self.by_name[name] = node
        for zi, mi, state in changes:
            zs[zi].mig[mi] = state
        self.model = FragmentationModel(Snapshot(self.nodes))
        for p in self.pods.values():
            if p.node and p.assignment is not None:
                self.model.apply(p.node, p.assignment, True)
        return True


class Clock:
    """Virtual-time event queue."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, str, str]] = []
        self._n = 0

    def push(self, t: float, what: str, pod: str) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, what, pod))

    def pop(self) -> tuple[float, str, str] | None:
        if not self._heap:
            return None
        t, _, what, pod = heapq.heappop(self._heap)
        return t, what, pod
