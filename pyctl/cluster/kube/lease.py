"""Leader election with a `coordination.k8s.io/v1` Lease, written over the raw API (client-go's
algorithm; kubernetes-asyncio's `leaderelection` has sharp edges: no release, local-time stamps,
connection errors escaping `run()`; `shared/docs/control_plane.md` §11.5).

- Acquire: GET the Lease (create it if missing); take it if it has no holder, or if its record has
  not changed for `lease_duration` by our own clock (never by comparing timestamps across
  machines). The write is a PUT carrying the resourceVersion read: two candidates racing get one
  200 and one 409.
- Renew every `retry_period`; a leader that has not renewed within `renew_deadline` (API server
  unreachable, conflicts) or that sees another holder stops being leader at once, and competes
  again. `renew_deadline < lease_duration` leaves the others' `lease_duration` to notice.
- Release on shutdown: holderIdentity "" so that another candidate takes over at its next try.
- `still_leader()`, for a workflow before each mutation: leader, and renewed within
  `renew_deadline` (false as soon as that lapses, even before the renew loop notices).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

import aiohttp
import anyio

from pyctl.cluster.kube.client import CONNECTION_ERRORS, KubeApiError, KubeClient, path_part
from pyctl.jsontypes import JsonObject, JsonValue

log = logging.getLogger(__name__)

#: seconds a Lease is held without renewal; the `lease_duration` setting's default
LEASE_DURATION: Final = 15.0


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: how long a release on shutdown may take
    release_timeout: float = 2.0

    def __post_init__(self) -> None:
        if not (self.namespace and self.name and self.identity):
            raise ValueError("lease: namespace, name and identity must not be empty")
        if not 0 < self.retry_period * 1.2 < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "lease: need 0 < 1.2 * retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline}, {self.lease_duration}"
            )

    @property
    def path(self) -> str:
        ns, name = path_part(self.namespace), path_part(self.name)
        return f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}"


def micro_time(t: datetime) -> str:
    """A Kubernetes MicroTime (RFC 3339, microseconds, UTC)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_RECORD = ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")


def _record(spec: JsonObject) -> tuple[JsonValue, ...]:
    return tuple(spec.get(k) for k in _RECORD)


def _lease(got: object) -> JsonObject:
    """A Lease as the API server answered it; `ValueError` when it is not an object."""
    if not isinstance(got, dict):
        raise ValueError(f"the Lease is a {type(got).__name__}, not an object")
    return got


def _spec(lease: JsonObject) -> JsonObject:
    """The Lease's spec (an empty one put in when it has none); `ValueError` when it is not an
    object or a field read here has the wrong type."""
    spec = lease.get("spec")
    if spec is None:
        spec = lease["spec"] = {}
    if not isinstance(spec, dict):
        raise ValueError(f"the Lease's spec is a {type(spec).__name__}, not an object")
    for key, types in _SPEC_TYPES.items():
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            raise ValueError(f"the Lease's spec.{key} is {value!r}")
    return spec


#: the types of the spec's fields read here (each may be absent or null)
_SPEC_TYPES: dict[str, type | tuple[type, ...]] = {
    "holderIdentity": str,
    "leaseDurationSeconds": (int, float),
    "leaseTransitions": (int, str),
}


def _holder(spec: JsonObject) -> str:
    holder = spec.get("holderIdentity")
    return holder if isinstance(holder, str) else ""


class LeaderElector:
    """One candidate. `run()` competes (and leads) until cancelled, then releases the Lease."""

    def __init__(
        self,
        kube: KubeClient,
        config: LeaseConfig,
        *,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.config = config
        self.on_change = on_change
        self._clock = clock
        self._rng = rng or random.Random()
        self._leader = False
        self._renewed_at = -math.inf  # when the last successful write was sent (our clock)
        self._observed: tuple[JsonValue, ...] | None = None
        self._observed_at = -math.inf
        self._lease: JsonObject | None = None  # the Lease as last read or written
        self._changed: anyio.Event | None = None
        self.transitions = 0  # how many times this candidate became leader
        self.errors = 0  # failed attempts (API server unreachable, unexpected status)
        self.holder = ""  # the holder last observed

    @property
    def changed(self) -> anyio.Event:
        """Set at the next change of leadership (a new Event after each change)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    @property
    def is_leader(self) -> bool:
        return self._leader

    def still_leader(self) -> bool:
        """Leader, with a renewal sent less than `renew_deadline` ago: safe to mutate now."""
        return self._leader and self._clock() - self._renewed_at < self.config.renew_deadline

    async def wait_for(self, leader: bool = True) -> None:
        """Return once `is_leader == leader`."""
        while self._leader != leader:
            await self.changed.wait()

    def _set_leader(self, leader: bool) -> None:
        if leader == self._leader:
            return
        self._leader = leader
        if leader:
            self.transitions += 1
        log.info(
            "lease %s/%s: %s %s",
            self.config.namespace,
            self.config.name,
            self.config.identity,
            "is now the leader" if leader else "is no longer the leader",
        )
        event, self._changed = self._changed, None
        if event is not None:
            event.set()
        if self.on_change is not None:
            try:
                self.on_change(leader)
            except Exception:
                log.exception("lease %s: on_change callback failed", self.config.name)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await self._acquire()
                await self._renew()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.release_timeout):
                await self.release()

    async def _acquire(self) -> None:
        cfg = self.config
        while True:
            if await self._attempt():
                self._set_leader(True)
                return
            # client-go's JitterUntil: retry_period * [1, 2.2)
            await anyio.sleep(cfg.retry_period * (1 + 1.2 * self._rng.random()))

    async def _renew(self) -> None:
        cfg = self.config
        while True:
            await anyio.sleep(cfg.retry_period)
            renewed = False
            with anyio.move_on_after(
                max(0.0, self._renewed_at + cfg.renew_deadline - self._clock())
            ):
                while not (renewed := await self._attempt()):
                    if self.holder and self.holder != cfg.identity:
                        break  # someone else holds it: we are not the leader, whatever the clock
                    await anyio.sleep(cfg.retry_period)
            if not renewed:
                self._set_leader(False)
                return

    async def _attempt(self) -> bool:
        """One try to acquire or renew; False on any failure (counted)."""
        try:
            return await self._try_acquire_or_renew()
        except (*CONNECTION_ERRORS, KubeApiError, ValueError) as e:
            self.errors += 1
            log.warning("lease %s: %s: %s", self.config.name, type(e).__name__, e)
            return False

    def _timeout(self) -> aiohttp.ClientTimeout:
        t = max(1.0, self.config.renew_deadline / 2)
        return aiohttp.ClientTimeout(total=t, sock_connect=t, sock_read=t)

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.config
        sent = self._clock()
        now = micro_time(datetime.now(UTC))
        duration = max(1, math.ceil(cfg.lease_duration))
        resp = await self.kube.request("GET", cfg.path, client_timeout=self._timeout())
        if resp.status == 404:
            lease: JsonObject = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": cfg.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                },
            }
            created = await self.kube.request(
                "POST",
                cfg.path.rsplit("/", 1)[0],
                body=lease,
                client_timeout=self._timeout(),
            )
            if created.status == 409:
                return False  # another candidate created it first
            return self._written(_lease(created.check().json()), sent)
        lease = _lease(resp.check().json())
        spec = _spec(lease)
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        holder = _holder(spec)
        self.holder = holder
        got = spec.get("leaseDurationSeconds")
        observed_duration = got if isinstance(got, int | float) and got else duration
        if holder and holder != cfg.identity:
            if self._leader:
                self._set_leader(False)  # taken over (we must have lapsed): never two leaders
                return False
            if self._observed_at + observed_duration > self._clock():
                return False
        if holder == cfg.identity:
            spec["acquireTime"] = spec.get("acquireTime") or now
        else:
            spec["acquireTime"] = now
            n = spec.get("leaseTransitions")
            spec["leaseTransitions"] = int(n if isinstance(n, int | str) and n else 0) + 1
        spec["holderIdentity"] = cfg.identity
        spec["leaseDurationSeconds"] = duration
        spec["renewTime"] = now
        # PUT with the resourceVersion just read: a concurrent writer makes this a 409.
        put = await self.kube.request("PUT", cfg.path, body=lease, client_timeout=self._timeout())
        if put.status == 409:
            return False
        return self._written(_lease(put.check().json()), sent)

    def _written(self, lease: JsonObject, sent: float) -> bool:
        spec = _spec(lease)
        self._lease = lease
        self._observed, self._observed_at = _record(spec), self._clock()
        self.holder = _holder(spec)
        self._renewed_at = sent
        return True

    async def release(self) -> bool:
        """Give the Lease up (if held): holderIdentity "" so the next candidate need not wait
        for it to expire. True if released."""
        lease = self._lease
        was_leader = self._leader
        self._set_leader(False)
        self._renewed_at = -math.inf
        if not was_leader or lease is None:
            return False
        for _ in range(3):
            now = micro_time(datetime.now(UTC))
            spec = _spec(lease)
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now, acquireTime=now)
            try:
                resp = await self.kube.request(
                    "PUT", self.config.path, body=lease, client_timeout=self._timeout()
                )
            except (*CONNECTION_ERRORS, KubeApiError) as e:
                log.warning("lease %s: release failed: %s", self.config.name, e)
                return False
            if resp.ok:
                break
            if resp.status != 409:
                log.warning("lease %s: release: %s", self.config.name, resp.error())
                return False
            # 409: our copy is stale (e.g. a renewal that was cancelled after the server applied
            # it). Re-read: if the Lease is still ours, release that version; else it is theirs.
            try:
                current = await self.kube.request(
                    "GET", self.config.path, client_timeout=self._timeout()
                )
            except (*CONNECTION_ERRORS, KubeApiError) as e:
                log.warning("lease %s: release failed: %s", self.config.name, e)
                return False
            if not current.ok:
                return False
            try:
                lease = _lease(json.loads(current.data))
                holder = _holder(_spec(lease))
            except ValueError as e:
                log.warning("lease %s: release: %s", self.config.name, e)
                return False
            if holder != self.config.identity:
                return False
        else:
            log.warning("lease %s: release: still conflicting after retries", self.config.name)
            return False
        released = json.loads(resp.data)
        self._lease = released if isinstance(released, dict) else None
        log.info("lease %s/%s released", self.config.namespace, self.config.name)
        return True
