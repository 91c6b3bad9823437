"""`kubectl pyctl score|plan` take the options `pyctl score|plan` take (its input aside).

The plugin once listed its own copy of `plan`'s options and lost `--rescue-depth`; `plan.run` then
failed on every call through kubectl.
"""

from __future__ import annotations

import argparse

import pytest

from pyctl.cli import kubectl_plugin, main


def _options(parser: argparse.ArgumentParser, command: str) -> dict[str, object]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    return {
        a.dest: a.default
        for a in p._actions
        if a.option_strings and a.dest not in {"help", "kubeconfig", "context"}
    }


@pytest.mark.parametrize("command", ["score", "plan"])
def test_plugin_options_are_the_commands_options(command: str) -> None:
    plugin = _options(kubectl_plugin.build_parser(), command)
    pyctl = _options(main.build_parser(), command)
    assert plugin == pyctl
    assert plugin  # the comparison is not vacuous


def test_plugin_plan_arguments_reach_run() -> None:
    args = kubectl_plugin.build_parser().parse_args(["plan", "--rescue-depth", "2"])
    assert args.rescue_depth == 2
    assert args.max_moves == 10
    assert not args.no_device_taint_rules
