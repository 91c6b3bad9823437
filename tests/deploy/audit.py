"""What a ServiceAccount did, from the API server's audit log, against what its RBAC grants.

`calls` reads the audit events (JSON lines, one per request at Metadata level) of one user into
`Call`s; `grants` expands Roles/ClusterRoles (as the API server returns them) bound to that user
into `Grant`s; `covering` says which grant authorizes a call the way RBAC does (API group,
resource/subresource, verb, namespace for a Role, resourceNames). The least-privilege test then
asserts that no call was refused and that every grant is used by some call."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    #: resource[/subresource], or the URL of a non-resource request
    resource: str
    namespace: str
    name: str
    code: int

    @property
    def non_resource(self) -> bool:
        return self.resource.startswith("/")


@dataclass(frozen=True)
class Grant:
    verb: str
    group: str
    resource: str
    #: "*" for a ClusterRole bound cluster-wide
    namespace: str
    names: tuple[str, ...]
    #: Kind/namespace/name of the role
    role: str

    def covers(self, c: Call) -> bool:
        if c.non_resource or self.verb not in (c.verb, "*"):
            return False
        if self.group != c.group or self.resource not in (c.resource, "*"):
            return False
        if self.namespace != "*" and self.namespace != c.namespace:
            return False
        return not self.names or c.name in self.names

    def label(self) -> str:
        where = "cluster-wide" if self.namespace == "*" else f"in {self.namespace}"
        names = f" {list(self.names)}" if self.names else ""
        group = self.group or "core"
        return f"{self.verb} {group}/{self.resource}{names} {where}"


def calls(path: Path, username: str, start: int = 0, end: int | None = None) -> list[Call]:
    """The requests of `username` between byte offsets `start` and `end` of the audit log (one
    Call per audit ID; watches log a ResponseStarted and a ResponseComplete event)."""
    data = path.read_bytes()[start:end]
    seen: dict[str, Call] = {}
    for line in data.splitlines():
        if not line.strip():
            continue
        ev = json.loads(line)
        if ev.get("user", {}).get("username") != username:
            continue
        ref = ev.get("objectRef")
        code = int((ev.get("responseStatus") or {}).get("code", 0))
        if ref:
            res = ref.get("resource", "")
            if ref.get("subresource"):
                res += "/" + ref["subresource"]
            call = Call(
                ev["verb"],
                ref.get("apiGroup", ""),
                res,
                ref.get("namespace", ""),
                ref.get("name", ""),
                code,
            )
        else:
            url = ev["requestURI"].split("?")[0]
            call = Call(ev["verb"], "", url, "", "", code)
        prev = seen.get(ev["auditID"])
        if prev is None or (prev.code == 0 and code):
            seen[ev["auditID"]] = call
    return list(seen.values())


def _subject_is(subject: Mapping[str, Any], namespace: str, account: str) -> bool:
    return (
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == account
        and subject.get("namespace") == namespace
    )


def grants(
    roles: Iterable[Mapping[str, Any]],
    bindings: Iterable[Mapping[str, Any]],
    namespace: str,
    account: str,
) -> list[Grant]:
    """The grants of the ServiceAccount through `bindings` (RoleBindings and
    ClusterRoleBindings) to `roles` (Roles and ClusterRoles), one per verb/group/resource."""
    by_ref = {
        (r["kind"], r["metadata"].get("namespace", ""), r["metadata"]["name"]): r for r in roles
    }
    out: list[Grant] = []
    for b in bindings:
        if not any(_subject_is(s, namespace, account) for s in b.get("subjects") or []):
            continue
        bns = b["metadata"].get("namespace", "")
        ref = b["roleRef"]
        role_ns = bns if ref["kind"] == "Role" else ""
        role = by_ref.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, f"{b['kind']} {b['metadata']['name']} binds a missing {ref}"
        scope = bns if b["kind"] == "RoleBinding" else "*"
        tag = f"{ref['kind']}/{role_ns + '/' if role_ns else ''}{ref['name']}"
        for rule in role.get("rules") or []:
            assert not rule.get("nonResourceURLs"), f"{tag}: non-resource URLs granted"
            for g in rule.get("apiGroups") or []:
                for r in rule.get("resources") or []:
                    for v in rule.get("verbs") or []:
                        names = tuple(rule.get("resourceNames") or ())
                        out.append(Grant(v, g, r, scope, names, tag))
    return out


def table(found: Sequence[Call], granted: Sequence[Grant], defaults: Mapping[str, str]) -> str:
    """The calls counted per (verb, resource, namespace, status), with the grants allowing each."""
    rows: Counter[tuple[str, str, str, str, str]] = Counter()
    for c in found:
        by = [g.role for g in granted if g.covers(c)]
        if c.non_resource:
            allowed = defaults.get(c.resource, "(no grant)")
        else:
            allowed = ", ".join(sorted(set(by))) or "(no grant)"
        res = f"{c.group + '/' if c.group else ''}{c.resource}"
        rows[(c.verb, res, c.namespace or "-", str(c.code), allowed)] += 1
    head = ("verb", "resource", "namespace", "code", "granted by", "calls")
    lines = [head, *[(*k, str(n)) for k, n in sorted(rows.items())]]
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in lines)
