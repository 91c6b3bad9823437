"""The trace replay with a fabric (issue 33, part 6; docs/topology-replay.md): the openb trace's
nodes arranged into NVLink domains and leaves, gang demand added to the trace's arrivals, and
the placement policies of the topology-aware schedulers replayed on it.

The variant (`Variant`, seeded):
- nodes: the trace's nodes, grouped by (GPU model, GPUs per node) (an NVLink domain is one kind
  of machine), each group in the seed's random node order cut into domains of `domain_nodes`
  (18: a GB200 NVL72 rack of 18 trays; the last domain of a group may be smaller), labelled
  `nvidia.com/gpu.clique`; the domains, in that order, cut into leaves of `leaf_domains` (4),
  labelled `network.topology.nvidia.com/leaf` (NVIDIA Topograph's leaf switch);
- arrivals: each is a trace task (drawn uniformly, with replacement, from the trace's tasks) or,
  with probability `p`, a gang (drawn from `MIX`); `p` is set so that gangs are `gang_share` of
  the arrived GPU request in expectation. A gang is `pods` pods of `gpus` whole GPUs each
  (`cpu_per_gpu`, `mem_per_gpu` per GPU) that must all run inside one domain of the clique level;
- the replay stops once the arrived GPU request (trace tasks and gangs, placed or not) reaches
  `stop_pct` of the GPU capacity. Arrival only, as in the FGD protocol (docs/simulator.md): a trace
  task that fits nowhere fails, a gang that no domain holds stays pending (never partly placed);
- the policies that repair (`Repair`) make room for a pending gang with the controller's
  decisions: the clique by `pyctl.core.fabric.cheapest_domain` (the rule of the controller's
  `gang_domain`), the moves of single pods by the one planner (`pyctl.core.policy.plan`), every
  move an eviction within a budget (`RepairBudget`).

Every policy places through the core's model (`pyctl.core.fragmentation.FragmentationModel`, the
same code the controller and the extender run): a pod's placement on a node (which GPUs, which
share) is the core's (`FragmentModel.rank`), so the policies differ only in the node and domain
they choose. Ranks are cached by node state (a node's rank depends on its own state only).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pyctl.controller.domains import DomainIdle
from pyctl.core import policy as planner
from pyctl.core.fabric import cheapest_domain
from pyctl.core.fragmentation import FragmentationModel, derive_workload, shape_dict
from pyctl.core.inputs import ShapeInput
from pyctl.core.types import Assignment, RankedRaw
from pyctl.model import GPU_MILLI, Gang, Gpu, Node, Shape, Snapshot, Workload, Zone
from pyctl.replay.trace import Trace, task_shapes

CLIQUE = "nvidia.com/gpu.clique"
LEAF = "network.topology.nvidia.com/leaf"
LEVELS: tuple[str, ...] = (CLIQUE, LEAF)


@dataclass(frozen=True)
class GangKind:
    """One kind of gang of the mix: `weight` of the gangs (by count), `pods` pods drawn uniformly
    from the range, each of `gpus` GPUs drawn uniformly from the choices."""

    name: str
    weight: float
    pods: tuple[int, int]
    gpus: tuple[int, ...]


#: NVIDIA's published Slurm segment sizes for NVL72 (the block topology plugin's segments of 16,
#: 4 and 1 nodes, each pod a whole 8-GPU node here), and LeaderWorkerSet groups of 2-8 pods of 4
#: or 8 GPUs (the tensor-parallel sizes in the 4-8 GPU range)
MIX: tuple[GangKind, ...] = (
    GangKind("slurm-16", 0.05, (16, 16), (8,)),
    GangKind("slurm-4", 0.15, (4, 4), (8,)),
    GangKind("slurm-1", 0.20, (1, 1), (8,)),
    GangKind("lws", 0.60, (2, 8), (4, 8)),
)


@dataclass(frozen=True)
class Variant:
    domain_nodes: int = 18
    leaf_domains: int = 4
    #: the gangs' expected share of the arrived GPU request
    gang_share: float = 0.25
    mix: tuple[GangKind, ...] = MIX
    cpu_per_gpu: int = 8000
    mem_per_gpu: int = 32768
    #: the replay ends when the arrived GPU request reaches this % of capacity
    stop_pct: int = 100


@dataclass(frozen=True)
class GangArrival:
    kind: str
    pods: int
    shape: Shape

    @property
    def gpu_milli(self) -> int:
        return self.pods * self.shape.gpus * GPU_MILLI


Arrival = Shape | GangArrival


def _request(a: Arrival) -> int:
    if isinstance(a, GangArrival):
        return a.gpu_milli
    return a.gpus * a.gpu_milli


def gang_probability(trace_mean: float, gang_mean: float, share: float) -> float:
    """The probability that an arrival is a gang for gangs to be `share` of the GPU request in
    expectation: p G / (p G + (1 - p) T) = share."""
    if share <= 0.0:
        return 0.0
    return share * trace_mean / (share * trace_mean + (1.0 - share) * gang_mean)


def _gang_mean(v: Variant) -> float:
    total = sum(k.weight for k in v.mix)
    return sum(
        k.weight / total * (k.pods[0] + k.pods[1]) / 2 * statistics.mean(k.gpus) * GPU_MILLI
        for k in v.mix
    )


def _draw_gang(rng: random.Random, v: Variant) -> GangArrival:
    kind = rng.choices(v.mix, weights=[k.weight for k in v.mix])[0]
    pods = rng.randint(*kind.pods)
    gpus = rng.choice(kind.gpus)
    shape = Shape(
        cpu_milli=gpus * v.cpu_per_gpu,
        memory_mib=gpus * v.mem_per_gpu,
        gpus=gpus,
        gpu_milli=GPU_MILLI,
        gang=Gang(pods, CLIQUE) if pods > 1 else None,
    )
    return GangArrival(kind.name, pods, shape)


def arrivals(trace: Trace, v: Variant, seed: int) -> list[Arrival]:
    """The seed's arrivals up to `v.stop_pct` of the GPU capacity (the last one crosses it)."""
    rng = random.Random(seed)
    shapes = task_shapes(trace.tasks)
    mems = trace.tasks["memory_mib"]
    shapes = [
        Shape(s.cpu_milli, m, s.gpus, s.gpu_milli, gpu_models=s.gpu_models)
        for s, m in zip(shapes, mems, strict=True)
    ]
    trace_mean = statistics.mean(_request(s) for s in shapes)
    p = gang_probability(trace_mean, _gang_mean(v), v.gang_share)
    cap = trace.gpu_count * GPU_MILLI * v.stop_pct / 100
    out: list[Arrival] = []
    arrived = 0
    while arrived < cap:
        a: Arrival = _draw_gang(rng, v) if rng.random() < p else rng.choice(shapes)
        out.append(a)
        arrived += _request(a)
    return out


@dataclass(frozen=True)
class Fabric:
    """The variant's cluster: nodes in the seed's order (ties go to the first), their domains."""

    nodes: tuple[Node, ...]
    clique_of: tuple[str, ...]
    leaf_of: tuple[str, ...]
    #: clique -> node indices, in construction order
    cliques: dict[str, list[int]]
    leaves: dict[str, list[str]]


def build_fabric(trace: Trace, v: Variant, seed: int) -> Fabric:
    n = trace.nodes
    count = len(n["name"])
    # the domains and the tie order are drawn apart: a node's place in the tie order says
    # nothing of its domain
    members_order = list(range(count))
    random.Random(seed ^ 0x5EED).shuffle(members_order)
    order = list(range(count))
    random.Random(seed).shuffle(order)
    groups: dict[tuple[str, int], list[int]] = {}
    for i in members_order:
        groups.setdefault((n["model"][i], n["gpu"][i]), []).append(i)
    clique_of = [""] * count
    cliques: list[tuple[str, list[int]]] = []
    for (model, gpus), members in sorted(groups.items()):
        for k in range(0, len(members), v.domain_nodes):
            name = f"{model.lower()}-{gpus}g-c{k // v.domain_nodes:02d}"
            chunk = members[k : k + v.domain_nodes]
            cliques.append((name, chunk))
            for i in chunk:
                clique_of[i] = name
    leaf_of_clique = {c: f"leaf-{k // v.leaf_domains:02d}" for k, (c, _) in enumerate(cliques)}
    pos = {old: new for new, old in enumerate(order)}
    nodes = []
    for i in order:
        labels = ((CLIQUE, clique_of[i]), (LEAF, leaf_of_clique[clique_of[i]]))
        zone = Zone(
            0,
            n["cpu_milli"][i],
            0,
            n["memory_mib"][i],
            0,
            gpus=tuple(Gpu(g) for g in range(n["gpu"][i])),
        )
        nodes.append(
            Node(n["name"][i], n["model"][i], "none", "none", zones=(zone,), labels=labels)
        )
    leaves: dict[str, list[str]] = {}
    for c, _ in cliques:
        leaves.setdefault(leaf_of_clique[c], []).append(c)
    return Fabric(
        tuple(nodes),
        tuple(clique_of[i] for i in order),
        tuple(leaf_of_clique[clique_of[i]] for i in order),
        {c: sorted(pos[i] for i in members) for c, members in cliques},
        leaves,
    )


# ---- the cluster state -------------------------------------------------------------------------

StateKey = tuple[int, tuple[int, ...], int, int]


class Cluster:
    """The replay's state: the core's model, and per node its GPUs' use, CPU and memory (the
    key its rank is cached by), each clique's used GPU, and the advice's `DomainIdle`."""

    def __init__(self, fabric: Fabric, workload: Workload) -> None:
        self.fabric = fabric
        self.model = FragmentationModel(Snapshot(fabric.nodes))
        self.names = [n.name for n in fabric.nodes]
        self.workload = workload
        self.wd: list[ShapeInput] = [shape_dict(s) for s in workload.shapes]
        z = [n.zones[0] for n in fabric.nodes]
        self.gpus = [len(x.gpus) for x in z]
        self.cpu_cap = [x.cpu_milli for x in z]
        self.mem_cap = [x.memory_mib for x in z]
        kinds: dict[tuple[str, int, int, int], int] = {}
        self.kind = [
            kinds.setdefault((n.gpu_model, g, c, m), len(kinds))
            for n, g, c, m in zip(fabric.nodes, self.gpus, self.cpu_cap, self.mem_cap, strict=True)
        ]
        self.used = [[0] * g for g in self.gpus]
        self.cpu = [0] * len(z)
        self.mem = [0] * len(z)
        self.keys: list[StateKey] = [self._key(i) for i in range(len(z))]
        self.groups: dict[StateKey, set[int]] = {}
        for i, k in enumerate(self.keys):
            self.groups.setdefault(k, set()).add(i)
        self.cache: dict[tuple[int, StateKey], RankedRaw | None] = {}
        self.shape_ids: dict[Shape, tuple[int, ShapeInput]] = {}
        self.clique_used = dict.fromkeys(fabric.cliques, 0)
        self.domains = DomainIdle(LEVELS)
        for i, n in enumerate(fabric.nodes):
            self.domains.update(n.name, dict(n.labels), self.gpus[i] * GPU_MILLI)
        self.allocated = 0

    def _key(self, i: int) -> StateKey:
        return (self.kind[i], tuple(self.used[i]), self.cpu[i], self.mem[i])

    def idle(self, i: int) -> int:
        return self.gpus[i] * GPU_MILLI - sum(self.used[i])

    def _shape(self, s: Shape) -> tuple[int, ShapeInput]:
        hit = self.shape_ids.get(s)
        if hit is None:
            hit = self.shape_ids[s] = (len(self.shape_ids), shape_dict(s))
        return hit

    def ranks(self, shape: Shape, nodes: Sequence[int]) -> list[RankedRaw | None]:
        """The policy's best placement of `shape` on each of `nodes` (None: not admitted)."""
        sid, sd = self._shape(shape)
        cache = self.cache
        missing: dict[StateKey, int] = {}
        for i in nodes:
            k = self.keys[i]
            if (sid, k) not in cache and k not in missing:
                missing[k] = i
        if missing:
            idx = list(missing.values())
            for i, r in zip(idx, self.model.core.rank(sd, self.wd, idx), strict=True):
                cache[(sid, self.keys[i])] = r
        return [cache[(sid, self.keys[i])] for i in nodes]

    def group_ranks(self, shape: Shape) -> list[tuple[RankedRaw, set[int]]]:
        """Each distinct node state that admits `shape`: its rank and its nodes."""
        groups = [(k, g) for k, g in self.groups.items() if g]
        reps = [min(g) for _, g in groups]
        out = []
        for r, (_, g) in zip(self.ranks(shape, reps), groups, strict=True):
            if r is not None:
                out.append((r, g))
        return out

    def apply(self, i: int, a: Assignment, place: bool = True) -> None:
        sign = 1 if place else -1
        self.model.core.apply(i, a, place)
        used = self.used[i]
        gpu = 0
        for _zone, g, milli in a["gpus"]:
            used[g] += sign * milli
            gpu += milli
        self.cpu[i] += sign * sum(m for _, m in a["cpu"])
        self.mem[i] += sign * sum(m for _, m in a["memory"])
        self.allocated += sign * gpu
        self.clique_used[self.fabric.clique_of[i]] += sign * gpu
        old = self.keys[i]
        self.groups[old].discard(i)
        new = self.keys[i] = self._key(i)
        self.groups.setdefault(new, set()).add(i)
        self.domains.update(self.names[i], dict(self.fabric.nodes[i].labels), self.idle(i))

    def fits(self, i: int, shape: Shape) -> int:
        """How many pods of `shape` node `i` holds one after another (Kueue's per-node count
        of a pod set: by the node's free resources, whole GPUs by count, a share by each GPU's
        free share)."""
        cpu = self.cpu_cap[i] - self.cpu[i]
        mem = self.mem_cap[i] - self.mem[i]
        n = 1 << 30
        if shape.cpu_milli:
            n = min(n, cpu // shape.cpu_milli)
        if shape.memory_mib:
            n = min(n, mem // shape.memory_mib)
        if shape.gpus:
            if shape.gpu_milli >= GPU_MILLI:
                n = min(n, sum(1 for u in self.used[i] if u == 0) // shape.gpus)
            else:
                n = min(n, sum((GPU_MILLI - u) // shape.gpu_milli for u in self.used[i]))
        return max(n, 0)

    def whole_cliques(self) -> int:
        return sum(1 for u in self.clique_used.values() if u == 0)


# ---- policies ----------------------------------------------------------------------------------

Chooser = Callable[[Cluster, Shape, Sequence[int] | None], tuple[int, RankedRaw] | None]


def choose_fgd(
    c: Cluster, shape: Shape, nodes: Sequence[int] | None
) -> tuple[int, RankedRaw] | None:
    """FGD (Weng et al., ATC '23; docs/simulator.md): the best FGD score of the node's fragment
    increase (the core's rank's first term), ties to the first node of the seed's order; blind
    to the fabric."""
    best: tuple[tuple[int, int], int, RankedRaw] | None = None
    if nodes is None:
        for r, g in c.group_ranks(shape):
            k = (r["rank"][0], min(g))
            if best is None or k < best[0]:
                best = (k, k[1], r)
    else:
        for i, ri in zip(nodes, c.ranks(shape, nodes), strict=True):
            if ri is not None:
                k = (ri["rank"][0], i)
                if best is None or k < best[0]:
                    best = (k, i, ri)
    return None if best is None else (best[1], best[2])


def choose_pyctl(
    c: Cluster, shape: Shape, nodes: Sequence[int] | None
) -> tuple[int, RankedRaw] | None:
    """pyctl's advice (docs/fabric.md, "Advice"): the one placement policy's rank
    (`rust/src/placement`: FGD's score, then CPU, then the share left), ties broken by the
    domains' hierarchical tightest fit of `pyctl.controller.domains.DomainIdle` (the node whose
    clique, then leaf, has the least idle GPU; for a gang's pod, the domains that can hold the
    whole gang first), then the seed's node order."""
    cands: list[tuple[tuple[int, int, int], int, RankedRaw]] = []
    if nodes is None:
        for r, g in c.group_ranks(shape):
            cands.extend((r["rank"], i, r) for i in g)
    else:
        for i, ri in zip(nodes, c.ranks(shape, nodes), strict=True):
            if ri is not None:
                cands.append((ri["rank"], i, ri))
    if not cands:
        return None
    best = min(x[0] for x in cands)
    tied = [x for x in cands if x[0] == best]
    if len(tied) == 1:
        return tied[0][1], tied[0][2]
    key = c.domains.key
    pick = min(tied, key=lambda x: (key(c.names[x[1]], shape), x[1]))
    return pick[1], pick[2]


def choose_lfc(
    c: Cluster, shape: Shape, nodes: Sequence[int] | None
) -> tuple[int, RankedRaw] | None:
    """Kueue TAS's LeastFreeCapacity for a pod set without a topology request (KEP-2724,
    "Selecting the algorithm": the default for `unconstrained` since Kueue v0.15): from the top
    level down, the domain with the least free capacity (pods of the shape its nodes hold) that
    holds the pod: the leaf, then the clique in it, then the node; ties to the seed's order."""
    if nodes is None:
        admitted = [i for r, g in c.group_ranks(shape) for i in g]
    else:
        admitted = [i for i, r in zip(nodes, c.ranks(shape, nodes), strict=True) if r is not None]
    cap = {i: f for i in admitted if (f := c.fits(i, shape)) > 0}
    if not cap:
        admitted.sort()
        if not admitted:
            return None
        i = admitted[0]  # the core admits it where the count says none: the core decides
        r = c.ranks(shape, [i])[0]
        return None if r is None else (i, r)
    leaf_cap: dict[str, int] = {}
    clique_cap: dict[str, int] = {}
    for i, f in cap.items():
        leaf_cap[c.fabric.leaf_of[i]] = leaf_cap.get(c.fabric.leaf_of[i], 0) + f
        clique_cap[c.fabric.clique_of[i]] = clique_cap.get(c.fabric.clique_of[i], 0) + f
    i = min(
        cap,
        key=lambda i: (
            leaf_cap[c.fabric.leaf_of[i]],
            clique_cap[c.fabric.clique_of[i]],
            cap[i],
            i,
        ),
    )
    r = c.ranks(shape, [i])[0]
    return None if r is None else (i, r)


def _trial(
    c: Cluster, shape: Shape, pods: int, nodes: Sequence[int], choose: Chooser
) -> list[tuple[int, Assignment]] | None:
    """`pods` pods placed one by one on `nodes` by `choose`; all or none (undone)."""
    done: list[tuple[int, Assignment]] = []
    for _ in range(pods):
        got = choose(c, shape, nodes)
        if got is None:
            for i, a in reversed(done):
                c.apply(i, a, place=False)
            return None
        i, r = got
        c.apply(i, r["assignment"])
        done.append((i, r["assignment"]))
    return done


def _place_counts(
    c: Cluster, shape: Shape, counts: Sequence[tuple[int, int]]
) -> list[tuple[int, Assignment]] | None:
    """`n` pods on node `i` for each (i, n), each where the core puts it on that node."""
    done: list[tuple[int, Assignment]] = []
    for i, n in counts:
        for _ in range(n):
            r = c.ranks(shape, [i])[0]
            if r is None:
                for j, a in reversed(done):
                    c.apply(j, a, place=False)
                return None
            c.apply(i, r["assignment"])
            done.append((i, r["assignment"]))
    return done


def _clique_counts(c: Cluster, shape: Shape) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """Per clique: the pods of `shape` its nodes hold (Kueue's `state`) and each node's count."""
    out: dict[str, tuple[int, list[tuple[int, int]]]] = {}
    for name, members in c.fabric.cliques.items():
        per = [(i, c.fits(i, shape)) for i in members]
        out[name] = (sum(f for _, f in per), per)
    return out


def gang_first_fit(c: Cluster, g: GangArrival) -> list[tuple[int, Assignment]] | None:
    """Topology-blind FGD with a gang scheduler's all-or-nothing: the pods placed one by one by
    FGD inside the first clique (in the fabric's order) where all of them fit."""
    for members in c.fabric.cliques.values():
        done = _trial(c, g.shape, g.pods, members, choose_fgd)
        if done is not None:
            return done
    return None


def gang_kueue_bestfit(c: Cluster, g: GangArrival) -> list[tuple[int, Assignment]] | None:
    """Kueue TAS BestFit for a pod set with `podset-required-topology` (KEP-2724, "Computing the
    assignment"): among the domains of the required level whose free capacity (pods of the
    shape, Kueue's `state`) holds the whole pod set, the one with the least; inside it, nodes
    from the most free capacity down, the last chosen as the tightest that holds the rest."""
    counts = _clique_counts(c, g.shape)
    fitting = [(s, k) for k, (name, (s, _)) in enumerate(counts.items()) if s >= g.pods]
    if not fitting:
        return None
    _, k = min(fitting)
    per = list(counts.values())[k][1]
    per = sorted((x for x in per if x[1] > 0), key=lambda x: (-x[1], x[0]))
    left = g.pods
    chosen: list[tuple[int, int]] = []
    while left > 0 and per:
        holding = [x for x in per if x[1] >= left]
        if holding:
            i, _ = min(holding, key=lambda x: (x[1], x[0]))
            chosen.append((i, left))
            left = 0
            break
        i, f = per.pop(0)
        chosen.append((i, f))
        left -= f
    return _place_counts(c, g.shape, chosen) if left == 0 else None


def gang_binpack(c: Cluster, g: GangArrival) -> list[tuple[int, Assignment]] | None:
    """KAI's and Volcano's domain bin-packing (KAI Scheduler docs/topology: a required placement
    fills one domain of the level; Volcano's network-topology-aware plugin scores HyperNodes by
    their allocation, binpack): among the cliques that hold the whole gang, the most allocated
    (used GPU / GPU), then its leaf's; inside it, the most allocated nodes first, each filled."""
    counts = _clique_counts(c, g.shape)
    gpu_of = {
        name: sum(c.gpus[i] for i in members) * GPU_MILLI
        for name, members in c.fabric.cliques.items()
    }
    leaf_used: dict[str, list[int]] = {}
    for name in counts:
        leaf = c.fabric.leaf_of[c.fabric.cliques[name][0]]
        t = leaf_used.setdefault(leaf, [0, 0])
        t[0] += c.clique_used[name]
        t[1] += gpu_of[name]
    best: tuple[tuple[float, float, int], str] | None = None
    for k, (name, (s, _)) in enumerate(counts.items()):
        if s < g.pods:
            continue
        leaf = c.fabric.leaf_of[c.fabric.cliques[name][0]]
        key = (-c.clique_used[name] / gpu_of[name], -leaf_used[leaf][0] / leaf_used[leaf][1], k)
        if best is None or key < best[0]:
            best = (key, name)
    if best is None:
        return None
    per = sorted(
        (x for x in counts[best[1]][1] if x[1] > 0),
        key=lambda x: (-(sum(c.used[x[0]]) / (c.gpus[x[0]] * GPU_MILLI)), x[0]),
    )
    left = g.pods
    chosen = []
    for i, f in per:
        take = min(f, left)
        chosen.append((i, take))
        left -= take
        if left == 0:
            break
    return _place_counts(c, g.shape, chosen) if left == 0 else None


def gang_pyctl(c: Cluster, g: GangArrival) -> list[tuple[int, Assignment]] | None:
    """pyctl's advice for a gang's pods (docs/fabric.md, "Advice"): the cliques in the order
    `DomainIdle` gives a pod of the gang (the tightest clique whose idle GPU holds the whole
    gang first, then by its leaf), each tried with the pods placed one by one by the one
    placement policy inside it; the first that holds them all."""
    counts = _clique_counts(c, g.shape)
    order = sorted(
        (name for name, (s, _) in counts.items() if s >= g.pods),
        key=lambda name: (c.domains.key(c.names[c.fabric.cliques[name][0]], g.shape), name),
    )
    for name in order:
        done = _trial(c, g.shape, g.pods, c.fabric.cliques[name], choose_pyctl)
        if done is not None:
            return done
    return None


# ---- repair: pyctl with repair ---------------------------------------------------------------


@dataclass(frozen=True)
class RepairBudget:
    """The protocol of the policies that repair (docs/topology-replay.md, "Repair"): a repair
    round for the pending gangs, oldest first, each time another `every_pct` of the capacity
    has arrived, and one for a gang the moment it finds no clique; the planner's limits for one
    gang's repair; the eviction budget; and, for a policy that also defragments, the planner's
    defragmentation in each round."""

    #: evictions, counted over the run, are at most this % of the pods arrived so far
    evict_pct: float = 2.0
    #: a repair round each time the arrived GPU request passes another `every_pct` % of capacity
    every_pct: int = 1
    #: the planner's limits (`PlanLimits`): most evictions to free one node (the controller's
    #: `workflow.rescue_depth`), candidate sets per rescue (its `rescue_budget`), and most
    #: evictions one gang's repair may take (the controller plans 3 a round; the replay makes a
    #: gang's rounds at once)
    rescue_depth: int = 3
    rescue_budget: int = 4096
    max_moves: int = 64
    #: a defragmenting policy's rounds: at most `round_moves` moves a round, each lowering F(M)
    #: by more than `min_gain` milli-GPU (the trace replay's: docs/simulator.md)
    round_moves: int = 20
    min_gain: float = 1.0
    #: defragmentation stops at this share of the eviction budget (the rest is the repairs')
    defrag_share: float = 0.75


@dataclass(frozen=True)
class RepairOutcome:
    """One gang's repair: the clique chosen (None for a one-pod gang: no domain), the plan's
    moves as made (pod key, from node, to node), and the gang's pods as placed (empty: it stays
    pending)."""

    clique: str | None
    moves: tuple[tuple[str, int, int], ...]
    placed: tuple[tuple[int, Assignment], ...]


class Repair:
    """pyctl with repair: the single pods placed (the movable ones: unconstrained, never a
    gang's), the evictions made, and the repair of a pending gang. The decisions are the
    controller's: the clique by `pyctl.core.fabric.cheapest_domain` (the rule of
    `pyctl.workflows.compaction.gang_domain`), the moves by the one planner
    (`pyctl.core.policy.plan`, the controller's `FragmentModel.plan`) with the gang's pods as
    pending pods allowed on the clique's nodes alone."""

    def __init__(self, c: Cluster, budget: RepairBudget | None = None) -> None:
        self.c = c
        self.budget = budget or RepairBudget()
        self.index = {n: i for i, n in enumerate(c.names)}
        #: pod key -> (node, assignment, shape) of each single pod placed
        self.pods: dict[str, tuple[int, Assignment, Shape]] = {}
        self.evictions = 0
        self.repairs = 0
        self._dest: dict[Shape, tuple[int, ...]] = {}

    def placed(self, key: str, i: int, a: Assignment, shape: Shape) -> None:
        self.pods[key] = (i, a, shape)

    def dest(self, shape: Shape) -> tuple[int, ...]:
        """The nodes whose capacity admits a pod of `shape` (the scheduler's resource filter)."""
        hit = self._dest.get(shape)
        if hit is None:
            c = self.c
            hit = self._dest[shape] = tuple(
                i
                for i in range(len(c.names))
                if c.gpus[i] >= shape.gpus
                and c.cpu_cap[i] >= shape.cpu_milli
                and c.mem_cap[i] >= shape.memory_mib
            )
        return hit

    def clique_for(self, g: GangArrival) -> str | None:
        """The clique the controller would make room in for `g` (none of whose pods runs):
        `cheapest_domain` over each clique's idle whole GPUs and GPUs, on the nodes of `dest`."""
        c = self.c
        gpus: dict[str, tuple[int, int]] = {}
        for i in self.dest(g.shape):
            name = c.fabric.clique_of[i]
            idle, total = gpus.get(name, (0, 0))
            gpus[name] = (idle + sum(1 for u in c.used[i] if u == 0), total + c.gpus[i])
        best = cheapest_domain(g.pods * g.shape.gpus, gpus)
        return None if best is None else best.domain

    def allowance(self, pods_arrived: int) -> int:
        return int(self.budget.evict_pct / 100 * pods_arrived) - self.evictions

    def _apply_moves(self, moves: Sequence[planner.Move]) -> list[tuple[str, int, int]]:
        c = self.c
        out = []
        for m in moves:
            i, a, shape = self.pods[m.pod]
            j = self.index[m.to_node]
            c.apply(i, a, place=False)
            c.apply(j, m.assignment)
            self.pods[m.pod] = (j, m.assignment, shape)
            out.append((m.pod, i, j))
        self.evictions += len(out)
        return out

    def defragment(self, allowance: int) -> int:
        """The planner's defragmentation over every single pod placed (the controller's round),
        within `allowance` evictions; the moves made."""
        b = self.budget
        n = min(
            b.round_moves, allowance - int((1.0 - b.defrag_share) * (allowance + self.evictions))
        )
        if n <= 0:
            return 0
        c = self.c
        movable = [
            planner.MovablePod(key, c.names[i], a, shape)
            for key, (i, a, shape) in self.pods.items()
        ]
        limits = planner.PlanLimits(max_moves=n, min_gain=b.min_gain, rescue_depth=0)
        plan = planner.plan(c.model, movable, [], c.workload, limits)
        return len(self._apply_moves(plan.moves))

    def repair(self, g: GangArrival, allowance: int, tag: str) -> RepairOutcome | None:
        """Make room for pending gang `g` and place it whole, within `allowance` evictions;
        None when the planner finds no room for every pod of the gang (nothing moves then)."""
        if allowance <= 0:
            return None
        c = self.c
        b = self.budget
        dest = self.dest(g.shape)
        clique = self.clique_for(g) if g.shape.gang is not None else None
        if g.shape.gang is not None:
            if clique is None:
                return None
            members = set(c.fabric.cliques[clique])
            where: Sequence[int] = [i for i in dest if i in members]
        else:
            where = dest
        allowed = frozenset(c.names[i] for i in where)
        on = set(where)
        movable = [
            planner.MovablePod(key, c.names[i], a, shape)
            for key, (i, a, shape) in self.pods.items()
            if i in on
        ]
        pending = [planner.PendingPod(f"{tag}/{k}", g.shape, allowed) for k in range(g.pods)]
        limits = planner.PlanLimits(
            max_moves=min(b.max_moves, allowance),
            rescue_depth=b.rescue_depth,
            max_rescues=g.pods,
            rescue_budget=b.rescue_budget,
            defragment=False,
        )
        plan = planner.plan(c.model, movable, pending, c.workload, limits)
        if plan.unrescued:
            return None
        moves = self._apply_moves(plan.moves)
        self.repairs += 1
        # the rescued pods where their room was held for them, the others by the policy
        done: list[tuple[int, Assignment]] = []
        for r in plan.rescues:
            i = self.index[r.node]
            c.apply(i, r.assignment)
            done.append((i, r.assignment))
        rest = _trial(c, g.shape, g.pods - len(done), where, choose_pyctl)
        if rest is None:
            for i, a in reversed(done):
                c.apply(i, a, place=False)
            return RepairOutcome(clique, tuple(moves), ())
        return RepairOutcome(clique, tuple(moves), tuple(done + rest))


@dataclass(frozen=True)
class Policy:
    name: str
    single: Chooser
    gang: Callable[[Cluster, GangArrival], list[tuple[int, Assignment]] | None]
    doc: str
    #: pending gangs are repaired (`Repair`)
    repair: bool = False
    #: and each repair round runs the planner's defragmentation (`Repair.defragment`)
    defragment: bool = False


POLICIES: tuple[Policy, ...] = (
    Policy("fgd", choose_fgd, gang_first_fit, "topology-blind FGD, gangs in the first clique"),
    Policy("kueue-bestfit", choose_fgd, gang_kueue_bestfit, "Kueue TAS BestFit; pods by FGD"),
    Policy("kueue-lfc", choose_lfc, gang_kueue_bestfit, "Kueue TAS: pods LeastFreeCapacity"),
    Policy("kai-binpack", choose_fgd, gang_binpack, "KAI/Volcano domain bin-packing"),
    Policy("pyctl", choose_pyctl, gang_pyctl, "pyctl: the policy and the domain order"),
    Policy(
        "pyctl-repair",
        choose_pyctl,
        gang_pyctl,
        "pyctl, and pending gangs repaired by the controller's domain rule and planner",
        repair=True,
    ),
    Policy(
        "pyctl-compact",
        choose_pyctl,
        gang_pyctl,
        "pyctl-repair, and the planner's defragmentation every round",
        repair=True,
        defragment=True,
    ),
)
POLICY_NAMES: tuple[str, ...] = tuple(p.name for p in POLICIES)


# ---- one run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    arrived_pct: int
    allocated_milli: int
    whole_cliques: int
    gangs_arrived: int
    gangs_placed: int
    gang_milli_arrived: int
    gang_milli_placed: int


@dataclass
class TopologyRun:
    policy: str
    seed: int
    capacity_milli: int
    cliques: int
    checkpoints: list[Checkpoint] = field(default_factory=list)
    tasks_failed: int = 0
    evictions: int = 0
    pods_arrived: int = 0
    seconds: float = 0.0

    @property
    def last(self) -> Checkpoint:
        return self.checkpoints[-1]

    def unallocated_pct(self) -> float:
        return 100.0 - 100.0 * self.last.allocated_milli / self.capacity_milli

    def gang_served_pct(self) -> float:
        c = self.last
        return 100.0 * c.gang_milli_placed / c.gang_milli_arrived if c.gang_milli_arrived else 0.0

    def gangs_pending(self) -> int:
        return self.last.gangs_arrived - self.last.gangs_placed

    def evicted_pct(self) -> float:
        return 100.0 * self.evictions / max(1, self.pods_arrived)


def workload_of(arrived: Sequence[Arrival]) -> Workload:
    """M from the arrivals as FGD derives it (the most frequent pod shapes covering 95% of the
    pods; a gang counts its pods)."""
    shapes: list[Shape] = []
    for a in arrived:
        if isinstance(a, GangArrival):
            plain = Shape(a.shape.cpu_milli, 0, a.shape.gpus, a.shape.gpu_milli)
            shapes.extend([plain] * a.pods)
        else:
            shapes.append(a)
    return derive_workload(shapes)


def run(
    trace: Trace,
    policy: str,
    seed: int,
    variant: Variant | None = None,
    budget: RepairBudget | None = None,
) -> TopologyRun:
    """One replay of the variant (`seed`) under `policy` (one of `POLICY_NAMES`; `budget`: the
    repair's, for a policy that repairs)."""
    v = variant or Variant()
    pol = {p.name: p for p in POLICIES}[policy]
    t0 = time.perf_counter()
    fabric = build_fabric(trace, v, seed)
    stream = arrivals(trace, v, seed)
    c = Cluster(fabric, workload_of(stream))
    fix = Repair(c, budget) if pol.repair else None
    cap = trace.gpu_count * GPU_MILLI
    out = TopologyRun(policy, seed, cap, len(fabric.cliques))
    arrived = 0
    next_pct = 1
    next_repair = fix.budget.every_pct if fix is not None else 0
    gangs = [0, 0, 0, 0]  # arrived, placed, milli arrived, milli placed
    pending: list[tuple[str, GangArrival]] = []

    def repair(tag: str, g: GangArrival) -> bool:
        assert fix is not None
        got = fix.repair(g, fix.allowance(out.pods_arrived), tag)
        out.evictions = fix.evictions
        if got is None or not got.placed:
            return False
        gangs[1] += 1
        gangs[3] += g.gpu_milli
        return True

    for n, a in enumerate(stream):
        if isinstance(a, GangArrival):
            gangs[0] += 1
            gangs[2] += a.gpu_milli
            out.pods_arrived += a.pods
            if pol.gang(c, a) is not None:
                gangs[1] += 1
                gangs[3] += a.gpu_milli
            elif fix is not None and not repair(f"gang-{n}", a):
                pending.append((f"gang-{n}", a))
        else:
            out.pods_arrived += 1
            got = pol.single(c, a, None)
            if got is None:
                out.tasks_failed += 1
            else:
                c.apply(got[0], got[1]["assignment"])
                if fix is not None:
                    fix.placed(f"pod-{n}", got[0], got[1]["assignment"], a)
        arrived += _request(a)
        if fix is not None and pending and arrived * 100 >= next_repair * cap:
            # a repair round: the pending gangs, oldest first (each tried as it arrives first)
            still = []
            for tag, g in pending:
                if pol.gang(c, g) is not None:
                    gangs[1] += 1
                    gangs[3] += g.gpu_milli
                elif not repair(tag, g):
                    still.append((tag, g))
            pending = still
        if fix is not None and pol.defragment and arrived * 100 >= next_repair * cap:
            fix.defragment(fix.allowance(out.pods_arrived))
            out.evictions = fix.evictions
        if fix is not None:
            while arrived * 100 >= next_repair * cap:
                next_repair += fix.budget.every_pct
        while next_pct <= v.stop_pct and arrived * 100 >= next_pct * cap:
            out.checkpoints.append(
                Checkpoint(
                    next_pct, c.allocated, c.whole_cliques(), gangs[0], gangs[1], gangs[2], gangs[3]
                )
            )
            next_pct += 1
    out.seconds = time.perf_counter() - t0
    return out
