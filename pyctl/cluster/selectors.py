"""Kubernetes label selectors: matching a `Selector` (or a node selector requirement) against
labels, and parsing the string form users write in flags and configuration
(`app=web,tier!=cache,zone in (a,b),!canary`, as `kubectl -l` takes it)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from pyctl.cluster.records import Requirement, Selector

#: the longest selector string read (a real one is a few hundred characters)
MAX_SELECTOR_CHARS = 4096
_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQ = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


class SelectorError(ValueError):
    """A label selector that cannot be read; the message says where."""


def requirement_matches(r: Requirement, labels: Mapping[str, str]) -> bool:
    """One requirement against labels (In, NotIn, Exists, DoesNotExist, Gt, Lt)."""
    op = r.operator
    has = r.key in labels
    if op == "In":
        return has and labels[r.key] in r.values
    if op == "NotIn":
        return not has or labels[r.key] not in r.values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt"):
        if not has or len(r.values) != 1:
            return False
        try:
            a, b = int(labels[r.key]), int(r.values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False  # an operator the API server would have refused: matches nothing


def matches(selector: Selector | None, labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy the selector. None (no selector) matches nothing, as the API's
    nil LabelSelector does; an empty one matches everything."""
    if selector is None:
        return False
    return all(labels.get(k) == v for k, v in selector.match_labels) and all(
        requirement_matches(r, labels) for r in selector.match_expressions
    )


def parse_selector(text: str) -> Selector:
    """The string form of a label selector. Raises `SelectorError`."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"label selector longer than {MAX_SELECTOR_CHARS} characters")
    eq: list[tuple[str, str]] = []
    exprs: list[Requirement] = []
    for part in _split(text):
        if not part.strip():
            continue
        if m := _SET.match(part):
            values = tuple(sorted(v.strip() for v in m.group(4).split(",") if v.strip()))
            exprs.append(Requirement(m.group(1), "In" if m.group(3) == "in" else "NotIn", values))
        elif m := _EQ.match(part):
            key, op, value = m.group(1), m.group(3), m.group(4)
            if op == "!=":
                exprs.append(Requirement(key, "NotIn", (value,)))
            else:
                eq.append((key, value))
        elif m := _EXISTS.match(part):
            exprs.append(Requirement(m.group(2), "DoesNotExist" if m.group(1) else "Exists"))
        else:
            raise SelectorError(f"label selector {text!r}: cannot read {part.strip()!r}")
    return Selector(tuple(sorted(eq)), tuple(exprs))


def _split(text: str) -> list[str]:
    """Split on the commas outside parentheses."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"label selector {text!r}: unbalanced ')'")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError(f"label selector {text!r}: unbalanced '('")
    out.append("".join(cur))
    return out
