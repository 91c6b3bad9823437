"""Federation across clusters on a real shared Redis (single, and a three-master Redis Cluster),
both with AUTH: members publish their summaries; `pyctl federation status` / `place` (the CLI, as
a subprocess), `GET /federation` and the `pyctl_federation_members_stale` gauge show every
member, stale ones marked and counted, and rank clusters, then nodes, by fragment delta."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from pyctl.controller.summary import Summary, federation_summary_bytes, summary_bytes
from pyctl.core.fragmentation import CATEGORIES, FragmentationModel
from pyctl.federation import (
    federation_status,
    parse_shape,
    place,
    read_members,
)
from pyctl.metrics import Metrics
from pyctl.model import Gpu, Node, Shape, Snapshot, Workload, Zone
from pyctl.serve.health import HealthServer
from pyctl.state.keys import Keys, members_key
from pyctl.state.redis_client import RedisConfig
from pyctl.state.redis_store import RedisStore
from tests.redis_servers import (
    HOST,
    Binaries,
    RedisClusterServers,
    RedisServer,
    Tls,
    cluster_args,
    free_port,
)

from .conftest import AUTH_PASSWORD, RedisConn, redis_config

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

#: the workload M of every member here: two-GPU replicas (a lone free GPU is fragment)
M = Workload((Shape(cpu_milli=2000, gpus=2, gpu_milli=1000),))


class AuthRedisCluster(RedisClusterServers):
    """Three masters with `requirepass` (and `masterauth`), joined with `redis-cli -a`."""

    def __init__(self, binaries: Binaries, workdir: Path, password: str) -> None:
        self.binaries = binaries
        self.password = password
        self.nodes = []
        for i in range(3):
            conf = workdir / f"auth-cluster-{i}" / "nodes.conf"
            self.nodes.append(
                RedisServer(
                    binaries,
                    workdir,
                    name=f"auth-cluster-{i}",
                    password=password,
                    extra_args=[*cluster_args(conf, free_port()), "--masterauth", password],
                )
            )

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        done = subprocess.run(
            [self.binaries.cli, "-a", self.password, "--no-auth-warning", "--cluster", "create",
             *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        self._wait_ok()

    def _cli(self, node: RedisServer, *args: str) -> str:
        done = subprocess.run(
            [self.binaries.cli, "-h", HOST, "-p", str(node.port), "-a", self.password,
             "--no-auth-warning", *args],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        return done.stdout


@pytest.fixture(scope="module")
def auth_cluster(
    redis_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuthRedisCluster]:
    servers = AuthRedisCluster(redis_binaries, tmp_path_factory.mktemp("rc-auth"), AUTH_PASSWORD)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture(params=["redis", "redis-cluster"])
def auth_config(request: pytest.FixtureRequest) -> RedisConfig:
    """A single Redis and a Redis Cluster, both requiring the password."""
    if request.param == "redis-cluster":
        servers: AuthRedisCluster = request.getfixturevalue("auth_cluster")
        return redis_config(servers.url, cluster=True, password=AUTH_PASSWORD)
    server: RedisServer = request.getfixturevalue("redis_auth_server")
    return redis_config(server.url, password=AUTH_PASSWORD)


def _node(name: str, free_gpus: int, used_gpus: int, model: str = "A100-SXM4-80GB") -> Node:
    gpus = tuple(Gpu(i, 0) for i in range(free_gpus)) + tuple(
        Gpu(free_gpus + i, 1000) for i in range(used_gpus)
    )
    zone = Zone(numa=0, cpu_milli=64000, cpu_milli_used=8000, memory_mib=512 * 1024, gpus=gpus)
    return Node(name=name, gpu_model=model, zones=(zone,))


def _summary(cluster: str, models: dict[str, Node]) -> Summary:
    score = FragmentationModel(Snapshot(tuple(models.values()))).score(M)
    return Summary(
        cluster=cluster,
        nodes=len(models),
        idle_gpu_milli=score.idle_gpu_milli,
        fragment_gpu_milli=score.fragment_gpu_milli,
        categories={c: score.categories[c] for c in CATEGORIES},
        idle_mig_slices=0,
        fragment_mig_slices=0,
        recoverable_mig_slices=0,
        pending=1,
        blocked={"lack_gpu": 1},
        scheduling_success=0.9,
    )


@pytest.fixture
async def fleet(
    auth_config: RedisConfig, cluster_name: str
) -> AsyncIterator[tuple[RedisConfig, dict[str, RedisStore]]]:
    """Four members on the shared Redis: `a` (a lone free GPU: placing there removes
    fragment), `b` (pairs of free GPUs: placing there creates fragment), `basic` (the basic
    summary, no per-node data), `gone` (ttl 1 s, then silent: stale)."""
    names = {k: f"{cluster_name}-{k}" for k in ("a", "b", "basic", "gone")}
    stores = {k: RedisStore(auth_config, n) for k, n in names.items()}
    for st in stores.values():
        await st.open()
    try:
        a = {"a-big": _node("a-big", 2, 6), "a-lone": _node("a-lone", 1, 7)}
        b = {"b-1": _node("b-1", 2, 6), "b-2": _node("b-2", 4, 4, "H100-SXM5-80GB")}
        await stores["a"].put_summary(federation_summary_bytes(_summary(names["a"], a), a, M), 60)
        await stores["b"].put_summary(federation_summary_bytes(_summary(names["b"], b), b, M), 60)
        await stores["basic"].put_summary(summary_bytes(_summary(names["basic"], a)), 60)
        await stores["gone"].put_summary(
            federation_summary_bytes(_summary(names["gone"], a), a, M), 1
        )
        await anyio.sleep(1.3)
        yield auth_config, stores
    finally:
        for st in stores.values():
            await st.close()


def _mine(items: list[Any], prefix: str, key: str = "cluster") -> list[Any]:
    return [
        i for i in items if (i[key] if isinstance(i, dict) else getattr(i, key)).startswith(prefix)
    ]


async def test_status_place_and_stale_gauge(
    fleet: tuple[RedisConfig, dict[str, RedisStore]], cluster_name: str
) -> None:
    _, stores = fleet
    members = _mine(await read_members(stores["a"]), cluster_name)
    assert [m.cluster.rsplit("-", 1)[1] for m in members] == ["a", "b", "basic", "gone"]
    assert [m.stale for m in members] == [False, False, False, True]
    assert [m.rich for m in members] == [True, True, False, True]
    a = members[0]
    assert (a.nodes, a.idle_gpus, a.fragment_gpus) == (2, 3.0, 1.0)

    metrics = Metrics()
    view: Any = await federation_status(stores["a"], metrics, cluster=stores["a"].cluster)
    mine = _mine(view["members"], cluster_name)
    assert [m["stale"] for m in mine] == [False, False, False, True]
    # other tests' members may share the server: the gauge counts every stale member it sees
    stale_seen = view["stale"]
    assert stale_seen >= 1
    gauge = metrics.registry.get_sample_value(
        "pyctl_federation_members_stale", {"cluster": stores["a"].cluster}
    )
    assert gauge == stale_seen

    ranks = _mine(place(members, parse_shape("gpus=1,cpu=2")), cluster_name)
    assert [(r.cluster.rsplit("-", 1)[1], bool(r.skipped)) for r in ranks] == [
        ("a", False),
        ("b", False),
        ("basic", True),
        ("gone", True),
    ]
    best_a, best_b = ranks[0], ranks[1]
    # a: the lone free GPU is fragment under M; filling it removes one GPU of fragment
    assert (best_a.nodes[0].node, best_a.delta_gpus) == ("a-lone", -1.0)
    # b: FGD counts whole free GPUs on a node that admits M as usable: b-2 (4 free) stays at
    # 0, while b-1 (a free pair) would keep a lone GPU: +1
    assert [(n.node, n.delta_gpus) for n in best_b.nodes] == [("b-2", 0.0), ("b-1", 1.0)]
    assert "no per-node data" in ranks[2].skipped
    assert "stale" in ranks[3].skipped
    # gpu_models restricts the nodes
    h100 = _mine(place(members, parse_shape("gpus=1,gpu_model=H100-SXM5-80GB")), cluster_name)
    assert (h100[0].cluster[-2:], [n.node for n in h100[0].nodes]) == ("-b", ["b-2"])
    assert "no node admits" in h100[1].skipped


async def test_http_federation_endpoint(
    fleet: tuple[RedisConfig, dict[str, RedisStore]], cluster_name: str
) -> None:
    _, stores = fleet
    store = stores["b"]
    metrics = Metrics()
    server = HealthServer(
        metrics.registry,
        lambda: (True, "ok"),
        federation=lambda: federation_status(store, metrics, store.cluster),
    )
    port = await server.start()
    try:

        def get(path: str) -> tuple[int, bytes]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.read()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        status, body = await anyio.to_thread.run_sync(get, "/federation")
        assert status == 200
        view = json.loads(body)
        assert view["observer"] == store.cluster
        mine = _mine(view["members"], cluster_name)
        assert [(m["stale"], m["placeable"]) for m in mine] == [
            (False, True),
            (False, True),
            (False, False),
            (True, True),
        ]
        status, body = await anyio.to_thread.run_sync(get, "/metrics")
        assert f'pyctl_federation_members_stale{{cluster="{store.cluster}"}}'.encode() in body
    finally:
        await server.stop()

    # without a callback: 404; with a failing one (store closed): 503 and the reason
    closed = RedisStore(stores["a"].config, f"{cluster_name}-closed")
    for callback, code in ((None, 404), (lambda: federation_status(closed), 503)):
        srv = HealthServer(metrics.registry, lambda: (True, "ok"), federation=callback)
        port = await srv.start()
        try:
            status, body = await anyio.to_thread.run_sync(get, "/federation")
            assert status == code, body
            if code == 503:
                assert b"not open" in body
        finally:
            await srv.stop()


def _cli(
    config: RedisConfig, *args: str, password: str = AUTH_PASSWORD
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    env["PYCTL_REDIS_PASSWORD"] = password
    flags = ["--redis", config.url] + (["--redis-cluster"] if config.cluster else [])
    return subprocess.run(
        [sys.executable, "-m", "pyctl.cli.main", "federation", *args, *flags],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=60,
        check=False,
    )


async def test_cli_status_and_place(
    fleet: tuple[RedisConfig, dict[str, RedisStore]], cluster_name: str
) -> None:
    config, _ = fleet
    r = await anyio.to_thread.run_sync(lambda: _cli(config, "status", "--json"))
    assert r.returncode == 0, r.stderr
    mine = _mine(json.loads(r.stdout)["members"], cluster_name)
    assert [m["stale"] for m in mine] == [False, False, False, True]

    r = await anyio.to_thread.run_sync(lambda: _cli(config, "status"))
    assert r.returncode == 0, r.stderr
    assert f"{cluster_name}-gone" in r.stdout
    assert "stale" in r.stdout

    r = await anyio.to_thread.run_sync(lambda: _cli(config, "place", "gpus=1,cpu=2", "--json"))
    assert r.returncode == 0, r.stderr
    placed = _mine(json.loads(r.stdout)["clusters"], cluster_name)
    assert placed[0]["cluster"] == f"{cluster_name}-a"
    assert placed[0]["nodes"][0]["node"] == "a-lone"
    assert placed[0]["nodes"][0]["delta_gpus"] == -1.0

    r = await anyio.to_thread.run_sync(lambda: _cli(config, "place", "gpus=1,cpu=2"))
    assert r.returncode == 0, r.stderr
    assert "a-lone" in r.stdout
    # (other tests' fleets on the shared server may tie with this one's `a`)
    assert re.search(r"best: cluster test-\w+-a, node a-lone", r.stdout), r.stdout

    # the wrong password: a clear error, exit 2
    bad = await anyio.to_thread.run_sync(
        lambda: _cli(config, "status", password="wrong"),
    )
    assert bad.returncode == 2
    assert "password" in bad.stderr.lower(), bad.stderr


async def test_real_controller_summary_round_trips(
    auth_config: RedisConfig, cluster_name: str
) -> None:
    """A real Controller on the built-in simulated cluster, with its state in the shared Redis:
    its rich summary (node models and workload from the reconciler) is published, read back by
    another member, ranked by `place`; `watch_members` keeps the stale gauge current."""
    from pyctl.cluster.sim.scenario import inference_day
    from pyctl.cluster.sim.source import SimClusterSource
    from pyctl.controller.controller import Controller
    from pyctl.federation import watch_members

    store = RedisStore(auth_config, f"{cluster_name}-sim")
    reader = RedisStore(auth_config, f"{cluster_name}-reader")
    ctl = Controller(
        store.cluster,
        SimClusterSource(inference_day(seed=7), speed=2000.0, forever=True),
        store,
        summary_interval=0.2,
    )
    await reader.open()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            tg.start_soon(watch_members, reader, ctl.metrics, store.cluster, 0.2)
            with anyio.fail_after(30):
                while ctl.last_summary is None or not ctl.last_summary.idle_gpu_milli:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                await anyio.sleep(1.0)  # some pods placed: a fragmented cluster
            stale = ctl.metrics.registry.get_sample_value(
                "pyctl_federation_members_stale", {"cluster": store.cluster}
            )
            assert stale is not None
            tg.cancel_scope.cancel()
        # the controller is stopped: publish (as its summary loop will) the rich summary
        s = ctl.last_summary
        assert s is not None
        await store.put_summary(
            federation_summary_bytes(s, ctl.reconciler.models, ctl.reconciler.workload), 60
        )
    finally:
        await store.close()
    try:
        (member,) = [m for m in await read_members(reader) if m.cluster == store.cluster]
        assert member.rich
        assert not member.stale
        assert member.summary is not None
        assert member.summary.snapshot is not None
        assert member.nodes == len(member.summary.snapshot["nodes"]) > 0
        assert member.summary.workload
        ranks = [r for r in place([member], parse_shape("gpus=1")) if not r.skipped]
        assert ranks, "the simulated cluster has room for one GPU"
        assert ranks[0].nodes[0].node in ctl.reconciler.models
    finally:
        await reader.close()


async def test_cli_over_tls(
    redis_tls_server: RedisServer, tls_files: Tls, cluster_name: str
) -> None:
    """`pyctl federation place` over TLS (rediss://, the CA and a client certificate)."""
    config = redis_config(redis_tls_server.url, ssl_ca_file=str(tls_files.ca))
    store = RedisStore(config, f"{cluster_name}-tls")
    await store.open()
    try:
        a = {"a-lone": _node("a-lone", 1, 7)}
        await store.put_summary(federation_summary_bytes(_summary(store.cluster, a), a, M), 60)
    finally:
        await store.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
    args = [
        sys.executable, "-m", "pyctl.cli.main", "federation", "place", "gpus=1", "--json",
        "--redis", redis_tls_server.url, "--redis-ca-file", str(tls_files.ca),
        "--redis-cert-file", str(tls_files.cert), "--redis-key-file", str(tls_files.key),
    ]  # fmt: skip
    r = await anyio.to_thread.run_sync(
        lambda: subprocess.run(args, capture_output=True, text=True, env=env, timeout=60)
    )
    assert r.returncode == 0, r.stderr
    (mine,) = _mine(json.loads(r.stdout)["clusters"], cluster_name)
    assert mine["nodes"][0]["node"] == "a-lone"


#: federation members whose stored summary no reader may use, as someone with write access to
#: the shared Redis (or a broken controller) leaves them: (how it is written, the reason shown)
HOSTILE: dict[str, tuple[dict[str, str] | None, str]] = {
    "list": (None, "holds a list, not a hash"),
    "ttl-inf": ({"ttl": "inf"}, "ttl 'inf' is not a whole number"),
    "ttl-absurd": ({"ttl": "1000000000000000000"}, "ttl '1000000000000000000' is not"),
    "ttl-zero": ({"ttl": "0"}, "ttl '0' is not"),
    "published-abc": ({"published": "abc"}, "published time 'abc' is not a time"),
    "published-nan": ({"published": "nan"}, "published time 'nan' is not a time"),
    "published-inf": ({"published": "inf"}, "published time 'inf' is not a time"),
    "published-future": ({"published": "99999999999"}, "published time '99999999999' is not"),
}


async def test_one_hostile_member_blinds_no_other(redis_conn: RedisConn, cluster_name: str) -> None:
    """A member whose summary key has another Redis type, or whose publication time or TTL is
    not one, is shown invalid with its reason and counted once in
    `pyctl_quarantined_records_total{store="summaries"}`; every other member is listed and
    placed on, by `read_members`, `GET /federation` and `pyctl federation status|place`. Before,
    one such member made all of them fail (WRONGTYPE, int('inf')), or showed fresh for ever."""
    good = RedisStore(redis_conn.config, f"{cluster_name}-good")
    await good.open()
    try:
        nodes = {"g-1": _node("g-1", 1, 7)}
        summary = federation_summary_bytes(_summary(good.cluster, nodes), nodes, M)
        await good.put_summary(summary, 60)
        client = redis_conn.client
        sec, usec = await client.time()
        for name, (fields, _) in HOSTILE.items():
            key = Keys(f"{cluster_name}-{name}").summary
            if fields is None:
                await client.rpush(key, "x")
            else:
                stored: dict[str | bytes, str | bytes] = {
                    "data": summary,
                    "published": f"{sec}.{usec:06d}",
                    "ttl": "60",
                }
                stored.update(fields)
                await client.hset(key, mapping=stored)  # type: ignore[arg-type]
            await client.expire(key, 300)
            await client.zadd(members_key(), {f"{cluster_name}-{name}": float(sec)})

        members = {m.cluster: m for m in _mine(await read_members(good), cluster_name)}
        assert members[good.cluster].summary is not None
        assert not members[good.cluster].stale
        for name, (_, why) in HOSTILE.items():
            m = members[f"{cluster_name}-{name}"]
            assert m.summary is None, name
            assert why in m.error, (name, m.error)
            assert not m.rich

        metrics = Metrics()
        server = HealthServer(
            metrics.registry,
            lambda: (True, "ok"),
            federation=lambda: federation_status(good, metrics, good.cluster),
        )
        port = await server.start()
        try:
            url = f"http://127.0.0.1:{port}/federation"
            for _ in range(2):  # counted once per summary, however often read
                body = await anyio.to_thread.run_sync(
                    lambda: urllib.request.urlopen(url, timeout=10).read()
                )
        finally:
            await server.stop()
        view = {m["cluster"]: m for m in json.loads(body)["members"]}
        assert view[good.cluster]["placeable"]
        assert view[good.cluster]["nodes"] == 1
        for name, (_, why) in HOSTILE.items():
            m = view[f"{cluster_name}-{name}"]
            assert why in m["error"], m
            assert "scheduling_success" not in m, m
        invalid_seen = sum(1 for m in view.values() if m["error"])  # others' too
        counted = metrics.registry.get_sample_value(
            "pyctl_quarantined_records_total", {"cluster": good.cluster, "store": "summaries"}
        )
        assert counted == invalid_seen >= len(HOSTILE)

        config = redis_conn.config
        r = await anyio.to_thread.run_sync(lambda: _cli(config, "status", password=""))
        assert r.returncode == 0, r.stderr
        rows = [line for line in r.stdout.splitlines() if f"{cluster_name}-" in line]
        assert len(rows) == 1 + len(HOSTILE), r.stdout
        for row in rows:
            if f"{cluster_name}-good" in row:
                assert "fresh" in row
            else:
                assert "invalid (" in row, row
                assert "%" not in row, row
        r = await anyio.to_thread.run_sync(
            lambda: _cli(config, "place", "gpus=1,cpu=2", "--json", password="")
        )
        assert r.returncode == 0, r.stderr
        placed = {c["cluster"]: c for c in json.loads(r.stdout)["clusters"]}
        assert placed[good.cluster]["nodes"][0]["node"] == "g-1"
        for name in HOSTILE:
            assert placed[f"{cluster_name}-{name}"]["skipped"], name
    finally:
        await good.close()
