"""The safety limits, with the same tests against the in-memory limiter (on a fake clock) and the
Redis one (single and Cluster, on Redis's clock: real, short sleeps with margins of at least
0.2 s); then what only a shared Redis gives: two clients, and two processes, sharing limits."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from pyctl.cluster.records import PodRecord
from pyctl.state.ratelimit import (
    Bound,
    Bucket,
    BucketLimit,
    Budget,
    Cooldown,
    MemoryRateLimiter,
    RateLimiter,
    Request,
    SafetyLimits,
    Slot,
)
from pyctl.state.redis_client import close_client, connect
from pyctl.state.redis_ratelimit import RedisRateLimiter
from tests.redis_servers import RedisClusterServers

from .conftest import REDIS_MODES, STORE_MODES, config_for, redis_config

pytestmark = pytest.mark.anyio

SLOW = 0.001  # tokens per second: no refill within a test


@dataclass
class Harness:
    limiter: RateLimiter
    wait: Callable[[float], Awaitable[None]]
    #: the memory limiter's clock is exact; Redis's runs on while the test does
    exact: bool


@pytest.fixture(params=STORE_MODES)
async def harness(request: pytest.FixtureRequest, cluster_name: str) -> AsyncIterator[Harness]:
    if request.param == "memory":
        now = [1000.0]

        async def advance(seconds: float) -> None:
            now[0] += seconds

        yield Harness(MemoryRateLimiter(clock=lambda: now[0]), advance, exact=True)
        return
    config = config_for(request, request.param)
    client = connect(config)
    try:
        yield Harness(RedisRateLimiter(client, config, cluster_name), anyio.sleep, exact=False)
    finally:
        await close_client(client)


def between(value: float, low: float, high: float, exact: bool) -> bool:
    """`value` is `high` on an exact clock, in (low, high] on a running one."""
    return value == pytest.approx(high) if exact else low < value <= high + 1e-6


async def test_bucket_drains_and_refills(harness: Harness) -> None:
    lim = harness.limiter
    req = Request(buckets=(Bucket("node/gpu-1", capacity=3, per_second=2),))
    for _ in range(3):
        assert (await lim.acquire(req)).allowed
    denied = await lim.acquire(req)
    assert not denied.allowed
    assert denied.limit == "bucket"
    assert [b.name for b in denied.bound] == ["node/gpu-1"]
    assert between(denied.retry_after, 0.3, 0.5, harness.exact)
    await harness.wait(0.6)  # 1.2 tokens back
    assert (await lim.acquire(req)).allowed
    assert not (await lim.acquire(req)).allowed
    other = Request(buckets=(Bucket("node/gpu-2", capacity=3, per_second=2),))
    assert (await lim.acquire(other)).allowed  # buckets are independent


async def test_all_or_nothing(harness: Harness) -> None:
    lim = harness.limiter
    a, b = Bucket("global", 5, SLOW), Bucket("namespace/ml", 1, SLOW)
    assert (await lim.acquire(Request(buckets=(a, b)))).allowed
    denied = await lim.acquire(Request(buckets=(a, b)))
    assert not denied.allowed
    assert [x.name for x in denied.bound] == ["namespace/ml"]  # only the one that bound
    # the refused request drew nothing from `a`: its 4 tokens are all there
    assert (await lim.acquire(Request(buckets=(Bucket("global", 5, SLOW, cost=4),)))).allowed
    assert not (await lim.acquire(Request(buckets=(a,)))).allowed


async def test_never_grantable(harness: Harness) -> None:
    lim = harness.limiter
    too_big = await lim.acquire(Request(buckets=(Bucket("big", 3, 1.0, cost=5),)))
    assert not too_big.allowed
    assert too_big.retry_after == math.inf
    fixed = Request(buckets=(Bucket("no-refill", 1, 0.0),))
    assert (await lim.acquire(fixed)).allowed
    assert (await lim.acquire(fixed)).retry_after == math.inf
    zero = await lim.acquire(Request(budgets=(Budget("none", 0),)))
    assert zero.bound == (Bound("budget", "none", math.inf),)
    closed = await lim.acquire(Request(slot=Slot("closed", "h", 0, 10)))
    assert closed.bound == (Bound("concurrency", "closed", math.inf),)


async def test_naming_a_bucket_twice_draws_twice(harness: Harness) -> None:
    lim = harness.limiter
    b = Bucket("workload/ml/llama", 2, SLOW)
    assert (await lim.acquire(Request(buckets=(b, b)))).allowed
    assert not (await lim.acquire(Request(buckets=(b,)))).allowed


async def test_cooldown(harness: Harness) -> None:
    lim = harness.limiter
    assert (await lim.acquire(Request(cooldowns=(Cooldown("node/a", 0.5),)))).allowed
    denied = await lim.acquire(Request(cooldowns=(Cooldown("node/a"),)))
    assert denied.limit == "cooldown"
    assert between(denied.retry_after, 0.3, 0.5, harness.exact)
    assert (await lim.acquire(Request(cooldowns=(Cooldown("node/b"),)))).allowed
    assert await lim.cooldown_remaining("node/b") == 0  # checked only, not started
    await lim.start_cooldown("node/a", 0.1)  # never shortens
    assert between(await lim.cooldown_remaining("node/a"), 0.3, 0.5, harness.exact)
    await harness.wait(0.7)
    assert await lim.cooldown_remaining("node/a") == 0
    assert (await lim.acquire(Request(cooldowns=(Cooldown("node/a"),)))).allowed
    await lim.start_cooldown("node/c", 0.5)
    assert not (await lim.acquire(Request(cooldowns=(Cooldown("node/c"),)))).allowed


async def test_concurrency_slots_expire(harness: Harness) -> None:
    lim = harness.limiter

    def slot(holder: str) -> Slot:
        return Slot("mig-reconfiguration", holder, limit=2, ttl_seconds=0.5)

    assert (await lim.acquire(Request(slot=slot("a")))).allowed
    assert (await lim.acquire(Request(slot=slot("b")))).allowed
    denied = await lim.acquire(Request(slot=slot("c")))
    assert denied.limit == "concurrency"
    assert between(denied.retry_after, 0.3, 0.5, harness.exact)
    assert (await lim.acquire(Request(slot=slot("a")))).allowed  # a holder may take it again
    await lim.release_slot("mig-reconfiguration", "b")
    assert (await lim.acquire(Request(slot=slot("c")))).allowed
    assert set(await lim.slot_holders("mig-reconfiguration")) == {"a", "c"}
    assert await lim.renew_slot(slot("a"))

    await harness.wait(0.7)  # a and c crashed: their claims lapse by themselves
    assert await lim.slot_holders("mig-reconfiguration") == {}
    assert not await lim.renew_slot(slot("a"))
    assert (await lim.acquire(Request(slot=slot("d")))).allowed
    assert (await lim.acquire(Request(slot=slot("e")))).allowed
    assert not (await lim.acquire(Request(slot=slot("f")))).allowed


async def test_disruption_budget_slides(harness: Harness) -> None:
    lim = harness.limiter

    def spend(cost: int) -> Request:
        return Request(budgets=(Budget("disruptions", limit=3, window_seconds=1.0, cost=cost),))

    assert (await lim.acquire(spend(1))).allowed  # t0
    await harness.wait(0.5)
    assert (await lim.acquire(spend(2))).allowed  # t0.5: 3 spent in the window
    denied = await lim.acquire(spend(1))
    assert denied.limit == "budget"
    assert between(denied.retry_after, 0.3, 0.5, harness.exact)  # when t0's unit leaves
    assert (await lim.acquire(spend(4))).retry_after == math.inf
    await harness.wait(0.7)  # t1.2: t0's unit has left, t0.5's have not
    assert (await lim.acquire(spend(1))).allowed
    denied = await lim.acquire(spend(1))
    assert not denied.allowed
    assert between(denied.retry_after, 0.05, 0.3, harness.exact)


async def test_refusal_lists_every_bound_and_changes_nothing(harness: Harness) -> None:
    lim = harness.limiter
    await lim.acquire(Request(buckets=(Bucket("global", 1, SLOW),)))
    await lim.start_cooldown("node/a", 60)
    await lim.acquire(Request(budgets=(Budget("disruptions", 1, 3600),)))
    req = Request(
        buckets=(Bucket("global", 1, SLOW), Bucket("node/a", 5, SLOW)),
        cooldowns=(Cooldown("node/a", 30), Cooldown("node/b", 30)),
        slot=Slot("mig", "wf-1", 1, 60),
        budgets=(Budget("disruptions", 1, 3600),),
    )
    denied = await lim.acquire(req)
    assert [(b.limit, b.name) for b in denied.bound] == [
        ("bucket", "global"),
        ("cooldown", "node/a"),
        ("budget", "disruptions"),
    ]
    assert denied.limit == "bucket"
    assert denied.retry_after == max(b.retry_after for b in denied.bound)
    assert await lim.slot_holders("mig") == {}  # the free slot was not taken
    assert await lim.cooldown_remaining("node/b") == 0  # no cooldown started
    node_a = Request(buckets=(Bucket("node/a", 5, SLOW, cost=5),))
    assert (await lim.acquire(node_a)).allowed  # no token drawn from node/a


async def test_safety_limits(harness: Harness) -> None:
    lim = harness.limiter
    limits = SafetyLimits(
        global_bucket=BucketLimit(100, SLOW),
        node_bucket=BucketLimit(2, SLOW),
        namespace_bucket=None,
        workload_bucket=BucketLimit(1, SLOW),
        node_cooldown_seconds=60,
        mig_concurrency=1,
        disruptions_per_hour=4,
    )
    assert (await lim.acquire(limits.eviction("gpu-1", "ml", "llama"))).allowed
    assert (await lim.acquire(limits.eviction("gpu-1", "ml", "mistral"))).allowed
    third = await lim.acquire(limits.eviction("gpu-1", "ml", "qwen"))
    assert [(b.limit, b.name) for b in third.bound] == [("bucket", "node/gpu-1")]
    same_workload = await lim.acquire(limits.eviction("gpu-2", "ml", "llama"))
    assert [(b.limit, b.name) for b in same_workload.bound] == [("bucket", "workload/llama")]

    assert (await lim.acquire(limits.mig_reconfiguration("gpu-3", "wf-a", evictions=2))).allowed
    second = await lim.acquire(limits.mig_reconfiguration("gpu-4", "wf-b", evictions=0))
    assert [(b.limit, b.name) for b in second.bound] == [("concurrency", "mig-reconfiguration")]
    cooling = await lim.acquire(limits.eviction("gpu-3", "ml", "phi"))
    assert [(b.limit, b.name) for b in cooling.bound] == [
        ("cooldown", "node/gpu-3"),
        ("budget", "disruptions"),  # 2 evictions + 2 disruptions of the reconfiguration
    ]


async def test_a_refund_gives_back_what_was_drawn_once(harness: Harness) -> None:
    """Issue 36: a grant is a reservation; its refund gives back its token and its disruption,
    once (a refund retried after a lost connection gives nothing more)."""
    lim = harness.limiter
    req = Request(buckets=(Bucket("node/gpu-1", 2, SLOW),), budgets=(Budget("disruptions", 2),))
    first, second = await lim.acquire(req), await lim.acquire(req)
    assert first.receipt is not None
    assert second.receipt is not None
    assert first.receipt.id != second.receipt.id
    assert not (await lim.acquire(req)).allowed
    assert await lim.refund(first.receipt)
    assert not await lim.refund(first.receipt)
    assert (await lim.acquire(req)).allowed  # one token and one unit back, not two
    denied = await lim.acquire(req)
    assert [(b.limit, b.name) for b in denied.bound] == [
        ("bucket", "node/gpu-1"),
        ("budget", "disruptions"),
    ]


async def test_a_refund_never_fills_a_bucket_above_its_capacity(harness: Harness) -> None:
    lim = harness.limiter
    req = Request(buckets=(Bucket("global", 2, 20.0),))
    drawn = await lim.acquire(req)
    assert drawn.receipt is not None
    await harness.wait(0.2)  # full again
    assert await lim.refund(drawn.receipt)
    assert (await lim.acquire(req)).allowed
    assert (await lim.acquire(req)).allowed
    assert not (await lim.acquire(req)).allowed


async def test_a_refund_takes_back_its_own_budget_units(harness: Harness) -> None:
    """The units given back are the refunded grant's, not the oldest nor the newest: the
    window frees up when the units that remain leave it."""
    lim = harness.limiter

    def spend() -> Request:
        return Request(budgets=(Budget("disruptions", limit=2, window_seconds=1.0),))

    early = await lim.acquire(spend())  # t0
    await harness.wait(0.5)
    late = await lim.acquire(spend())  # t0.5
    assert early.receipt is not None
    assert late.receipt is not None
    assert await lim.refund(late.receipt)
    assert (await lim.acquire(spend())).allowed  # t0.5: the units of t0 and t0.5
    denied = await lim.acquire(spend())
    assert between(denied.retry_after, 0.3, 0.5, harness.exact)  # when t0's unit leaves


async def test_an_eviction_in_flight_holds_its_limits_and_a_failed_one_gives_them_back(
    harness: Harness,
) -> None:
    """The gate on this limiter: two evictions at once off one node with one token, the first
    answered 500 after the second asked; the second is held back while the first is in flight
    (reserved, not checked), then made; afterwards the node's token and the disruption are
    spent once, by the eviction that was made."""
    from pyctl.cluster.source import ActuatorError
    from pyctl.metrics import Metrics
    from pyctl.workflows.gate import Gate
    from tests.unit.test_workflows import ONE_PER_NODE, FakeCluster

    cluster = FakeCluster(
        {f"ns/p{i}": PodRecord("ns", f"p{i}", uid=f"u{i}", node="n1") for i in range(3)}
    )
    gate = Gate("enforce", lambda: True, harness.limiter, ONE_PER_NODE, cluster, Metrics(), "c")
    cluster.hold, cluster.fail["ns/p0"] = anyio.Event(), 500
    failed: list[ActuatorError] = []

    async def first() -> None:
        try:
            await gate.evict(cluster.pods["ns/p0"], "n1")
        except ActuatorError as e:
            failed.append(e)

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        with anyio.fail_after(10):
            await cluster.asked.wait()
        assert (await gate.evict(cluster.pods["ns/p1"], "n1")).outcome == "rate-limited"
        cluster.hold.set()
    assert len(failed) == 1
    cluster.hold = None
    assert (await gate.evict(cluster.pods["ns/p1"], "n1")).done
    r = await gate.evict(cluster.pods["ns/p2"], "n1")
    assert (r.outcome, r.reason) == ("rate-limited", "limit bucket binds")
    assert cluster.evictions == ["ns/p1"]


async def test_bad_limits_are_value_errors() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Bucket("x", 0, 1)
    with pytest.raises(ValueError, match="cost"):
        Bucket("x", 1, 1, cost=-1)
    with pytest.raises(ValueError, match="ttl_seconds"):
        Slot("x", "h", 1, 0)
    with pytest.raises(ValueError, match="non-empty name"):
        Cooldown("")
    with pytest.raises(ValueError, match="window_seconds"):
        Budget("x", 1, window_seconds=math.inf)


@pytest.mark.redis
@pytest.mark.parametrize("mode", [p.values[0] for p in REDIS_MODES])
async def test_two_clients_share_limits(
    request: pytest.FixtureRequest, mode: str, cluster_name: str
) -> None:
    """Two replicas (two clients, two connection pools) acquiring at once: the limits hold
    exactly, whoever asks."""
    config = config_for(request, mode)
    clients = [connect(config), connect(config)]
    try:
        limiters = [RedisRateLimiter(c, config, cluster_name) for c in clients]
        results: list[tuple[str, bool]] = []

        async def ask(i: int, what: str, req: Request) -> None:
            results.append((what, (await limiters[i % 2].acquire(req)).allowed))

        async with anyio.create_task_group() as tg:
            for i in range(80):
                tg.start_soon(ask, i, "bucket", Request(buckets=(Bucket("global", 50, SLOW),)))
            for i in range(12):
                slot = Slot("mig-reconfiguration", f"wf-{i}", limit=3, ttl_seconds=60)
                tg.start_soon(ask, i, "slot", Request(slot=slot))
            for i in range(20):
                tg.start_soon(ask, i, "budget", Request(budgets=(Budget("disruptions", 7),)))
        granted = {w: sum(ok for what, ok in results if what == w) for w in ("bucket", "slot")}
        granted["budget"] = sum(ok for what, ok in results if what == "budget")
        assert granted == {"bucket": 50, "slot": 3, "budget": 7}
        assert len(await limiters[1].slot_holders("mig-reconfiguration")) == 3
    finally:
        for c in clients:
            await close_client(c)


_REPLICA = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from pyctl.state.ratelimit import Bucket, Budget, Request
    from pyctl.state.redis_client import RedisConfig, close_client, connect
    from pyctl.state.redis_ratelimit import RedisRateLimiter

    url, cluster, scope, barrier, me = sys.argv[1:6]

    async def main() -> None:
        config = RedisConfig(url=url, cluster=cluster == "1", socket_timeout=5, retries=1)
        client = connect(config)
        limiter = RedisRateLimiter(client, config, scope)
        await limiter.cooldown_remaining("warm-up")  # connected before the barrier
        Path(barrier, me).touch()
        deadline = time.monotonic() + 20
        while len(list(Path(barrier).iterdir())) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        req = Request(buckets=(Bucket("global", 30, 0.0001),), budgets=(Budget("disruptions", 25),))
        results = []
        for _ in range(4):
            results += await asyncio.gather(*(limiter.acquire(req) for _ in range(10)))
        print(sum(r.allowed for r in results), sorted({r.limit for r in results if r.limit}))
        await close_client(client)

    asyncio.run(main())
    """
)


@pytest.mark.redis
def test_two_processes_share_limits(redis_conn_sync: tuple[str, bool], tmp_path: Path) -> None:
    """Two controller processes on one Redis: 2 x 40 requests, a budget of 25: 25 granted."""
    url, cluster = redis_conn_sync
    scope = f"procs-{time.monotonic_ns()}"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _REPLICA, url, "1" if cluster else "0", scope, str(barrier), me],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in ("replica-a", "replica-b")
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        outputs.append(out.split(maxsplit=1))
    assert sum(int(granted) for granted, _ in outputs) == 25
    assert {limits.strip() for _, limits in outputs} == {"['budget']"}


@pytest.fixture(params=REDIS_MODES)
def redis_conn_sync(request: pytest.FixtureRequest) -> tuple[str, bool]:
    config = config_for(request, request.param)
    return config.url, config.cluster


@pytest.mark.redis
async def test_first_commands_of_a_fresh_cluster_client_at_once(
    redis_cluster: RedisClusterServers, cluster_name: str
) -> None:
    """redis-py 8.1's cluster client can fail when several commands are its first at once (an
    AttributeError inside the connection); the limiter initializes it first (`ready`)."""
    config = redis_config(redis_cluster.url, cluster=True)
    for _ in range(10):
        client = connect(config)
        try:
            limiter = RedisRateLimiter(client, config, cluster_name)
            req = Request(buckets=(Bucket("global", 1000, SLOW),))
            results = await asyncio.gather(*(limiter.acquire(req) for _ in range(30)))
            assert all(r.allowed for r in results)
        finally:
            await close_client(client)
