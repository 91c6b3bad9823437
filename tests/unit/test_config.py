"""The configuration tree: flat and nested names, the sections that are lower layers' options,
bounds, and messages that name the setting and never show a secret."""

from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyctl.app.config import SETTINGS, Config, ConfigError, load_config


def test_nested_and_flat_names_reach_the_option_types(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "mig:\n  apply_timeout: 120\n  nodes: [a, b]\n"
        "evictor:\n  excluded-namespaces: kube-system,gpu-operator\n  min_pod_age_seconds: 60\n"
        "reflector_page_size: 100\n"
    )
    cfg = load_config(
        str(f),
        {"PYCTL_EVICTOR_LABEL_SELECTOR": "app in (web, llm),!canary"},
        {"mig_node_holdoff_seconds": 0},
    )
    assert cfg.mig.apply_timeout == 120.0
    assert cfg.mig.nodes == ("a", "b")
    assert cfg.mig.node_holdoff_seconds == 0.0
    assert cfg.evictor.excluded_namespaces == ("kube-system", "gpu-operator")
    assert cfg.evictor.min_pod_age_seconds == 60.0
    assert cfg.evictor.selector is not None
    assert cfg.reflector.page_size == 100


def test_every_setting_has_one_flat_name() -> None:
    assert "redis_url" in SETTINGS
    assert "limit_node_burst" in SETTINGS
    assert "evictor_priority_threshold" in SETTINGS
    assert all(name == "_".join(s.path) for name, s in SETTINGS.items())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PYCTL_LIMIT_GLOBAL_PER_MINUTE": "0"}, "limit_global_per_minute: 0.0 is outside"),
        ({"PYCTL_LIMIT_NODE_PER_MINUTE": "nan"}, "must be finite"),
        ({"PYCTL_WORKLOAD_MAX_SHAPE_WEIGHT": "1e308"}, "workload_max_shape_weight"),
        ({"PYCTL_SIM_SPEED": "inf"}, "must be finite"),
        ({"PYCTL_REDIS_URL": "unix:///tmp/redis.sock"}, "unix:// sockets are not supported"),
        ({"PYCTL_MIG_ISOLATE": "drain"}, "mig isolate must be taint or cordon"),
        ({"PYCTL_EVICTOR_LABEL_SELECTOR": "app in (web"}, "unbalanced"),
        ({"PYCTL_REFLECTOR_BATCH_MAX": "0"}, "batch_max"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env)


def test_a_password_never_appears_in_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, {"PYCTL_REDIS_URL": "redis://u:s3cret@host:notaport/0"})
    assert "s3cret" not in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(None, {"PYCTL_REDIS_PASSWORD": "s3cret", "PYCTL_REDIS_URL": "ftp://x"})
    assert "s3cret" not in str(err.value)


def test_defaults_validate() -> None:
    assert Config().validate() == Config()


def alias_bomb(depth: int = 9, fan: int = 9) -> str:
    """Anchors nested `depth` deep inside `workload.excluded_namespaces`, each level repeating
    the one below `fan` times: under 1 KB of YAML standing for fan**depth names."""
    levels = [f"&l0 [{', '.join(['kube-system'] * fan)}]"]
    for i in range(1, depth):
        levels.append(f"&l{i} [{', '.join([f'*l{i - 1}'] * fan)}]")
    return "workload:\n  excluded_namespaces: [" + ", ".join(levels) + "]\n"


def test_a_yaml_alias_bomb_is_one_line_and_exit_2_at_once(tmp_path: Path) -> None:
    """Before: 40 s and 2.6 GB (the error message's repr walked the billion shared names)."""
    f = tmp_path / "bomb.yaml"
    f.write_text(alias_bomb())
    assert f.stat().st_size < 2000

    def limit_memory() -> None:  # a bomb that goes off must fail here, not take the machine
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    for command in (["status"], ["run"], ["federation", "status"]):
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pyctl.cli.main", *command, "--config", str(f)],
            capture_output=True, text=True, timeout=120, preexec_fn=limit_memory, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
        assert done.returncode == 2, (command, done.returncode, done.stderr[-2000:])
        assert done.stderr.splitlines() == [
            f"pyctl: error: config file {f}: line 2: YAML aliases (*l0) are not accepted"
        ], command
        assert took < 30, (command, took)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mode: observe\nmode: enforce\n", "line 2: key 'mode' given twice"),
        ("workload:\n  interval: 5\n  interval: 6\n", "line 3: key 'interval' given twice"),
        ("workload: {interval: 5}\nworkload: {namespaces: a}\n", "key 'workload' given twice"),
        ("workload_interval: 5\nworkload: {interval: 6}\n", "'workload_interval' given twice"),
        ("metrics-port: 1\nmetrics_port: 2\n", "'metrics_port' given twice"),
        ("a: &x 1\nmode: *x\n", "line 2: YAML aliases (*x) are not accepted"),
        ("<<: {mode: enforce}\nmode: observe\n", "line 1: YAML merge keys (<<) are not accepted"),
    ],
)
def test_duplicate_keys_and_aliases_are_errors(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(str(f), {})


def test_json_and_plain_yaml_configs_still_read(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text('{"mode": "enforce", "workload": {"namespaces": ["a", "b"]}}')
    cfg = load_config(str(f), {})
    assert cfg.mode == "enforce"
    assert cfg.workload.namespaces == ("a", "b")
