"""Fragmentation above the node: topology domains (an NVLink clique, an NVL72 rack, a leaf block)
and the gangs of the workload that need one (docs/fabric.md).

A facade over the core's fabric pass (`FragmentModel.fabric`, rust/src/fragment/fabric.rs). The
levels are node label keys, in order from the narrowest domain to the widest; a node's domain at
a level is its value of that label. A gang shape (`Shape.gang`) names its level by label key;
keys of gangs that are not among the configured levels are modelled too.

What is hostile here is counted, never fatal: a value that is no valid label value is "no
domain" (`malformed`), and past `MAX_DOMAINS_PER_LEVEL` distinct domains at one level the nodes of
the rest are "no domain" too (`overflow`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pyctl.cluster.bounds import MAX_DOMAINS_PER_LEVEL, MAX_LEVELS
from pyctl.core.fragmentation import FragmentationModel, workload_dicts
from pyctl.model import Workload

#: The levels read by default, narrowest first (each optional; docs/fabric.md says where each
#: comes from): NVIDIA GPU Feature Discovery's NVLink clique (`<ClusterUUID>.<CliqueID>`, an
#: NVL72 rack or a Fabric Manager partition of it), CoreWeave's NVLink domain, AWS's
#: UltraServer, NVIDIA Topograph's accelerator (NVLink) domain, GCP's sub-block, Topograph's leaf,
#: spine and core switches, and the zone.
DEFAULT_LEVELS: Final[tuple[str, ...]] = (
    "nvidia.com/gpu.clique",
    "ds.coreweave.com/nvlink.domain",
    "topology.k8s.aws/ultraserver-id",
    "network.topology.nvidia.com/accelerator",
    "cloud.google.com/gce-topology-subblock",
    "network.topology.nvidia.com/leaf",
    "network.topology.nvidia.com/spine",
    "network.topology.nvidia.com/core",
    "topology.kubernetes.io/zone",
)

#: the node's own label: a level of Kueue's and KAI's `Topology` objects (their narrowest, when
#: present), but a node is not a domain: never a level here
HOSTNAME: Final = "kubernetes.io/hostname"

#: a Kubernetes label value (at most 63 characters, alphanumeric at both ends)
_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


def valid_domain(value: str) -> bool:
    """Whether `value` can name a domain (a non-empty, valid label value)."""
    return bool(_VALUE.match(value))


@dataclass(frozen=True, slots=True)
class DomainChoice:
    """The domain a rescue makes room in for a gang none of whose pods runs (`cheapest_domain`)."""

    domain: str
    #: whole GPUs of the domain no pod uses
    idle: int
    #: GPUs still to free for the whole gang there (its GPUs less `idle`, at least 0)
    to_free: int


def cheapest_domain(need: int, gpus: Mapping[str, tuple[int, int]]) -> DomainChoice | None:
    """The one rule, for the controller (`pyctl.workflows.compaction.gang_domain`) and the
    topology replay alike, of where to make room for a gang needing `need` whole GPUs in one
    domain, given each candidate domain's (idle whole GPUs, all GPUs): the domain cheapest to
    free for the whole gang (the fewest GPUs to free: `need` less its idle GPUs), ties to the
    one with the least idle GPU (the tightest), then by name; only domains with GPUs enough for
    the gang. None when none has."""
    best: tuple[int, int, str] | None = None
    for domain, (idle, total) in gpus.items():
        if total < need:
            continue
        cand = (max(need - idle, 0), idle, domain)
        if best is None or cand < best:
            best = cand
    if best is None:
        return None
    to_free, idle, domain = best
    return DomainChoice(domain, idle, to_free)


@dataclass(frozen=True, slots=True)
class GangDemand:
    """A gang of the workload: `pods` pods of `shape` (its index in the workload) in one domain."""

    shape: int
    pods: int
    level: str
    gpus_per_pod: int
    weight: float


@dataclass(frozen=True, slots=True)
class DomainScore:
    level: str
    name: str
    nodes: int
    gpu_milli: float
    idle_gpu_milli: float
    #: weighted `domain_split` fragment, milli-GPU
    fragment_gpu_milli: float
    #: no GPU in use
    whole: bool
    #: per gang of `FabricScore.gangs`: pods of its shape the domain could host now
    capacity: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LevelSummary:
    level: str
    domains: int
    whole: int
    #: nodes with no (valid, modelled) domain at this level
    no_domain_nodes: int
    #: per gang of `FabricScore.gangs` at this level: the most pods of its shape one domain of
    #: the level could host now (None for gangs of other levels)
    largest: tuple[int | None, ...]
    malformed: int = 0
    overflow: int = 0

    @property
    def whole_fraction(self) -> float:
        return self.whole / self.domains if self.domains else 0.0


@dataclass(frozen=True, slots=True)
class FabricScore:
    levels: tuple[LevelSummary, ...] = ()
    domains: tuple[DomainScore, ...] = ()
    gangs: tuple[GangDemand, ...] = ()
    #: node -> weighted idle GPU its domain's lack of room strands (milli-GPU), nodes with some
    node_domain_split: Mapping[str, float] = field(default_factory=dict)
    #: node -> weighted idle GPU a gang may not use, the node being in no domain of its level
    node_no_domain: Mapping[str, float] = field(default_factory=dict)

    @property
    def domain_split_gpu_milli(self) -> float:
        return sum(self.node_domain_split.values())

    @property
    def no_domain_gpu_milli(self) -> float:
        return sum(self.node_no_domain.values())


@dataclass(frozen=True, slots=True)
class Levels:
    """The levels the fabric pass reads (`merge_levels`) and where each came from."""

    levels: tuple[str, ...]
    #: level -> its source: "config", or the first object that named it
    origin: Mapping[str, str]
    #: distinct levels of objects not modelled for want of room (past `MAX_LEVELS`)
    dropped: int = 0


def merge_levels(
    configured: Iterable[str], objects: Iterable[tuple[str, Sequence[str]]] = ()
) -> Levels:
    """The configured levels, then those of each object (`(source, levels)`: a Kueue or KAI
    `Topology`, whose levels run from the widest to the narrowest) not yet among them, each
    object's narrowest first, objects in the order given. The hostname level is a node, not a
    domain: skipped. At most `MAX_LEVELS`; the objects' levels past it are counted, not
    modelled (gangs' keys come after all of these, `levels_for`)."""
    out = list(dict.fromkeys(configured))[:MAX_LEVELS]
    origin = dict.fromkeys(out, "config")
    dropped: set[str] = set()
    for source, levels in objects:
        for key in reversed(levels):
            if key == HOSTNAME or key in origin:
                continue
            if len(out) >= MAX_LEVELS:
                dropped.add(key)
                continue
            out.append(key)
            origin[key] = source
    return Levels(tuple(out), origin, len(dropped))


def levels_for(workload: Workload, levels: Iterable[str] = DEFAULT_LEVELS) -> tuple[str, ...]:
    """The configured levels, then the gangs' keys not among them (at most `MAX_LEVELS`)."""
    out = list(dict.fromkeys(levels))
    for s in workload.shapes:
        if s.gang is not None and s.gang.key not in out:
            out.append(s.gang.key)
    return tuple(out[:MAX_LEVELS])


def _domains(
    labels: Sequence[Mapping[str, str]], levels: Sequence[str]
) -> tuple[list[list[int | None]], list[list[str]], list[int], list[int]]:
    """Per node (its labels) its domain index per level; per level the domain names (by index),
    the count of malformed values and of nodes beyond the domain bound."""
    rows: list[list[int | None]] = [[None] * len(levels) for _ in labels]
    names: list[list[str]] = []
    malformed = [0] * len(levels)
    overflow = [0] * len(levels)
    for li, key in enumerate(levels):
        values: dict[int, str] = {}
        for ni, n in enumerate(labels):
            v = n.get(key)
            if v is None:
                continue
            if not valid_domain(v):
                malformed[li] += 1
                continue
            values[ni] = v
        distinct = sorted(set(values.values()))
        kept = {v: i for i, v in enumerate(distinct[:MAX_DOMAINS_PER_LEVEL])}
        for ni, v in values.items():
            if v in kept:
                rows[ni][li] = kept[v]
            else:
                overflow[li] += 1
        names.append(distinct[:MAX_DOMAINS_PER_LEVEL])
    return rows, names, malformed, overflow


def fabric_score(
    model: FragmentationModel,
    workload: Workload,
    levels: Iterable[str] = DEFAULT_LEVELS,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> FabricScore:
    """The fabric pass over `model`'s cluster for `workload`: every domain of every level that has
    a node, and what the gangs of `workload` cannot use for want of room in one domain. A node's
    labels are `labels[name]` when given (the controller's node records), else its model's."""
    lv = levels_for(workload, levels)
    nodes = model.snapshot.nodes
    empty: Mapping[str, str] = {}
    node_labels: list[Mapping[str, str]] = [
        (labels.get(n.name, empty) if labels is not None else dict(n.labels)) for n in nodes
    ]
    rows, names, malformed, overflow = _domains(node_labels, lv)
    total = sum(s.weight for s in workload.shapes)  # the core's weights sum to 1
    gangs = tuple(
        GangDemand(i, s.gang.pods, s.gang.key, s.gpus, s.weight / total)
        for i, s in enumerate(workload.shapes)
        if s.gang is not None and s.gang.key in lv and not s.is_cpu_only
    )
    raw = model.core.fabric(
        workload_dicts(workload),
        [(g.shape, g.pods, lv.index(g.level)) for g in gangs],
        len(lv),
        rows,
    )
    domains = tuple(
        DomainScore(
            lv[d["level"]],
            names[d["level"]][d["domain"]],
            d["nodes"],
            d["gpu_milli"],
            d["idle_gpu_milli"],
            d["fragment_gpu_milli"],
            d["whole"],
            tuple(d["capacity"]),
        )
        for d in raw["domains"]
    )
    summaries = []
    for li, key in enumerate(lv):
        mine = [d for d in domains if d.level == key]
        if not mine and not malformed[li] and not overflow[li]:
            continue
        largest = tuple(
            max((d.capacity[gi] for d in mine), default=0) if g.level == key else None
            for gi, g in enumerate(gangs)
        )
        summaries.append(
            LevelSummary(
                key,
                len(mine),
                sum(d.whole for d in mine),
                sum(1 for r in rows if r[li] is None),
                largest,
                malformed[li],
                overflow[li],
            )
        )
    return FabricScore(
        tuple(summaries),
        domains,
        gangs,
        {n.name: v for n, v in zip(nodes, raw["node_domain_split"], strict=True) if v},
        {n.name: v for n, v in zip(nodes, raw["node_no_domain"], strict=True) if v},
    )
