"""Gangs: pods that must all run inside one topology domain (docs/fabric.md).

Read from what users write on their pods. Today: a required pod affinity term whose topology key
is not the hostname and whose selector matches the pod's own labels (in its own namespace), as a
LeaderWorkerSet group or a hand-written "all of us in one clique" deployment says: the pods that
match the term's selector, in the term's namespaces, and carry the same term form the gang; its
size is how many of them exist now (running or pending, not terminated or being deleted).

The topology key is the gang's level. A gang of one pod is no gang (it fits any domain its pod
fits). Bounded: a gang counts at most `MAX_GANG_PODS` pods.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pyctl.cluster.bounds import MAX_GANG_PODS
from pyctl.cluster.nodefit import HOSTNAME
from pyctl.cluster.records import PodRecord, PodTerm
from pyctl.cluster.selectors import matches
from pyctl.model import Gang


def _own_term(p: PodRecord) -> PodTerm | None:
    """The pod's first required affinity term that binds it to pods like itself in a domain
    wider than a node, if any."""
    c = p.constraints
    if c is None:
        return None
    labels = dict(p.labels)
    for t in c.affinity:
        if t.topology_key == HOSTNAME or not t.topology_key:
            continue
        if t.selector is None:
            continue
        if not t.all_namespaces and t.namespaces and p.namespace not in t.namespaces:
            continue
        if matches(t.selector, labels):
            return t
    return None


def gangs_of(pods: Iterable[PodRecord]) -> dict[str, Gang]:
    """Pod key -> its gang, for every pod in a gang of at least two pods."""
    groups: defaultdict[tuple[str, PodTerm], list[str]] = defaultdict(list)
    for p in pods:
        if p.terminated or p.deleting:
            continue
        t = _own_term(p)
        if t is None:
            continue
        scope = "*" if t.all_namespaces else ",".join(sorted(t.namespaces or (p.namespace,)))
        groups[(scope, t)].append(p.key)
    out: dict[str, Gang] = {}
    for (_, t), keys in groups.items():
        if len(keys) < 2:
            continue
        g = Gang(min(len(keys), MAX_GANG_PODS), t.topology_key)
        for k in keys:
            out[k] = g
    return out
