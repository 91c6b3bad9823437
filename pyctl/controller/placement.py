"""Placement advice: which of the scheduler's candidate nodes a pod should not go to, and how
much pyctl prefers each of the others, by pyctl's one placement policy
(`pyctl.core.policy`, rust/src/placement), on the controller's current per-node models
(`Reconciler.models`) and workload M. The wire format is the Kubernetes adapter's
(`pyctl.cluster.kube.extender`), the HTTP server `pyctl.serve.extender`.

- filter: a node is removed when the policy finds no placement the kubelet would admit there
  (e.g. no NUMA zone with enough free GPUs under ``single-numa-node``), so pods stop failing
  kubelet admission with TopologyAffinityError; a node whose room a rescue promised to another
  pending pod (`reservations`) is removed for every other pod; and the node a pod of a workload
  was just moved off by compaction (`departures`) is removed for that workload's pods, so the
  replacement does not land back where it came from. Nodes pyctl does not model (not seen yet,
  or not understood) pass: the extender only removes nodes it knows to be wrong. CPU-only pods
  pass everywhere (their placement is the scheduler's business), and so do pods whose GPUs come
  from DRA claims: the kube-scheduler's own DRA plugin decides which nodes can allocate their
  claims (exactly, with the devices' counters and taints).
- prioritize: the policy's rank of each node (`extender_scores`, nodes in name order): the
  policy's choice 10, other nodes of the same rank 9, the rest 1..8 by their fragment score, 0
  where the pod is not admitted or the node is not modelled. The scheduler's weight for the
  extender (deploy/scheduler) makes that choice the scheduler's. A DRA pod is ranked by the
  same policy, its shape taken from its claims (`Reconciler.shape_of`: DRA devices only, aligned
  as its matchAttribute asks); one whose claims pyctl cannot tell gets no preference.

Each node's rank for a pod shape is computed once and kept (`RankTable`, one per controller,
shared by the extender's workers) until that node's model object changes (the reconciler replaces
it) or M changes, so a request costs a lookup per node. For the hot shapes (asked about recently,
then those of the pods waiting for the scheduler) the ranks are computed ahead: the reconciler
recomputes those a re-score made stale, on the model it scored (`RankTable.refreshed`), and a
background task ranks the missing ones when the reconciler has nothing to score
(`RankTable.keep_warm`). So the scheduler does not wait for the nodes that changed since its last
call (the binds before it, the churn), for every node after M changed, nor for every candidate
the first time a new workload's pods are placed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Mapping

import anyio
import anyio.lowlevel

from pyctl.cluster.records import PodRecord
from pyctl.cluster.translate import pod_shape
from pyctl.controller.domains import DomainIdle
from pyctl.controller.reconcile import Reconciler
from pyctl.core import policy
from pyctl.core.fragmentation import FragmentationModel
from pyctl.metrics import Metrics
from pyctl.model import Node, Shape, Snapshot, Workload

log = logging.getLogger("pyctl.placement")

#: cached ranks beyond this many (shape, node) pairs are dropped (then rebuilt as needed)
MAX_CACHED = 1 << 18
#: a pod shape the scheduler asked about within this many seconds has its ranks computed ahead
HOT_SECONDS = 120.0
#: at most this many shapes are ranked ahead (the most recently asked)
MAX_HOT = 8


class NotKept(Exception):
    """A node's rank was to be served only if kept, and it is missing or stale."""


def no_reservations() -> Mapping[str, str]:
    return {}


class RankTable:
    """Each node's rank per (pod shape, M), kept per node model object; shared by the threads
    that read it (the extender's workers) and the one that keeps it fresh (the controller's event
    loop, `refreshed`). Every entry is checked against the node's current model object before
    use, so a rank is never served for a model other than the one it was computed on; the
    threads only add and replace entries (atomic under the GIL)."""

    def __init__(
        self,
        models: Mapping[str, Node],
        workload: Callable[[], Workload],
        metrics: Metrics | None = None,
        cluster: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._models = models
        self._workload = workload
        self._clock = clock
        self._node_models: dict[str, tuple[Node, FragmentationModel]] = {}
        #: (shape, workload) -> node -> (model node it was computed on, rank)
        self._ranks: dict[tuple[Shape, Workload], dict[str, tuple[Node, policy.Ranked | None]]] = {}
        self._cached = 0
        #: shape -> when a request last asked for its ranks (the shapes ranked ahead)
        self._asked: dict[Shape, float] = {}
        #: the shapes of the pods waiting for the scheduler (`keep_warm`), ranked ahead too
        self._pending: tuple[Shape, ...] = ()
        #: ranks computed while a request waited, and ahead of requests
        self.computed = 0
        self.ahead = 0
        self._counters = (
            (
                metrics.extender_ranks.labels(cluster, "request"),
                metrics.extender_ranks.labels(cluster, "ahead"),
            )
            if metrics is not None
            else None
        )

    def _model(self, name: str, node: Node) -> FragmentationModel:
        hit = self._node_models.get(name)
        if hit is not None and hit[0] is node:
            return hit[1]
        model = FragmentationModel(Snapshot((node,)))
        self._node_models[name] = (node, model)
        if len(self._node_models) > 2 * len(self._models) + 16:  # nodes gone: forget them
            for gone in [n for n in list(self._node_models) if n not in self._models]:
                self._node_models.pop(gone, None)
        return model

    def _per(self, key: tuple[Shape, Workload]) -> dict[str, tuple[Node, policy.Ranked | None]]:
        per = self._ranks.get(key)
        if per is None:
            if self._cached > MAX_CACHED or len(self._ranks) > 256:
                self._ranks.clear()
                self._cached = 0
            # ranks under an M other than this one are not asked for again
            for old in [k for k in list(self._ranks) if k[1] != key[1]]:
                self._ranks.pop(old, None)
            per = self._ranks[key] = {}
        return per

    def _keep(
        self,
        per: dict[str, tuple[Node, policy.Ranked | None]],
        name: str,
        node: Node,
        shape: Shape,
        workload: Workload,
        model: FragmentationModel | None = None,
    ) -> policy.Ranked | None:
        """Node `name`'s rank of `shape` under `workload`, computed on `node` (`model`: the node
        alone, if the caller has it) and kept in `per`."""
        alone = model if model is not None else self._model(name, node)
        (r,) = policy.rank(alone, shape, workload, [name])
        if name not in per:
            self._cached += 1
        per[name] = (node, r)
        return r

    def _not_hot(self, shape: Shape, e: ValueError) -> None:
        """A shape the core refuses is no longer ranked ahead (a request for it answers with
        the error)."""
        self._asked.pop(shape, None)
        self._pending = tuple(s for s in self._pending if s != shape)
        log.warning("shape not ranked ahead", extra={"shape": repr(shape), "error": str(e)})

    def rank(
        self, shape: Shape, names: tuple[str, ...], compute: bool = True
    ) -> dict[str, policy.Ranked | str | None]:
        """The policy's rank of `shape` on each node; "unknown" where pyctl has no model.
        `compute` False: only kept ranks, `NotKept` if a node's is missing or stale (nothing is
        computed then)."""
        workload = self._workload()
        per = self._per((shape, workload))
        out: dict[str, policy.Ranked | str | None] = {}
        models, cached = self._models.get, per.get
        computed = 0
        for name, node, hit in zip(names, map(models, names), map(cached, names), strict=True):
            if hit is not None and hit[0] is node:  # kept, for the node's model now
                out[name] = hit[1]
            elif node is None:
                out[name] = "unknown"
            elif not compute:
                raise NotKept(name)
            else:
                out[name] = self._keep(per, name, node, shape, workload)
                computed += 1
        self._asked[shape] = self._clock()
        if len(self._asked) > 4 * MAX_HOT:
            for old in sorted(self._asked, key=self._asked.__getitem__)[:MAX_HOT]:
                self._asked.pop(old, None)
        if computed:
            self.computed += computed
            if self._counters is not None:
                self._counters[0].inc(computed)
        return out

    def hot(self) -> list[Shape]:
        """The shapes ranked ahead (at most `MAX_HOT`): those asked about within
        `HOT_SECONDS`, the most recent first, then those of the pods waiting for the scheduler
        (`keep_warm`), the most common first."""
        now = self._clock()
        # sorted() copies the items before it calls the key: a worker adding a shape meanwhile
        # does not change the dict under the iteration
        asked = sorted(self._asked.items(), key=lambda st: -st[1])
        out = [s for s, t in asked[:MAX_HOT] if now - t <= HOT_SECONDS]
        for s in self._pending:
            if len(out) >= MAX_HOT:
                break
            if s not in out:
                out.append(s)
        return out

    async def keep_warm(
        self,
        pending_shapes: Callable[[], Iterable[Shape]],
        busy: Callable[[], bool] = lambda: False,
        interval: float = 1.0,
        chunk: int = 256,
    ) -> None:
        """Every `interval` seconds, on the controller's event loop: take the shapes of the
        pods waiting for the scheduler (`pending_shapes`, the most common first), and rank every
        node for each hot shape (`hot`) whose rank is missing or was computed on another model:
        a shape the scheduler has not asked about yet (a new workload), a node not re-scored
        since M changed. `chunk` nodes at a time, the loop's other work between them; never
        while `busy()` (the reconciler has nodes to score: scores come first, the requests
        compute what is missing meanwhile)."""
        while True:
            await anyio.sleep(interval)
            try:
                if busy():
                    continue
                self._pending = tuple(pending_shapes())
                await self._warm(chunk, busy)
            except Exception:  # never the end of the loop: the requests compute what is missing
                log.exception("ranking ahead failed")

    async def _warm(self, chunk: int, busy: Callable[[], bool] = lambda: False) -> None:
        for shape in self.hot():
            workload = self._workload()
            per = self._per((shape, workload))
            stale = [
                n
                for n, node in self._models.items()
                if (h := per.get(n)) is None or h[0] is not node
            ]
            for i in range(0, len(stale), chunk):
                done = 0
                for name in stale[i : i + chunk]:
                    node = self._models.get(name)
                    hit = per.get(name)
                    if node is None or (hit is not None and hit[0] is node):
                        continue
                    try:
                        self._keep(per, name, node, shape, workload)
                    except ValueError as e:
                        self._not_hot(shape, e)
                        return
                    done += 1
                self._count_ahead(done)
                await anyio.lowlevel.checkpoint()
                if busy():
                    return  # nodes to score: the next pass goes on
                if self._workload() is not workload:
                    break  # M changed meanwhile: the next pass ranks under the new one

    def _count_ahead(self, done: int) -> None:
        if done:
            self.ahead += done
            if self._counters is not None:
                self._counters[1].inc(done)

    def refreshed(self, name: str, node: Node, model: FragmentationModel) -> None:
        """The reconciler re-scored node `name` (`model`: the node alone, as it scored it): its
        kept ranks for the hot shapes under the current M, if computed on another model of the
        node, are computed again now (the scheduler's next call is likely to ask: a pod was just
        bound there). Ranks not kept at all (M changed, a new shape, a new node) are left to
        `keep_warm`, which computes them in chunks, so that a re-score of every node does not
        hold the loop for every rank as well. A shape the core refuses is no longer ranked
        ahead (a request for it answers with the error)."""
        shapes = self.hot()
        if not shapes:
            return
        workload = self._workload()
        done = 0
        for shape in shapes:
            per = self._ranks.get((shape, workload))
            hit = per.get(name) if per is not None else None
            if per is None or hit is None or hit[0] is node:
                continue
            try:
                self._keep(per, name, node, shape, workload, model)
            except ValueError as e:
                self._not_hot(shape, e)
                continue
            done += 1
        if done:
            self._node_models[name] = (node, model)
            self._count_ahead(done)


class PlacementAdvisor:
    """Answers from a live view of the cluster: `models` (node name → model node, replaced
    whenever a node is re-translated, as `Reconciler.models` is), `workload` (a callable, since
    the controller re-derives M) and `reservations` (node → the pending pod a rescue made room
    for there)."""

    def __init__(
        self,
        models: Mapping[str, Node],
        workload: Callable[[], Workload],
        reservations: Callable[[], Mapping[str, str]] = no_reservations,
        departures: Callable[[], Mapping[str, str]] = no_reservations,
        shape_of: Callable[[PodRecord], Shape | None] = pod_shape,
        ranks: RankTable | None = None,
        domains: Callable[[], DomainIdle] | None = None,
    ) -> None:
        self._models = models
        #: each topology domain's idle GPU: the order ties are broken in (`_in_order`)
        self._domains = domains
        self.reservations = reservations
        #: workload ("namespace/kind/name") -> the node compaction just moved one of its pods off
        self.departures = departures
        self._shape_of = shape_of
        #: the kept ranks (shared with other advisors on the same models, e.g. one per worker)
        self.ranks = ranks if ranks is not None else RankTable(models, workload)
        #: prioritize answers that preferred a node, filter answers that removed one
        self.advised = 0
        self.filtered = 0

    @classmethod
    def for_reconciler(
        cls,
        reconciler: Reconciler,
        reservations: Callable[[], Mapping[str, str]] = no_reservations,
        departures: Callable[[], Mapping[str, str]] = no_reservations,
        ranks: RankTable | None = None,
    ) -> PlacementAdvisor:
        return cls(
            reconciler.models,
            lambda: reconciler.workload,
            reservations,
            departures,
            reconciler.shape_of,
            ranks,
            reconciler.domain_idle,
        )

    def rank(
        self, shape: Shape, names: tuple[str, ...], compute: bool = True
    ) -> dict[str, policy.Ranked | str | None]:
        """The policy's rank of `shape` on each node; "unknown" where pyctl has no model
        (`compute`: `RankTable.rank`)."""
        return self.ranks.rank(shape, names, compute)

    def filter(
        self, pod: PodRecord, names: tuple[str, ...], compute: bool = True
    ) -> dict[str, str]:
        """The candidate nodes `pod` must not go to, with why. `compute` False: from kept ranks
        only (`NotKept` if one is missing, and nothing is counted), as for every method here."""
        shape = self._shape_of(pod)
        ranks = self.rank(shape, names, compute) if shape is not None and _filtered(shape) else {}
        return self._count(self._failed(pod, names, shape, ranks))

    def _failed(
        self,
        pod: PodRecord,
        names: tuple[str, ...],
        shape: Shape | None,
        ranks: Mapping[str, policy.Ranked | str | None],
    ) -> dict[str, str]:
        """The filter's answer, from `ranks` (of `shape` on each of `names`, if `_filtered`)."""
        failed: dict[str, str] = {}
        reserved = self.reservations()
        if reserved:
            for name in names:
                holder = reserved.get(name)
                if holder is not None and holder != pod.key:
                    failed[name] = f"pyctl: room reserved for pending pod {holder}"
        left = self.departures().get(workload_key(pod))
        if left is not None and left in names and left not in failed:
            failed[left] = "pyctl: compaction moved this workload's pod off this node"
        if shape is None or not _filtered(shape):
            return failed  # the scheduler's business (DRA: its own allocator's)
        what = ""
        for name in names:
            if ranks[name] is None and name not in failed:
                node = self._models[name]
                if shape.mig_profile is None and node.gpu_pool != shape.gpu_pool:
                    failed[name] = (
                        f"pyctl: the pod asks for GPUs of {_pool(shape.gpu_pool)}, the "
                        f"node shares its GPUs as {_pool(node.gpu_pool)}"
                    )
                    continue
                policy_name = node.topology_policy
                what = what or _describe(shape)
                failed[name] = (
                    f"pyctl: cannot place {what} within the node's free NUMA "
                    f"resources (Topology Manager policy {policy_name})"
                )
        return failed

    def _count(self, failed: dict[str, str]) -> dict[str, str]:
        if failed:
            self.filtered += 1
        return failed

    def _advise(self, scores: dict[str, int]) -> dict[str, int]:
        if any(scores.values()):
            self.advised += 1
        return scores

    def choose(
        self, pod: PodRecord, names: tuple[str, ...], compute: bool = True
    ) -> tuple[dict[str, str], frozenset[str] | None]:
        """For a scheduler that asks once per pod (verb ``choose``): the filter's answer (the
        candidates `pod` must not go to, with why) and the policy's choice among the others, the
        candidates `prioritize` would score highest; None when it gives no preference (every
        score 0: the filter's answer stands). At the shipped weight the top score is the
        scheduler's choice anyway; this way it costs one call, and the scheduler skips its
        scoring when one node is left. The ranks are looked up once for both."""
        shape = self._shape_of(pod)
        ranks = self.rank(shape, names, compute) if shape is not None else {}
        failed = self._failed(pod, names, shape, ranks)
        self._count(failed)
        if shape is None:  # claims pyctl cannot tell: no preference
            return failed, None
        # the nodes `prioritize` would score highest, without scoring the others: the policy's
        # choice among the candidates left, and the node a rescue freed for this pod
        ordered, known = self._in_order((n for n in names if n not in failed), ranks, shape)
        choice = policy.extender_choice(known)
        if choice is None:
            return failed, None
        self.advised += 1
        return failed, frozenset([ordered[choice], *self._freed_for(pod, ranks, failed)])

    def prioritize(
        self, pod: PodRecord, names: tuple[str, ...], compute: bool = True
    ) -> dict[str, int]:
        """A score 0..MAX_EXTENDER_PRIORITY per candidate node."""
        shape = self._shape_of(pod)
        ranks = self.rank(shape, names, compute) if shape is not None else {}
        return self._advise(self._scores(pod, names, shape, ranks))

    def _scores(
        self,
        pod: PodRecord,
        names: tuple[str, ...],
        shape: Shape | None,
        ranks: Mapping[str, policy.Ranked | str | None],
    ) -> dict[str, int]:
        """The scores of `names`, from `ranks` (of `shape` on each of them)."""
        if shape is None:  # claims pyctl cannot tell: no preference
            return dict.fromkeys(names, 0)
        ordered, known = self._in_order(names, ranks, shape)
        scores = dict(zip(ordered, policy.extender_scores(known), strict=True))
        for node in self._freed_for(pod, ranks, ()):
            scores[node] = policy.MAX_EXTENDER_PRIORITY
        return {n: scores.get(n, 0) for n in names}

    def _in_order(
        self, names: Iterable[str], ranks: Mapping[str, policy.Ranked | str | None], shape: Shape
    ) -> tuple[list[str], list[policy.Ranked | None]]:
        """`names` in the order the policy breaks ties in, and their ranks in that order (None:
        the node does not admit the pod, or pyctl does not model it): by name, with the node
        the topology domains' tightest fit puts first among those of the best rank moved to the
        front (`DomainIdle.order`: domains already broken first, a gang's pod into the tightest
        domain that holds its gang). Only the first of the best rank is the policy's choice
        (`extender_choice`; `extender_scores` gives the others of that rank 9 wherever they
        are), so only the tied nodes' domains are looked at."""
        ordered = sorted(names)
        ranked = [
            r if isinstance(r, policy.Ranked) else None for r in map(ranks.__getitem__, ordered)
        ]
        if self._domains is None:
            return ordered, ranked
        best = min((r.rank for r in ranked if r is not None), default=None)
        tied = [n for n, r in zip(ordered, ranked, strict=True) if r is not None and r.rank == best]
        if len(tied) > 1:
            first = self._domains().order(tied, shape)[0]
            i = ordered.index(first)
            ordered.insert(0, ordered.pop(i))
            ranked.insert(0, ranked.pop(i))
        return ordered, ranked

    def _freed_for(
        self,
        pod: PodRecord,
        ranks: Mapping[str, policy.Ranked | str | None],
        excluded: Container[str],
    ) -> list[str]:
        """The candidates (those `ranks` holds, but `excluded`) a rescue freed for `pod` that
        admit it: where it goes, beside the policy's choice."""
        return [
            n
            for n, holder in self.reservations().items()
            if holder == pod.key and n not in excluded and isinstance(ranks.get(n), policy.Ranked)
        ]


def _filtered(shape: Shape) -> bool:
    """Whether the filter looks at the ranks of `shape` (GPUs the device plugin serves; CPU-only
    pods are the scheduler's business, DRA pods its own allocator's)."""
    return not shape.is_cpu_only and not shape.dra


def workload_key(pod: PodRecord) -> str:
    """The workload a pod belongs to (its controller), as compaction names it."""
    return f"{pod.namespace}/{pod.owner_kind}/{pod.owner_name}"


def _describe(s: Shape) -> str:
    if s.mig_profile:
        return f"one MIG {s.mig_profile} instance"
    if s.gpu_milli == 0 and s.gpus:
        return f"{s.gpus} replica{'s' if s.gpus != 1 else ''} of {_pool(s.gpu_pool)}"
    return f"{s.gpus} GPU{'s' if s.gpus != 1 else ''}"


def _pool(pool: str) -> str:
    """A GPU sharing pool by name (docs/sharing.md)."""
    return {"": "nvidia.com/gpu", "hami": "HAMi"}.get(pool, pool)
