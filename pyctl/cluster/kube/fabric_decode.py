"""The fabric's sources as records (docs/fabric.md): Kueue's and KAI's `Topology` objects (their
levels' node label keys) and the NVIDIA DRA driver's `ComputeDomainClique` objects (the nodes
of one NVLink clique and its id).

Their lists are read item by item: a level that is not a label key, a daemon without a node name
or whose clique id is not a label value, a node named twice, the items past a bound
(`MAX_LEVELS` levels, `MAX_CLIQUE_NODES` daemons) are left out and counted in the record
(`dropped`); the object stays. A string longer than the API server would hold is one of them
(a label key of 317 characters, a node name of 253, a clique id of 63).
"""

from __future__ import annotations

import re
from typing import Any, Final

from pyctl.cluster.bounds import MAX_CLIQUE_NODES, MAX_KEY_CHARS, MAX_LEVELS, MAX_NAME_CHARS
from pyctl.cluster.kube import wire
from pyctl.cluster.records import CliqueRecord, KaiTopologyRecord, KueueTopologyRecord
from pyctl.core.fabric import valid_domain

#: a qualified label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
#: characters, alphanumeric at both ends (Kueue's and KAI's CRD pattern for `nodeLabel`)
_KEY: Final = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
    re.ASCII,
)
#: a node's name: a DNS subdomain
_NODE: Final = re.compile(r"^[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?$", re.ASCII)


def valid_label_key(key: str) -> bool:
    """Whether `key` is a label key (prefix at most 253 characters, name at most 63)."""
    if len(key) > MAX_KEY_CHARS or not _KEY.match(key):
        return False
    prefix, _, _ = key.rpartition("/")
    return len(prefix) <= MAX_NAME_CHARS


def _levels(items: list[Any] | None) -> tuple[tuple[str, ...], int]:
    levels: list[str] = []
    dropped = 0
    for item in items or ():
        key = item.get("nodeLabel") if isinstance(item, dict) else None
        if (
            not isinstance(key, str)
            or not valid_label_key(key)
            or key in levels
            or len(levels) >= MAX_LEVELS
        ):
            dropped += 1
            continue
        levels.append(key)
    return tuple(levels), dropped


def kueue_topology_record(t: wire.Topology) -> KueueTopologyRecord:
    levels, dropped = _levels(t.spec.levels)
    return KueueTopologyRecord(t.metadata.name, t.metadata.resourceVersion, levels, dropped)


def kai_topology_record(t: wire.Topology) -> KaiTopologyRecord:
    levels, dropped = _levels(t.spec.levels)
    return KaiTopologyRecord(t.metadata.name, t.metadata.resourceVersion, levels, dropped)


def clique_record(c: wire.ComputeDomainClique) -> CliqueRecord:
    members: list[tuple[str, str]] = []
    seen: set[str] = set()
    dropped = 0
    for item in c.daemons or ():
        node = item.get("nodeName") if isinstance(item, dict) else None
        clique = item.get("cliqueID") if isinstance(item, dict) else None
        if (
            not isinstance(node, str)
            or not isinstance(clique, str)
            or len(node) > MAX_NAME_CHARS
            or not _NODE.match(node)
            or not valid_domain(clique)
            or node in seen
            or len(members) >= MAX_CLIQUE_NODES
        ):
            dropped += 1
            continue
        seen.add(node)
        members.append((node, clique))
    meta = c.metadata
    return CliqueRecord(meta.namespace, meta.name, meta.resourceVersion, tuple(members), dropped)
