"""Which pods shape the workload M, and how much any one shape may weigh.

M (FGD's target workload) is derived from the observed GPU and MIG pods, pending ones included,
so whoever can create pods could steer what pyctl scores and compacts for. `WorkloadScope` says
which pods count (namespaces included and excluded, a label selector; the configuration's
`workload` section, which by default leaves out kube-system) and caps every shape's weight
(`cap_weights`): no shape weighs more than `max_shape_weight` of M, however many pods ask for it.
A pod whose shape the core cannot model is never part of M (`cluster.translate.pod_shape_problem`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from pyctl.cluster.records import PodRecord, Selector
from pyctl.cluster.selectors import matches
from pyctl.model import Shape, Workload


@dataclass(frozen=True)
class WorkloadScope:
    #: only pods of these namespaces (empty: every namespace)
    namespaces: frozenset[str] = frozenset()
    #: never pods of these namespaces
    excluded_namespaces: frozenset[str] = frozenset()
    #: only pods whose labels match (None: every pod)
    selector: Selector | None = None
    #: the largest share of M one shape may have (1: no cap)
    max_shape_weight: float = 1.0

    def admits(self, p: PodRecord) -> bool:
        ns = p.namespace
        if ns in self.excluded_namespaces or (self.namespaces and ns not in self.namespaces):
            return False
        return self.selector is None or matches(self.selector, dict(p.labels))

    def pods(self, pods: Iterable[PodRecord]) -> list[PodRecord]:
        return [p for p in pods if self.admits(p)]


def cap_weights(shapes: Iterable[Shape], cap: float) -> tuple[Shape, ...]:
    """The shapes with weights normalised to 1 and none above `cap`: a shape over the cap gets
    the cap, and what it gave up goes to the others in proportion to their weights (water
    filling). With fewer than 1/cap shapes, they weigh the same."""
    out = list(shapes)
    n = len(out)
    total = sum(s.weight for s in out)
    if n == 0 or total <= 0:
        return tuple(out)
    if cap * n <= 1.0:
        return tuple(replace(s, weight=1.0 / n) for s in out)
    w = [s.weight / total for s in out]
    capped: set[int] = set()
    while True:
        free = [i for i in range(n) if i not in capped]
        left = 1.0 - cap * len(capped)
        mass = sum(w[i] for i in free)
        if not free or mass <= 0:
            return tuple(replace(s, weight=1.0 / n) for s in out)
        scaled = {i: w[i] * left / mass for i in free}
        over = {i for i, v in scaled.items() if v > cap}
        if not over:
            break
        capped |= over
    return tuple(replace(s, weight=cap if i in capped else scaled[i]) for i, s in enumerate(out))


def capped_workload(workload: Workload, cap: float) -> Workload:
    return Workload(cap_weights(workload.shapes, cap)) if cap < 1.0 else workload
