"""The safety limits in Redis: `RateLimiter` as Lua scripts, so that every replica, and every
cluster sharing the Redis and the scope, draws from the same limits atomically.

All the keys of a scope carry the scope in a hash tag (`keys.py`), so one script can read and
write every limit of a request on one Redis Cluster slot. The clock is Redis's own (``TIME``,
read once per script): replicas with skewed clocks still agree. A script reads every limit
first and writes only when all allow the request (semantics: `ratelimit.py`, which
`MemoryRateLimiter` mirrors). Idle state expires by itself: a bucket once it would be full, a
cooldown when it ends, a slot set after its last claim, a budget after its window.

A grant's effect is not idempotent: if the connection drops after Redis ran it, redis-py's retry
runs it again, and the request is drawn twice. That errs on the safe side (fewer actions). A
refund is: its script marks the receipt (`rl:refund:<id>`, kept an hour) and gives nothing back
for a receipt already marked, so a retried refund never gives back twice.
"""

from __future__ import annotations

import math

from pyctl.state.keys import Keys
from pyctl.state.ratelimit import (
    GRANTED,
    Bound,
    Cooldown,
    Decision,
    LimitKind,
    Receipt,
    Request,
    Slot,
    new_receipt_id,
)
from pyctl.state.redis_client import RedisClient, RedisConfig, Script, ready, redis_errors

_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function fmt(x) return string.format('%.6f', x) end
local function num(x) return string.format('%.17g', x) end
local function ms(seconds) return math.max(1, math.ceil(seconds * 1000)) end
"""

# KEYS: per bucket its hash, per cooldown its key, the slot zset (if any), per budget its zset
# and its sequence key. ARGV: nb, nc, ns, nd, then per bucket capacity, per_second, cost; per
# cooldown seconds; the slot's holder, limit, ttl; per budget limit, window, cost.
# Returns {1, unit, ...} when granted (the ids of the budget units spent, in order), else
# {0, kind, index, retry_after, kind, index, retry_after, ...}.
_ACQUIRE = Script(
    _PRELUDE
    + """
local nb, nc, ns, nd = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local a, k = 5, 1
local bound = {}
local function deny(kind, i, after)
  bound[#bound + 1] = kind
  bound[#bound + 1] = i
  bound[#bound + 1] = num(after)
end

local buckets = {}
for i = 1, nb do
  local key = KEYS[k]
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  k, a = k + 1, a + 3
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = cap
  if st[1] and st[2] then
    tokens = math.min(cap, tonumber(st[1]) + math.max(0, now - tonumber(st[2])) * rate)
  end
  if tokens < cost then
    local after = math.huge
    if rate > 0 and cost <= cap then after = (cost - tokens) / rate end
    deny('bucket', i, after)
  end
  buckets[i] = {key, tokens - cost, cap, rate}
end

local cooldowns = {}
for i = 1, nc do
  local key, secs = KEYS[k], tonumber(ARGV[a])
  k, a = k + 1, a + 1
  local untl = tonumber(redis.call('GET', key) or '-1')
  if untl > now then deny('cooldown', i, untl - now) end
  cooldowns[i] = {key, secs}
end

local slot
if ns == 1 then
  local key, holder = KEYS[k], ARGV[a]
  local limit, ttl = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  k, a = k + 1, a + 3
  local held = tonumber(redis.call('ZSCORE', key, holder) or '-1')
  if held <= now and redis.call('ZCOUNT', key, '(' .. fmt(now), '+inf') >= limit then
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now), '+inf', 'WITHSCORES',
      'LIMIT', 0, 1)
    local after = math.huge
    if first[2] then after = tonumber(first[2]) - now end
    deny('concurrency', 1, after)
  end
  slot = {key, holder, ttl}
end

local budgets = {}
for i = 1, nd do
  local key, seq = KEYS[k], KEYS[k + 1]
  local limit, window, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  k, a = k + 2, a + 3
  local used = redis.call('ZCOUNT', key, '(' .. fmt(now - window), '+inf')
  if used + cost > limit then
    local after = math.huge
    if cost <= limit then
      local r = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(now - window), '+inf', 'WITHSCORES',
        'LIMIT', used + cost - limit - 1, 1)
      after = tonumber(r[2]) + window - now
    end
    deny('budget', i, after)
  end
  budgets[i] = {key, seq, window, cost}
end

if #bound > 0 then
  table.insert(bound, 1, 0)
  return bound
end

for i = 1, nb do
  local b = buckets[i]
  redis.call('HSET', b[1], 'tokens', num(b[2]), 'ts', fmt(now))
  if b[4] > 0 then
    redis.call('PEXPIRE', b[1], ms((b[3] - b[2]) / b[4]) + 1000)
  else
    redis.call('PERSIST', b[1])
  end
end
for i = 1, nc do
  local c = cooldowns[i]
  if c[2] > 0 then redis.call('SET', c[1], fmt(now + c[2]), 'PX', ms(c[2])) end
end
if slot then
  redis.call('ZREMRANGEBYSCORE', slot[1], '-inf', fmt(now))
  redis.call('ZADD', slot[1], fmt(now + slot[3]), slot[2])
  local last = redis.call('ZRANGE', slot[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', slot[1], ms(tonumber(last[2]) - now) + 1000)
end
local units = {1}
for i = 1, nd do
  local d = budgets[i]
  redis.call('ZREMRANGEBYSCORE', d[1], '-inf', fmt(now - d[3]))
  local last = redis.call('INCRBY', d[2], d[4])
  for j = last - d[4] + 1, last do
    local unit = fmt(now) .. ':' .. j
    redis.call('ZADD', d[1], fmt(now), unit)
    units[#units + 1] = unit
  end
  redis.call('PEXPIRE', d[1], ms(d[3]) + 1000)
  redis.call('PEXPIRE', d[2], ms(d[3]) + 1000)
end
return units
"""
)

# KEYS: the receipt's marker, per bucket its hash, per budget its zset. ARGV: nb, nd, the
# marker's lifetime (seconds), per bucket capacity, per_second, cost; per budget the number of
# units, then their ids. Returns 1 when given back, 0 when the receipt was refunded already.
_REFUND = Script(
    _PRELUDE
    + """
local nb, nd, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ms(keep)) then return 0 end
local a, k = 4, 2
for i = 1, nb do
  local key = KEYS[k]
  local cap, rate, cost = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  k, a = k + 1, a + 3
  local st = redis.call('HMGET', key, 'tokens', 'ts')
  -- no state: the bucket has expired full, there is nothing to give back
  if st[1] and st[2] then
    local tokens = math.min(cap, tonumber(st[1]) + math.max(0, now - tonumber(st[2])) * rate)
    tokens = math.min(cap, tokens + cost)
    redis.call('HSET', key, 'tokens', num(tokens), 'ts', fmt(now))
    if rate > 0 then
      redis.call('PEXPIRE', key, ms((cap - tokens) / rate) + 1000)
    end
  end
end
for i = 1, nd do
  local key, n = KEYS[k], tonumber(ARGV[a])
  k, a = k + 1, a + 1
  for j = 1, n do
    redis.call('ZREM', key, ARGV[a])
    a = a + 1
  end
end
return 1
"""
)

#: how long a refunded receipt is remembered (a receipt is refunded right after its action
#: failed: well within this)
REFUND_MEMORY_SECONDS = 3600.0

# KEYS: cooldown. ARGV: seconds. Starts or lengthens it.
_START_COOLDOWN = Script(
    _PRELUDE
    + """
local secs = tonumber(ARGV[1])
local untl = now + secs
if untl > tonumber(redis.call('GET', KEYS[1]) or '-1') then
  redis.call('SET', KEYS[1], fmt(untl), 'PX', ms(secs))
end
return 1
"""
)

# KEYS: cooldown. Returns the seconds left (string).
_COOLDOWN_LEFT = Script(
    _PRELUDE
    + """
return num(math.max(0, tonumber(redis.call('GET', KEYS[1]) or '-1') - now))
"""
)

# KEYS: slot zset. ARGV: holder, ttl. 1 if renewed, 0 if the claim had lapsed (it is dropped).
_RENEW_SLOT = Script(
    _PRELUDE
    + """
local held = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '-1')
if held <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], fmt(now + tonumber(ARGV[2])), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], ms(tonumber(last[2]) - now) + 1000)
return 1
"""
)

# KEYS: slot zset. Returns {holder, seconds left, ...} of the live claims.
_SLOT_HOLDERS = Script(
    _PRELUDE
    + """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. fmt(now), '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = num(tonumber(live[i + 1]) - now)
end
return out
"""
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisRateLimiter:
    """`RateLimiter` in Redis under one scope (by default a cluster's name; clusters that share
    limits share a scope). Uses a client made by `redis_client.connect`; does not close it."""

    def __init__(self, client: RedisClient, config: RedisConfig, scope: str) -> None:
        self._client = client
        self.config = config
        self.keys = Keys(scope, config.key_prefix)
        self.scope = self.keys.cluster

    async def acquire(self, request: Request) -> Decision:
        req = request.normalized()
        keys: list[str] = []
        args: list[str | int | float] = [
            len(req.buckets),
            len(req.cooldowns),
            0 if req.slot is None else 1,
            len(req.budgets),
        ]
        for b in req.buckets:
            keys.append(self.keys.bucket(b.name))
            args += (repr(float(b.capacity)), repr(float(b.per_second)), repr(float(b.cost)))
        for c in req.cooldowns:
            keys.append(self.keys.cooldown(c.name))
            args.append(repr(float(c.seconds)))
        if req.slot is not None:
            keys.append(self.keys.slots(req.slot.name))
            args += (req.slot.holder, req.slot.limit, repr(float(req.slot.ttl_seconds)))
        for d in req.budgets:
            keys += (self.keys.budget(d.name), self.keys.budget_seq(d.name))
            args += (d.limit, repr(float(d.window_seconds)), d.cost)
        if not keys:
            return GRANTED
        async with redis_errors("rate limit acquire", self.config):
            reply = await _ACQUIRE(self._client, keys, args)
        if int(reply[0]) == 1:
            units = [_text(u) for u in reply[1:]]
            spent: list[tuple[str, tuple[str, ...]]] = []
            for d in req.budgets:
                spent.append((d.name, tuple(units[: d.cost])))
                units = units[d.cost :]
            receipt = Receipt(new_receipt_id(), req.buckets, tuple(spent))
            return Decision(True, receipt=None if receipt.empty else receipt)
        names: dict[str, list[str]] = {
            "bucket": [b.name for b in req.buckets],
            "cooldown": [c.name for c in req.cooldowns],
            "concurrency": [req.slot.name] if req.slot is not None else [],
            "budget": [d.name for d in req.budgets],
        }
        bound: list[Bound] = []
        for i in range(1, len(reply), 3):
            kind: LimitKind = _text(reply[i])  # type: ignore[assignment]
            name = names[kind][int(reply[i + 1]) - 1]
            bound.append(Bound(kind, name, _seconds(reply[i + 2])))
        return Decision(False, tuple(bound))

    async def refund(self, receipt: Receipt) -> bool:
        keys = [self.keys.refund(receipt.id)]
        args: list[str | int | float] = [
            len(receipt.buckets),
            len(receipt.budgets),
            repr(REFUND_MEMORY_SECONDS),
        ]
        for b in receipt.buckets:
            keys.append(self.keys.bucket(b.name))
            args += (repr(float(b.capacity)), repr(float(b.per_second)), repr(float(b.cost)))
        for name, units in receipt.budgets:
            keys.append(self.keys.budget(name))
            args += (len(units), *units)
        async with redis_errors("rate limit refund", self.config):
            done = await _REFUND(self._client, keys, args)
        return int(done) == 1

    async def start_cooldown(self, name: str, seconds: float) -> None:
        Cooldown(name, seconds)  # validates
        async with redis_errors("start cooldown", self.config):
            await _START_COOLDOWN(self._client, [self.keys.cooldown(name)], [repr(float(seconds))])

    async def cooldown_remaining(self, name: str) -> float:
        async with redis_errors("read cooldown", self.config):
            left = await _COOLDOWN_LEFT(self._client, [self.keys.cooldown(name)], [])
        return _seconds(left)

    async def renew_slot(self, slot: Slot) -> bool:
        async with redis_errors("renew slot", self.config):
            renewed = await _RENEW_SLOT(
                self._client, [self.keys.slots(slot.name)], [slot.holder, repr(slot.ttl_seconds)]
            )
        return int(renewed) == 1

    async def release_slot(self, name: str, holder: str) -> None:
        async with redis_errors("release slot", self.config):
            await (await ready(self._client)).zrem(self.keys.slots(name), holder)

    async def slot_holders(self, name: str) -> dict[str, float]:
        async with redis_errors("read slot", self.config):
            flat = await _SLOT_HOLDERS(self._client, [self.keys.slots(name)], [])
        return {_text(flat[i]): _seconds(flat[i + 1]) for i in range(0, len(flat), 2)}


def _seconds(value: bytes | str) -> float:
    text = _text(value)
    return math.inf if text in ("inf", "1.#INF") else float(text)
