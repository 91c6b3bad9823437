"""`pyctl status`: one cluster as its controller stored it (`pyctl.app.state`), as typed values
and as JSON: how fresh the mirror is, whether the controller holding the Lease is publishing,
nodes and fragmentation by the controller's own scoring of the stored records, the worst nodes,
workflows in progress and recent ones, and what was skipped or quarantined."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyctl.app.state import StoredView, summarize
from pyctl.cluster.records import Record
from pyctl.controller.summary import Summary
from pyctl.core.fragmentation import CATEGORIES, shape_dict
from pyctl.core.inputs import ShapeInput
from pyctl.jsontypes import JsonObject, plain
from pyctl.workflows.engine import Workflow, WorkflowData

GPU = 1000.0
#: finished workflows shown (the most recent first); every one in progress is shown
RECENT = 10
#: nodes shown by the text view, worst first (JSON has every node)
WORST = 10


@dataclass(frozen=True)
class KindFreshness:
    """How fresh one kind's mirror is."""

    kind: str
    records: int
    #: the resourceVersion the kind's mirror is at (from its last list or watch event)
    resource_version: str
    #: the largest resourceVersion among its records (the newest change stored)
    newest_object: str
    #: seconds since the controller last wrote the kind (the store's clock); None if unknown
    written_age_seconds: float | None
    skipped: int


@dataclass(frozen=True)
class WorkflowLine:
    id: str
    kind: str
    node: str
    step: str
    attempts: int
    created: float
    updated: float
    #: the pod it is about, "namespace/name" ("" for a node's workflow)
    pod: str
    result: str
    finished: bool

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "kind": self.kind,
            "node": self.node,
            "step": self.step,
            "attempts": self.attempts,
            "created": self.created,
            "updated": self.updated,
            "pod": self.pod or None,
            "result": self.result,
            "finished": self.finished,
        }


def workflow_line(wf: Workflow[WorkflowData]) -> WorkflowLine:
    return WorkflowLine(
        wf.id,
        wf.kind,
        wf.node,
        wf.step,
        wf.attempts,
        wf.created,
        wf.updated,
        wf.data.named(),
        wf.result,
        wf.finished,
    )


@dataclass(frozen=True)
class NodeLine:
    name: str
    gpu_model: str
    idle_gpu_milli: float
    fragment_gpu_milli: float
    categories: dict[str, float]
    idle_mig_slices: float
    fragment_mig_slices: float
    #: per NUMA zone: (NUMA id, idle GPU milli, fragment GPU milli)
    zones: tuple[tuple[int, float, float], ...] = ()


@dataclass(frozen=True)
class LeftOut:
    """The objects the controller leaves out, as its published summary names them."""

    #: how many it remembers (the summary names the most recent, at most `MAX_LEFT_OUT`)
    count: int
    #: (kind, name, reason, message)
    objects: tuple[tuple[str, str, str, str], ...]

    def to_json(self) -> JsonObject:
        return {
            "count": self.count,
            "objects": [
                {"kind": k, "name": n, "reason": r, "message": m} for k, n, r, m in self.objects
            ],
        }


@dataclass(frozen=True)
class Heartbeat:
    """The controller's published summary: only the replica holding the Lease publishes it."""

    published: bool
    age_seconds: float | None = None
    ttl_seconds: int | None = None
    #: published within its TTL and decodes
    fresh: bool = False
    #: the publisher's wall clock when it made it
    heartbeat: float | None = None
    error: str = ""
    #: the summary as federation shows it (`Member.to_json`)
    summary: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class Status:
    cluster: str
    source: str
    #: the store's clock when read (seconds since the epoch)
    read_at: float
    heartbeat: Heartbeat
    freshness: list[KindFreshness]
    #: the controller's summary of the stored records (None: it could not be made, `error`)
    summary: Summary | None
    summary_error: str
    #: the published scheduling success (a window over watch events only the controller sees)
    scheduling_success: float | None
    workload_source: str
    workload: list[ShapeInput]
    nodes: list[NodeLine]
    #: stored nodes the controller's translation cannot model: name -> why
    unmodelled: dict[str, str]
    workflows_active: list[WorkflowLine]
    workflows_recent: list[WorkflowLine]
    workflows_total: int
    workflow_error: str
    #: workflow records that do not decode (left in place): id -> why
    workflows_undecodable: dict[str, str]
    #: workflow records the engine moved aside: id -> reason
    quarantined: dict[str, str]
    #: stored records that do not decode: (kind, key, why)
    skipped: list[tuple[str, str, str]]
    #: the objects the controller leaves out, from its published summary (None: none published)
    left_out: LeftOut | None = None

    def to_json(self) -> JsonObject:
        s = self.summary
        return {
            "cluster": self.cluster,
            "source": self.source,
            "read_at": self.read_at,
            "controller": {
                "published": self.heartbeat.published,
                "age_seconds": _round(self.heartbeat.age_seconds),
                "ttl_seconds": self.heartbeat.ttl_seconds,
                "fresh": self.heartbeat.fresh,
                "heartbeat": self.heartbeat.heartbeat,
                "error": self.heartbeat.error or None,
                "summary": self.heartbeat.summary or None,
            },
            "mirror": [
                {
                    "kind": f.kind,
                    "records": f.records,
                    "resource_version": f.resource_version,
                    "newest_object": f.newest_object,
                    "written_age_seconds": _round(f.written_age_seconds),
                    "skipped": f.skipped,
                }
                for f in self.freshness
            ],
            "summary": None
            if s is None
            else {
                "nodes": s.nodes,
                "idle_gpu_milli": s.idle_gpu_milli,
                "fragment_gpu_milli": s.fragment_gpu_milli,
                "fragmentation_rate": s.fragmentation_rate,
                "categories": dict(s.categories),
                "idle_mig_slices": s.idle_mig_slices,
                "fragment_mig_slices": s.fragment_mig_slices,
                "recoverable_mig_slices": s.recoverable_mig_slices,
                "pending": s.pending,
                "blocked": dict(s.blocked),
                "by_model": {
                    k: {"idle_gpu_milli": v[0], "fragment_gpu_milli": v[1]}
                    for k, v in s.by_model.items()
                },
                "shared_gpus": s.shared_gpus,
                "shared_used_milli": s.shared_used_milli,
                "shared_pods": s.shared_pods,
            },
            "summary_error": self.summary_error or None,
            "scheduling_success": self.scheduling_success,
            "workload": {
                "source": self.workload_source,
                "shapes": [plain(s) for s in self.workload],
            },
            "nodes": [
                {
                    "name": n.name,
                    "gpu_model": n.gpu_model,
                    "idle_gpu_milli": n.idle_gpu_milli,
                    "fragment_gpu_milli": n.fragment_gpu_milli,
                    "categories": dict(n.categories),
                    "idle_mig_slices": n.idle_mig_slices,
                    "fragment_mig_slices": n.fragment_mig_slices,
                    "zones": [
                        {"numa": z, "idle_gpu_milli": i, "fragment_gpu_milli": f}
                        for z, i, f in n.zones
                    ],
                }
                for n in self.nodes
            ],
            "worst": [n.name for n in self.worst()],
            "unmodelled": dict(self.unmodelled),
            "workflows": {
                "total": self.workflows_total,
                "active": [w.to_json() for w in self.workflows_active],
                "recent": [w.to_json() for w in self.workflows_recent],
                "undecodable": dict(self.workflows_undecodable),
                "quarantined": dict(self.quarantined),
                "error": self.workflow_error or None,
            },
            "skipped": [{"kind": k, "key": key, "why": why} for k, key, why in self.skipped],
            "left_out": None if self.left_out is None else self.left_out.to_json(),
        }

    def worst(self, limit: int | None = None) -> list[NodeLine]:
        """Nodes by fragment, worst first (the controller's order: `Reconciler.summary`)."""
        ranked = sorted(self.nodes, key=lambda n: (-n.fragment_gpu_milli, n.name))
        return ranked if limit is None else ranked[:limit]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _newest(records: dict[str, Record]) -> str:
    """The largest resourceVersion among records (numeric ones compared as numbers: etcd's
    are; the API calls them opaque, so a non-numeric one is shown as it is)."""
    rvs = [r.resource_version for r in records.values() if r.resource_version]
    if not rvs:
        return ""
    numeric = [v for v in rvs if v.isdigit()]
    return max(numeric, key=int) if numeric else max(rvs)


def status_of(view: StoredView) -> Status:
    """`pyctl status` from the stored view."""
    state = view.state
    freshness = [
        KindFreshness(
            kind,
            len(k.records),
            k.resource_version,
            _newest(k.records),
            None if k.written is None else max(0.0, state.now - k.written),
            len(k.skipped),
        )
        for kind, k in state.kinds.items()
    ]
    pub = view.published
    if pub is None:
        hb = Heartbeat(False, error=view.summary_error)
    else:
        hb = Heartbeat(
            True,
            pub.age_seconds,
            pub.ttl_seconds,
            pub.fresh,
            pub.heartbeat,
            pub.member.error or pub.workload_error,
            pub.member.to_json(),
        )
    summary, error = summarize(view)
    r = view.reconciler
    nodes = [
        NodeLine(
            name,
            r.models[name].gpu_model,
            s.idle_gpu_milli,
            s.fragment_gpu_milli,
            {c: s.categories[c] for c in CATEGORIES},
            s.idle_mig_slices,
            s.fragment_mig_slices,
            tuple((z.numa, z.idle_gpu_milli, z.fragment_gpu_milli) for z in s.zones),
        )
        for name, s in sorted(r.scores.items())
    ]
    left_out = None
    if pub is not None and pub.member.summary is not None:
        ps = pub.member.summary
        left_out = LeftOut(
            ps.left_out_count, tuple((x.kind, x.name, x.reason, x.message) for x in ps.left_out)
        )
    lines = [workflow_line(wf) for wf in view.workflows]
    active = sorted((w for w in lines if not w.finished), key=lambda w: (w.created, w.id))
    recent = sorted((w for w in lines if w.finished), key=lambda w: (-w.updated, w.id))
    success = None
    if pub is not None and not pub.member.error:
        success = pub.member.scheduling_success
    return Status(
        cluster=view.cluster,
        source=view.source,
        read_at=state.now,
        heartbeat=hb,
        freshness=freshness,
        summary=summary,
        summary_error=error,
        scheduling_success=success,
        workload_source=view.workload_source,
        workload=[shape_dict(s) for s in r.workload.shapes],
        nodes=nodes,
        unmodelled={**r.bad_nodes, **view.failed_nodes},
        workflows_active=active,
        workflows_recent=recent[:RECENT],
        workflows_total=len(lines),
        workflow_error=view.workflow_error,
        workflows_undecodable=view.bad_workflows,
        quarantined={wid: q.reason for wid, q in view.quarantined.items()},
        skipped=[(str(k), key, why) for k, key, why in state.skipped],
        left_out=left_out,
    )


__all__ = [
    "GPU",
    "WORST",
    "Heartbeat",
    "KindFreshness",
    "LeftOut",
    "NodeLine",
    "Status",
    "status_of",
]
