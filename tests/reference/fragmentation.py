"""Pure-Python twin of the fragmentation score (issue 3's definitions), written literally:
zone sets are enumerated with itertools, MIG layouts by brute force. For tests and benchmarks only.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from pyctl.model import Gpu, MigGpu, Node, Shape, Workload, Zone

CATS = (
    "lack_both",
    "lack_gpu",
    "lack_cpu",
    "no_access",
    "stranded",
    "numa_split",
    "mig_geometry",
    "link_split",
)
_DATA = Path(__file__).resolve().parents[2] / "pyctl" / "data" / "mig_profiles.json"
if not _DATA.exists():  # before the package copy existed
    _DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "mig_profiles.json"


@cache
def _models() -> dict[str, Any]:
    return dict(json.loads(_DATA.read_text())["gpus"])


def model(name: str) -> dict[str, Any]:
    lname = name.lower()
    for key, m in _models().items():
        names = [key, *m.get("aliases", [])]
        for n in names:
            n = n.split(" ")[0].lower()
            if lname == n or lname.endswith("-" + n):
                return dict(m)
    raise KeyError(name)


def profile(m: dict[str, Any], name: str) -> dict[str, Any]:
    for p in m["profiles"]:
        if p["name"] == name:
            return dict(p)
    raise KeyError(name)


@dataclass
class Score:
    idle_gpu: float = 0.0
    frag_gpu: float = 0.0
    cats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATS, 0.0))
    idle_mig: float = 0.0
    frag_mig: float = 0.0
    mig_cats: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CATS, 0.0))
    recoverable: float = 0.0
    zone_frag_gpu: list[float] = field(default_factory=list)
    zone_frag_mig: list[float] = field(default_factory=list)


def allows(shape: Shape, gpu_model: str) -> bool:
    if not shape.gpu_models:
        return True
    m = gpu_model.lower()
    return any(
        m == g.lower() or m.endswith("-" + g.lower()) or g.lower().endswith("-" + m)
        for g in shape.gpu_models
    )


def on_node(shape: Shape, node: Node) -> Shape:
    """docs/sharing.md: a replica (gpus >= 1, gpu_milli 0) is 1000 // replicas of the node's GPU;
    a memory request is its fraction of the node's GPU memory (a whole GPU if unknown), or
    gpu_milli if larger."""
    if shape.mig_profile is not None or shape.gpus == 0:
        return shape
    if shape.gpu_memory_mib:
        mem = node.gpu_memory_mib
        frac = min(1000, math.ceil(shape.gpu_memory_mib * 1000 / mem)) if mem else 1000
        return replace(shape, gpu_milli=max(frac, shape.gpu_milli), gpu_memory_mib=0)
    if shape.gpu_milli == 0:
        return replace(shape, gpu_milli=1000 // node.gpu_replicas)
    return shape


def _mig_idle(g: MigGpu, gpu_model: str) -> float:
    m = model(gpu_model)
    used = sum(profile(m, i.profile)["compute_slices"] for i in g.instances)
    free = sum(profile(m, i.profile)["compute_slices"] for i in g.instances if not i.used)
    return float(free + m["compute_slices"] - used)


def _narrowest(caps: Sequence[int], req: int) -> int | None:
    for k in range(1, len(caps) + 1):
        if any(sum(c) >= req for c in itertools.combinations(caps, k)):
            return k
    return None


def _preferred(caps: Sequence[int], free: Sequence[int], req: int) -> set[frozenset[int]]:
    w = _narrowest(caps, req)
    if w is None:
        return set()
    return {
        frozenset(c)
        for c in itertools.combinations(range(len(caps)), w)
        if sum(free[i] for i in c) >= req
    }


def _fragment(node: Node, shape: Shape, w: float, out: Score) -> None:
    zones = node.zones

    def gpu(zi: int, v: float, cat: str) -> None:
        out.frag_gpu += w * v
        out.cats[cat] += w * v
        out.zone_frag_gpu[zi] += w * v

    def mig(zi: int, v: float, cat: str) -> None:
        out.frag_mig += w * v
        out.mig_cats[cat] += w * v
        out.zone_frag_mig[zi] += w * v

    def everything(cat: str) -> None:
        for zi, z in enumerate(zones):
            for g in z.gpus:
                if g.used_milli < 1000:
                    gpu(zi, 1000 - g.used_milli, cat)
            for mg in z.mig:
                idle = _mig_idle(mg, node.gpu_model)
                if idle:
                    mig(zi, idle, cat)

    # the node's RDMA resource is a node-wide amount like CPU and memory
    cpu_ok = (
        sum(z.cpu_milli - z.cpu_milli_used for z in zones) >= shape.cpu_milli
        and sum(z.memory_mib - z.memory_mib_used for z in zones) >= shape.memory_mib
        and node.rdma - node.rdma_used >= shape.rdma
    )
    if shape.is_cpu_only:
        everything("stranded" if cpu_ok else "lack_cpu")
        for zi, z in enumerate(zones):
            for g in z.dra_gpus:
                if g.used_milli < 1000:
                    gpu(zi, 1000 - g.used_milli, "stranded" if cpu_ok else "lack_cpu")
        return
    if not allows(shape, node.gpu_model) or (
        shape.mig_profile is None and shape.gpu_pool != node.gpu_pool
    ):
        everything("no_access")
        for zi, z in enumerate(zones):
            for g in z.dra_gpus:
                if g.used_milli < 1000:
                    gpu(zi, 1000 - g.used_milli, "no_access")
        return
    if shape.dra or _has_dra(node):
        _fragment_dra(node, shape, cpu_ok, gpu, mig)
        return

    def is_p(inst_profile: str) -> bool:
        return shape.mig_profile is not None and inst_profile == shape.mig_profile

    if shape.mig_profile is None:
        d = shape.gpus
        elig = [sum(1 for g in z.gpus if 1000 - g.used_milli >= shape.gpu_milli) for z in zones]
        cap = [len(z.gpus) for z in zones]
    else:
        d = 1
        elig = [
            sum(1 for m in z.mig for i in m.instances if is_p(i.profile) and not i.used)
            for z in zones
        ]
        cap = [sum(1 for m in z.mig for i in m.instances if is_p(i.profile)) for z in zones]
    gpu_ok = sum(elig) >= d
    fail: str | None = {
        (False, False): "lack_both",
        (False, True): "lack_gpu",
        (True, False): "lack_cpu",
        (True, True): None,
    }[(gpu_ok, cpu_ok)]
    usable: set[int] = set()
    if fail is None:
        if node.topology_policy in ("none", "best-effort"):
            usable = set(range(len(zones)))
        else:
            providers = [(cap, elig, d)]
            if (
                node.cpu_manager_policy == "static"
                and shape.cpu_milli > 0
                and shape.cpu_milli % 1000 == 0
            ):
                providers.append(
                    (
                        [z.cpu_milli for z in zones],
                        [z.cpu_milli - z.cpu_milli_used for z in zones],
                        shape.cpu_milli,
                    )
                )
            if node.memory_manager_policy == "static" and shape.memory_mib > 0:
                providers.append(
                    (
                        [z.memory_mib for z in zones],
                        [z.memory_mib - z.memory_mib_used for z in zones],
                        shape.memory_mib,
                    )
                )
            sets: set[frozenset[int]] | None = None
            for p in providers:
                pref = _preferred(*p)
                sets = pref if sets is None else sets & pref
            sets = sets or set()
            if node.topology_policy == "single-numa-node":
                sets = {s for s in sets if len(s) == 1}
            for s in sets:
                usable |= s
            if not usable:
                fail = "numa_split"
    other = "mig_geometry" if cpu_ok else (fail or "lack_cpu")
    _, split = _link_split(node, shape, usable)
    for zi, z in enumerate(zones):
        if shape.mig_profile is None:
            for g in z.gpus:
                f = 1000 - g.used_milli
                if f == 0:
                    continue
                if fail:
                    gpu(zi, f, fail)
                elif f < shape.gpu_milli:
                    gpu(zi, f, "stranded")
                elif zi not in usable:
                    gpu(zi, f, "numa_split")
                elif split(g):
                    gpu(zi, f, "link_split")
            for mg in z.mig:
                idle = _mig_idle(mg, node.gpu_model)
                if idle:
                    mig(zi, idle, other)
        else:
            for g in z.gpus:
                if g.used_milli < 1000:
                    gpu(zi, 1000 - g.used_milli, other)
            mm = model(node.gpu_model) if z.mig else None
            for mg in z.mig:
                assert mm is not None
                used = sum(profile(mm, i.profile)["compute_slices"] for i in mg.instances)
                if mm["compute_slices"] - used:
                    mig(zi, mm["compute_slices"] - used, other)
                for i in mg.instances:
                    if i.used:
                        continue
                    c = profile(mm, i.profile)["compute_slices"]
                    if not is_p(i.profile):
                        mig(zi, c, other)
                    elif fail:
                        mig(zi, c, fail)
                    elif zi not in usable:
                        mig(zi, c, "numa_split")


def _link_level(node: Node, shape: Shape) -> dict[int, int] | None:
    """docs/fabric.md: the link groups {GPU id: group} a shape that needs its GPUs in one group
    uses: those of the smallest level of at least its GPUs (`Gpu.link_levels`; `Gpu.link` is
    the level of any size) that lists a GPU of the shape's source; None: no constraint."""
    if not (shape.link_group and shape.gpus >= 2 and shape.mig_profile is None):
        return None
    levels: dict[float, dict[int, tuple[int, bool]]] = {}
    for z in node.zones:
        for dra, gpus in ((False, z.gpus), (True, z.dra_gpus)):
            for g in gpus:
                if g.link is not None:
                    levels.setdefault(math.inf, {})[g.id] = (g.link, dra)
                for n, group in g.link_levels:
                    levels.setdefault(n, {})[g.id] = (group, dra)
    for size in sorted(levels):
        lv = levels[size]
        if size >= shape.gpus and any(dra == shape.dra for _, dra in lv.values()):
            return {gid: group for gid, (group, _) in lv.items()}
    return None


def _link_split(
    node: Node, shape: Shape, usable: set[int]
) -> tuple[dict[int, int] | None, Callable[[Gpu], bool]]:
    """The shape's link groups (`_link_level`), and whether a GPU of the shape's source lacks
    room in its group: the group (a GPU the level does not list is alone) holds fewer usable
    GPUs (with the share, in a usable zone) than the shape needs."""
    level = _link_level(node, shape)

    def key(g: Gpu) -> tuple[str, int]:
        return ("g", level[g.id]) if level is not None and g.id in level else ("alone", g.id)

    room: dict[tuple[str, int], int] = {}
    for zi, z in enumerate(node.zones):
        for g in z.dra_gpus if shape.dra else z.gpus:
            free = 1000 - g.used_milli
            if zi in usable and free > 0 and free >= shape.gpu_milli:
                room[key(g)] = room.get(key(g), 0) + 1

    def split(g: Gpu) -> bool:
        return level is not None and room.get(key(g), 0) < shape.gpus

    return level, split


def _has_dra(node: Node) -> bool:
    return any(z.dra_gpus or any(m.dra for m in z.mig) for z in node.zones)


def _dynamic_fit(m: dict[str, Any], name: str, mg: MigGpu) -> int:
    """Brute force: most instances of profile `name` at once in a dynamic GPU's free slices."""
    p = profile(m, name)
    used_masks = 0
    used_compute = 0
    for i in mg.instances:
        q = profile(m, i.profile)
        size = next(pl["size"] for pl in q["placements"] if pl["start"] == i.start)
        used_masks |= ((1 << size) - 1) << i.start
        used_compute += q["compute_slices"]
    full = (1 << m["memory_slices"]) - 1
    free = full & ~used_masks if mg.free_slices is None else mg.free_slices
    masks = [
        ((1 << pl["size"]) - 1) << pl["start"]
        for pl in p["placements"]
        if (((1 << pl["size"]) - 1) << pl["start"]) & ~free == 0
    ]
    best = 0
    for k in range(len(masks), 0, -1):
        if any(
            all(a & b == 0 for a, b in itertools.combinations(c, 2))
            for c in itertools.combinations(masks, k)
        ):
            best = k
            break
    left: int = m["compute_slices"] - used_compute
    count = sum(1 for i in mg.instances if i.profile == name)
    cost: int = p["compute_slices"]
    room: int = p["max_count"] - count
    return min(best, left // cost, room)


def _fragment_dra(node: Node, shape: Shape, cpu_ok: bool, gpu: Any, mig: Any) -> None:
    """The measure on a node with DRA devices, or for a DRA shape: devices of the other source
    are `no_access`; a DRA shape's admission is its claim's alignment (devices of one zone), not
    the Topology Manager; dynamic MIG GPUs count what the shape could allocate on them now."""
    zones = node.zones
    mm = model(node.gpu_model) if any(z.mig for z in zones) else None
    names = {p["name"] for p in mm["profiles"]} if mm else set()
    want = shape.mig_profile
    want_ok = not (want is not None and want not in names)

    def same(dra: bool) -> bool:
        return dra == shape.dra

    elig = []
    for z in zones:
        e = 0
        if shape.mig_profile is None:
            for g in z.dra_gpus if shape.dra else z.gpus:
                e += 1000 - g.used_milli >= shape.gpu_milli
            if shape.dra and shape.gpu_milli == 1000:
                e += sum(1 for m in z.mig if m.dra and m.dynamic and not m.instances)
        elif want_ok:
            assert mm is not None
            for m in z.mig:
                if not same(m.dra):
                    continue
                if m.dynamic:
                    e += _dynamic_fit(mm, want, m)  # type: ignore[arg-type]
                else:
                    e += sum(1 for i in m.instances if i.profile == want and not i.used)
        elig.append(e)
    d = shape.gpus if shape.mig_profile is None else 1
    gpu_ok = sum(elig) >= d
    fail: str | None = {
        (False, False): "lack_both",
        (False, True): "lack_gpu",
        (True, False): "lack_cpu",
        (True, True): None,
    }[(gpu_ok, cpu_ok)]
    usable: set[int] = set()
    if fail is None:
        if not shape.dra:
            # a device-plugin shape on a node with DRA devices: the Topology Manager decides, as
            # on any node (the reference handles it only under none/best-effort here)
            assert node.topology_policy in ("none", "best-effort"), "not covered by the twin"
            usable = set(range(len(zones)))
        elif not shape.numa_aligned or d <= 1:
            usable = set(range(len(zones)))
        else:
            usable = {zi for zi, e in enumerate(elig) if e >= d}
            if not usable:
                fail = "numa_split"
    other = "mig_geometry" if cpu_ok else (fail or "lack_cpu")
    foreign = "no_access" if cpu_ok else (fail or "lack_cpu")

    def ok_or(zi: int) -> str | None:
        return fail if fail else (None if zi in usable else "numa_split")

    level, split = _link_split(node, shape, usable)

    for zi, z in enumerate(zones):
        for dra, gpus in ((False, z.gpus), (True, z.dra_gpus)):
            for g in gpus:
                f = 1000 - g.used_milli
                if f == 0:
                    continue
                if not same(dra):
                    gpu(zi, f, foreign)
                elif shape.mig_profile is not None:
                    gpu(zi, f, other)
                elif fail:
                    gpu(zi, f, fail)
                elif f < shape.gpu_milli:
                    gpu(zi, f, "stranded")
                elif zi not in usable:
                    gpu(zi, f, "numa_split")
                elif split(g):
                    gpu(zi, f, "link_split")
        for m in z.mig:
            assert mm is not None
            idle = _mig_idle(m, node.gpu_model)
            if not same(m.dra):
                if idle:
                    mig(zi, idle, foreign)
                continue
            if m.dynamic:
                if shape.mig_profile is not None and want_ok:
                    fit = _dynamic_fit(mm, want, m) * profile(mm, want)["compute_slices"]  # type: ignore[arg-type]
                    fit = min(fit, idle)
                    if idle > fit:
                        mig(zi, idle - fit, other)
                    cat = ok_or(zi)
                    if fit and cat:
                        mig(zi, fit, cat)
                elif (
                    shape.mig_profile is None
                    and shape.dra
                    and shape.gpu_milli == 1000
                    and not m.instances
                ):
                    # under a level of link groups a MIG GPU taken whole is a group of its own
                    cat = ok_or(zi) or ("link_split" if level is not None else None)
                    if idle and cat:
                        mig(zi, idle, cat)
                elif idle:
                    mig(zi, idle, other)
                continue
            used = sum(profile(mm, i.profile)["compute_slices"] for i in m.instances)
            if mm["compute_slices"] - used:
                mig(zi, mm["compute_slices"] - used, other)
            for i in m.instances:
                if i.used:
                    continue
                c = profile(mm, i.profile)["compute_slices"]
                if shape.mig_profile is None or i.profile != shape.mig_profile:
                    mig(zi, c, other)
                else:
                    cat = ok_or(zi)
                    if cat:
                        mig(zi, c, cat)


def _layouts_cover(
    m: dict[str, Any], pinned: Iterable[tuple[str, int]], wanted: Sequence[str]
) -> int:
    """Brute force: the most compute slices instances of `wanted` can add around `pinned`."""
    occupied = 0
    compute = 0
    counts: dict[str, int] = {}
    for name, start in pinned:
        p = profile(m, name)
        size = next(pl["size"] for pl in p["placements"] if pl["start"] == start)
        occupied |= ((1 << size) - 1) << start
        compute += p["compute_slices"]
        counts[name] = counts.get(name, 0) + 1
    best = 0

    def go(occ: int, comp: int, cnt: dict[str, int], added: int) -> None:
        nonlocal best
        best = max(best, added)
        for name in wanted:
            p = profile(m, name)
            if (
                comp + p["compute_slices"] > m["compute_slices"]
                or cnt.get(name, 0) >= p["max_count"]
            ):
                continue
            for pl in p["placements"]:
                mask = ((1 << pl["size"]) - 1) << pl["start"]
                if occ & mask:
                    continue
                c2 = dict(cnt)
                c2[name] = c2.get(name, 0) + 1
                go(occ | mask, comp + p["compute_slices"], c2, added + p["compute_slices"])

    go(occupied, compute, counts, 0)
    return best


def score_node(node: Node, workload: Workload) -> Score:
    total = sum(s.weight for s in workload.shapes)
    out = Score()
    out.zone_frag_gpu = [0.0] * len(node.zones)
    out.zone_frag_mig = [0.0] * len(node.zones)
    out.idle_gpu = float(sum(1000 - g.used_milli for z in node.zones for g in z.gpus + z.dra_gpus))
    out.idle_mig = sum(_mig_idle(mg, node.gpu_model) for z in node.zones for mg in z.mig)
    for s in workload.shapes:
        _fragment(node, on_node(s, node), s.weight / total, out)
    has_mig = any(z.mig for z in node.zones)
    if has_mig:
        m = model(node.gpu_model)
        names = {p["name"] for p in m["profiles"]}
        wanted = sorted(
            {
                s.mig_profile
                for s in workload.shapes
                if s.mig_profile is not None
                and s.mig_profile in names
                and allows(s, node.gpu_model)
            }
        )
        if wanted:
            for z in node.zones:
                for mg in z.mig:
                    if mg.dynamic:
                        continue  # allocated on demand: nothing to re-partition
                    pinned = [(i.profile, i.start) for i in mg.instances if i.used]
                    now = sum(
                        profile(m, i.profile)["compute_slices"]
                        for i in mg.instances
                        if not i.used and i.profile in wanted
                    )
                    out.recoverable += max(0, _layouts_cover(m, pinned, wanted) - now)
    return out


def fgd_node_fragment(zones: Sequence[Zone], shape: Shape, gpu_model: str = "") -> float:
    """FGD's F_n(m) as the paper's code defines it (one node, NUMA-blind, no MIG)."""
    free = [1000 - g.used_milli for z in zones for g in z.gpus]
    idle = float(sum(free))
    cpu_free = sum(z.cpu_milli - z.cpu_milli_used for z in zones)
    if shape.gpus == 0 and shape.mig_profile is None:
        return idle
    if not allows(shape, gpu_model):
        return idle
    fits = (
        cpu_free >= shape.cpu_milli and sum(1 for f in free if f >= shape.gpu_milli) >= shape.gpus
    )
    if not fits:
        return idle
    return float(sum(f for f in free if f < shape.gpu_milli))
