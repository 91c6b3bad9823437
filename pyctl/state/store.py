"""The state store interface.

The controller keeps its working view of a cluster in process (`pyctl.controller.cache`); the
store is the durable, shared copy: a cache and a coordination point, rebuildable from a relist.
Writes come in batches of watch events (`apply`), or as the full content of one kind after a
relist (`replace`), each atomic. Key layout for Redis: `keys.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import msgspec

from pyctl.cluster.records import Event, Kind, Record, decode_record, record_key

SCHEMA_VERSION = 4


class StoreError(Exception):
    """The store is unreachable or refused an operation; the controller retries later."""


class StoreUnreachable(StoreError):
    """The store did not answer (a connection refused or lost, a timeout, a Redis still loading
    its data, a cluster down), as opposed to answering with a refusal."""


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
    #: why the member's stored summary cannot be used (its key of another type, a publication
    #: time or TTL that is not one, or out of bounds); then `summary` is empty, the age and TTL
    #: 0, and the member is never fresh
    error: str = ""

    @property
    def stale(self) -> bool:
        """No heartbeat within the TTL: the member is shown, marked stale."""
        return self.age_seconds > self.ttl_seconds

    @property
    def fresh(self) -> bool:
        """Valid and within its TTL: its summary may be used."""
        return not self.error and not self.stale


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


# ---- reading the state back (`pyctl status`, `pyctl explain`: pyctl/app/state.py) --------------


@dataclass(frozen=True)
class StoredKind:
    """One kind as read back: the records that decode, by key; those that do not, by key, with
    why (they are skipped and left where they are: a reader never writes); the resourceVersion
    the kind was stored at ("" if none); and when it was last written, on the store's clock
    (None when no write of this pyctl recorded it)."""

    kind: Kind
    records: dict[str, Record]
    resource_version: str
    written: float | None
    skipped: dict[str, str]


@dataclass(frozen=True)
class StoredState:
    """Every kind of one cluster, read at one instant (`now`, on the store's clock: Redis TIME
    for Redis, so ages do not depend on the reader's clock)."""

    cluster: str
    kinds: dict[Kind, StoredKind]
    now: float

    def records(self, kind: Kind) -> dict[str, Record]:
        return self.kinds[kind].records

    @property
    def skipped(self) -> list[tuple[Kind, str, str]]:
        """(kind, key, why) of every record that did not decode."""
        return [(k, key, why) for k, s in self.kinds.items() for key, why in s.skipped.items()]


#: the longest reason kept for a skipped record
_WHY = 300


def decode_stored(
    kind: Kind, pairs: Iterable[tuple[bytes | str, bytes]]
) -> tuple[dict[str, Record], dict[str, str]]:
    """Decode stored (key, record) pairs one at a time. A record that does not decode, or that
    names another object than the key it is stored under, is skipped with a one-line reason;
    it never stops the others."""
    records: dict[str, Record] = {}
    skipped: dict[str, str] = {}
    for raw_key, data in pairs:
        key = raw_key.decode(errors="replace") if isinstance(raw_key, bytes) else raw_key
        shown = key[:200]
        try:
            rec = decode_record(kind, bytes(data))
        except (msgspec.MsgspecError, ValueError, RecursionError) as e:
            why = " ".join(str(e).split()) or type(e).__name__
            skipped[shown] = f"does not decode as a {kind} record: {why}"[:_WHY]
            continue
        if record_key(rec) != key:
            skipped[shown] = f"stored under {shown!r} but names {record_key(rec)[:200]!r}"[:_WHY]
            continue
        records[key] = rec
    return records, skipped


@runtime_checkable
class StateReader(Protocol):
    """What reads a cluster's state back without writing anything. May raise `StoreError`
    (`StateLostError` when the store holds no state of the cluster, `SchemaError` when it holds
    another schema version's)."""

    cluster: str

    async def read(self) -> StoredState:
        """Every kind, read at one instant; records that do not decode are skipped and named."""

    async def read_summary(self) -> MemberSummary | None:
        """This cluster's published summary and its age (None: none published, or expired)."""
