"""Claims and the devices they can get (docs/dra.md): a pod's claims with their specs (the
claim's, or its template's before the claim is made), a request's devices (those that satisfy
its DeviceClass's and its own CEL selectors, `pyctl.cluster.dra.cel`), what kind of device that
is, and the index of the cluster's device kinds. What pyctl cannot evaluate raises `Unknown`
with the reason: counted and shown, never guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeAlias

from pyctl.cluster.dra import cel
from pyctl.cluster.dra.devices import GPU_DRIVERS, DeviceView, device_view
from pyctl.cluster.dra_records import (
    CapacityPolicy,
    ClaimRecord,
    ClaimSpec,
    ClaimTemplateRecord,
    Device,
    DeviceClassRecord,
    PodClaim,
    Request,
)


@dataclass(frozen=True)
class Catalogue:
    """What resolving claims needs besides the node: DeviceClasses, claims and templates."""

    classes: Mapping[str, DeviceClassRecord]
    claims: Mapping[str, ClaimRecord]
    templates: Mapping[str, ClaimTemplateRecord]


def pod_claim_specs(
    namespace: str, claims: Sequence[PodClaim], cat: Catalogue
) -> tuple[list[tuple[PodClaim, ClaimSpec | None, ClaimRecord | None]], bool]:
    """Each of a pod's claims with its spec (the claim's, or its template's before the claim is
    made) and the claim record; and whether every claim comes from a template (the pod may be
    moved: its replacement gets a new claim)."""
    out = []
    all_templates = True
    for pc in claims:
        rec = cat.claims.get(f"{namespace}/{pc.claim_name}") if pc.claim_name else None
        spec: ClaimSpec | None = rec.spec if rec is not None else None
        if pc.template:
            if spec is None:
                t = cat.templates.get(f"{namespace}/{pc.template}")
                spec = t.spec if t is not None else None
        else:
            all_templates = False
        out.append((pc, spec, rec))
    return out, all_templates


def effective(req: Request) -> Request:
    """A request with alternatives is taken as its first alternative (the allocator tries them
    in order; the first is what it gets where devices are free)."""
    return req.first_available[0] if req.first_available else req


class Unknown(Exception):
    """pyctl cannot tell (a selector it cannot evaluate, a search too large); says why."""


@lru_cache(maxsize=262144)
def _selector_matches(expression: str, driver: str, device: Device) -> bool | str:
    """True/False, or the reason pyctl cannot evaluate it (cached per device and expression)."""
    view = device_view(driver, "", device, 0)
    try:
        return cel.evaluate(expression, view.cel_input())
    except cel.SelectorUnknown as e:
        return str(e)


def request_matches(
    req: Request, cls: DeviceClassRecord | None, d: DeviceView, claim: str = ""
) -> bool:
    """Whether device `d` satisfies the request's DeviceClass and its own selectors; `Unknown`
    if a selector cannot be evaluated for it (or the class does not exist)."""
    if cls is None:
        raise Unknown(f"{claim}: request {req.name}: DeviceClass {req.class_name!r} not found")
    for expr in (*cls.selectors, *req.selectors):
        got = _selector_matches(expr, d.id.driver, d.device)
        if isinstance(got, str):
            raise Unknown(f"{claim}: request {req.name}: {got}")
        if not got:
            return False
    return True


def kind_of(d: DeviceView) -> tuple[str, str]:
    """What a device is for a shape: ("gpu", ""), ("shared", "") (a whole GPU several claims
    share by capacity), ("mig", profile), or ("other", driver)."""
    if d.id.driver in GPU_DRIVERS and d.kind == "gpu":
        return ("shared", "") if d.shared else ("gpu", "")
    if d.id.driver in GPU_DRIVERS and d.kind == "mig":
        return ("mig", d.profile)
    return ("other", d.id.driver)


#: (driver, kind, profile, product, and a shared device's capacities and their policies)
_GroupKey: TypeAlias = tuple[
    str, str, str, str, tuple[tuple[tuple[str, str], ...], tuple[CapacityPolicy, ...]] | None
]


class KindIndex:
    """The cluster's devices grouped by (driver, kind, profile, product), to tell which kinds of
    device a request can get without evaluating its selectors on every device of the cluster:
    each group is tried up to `per_group` devices."""

    def __init__(self, devices: Iterable[DeviceView], per_group: int = 64) -> None:
        groups: dict[_GroupKey, list[DeviceView]] = defaultdict(list)
        for d in devices:
            # shared devices also by their capacities (what a share of them is depends on it)
            shared = (d.device.capacity, d.device.policies) if d.shared else None
            g = groups[(d.id.driver, d.kind, d.profile, d.product, shared)]
            if len(g) < per_group:
                g.append(d)
        self.groups = dict(groups)

    def kinds(
        self, req: Request, cls: DeviceClassRecord | None, claim: str
    ) -> dict[tuple[str, str], list[DeviceView]]:
        """The kinds of device the request can get, each with the first matching device of
        each of its groups."""
        out: dict[tuple[str, str], list[DeviceView]] = {}
        for members in self.groups.values():
            for d in members:
                if request_matches(req, cls, d, claim):
                    out.setdefault(kind_of(d), []).append(d)
                    break
        return out


def unknown_kind(reason: str) -> str:
    """A short, bounded label for why a request is unknown (metrics)."""
    for needle, kind in (
        ("CEL", "selector"),
        ("selector pyctl does not know", "selector"),
        ("several kinds", "several_kinds"),
        ("not found", "class_not_found"),
        ("no device in the cluster", "no_device"),
        ("not known yet", "claim_not_known_yet"),
        ("out of steps", "search_limit"),
    ):
        if needle in reason:
            return kind
    return "not_modelled"
