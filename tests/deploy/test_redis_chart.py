"""The chart's Redis, run as its container runs it, on a real redis-server: the start script, the
redis.conf and the federation members' ACL rules exactly as `helm template` renders them (only the
container's mount paths and the port are replaced by a temporary directory's), with the passwords
of the Secret the chart generates. Each federation member's ACL user can do everything pyctl does
for its own cluster and read the others' summaries, and nothing to another member's keys; the
default user has the password; past `maxmemory` Redis refuses writes (OOM error replies) and
stays up, and pyctl's store reports the refusal as a store error."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import redis.exceptions as rexc

from pyctl.state.redis_client import RedisConfig
from pyctl.state.redis_ratelimit import RedisRateLimiter
from pyctl.state.redis_store import RedisStore
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.state.store import StoreError
from tests.integration.ratelimits import every_kind_of_limit
from tests.integration.records import ev, node, pod
from tests.redis_servers import (
    RedisServer,
    find_binaries,
    free_port,
    make_certificates,
)

from .tools import one, template

pytestmark = [pytest.mark.redis]

MEMBERS = ["east", "west"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class ChartRedis:
    port: int
    passwords: dict[str, str]
    log: Path

    def config(self, user: str | None) -> RedisConfig:
        pw = self.passwords["password" if user is None else f"member-{user}"]
        return RedisConfig(
            url=f"redis://127.0.0.1:{self.port}/0",
            username=user,
            password=pw,
            socket_timeout=2.0,
            connect_timeout=1.0,
            retries=0,
        )


@pytest.fixture
def chart_redis(tmp_path: Path) -> Iterator[ChartRedis]:
    find_binaries()  # a clear error when redis-server is missing
    objs = template({"redis.federationMembers": MEMBERS, "redis.maxmemory": "4mb"})
    conf = one(objs, "ConfigMap", "pyctl-redis")["data"]
    secret = one(objs, "Secret", "pyctl-redis")["data"]
    port = free_port()
    etc, auth, run, data = (tmp_path / d for d in ("etc", "auth", "run", "data"))
    for d in (etc, auth, run, data):
        d.mkdir()
    paths = {
        "/etc/redis-auth": str(auth),
        "/etc/redis/": f"{etc}/",
        "/run/redis": str(run),
        "dir /data": f"dir {data}",
        "port 6379": f"port {port}\nbind 127.0.0.1\nlogfile {tmp_path / 'redis.log'}",
    }
    for name, text in conf.items():
        for old, new in paths.items():
            text = text.replace(old, new)
        (etc / name).write_text(text)
    passwords = {k: base64.b64decode(v).decode() for k, v in secret.items()}
    for k, v in passwords.items():
        (auth / k).write_text(v)
    proc = subprocess.Popen(["sh", str(etc / "start.sh")], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the chart's redis did not start: {proc.poll()}", pytrace=False)
                time.sleep(0.05)
        yield ChartRedis(port, passwords, tmp_path / "redis.log")
        assert proc.poll() is None, "redis-server died"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.anyio
async def test_members_are_confined_to_their_own_keys(chart_redis: ChartRedis) -> None:
    stores = {}
    for m in MEMBERS:
        st = RedisStore(chart_redis.config(m), m)
        await st.open()
        assert await st.ping()
        await st.apply([ev("ADDED", node(f"{m}-gpu-1"))], {"Node": "1"})
        await st.replace("Pod", [pod("ns", "a")], "2")
        await st.put_summary(b'{"m": "%s"}' % m.encode(), 30)
        stores[m] = st
    east = stores["east"]
    # everything pyctl does for its own cluster
    assert (await east.load("Pod"))[1] == "2"
    limiter = RedisRateLimiter(east.client, chart_redis.config("east"), "east")
    assert (await limiter.acquire(every_kind_of_limit())).allowed
    workflows = RedisWorkflowStore(east.client, chart_redis.config("east"), "east")
    assert await workflows.put("w", b"x", 0) == 1
    # the federation: the members index and every member's summary
    assert set(await east.get_members()) == set(MEMBERS)
    # nothing of another member's own state
    intruder = RedisStore(chart_redis.config("east"), "west")
    with pytest.raises(StoreError, match="denied a command to this user"):
        await intruder.open()
    await intruder.close()
    raw = aioredis.Redis(
        host="127.0.0.1", port=chart_redis.port, username="east",
        password=chart_redis.passwords["member-east"],
    )  # fmt: skip
    try:
        with pytest.raises(rexc.NoPermissionError):
            await raw.get("pyctl:{west}:schema")
        with pytest.raises(rexc.NoPermissionError):
            await raw.hgetall("pyctl:{west}:obj:Node")
        with pytest.raises(rexc.NoPermissionError):
            await raw.flushall()
        with pytest.raises(rexc.NoPermissionError):
            await raw.config_set("maxmemory", "0")
    finally:
        await raw.aclose()
    # no password, no access
    anon = aioredis.Redis(host="127.0.0.1", port=chart_redis.port)
    try:
        with pytest.raises(rexc.AuthenticationError):
            await anon.ping()
    finally:
        await anon.aclose()
    for st in stores.values():
        await st.close()


@pytest.mark.anyio
async def test_past_maxmemory_writes_are_refused_and_redis_stays_up(
    chart_redis: ChartRedis,
) -> None:
    admin = aioredis.Redis(
        host="127.0.0.1", port=chart_redis.port, password=chart_redis.passwords["password"]
    )
    try:
        assert (await admin.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
        assert (await admin.config_get("maxmemory"))["maxmemory"] == str(4 * 1024 * 1024)
        blob = b"x" * 65536
        refused = None
        for i in range(200):  # 12.5 MiB at most: past 4 MiB well before
            try:
                await admin.set(f"filler:{i}", blob)
            except rexc.OutOfMemoryError as exc:
                refused = (i, str(exc))
                break
        assert refused is not None, "Redis accepted 12.5 MiB under maxmemory 4mb"
        assert "maxmemory" in refused[1]
        assert await admin.ping()
        assert await admin.get("filler:0") == blob  # nothing was evicted
        # pyctl's store: a clear error (the controller reports the store down and keeps serving
        # from memory), not a crash of Redis
        st = RedisStore(chart_redis.config("east"), "east")
        with pytest.raises(StoreError, match="out of memory"):
            await st.open()
        await st.close()
        assert await admin.ping()
    finally:
        await admin.aclose()


_TLS_PROBE = """
import asyncio, sys
from pyctl.state.redis_client import RedisConfig
from pyctl.state.redis_store import RedisStore
async def main():
    st = RedisStore(RedisConfig(url=sys.argv[1]), "c")
    try:
        await st.open()
        print("ok", await st.ping())
    finally:
        await st.close()
asyncio.run(main())
"""


def test_external_rediss_ca_from_the_chart_is_trusted(tmp_path: Path) -> None:
    """The chart's way to trust an external Redis's CA (its Deployment sets SSL_CERT_FILE to the
    mounted ca.crt): pyctl's store verifies a real TLS redis-server with it, and not without."""
    objs = template(
        {
            "redis.bundled": False,
            "redis.external.url": "rediss://redis.example.internal:6380/0",
            "redis.external.caSecret": "redis-ca",
        }
    )
    dep = one(objs, "Deployment", "pyctl")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["redis-ca"]
    assert env["SSL_CERT_FILE"] == f"{mount}/ca.crt"
    vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert vols["redis-ca"]["secret"]["secretName"] == "redis-ca"
    tls = make_certificates(tmp_path / "certs")
    server = RedisServer(find_binaries(), tmp_path, name="tls", tls=tls)
    server.start()
    try:
        base = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
        probe = [sys.executable, "-c", _TLS_PROBE, server.url]
        trusted = subprocess.run(
            probe, env={**base, "SSL_CERT_FILE": str(tls.ca)}, capture_output=True, text=True
        )
        assert trusted.stdout.strip() == "ok True", trusted.stderr[-2000:]
        untrusted = subprocess.run(probe, env=base, capture_output=True, text=True)
        assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    finally:
        server.stop()
