"""The configuration tree: flat and nested names, the sections that are lower layers' options,
bounds, and messages that name the setting and never show a secret."""

from __future__ import annotations

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
