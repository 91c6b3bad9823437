"""Federation: the view across clusters that share one Redis, and placement of a shape.

Each cluster's controller publishes a summary into the shared Redis (`StateStore.put_summary`,
under the cluster's own hash tag; `keys.py`). Two formats are read here:

* the basic summary (`pyctl.controller.summary.summary_bytes`): totals, fragment by category,
  by GPU model, pending and blocked pods, scheduling success, a heartbeat;
* the rich summary (`pyctl.controller.summary.federation_summary_bytes`): the same keys, plus
  the cluster's node models (`snapshot`, pyctl's snapshot format) and its target workload M
  (`workload`), so that another cluster can compute the fragment delta of placing a shape on
  each of its nodes.

`read_members` reads every member (fresh or stale: a member whose heartbeat is older than its
TTL is marked stale and counted in `pyctl_federation_members_stale`; one whose summary does not
decode as a `SummaryRecord`, every number finite, non-negative and bounded, is shown with its
error, never used, and counted in `pyctl_quarantined_records_total{store="summaries"}`); `place`
ranks the fresh
clusters, then their nodes, for one replica of a shape by fragment delta (FGD: the placement that
grows fragment least, under each cluster's own workload M). The CLI is `pyctl federation`, the
HTTP view `GET /federation` (`pyctl.controller.http`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import msgspec

from pyctl.controller.controller import FEDERATION_INTERVAL
from pyctl.controller.summary import SummaryRecord, decode_summary
from pyctl.core.fragmentation import FragmentationModel, shape_dict
from pyctl.core.types import Assignment
from pyctl.jsontypes import JsonObject, plain
from pyctl.metrics import Metrics
from pyctl.model import Shape, Snapshot, Workload
from pyctl.snapshot import SnapshotError, load_snapshot, shape_from_json
from pyctl.state.store import MemberSummary, StateStore, StoreError

GPU = 1000.0

log = logging.getLogger("pyctl.federation")


# -- reading ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Member:
    """One federation member as read from the shared store."""

    cluster: str
    stale: bool
    age_seconds: float
    ttl_seconds: int
    #: the decoded summary (None when it did not decode; then `error` says why)
    summary: SummaryRecord | None = None
    error: str = ""

    @property
    def _s(self) -> SummaryRecord:
        return self.summary if self.summary is not None else _EMPTY

    @property
    def nodes(self) -> int:
        return self._s.nodes

    @property
    def idle_gpus(self) -> float:
        return self._s.idle_gpu_milli / GPU

    @property
    def fragment_gpus(self) -> float:
        return self._s.fragment_gpu_milli / GPU

    @property
    def fragmentation_rate(self) -> float:
        return self._s.fragmentation_rate

    @property
    def pending(self) -> int:
        return self._s.pending

    @property
    def blocked(self) -> int:
        return sum(self._s.blocked.values())

    @property
    def scheduling_success(self) -> float:
        return self._s.scheduling_success

    @property
    def rich(self) -> bool:
        """Whether the member publishes its node models (can be ranked by `place`)."""
        return self._s.rich

    def to_json(self) -> JsonObject:
        s = self._s
        if self.summary is None:  # invalid: no figure of it is known
            return {
                "cluster": self.cluster,
                "stale": self.stale,
                "age_seconds": round(self.age_seconds, 3),
                "ttl_seconds": self.ttl_seconds,
                "error": self.error or "invalid",
                "placeable": False,
            }
        return {
            "cluster": self.cluster,
            "stale": self.stale,
            "age_seconds": round(self.age_seconds, 3),
            "ttl_seconds": self.ttl_seconds,
            "error": self.error or None,
            "nodes": self.nodes,
            "idle_gpus": round(self.idle_gpus, 3),
            "fragment_gpus": round(self.fragment_gpus, 3),
            "fragmentation_rate": round(self.fragmentation_rate, 4),
            "categories_gpus": {k: round(v / GPU, 3) for k, v in s.categories.items()},
            "idle_mig_slices": s.idle_mig_slices,
            "fragment_mig_slices": s.fragment_mig_slices,
            "pending": self.pending,
            "blocked": dict(s.blocked),
            "scheduling_success": self.scheduling_success,
            "by_model": {
                k: {"idle_gpu_milli": v.idle_gpu_milli, "fragment_gpu_milli": v.fragment_gpu_milli}
                for k, v in s.by_model.items()
            },
            "placeable": self.rich,
        }


_EMPTY = SummaryRecord(cluster="")


def decode_member(cluster: str, m: MemberSummary, head_only: bool = False) -> Member:
    """A member as read; a summary that does not decode (or holds a value out of its bounds)
    leaves `summary` None and says why in `error`. `head_only`: its summary is a `SummaryHead`
    (totals only; its snapshot is not for `place`)."""
    if m.error:  # the store could not read it as a summary (`MemberSummary.error`)
        return Member(cluster, m.stale, m.age_seconds, m.ttl_seconds, None, m.error[:500])
    try:
        summary = decode_summary(m.summary, head_only)
        return Member(cluster, m.stale, m.age_seconds, m.ttl_seconds, summary)
    except ValueError as e:
        error = f"summary does not decode: {e}"[:500]
    return Member(cluster, m.stale, m.age_seconds, m.ttl_seconds, None, error)


#: (observer, member, digest of the summary) of the bad summaries already counted
_COUNTED: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()


def _count_bad(metrics: Metrics, observer: str, m: Member, data: bytes) -> None:
    """A member's summary that does not decode: counted and logged once per summary."""
    key = (observer, m.cluster, hashlib.blake2b(data, digest_size=16).digest())
    if key in _COUNTED:
        return
    _COUNTED[key] = None
    while len(_COUNTED) > 1000:
        _COUNTED.popitem(last=False)
    metrics.workflow.quarantined.labels(observer, "summaries").inc()
    log.warning(
        "federation summary invalid; member skipped",
        extra={"member": m.cluster, "error": m.error[:300]},
    )


class MemberDecoder:
    """`decode_member` for a reader that reads the members again and again (the controller's
    `watch_members`, the HTTP view): a member's summary is decoded only when its bytes changed
    since the last read (a 5,000-node rich summary is megabytes of JSON); its age and staleness
    are always the store's latest. `head_only`: summaries are read for their totals
    (`decode_member`), as the controller's watcher needs them."""

    def __init__(self, head_only: bool = False) -> None:
        self.head_only = head_only
        self._last: dict[str, tuple[bytes, Member]] = {}
        #: summaries decoded at the last `decode_all` (the others were unchanged)
        self.decoded = 0

    def __call__(self, cluster: str, m: MemberSummary) -> Member:
        got = self._last.get(cluster)
        if got is not None and got[0] == m.summary and not m.error:
            d = got[1]
            return Member(cluster, m.stale, m.age_seconds, m.ttl_seconds, d.summary, d.error)
        member = decode_member(cluster, m, self.head_only)
        self._last[cluster] = (m.summary, member)
        self.decoded += 1
        return member

    def decode_all(self, members: Mapping[str, MemberSummary]) -> list[Member]:
        """Every member of `members` sorted by cluster name; forgets the ones not in it."""
        self.decoded = 0
        for gone in [c for c in self._last if c not in members]:
            del self._last[gone]
        return [self(c, members[c]) for c in sorted(members)]


async def read_members(
    store: StateStore,
    metrics: Metrics | None = None,
    observer: str | None = None,
    decoder: MemberDecoder | None = None,
) -> list[Member]:
    """Every member still known (fresh and stale), sorted by cluster name; with `metrics`, a
    member whose summary does not decode is counted (once per summary). `decoder`: kept between
    reads, it decodes only the summaries that changed since the last. Raises `StoreError`."""
    members = await store.get_members()
    if decoder is not None:
        out = decoder.decode_all(members)
    else:
        out = [decode_member(c, members[c]) for c in sorted(members)]
    if metrics is not None:
        for m in out:
            if m.summary is None:
                stored = members[m.cluster]
                data = stored.summary or stored.error.encode()
                _count_bad(metrics, observer or store.cluster, m, data)
    return out


def export_stale(metrics: Metrics, cluster: str, members: Sequence[Member]) -> int:
    """Set `pyctl_federation_members_stale` (seen from `cluster`); returns the count."""
    n = sum(1 for m in members if m.stale)
    metrics.federation_members_stale.labels(cluster).set(n)
    return n


async def federation_status(
    store: StateStore,
    metrics: Metrics | None = None,
    cluster: str | None = None,
    decoder: MemberDecoder | None = None,
) -> JsonObject:
    """The view across clusters as JSON (the CLI's `--json` and `GET /federation`); updates the
    stale-member gauge when `metrics` is given. Raises `StoreError`."""
    members = await read_members(store, metrics, cluster, decoder)
    stale = sum(1 for m in members if m.stale)
    if metrics is not None:
        export_stale(metrics, cluster or store.cluster, members)
    return {
        "observer": cluster or store.cluster,
        "time": time.time(),
        "members": [m.to_json() for m in members],
        "stale": stale,
        "fresh": len(members) - stale,
    }


async def watch_members(
    store: StateStore, metrics: Metrics, cluster: str, interval: float = FEDERATION_INTERVAL
) -> None:
    """Keep `pyctl_federation_members_stale` current (run it in the controller's task group);
    a failing store leaves the last value and is retried at the next interval. A member's
    summary is decoded again only when its bytes changed (`MemberDecoder`), and only its head:
    the staleness and the count of summaries that do not decode need no node models."""
    decoder = MemberDecoder(head_only=True)
    while True:
        try:
            export_stale(metrics, cluster, await read_members(store, metrics, cluster, decoder))
        except StoreError:
            metrics.store_errors.labels(cluster).inc()
        await anyio.sleep(interval)


# -- placement -------------------------------------------------------------------------------
class ShapeError(ValueError):
    """A SHAPE argument pyctl cannot read; the message says what is wrong."""


_SHAPE_ALIASES = {
    "cpu": "cpu_milli",
    "cpu_milli": "cpu_milli",
    "memory_mib": "memory_mib",
    "mem": "memory_mib",
    "memory": "memory_mib",
    "gpus": "gpus",
    "gpu": "gpus",
    "gpu_milli": "gpu_milli",
    "mig": "mig_profile",
    "mig_profile": "mig_profile",
    "gpu_model": "gpu_models",
    "gpu_models": "gpu_models",
    "pool": "gpu_pool",
    "gpu_pool": "gpu_pool",
    "gpumem": "gpu_memory_mib",
    "gpu_memory_mib": "gpu_memory_mib",
    "rdma": "rdma",
}


def parse_shape(text: str) -> Shape:
    """A shape from `key=value,...` (cpu_milli, memory_mib, gpus, gpu_milli, mig_profile,
    gpu_models separated by '|'; `cpu=8` means 8 cores, `mem`/`memory` is MiB, `mig` is
    mig_profile; `pool`/`gpu_pool` the GPU sharing pool, `gpumem`/`gpu_memory_mib` MiB per GPU,
    docs/sharing.md; `rdma` of the nodes' RDMA resource) or from a JSON object in pyctl's
    workload shape format. A GPU shape of the default pool without gpu_milli or GPU memory asks
    for whole GPUs; in another pool it asks for one replica of each GPU."""
    text = text.strip()
    if not text:
        raise ShapeError("empty shape")
    if text.startswith("{"):
        try:
            raw = msgspec.json.decode(text)
            shape = shape_from_json(raw, "shape", need_weight=False)
        except (msgspec.DecodeError, SnapshotError) as e:
            raise ShapeError(f"shape {text!r}: {e}") from None
    else:
        amounts: dict[str, int] = {}
        mig_profile: str | None = None
        gpu_pool = ""
        gpu_models: tuple[str, ...] = ()
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not sep or not value:
                raise ShapeError(f"shape {text!r}: {part!r} is not key=value")
            name = _SHAPE_ALIASES.get(key)
            if name is None:
                known = ", ".join(sorted(_SHAPE_ALIASES))
                raise ShapeError(f"shape {text!r}: unknown key {key!r} (known: {known})")
            if name == "mig_profile":
                mig_profile = value
            elif name == "gpu_pool":
                gpu_pool = value
            elif name == "gpu_models":
                gpu_models = tuple(v for v in value.split("|") if v)
            else:
                try:
                    num = float(value)
                except ValueError:
                    raise ShapeError(f"shape {text!r}: {key}={value!r} is not a number") from None
                if not math.isfinite(num) or num < 0:
                    raise ShapeError(f"shape {text!r}: {key} must be a non-negative number")
                amounts[name] = round(num * 1000) if key == "cpu" else int(num)
        shape = Shape(
            cpu_milli=amounts.get("cpu_milli", 0),
            memory_mib=amounts.get("memory_mib", 0),
            gpus=amounts.get("gpus", 0),
            gpu_milli=amounts.get("gpu_milli", 0),
            mig_profile=mig_profile,
            gpu_models=gpu_models,
            gpu_pool=gpu_pool,
            gpu_memory_mib=amounts.get("gpu_memory_mib", 0),
            rdma=amounts.get("rdma", 0),
        )
    if (
        shape.gpus
        and not shape.gpu_milli
        and shape.mig_profile is None
        and not shape.gpu_pool
        and not shape.gpu_memory_mib
    ):
        shape = Shape(
            cpu_milli=shape.cpu_milli,
            memory_mib=shape.memory_mib,
            gpus=shape.gpus,
            gpu_milli=1000,
            gpu_models=shape.gpu_models,
            rdma=shape.rdma,
        )
    if shape.is_cpu_only:
        raise ShapeError(f"shape {text!r}: asks for no GPU (gpus or mig_profile)")
    return shape


@dataclass(frozen=True)
class NodeRank:
    node: str
    gpu_model: str
    #: fragment after minus before, in GPUs (negative: the placement reduces fragmentation)
    delta_gpus: float
    delta_mig_slices: float
    assignment: Assignment


@dataclass(frozen=True)
class ClusterRank:
    cluster: str
    #: the best node's delta (the cluster's rank key); None when no node admits the shape
    delta_gpus: float | None
    delta_mig_slices: float | None
    fragmentation_rate: float
    nodes: list[NodeRank]
    #: why the cluster is not ranked ("" when it is)
    skipped: str = ""


def _key(delta_gpus: float, delta_mig: float, mig: bool) -> tuple[float, float]:
    return (delta_mig, delta_gpus) if mig else (delta_gpus, delta_mig)


def rank_nodes(
    snapshot: Snapshot, workload: Workload, shape: Shape, limit: int | None = None
) -> list[NodeRank]:
    """The nodes that admit one replica of `shape`, best first: least fragment growth under
    `workload` (MIG shapes: MIG slices first), then name."""
    if not snapshot.nodes:
        return []
    model = FragmentationModel(snapshot)
    mig = shape.mig_profile is not None
    out: list[NodeRank] = []
    for n in snapshot.nodes:
        if shape.gpu_models and n.gpu_model not in shape.gpu_models:
            continue
        d = model.place_delta(n.name, shape, workload)
        if d is None:
            continue
        out.append(
            NodeRank(
                n.name,
                n.gpu_model,
                d.fragment_gpu_milli / GPU,
                d.fragment_mig_slices,
                d.assignment,
            )
        )
    out.sort(key=lambda r: (*_key(r.delta_gpus, r.delta_mig_slices, mig), r.node))
    return out[:limit] if limit is not None else out


def place(
    members: Sequence[Member], shape: Shape, nodes_per_cluster: int | None = 5
) -> list[ClusterRank]:
    """Rank the clusters, then their nodes, for one replica of `shape`. Ranked clusters come
    first (by their best node's fragment delta, then lower fragmentation rate, then name);
    clusters that cannot be ranked follow, each with the reason (stale, no per-node data, no
    node admits the shape)."""
    mig = shape.mig_profile is not None
    ranked: list[ClusterRank] = []
    skipped: list[ClusterRank] = []
    for m in members:

        def skip(why: str, m: Member = m) -> None:
            skipped.append(ClusterRank(m.cluster, None, None, m.fragmentation_rate, [], why))

        if m.error:
            skip(m.error)
            continue
        if m.stale:
            skip(f"stale (last summary {m.age_seconds:.0f}s old, ttl {m.ttl_seconds}s)")
            continue
        if not m.rich:
            skip("publishes no per-node data (basic summary)")
            continue
        try:
            snap = load_snapshot(m._s.snapshot)
            shapes = tuple(
                shape_from_json(s, f"workload[{i}]") for i, s in enumerate(m._s.workload or ())
            )
        except (SnapshotError, TypeError, KeyError, ValueError, RecursionError) as e:
            skip(f"per-node data does not decode: {e}")
            continue
        workload = Workload(shapes) if shapes else Workload((shape,))
        try:
            all_nodes = rank_nodes(snap, workload, shape)
        except ValueError as e:  # the core refused the member's data: that member only
            skip(f"per-node data refused: {e}"[:300])
            continue
        if not all_nodes:
            skip("no node admits the shape")
            continue
        best = all_nodes[0]
        ranked.append(
            ClusterRank(
                m.cluster,
                best.delta_gpus,
                best.delta_mig_slices,
                m.fragmentation_rate,
                all_nodes[:nodes_per_cluster] if nodes_per_cluster is not None else all_nodes,
            )
        )
    ranked.sort(
        key=lambda c: (
            *_key(c.delta_gpus or 0.0, c.delta_mig_slices or 0.0, mig),
            c.fragmentation_rate,
            c.cluster,
        )
    )
    return ranked + sorted(skipped, key=lambda c: c.cluster)


def placement_json(shape: Shape, ranks: Sequence[ClusterRank]) -> JsonObject:
    return {
        "shape": plain(shape_dict(shape)),
        "clusters": [
            {
                "cluster": c.cluster,
                "rank": i + 1 if not c.skipped else None,
                "delta_gpus": c.delta_gpus,
                "delta_mig_slices": c.delta_mig_slices,
                "fragmentation_rate": c.fragmentation_rate,
                "skipped": c.skipped or None,
                "nodes": [
                    {
                        "node": n.node,
                        "gpu_model": n.gpu_model,
                        "delta_gpus": n.delta_gpus,
                        "delta_mig_slices": n.delta_mig_slices,
                        "assignment": plain(n.assignment),
                    }
                    for n in c.nodes
                ],
            }
            for i, c in enumerate(ranks)
        ],
    }
