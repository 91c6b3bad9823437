"""Pure-Python twin of the kubelet hint merge: the literal algorithm, for tests and benchmarks.

It walks the full cartesian product of the per-resource hint lists and keeps a running best, the
way the kubelet's `HintMerger.Merge` does (topologymanager.md §3-§8). The Rust core computes the
same answer differently (dynamic programming over candidate states plus the closed-form choice);
the property tests check that the two agree. Not on any hot path.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Mask = int | None  # None = the nil mask


@dataclass(frozen=True)
class Hint:
    mask: Mask
    preferred: bool


@dataclass(frozen=True)
class Result:
    affinity: list[int] | None
    preferred: bool
    admit: bool


def _mask(ids: Sequence[int] | None) -> Mask:
    if ids is None:
        return None
    m = 0
    for i in ids:
        m |= 1 << i
    return m


def _ids(mask: int) -> list[int]:
    return [i for i in range(64) if mask >> i & 1]


def _hint(h: Any) -> Hint:
    if isinstance(h, Mapping):
        return Hint(_mask(h["affinity"]), bool(h["preferred"]))
    return Hint(_mask(h.affinity), bool(h.preferred))


def filter_providers_hints(providers: Sequence[Any]) -> list[list[Hint]]:
    lists: list[list[Hint]] = []
    for p in providers:
        if not p:
            lists.append([Hint(None, True)])
            continue
        for hints in p.values():
            if hints is None:
                lists.append([Hint(None, True)])
            elif len(hints) == 0:
                lists.append([Hint(None, False)])
            else:
                lists.append([_hint(h) for h in hints])
    return lists


def _count(m: int) -> int:
    return bin(m).count("1")


class _Fitter:
    def __init__(self, closest: bool, distances: Mapping[Any, Sequence[int]] | None) -> None:
        self.closest = closest
        self.rows = {int(k): list(v) for k, v in (distances or {}).items()}

    def avg(self, m: int) -> float:
        ids = _ids(m)
        return sum(self.rows[i][j] for i in ids for j in ids) / (len(ids) ** 2)

    def fitter(self, cur: int, cand: int) -> int:
        """CompareNUMAAffinityMasks: the mask to keep."""
        if cur == cand:
            return cur
        if _count(cur) != _count(cand) or not self.closest:
            narrower = (_count(cand), cand) < (_count(cur), cur)
            return cand if narrower else cur
        a, b = self.avg(cur), self.avg(cand)
        if a != b:
            return cand if b < a else cur
        return cand if cand < cur else cur


def _max_of_min_affinity_counts(lists: list[list[Hint]]) -> int:
    best = 0
    for lst in lists:
        widths = [_count(h.mask) for h in lst if h.mask is not None]
        if widths:
            best = max(best, min(widths))
    return best


def _merge(lists: list[list[Hint]], default: int, fit: _Fitter) -> Hint:
    b = _max_of_min_affinity_counts(lists)
    best: Hint | None = None
    for combo in itertools.product(*lists):
        mask = default
        preferred = True
        raw: int | None = None
        for h in combo:
            preferred = preferred and h.preferred
            if h.mask is not None:
                mask &= h.mask
                if raw is None:
                    raw = h.mask
                elif raw != h.mask:
                    preferred = False
        if mask == 0:
            continue
        cand = Hint(mask, preferred)
        if best is None:
            best = cand
            continue
        assert best.mask is not None
        cur = best.mask
        if not best.preferred and preferred:
            best = cand
        elif best.preferred and not preferred:
            pass
        elif best.preferred and preferred:
            best = Hint(fit.fitter(cur, mask), True)
        else:
            wb, wc = _count(cur), _count(mask)
            if wb > b:
                pick = fit.fitter(cur, mask)
            elif wb == b:
                pick = fit.fitter(cur, mask) if wc == b else cur
            elif wc > b:
                pick = cur
            elif wc == b or wb < wc:
                pick = mask
            elif wc < wb:
                pick = cur
            else:
                pick = fit.fitter(cur, mask)
            best = Hint(pick, False)
    return best if best is not None else Hint(default, False)


def merge_hints(
    providers: Sequence[Any],
    policy: str,
    numa_nodes: Sequence[int],
    options: Mapping[str, Any] | None = None,
    distances: Mapping[Any, Sequence[int]] | None = None,
) -> Result:
    options = options or {}
    if policy == "none":
        return Result(None, False, True)
    default = _mask(numa_nodes) or 0
    lists = filter_providers_hints(providers)
    if policy == "single-numa-node":
        lists = [
            [h for h in lst if h.preferred and (h.mask is None or _count(h.mask) == 1)]
            for lst in lists
        ]
        h = _merge(lists, default, _Fitter(False, None))
        mask = None if h.mask == default else h.mask
        return Result(None if mask is None else _ids(mask), h.preferred, h.preferred)
    closest = bool(options.get("prefer-closest-numa-nodes", False))
    h = _merge(lists, default, _Fitter(closest, distances))
    assert h.mask is not None
    admit = True if policy == "best-effort" else h.preferred
    return Result(_ids(h.mask), h.preferred, admit)
