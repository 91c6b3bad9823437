"""The user-facing JSON formats: cluster snapshots and workloads (docs/formats.md).

`load_snapshot` reads pyctl's own snapshot format; a `kubectl get nodes,pods -o json` dump
(optionally with NodeResourceTopology objects) is read by `pyctl.cluster.kube.dump`.
Every error names the node, zone and field, and is a `SnapshotError` (a `ValueError`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pyctl.cluster.bounds import (
    MAX_GANG_PODS,
    MAX_GPUS_PER_NODE,
    MAX_KEY_CHARS,
    MAX_LABELS,
    MAX_LINK_GROUP,
    MAX_LINK_LEVELS,
    MAX_TEXT_CHARS,
    MAX_WEIGHT,
)
from pyctl.core import mig
from pyctl.jsontypes import JsonObject, JsonValue
from pyctl.model import (
    MANAGER_POLICIES,
    TOPOLOGY_POLICIES,
    Gang,
    Gpu,
    ManagerPolicy,
    MigGpu,
    MigInstance,
    Node,
    PolicyName,
    Shape,
    Snapshot,
    Workload,
    Zone,
)


class SnapshotError(ValueError):
    """Bad snapshot or workload input; the message names where."""


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise SnapshotError(f"{where}: expected an object, got {type(v).__name__}")
    return v


def _list(v: Any, where: str) -> Sequence[Any]:
    if not isinstance(v, list | tuple):
        raise SnapshotError(f"{where}: expected a list, got {type(v).__name__}")
    return v


def _int(o: Mapping[str, Any], key: str, where: str, default: int | None = 0) -> int:
    v = o.get(key, default)
    if v is None and default is None:
        raise SnapshotError(f"{where}.{key}: missing")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SnapshotError(f"{where}.{key}: expected a number, got {type(v).__name__}")
    if isinstance(v, float):
        if not math.isfinite(v) or v != int(v):
            raise SnapshotError(f"{where}.{key}: expected a whole number, got {v}")
        v = int(v)
    if v < 0:
        raise SnapshotError(f"{where}.{key}: must not be negative, got {v}")
    return int(v)


def _str(o: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    v = o.get(key, default)
    if v is None:
        raise SnapshotError(f"{where}.{key}: missing")
    if not isinstance(v, str):
        raise SnapshotError(f"{where}.{key}: expected a string, got {type(v).__name__}")
    return v


def _choice(
    o: Mapping[str, Any], key: str, where: str, choices: Sequence[str], default: str
) -> str:
    v = _str(o, key, where, default)
    if v not in choices:
        raise SnapshotError(f"{where}.{key}: {v!r} is not one of {', '.join(choices)}")
    return v


def _known(o: Mapping[str, Any], keys: set[str], where: str) -> None:
    extra = set(o) - keys
    if extra:
        raise SnapshotError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")


_ZONE_KEYS = {
    "numa",
    "cpu_milli",
    "cpu_milli_used",
    "memory_mib",
    "memory_mib_used",
    "gpus",
    "mig",
    "dra_gpus",
}
_NODE_KEYS = {
    "name",
    "gpu_model",
    "topology_policy",
    "cpu_manager_policy",
    "memory_manager_policy",
    "zones",
    "labels",
    "gpu_pool",
    "gpu_replicas",
    "gpu_memory_mib",
    "sharing",
    "gpu_source",
    "rdma",
    "rdma_used",
}


def _holders(raw: Any, where: str, used: int) -> tuple[tuple[str, int], ...]:
    """The pods holding shares of a GPU: {"ns/name": milli}; they add up to at most used."""
    d = _obj(raw, f"{where}.pods")
    out = tuple((str(k), _int(d, k, f"{where}.pods", None)) for k in sorted(d))
    if sum(m for _, m in out) > used:
        raise SnapshotError(f"{where}.pods: the pods' shares add up to more than used_milli {used}")
    return out


def _zone(raw: Any, node: str, i: int) -> Zone:
    where0 = f"nodes[{node!r}].zones[{i}]"
    z = _obj(raw, where0)
    numa = _int(z, "numa", where0, default=None)
    where = f"nodes[{node!r}].zones[numa={numa}]"
    _known(z, _ZONE_KEYS, where)
    cpu, cpu_used = _int(z, "cpu_milli", where), _int(z, "cpu_milli_used", where)
    mem, mem_used = _int(z, "memory_mib", where), _int(z, "memory_mib_used", where)
    if cpu_used > cpu:
        raise SnapshotError(f"{where}.cpu_milli_used: {cpu_used} is above capacity {cpu}")
    if mem_used > mem:
        raise SnapshotError(f"{where}.memory_mib_used: {mem_used} is above capacity {mem}")
    gpus = _gpus(z, "gpus", where)
    dra_gpus = _gpus(z, "dra_gpus", where)
    migs = []
    for j, m in enumerate(_list(z.get("mig", []), f"{where}.mig")):
        mw = f"{where}.mig[{j}]"
        m = _obj(m, mw)
        _known(m, {"gpu", "instances", "dra", "dynamic", "free_slices"}, mw)
        gid = _int(m, "gpu", mw, default=None)
        mw = f"{where}.mig[gpu={gid}]"
        insts = []
        for k, inst in enumerate(_list(m.get("instances", []), f"{mw}.instances")):
            iw = f"{mw}.instances[{k}]"
            inst = _obj(inst, iw)
            _known(inst, {"profile", "start", "used", "pod"}, iw)
            used_v = inst.get("used", False)
            if not isinstance(used_v, bool):
                raise SnapshotError(f"{iw}.used: expected true or false")
            pod = inst.get("pod")
            if pod is not None and not isinstance(pod, str):
                raise SnapshotError(f"{iw}.pod: expected a string")
            insts.append(
                MigInstance(_str(inst, "profile", iw), _int(inst, "start", iw, None), used_v, pod)
            )
        flags: dict[str, bool] = {}
        for key in ("dra", "dynamic"):
            v = m.get(key, False)
            if not isinstance(v, bool):
                raise SnapshotError(f"{mw}.{key}: expected true or false")
            flags[key] = v
        free = m.get("free_slices")
        if free is not None:
            free = _int(m, "free_slices", mw)
        migs.append(MigGpu(gid, tuple(insts), flags["dra"], flags["dynamic"], free))
    return Zone(numa, cpu, cpu_used, mem, mem_used, tuple(gpus), tuple(migs), tuple(dra_gpus))


def _gpus(z: Mapping[str, Any], key: str, where: str) -> list[Gpu]:
    gpus = []
    for j, g in enumerate(_list(z.get(key, []), f"{where}.{key}")):
        gw = f"{where}.{key}[{j}]"
        g = _obj(g, gw)
        _known(g, {"id", "used_milli", "pods", "link", "link_levels"}, gw)
        gid = _int(g, "id", gw, default=None)
        gw = f"{where}.{key}[id={gid}]"
        used = _int(g, "used_milli", gw)
        if used > 1000:
            raise SnapshotError(f"{gw}.used_milli: {used} is above 1000")
        link = g.get("link")
        if link is not None:
            link = _int(g, "link", gw)
            if link > MAX_LINK_GROUP:
                raise SnapshotError(f"{gw}.link: {link} is above {MAX_LINK_GROUP}")
        levels = _link_levels(g.get("link_levels"), f"{gw}.link_levels")
        gpus.append(Gpu(gid, used, _holders(g.get("pods", {}), gw, used), link, levels))
    return gpus


def _link_levels(raw: Any, where: str) -> tuple[tuple[int, int], ...]:
    """A GPU's link groups at given sizes, {"size": group}, as (size, group) by size."""
    if raw is None:
        return ()
    d = _obj(raw, where)
    if len(d) > MAX_LINK_LEVELS:
        raise SnapshotError(f"{where}: {len(d)} levels, more than {MAX_LINK_LEVELS}")
    out = []
    for k in d:
        size = int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else 0
        if not 1 <= size <= MAX_GPUS_PER_NODE:
            raise SnapshotError(
                f"{where}[{str(k)[:32]!r}]: expected a size of 1..{MAX_GPUS_PER_NODE} GPUs"
            )
        group = _int(d, k, where)
        if group > MAX_LINK_GROUP:
            raise SnapshotError(f"{where}[{k!r}]: {group} is above {MAX_LINK_GROUP}")
        out.append((size, group))
    return tuple(sorted(out))


def _check_link_levels(where: str, zones: Sequence[Zone]) -> None:
    """No link group of a level of size N holds more than N GPUs (the core's rule)."""
    held: dict[tuple[int, int], int] = {}
    for z in zones:
        for g in z.gpus + z.dra_gpus:
            for lv in g.link_levels:
                held[lv] = held.get(lv, 0) + 1
    for (size, group), n in sorted(held.items()):
        if n > size:
            raise SnapshotError(
                f"{where}: link group {group} of level {size} holds {n} GPUs, more than {size}"
            )


def _node(raw: Any, i: int) -> Node:
    n = _obj(raw, f"nodes[{i}]")
    name = _str(n, "name", f"nodes[{i}]")
    where = f"nodes[{name!r}]"
    _known(n, _NODE_KEYS, where)
    zones = tuple(
        _zone(z, name, j) for j, z in enumerate(_list(n.get("zones", []), f"{where}.zones"))
    )
    if not zones:
        raise SnapshotError(f"{where}.zones: a node needs at least one NUMA zone")
    seen: set[int] = set()
    gpu_ids: set[int] = set()
    for z in zones:
        if z.numa in seen:
            raise SnapshotError(f"{where}.zones[numa={z.numa}]: duplicate NUMA id")
        seen.add(z.numa)
        for gid in [g.id for g in z.gpus + z.dra_gpus] + [m.gpu for m in z.mig]:
            if gid in gpu_ids:
                raise SnapshotError(f"{where}.zones[numa={z.numa}]: GPU id {gid} appears twice")
            gpu_ids.add(gid)
    _check_link_levels(where, zones)
    rdma, rdma_used = _int(n, "rdma", where), _int(n, "rdma_used", where)
    if rdma_used > rdma:
        raise SnapshotError(f"{where}.rdma_used: {rdma_used} is above rdma {rdma}")
    return Node(
        name=name,
        gpu_model=_str(n, "gpu_model", where, ""),
        topology_policy=cast(
            PolicyName, _choice(n, "topology_policy", where, TOPOLOGY_POLICIES, "none")
        ),
        cpu_manager_policy=cast(
            ManagerPolicy, _choice(n, "cpu_manager_policy", where, MANAGER_POLICIES, "static")
        ),
        memory_manager_policy=cast(
            ManagerPolicy, _choice(n, "memory_manager_policy", where, MANAGER_POLICIES, "none")
        ),
        zones=zones,
        gpu_pool=_str(n, "gpu_pool", where, ""),
        gpu_replicas=_replicas(n, where),
        gpu_memory_mib=_int(n, "gpu_memory_mib", where),
        sharing=_str(n, "sharing", where, ""),
        labels=_labels(n.get("labels"), f"{where}.labels"),
        gpu_source=_str(n, "gpu_source", where, ""),
        rdma=rdma,
        rdma_used=rdma_used,
    )


def _labels(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A node's labels ({key: value}, strings within the API server's bounds), sorted."""
    if raw is None:
        return ()
    d = _obj(raw, where)
    if len(d) > MAX_LABELS:
        raise SnapshotError(f"{where}: {len(d)} labels, more than {MAX_LABELS}")
    out = []
    for k, v in d.items():
        if not isinstance(v, str) or len(k) > MAX_KEY_CHARS or len(v) > MAX_TEXT_CHARS:
            raise SnapshotError(
                f"{where}[{str(k)[:64]!r}]: expected a label value (a string of at most "
                f"{MAX_TEXT_CHARS} characters, its key at most {MAX_KEY_CHARS})"
            )
        out.append((k, v))
    return tuple(sorted(out))


def _gang(raw: Any, where: str) -> Gang | None:
    if raw is None:
        return None
    g = _obj(raw, where)
    _known(g, {"pods", "key"}, where)
    pods = _int(g, "pods", where, None)
    if not 1 <= pods <= MAX_GANG_PODS:
        raise SnapshotError(f"{where}.pods: {pods} is outside 1..{MAX_GANG_PODS}")
    key = _str(g, "key", where)
    if not key or len(key) > MAX_KEY_CHARS:
        raise SnapshotError(f"{where}.key: expected a label key of 1..{MAX_KEY_CHARS} characters")
    return Gang(pods, key)


def _replicas(n: Mapping[str, Any], where: str) -> int:
    r = _int(n, "gpu_replicas", where, 1)
    if not 1 <= r <= 1000:
        raise SnapshotError(f"{where}.gpu_replicas: {r} is outside 1..1000")
    return r


def load_snapshot(data: Any) -> Snapshot:
    """A snapshot from parsed JSON in pyctl's format (a kubectl dump is read by
    `pyctl.cluster.kube.dump`)."""
    d = _obj(data, "snapshot")
    _known(d, {"nodes"}, "snapshot")
    nodes = tuple(_node(n, i) for i, n in enumerate(_list(d.get("nodes"), "nodes")))
    names: set[str] = set()
    for n in nodes:
        if n.name in names:
            raise SnapshotError(f"nodes[{n.name!r}]: duplicate node name")
        names.add(n.name)
    return Snapshot(nodes)


_SHAPE_KEYS = {
    "cpu_milli",
    "memory_mib",
    "gpus",
    "gpu_milli",
    "mig_profile",
    "gpu_models",
    "weight",
    "dra",
    "numa_aligned",
    "gpu_pool",
    "gpu_memory_mib",
    "gang",
    "link_group",
    "rdma",
}


def shape_from_json(raw: Any, where: str, need_weight: bool = True) -> Shape:
    s = _obj(raw, where)
    _known(s, _SHAPE_KEYS | {"name"}, where)
    weight = s.get("weight", None if need_weight else 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise SnapshotError(f"{where}.weight: expected a positive number, got {weight!r}")
    if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
        raise SnapshotError(
            f"{where}.weight: must be positive, at most {MAX_WEIGHT:g}, got {weight}"
        )
    mig = s.get("mig_profile")
    if mig is not None and not isinstance(mig, str):
        raise SnapshotError(f"{where}.mig_profile: expected a string")
    models = s.get("gpu_models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise SnapshotError(f"{where}.gpu_models: expected a list of model names")
    flags = {}
    for k in ("dra", "numa_aligned", "link_group"):
        v = s.get(k, False)
        if not isinstance(v, bool):
            raise SnapshotError(f"{where}.{k}: expected true or false")
        flags[k] = v
    return Shape(
        cpu_milli=_int(s, "cpu_milli", where),
        memory_mib=_int(s, "memory_mib", where),
        gpus=_int(s, "gpus", where),
        gpu_milli=_int(s, "gpu_milli", where),
        mig_profile=mig,
        gpu_models=tuple(models),
        weight=float(weight),
        dra=flags["dra"],
        numa_aligned=flags["numa_aligned"],
        gpu_pool=_str(s, "gpu_pool", where, ""),
        gpu_memory_mib=_int(s, "gpu_memory_mib", where),
        gang=_gang(s.get("gang"), f"{where}.gang"),
        link_group=flags["link_group"],
        rdma=_int(s, "rdma", where),
    )


def load_workload(data: Any) -> Workload:
    d = _obj(data, "workload")
    _known(d, {"shapes"}, "workload")
    shapes = tuple(
        shape_from_json(s, f"shapes[{i}]") for i, s in enumerate(_list(d.get("shapes"), "shapes"))
    )
    if not shapes:
        raise SnapshotError("shapes: the workload needs at least one shape")
    return Workload(shapes)


def snapshot_to_json(s: Snapshot) -> JsonObject:
    """The inverse of `load_snapshot` for pyctl's own format."""
    return {"nodes": [node_to_json(n) for n in s.nodes]}


def node_to_json(n: Node) -> JsonObject:
    """One node of `snapshot_to_json`."""
    return {
        "name": n.name,
        "gpu_model": n.gpu_model,
        "topology_policy": n.topology_policy,
        "cpu_manager_policy": n.cpu_manager_policy,
        "memory_manager_policy": n.memory_manager_policy,
        **_sharing_to_json(n),
        "zones": [_zone_to_json(z) for z in n.zones],
    }


def _zone_to_json(z: Zone) -> JsonObject:
    out: JsonObject = {
        "numa": z.numa,
        "cpu_milli": z.cpu_milli,
        "cpu_milli_used": z.cpu_milli_used,
        "memory_mib": z.memory_mib,
        "memory_mib_used": z.memory_mib_used,
        "gpus": [_gpu_to_json(g) for g in z.gpus],
        "mig": [_mig_to_json(m) for m in z.mig],
    }
    if z.dra_gpus:
        out["dra_gpus"] = [_gpu_to_json(g, pods=False) for g in z.dra_gpus]
    return out


def _mig_to_json(m: MigGpu) -> JsonObject:
    instances: list[JsonValue] = []
    for i in m.instances:
        inst: JsonObject = {"profile": i.profile, "start": i.start, "used": i.used}
        if i.pod:
            inst["pod"] = i.pod
        instances.append(inst)
    out: JsonObject = {"gpu": m.gpu, "instances": instances}
    if m.dra:
        out["dra"] = True
    if m.dynamic:
        out["dynamic"] = True
    if m.free_slices is not None:
        out["free_slices"] = m.free_slices
    return out


def _gpu_to_json(g: Gpu, pods: bool = True) -> JsonObject:
    out: JsonObject = {"id": g.id, "used_milli": g.used_milli}
    if pods and g.holders:
        out["pods"] = dict(g.holders)
    if g.link is not None:
        out["link"] = g.link
    if g.link_levels:
        out["link_levels"] = {str(size): group for size, group in g.link_levels}
    return out


def _sharing_to_json(n: Node) -> JsonObject:
    out: JsonObject = {}
    if n.gpu_pool:
        out["gpu_pool"] = n.gpu_pool
    if n.gpu_replicas != 1:
        out["gpu_replicas"] = n.gpu_replicas
    if n.gpu_memory_mib:
        out["gpu_memory_mib"] = n.gpu_memory_mib
    if n.sharing:
        out["sharing"] = n.sharing
    if n.labels:
        out["labels"] = dict(n.labels)
    if n.gpu_source:
        out["gpu_source"] = n.gpu_source
    if n.rdma or n.rdma_used:
        out["rdma"], out["rdma_used"] = n.rdma, n.rdma_used
    return out


# ---- the MIG planner's demand (`pyctl mig plan --demand`) ------------------------------------


def _where_int(v: Any, where: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{where}: expected an integer >= {minimum}, got {v!r}")
    return v


def load_demand(data: Any) -> mig.Demand:
    """The demand file of `pyctl mig plan` (docs in `pyctl mig plan --help` and the README):
    ``{"pending": [{"profile": "3g.20gb", "count": 2, "gpu_model": "A100-SXM4-40GB"?}],
    "shapes": [workload shapes as for pyctl score]?, "limits": {"nodes": [...]?, "gpus": [0, 1] |
    {"node": [0, 1]}?, "max_used_destroyed": 0?, "executor": "placement" | "mig-parted"?}}``."""
    if not isinstance(data, Mapping):
        raise ValueError("demand: expected a JSON object")
    unknown = set(data) - {"pending", "shapes", "limits"}
    if unknown:
        raise ValueError(f"demand: unknown field(s) {sorted(unknown)}")
    pending = []
    raw_pending = data.get("pending", [])
    if not isinstance(raw_pending, list):
        raise ValueError("pending: expected a list")
    for i, p in enumerate(raw_pending):
        where = f"pending[{i}]"
        if not isinstance(p, Mapping) or not isinstance(p.get("profile"), str):
            raise ValueError(f"{where}: expected {{'profile': name, 'count': n}}")
        extra = set(p) - {"profile", "count", "gpu_model"}
        if extra:
            raise ValueError(f"{where}: unknown field(s) {sorted(extra)}")
        gm = p.get("gpu_model")
        if gm is not None and not isinstance(gm, str):
            raise ValueError(f"{where}.gpu_model: expected a model name")
        count = _where_int(p.get("count", 1), f"{where}.count")
        pending.append(mig.Pending(p["profile"], count, None if gm is None else mig.model(gm).name))
    raw_shapes = data.get("shapes", [])
    if not isinstance(raw_shapes, list):
        raise ValueError("shapes: expected a list")
    shapes = tuple(shape_from_json(s, f"shapes[{i}]") for i, s in enumerate(raw_shapes))
    return mig.Demand(tuple(pending), shapes, _load_limits(data.get("limits", {})))


def _load_limits(raw: Any) -> mig.Limits:
    if not isinstance(raw, Mapping):
        raise ValueError("limits: expected an object")
    extra = set(raw) - {"nodes", "gpus", "max_used_destroyed", "executor"}
    if extra:
        raise ValueError(f"limits: unknown field(s) {sorted(extra)}")
    gpus: tuple[int, ...] | dict[str, tuple[int, ...]] | None = None
    g = raw.get("gpus")
    if isinstance(g, list):
        gpus = tuple(_where_int(x, f"limits.gpus[{i}]") for i, x in enumerate(g))
    elif isinstance(g, Mapping):
        gpus = {}
        for k, v in g.items():
            if not isinstance(v, list):
                raise ValueError(f"limits.gpus[{k!r}]: expected a list of GPU indices")
            gpus[str(k)] = tuple(_where_int(x, f"limits.gpus[{k!r}][{i}]") for i, x in enumerate(v))
    elif g is not None:
        raise ValueError("limits.gpus: expected a list of GPU indices or {node: [indices]}")
    nodes = raw.get("nodes")
    if nodes is not None and (
        not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes)
    ):
        raise ValueError("limits.nodes: expected a list of node names")
    executor = raw.get("executor", "placement")
    if executor not in mig.EXECUTORS:
        raise ValueError(f"limits.executor: {executor!r} is not one of {list(mig.EXECUTORS)}")
    return mig.Limits(
        gpus=gpus,
        nodes=None if nodes is None else tuple(nodes),
        max_used_destroyed=_where_int(
            raw.get("max_used_destroyed", 0), "limits.max_used_destroyed"
        ),
        executor=executor,
    )
