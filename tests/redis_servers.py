"""Real Redis servers for the tests and benchmarks (the integration tier, the e2e tier and bench/
import it from here): a single ``redis-server``, one with a password
(AUTH), one with TLS only, and a Redis Cluster (``redis-server --cluster-enabled yes`` x3
joined by ``redis-cli --cluster create``; with replicas, a master can be failed over: killed
and replaced by its replica, then brought back as a replica), each on free 127.0.0.1 ports, in
a temporary directory, without persistence (``--save '' --appendonly no``).

Synchronous (subprocess and sockets) so that session-scoped fixtures can own them. Every server
started here is also registered with `atexit`, so none outlives the test run, even when a fixture
is interrupted.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"
START_TIMEOUT = 10.0
LOG_TAIL_LINES = 20

_live: set[RedisServer] = set()


class RedisServerError(Exception):
    """A server could not be started (the message says which and shows its log tail)."""


@dataclass(frozen=True)
class Binaries:
    server: str
    cli: str


def find_binaries() -> Binaries:
    """redis-server and redis-cli, or a RedisServerError saying how to install them."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    missing = [name for name, path in (("redis-server", server), ("redis-cli", cli)) if not path]
    if missing:
        raise RedisServerError(
            f"{' and '.join(missing)} not found on PATH: the integration tests need a real Redis. "
            "Install it with `scripts/system-deps` (Debian packages redis-server and redis-tools, "
            "listed in scripts/system-packages.txt), or `make setup`."
        )
    assert server is not None
    assert cli is not None
    return Binaries(server, cli)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Tls:
    """Certificates for a TLS server and its clients (made by `make_certificates`)."""

    ca: Path
    cert: Path
    key: Path


def make_certificates(directory: Path) -> Tls:
    """A throwaway CA and a server/client certificate for 127.0.0.1, with the openssl CLI."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "redis.key", directory / "redis.csr", directory / "redis.crt"
    ext = directory / "ext.cnf"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    steps = [
        ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=pyctl test CA"],
        ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", "/CN=127.0.0.1"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
         "-days", "2", "-extfile", ext],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run(
            ["openssl", *map(str, step)], capture_output=True, text=True, check=False, timeout=60
        )
        if done.returncode != 0:
            raise RedisServerError(f"openssl {step[0]} failed: {done.stderr.strip()}")
    return Tls(ca=ca, cert=cert, key=key)


class RedisServer:
    """One redis-server process on 127.0.0.1. `start`, `stop` (SIGTERM, then SIGKILL), `kill`
    (SIGKILL: Redis going away), `pause`/`resume` (SIGSTOP/SIGCONT: Redis not answering), and
    `start` again on the same port (Redis coming back, empty: nothing is persisted)."""

    def __init__(
        self,
        binaries: Binaries,
        workdir: Path,
        *,
        name: str = "redis",
        password: str | None = None,
        tls: Tls | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binaries = binaries
        self.name = name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.tls = tls
        self.extra_args = list(extra_args)
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "redis.log"

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{HOST}:{self.port}/0"

    def _args(self) -> list[str]:
        args = [
            self.binaries.server,
            "--bind", HOST,
            "--protected-mode", "no",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.log),
            "--daemonize", "no",
        ]  # fmt: skip
        if self.tls:
            args += [
                "--port", "0",
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert),
                "--tls-key-file", str(self.tls.key),
                "--tls-ca-cert-file", str(self.tls.ca),
                "--tls-auth-clients", "optional",
            ]  # fmt: skip
        else:
            args += ["--port", str(self.port)]
        if self.password is not None:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self, attempts: int = 3) -> None:
        """Start on a free port (the same port again when it ran before), wait until it answers."""
        failure = ""
        fixed = self.port != 0
        for _ in range(attempts):
            if not fixed:
                self.port = free_port()
            self._spawn()
            try:
                self._wait_ready()
                return
            except RedisServerError as exc:
                failure = str(exc)
                self._terminate()
                if fixed:  # the port must stay the same: try it again after a pause
                    time.sleep(0.2)
        raise RedisServerError(failure)

    def _spawn(self) -> None:
        self.process = subprocess.Popen(
            self._args(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _live.add(self)

    def _ping(self) -> bool:
        """One PING over a raw socket; an answer of any kind (+PONG, -NOAUTH) means it is up."""
        try:
            with socket.create_connection((HOST, self.port), timeout=0.5) as raw:
                conn: socket.socket | ssl.SSLSocket = raw
                if self.tls:
                    ctx = ssl.create_default_context(cafile=str(self.tls.ca))
                    conn = ctx.wrap_socket(raw, server_hostname=HOST)
                conn.sendall(b"PING\r\n")
                return conn.recv(64)[:1] in (b"+", b"-")
        except OSError:
            return False

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisServerError(
                    f"{self.name}: redis-server exited with {self.process.returncode} on port "
                    f"{self.port}\n{self.log_tail()}"
                )
            if self._ping():
                return
            time.sleep(0.02)
        raise RedisServerError(
            f"{self.name}: redis-server did not answer on port {self.port} within "
            f"{START_TIMEOUT:g}s\n{self.log_tail()}"
        )

    def log_tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def _signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)

    def _terminate(self) -> None:
        if self.process is None:
            return
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.process.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL: the server disappears at once (its data with it)."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=5)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def stop(self) -> None:
        self._terminate()
        _live.discard(self)

    def __repr__(self) -> str:
        return f"RedisServer({self.name} on {HOST}:{self.port})"


def cluster_args(config_file: Path, bus_port: int, node_timeout_ms: int = 5000) -> list[str]:
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", str(config_file),
        "--cluster-port", str(bus_port),
        "--cluster-node-timeout", str(node_timeout_ms),
    ]  # fmt: skip


@dataclass(frozen=True)
class ClusterNode:
    """One line of ``CLUSTER NODES`` as a live node sees it."""

    id: str
    port: int
    flags: frozenset[str]
    #: the master's id of a replica ("-" for a master)
    master_id: str
    #: (first, last) slot ranges a master serves
    slots: tuple[tuple[int, int], ...]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    def serves(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterNode]:
    """``CLUSTER NODES``: ``<id> <ip:port@bus[,hostname]> <flags> <master> <ping> <pong>
    <epoch> <link> <slot> ...`` per line (a slot is ``n``, ``a-b``, or ``[...]`` while it is
    being migrated: skipped)."""
    nodes = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        address = f[1].split("@", 1)[0]
        port = int(address.rsplit(":", 1)[1]) if ":" in address else 0
        slots = []
        for s in f[8:]:
            if s.startswith("["):
                continue
            first, _, last = s.partition("-")
            slots.append((int(first), int(last or first)))
        flags = frozenset(f[2].replace("myself,", "").split(","))
        nodes.append(ClusterNode(f[0], port, flags, f[3], tuple(slots)))
    return nodes


class RedisClusterServers:
    """`masters` masters on 127.0.0.1 (data and bus ports chosen free), each with `replicas`
    replicas, joined into one cluster. `node_timeout_ms` is `cluster-node-timeout`: how long a
    master may not answer before the others mark it failed and its replica takes over (a
    failover takes about that plus a second).

    A master failover as a fault: `master_of(key)` (the master serving the key's slot),
    `kill(node)` (SIGKILL), `wait_promoted(old)` (one of its replicas is the master of its
    slots, seen so by every live node), `rejoin(old)` (started again on its port with its
    nodes.conf: it comes back as a replica of the new master, empty, and copies its data).
    """

    replicas: int = 0
    node_timeout_ms: int = 5000

    def __init__(
        self,
        binaries: Binaries,
        workdir: Path,
        masters: int = 3,
        *,
        replicas: int = 0,
        node_timeout_ms: int = 5000,
    ) -> None:
        self.binaries = binaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[RedisServer] = []
        for i in range(masters * (1 + replicas)):
            bus = free_port()
            self.nodes.append(
                RedisServer(
                    binaries,
                    workdir,
                    name=f"cluster-{i}",
                    extra_args=cluster_args(
                        workdir / f"cluster-{i}" / "nodes.conf", bus, node_timeout_ms
                    ),
                )
            )

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"{HOST}:{node.port}" for node in self.nodes]
        done = subprocess.run(
            [self.binaries.cli, "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise RedisServerError(
                f"redis-cli --cluster create failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        self._wait_ok()
        if self.replicas:
            self._wait_replicas_up(self.nodes)

    def _cli(self, node: RedisServer, *args: str) -> str:
        done = subprocess.run(
            [self.binaries.cli, "-h", HOST, "-p", str(node.port), *args],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        return done.stdout

    def live(self) -> list[RedisServer]:
        """The nodes whose process runs."""
        return [n for n in self.nodes if n.process is not None and n.process.poll() is None]

    def _wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says cluster_state:ok and knows every slot (bounded)."""
        deadline = time.monotonic() + timeout
        infos: list[str] = []
        while time.monotonic() < deadline:
            infos = [self._cli(node, "CLUSTER", "INFO") for node in self.live()]
            if all("cluster_state:ok" in i and "cluster_slots_ok:16384" in i for i in infos):
                return
            time.sleep(0.1)
        raise RedisServerError(f"the Redis Cluster did not converge within {timeout:g}s:\n{infos}")

    def _wait_replicas_up(self, nodes: Sequence[RedisServer], timeout: float = 30.0) -> None:
        """Until each replica among `nodes` has its link to its master up (the first full copy
        made)."""
        deadline = time.monotonic() + timeout
        pending: list[RedisServer] = []
        while time.monotonic() < deadline:
            pending = []
            for node in nodes:
                info = self._cli(node, "INFO", "replication")
                if "role:slave" in info and "master_link_status:up" not in info:
                    pending.append(node)
            if not pending:
                return
            time.sleep(0.1)
        raise RedisServerError(
            f"replicas not linked to their master within {timeout:g}s: {pending}"
        )

    def keyslot(self, key: str) -> int:
        return int(self._cli(self.live()[0], "CLUSTER", "KEYSLOT", key).strip())

    def cluster_nodes(self, via: RedisServer | None = None) -> list[ClusterNode]:
        """``CLUSTER NODES`` as `via` (default: the first live node) sees it."""
        return parse_cluster_nodes(self._cli(via or self.live()[0], "CLUSTER", "NODES"))

    def server(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(port)

    def master_of(self, key: str) -> RedisServer:
        """The master serving `key`'s slot (as the first live node sees it)."""
        slot = self.keyslot(key)
        for n in self.cluster_nodes():
            if n.is_master and not n.failing and n.serves(slot):
                return self.server(n.port)
        raise RedisServerError(f"no live master serves slot {slot} ({key!r})")

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        nodes = self.cluster_nodes()
        ids = [n.id for n in nodes if n.port == master.port]
        return [self.server(n.port) for n in nodes if ids and n.master_id == ids[0]]

    def in_sync(self, master: RedisServer) -> bool:
        """Every replica of `master` has acknowledged all it was sent (replication is
        asynchronous: what a master acknowledged but its replica had not is lost when the
        replica takes over)."""
        info = self._cli(master, "INFO", "replication")
        fields = dict(
            line.split(":", 1) for line in info.splitlines() if ":" in line and line[0] != "#"
        )
        offset = fields.get("master_repl_offset", "").strip()
        replicas = [v for k, v in fields.items() if k.startswith("slave") and k[5:].isdigit()]
        if not offset or not replicas:
            return False
        return all(f"offset={offset}," in r for r in replicas)

    def wait_in_sync(self, master: RedisServer, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.in_sync(master):
                return
            time.sleep(0.05)
        raise RedisServerError(f"the replicas of {master} did not catch up within {timeout:g}s")

    def kill(self, node: RedisServer) -> None:
        """SIGKILL one node (a master: its slots have no master until a replica takes over)."""
        node.kill()

    def wait_promoted(self, old: RedisServer, slot: int, timeout: float = 30.0) -> RedisServer:
        """Until a master other than `old` (one of its replicas: no other node can take its
        slots) serves `slot`, every live node sees the same one, and every live node says
        cluster_state:ok; that new master."""
        deadline = time.monotonic() + timeout
        views: list[list[ClusterNode]] = []
        while time.monotonic() < deadline:
            views = [self.cluster_nodes(node) for node in self.live()]
            owners = {
                n.port
                for view in views
                for n in view
                if n.is_master and not n.failing and n.serves(slot)
            }
            if len(owners) == 1 and old.port not in owners:
                with contextlib.suppress(RedisServerError):
                    self._wait_ok(timeout=max(0.1, deadline - time.monotonic()))
                    return self.server(owners.pop())
            time.sleep(0.1)
        raise RedisServerError(
            f"no replica of {old} took over slot {slot} within {timeout:g}s: {views[:1]}"
        )

    def failover(self, key: str, timeout: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """The master failover as a fault: the master serving `key`'s slot killed, one of its
        replicas promoted; (old, new). The old master stays down (`rejoin` brings it back)."""
        slot = self.keyslot(key)
        old = self.master_of(key)
        if not self.replicas_of(old):
            raise RedisServerError(f"{old} has no replica to take over")
        self.kill(old)
        return old, self.wait_promoted(old, slot, timeout)

    def rejoin(self, old: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again on its port (its nodes.conf keeps its identity): it joins
        as a replica of the master that took its slots, empty, and copies its data from it."""
        old.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "role:slave" in self._cli(old, "INFO", "replication"):
                break
            time.sleep(0.1)
        else:
            raise RedisServerError(f"{old} did not rejoin as a replica within {timeout:g}s")
        self._wait_replicas_up([old], timeout=max(1.0, deadline - time.monotonic()))
        self._wait_ok(timeout=max(1.0, deadline - time.monotonic()))

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@atexit.register
def _stop_everything() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop()
