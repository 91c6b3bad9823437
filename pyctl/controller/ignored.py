"""Objects left out of the controller's view, and how they are reported: a bad item is isolated,
counted and reported; it never stops the loop and never changes what happens to the good items.

An object is left out when it does not decode (`cluster/kube/decode.py`: malformed, too_large,
bad_quantity, out_of_bounds), when the core cannot model a pod's shape (shape_rejected), or when
a node cannot be translated (untranslatable). Each is

- counted once per object (name and uid) and reason:
  `pyctl_ignored_objects_total{cluster, kind, reason}`;
- logged once per object and reason (a warning naming it and why);
- for a pod, told to its owner in a Kubernetes Event on the pod (`PyctlIgnored`, type Warning:
  "pyctl ignores this pod: ..."), once per pod uid, at most `events_per_second` (and `burst`),
  by the leader in enforce mode (observe mode writes nothing to the cluster, Events included).

What is remembered is bounded (`remember` objects, oldest forgotten first), so a flood of bad
objects costs bounded memory; a forgotten object reported again is counted again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pyctl.cluster.records import Kind, ObjectRef
from pyctl.metrics import Metrics

log = logging.getLogger("pyctl.controller")

#: the Event's reason on an ignored pod
EVENT_REASON = "PyctlIgnored"

EventSender = Callable[[ObjectRef, str, str], Awaitable[None]]


@dataclass(frozen=True)
class Ignored:
    ref: ObjectRef | None
    kind: Kind
    reason: str
    message: str


def _ident(ref: ObjectRef) -> str:
    """An object's identity: its key, and its uid when known (an object deleted and created
    again under the same name is another object)."""
    return f"{ref.key}#{ref.uid}" if ref.uid else ref.key


class IgnoredObjects:
    def __init__(
        self,
        metrics: Metrics,
        cluster: str,
        *,
        remember: int = 10_000,
        events_per_second: float = 1.0,
        burst: int = 10,
        logged: bool = True,
    ) -> None:
        self.metrics = metrics
        #: whether each new object is logged (a command that prints them itself says no)
        self.logged = logged
        self.cluster = cluster
        self.remember = remember
        #: (kind, key or message) -> reason -> what was reported; least recently reported first
        self._seen: OrderedDict[tuple[str, str], dict[str, Ignored]] = OrderedDict()
        #: uids of the pods that were sent (or queued) an Event
        self._told: OrderedDict[str, None] = OrderedDict()
        self._events: deque[Ignored] = deque(maxlen=1000)
        self.rate = events_per_second
        self.burst = float(burst)
        self._tokens = float(burst)
        self._refilled: float | None = None

    def report(self, kind: Kind, reason: str, message: str, ref: ObjectRef | None = None) -> bool:
        """An object left out; True when it is new (then counted, logged, and for a pod with a
        uid an Event is queued)."""
        ident = _ident(ref) if ref is not None else message[:120]
        reasons = self._seen.get((kind, ident))
        if reasons is None:
            reasons = self._seen[(kind, ident)] = {}
            while len(self._seen) > self.remember:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end((kind, ident))
            if reason in reasons:
                return False
        item = reasons[reason] = Ignored(ref, kind, reason, message[:1000])
        self.metrics.ignored_objects.labels(self.cluster, kind, reason).inc()
        if self.logged:
            log.warning(
                "object ignored",
                extra={"kind": kind, "object": ident, "reason": reason, "error": message[:500]},
            )
        if kind == "Pod" and ref is not None and ref.uid and ref.uid not in self._told:
            self._told[ref.uid] = None
            while len(self._told) > self.remember:
                self._told.popitem(last=False)
            self._events.append(item)
        return True

    def forget(self, kind: Kind, key: str, uid: str = "") -> None:
        """The object is good again: a later problem is reported anew. (A deleted object is not
        forgotten, since a watch event that does not decode deletes the object from the view;
        it ages out, and a new object of the same name has another uid.)"""
        self._seen.pop((kind, _ident(ObjectRef(kind, "", key, uid))), None)

    def is_ignored(self, kind: Kind, key: str, uid: str = "") -> bool:
        return (kind, _ident(ObjectRef(kind, "", key, uid))) in self._seen

    def current(self) -> list[Ignored]:
        """What is remembered as ignored, least recently reported first."""
        return [i for reasons in self._seen.values() for i in reasons.values()]

    @property
    def queued_events(self) -> int:
        return len(self._events)

    async def send_events(self, send: EventSender, now: float) -> int:
        """Send the queued Events the rate allows (`send(ref, reason, message)`; a failure is
        logged and dropped: an Event is worth trying, never worth retrying forever)."""
        if self._refilled is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._refilled) * self.rate)
        self._refilled = now
        sent = 0
        while self._events and self._tokens >= 1.0:
            item = self._events.popleft()
            self._tokens -= 1.0
            assert item.ref is not None
            try:
                await send(item.ref, EVENT_REASON, f"pyctl ignores this pod: {item.message}")
            except Exception:
                log.warning(
                    "could not record an Event", extra={"object": item.ref.key}, exc_info=True
                )
                continue
            sent += 1
        return sent
