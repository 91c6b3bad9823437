"""`kubectl pyctl score|plan` take the options `pyctl score|plan` take (its input aside).

The plugin once listed its own copy of `plan`'s options and lost `--rescue-depth`; `plan.run` then
failed on every call through kubectl.
"""

from __future__ import annotations

import argparse

import pytest

from pyctl.app.config import Config
from pyctl.cli import kubectl_plugin, main


def _options(parser: argparse.ArgumentParser, command: str) -> dict[str, object]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    return {
        a.dest: a.default
        for a in p._actions
        if a.dest not in {"help", "kubeconfig", "context", "dump", "snapshot"}
    }


@pytest.mark.parametrize("command", ["score", "plan", "status", "explain"])
def test_plugin_options_are_the_commands_options(command: str) -> None:
    plugin = _options(kubectl_plugin.build_parser(), command)
    pyctl = _options(main.build_parser(), command)
    assert plugin == pyctl
    assert plugin  # the comparison is not vacuous


def test_plugin_plan_arguments_reach_run() -> None:
    args = kubectl_plugin.build_parser().parse_args(["plan", "--rescue-depth", "2"])
    assert args.rescue_depth == 2
    # the controller's own limits unless told otherwise (`pyctl plan` is what it would do)
    assert (args.max_moves, args.min_gain) == (Config().workflow.max_moves, 1000.0)
    assert not args.no_device_taint_rules


def test_plugin_status_without_redis_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """`kubectl pyctl status` reads the stored state, not the API server: no Redis, one line."""
    code = kubectl_plugin.main(["status", "--redis", "redis://127.0.0.1:1/0", "--cluster", "c"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert "error" in err
