"""The inputs of the Rust core (`pyctl._core`, typed in `pyctl/_core.pyi`): the dicts (and dicts of
columns) its functions read, one TypedDict each.

The core declares the same types (`rust/src/python/inputs.rs`: per type its keys, the Python type
each holds and whether the reader requires it) and returns the declarations from
`_core.input_types()`; `tests/unit/test_core_types.py` checks the two agree key by key. A key the
core reads is `Required` here when the core refuses the dict without it, `NotRequired` when it
takes a default.

(No `from __future__ import annotations` in this module: with it, Python 3.11 reads
`NotRequired[...]` as a string and counts every key as required.)"""

from collections.abc import Sequence
from typing import NotRequired, TypedDict

from pyctl.core.types import Assignment

# ---- fragmentation, placement, compaction (rust/src/python/fragment.rs, shape.rs) ---------------


class ShapeInput(TypedDict):
    """A task shape (`pyctl.model.Shape` as the core reads it: `fragmentation.shape_dict`).
    An absent key (or None) is 0, empty or false. `weight` is required of a workload's shapes; a
    single task's weight is ignored. `rdma` is of the node's RDMA resource (`node_rdma`; the
    trace replay's: percent of one RNIC)."""

    cpu_milli: NotRequired[int]
    memory_mib: NotRequired[int]
    gpus: NotRequired[int]
    gpu_milli: NotRequired[int]
    mig_profile: NotRequired[str | None]
    gpu_models: NotRequired[list[str]]
    gpu_pool: NotRequired[str]
    gpu_memory_mib: NotRequired[int]
    weight: float
    dra: NotRequired[bool]
    numa_aligned: NotRequired[bool]
    link_group: NotRequired[bool]
    rdma: NotRequired[int]


class ClusterColumns(TypedDict):
    """A cluster snapshot in columns (`FragmentModel(columns)`;
    `pyctl.core.fragmentation.snapshot_columns`): per node, per zone (in node order), per GPU,
    MIG GPU and MIG instance; `*_offsets` say where each node's zones, each zone's GPUs... start.
    The optional columns are empty when absent."""

    node_names: list[str]
    node_models: list[str]
    node_policies: list[str]
    node_cpu_static: list[bool]
    node_memory_static: list[bool]
    zone_offsets: list[int]
    zone_numa: list[int]
    zone_cpu_milli: list[int]
    zone_cpu_used: list[int]
    zone_memory_mib: list[int]
    zone_memory_used: list[int]
    gpu_offsets: list[int]
    gpu_ids: list[int]
    gpu_used_milli: list[int]
    gpu_link_groups: NotRequired[list[int]]
    node_link_offsets: NotRequired[list[int]]
    link_sizes: NotRequired[list[int]]
    link_gpu_ids: NotRequired[list[int]]
    link_groups: NotRequired[list[int]]
    mig_offsets: list[int]
    mig_gpu_ids: list[int]
    instance_offsets: list[int]
    instance_profiles: list[str]
    instance_starts: list[int]
    instance_used: list[bool]
    dra_gpu_offsets: NotRequired[list[int]]
    dra_gpu_ids: NotRequired[list[int]]
    dra_gpu_used_milli: NotRequired[list[int]]
    mig_dra: NotRequired[list[bool]]
    mig_dynamic: NotRequired[list[bool]]
    mig_free_slices: NotRequired[list[int]]
    node_gpu_pools: NotRequired[list[str]]
    node_gpu_replicas: NotRequired[list[int]]
    node_gpu_memory_mib: NotRequired[list[int]]
    node_rdma: NotRequired[list[int]]
    node_rdma_used: NotRequired[list[int]]


class AssignmentInput(TypedDict, total=False):
    """Where a task sits on a node, as any part of an `Assignment` (what the core returns), its
    rows in lists or tuples: an absent key is nothing taken. The core takes either."""

    cpu: Sequence[tuple[int, int]]
    memory: Sequence[tuple[int, int]]
    gpus: Sequence[tuple[int, int, int]]
    mig: tuple[int, int, int] | None
    dra_gpus: Sequence[tuple[int, int, int]]
    dyn_whole: Sequence[tuple[int, int]]
    mig_new: tuple[int, int, str, int] | None
    rdma: int


class MovableInput(TypedDict):
    """A pod the compaction planner may move (`FragmentModel.plan`): its node (index), where it
    sits there and its shape; `allowed` indexes the plan's node sets (None: any node), `pdb` its
    budgets' headroom, and pods of one `group` never move in the same plan."""

    node: int
    assignment: Assignment | AssignmentInput
    shape: ShapeInput
    allowed: NotRequired[int | None]
    pdb: NotRequired[int | None]
    group: NotRequired[int | None]


class PendingInput(TypedDict):
    """A pending pod of `FragmentModel.plan`: its shape and where it may go."""

    shape: ShapeInput
    allowed: NotRequired[int | None]


class PlanLimitsInput(TypedDict, total=False):
    """The compaction planner's limits (absent or None: the core's default)."""

    max_moves: int | None
    min_gain: float
    max_moves_per_node: int | None
    rescue_depth: int | None
    max_rescues: int | None
    rescue_budget: int | None
    defragment: bool


# ---- trace replay (rust/src/python/replay.rs) ---------------------------------------------------


class ReplayNodes(TypedDict):
    """The replay's nodes in columns, one entry per node each (`rdma`: percent of one RNIC,
    100 per RNIC; absent: 0)."""

    name: list[str]
    cpu_milli: list[int]
    memory_mib: list[int]
    gpu: list[int]
    model: list[str]
    rdma: NotRequired[list[int]]


class ReplayTasks(TypedDict):
    """The trace replay's tasks in columns, one entry per task each (`gpu_models`: the models a
    task may use, none: any)."""

    cpu_milli: list[int]
    memory_mib: list[int]
    num_gpu: list[int]
    gpu_milli: list[int]
    gpu_models: NotRequired[list[list[str]]]
    rdma: NotRequired[list[int]]


class ReplayInstances(ReplayTasks):
    """The inference replay's instances: a task's columns, its app, the most instances of the
    app on one node (0 or less: no limit), and when it arrives and departs (seconds; None or NaN:
    before the start, after the end)."""

    app: list[int]
    max_per_node: list[int]
    arrive: list[float | None]
    depart: list[float | None]


class ReplayCompaction(TypedDict, total=False):
    """The trace replay's compaction settings (absent: the default)."""

    every: int
    budget: float
    max_moves: int
    min_gain: float
    reserve: float
    rescue_depth: int
    rescue_budget: int


class EventCompaction(TypedDict, total=False):
    """The inference replay's compaction settings (absent: the default)."""

    interval: float
    budget_per_day: float
    max_moves: int
    min_gain: float
    rescue_depth: int
    rescue_budget: int
    min_pod_age: float


# ---- MIG planner (rust/src/python/mig.rs) -------------------------------------------------------


class MigInstanceInput(TypedDict):
    """A MIG instance of a GPU: its profile, its first memory slice, whether a pod uses it."""

    profile: str
    start: int
    used: NotRequired[bool | None]
    pod: NotRequired[str | None]


class MigGpuInput(TypedDict):
    """A MIG GPU of the node `mig_plan` plans: its index and its instances."""

    gpu: int
    instances: NotRequired[list[MigInstanceInput] | None]


class MigPendingInput(TypedDict):
    """Pending requests of a profile (count absent or None: 1)."""

    profile: str
    count: NotRequired[int | None]


class MigWorkloadInput(TypedDict):
    """A MIG profile of the workload M and its weight."""

    profile: str
    weight: float


class MigLimitsInput(TypedDict, total=False):
    """`mig_plan`'s limits: the GPUs it may change, the most used instances it may destroy, the
    executor (absent or None: every GPU, no limit, the default executor)."""

    gpus: list[int] | None
    max_used_destroyed: int | None
    executor: str | None


# ---- topology merge (rust/src/python/topology.rs) -----------------------------------------------


class TopologyHintInput(TypedDict):
    """A provider's hint (affinity None: any NUMA node)."""

    affinity: list[int] | None
    preferred: bool
