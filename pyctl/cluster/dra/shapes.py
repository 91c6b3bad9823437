"""Claims -> shapes (docs/dra.md): what a pod's claims ask of GPUs (`DraNeed`). A request whose
devices are all whole GPUs asks for `count` GPUs; all MIG devices of one profile, for that
profile; all shares of shared GPUs, for that share of each. A `matchAttribute` constraint on
`numaNode` or `pcieRoot` over its GPU requests makes the shape NUMA-aligned; one on the NVIDIA
driver's `partitionN` (its GPUs in one Fabric Manager partition) makes it a link-group shape
(docs/fabric.md). Anything else
(selectors pyctl cannot evaluate, devices of several kinds, `All` mode, several MIG devices) is
"unknown" with a reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.claims import Catalogue, KindIndex, Unknown, effective, pod_claim_specs
from pyctl.cluster.dra.devices import NUMA_ATTRIBUTE, PCIE_ATTRIBUTE, DeviceView
from pyctl.cluster.dra.partitions import partition_size
from pyctl.cluster.dra_records import ClaimSpec, PodClaim, Request

ALIGN_ATTRIBUTES: Final = frozenset({NUMA_ATTRIBUTE, PCIE_ATTRIBUTE})


@dataclass(frozen=True)
class DraNeed:
    """What a pod's claims ask of GPUs, as a shape sees it."""

    gpus: int = 0
    mig_profile: str | None = None
    numa_aligned: bool = False
    #: the share of each GPU (milli-GPU; below 1000 for a share of a shared device)
    gpu_milli: int = 1000
    #: why pyctl cannot say ("" when it can)
    unknown: str = ""
    #: every claim comes from a template (the pod can be moved: its replacement gets new claims)
    movable: bool = True
    #: the pod has claims at all
    claims: int = 0
    #: its GPUs must be one link group (a `matchAttribute` on `gpu.nvidia.com/partitionN`)
    link_group: bool = False


def share_need(req: Request, devices: Sequence[DeviceView], claim: str) -> int:
    """The share (milli-GPU) a request takes of each shared device it gets: what it consumes by
    the allocator's arithmetic, as a fraction of the devices it matches (the largest, when
    devices of different capacities match); raises `Unknown` when none can serve it."""
    got = [
        dc.share(d.caps, c) for d in devices if (c := dc.consumed(d.caps, req.capacity)) is not None
    ]
    if not got:
        raise Unknown(
            f"{claim}: request {req.name}: no shared device it matches can serve its capacity "
            "request"
        )
    return max(1, max(got))


@dataclass(frozen=True)
class ClaimNeed:
    """What one claim asks of GPUs."""

    gpus: int
    profile: str | None
    #: its GPU requests share a NUMA node (or PCIe root)
    aligned: bool
    #: the share of each GPU in milli-GPU
    milli: int
    #: its GPU requests share a Fabric Manager partition
    link_group: bool = False


def _covers(c_requests: Sequence[str], spec: ClaimSpec, gpu_requests: list[str]) -> bool:
    """Whether a constraint over `c_requests` (none: every request) covers the GPU requests."""
    covered = set(c_requests) if c_requests else {r.name for r in spec.requests}
    return set(gpu_requests) <= {r.split("/")[0] for r in covered}


def claim_need(spec: ClaimSpec, cat: Catalogue, index: KindIndex, claim: str) -> ClaimNeed:
    """What one claim asks of GPUs; raises `Unknown`."""
    gpus = 0
    profiles: list[str] = []
    milli: set[int] = set()
    gpu_requests: list[str] = []
    for raw in spec.requests:
        req = effective(raw)
        if req.admin_access:
            continue  # admin access uses no capacity
        if req.mode == "All":
            raise Unknown(f"{claim}: request {req.name}: allocationMode All is not modelled")
        kinds = index.kinds(req, cat.classes.get(req.class_name), claim)
        gpu_kinds = {k for k in kinds if k[0] != "other"}
        if not gpu_kinds:
            if not kinds:
                raise Unknown(f"{claim}: request {req.name}: no device in the cluster matches it")
            continue  # not a GPU (a NIC, CPUs of a CPU driver): no GPU shape
        if len(kinds) > 1:
            raise Unknown(
                f"{claim}: request {req.name}: matches devices of several kinds "
                f"({', '.join(sorted(f'{a} {b}'.strip() for a, b in kinds))})"
            )
        ((k, profile),) = gpu_kinds
        if k in ("gpu", "shared"):
            gpus += req.count
            milli.add(share_need(req, kinds[(k, profile)], claim) if k == "shared" else 1000)
        else:
            if req.count != 1:
                raise Unknown(
                    f"{claim}: request {req.name}: {req.count} MIG devices (one is modelled)"
                )
            profiles.append(profile)
        gpu_requests.append(raw.name)
    if profiles and (gpus or len(profiles) > 1):
        raise Unknown(f"{claim}: asks for MIG devices together with other GPUs (not modelled)")
    if len(milli) > 1:
        raise Unknown(f"{claim}: asks for GPU shares of different sizes (not modelled)")
    aligned = link = False
    for c in spec.constraints:
        if c.match_attribute in ALIGN_ATTRIBUTES and _covers(c.requests, spec, gpu_requests):
            aligned = True
        if partition_size(c.match_attribute) and _covers(c.requests, spec, gpu_requests):
            link = True
    return ClaimNeed(
        gpus, (profiles[0] if profiles else None), aligned, min(milli, default=1000), link
    )


def pod_need(
    namespace: str, claims: Sequence[PodClaim], cat: Catalogue, index: KindIndex
) -> DraNeed:
    """A pod's DRA need from its claims (or their templates before the claims are made)."""
    if not claims:
        return DraNeed()
    resolved, movable = pod_claim_specs(namespace, claims, cat)
    gpus = 0
    profile: str | None = None
    aligned_all = True
    link_all = True
    claims_with_gpus = 0
    milli: set[int] = set()
    try:
        for pc, spec, _ in resolved:
            where = f"{namespace}/{pc.claim_name or pc.template or pc.name}"
            if spec is None:
                raise Unknown(f"{where}: the claim (or its template) is not known yet")
            cn = claim_need(spec, cat, index, where)
            g, p = cn.gpus, cn.profile
            if g:
                milli.add(cn.milli)
                if len(milli) > 1:
                    raise Unknown(f"{where}: GPU shares of different sizes (not modelled)")
            if g or p:
                claims_with_gpus += 1
                aligned_all = aligned_all and (cn.aligned or g <= 1)
                link_all = link_all and cn.link_group
            if p is not None:
                if profile is not None or gpus:
                    raise Unknown(f"{where}: MIG devices together with other GPUs (not modelled)")
                profile = p
            gpus += g
            if gpus and profile is not None:
                raise Unknown(f"{where}: MIG devices together with other GPUs (not modelled)")
    except Unknown as e:
        return DraNeed(unknown=str(e), movable=movable, claims=len(claims))
    # GPUs of several claims are aligned (or in one partition) only if one claim holds them all
    one = gpus > 1 and claims_with_gpus == 1
    return DraNeed(
        gpus,
        profile,
        one and aligned_all,
        min(milli, default=1000),
        "",
        movable,
        len(claims),
        one and link_all,
    )
