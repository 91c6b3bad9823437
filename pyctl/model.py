"""pyctl's records: the cluster as the core sees it (nodes, NUMA zones, GPUs, MIG instances) and
the workload (task shapes). Plain, immutable values; parsing and validation live in
`pyctl.snapshot`, scoring in `pyctl.fragmentation`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias, get_args

PolicyName: TypeAlias = Literal["none", "best-effort", "restricted", "single-numa-node"]
ManagerPolicy: TypeAlias = Literal["none", "static"]

#: the kubelet Topology Manager's policies, and its CPU and memory managers' (every list of these
#: names in pyctl is one of these)
TOPOLOGY_POLICIES: Final[tuple[PolicyName, ...]] = get_args(PolicyName)
MANAGER_POLICIES: Final[tuple[ManagerPolicy, ...]] = get_args(ManagerPolicy)
#: the policy of a node that says none (the kubelet's default); the `default_topology_policy`
#: setting's default
DEFAULT_TOPOLOGY_POLICY: Final[PolicyName] = "none"
GPU_MILLI: Final = 1000


@dataclass(frozen=True, slots=True)
class Gpu:
    """A whole (or shared) GPU: `used_milli` of 1000 is in use. On a shared GPU, `holders` says
    which pod holds how much of it ((pod key, milli), docs/sharing.md); the rest of
    `used_milli` is capacity no replica can use."""

    id: int
    used_milli: int = 0
    holders: tuple[tuple[str, int], ...] = ()
    #: its link group on the node (GPUs of one group share an NVLink bridge, switch or Fabric
    #: Manager partition; docs/fabric.md); None: not known
    link: int | None = None
    #: its link groups at given sizes, (size, group) by size: the group among groups of at most
    #: `size` GPUs (the NVIDIA DRA driver's Fabric Manager partitions, `partition<size>`);
    #: `link` is the level of any size
    link_levels: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance of `profile` at memory-slice `start`; `pod` uses it when known."""

    profile: str
    start: int
    used: bool = False
    pod: str | None = None


@dataclass(frozen=True, slots=True)
class MigGpu:
    """A GPU in MIG mode. `dra`: published by a DRA driver (only DRA requests can use it).
    `dynamic`: partitioned on demand (the NVIDIA DRA driver's DynamicMIG): `instances` are the
    allocated placements, and any placement within the free memory slices can be allocated;
    `free_slices` is the bit mask of free memory slices the driver's counters show (None: the
    slices no instance covers)."""

    gpu: int
    instances: tuple[MigInstance, ...] = ()
    dra: bool = False
    dynamic: bool = False
    free_slices: int | None = None


@dataclass(frozen=True, slots=True)
class Zone:
    """One NUMA zone of a node, with its CPU, memory and the GPUs attached to it: `gpus` of the
    device plugin, `dra_gpus` published by a DRA driver (each usable only by its own kind of
    request)."""

    numa: int
    cpu_milli: int = 0
    cpu_milli_used: int = 0
    memory_mib: int = 0
    memory_mib_used: int = 0
    gpus: tuple[Gpu, ...] = ()
    mig: tuple[MigGpu, ...] = ()
    dra_gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_model: str = ""
    topology_policy: PolicyName = "none"
    cpu_manager_policy: ManagerPolicy = "static"
    memory_manager_policy: ManagerPolicy = "none"
    zones: tuple[Zone, ...] = ()
    #: the sharing pool of its whole/shared GPUs ("" is nvidia.com/gpu; docs/sharing.md)
    gpu_pool: str = ""
    #: replicas per GPU (time-slicing, MPS); 1: not replicated
    gpu_replicas: int = 1
    #: memory of each GPU in MiB (0: unknown), for shapes that ask for GPU memory
    gpu_memory_mib: int = 0
    #: how the GPU shares were read, for display ("time-slicing x4, attributed", "hami, exact")
    sharing: str = ""
    #: labels that may name the node's topology domains, (key, value) sorted by key: an NVLink
    #: clique, a rack, a leaf block (docs/fabric.md; the controller keeps only the configured
    #: levels' keys)
    labels: tuple[tuple[str, str], ...] = ()
    #: how the pods' GPUs were attributed, for display: "agent (exact: ...)" where `pyctl agent`
    #: speaks for the node, "rules (why)" where it does not, "" where there is no agent
    gpu_source: str = ""
    #: its RDMA resource (the extended resource `rdma_resource` names: shared HCA devices,
    #: bandwidth shares), allocatable and requested by its pods, node-wide; 0: none
    rdma: int = 0
    rdma_used: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True)
class Gang:
    """`pods` pods of one shape that must all run inside one topology domain: the nodes that
    share the value of the label `key` (`nvidia.com/gpu.clique`, a leaf or block label;
    docs/fabric.md)."""

    pods: int
    key: str


@dataclass(frozen=True, slots=True)
class Shape:
    """A task shape of the workload M. `gpu_milli` is the per-GPU share (1000 = whole GPU; 0
    with `gpus` >= 1: one replica of each GPU, whose size the node says); `gpu_memory_mib` asks
    for that much memory of each GPU too (its fraction of the node's GPU memory); `gpu_pool`
    is the sharing pool its GPUs come from (docs/sharing.md). A MIG shape names `mig_profile`
    and needs one free instance of exactly that profile. `dra`: asked through a DRA
    ResourceClaim (served by DRA devices only, admitted by the claim's own constraints instead
    of the Topology Manager); `numa_aligned`: the claim asks its devices to share a NUMA node
    (matchAttribute on numaNode, or pcieRoot)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    mig_profile: str | None = None
    gpu_models: tuple[str, ...] = ()
    weight: float = 1.0
    dra: bool = False
    numa_aligned: bool = False
    gpu_pool: str = ""
    gpu_memory_mib: int = 0
    #: the gang its pods belong to (they need one domain of a level); None: each pod alone
    gang: Gang | None = None
    #: its GPUs must share one link group of the node (on nodes that publish links)
    link_group: bool = False
    #: of the node's RDMA resource (`Node.rdma`), node-wide like CPU; 0: none
    rdma: int = 0

    @property
    def is_cpu_only(self) -> bool:
        return self.gpus == 0 and self.mig_profile is None

    def key(
        self,
    ) -> tuple[
        int, int, int, str | None, tuple[str, ...], bool, bool, str, int, Gang | None, bool, int
    ]:
        """Identity of a shape without its weight (FGD keys shapes by CPU, GPU share, count and
        type; DRA shapes also by how they are admitted; sharing adds the pool and the GPU
        memory asked for; a gang's pods are a shape of their own)."""
        return (
            self.cpu_milli,
            self.gpu_milli,
            self.gpus,
            self.mig_profile,
            self.gpu_models,
            self.dra,
            self.numa_aligned,
            self.gpu_pool,
            self.gpu_memory_mib,
            self.gang,
            self.link_group,
            self.rdma,
        )


@dataclass(frozen=True, slots=True)
class Workload:
    shapes: tuple[Shape, ...] = field(default_factory=tuple)
