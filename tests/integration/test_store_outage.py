"""Fault: Redis going away ended the process (issue 36). `pyctl run` on the simulated cluster with
a real `redis-server`, as a user runs it: Redis killed, brought back with its data (an
append-only file) and brought back empty, and a key of the workflow records replaced by a list.
Each time the process stays up, `/healthz` and `/metrics` answer, `/readyz` says not ready and
why; once Redis is back the mirror is written again and `/readyz` is 200."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
import redis

from pyctl.cluster.records import KINDS, NodeRecord, PodRecord, Record
from pyctl.cluster.source import EventSink
from pyctl.controller.controller import Controller
from pyctl.state.keys import Keys
from pyctl.state.redis_store import RedisStore
from tests.redis_servers import HOST, Binaries, RedisServer, free_port

from .conftest import redis_config

pytestmark = pytest.mark.redis

#: seconds a condition may take to show (the store is probed every 2 s; a workflow round runs
#: every 30 virtual seconds, half a second at the speed below)
WAIT = 30.0
#: the simulated nodes (pyctl/cluster/sim/scenario.py)
NODES = 26


@dataclass
class PyctlRun:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"pyctl run exited with {code}:\n{self.tail()}"

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def until(self, what: str, ok: Callable[[], bool], timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.alive()
            try:
                if ok():
                    return
            except (OSError, redis.RedisError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout:g} s: {what}\n{self.tail()}")

    def ready(self) -> tuple[int, str]:
        return self.get("/readyz")


@pytest.fixture
def aof_redis(redis_binaries: Binaries, tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own that keeps its data in an append-only file written
    on every command, so that one killed and started again comes back with it."""
    server = RedisServer(
        redis_binaries,
        tmp_path,
        name="aof",
        extra_args=["--appendonly", "yes", "--appendfsync", "always"],
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pyctl_run(aof_redis: RedisServer, tmp_path: Path) -> Iterator[PyctlRun]:
    port = free_port()
    log = tmp_path / "pyctl.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    argv = [
        sys.executable, "-m", "pyctl.cli.main", "run",
        "--redis", aof_redis.url, "--cluster", "outage", "--mode", "enforce",
        "--forever", "--speed", "60", "--no-live", "--metrics-port", str(port),
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    ctl = PyctlRun(proc, port, log)
    try:
        yield ctl
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def mirrored(r: redis.Redis, keys: Keys) -> bool:
    """The mirror is in Redis: the schema, every node, pods."""
    return bool(r.exists(keys.schema)) and r.hlen(keys.objects("Node")) == NODES


def test_redis_going_away_does_not_end_the_process(
    pyctl_run: PyctlRun, aof_redis: RedisServer
) -> None:
    keys = Keys("outage")
    ctl = pyctl_run

    def client() -> redis.Redis:
        return redis.Redis(host=HOST, port=aof_redis.port, socket_timeout=2)

    ctl.until("ready", lambda: ctl.ready()[0] == 200, timeout=90)
    ctl.until("mirrored and workflows stored", lambda: mirrored(client(), keys))

    def out_and_back(what: str, empty: bool) -> None:
        aof_redis.kill()
        ctl.until(
            f"{what}: /readyz says the store is unavailable",
            lambda: unavailable(ctl.ready()),
        )
        time.sleep(5)  # it used to exit within 3 s
        ctl.alive()
        assert ctl.get("/healthz") == (200, "ok\n")
        status, metrics = ctl.get("/metrics")
        assert status == 200
        assert 'pyctl_store_up{cluster="outage"} 0.0' in metrics
        assert ctl.ready()[0] == 503
        if empty:
            for f in aof_redis.dir.iterdir():
                if f.name != aof_redis.log.name:
                    shutil.rmtree(f) if f.is_dir() else f.unlink()
        if empty:
            # the premise, checked before pyctl can write again: Redis came back with nothing
            ctl.process.send_signal(signal.SIGSTOP)
            try:
                aof_redis.start()
                assert client().dbsize() == 0
            finally:
                ctl.process.send_signal(signal.SIGCONT)
        else:
            aof_redis.start()
        ctl.until(f"{what}: ready again", lambda: ctl.ready() == (200, "ok\n"))
        ctl.until(f"{what}: re-synced", lambda: mirrored(client(), keys))
        status, metrics = ctl.get("/metrics")
        assert 'pyctl_store_up{cluster="outage"} 1.0' in metrics

    out_and_back("killed, back with its data", empty=False)
    out_and_back("killed, back empty", empty=True)

    # a key of the workflow records holding a list: the store refuses the workflows
    r = client()
    swap = r.pipeline(transaction=True)  # at once: pyctl writes the hash meanwhile
    swap.delete(keys.workflow_data)
    swap.rpush(keys.workflow_data, "not a hash")
    swap.execute()
    ctl.until(
        "a wrong-type key: /readyz names it",
        lambda: ctl.ready()[0] == 503 and "WRONGTYPE" in ctl.ready()[1],
    )
    why = ctl.ready()[1]
    assert why.startswith("state store refuses workflows: "), why
    time.sleep(3)
    ctl.alive()
    assert ctl.get("/healthz") == (200, "ok\n")
    r.delete(keys.workflow_data)
    ctl.until("the key repaired: ready again", lambda: ctl.ready() == (200, "ok\n"))


def unavailable(ready: tuple[int, str]) -> bool:
    code, why = ready
    return code == 503 and why.startswith("state store unavailable")


class _Listed:
    """A cluster that lists one node and one pod, then stays quiet: no watch event for the
    store loop to write (a real cluster at night)."""

    name = "quiet"

    async def run(self, sink: EventSink) -> None:
        for kind in KINDS:
            records: list[Record] = []
            if kind == "Node":
                records = [NodeRecord("gpu-1", gpus=8)]
            elif kind == "Pod":
                records = [PodRecord("ns", "llm", node="gpu-1", gpus=2, phase="Running")]
            await sink.replace(kind, records, "1")
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_a_quiet_controller_sees_redis_go_and_come_back(
    disposable_redis: RedisServer,
) -> None:
    """The Kubernetes path's controller, with nothing to write: killing Redis makes it not
    ready (the probe sees it; it used to answer 200 through a 20 s outage); Redis back empty:
    the mirror is written again and it is ready."""
    store = RedisStore(redis_config(disposable_redis.url), "quiet")
    ctl = Controller("quiet", _Listed(), store, summary_interval=0)
    ctl.store_probe_interval = 0.5
    keys = Keys("quiet")

    async def until(what: str, ok: Callable[[], bool], within: float = 15.0) -> None:
        with anyio.fail_after(within):
            while not ok():  # noqa: ASYNC110 (a condition of plain attributes)
                await anyio.sleep(0.05)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await until("ready", lambda: ctl.ready() == (True, "ok"))
            disposable_redis.kill()
            await until("not ready", lambda: not ctl.ready()[0], within=5.0)
            why = ctl.ready()[1]
            assert why.startswith("state store unavailable ("), why
            assert ctl.metrics.store_up.labels("quiet")._value.get() == 0
            disposable_redis.start()  # empty: nothing is persisted
            await until("ready again", lambda: ctl.ready() == (True, "ok"))
            r = redis.Redis(host=HOST, port=disposable_redis.port)
            assert r.exists(keys.schema)
            assert r.hkeys(keys.objects("Pod")) == [b"ns/llm"]
            assert ctl.metrics.store_up.labels("quiet")._value.get() == 1
            tg.cancel_scope.cancel()
    finally:
        await store.close()
