"""The placement advice's view of the fabric: each topology domain's idle GPU, kept node by node,
and the order in which the advice breaks ties between nodes of equal rank (docs/fabric.md).

The rule is a hierarchical tightest fit (the rule Kueue #10406 proposed for pods without a
topology request): among nodes the policy ranks alike, the one whose domain has the least idle GPU
comes first, level by level from the narrowest (an NVLink clique) to the widest (a zone); a node
in no domain of a level comes before every domain of it (using it breaks none). So small and
unconstrained pods fill domains already broken and leave whole ones whole. A gang's pod
(`Shape.gang`: `pods` pods in one domain of its level) is steered into the tightest domain of its
level whose idle GPU can hold the whole gang (a necessary condition: the fabric pass knows
whether its nodes can); domains that cannot come after every one that can, and nodes in no
domain of the gang's level after those.

The rank itself (FGD's score, then CPU, then the share left: `rust/src/placement`) is computed per
node, kept per node model (`RankTable`), and never depends on other nodes; the domain order is
applied when candidates are compared, from this index, so a neighbour's change never makes a kept
rank stale.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Final

from pyctl.core.fabric import valid_domain
from pyctl.model import GPU_MILLI, Shape

#: a node in no domain of a level: before every domain (using it breaks none)
NO_DOMAIN: Final = -1

#: a node's row: its domain per level (None: none) and its idle GPU (milli)
DomainRow = tuple[tuple[str | None, ...], int]


class DomainIdle:
    """Per level (label keys, narrowest first), each domain's idle GPU (milli), updated one node
    at a time (`update`) as the reconciler re-scores it. A label value that is not a valid label
    value is no domain (as in the fabric pass). Written by the reconciler, read by the
    extender's threads: a lock keeps each read whole."""

    def __init__(self, levels: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self.levels: tuple[str, ...] = tuple(levels)
        #: node -> (its domain per level, its idle GPU milli)
        self._nodes: dict[str, tuple[tuple[str | None, ...], int]] = {}
        #: per level: domain -> [idle GPU milli, nodes] of its nodes
        self._idle: list[dict[str, list[int]]] = [{} for _ in self.levels]

    def relevel(
        self, levels: Iterable[str], nodes: Iterable[tuple[str, Mapping[str, str], int]]
    ) -> None:
        """Start again with `levels`, from `nodes` (name, labels, idle GPU milli), read while
        the index is locked: an `update` meanwhile (the reconciler re-scoring a node) waits and
        then applies to the new index, never to one about to be replaced."""
        fresh = DomainIdle(levels)
        with self._lock:
            for name, labels, idle in nodes:
                fresh._update(name, labels, idle)
            self.levels, self._nodes, self._idle = fresh.levels, fresh._nodes, fresh._idle

    def rows(self) -> dict[str, DomainRow]:
        """Every node's row (a copy): what another process needs to keep the same index."""
        with self._lock:
            return dict(self._nodes)

    def apply_rows(
        self,
        levels: tuple[str, ...] | None,
        rows: Mapping[str, DomainRow],
        gone: Iterable[str] = (),
    ) -> None:
        """Rows from `rows` (another index's), nodes `gone` removed; with `levels`, the index
        starts again at those levels from `rows` alone."""
        with self._lock:
            if levels is not None:
                self.levels, self._nodes = tuple(levels), {}
                self._idle = [{} for _ in self.levels]
            for name in gone:
                self._put(name, None)
            for name, row in rows.items():
                if len(row[0]) == len(self.levels):
                    self._put(name, row)

    def update(self, name: str, labels: Mapping[str, str] | None, idle_milli: int) -> None:
        """Node `name` now has `labels` and `idle_milli` idle GPU; `labels` None: it is gone."""
        with self._lock:
            self._update(name, labels, idle_milli)

    def _update(self, name: str, labels: Mapping[str, str] | None, idle_milli: int) -> None:
        if labels is None:
            self._put(name, None)
            return
        domains = tuple(
            v if (v := labels.get(key)) is not None and valid_domain(v) else None
            for key in self.levels
        )
        self._put(name, (domains, max(idle_milli, 0)))

    def _put(self, name: str, row: DomainRow | None) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            for level, domain in zip(self._idle, old[0], strict=True):
                if domain is not None:
                    total = level[domain]
                    total[0] -= old[1]
                    total[1] -= 1
                    if total[1] == 0:
                        del level[domain]
        if row is None:
            return
        domains, idle = row
        self._nodes[name] = row
        for level, domain in zip(self._idle, domains, strict=True):
            if domain is not None:
                total = level.setdefault(domain, [0, 0])
                total[0] += idle
                total[1] += 1

    def idle(self, level: str, domain: str) -> int:
        """The idle GPU (milli) of `domain` at `level` (0 if unknown)."""
        with self._lock:
            if level not in self.levels:
                return 0
            total = self._idle[self.levels.index(level)].get(domain)
            return total[0] if total is not None else 0

    def domains(self, level: str) -> list[str]:
        """The domains of `level` that have a node, by name."""
        with self._lock:
            return sorted(self._idle[self.levels.index(level)]) if level in self.levels else []

    def __len__(self) -> int:
        return len(self._nodes)

    def order(self, names: Iterable[str], shape: Shape | None = None) -> list[str]:
        """`names` in the tie order for a pod of `shape` (`key`, then by name); by name alone
        while no node is in any domain (a cluster without topology labels pays nothing)."""
        with self._lock:
            active = self._active(shape)
            if not active:
                return sorted(names)
            return sorted(names, key=lambda n: (self._key(n, active), n))

    def key(self, name: str, shape: Shape | None = None) -> tuple[int, ...]:
        """Node `name`'s place in the tie order for a pod of `shape`: smaller first (a node not
        known here first: it is not modelled, so the policy ranks it nowhere)."""
        with self._lock:
            return self._key(name, self._active(shape))

    def _active(self, shape: Shape | None) -> list[tuple[int, dict[str, list[int]], int | None]]:
        """The levels some node is in (the others order nothing): (position, domains, the idle
        GPU a gang of `shape` at that level needs, else None)."""
        gang = shape.gang if shape is not None else None
        out = []
        for i, (key, level) in enumerate(zip(self.levels, self._idle, strict=True)):
            if level:
                need = None
                if gang is not None and shape is not None and gang.key == key:
                    need = gang.pods * shape.gpus * GPU_MILLI
                out.append((i, level, need))
        return out

    def _key(
        self, name: str, active: list[tuple[int, dict[str, list[int]], int | None]]
    ) -> tuple[int, ...]:
        node = self._nodes.get(name)
        if node is None:
            return ()
        domains = node[0]
        out: list[int] = []
        for i, level, need in active:
            domain = domains[i]
            if domain is None:
                # no domain: costs no domain anything, but holds no gang of this level
                out += (0 if need is None else 2, NO_DOMAIN)
                continue
            idle = level[domain][0]
            out += (int(need is not None and idle < need), idle)
        return tuple(out)
