"""CEL device selectors (`spec.selectors[].cel.expression` of DeviceClasses and claim requests),
evaluated with a real CEL implementation: cel-rust, through its Python bindings (PyPI
`common-expression-language`). Never a string match.

The input is what the kube-scheduler gives an expression (k8s.io/dynamic-resource-allocation/cel):
`device.driver`, `device.attributes[<domain>].<id>` (attributes grouped by domain; an unqualified
attribute belongs to the driver's domain; an unknown domain is an empty map),
`device.capacity[<domain>].<id>`, `device.allowMultipleAllocations`. Kubernetes' CEL library
functions that selectors use are provided as functions: `quantity()`, `semver()`,
`compareTo()`, `isGreaterThan()`, `isLessThan()`, `asInteger()`, `asApproximateFloat()`,
`isInteger()`, `lowerAscii()`, `upperAscii()`, `includes()` (list attributes). Quantities are
exact integers (a non-integral capacity or quantity() is refused); versions are semantic-version
strings compared as semantic versions.

Anything pyctl cannot evaluate (a syntax cel-rust lacks, such as `cel.bind` or optional chaining
`.?`, an unknown function, a runtime error, a result that is not a bool) raises
`SelectorUnknown` with the reason: the request is then "unknown", counted and shown, never
guessed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, TypeAlias, TypedDict

import cel

from pyctl.cluster import quantity as q

#: an attribute's value in the CEL input (a list attribute is a list of its values)
CelAttribute: TypeAlias = int | bool | str | list[int | bool | str]
#: a capacity's value in the CEL input (an integer where the quantity is whole)
CelCapacity: TypeAlias = int | float


class CelDevice(TypedDict):
    """What an expression sees as `device`: attributes and capacities by domain, then id."""

    driver: str
    attributes: dict[str, dict[str, CelAttribute]]
    capacity: dict[str, dict[str, CelCapacity]]
    allowMultipleAllocations: bool


class SelectorUnknown(Exception):
    """An expression pyctl cannot evaluate for a device; the message says why."""


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+[0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*)?$"
)


def _semver_key(v: str) -> tuple[Any, ...]:
    m = _SEMVER.match(v)
    if not m:
        raise ValueError(f"not a semantic version: {v!r}")
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        return (major, minor, patch, 1, ())
    ids = tuple((0, int(x), "") if x.isdigit() else (1, 0, x) for x in pre.split("."))
    return (major, minor, patch, 0, ids)


def _quantity(s: str) -> int:
    v = q.parse_quantity(s)
    if v.denominator != 1:
        raise ValueError(f"quantity {s!r} is not a whole number (pyctl compares exact integers)")
    return int(v)


def _semver(s: str) -> str:
    _semver_key(s)
    return s


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, str) and isinstance(b, str):
        ka, kb = _semver_key(a), _semver_key(b)
        return (ka > kb) - (ka < kb)
    if isinstance(a, bool) or isinstance(b, bool):
        raise TypeError("compareTo: not a quantity or version")
    if isinstance(a, int | float) and isinstance(b, int | float):
        return (a > b) - (a < b)
    raise TypeError(f"compareTo: cannot compare {type(a).__name__} with {type(b).__name__}")


def _includes(a: Any, x: Any) -> bool:
    return x in a if isinstance(a, list | tuple) else a == x


def _version_part(i: int) -> Callable[[str], int]:
    def part(v: str) -> int:
        m = _SEMVER.match(v)
        if not m:
            raise ValueError(f"not a semantic version: {v!r}")
        return int(m[i])

    return part


FUNCTIONS: Mapping[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "semver": _semver,
    "isSemver": lambda s: bool(_SEMVER.match(s)),
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "asInteger": lambda a: int(a),
    "asApproximateFloat": lambda a: float(a),
    "isInteger": lambda a: isinstance(a, int) and not isinstance(a, bool),
    "sign": lambda a: (a > 0) - (a < 0),
    "major": _version_part(1),
    "minor": _version_part(2),
    "patch": _version_part(3),
    "lowerAscii": lambda s: s.lower(),
    "upperAscii": lambda s: s.upper(),
    "includes": _includes,
}

#: the domains an expression names literally in `attributes["..."]` / `capacity["..."]`: an
#: unknown domain is an empty map for the scheduler, so these are filled in empty
_DOMAIN_LITERAL = re.compile(r"""(attributes|capacity)\s*\[\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\]""")


@lru_cache(maxsize=4096)
def _compiled(expression: str) -> tuple[cel.Program | None, str, frozenset[str], frozenset[str]]:
    """(program, why it cannot be compiled, attribute domains, capacity domains it names)."""
    if not expression:
        return None, "a selector pyctl does not know (no CEL expression)", frozenset(), frozenset()
    try:
        program = cel.compile(expression)
    except Exception as e:  # cel raises ValueError; anything else is as unknown
        return None, f"CEL: {str(e).splitlines()[0][:200]}", frozenset(), frozenset()
    attrs: set[str] = set()
    caps: set[str] = set()
    for m in _DOMAIN_LITERAL.finditer(expression):
        (attrs if m[1] == "attributes" else caps).add(m[2] if m[2] is not None else m[3])
    return program, "", frozenset(attrs), frozenset(caps)


def check(expression: str) -> str:
    """Why `expression` cannot be compiled ("" if it can)."""
    return _compiled(expression)[1]


def _context() -> cel.Context:
    ctx = cel.Context()
    for name, fn in FUNCTIONS.items():
        ctx.add_function(name, fn)
    return ctx


_CTX: cel.Context | None = None


def evaluate(expression: str, device: CelDevice) -> bool:
    """Whether `device` satisfies `expression`; `SelectorUnknown` if pyctl cannot tell."""
    global _CTX
    program, why, attr_domains, cap_domains = _compiled(expression)
    if program is None:
        raise SelectorUnknown(why)
    dev: dict[str, object] = dict(device)
    attrs = device["attributes"]
    caps = device["capacity"]
    if any(d not in attrs for d in attr_domains):
        dev["attributes"] = {**{d: {} for d in attr_domains}, **attrs}
    if any(d not in caps for d in cap_domains):
        dev["capacity"] = {**{d: {} for d in cap_domains}, **caps}
    if _CTX is None:
        _CTX = _context()
    _CTX.add_variable("device", dev)
    try:
        result = program.execute(_CTX)
    except Exception as e:  # an evaluation error: the scheduler would stop too; pyctl says unknown
        raise SelectorUnknown(f"CEL: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(result, bool):
        raise SelectorUnknown(f"CEL: the result is a {type(result).__name__}, not a bool")
    return result
