# Typed stubs of the Rust extension `pyctl._core` (rust/src/python/). Keep in step with it.
from collections.abc import Mapping, Sequence
from typing import Any, final

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

def extender_scores(ranks: Sequence[tuple[int, int, int] | None]) -> list[int]: ...
def extender_choice(ranks: Sequence[tuple[int, int, int] | None]) -> int | None: ...
def kube_default_scores(
    cpu_cap: int, cpu_left: int, mem_cap: int, mem_left: int, cpu: int, memory: int
) -> int: ...
def mig_pack(
    gpu_model: str, counts: Sequence[tuple[str, int]], gpus: int
) -> list[list[tuple[str, int]]]: ...

class FragmentModel:
    def __init__(self, columns: dict[str, list[Any]]) -> None: ...
    @property
    def node_count(self) -> int: ...
    def score(self, shapes: Sequence[Mapping[str, Any]]) -> ScoreColumns: ...
    def place_delta(
        self, node: int, task: Mapping[str, Any], shapes: Sequence[Mapping[str, Any]]
    ) -> DeltaRaw | None: ...
    # an assignment is read from a dict with its keys (`Assignment`, or one a caller built)
    def remove_delta(
        self,
        node: int,
        assignment: Assignment | dict[str, Any],
        shapes: Sequence[Mapping[str, Any]],
    ) -> DeltaRaw: ...
    def apply(self, node: int, assignment: Assignment | dict[str, Any], place: bool) -> None: ...
    def rank(
        self,
        task: Mapping[str, Any],
        shapes: Sequence[Mapping[str, Any]],
        nodes: Sequence[int] | None = None,
    ) -> list[RankedRaw | None]: ...
    def choose(
        self,
        task: Mapping[str, Any],
        shapes: Sequence[Mapping[str, Any]],
        nodes: Sequence[int] | None = None,
    ) -> RankedRaw | None: ...
    def plan(
        self,
        movable: Sequence[Mapping[str, Any]],
        pending: Sequence[Mapping[str, Any]],
        shapes: Sequence[Mapping[str, Any]],
        node_sets: Sequence[Sequence[int]] = ...,
        pdb_headroom: Sequence[int] = ...,
        limits: Mapping[str, Any] | None = None,
    ) -> PlanRaw: ...
    def fabric(
        self,
        shapes: Sequence[Mapping[str, Any]],
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
    providers: Sequence[Mapping[str, Sequence[Any] | None] | None],
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
    gpus: Sequence[Mapping[str, Any]],
    pending: Sequence[Mapping[str, Any]] | Mapping[str, int],
    workload: Sequence[Mapping[str, Any]] | None = None,
    limits: Mapping[str, Any] | None = None,
) -> MigPlanRaw: ...

# ---- end of MIG ---------------------------------------------------------------------------------

# ---- trace replay (rust/src/python/replay.rs) ---------------------------------------------------

REPLAY_POLICIES: list[str]

def replay_run(
    nodes: Mapping[str, Sequence[Any]],
    tasks: Mapping[str, Sequence[Any]],
    shapes: Sequence[Mapping[str, Any]],
    policy: str = "fgd",
    seed: int = 42,
    tune: float = 1.3,
    shuffle: bool = True,
    numa: bool = False,
    compaction: Mapping[str, float] | None = None,
    max_pct: int = 130,
    placements: bool = False,
) -> ReplayRaw: ...
def replay_events(
    nodes: Mapping[str, Sequence[Any]],
    instances: Mapping[str, Sequence[Any]],
    shapes: Sequence[Mapping[str, Any]],
    policy: str = "fgd",
    seed: int = 42,
    end: float = 0.0,
    shuffle: bool = True,
    compaction: Mapping[str, float] | None = None,
    sample_every: float = 0.0,
    log: bool = False,
) -> EventsRaw: ...

# ---- end of trace replay ------------------------------------------------------------------------
