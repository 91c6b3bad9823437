"""Watch events into records: every field the controller reads, ERROR and BOOKMARK lines."""

from __future__ import annotations

import json

import pytest

from pyctl.cluster.kube.decode import DecodeError, WatchError, decode_watch_line
from pyctl.cluster.records import PodRecord

POD = {
    "kind": "Pod",
    "metadata": {
        "name": "llm-0",
        "namespace": "serving",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"b": "2", "a": "1"},
        "annotations": {"pyctl.io/evict": "false", "kubernetes.io/config.mirror": "x"},
        "ownerReferences": [
            {"kind": "Other", "name": "o"},
            {"kind": "ReplicaSet", "name": "llm-abc", "controller": True},
        ],
        "deletionTimestamp": "2026-01-01T00:00:00Z",
    },
    "spec": {
        "nodeName": "n1",
        "priority": 1000,
        "priorityClassName": "high",
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "8"}}}],
        "containers": [
            {
                "name": "a",
                "resources": {
                    "requests": {"cpu": "1500m", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": "2", "cpu": "99"},
                },
            },
            {"name": "b", "resources": {"requests": {"cpu": "500m", "nvidia.com/mig-1g.5gb": "1"}}},
        ],
    },
    "status": {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes",
            }
        ],
    },
}


def line(typ: str, obj: object) -> bytes:
    return json.dumps({"type": typ, "object": obj}).encode()


def test_every_field() -> None:
    typ, rec, rv = decode_watch_line("Pod", line("MODIFIED", POD))
    assert (typ, rv) == ("MODIFIED", "42")
    assert rec == PodRecord(
        namespace="serving",
        name="llm-0",
        uid="u-1",
        resource_version="42",
        node="n1",
        phase="Pending",
        cpu_milli=8000,  # the init container's 8 CPUs beat the apps' 2
        memory_mib=1024,
        gpus=2,  # from the limits: extended resources may be given as limits only
        mig=(("1g.5gb", 1),),
        priority=1000,
        priority_class="high",
        owner_kind="ReplicaSet",
        owner_name="llm-abc",
        labels=(("a", "1"), ("b", "2")),
        unschedulable=True,
        unschedulable_message="0/3 nodes",
        deleting=True,
        mirror=True,
        local_storage=True,
        evict_annotation="false",
    )


def test_error_bookmark_and_broken_lines() -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    with pytest.raises(WatchError) as e:
        decode_watch_line("Pod", line("ERROR", gone))
    assert e.value.code == 410
    bm = {"kind": "Pod", "metadata": {"resourceVersion": "77"}}
    assert decode_watch_line("Pod", line("BOOKMARK", bm)) == ("BOOKMARK", None, "77")
    with pytest.raises(DecodeError, match="broken event"):
        decode_watch_line("Pod", b'{"type": "ADDED", "object": {')
    bad = json.loads(json.dumps(POD))
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    with pytest.raises(
        DecodeError, match="pod serving/llm-0: container a: cpu: malformed quantity"
    ):
        decode_watch_line("Pod", line("ADDED", bad))
