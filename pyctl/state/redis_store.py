"""The Redis state store: `StateStore` on a single Redis or a Redis Cluster (key layout: `keys.py`).

Every write is one Lua script on the cluster's slot, so it is atomic (Redis runs a script alone)
and takes one round trip. Scripts check before they write: the schema key must hold this pyctl's
version (`SchemaError` names both) and be present at all (`StateLostError`: the Redis lost the
state, e.g. restarted without persistence), and every hash they touch must be a hash; a check
that fails returns before the first write, so a refused batch leaves nothing behind. Large
batches are passed whole and written by the script in chunks of `CHUNK` arguments (a Lua call
takes at most a few thousand). Reads of one kind (`load`) are one script too: the records and
their resourceVersion are a consistent pair.

Time for federation summaries is Redis's (`TIME`), so members whose clocks disagree still agree
on ages.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pyctl.cluster.bounds import MAX_SUMMARY_CLOCK_SKEW_SECONDS, MAX_SUMMARY_TTL_SECONDS
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
from pyctl.metrics import Metrics
from pyctl.state.keys import Keys
from pyctl.state.redis_client import (
    RedisClient,
    RedisConfig,
    Script,
    close_client,
    connect,
    ready,
    redis_errors,
    release_idle,
)
from pyctl.state.store import (
    SCHEMA_VERSION,
    MemberSummary,
    SchemaError,
    StoredKind,
    StoredState,
    StoreError,
    decode_stored,
)

__all__ = ["CHUNK", "RedisConfig", "RedisStore"]

log = logging.getLogger("pyctl.state")

#: arguments per HSET/HDEL call inside a script (Lua's unpack() stops near 8,000)
CHUNK = 4000
#: summaries read concurrently (a Redis Cluster client refuses more than 100 at once per node)
_MEMBERS_AT_ONCE = 32

# The checks every writing script starts with (before its first write). KEYS[1] is the schema
# key, ARGV[1] the schema version this pyctl writes; KEYS[2..] must be hashes (or absent).
_CHECKS = """
local have = redis.call('GET', KEYS[1])
if not have then return redis.error_reply('PYCTL_LOST') end
if have ~= ARGV[1] then
  return redis.error_reply('PYCTL_SCHEMA redis holds pyctl state of schema version ' .. have ..
    ', this pyctl uses schema version ' .. ARGV[1] .. ' (key ' .. KEYS[1] .. ')')
end
for i = 2, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'hash' and t ~= 'none' then
    return redis.error_reply('PYCTL_WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. t ..
      ', not a hash')
  end
end
local function chunked(cmd, key, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + CHUNK - 1, last)
    redis.call(cmd, key, unpack(ARGV, i, j))
    i = j + 1
  end
end
""".replace("CHUNK", str(CHUNK))

# KEYS: schema. ARGV: version. Writes the version on an empty store; returns what is stored.
_OPEN = Script("""
local have = redis.call('GET', KEYS[1])
if not have then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return have
""")

# KEYS: schema, rv, obj:<kind 1>, ..., obj:<kind m>, written.
# ARGV: version, m, then per kind: name, n_set, n_del, has_rv, rv; then per kind its n_set
# field/value pairs followed by its n_del fields.
_APPLY = Script(
    _CHECKS
    + """
local m = tonumber(ARGV[2])
local pos = 3 + 5 * m
for k = 1, m do
  local h = 3 + 5 * (k - 1)
  local key = KEYS[2 + k]
  local nset = tonumber(ARGV[h + 1])
  local ndel = tonumber(ARGV[h + 2])
  chunked('HSET', key, pos, pos + 2 * nset - 1)
  pos = pos + 2 * nset
  chunked('HDEL', key, pos, pos + ndel - 1)
  pos = pos + ndel
  if ARGV[h + 3] == '1' then redis.call('HSET', KEYS[2], ARGV[h], ARGV[h + 4]) end
end
local t = redis.call('TIME')
local now = string.format('%d.%06d', t[1], t[2])
for k = 1, m do redis.call('HSET', KEYS[#KEYS], ARGV[3 + 5 * (k - 1)], now) end
return 1
"""
)

# KEYS: schema, rv, obj:<kind>, written. ARGV: version, kind, rv, field/value pairs...
_REPLACE = Script(
    _CHECKS
    + """
redis.call('UNLINK', KEYS[3])
chunked('HSET', KEYS[3], 4, #ARGV)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local t = redis.call('TIME')
redis.call('HSET', KEYS[4], ARGV[2], string.format('%d.%06d', t[1], t[2]))
return 1
"""
)

# KEYS: schema, rv, obj:<kind>. ARGV: version, kind. Returns {rv, {field, value, ...}}.
_LOAD = Script(
    _CHECKS
    + """
local rv = redis.call('HGET', KEYS[2], ARGV[2]) or ''
return {rv, redis.call('HGETALL', KEYS[3])}
"""
)

# KEYS: schema, obj:<kind>, quarantine:obj:<kind>, its reasons. ARGV: version, field, the value
# read, reason. Moves the record aside if it still holds the value read; returns 1 if moved.
_QUARANTINE = Script(
    _CHECKS
    + """
local v = redis.call('HGET', KEYS[2], ARGV[2])
if v ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[3], ARGV[2], v)
redis.call('HSET', KEYS[4], ARGV[2], ARGV[4])
redis.call('HDEL', KEYS[2], ARGV[2])
return 1
"""
)

# KEYS: summary. ARGV: data, ttl, retention. Returns the publication time (Redis TIME, seconds).
_PUT_SUMMARY = Script("""
local t = redis.call('TIME')
local now = string.format('%d.%06d', t[1], t[2])
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'published', now, 'ttl', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return now
""")

# KEYS: summary. Returns {data, published, ttl, now, type of the key} or false when the summary
# is gone (a key of another type is reported with its type, not read; a missing field is '').
_READ_SUMMARY = Script("""
local typ = redis.call('TYPE', KEYS[1])['ok']
if typ == 'none' then return false end
local t = redis.call('TIME')
local now = string.format('%d.%06d', t[1], t[2])
if typ ~= 'hash' then return {'', '', '', now, typ} end
local v = redis.call('HMGET', KEYS[1], 'data', 'published', 'ttl')
if not v[1] then return false end
return {v[1], v[2] or '', v[3] or '', now, typ}
""")

# KEYS: members. ARGV: member, score read before. Removes the member unless it moved on since.
_FORGET_MEMBER = Script("""
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
""")


# KEYS: schema, rv, written, obj:<kind 1>, ..., obj:<kind n>. ARGV: version, kind 1, ..., kind n.
# Reads only. Returns {now, {{rv, written, type of obj:<kind>, {field, value, ...}}, ...}}: every
# kind at one instant (a key of another type than a hash is reported with its type, not read).
_READ = Script("""
local have = redis.call('GET', KEYS[1])
if not have then return redis.error_reply('PYCTL_LOST') end
if have ~= ARGV[1] then
  return redis.error_reply('PYCTL_SCHEMA redis holds pyctl state of schema version ' .. have ..
    ', this pyctl uses schema version ' .. ARGV[1] .. ' (key ' .. KEYS[1] .. ')')
end
local function field(key, f)
  if redis.call('TYPE', key)['ok'] ~= 'hash' then return '' end
  return redis.call('HGET', key, f) or ''
end
local out = {}
for i = 2, #ARGV do
  local key = KEYS[i + 2]
  local t = redis.call('TYPE', key)['ok']
  local flat = {}
  if t == 'hash' then flat = redis.call('HGETALL', key) end
  out[#out + 1] = {field(KEYS[2], ARGV[i]), field(KEYS[3], ARGV[i]), t, flat}
end
local t = redis.call('TIME')
return {string.format('%d.%06d', t[1], t[2]), out}
""")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStore:
    """`StateStore` on Redis. Makes (and owns) its client from `config` on `open()`, unless one is
    given (then the caller closes it: one client can serve the store, the rate limiter and the
    workflow store)."""

    def __init__(
        self,
        config: RedisConfig,
        cluster: str = "default",
        *,
        client: RedisClient | None = None,
        schema_version: int = SCHEMA_VERSION,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        #: counts records moved aside (`pyctl_quarantined_records_total{store="objects"}`)
        self.metrics = metrics
        self.keys = Keys(cluster, config.key_prefix)
        self.cluster = self.keys.cluster
        self.schema_version = schema_version
        self._client = client
        self._owns_client = client is None
        self._open = False

    @property
    def client(self) -> RedisClient:
        if self._client is None:
            raise StoreError(f"redis store of cluster {self.cluster!r} is not open")
        return self._client

    def _opened(self) -> RedisClient:
        if not self._open or self._client is None:
            raise StoreError(f"redis store of cluster {self.cluster!r} is not open")
        return self._client

    async def open(self) -> None:
        if self._client is None:
            self._client = connect(self.config)
        async with redis_errors("open", self.config):
            stored = await _OPEN(self._client, [self.keys.schema], [str(self.schema_version)])
        if _text(stored) != str(self.schema_version):
            raise SchemaError(
                f"redis at {self.config.describe()} holds pyctl state of schema version "
                f"{_text(stored)} for cluster {self.cluster!r}; this pyctl uses schema version "
                f"{self.schema_version}"
            )
        self._open = True

    async def release_idle(self) -> None:
        """Close the client's idle connections (`redis_client.release_idle`)."""
        if self._client is not None:
            await release_idle(self._client)

    async def close(self) -> None:
        self._open = False
        if self._client is not None and self._owns_client:
            client, self._client = self._client, None
            await close_client(client)

    async def ping(self) -> bool:
        client = self._client
        if client is None:
            return False
        try:
            # routed to the node that owns this cluster's slot (in cluster mode)
            async with asyncio.timeout(self.config.socket_timeout + self.config.connect_timeout):
                await (await ready(client)).exists(self.keys.schema)
        except Exception:  # whatever it is, the store does not answer now
            return False
        return True

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        client = self._opened()
        # Only the last event of an object in a batch decides what is stored.
        final: dict[Kind, dict[str, bytes | None]] = {}
        for ev in events:
            kind = record_kind(ev.record)
            final.setdefault(kind, {})[record_key(ev.record)] = (
                None if ev.type == "DELETED" else encode_record(ev.record)
            )
        kinds = list(final) + [k for k in resource_versions if k not in final]
        if not kinds:
            return
        header: list[str | bytes] = [str(self.schema_version), str(len(kinds))]
        body: list[str | bytes] = []
        for kind in kinds:
            objs = final.get(kind, {})
            dels = [key for key, data in objs.items() if data is None]
            n_set = 0
            for key, data in objs.items():
                if data is not None:
                    body += (key, data)
                    n_set += 1
            body += dels
            rv = resource_versions.get(kind)
            header += (kind, str(n_set), str(len(dels)), "0" if rv is None else "1", rv or "")
        keys = [self.keys.schema, self.keys.resource_versions]
        keys += [self.keys.objects(kind) for kind in kinds]
        keys.append(self.keys.written)
        async with redis_errors(f"apply ({len(events)} events)", self.config):
            await _APPLY(client, keys, header + body)

    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        client = self._opened()
        args: list[str | bytes] = [str(self.schema_version), kind, resource_version]
        for r in records:
            args += (record_key(r), encode_record(r))
        keys = [self.keys.schema, self.keys.resource_versions, self.keys.objects(kind)]
        keys.append(self.keys.written)
        async with redis_errors(f"replace {kind} ({len(records)} records)", self.config):
            await _REPLACE(client, keys, args)

    async def load(self, kind: Kind) -> tuple[dict[str, Record], str]:
        client = self._opened()
        keys = [self.keys.schema, self.keys.resource_versions, self.keys.objects(kind)]
        async with redis_errors(f"load {kind}", self.config):
            rv, flat = await _LOAD(client, keys, [str(self.schema_version), kind])
        records: dict[str, Record] = {}
        bad: list[tuple[bytes, bytes, str]] = []
        for i in range(0, len(flat), 2):
            field, data = bytes(flat[i]), bytes(flat[i + 1])
            try:
                records[field.decode()] = decode_record(kind, data)
            except ValueError as exc:  # msgspec's errors, BoundsError, UnicodeDecodeError
                bad.append((field, data, f"{type(exc).__name__}: {exc}"[:1000]))
        for field, data, why in bad:
            await self._quarantine(kind, field, data, why)
        return records, _text(rv)

    async def _quarantine(self, kind: Kind, field: bytes, data: bytes, why: str) -> None:
        """Move a record that does not decode aside (one at a time, never fatal: the others are
        loaded; a relist writes the object again)."""
        shown = field.decode(errors="replace")[:300]
        log.error(
            "stored record does not decode; quarantined",
            extra={"kind": kind, "record": shown, "error": why[:300]},
        )
        if self.metrics is not None:
            self.metrics.workflow.quarantined.labels(self.cluster, "objects").inc()
        keys = [
            self.keys.schema,
            self.keys.objects(kind),
            self.keys.objects_quarantine(kind),
            self.keys.objects_quarantine_reasons(kind),
        ]
        try:
            async with redis_errors(f"quarantine {kind} record", self.config):
                await _QUARANTINE(
                    self._opened(), keys, [str(self.schema_version), field, data, why]
                )
        except StoreError as e:  # left where it is: moved aside at the next load
            log.warning("could not quarantine a record", extra={"error": str(e)})

    async def quarantined(self, kind: Kind) -> dict[str, tuple[bytes, str]]:
        """The records of `kind` moved aside: key -> (the record as stored, why)."""
        client = self._opened()
        async with redis_errors(f"list quarantined {kind} records", self.config):
            r = await ready(client)
            data = await r.hgetall(self.keys.objects_quarantine(kind))
            why = cast(
                "dict[Any, Any]", await r.hgetall(self.keys.objects_quarantine_reasons(kind))
            )
        return {
            bytes(k).decode(errors="replace"): (bytes(v), bytes(why.get(k, b"")).decode())
            for k, v in cast("dict[Any, Any]", data).items()
        }

    async def put_summary(self, summary: bytes, ttl_seconds: int) -> None:
        client = self._opened()
        if not 1 <= ttl_seconds <= MAX_SUMMARY_TTL_SECONDS:
            most = MAX_SUMMARY_TTL_SECONDS
            raise ValueError(f"summary ttl_seconds must be within 1..{most}, got {ttl_seconds}")
        retention = max(self.config.summary_retention_seconds, ttl_seconds)
        async with redis_errors("put_summary", self.config):
            published = await _PUT_SUMMARY(
                client, [self.keys.summary], [summary, ttl_seconds, retention]
            )
            # The index spans clusters, so it is outside this cluster's slot: its own command.
            await (await ready(client)).zadd(
                self.keys.members, {self.cluster: float(_text(published))}
            )

    async def get_summaries(self) -> dict[str, bytes]:
        return {c: m.summary for c, m in (await self.get_members()).items() if m.fresh}

    async def get_members(self) -> dict[str, MemberSummary]:
        client = self._opened()
        members_key = self.keys.members
        async with redis_errors("get_members", self.config):
            index = cast(
                "list[tuple[bytes, float]]",
                await (await ready(client)).zrange(members_key, 0, -1, withscores=True),
            )
            names: list[tuple[str, float, str]] = []
            for raw, score in index:
                try:
                    names.append((_text(raw), score, Keys(_text(raw), self.keys.prefix).summary))
                except ValueError:  # not a cluster name pyctl writes: ignore it
                    continue
            reads: list[Any] = []
            for i in range(0, len(names), _MEMBERS_AT_ONCE):
                batch = names[i : i + _MEMBERS_AT_ONCE]
                reads += await asyncio.gather(*(_READ_SUMMARY(client, [k], []) for *_, k in batch))
            out: dict[str, MemberSummary] = {}
            for (name, score, key), got in zip(names, reads, strict=True):
                if not got:  # past its retention: drop it from the index
                    await _FORGET_MEMBER(client, [members_key], [name, repr(score)])
                    continue
                out[name] = stored_member(key, got)
        return out

    # -- reading back (`StateReader`): no writes, and no `open()` needed -----------------------

    def _reader(self) -> RedisClient:
        if self._client is None:
            self._client = connect(self.config)
        return self._client

    async def read(self) -> StoredState:
        client = self._reader()
        keys = [self.keys.schema, self.keys.resource_versions, self.keys.written]
        keys += [self.keys.objects(kind) for kind in KINDS]
        async with redis_errors(f"read the state of cluster {self.cluster!r}", self.config):
            now, rows = await _READ(client, keys, [str(self.schema_version), *KINDS])
        kinds: dict[Kind, StoredKind] = {}
        for kind, (rv, written, typ, flat) in zip(KINDS, rows, strict=True):
            if _text(typ) not in ("hash", "none"):
                key = self.keys.objects(kind)
                records: dict[str, Record] = {}
                skipped = {key: f"key {key} holds a {_text(typ)}, not a hash: not read"}
            else:
                pairs = ((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
                records, skipped = decode_stored(kind, pairs)
            kinds[kind] = StoredKind(kind, records, _text(rv), _seconds(written), skipped)
        return StoredState(self.cluster, kinds, float(_text(now)))

    async def read_summary(self) -> MemberSummary | None:
        client = self._reader()
        async with redis_errors(f"read the summary of cluster {self.cluster!r}", self.config):
            got = await _READ_SUMMARY(client, [self.keys.summary], [])
        if not got:
            return None
        member = stored_member(self.keys.summary, got)
        if member.error:
            raise StoreError(f"the summary of cluster {self.cluster!r} is invalid: {member.error}")
        return member


_TTL = re.compile(r"[0-9]{1,10}")


def stored_member(key: str, got: Sequence[Any]) -> MemberSummary:
    """A member's summary as `_READ_SUMMARY` read it from `key`; one whose key is not a hash, or
    whose publication time or TTL is not one (not a number, not finite, in the future, a TTL
    beyond `MAX_SUMMARY_TTL_SECONDS`: it would look fresh for ever), is invalid (`error`)."""
    data, published, ttl, now, typ = got

    def invalid(why: str) -> MemberSummary:
        return MemberSummary(b"", 0.0, 0, error=why)

    if _text(typ) != "hash":
        return invalid(f"key {key} holds a {_text(typ)}, not a hash")
    at, clock = _seconds(published), float(_text(now))
    if at is None or not 0 < at <= clock + MAX_SUMMARY_CLOCK_SKEW_SECONDS:
        return invalid(f"published time {_shown(published)} is not a time up to now")
    t = ttl.decode("ascii", "replace") if isinstance(ttl, bytes) else str(ttl)
    if not _TTL.fullmatch(t) or not 1 <= int(t) <= MAX_SUMMARY_TTL_SECONDS:
        return invalid(f"ttl {_shown(ttl)} is not a whole number of 1..{MAX_SUMMARY_TTL_SECONDS} s")
    return MemberSummary(bytes(data), max(0.0, clock - at), int(t))


def _shown(value: bytes | str) -> str:
    """A stored field as shown in a message (at most 40 characters)."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return repr(text[:40])


def _seconds(value: bytes | str) -> float | None:
    """A stored time (seconds), None when absent or not a finite number."""
    try:
        t = float(_text(value))
    except (TypeError, ValueError, UnicodeDecodeError):
        return None
    return t if math.isfinite(t) else None
