"""DRA consumable capacity (docs/sharing.md, "DRA consumable capacity"): `pyctl score` on a kubectl
dump of GPUs several claims share by capacity (tests/data/sharing/dra-consumable.json), against
values worked out by hand; the allocator's arithmetic (`pyctl.cluster.dra.capacity`) against the
rules of k8s.io/dynamic-resource-allocation's consumable_capacity.go; the admission check and the
claims' shapes; hostile request policies."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec
import pytest

from pyctl.cli.main import main
from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.claims import pod_claim_specs
from pyctl.cluster.dra.search import allocate
from pyctl.cluster.dra_records import CapacityPolicy, ClaimRecord, Device, SliceRecord
from pyctl.cluster.kube.decode import DecodeError, decode_object
from pyctl.cluster.records import PodRecord, check_record
from pyctl.cluster.translate import attribute_pods, model_of, shape_of
from pyctl.controller.placement import PlacementAdvisor
from pyctl.model import Shape, Workload
from tests.dumps import dra_context, pod_shapes, records
from tests.paths import REPO

DATA = REPO / "tests" / "data" / "sharing"
DUMP = DATA / "dra-consumable.json"
S = "serving/"
GI = 1 << 30


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DUMP.read_text())
    return data


def nonzero(cats: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in cats.items() if v}


def test_score_dra_consumable_capacity(capsys: pytest.CaptureFixture[str]) -> None:
    """dra-h100-0 publishes two H100s (gpu-0 on NUMA 0, gpu-1 on NUMA 1) with
    allowMultipleAllocations and two capacities: memory 80Gi (requestPolicy default 10Gi,
    validRange min 10Gi step 5Gi) and compute 100 (default 10, validValues 10/25/50/100).
    The scheduler's allocation results (consumedCapacity):
    - qwen-0 asked memory 20Gi, compute 25: consumed 20Gi and 25 on gpu-0: 250 milli;
    - llama-0 asked memory 33Gi: rounded up to 35Gi (10 + 5 x 5), compute the default 10, on
      gpu-0: 35/80 = 437.5 -> 438;
    - bge-0 asked compute 30: rounded up to 50, memory the default 10Gi, on gpu-1: 500.
    gpu-0 in all: memory 55Gi -> 687.5 -> 688, compute 35 -> 350: used 688 (holders 250 + 438).
    gpu-1: memory 10Gi -> 125, compute 50 -> 500: used 500. Idle 312 + 500 = 812.
    Workload: a 75Gi DRA share (938 milli, 0.25): 812 idle in all is less than 938: lack_gpu
    0.25 x 812 = 203; a 20Gi share (250, 0.25) fits either GPU; a whole nvidia.com/gpu of the
    device plugin (0.5) has no access to DRA devices: 0.5 x 812 = 406. Fragment 609: zone 0
    0.75 x 312 = 234, zone 1 0.75 x 500 = 375."""
    argv = ["score", str(DUMP), "--json", "--workload", str(DATA / "dra-consumable-workload.json")]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"]["idle_gpu_milli"] == 812
    assert out["cluster"]["fragment_gpu_milli"] == 609
    assert nonzero(out["cluster"]["categories"]) == {"lack_gpu": 203, "no_access": 406}
    (n,) = out["nodes"]
    assert n["sharing"] == "dra consumable capacity (2 shared GPUs), exact"
    assert [(z["numa"], z["idle_gpu_milli"], z["fragment_gpu_milli"]) for z in n["zones"]] == [
        (0, 312, 234),
        (1, 500, 375),
    ]
    assert [(g["numa"], g["used_milli"], g["pods"]) for g in n["gpus"]] == [
        (0, 688, {S + "llama-0": 438, S + "qwen-0": 250}),
        (1, 500, {S + "bge-0": 500}),
    ]


def test_the_shapes_of_shared_claims() -> None:
    """Each pod's shape is its share of one DRA GPU by the allocator's arithmetic: the running
    pods' as above, and the pending big-0 (75Gi: 10 + 13 x 5 = 75Gi exactly; 937.5 -> 938)."""
    shapes = pod_shapes(load())
    assert sorted((s.gpus, s.gpu_milli, s.dra) for s in shapes) == [
        (1, 250, True),
        (1, 438, True),
        (1, 500, True),
        (1, 938, True),
    ]


def test_the_pending_claim_fits_no_gpu_though_enough_is_free() -> None:
    """big-0 asks 75Gi: gpu-0 has 25Gi left and gpu-1 70Gi; 95Gi free on the node, and the
    allocation check refuses it as the scheduler did. 40Gi would fit gpu-1 (its compute: 50
    used + the default 10); 70Gi too, 71Gi (rounded to 75Gi) not; two 35Gi requests in one claim
    both fit gpu-1 (a shared device may serve the same claim twice: 10 + 35 + 35 = 80Gi)."""
    data = load()
    ctx = dra_context(data)
    assert ctx is not None
    nd = ctx.node("dra-h100-0")
    assert nd is not None
    (_, pods, _, _) = records(data)
    big = next(p for p in pods if p.name == "big-0")
    ((_, spec, _),), _ = pod_claim_specs(big.namespace, big.claims, ctx.cat)
    assert spec is not None
    assert allocate([("big", spec)], nd, ctx.cat).ok is False

    def asking(*mems: str) -> bool | None:
        reqs = [
            {
                "name": f"gpu{i}",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "capacity": {"requests": {"memory": m}},
                },
            }
            for i, m in enumerate(mems)
        ]
        c = decode_object(
            "ResourceClaim",
            {
                "kind": "ResourceClaim",
                "metadata": {"name": "x", "namespace": "serving"},
                "spec": {"devices": {"requests": reqs}},
            },
        )
        got = allocate([("x", c.spec)], nd, ctx.cat)  # type: ignore[union-attr]
        if got.ok:
            assert {d.id.device for _, _, d in got.devices} == {"gpu-1"}
        return got.ok

    assert asking("40Gi") is True
    assert asking("70Gi") is True
    assert asking("71Gi") is False
    assert asking("35Gi", "35Gi") is True
    assert asking("35Gi", "40Gi") is False


def test_moving_a_share_frees_exactly_its_share() -> None:
    """The pods' places on the node (for compaction's deltas): each holder at its own share."""
    data = load()
    nodes, pods, _, _ = records(data)
    ctx = dra_context(data)
    positions: dict[str, list[tuple[object, ...]]] = {}
    node, _ = model_of(nodes[0], None, pods, dra=ctx, positions=positions)
    asg = attribute_pods(node, pods, positions)
    assert asg[S + "qwen-0"]["dra_gpus"] == [(0, 0, 250)]
    assert asg[S + "llama-0"]["dra_gpus"] == [(0, 0, 438)]
    assert asg[S + "bge-0"]["dra_gpus"] == [(1, 0, 500)]
    assert [g.used_milli for z in node.zones for g in z.dra_gpus] == [688, 500]


def two_nodes() -> dict[str, Any]:
    """The dump plus dra-h100-1: one such GPU, where x-0 holds 30Gi and compute 25 (375 milli)."""
    data = load()
    items = data["items"]

    def first(kind: str, name: str = "") -> dict[str, Any]:
        o = next(o for o in items if o["kind"] == kind and o["metadata"]["name"].startswith(name))
        c: dict[str, Any] = copy.deepcopy(o)
        return c

    node = first("Node")
    node["metadata"]["name"] = node["metadata"]["labels"]["kubernetes.io/hostname"] = "dra-h100-1"
    sl = first("ResourceSlice")
    sl["metadata"]["name"] = "dra-h100-1-gpu"
    sl["spec"]["nodeName"] = sl["spec"]["pool"]["name"] = "dra-h100-1"
    sl["spec"]["devices"] = sl["spec"]["devices"][:1]
    claim = first("ResourceClaim", "qwen")
    claim["metadata"]["name"] = "x-0-gpu"
    claim["metadata"]["ownerReferences"][0]["name"] = claim["status"]["reservedFor"][0]["name"] = (
        "x-0"
    )
    alloc = claim["status"]["allocation"]
    alloc["devices"]["results"][0] |= {
        "pool": "dra-h100-1",
        "consumedCapacity": {"memory": "30Gi", "compute": "25"},
    }
    alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["dra-h100-1"]
    pod = first("Pod", "qwen-0")
    pod["metadata"]["name"] = "x-0"
    pod["spec"]["nodeName"] = "dra-h100-1"
    pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "x-0-gpu"
    items += [node, sl, claim, pod]
    return data


def test_compaction_moves_a_share_to_make_room_for_a_pending_share(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """big-0 (75Gi) fits no GPU: dra-h100-0 has 25Gi and 70Gi left, dra-h100-1 50Gi. Moving x-0
    (30Gi, compute 25) to dra-h100-0's gpu-1 (10 + 30 = 40Gi, compute 50 + 25 = 75) empties
    dra-h100-1's GPU for it: one move, checked by the allocation check on the destination.
    Moving bge-0 instead (10Gi, compute 50) to dra-h100-1 (compute 25 + 50) would free gpu-1
    (70Gi + 10Gi = 80Gi) too; the planner's choice frees a whole node's GPU."""
    f = tmp_path / "dump.json"
    f.write_text(json.dumps(two_nodes()))
    assert main(["plan", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (rescue,) = out["rescues"]
    assert (rescue["pending"], rescue["node"]) == (S + "big-0", "dra-h100-1")
    assert [(m["pod"], m["from"], m["to"]) for m in rescue["moves"]] == [
        (S + "x-0", "dra-h100-1", "dra-h100-0")
    ]


def test_the_extender_ranks_a_pending_share_by_its_share() -> None:
    """A pending pod asking 40Gi (500 milli): dra-h100-0's gpu-1 has 500 free, dra-h100-1's GPU
    625: both are ranked. Asking 75Gi (938): neither is (the scheduler's allocator agrees: no
    GPU has 75Gi left), so the extender gives no preference. DRA pods are never filtered by the
    extender (the scheduler's own allocator decides where claims fit)."""
    data = two_nodes()
    nodes, pods, _, _ = records(data)
    ctx = dra_context(data)
    assert ctx is not None
    by_node: dict[str, list[PodRecord]] = {}
    for p in pods:
        by_node.setdefault(p.node, []).append(p)
    models = {n.name: model_of(n, None, by_node.get(n.name, []), dra=ctx)[0] for n in nodes}
    shapes = {
        "mid": Shape(cpu_milli=4000, memory_mib=16384, gpus=1, gpu_milli=500, dra=True),
        "big": Shape(cpu_milli=4000, memory_mib=16384, gpus=1, gpu_milli=938, dra=True),
    }
    adv = PlacementAdvisor(
        models,
        lambda: Workload(tuple(shapes.values())),
        shape_of=lambda p: shapes.get(p.name),
    )
    names = ("dra-h100-0", "dra-h100-1")
    mid = PodRecord(S[:-1], "mid", cpu_milli=4000)
    big = PodRecord(S[:-1], "big", cpu_milli=4000)
    assert adv.filter(mid, names) == {}
    assert adv.filter(big, names) == {}
    assert all(v > 0 for v in adv.prioritize(mid, names).values())
    assert adv.prioritize(big, names) == dict.fromkeys(names, 0)
    # the shape the extender gets for a pending pod is its claims' (shape_of, as the reconciler)
    big_0 = next(p for p in pods if p.name == "big-0")
    assert shape_of(big_0, ctx) == replace(
        shapes["big"], cpu_milli=big_0.cpu_milli, memory_mib=big_0.memory_mib
    )


# ---- the allocator's arithmetic -------------------------------------------------------------


def device(*caps: tuple[str, str], policies: tuple[CapacityPolicy, ...] = ()) -> Device:
    return Device("gpu-0", capacity=caps, multiple=True, policies=policies)


MEM = ("memory", "80Gi")
COMPUTE = ("compute", "100")
RANGE = CapacityPolicy("memory", default="10Gi", min="10Gi", step="5Gi")
VALUES = CapacityPolicy("compute", default="10", valid_values=("10", "25", "50", "100"))


@pytest.mark.parametrize(
    ("asked", "memory", "compute"),
    [
        ((), 10 * GI, 10),  # nothing asked: each capacity's default
        ((("memory", "1Gi"),), 10 * GI, 10),  # below min: min
        ((("memory", "33Gi"),), 35 * GI, 10),  # up to min + k x step
        ((("memory", "35Gi"),), 35 * GI, 10),
        ((("compute", "26"),), 10 * GI, 50),  # up to the next valid value
        ((("compute", "100"),), 10 * GI, 100),
    ],
)
def test_consumed_is_the_request_rounded_by_the_policy(
    asked: tuple[tuple[str, str], ...], memory: int, compute: int
) -> None:
    caps = dc.capacities(device(MEM, COMPUTE, policies=(RANGE, VALUES)))
    assert dc.consumed(caps, asked) == {"memory": Fraction(memory), "compute": Fraction(compute)}


def test_requests_a_device_cannot_serve() -> None:
    caps = dc.capacities(device(MEM, COMPUTE, policies=(RANGE, VALUES)))
    assert dc.consumed(caps, (("bandwidth", "1"),)) is None  # a capacity it does not publish
    assert dc.consumed(caps, (("compute", "101"),)) is None  # above every valid value
    capped = CapacityPolicy("memory", min="10Gi", max="40Gi", step="5Gi")
    assert (
        dc.consumed(dc.capacities(device(MEM, policies=(capped,))), (("memory", "41Gi"),)) is None
    )
    # no policy: the request as it is; no request and no default: the whole value
    plain = dc.capacities(device(MEM, COMPUTE))
    assert dc.consumed(plain, (("memory", "3Gi"),)) == {
        "memory": Fraction(3 * GI),
        "compute": Fraction(100),
    }


def test_share_is_the_largest_fraction_rounded_up() -> None:
    caps = dc.capacities(device(MEM, COMPUTE))
    assert dc.share(caps, {"memory": Fraction(20 * GI), "compute": Fraction(10)}) == 250
    assert dc.share(caps, {"memory": Fraction(GI), "compute": Fraction(1, 3)}) == 13  # 12.5 -> 13
    assert dc.share(caps, {"memory": Fraction(80 * GI), "compute": Fraction(100)}) == 1000
    assert dc.share({}, {}) == 1000  # a device without capacities is taken whole


# ---- hostile input --------------------------------------------------------------------------


def slice_with(policy: dict[str, Any]) -> dict[str, Any]:
    data = load()
    s: dict[str, Any] = copy.deepcopy(
        next(o for o in data["items"] if o["kind"] == "ResourceSlice")
    )
    s["spec"]["devices"][0]["capacity"]["memory"]["requestPolicy"] = policy
    return s


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"default": "lots"}, "capacity memory requestPolicy: default"),
        ({"validValues": [str(i) for i in range(11)]}, "11 capacity valid values, more than"),
        ({"validRange": {"min": "1Gi", "step": "-"}}, "validRange.step"),
    ],
)
def test_a_bad_request_policy_is_a_one_line_decode_error(
    policy: dict[str, Any], message: str
) -> None:
    with pytest.raises(DecodeError) as e:
        decode_object("ResourceSlice", slice_with(policy))
    text = str(e.value)
    assert "\n" not in text
    assert message in text, text


def test_a_zero_step_or_value_does_not_break_the_arithmetic() -> None:
    """Values the API server refuses, should a stored record carry them: no crash, no division
    by zero."""
    zero = CapacityPolicy("memory", min="10Gi", step="0")
    caps = dc.capacities(device(("memory", "0"), COMPUTE, policies=(zero,)))
    got = dc.consumed(caps, (("memory", "33Gi"),))
    assert got is not None
    assert got["memory"] == 33 * GI
    # memory (value 0) counts for nothing; compute has no default: the whole 100 is consumed
    assert dc.share(caps, got) == 1000
    assert not dc.fits(caps, {}, got)


def test_a_stored_record_with_a_bad_quantity_is_refused_in_one_line() -> None:
    """A record written to the store by anyone (not the decoder) is held to the same rules: a
    capacity, policy or consumed amount that is not a quantity is refused, never parsed later."""
    s = decode_object("ResourceSlice", slice_with({"default": "8Gi"}))
    assert isinstance(s, SliceRecord)
    d = s.devices[0]
    bad_policy = msgspec.structs.replace(d, policies=(CapacityPolicy("memory", step="5 gigs"),))
    bad_capacity = msgspec.structs.replace(d, capacity=(("memory", "lots"),))
    for dev in (bad_policy, bad_capacity):
        with pytest.raises(ValueError, match="malformed quantity") as e:
            check_record(msgspec.structs.replace(s, devices=(dev,)))
        assert "\n" not in str(e.value)
    c = decode_object(
        "ResourceClaim", next(o for o in load()["items"] if o["kind"] == "ResourceClaim")
    )
    assert isinstance(c, ClaimRecord)
    a = msgspec.structs.replace(c.allocated[0], consumed=(("memory", "-"),))
    with pytest.raises(ValueError, match="consumed"):
        check_record(msgspec.structs.replace(c, allocated=(a,)))
    check_record(c)


def test_device_plugin_gpus_beside_shared_dra_gpus_are_still_attributed() -> None:
    """A node with two device-plugin GPUs as well as the shared DRA ones: the whole GPU a pod
    holds through `nvidia.com/gpu` is still attributed to it (its move frees that GPU)."""
    data = load()
    items = data["items"]
    n = next(o for o in items if o["kind"] == "Node")
    for res in (n["status"]["allocatable"], n["status"]["capacity"]):
        res["nvidia.com/gpu"] = "2"
    plain = copy.deepcopy(next(o for o in items if o["kind"] == "Pod"))
    plain["metadata"]["name"] = "plain-0"
    del plain["spec"]["resourceClaims"]
    del plain["status"]["resourceClaimStatuses"]
    c = plain["spec"]["containers"][0]
    c["resources"] = {
        "requests": {"cpu": "4", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    items.append(plain)
    nodes, pods, _, _ = records(data)
    ctx = dra_context(data)
    positions: dict[str, list[tuple[object, ...]]] = {}
    node, _ = model_of(nodes[0], None, pods, dra=ctx, positions=positions)
    assert node.sharing == "dra consumable capacity (2 shared GPUs), exact"
    asg = attribute_pods(node, pods, positions)
    assert len(asg[S + "plain-0"]["gpus"]) == 1
    assert asg[S + "qwen-0"]["dra_gpus"] == [(0, 0, 250)]
