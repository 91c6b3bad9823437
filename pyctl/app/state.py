"""Reading a running controller's state back from the shared store (`pyctl status`,
`pyctl explain`): the records its store loop mirrored, the summary it published, its workflow
records. Nothing here talks to the Kubernetes API server, and nothing is written: the store is
read at one instant (`StateReader.read`), a record that does not decode is skipped and named,
and a workflow record that does not decode is listed, not quarantined (that is the engine's
job).

The records are turned into the controller's view by the controller's own code: a
`ClusterCache` filled with them and a `Reconciler` that translates every node
(`pyctl.cluster.translate.model_of`) and scores it under the workload M the controller
published (or, when none is published, M derived from the stored pods, as the controller does
at start). What `status` and `explain` say is therefore what the controller computes from the
same records; docs/state.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyctl.app.config import Config
from pyctl.cluster.records import KINDS
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import Summary
from pyctl.federation import Member, decode_member
from pyctl.metrics import Metrics
from pyctl.model import Node, Workload
from pyctl.snapshot import SnapshotError, load_snapshot, load_workload
from pyctl.state.store import (
    MemberSummary,
    StateLostError,
    StateReader,
    StoredState,
    StoreError,
)
from pyctl.state.workflows import Quarantined, WorkflowRecord, WorkflowStore
from pyctl.workflows import rescue
from pyctl.workflows.compactor import departure_seconds, departures
from pyctl.workflows.engine import Workflow, WorkflowData, decode
from pyctl.workflows.kinds import builtin_registry

log = logging.getLogger("pyctl.state")


class NoStateError(StoreError):
    """The store holds no state of the cluster (no controller has written it there)."""


@dataclass(frozen=True)
class Published:
    """The summary the controller holding the Lease published (only the leader publishes):
    its age on the store's clock, and what it carries."""

    age_seconds: float
    ttl_seconds: int
    #: the summary as federation decodes it (totals, categories, scheduling success, ...)
    member: Member
    #: the publisher's wall clock when it was made (seconds since the epoch; None if absent)
    heartbeat: float | None
    #: the workload M the controller scores under (None: not in the summary, or not readable)
    workload: Workload | None
    #: every node's model as the controller had it (None: not in the summary, or not readable)
    models: dict[str, Node] | None = None
    #: why M or the models could not be read from it ("" when they could, or are absent)
    workload_error: str = ""

    @property
    def fresh(self) -> bool:
        return not self.member.stale and not self.member.error


@dataclass
class StoredView:
    """One cluster as its controller stored it, rebuilt by the controller's own code."""

    cluster: str
    #: where it was read from (the store, password masked)
    source: str
    state: StoredState
    published: Published | None
    #: why the summary could not be read ("" if it could, or there is none)
    summary_error: str
    workflows: list[Workflow[WorkflowData]]
    #: workflow records that do not decode: id -> why (left in place)
    bad_workflows: dict[str, str]
    #: workflow records the engine moved aside: id -> (reason, as stored)
    quarantined: dict[str, Quarantined]
    #: why the workflow records could not be read ("" if they could)
    workflow_error: str
    cache: ClusterCache
    reconciler: Reconciler
    #: where M comes from: "published" (the controller's own), "derived" (from the stored pods,
    #: as the controller derives it), or "default" (no GPU pods to derive it from)
    workload_source: str
    #: nodes whose reconcile raised (an error in pyctl, isolated here): name -> why
    failed_nodes: dict[str, str] = field(default_factory=dict)

    @property
    def now(self) -> float:
        """The store's clock when the state was read (seconds since the epoch)."""
        return self.state.now

    def reservations(self) -> Mapping[str, str]:
        """Nodes an active rescue keeps for its pending pod (node -> pod), as the controller's
        compaction loop and scheduler extender see them (`rescue.reservations`)."""
        return rescue.reservations(self.workflows)

    def departures(self, cfg: Config) -> Mapping[str, str]:
        """Workload -> the node a recent move took one of its pods off (kept off it for a while
        by the extender), from the stored workflows (`compactor.departures`)."""
        return departures(self.workflows, self.now, departure_seconds(cfg.workflow.interval))


def published_of(m: MemberSummary, cluster: str) -> Published:
    """A published summary as read: federation's decoding, the heartbeat and M."""
    member = decode_member(cluster, m)
    s = member.summary
    heartbeat = s.heartbeat if s is not None and s.heartbeat > 0 else None
    workload: Workload | None = None
    models: dict[str, Node] | None = None
    error = ""
    if s is not None and s.workload is not None and s.snapshot is not None:
        try:
            workload = load_workload({"shapes": s.workload})
            models = {n.name: n for n in load_snapshot(s.snapshot).nodes}
        except (SnapshotError, TypeError, ValueError) as e:
            workload, models = None, None
            error = f"the published workload or node models do not decode: {e}"
    return Published(m.age_seconds, m.ttl_seconds, member, heartbeat, workload, models, error[:300])


def decode_workflows(
    records: Mapping[str, WorkflowRecord],
) -> tuple[list[Workflow[WorkflowData]], dict[str, str]]:
    """Every workflow record that decodes (`engine.decode`, the engine's own check, against the
    kinds pyctl runs), and the others by id with why; one bad record never hides the others."""
    good: list[Workflow[WorkflowData]] = []
    bad: dict[str, str] = {}
    registry = builtin_registry()
    for wid, rec in sorted(records.items()):
        try:
            good.append(decode(rec.data, registry))
        except ValueError as e:
            bad[wid[:200]] = " ".join(str(e).split())[:300]
    return good, bad


def build_view(
    cfg: Config,
    source: str,
    state: StoredState,
    summary: MemberSummary | None,
    summary_error: str = "",
    workflows: Mapping[str, WorkflowRecord] | None = None,
    quarantined: Mapping[str, Quarantined] | None = None,
    workflow_error: str = "",
) -> StoredView:
    """The controller's view of the stored records, by the controller's code (no I/O)."""
    published = published_of(summary, cfg.cluster) if summary is not None else None
    cache = ClusterCache()
    for kind in KINDS:
        cache.replace(kind, list(state.records(kind).values()))
    fixed = published.workload if published is not None else None
    reconciler = Reconciler(
        cache, Metrics(), cfg.cluster, workload=fixed, default_policy=cfg.default_topology_policy
    )
    if fixed is not None:
        source_of_m = "published"
    else:
        source_of_m = "derived" if reconciler.refresh_workload() else "default"
    if published is not None and published.models is not None:
        # each node is translated from its records with the controller's last model as the
        # previous one, as the controller does (replicas of shared GPUs stay where they were
        # attributed); a node the records no longer hold is dropped by its reconcile
        reconciler.models.update(published.models)
    failed: dict[str, str] = {}
    for name in sorted(set(cache.nodes) | set(reconciler.models)):
        try:
            reconciler.reconcile(name)
        except Exception as e:  # a bug in pyctl on one node: isolated, said, the others go on
            failed[name] = f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]
            log.warning("node not modelled", extra={"node": name, "error": failed[name]})
    wfs, bad = decode_workflows(workflows or {})
    return StoredView(
        cluster=cfg.cluster,
        source=source,
        state=state,
        published=published,
        summary_error=summary_error,
        workflows=wfs,
        bad_workflows=bad,
        quarantined=dict(quarantined or {}),
        workflow_error=workflow_error,
        cache=cache,
        reconciler=reconciler,
        workload_source=source_of_m,
        failed_nodes=failed,
    )


def summarize(view: StoredView) -> tuple[Summary | None, str]:
    """The controller's summary of the stored records (`Reconciler.summary`), or why it could
    not be made. Its scheduling success is not meaningful here (it is a window over watch
    events): the published one is the controller's."""
    try:
        return view.reconciler.summary(view.now), ""
    except Exception as e:  # isolated: status still shows everything else
        return None, f"{type(e).__name__}: {' '.join(str(e).split())}"[:300]


async def read_stored(
    cfg: Config, reader: StateReader, workflows: WorkflowStore | None, source: str
) -> StoredView:
    """Read everything of `cfg.cluster` from `reader` (and `workflows`) and build the view.
    Raises `NoStateError` when the store holds no state of the cluster, `StoreError` when it
    cannot be read; a summary or workflow records that cannot be read are said in the view."""
    try:
        state = await reader.read()
    except StateLostError:
        raise NoStateError(
            f"{source} holds no pyctl state of cluster {cfg.cluster!r} (is a controller running "
            f"with this Redis and --cluster {cfg.cluster}?)"
        ) from None
    summary: MemberSummary | None = None
    summary_error = ""
    try:
        summary = await reader.read_summary()
    except StoreError as e:
        summary_error = str(e)[:300]
    records: dict[str, WorkflowRecord] = {}
    quarantined: dict[str, Quarantined] = {}
    workflow_error = ""
    if workflows is not None:
        try:
            records = await workflows.list()
            quarantined = await workflows.quarantined()
        except StoreError as e:
            workflow_error = str(e)[:300]
    return build_view(
        cfg, source, state, summary, summary_error, records, quarantined, workflow_error
    )


async def read_view(cfg: Config) -> StoredView:
    """The state of `cfg.cluster` in the Redis of `cfg.redis` (the settings `pyctl run` takes).
    Raises `StoreError` (`NoStateError` when there is none) and ValueError on a bad setting."""
    if not cfg.redis.url:
        raise ValueError(
            "the state of a running controller is read from its Redis: give --redis URL (or "
            "PYCTL_REDIS_URL, or redis_url in --config)"
        )
    from pyctl.state.redis_client import close_client, connect
    from pyctl.state.redis_store import RedisStore
    from pyctl.state.redis_workflows import RedisWorkflowStore

    rc = cfg.redis.client_config()
    client = connect(rc)
    try:
        store = RedisStore(rc, cfg.cluster, client=client)
        flows = RedisWorkflowStore(client, rc, cfg.cluster)
        return await read_stored(cfg, store, flows, f"redis at {rc.describe()}")
    finally:
        await close_client(client)


__all__ = [
    "NoStateError",
    "Published",
    "StoredView",
    "build_view",
    "decode_workflows",
    "read_stored",
    "read_view",
    "summarize",
]
