"""Kueue's `Workload`: a pod Kueue holds back for lack of quota (or any reason but room) gets no
room made (no eviction admits it); one it holds back for lack of room in a domain does. The
messages are those of Kueue v0.17.0's flavor assigner (`fitsResourceQuota`), TAS and scheduler;
`tests/e2e/test_kueue_e2e.py` reads the quota and room ones from the real Kueue."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from msgspec.structs import replace

from pyctl.cluster.bounds import MAX_GANG_PODS, BoundsError
from pyctl.cluster.gangs import KUEUE_MESSAGE_CHARS, kueue_held
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.kube.dump import read_dump
from pyctl.cluster.records import (
    Event,
    PodGroupRecord,
    PodRecord,
    WorkloadRecord,
    check_record,
    record_key,
)
from pyctl.workflows.compactor import plan_round
from pyctl.workflows.rescue import RescueOptions
from tests.fuzz.gen import kueue_workload
from tests.unit import test_isolation as isolation
from tests.unit.test_isolation import PENDING_FOUR, cluster, reconciled

QUOTA = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in "
    "flavor default, 16 more needed"
)
MAXIMUM = (
    "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor "
    "default, previously considered podsets requests (0) + current podset request (16) > "
    "maximum capacity (8)"
)
TOPOLOGY = (
    'couldn\'t assign flavors to pod set main: topology "cliques" allows to fit only 2 out of 4 '
    'pod(s). Total nodes: 12; excluded: resource "nvidia.com/gpu": 6'
)


def _decoded(doc: dict[str, Any]) -> WorkloadRecord:
    rec = decode_object("KueueWorkload", json.dumps(doc).encode())
    assert isinstance(rec, WorkloadRecord)
    check_record(rec)
    return rec


SLICES = (
    "couldn't assign flavors to pod set main: topology \"cliques\" doesn't allow to fit any of 4 "
    "pod(s)"
)
#: two pod sets: one without room in the topology, one short of quota
BOTH = f"{TOPOLOGY}; {QUOTA}"
#: Kueue's scheduler, for a Workload its ClusterQueue's namespace selector leaves out
NAMESPACE = "Workload namespace doesn't match ClusterQueue selector"
#: Kueue's workload controller (reason Inadmissible), for a Workload whose queue does not admit
#: anything: a ClusterQueue with a missing ResourceFlavor, say, or a stopped LocalQueue
QUEUES = (
    "ClusterQueue gpus is inactive",
    "ClusterQueue gpus doesn't exist",
    "LocalQueue gpus is inactive",
    "LocalQueue gpus doesn't exist",
)


@pytest.mark.parametrize(
    ("conditions", "held"),
    [
        ([("QuotaReserved", "False", QUOTA)], QUOTA[:KUEUE_MESSAGE_CHARS]),
        ([("QuotaReserved", "False", MAXIMUM)], MAXIMUM[:KUEUE_MESSAGE_CHARS]),
        ([("QuotaReserved", "False", TOPOLOGY)], ""),
        ([("QuotaReserved", "False", SLICES)], ""),
        # any other reason: room does not admit it either
        ([("QuotaReserved", "False", NAMESPACE)], NAMESPACE),
        *[([("QuotaReserved", "False", q)], q) for q in QUEUES],
        # two pod sets, one short of quota: room alone does not admit it
        ([("QuotaReserved", "False", BOTH)], BOTH[:KUEUE_MESSAGE_CHARS]),
        # admitted (quota reserved), not tried yet, or no reason given
        ([("QuotaReserved", "True", QUOTA), ("Admitted", "True", "")], ""),
        ([], ""),
        ([("QuotaReserved", "False", "  ")], ""),
        # the quota message on another condition is not the reason it waits
        ([("Evicted", "False", QUOTA)], ""),
    ],
)
def test_kueue_holds_a_workload_back_for_what_room_does_not_give(
    conditions: list[tuple[str, str, str]], held: str
) -> None:
    assert kueue_held(conditions) == held


def test_the_record_names_the_workloads_pods_and_its_wait() -> None:
    rec = _decoded(kueue_workload())
    assert (rec.key, rec.pods) == ("ml/llm", ("llm-0", "llm-1"))
    assert rec.held.startswith("couldn't assign flavors to pod set llm: insufficient unused quota")
    assert _decoded(kueue_workload(quota=False)).held == ""
    # owners that are not pods (a Job's workload) name no pod
    doc = kueue_workload()
    doc["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j"}]
    assert _decoded(doc).pods == ()
    # read from a dump by its API group, as `pyctl plan` and `kubectl pyctl` read clusters
    listed = read_dump({"apiVersion": "v1", "kind": "List", "items": [kueue_workload()]})
    assert [record_key(r) for r in listed.of("KueueWorkload")] == ["ml/llm"]


def test_a_hostile_workload_is_refused_with_its_reason() -> None:
    with pytest.raises(BoundsError, match="Workload ml/llm pods"):
        check_record(WorkloadRecord("ml", "llm", pods=("p",) * (MAX_GANG_PODS + 1)))
    doc = copy.deepcopy(kueue_workload())
    doc["status"]["conditions"] = "not a list"
    with pytest.raises(ValueError, match=r"status\.conditions"):
        decode_object("KueueWorkload", json.dumps(doc).encode())


def considered(
    record: WorkloadRecord | PodGroupRecord | None, pod: PodRecord = PENDING_FOUR
) -> list[str]:
    """The pods a compaction round makes room for with `record` (a Kueue Workload, a Volcano
    PodGroup) stored beside the isolation tests' fragmented cluster and its pending 4-GPU `pod`
    (and `pyctl explain`'s question, asked of the same cache, answered alike)."""
    cache = cluster([replace(pod, created=1000.0)])
    if record is not None:
        cache.apply([Event("ADDED", record)])
    r = reconciled(cache)
    compactor, _ = isolation.compactor(cache, r, RescueOptions(), lambda: 1001.0)
    considered = [p.key for p in compactor.pending()]
    assert [x.pending for x in compactor.plan().rescues] == considered
    stored = plan_round(cache, r, compactor.options, compactor.limits, {}, {}, 0.0, 1001.0)
    assert [x.pending for x in stored.rescues] == considered
    return considered


def test_a_pod_kueue_holds_back_for_quota_gets_no_room() -> None:
    waits = WorkloadRecord("serving", "big-wl", pods=("big",), held=QUOTA)
    assert considered(None) == ["serving/big"]
    assert considered(replace(waits, held="")) == ["serving/big"]
    # another namespace's pod of that name is not this one
    assert considered(replace(waits, namespace="other")) == ["serving/big"]
    assert considered(waits) == []


def test_a_pod_that_waits_for_quota_is_not_blocked_by_fragmentation() -> None:
    """The summary's pods blocked by fragmentation (`pyctl_pending_pods_blocked_by_fragmentation`,
    which the alerts read) leave out a pod Kueue holds back for quota: room would not run it."""

    def blocked(workload: WorkloadRecord | None) -> int:
        cache = cluster([PENDING_FOUR])
        if workload is not None:
            cache.apply([Event("ADDED", workload)])
        return sum(reconciled(cache).summary().blocked.values())

    waits = WorkloadRecord("serving", "big-wl", pods=("big",), held=QUOTA)
    assert blocked(None) == 1
    assert blocked(replace(waits, held="")) == 1
    assert blocked(waits) == 0


@pytest.mark.parametrize("held_by", ["kueue", "volcano"])
def test_pyctl_explain_says_why_no_room_is_made_for_a_held_pod(held_by: str) -> None:
    """`pyctl explain` on the stored records: a pending, unschedulable 4-GPU pod on a cluster
    with no 4 GPUs free gets no rescue, and the answer quotes why: Kueue's message, or the
    Volcano PodGroup's subGroupPolicy pyctl cannot read."""
    from pyctl.app.config import load_config
    from pyctl.app.explain import explain
    from pyctl.app.state import build_view
    from pyctl.cluster.records import KINDS, NodeRecord
    from pyctl.state.store import StoredKind, StoredState

    pod = replace(PENDING_FOUR, pod_group="pg" if held_by == "volcano" else "")
    replicas = [
        replace(PENDING_FOUR, name=f"r{i}", uid=f"u-r{i}", node="n1", gpus=1, phase="Running",
                unschedulable=False)
        for i in range(5)
    ]  # fmt: skip
    records: dict[str, dict[str, Any]] = {k: {} for k in KINDS}
    records["Node"] = {"n1": NodeRecord("n1", gpu_model="H100-SXM5-80GB", gpus=8, cpu_milli=64000)}
    records["Pod"] = {p.key: p for p in (pod, *replicas)}
    if held_by == "kueue":
        records["KueueWorkload"] = {
            "serving/big-wl": WorkloadRecord("serving", "big-wl", pods=("big",), held=QUOTA)
        }
        said = f"Kueue holds its Workload back for what no eviction gives: {QUOTA}"
    else:
        records["PodGroup"] = {
            "serving/pg": PodGroupRecord("serving", "pg", min_member=1, hard=True, sub_unread=1)
        }
        said = "Volcano PodGroup pg: 1 subGroupPolicy entry pyctl cannot read"
    kinds = {k: StoredKind(k, records[k], "1", 990.0, {}) for k in KINDS}
    cfg = load_config(None, {}, {"cluster": "c"})
    view = build_view(cfg, "test", StoredState("c", kinds, 1000.0), None)
    e = explain(view, cfg, "serving/big")
    assert e.state == "pending"
    assert e.rescue is None
    assert e.plan_note.startswith(f"no rescue planned: {said}"), e.plan_note
