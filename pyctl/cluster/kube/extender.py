"""The kube-scheduler extender's wire format (k8s.io/kube-scheduler/extender/v1): Go structs
without JSON tags, so the keys are the Go field names.

- request, both verbs: ``ExtenderArgs`` ``{"Pod": <v1.Pod>, "Nodes": <v1.NodeList>|null,
  "NodeNames": [..]|null}`` (``NodeNames`` with ``nodeCacheCapable: true``, else ``Nodes``);
- filter answer: ``ExtenderFilterResult`` ``{"Nodes", "NodeNames", "FailedNodes": {name: reason},
  "FailedAndUnresolvableNodes": {..}, "Error": ""}``;
- prioritize answer: ``HostPriorityList`` ``[{"Host": name, "Score": 0..10}]``
  (``MaxExtenderPriority`` is 10; the scheduler multiplies by the extender's ``weight`` and by
  ``MaxNodeScore / MaxExtenderPriority``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import msgspec

from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import PodRecord

MAX_EXTENDER_PRIORITY = 10


class ExtenderInputError(ValueError):
    """A request the extender cannot read; the message says why."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: PodRecord
    #: candidate node names, in the order the scheduler sent them
    names: tuple[str, ...]
    #: the NodeList items when the scheduler sent whole nodes (nodeCacheCapable: false)
    items: tuple[Mapping[str, Any], ...] | None


def _field(obj: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct without JSON tags: its exact name, or any casing of it (Go's
    decoder matches case-insensitively, so other clients may send ``pod`` or ``nodenames``)."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


class _Wire(msgspec.Struct):
    """The request as kube-scheduler sends it with ``nodeCacheCapable`` (the Go field names),
    decoded and type-checked in one pass; anything else takes the general path."""

    Pod: dict[str, Any] | None = None
    NodeNames: list[str] | None = None


_WIRE = msgspec.json.Decoder(_Wire)


def _as_sent(body: bytes | str, rdma_resource: str = "") -> ExtenderArgs | None:
    """The scheduler's request (``Pod`` and ``NodeNames``, exactly so named and typed), or None
    for `parse_args`'s general path (other casings, ``Nodes``, or anything it must explain)."""
    try:
        w = _WIRE.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):  # (ValidationError included)
        return None
    if w.Pod is None or w.NodeNames is None:
        return None
    return ExtenderArgs(_pod(w.Pod, rdma_resource), tuple(w.NodeNames), None)


def _pod(pod: Mapping[str, Any], rdma_resource: str = "") -> PodRecord:
    try:
        rec = decode_object("Pod", pod, rdma_resource)
    except ValueError as e:
        raise ExtenderInputError(f"ExtenderArgs.Pod: {e}") from None
    if not isinstance(rec, PodRecord) or not rec.name:
        raise ExtenderInputError("ExtenderArgs.Pod has no metadata.name")
    return rec


def parse_args(body: bytes | str | Mapping[str, Any], rdma_resource: str = "") -> ExtenderArgs:
    """`ExtenderArgs` from a request body, its pod read as the reflector reads pods
    (`rdma_resource`); raises `ExtenderInputError` on anything unreadable."""
    if isinstance(body, bytes | str):
        sent = _as_sent(body, rdma_resource)
        if sent is not None:
            return sent
        try:
            obj = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise ExtenderInputError(f"request body is not JSON: {e}") from None
    else:
        obj = body
    if not isinstance(obj, Mapping):
        raise ExtenderInputError("ExtenderArgs must be a JSON object")
    pod = _field(obj, "Pod")
    if not isinstance(pod, Mapping):
        raise ExtenderInputError("ExtenderArgs.Pod is missing")
    rec = _pod(pod, rdma_resource)
    names_raw = _field(obj, "NodeNames")
    nodes_raw = _field(obj, "Nodes")
    items: tuple[Mapping[str, Any], ...] | None = None
    if names_raw is not None:
        if not isinstance(names_raw, list) or not all(isinstance(n, str) for n in names_raw):
            raise ExtenderInputError("ExtenderArgs.NodeNames must be a list of strings")
        names = tuple(names_raw)
    elif nodes_raw is not None:
        raw_items = nodes_raw.get("items") if isinstance(nodes_raw, Mapping) else None
        if not isinstance(raw_items, list) or not all(isinstance(i, Mapping) for i in raw_items):
            raise ExtenderInputError("ExtenderArgs.Nodes must be a NodeList with items")
        items = tuple(raw_items)
        got = []
        for i in items:
            meta = i.get("metadata")
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                raise ExtenderInputError("ExtenderArgs.Nodes has a node without metadata.name")
            got.append(name)
        names = tuple(got)
    else:
        raise ExtenderInputError("ExtenderArgs has neither NodeNames nor Nodes")
    return ExtenderArgs(rec, names, items)


class ExtenderFilterResult(TypedDict):
    """The filter verb's answer (``ExtenderFilterResult``; one of ``Nodes`` and ``NodeNames``,
    as the request came)."""

    Nodes: Mapping[str, Any] | None
    NodeNames: list[str] | None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(TypedDict):
    """One node's score in the prioritize verb's answer (``HostPriorityList``)."""

    Host: str
    Score: int


def filter_result(
    args: ExtenderArgs,
    failed: Mapping[str, str],
    error: str = "",
    only: Collection[str] | None = None,
) -> ExtenderFilterResult:
    """An ``ExtenderFilterResult``: the nodes not in `failed` (and, with `only`, in it), in the
    form they came in. A node neither kept nor failed is left out of the answer: the scheduler
    drops it from the candidates without a status (kube-scheduler's
    ``findNodesThatPassExtenders``: statuses are set for the failed maps' nodes only; they
    explain a pod that fits no node, and a pod left a node is not one)."""
    kept = [n for n in args.names if n not in failed and (only is None or n in only)]
    out: ExtenderFilterResult = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": {},
        "Error": error,
    }
    if args.items is not None:
        keep = set(kept)
        out["Nodes"] = {
            "apiVersion": "v1",
            "kind": "NodeList",
            "metadata": {},
            "items": [i for i in args.items if i["metadata"]["name"] in keep],
        }
    else:
        out["NodeNames"] = kept
    return out


def filter_error(message: str) -> ExtenderFilterResult:
    """A filter answer that says the request failed (the scheduler applies ``ignorable``)."""
    return {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": message,
    }


def priority_list(scores: Mapping[str, int], names: Sequence[str]) -> list[HostPriority]:
    """A ``HostPriorityList`` in the scheduler's node order."""
    return [{"Host": n, "Score": int(scores.get(n, 0))} for n in names]


def encode(result: ExtenderFilterResult | list[HostPriority] | Mapping[str, str]) -> bytes:
    """An answer as JSON (a mapping of strings: an error for a verb that is none of these)."""
    return msgspec.json.encode(result)
