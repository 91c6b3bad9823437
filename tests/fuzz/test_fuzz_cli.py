"""Random and mutated files through every command that reads one: `pyctl score`, `plan`,
`mig plan`, `topology merge|conformance`, `run --config|--workload|--kubeconfig`,
`federation status|place --config`, `simulate --trace`. Each ends with its result (exit 0, or 1
where a command says so), or one line on stderr and exit 2: never a traceback, never pyctl's own
failure (exit 70), never a hang."""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from pyctl.cli.main import main
from tests.paths import REPO, TOPOLOGY_CORPUS
from tests.unit.test_mig_cli import DEMAND, SNAPSHOT

from . import gen
from .conftest import CASES, FUZZ

EXAMPLES = REPO / "docs" / "examples"
SNAP = json.loads((EXAMPLES / "snapshot.json").read_text())
WORK = json.loads((EXAMPLES / "workload.json").read_text())
DUMP = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        gen.node("a"),
        gen.nrt("a"),
        gen.pod("a0", "a"),
        gen.pod("big", "", gpus=4, pending=True),
        gen.pdb(),
    ],
}
CORPUS = json.loads(TOPOLOGY_CORPUS.read_text())
CASE = CORPUS["cases"][0]
CONFIG = {
    "cluster": "fuzz",
    "mode": "observe",
    "workload": {"namespaces": ["a"], "label_selector": "app=x", "max_shape_weight": 0.5},
    "limit": {"global_burst": 10, "global_per_minute": 1.0},
    "mig": {"apply_timeout": 900, "isolate": "taint"},
    "evictor": {"min_pod_age_seconds": 0},
    "log": {"level": "info"},
}
TRACE = REPO / "tests" / "data" / "replay_tiny"

Argv = Callable[[str], list[str]]
#: (target, file template, how the command line takes the file)
TARGETS: list[tuple[str, Any, Argv]] = [
    ("score snapshot", SNAP, lambda f: ["score", f, "--workload", str(EXAMPLES / "workload.json")]),
    ("score workload", WORK, lambda f: ["score", str(EXAMPLES / "snapshot.json"), "--workload", f]),
    ("score dump", DUMP, lambda f: ["score", f, "--json"]),
    ("plan dump", DUMP, lambda f: ["plan", f, "--json"]),
    ("recommend dump", DUMP, lambda f: ["recommend", f, "--json"]),
    ("mig plan snapshot", SNAPSHOT, lambda f: ["mig", "plan", f, "--demand", _demand()]),
    ("mig plan demand", DEMAND, lambda f: ["mig", "plan", _snapshot(), "--demand", f]),
    ("topology merge", CASE, lambda f: ["topology", "merge", f]),
    (
        "topology conformance",
        {"cases": CORPUS["cases"][:3]},
        lambda f: ["topology", "conformance", f],
    ),
    ("run config", CONFIG, lambda f: ["run", "--config", f, "--kubeconfig", "/nonexistent"]),
    ("run workload", WORK, lambda f: ["run", "--workload", f, "--kubeconfig", "/nonexistent"]),
    ("federation config", CONFIG, lambda f: ["federation", "status", "--config", f]),
    ("federation place", CONFIG, lambda f: ["federation", "place", "gpus=1", "--config", f]),
]
#: the valid files given beside the fuzzed one
_BESIDE = Path(tempfile.mkdtemp(prefix="pyctl-fuzz-"))
(_BESIDE / "demand.json").write_text(json.dumps(DEMAND))
(_BESIDE / "snapshot.json").write_text(json.dumps(SNAPSHOT))


def _demand() -> str:
    return str(_BESIDE / "demand.json")


def _snapshot() -> str:
    return str(_BESIDE / "snapshot.json")


def _yaml_or_json(template: Any) -> st.SearchStrategy[bytes]:
    return st.one_of(
        gen.document(template),
        gen.mutated(template).map(lambda d: _as_yaml(d)),
    )


def _as_yaml(data: bytes) -> bytes:
    try:
        return yaml.safe_dump(json.loads(data)).encode()
    except (ValueError, RecursionError, yaml.YAMLError):
        return data


FILES = st.sampled_from(range(len(TARGETS))).flatmap(
    lambda i: (
        _yaml_or_json(TARGETS[i][1])
        if TARGETS[i][0].startswith(("run config", "federation"))
        else gen.document(TARGETS[i][1])
    ).map(lambda d: (i, d))
)


def check(argv: list[str], capsys: pytest.CaptureFixture[str], allowed: tuple[int, ...]) -> str:
    """Runs the command; its stderr."""
    code = main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err[-3000:]
    assert code in allowed, (argv, code, out.err[-2000:])
    if code == 2:
        lines = out.err.strip().splitlines()
        assert len(lines) == 1, out.err[-3000:]
        assert lines[0].startswith("pyctl: error: ")
    return out.err


@FUZZ
@given(case=FILES)
def test_files_through_every_command(
    case: tuple[int, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    i, data = case
    name, _, argv = TARGETS[i]
    CASES["cli files"] += 1
    f = tmp_path / "input.json"
    f.write_bytes(data)
    check(argv(str(f)), capsys, (0, 1, 2) if name == "topology conformance" else (0, 2))


@st.composite
def yaml_tricks(draw: st.DrawFn) -> bytes:
    """The config as YAML with one setting's value an alias bomb (anchors nested up to 9 deep,
    each repeating the one below up to 9 times), or one of its lines (a key) given twice."""
    lines = yaml.safe_dump(CONFIG, sort_keys=False).splitlines()
    keys = [i for i, line in enumerate(lines) if ": " in line and not line.lstrip().startswith("-")]
    at = draw(st.sampled_from(keys))
    if draw(st.booleans()):
        return "\n".join([*lines[: at + 1], lines[at], *lines[at + 1 :]]).encode()
    depth, fan = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    levels = [f"&l0 [{', '.join(['x'] * fan)}]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * fan)}]" for i in range(1, depth)]
    key = lines[at].split(":")[0]
    lines[at] = f"{key}: [{', '.join(levels)}, *l{depth - 1}]"
    return "\n".join(lines).encode()


@FUZZ
@given(data=yaml_tricks(), target=st.sampled_from([0, 1, 2]))
def test_yaml_aliases_and_duplicate_keys_in_configs(
    data: bytes, target: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused at once, with one line (before: an alias bomb ran 40 s and took 2.6 GB; a key
    given twice was read as its last value)."""
    CASES["cli yaml tricks"] += 1
    f = tmp_path / "config.yaml"
    f.write_bytes(data)
    argv = [t for t in TARGETS if t[1] is CONFIG][target][2]
    err = check(argv(str(f)), capsys, (2,))
    assert "YAML aliases" in err or "given twice" in err, err


@FUZZ
@given(data=st.one_of(st.binary(max_size=400), gen.JSON.map(lambda v: json.dumps(v).encode())))
def test_kubeconfig_files(data: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    CASES["cli kubeconfig"] += 1
    f = tmp_path / "kubeconfig"
    f.write_bytes(data)
    check(["run", "--kubeconfig", str(f)], capsys, (2,))


def _csv_rows(path: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text())))


CELL = st.one_of(
    gen.QUANTITY.map(str), st.text(max_size=10), st.sampled_from(["", "-1", "99999999"])
)


@st.composite
def traces(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """The tiny trace's two CSV files with a few cells, rows or bytes changed."""
    out = []
    for name in ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"):
        rows = _csv_rows(TRACE / name)
        for _ in range(draw(st.integers(0, 2))):
            r = draw(st.integers(0, len(rows) - 1))
            if rows[r]:
                c = draw(st.integers(0, len(rows[r]) - 1))
                rows[r][c] = draw(CELL)
        buf = io.StringIO()
        csv.writer(buf).writerows(rows)
        data = buf.getvalue().encode()
        if draw(st.booleans()) and data:
            k = draw(st.integers(0, len(data) - 1))
            data = data[:k] + draw(st.binary(max_size=8)) + data[k + 1 :]
        out.append(data)
    return out[0], out[1]


@FUZZ
@given(trace=traces())
def test_trace_files_through_simulate(
    trace: tuple[bytes, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    CASES["cli traces"] += 1
    d = tmp_path / "trace"
    d.mkdir(exist_ok=True)
    (d / "openb_node_list_gpu_node.csv").write_bytes(trace[0])
    (d / "openb_pod_list_default.csv").write_bytes(trace[1])
    argv = ["simulate", "--trace", str(d), "--policy", "fgd", "--seeds", "1", "--tune", "1.0"]
    check(argv, capsys, (0, 2))


INFERENCE = REPO / "tests" / "data" / "inference_tiny" / "disaggregated_DLRM_trace.csv"


@st.composite
def inference_traces(draw: st.DrawFn) -> bytes:
    """The tiny inference trace with a few cells, rows or bytes changed."""
    rows = _csv_rows(INFERENCE)
    for _ in range(draw(st.integers(0, 3))):
        r = draw(st.integers(0, len(rows) - 1))
        if rows[r]:
            c = draw(st.integers(0, len(rows[r]) - 1))
            rows[r][c] = draw(CELL)
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    data = buf.getvalue().encode()
    if draw(st.booleans()) and data:
        k = draw(st.integers(0, len(data) - 1))
        data = data[:k] + draw(st.binary(max_size=8)) + data[k + 1 :]
    return data


@FUZZ
@given(trace=inference_traces())
def test_inference_traces_through_simulate(
    trace: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    CASES["cli inference traces"] += 1
    d = tmp_path / "inference"
    d.mkdir(exist_ok=True)
    (d / "disaggregated_DLRM_trace.csv").write_bytes(trace)
    check(["simulate", "--inference", str(d), "--seeds", "1"], capsys, (0, 2))
