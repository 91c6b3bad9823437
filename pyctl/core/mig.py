"""MIG geometry and the partition planner, computed by the Rust core.

Geometry: `validate("A100-SXM4-40GB", ["4g.20gb", "3g.20gb"])`, where an instance is a profile
name placed anywhere valid or a name pinned at a memory-slice start (``"1g.10gb@6"``);
`layouts(model)` lists every maximal layout. Models resolve from catalog names, aliases, PCI
device ids and the `nvidia.com/gpu.product` label forms (``"NVIDIA-A100-SXM4-40GB"``).

Planner: `plan(...)` for one node's MIG GPUs, `plan_snapshot(snapshot, demand)` for the nodes of
a `pyctl score` snapshot, and `mig_parted_config(...)` to emit the result as a mig-parted ``v1``
config under a name derived from its content (mig-manager acts only when the
``nvidia.com/mig.config`` label value changes). The data and its sources:
`pyctl/data/mig_profiles.json`, `docs/mig-data.md`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from pyctl import _core, safe_yaml
from pyctl.core.inputs import MigGpuInput, MigLimitsInput, MigPendingInput, MigWorkloadInput
from pyctl.core.types import MigModelRaw, MigPlanRaw
from pyctl.model import Node, Shape, Snapshot

EXECUTORS: Final[tuple[str, ...]] = ("placement", "mig-parted")
MIG_CONFIG_LABEL: Final = "nvidia.com/mig.config"


# ---- geometry ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    id: int
    compute_slices: int
    memory_slices: int
    max_count: int
    #: (start, size) in memory slices, as `nvidia-smi mig -lgipp` prints them.
    placements: tuple[tuple[int, int], ...]
    media_extensions: bool
    placements_inferred: bool


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    aliases: tuple[str, ...]
    pci_device_ids: tuple[str, ...]
    memory_slices: int
    compute_slices: int
    #: Some placements are inferred from NVIDIA's memory fractions, not from a real capture.
    placements_inferred: bool
    notes: str
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise ValueError(f"unknown MIG profile {name!r} for {self.name}")


def _model(raw: MigModelRaw) -> GpuModel:
    return GpuModel(
        name=raw["name"],
        aliases=tuple(raw["aliases"]),
        pci_device_ids=tuple(raw["pci_device_ids"]),
        memory_slices=raw["memory_slices"],
        compute_slices=raw["compute_slices"],
        placements_inferred=raw["placements_inferred"],
        notes=raw["notes"],
        profiles=tuple(
            MigProfile(
                name=p["name"],
                id=p["id"],
                compute_slices=p["compute_slices"],
                memory_slices=p["memory_slices"],
                max_count=p["max_count"],
                placements=tuple((s, z) for s, z in p["placements"]),
                media_extensions=p["media_extensions"],
                placements_inferred=p["placements_inferred"],
            )
            for p in raw["profiles"]
        ),
    )


def models() -> list[GpuModel]:
    """Every MIG-capable GPU model of the built-in catalog."""
    return [_model(m) for m in _core.mig_models()]


def model(gpu_model: str) -> GpuModel:
    """A model by name, alias, PCI device id or product label; unknown → ValueError."""
    return _model(_core.mig_model(gpu_model))


def inferred_note(m: GpuModel) -> str | None:
    """What to tell a user about a model whose placements are not documented."""
    if not m.placements_inferred:
        return None
    return (
        f"placements of {m.name} are inferred (from NVIDIA's memory fractions and the pattern of "
        "the captured 8-slice GPUs), not read from a real `nvidia-smi mig -lgipp`"
    )


@dataclass(frozen=True, slots=True)
class Check:
    valid: bool
    #: When valid: (profile, memory-slice start) of every instance, in input order.
    placements: tuple[tuple[str, int], ...]
    #: When invalid: why.
    reason: str


def check(gpu_model: str, instances: Sequence[str], *, pre_r510: bool = False) -> Check:
    """Can these GPU instances exist together on one GPU? Pinned ones (``"1g.10gb@6"``) stay
    where they are. Bad input (unknown model or profile, a pin outside the GPU, overlapping
    pins) raises ValueError naming it. ``pre_r510``: drivers before R510, where a 4g and a 3g
    profile on 4 memory slices each cannot be combined."""
    valid, placements, reason = _core.mig_validate(gpu_model, list(instances), pre_r510)
    return Check(valid, tuple(placements), reason)


def profile_name(gpu_model: str, profile: str) -> str:
    """The catalog's name of a profile also written as ``nvidia.com/mig-1g.5gb.me`` or in
    other letter case; unknown → ValueError naming profile and model."""
    return _core.mig_profile_name(gpu_model, profile)


def validate(gpu_model: str, instances: Sequence[str], *, pre_r510: bool = False) -> bool:
    """`check(...).valid`."""
    valid, _placements, _reason = _core.mig_validate(gpu_model, list(instances), pre_r510)
    return valid


@dataclass(frozen=True, slots=True)
class Layout:
    """A set of GPU instances with one valid placement: (profile, start), ascending by start."""

    instances: tuple[tuple[str, int], ...]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, _ in self.instances:
            out[name] = out.get(name, 0) + 1
        return out

    def __str__(self) -> str:
        return " + ".join(f"{n}@{s}" for n, s in self.instances)


def _layouts(
    gpu_model: str, profiles: Sequence[str] | None, media_extensions: bool, pre_r510: bool
) -> tuple[int, list[Layout]]:
    n, raw = _core.mig_layouts(
        gpu_model, None if profiles is None else list(profiles), media_extensions, pre_r510
    )
    return n, [Layout(tuple(x)) for x in raw]


def layouts(
    gpu_model: str,
    profiles: Sequence[str] | None = None,
    *,
    media_extensions: bool = False,
    pre_r510: bool = False,
) -> list[Layout]:
    """Every maximal layout of the model: valid, and no further instance of the considered
    profiles fits. Considered: ``profiles`` if given, else every profile but the ``+me``
    variants (same geometry as their base profile), or all of them with ``media_extensions``.
    Largest profiles first."""
    return _layouts(gpu_model, profiles, media_extensions, pre_r510)[1]


def count_valid(
    gpu_model: str,
    profiles: Sequence[str] | None = None,
    *,
    media_extensions: bool = False,
    pre_r510: bool = False,
) -> int:
    """How many non-empty multisets of the considered profiles are valid."""
    return _layouts(gpu_model, profiles, media_extensions, pre_r510)[0]


def place(
    gpu_model: str, pinned: Sequence[tuple[str, int]], unpinned: Sequence[str]
) -> list[int] | None:
    """The exact placement search: starts for ``unpinned`` beside ``pinned`` (profile, start),
    or None when impossible."""
    return _core.mig_place(gpu_model, [(n, s) for n, s in pinned], list(unpinned))


def pack(
    gpu_model: str, counts: Sequence[tuple[str, int]], gpus: int
) -> list[list[tuple[str, int]]]:
    """Instances by count (profile, how many) packed onto at most `gpus` GPUs of the model at
    valid placements (a layout mig-parted could have made): per GPU, (profile, start). Raises
    ValueError when they do not fit."""
    return _core.mig_pack(gpu_model, list(counts), gpus)


# ---- planner ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limits:
    """What a plan may touch. ``gpus``: GPU indices that may be re-partitioned, for every node
    (a list) or per node name (a mapping); None = all. ``nodes``: node names that may be
    planned; None = all. ``max_used_destroyed``: used instances a node's plan may destroy (their
    pods must move). ``executor``: ``placement`` keeps instances in place (NVML with placement,
    DRA DynamicMIG); ``mig-parted`` re-creates every instance of a GPU it changes."""

    gpus: tuple[int, ...] | Mapping[str, tuple[int, ...]] | None = None
    nodes: tuple[str, ...] | None = None
    max_used_destroyed: int = 0
    executor: str = "placement"

    def gpus_for(self, node: str) -> list[int] | None:
        if self.gpus is None:
            return None
        if isinstance(self.gpus, Mapping):
            return list(self.gpus.get(node, ()))
        return list(self.gpus)


@dataclass(frozen=True, slots=True)
class Pending:
    profile: str
    count: int = 1
    #: Only nodes of this GPU model (None: every planned node, whose model must have the profile).
    gpu_model: str | None = None


@dataclass(frozen=True, slots=True)
class Demand:
    pending: tuple[Pending, ...] = ()
    shapes: tuple[Shape, ...] = ()
    limits: Limits = field(default_factory=Limits)


def plan(
    gpu_model: str,
    gpus: Sequence[MigGpuInput],
    pending: Sequence[MigPendingInput] | Mapping[str, int],
    workload: Sequence[MigWorkloadInput] | None = None,
    limits: MigLimitsInput | None = None,
) -> MigPlanRaw:
    """Plan one node's MIG GPUs (the definition: `rust/src/mig/planner.rs`).

    ``gpus``: ``[{"gpu": 0, "instances": [{"profile", "start", "used", "pod"?}]}]``;
    ``pending``: ``[{"profile", "count"}]`` or ``{profile: count}``; ``workload``:
    ``[{"profile", "weight"}]`` (the MIG shapes of M); ``limits``: ``{"gpus", "max_used_destroyed",
    "executor"}``. Returns the plan (`MigPlanRaw`: per GPU the new layout, destroyed instances,
    pods to move, demand served, fragment before/after)."""
    return _core.mig_plan(gpu_model, gpus, pending, workload, limits)


@dataclass(frozen=True, slots=True)
class NodePlan:
    node: str
    gpu_model: str
    placements_inferred: bool
    plan: MigPlanRaw


def _node_gpus(node: Node) -> list[MigGpuInput]:
    migs = sorted((m for z in node.zones for m in z.mig), key=lambda m: m.gpu)
    return [
        {
            "gpu": m.gpu,
            "instances": [
                {"profile": i.profile, "start": i.start, "used": i.used, "pod": i.pod}
                for i in m.instances
            ],
        }
        for m in migs
    ]


def _mig_workload(m: GpuModel, shapes: Sequence[Shape]) -> list[MigWorkloadInput]:
    """The MIG shapes of M that apply to this model, as (profile, weight). A shape restricted to
    other models is skipped; a shape for this model naming a profile it lacks is an error."""
    out: list[MigWorkloadInput] = []
    for i, s in enumerate(shapes):
        if s.mig_profile is None:
            continue
        allowed = [model(g).name for g in s.gpu_models if _known_model(g)]
        if s.gpu_models and m.name not in allowed:
            continue
        names = [p.name for p in m.profiles]
        if s.mig_profile not in names:
            if s.gpu_models:
                raise ValueError(
                    f"shapes[{i}].mig_profile: {m.name} has no MIG profile {s.mig_profile!r}"
                )
            continue
        out.append({"profile": s.mig_profile, "weight": s.weight})
    return out


def _known_model(name: str) -> bool:
    try:
        model(name)
    except ValueError:
        return False
    return True


def plan_snapshot(snapshot: Snapshot, demand: Demand) -> list[NodePlan]:
    """Plan every node with MIG GPUs (or those in ``demand.limits.nodes``), in snapshot order.
    Pending demand is node-independent: what one node's plan serves is taken off before the next
    node is planned."""
    left: list[tuple[Pending, int]] = [(p, p.count) for p in demand.pending]
    out = []
    lim = demand.limits
    for node in snapshot.nodes:
        gpus = _node_gpus(node)
        if not gpus or (lim.nodes is not None and node.name not in lim.nodes):
            continue
        if not node.gpu_model:
            raise ValueError(f"nodes[{node.name!r}].gpu_model: a node with MIG GPUs needs a model")
        try:
            m = model(node.gpu_model)
        except ValueError as e:
            raise ValueError(f"nodes[{node.name!r}].{e}") from None
        pending: dict[str, int] = {}
        names: dict[int, str] = {}
        for i, (p, count) in enumerate(left):
            if p.gpu_model is not None and p.gpu_model != m.name:
                continue
            try:
                names[i] = profile_name(m.name, p.profile)
            except ValueError:
                raise ValueError(
                    f"pending[{i}].profile: {m.name} (node {node.name!r}) has no MIG profile "
                    f"{p.profile!r}; give the entry a gpu_model to aim it at other nodes"
                ) from None
            pending[names[i]] = pending.get(names[i], 0) + count
        limits: MigLimitsInput = {
            "gpus": lim.gpus_for(node.name),
            "max_used_destroyed": lim.max_used_destroyed,
            "executor": lim.executor,
        }
        try:
            result = plan(m.name, gpus, pending, _mig_workload(m, demand.shapes), limits)
        except ValueError as e:
            raise ValueError(f"nodes[{node.name!r}]: {e}") from None
        served = {d["profile"]: d["served_after"] for d in result["demand"]}
        for i, name in names.items():
            take = min(left[i][1], served.get(name, 0))
            left[i] = (left[i][0], left[i][1] - take)
            served[name] = served.get(name, 0) - take
        out.append(NodePlan(node.name, m.name, m.placements_inferred, result))
    return out


# ---- mig-parted -------------------------------------------------------------------------------


def mig_parted_entries(node_plan: MigPlanRaw) -> list[dict[str, Any]]:
    """One mig-parted v1 entry per GPU of a node plan: ``devices: [index]``, MIG on, and the
    profile counts of its new layout."""
    entries = []
    for g in node_plan["gpus"]:
        counts: dict[str, int] = {}
        for inst in g["layout"]:
            counts[inst["profile"]] = counts.get(inst["profile"], 0) + 1
        entries.append(
            {
                "devices": [g["gpu"]],
                "mig-enabled": True,
                "mig-devices": dict(sorted(counts.items())),
            }
        )
    return entries


def config_name(entries: Sequence[Mapping[str, Any]]) -> str:
    """``pyctl-<12 hex digits of sha256 of the entries>``: a new layout gets a new name, so
    setting the label changes its value and mig-manager acts."""
    digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()
    return f"pyctl-{digest[:12]}"


def mig_parted_config(node_plans: Sequence[NodePlan]) -> dict[str, Any]:
    """A mig-parted ``v1`` config file holding one config per planned node (nodes with the
    same layouts share one)."""
    configs: dict[str, Any] = {}
    for np_ in node_plans:
        entries = mig_parted_entries(np_.plan)
        configs[config_name(entries)] = entries
    return {"version": "v1", "mig-configs": configs}


def node_config_names(node_plans: Sequence[NodePlan]) -> dict[str, str]:
    """Node name → the config name to set as its ``nvidia.com/mig.config`` label."""
    return {np_.node: config_name(mig_parted_entries(np_.plan)) for np_ in node_plans}


def to_yaml(config: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=None)


def parse_mig_parted(text: str) -> dict[str, list[dict[str, Any]]]:
    """Read a mig-parted config file and check it against the ``v1`` spec
    (`api/spec/v1/spec.go`): ``version: v1``, a non-empty ``mig-configs`` map, entries with
    ``devices`` (``all`` or GPU indices), optional ``device-filter``, a boolean ``mig-enabled``,
    and ``mig-devices`` (profile → count) that is empty when MIG is off. Returns the configs."""
    data = safe_yaml.load(text, "mig-parted config")
    if not isinstance(data, dict) or data.get("version") != "v1":
        raise ValueError("mig-parted config: 'version: v1' is required")
    extra = set(data) - {"version", "mig-configs"}
    if extra:
        raise ValueError(f"mig-parted config: unexpected field(s) {sorted(extra)}")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise ValueError("mig-parted config: 'mig-configs' must hold at least one config")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise ValueError(f"mig-configs[{name!r}]: expected a list of entries")
        for i, e in enumerate(entries):
            where = f"mig-configs[{name!r}][{i}]"
            if not isinstance(e, dict):
                raise ValueError(f"{where}: expected a mapping")
            extra = set(e) - {"devices", "device-filter", "mig-enabled", "mig-devices"}
            if extra:
                raise ValueError(f"{where}: unexpected field(s) {sorted(extra)}")
            dev = e.get("devices")
            if dev != "all" and not (
                isinstance(dev, list) and all(isinstance(d, int) and d >= 0 for d in dev)
            ):
                raise ValueError(f"{where}.devices: 'all' or a list of GPU indices is required")
            if not isinstance(e.get("mig-enabled"), bool):
                raise ValueError(f"{where}.mig-enabled: true or false is required")
            devices = e.get("mig-devices")
            if e["mig-enabled"]:
                if not isinstance(devices, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in devices.items()
                ):
                    raise ValueError(f"{where}.mig-devices: profile -> count is required")
            elif devices:
                raise ValueError(f"{where}.mig-devices: must be empty when MIG is disabled")
    return configs


__all__ = [
    "EXECUTORS",
    "MIG_CONFIG_LABEL",
    "Check",
    "Demand",
    "GpuModel",
    "Layout",
    "Limits",
    "MigProfile",
    "NodePlan",
    "Pending",
    "check",
    "config_name",
    "count_valid",
    "inferred_note",
    "layouts",
    "mig_parted_config",
    "mig_parted_entries",
    "model",
    "models",
    "node_config_names",
    "parse_mig_parted",
    "place",
    "plan",
    "plan_snapshot",
    "profile_name",
    "to_yaml",
    "validate",
]
