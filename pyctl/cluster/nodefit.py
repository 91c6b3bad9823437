"""NodeFit: whether a pod may run on a node, by the scheduler's filters besides resources (the
core checks resources and NUMA alignment). At least as strict as the descheduler's NodeFit:

- the node is schedulable (not cordoned) and ready;
- `nodeSelector` and required node affinity (any one term; `matchFields` on `metadata.name`);
- taints: every NoSchedule and NoExecute taint is tolerated;
- required pod anti-affinity, both ways (the pod's terms against pods in the node's topology
  domain, and their terms against the pod) and required pod affinity (some matching pod in the
  domain, or the pod matches its own term and none exists anywhere, as kube-scheduler allows);
- topology spread constraints with `whenUnsatisfiable: DoNotSchedule` (the skew after placing
  it, counting only nodes the pod's node selector and affinity admit, as the default
  `nodeAffinityPolicy: Honor` does).

`Fit` answers for a pod that would leave `source` (a move): it is counted out of its domain
there. Pods whose fit depends on other pods (inter-pod terms, spread) are `grouped`: the
planner moves at most one of them per plan, so each check stays valid.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from pyctl.cluster.records import (
    Constraints,
    NodeRecord,
    NodeTerm,
    PodRecord,
    PodTerm,
    Requirement,
    Selector,
    Taint,
    Toleration,
)
from pyctl.cluster.selectors import matches, requirement_matches

HOSTNAME = "kubernetes.io/hostname"


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.operator == "Exists":
            if not t.key or t.key == taint.key:
                return True
        elif t.key == taint.key and t.value == taint.value:
            return True
    return False


def node_labels(node: NodeRecord) -> dict[str, str]:
    """The node's labels as NodeFit matches them (its hostname label defaulted)."""
    labels = dict(node.labels)
    labels.setdefault(HOSTNAME, node.name)
    return labels


def _field_matches(r: Requirement, node: NodeRecord) -> bool:
    if r.key != "metadata.name":
        return False
    return requirement_matches(r, {"metadata.name": node.name})


def _term_matches(term: NodeTerm, node: NodeRecord, labels: Mapping[str, str]) -> bool:
    if not term.match_expressions and not term.match_fields:
        return False  # an empty term matches nothing
    return all(requirement_matches(r, labels) for r in term.match_expressions) and all(
        _field_matches(r, node) for r in term.match_fields
    )


def node_affinity_ok(c: Constraints | None, node: NodeRecord) -> bool:
    """nodeSelector and required node affinity."""
    if c is None:
        return True
    labels = node_labels(node)
    if any(labels.get(k) != v for k, v in c.node_selector):
        return False
    return not c.node_affinity or any(_term_matches(t, node, labels) for t in c.node_affinity)


def taints_ok(c: Constraints | None, node: NodeRecord) -> bool:
    tolerations = c.tolerations if c is not None else ()
    return all(
        tolerates(tolerations, t) for t in node.taints if t.effect in ("NoSchedule", "NoExecute")
    )


def static_fit(pod: PodRecord, node: NodeRecord) -> str | None:
    """What keeps `pod` off `node` regardless of other pods (None: nothing)."""
    if node.unschedulable:
        return "node is cordoned"
    if not node.ready:
        return "node is not ready"
    c = pod.constraints
    if not node_affinity_ok(c, node):
        return "node selector or required node affinity"
    if not taints_ok(c, node):
        return "an untolerated taint"
    return None


def _in_namespaces(term: PodTerm, owner: PodRecord, other: PodRecord) -> bool:
    if term.all_namespaces:
        return True
    return other.namespace in (term.namespaces or (owner.namespace,))


def _matching(term: PodTerm, owner: PodRecord, other: PodRecord) -> bool:
    return (
        other.key != owner.key
        and _in_namespaces(term, owner, other)
        and matches(term.selector, dict(other.labels))
    )


def grouped(pod: PodRecord) -> bool:
    """Whether the pod's fit depends on where other pods are."""
    c = pod.constraints
    return c is not None and bool(c.affinity or c.anti_affinity or c.spread)


class Fit:
    """NodeFit over one view of the cluster (node records, and where running pods are)."""

    def __init__(
        self,
        nodes: Mapping[str, NodeRecord],
        pods: Iterable[PodRecord],
        labels: Mapping[str, Mapping[str, str]] | None = None,
        running: bool = False,
    ) -> None:
        self.nodes = nodes
        #: node -> its labels (`labels`: those of `nodes`, already read); `running`: every pod
        #: of `pods` runs (no need to look)
        self.labels = (
            labels if labels is not None else {n: node_labels(r) for n, r in nodes.items()}
        )
        self.running = (
            list(pods)
            if running
            else [p for p in pods if p.node and not p.terminated and not p.deleting]
        )
        #: pods that carry anti-affinity terms (checked against every incoming pod)
        self.repelling = [
            p for p in self.running if p.constraints is not None and p.constraints.anti_affinity
        ]

    def with_pods(self, pods: Iterable[PodRecord]) -> Fit:
        """The same nodes with other pods running (`pods`: all running; the nodes' labels are
        not read again)."""
        return Fit(self.nodes, pods, self.labels, running=True)

    def _domain(self, node: str, key: str) -> str | None:
        return self.labels.get(node, {}).get(key)

    def _same_domain(self, a: str, b: str, key: str) -> bool:
        da = self._domain(a, key)
        return da is not None and da == self._domain(b, key)

    def why_not(self, pod: PodRecord, node: str, source: str = "") -> str | None:
        """Why `pod` may not go to `node` (None: it may); `source`: the node it leaves."""
        rec = self.nodes.get(node)
        if rec is None:
            return "unknown node"
        why = static_fit(pod, rec)
        if why is not None:
            return why
        if not grouped(pod) and not self.repelling:
            return None
        others = [p for p in self.running if p.key != pod.key]
        c = pod.constraints
        if c is not None:
            for t in c.anti_affinity:
                for o in others:
                    if self._same_domain(o.node, node, t.topology_key) and _matching(t, pod, o):
                        return f"pod anti-affinity with {o.key}"
            for t in c.affinity:
                if not self._affinity_ok(t, pod, node, others):
                    return f"pod affinity ({t.topology_key})"
            for s in c.spread:
                if not self._spread_ok(s.max_skew, s.topology_key, s.selector, pod, node, others):
                    return f"topology spread on {s.topology_key} (maxSkew {s.max_skew})"
        for o in self.repelling:
            if o.key == pod.key:
                continue
            assert o.constraints is not None
            for t in o.constraints.anti_affinity:
                if self._same_domain(o.node, node, t.topology_key) and _matching(t, o, pod):
                    return f"{o.key}'s pod anti-affinity"
        return None

    def _affinity_ok(self, t: PodTerm, pod: PodRecord, node: str, others: list[PodRecord]) -> bool:
        hits = [o for o in others if _matching(t, pod, o)]
        if any(self._same_domain(o.node, node, t.topology_key) for o in hits):
            return True
        # no matching pod anywhere, and the pod matches its own term: allowed (the first of
        # a group that wants to be together)
        return not hits and matches(t.selector, dict(pod.labels))

    def _spread_ok(
        self,
        max_skew: int,
        key: str,
        selector: Selector | None,
        pod: PodRecord,
        node: str,
        others: list[PodRecord],
    ) -> bool:
        target = self._domain(node, key)
        if target is None:
            return False  # a node without the topology key is not a candidate
        counts: Counter[str] = Counter()
        for n, rec in self.nodes.items():
            d = self._domain(n, key)
            if d is not None and node_affinity_ok(pod.constraints, rec):
                counts[d] += 0
        for o in others:
            if o.namespace != pod.namespace or not matches(selector, dict(o.labels)):
                continue
            d = self._domain(o.node, key)
            if d is not None and d in counts:
                counts[d] += 1
        counts[target] += 1
        return counts[target] - min(counts.values()) <= max_skew

    def allowed(self, pod: PodRecord, source: str = "") -> frozenset[str]:
        """Every node `pod` may go to (never `source`)."""
        return frozenset(
            n for n in self.nodes if n != source and self.why_not(pod, n, source) is None
        )
