# Typed stubs of the Rust extension `pyctl._core` (rust/src/python/). Keep in step with it.
from collections.abc import Mapping, Sequence
from typing import final

from pyctl.core.inputs import (
    AssignmentInput,
    ClusterColumns,
    EventCompaction,
    MigGpuInput,
    MigLimitsInput,
    MigPendingInput,
    MigWorkloadInput,
    MovableInput,
    PendingInput,
    PlanLimitsInput,
    ReplayCompaction,
    ReplayInstances,
    ReplayNodes,
    ReplayTasks,
    ShapeInput,
    TopologyHintInput,
)
from pyctl.core.types import (
    Assignment,
    DeltaRaw,
    EventsRaw,
    FabricRaw,
    MigModelRaw,
    MigPlanRaw,
    PlanRaw,
    RankedRaw,
    ReplayRaw,
    ScoreColumns,
)

__version__: str

CATEGORY_NAMES: list[str]

EXTENDER_WEIGHT: int

# the inputs' declarations (rust/src/python/inputs.rs): {type name: {key: (kind, required)}}
def input_types() -> dict[str, dict[str, tuple[str, bool]]]: ...
def extender_scores(ranks: Sequence[tuple[int, int, int] | None]) -> list[int]: ...
def extender_choice(ranks: Sequence[tuple[int, int, int] | None]) -> int | None: ...
def kube_default_scores(
    cpu_cap: int, cpu_left: int, mem_cap: int, mem_left: int, cpu: int, memory: int
) -> int: ...
def mig_pack(
    gpu_model: str, counts: Sequence[tuple[str, int]], gpus: int
) -> list[list[tuple[str, int]]]: ...

class FragmentModel:
    def __init__(self, columns: ClusterColumns) -> None: ...
    @property
    def node_count(self) -> int: ...
    def score(self, shapes: Sequence[ShapeInput]) -> ScoreColumns: ...
    def place_delta(
        self, node: int, task: ShapeInput, shapes: Sequence[ShapeInput]
    ) -> DeltaRaw | None: ...
    def remove_delta(
        self,
        node: int,
        assignment: Assignment | AssignmentInput,
        shapes: Sequence[ShapeInput],
    ) -> DeltaRaw: ...
    def apply(self, node: int, assignment: Assignment | AssignmentInput, place: bool) -> None: ...
    def rank(
        self,
        task: ShapeInput,
        shapes: Sequence[ShapeInput],
        nodes: Sequence[int] | None = None,
    ) -> list[RankedRaw | None]: ...
    def choose(
        self,
        task: ShapeInput,
        shapes: Sequence[ShapeInput],
        nodes: Sequence[int] | None = None,
    ) -> RankedRaw | None: ...
    def plan(
        self,
        movable: Sequence[MovableInput],
        pending: Sequence[PendingInput],
        shapes: Sequence[ShapeInput],
        node_sets: Sequence[Sequence[int]] = ...,
        pdb_headroom: Sequence[int] = ...,
        limits: PlanLimitsInput | None = None,
    ) -> PlanRaw: ...
    def fabric(
        self,
        shapes: Sequence[ShapeInput],
        gangs: Sequence[tuple[int, int, int]],
        levels: int,
        node_domains: Sequence[Sequence[int | None]],
    ) -> FabricRaw: ...
    def node_index(self, name: str) -> int | None: ...

@final
class MergeResult:
    @property
    def affinity(self) -> list[int] | None: ...
    @property
    def preferred(self) -> bool: ...
    @property
    def admit(self) -> bool: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def merge_hints(
    # a hint: a `TopologyHintInput` or an object with its keys as attributes
    providers: Sequence[Mapping[str, Sequence[TopologyHintInput | object] | None] | None],
    policy: str,
    numa_nodes: Sequence[int],
    options: Mapping[str, bool | int | str] | None = None,
    distances: Mapping[int | str, Sequence[int]] | None = None,
) -> MergeResult: ...

# ---- MIG geometry and planner (rust/src/python/mig.rs) ------------------------------------------

def mig_models() -> list[MigModelRaw]: ...
def mig_model(gpu_model: str) -> MigModelRaw: ...
def mig_validate(
    gpu_model: str, instances: Sequence[str], pre_r510: bool = False
) -> tuple[bool, list[tuple[str, int]], str]: ...
def mig_profile_name(gpu_model: str, profile: str) -> str: ...
def mig_layouts(
    gpu_model: str,
    profiles: Sequence[str] | None = None,
    media_extensions: bool = False,
    pre_r510: bool = False,
) -> tuple[int, list[list[tuple[str, int]]]]: ...
def mig_place(
    gpu_model: str, pinned: Sequence[tuple[str, int]], unpinned: Sequence[str]
) -> list[int] | None: ...
def mig_plan(
    gpu_model: str,
    gpus: Sequence[MigGpuInput],
    pending: Sequence[MigPendingInput] | Mapping[str, int],
    workload: Sequence[MigWorkloadInput] | None = None,
    limits: MigLimitsInput | None = None,
) -> MigPlanRaw: ...

# ---- end of MIG ---------------------------------------------------------------------------------

# ---- trace replay (rust/src/python/replay.rs) ---------------------------------------------------

REPLAY_POLICIES: list[str]

def replay_run(
    nodes: ReplayNodes,
    tasks: ReplayTasks,
    shapes: Sequence[ShapeInput],
    policy: str = "fgd",
    seed: int = 42,
    tune: float = 1.3,
    shuffle: bool = True,
    numa: bool = False,
    compaction: ReplayCompaction | None = None,
    max_pct: int = 130,
    placements: bool = False,
) -> ReplayRaw: ...
def replay_events(
    nodes: ReplayNodes,
    instances: ReplayInstances,
    shapes: Sequence[ShapeInput],
    policy: str = "fgd",
    seed: int = 42,
    end: float = 0.0,
    shuffle: bool = True,
    compaction: EventCompaction | None = None,
    sample_every: float = 0.0,
    log: bool = False,
) -> EventsRaw: ...

# ---- end of trace replay ------------------------------------------------------------------------
