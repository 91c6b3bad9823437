"""What every workflow shares: the persisted record (`Workflow`), what a kind keeps between its
steps (a `WorkflowData`, typed and versioned per kind), the context its steps run in (`Context`),
and the registry of workflow kinds and their step handlers (`Registry`), filled explicitly at
start-up (`pyctl.workflows.kinds.builtin_registry`)."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, TypeAlias, TypeVar, Union, cast

import msgspec
import msgspec.inspect as mi

from pyctl.cluster.bounds import MAX_NAME_CHARS, MAX_NAMESPACE_CHARS, MAX_UID_CHARS
from pyctl.cluster.records import PodRecord
from pyctl.workflows.gate import Gate

#: steps a workflow ends in
FINISHED = ("done", "dry-run", "failed", "abandoned")


#: the strings a kind's data holds, held to the bounds of the objects they name
Namespace: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_NAMESPACE_CHARS)]
Uid: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_UID_CHARS)]
#: a pod's "namespace/name"
PodKey: TypeAlias = Annotated[
    str, msgspec.Meta(max_length=MAX_NAMESPACE_CHARS + 1 + MAX_NAME_CHARS)
]


class WorkflowData(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="schema"):
    """What one kind of workflow keeps between its steps: each kind subclasses it once, next to
    its steps, with the tag ``<kind>/<version>`` (stored as the data's ``schema`` field). A record
    whose data is of another version, or holds a field its version does not, does not decode
    (the engine quarantines it with the reason). Strings and lists are held to the bounds of
    `pyctl.cluster.bounds` while decoding; JSON numbers are finite (msgspec refuses one out of
    range)."""

    def named(self) -> str:
        """The pod the workflow is about, "namespace/name" ("" for a node's workflow)."""
        return ""

    def moves(self) -> tuple[str, ...]:
        """The pods it evicts, "namespace/name"."""
        return ()


D = TypeVar("D", bound=WorkflowData, covariant=True)


class Workflow(msgspec.Struct, Generic[D]):
    id: str
    kind: str
    node: str
    step: str
    created: float
    #: the kind's own data (`WorkflowKind.data`)
    data: D
    updated: float = 0.0
    attempts: int = 0
    #: wall-clock time before which the step is not retried (rate limits, PDB refusals)
    not_before: float = 0.0
    result: str = ""
    #: a replica is running this step until then (the process that claimed it leaves it alone;
    #: see `Engine.advance_all` for when the leader takes another process's claim over)
    claimed_until: float = 0.0
    #: the process that claimed it (`engine.INSTANCE`; "" in records written before the field)
    claimed_by: str = ""

    @property
    def finished(self) -> bool:
        return self.step in FINISHED


def of_kind(wf: Workflow[WorkflowData], cls: type[D]) -> Workflow[D] | None:
    """`wf` as a workflow whose data is `cls` (None: its data is another kind's)."""
    return cast("Workflow[D]", wf) if isinstance(wf.data, cls) else None


@dataclass
class Context:
    gate: Gate
    #: the pod as the controller sees it now (None: gone)
    pod: Callable[[str, str], PodRecord | None]
    clock: Callable[[], float] = time.time


Handler: TypeAlias = Callable[[Context, Workflow[D]], Awaitable[Workflow[D]]]


def abandon(wf: Workflow[D], error: str) -> Workflow[D]:
    """The default end of a workflow whose step keeps failing."""
    return msgspec.structs.replace(wf, step="abandoned", result=error)


@dataclass(frozen=True)
class WorkflowKind(Generic[D]):
    """One kind of workflow: the type of its data, its step handlers, and where it goes after
    `max_errors` failed attempts of a step (`give_up`; a kind that has changed the cluster goes
    somewhere that undoes it, never straight to a finished step)."""

    name: str
    data: type[D]
    steps: Mapping[str, Handler[D]]
    give_up: Callable[[Workflow[D], str], Workflow[D]] = abandon
    max_errors: int = 10
    #: base and cap of the backoff after a failed attempt, seconds
    backoff: float = 2.0
    backoff_max: float = 60.0


@dataclass
class Registry:
    """The workflow kinds an engine can advance."""

    kinds: dict[str, WorkflowKind[Any]] = field(default_factory=dict)
    _decoder: msgspec.json.Decoder[Workflow[WorkflowData]] | None = field(
        default=None, init=False, repr=False
    )

    def add(self, kind: WorkflowKind[Any]) -> None:
        if kind.name in self.kinds:
            raise ValueError(f"workflow kind {kind.name!r} is registered twice")
        if any(k.data is kind.data for k in self.kinds.values()):
            raise ValueError(f"workflow kind {kind.name!r}: its data type is another kind's")
        self.kinds[kind.name] = kind
        self._decoder = None

    def get(self, kind: str) -> WorkflowKind[Any] | None:
        return self.kinds.get(kind)

    @property
    def decoder(self) -> msgspec.json.Decoder[Workflow[WorkflowData]]:
        """A decoder of the records of these kinds (their data a tagged union of the kinds'
        data types)."""
        if self._decoder is None:
            types = tuple(k.data for k in self.kinds.values())
            data: Any = Union[types] if types else WorkflowData  # noqa: UP007 (built at run time)
            self._decoder = msgspec.json.Decoder(Workflow[data])
        return self._decoder

    def tags(self) -> list[str]:
        """The data versions these kinds read (``<kind>/<version>``)."""
        return sorted(tag_of(k.data) for k in self.kinds.values())


def tag_of(cls: type[WorkflowData]) -> str:
    """A data type's version, ``<kind>/<version>``."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return str(info.tag)


def legacy_data(cls: type[D], raw: Mapping[str, str]) -> D:
    """A kind's data from a record written before the data was typed (an object of strings,
    where lists, maps and numbers were JSON text and flags "1" or ""): each string read as its
    field's type, then checked as a decoded record is (`msgspec.convert`: bounds, unknown
    fields). Raises ValueError naming what does not convert."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    types = {f.encode_name: f.type for f in info.fields}
    out: dict[str, object] = {info.tag_field or "schema": info.tag}
    for key, text in raw.items():
        t = types.get(key)
        if isinstance(t, mi.UnionType):  # optional: the type besides None
            t = next((x for x in t.types if not isinstance(x, mi.NoneType)), t)
        try:
            if t is None or isinstance(t, mi.StrType):
                out[key] = text
            elif isinstance(t, mi.BoolType):
                out[key] = text == "1"
            else:
                out[key] = json.loads(text)
        except ValueError:
            raise ValueError(
                f"data field {key!r} is not {type(t).__name__}: {text[:100]!r}"
            ) from None
    try:
        return msgspec.convert(out, cls)
    except msgspec.ValidationError as e:
        raise ValueError(f"data: {e}") from None
