"""Volcano as a source of the fabric (docs/fabric.md): `HyperNode` objects give each node a
domain at each tier (the synthetic levels `volcano.sh/hypernode-tier-<t>`), and a `PodGroup`
whose `networkTopology` is hard makes its pods a gang at the tier it allows; decoded from good
and hostile objects, resolved through nested HyperNodes, read by the controller and on a dump."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyctl.cli.main import main
from pyctl.cluster.bounds import MAX_HYPERNODE_MEMBERS, MAX_HYPERNODE_PATTERNS, BoundsError
from pyctl.cluster.gangs import (
    SubGroupGang,
    VolcanoGang,
    gangs_of,
    gangs_with_outer,
    volcano_group,
)
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.kube.dump import read_dump
from pyctl.cluster.kube.fabric_decode import safe_pattern
from pyctl.cluster.records import (
    Event,
    HyperNodeRecord,
    NodeRecord,
    PodGroupRecord,
    PodRecord,
    Selector,
    SubGroupRecord,
    check_record,
    decode_record,
    encode_record,
    record_key,
)
from pyctl.controller import fabric_sources as fs
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.metrics import Metrics
from pyctl.model import Gang
from tests.fuzz.gen import hypernode, pod_group

T1, T2, T3 = fs.tier_key(1), fs.tier_key(2), fs.tier_key(3)
RACK = "example.com/rack"


def _enc(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def _members(*items: Any) -> dict[str, Any]:
    doc = hypernode("h")
    doc["spec"]["members"] = list(items)
    return doc


def _node_member(how: str, value: Any) -> dict[str, Any]:
    return {"type": "Node", "selector": {how: value}}


# -- decode -----------------------------------------------------------------------------------


def test_a_hypernode_decodes_to_its_tier_and_members() -> None:
    rec = decode_object("HyperNode", _enc(hypernode("rack-1", tier=1)))
    assert rec == HyperNodeRecord(
        "rack-1",
        tier=1,
        tier_name="rack",
        nodes=("a",),
        patterns=("^c[0-9]*$",),
        label_selectors=(Selector(((RACK, "r1"),)),),
        children=("block-1",),
    )
    assert record_key(rec) == "rack-1"
    check_record(rec)
    assert decode_record("HyperNode", encode_record(rec)) == rec


def test_a_hypernodes_bad_members_are_left_out_and_counted_the_object_stays() -> None:
    doc = _members(
        _node_member("exactMatch", {"name": "good"}),
        "not a member",
        {"type": "Rack", "selector": {"exactMatch": {"name": "x"}}},
        {"type": "Node"},  # no selector
        {"type": "Node", "selector": {"exactMatch": {"name": "x"}, "regexMatch": {"pattern": "x"}}},
        _node_member("exactMatch", {"name": "Not_A_Name"}),
        _node_member("exactMatch", {"name": "n" * 254}),
        _node_member("exactMatch", {"name": "good"}),  # named twice
        _node_member("regexMatch", {"pattern": "(a+)+$"}),  # catastrophic backtracking
        _node_member("regexMatch", {"pattern": "[unclosed"}),
        _node_member("regexMatch", {"pattern": "x" * 257}),
        _node_member("regexMatch", {"pattern": 7}),
        {"type": "HyperNode", "selector": {"regexMatch": {"pattern": "^rack"}}},
        _node_member("labelMatch", {"matchExpressions": [{"key": RACK, "operator": "Near"}]}),
        _node_member("labelMatch", {"matchLabels": {"bad key!": "x"}}),
        _node_member("labelMatch", {}),  # matches no node in Volcano
        _node_member("labelMatch", {"matchExpressions": [{"key": RACK, "operator": "In"}]}),
        _node_member("regexMatch", {"pattern": "^gpu-[0-9]+$"}),
    )
    doc["spec"]["tier"] = "2"
    doc["spec"]["tierName"] = "t" * 300
    rec = decode_object("HyperNode", _enc(doc))
    assert isinstance(rec, HyperNodeRecord)
    assert (rec.tier, rec.tier_name, rec.nodes, rec.patterns) == (
        0,
        "",
        ("good",),
        ("^gpu-[0-9]+$",),
    )
    assert rec.dropped == 16
    check_record(rec)


@pytest.mark.parametrize("tier", [0, -1, 17, 2.5, True, None])
def test_a_tier_pyctl_cannot_model_is_none(tier: Any) -> None:
    doc = hypernode("h")
    doc["spec"]["tier"] = tier
    rec = decode_object("HyperNode", _enc(doc))
    assert isinstance(rec, HyperNodeRecord)
    assert rec.tier == 0


def test_a_hypernode_naming_more_members_than_the_bound_keeps_the_first() -> None:
    doc = _members(
        *(_node_member("exactMatch", {"name": f"n{i}"}) for i in range(MAX_HYPERNODE_MEMBERS + 5))
    )
    rec = decode_object("HyperNode", _enc(doc))
    assert isinstance(rec, HyperNodeRecord)
    assert (len(rec.nodes), rec.dropped) == (MAX_HYPERNODE_MEMBERS, 5)


@pytest.mark.parametrize(
    "spec", [["members"], {"members": "all"}, {"members": {"type": "Node"}}, "x"]
)
def test_a_hypernode_that_is_not_one_is_refused_with_its_reason(spec: Any) -> None:
    doc = hypernode("h")
    doc["spec"] = spec
    with pytest.raises(DecodeError):
        decode_object("HyperNode", _enc(doc))


def test_patterns_that_backtrack_badly_are_not_read() -> None:
    for good in ("^node-[0-9]+$", "^rack1-n[0-9]{2}$", "gpu", "^(a|b)-x.*$", "^h100-(sxm|pcie)-1$"):
        assert safe_pattern(good) is not None, good
    for bad in ("(a+)+$", "a*a*b", "(x|xx)+y", r"(\w)\1", "(?=x)x", "(?!x)y", "[", "", None, 3):
        assert safe_pattern(bad) is None, bad
    # what is read stays fast on the longest node name (a search, as Volcano's Go regexp does)
    p = safe_pattern(".*x")
    assert p is not None
    t = time.perf_counter()
    for _ in range(100):
        p.search("a" * 253)
    assert time.perf_counter() - t < 1.0


def test_a_podgroup_decodes_hard_or_soft_with_its_tier() -> None:
    rec = decode_object("PodGroup", _enc(pod_group("llm")))
    assert rec == PodGroupRecord("ml", "llm", min_member=4, hard=True, tier=1)
    assert record_key(rec) == "ml/llm"
    assert decode_record("PodGroup", encode_record(rec)) == rec
    soft = decode_object("PodGroup", _enc(pod_group("llm", mode="soft")))
    assert isinstance(soft, PodGroupRecord)
    assert not soft.hard
    # the CRD's default mode is hard
    doc = pod_group("d")
    doc["spec"]["networkTopology"] = {"highestTierName": "rack"}
    named = decode_object("PodGroup", _enc(doc))
    assert named == PodGroupRecord("ml", "d", min_member=4, hard=True, tier_name="rack")
    # no networkTopology: no tier, never a gang
    doc["spec"] = {"minMember": 2}
    assert decode_object("PodGroup", _enc(doc)) == PodGroupRecord("ml", "d", min_member=2)


TASK = "volcano.sh/task-spec"
PARTITION = "volcano.sh/partition-id"
WORKERS = SubGroupRecord("worker", 2, True, 1, "", Selector(((TASK, "worker"),)), (PARTITION,))


def test_a_podgroups_sub_groups_decode_in_order() -> None:
    """`subGroupPolicy` as Volcano's job controller writes it for a task's `partitionPolicy`
    (partitions of 2 pods, each in one tier-1 HyperNode). Entries are kept in order (a pod
    belongs to the first that takes it), soft and bare ones too, when one is hard; entries pyctl
    cannot read are counted; with no hard entry none is kept."""
    doc = pod_group("parts", sub_groups=True)
    rec = decode_object("PodGroup", _enc(doc))
    assert rec == PodGroupRecord(
        "ml", "parts", min_member=4, hard=True, tier=2, sub_groups=(WORKERS,)
    )
    assert decode_record("PodGroup", encode_record(rec)) == rec
    [entry] = doc["spec"]["subGroupPolicy"]
    del entry["networkTopology"]["mode"]  # the CRD's default: hard
    soft = {**entry, "name": "soft", "networkTopology": {"mode": "soft", "highestTierAllowed": 1}}
    bare = {k: v for k, v in entry.items() if k not in ("networkTopology", "labelSelector")}
    bad = [
        "x",
        None,
        {**entry, "labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt"}]}},
        {**entry, "matchLabelKeys": ["not a key"]},
        {**entry, "subGroupSize": 0},
        {**entry, "name": 7},
    ]
    doc["spec"]["subGroupPolicy"] = [soft, entry, bare, *bad, {**entry, "labelSelector": {}}]
    rec = decode_object("PodGroup", _enc(doc))
    assert isinstance(rec, PodGroupRecord)
    assert rec.sub_groups == (
        SubGroupRecord("soft", 2, False, 0, "", WORKERS.selector, (PARTITION,)),
        WORKERS,
        SubGroupRecord("worker", 2, match_keys=(PARTITION,)),
        SubGroupRecord("worker", 2, True, 1, "", Selector(), (PARTITION,)),
    )
    assert rec.sub_unread == len(bad)
    soft_only = decode_object("PodGroup", _enc(pod_group("s", sub_groups=True, mode="soft")))
    assert soft_only == PodGroupRecord("ml", "s", min_member=4, tier=2)
    # an entry pyctl cannot read counts where it may matter: its own topology hard, or another's
    doc = pod_group("u", sub_groups=True, mode="soft")
    [entry] = doc["spec"]["subGroupPolicy"]
    unreadable = {**entry, "matchLabelKeys": ["not a key"]}
    for unread_mode, other_mode, counted in (
        ("soft", "soft", 0),
        ("hard", "soft", 1),
        ("soft", "hard", 1),
    ):
        doc["spec"]["subGroupPolicy"] = [
            {**unreadable, "networkTopology": {"mode": unread_mode, "highestTierAllowed": 1}},
            {**entry, "networkTopology": {"mode": other_mode, "highestTierAllowed": 1}},
        ]
        rec = decode_object("PodGroup", _enc(doc))
        assert isinstance(rec, PodGroupRecord)
        assert rec.sub_unread == counted, (unread_mode, other_mode)
    # a stored record out of bounds (read back from the store) is refused, naming the field
    for bad_sub in (
        msgspec.structs.replace(WORKERS, size=0),
        msgspec.structs.replace(WORKERS, tier=99),
        msgspec.structs.replace(WORKERS, match_keys=("k",) * 17),
    ):
        with pytest.raises(BoundsError, match=r"subGroupSize|sub-group tier|matchLabelKeys"):
            check_record(PodGroupRecord("ml", "x", sub_groups=(bad_sub,)))


@pytest.mark.parametrize(
    ("field", "value", "want"),
    [
        ("minMember", -1, ("min_member", 0)),
        ("minMember", "4", ("min_member", 0)),
        ("minMember", 10**30, ("min_member", 0)),
        ("networkTopology", {"highestTierAllowed": 0}, ("tier", 0)),
        ("networkTopology", {"highestTierAllowed": "1"}, ("tier", 0)),
        ("networkTopology", {"highestTierAllowed": 99}, ("tier", 0)),
        ("networkTopology", {"mode": ["hard"], "highestTierAllowed": 1}, ("hard", False)),
        ("networkTopology", "hard", ("hard", False)),
    ],
)
def test_a_podgroups_hostile_fields_are_no_gang_never_an_error(
    field: str, value: Any, want: tuple[str, Any]
) -> None:
    doc = pod_group("x")
    doc["spec"][field] = value
    rec = decode_object("PodGroup", _enc(doc))
    assert getattr(rec, want[0]) == want[1]
    check_record(rec)


def test_a_pods_podgroup_annotation_is_on_its_record() -> None:
    assert volcano_group({"scheduling.k8s.io/group-name": "llm"}) == "llm"
    assert volcano_group({"scheduling.volcano.sh/group-name": "llm"}) == "llm"
    assert volcano_group({"scheduling.k8s.io/group-name": "bad name!"}) == ""
    assert volcano_group({"scheduling.k8s.io/group-name": "x" * 254}) == ""
    from tests.unit.test_kube_dump import pod

    doc = pod("w0", "", gpus=4)
    doc["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "llm"}
    rec = decode_object("Pod", _enc(doc))
    assert isinstance(rec, PodRecord)
    assert rec.pod_group == "llm"


# -- the tree -----------------------------------------------------------------------------------


def _hn(name: str, tier: int, **members: Any) -> HyperNodeRecord:
    return HyperNodeRecord(name, tier=tier, **members)


def _tree() -> list[HyperNodeRecord]:
    """rack-1 {n0, n1} and rack-2 {by pattern ^n[23]$} under block-1; rack-3 {by label} under
    block-2; both blocks under the spine (tier 3)."""
    return [
        _hn("rack-1", 1, tier_name="rack", nodes=("n0", "n1")),
        _hn("rack-2", 1, tier_name="rack", patterns=("^n[23]$",)),
        _hn("rack-3", 1, tier_name="rack", label_selectors=(Selector(((RACK, "r3"),)),)),
        _hn("block-1", 2, children=("rack-1", "rack-2")),
        _hn("block-2", 2, children=("rack-3",)),
        _hn("spine", 3, tier_name="spine", children=("block-1", "block-2")),
    ]


def test_a_nodes_domain_at_each_tier_is_the_hypernode_that_holds_it_through_the_tree() -> None:
    fill = fs.HyperNodeFill(_tree())
    assert fill.tiers == (1, 2, 3)
    assert fill.domains("n0", ()) == {T1: "rack-1", T2: "block-1", T3: "spine"}
    assert fill.domains("n3", ()) == {T1: "rack-2", T2: "block-1", T3: "spine"}
    assert fill.domains("n9", ((RACK, "r3"),)) == {T1: "rack-3", T2: "block-2", T3: "spine"}
    assert fill.domains("n9", ((RACK, "r4"),)) == {}
    assert fill.domains("n33", ()) == {}  # the pattern is a search: ^n[23]$ is not n33
    assert fill.tier_names == {"rack": 1, "spine": 3}
    assert fill.conflicts == 0


def test_a_node_two_hypernodes_of_one_tier_hold_has_no_domain_there_counted() -> None:
    fill = fs.HyperNodeFill([*_tree(), _hn("rack-9", 1, nodes=("n0",))])
    # n0 is in rack-1 and rack-9 (tier 1), and through rack-1 in block-1 and the spine
    assert fill.domains("n0", ()) == {T2: "block-1", T3: "spine"}
    assert fill.conflicts == 1


def test_a_cycle_of_hypernodes_ends_and_bounds_are_counted() -> None:
    cyc = [_hn("a", 1, nodes=("n0",), children=("b",)), _hn("b", 2, children=("a",))]
    assert fs.HyperNodeFill(cyc).domains("n0", ()) == {T1: "a", T2: "b"}
    many = [_hn(f"r{i:03}", 1, patterns=(f"^n{i}$",)) for i in range(MAX_HYPERNODE_PATTERNS + 3)]
    fill = fs.HyperNodeFill(many)
    assert fill.patterns_left_out == 3
    assert fill.domains("n1", ()) == {T1: "r001"}
    assert fill.domains(f"n{MAX_HYPERNODE_PATTERNS + 1}", ()) == {}


def test_the_tiers_join_the_levels_narrowest_first_after_the_topologies() -> None:
    levels = fs.fabric_levels(["nvidia.com/gpu.clique"], tiers=(3, 1, 2))
    assert levels.levels == ("nvidia.com/gpu.clique", T1, T2, T3)
    assert levels.origin[T2] == fs.VOLCANO_SOURCE


# -- gangs --------------------------------------------------------------------------------------


def _pod(name: str, group: str, ns: str = "ml", node: str = "") -> PodRecord:
    return PodRecord(ns, name, node=node, gpus=4, pod_group=group)


def test_a_hard_podgroup_is_a_gang_at_its_tier_and_a_soft_one_is_none() -> None:
    fill = fs.HyperNodeFill(_tree())
    groups = [
        PodGroupRecord("ml", "hard", min_member=4, hard=True, tier=2),
        PodGroupRecord("ml", "soft", min_member=4, hard=False, tier=2),
        PodGroupRecord("ml", "named", min_member=2, hard=True, tier_name="rack"),
        PodGroupRecord("ml", "unknown", min_member=2, hard=True, tier_name="row"),
    ]
    vg = fs.volcano_gangs(groups, fill)
    assert vg == {"ml/hard": VolcanoGang(T2, 4), "ml/named": VolcanoGang(T1, 2)}
    pods = [
        _pod("h0", "hard", node="n0"),
        _pod("h1", "hard"),  # two of four exist: the gang is minMember
        *(_pod(f"s{i}", "soft") for i in range(4)),
        *(_pod(f"n{i}", "named") for i in range(3)),  # more pods than minMember: the pods
        *(_pod(f"u{i}", "unknown") for i in range(2)),
        _pod("other", "hard", ns="elsewhere"),  # another namespace's PodGroup of the name
    ]
    gangs = gangs_of(pods, vg)
    assert gangs["ml/h0"] == gangs["ml/h1"] == Gang(4, T2)
    assert gangs["ml/n0"] == Gang(3, T1)
    assert set(gangs) == {"ml/h0", "ml/h1", "ml/n0", "ml/n1", "ml/n2"}
    # without the PodGroups nothing is a gang (as the compaction planner reads pods today)
    assert gangs_of(pods) == {}


def test_a_podgroups_sub_groups_are_gangs_inside_its_own() -> None:
    """Each partition of the workers (their `volcano.sh/partition-id`) is a gang of 2 at tier 1;
    the whole PodGroup, at tier 2, is the gang the others belong to and the sub-groups' pods'
    outer gang. A worker without a partition label and the leader belong to no sub-group."""
    from msgspec.structs import replace

    fill = fs.HyperNodeFill(_tree())
    group = PodGroupRecord("ml", "parts", min_member=4, hard=True, tier=2, sub_groups=(WORKERS,))
    vg = fs.volcano_gangs([group], fill)
    sub = SubGroupGang("worker", WORKERS.selector, (PARTITION,), T1, 2)
    assert vg == {"ml/parts": VolcanoGang(T2, 4, (sub,))}

    def member(name: str, task: str, part: str = "", node: str = "") -> PodRecord:
        labels = ((PARTITION, part), (TASK, task)) if part else ((TASK, task),)
        return replace(_pod(name, "parts", node=node), labels=labels)

    pods = [
        member("w0", "worker", "0", node="n0"),
        member("w1", "worker", "0"),
        member("w2", "worker", "1"),
        member("w3", "worker", "1"),
        member("x", "worker"),
        member("leader", "leader", "0"),  # a partition label, but not a worker
    ]
    gangs, outer = gangs_with_outer(pods, vg)
    assert gangs == gangs_of(pods, vg)
    assert gangs["ml/w0"] == gangs["ml/w1"] == gangs["ml/w2"] == Gang(2, T1)
    assert gangs["ml/w0"] is gangs["ml/w1"]
    assert gangs["ml/w2"] is not gangs["ml/w0"]
    assert gangs["ml/x"] == gangs["ml/leader"] == Gang(6, T2)
    assert set(outer) == {"ml/w0", "ml/w1", "ml/w2", "ml/w3"}
    assert outer["ml/w3"] is gangs["ml/leader"]  # one gang: the whole PodGroup
    # the PodGroup's own topology soft: its sub-groups are gangs, nothing around them
    vg = fs.volcano_gangs([replace(group, hard=False)], fill)
    assert set(gangs_of(pods, vg)) == {"ml/w0", "ml/w1", "ml/w2", "ml/w3"}
    assert gangs_with_outer(pods, vg)[1] == {}
    # a sub-group's tier unknown: no sub-group gang; the PodGroup's is the only one
    vg = fs.volcano_gangs([replace(group, sub_groups=(replace(WORKERS, tier=0),))], fill)
    assert vg == {"ml/parts": VolcanoGang(T2, 4)}
    assert gangs_of(pods, vg)["ml/w0"] == Gang(6, T2)


# -- the controller and a dump ------------------------------------------------------------------


def _node(name: str) -> NodeRecord:
    return NodeRecord(name, gpu_model="H100-SXM5-80GB", cpu_milli=64000, memory_mib=1 << 20, gpus=4)


def test_the_controller_reads_the_tree_as_levels_and_a_hard_podgroup_as_a_gang() -> None:
    cache = ClusterCache()
    cache.apply([Event("ADDED", _node(f"n{i}")) for i in range(4)])
    r = Reconciler(cache, Metrics(), "t")
    for n in cache.nodes:
        r.reconcile(n)
    dirty = cache.apply([Event("ADDED", h) for h in _tree()])
    assert dirty == {"n0", "n1", "n2", "n3"}  # a pattern or a subtree may hold any node
    for n in sorted(dirty):
        r.reconcile(n)
    cache.apply(
        [
            Event("ADDED", PodGroupRecord("ml", "llm", min_member=4, hard=True, tier=1)),
            *(Event("ADDED", _pod(f"w{i}", "llm")) for i in range(4)),
        ]
    )
    assert r.refresh_workload()
    gangs = [s.gang for s in r.workload.shapes if s.gang is not None]
    assert gangs == [Gang(4, T1)]
    f = r.fabric(60.0)
    assert f is not None
    domains = {(d.level, d.name): d.nodes for d in f.domains}
    assert domains[(T1, "rack-1")] == domains[(T1, "rack-2")] == 2
    assert domains[(T2, "block-1")] == 4
    get = r.metrics.registry.get_sample_value
    assert get("pyctl_level_source", {"cluster": "t", "level": T3, "source": "volcano/hypernodes"})
    idle = r.domain_idle()
    assert idle.rows()["n2"][0][idle.levels.index(T1)] == "rack-2"  # the advice's order too
    # a soft PodGroup is no gang
    cache.apply([Event("MODIFIED", PodGroupRecord("ml", "llm", min_member=4, tier=1))])
    r.refresh_workload()
    assert all(s.gang is None for s in r.workload.shapes)
    # the HyperNodes gone: so are their levels
    cache.apply([Event("DELETED", h) for h in _tree()])
    f = r.fabric(120.0)
    assert f is None or not any(d.level.startswith("volcano.sh/") for d in f.domains)


def test_pyctl_score_on_a_dump_reads_hypernodes_and_only_volcanos_podgroups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.test_kube_dump import node, pod

    items: list[dict[str, Any]] = [node(f"n{i}", 4, {}) for i in range(4)]
    for i in range(2):
        p = pod(f"w{i}", "", gpus=4)
        p["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "llm"}
        items.append(p)
    for name, members in (("rack-a", ["n0", "n1"]), ("rack-b", ["n2", "n3"])):
        h = hypernode(name)
        h["spec"]["members"] = [_node_member("exactMatch", {"name": m}) for m in members]
        items.append(h)
    pg = pod_group("llm")
    pg["metadata"]["namespace"] = items[4]["metadata"]["namespace"]
    kai = copy.deepcopy(pg)
    kai["apiVersion"] = "scheduling.run.ai/v2alpha2"  # KAI's PodGroup: not Volcano's
    items += [pg, kai]
    listed = read_dump({"kind": "List", "items": items})
    assert len(listed.records["PodGroup"]) == 1
    assert len(listed.records["HyperNode"]) == 2
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["score", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    levels = {lv["level"]: lv for lv in out["fabric"]["levels"]}
    assert levels[T1]["domains"] == 2


def test_a_pod_of_a_podgroup_with_a_sub_group_policy_pyctl_cannot_read_gets_no_room() -> None:
    """Which of its pods must share a domain is not known: room made could be room Volcano does
    not use, so none is made (`ClusterCache.volcano_held`)."""
    from msgspec.structs import replace

    from tests.unit.test_isolation import PENDING_FOUR
    from tests.unit.test_kueue_workload import considered

    pod = replace(PENDING_FOUR, pod_group="pg")
    group = PodGroupRecord("serving", "pg", min_member=1, hard=True, tier=1)
    assert considered(group, pod) == ["serving/big"]
    assert considered(replace(group, sub_unread=1), pod) == []
    # another namespace's PodGroup of that name is not its group
    assert considered(replace(group, namespace="ml", sub_unread=1), pod) == ["serving/big"]


@pytest.mark.parametrize("unread", [False, True])
def test_pyctl_plan_says_why_it_makes_no_room_for_a_podgroup_it_cannot_read(
    unread: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pyctl plan` on a dump: a pending 4-GPU pod of a PodGroup, no node with 4 GPUs free. With
    a `subGroupPolicy` entry pyctl cannot read, the pod is not considered and `held` says why."""
    from tests.unit.test_kube_dump import node, pod

    items: list[dict[str, Any]] = [node("n0", 4, {}), node("n1", 4, {})]
    items += [pod(f"r{i}", "n0", gpus=1) for i in range(3)] + [pod("r9", "n1", gpus=1)]
    big = pod("big", "", gpus=4)
    big["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "parts"}
    big["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    pg = pod_group("parts", sub_groups=True)
    pg["metadata"]["namespace"] = big["metadata"]["namespace"]
    if unread:
        pg["spec"]["subGroupPolicy"][0]["labelSelector"] = {"matchLabels": {"a": "not a value"}}
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": [*items, big, pg]}))
    assert main(["plan", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    key = f"{big['metadata']['namespace']}/big"
    if unread:
        assert out["held"] == {
            key: "Volcano PodGroup parts: 1 subGroupPolicy entry pyctl cannot read (which of "
            "its pods must share a domain is not known)"
        }
        assert key not in out["unrescued"]
    else:
        assert out["held"] == {}
        assert key in out["unrescued"]  # considered (the bare pods may not move)


_PARTS = st.sampled_from(["", "0", "1", "2"])
_TASKS = st.sampled_from(["worker", "leader", ""])


@settings(max_examples=200, deadline=None)
@given(
    members=st.lists(st.tuples(_TASKS, _PARTS, st.booleans()), max_size=12),
    group_key=st.sampled_from(["", T2]),
    sub_key=st.sampled_from(["", T1]),
    keys=st.sampled_from([(), (PARTITION,), (PARTITION, TASK)]),
    selector=st.sampled_from([None, Selector(), Selector(((TASK, "worker"),))]),
    size=st.integers(1, 4),
    min_member=st.integers(0, 6),
)
def test_sub_group_gangs_follow_volcanos_rule(
    members: list[tuple[str, str, bool]],
    group_key: str,
    sub_key: str,
    keys: tuple[str, ...],
    selector: Selector | None,
    size: int,
    min_member: int,
) -> None:
    """Against the rule written out: a pod is in a sub-group iff the selector matches (None:
    every pod) and it carries every key non-empty (no keys: none); a sub-group's pods share one
    gang at the entry's level, of the entry's size or its pods if more, when that level is known
    and it has two pods or more; the PodGroup's other pods (and, as their outer gang, the
    sub-groups' pods) share one gang at its level, when it has one."""
    from msgspec.structs import replace

    sub = SubGroupGang("s", selector, keys, sub_key, size)
    vg = VolcanoGang(group_key, min_member, (sub,))
    pods = []
    for i, (task, part, running) in enumerate(members):
        labels = tuple(sorted({TASK: task, PARTITION: part}.items()))
        pods.append(replace(_pod(f"p{i}", "g", node="n0" if running else ""), labels=labels))
    gangs, outer = gangs_with_outer(pods, {"ml/g": vg})

    def values(p: PodRecord) -> tuple[str, ...]:
        labels = dict(p.labels)
        if selector is not None and any(labels.get(k) != v for k, v in selector.match_labels):
            return ()
        got = tuple(labels.get(k, "") for k in keys)
        return got if got and all(got) else ()

    subs: dict[tuple[str, ...], list[str]] = {}
    rest: list[str] = []
    for p in pods:
        v = values(p)
        if v and sub_key:
            subs.setdefault(v, []).append(p.key)
        else:
            rest.append(p.key)
    in_sub = {k for ks in subs.values() for k in ks}
    whole = len(pods) if group_key else 0
    for ks in subs.values():
        want = Gang(max(len(ks), size), sub_key)
        if want.pods >= 2:
            assert {id(gangs[k]) for k in ks} == {id(gangs[ks[0]])}
            assert gangs[ks[0]] == want
        else:
            assert not any(k in gangs for k in ks)
    for k in rest:
        if group_key and max(whole, min_member) >= 2:
            assert gangs[k] == Gang(max(whole, min_member), group_key)
        else:
            assert k not in gangs
    # the outer gang: the PodGroup's, for the sub-groups' pods, one object with the others'
    if group_key and max(whole, min_member) >= 2:
        assert set(outer) == in_sub
        shared = {id(g) for g in outer.values()} | {id(gangs[k]) for k in rest}
        assert len(shared) <= 1
    else:
        assert outer == {}
