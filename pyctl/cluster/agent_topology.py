"""The node annotation `pyctl.io/node-topology` that `pyctl agent` writes on its own node, and
that the controller's decode reads: a compact, versioned, bounded JSON (docs/agent.md).

    {"v": 1, "gpus": [{"u": "GPU-…", "n": 1, "c": "<cluster uuid>.<clique>"}, …],
     "nvlink": [[0, 1], [2, 3]], "pods": {"ns/name": [0, 1]}, "cd": 0}

`gpus` is in NVML index order: `u` the UUID, `n` the NUMA node from sysfs (-1: unknown), `c` the
fabric clique (absent: none); `nvlink` the NVLink groups (GPU indexes); `pods` which GPUs each
pod holds, from the kubelet's PodResources API (absent: not read); `cd` the catalog
disagreements the agent found. Both sides hold it to `MAX_ANNOTATION_BYTES` and the bounds of
`pyctl.cluster.bounds`; a value that breaks them is an `AgentTopologyError` naming the field.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from pyctl.cluster import bounds as b
from pyctl.jsontypes import JsonObject, JsonValue, plain

ANNOTATION: Final = "pyctl.io/node-topology"
VERSION: Final = 1
#: the annotation's size at most (Kubernetes allows 256 KiB for all of an object's annotations)
MAX_ANNOTATION_BYTES: Final = 32 << 10


class AgentTopologyError(ValueError):
    """The annotation is not a topology this version reads; the message says why."""


class AgentGpu(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    uuid: str
    #: -1: unknown
    numa: int = -1
    clique: str = ""


class AgentTopology(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """What the agent says about its node, as the records carry it."""

    gpus: tuple[AgentGpu, ...] = ()
    nvlink: tuple[tuple[int, ...], ...] = ()
    #: (namespace/name, GPU indexes), sorted; None: the kubelet's PodResources were not read
    pods: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    catalog_disagreements: int = 0

    def numa_of(self) -> dict[int, int]:
        """GPU index -> NUMA node, for the GPUs whose node is known."""
        return {i: g.numa for i, g in enumerate(self.gpus) if g.numa >= 0}


_Idx = Annotated[int, msgspec.Meta(ge=0, lt=b.MAX_GPUS_PER_NODE)]


class _Gpu(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    u: Annotated[str, msgspec.Meta(min_length=1, max_length=b.MAX_NAME_CHARS)]
    n: Annotated[int, msgspec.Meta(ge=-1, le=b.MAX_NUMA_ID)] = -1
    c: Annotated[str, msgspec.Meta(max_length=b.MAX_NAME_CHARS)] = ""


class _V1(msgspec.Struct, frozen=True):
    v: int
    gpus: Annotated[list[_Gpu], msgspec.Meta(max_length=b.MAX_GPUS_PER_NODE)] = []
    nvlink: Annotated[
        list[Annotated[list[_Idx], msgspec.Meta(max_length=b.MAX_GPUS_PER_NODE)]],
        msgspec.Meta(max_length=b.MAX_GPUS_PER_NODE),
    ] = []
    pods: (
        Annotated[
            dict[
                Annotated[str, msgspec.Meta(max_length=b.MAX_KEY_CHARS)],
                Annotated[list[_Idx], msgspec.Meta(max_length=b.MAX_GPUS_PER_NODE)],
            ],
            msgspec.Meta(max_length=b.MAX_ITEMS),
        ]
        | None
    ) = None
    cd: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 0


def decode(value: str) -> AgentTopology:
    """The annotation's value as a topology; `AgentTopologyError` when it is not one."""
    if len(value) > MAX_ANNOTATION_BYTES:
        raise AgentTopologyError(f"larger than {MAX_ANNOTATION_BYTES} bytes")
    try:
        head = msgspec.json.decode(value)
    except msgspec.DecodeError as e:
        raise AgentTopologyError(f"not JSON: {e}") from None
    if not isinstance(head, dict) or head.get("v") != VERSION:
        v = head.get("v") if isinstance(head, dict) else None
        raise AgentTopologyError(f"version {v!r} is not {VERSION}")
    try:
        raw = msgspec.convert(head, _V1)
    except msgspec.ValidationError as e:
        raise AgentTopologyError(str(e)) from None
    n = len(raw.gpus)
    for group in raw.nvlink:
        if any(i >= n for i in group):
            raise AgentTopologyError(f"nvlink group {group[:8]} names a GPU beyond the {n} listed")
    pods = None
    if raw.pods is not None:
        for key, held in raw.pods.items():
            if any(i >= n for i in held):
                raise AgentTopologyError(f"pod {key[:253]} holds a GPU beyond the {n} listed")
        pods = tuple(sorted((k, tuple(sorted(set(v)))) for k, v in raw.pods.items()))
    return AgentTopology(
        gpus=tuple(AgentGpu(g.u, g.n, g.c) for g in raw.gpus),
        nvlink=tuple(tuple(sorted(set(g))) for g in raw.nvlink),
        pods=pods,
        catalog_disagreements=raw.cd,
    )


def encode(
    gpus: list[tuple[str, int | None, str | None]],
    nvlink: list[list[int]],
    pods: dict[str, list[int]] | None,
    disagreements: int,
) -> str:
    """The annotation's value: `gpus` as (uuid, NUMA node or None, clique or None) in index
    order. When the pods do not fit in `MAX_ANNOTATION_BYTES` they are left out (as not read);
    when even that does not fit, `AgentTopologyError`."""
    listed: list[JsonValue] = []
    for uuid, numa, clique in gpus:
        g: JsonObject = {"u": uuid[: b.MAX_NAME_CHARS]}
        if numa is not None:
            g["n"] = numa
        if clique:
            g["c"] = clique[: b.MAX_NAME_CHARS]
        listed.append(g)
    doc: JsonObject = {"v": VERSION, "gpus": listed}
    if nvlink:
        doc["nvlink"] = plain(nvlink)
    if disagreements:
        doc["cd"] = disagreements
    if pods is not None:
        with_pods = msgspec.json.encode({**doc, "pods": dict(sorted(pods.items()))}).decode()
        if len(with_pods) <= MAX_ANNOTATION_BYTES:
            return with_pods
    out = msgspec.json.encode(doc).decode()
    if len(out) > MAX_ANNOTATION_BYTES:
        raise AgentTopologyError(f"{len(gpus)} GPUs do not fit in {MAX_ANNOTATION_BYTES} bytes")
    return out
