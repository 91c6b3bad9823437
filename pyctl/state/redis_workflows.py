"""Workflow records in Redis (`WorkflowStore`): two hashes on the cluster's slot (`keys.py`),
data and version by workflow id, changed only by Lua scripts that compare the version first, so
a compare-and-set is one atomic round trip on a single Redis and on Redis Cluster alike."""

from __future__ import annotations

from pyctl.state.keys import Keys
from pyctl.state.redis_client import RedisClient, RedisConfig, Script, redis_errors, release_idle
from pyctl.state.workflows import (
    ConflictError,
    Quarantined,
    WorkflowRecord,
    check_id,
    check_version,
)

# KEYS: data, version. ARGV: id, expected version, data. Returns {1, new} or {0, found}.
_PUT = Script("""
local found = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if found ~= tonumber(ARGV[2]) then return {0, found} end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], found + 1)
return {1, found + 1}
""")

# KEYS: data, version. ARGV: id, expected version. Returns {1, 0} or {0, found}.
_DELETE = Script("""
local found = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if found == 0 or found ~= tonumber(ARGV[2]) then return {0, found} end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return {1, 0}
""")

# KEYS: data, version, quarantined data, quarantine reasons. ARGV: id, expected version, reason.
# Returns {1, 0} or {0, found}.
_QUARANTINE = Script("""
local found = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if found == 0 or found ~= tonumber(ARGV[2]) then return {0, found} end
redis.call('HSET', KEYS[3], ARGV[1], redis.call('HGET', KEYS[1], ARGV[1]) or '')
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return {1, 0}
""")

# KEYS: data, version. ARGV: id. Returns {version, data} or false.
_GET = Script("""
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return false end
return {v, redis.call('HGET', KEYS[1], ARGV[1])}
""")

# KEYS: data, version. Returns {{id, data, ...}, {id, version, ...}} read at one instant.
_LIST = Script("""
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
""")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisWorkflowStore:
    """Uses a client made by `redis_client.connect`; does not close it."""

    def __init__(self, client: RedisClient, config: RedisConfig, cluster: str) -> None:
        self._client = client
        self.config = config
        self.keys = Keys(cluster, config.key_prefix)
        self.cluster = self.keys.cluster

    async def release_idle(self) -> None:
        """Close the client's idle connections (`redis_client.release_idle`; the rate limits
        share the client)."""
        await release_idle(self._client)

    @property
    def _keys(self) -> list[str]:
        return [self.keys.workflow_data, self.keys.workflow_versions]

    async def put(self, workflow_id: str, data: bytes, expected_version: int) -> int:
        args: list[str | bytes | int] = [
            check_id(workflow_id),
            check_version(expected_version),
            bytes(data),
        ]
        async with redis_errors(f"put workflow {workflow_id!r}", self.config):
            ok, version = await _PUT(self._client, self._keys, args)
        if int(ok) != 1:
            raise ConflictError(workflow_id, expected_version, int(version))
        return int(version)

    async def get(self, workflow_id: str) -> WorkflowRecord | None:
        async with redis_errors(f"get workflow {workflow_id!r}", self.config):
            got = await _GET(self._client, self._keys, [check_id(workflow_id)])
        if not got:
            return None
        version, data = got
        return WorkflowRecord(workflow_id, int(version), bytes(data or b""))

    async def list(self) -> dict[str, WorkflowRecord]:
        async with redis_errors("list workflows", self.config):
            data_flat, version_flat = await _LIST(self._client, self._keys, [])
        data = {_text(data_flat[i]): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
        out: dict[str, WorkflowRecord] = {}
        for i in range(0, len(version_flat), 2):
            wid = _text(version_flat[i])
            out[wid] = WorkflowRecord(wid, int(version_flat[i + 1]), bytes(data.get(wid, b"")))
        return out

    async def delete(self, workflow_id: str, expected_version: int) -> None:
        args: list[str | bytes | int] = [check_id(workflow_id), check_version(expected_version)]
        async with redis_errors(f"delete workflow {workflow_id!r}", self.config):
            ok, found = await _DELETE(self._client, self._keys, args)
        if int(ok) != 1:
            raise ConflictError(workflow_id, expected_version, int(found))

    async def quarantine(self, workflow_id: str, expected_version: int, reason: str) -> None:
        keys = [*self._keys, self.keys.workflow_quarantine, self.keys.workflow_quarantine_reasons]
        args: list[str | bytes | int] = [
            check_id(workflow_id),
            check_version(expected_version),
            reason,
        ]
        async with redis_errors(f"quarantine workflow {workflow_id!r}", self.config):
            ok, found = await _QUARANTINE(self._client, keys, args)
        if int(ok) != 1:
            raise ConflictError(workflow_id, expected_version, int(found))

    async def quarantined(self) -> dict[str, Quarantined]:
        keys = [self.keys.workflow_quarantine, self.keys.workflow_quarantine_reasons]
        async with redis_errors("list quarantined workflows", self.config):
            data_flat, reason_flat = await _LIST(self._client, keys, [])
        data = {_text(data_flat[i]): data_flat[i + 1] for i in range(0, len(data_flat), 2)}
        out: dict[str, Quarantined] = {}
        for i in range(0, len(reason_flat), 2):
            wid = _text(reason_flat[i])
            out[wid] = Quarantined(wid, _text(reason_flat[i + 1]), bytes(data.get(wid, b"")))
        return out
