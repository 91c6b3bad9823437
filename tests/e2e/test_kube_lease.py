"""Leader election on a real coordination.k8s.io/v1 Lease: one leader of two, a release hands over
at once, and a leader whose renewals fail (its API server killed) steps down by its renew deadline,
before the other candidate takes over."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from pyctl.cluster.kube.client import KubeClient, connect
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig
from pyctl.dev.control_plane import ControlPlane, ExtraApiserver

from .conftest import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.timeout(90, func_only=True)]


def config(name: str, identity: str, lease_duration: float = 4.0) -> LeaseConfig:
    return LeaseConfig(
        "default", name, identity, lease_duration=lease_duration, renew_deadline=2.0,
        retry_period=0.3,
    )  # fmt: skip


@pytest.fixture
async def kube(control_plane: ControlPlane) -> Any:
    async with await connect(kubeconfig=control_plane.kubeconfig) as k:
        yield k


class Overlap:
    """Samples the candidates every 10 ms: at no time may two think they may act."""

    def __init__(self, *electors: LeaderElector) -> None:
        self.electors = electors
        self.samples = 0
        self.both = 0

    async def run(self) -> None:
        while True:
            if sum(e.still_leader() for e in self.electors) > 1:
                self.both += 1
            if sum(e.is_leader for e in self.electors) > 1:
                self.both += 1
            self.samples += 1
            await anyio.sleep(0.01)


@contextmanager
def elapsed() -> Iterator[list[float]]:
    out: list[float] = []
    t = time.monotonic()
    yield out
    out.append(time.monotonic() - t)


async def lease_spec(kube: KubeClient, cfg: LeaseConfig) -> dict[str, Any]:
    spec: dict[str, Any] = (await kube.request("GET", cfg.path)).check().json()["spec"]
    return spec


async def test_one_leader_of_two_and_release_hands_over(kube: KubeClient) -> None:
    name = f"pyctl-e2e-{uuid.uuid4().hex[:8]}"
    a = LeaderElector(kube, config(name, "a", lease_duration=10.0))
    b = LeaderElector(kube, config(name, "b", lease_duration=10.0))
    overlap = Overlap(a, b)
    async with anyio.create_task_group() as tg:
        tg.start_soon(overlap.run)
        scopes = {}
        for e in (a, b):
            scopes[e] = anyio.CancelScope()

            async def run(e: LeaderElector = e) -> None:
                with scopes[e]:
                    await e.run()

            tg.start_soon(run)
        await wait_until(lambda: a.is_leader or b.is_leader, "a leader")
        await anyio.sleep(1.5)  # several renewals and attempts
        leader, other = (a, b) if a.is_leader else (b, a)
        assert leader.is_leader
        assert leader.still_leader()
        assert not other.is_leader
        assert leader.transitions == 1
        assert other.transitions == 0
        spec = await lease_spec(kube, a.config)
        assert spec["holderIdentity"] == leader.config.identity
        assert spec["leaseDurationSeconds"] == 10

        # Shutdown releases the Lease: the other takes over well before it would have expired.
        with elapsed() as took:
            scopes[leader].cancel()
            await wait_until(lambda: other.is_leader, "the other candidate to take over")
        assert took[0] < 5.0, took  # retry period 0.3 s; waiting for expiry would take 10 s
        assert not leader.is_leader
        assert not leader.still_leader()
        spec = await lease_spec(kube, a.config)
        assert spec["holderIdentity"] == other.config.identity
        assert spec["leaseTransitions"] == 1
        tg.cancel_scope.cancel()
    assert overlap.samples > 50
    assert overlap.both == 0


async def test_leader_whose_renewals_fail_steps_down(
    kube: KubeClient, nocache_apiserver: ExtraApiserver
) -> None:
    """`a` talks to an apiserver that gets killed: its renewals fail, it stops being leader by
    its renew deadline (2 s); `b` takes over only once the Lease has expired (4 s)."""
    name = f"pyctl-e2e-{uuid.uuid4().hex[:8]}"
    async with await connect(kubeconfig=nocache_apiserver.kubeconfig) as kube_a:
        a = LeaderElector(kube_a, config(name, "a"))
        b = LeaderElector(kube, config(name, "b"))
        changes: list[tuple[str, bool, float]] = []
        a.on_change = lambda on: changes.append(("a", on, time.monotonic()))
        b.on_change = lambda on: changes.append(("b", on, time.monotonic()))
        overlap = Overlap(a, b)
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.run)
            await wait_until(lambda: a.is_leader, "a to lead")
            tg.start_soon(b.run)
            tg.start_soon(overlap.run)
            await anyio.sleep(1.0)
            assert a.is_leader
            assert not b.is_leader

            try:
                killed = time.monotonic()
                nocache_apiserver.kill()
                await wait_until(lambda: not a.still_leader(), "a to stop acting", 5)
                assert time.monotonic() - killed < 3.0  # renew deadline 2 s (+ scheduling)
                await wait_until(lambda: not a.is_leader, "a to step down", 5)
                await wait_until(lambda: b.is_leader, "b to take over", 10)
                assert a.errors > 0
            finally:
                nocache_apiserver.start()  # main thread (see ExtraApiserver)
            # a is back in touch: it follows, and b keeps leading.
            await anyio.sleep(1.0)
            assert b.is_leader
            assert not a.is_leader
            tg.cancel_scope.cancel()
    lost = next(t for who, on, t in changes if who == "a" and not on)
    won = next(t for who, on, t in changes if who == "b" and on)
    assert won - lost > 1.0, changes  # b waited for the Lease to expire, a had stepped down
    assert overlap.both == 0
