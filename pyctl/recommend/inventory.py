"""What `pyctl recommend` reads: the GPU nodes and the replicas, grouped into pools.

From the records the watches and dumps produce (`pyctl.cluster.records`), plus what only the raw
objects say (container names and their GPU requests, for the patches; the GFD label
``nvidia.com/gpu.memory``; a ReplicaSet's Deployment). A replica's workload is its controller,
with a ReplicaSet resolved to its Deployment: from the ReplicaSet object when it was listed, else
by the ``pod-template-hash`` label (a Deployment's ReplicaSet is named ``<deployment>-<hash>``).

Bad objects are isolated: each is left out, counted and named once in ``Inventory.problems``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final

from pyctl.cluster.kube.dump import read_dump
from pyctl.cluster.records import NodeRecord, NrtRecord, PodRecord, Selector
from pyctl.cluster.selectors import matches
from pyctl.cluster.translate import TranslateError, node_from_records, pod_shape
from pyctl.core import mig
from pyctl.model import DEFAULT_TOPOLOGY_POLICY, Node, Shape, Snapshot
from pyctl.recommend.sizes import MIG_PREFIX, Pool, mig_model_name, table_memory_mib

GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"
TEMPLATE_HASH: Final = "pod-template-hash"
#: Namespaces whose CPU-only pods are not counted as replicas (cluster add-ons).
SYSTEM_NAMESPACE_PREFIXES: Final = ("kube-",)
#: Owners whose pod template pyctl can emit a patch for.
PATCHABLE: Final = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")


@dataclass(frozen=True, slots=True)
class Container:
    """A container's GPU resources (``nvidia.com/*``), as written in its spec."""

    name: str
    requests: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, str], ...] = ()

    @property
    def gpu_resources(self) -> set[str]:
        return {k for k, _ in self.requests} | {k for k, _ in self.limits}


@dataclass(frozen=True, slots=True)
class Owner:
    """The workload a replica belongs to (kind ``Pod`` for a pod without a controller)."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Replica:
    namespace: str
    pod: str
    owner: Owner
    #: the pod's own controller (a ReplicaSet for a Deployment's pods), for usage attribution
    controller: str
    node: str
    shape: Shape
    #: None when unknown (the controller's records do not keep containers)
    containers: tuple[Container, ...] | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def is_gpu(self) -> bool:
        return not self.shape.is_cpu_only


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    gpu_model: str = ""
    whole_gpus: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    #: physical GPUs: whole ones plus those in MIG mode
    gpus: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_memory_mib: int | None = None
    mig_config: str = ""
    ready: bool = True

    @property
    def mig_on(self) -> bool:
        return bool(self.mig) or self.mig_config not in ("", "all-disabled")


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[NodeInfo, ...]
    replicas: tuple[Replica, ...]
    #: the model of each node as it is now (for F(M') of the normalized workload)
    current: Mapping[str, Node] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def snapshot(self, names: Iterable[str]) -> Snapshot:
        return Snapshot(tuple(self.current[n] for n in names if n in self.current))


def mig_gpus_needed(gpu_model: str, counts: Sequence[tuple[str, int]]) -> int:
    """The fewest GPUs of the model that hold these MIG instances (first fit, largest first,
    each GPU checked with the exact placement search)."""
    return _mig_gpus_needed(gpu_model, tuple(counts))


@lru_cache(maxsize=1024)
def _mig_gpus_needed(gpu_model: str, counts: tuple[tuple[str, int], ...]) -> int:
    name = mig_model_name(gpu_model)
    if name is None or not counts:
        return 0
    m = mig.model(name)
    slices = {p.name: (p.compute_slices, p.memory_slices) for p in m.profiles}
    wanted: list[str] = []
    for prof, n in counts:
        wanted += [mig.profile_name(name, prof)] * max(0, n)
    wanted.sort(key=lambda p: slices.get(p, (0, 0)), reverse=True)
    gpus: list[list[str]] = []
    for p in wanted:
        for g in gpus:
            if mig.validate(name, [*g, p]):
                g.append(p)
                break
        else:
            gpus.append([p])
    return len(gpus)


def node_info(r: NodeRecord, gpu_memory_mib: int | None = None) -> NodeInfo:
    mig_counts = tuple((p, n) for p, n in r.mig if n > 0)
    mig_gpus = 0
    if mig_counts:
        mig_gpus = max(r.gpu_count_label - r.gpus, mig_gpus_needed(r.gpu_model, mig_counts))
    mem = gpu_memory_mib or (table_memory_mib(r.gpu_model) if r.gpu_model else None)
    return NodeInfo(
        name=r.name,
        gpu_model=r.gpu_model,
        whole_gpus=r.gpus,
        mig=mig_counts,
        gpus=r.gpus + mig_gpus,
        cpu_milli=r.cpu_milli,
        memory_mib=r.memory_mib,
        gpu_memory_mib=mem,
        mig_config=r.mig_config,
        ready=r.ready and not r.unschedulable,
    )


def workload_owner(p: PodRecord, rs_owner: Mapping[tuple[str, str], Owner] | None = None) -> Owner:
    """The workload of a pod: its controller, a ReplicaSet resolved to its Deployment."""
    if p.owner_kind == "ReplicaSet":
        got = (rs_owner or {}).get((p.namespace, p.owner_name))
        if got is not None:
            return got
        h = dict(p.labels).get(TEMPLATE_HASH, "")
        if h and p.owner_name.endswith(f"-{h}"):
            return Owner("Deployment", p.namespace, p.owner_name[: -len(h) - 1])
        return Owner("ReplicaSet", p.namespace, p.owner_name)
    if p.owner_kind:
        return Owner(p.owner_kind, p.namespace, p.owner_name)
    return Owner("Pod", p.namespace, p.name)


def is_replica(p: PodRecord, namespaces: Sequence[str] | None = None) -> bool:
    """A pod that counts: not terminated or being deleted, not a mirror pod, in the namespaces
    asked for; CPU-only pods only when a Deployment/StatefulSet/ReplicaSet runs them outside the
    cluster add-on namespaces."""
    if p.terminated or p.deleting or p.mirror:
        return False
    if namespaces and p.namespace not in namespaces:
        return False
    s = pod_shape(p)
    if s.is_cpu_only:
        return p.owner_kind in ("ReplicaSet", "StatefulSet", "Deployment") and not (
            p.namespace.startswith(SYSTEM_NAMESPACE_PREFIXES)
        )
    return True


def from_records(
    nodes: Sequence[NodeRecord],
    pods: Sequence[PodRecord],
    nrts: Sequence[NrtRecord] = (),
    *,
    containers: Mapping[str, tuple[Container, ...]] | None = None,
    gpu_memory: Mapping[str, int] | None = None,
    rs_owner: Mapping[tuple[str, str], Owner] | None = None,
    current: Mapping[str, Node] | None = None,
    namespaces: Sequence[str] | None = None,
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
    problems: Sequence[str] = (),
) -> Inventory:
    """The inventory of records. ``current``: models already translated (the controller's
    reconciler view); missing ones are translated here. ``containers``: pod key -> its containers
    (from raw pods)."""
    probs = list(problems)
    by_node: dict[str, list[PodRecord]] = defaultdict(list)
    for p in pods:
        if p.node and not p.terminated:
            by_node[p.node].append(p)
    nrt = {t.name: t for t in nrts}
    infos = []
    models: dict[str, Node] = dict(current or {})
    for r in nodes:
        try:
            infos.append(node_info(r, (gpu_memory or {}).get(r.name)))
        except ValueError as e:
            probs.append(f"node {r.name}: left out: {e}")
            models.pop(r.name, None)
            continue
        if r.name in models:
            continue
        try:
            models[r.name] = node_from_records(r, nrt.get(r.name), by_node[r.name], default_policy)
        except (TranslateError, ValueError) as e:
            probs.append(f"node {r.name}: left out of the fragment measure: {e}")
    replicas = []
    for p in pods:
        if not is_replica(p, namespaces):
            continue
        replicas.append(
            Replica(
                p.namespace,
                p.name,
                workload_owner(p, rs_owner),
                p.owner_name,
                p.node,
                pod_shape(p),
                None if containers is None else containers.get(p.key, ()),
            )
        )
    return Inventory(tuple(infos), tuple(replicas), models, tuple(probs))


# ---- raw objects (a kubectl dump, or what the live listing returns) --------------------------


def _gpu_quantities(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        return ()
    return tuple(
        sorted((str(k), str(v)) for k, v in raw.items() if str(k).startswith("nvidia.com/"))
    )


def raw_containers(pod: Mapping[str, Any]) -> tuple[Container, ...]:
    spec = pod.get("spec")
    cs = spec.get("containers") if isinstance(spec, Mapping) else None
    out = []
    for c in cs if isinstance(cs, list) else []:
        if not isinstance(c, Mapping):
            continue
        res = c.get("resources")
        res = res if isinstance(res, Mapping) else {}
        out.append(
            Container(
                str(c.get("name", "")),
                _gpu_quantities(res.get("requests")),
                _gpu_quantities(res.get("limits")),
            )
        )
    return tuple(out)


def from_objects(
    items: Sequence[Any],
    *,
    namespaces: Sequence[str] | None = None,
    node_selector: Selector | None = None,
    default_policy: str = DEFAULT_TOPOLOGY_POLICY,
) -> Inventory:
    """The inventory of Kubernetes objects (a dump's items, or what the live listing returns):
    the kinds the controller watches are read as the controller reads them
    (`pyctl.cluster.kube.dump.read_dump`: its decoding, bounds and isolation), ReplicaSets and
    the containers' GPU requests from the raw objects; only the nodes whose labels match
    ``node_selector`` (a `pyctl.cluster.selectors` selector). An object that does not decode is
    left out and named in ``problems``."""
    listed = read_dump({"kind": "List", "items": list(items)}, "objects")
    problems = [f"left out: {lo.message}" for lo in listed.left_out]
    raw_pods: dict[str, Mapping[str, Any]] = {}
    rs_owner: dict[tuple[str, str], Owner] = {}
    bad = Counter[str]()
    for o in items:
        if not isinstance(o, Mapping):
            bad["not an object"] += 1
            continue
        kind = o.get("kind")
        meta = o.get("metadata") if isinstance(o.get("metadata"), Mapping) else {}
        assert isinstance(meta, Mapping)
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        if kind == "ReplicaSet":
            for ref in meta.get("ownerReferences") or []:
                if isinstance(ref, Mapping) and ref.get("controller"):
                    rs_owner[(ns, name)] = Owner(
                        str(ref.get("kind", "")), ns, str(ref.get("name", ""))
                    )
        elif kind == "Pod":
            raw_pods[f"{ns}/{name}"] = o
    nodes = [
        r for r in listed.nodes if node_selector is None or matches(node_selector, dict(r.labels))
    ]
    gpu_memory: dict[str, int] = {}
    for r in nodes:
        v = dict(r.labels).get(GPU_MEMORY_LABEL, "")
        if v.isdigit() and int(v) > 0:
            gpu_memory[r.name] = int(v)
    containers = {p.key: raw_containers(raw_pods[p.key]) for p in listed.pods if p.key in raw_pods}
    problems += [f"{n} item(s) left out: {why}" for why, n in bad.items()]
    return from_records(
        nodes,
        listed.pods,
        listed.nrts,
        containers=containers,
        gpu_memory=gpu_memory,
        rs_owner=rs_owner,
        namespaces=namespaces,
        default_policy=default_policy,
        problems=problems,
    )


# ---- pools ----------------------------------------------------------------------------------


def pools(inv: Inventory, grid: int = 10) -> dict[str, Pool]:
    """One pool per GPU model of the nodes with GPUs (nodes without a model label: ``unknown``)."""
    by_model: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in inv.nodes:
        if n.gpus > 0:
            by_model[n.gpu_model or "unknown"].append(n)
    share_models = set()
    node_model = {n.name: n.gpu_model or "unknown" for n in inv.nodes}
    for r in inv.replicas:
        if r.shape.gpus == 1 and 0 < r.shape.gpu_milli < 1000:
            share_models.add(node_model.get(r.node, ""))
    out = {}
    for model, ns in sorted(by_model.items()):
        mig_on = any(n.mig_on for n in ns) and mig_model_name(model) is not None
        mems = [n.gpu_memory_mib for n in ns if n.gpu_memory_mib]
        out[model] = Pool(
            gpu_model=model,
            nodes=tuple((n.name, n.gpus) for n in sorted(ns, key=lambda n: n.name)),
            mig=mig_on,
            shares=not mig_on and model in share_models,
            gpu_memory_mib=min(mems) if mems else None,
            grid=grid,
        )
    return out


def pool_of(r: Replica, inv_nodes: Mapping[str, NodeInfo], ps: Mapping[str, Pool]) -> str | None:
    """The pool of a replica: its node's; for a pending one, the pool that can take its request
    (a MIG profile: the first MIG pool whose model has it; else the pool with the most GPUs)."""
    if r.node:
        n = inv_nodes.get(r.node)
        if n is None or n.gpus == 0:
            return None
        return n.gpu_model or "unknown"
    if r.shape.mig_profile is not None:
        for name, p in ps.items():
            if p.mig_model is not None:
                try:
                    mig.profile_name(p.mig_model, r.shape.mig_profile)
                except ValueError:
                    continue
                return name
        return None
    fit = [p for p in ps.values() if r.shape.gpus <= max((g for _, g in p.nodes), default=0)]
    if not fit:
        return None
    return max(fit, key=lambda p: (p.gpus, p.gpu_model)).gpu_model


def mig_resource(profile: str) -> str:
    return f"{MIG_PREFIX}{profile}"
