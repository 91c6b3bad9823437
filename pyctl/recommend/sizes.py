"""Standard sizes: what a replica's GPU request can be normalized to, per GPU pool.

A *pool* is the GPUs of one model. Where MIG is on, the standard sizes are the model's MIG profiles
from the catalog (`pyctl.core.mig`; the `+me` variants and the full-GPU profile left out) plus the
whole GPU (`nvidia.com/gpu: 1`, the seed's ``gpu-large``). Where MIG is off, they are the whole
GPU and, when the pool's requests are GPU shares (time-slicing; the openb traces), the shares on a
grid of ``1/grid`` of a GPU.

A *need* is what a replica needs of one GPU: its compute (a share of one GPU's SMs) and its GPU
memory, either from its current request or from observed usage. A size *holds* a need when both
fit. Amounts (demand, rounding waste) are in GPUs: a MIG size counts its compute slices (an A100
has 7), a share its fraction; a need on a MIG pool counts as the finest catalog size that holds it,
elsewhere as the larger of its compute and memory shares.

Memory of a MIG size: the GB in its name read as 10^9 bytes (``1g.5gb`` = 4768 MiB), at or below
what ``nvidia-smi mig -lgip`` reports (4864 MiB), so a fit is never optimistic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Final, Literal, TypeAlias

from pyctl.core import mig

SizeKind: TypeAlias = Literal["mig", "gpu", "share"]
GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_PREFIX: Final = "nvidia.com/mig-"
WHOLE: Final = "gpu"
MIB_PER_GB: Final = Fraction(10**9, 2**20)

#: GPU memory (GiB) of common models without MIG, when no `nvidia.com/gpu.memory` label says it;
#: matched as a case-insensitive substring of the model name, longest key first.
GPU_MEMORY_GIB: Final[dict[str, int]] = {
    "T4": 16,
    "P100": 16,
    "P4": 8,
    "V100M16": 16,
    "V100M32": 32,
    "V100-SXM2-16GB": 16,
    "V100-SXM2-32GB": 32,
    "V100-PCIE-16GB": 16,
    "V100-PCIE-32GB": 32,
    "A10G": 24,
    "A10": 24,
    "A16": 16,
    "A40": 48,
    "L4": 24,
    "L40": 48,
    "L40S": 48,
    "RTX-A6000": 48,
}

_GB: Final = re.compile(r"\.(\d+)gb")


def gb_to_mib(gb: float | Fraction) -> int:
    """Decimal GB as MiB, rounded down."""
    return int(Fraction(gb) * MIB_PER_GB)


def profile_memory_mib(profile: str) -> int | None:
    """Memory of a MIG profile from its name (``3g.20gb`` -> 19073 MiB), None if it has none."""
    m = _GB.search(profile)
    return gb_to_mib(int(m.group(1))) if m else None


@lru_cache(maxsize=256)
def catalog(gpu_model: str) -> mig.GpuModel | None:
    """The catalog's model (any name `pyctl.core.mig` resolves), else None."""
    if not gpu_model:
        return None
    try:
        return mig.model(gpu_model)
    except ValueError:
        return None


def mig_model_name(gpu_model: str) -> str | None:
    """The catalog name of a MIG-capable model, else None."""
    m = catalog(gpu_model)
    return None if m is None else m.name


def table_memory_mib(gpu_model: str) -> int | None:
    """GPU memory of a model: the catalog's full profile for MIG models, else the table above."""
    cat = catalog(gpu_model)
    if cat is not None:
        full = max(cat.profiles, key=lambda p: (p.compute_slices, p.memory_slices))
        return profile_memory_mib(full.name)
    upper = gpu_model.upper()
    for key in sorted(GPU_MEMORY_GIB, key=len, reverse=True):
        if key.upper() in upper:
            return GPU_MEMORY_GIB[key] * 1024
    return None


@dataclass(frozen=True, slots=True)
class Need:
    """What a replica needs. ``gpus`` >= 2: whole GPUs (multi-GPU replicas are not normalized);
    otherwise of one GPU: ``compute`` as a share of its SMs and ``memory_mib``, each None when
    unknown (then unconstrained)."""

    gpus: int = 1
    compute: Fraction | None = None
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Size:
    """A standard size. ``compute`` is the share of one GPU's SMs (MIG: compute slices / the
    GPU's); ``memory_mib`` None when the pool's GPU memory is unknown."""

    name: str
    kind: SizeKind
    compute: Fraction
    memory_mib: int | None
    profile: str | None = None
    memory_slices: int = 0

    @property
    def milli(self) -> int:
        """The size in milli-GPU (the unit of `pyctl.model.Shape.gpu_milli`)."""
        return int(self.compute * 1000)

    @property
    def resource(self) -> str:
        """The Kubernetes extended resource a replica of this size requests."""
        if self.kind == "mig":
            return f"{MIG_PREFIX}{self.profile}"
        return GPU_RESOURCE

    @property
    def amount(self) -> Fraction:
        """What it takes of a GPU, in GPUs."""
        return self.compute

    def holds(self, need: Need) -> bool:
        if need.gpus != 1:
            return False
        if need.compute is not None and self.compute < need.compute:
            return False
        if need.memory_mib is not None and self.memory_mib is not None:
            return self.memory_mib >= need.memory_mib
        return True

    def order(self) -> tuple[Fraction, int, str]:
        """Smallest first: compute, then memory, then name."""
        return (self.compute, self.memory_mib or 0, self.name)


def share_name(milli: int) -> str:
    return WHOLE if milli == 1000 else f"{milli / 1000:g}gpu"


@dataclass(frozen=True, slots=True)
class Pool:
    """The GPUs of one model. ``nodes``: (node name, GPUs) of the nodes that have them;
    ``mig``: MIG is on (some node shows MIG resources or a MIG config), so the sizes are MIG
    profiles; ``shares``: sub-GPU shares are sizes (MIG off, requests are shares)."""

    gpu_model: str
    nodes: tuple[tuple[str, int], ...]
    mig: bool = False
    shares: bool = False
    gpu_memory_mib: int | None = None
    grid: int = 10

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.nodes)

    @property
    def mig_model(self) -> str | None:
        return mig_model_name(self.gpu_model) if self.mig else None

    @property
    def compute_slices(self) -> int:
        """A GPU's compute slices (MIG pools), 1000 otherwise (milli-GPU)."""
        m = catalog(self.gpu_model) if self.mig else None
        return m.compute_slices if m else 1000

    def whole(self) -> Size:
        return _sizes(self.gpu_model, self.mig, self.shares, self.gpu_memory_mib, self.grid)[0]

    def sizes(self) -> tuple[Size, ...]:
        """The candidate standard sizes, smallest first."""
        return _sizes(self.gpu_model, self.mig, self.shares, self.gpu_memory_mib, self.grid)[1]

    def size(self, name: str) -> Size:
        for s in self.sizes():
            if s.name == name:
                return s
        raise ValueError(f"pool {self.gpu_model}: no standard size {name!r}")

    def memory_share(self, memory_mib: int) -> Fraction | None:
        return None if not self.gpu_memory_mib else Fraction(memory_mib, self.gpu_memory_mib)

    def amount(self, need: Need) -> Fraction:
        """A need in GPUs. Multi-GPU: its GPUs. MIG pools: the compute share of the finest
        catalog size that holds it (so rounding waste is what the menu costs above what MIG could
        give); other pools: the larger of its compute and memory shares. At most 1."""
        if need.gpus != 1:
            return Fraction(need.gpus)
        if self.mig_model is not None:
            finest = smallest_holding(self.sizes(), need)
            return Fraction(1) if finest is None else finest.compute
        parts = [Fraction(0)]
        if need.compute is not None:
            parts.append(need.compute)
        if need.memory_mib is not None:
            share = self.memory_share(need.memory_mib)
            if share is not None:
                parts.append(share)
        return min(max(parts), Fraction(1))

    def request_size(
        self, gpus: int, gpu_milli: int, mig_profile: str | None
    ) -> tuple[Size | None, Need]:
        """A current request as (its size when it is one of this pool's, its need)."""
        if mig_profile is not None:
            gm = catalog(self.gpu_model)
            if gm is None:
                raise ValueError(
                    f"pool {self.gpu_model}: MIG request {mig_profile!r} on a GPU without MIG"
                )
            name = mig.profile_name(gm.name, mig_profile)
            p = gm.profile(name)
            need = Need(
                1, Fraction(p.compute_slices, gm.compute_slices), profile_memory_mib(p.name)
            )
            if p.compute_slices >= gm.compute_slices:
                return self.whole(), need
            size = Size(
                p.name,
                "mig",
                Fraction(p.compute_slices, gm.compute_slices),
                profile_memory_mib(p.name),
                p.name,
                p.memory_slices,
            )
            return size, need
        if gpus >= 2:
            return None, Need(gpus)
        milli = gpu_milli or 1000
        if milli >= 1000:
            return self.whole(), Need(1, Fraction(1), self.gpu_memory_mib)
        share = Fraction(milli, 1000)
        mem = None if self.gpu_memory_mib is None else int(share * self.gpu_memory_mib)
        return Size(share_name(milli), "share", share, mem), Need(1, share, None)


@lru_cache(maxsize=256)
def _sizes(
    gpu_model: str, mig_on: bool, shares: bool, gpu_memory_mib: int | None, grid: int
) -> tuple[Size, tuple[Size, ...]]:
    m = catalog(gpu_model) if mig_on else None
    whole = Size(WHOLE, "gpu", Fraction(1), gpu_memory_mib, None, m.memory_slices if m else 0)
    out = [whole]
    if m is not None:
        for p in m.profiles:
            if p.media_extensions or p.compute_slices >= m.compute_slices:
                continue
            out.append(
                Size(
                    p.name,
                    "mig",
                    Fraction(p.compute_slices, m.compute_slices),
                    profile_memory_mib(p.name),
                    p.name,
                    p.memory_slices,
                )
            )
    elif shares:
        for i in range(1, grid):
            milli = 1000 * i // grid
            if milli * grid != 1000 * i:
                continue  # only grid points that are whole milli-GPUs
            mem = None if gpu_memory_mib is None else gpu_memory_mib * i // grid
            out.append(Size(share_name(milli), "share", Fraction(milli, 1000), mem))
    return whole, tuple(sorted(out, key=Size.order))


def smallest_holding(menu: tuple[Size, ...], need: Need) -> Size | None:
    """The smallest size of the menu that holds the need (None: none does)."""
    best: Size | None = None
    for s in menu:
        if s.holds(need) and (best is None or s.order() < best.order()):
            best = s
    return best
