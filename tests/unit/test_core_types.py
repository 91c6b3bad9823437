"""The Rust core's results against their declared types: every key and the type of every value
of what `pyctl._core` returns, checked on real outputs against the TypedDicts of
`pyctl.core.types` (the return types of `pyctl/_core.pyi`, which `mypy --strict` trusts)."""

from __future__ import annotations

import ast
import inspect
import re
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from pyctl import _core
from pyctl.core import types as t
from pyctl.core.fragmentation import shape_dict, snapshot_columns
from pyctl.core.inputs import (
    AssignmentInput,
    MigGpuInput,
    MovableInput,
    PendingInput,
    ReplayInstances,
    ReplayNodes,
    ReplayTasks,
    ShapeInput,
)
from pyctl.model import Gpu, MigGpu, MigInstance, Node, Shape, Snapshot, Zone


def conforms(value: Any, tp: Any, path: str = "result") -> None:
    """Raises AssertionError naming the first value that does not have type `tp`."""
    origin = get_origin(tp)
    if tp is Any:
        return
    if is_typeddict(tp):
        assert isinstance(value, dict), f"{path}: {type(value).__name__}, not a dict"
        hints = get_type_hints(tp)
        keys = set(value)
        assert keys <= set(hints), f"{path}: keys {sorted(keys - set(hints))} not declared"
        missing = tp.__required_keys__ - keys
        assert not missing, f"{path}: required keys {sorted(missing)} missing"
        for k, v in value.items():
            conforms(v, hints[k], f"{path}.{k}")
    elif origin in (Union, types.UnionType):
        errors = []
        for arg in get_args(tp):
            try:
                conforms(value, arg, path)
            except AssertionError as e:
                errors.append(str(e))
            else:
                return
        raise AssertionError(" / ".join(errors))
    elif origin is Literal:
        assert value in get_args(tp), f"{path}: {value!r} not one of {get_args(tp)}"
    elif origin is list:
        assert isinstance(value, list), f"{path}: {type(value).__name__}, not a list"
        for i, x in enumerate(value):
            conforms(x, get_args(tp)[0], f"{path}[{i}]")
    elif origin is tuple:
        args = get_args(tp)
        assert isinstance(value, tuple), f"{path}: {type(value).__name__}, not a tuple"
        assert len(value) == len(args), f"{path}: {len(value)} items, not {len(args)}"
        for i, (x, a) in enumerate(zip(value, args, strict=True)):
            conforms(x, a, f"{path}[{i}]")
    elif origin is dict:
        kt, vt = get_args(tp)
        assert isinstance(value, dict), f"{path}: {type(value).__name__}, not a dict"
        for k, v in value.items():
            conforms(k, kt, f"{path} key")
            conforms(v, vt, f"{path}[{k!r}]")
    elif tp is type(None) or tp is None:
        assert value is None, f"{path}: {value!r}, not None"
    elif tp is int:
        assert isinstance(value, int), f"{path}: {value!r} is not an int"
        assert not isinstance(value, bool), f"{path}: {value!r} is a bool, not an int"
    elif tp is float:
        assert isinstance(value, float), f"{path}: {value!r} is not a float"
    else:
        assert isinstance(value, tp), f"{path}: {value!r} is not {tp}"


def test_the_checker_fails_on_a_wrong_value() -> None:
    good: t.ServesRaw = {"profile": "1g.5gb", "count": 1}
    conforms(good, t.ServesRaw)
    for bad in ({"profile": "1g.5gb"}, {"profile": 1, "count": 1}, {**good, "extra": 0}):
        with pytest.raises(AssertionError):
            conforms(bad, t.ServesRaw)
    with pytest.raises(AssertionError):
        conforms({"a": [1.0, 2]}, dict[str, list[float]])
    with pytest.raises(AssertionError):
        conforms((1, True), tuple[int, int])


def _snapshot() -> Snapshot:
    """A MIG node (A100), two plain nodes with half-used GPUs, and a DRA node with DRA GPUs and
    dynamic MIG GPUs: enough for every key of an assignment, and for a move, to appear."""
    mig = Node(
        "mig",
        "A100-SXM4-40GB",
        "single-numa-node",
        zones=(
            Zone(
                0,
                32000,
                0,
                65536,
                0,
                (Gpu(0, 0),),
                (
                    MigGpu(
                        1,
                        (
                            MigInstance("3g.20gb", 0, True, "ns/a"),
                            MigInstance("1g.5gb", 4, False),
                        ),
                    ),
                ),
            ),
        ),
    )
    plain = Node(
        "plain",
        "L40S",
        zones=(Zone(0, 32000, 0, 65536, 0, (Gpu(0, 500), Gpu(1, 500))),),
    )
    plain2 = Node(
        "plain2",
        "L40S",
        zones=(Zone(0, 32000, 0, 65536, 0, (Gpu(0, 500),)),),
        rdma=100,
        rdma_used=20,
    )
    dra = Node(
        "dra",
        "A100-SXM4-40GB",
        zones=(
            Zone(
                0,
                32000,
                0,
                65536,
                0,
                (),
                (MigGpu(1, (), dra=True, dynamic=True), MigGpu(2, (), dra=True, dynamic=True)),
                (Gpu(0, 0),),
            ),
        ),
    )
    return Snapshot((mig, plain, dra, plain2))


WHOLE = Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=1.0)
HALF = Shape(cpu_milli=1000, gpus=1, gpu_milli=500, weight=1.0)
MIG = Shape(cpu_milli=1000, gpus=1, mig_profile="1g.5gb", weight=1.0)


def test_fragmentation_results_have_their_declared_types() -> None:
    core = _core.FragmentModel(snapshot_columns(_snapshot()))
    shapes = [shape_dict(s) for s in (WHOLE, HALF, MIG)]
    score = core.score(shapes)
    conforms(score, t.ScoreColumns)
    assert set(score["categories"]) == set(_core.CATEGORY_NAMES)
    keys: set[str] = set()
    tasks = [
        WHOLE,
        HALF,
        MIG,
        Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, dra=True, weight=1.0),
        Shape(cpu_milli=1000, gpus=2, gpu_milli=1000, dra=True, weight=1.0),
        Shape(cpu_milli=1000, gpus=1, mig_profile="2g.10gb", dra=True, weight=1.0),
        Shape(cpu_milli=1000, gpus=1, gpu_milli=500, rdma=50, weight=1.0),
    ]
    for task in tasks:
        for node in range(core.node_count):
            d = core.place_delta(node, shape_dict(task), shapes)
            if d is None:
                continue
            conforms(d, t.DeltaRaw)
            keys |= set(d["assignment"])
            core.apply(node, d["assignment"], True)
            conforms(core.remove_delta(node, d["assignment"], shapes), t.DeltaRaw)
            core.apply(node, d["assignment"], False)
        for r in core.rank(shape_dict(task), shapes):
            conforms(r, t.RankedRaw | None)
        conforms(core.choose(shape_dict(task), shapes), t.RankedRaw | None)
    # every key of an assignment was seen at least once
    assert keys == set(get_type_hints(t.Assignment))


def test_a_compaction_plan_has_its_declared_types() -> None:
    core = _core.FragmentModel(snapshot_columns(_snapshot()))
    shapes = [shape_dict(WHOLE)]
    half: AssignmentInput = {"cpu": [], "memory": [], "gpus": [(0, 0, 500)], "mig": None}
    movable: list[MovableInput] = [{"node": 1, "assignment": half, "shape": shape_dict(HALF)}]
    pending: list[PendingInput] = [
        {"shape": shape_dict(Shape(cpu_milli=1000, gpus=2, gpu_milli=1000))}
    ]
    plan = core.plan(movable, pending, shapes, limits={"min_gain": 1.0})
    conforms(plan, t.PlanRaw)
    assert plan["moves"], plan
    assert plan["rescues"] or plan["unrescued"], plan


def test_mig_results_have_their_declared_types() -> None:
    conforms(_core.mig_models(), list[t.MigModelRaw])
    conforms(_core.mig_model("A100-SXM4-40GB"), t.MigModelRaw)
    gpus: list[MigGpuInput] = [
        {
            "gpu": 0,
            "instances": [
                {"profile": "3g.20gb", "start": 0, "used": True, "pod": "ns/a"},
                {"profile": "1g.5gb", "start": 4, "used": False},
            ],
        },
        {"gpu": 1, "instances": [{"profile": "7g.40gb", "start": 0, "used": True}]},
    ]
    plan = _core.mig_plan(
        "A100-SXM4-40GB",
        gpus,
        {"2g.10gb": 2, "1g.5gb": 1},
        [{"profile": "2g.10gb", "weight": 1.0}],
        {"max_used_destroyed": 1},
    )
    conforms(plan, t.MigPlanRaw)
    states = {i["state"] for g in plan["gpus"] for i in g["layout"]}
    assert "new" in states, plan
    assert "kept-used" in states, plan


@pytest.mark.parametrize("placements", [False, True])
def test_a_replay_result_has_its_declared_types(placements: bool) -> None:
    nodes: ReplayNodes = {
        "name": ["a", "b"],
        "cpu_milli": [32000, 32000],
        "memory_mib": [65536, 65536],
        "gpu": [4, 2],
        "model": ["A100", "V100"],
    }
    tasks: ReplayTasks = {
        "cpu_milli": [1000] * 6,
        "memory_mib": [0] * 6,
        "num_gpu": [1, 1, 2, 0, 1, 1],
        "gpu_milli": [500, 1000, 1000, 0, 250, 1000],
    }
    shapes: list[ShapeInput] = [{"cpu_milli": 1000, "gpus": 1, "gpu_milli": 1000, "weight": 1.0}]
    res = _core.replay_run(
        nodes,
        tasks,
        shapes,
        policy="pyctl",
        seed=3,
        compaction={"every": 2},
        placements=placements,
    )
    conforms(res, t.ReplayRaw)
    assert ("node_of" in res) == placements


def _events_input() -> tuple[ReplayNodes, ReplayInstances]:
    nodes: ReplayNodes = {
        "name": ["a", "b"],
        "cpu_milli": [32000, 32000],
        "memory_mib": [65536, 65536],
        "gpu": [4, 4],
        "model": ["G", "G"],
        "rdma": [200, 200],
    }
    instances: ReplayInstances = {
        "cpu_milli": [8000] * 5,
        "memory_mib": [0] * 5,
        "num_gpu": [1] * 5,
        "gpu_milli": [1000] * 5,
        "rdma": [25, 50, 75, 25, 100],
        "app": [0, 0, 0, 1, 1],
        "max_per_node": [1, 1, 1, 0, -1],
        "arrive": [None, 10.0, 20.0, float("nan"), 30.0],
        "depart": [100.0, None, 50.0, float("nan"), 40.0],
    }
    return nodes, instances


def test_an_inference_replay_result_has_its_declared_types() -> None:
    nodes, instances = _events_input()
    shapes: list[ShapeInput] = [
        {"cpu_milli": 8000, "gpus": 1, "gpu_milli": 1000, "weight": 1.0, "rdma": 25}
    ]
    res = _core.replay_events(
        nodes,
        instances,
        shapes,
        policy="pyctl",
        seed=3,
        end=200.0,
        compaction={"interval": 10.0},
        sample_every=25.0,
        log=True,
    )
    conforms(res, t.EventsRaw)
    # app 0 at most one per node: its third instance waits from 20 s and leaves at 50 s unplaced
    assert (res["placed_on_arrival"], res["placed_after_wait"], res["never_placed"]) == (4, 0, 1)
    assert res["pending_s"] == 30.0
    assert [e[1] for e in res["log"]].count("wait") == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda i: i["depart"].__setitem__(2, 5.0), "instances[2].depart: must be a finite time"),
        (lambda i: i["app"].__setitem__(0, -1), "instances.app[0]: must not be negative, got -1"),
        (lambda i: i["arrive"].__setitem__(1, "x"), "instances.arrive[1]: expected a number"),
        (lambda i: i["rdma"].pop(), "instances.rdma: 4 entries, but the other columns have 5"),
        (lambda i: i["rdma"].__setitem__(1, -5), "tasks[1].rdma: must not be negative"),
        (lambda i: i.pop("max_per_node"), 'instances: missing "max_per_node"'),
    ],
)
def test_a_bad_instance_is_an_error_naming_it(change: Any, message: str) -> None:
    nodes, instances = _events_input()
    change(instances)
    with pytest.raises(ValueError, match=re.escape(message)):
        _core.replay_events(nodes, instances, [], end=100.0)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ({"gpus": -1, "weight": 1}, "shapes[0].gpus: must not be negative, got -1"),
        ({"cpu_milli": "2", "weight": 1}, "shapes[0].cpu_milli: expected an integer, got str"),
        ({"gpus": True, "weight": 1}, "shapes[0].gpus: expected an integer, got bool"),
        ({"gpus": 1, "gpu_milli": 500}, 'shapes[0]: missing "weight"'),
        ({"gpus": 1, "weight": "1"}, "shapes[0].weight: expected a number, got str"),
        ({"gpus": 1, "gpu_models": "A100", "weight": 1}, "shapes[0].gpu_models: expected a list"),
        ([1, 2], "shapes[0]: expected an object"),
        ({"gpus": 1, "weight": 1, "dra": 1}, "shapes[0].dra: expected true or false, got int"),
        ({"gpus": 1 << 40, "weight": 1}, "shapes[0].gpus: too large"),
    ],
)
def test_the_scorer_and_the_replay_read_a_shape_alike(shape: Any, message: str) -> None:
    """One reader (rust/src/python/shape.rs) for every shape the extension takes: the same bad
    shape gets the same error from the scorer and from the replay."""
    core = _core.FragmentModel(snapshot_columns(_snapshot()))
    with pytest.raises(ValueError, match=re.escape(message)):
        core.score([shape])
    nodes: ReplayNodes = {
        "name": ["a"],
        "cpu_milli": [1000],
        "memory_mib": [0],
        "gpu": [1],
        "model": ["x"],
    }
    tasks: ReplayTasks = {"cpu_milli": [0], "memory_mib": [0], "num_gpu": [0], "gpu_milli": [0]}
    with pytest.raises(ValueError, match=re.escape(message)):
        _core.replay_run(nodes, tasks, [shape])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: 7, r"movable\[1\]: expected an object"),
        (lambda m: {k: v for k, v in m.items() if k != "node"}, r'movable\[1\]: missing "node"'),
        (lambda m: {**m, "node": -1}, r"movable\[1\]\.node: must not be negative"),
        (lambda m: {**m, "node": 99}, r"movable\[1\]\.node: index 99 out of range"),
        (lambda m: {**m, "group": 1 << 40}, r"movable\[1\]\.group: too large"),
        (lambda m: {**m, "pdb": "a"}, r"movable\[1\]\.pdb: expected an integer"),
        (lambda m: {k: v for k, v in m.items() if k != "shape"}, r'movable\[1\]: missing "shape"'),
        (
            lambda m: {**m, "assignment": {**m["assignment"], "cpu": [[0]]}},
            r"assignment\.cpu\[0\]: expected 2 non-negative integers",
        ),
        (
            lambda m: {**m, "assignment": {**m["assignment"], "gpus": [[0, 0, -500]]}},
            r"assignment\.gpus\[0\]: expected 3 non-negative integers",
        ),
        (
            lambda m: {**m, "assignment": {**m["assignment"], "gpus": [[0, "x", 5, 6]]}},
            r"assignment\.gpus\[0\]\[1\]: expected an integer",
        ),
        (
            lambda m: {**m, "assignment": {**m["assignment"], "memory": "lots"}},
            r"assignment\.memory: expected a list",
        ),
    ],
)
def test_a_bad_planner_input_is_an_error_naming_it(change: Any, message: str) -> None:
    """The planner reads tens of thousands of items per round: a bad one is a ValueError naming
    the item and field (never a panic), whichever item it is."""
    core = _core.FragmentModel(snapshot_columns(_snapshot()))
    half: AssignmentInput = {"cpu": [], "memory": [], "gpus": [(0, 0, 500)], "mig": None}
    good: MovableInput = {"node": 1, "assignment": half, "shape": shape_dict(HALF)}
    with pytest.raises(ValueError, match=message):
        core.plan([good, change(good)], [], [shape_dict(WHOLE)])
    core.plan([good, good], [], [shape_dict(WHOLE)])  # the same good input plans


def test_an_input_may_be_an_object_with_the_keys_as_attributes() -> None:
    """The declared reader takes a dict or an object whose attributes hold the keys (a
    dataclass), with the same defaults and the same errors naming the field."""

    @dataclass
    class Hint:
        affinity: list[int] | None
        preferred: bool

    as_dict = _core.merge_hints(
        [{"gpu": [{"affinity": [1], "preferred": True}]}], "best-effort", [0, 1]
    )
    as_object = _core.merge_hints([{"gpu": [Hint([1], True)]}], "best-effort", [0, 1])
    assert as_object == as_dict
    with pytest.raises(ValueError, match=re.escape('providers[0]["gpu"][0].preferred: expected')):
        _core.merge_hints([{"gpu": [Hint([1], 1)]}], "best-effort", [0, 1])  # type: ignore[arg-type]


# ---- the core's inputs and signatures: the Rust declarations against pyctl/core/inputs.py and
# pyctl/_core.pyi ---------------------------------------------------------------------------------


def render(tp: Any) -> str:
    """An annotation as the Rust declarations write a key's kind (`list[int]`, `int | None`,
    `Sequence[tuple[int, int]]`, the name of another input type)."""
    if tp is type(None) or tp is None:
        return "None"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(render(a) for a in get_args(tp))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(render(a) for a in get_args(tp))}]"
    return str(tp.__name__)


def input_disagreements(declared: dict[str, dict[str, tuple[str, bool]]], module: Any) -> list[str]:
    """Every difference between the core's declared inputs (`_core.input_types()`) and the
    TypedDicts of `module`: a type or key on one side only, a key's kind or requiredness."""
    out = []
    typeddicts = {
        n for n, v in vars(module).items() if is_typeddict(v) and v.__module__ == module.__name__
    }
    out += [
        f"{n}: a TypedDict the core does not declare" for n in sorted(typeddicts - set(declared))
    ]
    for name, keys in declared.items():
        td = getattr(module, name, None)
        if td is None or not is_typeddict(td):
            out.append(f"{name}: declared by the core, no TypedDict in {module.__name__}")
            continue
        hints = get_type_hints(td)
        out += [f"{name}.{k}: in the TypedDict only" for k in sorted(set(hints) - set(keys))]
        for key, (kind, required) in keys.items():
            if key not in hints:
                out.append(f"{name}.{key}: declared by the core only")
                continue
            if render(hints[key]) != kind:
                out.append(
                    f"{name}.{key}: the core reads {kind}, the TypedDict says {render(hints[key])}"
                )
            if (key in td.__required_keys__) != required:
                want = "required" if required else "not required"
                out.append(f"{name}.{key}: {want} by the core, not in the TypedDict")
            assert (key in td.__optional_keys__) != (key in td.__required_keys__)
    return out


def test_the_inputs_typeddicts_are_the_cores_declarations() -> None:
    from pyctl.core import inputs

    problems = input_disagreements(_core.input_types(), inputs)
    assert not problems, "\n".join(problems)


def test_the_inputs_check_names_each_disagreement() -> None:
    from pyctl.core import inputs

    declared = _core.input_types()
    declared["ShapeInput"] = {**declared["ShapeInput"], "cores": ("int", False)}
    declared["PendingInput"] = {**declared["PendingInput"], "allowed": ("int", True)}
    del declared["MigLimitsInput"]
    declared["Nowhere"] = {}
    assert input_disagreements(declared, inputs) == [
        "MigLimitsInput: a TypedDict the core does not declare",
        "ShapeInput.cores: declared by the core only",
        "PendingInput.allowed: the core reads int, the TypedDict says int | None",
        "PendingInput.allowed: required by the core, not in the TypedDict",
        "Nowhere: declared by the core, no TypedDict in pyctl.core.inputs",
    ]


def test_the_replays_instances_have_the_tasks_columns() -> None:
    declared = _core.input_types()
    assert declared["ReplayTasks"].items() <= declared["ReplayInstances"].items()


STUB = Path(__file__).resolve().parents[2] / "pyctl" / "_core.pyi"


def _stub_signature(f: ast.FunctionDef) -> list[tuple[str, str | None]]:
    """(name, default as source or None) of each parameter of a function of the stub."""
    a = f.args
    params = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(params) - len(a.defaults)) + [*a.defaults]
    out = [
        (p.arg, None if d is None else ast.unparse(d))
        for p, d in zip(params, defaults, strict=True)
    ]
    out += [
        (p.arg, None if d is None else ast.unparse(d))
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    return out


def _runtime_signature(obj: Any) -> list[tuple[str, str | None]]:
    """The same of an extension function or method, from its `__text_signature__`."""
    sig = inspect.signature(obj)
    return [
        (
            p.name,
            None
            if p.default is inspect.Parameter.empty
            else "..."
            if p.default is Ellipsis
            else repr(p.default),
        )
        for p in sig.parameters.values()
    ]


def _is_property(f: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)


def signature_disagreements(stub: str, module: Any) -> list[str]:
    """Every difference between the functions and methods of the stub `stub` (source) and those
    of the extension `module`: one on one side only, a parameter's name, place or default."""
    out = []
    stubbed: dict[str, ast.FunctionDef] = {}
    classes: dict[str, set[str]] = {}
    for node in ast.parse(stub).body:
        if isinstance(node, ast.FunctionDef):
            stubbed[node.name] = node
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = set()
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and not _is_property(f):
                    classes[node.name].add(f.name)
                    if f.name == "__init__" or not f.name.startswith("__"):
                        stubbed[f"{node.name}.{f.name}"] = f
    for name, value in vars(module).items():
        if isinstance(value, type) and not name.startswith("_"):
            for attr, member in vars(value).items():
                is_method = inspect.ismethoddescriptor(member) and not inspect.isdatadescriptor(
                    member
                )
                if is_method and not attr.startswith("__") and attr not in classes.get(name, set()):
                    out.append(f"{name}.{attr}: in the extension, not in the stub")
        elif callable(value) and not name.startswith("_") and name not in stubbed:
            out.append(f"{name}: in the extension, not in the stub")
    for name, f in stubbed.items():
        cls, _, attr = name.rpartition(".")
        owner = getattr(module, cls, None) if cls else module
        obj = getattr(owner, attr, None) if owner is not None else None
        if obj is None:
            out.append(f"{name}: in the stub, not in the extension")
            continue
        if attr == "__init__":
            obj = owner  # a pyclass's constructor signature is the class's
        stub_params = _stub_signature(f)
        if cls and attr != "__init__":
            stub_params = [("$self" if p == "self" else p, d) for p, d in stub_params]
        if attr == "__init__":
            stub_params = stub_params[1:]  # self
        runtime = _runtime_signature(obj)
        if cls and attr != "__init__":
            runtime = [("$self", d) if i == 0 else (p, d) for i, (p, d) in enumerate(runtime)]
        if stub_params != runtime:
            out.append(
                f"{name}: the stub has ({_show(stub_params)}), the extension ({_show(runtime)})"
            )
    return out


def _show(params: list[tuple[str, str | None]]) -> str:
    return ", ".join(p if d is None else f"{p}={d}" for p, d in params)


def test_the_stub_has_the_extensions_signatures() -> None:
    problems = signature_disagreements(STUB.read_text(), _core)
    assert not problems, "\n".join(problems)


def test_the_signature_check_names_each_disagreement() -> None:
    stub = STUB.read_text()
    for old, new, want in [
        (
            'policy: str = "fgd",\n    seed',
            'policy: str = "fgs",\n    seed',
            "replay_run: the stub has",
        ),
        (
            "def mig_profile_name(gpu_model: str, profile: str)",
            "def mig_profile_name(profile: str, gpu_model: str)",
            "mig_profile_name: the stub has",
        ),
        (
            "    def node_index(self, name: str) -> int | None: ...\n",
            "",
            "FragmentModel.node_index: in the extension, not in the stub",
        ),
        (
            "def mig_models() -> list[MigModelRaw]: ...\n",
            "def mig_models() -> list[MigModelRaw]: ...\ndef mig_nothing() -> None: ...\n",
            "mig_nothing: in the stub, not in the extension",
        ),
        (
            "def __init__(self, columns: ClusterColumns)",
            "def __init__(self, columns: ClusterColumns, x: int = 0)",
            "FragmentModel.__init__: the stub has",
        ),
    ]:
        assert old in stub, old
        problems = signature_disagreements(stub.replace(old, new, 1), _core)
        assert len(problems) == 1, problems
        assert problems[0].startswith(want), problems
