"""The shapes of what the Rust core returns (`pyctl._core`, typed in `pyctl/_core.pyi`).

They are TypedDicts: the extension returns plain dicts and lists (its functions build them in
`rust/src/python/`), and these say which keys and value types each has, so that `mypy --strict`
checks the code that reads them. Defined here rather than in the stub so that other layers can
name them at run time (dataclass fields, annotations); the stub imports them."""

from __future__ import annotations

from typing import Literal, TypedDict

# ---- fragmentation (rust/src/python/fragment.rs) ------------------------------------------------


class _AssignmentRequired(TypedDict):
    #: (zone position, CPU milli) and (zone position, memory MiB) taken per zone
    cpu: list[tuple[int, int]]
    memory: list[tuple[int, int]]
    #: (zone position, GPU position in the zone, milli-GPU) of device-plugin GPUs
    gpus: list[tuple[int, int, int]]
    #: (zone position, MIG GPU position, instance position), or None
    mig: tuple[int, int, int] | None


class Assignment(_AssignmentRequired, total=False):
    """Where a task sits on a node, in positions (`Assignment` in rust/src/fragment/delta.rs):
    the core returns it and takes it back to apply or remove the task. The DRA keys and `rdma`
    are present only when not empty."""

    #: (zone position, DRA GPU position, milli-GPU)
    dra_gpus: list[tuple[int, int, int]]
    #: dynamic MIG GPUs taken whole: (zone position, MIG GPU position)
    dyn_whole: list[tuple[int, int]]
    #: a new placement on a dynamic MIG GPU: (zone position, MIG GPU position, profile, start)
    mig_new: tuple[int, int, str, int]
    #: of the node's RDMA resource (node-wide; present when not 0)
    rdma: int


class ScoreColumns(TypedDict):
    """`FragmentModel.score`: per node (in snapshot order) and per zone (nodes' zones in order),
    and per category name (`CATEGORY_NAMES`) a column of nodes."""

    idle_gpu_milli: list[float]
    fragment_gpu_milli: list[float]
    idle_mig_slices: list[float]
    fragment_mig_slices: list[float]
    recoverable_mig_slices: list[float]
    categories: dict[str, list[float]]
    mig_categories: dict[str, list[float]]
    zone_idle_gpu_milli: list[float]
    zone_fragment_gpu_milli: list[float]
    zone_idle_mig_slices: list[float]
    zone_fragment_mig_slices: list[float]


class DomainRaw(TypedDict):
    """One topology domain of the fabric pass (`rust/src/fragment/fabric.rs` `DomainScore`)."""

    level: int
    domain: int
    nodes: int
    gpu_milli: float
    idle_gpu_milli: float
    fragment_gpu_milli: float
    whole: bool
    #: per gang (input order): pods of its shape the domain could host now
    capacity: list[int]


class FabricRaw(TypedDict):
    """`FragmentModel.fabric`: the domains, and per node (snapshot order) the weighted idle GPU
    a domain without room strands (`domain_split`) and that a gang may not use for want of a
    domain (`no_domain`), milli-GPU."""

    domains: list[DomainRaw]
    node_domain_split: list[float]
    node_no_domain: list[float]


class DeltaRaw(TypedDict):
    """The fragment delta of placing or removing one task, and where it sits."""

    fragment_gpu_milli: float
    fragment_mig_slices: float
    assignment: Assignment


class RankedRaw(TypedDict):
    """The policy's best placement on one node (`rust/src/placement`)."""

    node: int
    rank: tuple[int, int, int]
    inc: float
    cpu_short: bool
    left: int
    idle: int
    assignment: Assignment


class RescueRaw(TypedDict):
    pending: int
    node: int
    assignment: Assignment
    moves: list[int]
    waits: int
    delta: float


#: A planned move; its source node is under the key "from" (a Python keyword, hence the
#: functional form).
PlanMove = TypedDict(
    "PlanMove",
    {
        "pod": int,
        "from": int,
        "to": int,
        "assignment": Assignment,
        "gain": float,
        "rescue": int | None,
    },
)


class PlanRaw(TypedDict):
    """A compaction plan (`rust/src/compaction`)."""

    moves: list[PlanMove]
    rescues: list[RescueRaw]
    unrescued: list[int]
    truncated: bool


# ---- MIG (rust/src/python/mig.rs) ---------------------------------------------------------------


class MigProfileRaw(TypedDict):
    name: str
    id: int
    compute_slices: int
    memory_slices: int
    max_count: int
    #: (start, size) in memory slices
    placements: list[tuple[int, int]]
    media_extensions: bool
    placements_inferred: bool


class MigModelRaw(TypedDict):
    """A GPU model of the MIG catalog (`mig_models`, `mig_model`)."""

    name: str
    aliases: list[str]
    pci_device_ids: list[str]
    memory_slices: int
    compute_slices: int
    placements_inferred: bool
    notes: str
    profiles: list[MigProfileRaw]


class WantedRaw(TypedDict):
    profile: str
    weight: float


class DemandLineRaw(TypedDict):
    profile: str
    pending: int
    served_before: int
    served_after: int
    moved: int
    rehoused: int


class PlannedInstanceRaw(TypedDict):
    profile: str
    start: int
    state: Literal["kept-used", "kept-free", "new"]
    pod: str | None


class DestroyedRaw(TypedDict):
    profile: str
    start: int
    used: bool
    pod: str | None


class ServesRaw(TypedDict):
    profile: str
    count: int


class GpuPlanRaw(TypedDict):
    gpu: int
    changed: bool
    #: the new layout, ascending by start
    layout: list[PlannedInstanceRaw]
    destroyed: list[DestroyedRaw]
    pods_to_move: list[str]
    serves: list[ServesRaw]
    fragment_before: float
    fragment_after: float


class MigPlanRaw(TypedDict):
    """One node's MIG plan (`mig_plan`; the definition: rust/src/mig/planner.rs)."""

    gpu_model: str
    placements_inferred: bool
    executor: str
    exact: bool
    net_served: int
    used_destroyed: int
    free_destroyed: int
    changed_gpus: int
    fragment_before: float
    fragment_after: float
    wanted: list[WantedRaw]
    demand: list[DemandLineRaw]
    gpus: list[GpuPlanRaw]


# ---- trace replay (rust/src/python/replay.rs) ---------------------------------------------------


class Checkpoint(TypedDict):
    """The replay's state when the arrived GPU request reached `arrived_pct`% of capacity."""

    arrived_pct: int
    arrived_milli: int
    allocated_milli: int
    frag_milli: float
    idle_milli: int
    numa_split_milli: float
    arrived_tasks: int
    failed_tasks: int
    evictions: int


class _ReplayRequired(TypedDict):
    policy: str
    seed: int
    gpu_capacity_milli: int
    tasks: int
    placed: int
    failed: int
    failed_admission: int
    evictions: int
    compaction_rounds: int
    checkpoints: list[Checkpoint]


class ReplayRaw(_ReplayRequired, total=False):
    """One replay's result; `node_of` and `task_of` only when placements were asked for."""

    node_of: list[int]
    task_of: list[int]


class EventSample(TypedDict):
    """The inference replay's state at `t` (seconds; before the events of that instant)."""

    t: float
    allocated_milli: int
    idle_milli: int
    frag_milli: float
    pending: int
    running: int
    evictions: int


class EventsRaw(TypedDict):
    """One inference replay (`rust/src/replay/events.rs`): counts, time integrals over 0..end
    (milli-GPU x s, instance x s), samples, and with `log` every placement, move, departure and
    wait as (t, kind, instance, node, to)."""

    policy: str
    seed: int
    gpu_capacity_milli: int
    end: float
    instances: int
    arrived: int
    placed_on_arrival: int
    placed_after_wait: int
    never_placed: int
    evictions: int
    compaction_rounds: int
    rescues: int
    frag_milli_s: float
    idle_milli_s: float
    allocated_milli_s: float
    pending_s: float
    running_s: float
    samples: list[EventSample]
    log: list[tuple[float, str, int, int, int]]
