"""An Event on the agent's own Node when pyctl's MIG catalog disagrees with the device
(docs/agent.md): what `kubectl describe node` shows an operator, beside the metric
`pyctl_agent_catalog_disagreements` and the annotation's count.

One Event per distinct set of disagreements, never one per read: the agent reads every minute, and
a catalog that disagrees today disagrees at every read until the catalog or the driver changes.
A core/v1 Event about a cluster-scoped object lives in the namespace `default` (the API server
requires it, as the kubelet's node Events do); the chart lets the agent create Events there only
about its own Node (a ValidatingAdmissionPolicy on the token's node claim, as for the
annotation).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pyctl.agent.view import NodeView
from pyctl.cluster.kube.client import KubeClient, path_part

log = logging.getLogger("pyctl.agent")

NAMESPACE = "default"
REASON = "MigCatalogDisagrees"
COMPONENT = "pyctl-agent"
#: an Event's message is at most this long (the API server allows 1 KiB in events.k8s.io)
MAX_MESSAGE = 1024
#: at most this many disagreements named in the message (the rest are counted)
MAX_NAMED = 8


def disagreement_lines(view: NodeView) -> list[str]:
    """Each disagreement of every GPU of `view`, one line each, in a stable order."""
    out = []
    for g in view.gpus:
        for d in g.disagreements:
            out.append(
                f"GPU {g.index} ({g.model}) profile {d.profile_id} {d.profile}: {d.what} "
                f"device {d.device!r}, catalog {d.catalog!r}"
            )
    return sorted(out)


def message(lines: list[str]) -> str:
    """The Event's message for `lines` (bounded)."""
    head = (
        f"pyctl's MIG catalog disagrees with the device in {len(lines)} place(s); pyctl uses "
        f"the device's answer: "
    )
    body = "; ".join(lines[:MAX_NAMED])
    if len(lines) > MAX_NAMED:
        body += f"; and {len(lines) - MAX_NAMED} more"
    text = head + body
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


class DisagreementEvents:
    """Posts a Warning Event on Node `node` when the set of disagreements differs from the last
    one posted (a set that clears is remembered, not announced). A failed post is logged and
    tried again at the next read."""

    def __init__(self, kube: KubeClient, node: str, clock: Callable[[], float] = time.time):
        if not node:
            raise ValueError("the agent's node name is not known (set NODE_NAME or --node)")
        self.kube = kube
        self.node = node
        self.clock = clock
        self.last: list[str] = []
        self.posted = 0

    async def __call__(self, view: NodeView) -> None:
        lines = disagreement_lines(view)
        if lines == self.last:
            return
        if not lines:
            self.last = lines
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node[:200]}.pyctl-agent-", "namespace": NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node},
            "reason": REASON,
            "message": message(lines),
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": f"pyctl.io/{COMPONENT}",
            "reportingInstance": self.node[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        resp = await self.kube.request(
            "POST", f"/api/v1/namespaces/{path_part(NAMESPACE)}/events", body=event
        )
        resp.check()
        self.last = lines
        self.posted += 1
        log.warning(
            "MIG catalog disagrees with the device; Event posted on the node",
            extra={"node": self.node, "disagreements": len(lines)},
        )
