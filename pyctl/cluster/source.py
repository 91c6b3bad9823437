"""The ports between a cluster and the controller.

A `ClusterSource` (the Kubernetes adapter, or the simulated cluster) lists and watches objects and
hands them to an `EventSink` as records: the full content of a kind after a (re)list, then batches
of events. An `Actuator` is how the controller acts on the cluster (used by the workflows); the
observe mode plugs in `NullActuator`, which records what it would have done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pyctl.cluster.records import Event, Kind, ObjectRef, Record


class EventSink(Protocol):
    async def replace(self, kind: Kind, records: Sequence[Record], resource_version: str) -> None:
        """Everything of `kind` that exists now (after a list or a relist on 410 Gone)."""

    async def apply(self, events: Sequence[Event], resource_versions: Mapping[Kind, str]) -> None:
        """A batch of watch events, and the resourceVersions they bring each kind to."""

    def decode_error(
        self, kind: Kind, message: str, *, reason: str = "malformed", ref: ObjectRef | None = None
    ) -> None:
        """An object the source could not understand (counted, logged once; the rest goes on):
        `reason` in one word (`DecodeError.reason`), `ref` the object when it could be named."""


class ClusterSource(Protocol):
    name: str

    async def run(self, sink: EventSink) -> None:
        """List, then watch, until cancelled (or, for a finite scenario, until it ends)."""


class LeaseLost(Exception):
    """A mutation not sent: this replica no longer holds the Lease (the actuator's last check,
    right before the request, failed)."""


class ActuatorError(Exception):
    """The cluster answered a mutation with an error status (a 500, a 503...): the mutation did
    not happen. A failure with no answer (a timeout, a connection lost) raises anything else:
    whether it happened is not known."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class EvictionOutcome:
    """What the Eviction API answered."""

    #: accepted, or the pod is already gone
    allowed: bool
    status: int
    reason: str = ""
    message: str = ""
    #: seconds the API server asks to wait (Retry-After header or details.retryAfterSeconds)
    retry_after: float | None = None
    #: the PodDisruptionBudget that refused it, when the API server names it
    budget: str = ""
    #: (reason, message) of each of `details.causes`
    causes: tuple[tuple[str, str], ...] = ()


class Actuator(Protocol):
    """Mutations of the cluster. Each is idempotent; callers pass the gate (dry-run, lease, rate
    limits) first."""

    async def cordon(self, node: str, on: bool) -> None: ...

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        """Eviction API (with `uid` as a precondition when given): accepted (or the pod, or
        that incarnation of it, is already gone), or refused: 429 (a PodDisruptionBudget), with
        why and how long the API server asks to wait, or 403/422 (an admission denial: a
        webhook's 403, a ValidatingAdmissionPolicy's 422). Any other error status raises
        `ActuatorError`."""

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None: ...

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None:
        """A core/v1 Event about the object (type Warning when `warning`); `uid` when the caller
        knows it (an evicted pod may be gone before the Event is written)."""

    # -- MIG reconfiguration (pyctl/workflows/mig_reconfig.py) --

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        """Add (`on`) or remove the taint `key[=value]:effect`; True if the node changed."""

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's `data` (None: no such ConfigMap)."""

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Create the ConfigMap, or set these keys of its `data` (other keys are kept)."""

    # -- DRA device taints (pyctl/workflows/dra_taints.py) --

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        """pyctl's DeviceTaintRules by name (labelled managed-by pyctl); None if the API server
        does not serve DeviceTaintRules."""

    async def put_device_taint_rule(self, manifest: Mapping[str, object], on: bool) -> None:
        """Create (`on`) or delete the DeviceTaintRule (idempotent)."""


@dataclass
class NullActuator:
    """Observe mode: nothing is mutated; every call is recorded."""

    calls: list[tuple[str, tuple[object, ...]]] = field(default_factory=list)

    async def cordon(self, node: str, on: bool) -> None:
        self.calls.append(("cordon", (node, on)))

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        self.calls.append(("evict", (namespace, pod)))
        return EvictionOutcome(True, 201)

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        self.calls.append(("label_node", (node, dict(labels))))

    async def event(
        self,
        kind: str,
        namespace: str,
        name: str,
        reason: str,
        message: str,
        *,
        uid: str = "",
        warning: bool = False,
    ) -> None:
        self.calls.append(("event", (kind, namespace, name, reason, message)))

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        self.calls.append(("taint", (node, key, effect, value, on)))
        return True

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        self.calls.append(("read_configmap", (namespace, name)))
        return None

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.calls.append(("apply_configmap", (namespace, name, dict(data))))

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        self.calls.append(("device_taint_rules", ()))
        return None

    async def put_device_taint_rule(self, manifest: Mapping[str, object], on: bool) -> None:
        self.calls.append(("put_device_taint_rule", (dict(manifest), on)))
