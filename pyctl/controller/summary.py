"""The cluster summary: what the live view, the metrics and federation see of the cluster at one
moment, and its wire format in the shared store (`summary_bytes`, and `federation_summary_bytes`
with the node models and the workload M, which `pyctl.federation` reads)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

from pyctl.cluster.bounds import MAX_ITEMS, Key, Name, Text
from pyctl.core.fragmentation import shape_dict
from pyctl.model import Node, Snapshot, Workload
from pyctl.snapshot import node_to_json, snapshot_to_json

#: the version of the rich summary's extra keys (`format` in the summary)
RICH_FORMAT = 1


@dataclass(frozen=True)
class Summary:
    """The cluster at one moment, as the live view, the metrics and federation see it."""

    cluster: str
    nodes: int
    idle_gpu_milli: float
    fragment_gpu_milli: float
    categories: dict[str, float]
    idle_mig_slices: float
    fragment_mig_slices: float
    recoverable_mig_slices: float
    pending: int
    blocked: dict[str, int]
    scheduling_success: float
    worst: list[tuple[str, float, float]] = field(default_factory=list)
    by_model: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: shared GPUs (time-slicing, MPS, HAMi; docs/sharing.md): how many, their used share in
    #: milli-GPU, and the pods holding shares of them
    shared_gpus: int = 0
    shared_used_milli: float = 0.0
    shared_pods: int = 0
    #: objects the controller leaves out (`controller/ignored.py`): how many it remembers, and
    #: the most recently reported of them (at most `MAX_LEFT_OUT`): (kind, name, reason,
    #: message), the name "" when the object could not be named
    left_out_count: int = 0
    left_out: tuple[tuple[str, str, str, str], ...] = ()

    @property
    def fragmentation_rate(self) -> float:
        return self.fragment_gpu_milli / self.idle_gpu_milli if self.idle_gpu_milli else 0.0


# -- the wire format: a typed record, validated when it is read ------------------------------------

#: objects left out that a summary names (the most recently reported; the count is of all)
MAX_LEFT_OUT = 100

#: the largest summary read from the store (a rich summary of 10,000 nodes is a few MiB)
MAX_SUMMARY_BYTES = 64 << 20
#: an amount (milli-GPU, MIG slices) no cluster reaches: 2**31 nodes of 1024 GPUs in milli-GPU
MAX_AMOUNT = float(1 << 51)

Amount = Annotated[float, msgspec.Meta(ge=0.0, le=MAX_AMOUNT)]
Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 31) - 1)]
Ratio = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Cats = Annotated[dict[Key, Amount], msgspec.Meta(max_length=64)]


class LeftOutRecord(msgspec.Struct, frozen=True):
    """An object the controller leaves out, as a summary names it."""

    kind: Key
    name: Text = ""
    reason: Key = ""
    message: Text = ""


class ModelTotals(msgspec.Struct, forbid_unknown_fields=False):
    idle_gpu_milli: Amount = 0.0
    fragment_gpu_milli: Amount = 0.0


class SummaryRecord(msgspec.Struct, omit_defaults=True):
    """A cluster's published summary as stored and read (`summary_bytes`; with `format`,
    `workload` and `snapshot`, `federation_summary_bytes`). Every number is finite, non-negative
    and bounded; decoding refuses anything else (a member's summary that does not decode is
    shown with its error, never used)."""

    cluster: Name
    nodes: Count = 0
    idle_gpu_milli: Amount = 0.0
    fragment_gpu_milli: Amount = 0.0
    fragmentation_rate: Ratio = 0.0
    categories: Cats = {}
    idle_mig_slices: Amount = 0.0
    fragment_mig_slices: Amount = 0.0
    recoverable_mig_slices: Amount = 0.0
    pending: Count = 0
    blocked: Annotated[dict[Key, Count], msgspec.Meta(max_length=64)] = {}
    scheduling_success: Ratio = 1.0
    by_model: Annotated[dict[Key, ModelTotals], msgspec.Meta(max_length=MAX_ITEMS)] = {}
    #: GPUs shared by time-slicing, MPS or HAMi: how many, their use, the pods holding them
    shared_gpus: Count = 0
    shared_used_milli: Amount = 0.0
    shared_pods: Count = 0
    #: objects the controller leaves out: how many, and the most recent (`Summary.left_out`)
    left_out_count: Count = 0
    left_out: Annotated[list[LeftOutRecord], msgspec.Meta(max_length=MAX_LEFT_OUT)] = []
    #: wall-clock seconds of the publisher (Redis TIME decides ages)
    heartbeat: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)] = 0.0
    #: RICH_FORMAT when `workload` and `snapshot` are there
    format: Count = 0
    #: the workload M (pyctl's shape format; checked by `snapshot.shape_from_json` when used)
    workload: Annotated[list[Any], msgspec.Meta(max_length=MAX_ITEMS)] | None = None
    #: every node's model (pyctl's snapshot format; checked by `snapshot.load_snapshot`)
    snapshot: dict[str, Any] | None = None

    @property
    def rich(self) -> bool:
        return self.workload is not None and self.snapshot is not None


class SummaryHead(SummaryRecord):
    """A summary read for its head: every field of `SummaryRecord`, checked the same way, with
    the snapshot's parts kept as raw JSON (a rich summary's snapshot is every node's model,
    megabytes at 5,000 nodes, and decoding it into Python objects takes 50-150 ms with the GIL
    held; a reader that needs only the totals and whether the summary decodes reads this)."""

    snapshot: dict[str, msgspec.Raw] | None = None


_SUMMARY = msgspec.json.Decoder(SummaryRecord)
_HEAD = msgspec.json.Decoder(SummaryHead)
_ENC = msgspec.json.Encoder()


def decode_summary(data: bytes, head_only: bool = False) -> SummaryRecord:
    """A stored summary; raises ValueError saying why it is not one. `head_only`: a
    `SummaryHead` (the same checks, the snapshot's parts left as raw JSON)."""
    if len(data) > MAX_SUMMARY_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {MAX_SUMMARY_BYTES}")
    try:
        return (_HEAD if head_only else _SUMMARY).decode(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except msgspec.DecodeError as e:  # ValidationError too
        raise ValueError(str(e)) from None


def _record(s: Summary, now: float | None) -> SummaryRecord:
    return SummaryRecord(
        cluster=s.cluster,
        nodes=s.nodes,
        idle_gpu_milli=float(s.idle_gpu_milli),
        fragment_gpu_milli=float(s.fragment_gpu_milli),
        fragmentation_rate=float(s.fragmentation_rate),
        categories={k: float(v) for k, v in s.categories.items()},
        idle_mig_slices=float(s.idle_mig_slices),
        fragment_mig_slices=float(s.fragment_mig_slices),
        recoverable_mig_slices=float(s.recoverable_mig_slices),
        pending=s.pending,
        blocked=dict(s.blocked),
        scheduling_success=float(s.scheduling_success),
        by_model={k: ModelTotals(float(v[0]), float(v[1])) for k, v in s.by_model.items()},
        shared_gpus=s.shared_gpus,
        shared_used_milli=float(s.shared_used_milli),
        shared_pods=s.shared_pods,
        left_out_count=s.left_out_count,
        left_out=[LeftOutRecord(*x) for x in s.left_out[-MAX_LEFT_OUT:]],
        heartbeat=time.time() if now is None else now,
    )


def _checked(r: SummaryRecord) -> bytes:
    """The encoded record, after checking it decodes (a summary with a value out of its bounds
    is refused here, by the publisher, rather than by every reader)."""
    data = _ENC.encode(r)
    decode_summary(data)
    return data


def summary_bytes(s: Summary, now: float | None = None) -> bytes:
    """The basic summary. Raises ValueError when a value is out of its bounds (not finite,
    negative, ...): such a summary is not published."""
    return _checked(_record(s, now))


def federation_summary_bytes(
    summary: Summary,
    models: Mapping[str, Node],
    workload: Workload,
    now: float | None = None,
) -> bytes:
    """The rich federation summary: every key of `summary_bytes`, plus the node models and the
    workload M (what `place` needs to rank this cluster's nodes). Call it where the controller
    publishes (`Controller._summary_loop`) with `self.reconciler.models` and
    `self.reconciler.workload` instead of `summary_bytes(s)`. Raises ValueError like
    `summary_bytes`."""
    r = msgspec.structs.replace(
        _federation_head(summary, workload, now),
        snapshot=snapshot_to_json(Snapshot(tuple(models[n] for n in sorted(models)))),
    )
    return _checked(r)


def _federation_head(summary: Summary, workload: Workload, now: float | None) -> SummaryRecord:
    """The rich summary without its snapshot (the record's last field)."""
    return msgspec.structs.replace(
        _record(summary, now), format=RICH_FORMAT, workload=[shape_dict(s) for s in workload.shapes]
    )


class FederationEncoder:
    """`federation_summary_bytes`, byte for byte and with the same checks, with each node
    model's encoded form kept between publishes: a node whose model is the same object as at
    the last publish is not encoded again (the controller's models are immutable; a re-scored
    node gets a new one). The snapshot is the record's last field, so the summary is its
    head's JSON with the snapshot's nodes spliced in; the head is checked as `_checked` checks
    the whole (the snapshot, pyctl's own fixed-depth format, adds only its size to check), so
    the whole is not decoded again at each publish."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Node, bytes]] = {}
        #: nodes encoded at the last `encode` (the others were taken from the last publish)
        self.encoded = 0

    def encode(
        self,
        summary: Summary,
        models: Mapping[str, Node],
        workload: Workload,
        now: float | None = None,
    ) -> bytes:
        """Raises ValueError like `federation_summary_bytes`."""
        head = _ENC.encode(_federation_head(summary, workload, now))
        last, kept = self._nodes, {}
        self.encoded = 0
        for name in sorted(models):
            node = models[name]
            got = last.get(name)
            if got is None or got[0] is not node:
                got = (node, _ENC.encode(node_to_json(node)))
                self.encoded += 1
            kept[name] = got
        self._nodes = kept
        nodes = b",".join(b for _, b in kept.values())
        data = head[:-1] + b',"snapshot":{"nodes":[' + nodes + b"]}}"
        if len(data) > MAX_SUMMARY_BYTES:
            raise ValueError(f"{len(data)} bytes, more than {MAX_SUMMARY_BYTES}")
        decode_summary(head)
        return data
