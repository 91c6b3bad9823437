"""A work queue keyed by node, after client-go's: adding a key that is already queued coalesces;
a key added while it is being processed is processed again once, after; failures are requeued
with per-key exponential backoff until `forget`."""

from __future__ import annotations

import math
from collections import deque

import anyio


class WorkQueue:
    def __init__(self, base_delay: float = 0.005, max_delay: float = 60.0) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._redo: set[str] = set()
        self._failures: dict[str, int] = {}
        self._wakeup = anyio.Event()
        self._base = base_delay
        self._max = max_delay
        self._closed = False
        self.adds = 0
        self.coalesced = 0

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being processed."""
        return not self._queue and not self._processing

    def add(self, key: str) -> None:
        if self._closed:
            return
        self.adds += 1
        if key in self._processing:
            self._redo.add(key)
            self.coalesced += 1
            return
        if key in self._queued:
            self.coalesced += 1
            return
        self._queued.add(key)
        self._queue.append(key)
        self._wakeup.set()

    async def get(self) -> str | None:
        """The next key (marked as processing), or None once the queue is shut down and empty."""
        while not self._queue:
            if self._closed:
                return None
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: str) -> None:
        self._processing.discard(key)
        if key in self._redo:
            self._redo.discard(key)
            self.add(key)

    def backoff(self, key: str) -> float:
        n = self._failures.get(key, 0)
        return float(min(self._max, self._base * math.pow(2, n)))

    async def add_rate_limited(self, key: str) -> None:
        """Requeue `key` after its backoff (which doubles on every failure)."""
        delay = self.backoff(key)
        self._failures[key] = self._failures.get(key, 0) + 1
        await anyio.sleep(delay)
        self.add(key)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def shutdown(self) -> None:
        self._closed = True
        self._wakeup.set()
