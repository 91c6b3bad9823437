"""Persistence of workflow runs (issue 7's crash-safe state machines): opaque records under an
id, each with a version number for compare-and-set, so that two writers (an old leader that has
not noticed it lost the Lease, and the new one) cannot both advance one run.

A record's version starts at 1 when it is created and goes up by one on every write. A write
names the version it read (0: "it must not exist yet"); if the stored version differs the write
is refused with `ConflictError` and nothing changes. The engine then re-reads and decides again.
What a record holds (state, step, what was done) is the workflow engine's business: bytes here.
A deleted record's version starts again at 1 if the id is reused: give each run a unique id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyctl.state.store import StoreError


class ConflictError(StoreError):
    """A compare-and-set found another version than the one the writer had read."""

    def __init__(self, workflow_id: str, expected: int, found: int) -> None:
        state = "does not exist" if found == 0 else f"is at version {found}"
        super().__init__(
            f"workflow {workflow_id!r} {state}, not at version {expected} as the writer read it"
        )
        self.workflow_id = workflow_id
        self.expected = expected
        self.found = found


@dataclass(frozen=True)
class WorkflowRecord:
    id: str
    version: int
    data: bytes


@dataclass(frozen=True)
class Quarantined:
    """A record that did not decode, as it was stored, and why it was moved aside."""

    id: str
    reason: str
    data: bytes


@runtime_checkable
class WorkflowStore(Protocol):
    """One cluster's workflow records. Every method may raise `StoreError`."""

    async def put(self, workflow_id: str, data: bytes, expected_version: int) -> int:
        """Write `data` if the stored version is `expected_version` (0: absent); returns the new
        version. Raises `ConflictError` otherwise."""

    async def get(self, workflow_id: str) -> WorkflowRecord | None: ...

    async def list(self) -> dict[str, WorkflowRecord]:
        """Every record, read at one instant."""

    async def delete(self, workflow_id: str, expected_version: int) -> None:
        """Remove the record if it is at `expected_version`; `ConflictError` otherwise (also when
        it does not exist)."""

    async def quarantine(self, workflow_id: str, expected_version: int, reason: str) -> None:
        """Move the record aside (kept with `reason`, out of `list`) if it is at
        `expected_version`; `ConflictError` otherwise."""

    async def quarantined(self) -> dict[str, Quarantined]:
        """The records moved aside, by id."""


def check_id(workflow_id: str) -> str:
    if not isinstance(workflow_id, str) or not workflow_id:
        raise ValueError(f"a workflow id must be a non-empty string, got {workflow_id!r}")
    return workflow_id


def check_version(expected_version: int) -> int:
    if not isinstance(expected_version, int) or expected_version < 0:
        raise ValueError(f"expected_version must be an integer >= 0, got {expected_version!r}")
    return expected_version


class MemoryWorkflowStore:
    def __init__(self) -> None:
        self._records: dict[str, WorkflowRecord] = {}
        self._quarantine: dict[str, Quarantined] = {}

    def _version(self, workflow_id: str) -> int:
        rec = self._records.get(workflow_id)
        return 0 if rec is None else rec.version

    async def put(self, workflow_id: str, data: bytes, expected_version: int) -> int:
        check_id(workflow_id)
        found = self._version(workflow_id)
        if found != check_version(expected_version):
            raise ConflictError(workflow_id, expected_version, found)
        self._records[workflow_id] = WorkflowRecord(workflow_id, found + 1, bytes(data))
        return found + 1

    async def get(self, workflow_id: str) -> WorkflowRecord | None:
        return self._records.get(check_id(workflow_id))

    async def list(self) -> dict[str, WorkflowRecord]:
        return dict(self._records)

    async def delete(self, workflow_id: str, expected_version: int) -> None:
        check_id(workflow_id)
        found = self._version(workflow_id)
        if found == 0 or found != check_version(expected_version):
            raise ConflictError(workflow_id, expected_version, found)
        del self._records[workflow_id]

    async def quarantine(self, workflow_id: str, expected_version: int, reason: str) -> None:
        check_id(workflow_id)
        found = self._version(workflow_id)
        if found == 0 or found != check_version(expected_version):
            raise ConflictError(workflow_id, expected_version, found)
        rec = self._records.pop(workflow_id)
        self._quarantine[workflow_id] = Quarantined(workflow_id, reason, rec.data)

    async def quarantined(self) -> dict[str, Quarantined]:
        return dict(self._quarantine)
