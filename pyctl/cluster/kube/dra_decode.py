"""`resource.k8s.io/v1` JSON → DRA records (DeviceClass, ResourceSlice, ResourceClaim,
ResourceClaimTemplate), and the DRA parts of a Pod.

Decoding is bounded: an object larger than the API server itself allows (`BOUNDS`, the limits of
k8s.io/api/resource/v1 validation) is refused with a `DecodeError` naming the object and the
limit, so a hostile or corrupted object cannot make pyctl build huge records; the reflector
counts it and goes on. Quantities are kept as the strings the API server wrote, checked to
parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Final

from pyctl.cluster import quantity as q
from pyctl.cluster.bounds import DRA_BOUNDS
from pyctl.cluster.dra_records import (
    Allocated,
    Attr,
    CapacityPolicy,
    ClaimRecord,
    ClaimSpec,
    ClaimTemplateRecord,
    Constraint,
    Consumer,
    CounterSet,
    CounterUse,
    Device,
    DeviceClassRecord,
    DeviceTaint,
    DeviceToleration,
    PodClaim,
    Request,
    SliceRecord,
)
from pyctl.cluster.kube import dra_wire as w
from pyctl.cluster.kube import wire

#: Limits of the objects pyctl decodes (`pyctl.cluster.bounds.DRA_BOUNDS`)
BOUNDS: Final[Mapping[str, int]] = DRA_BOUNDS

EXTENDED_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"
POD_CLAIM_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"


class DraDecodeError(ValueError):
    """A DRA object pyctl refuses (too large, or a value it cannot read)."""


def _where(kind: str, meta: wire.Meta) -> str:
    return f"{kind} {meta.namespace + '/' if meta.namespace else ''}{meta.name}"


def _bound(n: int, what: str, where: str) -> None:
    limit = BOUNDS[what]
    if n > limit:
        raise DraDecodeError(f"{where}: {n} {what.replace('_', ' ')}, more than the limit {limit}")


@lru_cache(maxsize=16384)
def _quantity_error(v: str) -> str:
    """Why `v` is not a quantity ("" if it is); cached, since the same strings repeat."""
    try:
        q.parse_quantity(v)
    except q.QuantityError as e:
        return str(e)
    return ""


def _quantity(v: w.Quantity, where: str) -> str:
    """The quantity as the record keeps it (its text), checked as text: a JSON number is a
    quantity too, and its text must pass what `check_record` asks of a stored one (a number of
    400 digits parses as a number, not as a quantity's text)."""
    try:
        text = v if isinstance(v, str) else str(v)
    except ValueError as e:  # an integer beyond Python's digit limit for str()
        raise DraDecodeError(f"{where}: not a quantity: {e}") from None
    why = _quantity_error(text)
    if why:
        raise DraDecodeError(f"{where}: {why}")
    return text


def _selectors(sels: list[w.DeviceSelector], where: str) -> tuple[str, ...]:
    _bound(len(sels), "selectors_per_request", where)
    out = []
    for s in sels:
        if s.cel is None:
            # a selector of a kind this pyctl does not know: keep it visible as unevaluable
            out.append("")
            continue
        if len(s.cel.expression) > BOUNDS["selector_length"]:
            _bound(len(s.cel.expression), "selector_length", where)
        out.append(s.cel.expression)
    return tuple(out)


# -- DeviceClass -----------------------------------------------------------------------------


def device_class_record(c: w.DeviceClass) -> DeviceClassRecord:
    where = _where("DeviceClass", c.metadata)
    return DeviceClassRecord(
        c.metadata.name,
        c.metadata.resourceVersion,
        _selectors(c.spec.selectors, where),
        c.spec.extendedResourceName or "",
    )


# -- ResourceSlice ---------------------------------------------------------------------------


def _attr(name: str, a: w.DeviceAttribute, where: str) -> Attr:
    # the hot path of slice decoding: exactly one field set, found with plain tests
    found: Attr | None = None
    n = 0
    if a.string is not None:
        found, n = Attr(name, "string", a.string), n + 1
    if a.int_ is not None:
        found, n = Attr(name, "int", a.int_), n + 1
    if a.version is not None:
        found, n = Attr(name, "version", a.version), n + 1
    if a.bool_ is not None:
        found, n = Attr(name, "bool", a.bool_), n + 1
    if a.ints is not None or a.bools is not None or a.strings is not None or a.versions is not None:
        for kind, vals in (
            ("ints", a.ints),
            ("bools", a.bools),
            ("strings", a.strings),
            ("versions", a.versions),
        ):
            if vals is not None:
                _bound(len(vals), "list_attribute_items", f"{where}: attribute {name}")
                found, n = Attr(name, kind, tuple(vals)), n + 1
    if n != 1 or found is None:
        raise DraDecodeError(f"{where}: attribute {name} must have exactly one value, has {n}")
    return found


def _counters(cs: Mapping[str, w.Value], where: str) -> tuple[tuple[str, str], ...]:
    _bound(len(cs), "counters_per_set", where)
    return tuple(sorted((k, _quantity(v.value, f"{where}: counter {k}")) for k, v in cs.items()))


def _policy(name: str, c: w.DeviceCapacity, where: str) -> CapacityPolicy | None:
    """A capacity's requestPolicy (None: it has none)."""
    rp = c.requestPolicy
    if rp is None:
        return None
    pw = f"{where}: capacity {name} requestPolicy"
    _bound(len(rp.validValues), "capacity_valid_values", pw)
    rng = rp.validRange

    def opt(v: w.Quantity | None, what: str) -> str:
        return "" if v is None else _quantity(v, f"{pw}: {what}")

    return CapacityPolicy(
        name,
        opt(rp.default, "default"),
        tuple(_quantity(v, f"{pw}: validValues") for v in rp.validValues),
        opt(rng.min if rng else None, "validRange.min"),
        opt(rng.max if rng else None, "validRange.max"),
        opt(rng.step if rng else None, "validRange.step"),
    )


def _device(d: w.Device, where: str) -> Device:
    dw = f"{where}: device {d.name}"
    _bound(len(d.attributes) + len(d.capacity), "attributes_and_capacities_per_device", dw)
    _bound(len(d.consumesCounters), "consumptions_per_device", dw)
    _bound(len(d.taints), "taints_per_device", dw)
    return Device(
        d.name,
        tuple(_attr(k, v, dw) for k, v in sorted(d.attributes.items())),
        tuple(
            sorted((k, _quantity(v.value, f"{dw}: capacity {k}")) for k, v in d.capacity.items())
        ),
        tuple(
            CounterUse(c.counterSet, _counters(c.counters, f"{dw}: counters of {c.counterSet}"))
            for c in d.consumesCounters
        ),
        tuple(DeviceTaint(t.key, t.value, t.effect) for t in d.taints),
        bool(d.allowMultipleAllocations),
        d.nodeName or "",
        tuple(
            p for k, v in sorted(d.capacity.items()) if (p := _policy(k, v, f"{dw}")) is not None
        ),
    )


def slice_record(s: w.ResourceSlice) -> SliceRecord:
    meta = s.metadata
    where = _where("ResourceSlice", meta)
    spec = s.spec
    _bound(len(spec.devices), "devices_per_slice", where)
    _bound(len(spec.sharedCounters), "counter_sets_per_slice", where)
    if spec.pool.resourceSliceCount < 1:
        raise DraDecodeError(f"{where}: pool.resourceSliceCount must be at least 1")
    return SliceRecord(
        meta.name,
        meta.resourceVersion,
        spec.driver,
        spec.pool.name,
        spec.pool.generation,
        spec.pool.resourceSliceCount,
        spec.nodeName or "",
        bool(spec.allNodes),
        spec.nodeSelector is not None,
        bool(spec.perDeviceNodeSelection),
        tuple(_device(d, where) for d in spec.devices),
        tuple(
            CounterSet(c.name, _counters(c.counters, f"{where}: counter set {c.name}"))
            for c in spec.sharedCounters
        ),
    )


# -- ResourceClaim(Template) -----------------------------------------------------------------


def _tolerations(ts: list[w.DeviceToleration], where: str) -> tuple[DeviceToleration, ...]:
    _bound(len(ts), "tolerations_per_request", where)
    return tuple(DeviceToleration(t.key, t.operator or "Equal", t.value, t.effect) for t in ts)


def _sub(r: w.SubRequest, name: str, where: str) -> Request:
    rw = f"{where}: request {name}"
    count = 1 if r.count is None else r.count
    _bound(count, "count_per_request", rw)
    return Request(
        name=name,
        class_name=r.deviceClassName,
        selectors=_selectors(r.selectors, rw),
        mode=r.allocationMode or "ExactCount",
        count=count,
        admin_access=bool(r.adminAccess),
        tolerations=_tolerations(r.tolerations, rw),
        capacity=tuple(
            sorted(
                (k, _quantity(v, f"{rw}: capacity {k}"))
                for k, v in (r.capacity.requests if r.capacity else {}).items()
            )
        ),
    )


def claim_spec(spec: w.ResourceClaimSpec, where: str) -> ClaimSpec:
    dev = spec.devices
    _bound(len(dev.requests), "requests_per_claim", where)
    _bound(len(dev.constraints), "constraints_per_claim", where)
    requests = []
    for r in dev.requests:
        if r.exactly is not None:
            requests.append(_sub(r.exactly, r.name, where))
        else:
            _bound(len(r.firstAvailable), "subrequests_per_request", f"{where}: request {r.name}")
            requests.append(
                Request(
                    name=r.name,
                    first_available=tuple(
                        _sub(s, f"{r.name}/{s.name}", where) for s in r.firstAvailable
                    ),
                )
            )
    return ClaimSpec(
        tuple(requests),
        tuple(
            Constraint(tuple(c.requests), c.matchAttribute or "", c.distinctAttribute or "")
            for c in dev.constraints
        ),
    )


def allocation_node(sel: wire.NodeSelector | None) -> str:
    """The node a node-local allocation is for: its nodeSelector's one term names it by
    `metadata.name` (matchFields In [node]), as the scheduler writes it; "" otherwise."""
    if sel is None:
        return ""
    for term in sel.nodeSelectorTerms:
        for f in term.matchFields:
            if f.key == "metadata.name" and f.operator == "In" and len(f.values) == 1:
                return f.values[0]
    return ""


def claim_record(c: w.ResourceClaim) -> ClaimRecord:
    meta = c.metadata
    where = _where("ResourceClaim", meta)
    alloc = c.status.allocation
    results = alloc.devices.results if alloc is not None else []
    _bound(len(results), "results_per_claim", where)
    _bound(len(c.status.reservedFor), "reserved_for", where)
    owner = next((o for o in meta.ownerReferences if o.kind == "Pod" and o.controller), None)
    return ClaimRecord(
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        resource_version=meta.resourceVersion,
        spec=claim_spec(c.spec, where),
        allocated=tuple(
            Allocated(
                r.request,
                r.driver,
                r.pool,
                r.device,
                bool(r.adminAccess),
                r.shareID or "",
                tuple(
                    sorted(
                        (k, _quantity(v, f"{where}: consumed {k}"))
                        for k, v in r.consumedCapacity.items()
                    )
                ),
            )
            for r in results
        ),
        allocated_node=allocation_node(alloc.nodeSelector) if alloc is not None else "",
        reserved_for=tuple(Consumer(r.resource, r.name, r.uid) for r in c.status.reservedFor),
        owner_pod=owner.name if owner else "",
        owner_uid=owner.uid if owner else "",
        pod_claim_name=meta.annotations.get(POD_CLAIM_ANNOTATION, ""),
        extended=meta.annotations.get(EXTENDED_CLAIM_ANNOTATION, "") == "true",
        deleting=meta.deletionTimestamp is not None,
    )


def claim_template_record(t: w.ResourceClaimTemplate) -> ClaimTemplateRecord:
    meta = t.metadata
    return ClaimTemplateRecord(
        meta.namespace,
        meta.name,
        meta.resourceVersion,
        claim_spec(t.spec.spec, _where("ResourceClaimTemplate", meta)),
    )


# -- the DRA parts of a Pod ------------------------------------------------------------------


def pod_claims(p: wire.Pod) -> tuple[PodClaim, ...]:
    """spec.resourceClaims with the generated claim names of status.resourceClaimStatuses."""
    claims = p.spec.resourceClaims
    if not claims:
        return ()
    _bound(len(claims), "claims_per_pod", _where("Pod", p.metadata))
    generated = {
        s.name: s.resourceClaimName or "" for s in p.status.resourceClaimStatuses if s.name
    }
    return tuple(
        PodClaim(
            c.name,
            c.resourceClaimName or "",
            c.resourceClaimTemplateName or "",
            generated.get(c.name, ""),
        )
        for c in claims
    )
