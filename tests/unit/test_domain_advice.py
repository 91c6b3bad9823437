"""The placement advice keeps topology domains whole (docs/fabric.md, `pyctl.controller.domains`):
ties between nodes the policy ranks alike go to the tightest domain, hand-worked, and through the
controller's own path (records, the reconciler, the extender's advisor) on arrivals."""

from __future__ import annotations

from collections.abc import Iterable

from pyctl.cluster.records import Event, NodeRecord, PodRecord, Record
from pyctl.controller.cache import ClusterCache
from pyctl.controller.domains import DomainIdle
from pyctl.controller.placement import PlacementAdvisor
from pyctl.controller.reconcile import Reconciler
from pyctl.metrics import Metrics
from pyctl.model import Gang, Shape, Workload

CLIQUE = "nvidia.com/gpu.clique"
LEAF = "network.topology.nvidia.com/leaf"
ONE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000)
GANG = Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, gang=Gang(2, CLIQUE))


def index() -> DomainIdle:
    d = DomainIdle((CLIQUE,))
    d.update("a1", {CLIQUE: "a"}, 4000)
    d.update("a2", {CLIQUE: "a"}, 1000)
    d.update("b1", {CLIQUE: "b"}, 4000)
    d.update("b2", {CLIQUE: "b"}, 4000)
    d.update("c", {}, 4000)  # no label: no domain
    d.update("bad", {CLIQUE: "-not-a-label-value-"}, 4000)  # malformed: no domain
    return d


def test_small_pods_go_to_the_domain_already_broken_and_nodes_in_none_first() -> None:
    d = index()
    assert (d.idle(CLIQUE, "a"), d.idle(CLIQUE, "b")) == (5000, 8000)
    order = sorted(["b1", "a1", "c", "b2", "a2", "bad"], key=lambda n: (d.key(n, ONE), n))
    assert order == ["bad", "c", "a1", "a2", "b1", "b2"]


def test_a_gangs_pod_goes_to_the_tightest_domain_that_holds_the_gang() -> None:
    d = index()
    # the gang needs 2 x 4 GPUs: clique a (5 idle) cannot hold it, b (8 idle) can; nodes in no
    # clique hold no gang of the clique level
    order = sorted(["b1", "a1", "c", "b2", "a2", "bad"], key=lambda n: (d.key(n, GANG), n))
    assert order == ["b1", "b2", "a1", "a2", "bad", "c"]
    # with a third clique of 9 idle GPUs that also holds it, b (8) is still the tighter
    d.update("d1", {CLIQUE: "d"}, 9000)
    assert sorted(["d1", "b1"], key=lambda n: (d.key(n, GANG), n)) == ["b1", "d1"]


def test_the_index_follows_nodes_that_change_move_and_leave() -> None:
    d = index()
    d.update("a2", {CLIQUE: "a"}, 0)  # a pod landed
    assert d.idle(CLIQUE, "a") == 4000
    d.update("a1", {CLIQUE: "b"}, 4000)  # relabelled: a clique id changed at run time
    assert (d.idle(CLIQUE, "a"), d.idle(CLIQUE, "b")) == (0, 12000)
    d.update("a2", None, 0)  # gone: clique a has no node left
    assert d.idle(CLIQUE, "a") == 0
    assert d.domains(CLIQUE) == ["b"]
    assert len(d) == 5
    # levels change (a gang names a new key): rebuilt from what the caller has
    d.relevel((CLIQUE, LEAF), [("x", {CLIQUE: "a", LEAF: "l1"}, 2000)])
    assert (d.idle(CLIQUE, "a"), d.idle(LEAF, "l1"), len(d)) == (2000, 2000, 1)


def test_levels_are_compared_narrowest_first() -> None:
    d = DomainIdle((CLIQUE, LEAF))
    d.update("p", {CLIQUE: "a", LEAF: "l1"}, 4000)
    d.update("q", {CLIQUE: "b", LEAF: "l2"}, 4000)
    d.update("r", {CLIQUE: "b", LEAF: "l2"}, 0)
    d.update("s", {CLIQUE: "c", LEAF: "l2"}, 0)
    # clique b (4 idle) ties a (4 idle); leaf l1 (4) is tighter than l2 (4 + 4 + 0 + 0 = 8)
    assert sorted(["q", "p"], key=lambda n: (d.key(n, ONE), n)) == ["p", "q"]


# -- through the controller's path -----------------------------------------------------------


def records(n: int = 12) -> list[Record]:
    """`n` 4-GPU nodes in three cliques, named so that name order alternates cliques."""
    return [
        NodeRecord(
            f"n{i:02d}",
            gpu_model="H100-SXM5-80GB",
            cpu_milli=64000,
            memory_mib=512 * 1024,
            gpus=4,
            labels=((CLIQUE, "abc"[i % 3]),),
        )
        for i in range(n)
    ]


def arrive(advise_domains: bool, pods: int) -> tuple[Reconciler, dict[str, str]]:
    """`pods` single-GPU pods arriving one by one, each bound where the advice chooses."""
    cache = ClusterCache()
    cache.apply([Event("ADDED", r) for r in records()])
    workload = Workload((ONE, Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, gang=Gang(4, CLIQUE))))
    r = Reconciler(cache, Metrics(), "c", workload=workload)
    for name in cache.nodes:
        r.reconcile(name)
    if advise_domains:
        advisor = PlacementAdvisor.for_reconciler(r)
    else:  # the same advisor with the ties broken by name alone
        advisor = PlacementAdvisor(r.models, lambda: r.workload)
    names = tuple(sorted(cache.nodes))
    where: dict[str, str] = {}
    for i in range(pods):
        pending = PodRecord("default", f"p{i}", f"u{i}", phase="Pending", cpu_milli=1000, gpus=1)
        failed, chosen = advisor.choose(pending, names)
        assert chosen is not None
        assert len(chosen) == 1
        assert not chosen & set(failed)
        (node,) = chosen
        bound = PodRecord(
            "default", f"p{i}", f"u{i}", node=node, phase="Running", cpu_milli=1000, gpus=1,
            owner_kind="ReplicaSet", owner_name="web",
        )  # fmt: skip
        cache.apply([Event("ADDED", bound)])
        r.reconcile(node)
        where[f"p{i}"] = node
    return r, where


def whole_cliques(r: Reconciler, where: Iterable[str]) -> set[str]:
    used = {dict(r.cache.nodes[n].labels)[CLIQUE] for n in where}
    return {"a", "b", "c"} - used


def test_arrivals_fill_one_clique_and_leave_the_others_whole() -> None:
    r, where = arrive(advise_domains=True, pods=16)
    assert whole_cliques(r, where.values()) == {"b", "c"}
    # FGD fills a node before it starts another; the cliques order its choice of the next node
    assert sorted(set(where.values())) == ["n00", "n03", "n06", "n09"]
    # the gang of 4 pods x 4 GPUs fits in a whole clique
    assert r.domain_idle().idle(CLIQUE, "b") == 16000


def test_without_the_domain_order_the_same_arrivals_break_every_clique() -> None:
    """The control: ties broken by name alone (the order before the domain order) spread the
    same arrivals over all three cliques, and no clique holds the gang."""
    r, where = arrive(advise_domains=False, pods=16)
    assert sorted(set(where.values())) == ["n00", "n01", "n02", "n03"]
    assert whole_cliques(r, where.values()) == set()
