"""The state store interface.

The controller keeps its working view of a cluster in process (`pyctl.controller.cache`); the
store is the durable, shared copy: a cache and a coordination point, rebuildable from a relist.
Writes come in batches of watch events (`apply`), or as the full content of one kind after a
relist (`replace`), each atomic. Key layout for Redis: `keys.py`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyctl.cluster.records import Event, Kind, Record

SCHEMA_VERSION = 4


class StoreError(Exception):
    """The store is unreachable or refused an operation; the controller retries later."""


class SchemaError(StoreError):
    """The store holds state written by an incompatible pyctl (another schema version)."""


class StateLostError(StoreError):
    """The store lost its content since it was opened (a Redis restarted without persistence,
    flushed, or evicting): reopen it, then `replace` every kind (relist) before `apply` again."""


@dataclass(frozen=True)
class MemberSummary:
    """A federation member's last published summary and how old it is."""

    summary: bytes
    #: seconds since it was published (by the store's clock: Redis TIME for Redis)
    age_seconds: float
    #: how long it was published to stay fresh for
    ttl_seconds: int

    @property
    def stale(self) -> bool:
        """No heartbeat within the TTL: the member is shown, marked stale."""
        return self.age_seconds > self.ttl_seconds


@runtime_checkable
class StateStore(Protocol):
    """One cluster's state. Every method may raise `StoreError`."""

    cluster: str

    async def open(self) -> None:
        """Connect, and check (or write, on an empty store) the schema version."""

    async def close(self) -> None: ...

    async def ping(self) -> bool:
        """Whether the store answers now (never raises)."""

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        """Apply a batch of events atomically, with the resourceVersions they bring each kind to."""

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        """Replace everything of `kind` with `records` atomically (after a relist)."""

    async def load(self, kind: Kind) -> tuple[dict[str, Record], str]:
        """All records of `kind` by key, and the kind's resourceVersion ("" if none)."""

    async def put_summary(self, summary: bytes, ttl_seconds: int) -> None:
        """Publish this cluster's summary (federation), expiring after `ttl_seconds`."""

    async def get_summaries(self) -> dict[str, bytes]:
        """Every federation member's last summary that is still fresh, by cluster name."""

    async def get_members(self) -> dict[str, MemberSummary]:
        """Every federation member still known, fresh or stale, with its summary's age."""
