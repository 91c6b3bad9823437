"""When Python's cycle collector walks the whole heap: the controller decides, not the
allocation count.

A controller at 5,000 nodes holds some 400,000 objects the collector tracks (the node models
and their GPUs, a Prometheus child per node and NUMA zone, ...), none of them in a cycle. By
default CPython runs a full collection each time the objects that reached the oldest
generation grew by a quarter since the last one: ten times while the initial lists fill the
state, then about once a minute under churn, each holding the GIL for 200-700 ms (the event
loop and the scheduler extender's threads wait) and each finding next to nothing (96 objects in
all, in a bench run's first 14 collections; docs/scale.md).

So `pyctl run` turns the automatic full collections off (the young generations are collected as
usual: they are small, and that is where cycles die) and runs a full collection itself every
`FULL_INTERVAL` seconds, besides the one each HTTP server runs after a burst of requests
(`pyctl.serve.http`). Every collection is timed (`pyctl_gc_pause_seconds`)."""

from __future__ import annotations

import gc

import anyio

#: seconds between two full collections run by the controller
FULL_INTERVAL = 600.0
#: the oldest generation's threshold that no process reaches: gen-1 collections between two
#: automatic full collections
_NEVER = 2**31 - 1


def take_over_full_collections() -> tuple[int, int, int]:
    """Turn the automatic full collections off; returns the thresholds before."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], _NEVER)
    return before


async def full_collections(interval: float = FULL_INTERVAL) -> None:
    """A full collection every `interval` seconds (run it in the controller's task group)."""
    while True:
        await anyio.sleep(interval)
        gc.collect()
