"""Kubernetes resource quantities ("1500m", "64Gi", "1e3", "0.5"), parsed exactly.

The grammar is apimachinery's `resource.Quantity`: an optionally signed decimal number followed by
a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal SI suffix (n u m k M G T P E) or a decimal exponent
(e/E and a signed integer). Values are `Fraction`s, so nothing is rounded until a caller asks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Final

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_RE: Final = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suf>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float | Fraction) -> Fraction:
    if isinstance(text, Fraction):
        return text
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(f"not a quantity: {text!r}")
        return Fraction(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"not a quantity: {text!r}")
    if len(text) > 64:
        raise QuantityError(f"malformed quantity {text[:64]!r}... ({len(text)} characters)")
    m = _RE.match(text.strip())
    if not m:
        raise QuantityError(f"malformed quantity {text!r}")
    value = Fraction(m.group("num"))
    if m.group("exp"):
        e = int(m.group("exp")[1:])
        if abs(e) > 30:
            raise QuantityError(f"quantity exponent out of range in {text!r}")
        value *= Fraction(10) ** e
    elif m.group("suf"):
        suf = m.group("suf")
        value *= _BINARY[suf] if suf in _BINARY else _DECIMAL[suf]
    return value


def cpu_milli(text: str | int | float | Fraction) -> int:
    """CPU in millicores, rounded up as Kubernetes does for requests."""
    return math.ceil(parse_quantity(text) * 1000)


def memory_mib(text: str | int | float | Fraction, round_up: bool = True) -> int:
    """Memory in MiB (requests round up, capacities down)."""
    v = parse_quantity(text) / 2**20
    return math.ceil(v) if round_up else math.floor(v)


def count(text: str | int | float | Fraction) -> int:
    """A whole count (extended resources such as nvidia.com/gpu must be integers)."""
    v = parse_quantity(text)
    if v.denominator != 1:
        raise QuantityError(f"expected a whole number, got {text!r}")
    return int(v)


def largest_remainder(shares: Mapping[str, int], to: int) -> dict[str, int]:
    """`shares` scaled to add up to `to` (whole numbers, largest remainder; ties by key)."""
    total = sum(shares.values())
    if total <= 0:
        return dict(shares)
    exact = {k: Fraction(v * to, total) for k, v in shares.items()}
    out = {k: math.floor(v) for k, v in exact.items()}
    rest = to - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:rest]:
        out[k] += 1
    return out
