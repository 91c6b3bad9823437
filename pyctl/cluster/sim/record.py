"""What a run on the simulated cluster did to the workload, measured on the cluster's own state
(not on what the controller believes) and weighted by virtual time, so that the figures are the
same whatever the playback speed.

Between two changes the cluster stands still; each change closes the interval since the last
one, and the state measured after the previous change counts for all of it:

- replica-hours pending: pods not bound (their demand waits), and of those the hours blocked by
  fragmentation, by category (`pyctl.core.fragmentation.blocked_by`: the idle capacity could
  hold the pod but no node admits it; the category strands the most capacity for its shape);
- GPU-hours idle and stranded: idle GPU (whole and shared GPUs) and the part of it FGD's measure
  says the workload M cannot use (`fragment_gpu_milli`); MIG separately, in compute-slice-hours.
  M is the scenario's GPU and MIG replicas by their share of arrivals (CPU-only replicas are left
  out: FGD counts every idle GPU as fragment for them, as the controller's derived M does too);
- the fragmentation rate (stranded / idle) over time, and its time-weighted mean;
- the scheduling success rate per window of `window` virtual seconds: replicas bound when they
  arrived / replicas that arrived (the mean over the run, and the worst window);
- replicas served: replicas bound at some point of their life (an evicted replica's replacement
  is the same replica).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from pyctl.cluster.sim.cluster import SimCluster
from pyctl.core.fragmentation import CATEGORIES, blocked_by
from pyctl.model import Workload

HOUR = 3600.0


@dataclass(frozen=True)
class Point:
    """The cluster at virtual time `t` (seconds from the start of the run)."""

    t: float
    pending: int
    blocked: int
    idle_gpus: float
    stranded_gpus: float

    @property
    def fragmentation_rate(self) -> float:
        return self.stranded_gpus / self.idle_gpus if self.idle_gpus > 0 else 0.0


@dataclass(frozen=True)
class RunStats:
    """A run's figures (see the module's docstring)."""

    duration_hours: float
    arrived: int
    served: int
    evictions: int
    pending_hours: float
    blocked_hours: dict[str, float]
    idle_gpu_hours: float
    stranded_gpu_hours: float
    stranded_mig_slice_hours: float
    mean_fragmentation_rate: float
    success_mean: float
    success_worst: float
    #: the worst window's start (hours)
    success_worst_at: float
    points: tuple[Point, ...] = ()

    @property
    def blocked_total_hours(self) -> float:
        return sum(self.blocked_hours.values())


@dataclass
class _State:
    pending: int = 0
    blocked: Counter[str] = field(default_factory=Counter)
    idle_gpu_milli: float = 0.0
    stranded_gpu_milli: float = 0.0
    stranded_mig_slices: float = 0.0


class Recorder:
    def __init__(self, cluster: SimCluster, window: float = 1800.0) -> None:
        self.cluster = cluster
        self.window = window
        gpu = [s for s in cluster.workload.shapes if not s.is_cpu_only]
        total = sum(s.weight for s in gpu) or 1.0
        self.workload = Workload(tuple(replace(s, weight=s.weight / total) for s in gpu))
        self._t = 0.0
        self._state = _State()
        self._started = False
        self._served: set[str] = set()
        self._arrived = 0
        self._evictions = 0
        #: window index -> (arrived, bound on arrival)
        self._windows: dict[int, list[int]] = {}
        self._pending_s = 0.0
        self._blocked_s: dict[str, float] = {}
        self._idle_s = 0.0
        self._stranded_s = 0.0
        self._mig_s = 0.0
        self._rate_s = 0.0
        self._end: float | None = None
        self.points: list[Point] = []

    # -- what the source tells ---------------------------------------------------------------
    def arrival(self, t: float, bound: bool) -> None:
        """A replica arrived at `t` and was bound at once (or not)."""
        self._arrived += 1
        w = self._windows.setdefault(int(t // self.window), [0, 0])
        w[0] += 1
        w[1] += int(bound)

    def evicted(self, t: float) -> None:
        self._evictions += 1

    def observe(self, t: float) -> None:
        """The cluster changed at `t`: close the interval since the last change, measure now."""
        if self._started and t < self._t:
            return  # a clock that went back is ignored (never happens in one run)
        self._close(t)
        self._state = self._measure()
        self._started = True
        s = self._state
        self.points.append(
            Point(
                t,
                s.pending,
                sum(s.blocked.values()),
                s.idle_gpu_milli / 1000,
                s.stranded_gpu_milli / 1000,
            )
        )

    def finish(self, t: float) -> None:
        self._close(t)
        self._end = t

    # -- the figures -------------------------------------------------------------------------
    def stats(self) -> RunStats:
        end = self._end if self._end is not None else self._t
        rates = [b / a for a, b in self._windows.values() if a]
        worst_at = 0.0
        worst = 1.0
        for k in sorted(self._windows):
            a, b = self._windows[k]
            if a and b / a < worst:
                worst, worst_at = b / a, k * self.window / HOUR
        bound = sum(b for _, b in self._windows.values())
        return RunStats(
            duration_hours=end / HOUR,
            arrived=self._arrived,
            served=len(self._served),
            evictions=self._evictions,
            pending_hours=self._pending_s / HOUR,
            blocked_hours={
                c: self._blocked_s[c] / HOUR for c in CATEGORIES if self._blocked_s.get(c)
            },
            idle_gpu_hours=self._idle_s / HOUR,
            stranded_gpu_hours=self._stranded_s / HOUR,
            stranded_mig_slice_hours=self._mig_s / HOUR,
            mean_fragmentation_rate=self._rate_s / end if end > 0 else 0.0,
            success_mean=bound / self._arrived if self._arrived else 1.0,
            success_worst=min(rates) if rates else 1.0,
            success_worst_at=worst_at,
            points=tuple(self.points),
        )

    # -- internals ---------------------------------------------------------------------------
    def _close(self, t: float) -> None:
        dt = t - self._t
        if self._started and dt > 0:
            s = self._state
            self._pending_s += s.pending * dt
            for c, n in s.blocked.items():
                self._blocked_s[c] = self._blocked_s.get(c, 0.0) + n * dt
            self._idle_s += s.idle_gpu_milli / 1000 * dt
            self._stranded_s += s.stranded_gpu_milli / 1000 * dt
            self._mig_s += s.stranded_mig_slices * dt
            if s.idle_gpu_milli > 0:
                self._rate_s += s.stranded_gpu_milli / s.idle_gpu_milli * dt
        self._t = max(self._t, t)

    def _measure(self) -> _State:
        c = self.cluster
        pending = []
        for p in c.pods.values():
            if p.node:
                self._served.add(p.root)
            else:
                pending.append(p.shape)
        score = c.model.score(self.workload)
        return _State(
            pending=len(pending),
            blocked=Counter(blocked_by(c.model, pending)),
            idle_gpu_milli=score.idle_gpu_milli,
            stranded_gpu_milli=score.fragment_gpu_milli,
            stranded_mig_slices=score.fragment_mig_slices,
        )
