"""What Kubernetes shows of GPU sharing, read into records (docs/sharing.md):

- the NVIDIA device plugin's time-slicing and MPS (`sharing.timeSlicing` / `sharing.mps` of its
  config): each GPU advertised as `replicas` devices of `nvidia.com/gpu`, or of
  `nvidia.com/gpu.shared` with `renameByDefault`; GPU Feature Discovery labels the node
  `nvidia.com/gpu.replicas`, `nvidia.com/gpu.sharing-strategy` (`time-slicing`, `mps`, `none`),
  `nvidia.com/gpu.count` (physical GPUs) and `nvidia.com/gpu.memory` (MiB per GPU);
- HAMi: its device plugin registers each GPU in the node annotation
  `hami.io/node-nvidia-register` (JSON since v2.8: `[{"id", "index", "count", "devmem",
  "devcore", "type", "numa", "mode", "health"}]`, fields left out when zero/false; before:
  `id,count,devmem,devcore,type,numa,health[,index,mode]:` per GPU); pods ask
  `nvidia.com/gpu` with `nvidia.com/gpumem` (MiB), `nvidia.com/gpumem-percentage` and
  `nvidia.com/gpucores` (percent), and HAMi's scheduler writes the devices it assigned to
  `hami.io/vgpu-devices-allocated`: `uuid,type,usedmem,usedcores:` per device, `;` after each
  container (init containers first).
- HAMi's link scores: with `ENABLE_TOPOLOGY_SCORE`, its device plugin writes the pairwise GPU
  scores to `hami.io/node-nvidia-score` (`[{"uuid", "score": {uuid: score}}]`; 10-60 for the
  PCIe path, plus 100 per NVLink); GPUs joined by an NVLink (a score of 100 or more) are one link
  group (docs/fabric.md). A pod that asks HAMi's `topology-aware` policy
  (`hami.io/gpu-scheduler-policy`) for several GPUs wants them linked.

Every count is bounded (a hostile value is a `DecodeError` naming the object and field, like a
bad quantity).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from pyctl.cluster.records import HamiDevice, HamiShare, NodeSharing, PodSharing

SHARED: Final = "nvidia.com/gpu.shared"
GPUMEM: Final = "nvidia.com/gpumem"
GPUMEM_PERCENT: Final = "nvidia.com/gpumem-percentage"
GPUCORES: Final = "nvidia.com/gpucores"
HAMI_RESOURCES: Final = frozenset((GPUMEM, GPUMEM_PERCENT, GPUCORES))
REPLICAS_LABEL: Final = "nvidia.com/gpu.replicas"
STRATEGY_LABEL: Final = "nvidia.com/gpu.sharing-strategy"
MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
HAMI_REGISTER: Final = "hami.io/node-nvidia-register"
HAMI_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
HAMI_SCORE: Final = "hami.io/node-nvidia-score"
HAMI_POLICY: Final = "hami.io/gpu-scheduler-policy"
#: a pair score of at least this is an NVLink (HAMi adds 100 per link; the PCIe path is 10-60)
NVLINK_SCORE: Final = 100
HAMI_SCHEDULER: Final = "hami-scheduler"
STRATEGIES: Final = ("time-slicing", "mps", "none")

# bounds on what a hostile or broken object may claim
#: replicas per GPU (a replica must be at least 1 milli-GPU)
MAX_REPLICAS: Final = 1000
#: GPUs HAMi may register on one node, and devices a pod may hold
MAX_HAMI_DEVICES: Final = 64
#: length of a HAMi annotation (the link scores: up to 64 x 63 pairs)
MAX_ANNOTATION: Final = 64 * 1024
MAX_SCORE_ANNOTATION: Final = 512 * 1024
#: MiB of one GPU (16 TiB), tasks per GPU, percent of cores (deviceCoreScaling may exceed 100)
MAX_GPU_MEMORY_MIB: Final = 1 << 24
MAX_SPLIT: Final = 10_000
MAX_CORES: Final = 10_000
MAX_NUMA: Final = 63


class SharingError(ValueError):
    """A sharing label, annotation or request pyctl cannot read; the message names it."""


def _bounded(v: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(v, bool):
        raise SharingError(f"{what}: expected an integer, got {v!r}")
    if isinstance(v, str):
        s = v.strip()
        if not (s.isdigit() or (s[:1] == "-" and s[1:].isdigit())) or len(s) > 12:
            raise SharingError(f"{what}: expected an integer, got {v[:40]!r}")
        v = int(s)
    if not isinstance(v, int):
        raise SharingError(f"{what}: expected an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise SharingError(f"{what}: {v} is outside {lo}..{hi}")
    return v


def node_sharing(
    labels: Mapping[str, str], annotations: Mapping[str, str], allocatable: Mapping[str, int]
) -> NodeSharing | None:
    """The node's GPU sharing from GFD's labels, the allocatable `nvidia.com/gpu.shared` (already
    a count) and HAMi's registration; None when the node shows none."""
    strategy = labels.get(STRATEGY_LABEL, "")
    if strategy and strategy not in STRATEGIES:
        raise SharingError(f"label {STRATEGY_LABEL}: unknown strategy {strategy[:40]!r}")
    raw = labels.get(REPLICAS_LABEL, "")
    replicas = _bounded(raw, f"label {REPLICAS_LABEL}", 0, MAX_REPLICAS) if raw else 0
    shared = allocatable.get(SHARED, 0)
    hami_raw = annotations.get(HAMI_REGISTER)
    hami = hami_devices(hami_raw) if hami_raw is not None else ()
    if not (strategy in ("time-slicing", "mps") or replicas > 1 or shared or hami):
        return None
    links_error = ""
    scores = annotations.get(HAMI_SCORE)
    if hami and scores:
        try:
            groups = hami_links(scores, hami)
        except SharingError as e:
            links_error = str(e)[:240]
        else:
            hami = tuple(msgspec.structs.replace(d, link=groups.get(d.uuid, -1)) for d in hami)
    mem = labels.get(MEMORY_LABEL, "")
    return NodeSharing(
        strategy=strategy if strategy != "none" else "",
        replicas=replicas,
        shared=shared,
        gpu_memory_mib=_bounded(mem, f"label {MEMORY_LABEL}", 0, MAX_GPU_MEMORY_MIB) if mem else 0,
        hami=hami,
        links_error=links_error,
    )


def hami_links(raw: str, devices: tuple[HamiDevice, ...]) -> dict[str, int]:
    """HAMi's pair scores as link groups: uuid -> group (the smallest device index of the
    GPUs joined to it by NVLink, directly or through others). Empty when no pair has an NVLink
    (HAMi before its PR #2103, merged 2026-07, scored no link through an NVSwitch: such a
    board shows as unknown, not as single GPUs); scores of GPUs it did not register are ignored."""
    what = f"annotation {HAMI_SCORE}"
    if len(raw) > MAX_SCORE_ANNOTATION:
        raise SharingError(f"{what}: longer than {MAX_SCORE_ANNOTATION} characters")
    try:
        items = json.loads(raw)
    except ValueError as e:
        raise SharingError(f"{what}: broken JSON: {e}") from None
    if not isinstance(items, list) or len(items) > MAX_HAMI_DEVICES:
        raise SharingError(f"{what}: expected a list of at most {MAX_HAMI_DEVICES} devices")
    index = {d.uuid: d.index for d in devices}
    parent = {u: u for u in index}

    def root(u: str) -> str:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    linked = False
    for i, item in enumerate(items):
        w = f"{what}[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("score"), Mapping):
            raise SharingError(f'{w}: expected {{"uuid", "score": {{uuid: score}}}}')
        a = _uuid(item.get("uuid"), f"{w}.uuid")
        scores = item["score"]
        if len(scores) > MAX_HAMI_DEVICES:
            raise SharingError(f"{w}.score: more than {MAX_HAMI_DEVICES} peers")
        for b, v in scores.items():
            score = _bounded(v, f"{w}.score[{str(b)[:40]!r}]", 0, 1_000_000)
            if score >= NVLINK_SCORE and a in index and b in index and a != b:
                parent[root(a)] = root(b)
                linked = True
    if not linked:
        return {}
    first: dict[str, int] = {}
    for u in index:
        r = root(u)
        first[r] = min(first.get(r, index[u]), index[u])
    return {u: first[root(u)] for u in index}


def hami_devices(raw: str) -> tuple[HamiDevice, ...]:
    """HAMi's node registration, in either of its formats."""
    what = f"annotation {HAMI_REGISTER}"
    if len(raw) > MAX_ANNOTATION:
        raise SharingError(f"{what}: longer than {MAX_ANNOTATION} characters")
    text = raw.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise SharingError(f"{what}: broken JSON: {e}") from None
        if not isinstance(items, list):
            raise SharingError(f"{what}: expected a list of devices")
        if len(items) > MAX_HAMI_DEVICES:
            raise SharingError(f"{what}: more than {MAX_HAMI_DEVICES} devices")
        return tuple(_json_device(d, f"{what}[{i}]") for i, d in enumerate(items))
    if not text:
        return ()
    if ":" not in text:
        raise SharingError(f"{what}: neither JSON nor id,count,devmem,devcore,type,numa,health:")
    parts = [p for p in text.split(":") if p]
    if len(parts) > MAX_HAMI_DEVICES:
        raise SharingError(f"{what}: more than {MAX_HAMI_DEVICES} devices")
    out = []
    for i, p in enumerate(parts):
        w = f"{what}[{i}]"
        f = p.split(",")
        if len(f) not in (7, 9):
            raise SharingError(f"{w}: expected 7 or 9 fields, got {len(f)}")
        if f[6] not in ("true", "false", "True", "False", "1", "0", "t", "f", "T", "F"):
            raise SharingError(f"{w}: health {f[6][:20]!r} is not a boolean")
        out.append(
            HamiDevice(
                uuid=_uuid(f[0], w),
                index=_bounded(f[7], f"{w}.index", 0, MAX_HAMI_DEVICES * 16) if len(f) == 9 else 0,
                split=_bounded(f[1], f"{w}.count", 0, MAX_SPLIT),
                memory_mib=_bounded(f[2], f"{w}.devmem", 0, MAX_GPU_MEMORY_MIB),
                cores=_bounded(f[3], f"{w}.devcore", 0, MAX_CORES),
                type=f[4][:128],
                numa=_bounded(f[5], f"{w}.numa", 0, MAX_NUMA),
                healthy=f[6] in ("true", "True", "1", "t", "T"),
                mode=f[8][:32] if len(f) == 9 else "hami-core",
            )
        )
    return tuple(out)


def _uuid(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v or len(v) > 128 or "," in v or ":" in v or ";" in v:
        raise SharingError(f"{where}: bad device id {str(v)[:40]!r}")
    return v


def _json_device(d: Any, where: str) -> HamiDevice:
    if not isinstance(d, Mapping):
        raise SharingError(f"{where}: expected an object")
    health = d.get("health", False)
    if not isinstance(health, bool):
        raise SharingError(f"{where}.health: expected true or false")
    typ = d.get("type", "")
    mode = d.get("mode", "")
    if not isinstance(typ, str) or not isinstance(mode, str):
        raise SharingError(f"{where}: type and mode must be strings")
    return HamiDevice(
        uuid=_uuid(d.get("id"), f"{where}.id"),
        index=_bounded(d.get("index", 0), f"{where}.index", 0, MAX_HAMI_DEVICES * 16),
        split=_bounded(d.get("count", 0), f"{where}.count", 0, MAX_SPLIT),
        memory_mib=_bounded(d.get("devmem", 0), f"{where}.devmem", 0, MAX_GPU_MEMORY_MIB),
        cores=_bounded(d.get("devcore", 0), f"{where}.devcore", 0, MAX_CORES),
        type=typ[:128],
        numa=_bounded(d.get("numa", 0), f"{where}.numa", 0, MAX_NUMA),
        healthy=health,
        mode=mode[:32] or "hami-core",
    )


def pod_sharing(
    requests: Mapping[str, int],
    annotations: Mapping[str, str],
    scheduler: str,
    init_containers: int,
    gpus: int,
) -> PodSharing | None:
    """A pod's shared-GPU requests (summed over its containers, as the scheduler sums them) and
    HAMi's assignment; None when it asks for none."""
    shared = requests.get(SHARED, 0)
    allocated = annotations.get(HAMI_ALLOCATED) if annotations else None
    hami = (
        any(r in requests for r in HAMI_RESOURCES)
        or allocated is not None
        or (scheduler == HAMI_SCHEDULER and gpus > 0)
    )
    if not shared and not hami:
        return None
    if shared < 0:
        raise SharingError(f"{SHARED}: {shared} is negative")
    devices = hami_allocation(allocated, init_containers) if allocated else ()
    cores = requests.get(GPUCORES, -1)
    policy = annotations.get(HAMI_POLICY, "") if annotations else ""
    return PodSharing(
        shared=shared,
        hami=hami,
        memory_mib=_bounded(requests.get(GPUMEM, 0), GPUMEM, 0, MAX_GPU_MEMORY_MIB),
        memory_percent=_bounded(requests.get(GPUMEM_PERCENT, 0), GPUMEM_PERCENT, 0, 100),
        cores=-1 if cores == -1 else _bounded(cores, GPUCORES, 0, 100),
        devices=devices,
        topology="topology-aware" in (x.strip() for x in policy[:256].split(",")),
    )


def hami_allocation(raw: str, init_containers: int = 0) -> tuple[HamiShare, ...]:
    """`hami.io/vgpu-devices-allocated`, collapsed per device as HAMi does
    (`CollapseInitContainerUsage`): app containers add up (each is a task), init containers
    (they come first and run one at a time) count with their peak."""
    what = f"annotation {HAMI_ALLOCATED}"
    if len(raw) > MAX_ANNOTATION:
        raise SharingError(f"{what}: longer than {MAX_ANNOTATION} characters")
    containers = raw.split(";")
    if containers and containers[-1] == "":
        containers.pop()
    if len(containers) > 4 * MAX_HAMI_DEVICES:
        raise SharingError(f"{what}: too many containers")
    # older HAMi wrote app containers only: init entries exist when there are enough entries
    n_init = init_containers if len(containers) > init_containers else 0
    init_peak: dict[str, list[int]] = {}
    app_sum: dict[str, list[int]] = {}
    total = 0
    for ci, c in enumerate(containers):
        for entry in c.split(":"):
            if "," not in entry:
                continue
            f = entry.split(",")
            w = f"{what}: container {ci}"
            if len(f) < 4:
                raise SharingError(f"{w}: expected uuid,type,usedmem,usedcores")
            total += 1
            if total > MAX_HAMI_DEVICES:
                raise SharingError(f"{what}: more than {MAX_HAMI_DEVICES} devices")
            uuid = _uuid(f[0], w)
            mem = _bounded(f[2], f"{w}: usedmem", 0, MAX_GPU_MEMORY_MIB)
            cores = _bounded(f[3], f"{w}: usedcores", 0, MAX_CORES)
            if ci < n_init:
                cur = init_peak.setdefault(uuid, [0, 0])
                cur[0], cur[1] = max(cur[0], mem), max(cur[1], cores)
            else:
                cur = app_sum.setdefault(uuid, [0, 0, 0])
                cur[0] += mem
                cur[1] += cores
                cur[2] += 1
    out = []
    for uuid in sorted(init_peak.keys() | app_sum.keys()):
        i = init_peak.get(uuid, [0, 0])
        a = app_sum.get(uuid, [0, 0, 0])
        out.append(HamiShare(uuid, max(i[0], a[0]), max(i[1], a[1]), max(a[2], 1)))
    return tuple(out)
