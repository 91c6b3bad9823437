"""DRA from the API server's JSON to pyctl's model and admission (docs/dra.md): decoding through
the watch path's decoder (bounds included), the NVIDIA driver's attribute forms under CEL, scalar
and list `numaNode`, DynamicMIG counters against the MIG catalog for every catalog model, and the
allocator's search (counters, constraints, taints)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyctl.cluster.dra import cel
from pyctl.cluster.dra.claims import Catalogue
from pyctl.cluster.dra.context import DraContext, misaligned_pods
from pyctl.cluster.dra.node import claim_pods, node_devices
from pyctl.cluster.dra.search import allocate
from pyctl.cluster.dra.zones import model_gpus
from pyctl.cluster.dra_records import ClaimRecord, SliceRecord
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import NodeRecord, PodRecord, check_record
from pyctl.cluster.translate import model_of, shape_of
from pyctl.core import mig
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Shape, Snapshot, Workload
from tests.e2e.dra_driver_sim import (
    GPU_CLASS,
    MIG_CLASS,
    PRODUCTS,
    SimGpu,
    SimNode,
    device_classes,
    slices_for,
)

NS = "ns"


def slices(node: SimNode) -> list[SliceRecord]:
    out = []
    for s in slices_for(node):
        rec = decode_object("ResourceSlice", json.dumps(s).encode())
        assert isinstance(rec, SliceRecord)
        out.append(rec)
    return out


def classes() -> list[Any]:
    return [decode_object("DeviceClass", c) for c in device_classes()]


def claim_json(
    name: str,
    requests: list[dict[str, Any]],
    constraints: list[dict[str, Any]] | None = None,
    results: list[tuple[str, str, str]] | None = None,
    node: str = "",
    pod: str = "",
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": r, "driver": "gpu.nvidia.com", "pool": node, "device": d}
                    for r, _, d in results
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
        if pod:
            status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return {
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests, "constraints": constraints or []}},
        "status": status,
    }


def claim(*a: Any, **kw: Any) -> ClaimRecord:
    rec = decode_object("ResourceClaim", claim_json(*a, **kw))
    assert isinstance(rec, ClaimRecord)
    return rec


def gpus(count: int, selectors: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "name": "gpus",
        "exactly": {
            "deviceClassName": GPU_CLASS,
            "count": count,
            "selectors": [{"cel": {"expression": e}} for e in selectors],
        },
    }


def mig_request(profile: str) -> dict[str, Any]:
    expr = f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"
    return {
        "name": "part",
        "exactly": {"deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": expr}}]},
    }


ALIGNED = [{"matchAttribute": "resource.kubernetes.io/numaNode"}]
EIGHT = SimNode("n", [SimGpu(i, i // 4) for i in range(8)])


def catalogue(claims: Sequence[ClaimRecord] = ()) -> Catalogue:
    return Catalogue({c.name: c for c in classes()}, {c.key: c for c in claims}, {})


# ---- decoding --------------------------------------------------------------------------------


def test_slices_decode_with_attribute_types_counters_and_quantities_kept_exact() -> None:
    node = SimNode("m", [SimGpu(0, 0, dynamic_mig=True), SimGpu(1, 1)])
    recs = slices(node)
    devs = {d.name: d for s in recs for d in s.devices}
    full = devs["gpu-0"]
    kinds = {a.name: a.kind for a in full.attributes}
    assert kinds["resource.kubernetes.io/numaNode"] == "int"
    assert kinds["driverVersion"] == "version"
    assert kinds["productName"] == "string"
    assert {u.counter_set for u in full.consumes} == {"gpu-0-counter-set"}
    part = devs["gpu-0-mig-3g40gb-9-4"]
    (use,) = part.consumes
    assert [c for c, _ in use.counters if c.startswith("memory-slice")] == [
        f"memory-slice-{i}" for i in range(4, 8)
    ]
    (cs,) = [c for s in recs for c in s.counter_sets]
    assert dict(cs.counters)["memory-slice-7"] == "1"
    assert all(s.slice_count == len(recs) for s in recs)


def test_decoding_is_bounded_and_names_the_object() -> None:
    s = slices_for(EIGHT)[0]
    s["spec"]["devices"] = [dict(s["spec"]["devices"][0], name=f"gpu-{i}") for i in range(129)]
    with pytest.raises(
        DecodeError, match=r"ResourceSlice n-gpu.nvidia.com-0: 129 devices per slice"
    ):
        decode_object("ResourceSlice", s)
    c = claim_json("big", [gpus(1, ("true",) * 33)])
    with pytest.raises(DecodeError, match="selectors per request"):
        decode_object("ResourceClaim", c)
    bad = slices_for(EIGHT)[0]
    bad["spec"]["devices"][0]["attributes"]["x"] = {"int": 1, "string": "a"}
    with pytest.raises(DecodeError, match="attribute x must have exactly one value"):
        decode_object("ResourceSlice", bad)
    q = slices_for(EIGHT)[0]
    q["spec"]["devices"][0]["capacity"]["memory"] = {"value": "lots"}
    with pytest.raises(DecodeError, match="capacity memory"):
        decode_object("ResourceSlice", q)
    # below a bound too (found by the fuzzer): what decodes is what `check_record` accepts
    for wrong, why in ((-1, "count is -1, outside 0..128"), (129, "129 count per request")):
        with pytest.raises(DecodeError, match=f"ns/neg:? request gpus.*{why}") as info:
            decode_object("ResourceClaim", claim_json("neg", [gpus(wrong)]))
        assert info.value.reason == "out_of_bounds"


def test_a_pods_claims_and_the_extended_resource_claim_are_read() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": NS},
        "spec": {
            "resourceClaims": [
                {"name": "a", "resourceClaimTemplateName": "t"},
                {"name": "b", "resourceClaimName": "shared"},
            ],
            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {
            "resourceClaimStatuses": [{"name": "a", "resourceClaimName": "p-a-x7"}],
            "extendedResourceClaimStatus": {"resourceClaimName": "p-ext", "requestMappings": []},
        },
    }
    rec = decode_object("Pod", pod)
    assert isinstance(rec, PodRecord)
    assert [(c.name, c.claim_name, c.template) for c in rec.claims] == [
        ("a", "p-a-x7", "t"),
        ("b", "shared", ""),
    ]
    assert rec.extended_claim == "p-ext"


def test_a_quantity_given_as_a_json_number_is_checked_as_the_text_kept() -> None:
    """A quantity may come as a JSON number; the record keeps its text, and that text is what
    must pass (found by the fuzzer: a number of 400 digits parsed as a number, its text did not
    pass `check_record`)."""
    s = slices_for(EIGHT)[0]
    s["spec"]["devices"][0]["capacity"]["memory"] = {"value": 0}
    text = json.dumps(s)
    assert text.count('"memory": {"value": 0}') == 1

    def with_memory(number: str) -> bytes:
        return text.replace('"memory": {"value": 0}', f'"memory": {{"value": {number}}}').encode()

    rec = decode_object("ResourceSlice", with_memory("85899345920"))
    assert isinstance(rec, SliceRecord)
    assert dict(rec.devices[0].capacity)["memory"] == "85899345920"
    check_record(rec)
    for digits in (400, 5000):  # 5000: beyond the digits Python's str() of an int allows
        with pytest.raises(DecodeError, match=r"capacity(\[\.\.\.\]\.value| memory)") as info:
            decode_object("ResourceSlice", with_memory("1" + "0" * digits))
        assert info.value.reason == "malformed"


# ---- CEL on the NVIDIA driver's attribute forms ----------------------------------------------


@pytest.mark.parametrize(
    ("expression", "device", "want"),
    [
        ("device.driver == 'gpu.nvidia.com'", "gpu-0", True),
        ("device.attributes['gpu.nvidia.com'].type == 'gpu'", "gpu-0", True),
        ("device.attributes['gpu.nvidia.com'].type == 'mig'", "gpu-0", False),
        ("device.attributes['gpu.nvidia.com'].profile == '3g.40gb'", "gpu-0-mig-3g40gb-9-4", True),
        (
            "device.attributes['gpu.nvidia.com'].profile == '3g.40gb'",
            "gpu-0-mig-1g10gb-19-4",
            False,
        ),
        ("has(device.attributes['gpu.nvidia.com'].profile)", "gpu-0", False),
        (
            'device.attributes["gpu.nvidia.com"].productName.lowerAscii().matches("^.*h100.*$")',
            "gpu-0",
            True,
        ),
        (
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0',
            "gpu-1",
            False,  # 81559 MiB < 80 GiB = 81920 MiB
        ),
        (
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("79Gi")) >= 0',
            "gpu-1",
            True,
        ),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("580.0.0")) >= 0',
            "gpu-1",
            True,
        ),
        (
            'device.attributes["gpu.nvidia.com"].driverVersion.isLessThan(semver("580.100.0"))',
            "gpu-1",
            True,
        ),
        ("device.attributes['resource.kubernetes.io'].numaNode == 1", "gpu-1", True),
        ("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:50'", "gpu-1", True),
        (
            "device.attributes['gpu.nvidia.com'].parentUUID.startsWith('GPU-')",
            "gpu-0-mig-1g10gb-19-0",
            True,
        ),
        ("has(device.attributes['dra.example.com'].model)", "gpu-1", False),
        ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.major() == 9", "gpu-1", True),
    ],
)
def test_cel_selectors_on_the_driver_attribute_forms(
    expression: str, device: str, want: bool
) -> None:
    node = SimNode("m", [SimGpu(0, 0, dynamic_mig=True), SimGpu(1, 1)])
    nd = node_devices("m", slices(node), [])
    (d,) = [d for d in nd.devices if d.id.device == device]
    assert cel.evaluate(expression, d.cel_input()) is want


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("cel.bind(g, device.attributes['gpu.nvidia.com'], g.type == 'gpu')", "Undefined"),
        ("device.attributes['gpu.nvidia.com'].?profile.orValue('') == ''", "unsupported syntax"),
        ("device.attributes['gpu.nvidia.com'].profile == 'x'", "KeyError"),  # no such key
        ("device.attributes['gpu.nvidia.com'].uuid", "not a bool"),
        ("", "does not know"),
    ],
)
def test_what_pyctl_cannot_evaluate_is_unknown(expression: str, why: str) -> None:
    nd = node_devices("n", slices(EIGHT), [])
    with pytest.raises(cel.SelectorUnknown, match=why):
        cel.evaluate(expression, nd.devices[0].cel_input())


def test_an_unevaluable_selector_makes_the_pod_unknown_never_guessed() -> None:
    ctx = DraContext.of(classes(), slices(EIGHT))
    bad = claim("c", [gpus(1, ("cel.bind(x, 1, x == 1)",))])
    ctx = DraContext.of(classes(), slices(EIGHT), [bad])
    pod = PodRecord(NS, "p", claims=(decode_claims({"g": "claim:c"})))
    assert shape_of(pod, ctx) is None
    need = ctx.need(NS, pod.claims)
    assert "request gpus" in need.unknown
    assert "CEL" in need.unknown
    ok = claim("c2", [gpus(2)], ALIGNED)
    ctx = DraContext.of(classes(), slices(EIGHT), [ok])
    shape = shape_of(
        PodRecord(NS, "q", cpu_milli=4000, claims=decode_claims({"g": "claim:c2"})), ctx
    )
    assert shape == Shape(cpu_milli=4000, gpus=2, gpu_milli=1000, dra=True, numa_aligned=True)


def decode_claims(m: dict[str, str]) -> Any:
    rcs = []
    for name, src in m.items():
        kind, _, ref = src.partition(":")
        rcs.append(
            {
                "name": name,
                ("resourceClaimName" if kind == "claim" else "resourceClaimTemplateName"): ref,
            }
        )
    rec = decode_object(
        "Pod", {"metadata": {"name": "x", "namespace": NS}, "spec": {"resourceClaims": rcs}}
    )
    assert isinstance(rec, PodRecord)
    return rec.claims


# ---- numaNode: scalar and list ---------------------------------------------------------------


def list_numa_node(lists: list[list[int]]) -> SimNode:
    return SimNode("l", [SimGpu(i, tuple(v)) for i, v in enumerate(lists)])


def test_zones_from_scalar_and_list_numa_node() -> None:
    nd = node_devices("n", slices(EIGHT), [])
    dm = model_gpus(nd)
    assert dm.basis == "numaNode"
    assert [g.zone for g in dm.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    # DRAListTypeAttributes: same-socket NUMA nodes as a list; a GPU goes to the lowest
    nd = node_devices("l", slices(list_numa_node([[0, 1], [1], [2, 3], [3]])), [])
    assert [d.numa for d in nd.devices] == [(0, 1), (1,), (2, 3), (3,)]
    assert [g.zone for g in model_gpus(nd).gpus] == [0, 1, 2, 3]


def test_match_attribute_on_list_numa_nodes_is_set_intersection() -> None:
    node = list_numa_node([[0, 1], [1], [0], [2]])
    nd = node_devices("l", slices(node), [])
    cat = catalogue()
    two = claim("c", [gpus(2)], ALIGNED).spec
    got = allocate([("c", two)], nd, cat)
    assert got.ok is True
    # gpu-0 {0,1} with gpu-1 {1}: they share NUMA node 1
    assert [d.id.device for _, _, d in got.devices] == ["gpu-0", "gpu-1"]
    three = claim("c", [gpus(3)], ALIGNED).spec
    # {0,1} & {1} & {0} is empty; no three GPUs share a node
    assert allocate([("c", three)], nd, cat).ok is False
    assert allocate([("c", claim("c", [gpus(3)]).spec)], nd, cat).ok is True


def test_zones_by_pcie_root_where_numa_is_absent() -> None:
    raw = slices_for(
        SimNode("p", [SimGpu(i, 0, pcie_root=f"pci0000:{i // 2:02x}") for i in range(4)])
    )
    for d in raw[0]["spec"]["devices"]:
        del d["attributes"]["resource.kubernetes.io/numaNode"]
    recs = [decode_object("ResourceSlice", s) for s in raw]
    dm = model_gpus(node_devices("p", recs, []))  # type: ignore[arg-type]
    assert dm.basis == "pcieRoot"
    assert dm.roots == {"pci0000:00": 0, "pci0000:01": 1}
    assert [g.zone for g in dm.gpus] == [0, 0, 1, 1]


# ---- usage, alignment, both kinds of GPU -----------------------------------------------------


def test_usage_is_exactly_the_allocation_results_and_spans_are_reported() -> None:
    a = claim("a", [gpus(2)], ALIGNED, [("gpus", "", "gpu-0"), ("gpus", "", "gpu-1")], "n", "pa")
    b = claim("b", [gpus(2)], None, [("gpus", "", "gpu-3"), ("gpus", "", "gpu-4")], "n", "pb")
    ctx = DraContext.of(classes(), slices(EIGHT), [a, b])
    node = NodeRecord("n", cpu_milli=64000, memory_mib=1 << 20, gpu_model="NVIDIA-H100-80GB-HBM3")
    pods = [
        PodRecord(NS, "pa", node="n", phase="Running"),
        PodRecord(NS, "pb", node="n", phase="Running"),
    ]
    model, dm = model_of(node, None, pods, dra=ctx)
    assert dm is not None
    used = [[g.used_milli for g in z.dra_gpus] for z in model.zones]
    assert used == [[1000, 1000, 0, 1000], [1000, 0, 0, 0]]
    assert all(not z.gpus for z in model.zones)  # nothing of the device plugin
    assert [x.pod for x in misaligned_pods(ctx)] == [f"{NS}/pb"]
    assert claim_pods(b) == (f"{NS}/pb",)


def test_a_node_with_both_kinds_counts_both_and_neither_twice() -> None:
    # 4 device-plugin GPUs (one used by a plugin pod) and the DRA driver's 8; a pod whose
    # nvidia.com/gpu request a DRA claim serves (DRAExtendedResource) is not counted twice
    ext = claim("p-ext", [gpus(1)], None, [("gpus", "", "gpu-7")], "n", "ext")
    ctx = DraContext.of(classes(), slices(EIGHT), [ext])
    node = NodeRecord(
        "n", cpu_milli=64000, memory_mib=1 << 20, gpus=4, gpu_model="NVIDIA-H100-80GB-HBM3"
    )
    pods = [
        PodRecord(NS, "plugin", node="n", gpus=1),
        PodRecord(NS, "ext", node="n", gpus=1, extended_claim="p-ext"),
    ]
    model, _ = model_of(node, None, pods, dra=ctx)
    plugin = [g.used_milli for z in model.zones for g in z.gpus]
    dra_used = [g.used_milli for z in model.zones for g in z.dra_gpus]
    assert sorted(plugin) == [0, 0, 0, 1000]
    assert sum(dra_used) == 1000
    assert len(dra_used) == 8
    score = FragmentationModel(Snapshot((model,))).score(Workload((Shape(gpus=1, gpu_milli=1000),)))
    assert score.idle_gpu_milli == 3000 + 7000


# ---- DynamicMIG counters against the catalog, for every model --------------------------------


@pytest.mark.parametrize("model", [m.name for m in mig.models()])
def test_dynamic_mig_counters_agree_with_the_catalog_for_every_model(model: str) -> None:
    m = mig.model(model)
    node = SimNode("g", [SimGpu(0, 0, model=_sim_model(model), dynamic_mig=True)])
    recs = slices(node)
    nd = node_devices("g", recs, [])
    (g,) = nd.gpus
    assert g.dynamic
    dm = model_gpus(nd, model)
    assert dm.notes == []
    (mg,) = dm.gpus
    assert mg.free_slices == (1 << m.memory_slices) - 1
    # every published placement is the catalog's
    parts = {(d.profile, d.memory_slices) for d in g.parts}
    want = {(p.name, tuple(range(s, s + z))) for p in m.profiles for s, z in p.placements}
    assert parts == want


def _sim_model(model: str) -> str:
    """The simulated driver knows products of two families; others borrow the H100's names
    (the geometry is the catalog model's either way)."""
    if model in PRODUCTS:
        return model
    PRODUCTS.setdefault(model, ("NVIDIA " + model, "Hopper", "9.0", 81559))
    return model


def test_counters_that_disagree_with_the_catalog_are_said_and_the_slices_trusted() -> None:
    # a driver that publishes 3g.40gb at slices 3-6 (the catalog has starts 0 and 4)
    node = SimNode("g", [SimGpu(0, 0, dynamic_mig=True)], {"3g.40gb": [(3, 4)]})
    nd = node_devices("g", slices(node), [])
    a = claim("c", [mig_request("3g.40gb")], None, [("part", "", "gpu-0-mig-3g40gb-9-3")], "g", "p")
    nd = node_devices("g", slices(node), [a])
    dm = model_gpus(nd, "H100-80GB")
    assert any("disagree with pyctl's catalog" in n for n in dm.notes), dm.notes
    (g,) = dm.gpus
    assert g.free_slices == 0b10000111  # the published slices 3-6 are taken


def brute_max_pack(m: mig.GpuModel, profile: str, free: int, free_compute: int) -> int:
    """Most instances of `profile` in the free memory slices (exhaustive, independent of pyctl)."""
    p = m.profile(profile)
    masks = [((1 << z) - 1) << s for s, z in p.placements if ((1 << z) - 1) << s & ~free == 0]
    best = 0

    def go(i: int, taken: int, n: int) -> None:
        nonlocal best
        best = max(best, n)
        for j in range(i, len(masks)):
            if masks[j] & taken == 0:
                go(j + 1, taken | masks[j], n + 1)

    go(0, 0, 0)
    return min(best, free_compute // p.compute_slices, p.max_count)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_allocations_through_counters_match_the_catalog_geometry(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from([m.name for m in mig.models()]))
    m = mig.model(model)
    node = SimNode("g", [SimGpu(0, 0, model=_sim_model(model), dynamic_mig=True)])
    recs = slices(node)
    base = node_devices("g", recs, [])
    (g,) = base.gpus
    rnd = random.Random(data.draw(st.integers(0, 10_000)))
    claims: list[ClaimRecord] = []
    taken = 0
    # allocate random placements one by one, as the scheduler would: each must fit the counters
    for k in range(data.draw(st.integers(0, 5))):
        nd = node_devices("g", recs, claims)
        d = rnd.choice(g.parts)
        spec = claim(f"c{k}", [mig_request(d.profile)]).spec
        got = allocate([(f"c{k}", spec)], nd, catalogue())
        mask = sum(1 << i for i in d.memory_slices)
        prof = m.profile(d.profile)
        prefix = d.id.device.rsplit("-", 1)[0] + "-"
        same = sum(1 for c in claims if c.allocated[0].device.startswith(prefix))
        # the media engines are one set per GPU: one +me instance of any size at a time
        media = "+me" in d.profile and any("-me-" in c.allocated[0].device for c in claims)
        fits = (
            mask & taken == 0
            and _compute_left(m, claims, g) >= prof.compute_slices
            and same < prof.max_count
            and not media
        )
        if got.ok:
            (_, _, chosen) = got.devices[0]
            cmask = sum(1 << i for i in chosen.memory_slices)
            assert cmask & taken == 0  # the counters never hand out a slice twice
            taken |= cmask
            claims.append(
                claim(
                    f"c{k}",
                    [mig_request(d.profile)],
                    None,
                    [("part", "", chosen.id.device)],
                    "g",
                    f"p{k}",
                )
            )
        else:
            assert not fits or got.ok is None
    nd = node_devices("g", recs, claims)
    (mg,) = model_gpus(nd, model).gpus
    full = (1 << m.memory_slices) - 1
    assert mg.free_slices == full & ~taken
    # the core's fragment for each profile equals an exhaustive packing of the free slices
    snap_node, _ = model_of(
        NodeRecord("g", cpu_milli=64000, memory_mib=1 << 20, gpu_model=model),
        None,
        [],
        dra=_ctx(recs, claims),
    )
    used_compute = sum(m.profile(p).compute_slices for p, _, used, _ in mg.instances if used)
    fm = FragmentationModel(Snapshot((snap_node,)))
    for p in m.profiles:
        score = fm.score(Workload((Shape(gpus=1, mig_profile=p.name, dra=True),))).nodes[0]
        idle = m.compute_slices - used_compute
        k = brute_max_pack(m, p.name, full & ~taken, idle)
        k = min(k, p.max_count - sum(1 for q, *_ in mg.instances if q == p.name))
        assert score.idle_mig_slices == idle
        assert score.fragment_mig_slices == idle - min(idle, k * p.compute_slices), (p.name, taken)


def _ctx(recs: list[SliceRecord], claims: list[ClaimRecord]) -> DraContext:
    return DraContext.of(classes(), recs, claims)


def _compute_left(m: mig.GpuModel, claims: list[ClaimRecord], g: Any) -> int:
    used = 0
    for c in claims:
        for r in c.allocated:
            (d,) = [d for d in g.parts if d.id.device == r.device]
            used += m.profile(d.profile).compute_slices
    return m.compute_slices - used


# ---- the allocator's search --------------------------------------------------------------------


def test_allocate_follows_slice_order_taints_and_in_use_devices() -> None:
    held = claim("h", [gpus(1)], None, [("gpus", "", "gpu-0")], "n", "h")
    recs = slices(EIGHT)
    nd = node_devices("n", recs, [held])
    got = allocate([("c", claim("c", [gpus(2)], ALIGNED).spec)], nd, catalogue())
    assert [d.id.device for _, _, d in got.devices] == ["gpu-1", "gpu-2"]
    # a NoSchedule taint on gpu-1 and gpu-2 (a DeviceTaintRule would put it there): skipped
    raw = slices_for(EIGHT)
    for d in raw[0]["spec"]["devices"][1:3]:
        d["taints"] = [{"key": "example.com/maintenance", "effect": "NoSchedule"}]
    tainted = [decode_object("ResourceSlice", s) for s in raw]
    nd = node_devices("n", tainted, [held])  # type: ignore[arg-type]
    got = allocate([("c", claim("c", [gpus(2)], ALIGNED).spec)], nd, catalogue())
    assert [d.id.device for _, _, d in got.devices] == ["gpu-4", "gpu-5"]
    four = claim("c", [gpus(4)], ALIGNED).spec
    assert allocate([("c", four)], nd, catalogue()).ok is True
    held3 = claim("h3", [gpus(1)], None, [("gpus", "", "gpu-5")], "n", "h3")
    nd = node_devices("n", tainted, [held, held3])  # type: ignore[arg-type]
    assert allocate([("c", four)], nd, catalogue()).ok is False


# ---- the core against the pure-Python twin on random DRA nodes ------------------------------


def random_dra_node(rnd: random.Random, name: str) -> Any:
    from pyctl.model import Gpu, MigGpu, MigInstance, Node, Zone

    m = mig.model("H100-80GB")
    zones = []
    gid = 0
    # the DRA GPUs' Fabric Manager partitions on some nodes (the k-th DRA GPU in partition
    # k // size of each size; some unlisted, hence alone), NVLink groups on some plugin GPUs
    sizes = rnd.choice([(), (), (1, 2, 4, 8), (2, 4), (2,)])
    links = rnd.choice([False, False, True])
    k = 0
    for z in range(rnd.choice([1, 2, 4])):
        plugin = [
            Gpu(gid + i, rnd.choice([0, 1000, 500]), link=(gid + i) // 2 if links else None)
            for i in range(rnd.choice([0, 0, 2]))
        ]
        gid += len(plugin)
        dra_gpus = []
        for i in range(rnd.choice([0, 2, 4])):
            listed = rnd.random() < 0.9
            levels = tuple((size, k // size) for size in sizes) if listed else ()
            dra_gpus.append(Gpu(gid + i, rnd.choice([0, 0, 1000]), link_levels=levels))
            k += 1
        gid += len(dra_gpus)
        migs = []
        for _ in range(rnd.choice([0, 0, 1, 2])):
            # a dynamic GPU: a random set of allocated placements that fit together
            insts: list[MigInstance] = []
            taken = 0
            compute = 0
            for _ in range(rnd.randint(0, 4)):
                p = rnd.choice(m.profiles)
                s, size = rnd.choice(p.placements)
                mask = ((1 << size) - 1) << s
                count = sum(1 for i in insts if i.profile == p.name)
                if (
                    mask & taken
                    or compute + p.compute_slices > m.compute_slices
                    or count >= p.max_count
                ):
                    continue
                taken |= mask
                compute += p.compute_slices
                insts.append(MigInstance(p.name, s, True, None))
            migs.append(MigGpu(gid, tuple(insts), dra=True, dynamic=True))
            gid += 1
        zones.append(
            Zone(
                z,
                32000,
                rnd.choice([0, 8000, 31000]),
                1 << 18,
                0,
                tuple(plugin),
                tuple(migs),
                tuple(dra_gpus),
            )
        )
    return Node(name, "H100-80GB", "none", zones=tuple(zones))


DRA_SHAPES = [
    Shape(cpu_milli=4000, gpus=1, gpu_milli=1000, dra=True),
    Shape(cpu_milli=8000, gpus=2, gpu_milli=1000, dra=True, numa_aligned=True),
    Shape(cpu_milli=8000, gpus=4, gpu_milli=1000, dra=True, numa_aligned=True),
    Shape(cpu_milli=8000, gpus=3, gpu_milli=1000, dra=True),
    Shape(cpu_milli=8000, gpus=2, gpu_milli=1000, dra=True, link_group=True),
    Shape(cpu_milli=8000, gpus=4, gpu_milli=1000, dra=True, link_group=True),
    Shape(cpu_milli=8000, gpus=3, gpu_milli=1000, dra=True, numa_aligned=True, link_group=True),
    Shape(cpu_milli=4000, gpus=2, gpu_milli=1000, link_group=True),
    Shape(cpu_milli=2000, gpus=1, mig_profile="3g.40gb", dra=True),
    Shape(cpu_milli=2000, gpus=1, mig_profile="1g.10gb", dra=True),
    Shape(cpu_milli=2000, gpus=1, mig_profile="1g.20gb", dra=True),
    Shape(cpu_milli=4000, gpus=1, gpu_milli=1000),
    Shape(cpu_milli=4000, gpus=1, gpu_milli=500),
    Shape(cpu_milli=40000, gpus=1, gpu_milli=1000, dra=True),
    Shape(cpu_milli=1000),
]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 1 << 30))
def test_the_core_agrees_with_the_reference_on_dra_nodes(seed: int) -> None:
    from tests.reference import fragmentation as ref

    rnd = random.Random(seed)
    node = random_dra_node(rnd, "n")
    shapes = tuple(
        replace(s, weight=rnd.randint(1, 5)) for s in rnd.sample(DRA_SHAPES, rnd.randint(1, 4))
    )
    w = Workload(shapes)
    got = FragmentationModel(Snapshot((node,))).score(w).nodes[0]
    want = ref.score_node(node, w)
    assert got.idle_gpu_milli == pytest.approx(want.idle_gpu)
    assert got.idle_mig_slices == pytest.approx(want.idle_mig)
    assert got.fragment_gpu_milli == pytest.approx(want.frag_gpu)
    assert got.fragment_mig_slices == pytest.approx(want.frag_mig)
    for c, v in got.categories.items():
        assert v == pytest.approx(want.cats[c]), c
    for c, v in got.mig_categories.items():
        assert v == pytest.approx(want.mig_cats[c]), c
    assert got.recoverable_mig_slices == pytest.approx(want.recoverable)


def test_one_media_engine_instance_per_gpu_whatever_its_size() -> None:
    """The A30's media engines are one set: with a 2g.12gb+me allocated, a 1g.6gb+me on free
    memory slices is refused by the counters (found by the geometry property above)."""
    model = "A30-24GB"
    node = SimNode("g", [SimGpu(0, 0, model=_sim_model(model), dynamic_mig=True)])
    recs = slices(node)
    first = allocate(
        [("c0", claim("c0", [mig_request("2g.12gb+me")]).spec)],
        node_devices("g", recs, []),
        catalogue(),
    )
    assert first.ok
    (_, _, dev) = first.devices[0]
    where = [("part", "", dev.id.device)]
    held = [claim("c0", [mig_request("2g.12gb+me")], None, where, "g", "p0")]
    again = allocate(
        [("c1", claim("c1", [mig_request("1g.6gb+me")]).spec)],
        node_devices("g", recs, held),
        catalogue(),
    )
    assert not again.ok
    plain = allocate(
        [("c1", claim("c1", [mig_request("1g.6gb")]).spec)],
        node_devices("g", recs, held),
        catalogue(),
    )
    assert plain.ok
