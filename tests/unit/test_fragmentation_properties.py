"""Property tests: the Rust scorer agrees with the pure-Python twin on random snapshots; under
policy `none` it is FGD's F_n(m); placing then removing a task changes nothing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyctl.core.fragmentation import FragmentationModel, score
from pyctl.core.inputs import AssignmentInput
from pyctl.model import Gpu, MigGpu, MigInstance, Node, Shape, Snapshot, Workload, Zone
from tests.reference import fragmentation as ref

MIG_MODELS = ("A100-SXM4-40GB", "H100-SXM5-80GB", "A30-24GB")


def _place_random(draw: st.DrawFn, model: str) -> tuple[MigInstance, ...]:
    """A random valid MIG layout: profiles placed first-fit at random documented starts."""
    m = ref.model(model)
    occupied = 0
    compute = 0
    counts: dict[str, int] = {}
    out = []
    for _ in range(draw(st.integers(0, 7))):
        p = draw(st.sampled_from(m["profiles"]))
        if compute + p["compute_slices"] > m["compute_slices"]:
            continue
        if counts.get(p["name"], 0) >= p["max_count"]:
            continue
        starts = [
            pl for pl in p["placements"] if not occupied & (((1 << pl["size"]) - 1) << pl["start"])
        ]
        if not starts:
            continue
        pl = draw(st.sampled_from(starts))
        occupied |= ((1 << pl["size"]) - 1) << pl["start"]
        compute += p["compute_slices"]
        counts[p["name"]] = counts.get(p["name"], 0) + 1
        out.append(MigInstance(p["name"], pl["start"], draw(st.booleans())))
    return tuple(out)


#: GPU sharing pools (docs/sharing.md): "" (nvidia.com/gpu) most often
POOLS = ["", "", "", "nvidia.com/gpu.shared", "hami"]


@st.composite
def nodes(draw: st.DrawFn, name: str) -> Node:
    mig = draw(st.booleans())
    gpu_model = draw(st.sampled_from(MIG_MODELS)) if mig else draw(st.sampled_from(["V100", "T4"]))
    zones = []
    gid = 0
    # link groups at given sizes on some nodes (Fabric Manager partitions: the k-th whole GPU
    # in group k // size of each size; some GPUs unlisted, hence alone)
    sizes = draw(st.sampled_from([(), (), (2,), (1, 2, 4), (1, 2, 4, 8), (4,)]))
    any_size = draw(st.booleans())
    whole = 0
    for numa in range(draw(st.integers(1, 4))):
        cpu = draw(st.sampled_from([8000, 16000, 32000]))
        mem = draw(st.sampled_from([0, 65536, 131072]))
        gpus = []
        for _ in range(draw(st.integers(0, 4))):
            used = draw(st.sampled_from([0, 0, 250, 500, 700, 1000, 1000]))
            # link groups (docs/fabric.md) on some nodes: NVLink pairs, or none known
            link = draw(st.sampled_from([None, 0, 0, 1, 2])) if any_size else None
            listed = draw(st.integers(0, 5)) > 0
            levels = tuple((size, whole // size) for size in sizes) if listed else ()
            gpus.append(Gpu(gid, used, link=link, link_levels=levels))
            gid += 1
            whole += 1
        migs = []
        if mig and draw(st.booleans()):
            migs.append(MigGpu(gid, _place_random(draw, gpu_model)))
            gid += 1
        zones.append(
            Zone(
                numa,
                cpu,
                draw(st.integers(0, cpu // 1000)) * 1000,
                mem,
                draw(st.integers(0, mem)),
                tuple(gpus),
                tuple(migs),
            )
        )
    return Node(
        name=name,
        gpu_model=gpu_model,
        topology_policy=draw(
            st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"])
        ),
        cpu_manager_policy=draw(st.sampled_from(["static", "none"])),
        memory_manager_policy=draw(st.sampled_from(["static", "none"])),
        zones=tuple(zones),
        gpu_pool=draw(st.sampled_from(POOLS)),
        gpu_replicas=draw(st.sampled_from([1, 1, 2, 3, 4, 7, 48])),
        gpu_memory_mib=draw(st.sampled_from([0, 23028, 81920])),
        # an RDMA resource on some nodes (shared HCA devices, docs/fragmentation.md)
        rdma=(rdma := draw(st.sampled_from([0, 0, 100, 400]))),
        rdma_used=draw(st.integers(0, rdma)),
    )


@st.composite
def shapes(draw: st.DrawFn, mig_ok: bool = True) -> Shape:
    kind = draw(
        st.sampled_from(["cpu", "whole", "shared", "mig"] if mig_ok else ["cpu", "whole", "shared"])
    )
    cpu = draw(st.sampled_from([0, 500, 1000, 2500, 4000, 8000, 16000]))
    mem = draw(st.sampled_from([0, 0, 4096, 65536]))
    models = draw(
        st.sampled_from([(), (), ("V100",), ("A100-SXM4-40GB",), ("T4", "H100-SXM5-80GB")])
    )
    weight = draw(st.integers(1, 5))
    rdma = draw(st.sampled_from([0, 0, 0, 50, 100, 300]))
    if kind == "cpu":
        return Shape(cpu, mem, weight=weight, rdma=rdma)
    if kind == "whole":
        return Shape(
            cpu,
            mem,
            draw(st.integers(1, 6)),
            1000,
            gpu_models=models,
            weight=weight,
            link_group=draw(st.booleans()),
            rdma=rdma,
        )
    if kind == "shared":
        # a share of one or more GPUs; 0: one replica of each (the node sizes it); a GPU memory
        # request is a fraction of the node's GPU memory (docs/sharing.md)
        return Shape(
            cpu,
            mem,
            draw(st.sampled_from([1, 1, 2, 3])),
            draw(st.sampled_from([0, 1, 100, 250, 500, 750])),
            gpu_models=models,
            weight=weight,
            gpu_pool=draw(st.sampled_from(POOLS)),
            gpu_memory_mib=draw(st.sampled_from([0, 0, 10000, 40000])),
            rdma=rdma,
        )
    prof = draw(st.sampled_from(["1g.5gb", "2g.10gb", "3g.20gb", "1g.10gb", "3g.40gb", "2g.12gb"]))
    return Shape(cpu, mem, 0, 0, prof, weight=weight, rdma=rdma)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    return Snapshot(tuple(draw(nodes(f"n{i}")) for i in range(draw(st.integers(1, 3)))))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.lists(shapes(), min_size=1, max_size=4))
def test_rust_agrees_with_the_reference(snap: Snapshot, shape_list: list[Shape]) -> None:
    w = Workload(tuple(shape_list))
    got = score(snap, w)
    for n, gn in zip(snap.nodes, got.nodes, strict=True):
        want = ref.score_node(n, w)
        assert _close(gn.idle_gpu_milli, want.idle_gpu)
        assert _close(gn.fragment_gpu_milli, want.frag_gpu), (gn, want)
        assert _close(gn.idle_mig_slices, want.idle_mig)
        assert _close(gn.fragment_mig_slices, want.frag_mig), (gn, want)
        assert _close(gn.recoverable_mig_slices, want.recoverable)
        for c in ref.CATS:
            assert _close(gn.categories[c], want.cats[c]), c
            assert _close(gn.mig_categories[c], want.mig_cats[c]), c
        for zs, zf, zm in zip(gn.zones, want.zone_frag_gpu, want.zone_frag_mig, strict=True):
            assert _close(zs.fragment_gpu_milli, zf)
            assert _close(zs.fragment_mig_slices, zm)
        assert _close(sum(gn.categories.values()), gn.fragment_gpu_milli)


@settings(max_examples=300, deadline=None)
@given(nodes("n"), shapes(mig_ok=False))
def test_policy_none_is_fgd(node: Node, shape: Shape) -> None:
    plain = Node(
        node.name,
        node.gpu_model,
        "none",
        node.cpu_manager_policy,
        node.memory_manager_policy,
        tuple(
            Zone(z.numa, z.cpu_milli, z.cpu_milli_used, z.memory_mib, z.memory_mib_used, z.gpus)
            for z in node.zones
        ),
    )
    # FGD ignores memory: compare with a memory-free shape; FGD knows no sharing pools or
    # replicas (a replica of an unshared GPU is the whole GPU)
    milli = shape.gpu_milli or (1000 if shape.gpus else 0)
    s = Shape(shape.cpu_milli, 0, shape.gpus, milli, None, shape.gpu_models, 1.0)
    got = score(Snapshot((plain,)), Workload((s,))).fragment_gpu_milli
    assert _close(got, ref.fgd_node_fragment(plain.zones, s, plain.gpu_model))


@st.composite
def linked_nodes(draw: st.DrawFn) -> Node:
    """A node whose whole GPUs (of the device plugin, a DRA driver, or both: then the DRA GPUs
    publish the sized levels, the plugin's a level of any size) publish link groups at several
    sizes (the k-th GPU in group k // size; some unlisted, hence alone), and on some nodes a
    level of any size too."""
    sizes = draw(st.sampled_from([(2,), (1, 2, 4), (1, 2, 4, 8), (2, 4), (4,)]))
    any_size = draw(st.booleans())
    kind = draw(st.sampled_from(["plugin", "dra", "both"]))
    zones = []
    gid = 0
    for numa in range(draw(st.integers(1, 2))):
        plugin: list[Gpu] = []
        dra_gpus: list[Gpu] = []
        for _ in range(draw(st.integers(0, 8))):
            dra = kind == "dra" or (kind == "both" and draw(st.booleans()))
            sized = kind != "both" or dra
            listed = sized and draw(st.integers(0, 7)) > 0
            levels = tuple((size, gid // size) for size in sizes) if listed else ()
            some = any_size and (kind != "both" or not dra)
            link = draw(st.sampled_from([None, 0, 1])) if some else None
            used = draw(st.sampled_from([0, 0, 0, 500, 1000]))
            (dra_gpus if dra else plugin).append(Gpu(gid, used, link=link, link_levels=levels))
            gid += 1
        zones.append(Zone(numa, 64000, 0, 1 << 20, 0, tuple(plugin), (), tuple(dra_gpus)))
    # the twin covers device-plugin shapes on a DRA node under none and best-effort only
    policies = ["none", "best-effort"]
    if kind == "plugin":
        policies += ["restricted", "single-numa-node"]
    return Node("n", "H100", draw(st.sampled_from(policies)), zones=tuple(zones))


@st.composite
def linked_shapes(draw: st.DrawFn) -> Shape:
    dra = draw(st.booleans())
    return Shape(
        1000,
        0,
        draw(st.integers(1, 5)),
        draw(st.sampled_from([1000, 1000, 500])),
        dra=dra,
        numa_aligned=dra and draw(st.booleans()),
        link_group=draw(st.integers(0, 3)) > 0,
        weight=draw(st.integers(1, 3)),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(linked_nodes(), st.lists(linked_shapes(), min_size=1, max_size=3), linked_shapes())
def test_link_levels_agree_with_the_reference_and_the_delta(
    node: Node, shape_list: list[Shape], task: Shape
) -> None:
    """docs/fabric.md: a shape of g GPUs that needs one link group uses the smallest level of
    at least g GPUs of its source; the core and the twin agree, and a placement's delta is the
    score's change."""
    w = Workload(tuple(shape_list))
    m = FragmentationModel(Snapshot((node,)))
    before = m.score(w)
    got = before.nodes[0]
    want = ref.score_node(node, w)
    assert _close(got.fragment_gpu_milli, want.frag_gpu), (got, want)
    for c in ref.CATS:
        assert _close(got.categories[c], want.cats[c]), c
    d = m.place_delta("n", task, w)
    if d is None:
        return
    m.apply("n", d.assignment)
    after = m.score(w)
    assert _close(after.fragment_gpu_milli - before.fragment_gpu_milli, d.fragment_gpu_milli)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes("n"), shapes(), st.lists(shapes(), min_size=1, max_size=3))
def test_place_then_remove_is_zero(node: Node, task: Shape, shape_list: list[Shape]) -> None:
    w = Workload(tuple(shape_list))
    m = FragmentationModel(Snapshot((node,)))
    before = m.score(w)
    d = m.place_delta("n", task, w)
    if d is None:
        return
    m.apply("n", d.assignment)
    after = m.score(w)
    assert _close(after.fragment_gpu_milli - before.fragment_gpu_milli, d.fragment_gpu_milli)
    back = m.remove_delta("n", d.assignment, w)
    assert _close(back.fragment_gpu_milli, -d.fragment_gpu_milli)
    assert _close(back.fragment_mig_slices, -d.fragment_mig_slices)
    m.apply("n", d.assignment, place=False)
    assert m.score(w) == before


def test_bad_assignment_is_refused_and_changes_nothing() -> None:
    node = Node("n", "V100", zones=(Zone(0, 8000, 0, 0, 0, (Gpu(0, 0),)),))
    m = FragmentationModel(Snapshot((node,)))
    w = Workload((Shape(1000, 0, 1, 1000),))
    before = m.score(w)
    bad: AssignmentInput = {"cpu": [(0, 1000)], "gpus": [(0, 5, 1000)]}
    with pytest.raises(ValueError, match="GPU out of range"):
        m.apply("n", bad)
    with pytest.raises(ValueError, match="removing more"):
        m.apply("n", {"gpus": [(0, 0, 1000)]}, place=False)
    assert m.score(w) == before
