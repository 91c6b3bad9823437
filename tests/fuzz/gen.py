"""Hypothesis strategies for the fuzz tier: random JSON, quantities, and mutations of valid
templates (a real GPU Node, a Pod with every scheduling constraint pyctl reads, a PDB, a
NodeResourceTopology, a workflow record, a summary, the command line's files).

A mutation picks a place in a valid document and replaces it (a random value, a quantity, a huge
or negative number, a long list, a long string), deletes it, or splices in raw bytes (deep
nesting, NaN, truncation); the document stays mostly valid, so the mutation reaches the code past
the parser."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from pyctl.cluster import bounds
from tests.e2e.dra_driver_sim import GPU_CLASS, SimGpu, SimNode, device_classes, slices_for

# -- values ---------------------------------------------------------------------------------------

HUGE_INTS = st.sampled_from(
    [
        -1,
        -(2**31),
        2**31,
        2**32,
        4294967296,
        2**53 + 1,
        2**63,
        10**21,
        10**400,
        bounds.MAX_GPUS_PER_NODE,
        bounds.MAX_GPUS_PER_NODE + 1,
        bounds.MAX_MIG_PER_NODE + 1,
        bounds.MAX_NUMA_ID + 1,
    ]
)
SPECIAL_FLOATS = st.sampled_from([0.5, -0.0, 1e308, -1e308, 1e-320, 3.5e38])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    HUGE_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    SPECIAL_FLOATS,
    st.text(max_size=40),
    st.sampled_from(["", "0", "-1", "1e30", "NaN", "Infinity", "nvidia.com/gpu", "²", "٣"]),
)
JSON = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=30,
)

QUANTITY = st.one_of(
    st.from_regex(
        r"\A[+-]?[0-9]{1,25}(\.[0-9]{0,6})?([eE][+-]?[0-9]{1,3}|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?\Z"
    ),
    st.sampled_from(
        ["4294967296", "999999999999999999999", "1e30", "-1", "0.5", "1.5", "", "1e-30", "NaN"]
    ),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=70),
)

# -- templates ------------------------------------------------------------------------------------


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "10",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig.config": "all-balanced",
                "nvidia.com/mig.config.state": "success",
                **{f"nvidia.com/gpu-{i}-numa": str(i * 2 // gpus) for i in range(gpus)},
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {
                "cpu": "63500m",
                "memory": "1000Gi",
                "nvidia.com/gpu": str(gpus - 2),
                "nvidia.com/mig-1g.5gb": "4",
                "nvidia.com/mig-3g.20gb": "2",
            },
            "capacity": {"cpu": "64", "memory": "1024Gi", "nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(
    name: str, node_name: str = "", gpus: int = 1, mig: str = "", pending: bool = False
) -> dict[str, Any]:
    limits: dict[str, Any] = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if mig:
        limits[f"nvidia.com/mig-{mig}"] = "1"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "serving",
            "uid": f"uid-{name}",
            "resourceVersion": "20",
            "creationTimestamp": "2024-06-01T10:00:00Z",
            "labels": {"app": "llm", "tier": "s"},
            "annotations": {"pyctl.io/evict": "true"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "llm-abc", "controller": True}],
        },
        "spec": {
            "nodeName": node_name,
            "priority": 100,
            "priorityClassName": "normal",
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "4", "memory": "16Gi"},
                        "limits": limits,
                    },
                }
            ],
            "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}}}],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["a", "b"],
                                    }
                                ]
                            }
                        ]
                    }
                },
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "other"}},
                        }
                    ]
                },
            },
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app": "llm"}},
                }
            ],
        },
        "status": {
            "phase": "Pending" if pending else "Running",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available",
                }
            ]
            if pending
            else [{"type": "PodScheduled", "status": "True"}],
        },
    }


def pdb(name: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "serving", "uid": f"uid-pdb-{name}"},
        "spec": {
            "maxUnavailable": 1,
            "selector": {
                "matchLabels": {"app": "llm"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["s"]}],
            },
        },
        "status": {
            "disruptionsAllowed": 1,
            "currentHealthy": 3,
            "desiredHealthy": 2,
            "expectedPods": 3,
        },
    }


def nrt(name: str, used: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name, "uid": f"uid-nrt-{name}"},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": [
            {
                "name": f"node-{z}",
                "type": "Node",
                "resources": [
                    {
                        "name": "cpu",
                        "capacity": "32",
                        "allocatable": "31750m",
                        "available": f"{31 - 4 * used[z]}",
                    },
                    {
                        "name": "memory",
                        "capacity": "512Gi",
                        "allocatable": "500Gi",
                        "available": "400Gi",
                    },
                    {
                        "name": "nvidia.com/gpu",
                        "capacity": "4",
                        "allocatable": "3",
                        "available": str(3 - used[z]),
                    },
                ],
            }
            for z in (0, 1)
        ],
    }


def _requests(count: int = 1) -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpus",
                    "exactly": {
                        "deviceClassName": GPU_CLASS,
                        "count": count,
                        "selectors": [
                            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].index < 8"}}
                        ],
                    },
                }
            ],
            "constraints": [{"matchAttribute": "resource.kubernetes.io/numaNode"}],
        }
    }


def claim(name: str, allocated: bool = False) -> dict[str, Any]:
    """A ResourceClaim for one GPU, allocated on node a (reserved for pod p) or not."""
    status: dict[str, Any] = {}
    if allocated:
        status = {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": GPU_CLASS, "pool": "a", "device": "gpu-0"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["a"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-p"}],
        }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "serving", "uid": f"uid-{name}"},
        "spec": _requests(),
        "status": status,
    }


def shared_claim() -> dict[str, Any]:
    """A claim holding a share of node s's shared GPU (consumable capacity), reserved for pod p."""
    c = claim("a", allocated=True)
    c["metadata"]["name"] = "share"
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"memory": "20Gi", "compute": "25"}
    }
    alloc = c["status"]["allocation"]
    alloc["devices"]["results"][0] |= {
        "pool": "s",
        "shareID": "3f0e5a54-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": "20Gi", "compute": "25"},
    }
    alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["s"]
    return c


def dra_pod(p: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """`p` with one `spec.resourceClaims` entry (and its generated claim's status when it comes
    from a template)."""
    out = copy.deepcopy(p)
    out["spec"]["resourceClaims"] = [entry]
    if "resourceClaimTemplateName" in entry:
        out["status"]["resourceClaimStatuses"] = [{"name": entry["name"], "resourceClaimName": "q"}]
    return out


def claim_template() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus", "namespace": "serving"},
        "spec": {"spec": _requests(2)},
    }


def topology(api_version: str, name: str = "fabric") -> dict[str, Any]:
    """Kueue's (kueue.x-k8s.io/v1beta1) or KAI's (kai.scheduler/v1alpha1) Topology."""
    return {
        "apiVersion": api_version,
        "kind": "Topology",
        "metadata": {"name": name, "uid": f"uid-topology-{name}"},
        "spec": {
            "levels": [
                {"nodeLabel": "network.topology.nvidia.com/spine"},
                {"nodeLabel": "nvidia.com/gpu.clique"},
                {"nodeLabel": "kubernetes.io/hostname"},
            ]
        },
    }


def compute_domain_clique(cd: str = "cd-uid", clique: str = "uuid-a.1") -> dict[str, Any]:
    """The NVIDIA DRA driver's ComputeDomainClique (resource.nvidia.com/v1beta1)."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomainClique",
        "metadata": {"name": f"{cd}.{clique}", "namespace": "nvidia-dra-driver-gpu"},
        "daemons": [
            {
                "nodeName": n,
                "ipAddress": f"10.0.0.{i}",
                "cliqueID": clique,
                "index": i,
                "status": "Ready",
            }
            for i, n in enumerate(("a", "c"))
        ],
    }


def hypernode(name: str = "rack-1", tier: int = 1) -> dict[str, Any]:
    """Volcano's HyperNode (topology.volcano.sh/v1alpha1): a member of each selector, and one
    HyperNode member."""
    return {
        "apiVersion": "topology.volcano.sh/v1alpha1",
        "kind": "HyperNode",
        "metadata": {"name": name, "uid": f"uid-hypernode-{name}"},
        "spec": {
            "tier": tier,
            "tierName": "rack",
            "members": [
                {"type": "Node", "selector": {"exactMatch": {"name": "a"}}},
                {"type": "Node", "selector": {"regexMatch": {"pattern": "^c[0-9]*$"}}},
                {
                    "type": "Node",
                    "selector": {"labelMatch": {"matchLabels": {"example.com/rack": "r1"}}},
                },
                {"type": "HyperNode", "selector": {"exactMatch": {"name": "block-1"}}},
            ],
        },
    }


def pod_group(name: str = "llm", mode: str = "hard", sub_groups: bool = False) -> dict[str, Any]:
    """Volcano's PodGroup (scheduling.volcano.sh/v1beta1) with a networkTopology; with
    `sub_groups`, at tier 2, and the `subGroupPolicy` Volcano's job controller writes for a task
    with a `partitionPolicy` (partitions of 2 pods, each in one tier-1 HyperNode)."""
    doc: dict[str, Any] = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-podgroup-{name}"},
        "spec": {
            "minMember": 4,
            "networkTopology": {"mode": mode, "highestTierAllowed": 1},
        },
    }
    if sub_groups:
        doc["spec"]["networkTopology"]["highestTierAllowed"] = 2
        doc["spec"]["subGroupPolicy"] = [
            {
                "name": "worker",
                "subGroupSize": 2,
                "minSubGroups": 2,
                "labelSelector": {"matchLabels": {"volcano.sh/task-spec": "worker"}},
                "matchLabelKeys": ["volcano.sh/partition-id"],
                "networkTopology": {"mode": mode, "highestTierAllowed": 1},
            }
        ]
    return doc


def kueue_workload(name: str = "llm", quota: bool = True) -> dict[str, Any]:
    """Kueue's Workload of a pod group of two pods, not admitted: for lack of quota, or of room
    in a domain (the messages of Kueue v0.17.0's flavor assigner and TAS)."""
    message = (
        "couldn't assign flavors to pod set llm: insufficient unused quota for nvidia.com/gpu "
        "in flavor default, 8 more needed"
        if quota
        else 'couldn\'t assign flavors to pod set llm: topology "cliques" allows to fit only 2 '
        "out of 4 pod(s)"
    )
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-workload-{name}",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": f"{name}-{i}", "uid": f"uid-{i}"}
                for i in range(2)
            ],
        },
        "spec": {"queueName": "gpus", "podSets": [{"name": "llm", "count": 2}]},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                }
            ]
        },
    }


TEMPLATES: dict[str, list[Any]] = {
    "Node": [node("a"), node("c", gpus=4), node("s", gpus=0)],
    "Pod": [
        pod("p", "a"),
        pod("q", "", gpus=2, pending=True),
        pod("r", "", gpus=0, mig="3g.20gb", pending=True),
        # the plausible mistake: whole GPUs and a MIG instance at once
        pod("s", "", gpus=2, mig="1g.5gb", pending=True),
        pod("t", "b", gpus=0, mig="1g.5gb"),
        # DRA: a running pod of the allocated claim, a pending one asking through a template
        dra_pod(pod("p", "a", gpus=0), {"name": "gpus", "resourceClaimName": "a"}),
        dra_pod(
            pod("d", "", gpus=0, pending=True),
            {"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
        ),
    ],
    "PodDisruptionBudget": [pdb()],
    "NodeResourceTopology": [nrt("a"), nrt("c", (0, 0))],
    # DRA (resource.k8s.io/v1), as the simulated NVIDIA driver of the e2e tests publishes it
    "DeviceClass": device_classes(),
    "ResourceSlice": [
        *slices_for(SimNode("a", [SimGpu(0, 0), SimGpu(1, 1)])),
        *slices_for(SimNode("c", [SimGpu(0, 0, dynamic_mig=True)])),
        # GPUs several claims share by capacity (allowMultipleAllocations, request policies)
        *slices_for(SimNode("s", [SimGpu(0, 0, shared=True)])),
    ],
    "ResourceClaim": [claim("a", allocated=True), claim("q"), shared_claim()],
    "ResourceClaimTemplate": [claim_template()],
    # the fabric's sources (docs/fabric.md)
    "KueueTopology": [topology("kueue.x-k8s.io/v1beta1")],
    "KaiTopology": [topology("kai.scheduler/v1alpha1")],
    "ComputeDomainClique": [compute_domain_clique()],
    "HyperNode": [hypernode()],
    "PodGroup": [pod_group(), pod_group("parts", sub_groups=True)],
    "KueueWorkload": [kueue_workload(quota=False), kueue_workload()],
}

# -- mutations ------------------------------------------------------------------------------------

Path = tuple[str | int, ...]


def paths(doc: Any, prefix: Path = ()) -> list[Path]:
    """Every place in `doc` (the root excluded)."""
    out: list[Path] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.append((*prefix, k))
            out += paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.append((*prefix, i))
            out += paths(v, (*prefix, i))
    return out


#: mutations, amounts weighted up (they reach the code past the parser)
OPS = ["value", "number", "delete", "delete", "long_list", "long_text", "raw", "many"]
OPS += ["quantity"] * 8

_HOT = (
    "requests",
    "limits",
    "allocatable",
    "capacity",
    "available",
    "numa",
    "gpu.count",
    "priority",
    "maxSkew",
    "minDomains",
    "disruptionsAllowed",
    "expectedPods",
)


def _hot(p: Path) -> bool:
    """A place whose value is an amount (a quantity, a count, a NUMA id)."""
    return any(isinstance(k, str) and any(h in k for h in _HOT) for k in p)


MARK = "\u0000PYCTL-RAW\u0000"
RAW = st.sampled_from(
    [
        b"[" * 50_000 + b"]" * 50_000,
        b'{"a": ' * 50_000 + b"1" + b"}" * 50_000,
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e400",
        b"9" * 5000,
        b'"' + b"x" * (bounds.MAX_TEXT_CHARS + 1) + b'"',
        b'"\\ud800"',
        b"[" + b"1," * (bounds.MAX_ITEMS + 1) + b"1]",
    ]
)


@st.composite
def mutated(draw: st.DrawFn, template: Any, max_mutations: int = 2) -> bytes:
    """`template` with 1 to `max_mutations` mutations, as JSON bytes (possibly broken)."""
    doc = copy.deepcopy(template)
    raws: list[bytes] = []
    for _ in range(draw(st.integers(1, max_mutations))):
        places = paths(doc)
        if not places:
            break
        op = draw(st.sampled_from(OPS))
        hot = [p for p in places if op == "quantity" and _hot(p)]
        where = draw(st.sampled_from(hot or places))
        parent: Any = doc
        for k in where[:-1]:
            parent = parent[k]
        key = where[-1]
        if op == "delete":
            del parent[key]
            continue
        if op == "value":
            new: Any = draw(JSON)
        elif op == "quantity":
            new = draw(QUANTITY)
        elif op == "number":
            new = draw(HUGE_INTS)
        elif op == "long_list":
            new = [copy.deepcopy(parent[key])] * draw(st.sampled_from([2, bounds.MAX_ITEMS + 1]))
        elif op == "long_text":
            new = "x" * draw(
                st.sampled_from([bounds.MAX_NAME_CHARS + 1, bounds.MAX_TEXT_CHARS + 1])
            )
        elif op == "many" and isinstance(parent[key], dict):
            n = draw(st.sampled_from([10, bounds.MAX_LABELS + 1]))
            new = {**parent[key], **{f"k{i}": "v" for i in range(n)}}
        else:
            raws.append(draw(RAW))
            new = f"{MARK}{len(raws) - 1}"
        parent[key] = new
    data = json.dumps(doc).encode()
    for i, raw in enumerate(raws):
        data = data.replace(json.dumps(f"{MARK}{i}").encode(), raw)
    cut = draw(st.sampled_from([None] * 8 + ["truncate", "flip"]))
    if cut == "truncate" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif cut == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ (1 << draw(st.integers(0, 7)))]) + data[i + 1 :]
    return data


def document(template: Any) -> st.SearchStrategy[bytes]:
    """Bytes a reader of `template`'s kind may be given: mostly mutations of it, sometimes the
    template itself, random JSON or random bytes."""
    return st.one_of(
        st.just(json.dumps(template).encode()),
        *[mutated(template)] * 6,
        JSON.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=300),
    )
