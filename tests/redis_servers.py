"""Real Redis servers for the tests and benchmarks (the integration tier, the e2e tier and bench/
import it from here): a single ``redis-server``, one with a password
(AUTH), one with TLS only, and a three-master Redis Cluster (``redis-server --cluster-enabled
yes`` x3 joined by ``redis-cli --cluster create``), each on free 127.0.0.1 ports, in a temporary
directory, without persistence (``--save '' --appendonly no``).

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


def cluster_args(config_file: Path, bus_port: int) -> list[str]:
    return [
        "--cluster-enabled", "yes",
        "--cluster-config-file", str(config_file),
        "--cluster-port", str(bus_port),
        "--cluster-node-timeout", "5000",
    ]  # fmt: skip


class RedisClusterServers:
    """Three masters on 127.0.0.1 (data and bus ports chosen free), joined into one cluster."""

    def __init__(self, binaries: Binaries, workdir: Path, masters: int = 3) -> None:
        self.binaries = binaries
        self.nodes: list[RedisServer] = []
        for i in range(masters):
            bus = free_port()
            self.nodes.append(
                RedisServer(
                    binaries,
                    workdir,
                    name=f"cluster-{i}",
                    extra_args=cluster_args(workdir / f"cluster-{i}" / "nodes.conf", bus),
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
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise RedisServerError(
                f"redis-cli --cluster create failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
            )
        self._wait_ok()

    def _cli(self, node: RedisServer, *args: str) -> str:
        done = subprocess.run(
            [self.binaries.cli, "-h", HOST, "-p", str(node.port), *args],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        return done.stdout

    def _wait_ok(self) -> None:
        """Until every node says cluster_state:ok and knows every slot (bounded)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            infos = [self._cli(node, "CLUSTER", "INFO") for node in self.nodes]
            if all("cluster_state:ok" in i and "cluster_slots_ok:16384" in i for i in infos):
                return
            time.sleep(0.1)
        raise RedisServerError(f"the Redis Cluster did not converge within 30s:\n{infos}")

    def keyslot(self, key: str) -> int:
        return int(self._cli(self.nodes[0], "CLUSTER", "KEYSLOT", key).strip())

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@atexit.register
def _stop_everything() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop()
