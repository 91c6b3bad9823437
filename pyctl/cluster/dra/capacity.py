"""DRA consumable capacity (KEP-5075): what a claim's request consumes of a device that allows
several allocations, and what share of the device that is (docs/sharing.md, "DRA consumable
capacity").

The arithmetic is the scheduler's allocator's (k8s.io/dynamic-resource-allocation,
`structured/internal/incubating/consumable_capacity.go`):

- A request consumes, of **every** capacity the device publishes: the amount it asks for,
  rounded up by the capacity's `requestPolicy` (`validRange`: to `min`, then to `min` plus a
  multiple of `step`; `validValues`: to the next valid value); or, for a capacity it does not
  ask for, the policy's `default`, else the whole value.
- The device is skipped when the request names a capacity the device does not publish, when
  the rounded amount breaks the policy (above `max`, off the `step` grid, not a valid value,
  unless it is the default), or when the amounts already consumed plus this one exceed a value.
- The allocation result records the consumed amounts (`consumedCapacity`) and a `shareID`.

pyctl reads a device's used share as the largest fraction consumed over its capacities, in
milli-GPU rounded up (HAMi's rule for memory and cores, generalised); a holder's share is its
own largest fraction. Amounts are exact fractions; the allocator's integer path rounds a
fractional request up to a whole unit first, which matters only for requests that are not whole
numbers of a capacity with a `step`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from pyctl.cluster import quantity as q
from pyctl.cluster.dra_records import CapacityPolicy, Device

#: a whole GPU in milli-GPU
WHOLE: int = 1000


@dataclass(frozen=True, slots=True)
class Capacity:
    """One capacity of a device, with its request policy (all None/empty: no policy)."""

    value: Fraction
    policy: bool = False
    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    min: Fraction | None = None
    max: Fraction | None = None
    step: Fraction | None = None


def capacities(d: Device) -> dict[str, Capacity]:
    """The device's capacities by name, with their request policies."""
    policies: dict[str, CapacityPolicy] = {p.name: p for p in d.policies}
    out: dict[str, Capacity] = {}
    for name, v in d.capacity:
        p = policies.get(name)
        value = q.parse_quantity(v)
        if p is None:
            out[name] = Capacity(value)
            continue

        def opt(s: str) -> Fraction | None:
            return q.parse_quantity(s) if s else None

        out[name] = Capacity(
            value,
            True,
            opt(p.default),
            tuple(sorted(q.parse_quantity(x) for x in p.valid_values)),
            opt(p.min),
            opt(p.max),
            opt(p.step),
        )
    return out


def _rounded(asked: Fraction, c: Capacity) -> Fraction:
    if not c.policy:
        return asked
    if c.min is not None:
        if asked < c.min:
            return c.min
        if c.step is None or c.step <= 0:
            return asked
        return c.min + math.ceil((asked - c.min) / c.step) * c.step
    if c.valid_values:
        return next((v for v in c.valid_values if asked <= v), asked)
    return asked


def _breaks_policy(v: Fraction, c: Capacity) -> bool:
    if not c.policy or (c.default is not None and v == c.default):
        return False
    if c.min is not None or c.max is not None or c.step is not None:
        if c.max is not None and v > c.max:
            return True
        if c.step is not None and c.step > 0:
            return (v - (c.min or 0)) % c.step != 0
        return False
    if c.valid_values:
        return v not in c.valid_values
    return False


def consumed(
    caps: Mapping[str, Capacity], asked: Iterable[tuple[str, str]]
) -> dict[str, Fraction] | None:
    """What a request asking `asked` ((capacity name, quantity)) consumes of a device with
    `caps`, capacity by capacity; None when the device cannot serve it at all (a capacity it
    does not publish, or an amount its policy does not allow)."""
    want: dict[str, Fraction] = {}
    for name, text in asked:
        if name not in caps:
            return None
        want[name] = q.parse_quantity(text)
    out: dict[str, Fraction] = {}
    for name, c in caps.items():
        a = want.get(name)
        v = (c.default if c.default is not None else c.value) if a is None else _rounded(a, c)
        if v < 0 or _breaks_policy(v, c):
            return None
        out[name] = v
    return out


def fits(
    caps: Mapping[str, Capacity], used: Mapping[str, Fraction], more: Mapping[str, Fraction]
) -> bool:
    """Whether `more` fits beside what is `used` under every capacity's value."""
    return all(
        used.get(n, Fraction(0)) + more.get(n, Fraction(0)) <= c.value for n, c in caps.items()
    )


def share(caps: Mapping[str, Capacity], amounts: Mapping[str, Fraction]) -> int:
    """The share of the device `amounts` take, in milli-GPU: the largest fraction over its
    capacities (with a positive value), rounded up, at most a whole GPU. A device without
    capacities is taken whole by any allocation."""
    best = 0
    counted = False
    for name, c in caps.items():
        if c.value <= 0:
            continue
        counted = True
        a = amounts.get(name, Fraction(0))
        best = max(best, math.ceil(WHOLE * a / c.value))
    if not counted:
        return WHOLE
    return min(WHOLE, best)


def amounts(pairs: Iterable[tuple[str, str]]) -> dict[str, Fraction]:
    """(name, quantity) pairs of a record as exact amounts."""
    return {n: q.parse_quantity(v) for n, v in pairs}
