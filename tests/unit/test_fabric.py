"""The fabric pass (docs/fabric.md): topology domains, gangs, `domain_split` and `no_domain`,
against hand-worked cases and the pure-Python twin (tests/reference/fabric.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyctl.cli.main import main
from pyctl.cluster.bounds import MAX_DOMAINS_PER_LEVEL
from pyctl.cluster.gangs import VolcanoGang, gangs_of
from pyctl.cluster.records import (
    Constraints,
    NodeRecord,
    PodGang,
    PodRecord,
    PodTerm,
    Requirement,
    Selector,
)
from pyctl.core.fabric import fabric_score, levels_for
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Gang, Gpu, Node, PolicyName, Shape, Snapshot, Workload, Zone
from pyctl.snapshot import load_snapshot, load_workload, snapshot_to_json
from pyctl.workflows.compaction import CompactionPlan
from tests.reference import fabric as ref

CLIQUE = "nvidia.com/gpu.clique"


def gpu_node(name: str, used: int, gpus: int = 4, clique: str | None = None) -> Node:
    return Node(
        name,
        "H100-SXM5-80GB",
        cpu_manager_policy="none",
        zones=(
            Zone(
                0,
                cpu_milli=64000,
                memory_mib=1 << 20,
                gpus=tuple(Gpu(i, 1000 if i < used else 0) for i in range(gpus)),
            ),
        ),
        labels=((CLIQUE, clique),) if clique else (),
    )


def gang_workload(pods: int = 4, gpus: int = 4) -> Workload:
    return Workload(
        (
            Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
            Shape(cpu_milli=1000, gpus=gpus, gpu_milli=1000, weight=0.5, gang=Gang(pods, CLIQUE)),
        )
    )


def twelve_nodes(full: list[int]) -> Snapshot:
    return Snapshot(
        tuple(
            gpu_node(f"n{i:02}", 4 if i in full else 0, clique=f"uuid-1.{i // 4}")
            for i in range(12)
        )
    )


def test_the_three_cliques_case_strands_every_idle_gpu_for_the_gang() -> None:
    """Twelve 4-GPU nodes in three cliques, two full in each: 24 idle GPUs, each clique can host
    two of the gang's four 4-GPU pods. Per node the 4-GPU shape fits (fragment 0 before this
    pass); the gang's half of M strands all 24 GPUs: 0.5 x 24,000 milli-GPU of domain_split."""
    model = FragmentationModel(twelve_nodes([0, 1, 4, 5, 8, 9]))
    w = gang_workload()
    assert model.score(w).fragment_gpu_milli == 0.0
    f = fabric_score(model, w)
    assert f.domain_split_gpu_milli == pytest.approx(12_000.0)
    assert f.no_domain_gpu_milli == 0.0
    (lv,) = f.levels
    assert (lv.level, lv.domains, lv.whole, lv.largest) == (CLIQUE, 3, 0, (2,))
    assert all(d.capacity == (2,) and d.idle_gpu_milli == 8000 for d in f.domains)
    # one clique freed: it hosts the gang (no domain_split there); the half-full clique's two
    # empty nodes still cannot host it: 0.5 x 8,000
    f = fabric_score(FragmentationModel(twelve_nodes([0, 1, 2, 3, 4, 5])), w)
    assert f.domain_split_gpu_milli == pytest.approx(4000.0)
    assert set(f.node_domain_split) == {"n06", "n07"}
    assert [d.whole for d in f.domains] == [False, False, True]
    assert f.levels[0].largest == (4,)
    assert f.levels[0].whole_fraction == pytest.approx(1 / 3)


def test_nodes_without_the_label_are_no_domain_said_never_an_error() -> None:
    snap = Snapshot((gpu_node("a", 0, clique="x.1"), gpu_node("b", 0)))
    f = fabric_score(FragmentationModel(snap), gang_workload(pods=1))
    assert f.node_no_domain == {"b": pytest.approx(2000.0)}
    assert f.levels[0].no_domain_nodes == 1


def test_hostile_topology_input_is_bounded_and_counted() -> None:
    n = MAX_DOMAINS_PER_LEVEL + 50
    nodes = [gpu_node(f"n{i}", 0, gpus=1, clique=f"c.{i:05}") for i in range(n)]
    nodes += [gpu_node("bad1", 0, clique="-nope-"), gpu_node("bad2", 0, clique="x" * 64)]
    f = fabric_score(FragmentationModel(Snapshot(tuple(nodes))), gang_workload(pods=1, gpus=1))
    (lv,) = f.levels
    assert lv.domains == MAX_DOMAINS_PER_LEVEL
    assert lv.overflow == 50
    assert lv.malformed == 2
    assert lv.no_domain_nodes == 52


def test_levels_are_the_configured_then_the_gangs_keys() -> None:
    w = Workload((Shape(gpus=1, gpu_milli=1000, gang=Gang(2, "example.com/block")),))
    assert levels_for(w, ["a", "b", "a"]) == ("a", "b", "example.com/block")


def _pod(name: str, labels: dict[str, str], key: str = CLIQUE, node: str = "") -> PodRecord:
    sel = Selector(
        match_expressions=(Requirement("lws", "In", (labels.get("lws", ""),)),),
    )
    return PodRecord(
        "ns",
        name,
        node=node,
        gpus=4,
        labels=tuple(sorted(labels.items())),
        constraints=Constraints(affinity=(PodTerm(key, sel),)),
    )


def test_a_required_pod_affinity_group_is_a_gang() -> None:
    pods = [_pod(f"g{i}", {"lws": "a"}) for i in range(4)]
    pods.append(_pod("h0", {"lws": "b"}))  # a group of one: no gang
    pods.append(_pod("k0", {"lws": "c"}, key="kubernetes.io/hostname"))
    pods.append(_pod("k1", {"lws": "c"}, key="kubernetes.io/hostname"))
    pods.append(_pod("x", {"lws": "zzz-other"}))
    got = gangs_of(pods)
    assert set(got) == {"ns/g0", "ns/g1", "ns/g2", "ns/g3"}
    assert got["ns/g0"] == Gang(4, CLIQUE)


def test_snapshot_and_workload_files_carry_labels_and_gangs() -> None:
    snap = twelve_nodes([0])
    again = load_snapshot(snapshot_to_json(snap))
    assert again == snap
    gang = {"pods": 4, "key": CLIQUE}
    w = load_workload({"shapes": [{"gpus": 4, "gpu_milli": 1000, "weight": 1, "gang": gang}]})
    assert w.shapes[0].gang == Gang(4, CLIQUE)
    with pytest.raises(ValueError, match=r"gang\.pods"):
        load_workload({"shapes": [{"gpus": 4, "weight": 1, "gang": {"pods": 0, "key": "k"}}]})


@st.composite
def clusters(draw: st.DrawFn) -> tuple[Snapshot, dict[str, dict[str, str]], Workload]:
    nodes = []
    labels: dict[str, dict[str, str]] = {}
    gid = 0
    for i in range(draw(st.integers(1, 10))):
        policy: PolicyName = draw(st.sampled_from(["none", "single-numa-node"]))
        zones = []
        for numa in range(draw(st.integers(1, 2))):
            count = draw(st.integers(0, 4))
            gpus = tuple(Gpu(gid + k, draw(st.sampled_from([0, 0, 1000]))) for k in range(count))
            gid += len(gpus)
            cpu = draw(st.sampled_from([8000, 32000]))
            zones.append(
                Zone(
                    numa,
                    cpu_milli=cpu,
                    cpu_milli_used=draw(st.sampled_from([0, 4000, cpu])),
                    memory_mib=1 << 20,
                    gpus=gpus,
                )
            )
        name = f"n{i}"
        nodes.append(
            Node(
                name,
                "H100",
                topology_policy=policy,
                cpu_manager_policy="none",
                zones=tuple(zones),
            )
        )
        lab = {}
        for key, values in ((CLIQUE, ["a.1", "a.2", "b.1"]), ("leaf", ["l1", "l2"])):
            v = draw(st.sampled_from([None, *values]))
            if v is not None:
                lab[key] = v
        labels[name] = lab
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        g = draw(st.integers(1, 4))
        gang = draw(st.sampled_from([None, CLIQUE, "leaf"]))
        shapes.append(
            Shape(
                cpu_milli=draw(st.sampled_from([1000, 8000])),
                gpus=g,
                gpu_milli=1000,
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
                gang=None if gang is None else Gang(draw(st.integers(1, 6)), gang),
            )
        )
    return Snapshot(tuple(nodes)), labels, Workload(tuple(shapes))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_the_core_agrees_with_the_twin(
    case: tuple[Snapshot, dict[str, dict[str, str]], Workload],
) -> None:
    snap, labels, w = case
    levels = (CLIQUE, "leaf")
    got = fabric_score(FragmentationModel(snap), w, levels, labels)
    want = ref.fabric(snap.nodes, w, levels, labels)
    assert got.node_domain_split == pytest.approx(want.node_domain_split)
    assert got.node_no_domain == pytest.approx(want.node_no_domain)
    assert {(d.level, d.name): d.idle_gpu_milli for d in got.domains} == pytest.approx(
        {k: v[0] for k, v in want.domains.items()}
    )
    assert {(d.level, d.name): d.fragment_gpu_milli for d in got.domains} == pytest.approx(
        {k: v[1] for k, v in want.domains.items()}
    )
    gang_levels = [g.level for g in got.gangs]
    for d in got.domains:
        caps = want.capacity[(d.level, d.name)]
        assert [c for c, lv in zip(d.capacity, gang_levels, strict=True) if lv == d.level] == [
            c for c, lv in zip(caps, gang_levels, strict=True) if lv == d.level
        ]


def test_kueue_and_kai_annotations_say_the_gang() -> None:
    from pyctl.cluster.gangs import pod_gang

    kueue = {
        "kueue.x-k8s.io/podset-required-topology": CLIQUE,
        "kueue.x-k8s.io/pod-group-total-count": "4",
    }
    g = pod_gang(kueue, {"kueue.x-k8s.io/pod-group-name": "tp"}, "", "")
    assert g is not None
    assert (g.key, g.group, g.size) == (CLIQUE, "tp", 4)
    g = pod_gang({"kai.scheduler/topology-required-placement": "leaf"}, {}, "Job", "j")
    assert g is not None
    assert (g.key, g.group, g.size) == ("leaf", "Job/j", 0)
    # hostile values: no gang, or an unknown size; never an error
    assert pod_gang({"kueue.x-k8s.io/podset-required-topology": "a b"}, {}, "Job", "j") is None
    assert pod_gang({"kueue.x-k8s.io/podset-required-topology": "k" * 400}, {}, "J", "j") is None
    assert pod_gang({"kueue.x-k8s.io/podset-required-topology": CLIQUE}, {}, "", "") is None
    bad = {**kueue, "kueue.x-k8s.io/pod-group-total-count": "9" * 40}
    g = pod_gang(bad, {}, "Job", "j")
    assert g is not None
    assert g.size == 0
    # three pods of a group of four said: a gang of four
    pods = [PodRecord("ns", f"p{i}", gpus=4, gang=PodGang(CLIQUE, "tp", 4)) for i in range(3)] + [
        PodRecord("ns", "alone", gpus=4, gang=PodGang(CLIQUE, "solo", 0))
    ]
    got = gangs_of(pods)
    assert set(got) == {"ns/p0", "ns/p1", "ns/p2"}
    assert got["ns/p0"] == Gang(4, CLIQUE)


def test_kueue_podset_slices_are_gangs_of_the_slice_size() -> None:
    """A Job of 8 pods with `podset-slice-required-topology` on the clique and
    `podset-slice-size: 4`: every pod is in a gang of 4 at the clique (each slice in one domain;
    which pods make a slice is Kueue's). A slice of one pod, or of no size, binds none; the
    preferred topology is no gang; a gated pod of a slice waits for Kueue like a required one."""
    from pyctl.cluster.gangs import kueue_waiting, pod_gang

    sliced = {
        "kueue.x-k8s.io/podset-slice-required-topology": CLIQUE,
        "kueue.x-k8s.io/podset-slice-size": "4",
    }
    g = pod_gang(sliced, {}, "Job", "train")
    assert g == PodGang(CLIQUE, "Job/train", 4, slice=True)
    pods = [PodRecord("ns", f"p{i}", gpus=8, gang=g) for i in range(8)]
    got = gangs_of(pods)
    assert len(got) == 8
    assert set(got.values()) == {Gang(4, CLIQUE)}
    one = {**sliced, "kueue.x-k8s.io/podset-slice-size": "1"}
    assert pod_gang(one, {}, "Job", "train") is None
    unsized = {"kueue.x-k8s.io/podset-slice-required-topology": CLIQUE}
    assert pod_gang(unsized, {}, "Job", "train") is None
    preferred = {"kueue.x-k8s.io/podset-preferred-topology": CLIQUE}
    assert pod_gang(preferred, {}, "Job", "train") is None
    # with the whole group's required topology too: the whole group (the larger demand)
    both = {**sliced, "kueue.x-k8s.io/podset-required-topology": "network.topology.nvidia.com/leaf"}
    g = pod_gang(both, {}, "Job", "train")
    assert g is not None
    assert (g.key, g.slice) == ("network.topology.nvidia.com/leaf", False)
    assert kueue_waiting(["kueue.x-k8s.io/admission"], sliced)
    assert not kueue_waiting(["kueue.x-k8s.io/admission"], preferred)


def test_a_leaderworkerset_group_is_a_gang_of_its_size() -> None:
    """LWS copies `exclusive-topology` onto its pods with the group's key label and the group's
    size (leader and workers): the gang is the group, of that size before all its pods exist."""
    from pyctl.cluster.gangs import pod_gang

    lws = {
        "leaderworkerset.sigs.k8s.io/exclusive-topology": CLIQUE,
        "leaderworkerset.sigs.k8s.io/size": "4",
    }
    labels = {"leaderworkerset.sigs.k8s.io/group-key": "9f2c1e"}
    g = pod_gang(lws, labels, "StatefulSet", "serve-0")
    assert g is not None
    assert (g.key, g.group, g.size) == (CLIQUE, "9f2c1e", 4)
    # without the group's key label: the owner (the group's StatefulSet)
    g = pod_gang(lws, {}, "StatefulSet", "serve-0")
    assert g is not None
    assert g.group == "StatefulSet/serve-0"
    # the leader and one worker created so far: a gang of four all the same
    pods = [PodRecord("ns", n, gpus=4, gang=PodGang(CLIQUE, "9f2c1e", 4)) for n in ("l", "w1")]
    assert gangs_of(pods)["ns/w1"] == Gang(4, CLIQUE)


def test_the_agents_nvlink_groups_are_the_nodes_link_groups() -> None:
    """The agent says GPUs 0-7 (NUMA 0: 0-3, 1: 4-7) form NVLink pairs (0,1) (2,3) (4,5) (6,7)
    and the kubelet put one pod on GPU 0 and one on GPU 4: for a 2-GPU shape that needs a pair,
    GPUs 1 and 5 are link_split (their pair is broken), the other four idle GPUs usable."""
    from pyctl.cluster import agent_topology as at
    from pyctl.cluster.translate import node_from_records
    from pyctl.core.fragmentation import score
    from tests.unit.test_agent_topology import PODS, UUIDS, _node

    value = at.encode(
        [(u, n, None) for u, n in zip(UUIDS, [0, 0, 0, 0, 1, 1, 1, 1], strict=True)],
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        {"ns/a": [0], "ns/b": [4]},
        0,
    )
    node = node_from_records(_node({at.ANNOTATION: value}), None, PODS, "single-numa-node")
    assert [g.link for z in node.zones for g in z.gpus] == [0, 0, 1, 1, 2, 2, 3, 3]
    pair = Workload((Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, link_group=True),))
    got = score(Snapshot((node,)), pair).nodes[0]
    assert got.idle_gpu_milli == 6000
    assert got.categories["link_split"] == pytest.approx(2000.0)
    assert got.fragment_gpu_milli == pytest.approx(2000.0)
    # without the agent's view (the rules): no links known, no link_split
    rules = node_from_records(_node({}), None, PODS, "single-numa-node")
    assert score(Snapshot((rules,)), pair).nodes[0].categories["link_split"] == 0.0


def test_pyctl_score_on_a_dump_shows_each_clique(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kubectl dump of the three-clique case: twelve 4-GPU nodes, two full per clique, a gang
    of four 4-GPU pods with required pod affinity on the clique key (two running in clique 0,
    two pending), one node with a malformed clique value and one with none."""
    from tests.unit.test_kube_dump import node, pod

    items = [
        node(f"n{i:02}", 4, {CLIQUE: f"3f1c2a.{i // 4}", "kubernetes.io/hostname": f"n{i:02}"})
        for i in range(12)
    ]
    items += [node("odd", 4, {CLIQUE: "-bad-"}), node("bare", 4)]
    for n in ("n00", "n01", "n04", "n05", "n08", "n09"):
        items += [pod(f"s-{n}-{j}", n, gpus=1) for j in range(4)]
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"gang": "tp"}}, "topologyKey": CLIQUE}
            ]
        }
    }
    for j, where in enumerate(["n02", "n03", None, None]):
        g = pod(f"g{j}", where, gpus=4)
        g["metadata"]["labels"] = {"gang": "tp"}
        g["spec"]["affinity"] = affinity
        items.append(g)
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["score", str(f), "--json"]) == 0
    fab = json.loads(capsys.readouterr().out)["fabric"]
    (level,) = fab["levels"]
    assert level["level"] == CLIQUE
    assert (level["domains"], level["whole"], level["malformed"]) == (3, 0, 1)
    assert level["no_domain_nodes"] == 2
    (gang,) = fab["gangs"]
    assert (gang["pods"], gang["level"], gang["gpus_per_pod"]) == (4, CLIQUE, 4)
    by_name = {d["domain"]: d for d in fab["domains"]}
    # cliques 1 and 2 each have two empty nodes: room for two of the four pods, so their 8
    # idle GPUs are domain_split (weighted by the gang's share of M); clique 0 has none idle
    assert by_name["3f1c2a.0"]["idle_gpu_milli"] == 0
    assert by_name["3f1c2a.1"]["capacity"] == [2]
    assert by_name["3f1c2a.1"]["fragment_gpu_milli"] > 0
    assert fab["domain_split_gpu_milli"] == pytest.approx(
        by_name["3f1c2a.1"]["fragment_gpu_milli"] + by_name["3f1c2a.2"]["fragment_gpu_milli"]
    )
    # the two nodes in no clique: their idle GPUs are no_domain for the gang
    assert set(fab["node_no_domain"]) == {"odd", "bare"}


def test_the_levels_and_the_interval_are_settings() -> None:
    from pyctl.app.config import ConfigError, load_config

    c = load_config(env={"PYCTL_FABRIC_LEVELS": "example.com/rack, " + CLIQUE})
    assert c.fabric.levels == ("example.com/rack", CLIQUE)
    assert load_config(env={}).fabric.levels[0] == CLIQUE
    with pytest.raises(ConfigError, match="fabric_interval"):
        load_config(env={"PYCTL_FABRIC_INTERVAL": "0"})
    with pytest.raises(ConfigError, match="fabric_levels"):
        load_config(env={"PYCTL_FABRIC_LEVELS": ",".join(f"k{i}" for i in range(17))})


def _four_gpu_nodes(
    domain: dict[str, str], replicas: dict[str, int], labelled: bool
) -> tuple[dict[str, NodeRecord], list[PodRecord]]:
    """4-GPU nodes (each labelled with its clique `domain[n]` when `labelled`) and `replicas[n]`
    running one-GPU replicas of one Deployment on each."""
    nodes = {
        n: NodeRecord(
            n,
            gpu_model="H100-SXM5-80GB",
            cpu_milli=64000,
            memory_mib=1 << 20,
            gpus=4,
            labels=((CLIQUE, d),) if labelled else (),
        )
        for n, d in domain.items()
    }
    pods = [
        PodRecord(
            "ns",
            f"r-{n}-{k}",
            f"u-{n}-{k}",
            node=n,
            phase="Running",
            cpu_milli=1000,
            gpus=1,
            owner_kind="ReplicaSet",
            owner_name="web",
        )
        for n, c in replicas.items()
        for k in range(c)
    ]
    return nodes, pods


def _gang_cluster(gang: bool, volcano: bool = False) -> tuple[CompactionPlan, dict[str, str]]:
    """Twelve 4-GPU nodes in cliques a (n00-n03), b (n04-n07), c (n08-n11). Clique a: two
    one-GPU replicas on each node (8 GPUs idle, 8 to free for a gang of 4 x 4 GPUs); b: three
    on each (4 idle); c: one on n08 and four on each other node (3 idle, 13 to free). No node has
    4 GPUs free: the group's first pod is unschedulable. The single cheapest node to free is n08
    (one eviction), in the clique that could hold the gang only after 12 more. With `volcano`,
    the cliques are tier-1 HyperNodes (no node label says them) and the gang a Volcano PodGroup
    with a hard `networkTopology` at tier 1."""
    from pyctl.cluster.translate import models_of
    from pyctl.core.policy import PlanLimits
    from pyctl.workflows.compaction import plan_compaction

    cliques = {f"n{i:02}": "abc"[i // 4] for i in range(12)}
    per = {"a": 2, "b": 3}
    counts = {n: per.get(c, 1 if n == "n08" else 4) for n, c in cliques.items()}
    nodes, pods = _four_gpu_nodes(cliques, counts, labelled=not volcano)
    if volcano:
        group = [PodRecord("ns", f"g{i}", gpus=4, pod_group="pg") for i in range(4)]
    elif gang:
        group = [_pod(f"g{i}", {"lws": "grp"}) for i in range(4)]
    else:
        group = [PodRecord("ns", "g0", gpus=4)]
    pending = [
        msgspec.structs.replace(
            q, uid=f"u-{q.name}", phase="Pending", unschedulable=True, cpu_milli=1000
        )
        for q in group
    ]
    models = models_of(nodes.values(), (), pods)
    work = Workload((Shape(cpu_milli=1000, gpus=4, gpu_milli=1000),))
    tier1 = "volcano.sh/hypernode-tier-1"
    plan = plan_compaction(
        models, nodes, [*pods, *pending], (), work, pending=pending[:1],
        limits=PlanLimits(max_moves=4, rescue_depth=4),
        pod_groups={"ns/pg": VolcanoGang(tier1, 4)} if volcano else None,
        domain_labels={n: {tier1: f"hn-{c}"} for n, c in cliques.items()} if volcano else None,
    )  # fmt: skip
    return plan, cliques


def test_a_gangs_rescue_makes_room_in_the_domain_cheapest_to_free_for_the_whole_gang() -> None:
    plan, cliques = _gang_cluster(gang=True)
    [rescue] = plan.rescues
    assert cliques[rescue.node] == "a"  # two evictions, in the clique that holds the gang soonest
    assert len(rescue.moves) == 2
    assert plan.gang_domains == {
        "ns/g0": (
            "gang of 4 x 4 GPUs in one nvidia.com/gpu.clique domain, none running yet: room made "
            "in a (8 GPUs idle, 8 to free; the cheapest of 3 domain(s) to free for the whole gang)"
        )
    }


def test_a_volcano_gangs_rescue_makes_room_in_one_hypernode() -> None:
    """The same cluster with the cliques as tier-1 HyperNodes and the gang a Volcano PodGroup
    (hard `networkTopology`, tier 1): the same domain, named by its HyperNode."""
    plan, cliques = _gang_cluster(gang=True, volcano=True)
    [rescue] = plan.rescues
    assert cliques[rescue.node] == "a"
    assert len(rescue.moves) == 2
    assert plan.gang_domains == {
        "ns/g0": (
            "gang of 4 x 4 GPUs in one volcano.sh/hypernode-tier-1 domain, none running yet: room "
            "made in hn-a (8 GPUs idle, 8 to free; the cheapest of 3 domain(s) to free for the "
            "whole gang)"
        )
    }


def _running_gang(running_on: tuple[str, ...], volcano: bool = True) -> CompactionPlan:
    """Four 4-GPU nodes, n00 and n01 in domain a, n02 and n03 in b (tier-1 HyperNodes, or clique
    labels); n01 holds two one-GPU replicas, n02 one, n03 four (none if the gang runs there). A
    gang of pods x 4 GPUs (a Volcano PodGroup with a hard `networkTopology` at tier 1, minMember
    2, or pods of required affinity on the clique) runs a pod on each node of `running_on` and
    has one pending pod, g1. The cheapest node to free is n02 (one eviction), in domain b."""
    from pyctl.cluster.translate import models_of
    from pyctl.core.policy import PlanLimits
    from pyctl.workflows.compaction import plan_compaction

    domain = {"n00": "a", "n01": "a", "n02": "b", "n03": "b"}
    tier1 = "volcano.sh/hypernode-tier-1"
    replicas = {"n01": 2, "n02": 1, "n03": 0 if "n03" in running_on else 4}
    nodes, pods = _four_gpu_nodes(domain, replicas, labelled=not volcano)

    def member(name: str, node: str) -> PodRecord:
        if volcano:
            return PodRecord("ns", name, f"u-{name}", node=node, gpus=4, pod_group="pg")
        return msgspec.structs.replace(_pod(name, {"lws": "grp"}, node=node), uid=f"u-{name}")

    group = [
        msgspec.structs.replace(member(f"g{i}", n), phase="Running", cpu_milli=1000)
        for i, n in enumerate(running_on, start=2)
    ]
    g1 = msgspec.structs.replace(
        member("g1", ""), phase="Pending", unschedulable=True, cpu_milli=1000
    )
    models = models_of(nodes.values(), (), [*pods, *group])
    return plan_compaction(
        models, nodes, [*pods, *group, g1], (), Workload((Shape(cpu_milli=1000, gpus=4),)),
        pending=[g1], limits=PlanLimits(max_moves=4, rescue_depth=4),
        pod_groups={"ns/pg": VolcanoGang(tier1, 2)} if volcano else None,
        domain_labels={n: {tier1: f"hn-{d}"} for n, d in domain.items()} if volcano else None,
    )  # fmt: skip


def test_a_gangs_pending_pod_gets_room_where_its_running_pods_are() -> None:
    """A Volcano PodGroup's topology is no pod constraint the scheduler's filters (NodeFit) read:
    with one pod running in HyperNode hn-a, the rescue of the next frees n01 there (two
    evictions), not n02 in hn-b (one), where Volcano would never put it."""
    plan = _running_gang(("n00",))
    [rescue] = plan.rescues
    assert rescue.node == "n01"
    assert len(rescue.moves) == 2
    assert plan.gang_domains == {
        "ns/g1": (
            "gang of 2 pods in one volcano.sh/hypernode-tier-1 domain, 1 running in hn-a: room "
            "made there only"
        )
    }
    # a gang of required pod affinity: NodeFit confines it to the same domain, and so does this
    plan = _running_gang(("n00",), volcano=False)
    [rescue] = plan.rescues
    assert rescue.node == "n01"
    assert plan.gang_domains["ns/g1"].endswith("1 running in a: room made there only")


def test_a_gang_already_split_over_domains_gets_no_room() -> None:
    """Its running pods in two HyperNodes: no placement puts it in one domain again, so no
    eviction is made for its pending pod, and the plan says why."""
    plan = _running_gang(("n00", "n03"))
    assert plan.rescues == ()
    assert "ns/g1" in plan.unrescued
    assert plan.gang_domains == {
        "ns/g1": (
            "gang of 3 pods in one volcano.sh/hypernode-tier-1 domain: its running pods are in "
            "domains hn-a, hn-b; no room made"
        )
    }


def _partitions(
    group_hard: bool,
    replicas: dict[str, int] | None = None,
    running: bool = True,
) -> CompactionPlan:
    """Eight 4-GPU nodes: racks (tier-1 HyperNodes) r1 {n00, n01}, r2 {n02, n03} in block b1
    (tier 2), r3 {n04, n05}, r4 {n06, n07} in block b2. A Volcano PodGroup of 4 x 4-GPU workers
    in partitions of two, each partition in one rack (`subGroupPolicy`), the whole group in one
    block when `group_hard`: partition 0 runs on r1 (if `running`, else it is pending too);
    partition 1's pod p1a is pending. One-GPU `replicas` (by default two on each node of r2,
    one on n04, four on each node of r4: the rack cheapest to free for a partition is r3, one
    eviction, in the other block)."""
    from pyctl.cluster.gangs import SubGroupGang
    from pyctl.cluster.translate import models_of
    from pyctl.core.policy import PlanLimits
    from pyctl.workflows.compaction import plan_compaction

    t1, t2 = "volcano.sh/hypernode-tier-1", "volcano.sh/hypernode-tier-2"
    rack = {f"n{i:02}": f"r{i // 2 + 1}" for i in range(8)}
    block = {n: "b1" if r in ("r1", "r2") else "b2" for n, r in rack.items()}
    if replicas is None:
        replicas = {"n02": 2, "n03": 2, "n04": 1, "n06": 4, "n07": 4}
    nodes, pods = _four_gpu_nodes(rack, replicas, labelled=False)
    part = "volcano.sh/partition-id"

    def worker(name: str, p: str, node: str = "") -> PodRecord:
        return PodRecord("ns", name, f"u-{name}", node=node, cpu_milli=1000, gpus=4,
                         pod_group="pg", labels=((part, p),),
                         phase="Running" if node else "Pending",
                         unschedulable=not node)  # fmt: skip

    on = ("n00", "n01") if running else ("", "")
    group = [worker("p0a", "0", on[0]), worker("p0b", "0", on[1]), worker("p1a", "1")]
    pending = [g for g in group if not g.node]
    models = models_of(nodes.values(), (), [*pods, *(g for g in group if g.node)])
    sub = SubGroupGang("part", None, (part,), t1, 2)
    return plan_compaction(
        models, nodes, [*pods, *group], (), Workload((Shape(cpu_milli=1000, gpus=4),)),
        pending=pending[-1:], limits=PlanLimits(max_moves=4, rescue_depth=4),
        pod_groups={"ns/pg": VolcanoGang(t2 if group_hard else "", 4, (sub,))},
        domain_labels={n: {t1: rack[n], t2: block[n]} for n in rack},
    )  # fmt: skip


def test_a_volcano_sub_groups_first_rescue_picks_the_block_then_the_rack() -> None:
    """No pod of the PodGroup runs yet: the block cheapest to free for the whole PodGroup (b1,
    six GPUs to free, against ten in b2) first, then the rack in it (r1 by name of two with
    three to free), not the rack cheapest to free for the partition alone (r3, two to free, in
    b2, which could hold the rest only after eight more)."""
    replicas = {"n00": 1, "n01": 2, "n02": 1, "n03": 2, "n04": 1, "n05": 1, "n06": 4, "n07": 4}
    plan = _partitions(group_hard=True, replicas=replicas, running=False)
    [rescue] = plan.rescues
    assert rescue.node == "n00"
    why = plan.gang_domains["ns/p1a"]
    assert why.startswith(
        "gang of 4 x 4 GPUs in one volcano.sh/hypernode-tier-2 domain, none running yet: room "
        "made in b1 (10 GPUs idle, 6 to free;"
    ), why
    inner = "gang of 2 x 4 GPUs in one volcano.sh/hypernode-tier-1 domain, none running yet: "
    assert f"; {inner}room made in r1 (5 GPUs idle, 3 to free;" in why, why
    # the PodGroup's own topology soft: the partition's cheapest rack, r3
    plan = _partitions(group_hard=False, replicas=replicas, running=False)
    [rescue] = plan.rescues
    assert rescue.node in ("n04", "n05")


def test_a_volcano_sub_groups_rescue_keeps_to_its_podgroups_domain() -> None:
    """The partition's rack is chosen among the racks of the block where the PodGroup runs (r2,
    four GPUs to free), not the cheapest anywhere (r3, in the other block), where Volcano would
    not put the PodGroup's pod."""
    plan = _partitions(group_hard=True)
    [rescue] = plan.rescues
    assert rescue.node in ("n02", "n03")
    assert len(rescue.moves) == 2
    why = plan.gang_domains["ns/p1a"]
    assert why.startswith(
        "gang of 4 pods in one volcano.sh/hypernode-tier-2 domain, 2 running in b1: room made "
        "there only; gang of 2 x 4 GPUs in one volcano.sh/hypernode-tier-1 domain, none running "
        "yet: room made in r2"
    ), why
    # the PodGroup's own topology soft: r3, where n05 holds the pod now (no eviction)
    plan = _partitions(group_hard=False)
    assert plan.rescues == ()
    assert "room made in r3" in plan.gang_domains["ns/p1a"]


def test_without_a_gang_the_rescue_frees_the_cheapest_node() -> None:
    """The control: the same pod without the gang's affinity is rescued on n08 (one eviction)."""
    plan, _ = _gang_cluster(gang=False)
    [rescue] = plan.rescues
    assert rescue.node == "n08"
    assert plan.gang_domains == {}


def _kueue_pod(name: str, gates: list[str], node: str = "", topology: bool = True) -> PodRecord:
    """A pod of a Kueue pod group of 4 x 4 GPUs as its webhook leaves it, decoded from a watch
    line: gated, PodScheduled=False with reason SchedulingGated (the API server's)."""
    from pyctl.cluster.kube.decode import decode_watch_line

    annotations = {"kueue.x-k8s.io/pod-group-total-count": "4"}
    if topology:
        annotations["kueue.x-k8s.io/podset-required-topology"] = CLIQUE
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"u-{name}",
            "resourceVersion": "7",
            "labels": {
                "kueue.x-k8s.io/queue-name": "gpus",
                "kueue.x-k8s.io/pod-group-name": "tp",
            },
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "schedulingGates": [{"name": g} for g in gates],
            "containers": [
                {"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "4"}}}
            ],
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
            ],
        },
    }
    _, rec, _ = decode_watch_line("Pod", json.dumps({"type": "ADDED", "object": pod}).encode())
    assert isinstance(rec, PodRecord)
    return rec


def test_a_kueue_gated_pod_with_a_required_topology_is_pending() -> None:
    """Kueue holds its pods back with a scheduling gate until TAS finds the group room in one
    domain: no scheduler tries them, so no Unschedulable condition ever comes. Such a pod is
    pending for pyctl; a Kueue-gated pod without a required topology (it waits for quota, which
    no eviction gives), one past admission (only TAS's own gate left) and a bound pod are not."""
    waiting = _kueue_pod("g0", ["kueue.x-k8s.io/admission", "kueue.x-k8s.io/topology"])
    assert waiting.unschedulable
    assert waiting.unschedulable_message == (
        "waiting for Kueue to admit it (scheduling gate kueue.x-k8s.io/admission, "
        "nvidia.com/gpu.clique)"
    )
    assert waiting.gang == PodGang(CLIQUE, "tp", 4)
    assert not _kueue_pod("q0", ["kueue.x-k8s.io/admission"], topology=False).unschedulable
    assert not _kueue_pod("a0", ["kueue.x-k8s.io/topology"]).unschedulable
    assert not _kueue_pod("o0", ["example.com/other"]).unschedulable
    assert not _kueue_pod("b0", ["kueue.x-k8s.io/admission"], node="n00").unschedulable


def _kueue_cluster(
    evicted: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[PodRecord], list[PodRecord]]:
    """The e2e's cluster: twelve 4-GPU nodes in three cliques (n00-n03 uuid-1.0, ...), two full
    nodes per clique (four one-GPU replicas each; none on the nodes in `evicted`), and a Kueue
    pod group of 4 x 4 GPUs, all four gated."""

    nodes = {
        f"n{i:02}": NodeRecord(
            f"n{i:02}",
            gpu_model="H100-SXM5-80GB",
            cpu_milli=64000,
            memory_mib=1 << 20,
            gpus=4,
            labels=((CLIQUE, f"uuid-1.{i // 4}"),),
        )
        for i in range(12)
    }
    full = [n for n in ("n00", "n01", "n04", "n05", "n08", "n09") if n not in evicted]
    replica = PodRecord(
        "ns", "r", phase="Running", cpu_milli=100, gpus=1, owner_kind="ReplicaSet",
        owner_name="small",
    )  # fmt: skip
    pods = [
        msgspec.structs.replace(replica, name=f"r-{n}-{k}", uid=f"u-{n}-{k}", node=n)
        for n in full
        for k in range(4)
    ]
    group = [_kueue_pod(f"g{i}", ["kueue.x-k8s.io/admission"]) for i in range(4)]
    return nodes, pods, group


def _plan_kueue(
    nodes: dict[str, Any],
    pods: list[PodRecord],
    pending: list[PodRecord],
    group: list[PodRecord],
    reserved: dict[str, str],
) -> CompactionPlan:
    from pyctl.cluster.translate import models_of
    from pyctl.core.policy import PlanLimits
    from pyctl.workflows.compaction import plan_compaction

    models = models_of(nodes.values(), (), pods)
    work = Workload((Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, gang=Gang(4, CLIQUE)),))
    return plan_compaction(
        models, nodes, [*pods, *group], (), work, pending=pending,
        limits=PlanLimits(max_moves=4, rescue_depth=4), reserved=reserved,
    )  # fmt: skip


def test_a_kueue_gated_group_is_rescued_inside_one_domain() -> None:
    """The planner places two pods of the gated group on the empty nodes of the clique it chose
    for the gang and makes room for the third by evicting the replicas of a node of that same
    clique (one rescue with evictions per plan: a later round does the fourth's). The gate keeps
    the two that fit from taking their room, so the plan holds it for them: a rescue with no
    evictions on each empty node of the clique."""
    nodes, pods, group = _kueue_cluster()
    assert all(p.unschedulable and p.gated for p in group)
    plan = _plan_kueue(nodes, pods, group, group, {})
    rescue, *holds = plan.rescues
    assert rescue.node in ("n00", "n01")  # clique uuid-1.0: the tie goes to the first by name
    assert len(rescue.moves) == 4
    # the replicas' replacements go to the other cliques (the empty nodes of this one are the
    # room of the group's first two pods)
    assert all(nodes[m.to_node].labels != nodes[rescue.node].labels for m in rescue.moves)
    assert {(h.pending, h.node, h.moves) for h in holds} == {
        ("ns/g0", "n02", ()),
        ("ns/g1", "n03", ()),
    }
    assert set(plan.gang_domains) == {"ns/g0", "ns/g1", "ns/g2", "ns/g3"}
    assert "room made in uuid-1.0 (8 GPUs idle, 8 to free" in plan.gang_domains["ns/g0"]
    # the same pods refused by a scheduler (no gate) take the room they fit in themselves
    ungated = [msgspec.structs.replace(p, gated=False) for p in group]
    plan = _plan_kueue(nodes, pods, ungated, ungated, {})
    assert [len(r.moves) for r in plan.rescues] == [4]


@pytest.mark.parametrize("evicted", [(), ("n00",)], ids=["evicting", "evicted"])
def test_the_next_round_keeps_to_the_domain_a_rescue_of_the_gang_holds(
    evicted: tuple[str, ...],
) -> None:
    """Rescues keep n00 (its replicas still there, or gone), n02 and n03 for pods of the group.
    No pod of the group runs (Kueue admits it only whole), so the next round chooses the gang's
    domain again: the kept nodes are no destination, but they still count for uuid-1.0, and the
    rescue of the last pod frees n01 there; not a node of another clique, which uuid-1.0 without
    them could not hold the gang."""
    nodes, pods, group = _kueue_cluster(evicted)
    kept = {"n00": "ns/g0", "n02": "ns/g1", "n03": "ns/g2"}
    plan = _plan_kueue(nodes, pods, group[3:], group, kept)
    [rescue] = plan.rescues
    assert rescue.node == "n01"
    assert "room made in uuid-1.0" in plan.gang_domains["ns/g3"]
    # the same round had the nodes been kept for pods of no gang: uuid-1.0 cannot hold it
    plan = _plan_kueue(nodes, pods, group[3:], group, dict.fromkeys(kept, "ns/other"))
    [rescue] = plan.rescues
    assert nodes[rescue.node].labels != nodes["n00"].labels


@pytest.mark.parametrize("gang", ["kueue", "volcano", ""])
def test_a_running_pod_of_a_gang_is_not_moved(gang: str) -> None:
    """Two 4-GPU nodes of one clique: a one-GPU pod on n0, three on n1; M asks for 4 GPUs, so
    defragmentation moves n0's pod to n1 (frees a whole node). When n0's pod and one of n1's say
    they are a Kueue gang (or a Volcano PodGroup that is a gang), the move is refused (it could
    take a gang's pod out of its domain); without the gang, the control, it is planned."""
    from pyctl.cluster.translate import models_of
    from pyctl.workflows.compaction import GANG_KEPT, plan_compaction

    nodes = {
        n: NodeRecord(n, gpu_model="H100-SXM5-80GB", cpu_milli=64000, memory_mib=1 << 20, gpus=4,
                      labels=((CLIQUE, "a"),))
        for n in ("n0", "n1")
    }  # fmt: skip
    said = PodGang(CLIQUE, "tp", 2) if gang == "kueue" else None
    group = "tp" if gang == "volcano" else ""
    pods = [
        PodRecord("ns", "g0", "u-g0", node="n0", phase="Running", cpu_milli=1000, gpus=1,
                  owner_kind="ReplicaSet", owner_name="tp", gang=said, pod_group=group),
        PodRecord("ns", "g1", "u-g1", node="n1", phase="Running", cpu_milli=1000, gpus=1,
                  owner_kind="ReplicaSet", owner_name="tp", gang=said, pod_group=group),
        *(
            PodRecord("ns", f"r{i}", f"u-r{i}", node="n1", phase="Running", cpu_milli=1000,
                      gpus=1, owner_kind="ReplicaSet", owner_name="web")
            for i in range(2)
        ),
    ]  # fmt: skip
    models = models_of(nodes.values(), (), pods)
    work = Workload((Shape(cpu_milli=1000, gpus=4, gpu_milli=1000),))
    groups = {"ns/tp": VolcanoGang("volcano.sh/hypernode-tier-1", 2)} if gang == "volcano" else None
    plan = plan_compaction(models, nodes, pods, (), work, pod_groups=groups)
    moved = [m.pod for m in plan.moves]
    if gang:
        assert moved == []
        assert plan.refused["ns/g0"] == GANG_KEPT
    else:
        assert moved == ["ns/g0"]
