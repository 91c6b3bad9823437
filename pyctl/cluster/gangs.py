"""Gangs: pods that must all run inside one topology domain (docs/fabric.md).

Read from what users write on their pods:

- Kueue: the pod annotation `kueue.x-k8s.io/podset-required-topology` (the level's label key);
  the gang is the pod group (label `kueue.x-k8s.io/pod-group-name`, its size the annotation
  `kueue.x-k8s.io/pod-group-total-count`) or else the pod's owner (a Job's pods);
  with only `kueue.x-k8s.io/podset-slice-required-topology` and `kueue.x-k8s.io/podset-slice-size`
  (PodSet slices: every slice of that many pods in one domain of the slice's level), each slice
  is a gang of the slice's size (with both, the required topology of the whole group is read:
  the larger demand). `kueue.x-k8s.io/podset-preferred-topology` is no gang (Kueue falls back to
  wider levels, then spreads);
- KAI: the annotation `kai.scheduler/topology-required-placement` (the level); the gang is the
  pod group (annotation `pod-group-name`) or else the owner;
- LeaderWorkerSet: the pod annotation `leaderworkerset.sigs.k8s.io/exclusive-topology` (the
  level, which LWS copies onto its pods and turns into pod (anti-)affinity); the gang is the group
  (label `leaderworkerset.sigs.k8s.io/group-key`), its size the annotation
  `leaderworkerset.sigs.k8s.io/size` (leader and workers: the whole group, also before all its
  pods exist);
- Volcano: a PodGroup (`scheduling.volcano.sh/v1beta1`) whose `spec.networkTopology.mode` is
  `hard` (the CRD's default); its pods are those whose annotation `scheduling.k8s.io/group-name`
  (or `scheduling.volcano.sh/group-name`) names it, in its namespace; the gang's size is its
  `minMember` (or the pods that exist, if more), its level the synthetic key of its
  `highestTierAllowed` (`fabric_sources.tier_key`; a `soft` PodGroup is no gang). Its
  `subGroupPolicy` divides its pods: a pod belongs to the first entry whose `labelSelector`
  matches it and whose `matchLabelKeys` it all carries (non-empty; an entry without keys takes
  no pod), with the pods of the same values; where that entry's topology is hard, those pods are
  a gang of their own (size `subGroupSize`, level its tier) inside the PodGroup's
  (`gangs_with_outer`), as Volcano's scheduler reads it (`pkg/scheduler/api/job_info.go`,
  `sub_job_info.go`: `getSubJobMatchValues`);
- a required pod affinity term whose topology key
is not the hostname and whose selector matches the pod's own labels (in its own namespace), as a
LeaderWorkerSet group or a hand-written "all of us in one clique" deployment says: the pods that
match the term's selector, in the term's namespaces, and carry the same term form the gang; its
size is how many of them exist now (running or pending, not terminated or being deleted).

A pod Kueue holds back (its scheduling gate `kueue.x-k8s.io/admission`) that asks for a required
topology waits for room in one domain (Kueue TAS admits the group only where all of it fits): it is
pending like an unschedulable pod (`kueue_waiting`), so a rescue may make that room. Without a
required topology a Kueue-gated pod waits for quota only, which no eviction gives: not pending.
Nor is a pod whose Kueue `Workload` says it waits for something room does not give (quota, a
queue that does not select its namespace; `kueue_held`), with or without a topology: room made
in a domain would wait, held, for an admission that something else blocks.

The topology key is the gang's level. A gang of one pod is no gang (it fits any domain its pod
fits). Bounded: a gang counts at most `MAX_GANG_PODS` pods.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyctl.cluster.bounds import MAX_GANG_PODS, MAX_KEY_CHARS, MAX_NAME_CHARS
from pyctl.cluster.nodefit import HOSTNAME
from pyctl.cluster.records import PodGang, PodRecord, PodTerm, Selector
from pyctl.cluster.selectors import matches
from pyctl.model import Gang

KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_SLICE_REQUIRED = "kueue.x-k8s.io/podset-slice-required-topology"
KUEUE_SLICE_SIZE = "kueue.x-k8s.io/podset-slice-size"
#: the scheduling gate Kueue's pod webhook puts on the pods it manages, removed at admission
KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"
KAI_REQUIRED = "kai.scheduler/topology-required-placement"
KAI_GROUP = "pod-group-name"
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-key"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
#: the annotations that name a pod's Volcano PodGroup (the first wins)
VOLCANO_GROUP = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")


@dataclass(frozen=True, slots=True)
class SubGroupGang:
    """A `subGroupPolicy` entry of a Volcano PodGroup (`SubGroupRecord`) as gangs: its pods of
    the same values of `match_keys` are a gang of `size` pods at the level `key` ("": its
    topology is not hard, or its tier unknown: it takes its pods, which are no gang of their
    own)."""

    name: str
    selector: Selector | None
    match_keys: tuple[str, ...]
    key: str
    size: int

    def values(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The pod's values of `match_keys` if this entry takes it, else () (Volcano's
        `getSubJobMatchValues`: the selector matches, no selector matches every pod; every key
        present with a non-empty value; an entry without keys takes no pod)."""
        if self.selector is not None and not matches(self.selector, labels):
            return ()
        got = tuple(labels.get(k, "") for k in self.match_keys)
        return got if got and all(got) else ()


@dataclass(frozen=True, slots=True)
class VolcanoGang:
    """A Volcano PodGroup that is a gang or holds gangs (`fabric_sources.volcano_gangs`): the
    level of its own hard topology (`key`, "": none) and its minMember (`size`), and its
    `subGroupPolicy` entries in order (`subs`)."""

    key: str
    size: int
    subs: tuple[SubGroupGang, ...] = ()

    def sub_of(self, labels: Mapping[str, str]) -> tuple[SubGroupGang, tuple[str, ...]] | None:
        """The entry that takes a pod with these labels (the first), and its values."""
        for s in self.subs:
            values = s.values(labels)
            if values:
                return s, values
        return None


def volcano_group(annotations: Mapping[str, str]) -> str:
    """The Volcano PodGroup a pod's annotations name ("": none, or no object name)."""
    for key in VOLCANO_GROUP:
        name = annotations.get(key)
        if name:
            ok = len(name) <= MAX_NAME_CHARS and all(c.isalnum() or c in "-." for c in name)
            return name if ok and name.isascii() else ""
    return ""


def pod_gang(
    annotations: Mapping[str, str], labels: Mapping[str, str], owner_kind: str, owner_name: str
) -> PodGang | None:
    """The gang a pod's annotations say it belongs to (None: none, or a level that is no label
    key). A size that is no number in 1..MAX_GANG_PODS is unknown (0)."""
    for required, group_key, by_label in (
        (KUEUE_REQUIRED, KUEUE_GROUP, True),
        (KAI_REQUIRED, KAI_GROUP, False),
        (LWS_EXCLUSIVE, LWS_GROUP, True),
        (KUEUE_SLICE_REQUIRED, KUEUE_GROUP, True),
    ):
        key = annotations.get(required)
        if not key:
            continue
        key = key.strip()
        if not key or len(key) > MAX_KEY_CHARS or any(c.isspace() for c in key):
            return None
        first, second = (labels, annotations) if by_label else (annotations, labels)
        group = first.get(group_key) or second.get(group_key) or ""
        if not group and owner_name:
            group = f"{owner_kind}/{owner_name}"
        if not group:
            return None
        count = {
            KUEUE_REQUIRED: KUEUE_COUNT,
            LWS_EXCLUSIVE: LWS_SIZE,
            KUEUE_SLICE_REQUIRED: KUEUE_SLICE_SIZE,
        }.get(required)
        raw = annotations.get(count, "") if count else ""
        size = int(raw) if raw.isdigit() and len(raw) <= 6 else 0
        if not 1 <= size <= MAX_GANG_PODS:
            size = 0
        if required == KUEUE_SLICE_REQUIRED:
            # a slice of unknown size, or of one pod, binds no pods together
            return PodGang(key, group[:MAX_NAME_CHARS], size, slice=True) if size > 1 else None
        return PodGang(key, group[:MAX_NAME_CHARS], size)
    return None


def kueue_waiting(gates: Iterable[str], annotations: Mapping[str, str]) -> str:
    """Why an unbound pod waits for room in a domain though no scheduler has tried it ("": it
    does not): Kueue holds it back (`KUEUE_ADMISSION_GATE`) and it asks for a required topology
    (Kueue TAS admits its group only where all of it fits)."""
    if KUEUE_ADMISSION_GATE not in gates:
        return ""
    key = (annotations.get(KUEUE_REQUIRED) or annotations.get(KUEUE_SLICE_REQUIRED) or "").strip()
    if not key or len(key) > MAX_KEY_CHARS or any(c.isspace() for c in key):
        return ""
    return f"waiting for Kueue to admit it (scheduling gate {KUEUE_ADMISSION_GATE}, {key})"


#: what Kueue says, in the message of a Workload's `QuotaReserved` condition while it is False, of
#: a pod set its ClusterQueue (and cohort) lacks quota for (sigs.k8s.io/kueue
#: pkg/scheduler/flavorassigner: `fitsResourceQuota`) ...
KUEUE_QUOTA_MESSAGES = ("insufficient quota for ", "insufficient unused quota for ")
#: ... and of a pod set for which a topology has no room (pkg/cache/scheduler/tas_flavor_snapshot)
KUEUE_ROOM_MESSAGES = ("doesn't allow to fit", "allows to fit only ")
#: most characters of Kueue's message a record keeps
KUEUE_MESSAGE_CHARS = 200


def kueue_held(conditions: Iterable[tuple[str, str, str]]) -> str:
    """Why Kueue holds a `Workload` with these conditions (type, status, message) back for
    something room in a domain does not give ("": it does not say so): its `QuotaReserved`
    condition is False and its message names missing quota, or any reason but a topology without
    room for it (Kueue TAS: "topology ... allows to fit only ...", "... doesn't allow to fit
    ..."), such as a namespace its ClusterQueue does not select or a queue that admits nothing
    ("ClusterQueue ... is inactive", "LocalQueue ... doesn't exist"). Quota before room: while any
    pod set lacks quota, room does not admit the workload. No message (not tried yet): "". The
    message, cut to `KUEUE_MESSAGE_CHARS`."""
    for kind, status, message in conditions:
        if kind != "QuotaReserved" or status != "False":
            continue
        said = message.strip()
        if not said:
            return ""
        if any(m in said for m in KUEUE_QUOTA_MESSAGES):
            return said[:KUEUE_MESSAGE_CHARS]
        if any(m in said for m in KUEUE_ROOM_MESSAGES):
            return ""
        return said[:KUEUE_MESSAGE_CHARS]
    return ""


def _own_term(p: PodRecord) -> PodTerm | None:
    """The pod's first required affinity term that binds it to pods like itself in a domain
    wider than a node, if any."""
    c = p.constraints
    if c is None:
        return None
    labels = dict(p.labels)
    for t in c.affinity:
        if t.topology_key == HOSTNAME or not t.topology_key:
            continue
        if t.selector is None:
            continue
        if not t.all_namespaces and t.namespaces and p.namespace not in t.namespaces:
            continue
        if matches(t.selector, labels):
            return t
    return None


def gangs_of(
    pods: Iterable[PodRecord], pod_groups: Mapping[str, VolcanoGang] | None = None
) -> dict[str, Gang]:
    """Pod key -> its gang, for every pod in a gang of at least two pods (a Volcano sub-group's
    pod: its sub-group's gang; `gangs_with_outer` says its PodGroup's too). `pod_groups`: the
    Volcano PodGroups that are gangs or hold some, `namespace/name` -> `VolcanoGang`
    (`fabric_sources.volcano_gangs`)."""
    return gangs_with_outer(pods, pod_groups)[0]


def gangs_with_outer(
    pods: Iterable[PodRecord], pod_groups: Mapping[str, VolcanoGang] | None
) -> tuple[dict[str, Gang], dict[str, Gang]]:
    """`gangs_of`, and pod key -> the gang of its whole Volcano PodGroup for the pods `gangs_of`
    puts in a sub-group's gang while the PodGroup's own topology is hard too (the sub-group's
    domain lies inside the PodGroup's): one gang object per gang across both, so the pods of
    the PodGroup outside its sub-groups share that object."""
    groups: defaultdict[tuple[str, PodTerm], list[str]] = defaultdict(list)
    said: defaultdict[tuple[str, str, str], list[str]] = defaultdict(list)
    sizes: dict[tuple[str, str, str], int] = {}
    sliced: dict[str, Gang] = {}
    # a Volcano sub-group's pod -> its PodGroup's gang (namespace, group, level key)
    outer_of: dict[str, tuple[str, str, str]] = {}
    for p in pods:
        if p.terminated or p.deleting:
            continue
        if p.gang is not None and p.gang.slice:
            # every slice is a gang of the slice's size (which pods make a slice is Kueue's)
            g = Gang(min(p.gang.size, MAX_GANG_PODS), p.gang.key)
            sliced[p.key] = g
            continue
        if p.gang is not None:
            named = (p.namespace, p.gang.group, p.gang.key)
            said[named].append(p.key)
            sizes[named] = max(sizes.get(named, 0), p.gang.size)
            continue
        if p.pod_group and pod_groups:
            vg = pod_groups.get(f"{p.namespace}/{p.pod_group}")
            if vg is not None:
                whole = (p.namespace, f"volcano:{p.pod_group}", vg.key)
                sub = vg.sub_of(dict(p.labels)) if vg.subs else None
                if sub is not None and sub[0].key:
                    s, values = sub
                    named = (p.namespace, f"{whole[1]}/{s.name}/{'/'.join(values)}", s.key)
                    said[named].append(p.key)
                    sizes[named] = s.size
                    if vg.key:  # the PodGroup's gang counts its sub-groups' pods too
                        outer_of[p.key] = whole
                        said[whole].append(p.key)
                        sizes[whole] = vg.size
                    continue
                if vg.key:
                    said[whole].append(p.key)
                    sizes[whole] = vg.size
                    continue
        t = _own_term(p)
        if t is None:
            continue
        scope = "*" if t.all_namespaces else ",".join(sorted(t.namespaces or (p.namespace,)))
        groups[(scope, t)].append(p.key)
    out: dict[str, Gang] = dict(sliced)
    made: dict[tuple[str, str, str], Gang] = {}
    for group, members in said.items():
        n = max(len(members), sizes[group])
        if n < 2:
            continue
        g = made[group] = Gang(min(n, MAX_GANG_PODS), group[2])
        for member in members:
            if outer_of.get(member) != group:
                out[member] = g
    for (_, t), keys in groups.items():
        if len(keys) < 2:
            continue
        g = Gang(min(len(keys), MAX_GANG_PODS), t.topology_key)
        for k in keys:
            out[k] = g
    outer = {k: made[w] for k, w in outer_of.items() if w in made}
    return out, outer
