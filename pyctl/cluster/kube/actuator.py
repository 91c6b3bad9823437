"""`KubeActuator`: the `Actuator` of a real cluster. Every mutation is idempotent (a merge patch
that sets what is already there is not written by the API server; taints are read, changed and
written back with the resourceVersion read). Callers pass the gate (dry-run, lease, rate limits)
first; this module does not decide anything.

- cordon / uncordon: `spec.unschedulable` (merge patch)
- eviction: policy/v1 Eviction (`try_evict`); allowed when the API server accepts it (or the pod
  is already gone), refused on 429 (a PodDisruptionBudget, or a budget still being computed),
  with the budget named in `details.causes` and any retry-after, or denied by admission (403 from
  a webhook, 422 from a ValidatingAdmissionPolicy); other errors raise
- node labels (None deletes one), taints (for MIG reconfiguration), core/v1 Events
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from pyctl.cluster.kube.client import KubeApiError, KubeClient, Response, path_part
from pyctl.cluster.source import EvictionOutcome, LeaseLost
from pyctl.jsontypes import JsonObject

log = logging.getLogger(__name__)

MERGE_PATCH: Final = "application/merge-patch+json"
_BUDGET: Final = re.compile(r"disruption budget (\S+?)[ .:]")
_CONFLICT_RETRIES: Final = 5


def _time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeActuator:
    def __init__(
        self,
        kube: KubeClient,
        *,
        component: str = "pyctl",
        instance: str = "",
        grace_period_seconds: int | None = None,
        still_leader: Callable[[], bool] | None = None,
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        #: the Lease, checked right before every mutation is sent (None: not checked here). The
        #: gate checks it before it acts, but a replica paused past its Lease between that check
        #: and the request (a GET first, a slow rate-limit call) would otherwise write on a stale
        #: view: the soak found one doing so (docs/soak.md)
        self.still_leader = still_leader
        #: passed in the Eviction's deleteOptions (None: the pod's own)
        self.grace_period_seconds = grace_period_seconds

    async def _request(self, method: str, path: str, **kw: Any) -> Response:
        """`kube.request`, a mutation sent only while this replica holds the Lease (Events, which
        change nothing, go out regardless)."""
        if (
            method != "GET"
            and self.still_leader is not None
            and not path.endswith("/events")
            and not self.still_leader()
        ):
            raise LeaseLost(f"{method} {path[:200]}: this replica no longer holds the Lease")
        return await self.kube.request(method, path, **kw)

    # -- nodes -------------------------------------------------------------------------------------

    @staticmethod
    def _node_path(node: str) -> str:
        return f"/api/v1/nodes/{path_part(node)}"

    async def _patch_node(self, node: str, patch: Mapping[str, Any]) -> Response:
        resp = await self._request(
            "PATCH", self._node_path(node), body=patch, content_type=MERGE_PATCH
        )
        return resp.check()

    async def cordon(self, node: str, on: bool) -> None:
        """Mark the node (un)schedulable. Setting what is already set writes nothing."""
        # None removes the field: an uncordoned node looks like one never cordoned.
        await self._patch_node(node, {"spec": {"unschedulable": True if on else None}})

    async def label_node(self, node: str, labels: Mapping[str, str | None]) -> None:
        """Set labels; a None value deletes the label (absent labels: nothing to do)."""
        if labels:
            await self._patch_node(node, {"metadata": {"labels": dict(labels)}})

    async def taint(
        self, node: str, key: str, effect: str = "NoSchedule", *, value: str = "", on: bool = True
    ) -> bool:
        """Add (`on`) or remove the taint `key[=value]:effect`; True if the node changed.

        Read-modify-write with the resourceVersion read, retried on conflict (a merge patch
        replaces the whole `taints` list, so a concurrent writer must not be overwritten)."""
        if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise ValueError(f"taint: unknown effect {effect!r}")
        for _ in range(_CONFLICT_RETRIES):
            got = (await self._request("GET", self._node_path(node))).check().json()
            taints: list[JsonObject] = list((got.get("spec") or {}).get("taints") or [])
            same = [t for t in taints if t.get("key") == key and t.get("effect") == effect]
            others = [t for t in taints if t not in same]
            if on:
                if len(same) == 1 and (same[0].get("value") or "") == value:
                    return False
                new: list[JsonObject] = [
                    *others,
                    {"key": key, "effect": effect, **({"value": value} if value else {})},
                ]
            else:
                if not same:
                    return False
                new = others
            patch = {
                "metadata": {"resourceVersion": got["metadata"]["resourceVersion"]},
                "spec": {"taints": new or None},
            }
            resp = await self._request(
                "PATCH", self._node_path(node), body=patch, content_type=MERGE_PATCH
            )
            if resp.status != 409:
                resp.check()
                return True
        raise KubeApiError(409, "Conflict", f"taint {key} on node {node}: too many conflicts", {})

    # -- ConfigMaps (the mig-parted config of MIG reconfigurations) -------------------------------

    @staticmethod
    def _configmap_path(namespace: str, name: str = "") -> str:
        base = f"/api/v1/namespaces/{path_part(namespace)}/configmaps"
        return f"{base}/{path_part(name)}" if name else base

    async def read_configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's `data`; None when it does not exist."""
        resp = await self._request("GET", self._configmap_path(namespace, name))
        if resp.status == 404:
            return None
        data = resp.check().json().get("data") or {}
        return {str(k): str(v) for k, v in data.items()}

    async def apply_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Create the ConfigMap with `data`, or merge-patch these keys into its `data`."""
        patch = {"data": dict(data)}
        resp = await self._request(
            "PATCH", self._configmap_path(namespace, name), body=patch, content_type=MERGE_PATCH
        )
        if resp.status != 404:
            resp.check()
            return
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        resp = await self._request("POST", self._configmap_path(namespace), body=body)
        if resp.status == 409:  # created meanwhile: patch it
            resp = await self._request(
                "PATCH",
                self._configmap_path(namespace, name),
                body=patch,
                content_type=MERGE_PATCH,
            )
        resp.check()

    # -- DRA device taints -------------------------------------------------------------------------

    _DTR = "/apis/resource.k8s.io/v1/devicetaintrules"

    async def device_taint_rules(self) -> dict[str, dict[str, object]] | None:
        """pyctl's DeviceTaintRules by name; None where the API server does not serve them
        (discovery of resource.k8s.io/v1)."""
        disc = await self._request("GET", "/apis/resource.k8s.io/v1")
        if disc.status == 404:
            return None
        served = disc.check().json().get("resources") or []
        if not any(r.get("name") == "devicetaintrules" for r in served):
            return None
        resp = await self._request(
            "GET", self._DTR, query=[("labelSelector", "app.kubernetes.io/managed-by=pyctl")]
        )
        items = resp.check().json().get("items") or []
        return {i["metadata"]["name"]: i for i in items}

    async def put_device_taint_rule(self, manifest: Mapping[str, object], on: bool) -> None:
        meta = manifest.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise ValueError("DeviceTaintRule without metadata.name")
        if on:
            resp = await self._request("POST", self._DTR, body=dict(manifest))
            if resp.status != 409:  # 409: it exists already
                resp.check()
            return
        resp = await self._request("DELETE", f"{self._DTR}/{path_part(name)}")
        if resp.status != 404:
            resp.check()

    # -- eviction ----------------------------------------------------------------------------------

    async def try_evict(self, namespace: str, pod: str, uid: str = "") -> EvictionOutcome:
        body: JsonObject = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        options: JsonObject = {}
        if self.grace_period_seconds is not None:
            options["gracePeriodSeconds"] = self.grace_period_seconds
        if uid:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        path = f"/api/v1/namespaces/{path_part(namespace)}/pods/{path_part(pod)}/eviction"
        resp = await self._request("POST", path, body=body)
        if resp.ok:
            return EvictionOutcome(True, resp.status)
        err = resp.error()
        if resp.status == 404 and (err.details.get("kind") in ("pods", None)):
            # Already gone (a retried eviction after a crash): what eviction wanted is done.
            return EvictionOutcome(True, 404, err.reason, err.message)
        if resp.status == 409 and uid:
            # The uid precondition failed: the pod of that name is another incarnation, the one
            # meant is gone. Never evict the new one.
            return EvictionOutcome(True, 409, err.reason, err.message)
        if resp.status in (403, 422):
            # An admission webhook (403 by default) or a ValidatingAdmissionPolicy (422 Invalid
            # unless its validation names another reason) denied it: not a reason to retry.
            return EvictionOutcome(False, resp.status, err.reason, err.message)
        if resp.status != 429:
            raise err
        causes = tuple(
            (str(c.get("reason", "")), str(c.get("message", "")))
            for c in err.details.get("causes") or []
            if isinstance(c, Mapping)
        )
        retry_after: float | None = None
        header = resp.headers.get("Retry-After")
        if header is not None and header.strip().isdigit():
            retry_after = float(header)
        elif isinstance(err.details.get("retryAfterSeconds"), int):
            retry_after = float(err.details["retryAfterSeconds"])
        budget = ""
        for text in [m for r, m in causes if r == "DisruptionBudget"] + [err.message]:
            if m := _BUDGET.search(text + " "):
                budget = m.group(1)
                break
        return EvictionOutcome(False, 429, err.reason, err.message, retry_after, budget, causes)

    # -- events ------------------------------------------------------------------------------------

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
        """A core/v1 Event about a Pod or Node (what `kubectl describe` shows). Events of
        cluster-scoped objects live in namespace `default`, as client-go's recorder puts them."""
        type_ = "Warning" if warning else "Normal"
        involved: JsonObject = {"apiVersion": "v1", "kind": kind, "name": name}
        if namespace:
            involved["namespace"] = namespace
        uid = uid or await self._uid(kind, namespace, name)
        if uid:
            involved["uid"] = uid  # kubectl describe matches events by uid too
        now = datetime.now(UTC)
        ev_ns = namespace or "default"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": ev_ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "count": 1,
            "firstTimestamp": _time(now),
            "lastTimestamp": _time(now),
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance or self.component,
        }
        path = f"/api/v1/namespaces/{path_part(ev_ns)}/events"
        (await self._request("POST", path, body=body)).check()

    async def _uid(self, kind: str, namespace: str, name: str) -> str:
        if kind == "Node":
            path = self._node_path(name)
        elif kind == "Pod" and namespace:
            path = f"/api/v1/namespaces/{path_part(namespace)}/pods/{path_part(name)}"
        else:
            return ""
        resp = await self._request("GET", path)
        if not resp.ok:
            return ""  # gone already: the event is still worth recording
        uid = (resp.json().get("metadata") or {}).get("uid", "")
        return str(uid)
