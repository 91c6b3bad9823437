"""The key schema and the Redis configuration: names, validation, messages (no server needed)."""

from __future__ import annotations

import pytest

from pyctl.cluster.records import KINDS
from pyctl.state.keys import Keys, members_key
from pyctl.state.redis_client import RedisConfig


def test_every_key_carries_the_cluster_hash_tag() -> None:
    keys = Keys("prod-eu")
    names = [keys.schema, keys.resource_versions, keys.summary]
    names += [keys.workflow_data, keys.workflow_versions]
    names += [keys.objects(kind) for kind in KINDS]
    names += [keys.bucket("node/a"), keys.cooldown("node/a"), keys.slots("mig")]
    names += [keys.budget("disruptions"), keys.budget_seq("disruptions")]
    for name in names:
        assert name.startswith("pyctl:{prod-eu}:")
        # Redis hashes the text between the first '{' and the next '}'
        assert name[name.index("{") + 1 : name.index("}")] == "prod-eu"
    assert keys.objects("Pod") == "pyctl:{prod-eu}:obj:Pod"
    assert len(set(names)) == len(names)
    assert keys.members == members_key() == "pyctl:federation:members"
    assert Keys("c", prefix="acme:pyctl").schema == "acme:pyctl:{c}:schema"


@pytest.mark.parametrize("bad", ["", "a{b", "a}b", "{x}", "has space", "tab\t"])
def test_bad_cluster_names(bad: str) -> None:
    with pytest.raises(ValueError, match="cluster name"):
        Keys(bad)


def test_bad_prefix() -> None:
    with pytest.raises(ValueError, match="key prefix"):
        Keys("c", prefix="pyctl{x}")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"url": "http://127.0.0.1:6379"}, "scheme"),
        ({"url": "redis://"}, "no host"),
        ({"url": "redis://h:notaport"}, "bad port"),
        ({"url": "redis://h:6379/x"}, "database number"),
        ({"url": "redis://h:6379/3", "cluster": True}, "only database 0"),
        ({"socket_timeout": 0}, "socket_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"retries": -1}, "retries"),
        ({"key_prefix": "a{b"}, "key prefix"),
        ({"ssl_ca_file": "/ca.pem"}, "TLS is off"),
        ({"ssl": True, "ssl_cert_file": "/c.pem"}, "go together"),
        ({"summary_retention_seconds": 0}, "summary_retention_seconds"),
    ],
)
def test_bad_config(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedisConfig(**settings)  # type: ignore[arg-type]


def test_describe_never_shows_the_password() -> None:
    config = RedisConfig(url="redis://ops:s3cret@redis.example:6380/2")
    assert config.describe() == "redis://ops@redis.example:6380"
    assert "s3cret" not in config.describe()
    tls = RedisConfig(url="redis://h", ssl=True, cluster=True, password="p")
    assert tls.tls
    assert tls.describe() == "rediss://h:6379 (cluster)"
