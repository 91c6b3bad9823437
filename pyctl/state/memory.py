"""The in-memory store: the embedded default. Same semantics as the Redis store, in one process
(records are kept encoded, as Redis keeps them, so both stores are exercised the same way)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from pyctl.cluster.records import (
    KINDS,
    Event,
    Kind,
    Record,
    decode_record,
    encode_record,
    record_key,
    record_kind,
)
from pyctl.state.store import (
    SCHEMA_VERSION,
    MemberSummary,
    StoredKind,
    StoredState,
    StoreError,
    decode_stored,
)


class MemoryStore:
    """`clock` (seconds, monotonic) is injectable for tests of summary ages."""

    def __init__(
        self, cluster: str = "default", *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.cluster = cluster
        self.schema = SCHEMA_VERSION
        self._clock = clock
        self._objects: dict[Kind, dict[str, bytes]] = {k: {} for k in KINDS}
        self._rv: dict[Kind, str] = dict.fromkeys(KINDS, "")
        self._written: dict[Kind, float] = {}
        #: cluster -> (summary, published at, ttl seconds)
        self._summaries: dict[str, tuple[bytes, float, int]] = {}
        #: records that did not decode on load: kind -> key -> (the record, why)
        self._quarantine: dict[Kind, dict[str, tuple[bytes, str]]] = {k: {} for k in KINDS}
        self._open = False

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def ping(self) -> bool:
        return self._open

    def _check(self) -> None:
        if not self._open:
            raise StoreError("memory store is closed")

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        self._check()
        for ev in events:
            kind = record_kind(ev.record)
            key = record_key(ev.record)
            if ev.type == "DELETED":
                self._objects[kind].pop(key, None)
            else:
                self._objects[kind][key] = encode_record(ev.record)
        self._rv.update(resource_versions)
        now = self._clock()
        for kind in {record_kind(ev.record) for ev in events} | set(resource_versions):
            self._written[kind] = now

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        self._check()
        self._objects[kind] = {record_key(r): encode_record(r) for r in records}
        self._rv[kind] = resource_version
        self._written[kind] = self._clock()

    async def load(self, kind: Kind) -> tuple[dict[str, Record], str]:
        self._check()
        out: dict[str, Record] = {}
        objects = self._objects[kind]
        for k, v in list(objects.items()):
            try:
                out[k] = decode_record(kind, v)
            except ValueError as e:  # one at a time: moved aside, never fatal
                self._quarantine[kind][k] = (objects.pop(k), f"{type(e).__name__}: {e}"[:1000])
        return out, self._rv[kind]

    async def quarantined(self, kind: Kind) -> dict[str, tuple[bytes, str]]:
        return dict(self._quarantine[kind])

    async def put_summary(self, summary: bytes, ttl_seconds: int) -> None:
        self._check()
        self._summaries[self.cluster] = (summary, self._clock(), ttl_seconds)

    async def get_summaries(self) -> dict[str, bytes]:
        return {c: m.summary for c, m in (await self.get_members()).items() if m.fresh}

    async def get_members(self) -> dict[str, MemberSummary]:
        self._check()
        now = self._clock()
        return {
            c: MemberSummary(summary=s, age_seconds=max(0.0, now - t), ttl_seconds=ttl)
            for c, (s, t, ttl) in self._summaries.items()
        }

    # -- reading back (`StateReader`) -------------------------------------------------------

    async def read(self) -> StoredState:
        self._check()
        kinds: dict[Kind, StoredKind] = {}
        for kind in KINDS:
            records, skipped = decode_stored(kind, self._objects[kind].items())
            kinds[kind] = StoredKind(
                kind, records, self._rv[kind], self._written.get(kind), skipped
            )
        return StoredState(self.cluster, kinds, self._clock())

    async def read_summary(self) -> MemberSummary | None:
        self._check()
        got = self._summaries.get(self.cluster)
        if got is None:
            return None
        s, t, ttl = got
        return MemberSummary(summary=s, age_seconds=max(0.0, self._clock() - t), ttl_seconds=ttl)
