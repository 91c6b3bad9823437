"""What the workflow loops (compaction, MIG) share: ticking at an interval, and exporting how
many workflows sit at each step."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable

import anyio

from pyctl.metrics import Metrics

log = logging.getLogger("pyctl.workflows")


async def run_every(
    interval: float, tick: Callable[[bool], Awaitable[None]], leader: Callable[[], bool], what: str
) -> None:
    """Call `tick(is_leader)` every `interval` seconds; a failing tick is logged and retried."""
    while True:
        await anyio.sleep(interval)
        try:
            await tick(leader())
        except Exception:
            log.exception("%s tick failed; will retry", what)


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
