"""What every workflow shares: the persisted record (`Workflow`), the context its steps run in
(`Context`), and the registry of workflow kinds and their step handlers (`Registry`), filled
explicitly at start-up (`pyctl.workflows.kinds.builtin_registry`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import msgspec

from pyctl.cluster.records import PodRecord
from pyctl.workflows.gate import Gate

#: steps a workflow ends in
FINISHED = ("done", "dry-run", "failed", "abandoned")


class Workflow(msgspec.Struct):
    id: str
    kind: str
    node: str
    step: str
    created: float
    updated: float = 0.0
    attempts: int = 0
    #: wall-clock time before which the step is not retried (rate limits, PDB refusals)
    not_before: float = 0.0
    data: dict[str, str] = {}
    result: str = ""
    #: a replica is running this step until then (the process that claimed it leaves it alone;
    #: see `Engine.advance_all` for when the leader takes another process's claim over)
    claimed_until: float = 0.0
    #: the process that claimed it (`engine.INSTANCE`; "" in records written before the field)
    claimed_by: str = ""

    @property
    def finished(self) -> bool:
        return self.step in FINISHED


@dataclass
class Context:
    gate: Gate
    #: the pod as the controller sees it now (None: gone)
    pod: Callable[[str, str], PodRecord | None]
    clock: Callable[[], float] = time.time


Handler = Callable[[Context, Workflow], Awaitable[Workflow]]


def abandon(wf: Workflow, error: str) -> Workflow:
    """The default end of a workflow whose step keeps failing."""
    return msgspec.structs.replace(wf, step="abandoned", result=error)


@dataclass(frozen=True)
class WorkflowKind:
    """One kind of workflow: its step handlers, and where it goes after `max_errors` failed
    attempts of a step (`give_up`; a kind that has changed the cluster goes somewhere that
    undoes it, never straight to a finished step)."""

    name: str
    steps: Mapping[str, Handler]
    give_up: Callable[[Workflow, str], Workflow] = abandon
    max_errors: int = 10
    #: base and cap of the backoff after a failed attempt, seconds
    backoff: float = 2.0
    backoff_max: float = 60.0


@dataclass
class Registry:
    """The workflow kinds an engine can advance."""

    kinds: dict[str, WorkflowKind] = field(default_factory=dict)

    def add(self, kind: WorkflowKind) -> None:
        if kind.name in self.kinds:
            raise ValueError(f"workflow kind {kind.name!r} is registered twice")
        self.kinds[kind.name] = kind

    def get(self, kind: str) -> WorkflowKind | None:
        return self.kinds.get(kind)
