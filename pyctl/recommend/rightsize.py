"""Per workload: what it requests, what it needs, the standard size it should request, why, and
the patch that makes the change (emitted, never applied).

Need of a workload (one replica): from usage when Prometheus has any for its pods — memory = the
peak framebuffer memory of any of its pods x (1 + headroom); compute (a floor, no headroom) = the
95th percentile of the utilization x the compute share of the GPU or MIG instance it ran on — else
its current request. Usage series are attributed to a workload by pod; a series of a pod that no
longer exists is attributed through its name (``<replicaset>-<suffix>``, ``<deployment>-<hash>-
<suffix>``, ``<statefulset>-<ordinal>``) when a current workload matches, and is otherwise a stale
series: counted, reported, not used.
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Final

from pyctl.jsontypes import JsonObject
from pyctl.model import Shape
from pyctl.recommend.inventory import PATCHABLE, Container, Owner, Replica
from pyctl.recommend.prometheus import UsageReport
from pyctl.recommend.sizes import (
    GPU_RESOURCE,
    MIG_PREFIX,
    Need,
    Pool,
    Size,
    smallest_holding,
)

CLASS_LABEL: Final = "pyctl.io/resource-class"
GPU_LARGE: Final = "gpu-large"
MIG: Final = "mig"
GPU_SHARED: Final = "gpu-shared"
CPU_MICRO: Final = "cpu-micro"
_KIND_RESOURCE: Final = {
    "Deployment": "deployment",
    "StatefulSet": "statefulset",
    "DaemonSet": "daemonset",
    "ReplicaSet": "replicaset",
}


@dataclass(frozen=True)
class Workload:
    owner: Owner
    pool: str | None
    replicas: tuple[Replica, ...]
    #: the request most of its replicas make
    request: Shape
    containers: tuple[Container, ...] | None


def group(replicas: Sequence[Replica], pool_of: Mapping[str, str | None]) -> list[Workload]:
    """Replicas by workload (GPU replicas only), in a stable order."""
    by: dict[Owner, list[Replica]] = defaultdict(list)
    for r in replicas:
        if r.is_gpu:
            by[r.owner].append(r)
    out = []
    for owner in sorted(by, key=lambda o: (o.namespace, o.kind, o.name)):
        rs = by[owner]
        common = Counter(r.shape.key() for r in rs).most_common(1)[0][0]
        first = next(r for r in rs if r.shape.key() == common)
        containers = next((r.containers for r in rs if r.containers), first.containers)
        out.append(Workload(owner, pool_of.get(first.key), tuple(rs), first.shape, containers))
    return out


@dataclass(frozen=True)
class WorkloadUsage:
    peak_memory_mib: float | None = None
    util_p95: float | None = None
    #: compute share of a GPU the observed utilization needs (no headroom)
    compute_floor: Fraction | None = None
    pods: int = 0
    earlier_pods: int = 0
    profiles: tuple[str, ...] = ()


@dataclass
class Attribution:
    usage: dict[Owner, WorkloadUsage] = field(default_factory=dict)
    stale_series_pods: list[str] = field(default_factory=list)
    profile_mismatches: list[str] = field(default_factory=list)


def _profile_share(profile: str, pool: Pool | None) -> Fraction | None:
    if not profile or pool is None:
        return None
    head = profile.split("g.", 1)[0]
    if not head.isdigit() or not pool.mig_model:
        return None
    return Fraction(int(head), pool.compute_slices)


def _request_share(shape: Shape, pool: Pool | None) -> Fraction:
    if shape.mig_profile is not None and pool is not None and pool.mig_model:
        return _profile_share(shape.mig_profile, pool) or Fraction(1)
    if shape.gpus == 1 and 0 < shape.gpu_milli < 1000:
        return Fraction(shape.gpu_milli, 1000)
    return Fraction(1)


@dataclass(slots=True)
class _Seen:
    """One workload's usage while the series are attributed (`WorkloadUsage` once done)."""

    peak: float | None = None
    util: float | None = None
    floor: Fraction | None = None
    pods: set[str] = field(default_factory=set)
    earlier: set[str] = field(default_factory=set)
    profiles: set[str] = field(default_factory=set)


def attribute(
    usage: UsageReport, workloads: Sequence[Workload], pools: Mapping[str, Pool]
) -> Attribution:
    """Usage series -> workloads: by pod, else by the pod name's prefix; the rest is stale."""
    out = Attribution()
    by_pod: dict[tuple[str, str], Workload] = {}
    by_prefix: dict[tuple[str, str], Workload] = {}
    for wl in workloads:
        for r in wl.replicas:
            by_pod[(r.namespace, r.pod)] = wl
            if r.controller:
                by_prefix[(r.namespace, r.controller)] = wl
        by_prefix.setdefault((wl.owner.namespace, wl.owner.name), wl)
    acc: dict[Owner, _Seen] = {}
    seen_stale: set[str] = set()
    for (ns, pod, _container), cu in usage.containers.items():
        w = by_pod.get((ns, pod))
        earlier = False
        if w is None:
            parts = pod.rsplit("-", 2)
            for cut in (1, 2):
                if len(parts) > cut:
                    w = by_prefix.get((ns, "-".join(parts[:-cut])))
                    if w is not None:
                        break
            earlier = w is not None
        if w is None:
            if f"{ns}/{pod}" not in seen_stale:
                seen_stale.add(f"{ns}/{pod}")
                out.stale_series_pods.append(f"{ns}/{pod}")
            continue
        pool = pools.get(w.pool) if w.pool else None
        a = acc.setdefault(w.owner, _Seen())
        (a.earlier if earlier else a.pods).add(pod)
        if cu.peak_memory_mib is not None:
            a.peak = max(a.peak or 0.0, cu.peak_memory_mib)
        want = w.request.mig_profile or ""
        for prof in cu.profiles:
            a.profiles.add(prof)
            if prof and want and prof != want:
                out.profile_mismatches.append(
                    f"{ns}/{pod}: usage on a {prof} instance, the workload requests {want}"
                )
        if cu.util_p95 is not None:
            a.util = max(a.util or 0.0, cu.util_p95)
            shares = [s for p in cu.profiles if (s := _profile_share(p, pool)) is not None]
            share = max(shares) if shares else _request_share(w.request, pool)
            floor = Fraction(cu.util_p95).limit_denominator(10**6) * share
            a.floor = floor if a.floor is None else max(a.floor, floor)
    for owner, a in acc.items():
        out.usage[owner] = WorkloadUsage(
            a.peak,
            a.util,
            a.floor,
            len(a.pods),
            len(a.earlier),
            tuple(sorted(a.profiles)),
        )
    return out


@dataclass(frozen=True)
class Recommendation:
    workload: Workload
    current: str
    current_resource: str
    recommended: str | None
    recommended_resource: str | None
    change: bool
    why: str
    need: Need
    usage: WorkloadUsage | None = None
    klass: str | None = None
    patch: Patch | None = None
    no_patch: str = ""

    def to_json(self) -> JsonObject:
        o = self.workload.owner
        u = self.usage
        return {
            "workload": {"kind": o.kind, "namespace": o.namespace, "name": o.name},
            "pool": self.workload.pool,
            "replicas": len(self.workload.replicas),
            "current": self.current,
            "current_resource": self.current_resource,
            "recommended": self.recommended,
            "recommended_resource": self.recommended_resource,
            "change": self.change,
            "class": self.klass,
            "why": self.why,
            "usage": None
            if u is None
            else {
                "peak_memory_mib": None
                if u.peak_memory_mib is None
                else round(u.peak_memory_mib, 1),
                "util_p95": None if u.util_p95 is None else round(u.util_p95, 4),
                "pods": u.pods,
                "earlier_pods": u.earlier_pods,
                "profiles": list(u.profiles),
            },
            "patch": None if self.patch is None else self.patch.to_json(),
            "no_patch": self.no_patch or None,
        }


def size_label(shape: Shape) -> tuple[str, str]:
    """(name, resource) of a request: ``2g.10gb``/``nvidia.com/mig-2g.10gb``, ``gpu``,
    ``2 gpus``, ``0.47gpu``."""
    if shape.mig_profile is not None:
        return shape.mig_profile, f"{MIG_PREFIX}{shape.mig_profile}"
    if shape.gpus >= 2:
        return f"{shape.gpus} gpus", GPU_RESOURCE
    if shape.gpus == 1 and 0 < shape.gpu_milli < 1000:
        return f"{shape.gpu_milli / 1000:g}gpu", GPU_RESOURCE
    return "gpu", GPU_RESOURCE


def _gib(mib: float) -> str:
    return f"{mib / 1024:.2f} GiB"


def need_of(
    w: Workload, pool: Pool, usage: WorkloadUsage | None, headroom: float
) -> tuple[Need, str]:
    """The need of one replica of the workload, and where it comes from (for the why)."""
    _size, req_need = pool.request_size(w.request.gpus, w.request.gpu_milli, w.request.mig_profile)
    if req_need.gpus != 1:
        return req_need, f"{w.request.gpus} whole GPUs: multi-GPU replicas keep their request"
    if usage is None or usage.peak_memory_mib is None:
        return req_need, "no usage data"
    mem = math.ceil(usage.peak_memory_mib * (1.0 + headroom))
    src = f"peak {_gib(usage.peak_memory_mib)} +{headroom:.0%} = {_gib(mem)}"
    if usage.compute_floor is not None:
        src += f", compute p95 {float(usage.compute_floor):.1%} of a GPU"
    if usage.earlier_pods and not usage.pods:
        src += " (earlier pods)"
    return Need(1, usage.compute_floor, mem), src


def class_of(size: Size | None, gpus: int = 1) -> str | None:
    """The resource class a replica of this size goes to."""
    if gpus >= 2 or (size is not None and size.kind == "gpu"):
        return GPU_LARGE
    if size is None:
        return None
    return MIG if size.kind == "mig" else GPU_SHARED


def recommend_workload(
    w: Workload,
    pool: Pool,
    menu: Sequence[Size],
    usage: WorkloadUsage | None,
    headroom: float,
    class_selector: bool = False,
) -> Recommendation:
    current, current_res = size_label(w.request)
    req_size, _ = pool.request_size(w.request.gpus, w.request.gpu_milli, w.request.mig_profile)
    need, src = need_of(w, pool, usage, headroom)
    if need.gpus != 1:
        return Recommendation(
            w,
            current,
            current_res,
            current,
            current_res,
            False,
            src,
            need,
            usage,
            class_of(None, need.gpus),
        )
    size = smallest_holding(tuple(menu), need)
    if size is None:
        why = f"{src}: no menu size ({', '.join(s.name for s in menu)}) holds it; keep {current}"
        return Recommendation(
            w, current, current_res, None, None, False, why, need, usage, class_of(req_size)
        )
    klass = class_of(size)
    change = (size.resource, size.name) != (current_res, current)
    held = f"{float(size.compute):.1%} compute"
    if size.memory_mib is not None:
        held = f"{_gib(size.memory_mib)}, " + held
    if usage is None or usage.peak_memory_mib is None:
        if change:
            why = f"no usage data; {current} is not on the menu: {size.name} holds it ({held})"
        else:
            why = f"no usage data; {current} is on the menu"
    else:
        why = f"{src} -> {size.name} ({held}) is the smallest menu size holding it"
    rec = Recommendation(
        w, current, current_res, size.name, size.resource, change, why, need, usage, klass
    )
    if change:
        patch, reason = make_patch(w, current_res, size, klass if class_selector else None)
        rec = replace(rec, patch=patch, no_patch=reason)
    return rec


# ---- patches ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Patch:
    owner: Owner
    container: str
    #: a strategic merge patch of the workload (null deletes a key)
    body: JsonObject

    @property
    def command(self) -> str:
        o = self.owner
        return (
            f"kubectl -n {shlex.quote(o.namespace)} patch {_KIND_RESOURCE[o.kind]} "
            f"{shlex.quote(o.name)} --type strategic -p "
            + shlex.quote(json.dumps(self.body, separators=(",", ":"), sort_keys=True))
        )

    def kustomize(self) -> JsonObject:
        """The same patch as a kustomize strategic-merge patch file."""
        o = self.owner
        api = "apps/v1"
        return {
            "apiVersion": api,
            "kind": o.kind,
            "metadata": {"name": o.name, "namespace": o.namespace},
            **self.body,
        }

    @property
    def file_name(self) -> str:
        o = self.owner
        return f"{o.namespace}.{_KIND_RESOURCE[o.kind]}.{o.name}.yaml"

    def to_json(self) -> JsonObject:
        return {"container": self.container, "body": self.body, "command": self.command}


def make_patch(
    w: Workload, old_resource: str, size: Size, klass: str | None
) -> tuple[Patch | None, str]:
    """The patch changing the workload's GPU request, or why there is none."""
    o = w.owner
    if o.kind not in PATCHABLE:
        if o.kind == "Pod":
            return None, "a pod without a controller: recreate it with the recommended request"
        return None, f"{o.kind} pod templates are not patched by pyctl: change its definition"
    if w.containers is None:
        return None, "container names unknown (run pyctl recommend on a dump or the cluster)"
    holders = [c for c in w.containers if old_resource in c.gpu_resources]
    if len(holders) != 1:
        return None, (
            f"{len(holders)} containers request {old_resource}: change the one that uses the GPU"
        )
    c = holders[0]
    new = size.resource
    resources: JsonObject = {}
    for part, declared in (("requests", c.requests), ("limits", c.limits)):
        keys = {k for k, _ in declared}
        if old_resource not in keys:
            continue
        entry: JsonObject = {new: "1"}
        if old_resource != new:
            entry[old_resource] = None
        resources[part] = entry
    spec: JsonObject = {"containers": [{"name": c.name, "resources": resources}]}
    if klass:
        spec["nodeSelector"] = {CLASS_LABEL: klass}
    return Patch(o, c.name, {"spec": {"template": {"spec": spec}}}), ""
