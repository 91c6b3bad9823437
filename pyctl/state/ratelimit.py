"""The safety limits every mutation of a cluster passes (issue 7), and their in-memory form.

Four kinds of limit, all in one request so that a request is granted all-or-nothing:

- token buckets (`Bucket`): ``capacity`` tokens when full, refilled at ``per_second``; a request
  draws ``cost`` from each bucket it names (global, per node, per namespace, per workload...);
- cooldowns (`Cooldown`): a name (a node) that was acted on may not be acted on again before its
  cooldown ends; granting a request starts the cooldowns it names (``seconds`` > 0);
- a concurrency slot (`Slot`): at most ``limit`` holders at once (concurrent MIG
  reconfigurations); a holder's claim expires ``ttl_seconds`` after it was taken or last renewed,
  so a crashed holder frees its slot by itself; taking a slot one already holds renews it;
- budgets (`Budget`): at most ``limit`` units spent over any sliding ``window_seconds`` (the
  disruption budget per hour).

Either every limit allows the request, and then every bucket is drawn, every cooldown started,
the slot taken and every budget spent; or nothing changes, and the `Decision` lists every limit
that bound and how long until it might not (for metrics and requeueing).

A granted request is a reservation: its `Decision` carries a `Receipt` of what it drew, and
`refund(receipt)` gives the tokens and the budget units back when the action they were drawn for
did not happen (an eviction refused or failed), so that limits count what was done, not what was
tried. Taking before acting keeps two callers from both passing; giving back afterwards is one
atomic step as well, and a receipt is refunded at most once. Cooldowns and slots are not given
back (an eviction starts none; a MIG reconfiguration releases its slot itself).

Time: the Redis implementation reads the clock of Redis (``TIME``, inside the script) so that
replicas, and clusters sharing one Redis, use one clock whatever theirs say; this in-memory one
takes an injectable clock (seconds, monotonic) for tests.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, TypeAlias, runtime_checkable

LimitKind: TypeAlias = Literal["bucket", "cooldown", "concurrency", "budget"]


@dataclass(frozen=True)
class Bucket:
    name: str
    capacity: float
    per_second: float
    cost: float = 1.0

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not self.capacity > 0:
            raise ValueError(f"bucket {self.name!r}: capacity must be > 0, got {self.capacity}")
        if not (self.per_second >= 0 and math.isfinite(self.per_second)):
            raise ValueError(f"bucket {self.name!r}: per_second must be >= 0 (finite)")
        if not (self.cost > 0 and math.isfinite(self.cost)):
            raise ValueError(f"bucket {self.name!r}: cost must be > 0, got {self.cost}")


@dataclass(frozen=True)
class Cooldown:
    name: str
    #: started when the request is granted; 0 only checks that `name` is not cooling down
    seconds: float = 0.0

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not (self.seconds >= 0 and math.isfinite(self.seconds)):
            raise ValueError(f"cooldown {self.name!r}: seconds must be >= 0, got {self.seconds}")


@dataclass(frozen=True)
class Slot:
    name: str
    holder: str
    limit: int
    ttl_seconds: float

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_name(self.holder)
        if self.limit < 0:
            raise ValueError(f"slot {self.name!r}: limit must be >= 0, got {self.limit}")
        if not (self.ttl_seconds > 0 and math.isfinite(self.ttl_seconds)):
            raise ValueError(f"slot {self.name!r}: ttl_seconds must be > 0")


@dataclass(frozen=True)
class Budget:
    name: str
    limit: int
    window_seconds: float = 3600.0
    cost: int = 1

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.limit < 0:
            raise ValueError(f"budget {self.name!r}: limit must be >= 0, got {self.limit}")
        if not (self.window_seconds > 0 and math.isfinite(self.window_seconds)):
            raise ValueError(f"budget {self.name!r}: window_seconds must be > 0")
        if self.cost < 1:
            raise ValueError(f"budget {self.name!r}: cost must be >= 1, got {self.cost}")


@dataclass(frozen=True)
class Request:
    buckets: tuple[Bucket, ...] = ()
    cooldowns: tuple[Cooldown, ...] = ()
    slot: Slot | None = None
    budgets: tuple[Budget, ...] = ()

    def normalized(self) -> Request:
        """One entry per bucket, cooldown and budget name (costs add up, the longest cooldown
        wins), so that naming a limit twice in one request means drawing from it twice."""
        buckets: dict[str, Bucket] = {}
        for b in self.buckets:
            seen = buckets.get(b.name)
            buckets[b.name] = b if seen is None else replace(seen, cost=seen.cost + b.cost)
        cooldowns: dict[str, Cooldown] = {}
        for c in self.cooldowns:
            seen_c = cooldowns.get(c.name)
            cooldowns[c.name] = c if seen_c is None or c.seconds > seen_c.seconds else seen_c
        budgets: dict[str, Budget] = {}
        for d in self.budgets:
            seen_d = budgets.get(d.name)
            budgets[d.name] = d if seen_d is None else replace(seen_d, cost=seen_d.cost + d.cost)
        return Request(
            tuple(buckets.values()), tuple(cooldowns.values()), self.slot, tuple(budgets.values())
        )


@dataclass(frozen=True)
class Bound:
    """One limit that refused a request."""

    limit: LimitKind
    name: str
    #: seconds until this limit alone would allow the request (math.inf: never, e.g. a cost
    #: above the bucket's capacity)
    retry_after: float


@dataclass(frozen=True)
class Receipt:
    """What a granted request drew, to give back with `RateLimiter.refund`: its buckets (each
    with the cost drawn) and, per budget, the ids of the units spent. `id` is unique per grant:
    a receipt is refunded at most once."""

    id: str
    buckets: tuple[Bucket, ...] = ()
    budgets: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.buckets and not self.budgets


def new_receipt_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Decision:
    allowed: bool
    bound: tuple[Bound, ...] = field(default=())
    #: what a granted request drew (None when refused, or granted with nothing to draw)
    receipt: Receipt | None = None

    @property
    def retry_after(self) -> float:
        """Seconds until every limit that bound might allow the request (0 when allowed)."""
        return max((b.retry_after for b in self.bound), default=0.0)

    @property
    def limit(self) -> LimitKind | None:
        """The kind of the first limit that bound (for a metric label), None when allowed."""
        return self.bound[0].limit if self.bound else None


GRANTED = Decision(True)


@runtime_checkable
class RateLimiter(Protocol):
    """Shared safety limits. Every method may raise `StoreError` (the Redis implementation)."""

    async def acquire(self, request: Request) -> Decision:
        """Grant `request` entirely or not at all (see the module docstring); a grant carries
        the `Receipt` of what it drew."""

    async def refund(self, receipt: Receipt) -> bool:
        """Give back what `receipt` drew (a bucket never above its capacity; the budget units it
        spent, by id, whatever was spent since); False, and nothing changes, if it was refunded
        already."""

    async def start_cooldown(self, name: str, seconds: float) -> None:
        """Start (or lengthen, never shorten) the cooldown of `name`."""

    async def cooldown_remaining(self, name: str) -> float:
        """Seconds left in `name`'s cooldown (0 when none)."""

    async def renew_slot(self, slot: Slot) -> bool:
        """Extend `slot.holder`'s claim by `slot.ttl_seconds`; False if it had lost it."""

    async def release_slot(self, name: str, holder: str) -> None: ...

    async def slot_holders(self, name: str) -> dict[str, float]:
        """The live holders of slot `name` and the seconds left on each claim."""


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a limit needs a non-empty name, got {name!r}")


@dataclass(frozen=True)
class BucketLimit:
    """The parameters of one family of buckets (one per node, per namespace...)."""

    capacity: float
    per_second: float


@dataclass(frozen=True)
class SafetyLimits:
    """The configured limits of issue 7, and the requests the workflows make from them.
    A family set to None is not limited."""

    global_bucket: BucketLimit | None = BucketLimit(capacity=10, per_second=1 / 60)
    node_bucket: BucketLimit | None = BucketLimit(capacity=2, per_second=1 / 300)
    namespace_bucket: BucketLimit | None = BucketLimit(capacity=5, per_second=1 / 120)
    workload_bucket: BucketLimit | None = BucketLimit(capacity=1, per_second=1 / 120)
    node_cooldown_seconds: float = 300.0
    mig_concurrency: int = 1
    mig_slot_ttl_seconds: float = 900.0
    disruptions_per_hour: int | None = 20

    def _buckets(self, **names: str | None) -> tuple[Bucket, ...]:
        out = []
        for family, name in names.items():
            spec: BucketLimit | None = getattr(self, f"{family}_bucket")
            if spec is not None and name is not None:
                label = "global" if family == "global" else f"{family}/{name}"
                out.append(Bucket(label, spec.capacity, spec.per_second))
        return tuple(out)

    def _budget(self, cost: int) -> tuple[Budget, ...]:
        if self.disruptions_per_hour is None:
            return ()
        return (Budget("disruptions", self.disruptions_per_hour, 3600.0, cost),)

    def eviction(self, node: str, namespace: str, workload: str) -> Request:
        """One eviction: the four buckets, the node not cooling down, one disruption."""
        return Request(
            buckets=self._buckets(
                **{"global": "", "node": node, "namespace": namespace, "workload": workload}
            ),
            cooldowns=(Cooldown(f"node/{node}"),),
            budgets=self._budget(1),
        )

    def mig_reconfiguration(self, node: str, holder: str, evictions: int) -> Request:
        """Start a MIG reconfiguration: a concurrency slot, the global and node buckets, the node
        not cooling down (its cooldown starts now), `evictions` disruptions."""
        return Request(
            buckets=self._buckets(**{"global": "", "node": node}),
            cooldowns=(Cooldown(f"node/{node}", self.node_cooldown_seconds),),
            slot=Slot(
                "mig-reconfiguration", holder, self.mig_concurrency, self.mig_slot_ttl_seconds
            ),
            budgets=self._budget(evictions) if evictions > 0 else (),
        )


class MemoryRateLimiter:
    """The limits in one process (the embedded default, and the reference for the Redis one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)
        self._cooldowns: dict[str, float] = {}  # name -> until
        self._slots: dict[str, dict[str, float]] = {}  # name -> holder -> expiry
        # name -> (time, unit id) of spent units, ascending
        self._budgets: dict[str, list[tuple[float, str]]] = {}
        self._refunded: dict[str, float] = {}  # receipt id -> when it was refunded

    def _tokens(self, b: Bucket, now: float) -> float:
        state = self._buckets.get(b.name)
        if state is None:
            return b.capacity
        tokens, at = state
        return min(b.capacity, tokens + max(0.0, now - at) * b.per_second)

    async def acquire(self, request: Request) -> Decision:
        req = request.normalized()
        now = self._clock()
        bound: list[Bound] = []
        for b in req.buckets:
            tokens = self._tokens(b, now)
            if tokens < b.cost:
                after = math.inf
                if b.per_second > 0 and b.cost <= b.capacity:
                    after = (b.cost - tokens) / b.per_second
                bound.append(Bound("bucket", b.name, after))
        for c in req.cooldowns:
            until = self._cooldowns.get(c.name, -math.inf)
            if until > now:
                bound.append(Bound("cooldown", c.name, until - now))
        if req.slot is not None:
            s = req.slot
            live = {h: e for h, e in self._slots.get(s.name, {}).items() if e > now}
            if s.holder not in live and len(live) >= s.limit:
                after = min(live.values()) - now if live else math.inf
                bound.append(Bound("concurrency", s.name, after))
        for d in req.budgets:
            spent = self._spent(d, now)
            if len(spent) + d.cost > d.limit:
                after = math.inf
                if d.cost <= d.limit:
                    after = spent[len(spent) + d.cost - d.limit - 1][0] + d.window_seconds - now
                bound.append(Bound("budget", d.name, after))
        if bound:
            return Decision(False, tuple(bound))
        for b in req.buckets:
            self._buckets[b.name] = (self._tokens(b, now) - b.cost, now)
        for c in req.cooldowns:
            if c.seconds > 0:
                self._cooldowns[c.name] = now + c.seconds
        if req.slot is not None:
            s = req.slot
            live = {h: e for h, e in self._slots.get(s.name, {}).items() if e > now}
            live[s.holder] = now + s.ttl_seconds
            self._slots[s.name] = live
        rid = new_receipt_id()
        units: list[tuple[str, tuple[str, ...]]] = []
        for d in req.budgets:
            ids = tuple(f"{rid}:{j}" for j in range(d.cost))
            self._budgets[d.name] = self._spent(d, now) + [(now, i) for i in ids]
            units.append((d.name, ids))
        receipt = Receipt(rid, req.buckets, tuple(units))
        return Decision(True, receipt=None if receipt.empty else receipt)

    def _spent(self, d: Budget, now: float) -> list[tuple[float, str]]:
        return [u for u in self._budgets.get(d.name, []) if u[0] > now - d.window_seconds]

    async def refund(self, receipt: Receipt) -> bool:
        now = self._clock()
        # a receipt is at most an hour old when refunded (the longest wait a limit asks for)
        self._refunded = {r: t for r, t in self._refunded.items() if t > now - 3600.0}
        if receipt.id in self._refunded:
            return False
        self._refunded[receipt.id] = now
        for b in receipt.buckets:
            if b.name in self._buckets:
                self._buckets[b.name] = (min(b.capacity, self._tokens(b, now) + b.cost), now)
        for name, ids in receipt.budgets:
            gone = set(ids)
            self._budgets[name] = [u for u in self._budgets.get(name, []) if u[1] not in gone]
        return True

    async def start_cooldown(self, name: str, seconds: float) -> None:
        Cooldown(name, seconds)  # validates
        until = self._clock() + seconds
        if until > self._cooldowns.get(name, -math.inf):
            self._cooldowns[name] = until

    async def cooldown_remaining(self, name: str) -> float:
        return max(0.0, self._cooldowns.get(name, -math.inf) - self._clock())

    async def renew_slot(self, slot: Slot) -> bool:
        now = self._clock()
        holders = self._slots.get(slot.name, {})
        if holders.get(slot.holder, -math.inf) > now:
            holders[slot.holder] = now + slot.ttl_seconds
            return True
        holders.pop(slot.holder, None)
        return False

    async def release_slot(self, name: str, holder: str) -> None:
        self._slots.get(name, {}).pop(holder, None)

    async def slot_holders(self, name: str) -> dict[str, float]:
        now = self._clock()
        return {h: e - now for h, e in self._slots.get(name, {}).items() if e > now}
