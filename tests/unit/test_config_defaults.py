"""The configuration's defaults are the components' own: a component built without the setting
behaves as the default configuration says (each default is defined once, in the lowest layer that
uses it, and the configuration refers to it)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pyctl.app.config import Config
from pyctl.cluster.kube.lease import LeaseConfig
from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller.controller import Controller
from pyctl.federation import watch_members
from pyctl.state.memory import MemoryStore
from pyctl.state.ratelimit import SafetyLimits
from pyctl.workflows.compactor import Compactor
from pyctl.workflows.dra_steering import DraSteering
from pyctl.workflows.mig_loop import MigLoop


def default_of(call: Callable[..., Any], parameter: str) -> Any:
    return inspect.signature(call).parameters[parameter].default


def test_the_controller_built_without_settings_uses_the_configured_defaults() -> None:
    cfg = Config()
    ctl = Controller("sim", SimClusterSource(inference_day(seed=1)), MemoryStore())
    assert ctl.summary_interval == cfg.summary_interval
    assert ctl.workload_interval == cfg.workload.interval
    assert ctl.reconciler.fabric_interval == cfg.fabric.interval
    assert ctl.reconciler.fabric_levels == cfg.fabric.levels
    assert ctl.reconciler.default_policy == cfg.default_topology_policy
    # members are read as often as each one publishes
    assert default_of(watch_members, "interval") == ctl.federation_interval


def test_the_workflow_loops_default_to_the_configured_interval() -> None:
    interval = Config().workflow.interval
    for loop in (Compactor, MigLoop, DraSteering):
        assert default_of(loop, "interval") == interval, loop.__name__


def test_the_lease_the_safety_limits_and_the_scenario_default_to_the_configuration() -> None:
    cfg = Config()
    assert default_of(inference_day, "seed") == cfg.sim.seed
    assert LeaseConfig("ns", "name", "me").lease_duration == cfg.lease.duration
    assert cfg.safety_limits() == SafetyLimits()
