"""The bounds pyctl holds every object and record to: values a real machine or a real Kubernetes
object cannot exceed, stated once. An object beyond them is left out (counted, logged, and for a
pod reported in an Event) instead of being modelled, so that nothing downstream (translate, the
core, the planners) ever loops over an unbounded count or carries an unbounded list.

Where they are enforced:

- `cluster/kube/wire.py`: list, map and string lengths of what is decoded from the API (msgspec
  checks them while decoding, in C), through the `Annotated` types below;
- `cluster/kube/decode.py`: the object's size, and the amounts parsed from quantities and labels
  (GPU, MIG, CPU, memory, NUMA ids), through `check`;
- `cluster/records.py` `check_record`: the same amounts and lengths, and every string by its
  field, on a record from anywhere (the store, the simulator), used by `cluster/kube/decode.py`,
  by `cluster/translate.py` before it builds a node and by the state store when it reads
  records back.

docs/reliability.md lists them with the reasoning behind each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final, TypeAlias

import msgspec

#: the largest object read from the API, in bytes of JSON. etcd refuses requests above 1.5 MiB
#: (its default `--max-request-bytes`), so the API server never stores a bigger object; twice
#: that leaves room for a raised etcd limit.
MAX_OBJECT_BYTES: Final = 3 << 20

#: the largest file a command reads (a kubectl dump of 10,000 pods is about 200 MiB)
MAX_INPUT_BYTES: Final = 256 << 20

#: `nvidia.com/gpu` units on one node. Physical GPUs per node are at most 16 to 20 today; the
#: device plugin's time-slicing advertises replicas x GPUs (16 GPUs x 64 replicas = 1024).
MAX_GPUS_PER_NODE: Final = 1024
#: `nvidia.com/gpu` a pod may request: no more than a node can have
MAX_GPUS_PER_POD: Final = MAX_GPUS_PER_NODE
#: MIG instances on one node (7 per GPU, the most any MIG geometry has, x 64 GPUs), and of one
#: profile requested by one pod
MAX_MIG_PER_NODE: Final = 7 * 64
MAX_MIG_PER_POD: Final = MAX_MIG_PER_NODE
#: distinct `nvidia.com/mig-<profile>` resources on one object (a GPU model in the MIG catalog
#: has at most 7 profiles, 8 with the `+me` variants)
MAX_MIG_PROFILES: Final = 64
#: CPU in millicores (65,536 cores: 16 times the largest single-system-image machines)
MAX_CPU_MILLI: Final = 65_536 * 1000
#: memory in MiB (1 PiB: 16 times the largest single-system-image machines)
MAX_MEMORY_MIB: Final = 1 << 30
#: most of the RDMA resource (an extended resource: a count) a node or pod holds: 2**40, far
#: beyond any HCA device count or bandwidth share in Mb/s
MAX_RDMA: Final = 1 << 40
#: NUMA node ids (Linux's MAX_NUMNODES is at most 1024: CONFIG_NODES_SHIFT <= 10)
MAX_NUMA_ID: Final = 1023
#: NUMA zones of one node (and GPU index labels `nvidia.com/gpu-<i>-numa`)
MAX_NUMA_ZONES: Final = 1024

#: names (DNS subdomains: node, pod, namespace names) and label keys (a 253-character prefix,
#: '/', a 63-character name)
MAX_NAME_CHARS: Final = 253
MAX_KEY_CHARS: Final = 317
#: every other string a record carries (label values, taint values, uids, resourceVersions, a
#: selector's values, ...): the API server holds most to 63 characters
MAX_TEXT_CHARS: Final = 1024
#: what the API server holds these to: a namespace is a DNS label; a uid is a UUID (36) where
#: the API server makes it, at most 128 where a client names one (an ownerReference); a label's
#: (and a taint's, a toleration's) value is at most 63 characters
MAX_NAMESPACE_CHARS: Final = 63
MAX_UID_CHARS: Final = 128
MAX_LABEL_VALUE_CHARS: Final = 63
#: labels on one object (node feature discovery puts a few hundred on a node)
MAX_LABELS: Final = 4096
#: entries of every other list an object carries (taints, tolerations, containers, volumes,
#: conditions, affinity terms, selector requirements, NodeResourceTopology zones, ...)
MAX_ITEMS: Final = 1024
#: values of one selector requirement (`In` over a list of node names, say)
MAX_VALUES: Final = 16384
#: resources named in one requests/limits/allocatable map
MAX_RESOURCES: Final = 1024
#: priorities, counts and skews: what fits a Kubernetes int32
INT32: Final = (-(1 << 31), (1 << 31) - 1)

#: pods of one gang (a group that must share one topology domain: a LeaderWorkerSet group, a
#: Kueue pod set, a required pod affinity group); a 5,000-node cluster of 8-GPU nodes holds 40,000
MAX_GANG_PODS: Final = 65_536
#: distinct domains pyctl models at one topology level (an NVL72 rack is 18 nodes: 4,096 racks
#: are 73,728 nodes); nodes of the domains beyond it are "no domain", counted and said once
MAX_DOMAINS_PER_LEVEL: Final = 4096
#: a GPU's link group id on its node (the core keeps ids below 2**31 - 1 for groups it names)
MAX_LINK_GROUP: Final = (1 << 30) - 1
#: levels of link groups of given sizes a node may publish (the NVIDIA DRA driver's Fabric
#: Manager partitions: sizes 1, 2, 4 and 8 on an 8-GPU board); a level's size is at most
#: `MAX_GPUS_PER_NODE`
MAX_LINK_LEVELS: Final = 16
#: topology levels (label keys) pyctl models (also the most a Kueue or KAI `Topology` has)
MAX_LEVELS: Final = 16
#: `subGroupPolicy` entries read of a Volcano PodGroup, and `matchLabelKeys` of one (Volcano's
#: job controller writes one entry per task with a `partitionPolicy`, with one key)
MAX_SUB_GROUPS: Final = 64
MAX_SUB_GROUP_KEYS: Final = 16
#: nodes one `ComputeDomainClique` names (an NVLink clique: 18 nodes in an NVL72 rack; the CRD
#: sets no bound, an object of the API server's 3 MiB could name some 30,000)
MAX_CLIQUE_NODES: Final = 1024
#: `ComputeDomainClique` objects whose nodes fill in a clique (one per ComputeDomain and clique);
#: past it the rest (in namespace/name order) are left out, counted
MAX_CLIQUE_OBJECTS: Final = 16384
#: members one Volcano `HyperNode` names (nodes, patterns, label selectors, HyperNodes)
MAX_HYPERNODE_MEMBERS: Final = 1024
#: Volcano `HyperNode` objects read (in name order; past it the rest are left out, counted)
MAX_HYPERNODES: Final = 16384
#: a `HyperNode` member's `regexMatch.pattern` (the CRD sets no bound); see
#: `fabric_decode.safe_pattern` for the patterns read at all
MAX_PATTERN_CHARS: Final = 256
#: `regexMatch` members read over all `HyperNode` objects (each is tried on every node's name)
MAX_HYPERNODE_PATTERNS: Final = 64

#: a workload shape's weight (a workload file may give counts instead of shares); the core
#: normalises weights, so a sum that overflows to inf would silently weigh every shape 0
MAX_WEIGHT: Final = 1e9

#: a federation member's summary: how long it is published to stay fresh (a controller
#: publishes 3 x its interval, at least 30 s), and how far its publication time may be ahead of
#: the reader's clock (both are the Redis TIME of the node holding it: ahead only after a
#: failover to a replica whose clock is). Beyond them a member would look fresh for ever.
MAX_SUMMARY_TTL_SECONDS: Final = 7 * 86400
MAX_SUMMARY_CLOCK_SKEW_SECONDS: Final = 60.0


#: Limits of the objects pyctl decodes: those of k8s.io/api/resource/v1 (validation), so that
#: nothing the API server accepts is refused.
DRA_BOUNDS: Final[Mapping[str, int]] = {
    "devices_per_slice": 128,  # ResourceSliceMaxDevices
    "attributes_and_capacities_per_device": 32,  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
    "counter_sets_per_slice": 8,  # ResourceSliceMaxCounterSets
    "counters_per_set": 32,  # ResourceSliceMaxCountersPerCounterSet
    "consumptions_per_device": 2,  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
    "capacity_valid_values": 10,  # CapacityRequestPolicyDiscreteMaxOptions
    "taints_per_device": 16,  # DeviceTaintsMaxLength
    "list_attribute_items": 64,  # list-type attributes (DRAListTypeAttributes)
    "requests_per_claim": 32,  # DeviceRequestsMaxSize
    "subrequests_per_request": 8,  # FirstAvailableDeviceRequestMaxSize
    "constraints_per_claim": 32,  # DeviceConstraintsMaxSize
    "selectors_per_request": 32,  # DeviceSelectorsMaxSize
    "selector_length": 10 * 1024,  # CELSelectorExpressionMaxLength
    "tolerations_per_request": 16,  # DeviceTolerationsMaxLength
    "results_per_claim": 32,  # AllocationResultsMaxSize
    "reserved_for": 256,  # ResourceClaimReservedForMaxSize
    "count_per_request": 128,  # AllocationResultsMaxSize bounds what ExactCount can ask
    "claims_per_pod": 32,
}

# -- msgspec types: the lengths above, checked while decoding ------------------------------------
Name: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)]
Key: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_KEY_CHARS)]
Text: TypeAlias = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
Labels: TypeAlias = Annotated[dict[Key, Text], msgspec.Meta(max_length=MAX_LABELS)]
Int32: TypeAlias = Annotated[int, msgspec.Meta(ge=INT32[0], le=INT32[1])]
#: a selector requirement's values: label values, or node names for a node selector's
#: `matchFields` on `metadata.name` (the longer: a DNS subdomain), as the records bound them
Values: TypeAlias = Annotated[list[Name], msgspec.Meta(max_length=MAX_VALUES)]
Names: TypeAlias = Annotated[list[Name], msgspec.Meta(max_length=MAX_ITEMS)]


class BoundsError(ValueError):
    """A value beyond its bound; the message names it, its value and the bound."""


def check(what: str, value: int, high: int, low: int = 0) -> int:
    """`value` if `low <= value <= high`; `BoundsError` naming `what` otherwise."""
    if not low <= value <= high:
        shown = str(value) if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise BoundsError(f"{what} is {shown}, outside {low}..{high}")
    return value


def check_len(what: str, n: int, high: int) -> None:
    """A length at most `high`; `BoundsError` otherwise."""
    if n > high:
        raise BoundsError(f"{what} has {n} entries, more than {high}")
