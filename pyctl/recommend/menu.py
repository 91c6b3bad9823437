"""The menu of standard sizes: which k sizes a pool should offer, and what that costs.

Objective of a menu (per pool, `evaluate`): every replica's need is rounded up to the smallest
menu size that holds it; the observed mix is scaled so that its total need equals the pool's GPU
capacity (100% arrived, as the trace replays read unallocated GPU); the normalized replicas are
packed onto the pool's GPUs (multi-GPU replicas first, whole GPUs on one node; then largest size
first, each into the fullest GPU it fits, MIG validity from the catalog's layouts). Menus compare
by, in order: (1) demand served (the needs of the packed replicas, in GPUs: more is better),
(2) the fragment F(M') of the pool's *current* nodes under the normalized workload M' (fragmentation
core; less is better), (3) rounding waste of the packed replicas (less is better), (4) fewer
sizes, (5) names. Row k of the trade-off is the best menu of at most k sizes, found by trying
every such menu of the sizes that hold at least one need (a size that holds none is never used);
`tests/unit/test_recommend_menu.py` checks it against all subsets of all sizes by brute force.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

from pyctl.core import mig
from pyctl.core.fragmentation import FragmentationModel
from pyctl.jsontypes import JsonObject
from pyctl.model import Shape, Snapshot, Workload
from pyctl.recommend.sizes import Need, Pool, Size, smallest_holding

#: (need, its size or None when uncovered or multi-GPU, replicas). The input of an evaluation is
#: the same triple with the replicas' *current* request size ("groups").
Item = tuple[Need, Size | None, int]
#: More menus than this are not tried exhaustively (never reached with the catalog's profiles
#: and a share grid of 10).
MAX_MENUS = 20000


def normalize(groups: Iterable[Item], menu: Sequence[Size]) -> list[Item]:
    """Each group's need rounded up to the smallest menu size holding it (None: no size does,
    or a multi-GPU need, which is not normalized)."""
    m = tuple(menu)
    return [(nd, None if nd.gpus != 1 else smallest_holding(m, nd), n) for nd, _, n in groups]


def requested(groups: Iterable[Item]) -> list[Item]:
    """The groups as they request now (the baseline)."""
    return [(nd, None if nd.gpus != 1 else sz, n) for nd, sz, n in groups]


def scale(pool: Pool, groups: Sequence[Item]) -> list[Item]:
    """The mix scaled so that its total need is the pool's GPU capacity (largest remainder; the
    replica count is rounded to the nearest whole)."""
    total = sum((pool.amount(nd) * n for nd, _, n in groups), Fraction(0))
    if total == 0 or pool.gpus == 0:
        return list(groups)
    alpha = Fraction(pool.gpus) / total
    raw = [n * alpha for _, _, n in groups]
    base = [int(x) for x in raw]
    want = round(sum(raw, Fraction(0)))
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i] - base[i]), i))
    for i in order[: max(0, want - sum(base))]:
        base[i] += 1
    return [(nd, sz, b) for (nd, sz, _), b in zip(groups, base, strict=True) if b > 0]


# ---- packing ------------------------------------------------------------------------------


class _MigFits:
    """Which multisets of MIG profiles fit one GPU: those below one of the maximal layouts."""

    def __init__(self, model: str, profiles: Sequence[str]) -> None:
        self.profiles = tuple(profiles)
        self.maximal = [
            tuple(lay.counts.get(p, 0) for p in self.profiles)
            for lay in (mig.layouts(model, list(profiles)) if profiles else [])
        ]

    def fits(self, counts: tuple[int, ...]) -> bool:
        return any(all(c <= m for c, m in zip(counts, lay, strict=True)) for lay in self.maximal)


_FITS_CACHE: dict[tuple[str, tuple[str, ...]], _MigFits] = {}


def _mig_fits(model: str, profiles: tuple[str, ...]) -> _MigFits:
    key = (model, profiles)
    got = _FITS_CACHE.get(key)
    if got is None:
        got = _FITS_CACHE[key] = _MigFits(model, profiles)
    return got


State = tuple[int, ...]


def _pack_nodes(pool: Pool, multi: dict[int, int]) -> tuple[dict[int, int], int]:
    """Multi-GPU replicas onto nodes (largest first, each on the node with the fewest free GPUs
    that holds it): (placed per GPU count, whole GPUs left)."""
    free: Counter[int] = Counter(g for _, g in pool.nodes if g > 0)
    placed: dict[int, int] = {}
    for g in sorted(multi, reverse=True):
        n = multi[g]
        while n > 0:
            fit = [f for f, c in free.items() if c > 0 and f >= g]
            if not fit:
                break
            f = min(fit)
            per = f // g
            full = min(free[f], n // per)
            if full > 0:
                free[f] -= full
                free[f - per * g] += full
                n -= full * per
                placed[g] = placed.get(g, 0) + full * per
                continue
            free[f] -= 1
            free[f - n * g] += 1
            placed[g] = placed.get(g, 0) + n
            n = 0
    return placed, sum(f * c for f, c in free.items())


def _pack_gpus(
    gpus: int,
    sizes: list[tuple[Size, int]],
    add: Callable[[State, Size], State | None],
    used: Callable[[State], Fraction],
    empty: State,
) -> dict[str, int]:
    """Best fit over identical GPUs, largest size first: each replica goes to the fullest GPU it
    fits (GPUs in the same state are interchangeable, so states are counted, not listed)."""
    states: Counter[State] = Counter({empty: gpus} if gpus > 0 else {})
    placed: dict[str, int] = {}
    for size, n in sorted(sizes, key=lambda x: x[0].order(), reverse=True):
        while n > 0:
            best: tuple[tuple[Fraction, State], State] | None = None
            for st, c in states.items():
                if c > 0 and add(st, size) is not None:
                    key = (used(st), st)
                    if best is None or key > best[0]:
                        best = (key, st)
            if best is None:
                break
            st = best[1]
            # copies of `size` one GPU in state `st` takes, one after the other (best fit keeps
            # filling the GPU it just filled: it is then the fullest)
            chain = [st]
            while (nxt := add(chain[-1], size)) is not None and len(chain) <= n:
                chain.append(nxt)
            per = len(chain) - 1
            full = min(states[st], n // per)
            if full > 0:
                states[st] -= full
                states[chain[per]] += full
                n -= full * per
                placed[size.name] = placed.get(size.name, 0) + full * per
            else:
                states[st] -= 1
                states[chain[n]] += 1
                placed[size.name] = placed.get(size.name, 0) + n
                n = 0
    return placed


def pack(pool: Pool, items: Sequence[Item]) -> tuple[dict[str, int], dict[int, int]]:
    """Pack the items onto the pool: (placed per size name, placed multi-GPU per GPU count)."""
    multi: dict[int, int] = {}
    by_size: dict[str, tuple[Size, int]] = {}
    for need, size, n in items:
        if need.gpus != 1:
            multi[need.gpus] = multi.get(need.gpus, 0) + n
        elif size is not None:
            s, c = by_size.get(size.name, (size, 0))
            by_size[size.name] = (s, c + n)
    placed_multi, gpus = _pack_nodes(pool, multi)
    sizes = list(by_size.values())
    model = mig.model(pool.gpu_model).name if any(s.kind == "mig" for s, _ in sizes) else None
    if model is not None:
        profiles = tuple(sorted({s.profile for s, _ in sizes if s.profile}))
        fits = _mig_fits(model, profiles)
        index = {p: i for i, p in enumerate(profiles)}
        whole = len(profiles)
        slices = {p.name: p.compute_slices for p in mig.model(model).profiles}
        total = mig.model(model).compute_slices

        def add_mig(st: State, s: Size) -> State | None:
            if st[whole]:
                return None
            if s.kind == "gpu":
                return None if any(st) else (*st[:whole], 1)
            new = list(st)
            new[index[s.profile or ""]] += 1
            return tuple(new) if fits.fits(tuple(new[:whole])) else None

        def used_mig(st: State) -> Fraction:
            if st[whole]:
                return Fraction(1)
            return Fraction(sum(c * slices[p] for p, c in zip(profiles, st, strict=False)), total)

        placed = _pack_gpus(gpus, sizes, add_mig, used_mig, (0,) * (whole + 1))
    else:

        def add_share(st: State, s: Size) -> State | None:
            u = st[0] + s.milli
            return (u,) if u <= 1000 else None

        placed = _pack_gpus(gpus, sizes, add_share, lambda st: Fraction(st[0], 1000), (0,))
    return placed, placed_multi


# ---- evaluation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MenuEval:
    """One menu (or the requests as they are: ``menu`` None) on one pool, at 100% arrived.
    Amounts in GPUs; ``*_pct`` of the pool's GPUs."""

    menu: tuple[str, ...] | None
    capacity_gpus: int
    demand_gpus: Fraction
    served_gpus: Fraction
    allocated_gpus: Fraction
    uncovered_gpus: Fraction
    fragment_gpus: float
    idle_gpus: float
    #: size -> replicas at 100% arrived, and how many of them were placed
    counts: dict[str, int] = field(default_factory=dict)
    placed: dict[str, int] = field(default_factory=dict)
    #: the observed (unscaled) replicas: Σ (size - need) over those with a size, and Σ need
    observed_waste_gpus: Fraction = Fraction(0)
    observed_gpus: Fraction = Fraction(0)

    def _pct(self, x: Fraction | float) -> float:
        return 100.0 * float(x) / self.capacity_gpus if self.capacity_gpus else 0.0

    @property
    def sizes(self) -> int:
        return len(self.menu) if self.menu is not None else len(self.counts)

    @property
    def served_pct(self) -> float:
        return self._pct(self.served_gpus)

    @property
    def waste_pct(self) -> float:
        """Rounding waste of the placed replicas, % of capacity."""
        return self._pct(self.allocated_gpus - self.served_gpus)

    @property
    def unallocated_pct(self) -> float:
        return self._pct(self.capacity_gpus - self.allocated_gpus)

    @property
    def fragmentation_rate(self) -> float:
        return self.fragment_gpus / self.idle_gpus if self.idle_gpus > 1e-12 else 0.0

    @property
    def observed_waste_pct(self) -> float:
        """Rounding waste of the observed replicas, % of their need."""
        o = self.observed_gpus
        return 100.0 * float(self.observed_waste_gpus / o) if o else 0.0

    def key(self) -> tuple[Fraction, float, Fraction, int]:
        """Larger is better: served, then less fragment, less waste, fewer sizes (a menu of
        which no size holds any need ranks after every other)."""
        return (
            self.served_gpus,
            -round(self.fragment_gpus, 6),
            self.served_gpus - self.allocated_gpus,
            -self.sizes if self.sizes else -(10**6),
        )

    def to_json(self) -> JsonObject:
        return {
            "menu": None if self.menu is None else list(self.menu),
            "sizes": self.sizes,
            "served_pct": round(self.served_pct, 3),
            "rounding_waste_pct": round(self.waste_pct, 3),
            "unallocated_pct": round(self.unallocated_pct, 3),
            "uncovered_gpus": round(float(self.uncovered_gpus), 3),
            "fragment_gpus": round(self.fragment_gpus, 3),
            "fragmentation_rate": round(self.fragmentation_rate, 4),
            "observed_rounding_waste_pct": round(self.observed_waste_pct, 3),
            "replicas_at_100pct": dict(self.counts),
            "placed_at_100pct": dict(self.placed),
        }


def size_shape(size: Size, weight: float = 1.0) -> Shape:
    """The workload shape of a replica of this size (for F(M'))."""
    if size.kind == "mig":
        return Shape(mig_profile=size.profile, weight=weight)
    return Shape(gpus=1, gpu_milli=size.milli, weight=weight)


class Evaluator:
    """Evaluates menus of one pool: its groups (need, current request size, replicas) and its
    current nodes (for F(M')); cached by the sizes a menu actually uses."""

    def __init__(self, pool: Pool, groups: Sequence[Item], current: Snapshot | None = None) -> None:
        self.pool = pool
        self.groups = [g for g in groups if g[2] > 0]
        self.scaled = scale(pool, self.groups)
        self.model = FragmentationModel(current) if current is not None and current.nodes else None
        self._cache: dict[tuple[str, ...], MenuEval] = {}

    def _fragment(self, items: Sequence[Item]) -> tuple[float, float]:
        if self.model is None:
            return 0.0, 0.0
        weights: dict[Shape, int] = {}
        for need, size, n in items:
            if need.gpus != 1:
                shape = Shape(gpus=need.gpus, gpu_milli=1000)
            elif size is not None:
                shape = size_shape(size)
            else:
                continue
            weights[shape] = weights.get(shape, 0) + n
        if not weights:
            return 0.0, 0.0
        total = sum(weights.values())
        w = Workload(tuple(replace(s, weight=c / total) for s, c in weights.items()))
        r = self.model.score(w)
        unit = float(self.pool.compute_slices) if self.pool.mig_model else 7.0
        frag = r.fragment_gpu_milli / 1000.0 + r.fragment_mig_slices / unit
        idle = r.idle_gpu_milli / 1000.0 + r.idle_mig_slices / unit
        return frag, idle

    def _run(
        self, menu: tuple[str, ...] | None, items_of: Callable[[Sequence[Item]], list[Item]]
    ) -> MenuEval:
        pool = self.pool
        items = items_of(self.scaled)
        placed, placed_multi = pack(pool, items)
        counts: dict[str, int] = {}
        need_of: dict[str, Fraction] = {}
        amount_of: dict[str, Fraction] = {}
        uncovered = Fraction(0)
        demand = Fraction(0)
        for need, size, n in items:
            a = pool.amount(need)
            demand += a * n
            if need.gpus != 1:
                continue
            if size is None:
                uncovered += a * n
                continue
            counts[size.name] = counts.get(size.name, 0) + n
            need_of[size.name] = need_of.get(size.name, Fraction(0)) + a * n
            amount_of[size.name] = size.amount
        served = Fraction(0)
        allocated = Fraction(0)
        for name, k in placed.items():
            # the placed replicas of a size carry its average need (order-free)
            served += need_of[name] * k / counts[name]
            allocated += amount_of[name] * k
        for g, k in placed_multi.items():
            served += Fraction(g * k)
            allocated += Fraction(g * k)
        frag, idle = self._fragment(items)
        o_waste = Fraction(0)
        o_need = Fraction(0)
        for need, size, n in items_of(self.groups):
            a = pool.amount(need)
            o_need += a * n
            if size is not None:
                o_waste += max(Fraction(0), size.amount - a) * n
        return MenuEval(
            menu=menu,
            capacity_gpus=pool.gpus,
            demand_gpus=demand,
            served_gpus=served,
            allocated_gpus=allocated,
            uncovered_gpus=uncovered,
            fragment_gpus=frag,
            idle_gpus=idle,
            counts=counts,
            placed={**placed, **{f"{g} gpus": k for g, k in placed_multi.items()}},
            observed_waste_gpus=o_waste,
            observed_gpus=o_need,
        )

    def as_requested(self) -> MenuEval:
        """The baseline: every replica keeps its current request."""
        return self._run(None, requested)

    def evaluate(self, menu: Sequence[Size]) -> MenuEval:
        """A menu, by the sizes it actually uses (a size no need rounds to is dropped)."""
        menu_t = tuple(sorted(menu, key=Size.order))
        got_sizes = {sz.name for _, sz, _ in normalize(self.groups, menu_t) if sz is not None}
        used = tuple(s.name for s in menu_t if s.name in got_sizes)
        got = self._cache.get(used)
        if got is None:
            kept = tuple(s for s in menu_t if s.name in used)
            got = self._cache[used] = self._run(used, lambda g: normalize(g, kept))
        return got


@dataclass(frozen=True)
class Tradeoff:
    """Row k: the best menu of at most k sizes (k = 1..max_k); the one recommended; the
    requests as they are."""

    pool: str
    candidates: tuple[str, ...]
    rows: tuple[MenuEval, ...]
    recommended: MenuEval | None
    baseline: MenuEval
    exhaustive: bool
    tolerance_pct: float


def useful(pool: Pool, groups: Sequence[Item]) -> tuple[Size, ...]:
    """Sizes that hold at least one need (any other size is never used)."""
    singles = [nd for nd, _, _ in groups if nd.gpus == 1]
    return tuple(s for s in pool.sizes() if any(s.holds(nd) for nd in singles))


def tradeoff(ev: Evaluator, max_k: int = 5, tolerance_pct: float = 1.0) -> Tradeoff:
    """Row k: the best menu of at most k sizes, by `MenuEval.key`, trying every menu of the
    useful sizes. Recommended: the row with the fewest sizes whose demand served is within
    ``tolerance_pct`` points (of capacity) of the best row's."""
    if max_k < 1:
        raise ValueError("max_k must be at least 1")
    cands = useful(ev.pool, ev.groups)
    top_k = min(max_k, len(cands))
    exhaustive = sum(math.comb(len(cands), j) for j in range(1, top_k + 1)) <= MAX_MENUS
    rows: list[MenuEval] = []
    best: MenuEval | None = None
    for k in range(1, top_k + 1):
        if exhaustive:
            menus: Iterable[Sequence[Size]] = itertools.combinations(cands, k)
        else:  # greedy: the best so far plus one size
            base = [ev.pool.size(n) for n in (best.menu or ())] if best else []
            menus = [[*base, s] for s in cands if s not in base]
        for menu in menus:
            e = ev.evaluate(menu)
            if best is None or e.key() > best.key():
                best = e
        assert best is not None
        rows.append(best)
    recommended = None
    if rows:
        top = max(r.served_pct for r in rows)
        recommended = next(r for r in rows if r.served_pct >= top - tolerance_pct)
    return Tradeoff(
        ev.pool.gpu_model,
        tuple(s.name for s in cands),
        tuple(rows),
        recommended,
        ev.as_requested(),
        exhaustive,
        tolerance_pct,
    )
