"""Where the fabric pass's levels and cliques come from besides node labels (docs/fabric.md):
Kueue's and KAI's `Topology` objects add their levels to the configured ones, and the NVIDIA
DRA driver's `ComputeDomainClique` objects give a node its NVLink clique
(`nvidia.com/gpu.clique`) where the node has no such label.

Each is read from the controller's cache, built again when one of those objects changes
(`ClusterCache.fabric_version`). What is hostile is bounded and counted, never fatal: levels past
`MAX_LEVELS`, clique objects past `MAX_CLIQUE_OBJECTS`, the daemons an object names that could not
be read (`CliqueRecord.dropped`), a node two objects put in different cliques (it gets none from
them), a node whose label disagrees with the objects (the label wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyctl.cluster.bounds import MAX_CLIQUE_OBJECTS
from pyctl.cluster.records import CliqueRecord, TopologyRecord
from pyctl.core.fabric import Levels, merge_levels

#: the label a clique object fills in
CLIQUE_LABEL = "nvidia.com/gpu.clique"


def topology_source(kind: str, r: TopologyRecord) -> str:
    """How a `Topology` object is named as a level's source: `kueue/<name>` or `kai/<name>`."""
    return f"{'kueue' if kind == 'KueueTopology' else 'kai'}/{r.name}"


def fabric_levels(
    configured: Iterable[str],
    kueue: Iterable[TopologyRecord] = (),
    kai: Iterable[TopologyRecord] = (),
) -> Levels:
    """The configured levels, then Kueue's `Topology` objects' and then KAI's (each in name
    order) not yet among them (`pyctl.core.fabric.merge_levels`)."""
    objects = [
        (topology_source(kind, r), r.levels)
        for kind, records in (("KueueTopology", kueue), ("KaiTopology", kai))
        for r in sorted(records, key=lambda r: r.name)
    ]
    return merge_levels(configured, objects)


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


def object_cliques(records: Iterable[CliqueRecord]) -> CliqueFill:
    """The nodes the clique objects name, each with its clique (`CliqueFill`)."""
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
    )


def node_labels(
    labels: Iterable[tuple[str, str]], node: str, fill: CliqueFill
) -> tuple[dict[str, str], str]:
    """A node's labels as the fabric reads them: with its clique from the objects when it has no
    `nvidia.com/gpu.clique` label (the label, when present, wins). The second value says what
    the objects did: "filled", "disagrees" (the label wins over another clique), or ""."""
    out = dict(labels)
    clique = fill.cliques.get(node)
    if clique is None:
        return out, ""
    have = out.get(CLIQUE_LABEL)
    if have is None:
        out[CLIQUE_LABEL] = clique
        return out, "filled"
    return out, "" if have == clique else "disagrees"
