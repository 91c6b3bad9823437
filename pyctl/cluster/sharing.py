"""Shared GPUs in the model (docs/sharing.md): from a node's sharing record and the pods bound
to it, each physical GPU's used share (milli-GPU) and which pod holds how much of it.

- Time-slicing and MPS (NVIDIA device plugin): a GPU shared N ways is N replicas of
  floor(1000 / N) milli; the remainder 1000 - N * floor(1000 / N) (0 when N divides 1000) is
  capacity no replica can use, counted as used, so that exactly N replicas fit. Kubernetes does
  not say which GPU a replica is on, so pods are attributed as the device plugin allocates them:
  in order of creation, each replica to the GPU with the fewest allocated replicas (its default
  `distributed` policy; ties: the GPU this pod took fewest from, then the lowest index), among
  the GPUs of the NUMA zones the kubelet's Topology Manager would align the request to (the
  narrowest set of zones with enough free replicas, lowest first; none under policy `none`).
  Given the previous layout of the node (the controller keeps it), pods already placed stay
  where they were and only new pods are placed: followed live, the attribution is the device
  plugin's own; from a snapshot alone (a kubectl dump) the pods present are replayed in order of
  creation, which differs from the device plugin's history when pods have come and gone.
- HAMi: exact, from `hami.io/vgpu-devices-allocated`. A device's used share is the larger of
  the fraction of its memory in use (sum of usedmem / devmem) and of its cores (sum of
  usedcores / devcore), rounded up; a device is full when it holds `count` (deviceSplitCount)
  tasks. A pod holds the larger of its own memory and core fractions (at least 1 milli), scaled
  down (largest remainder) when the holdings add up to more than the device's used share (pods
  bound by different resources share a device). A HAMi pod without the annotation is attributed
  to the device with the most free share.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from pyctl.cluster import quantity as q
from pyctl.cluster.records import HamiDevice, NodeRecord, PodRecord
from pyctl.model import GPU_MILLI, Shape

GPU: str = "nvidia.com/gpu"
SHARED: str = "nvidia.com/gpu.shared"
HAMI: str = "hami"
SHARED_SUFFIX: str = "-SHARED"
#: HAMi's default when a pod asks no memory (defaultMemory 0): the whole GPU's memory
HAMI_DEFAULT_PERCENT: int = 100


@dataclass(frozen=True)
class Plan:
    """How a node's whole GPUs are shared."""

    #: time-slicing, mps or hami
    kind: str
    #: the pool shapes must ask for to use these GPUs ("" is nvidia.com/gpu)
    pool: str
    #: replicas per GPU (1 for HAMi)
    replicas: int
    #: physical GPUs shared
    gpus: int
    #: MiB per GPU (0: unknown)
    memory_mib: int = 0
    #: HAMi: the devices, in the order GPUs are numbered on the node
    devices: tuple[HamiDevice, ...] = ()
    #: what could not be read as the rest says (shown with the node)
    notes: tuple[str, ...] = ()

    @property
    def unit(self) -> int:
        """One replica's share."""
        return GPU_MILLI // max(1, self.replicas)

    def describe(self, attributed: bool) -> str:
        if self.kind == HAMI:
            how = "hami, exact" if not attributed else "hami, partly attributed"
        else:
            how = f"{self.kind} x{self.replicas} ({self.pool or GPU}), attributed"
        return "; ".join((how, *self.notes))


def plan(node: NodeRecord) -> Plan | None:
    """The node's sharing, or None when its GPUs are not shared."""
    s = node.sharing
    if s is None:
        return None
    if s.hami:
        devices = tuple(
            sorted(
                (d for d in s.hami if d.healthy and d.mode != "mig"),
                key=lambda d: (d.numa, d.index),
            )
        )
        left = len(s.hami) - len(devices)
        dropped: tuple[str, ...] = (
            (f"{left} unhealthy or MIG-mode devices left out",) if left else ()
        )
        if s.links_error:
            dropped += (f"link scores left out: {s.links_error}",)
        mem = min((d.memory_mib for d in devices if d.memory_mib), default=0)
        return Plan(HAMI, HAMI, 1, len(devices), mem, devices, dropped)
    count = node.gpu_count_label
    units = s.shared if s.shared else node.gpus
    n = s.replicas
    if n < 2 and count > 0 and units > count and units % count == 0:
        n = units // count  # GFD not running: the allocatable says it
    if n < 2:
        return None
    gpus = count if count > 0 else units // n
    notes: tuple[str, ...] = ()
    if units and units != gpus * n:
        notes = (f"{units} replicas advertised for {gpus} GPUs x {n}",)
    return Plan(
        s.strategy or "time-slicing",
        SHARED if s.shared else "",
        n,
        gpus,
        s.gpu_memory_mib,
        notes=notes,
    )


def gpu_model(node: NodeRecord, p: Plan | None) -> str:
    """The GPU model: GFD's product label (without the `-SHARED` GFD appends when replicas are
    not renamed), else HAMi's device type."""
    model = node.gpu_model
    if p is not None and p.kind != HAMI and model.endswith(SHARED_SUFFIX):
        model = model[: -len(SHARED_SUFFIX)]
    if not model and p is not None and p.devices:
        # HAMi's type is NVML's name ("NVIDIA A100-SXM4-80GB"; before v2.8 prefixed "NVIDIA-")
        t = p.devices[0].type
        if t.startswith("NVIDIA-NVIDIA "):
            t = t[len("NVIDIA-") :]
        model = t.replace(" ", "-")
    return model


def zone_of_device(d: HamiDevice, zones: Sequence[int]) -> int:
    return d.numa if d.numa in zones else zones[0]


@dataclass
class SharedGpu:
    #: HAMi: the device's index (nvidia-smi's); -1: none
    id: int = -1
    used: int = 0
    holders: dict[str, int] = field(default_factory=dict)
    #: time-slicing: replicas allocated; HAMi: tasks, memory, cores
    replicas: int = 0
    tasks: int = 0


def is_sharing_pod(p: PodRecord, pl: Plan) -> bool:
    """Whether the pod takes its GPUs from the node's shared GPUs."""
    if pl.kind == HAMI:
        return p.gpus > 0 or (p.sharing is not None and p.sharing.hami)
    if pl.pool == SHARED:
        return p.sharing is not None and p.sharing.shared > 0
    return p.gpus > 0


def _replicas_asked(p: PodRecord, pl: Plan) -> int:
    if pl.pool == SHARED:
        return p.sharing.shared if p.sharing is not None else 0
    return p.gpus


def layout(
    pl: Plan,
    zones: Sequence[tuple[int, int]],
    pods: Iterable[PodRecord],
    policy: str,
    previous: Sequence[Sequence[tuple[str, int]]] | None = None,
) -> tuple[list[SharedGpu], list[str]]:
    """Each physical GPU's share, in the order GPUs are numbered on the node (zone by zone;
    `zones` is (NUMA id, GPUs) in that order), and notes on what did not fit. `previous`: the
    holders of each GPU in the node's previous layout (replicas only: pods placed there keep
    their GPUs)."""
    gpus = [SharedGpu() for _ in range(sum(n for _, n in zones))]
    zone_of = [numa for numa, n in zones for _ in range(n)]
    live = sorted(
        (p for p in pods if not p.terminated and is_sharing_pod(p, pl)),
        key=lambda p: (p.created, p.key),
    )
    notes: list[str] = []
    if pl.kind == HAMI:
        numas = [numa for numa, _ in zones]
        devices = sorted(pl.devices, key=lambda d: (numas.index(zone_of_device(d, numas)), d.index))
        for g, d in zip(gpus, devices, strict=False):
            g.id = d.index
        _hami(devices, gpus, live, notes)
    else:
        if previous is not None and len(previous) == len(gpus):
            live = _keep(pl, gpus, live, previous)
        _replicas(pl, gpus, zone_of, live, policy, notes)
    return gpus, notes


def _keep(
    pl: Plan,
    gpus: list[SharedGpu],
    pods: list[PodRecord],
    previous: Sequence[Sequence[tuple[str, int]]],
) -> list[PodRecord]:
    """Pods of the previous layout keep their replicas (if they still ask as many and they still
    fit); the others are returned, to be placed."""
    where: dict[str, dict[int, int]] = {}
    for i, holders in enumerate(previous):
        for pod, milli in holders:
            where.setdefault(pod, {})[i] = milli // pl.unit
    rest = []
    for p in pods:
        got = where.get(p.key)
        if (
            got is None
            or sum(got.values()) != _replicas_asked(p, pl)
            or any(gpus[i].replicas + k > pl.replicas for i, k in got.items())
        ):
            rest.append(p)
            continue
        for i, k in got.items():
            gpus[i].replicas += k
            gpus[i].holders[p.key] = k * pl.unit
    return rest


def _replicas(
    pl: Plan,
    gpus: list[SharedGpu],
    zone_of: list[int],
    pods: list[PodRecord],
    policy: str,
    notes: list[str],
) -> None:
    n, unit = pl.replicas, pl.unit
    left = 0
    for p in pods:
        k = _replicas_asked(p, pl)
        cands = _aligned(gpus, zone_of, k, n, policy)
        picked: dict[int, int] = {}
        for _ in range(k):
            free = [i for i in cands if gpus[i].replicas < n]
            if not free:
                left += 1
                continue
            # the device plugin's distributed policy: fewest allocated replicas, then the GPU
            # this allocation took fewest from, then the lowest index
            i = min(free, key=lambda i: (gpus[i].replicas, picked.get(i, 0), i))
            gpus[i].replicas += 1
            picked[i] = picked.get(i, 0) + 1
        for i, c in picked.items():
            gpus[i].holders[p.key] = gpus[i].holders.get(p.key, 0) + c * unit
    for g in gpus:
        g.used = GPU_MILLI - (n - min(g.replicas, n)) * unit
    if left:
        notes.append(f"{left} replicas asked for beyond the {n} per GPU")


def _aligned(gpus: list[SharedGpu], zone_of: list[int], k: int, n: int, policy: str) -> list[int]:
    """The GPUs the kubelet lets the device plugin choose from: those of the narrowest set of
    NUMA zones with k free replicas (lowest zones first), as its Topology Manager aligns a
    device request; all GPUs under policy none or when no set has enough."""
    every = list(range(len(gpus)))
    if policy == "none":
        return every
    zones = sorted(set(zone_of))
    free = {z: sum(n - gpus[i].replicas for i in every if zone_of[i] == z) for z in zones}
    for width in range(1, len(zones) + 1):
        for combo in combinations(zones, width):
            if sum(free[z] for z in combo) >= k:
                return [i for i in every if zone_of[i] in combo]
    return every


def _share(mem: int, cores: int, d: HamiDevice) -> int:
    m = math.ceil(GPU_MILLI * mem / d.memory_mib) if d.memory_mib else 0
    c = math.ceil(GPU_MILLI * cores / (d.cores or 100))
    return max(1, min(GPU_MILLI, max(m, c)))


def _hami(
    devices: Sequence[HamiDevice], gpus: list[SharedGpu], pods: list[PodRecord], notes: list[str]
) -> None:
    """`devices` in the order of `gpus`. A device's used share is the larger of its memory and
    core fractions in use (as HAMi checks both); each pod holds its own larger fraction, scaled
    down when the holdings add up to more than the device's used share."""
    memory_mib = min((d.memory_mib for d in devices if d.memory_mib), default=0)
    index = {d.uuid: i for i, d in enumerate(devices)}
    mem = [0] * len(gpus)
    cores = [0] * len(gpus)
    extra = [0] * len(gpus)
    guessed = unknown = 0
    for p in pods:
        s = p.sharing
        if s is not None and s.devices:
            for h in s.devices:
                i = index.get(h.uuid)
                if i is None:
                    unknown += 1
                    continue
                g = gpus[i]
                g.holders[p.key] = g.holders.get(p.key, 0) + _share(
                    h.memory_mib, h.cores, devices[i]
                )
                g.tasks += h.slots
                mem[i] += h.memory_mib
                cores[i] += h.cores
            continue
        # no annotation: the device(s) with the most free share
        guessed += 1
        want = _request_share(p, memory_mib)
        for _ in range(max(1, p.gpus)):
            free = [
                i
                for i, g in enumerate(gpus)
                if p.key not in g.holders and g.tasks < (devices[i].split or 1)
            ]
            if not free:
                break
            i = min(free, key=lambda i: (sum(gpus[i].holders.values()), i))
            gpus[i].holders[p.key] = want
            gpus[i].tasks += 1
            extra[i] += want
    for i, g in enumerate(gpus):
        if not g.holders:
            continue
        d = devices[i]
        by_mem = math.ceil(GPU_MILLI * mem[i] / d.memory_mib) if d.memory_mib else 0
        by_cores = math.ceil(GPU_MILLI * cores[i] / (d.cores or 100))
        used = min(GPU_MILLI, max(by_mem, by_cores, 1) + extra[i])
        if sum(g.holders.values()) > used:
            g.holders = q.largest_remainder(g.holders, used)
        g.used = GPU_MILLI if g.tasks >= (d.split or 1) else used
    if guessed:
        notes.append(f"{guessed} pods without HAMi's annotation attributed")
    if unknown:
        notes.append(f"{unknown} assigned devices not registered on the node")


def _request_share(p: PodRecord, memory_mib: int) -> int:
    s = p.sharing
    if s is None:
        return GPU_MILLI
    cores = max(s.cores, 0) * 10
    if s.memory_mib:
        mem = math.ceil(GPU_MILLI * s.memory_mib / memory_mib) if memory_mib else GPU_MILLI
    else:
        mem = (s.memory_percent or HAMI_DEFAULT_PERCENT) * 10
    return max(1, min(GPU_MILLI, max(mem, cores)))


def replicates_gpu(node: NodeRecord | None) -> bool:
    """Whether a pod asking `nvidia.com/gpu` on this node gets replicas (time-slicing or MPS
    without renaming)."""
    if node is None:
        return False
    pl = plan(node)
    return pl is not None and pl.kind != HAMI and pl.pool == ""


def shared_shape(p: PodRecord, node: NodeRecord | None) -> Shape | None:
    """The shape of a pod that asks for shared GPUs (None: it does not). A replica is `gpu_milli`
    0 (the node sizes it); HAMi's memory in MiB stays `gpu_memory_mib` (the node's GPU memory
    sizes it); cores and memory percentages are milli (at least 1: HAMi does not put a pod on
    a GPU whose cores are all taken)."""
    s = p.sharing

    def shape(gpus: int, milli: int, pool: str, memory: int = 0) -> Shape:
        return Shape(
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            gpus=gpus,
            gpu_milli=milli,
            gpu_pool=pool,
            gpu_memory_mib=memory,
            # HAMi's topology-aware policy gives several GPUs the best-linked set
            link_group=s is not None and s.topology and gpus > 1,
            rdma=p.rdma,
        )

    def clamp(milli: int) -> int:
        return max(1, min(GPU_MILLI, milli))

    if s is not None and s.hami:
        if s.devices:
            mem = max(h.memory_mib for h in s.devices)
            cores = max(h.cores for h in s.devices)
            return shape(len(s.devices), clamp(cores * 10), HAMI, mem)
        cores = max(s.cores, 0) * 10
        if s.memory_mib:
            return shape(max(1, p.gpus), clamp(cores), HAMI, s.memory_mib)
        pct = (s.memory_percent or HAMI_DEFAULT_PERCENT) * 10
        return shape(max(1, p.gpus), clamp(max(pct, cores)), HAMI)
    if s is not None and s.shared:
        return shape(s.shared, 0, SHARED)
    if p.gpus and replicates_gpu(node):
        return shape(p.gpus, 0, "")
    return None
