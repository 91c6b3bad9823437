"""The fabric's sources besides node labels (docs/fabric.md): Kueue's and KAI's `Topology`
objects (their levels join the configured ones) and the NVIDIA DRA driver's
`ComputeDomainClique` objects (a node without `nvidia.com/gpu.clique` gets its clique from them),
decoded from good and hostile objects, merged, filled in, and changed at run time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pyctl.cli.main import main
from pyctl.cluster.bounds import MAX_CLIQUE_NODES, MAX_LEVELS, BoundsError
from pyctl.cluster.kube.decode import DecodeError, decode_object, decode_watch_line
from pyctl.cluster.kube.reflector import RESOURCES
from pyctl.cluster.records import (
    FABRIC_KINDS,
    KINDS,
    CliqueRecord,
    Event,
    KaiTopologyRecord,
    KueueTopologyRecord,
    NodeRecord,
    TopologyRecord,
    check_record,
    decode_record,
    encode_record,
    record_key,
    record_kind,
)
from pyctl.controller import fabric_sources as fs
from pyctl.controller.cache import ClusterCache
from pyctl.controller.reconcile import Reconciler
from pyctl.core.fabric import HOSTNAME, merge_levels
from pyctl.metrics import Metrics
from pyctl.model import Gang, Shape, Workload
from tests.fuzz.gen import compute_domain_clique, topology

CLIQUE = "nvidia.com/gpu.clique"
RACK = "example.com/rack"
BLOCK = "example.com/block"


def _enc(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


# -- decode -----------------------------------------------------------------------------------


def test_the_new_kinds_are_optional_resources_where_their_crds_serve_them() -> None:
    assert set(FABRIC_KINDS) <= set(KINDS)
    paths = {k: (RESOURCES[k].path(), RESOURCES[k].optional) for k in FABRIC_KINDS}
    assert paths == {
        "KueueTopology": ("/apis/kueue.x-k8s.io/v1beta2/topologies", True),
        "KaiTopology": ("/apis/kai.scheduler/v1alpha1/topologies", True),
        "ComputeDomainClique": ("/apis/resource.nvidia.com/v1beta1/computedomaincliques", True),
        "HyperNode": ("/apis/topology.volcano.sh/v1alpha1/hypernodes", True),
        "PodGroup": ("/apis/scheduling.volcano.sh/v1beta1/podgroups", True),
        "KueueWorkload": ("/apis/kueue.x-k8s.io/v1beta2/workloads", True),
    }
    # Kueue's older version, watched where v1beta2 is not served (test_reflector_watch.py)
    assert [v.path() for v in RESOURCES["KueueTopology"].versions()][1:] == [
        "/apis/kueue.x-k8s.io/v1beta1/topologies"
    ]
    assert RESOURCES["ComputeDomainClique"].path("nv") == (
        "/apis/resource.nvidia.com/v1beta1/namespaces/nv/computedomaincliques"
    )


@pytest.mark.parametrize(
    ("kind", "api", "cls"),
    [
        ("KueueTopology", "kueue.x-k8s.io/v1beta1", KueueTopologyRecord),
        ("KaiTopology", "kai.scheduler/v1alpha1", KaiTopologyRecord),
    ],
)
def test_a_topology_decodes_to_its_levels_widest_first(
    kind: Any, api: str, cls: type[TopologyRecord]
) -> None:
    rec = decode_object(kind, _enc(topology(api)))
    assert type(rec) is cls
    assert record_kind(rec) == kind
    assert rec == cls("fabric", "", ("network.topology.nvidia.com/spine", CLIQUE, HOSTNAME))
    # the same from a dump's parsed dict, and through the store
    assert decode_object(kind, topology(api)) == rec
    assert decode_record(kind, encode_record(rec)) == rec


def test_a_topologys_bad_levels_are_left_out_and_counted_the_object_stays() -> None:
    doc = topology("kueue.x-k8s.io/v1beta1")
    doc["spec"]["levels"] = [
        {"nodeLabel": BLOCK},
        {"nodeLabel": "not a key"},
        {"nodeLabel": "x" * 64},  # a name of 64 characters
        {"nodeLabel": "a" * 254 + "/rack"},  # a prefix of 254
        {"nodeLabel": 7},
        "rack",
        None,
        {},
        {"nodeLabel": BLOCK},  # twice
        *({"nodeLabel": f"example.com/l{i}"} for i in range(MAX_LEVELS)),
    ]
    rec = decode_object("KueueTopology", _enc(doc))
    assert isinstance(rec, KueueTopologyRecord)
    assert rec.levels == (BLOCK, *(f"example.com/l{i}" for i in range(MAX_LEVELS - 1)))
    assert rec.dropped == 8 + 1
    check_record(rec)
    # no levels at all, or null: an object with none
    doc["spec"]["levels"] = None
    assert decode_object("KaiTopology", _enc(doc)) == KaiTopologyRecord("fabric")


def test_a_topology_that_is_not_one_is_refused_with_its_reason() -> None:
    doc = topology("kai.scheduler/v1alpha1")
    doc["spec"] = "levels"
    with pytest.raises(DecodeError) as e:
        decode_object("KaiTopology", _enc(doc))
    assert e.value.reason == "malformed"
    assert e.value.tombstone == KaiTopologyRecord("fabric")  # a watch drops its last version
    doc = topology("kai.scheduler/v1alpha1")
    doc["spec"]["levels"] = [{"nodeLabel": "x"}] * 400_000
    with pytest.raises(DecodeError) as e:
        decode_object("KaiTopology", _enc(doc))
    assert e.value.reason == "too_large"


def test_a_clique_decodes_to_its_nodes_and_their_clique_id() -> None:
    rec = decode_object("ComputeDomainClique", _enc(compute_domain_clique()))
    assert rec == CliqueRecord(
        "nvidia-dra-driver-gpu", "cd-uid.uuid-a.1", "", (("a", "uuid-a.1"), ("c", "uuid-a.1"))
    )
    assert record_key(rec) == "nvidia-dra-driver-gpu/cd-uid.uuid-a.1"
    assert decode_record("ComputeDomainClique", encode_record(rec)) == rec
    line = json.dumps({"type": "MODIFIED", "object": compute_domain_clique()}).encode()
    assert decode_watch_line("ComputeDomainClique", line)[1] == rec


def test_a_cliques_bad_daemons_are_isolated_and_counted() -> None:
    doc = compute_domain_clique()
    good = doc["daemons"][0]
    doc["daemons"] = [
        good,
        {**good, "nodeName": "b", "cliqueID": "uuid-a.2"},  # another clique in one object: kept
        {**good},  # node a twice
        {**good, "nodeName": "Bad_Node"},
        {**good, "nodeName": "n" * 254},
        {**good, "nodeName": 5},
        {"cliqueID": "uuid-a.1"},
        {**good, "nodeName": "d", "cliqueID": ""},
        {**good, "nodeName": "d", "cliqueID": "u" * 64},
        {**good, "nodeName": "d", "cliqueID": "-x"},
        {**good, "nodeName": "d", "cliqueID": ["uuid-a.1"]},
        "a",
        None,
        [1, 2],
    ]
    rec = decode_object("ComputeDomainClique", _enc(doc))
    assert isinstance(rec, CliqueRecord)
    assert rec.members == (("a", "uuid-a.1"), ("b", "uuid-a.2"))
    assert rec.dropped == 12
    doc["daemons"] = None
    assert decode_object("ComputeDomainClique", _enc(doc)).members == ()  # type: ignore[union-attr]


def test_a_clique_naming_more_nodes_than_the_bound_keeps_the_first() -> None:
    doc = compute_domain_clique()
    doc["daemons"] = [
        {"nodeName": f"n{i}", "cliqueID": "uuid-a.1"} for i in range(MAX_CLIQUE_NODES + 76)
    ]
    rec = decode_object("ComputeDomainClique", _enc(doc))
    assert isinstance(rec, CliqueRecord)
    assert len(rec.members) == MAX_CLIQUE_NODES
    assert rec.members[-1][0] == f"n{MAX_CLIQUE_NODES - 1}"
    assert rec.dropped == 76
    # a stored record past the bounds (written by anyone) is refused, as every record is
    big = msgspec.structs.replace(rec, members=(*rec.members, ("z", "uuid-a.1")))
    with pytest.raises(BoundsError, match="daemons"):
        check_record(big)
    with pytest.raises(ValueError, match="members"):
        decode_record(
            "ComputeDomainClique",
            encode_record(msgspec.structs.replace(rec, members=(("n" * 300, "u.1"),))),
        )
    with pytest.raises(DecodeError) as e:
        decode_object("ComputeDomainClique", _enc({**doc, "daemons": {"nodeName": "a"}}))
    assert e.value.reason == "malformed"


# -- the level merge --------------------------------------------------------------------------


def test_levels_are_the_configured_then_the_objects_narrowest_first_without_the_hostname() -> None:
    lv = merge_levels(
        (CLIQUE, "topology.kubernetes.io/zone"),
        [
            ("kueue/a", ("topology.kubernetes.io/zone", BLOCK, RACK, CLIQUE, HOSTNAME)),
            ("kai/b", ("example.com/hall", BLOCK, "example.com/row")),
        ],
    )
    assert lv.levels == (
        CLIQUE,
        "topology.kubernetes.io/zone",
        RACK,
        BLOCK,
        "example.com/row",
        "example.com/hall",
    )
    assert lv.origin == {
        CLIQUE: "config",
        "topology.kubernetes.io/zone": "config",
        RACK: "kueue/a",
        BLOCK: "kueue/a",
        "example.com/row": "kai/b",
        "example.com/hall": "kai/b",
    }
    assert lv.dropped == 0


def test_levels_past_the_bound_are_counted_once_each() -> None:
    configured = [f"c/{i}" for i in range(MAX_LEVELS - 2)]
    lv = merge_levels(configured, [("kueue/a", ("x/a", "x/b", "x/c")), ("kai/b", ("x/a", "x/d"))])
    assert lv.levels == (*configured, "x/c", "x/b")
    assert lv.dropped == 2  # x/a (named twice) and x/d


def test_kueues_objects_come_before_kais_each_in_name_order() -> None:
    lv = fs.fabric_levels(
        (),
        [KueueTopologyRecord("z", levels=("k/z",)), KueueTopologyRecord("a", levels=("k/a",))],
        [KaiTopologyRecord("a", levels=("k/a", "kai/a"))],
    )
    assert lv.levels == ("k/a", "k/z", "kai/a")
    assert lv.origin == {"k/a": "kueue/a", "k/z": "kueue/z", "kai/a": "kai/a"}


# -- the clique fill-in -----------------------------------------------------------------------


def _clique(name: str, members: dict[str, str], dropped: int = 0, ns: str = "nv") -> CliqueRecord:
    return CliqueRecord(ns, name, "1", tuple(members.items()), dropped)


def test_the_objects_cliques_conflicts_and_what_was_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fill = fs.object_cliques(
        [
            _clique("cd1.u.1", {"n1": "u.1", "n2": "u.1"}, dropped=2),
            _clique("cd2.u.1", {"n1": "u.1", "n3": "u.1"}),  # another ComputeDomain, agreeing
            _clique("cd3.u.2", {"n2": "u.2", "n4": "u.2"}, dropped=1),  # n2 in two cliques
            _clique("cd4.u.3", {"n2": "u.3"}),
        ]
    )
    assert fill.cliques == {"n1": "u.1", "n3": "u.1", "n4": "u.2"}
    assert (fill.objects, fill.objects_left_out, fill.items_left_out, fill.conflicts) == (
        4,
        0,
        3,
        1,
    )
    monkeypatch.setattr(fs, "MAX_CLIQUE_OBJECTS", 2)
    fill = fs.object_cliques([_clique(f"cd{i}", {f"n{i}": "u.1"}) for i in (3, 1, 2)])
    assert fill.cliques == {"n1": "u.1", "n2": "u.1"}  # namespace/name order
    assert (fill.objects, fill.objects_left_out) == (2, 1)


def test_the_label_when_present_wins_over_the_objects() -> None:
    fill = fs.object_cliques([_clique("cd.u.1", {"a": "u.1", "b": "u.1", "c": "u.1"})])
    host = (HOSTNAME, "x")
    assert fs.node_labels([host], "a", fill) == ({HOSTNAME: "x", CLIQUE: "u.1"}, "filled")
    assert fs.node_labels([host, (CLIQUE, "u.1")], "b", fill) == (
        {HOSTNAME: "x", CLIQUE: "u.1"},
        "",
    )
    assert fs.node_labels([(CLIQUE, "u.9")], "c", fill) == ({CLIQUE: "u.9"}, "disagrees")
    assert fs.node_labels([host], "z", fill) == ({HOSTNAME: "x"}, "")


# -- through the controller's reconciler --------------------------------------------------------


def _node(name: str, labels: tuple[tuple[str, str], ...] = ()) -> NodeRecord:
    return NodeRecord(
        name,
        gpu_model="H100-SXM5-80GB",
        cpu_milli=64000,
        memory_mib=1 << 20,
        gpus=4,
        labels=labels,
    )


def _gang() -> Workload:
    return Workload(
        (
            Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
            Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, weight=0.5, gang=Gang(4, CLIQUE)),
        )
    )


class _Cluster:
    """Twelve 4-GPU nodes without a clique label, a reconciler with the 4 x 4-GPU gang in M."""

    def __init__(self, nodes: list[NodeRecord] | None = None) -> None:
        self.cache = ClusterCache()
        self.now = 0.0
        nodes = nodes if nodes is not None else [_node(f"n{i:02}") for i in range(12)]
        self.cache.apply([Event("ADDED", n) for n in nodes])
        self.r = Reconciler(self.cache, Metrics(), "t", workload=_gang())
        for n in self.cache.nodes:
            self.r.reconcile(n)

    def apply(self, *events: Event) -> None:
        for n in sorted(self.cache.apply(list(events))):
            self.r.reconcile(n)

    def domains(self, level: str = CLIQUE) -> dict[str, int]:
        self.now += 60  # the next pass
        f = self.r.fabric(self.now)
        assert f is not None
        return {d.name: d.nodes for d in f.domains if d.level == level}

    def metric(self, name: str, **labels: str) -> float | None:
        return self.r.metrics.registry.get_sample_value(name, {"cluster": "t", **labels})


def _cliques(split: dict[str, list[int]]) -> list[Event]:
    return [
        Event(
            "ADDED",
            _clique(f"cd.{c}", {f"n{i:02}": c for i in nodes}, ns="nvidia-dra-driver-gpu"),
        )
        for c, nodes in split.items()
    ]


def test_nodes_without_the_label_get_their_clique_from_the_objects() -> None:
    c = _Cluster()
    assert c.domains() == {}
    c.apply(*_cliques({"u.0": [0, 1, 2, 3], "u.1": [4, 5, 6, 7], "u.2": [8, 9, 10, 11]}))
    assert c.domains() == {"u.0": 4, "u.1": 4, "u.2": 4}
    assert c.metric("pyctl_clique_filled_nodes") == 12
    assert c.metric("pyctl_level_whole_domains", level=CLIQUE) == 3
    # the placement advice's index has them too (the nodes named were re-scored)
    rows = c.r.domain_idle().rows()
    assert rows["n05"][0][0] == "u.1"


def test_a_changed_clique_is_a_changed_domain_at_the_next_pass() -> None:
    c = _Cluster()
    c.apply(*_cliques({"u.0": [0, 1, 2, 3], "u.1": [4, 5, 6, 7], "u.2": [8, 9, 10, 11]}))
    assert c.domains() == {"u.0": 4, "u.1": 4, "u.2": 4}
    # Fabric Manager restarted: n00..n03 now report another clique id (the object changes)
    moved = _clique("cd.u.0", {f"n{i:02}": "u.7" for i in range(4)}, ns="nvidia-dra-driver-gpu")
    c.apply(Event("MODIFIED", moved))
    assert c.domains() == {"u.7": 4, "u.1": 4, "u.2": 4}
    assert c.r.domain_idle().rows()["n00"][0][0] == "u.7"
    # an object gone: its nodes are in no clique again
    c.apply(Event("DELETED", moved))
    assert c.domains() == {"u.1": 4, "u.2": 4}
    assert c.r.domain_idle().rows()["n00"][0][0] is None
    assert c.metric("pyctl_clique_filled_nodes") == 8


def test_the_label_wins_and_a_disagreement_is_counted() -> None:
    nodes = [_node(f"n{i:02}", ((CLIQUE, "lab.1"),) if i == 0 else ()) for i in range(4)]
    c = _Cluster(nodes)
    c.apply(*_cliques({"u.0": [0, 1, 2, 3]}))
    assert c.domains() == {"lab.1": 1, "u.0": 3}
    assert c.metric("pyctl_fabric_source_problems", problem="clique_label_disagrees") == 1
    assert c.metric("pyctl_clique_filled_nodes") == 3


def test_hostile_clique_objects_never_stop_the_pass() -> None:
    c = _Cluster()
    c.apply(
        Event("ADDED", _clique("cd.a", {"n00": "u.0", "n01": "u.0"}, dropped=5)),
        Event("ADDED", _clique("cd.b", {"n01": "u.1", "ghost": "u.1"})),  # n01 in two cliques
        *(Event("ADDED", _clique(f"cd.x{i}", {f"far{i}": f"x.{i}"})) for i in range(50)),
    )
    assert c.domains() == {"u.0": 1}  # nodes the cluster does not have are no domain of it
    assert c.metric("pyctl_fabric_source_problems", problem="clique_conflicts") == 1
    assert c.metric("pyctl_fabric_source_problems", problem="clique_daemons_unread") == 5


def test_a_topologys_levels_join_the_fabric_and_say_where_they_came_from() -> None:
    nodes = [_node(f"n{i:02}", ((RACK, f"r{i // 2}"), (BLOCK, "b0"))) for i in range(4)]
    c = _Cluster(nodes)
    assert c.domains(RACK) == {}
    c.apply(
        Event(
            "ADDED",
            KueueTopologyRecord("default", "1", (BLOCK, RACK, HOSTNAME)),
        )
    )
    assert c.domains(RACK) == {"r0": 2, "r1": 2}
    assert c.domains(BLOCK) == {"b0": 4}
    assert c.domains(HOSTNAME) == {}
    assert c.metric("pyctl_level_source", level=RACK, source="kueue/default") == 1
    assert c.metric("pyctl_level_source", level=CLIQUE, source="config") == 1
    assert c.r.domain_idle().levels[-2:] == (RACK, BLOCK)
    # the object goes: so do its levels and their metrics
    c.apply(Event("DELETED", KueueTopologyRecord("default")))
    assert c.domains(RACK) == {}
    assert c.metric("pyctl_level_source", level=RACK, source="kueue/default") is None
    assert RACK not in c.r.domain_idle().levels


def test_pyctl_score_on_a_dump_reads_the_topology_and_clique_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kubectl dump: four 4-GPU nodes with a rack label and no clique label (a 1-GPU pod on
    one), Kueue's Topology
    (as `kubectl get` gives it, in v1beta2) naming the rack level, and a ComputeDomainClique of
    three of the nodes; a KAI Topology that is not one is left out, said."""
    from tests.unit.test_kube_dump import node, pod

    items: list[dict[str, Any]] = [
        node(f"n{i}", 4, {RACK: f"r{i // 2}", HOSTNAME: f"n{i}"}) for i in range(4)
    ]
    items.append(pod("p0", "n3", gpus=1))
    kueue = topology("kueue.x-k8s.io/v1beta2", "default")
    kueue["spec"]["levels"] = [{"nodeLabel": RACK}, {"nodeLabel": HOSTNAME}]
    bad_kai = topology("kai.scheduler/v1alpha1", "broken")
    bad_kai["spec"] = ["levels"]
    cdc = compute_domain_clique(clique="u.1")
    cdc["daemons"] = [{"nodeName": f"n{i}", "cliqueID": "u.1", "ipAddress": "x"} for i in range(3)]
    items += [kueue, bad_kai, cdc, topology("example.com/v1", "not-a-scheduler")]
    f = tmp_path / "dump.json"
    f.write_text(json.dumps({"kind": "List", "items": items}))
    assert main(["score", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    levels = {lv["level"]: lv for lv in out["fabric"]["levels"]}
    assert set(levels) == {CLIQUE, RACK}
    assert (levels[CLIQUE]["domains"], levels[CLIQUE]["no_domain_nodes"]) == (1, 1)
    assert levels[RACK]["domains"] == 2
    assert [(lo["kind"], lo["name"], lo["reason"]) for lo in out["left_out"]["objects"]] == [
        ("KaiTopology", "broken", "malformed")
    ]


def test_a_clique_object_dirties_the_nodes_it_names_that_the_cluster_has() -> None:
    cache = ClusterCache()
    cache.apply([Event("ADDED", _node("n1")), Event("ADDED", _node("n2"))])
    v = cache.fabric_version
    a = _clique("cd.a", {"n1": "u.1", "ghost": "u.1"})
    assert cache.apply([Event("ADDED", a)]) == {"n1"}
    b = _clique("cd.a", {"n2": "u.1", "ghost2": "u.1"})
    assert cache.apply([Event("MODIFIED", b)]) == {"n1", "n2"}  # the old and the new nodes
    assert cache.apply([Event("DELETED", CliqueRecord("nv", "cd.a"))]) == {"n2"}
    assert cache.fabric_version == v + 3
    # the same object listed again changes nothing
    cache.replace("ComputeDomainClique", [a])
    assert cache.replace("ComputeDomainClique", [a]) == set()
    assert cache.fabric_version == v + 4


def test_nodes_whose_link_scores_were_left_out_are_counted() -> None:
    """Two HAMi nodes whose `hami.io/node-nvidia-score` could not be read (one broken, one
    oversized) and one whose scores read: the pass counts the two, and scores all three."""
    from pyctl.cluster.kube.sharing import HAMI_REGISTER, HAMI_SCORE, node_sharing
    from tests.unit.test_hami_links import PAIRS, register, scores

    def hami(name: str, score: str) -> NodeRecord:
        sharing = node_sharing({}, {HAMI_REGISTER: register(), HAMI_SCORE: score}, {})
        return NodeRecord(name, cpu_milli=64000, memory_mib=1 << 19, sharing=sharing)

    c = _Cluster([hami("h0", "{broken"), hami("h1", " " * (1 << 20)), hami("h2", scores(PAIRS))])
    c.now += 60
    c.r.fabric(c.now)
    assert c.metric("pyctl_fabric_source_problems", problem="link_scores_left_out") == 2
    assert sorted(c.r.scores) == ["h0", "h1", "h2"]
