"""Where the fabric pass's levels and cliques come from besides node labels (docs/fabric.md):
Kueue's and KAI's `Topology` objects add their levels to the configured ones, the NVIDIA
DRA driver's `ComputeDomainClique` objects give a node its NVLink clique
(`nvidia.com/gpu.clique`) where the node has no such label, and Volcano's `HyperNode` tree gives
each node a domain at each tier (a synthetic level per tier, `tier_key`), which Volcano's
PodGroups with a hard `networkTopology` name as their gangs' level (`volcano_gangs`).

Each is read from the controller's cache, built again when one of those objects changes
(`ClusterCache.fabric_version`). What is hostile is bounded and counted, never fatal: levels past
`MAX_LEVELS`, clique objects past `MAX_CLIQUE_OBJECTS`, the daemons an object names that could not
be read (`CliqueRecord.dropped`), a node two objects put in different cliques (it gets none from
them), a node whose label disagrees with the objects (the label wins).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyctl.cluster.bounds import MAX_CLIQUE_OBJECTS, MAX_HYPERNODE_PATTERNS, MAX_HYPERNODES
from pyctl.cluster.gangs import SubGroupGang, VolcanoGang
from pyctl.cluster.kube.fabric_decode import safe_pattern
from pyctl.cluster.records import (
    CliqueRecord,
    HyperNodeRecord,
    PodGroupRecord,
    Selector,
    TopologyRecord,
)
from pyctl.cluster.selectors import matches
from pyctl.core.fabric import Levels, merge_levels

#: the label a clique object fills in
CLIQUE_LABEL = "nvidia.com/gpu.clique"


def topology_source(kind: str, r: TopologyRecord) -> str:
    """How a `Topology` object is named as a level's source: `kueue/<name>` or `kai/<name>`."""
    return f"{'kueue' if kind == 'KueueTopology' else 'kai'}/{r.name}"


#: the source of the HyperNode tiers' levels (`pyctl_level_source`)
VOLCANO_SOURCE = "volcano/hypernodes"


def tier_key(tier: int) -> str:
    """The synthetic level of Volcano's HyperNode tier `tier` (1 the narrowest): a node's domain
    there is the name of the tier's HyperNode that holds it."""
    return f"volcano.sh/hypernode-tier-{tier}"


def fabric_levels(
    configured: Iterable[str],
    kueue: Iterable[TopologyRecord] = (),
    kai: Iterable[TopologyRecord] = (),
    tiers: Iterable[int] = (),
) -> Levels:
    """The configured levels, then Kueue's `Topology` objects' and then KAI's (each in name
    order), then the HyperNodes' tiers (narrowest first), each not yet among them
    (`pyctl.core.fabric.merge_levels`)."""
    objects = [
        (topology_source(kind, r), r.levels)
        for kind, records in (("KueueTopology", kueue), ("KaiTopology", kai))
        for r in sorted(records, key=lambda r: r.name)
    ]
    # merge_levels takes an object's levels widest first
    objects.append((VOLCANO_SOURCE, tuple(tier_key(t) for t in sorted(set(tiers), reverse=True))))
    return merge_levels(configured, objects)


class HyperNodeFill:
    """Each node's domain at each tier of Volcano's `HyperNode` tree: the name of the tier-t
    HyperNode that holds it, directly (a member `Node` by name, pattern or labels) or through
    the HyperNodes below it. Bounded and counted: at most `MAX_HYPERNODES` objects (in name
    order) and `MAX_HYPERNODE_PATTERNS` patterns in all; a node two HyperNodes of one tier hold
    has no domain at that tier (`conflicts`); a cycle of HyperNodes is walked once. A node's
    domains are worked out when first asked for and kept (the object is built again when a
    HyperNode changes)."""

    def __init__(self, records: Iterable[HyperNodeRecord] = ()) -> None:
        ordered = sorted(records, key=lambda r: r.name)
        kept = ordered[:MAX_HYPERNODES]
        self.objects = len(kept)
        self.objects_left_out = len(ordered) - len(kept)
        self.items_left_out = sum(r.dropped for r in kept)
        self.patterns_left_out = 0
        self._tier = {r.name: r.tier for r in kept if r.tier}
        self.tiers: tuple[int, ...] = tuple(sorted(set(self._tier.values())))
        named: defaultdict[str, set[int]] = defaultdict(set)
        for r in kept:
            if r.tier and r.tier_name:
                named[r.tier_name].add(r.tier)
        #: tierName -> its tier, where every HyperNode of that name has the same tier
        self.tier_names: dict[str, int] = {
            n: next(iter(t)) for n, t in named.items() if len(t) == 1
        }
        self._parents: defaultdict[str, list[str]] = defaultdict(list)
        self._exact: defaultdict[str, list[str]] = defaultdict(list)
        self._patterns: list[tuple[re.Pattern[str], str]] = []
        self._selectors: list[tuple[Selector, str]] = []
        for r in kept:
            for child in r.children:
                self._parents[child].append(r.name)
            for node in r.nodes:
                self._exact[node].append(r.name)
            for p in r.patterns:
                compiled = safe_pattern(p) if len(self._patterns) < MAX_HYPERNODE_PATTERNS else None
                if compiled is None:
                    self.patterns_left_out += 1
                else:
                    self._patterns.append((compiled, r.name))
            for sel in r.label_selectors:
                self._selectors.append((sel, r.name))
        self._memo: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, str]] = {}
        self._conflicted: set[str] = set()

    @property
    def conflicts(self) -> int:
        """Nodes (of those asked for) that two HyperNodes of one tier hold."""
        return len(self._conflicted)

    def domains(self, node: str, labels: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The node's domain at each tier it has one: `tier_key(t)` -> the HyperNode's name."""
        if not self._tier:
            return {}
        pairs = tuple(labels) if self._selectors else ()
        got = self._memo.get((node, pairs))
        if got is not None:
            return got
        direct = list(self._exact.get(node, ()))
        direct += [hn for p, hn in self._patterns if p.search(node)]
        if self._selectors:
            have = dict(pairs)
            direct += [hn for sel, hn in self._selectors if matches(sel, have)]
        seen: set[str] = set()
        todo = direct
        while todo:
            hn = todo.pop()
            if hn in seen:
                continue
            seen.add(hn)
            todo.extend(self._parents.get(hn, ()))
        by_tier: defaultdict[int, set[str]] = defaultdict(set)
        for hn in seen:
            tier = self._tier.get(hn)
            if tier:
                by_tier[tier].add(hn)
        out: dict[str, str] = {}
        for tier, names in by_tier.items():
            if len(names) == 1:
                out[tier_key(tier)] = next(iter(names))
            else:
                self._conflicted.add(node)
        if len(self._memo) >= 1 << 17:  # nodes come and go: never more than a bound
            self._memo.clear()
        self._memo[(node, pairs)] = out
        return out


def volcano_gangs(
    pod_groups: Iterable[PodGroupRecord], fill: HyperNodeFill
) -> dict[str, VolcanoGang]:
    """The Volcano PodGroups that are gangs or hold some, `namespace/name` -> `VolcanoGang`:
    those whose `networkTopology` is hard, at the tier of `highestTierAllowed` (or of the
    HyperNodes whose `tierName` is `highestTierName`), and those with a `subGroupPolicy` entry
    whose topology is hard at a tier known so. A soft topology, or one whose tier is unknown, is
    none."""

    def level(hard: bool, tier: int, tier_name: str) -> str:
        t = (tier or fill.tier_names.get(tier_name, 0)) if hard else 0
        return tier_key(t) if t else ""

    out: dict[str, VolcanoGang] = {}
    for g in pod_groups:
        subs = tuple(
            SubGroupGang(
                s.name, s.selector, s.match_keys, level(s.hard, s.tier, s.tier_name), s.size
            )
            for s in g.sub_groups
        )
        key = level(g.hard, g.tier, g.tier_name)
        if key or any(s.key for s in subs):
            out[g.key] = VolcanoGang(key, g.min_member, subs if any(s.key for s in subs) else ())
    return out


@dataclass(frozen=True)
class CliqueFill:
    """Each node's clique as the `ComputeDomainClique` objects name it, and what was left out."""

    #: node -> clique id (a valid label value)
    cliques: Mapping[str, str] = field(default_factory=dict)
    objects: int = 0
    #: objects past `MAX_CLIQUE_OBJECTS` (in namespace/name order), not read
    objects_left_out: int = 0
    #: daemons the objects name that could not be read (the records' `dropped`)
    items_left_out: int = 0
    #: nodes two objects put in different cliques: no clique from the objects
    conflicts: int = 0
    #: each node's domains at the HyperNodes' tiers (Volcano)
    hypernodes: HyperNodeFill = field(default_factory=HyperNodeFill)


def object_cliques(
    records: Iterable[CliqueRecord], hypernodes: Iterable[HyperNodeRecord] = ()
) -> CliqueFill:
    """The nodes the clique objects name, each with its clique, and the HyperNodes' tree
    (`CliqueFill`)."""
    ordered = sorted(records, key=lambda r: (r.namespace, r.name))
    kept = ordered[:MAX_CLIQUE_OBJECTS]
    cliques: dict[str, str] = {}
    conflicted: set[str] = set()
    for r in kept:
        for node, clique in r.members:
            if node in conflicted:
                continue
            had = cliques.setdefault(node, clique)
            if had != clique:
                conflicted.add(node)
                del cliques[node]
    return CliqueFill(
        cliques,
        len(kept),
        len(ordered) - len(kept),
        sum(r.dropped for r in kept),
        len(conflicted),
        HyperNodeFill(hypernodes),
    )


def node_labels(
    labels: Iterable[tuple[str, str]], node: str, fill: CliqueFill
) -> tuple[dict[str, str], str]:
    """A node's labels as the fabric reads them: with its clique from the objects when it has no
    `nvidia.com/gpu.clique` label (the label, when present, wins). The second value says what
    the objects did: "filled", "disagrees" (the label wins over another clique), or "". Its
    domains at the HyperNodes' tiers are added (a label of the same key, if any, wins)."""
    out = dict(labels)
    for key, domain in fill.hypernodes.domains(node, out.items()).items():
        out.setdefault(key, domain)
    clique = fill.cliques.get(node)
    if clique is None:
        return out, ""
    have = out.get(CLIQUE_LABEL)
    if have is None:
        out[CLIQUE_LABEL] = clique
        return out, "filled"
    return out, "" if have == clique else "disagrees"
