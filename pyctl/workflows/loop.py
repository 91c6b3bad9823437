"""What the workflow loops (compaction, MIG) share: ticking at an interval, running a planning
round with the cycle collector paused, and exporting how many workflows sit at each step."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Final

import anyio

from pyctl.metrics import Metrics
from pyctl.state.store import StoreError

log = logging.getLogger("pyctl.workflows")

#: seconds between two planning rounds of a workflow loop (compaction, MIG, DRA steering); the
#: default of the `workflow_interval` setting
WORKFLOW_INTERVAL: Final = 30.0


async def guarded(what: str, call: Callable[[], Awaitable[None]]) -> None:
    """One round of a loop: whatever it raises is logged and the next round tries again; it
    never ends the loop nor the process. A store that fails is said in one line (its health,
    `pyctl.state.health`, which the workflow store and the rate limits report to, makes
    `/readyz` say why)."""
    try:
        await call()
    except StoreError as e:
        log.warning("%s tick failed; will retry: %s", what, " ".join(str(e).split())[:300])
    except Exception:
        log.exception("%s tick failed; will retry", what)


#: when each loop's first round runs after every node is scored, as a share of its interval:
#: the compactor's at once (a restarted controller plans, and resumes its workflows, without
#: waiting an interval), the others' spread over the interval, so that the loops' rounds, each
#: in a worker thread sharing the GIL, do not start together (docs/scale.md)
COMPACTION_PHASE: Final = 0.0
DRA_STEERING_PHASE: Final = 0.25
MIG_PHASE: Final = 0.5


async def run_every(
    interval: float,
    tick: Callable[[bool], Awaitable[None]],
    leader: Callable[[], bool],
    what: str,
    phase: float = 1.0,
) -> None:
    """Call `tick(is_leader)` every `interval` seconds, the first time `phase` intervals after
    the loop starts; a failing tick is logged and retried."""
    await anyio.sleep(interval * phase)
    while True:
        await guarded(what, lambda: tick(leader()))
        await anyio.sleep(interval)


_pause_lock = threading.Lock()
_pauses = 0
_was_enabled = True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector paused while a planning round runs (rounds of both loops may
    overlap: the collector runs again when the last one ends, if it ran before the first).

    A round over the whole cluster allocates a few hundred thousand short-lived containers (the
    planner's per-pod inputs), none of them in a cycle, all freed by reference counting when it
    ends. With the collector running, the young collections during the round promote them, and
    their number then sets off a full collection that walks everything the controller holds,
    with the GIL held: 100-200 ms at 5,000 nodes, once per round, during which the event loop
    and the scheduler extender's threads wait (docs/scale.md). Paused, they never reach an
    older generation."""
    global _pauses, _was_enabled
    with _pause_lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()


class WorkflowGauge:
    """`pyctl_workflows{kind, step}`: a step that empties goes back to 0 rather than keeping its
    last count; `preset` (kind, step) pairs are exported as 0 from the start."""

    def __init__(
        self, metrics: Metrics, cluster: str, preset: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.gauge = metrics.workflow.workflows
        self.cluster = cluster
        self._seen: set[tuple[str, str]] = set(preset)
        for kind, step in self._seen:
            self.gauge.labels(cluster, kind, step).set(0)

    def export(self, counts: Counter[tuple[str, str]]) -> None:
        for kind, step in self._seen - counts.keys():
            self.gauge.labels(self.cluster, kind, step).set(0)
        for (kind, step), n in counts.items():
            self.gauge.labels(self.cluster, kind, step).set(n)
        self._seen |= counts.keys()
