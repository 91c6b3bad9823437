"""The fabric's sources as records (docs/fabric.md): Kueue's and KAI's `Topology` objects (their
levels' node label keys), the NVIDIA DRA driver's `ComputeDomainClique` objects (the nodes
of one NVLink clique and its id), Volcano's `HyperNode` objects (one domain of a tier and its
members) and `PodGroup` objects (a gang where its `networkTopology` is hard); and Kueue's
`Workload` objects (the pods of a gang Kueue holds back, and whether for something room does
not give).

Their lists are read item by item: a level that is not a label key, a daemon without a node name
or whose clique id is not a label value, a node named twice, the items past a bound
(`MAX_LEVELS` levels, `MAX_CLIQUE_NODES` daemons) are left out and counted in the record
(`dropped`); the object stays. A string longer than the API server would hold is one of them
(a label key of 317 characters, a node name of 253, a clique id of 63).
"""

from __future__ import annotations

import importlib
import re
from typing import Any, Final

import msgspec

from pyctl.cluster.bounds import (
    MAX_CLIQUE_NODES,
    MAX_GANG_PODS,
    MAX_HYPERNODE_MEMBERS,
    MAX_KEY_CHARS,
    MAX_LEVELS,
    MAX_NAME_CHARS,
    MAX_PATTERN_CHARS,
    MAX_SUB_GROUP_KEYS,
    MAX_SUB_GROUPS,
)
from pyctl.cluster.gangs import kueue_held
from pyctl.cluster.kube import wire
from pyctl.cluster.records import (
    CliqueRecord,
    HyperNodeRecord,
    KaiTopologyRecord,
    KueueTopologyRecord,
    PodGroupRecord,
    Requirement,
    Selector,
    SubGroupRecord,
    WorkloadRecord,
)
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


# -- Volcano: HyperNodes and PodGroups

#: Python's own regular-expression parser (`re._parser`, `re._constants`: no typed public API)
sre_parse: Any = importlib.import_module("re._parser")
sre_constants: Any = importlib.import_module("re._constants")

_REPEATS: Final = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
_UNSAFE: Final = (
    sre_constants.GROUPREF,
    sre_constants.GROUPREF_EXISTS,
    sre_constants.ASSERT,
    sre_constants.ASSERT_NOT,
)


def _shape(items: Any, inside_repeat: bool) -> int | None:
    """The variable-length repeats of a parsed pattern, or None if it can backtrack badly: a
    repeat inside a repeat, an alternation inside a repeat, a back-reference or a look-around."""
    count = 0
    for op, av in items:
        if op in _UNSAFE:
            return None
        if op in _REPEATS:
            low, high, sub = av
            if inside_repeat:
                return None
            inner = _shape(sub, True)
            if inner is None:
                return None
            count += 1 if low != high else 0
        elif op is sre_constants.BRANCH:
            if inside_repeat:
                return None
            for alt in av[1]:
                inner = _shape(alt, inside_repeat)
                if inner is None:
                    return None
                count += inner
        elif op is sre_constants.SUBPATTERN:
            inner = _shape(av[-1], inside_repeat)
            if inner is None:
                return None
            count += inner
        elif op not in (
            sre_constants.LITERAL,
            sre_constants.NOT_LITERAL,
            sre_constants.ANY,
            sre_constants.IN,
            sre_constants.AT,
            sre_constants.CATEGORY,
        ):
            return None  # anything else (an atomic group, a possessive repeat): not read
    return count


def safe_pattern(pattern: object) -> re.Pattern[str] | None:
    """A `regexMatch` pattern compiled, if pyctl reads it: at most `MAX_PATTERN_CHARS`
    characters, valid, and at most one variable-length repeat with no repeat, alternation,
    back-reference or look-around inside a repeat, so that a search on a node's name (at most
    253 characters) takes at most quadratic time in it (Python's `re` backtracks; Go's, which
    Volcano uses, does not). None: not read (counted by the caller)."""
    if not isinstance(pattern, str) or not 0 < len(pattern) <= MAX_PATTERN_CHARS:
        return None
    try:
        parsed = sre_parse.parse(pattern)
        shape = _shape(parsed, False)
        if shape is None or shape > 1:
            return None
        return re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


_OPERATORS: Final = frozenset(("In", "NotIn", "Exists", "DoesNotExist"))


def _label_selector(raw: object) -> Selector | None:
    """A `labelMatch` (a metav1.LabelSelector) whose keys and values are label keys and values
    and whose operators are a label selector's; None if not."""
    try:
        sel = msgspec.convert(raw, wire.LabelSelector)
    except msgspec.ValidationError:
        return None
    if not sel.matchLabels and not sel.matchExpressions:
        return None  # Volcano matches no node with it (nodeMatchSelector)
    for k, v in sel.matchLabels.items():
        if not valid_label_key(k) or not (v == "" or valid_domain(v)):
            return None
    for r in sel.matchExpressions:
        if not valid_label_key(r.key) or r.operator not in _OPERATORS:
            return None
        if (r.operator in ("In", "NotIn")) != bool(r.values):
            return None
    return Selector(
        tuple(sorted(sel.matchLabels.items())),
        tuple(Requirement(r.key, r.operator, tuple(r.values)) for r in sel.matchExpressions),
    )


def _dns_name(name: object) -> str | None:
    if isinstance(name, str) and len(name) <= MAX_NAME_CHARS and _NODE.match(name):
        return name
    return None


def hypernode_record(h: wire.HyperNode) -> HyperNodeRecord:
    tier = h.spec.tier
    if isinstance(tier, bool) or not isinstance(tier, int) or not 1 <= tier <= MAX_LEVELS:
        tier = 0
    tier_name = h.spec.tierName
    if not isinstance(tier_name, str) or len(tier_name) > MAX_NAME_CHARS:
        tier_name = ""
    nodes: list[str] = []
    patterns: list[str] = []
    selectors: list[Selector] = []
    children: list[str] = []
    dropped = 0
    for item in h.spec.members or ():
        kept = len(nodes) + len(patterns) + len(selectors) + len(children)
        sel = item.get("selector") if isinstance(item, dict) else None
        kind = item.get("type") if isinstance(item, dict) else None
        if (
            not isinstance(sel, dict)
            or kind not in ("Node", "HyperNode")
            or kept >= (MAX_HYPERNODE_MEMBERS)
        ):
            dropped += 1
            continue
        given = [k for k in ("exactMatch", "regexMatch", "labelMatch") if sel.get(k) is not None]
        if len(given) != 1:
            dropped += 1
            continue
        how = sel[given[0]]
        if given[0] == "exactMatch":
            name = _dns_name(how.get("name") if isinstance(how, dict) else None)
            into = nodes if kind == "Node" else children
            if name is None or name in into:
                dropped += 1
            else:
                into.append(name)
        elif kind != "Node":  # a HyperNode member is named exactly
            dropped += 1
        elif given[0] == "regexMatch":
            pattern = how.get("pattern") if isinstance(how, dict) else None
            if safe_pattern(pattern) is None or pattern in patterns:
                dropped += 1
            else:
                patterns.append(str(pattern))
        else:
            selector = _label_selector(how)
            if selector is None:
                dropped += 1
            else:
                selectors.append(selector)
    return HyperNodeRecord(
        h.metadata.name,
        h.metadata.resourceVersion,
        tier,
        tier_name,
        tuple(nodes),
        tuple(patterns),
        tuple(selectors),
        tuple(children),
        dropped,
    )


def _hard(topo: Any) -> bool:
    """Whether a `networkTopology` is hard: the CRD's default mode is hard (the API server
    fills it in; a dump may omit it)."""
    return isinstance(topo, dict) and topo.get("mode", "hard") == "hard"


def _tier(topo: dict[str, Any]) -> tuple[int, str]:
    """A `networkTopology`'s `highestTierAllowed` (0: none or out of range) and
    `highestTierName` ("": none or too long)."""
    tier, tier_name = 0, ""
    high = topo.get("highestTierAllowed")
    if isinstance(high, int) and not isinstance(high, bool) and 1 <= high <= MAX_LEVELS:
        tier = high
    named = topo.get("highestTierName")
    if isinstance(named, str) and len(named) <= MAX_NAME_CHARS:
        tier_name = named
    return tier, tier_name


def _sub_group(raw: object) -> SubGroupRecord | None:
    """One `subGroupPolicy` entry; None where pyctl cannot read it (its name, selector, keys or
    size are not what the CRD allows)."""
    if not isinstance(raw, dict):
        return None
    name = raw.get("name", "")
    keys = raw.get("matchLabelKeys") or []
    size = raw.get("subGroupSize", 1)
    if (
        not isinstance(name, str)
        or len(name) > MAX_NAME_CHARS
        or not isinstance(keys, list)
        or len(keys) > MAX_SUB_GROUP_KEYS
        or not all(isinstance(k, str) and valid_label_key(k) for k in keys)
        or isinstance(size, bool)
        or not isinstance(size, int)
        or not 1 <= size <= MAX_GANG_PODS
    ):
        return None
    selector: Selector | None = None
    if raw.get("labelSelector") is not None:
        selector = _label_selector(raw["labelSelector"])
        if selector is None and raw["labelSelector"] != {}:
            return None
        selector = selector or Selector()  # an empty one selects every pod
    topo = raw.get("networkTopology")
    hard = _hard(topo)
    tier, tier_name = _tier(topo) if isinstance(topo, dict) and hard else (0, "")
    return SubGroupRecord(name, size, hard, tier, tier_name, selector, tuple(keys))


def podgroup_record(g: wire.PodGroup) -> PodGroupRecord:
    """Its minMember, its own topology and its `subGroupPolicy` (`SubGroupRecord`s; entries
    pyctl cannot read, or past `MAX_SUB_GROUPS`, are counted in `sub_unread`)."""
    meta = g.metadata
    size = g.spec.minMember
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_GANG_PODS:
        size = 0
    topo = g.spec.networkTopology
    hard = _hard(topo)
    tier, tier_name = _tier(topo) if isinstance(topo, dict) else (0, "")
    subs: list[SubGroupRecord] = []
    unread = max(0, len(g.spec.subGroupPolicy) - MAX_SUB_GROUPS)
    # whether an entry pyctl cannot read may give its sub-groups a topology
    topology_unread = unread > 0
    for raw in g.spec.subGroupPolicy[:MAX_SUB_GROUPS]:
        got = _sub_group(raw)
        if got is None:
            unread += 1
            topology_unread |= not isinstance(raw, dict) or _hard(raw.get("networkTopology"))
        else:
            subs.append(got)
    if not any(s.hard for s in subs):
        subs = []  # no entry gives a topology: none changes what pyctl does
        unread = unread if topology_unread else 0
    return PodGroupRecord(
        meta.namespace,
        meta.name,
        meta.resourceVersion,
        size,
        hard,
        tier,
        tier_name,
        tuple(subs),
        unread,
    )


def workload_record(w: wire.Workload) -> WorkloadRecord:
    """Its owners of kind Pod (a pod group's pods; an owner without a name is left out) and why
    Kueue holds it back if room does not fix it (`gangs.kueue_held`; a message read to its first
    4,096 characters: Kueue's reasons come first)."""
    meta = w.metadata
    pods = tuple(sorted({o.name for o in meta.ownerReferences if o.kind == "Pod" and o.name}))
    held = kueue_held((c.type, c.status, c.message[:4096]) for c in w.status.conditions)
    return WorkloadRecord(meta.namespace, meta.name, meta.resourceVersion, pods, held)
