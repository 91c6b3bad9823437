"""Publishing the agent's view: the annotation `pyctl.io/node-topology` on the agent's own Node
(`pyctl.cluster.agent_topology` is its format), written by a JSON merge patch of that one
annotation, and only when its value changes.

Why an annotation, not a CR or NodeResourceTopology: the controller already watches Nodes (no new
watch, no CRD to install, no RBAC beyond `nodes patch`), a merge patch of one annotation touches
nothing else on the object, the ValidatingAdmissionPolicy can pin the writer to its own Node, and
the value is small and bounded (32 KiB). NodeResourceTopology belongs to NFD's topology-updater
where it runs (two writers would fight), and a CR per node would be a second object to list,
watch, garbage-collect and authorize for a few hundred bytes.
"""

from __future__ import annotations

import logging

from pyctl.cluster import agent_topology
from pyctl.cluster.kube.client import KubeClient, path_part
from pyctl.jsontypes import JsonObject, JsonValue, as_list, as_object

log = logging.getLogger("pyctl.agent")

MERGE_PATCH = "application/merge-patch+json"


def annotation(doc: JsonObject) -> str:
    """The annotation's value for the agent's view (`pyctl.agent.view.view_json`, with
    `pod_resources` when the kubelet was read); `ValueError` when `doc` is not one."""
    listed = [as_object(g, "gpus") for g in as_list(doc.get("gpus", []), "gpus")]
    gpus = [
        (
            str(g["uuid"]),
            _int_or_none(as_object(g["numa"], "numa")["node"], "numa.node"),
            _str_or_none(g.get("clique"), "clique"),
        )
        for g in listed
    ]
    index = {_int(g["index"], "index"): pos for pos, g in enumerate(listed)}
    groups = [
        [index[i] for i in as_list(grp, "nvlink_groups") if isinstance(i, int) and i in index]
        for grp in as_list(doc.get("nvlink_groups", []), "nvlink_groups")
    ]
    pods: dict[str, list[int]] | None = None
    pr = doc.get("pod_resources")
    if isinstance(pr, dict) and "containers" in pr:
        pods = {}
        for cv in as_list(pr["containers"], "containers"):
            c = as_object(cv, "containers")
            key = f"{c['namespace']}/{c['pod']}"
            for dv in as_list(c["devices"], "devices"):
                d = as_object(dv, "devices")
                gpu = d["gpu_index"]
                if isinstance(gpu, int) and gpu in index and d["mig_profile_id"] is None:
                    held = pods.setdefault(key, [])
                    if index[gpu] not in held:
                        held.append(index[gpu])
    return agent_topology.encode(
        gpus,
        [g for g in groups if len(g) > 1],
        pods,
        _int(doc.get("catalog_disagreements", 0), "catalog_disagreements"),
    )


def _int(value: JsonValue, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what}: {value!r} is not an integer")
    return value


def _int_or_none(value: JsonValue, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _str_or_none(value: JsonValue, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{what}: {value!r} is not a string")
    return value


class NodeAnnotationPublisher:
    """Writes the annotation on one Node, the agent's own (`node`: the Downward API's
    spec.nodeName), when its value differs from the last one written."""

    def __init__(self, kube: KubeClient, node: str) -> None:
        if not node:
            raise ValueError("the agent's node name is not known (set NODE_NAME or --node)")
        self.kube = kube
        self.node = node
        self.last: str | None = None

    async def __call__(self, doc: JsonObject) -> None:
        value = annotation(doc)
        if value == self.last:
            return
        patch = {"metadata": {"annotations": {agent_topology.ANNOTATION: value}}}
        resp = await self.kube.request(
            "PATCH", f"/api/v1/nodes/{path_part(self.node)}", body=patch, content_type=MERGE_PATCH
        )
        resp.check()
        self.last = value
        log.info("node topology published", extra={"node": self.node, "bytes": len(value)})
