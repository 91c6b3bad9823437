"""Kubernetes JSON → pyctl's compact records (the hot path of every watch event).

Raw bytes are decoded with msgspec straight into the `wire` structs (unknown fields skipped),
then summarised into records: pod requests summed over containers (max with init containers),
quantities parsed exactly (with a cache, since the same strings repeat), the NVIDIA stack's
resources and labels picked out.

An object pyctl cannot take raises `DecodeError`, with a `reason` (a metric label) and, when its
metadata could be read, a `ref` naming it: `malformed` (not the object's JSON shape, or a list or
string longer than `pyctl.cluster.bounds` allows), `too_large` (more bytes than an API server
stores), `bad_quantity`, `out_of_bounds` (a count or amount no real machine has).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, TypeVar

import msgspec

from pyctl.cluster import agent_topology
from pyctl.cluster import quantity as q
from pyctl.cluster.bounds import (
    MAX_CPU_MILLI,
    MAX_GPUS_PER_POD,
    MAX_MEMORY_MIB,
    MAX_OBJECT_BYTES,
    MAX_RDMA,
    MAX_TEXT_CHARS,
    BoundsError,
)
from pyctl.cluster.gangs import kueue_waiting, pod_gang, volcano_group
from pyctl.cluster.kube import dra_decode, dra_wire, fabric_decode, wire
from pyctl.cluster.kube.sharing import (
    HAMI_ALLOCATED,
    HAMI_SCHEDULER,
    SHARED,
    SharingError,
    node_sharing,
    pod_sharing,
)
from pyctl.cluster.records import (
    FABRIC_KINDS,
    Constraints,
    Kind,
    NodeRecord,
    NodeTerm,
    NrtRecord,
    ObjectRef,
    PdbRecord,
    PodRecord,
    PodTerm,
    Record,
    Requirement,
    Selector,
    Spread,
    Taint,
    Toleration,
    ZoneRecord,
    check_record,
    check_texts,
    tombstone,
)
from pyctl.model import TOPOLOGY_POLICIES, PolicyName

GPU: Final = "nvidia.com/gpu"
MIG_PREFIX: Final = "nvidia.com/mig-"
PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
COUNT_LABEL: Final = "nvidia.com/gpu.count"
MIG_CONFIG_LABEL: Final = "nvidia.com/mig.config"
MIG_CONFIG_STATE_LABEL: Final = "nvidia.com/mig.config.state"
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"
POLICY_LABEL: Final = "pyctl.io/topology-manager-policy"
GPU_NUMA_LABEL: Final = re.compile(r"^nvidia\.com/gpu-(\d+)-numa$", re.ASCII)
#: an extended resource's name: a DNS subdomain prefix, "/", a name (IsExtendedResourceName's
#: shape; the resources pyctl reads as GPUs are not one it can be told to read as RDMA)
_EXTENDED = re.compile(
    r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    re.ASCII,
)


def is_extended_resource(name: str) -> bool:
    """Whether `name` can name the RDMA resource: an extended resource (domain/name) outside
    the kubernetes.io domains and other than the GPU, MIG and shared-GPU resources."""
    domain = name.split("/", 1)[0]
    return (
        _EXTENDED.match(name) is not None
        and domain != "kubernetes.io"
        and not domain.endswith(".kubernetes.io")
        and name not in (GPU, SHARED)
        and not name.startswith(MIG_PREFIX)
    )


EVICT_ANNOTATIONS: Final = ("pyctl.io/evict", "descheduler.alpha.kubernetes.io/evict")
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
#: the policy names a NodeResourceTopology carries (the kubelet's and the NFD topology updater's
#: spellings) -> pyctl's
NRT_POLICIES: Final[dict[str, PolicyName]] = {
    **{p: p for p in TOPOLOGY_POLICIES},
    "SingleNUMANodeContainerLevel": "single-numa-node",
    "SingleNUMANodePodLevel": "single-numa-node",
    "Restricted": "restricted",
    "BestEffort": "best-effort",
    "None": "none",
}


class DecodeError(ValueError):
    """An object pyctl cannot understand; the message names it, `reason` says why in one word
    (a metric label), `ref` names the object when its metadata could be read."""

    def __init__(self, message: str, reason: str = "malformed", ref: ObjectRef | None = None):
        super().__init__(message)
        self.reason = reason
        self.ref = ref

    @property
    def tombstone(self) -> Record | None:
        """A DELETED event's record for the object (None when it is not named): a watch event
        that does not decode drops the object's previous version from the controller's view."""
        return tombstone(self.ref) if self.ref is not None else None


def _ref(kind: Kind, meta: wire.Meta) -> ObjectRef:
    return ObjectRef(kind, meta.namespace, meta.name, meta.uid)


def _digits(v: str) -> bool:
    return v.isascii() and v.isdigit()


_R = TypeVar("_R", NodeRecord, PodRecord, PdbRecord, NrtRecord)


def _check(rec: _R, kind: Kind, meta: wire.Meta) -> _R:
    try:
        check_record(rec)
    except BoundsError as e:
        raise DecodeError(str(e), "out_of_bounds", _ref(kind, meta)) from None
    return rec


@lru_cache(maxsize=8192)
def _cpu(v: str | int | float) -> int:
    return q.cpu_milli(v)


@lru_cache(maxsize=8192)
def _mem(v: str | int | float, up: bool = True) -> int:
    return q.memory_mib(v, round_up=up)


@lru_cache(maxsize=8192)
def _count(v: str | int | float) -> int:
    return q.count(v)


def _where(kind: str, meta: wire.Meta) -> str:
    return f"{kind} {meta.namespace + '/' if meta.namespace else ''}{meta.name}"


def _agent(annotations: Mapping[str, str]) -> tuple[agent_topology.AgentTopology | None, str]:
    """The agent's topology annotation, or why it is unreadable: an unreadable one is left out
    with the reason (the node itself is read as without it: the controller's rules apply)."""
    value = annotations.get(agent_topology.ANNOTATION)
    if value is None:
        return None, ""
    try:
        return agent_topology.decode(value), ""
    except agent_topology.AgentTopologyError as e:
        return None, f"{agent_topology.ANNOTATION}: {e}"[:MAX_TEXT_CHARS]


def node_record(n: wire.Node, rdma_resource: str = "") -> NodeRecord:
    """The node as a record; `rdma_resource` names the extended resource read as its RDMA."""
    meta = n.metadata
    labels = meta.labels
    alloc = n.status.allocatable or n.status.capacity
    try:
        mig = tuple(
            sorted(
                (k[len(MIG_PREFIX) :], _count(v))
                for k, v in alloc.items()
                if k.startswith(MIG_PREFIX)
            )
        )
        count_label = labels.get(COUNT_LABEL, "")
        agent, agent_error = _agent(meta.annotations)
        rec = NodeRecord(
            name=meta.name,
            resource_version=meta.resourceVersion,
            gpu_model=labels.get(PRODUCT_LABEL, ""),
            cpu_milli=_cpu(alloc.get("cpu", 0)),
            memory_mib=_mem(alloc.get("memory", 0), False),
            gpus=_count(alloc.get(GPU, 0)),
            mig=mig,
            gpu_numa=tuple(
                sorted(
                    (int(m.group(1)), int(v))
                    for k, v in labels.items()
                    if (m := GPU_NUMA_LABEL.match(k)) and _digits(v)
                )
            ),
            gpu_count_label=int(count_label) if _digits(count_label) else 0,
            mig_config=labels.get(MIG_CONFIG_LABEL, ""),
            mig_config_state=labels.get(MIG_CONFIG_STATE_LABEL, ""),
            mig_strategy=labels.get(MIG_STRATEGY_LABEL, ""),
            topology_policy=labels.get(POLICY_LABEL, meta.annotations.get(POLICY_LABEL, ""))[
                :MAX_TEXT_CHARS
            ],
            unschedulable=n.spec.unschedulable,
            taints=tuple(Taint(t.key, t.value, t.effect) for t in n.spec.taints),
            ready=all(c.status == "True" for c in n.status.conditions if c.type == "Ready"),
            labels=tuple(sorted(labels.items())),
            sharing=node_sharing(
                labels, meta.annotations, {SHARED: _count(alloc[SHARED])} if SHARED in alloc else {}
            ),
            agent=agent,
            agent_error=agent_error,
            rdma=_rdma(alloc, rdma_resource),
        )
    except q.QuantityError as e:
        raise DecodeError(
            f"{_where('node', meta)}: {e}", "bad_quantity", _ref("Node", meta)
        ) from None
    except SharingError as e:
        raise DecodeError(f"{_where('node', meta)}: {e}", "malformed", _ref("Node", meta)) from None
    return _check(rec, "Node", meta)


def _rdma(alloc: Mapping[str, str | int | float], name: str) -> int:
    """The node's allocatable of the RDMA resource `name` (0: none, or no name)."""
    if not name or name not in alloc:
        return 0
    try:
        return _units(name, alloc[name])
    except q.QuantityError as e:
        raise q.QuantityError(f"{name}: {e}") from None


@lru_cache(maxsize=16384)
def _units(resource: str, value: str | int | float) -> int:
    """A request in the scheduler's units: CPU in millicores and memory in bytes (both rounded
    up per container, as `MilliValue()`/`Value()` do), extended resources as whole counts."""
    if resource == "cpu":
        return q.cpu_milli(value)
    v = q.parse_quantity(value)
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        return -(-v.numerator // v.denominator)
    if v.denominator != 1:
        raise q.QuantityError(f"expected a whole number, got {value!r}")
    return int(v)


def _sum_requests(containers: list[wire.Container], meta: wire.Meta) -> dict[str, int]:
    acc: dict[str, int] = {}
    for c in containers:
        reqs = c.resources.requests
        limits = c.resources.limits
        try:
            for k, v in reqs.items():
                acc[k] = acc.get(k, 0) + _units(k, v)
            # extended resources are often given as limits only (then the request equals them)
            for k, v in limits.items():
                if k not in reqs and k not in ("cpu", "memory", "ephemeral-storage"):
                    acc[k] = acc.get(k, 0) + _units(k, v)
        except q.QuantityError as e:
            raise DecodeError(
                f"{_where('pod', meta)}: container {c.name}: {k}: {e}",
                "bad_quantity",
                _ref("Pod", meta),
            ) from None
    return acc


def _pending(p: wire.Pod) -> tuple[bool, str, bool]:
    """Whether the pod waits for room, why, and whether a gate holds it back: PodScheduled=False
    with reason Unschedulable, or held back by Kueue until its group fits in one domain
    (`gangs.kueue_waiting`)."""
    for c in p.status.conditions:
        if c.type == "PodScheduled":
            if c.status == "False" and c.reason == "Unschedulable":
                return True, c.message[:200], False
            break
    spec = p.spec
    if spec.schedulingGates and not spec.nodeName:
        why = kueue_waiting([g.name for g in spec.schedulingGates], p.metadata.annotations)
        return bool(why), why[:200], bool(why)
    return False, "", False


def pod_record(p: wire.Pod, rdma_resource: str = "") -> PodRecord:
    """The pod as a record; `rdma_resource` names the extended resource read as its RDMA."""
    meta = p.metadata
    spec = p.spec
    req = _sum_requests(spec.containers, meta)
    for init in spec.initContainers:
        for k, v in _sum_requests([init], meta).items():
            req[k] = max(req.get(k, 0), v)
    # plain loops: this runs for every pod event
    owner = None
    for o in meta.ownerReferences:
        if o.controller:
            owner = o
            break
    if owner is None and meta.ownerReferences:
        owner = meta.ownerReferences[0]
    unsched, message, gated = _pending(p)
    annotations = meta.annotations
    evict = ""
    if annotations:
        for a in EVICT_ANNOTATIONS:
            if a in annotations:
                evict = annotations[a][:MAX_TEXT_CHARS]
                break
    mig: tuple[tuple[str, int], ...] = ()
    if len(req) > 3 or (req and not req.keys() <= _PLAIN):
        mig = tuple(
            sorted(
                (k[len(MIG_PREFIX) :], v) for k, v in req.items() if k.startswith(MIG_PREFIX) and v
            )
        )
    sharing = None
    if (
        (req and not req.keys() <= _PLAIN)
        or spec.schedulerName == HAMI_SCHEDULER
        or (annotations and HAMI_ALLOCATED in annotations)
    ):
        try:
            sharing = pod_sharing(
                req, annotations, spec.schedulerName, len(spec.initContainers), req.get(GPU, 0)
            )
        except SharingError as e:
            raise DecodeError(
                f"{_where('pod', meta)}: {e}", "malformed", _ref("Pod", meta)
            ) from None
    local = pvc = False
    for vol in spec.volumes:
        if vol.emptyDir is not None or vol.hostPath is not None:
            local = True
        if vol.persistentVolumeClaim is not None or vol.ephemeral is not None:
            pvc = True
    labels = meta.labels
    rec = PodRecord(
        meta.namespace,
        meta.name,
        meta.uid,
        meta.resourceVersion,
        spec.nodeName,
        p.status.phase,
        req.get("cpu", 0),
        -(-req.get("memory", 0) // 2**20),
        req.get(GPU, 0),
        mig,
        spec.priority or 0,
        spec.priorityClassName,
        owner.kind if owner else "",
        owner.name if owner else "",
        tuple(sorted(labels.items())) if labels else (),
        unsched,
        message,
        meta.deletionTimestamp is not None,
        MIRROR_ANNOTATION in annotations,
        local,
        evict,
        pvc,
        _timestamp(meta.creationTimestamp),
        "" if spec.schedulerName in ("", DEFAULT_SCHEDULER) else spec.schedulerName,
        _constraints(spec) if _has_constraints(spec) else None,
        dra_decode.pod_claims(p) if spec.resourceClaims else (),
        ext.resourceClaimName if (ext := p.status.extendedResourceClaimStatus) else "",
        sharing,
        pod_gang(annotations, labels, owner.kind if owner else "", owner.name if owner else "")
        if annotations
        else None,
        gated,
        volcano_group(annotations) if annotations else "",
        req.get(rdma_resource, 0) if rdma_resource else 0,
    )
    # the wire types bound every list and string; what is left are the amounts (a fast path,
    # since this runs for every pod event: the full check only when one is out of bounds)
    if (
        not 0 <= rec.cpu_milli <= MAX_CPU_MILLI
        or not 0 <= rec.memory_mib <= MAX_MEMORY_MIB
        or not 0 <= rec.gpus <= MAX_GPUS_PER_POD
        or not 0 <= rec.rdma <= MAX_RDMA
        or mig
    ):
        return _check(rec, "Pod", meta)
    return rec


DEFAULT_SCHEDULER: Final = "default-scheduler"


def _timestamp(ts: str | None) -> float:
    """An RFC 3339 timestamp (creationTimestamp) as seconds since the epoch; 0 when absent or
    unreadable."""
    if not ts:
        return 0.0
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _has_constraints(spec: wire.PodSpec) -> bool:
    return bool(
        spec.nodeSelector or spec.affinity or spec.tolerations or spec.topologySpreadConstraints
    )


def _requirements(reqs: list[wire.Requirement]) -> tuple[Requirement, ...]:
    return tuple(Requirement(r.key, r.operator, tuple(r.values)) for r in reqs)


def _selector(sel: wire.LabelSelector | None) -> Selector | None:
    if sel is None:
        return None
    return Selector(tuple(sorted(sel.matchLabels.items())), _requirements(sel.matchExpressions))


def _pod_terms(aff: wire.PodAffinity | None) -> tuple[PodTerm, ...]:
    if aff is None:
        return ()
    return tuple(
        PodTerm(
            t.topologyKey,
            _selector(t.labelSelector),
            tuple(t.namespaces),
            # an empty namespaceSelector ({}) selects every namespace
            t.namespaceSelector is not None
            and not t.namespaceSelector.matchLabels
            and not t.namespaceSelector.matchExpressions,
        )
        for t in aff.requiredDuringSchedulingIgnoredDuringExecution
    )


def _constraints(spec: wire.PodSpec) -> Constraints:
    aff = spec.affinity
    node_terms: tuple[NodeTerm, ...] = ()
    if aff is not None and aff.nodeAffinity is not None:
        req = aff.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
        if req is not None:
            node_terms = tuple(
                NodeTerm(_requirements(t.matchExpressions), _requirements(t.matchFields))
                for t in req.nodeSelectorTerms
            )
    return Constraints(
        node_selector=tuple(sorted(spec.nodeSelector.items())),
        node_affinity=node_terms,
        tolerations=tuple(
            Toleration(t.key, t.operator or "Equal", t.value, t.effect) for t in spec.tolerations
        ),
        affinity=_pod_terms(aff.podAffinity if aff else None),
        anti_affinity=_pod_terms(aff.podAntiAffinity if aff else None),
        spread=tuple(
            Spread(c.maxSkew, c.topologyKey, _selector(c.labelSelector), c.minDomains or 0)
            for c in spec.topologySpreadConstraints
            if c.whenUnsatisfiable == "DoNotSchedule"
        ),
    )


_PLAIN: Final = frozenset(("cpu", "memory", GPU, "ephemeral-storage"))


def _int_or_pct(v: int | str | None) -> str:
    return "" if v is None else str(v)


def pdb_record(b: wire.Pdb) -> PdbRecord:
    meta = b.metadata
    rec = PdbRecord(
        namespace=meta.namespace,
        name=meta.name,
        resource_version=meta.resourceVersion,
        match_labels=tuple(sorted(b.spec.selector.matchLabels.items())),
        match_expressions=_requirements(b.spec.selector.matchExpressions),
        min_available=_int_or_pct(b.spec.minAvailable),
        max_unavailable=_int_or_pct(b.spec.maxUnavailable),
        disruptions_allowed=b.status.disruptionsAllowed,
        current_healthy=b.status.currentHealthy,
        desired_healthy=b.status.desiredHealthy,
        expected_pods=b.status.expectedPods,
    )
    return _check(rec, "PodDisruptionBudget", meta)


_NUMA_ID: Final = re.compile(r"(\d+)$", re.ASCII)


def _numa_id(name: str, where: str, ref: ObjectRef) -> int:
    m = _NUMA_ID.search(name)
    if not m:
        raise DecodeError(f"{where}: zone {name!r} has no NUMA id in its name", ref=ref)
    return int(m.group(1))


def _nrt_amounts(r: wire.NrtResource) -> tuple[str | int, str | int]:
    """A zone resource's (allocatable, available): capacity when no allocatable is given, and
    all of it available when no available is."""
    total = r.allocatable if r.allocatable is not None else r.capacity
    return total, r.available if r.available is not None else total


def _nrt_links(t: wire.Nrt, where: str, ref: ObjectRef) -> dict[str, tuple[tuple[int, int], ...]]:
    """Zones nested in a NUMA zone (`parent`) that hold `nvidia.com/gpu`: the NUMA zone's name
    -> each one's (allocatable, available) GPUs, in zone name order. The NRT API lets zones
    nest; a zone of GPUs inside a NUMA node is read as one link group (an NVLink bridge, switch
    or partition). Other nested zones are ignored."""
    numa = {z.name for z in t.zones if z.type == "Node"}
    found: dict[str, list[tuple[str, int, int]]] = {}
    for z in t.zones:
        if z.type == "Node" or z.parent not in numa:
            continue
        for r in z.resources:
            if r.name != GPU:
                continue
            total, avail = _nrt_amounts(r)
            try:
                got = (z.name, _count(total), _count(avail))
            except q.QuantityError as e:
                raise DecodeError(
                    f"{where}: zone {z.name}: {r.name}: {e}", "bad_quantity", ref
                ) from None
            found.setdefault(z.parent, []).append(got)
    return {
        p: tuple((n, min(a, n)) for _, n, a in sorted(groups) if n > 0)
        for p, groups in found.items()
    }


def nrt_record(t: wire.Nrt) -> NrtRecord:
    meta = t.metadata
    where = _where("NodeResourceTopology", meta)
    ref = _ref("NodeResourceTopology", meta)
    policy = ""
    scope = ""
    for a in t.attributes:
        if a.name == "topologyManagerPolicy":
            policy = NRT_POLICIES.get(a.value, "")
        elif a.name == "topologyManagerScope":
            scope = a.value
    if not policy:
        policy = next((NRT_POLICIES[p] for p in t.topologyPolicies if p in NRT_POLICIES), "")
    links = _nrt_links(t, where, ref)
    zones = []
    for z in t.zones:
        if z.type != "Node":
            continue
        cpu = cpu_av = mem = mem_av = gpus = gpus_av = shared = shared_av = 0
        mig = []
        for r in z.resources:
            total, avail = _nrt_amounts(r)
            try:
                if r.name == "cpu":
                    cpu, cpu_av = _cpu(total), _cpu(avail)
                elif r.name == "memory":
                    mem, mem_av = _mem(total, False), _mem(avail, False)
                elif r.name == GPU:
                    gpus, gpus_av = _count(total), _count(avail)
                elif r.name == SHARED:
                    shared, shared_av = _count(total), _count(avail)
                elif r.name.startswith(MIG_PREFIX):
                    mig.append((r.name[len(MIG_PREFIX) :], _count(total), _count(avail)))
            except q.QuantityError as e:
                raise DecodeError(
                    f"{where}: zone {z.name}: {r.name}: {e}", "bad_quantity", ref
                ) from None
        groups = links.get(z.name, ())
        zones.append(
            ZoneRecord(
                _numa_id(z.name, where, ref),
                cpu,
                cpu_av,
                mem,
                mem_av,
                gpus,
                gpus_av,
                tuple(sorted(mig)),
                shared,
                shared_av,
                # the groups must hold the zone's GPUs exactly, else they are not read
                groups if sum(g for g, _ in groups) == gpus else (),
            )
        )
    rec = NrtRecord(meta.name, meta.resourceVersion, policy, scope[:MAX_TEXT_CHARS], tuple(zones))
    return _check(rec, "NodeResourceTopology", meta)


_WIRE: Final[dict[str, type[Any]]] = {
    "Node": wire.Node,
    "Pod": wire.Pod,
    "PodDisruptionBudget": wire.Pdb,
    "NodeResourceTopology": wire.Nrt,
    "DeviceClass": dra_wire.DeviceClass,
    "ResourceSlice": dra_wire.ResourceSlice,
    "ResourceClaim": dra_wire.ResourceClaim,
    "ResourceClaimTemplate": dra_wire.ResourceClaimTemplate,
    "KueueTopology": wire.Topology,
    "KaiTopology": wire.Topology,
    "ComputeDomainClique": wire.ComputeDomainClique,
    "HyperNode": wire.HyperNode,
    "PodGroup": wire.PodGroup,
    "KueueWorkload": wire.Workload,
}
#: the kinds that carry the RDMA resource, read with its name
_TO_RECORD_RDMA: Final[dict[str, Callable[[Any, str], Record]]] = {
    "Node": node_record,
    "Pod": pod_record,
}
_TO_RECORD: Final[dict[str, Callable[[Any], Record]]] = {
    "Node": node_record,
    "Pod": pod_record,
    "PodDisruptionBudget": pdb_record,
    "NodeResourceTopology": nrt_record,
    "DeviceClass": dra_decode.device_class_record,
    "ResourceSlice": dra_decode.slice_record,
    "ResourceClaim": dra_decode.claim_record,
    "ResourceClaimTemplate": dra_decode.claim_template_record,
    "KueueTopology": fabric_decode.kueue_topology_record,
    "KaiTopology": fabric_decode.kai_topology_record,
    "ComputeDomainClique": fabric_decode.clique_record,
    "HyperNode": fabric_decode.hypernode_record,
    "PodGroup": fabric_decode.podgroup_record,
    "KueueWorkload": fabric_decode.workload_record,
}
_DECODERS: Final = {k: msgspec.json.Decoder(v) for k, v in _WIRE.items()}
_CHECKED_AFTER: Final = frozenset(
    ("DeviceClass", "ResourceClaim", "ResourceClaimTemplate", *FABRIC_KINDS)
)
_LINE: Final = msgspec.json.Decoder(wire.WatchLine)
_STATUS: Final = msgspec.json.Decoder(wire.Status)

T = TypeVar("T")


class _IdentMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""


class _Ident(msgspec.Struct):
    metadata: _IdentMeta = msgspec.field(default_factory=_IdentMeta)


_IDENT: Final = msgspec.json.Decoder(_Ident)


def _ident(
    kind: Kind, data: bytes | bytearray | memoryview | Mapping[str, Any]
) -> ObjectRef | None:
    """The object's name, namespace and uid if its metadata reads (on the error path only)."""
    try:
        if isinstance(data, Mapping):
            m = msgspec.convert(data.get("metadata") or {}, _IdentMeta, strict=False)
        else:
            m = _IDENT.decode(data).metadata
    except (msgspec.MsgspecError, RecursionError, TypeError, ValueError):
        return None
    if not m.name or len(m.name) > 253 or len(m.namespace) > 253 or len(m.uid) > 128:
        return None
    return ObjectRef(kind, m.namespace, m.name, m.uid)


def decode_object(kind: Kind, data: bytes | Mapping[str, Any], rdma_resource: str = "") -> Record:
    """One Kubernetes object (JSON bytes, or an already parsed dict) as a record; a node's or
    pod's amount of the extended resource `rdma_resource` names is its `rdma`. Raises
    `DecodeError` (with its reason, and the object's ref when its metadata reads)."""
    try:
        if isinstance(data, bytes | bytearray | memoryview):
            if len(data) > MAX_OBJECT_BYTES:
                raise DecodeError(
                    f"{kind}: {len(data)} bytes, more than an API server stores "
                    f"({MAX_OBJECT_BYTES})",
                    "too_large",
                    _ident(kind, data),
                )
            obj = _DECODERS[kind].decode(data)
        else:
            obj = msgspec.convert(data, _WIRE[kind], strict=False)
    except msgspec.ValidationError as e:
        ref = _ident(kind, data)
        who = f" {ref.key}" if ref else ""
        raise DecodeError(f"{kind}{who}: {e}", "malformed", ref) from None
    except msgspec.DecodeError as e:
        raise DecodeError(f"{kind}: broken JSON: {e}") from None
    except UnicodeDecodeError as e:
        raise DecodeError(f"{kind}: not UTF-8 (byte {e.start})", ref=_ident(kind, data)) from None
    except RecursionError:
        raise DecodeError(f"{kind}: JSON nested too deeply", ref=_ident(kind, data)) from None
    try:
        rec: Record = (
            _TO_RECORD[kind](obj)
            if not rdma_resource or kind not in _TO_RECORD_RDMA
            else _TO_RECORD_RDMA[kind](obj, rdma_resource)
        )
        if kind in _CHECKED_AFTER:
            # the record's own bounds (a negative count): whatever decodes is what `check_record`
            # accepts from Redis or a file. A slice's counts are all applied while it decodes
            # (the whole check would add a third to its cost), its strings here; the fuzz tests
            # check both agree.
            check_record(rec)
        elif kind == "ResourceSlice":
            check_texts(rec)
    except dra_decode.DraDecodeError as e:
        # beyond a limit of k8s.io/api/resource/v1 (bounds.DRA_BOUNDS), or a value pyctl cannot read
        reason = "out_of_bounds" if "more than the limit" in str(e) else "malformed"
        raise DecodeError(str(e), reason, _ident(kind, data)) from None
    except BoundsError as e:
        raise DecodeError(str(e), "out_of_bounds", _ident(kind, data)) from None
    return rec


class WatchError(Exception):
    """An ERROR event of a watch stream (410 Gone: the resourceVersion is too old)."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason


def decode_watch_line(
    kind: Kind, line: bytes, rdma_resource: str = ""
) -> tuple[str, Record | None, str]:
    """One watch stream line: (event type, record or None for BOOKMARK, resourceVersion), its
    object read as `decode_object` reads it. An ERROR event raises `WatchError`."""
    try:
        ev = _LINE.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as e:
        raise DecodeError(f"{kind} watch: broken event: {e}") from None
    except RecursionError:
        raise DecodeError(f"{kind} watch: event nested too deeply") from None
    if ev.type == "ERROR":
        st = _STATUS.decode(ev.object)
        raise WatchError(st.code, st.reason, st.message)
    if ev.type == "BOOKMARK":
        meta = msgspec.json.decode(ev.object, type=_Bookmark)
        return "BOOKMARK", None, meta.metadata.resourceVersion
    rec = decode_object(kind, bytes(ev.object), rdma_resource)
    return ev.type, rec, getattr(rec, "resource_version", "")


class _Bookmark(msgspec.Struct):
    metadata: wire.Meta = msgspec.field(default_factory=wire.Meta)
