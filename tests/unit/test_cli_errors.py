"""Every read failure of every command is one line on stderr and exit code 2 (deep nesting, huge
files, bad encodings, NaN, directories, missing files); output to a closed pipe ends quietly;
a Redis password never appears in a message."""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyctl.cli import errors
from pyctl.cli.main import main
from tests.paths import REPO

EXAMPLES = REPO / "docs" / "examples"


@pytest.fixture(autouse=True)
def _pyctl_logger() -> Iterator[None]:
    """`pyctl run` sets up the `pyctl` logger (its own handler, no propagation) before it reads
    the kubeconfig: put it back, so that later tests' caplog sees pyctl's records."""
    log = logging.getLogger("pyctl")
    saved = (log.handlers[:], log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


SNAP = str(EXAMPLES / "snapshot.json")
WORK = str(EXAMPLES / "workload.json")


def commands(f: str) -> list[list[str]]:
    """Every command that reads a file, with `f` in each of its file arguments."""
    return [
        ["score", f, "--workload", WORK],
        ["score", SNAP, "--workload", f],
        ["score", f],
        ["plan", f],
        ["plan", f, "--workload", f],
        ["mig", "plan", f, "--demand", f],
        ["mig", "plan", SNAP, "--demand", f],
        ["topology", "merge", f],
        ["topology", "conformance", f],
        ["run", "--config", f, "--kubeconfig", f],
        ["run", "--workload", f, "--kubeconfig", f],
        ["federation", "status", "--config", f],
        ["federation", "place", "gpus=1", "--config", f],
        ["simulate", "--trace", str(Path(f).parent), "--workload", Path(f).stem, "--seeds", "1"],
    ]


BAD = {
    "deep.json": b"[" * 200_000 + b"]" * 200_000,
    "deep_obj.json": b'{"a": ' * 100_000 + b"1" + b"}" * 100_000,
    "latin1.json": b'{"nodes": "\xe9t\xe9"}',
    "nan.json": b'{"shapes": [{"gpus": 1, "gpu_milli": 1000, "weight": NaN}]}',
    "bigint.json": b'{"shapes": [{"gpus": ' + b"9" * 5000 + b"}]}",
    "empty.json": b"",
    "nul.json": b"\x00\x00\x00",
    "array.json": b"[1, 2, 3]",
    "yaml_bomb.json": b'a: &a ["x","x"]\nb: &b [*a,*a]\nc: &c [*b,*b]\nd: [*c,*c]\n',
}


def one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert code == 2, (argv, code, out.err[-500:])
    assert len(lines) == 1, (argv, out.err[-2000:])
    assert lines[0].startswith("pyctl: error: ")
    assert "Traceback" not in out.err
    return lines[0]


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_are_one_line_and_exit_2(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / name
    f.write_bytes(BAD[name])
    (tmp_path / f"openb_pod_list_{f.stem}.csv").write_bytes(BAD[name])
    (tmp_path / "openb_node_list_gpu_node.csv").write_bytes(BAD[name])
    for argv in commands(str(f)):
        one_line_exit_2(argv, capsys)


def test_missing_files_and_directories(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for f in (str(tmp_path / "nope.json"), str(tmp_path)):
        for argv in commands(f):
            one_line_exit_2(argv, capsys)


def test_huge_input_is_refused_before_it_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as f:  # sparse: 300 MiB that take no disk
        f.truncate(300 << 20)
    line = one_line_exit_2(["score", str(big), "--workload", WORK], capsys)
    assert "larger than 268435456 bytes" in line


def test_a_redis_password_is_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    url = "redis://admin:s3cr3t-pw@127.0.0.1:1/0"
    for argv in (
        ["federation", "status", "--redis", url],
        ["federation", "status", "--redis", url.replace("redis:", "unix:")],
        ["federation", "status", "--redis", url + "?ssl_cert_reqs=bogus%"],
    ):
        line = one_line_exit_2(argv, capsys)
        assert "s3cr3t" not in line


def test_one_line_masks_and_bounds() -> None:
    msg = errors.one_line("a\nb\r\n  c rediss://u:p4ss@h:1 " + "x" * 5000)
    assert "\n" not in msg
    assert "p4ss" not in msg
    assert len(msg) == errors.MAX_MESSAGE_CHARS


def test_output_to_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    snap = json.loads(Path(SNAP).read_text())
    node = snap["nodes"][0]
    snap["nodes"] = [{**node, "name": f"n{i}"} for i in range(2000)]  # output > a pipe's buffer
    big = tmp_path / "big.json"
    big.write_text(json.dumps(snap))
    for argv in (
        ["score", str(big), "--workload", WORK, "--json"],
        ["score", str(big), "--workload", WORK, "--top", "2000"],
    ):
        p = subprocess.Popen(
            [sys.executable, "-m", "pyctl.cli.main", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert p.stdout is not None
        assert p.stderr is not None
        p.stdout.read(10)
        p.stdout.close()  # the reader goes away (`| head -c 10`)
        err = p.stderr.read()
        code = p.wait(timeout=120)
        assert err == b"", (argv, err.decode()[-2000:])
        assert code == errors.EXIT_BROKEN_PIPE, (argv, code)


UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--kubeconfig", "/nonexistent/kubeconfig"],
        ["status", "--redis", UNREACHABLE_REDIS],
        ["explain", "default/p", "--redis", UNREACHABLE_REDIS],
        ["federation", "status", "--redis", UNREACHABLE_REDIS],
        ["federation", "place", "gpus=1", "--redis", UNREACHABLE_REDIS],
    ],
)
def test_pyctl_debug_is_not_a_setting(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every internal-error message tells users to set PYCTL_DEBUG=1: every command that reads
    the configuration accepts it, and it changes nothing but that traceback."""
    monkeypatch.delenv("PYCTL_DEBUG", raising=False)
    without = one_line_exit_2(argv, capsys)
    monkeypatch.setenv("PYCTL_DEBUG", "1")
    with_debug = one_line_exit_2(argv, capsys)
    assert "unknown setting" not in with_debug
    assert with_debug == without


def test_pyctl_debug_shows_the_traceback_of_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyctl.cli import status

    def bug(*_: object, **__: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(status, "read", bug)  # a failure of pyctl's own, after the config
    argv = ["status", "--redis", UNREACHABLE_REDIS]
    for off in ("", "0"):
        monkeypatch.setenv("PYCTL_DEBUG", off)
        assert main(argv) == errors.EXIT_INTERNAL
        err = capsys.readouterr().err
        assert err.startswith("pyctl: error: internal error (a bug in pyctl; PYCTL_DEBUG=1")
        assert len(err.splitlines()) == 1
    monkeypatch.setenv("PYCTL_DEBUG", "1")
    with pytest.raises(KeyError, match="a bug"):
        main(argv)


def kubeconfig_bomb() -> str:
    """A kubeconfig whose `contexts` is one alias standing for 9**9 entries (under 1 KB)."""
    levels = ["&l0 [" + ", ".join(["{name: x}"] * 9) + "]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return (
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"bomb: [{', '.join(levels)}]\ncontexts: [*l8]\nclusters: []\nusers: []\n"
    )


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (kubeconfig_bomb(), "line 4: YAML aliases (*l0) are not accepted"),
        ("apiVersion: v1\nkind: Config\nkind: Config\n", "line 3: key 'kind' given twice"),
    ],
)
def test_a_kubeconfig_alias_bomb_or_a_key_given_twice_is_one_line_at_once(
    text: str, line: str, tmp_path: Path
) -> None:
    """Before, the bomb ran past 40 s (the kubeconfig loader walked the expanded entries)."""
    f = tmp_path / "kubeconfig"
    f.write_text(text)

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pyctl.cli.main", "run", "--kubeconfig", str(f)],
        capture_output=True, text=True, timeout=120, preexec_fn=limit_memory, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines() == [f"pyctl: error: kubeconfig {f}: {line}"]
    assert time.monotonic() - started < 30
