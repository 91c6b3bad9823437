"""Random and mutated Kubernetes objects through decode -> cache -> translate -> score -> summary
-> compaction plan, beside a small valid GPU cluster: nothing raises but `DecodeError` at decode,
every node is scored or left out with a reason, the summary publishes, and a pod the core cannot
model changes nothing (the workload M and every score are what they are without it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import KINDS, Event, Kind, PodRecord, Record, check_record
from pyctl.cluster.source import NullActuator
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import decode_summary, federation_summary_bytes
from pyctl.controller.workload import WorkloadScope
from pyctl.metrics import Metrics
from pyctl.state.ratelimit import MemoryRateLimiter, SafetyLimits
from pyctl.state.workflows import MemoryWorkflowStore
from pyctl.workflows.compaction import CompactionPlan
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.engine import Context, Engine
from pyctl.workflows.gate import Gate
from pyctl.workflows.kinds import builtin_registry

from . import gen
from .conftest import CASES, FUZZ

BASE: list[tuple[Kind, dict[str, Any]]] = [
    ("Node", gen.node("a")),
    ("Node", gen.node("b")),
    ("NodeResourceTopology", gen.nrt("a", (1, 1))),
    ("NodeResourceTopology", gen.nrt("b", (2, 0))),
    ("Pod", gen.pod("a0", "a")),
    ("Pod", gen.pod("a1", "a")),
    ("Pod", gen.pod("b0", "b", gpus=2)),
    ("Pod", gen.pod("m0", "a", gpus=0, mig="1g.5gb")),
    ("Pod", gen.pod("big", "", gpus=4, pending=True)),
    ("PodDisruptionBudget", gen.pdb()),
]


def plan(cache: ClusterCache, r: Reconciler) -> CompactionPlan:
    """The compaction plan as the controller makes it (the one call into the planner)."""
    gate = Gate(
        "observe", lambda: True, MemoryRateLimiter(), SafetyLimits(), NullActuator(), r.metrics, "f"
    )
    engine = Engine(
        MemoryWorkflowStore(),
        Context(gate, lambda ns, n: cache.pods.get(f"{ns}/{n}")),
        builtin_registry(),
    )
    return Compactor(cache, r, engine, r.metrics, "f", "observe", max_moves=3).plan()


def decode_all(docs: Sequence[tuple[Kind, bytes]]) -> tuple[list[Record], list[DecodeError]]:
    good: list[Record] = []
    bad: list[DecodeError] = []
    for kind, data in docs:
        try:
            rec = decode_object(kind, data)
        except DecodeError as e:
            bad.append(e)
            continue
        check_record(rec)  # whatever decodes is within the bounds
        good.append(rec)
    return good, bad


def run(records: Sequence[Record]) -> tuple[Reconciler, ClusterCache, CompactionPlan]:
    cache = ClusterCache()
    cache.apply([Event("ADDED", r) for r in records])
    r = Reconciler(cache, Metrics(), "f", scope=WorkloadScope(max_shape_weight=0.5))
    r.refresh_workload()
    for name in sorted(cache.nodes):
        r.reconcile(name)  # never raises: a node it cannot model is left out with why
        assert (name in r.scores) != (name in r.bad_nodes)
    s = r.summary()
    decode_summary(federation_summary_bytes(s, r.models, r.workload))  # publishable
    return r, cache, plan(cache, r)


HOSTILE = st.lists(
    st.sampled_from([(k, t) for k in KINDS for t in gen.TEMPLATES[k]]).flatmap(
        lambda kt: gen.document(kt[1]).map(lambda d: (kt[0], d))
    ),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(hostile=HOSTILE)
def test_objects_through_decode_translate_score_and_plan(hostile: list[tuple[Kind, bytes]]) -> None:
    CASES["kubernetes objects"] += 1
    base = [(k, json.dumps(d).encode()) for k, d in BASE]
    good, bad = decode_all(base + hostile)
    for e in bad:
        assert e.reason in ("malformed", "too_large", "bad_quantity", "out_of_bounds")
    r, cache, _ = run(good)
    # a pending pod the core cannot model changes nothing: run again without it
    ignored = {i.ref.key for i in r.ignored.current() if i.ref is not None and i.kind == "Pod"}
    rejected = {
        key for key, p in cache.pods.items() if not p.node and (p.gpus or p.mig) and key in ignored
    }
    event(f"decoded {len(good) - len(base)}+ hostile, refused {len(bad)}")
    event(f"pods left out of M: {bool(rejected)}")
    event(f"nodes left out: {bool(r.bad_nodes)}")
    if rejected:
        kept = [g for g in good if not (isinstance(g, PodRecord) and g.key in rejected)]
        r2, _, _ = run(kept)
        assert r2.workload == r.workload
        assert r2.scores == r.scores
