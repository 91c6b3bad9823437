"""A soak of pyctl on the real control plane: two replicas as deployed, load, and a seeded
schedule of faults; invariants checked from the API server's audit log, pyctl's logs and the
cluster while it runs and at the end (docs/soak.md).

What runs (all on 127.0.0.1, in `--work-dir`):

- the real control plane of the e2e tests (`pyctl/dev/control_plane.py`: etcd, kube-apiserver
  with an audit log, kube-controller-manager, kube-scheduler, kwok), `--nodes` kwok GPU nodes:
  nodes of 4 GPUs in one NUMA zone, and one in ten an A100 node whose two GPUs are in MIG mode
  (`all-1g.5gb`, played by the mig-manager stand-in, `pyctl/dev/mig_manager.py`);
- a real redis-server, or with `--redis cluster` a Redis Cluster (3 masters with a replica each,
  `cluster-node-timeout` 2 s; the replicas get `PYCTL_REDIS_CLUSTER=true`, as the chart sets it);
- two `pyctl run --kubeconfig ... --redis ... --mode enforce` replicas (subprocesses, leader
  election by the Lease, identities `pyctl-a` and `pyctl-b`), each with its own ServiceAccount
  token, so that the audit log names which replica made each request; `pyctl-b` reaches the API
  server through a proxy (below);
- load: 1-GPU pods created and deleted at a steady rate with bursts (the default scheduler
  spreads them), Deployments of 1-GPU replicas under PodDisruptionBudgets (`maxUnavailable: 1`)
  scaled up and down, 4-GPU pods that stay pending until pyctl rescues them, and pods asking for
  MIG profiles the MIG nodes do not offer until pyctl re-partitions them;
- faults at seeded random points (each kind `--faults-per-kind` times): `kill` (SIGKILL the
  leader, mid-workflow when one is open; it is started again), `stop` (SIGSTOP the leader past its
  Lease, until the other leads, then SIGCONT), `apiserver` (kube-apiserver restarted), `compact`
  (etcd compacted to its head, then the API server restarted: resumes from older
  resourceVersions get 410 Gone), `redis-empty` and `redis-keep` (redis-server gone for
  `--redis-outage` s, back empty or with its data; single Redis only), `redis-failover` (Redis
  Cluster only: the master serving pyctl's slot SIGKILLed, its replica promoted, the old master
  started again as a replica), `proxy` (for `--proxy-window` s the proxy in
  front of the API server for `pyctl-b` answers a share of requests with 500, 429 with
  Retry-After, drops the connection, or sends the body slowly), `mig-fail` (the mig-manager
  stand-in fails the next reconfiguration), `node-delete` (a node with an open workflow deleted).

Invariants (each violation is printed with its evidence): no write by a replica that did not
hold the Lease at that moment (audit log), no pod evicted twice, no PDB below its desired healthy
pods while its Deployment is steady, no eviction rate limit exceeded (global, per node, per
namespace, per hour; MIG re-partitions at once), no pyctl taint left on a node without an open
workflow, every workflow ended within its kind's deadline, resources flat (RSS, file descriptors,
threads of a replica that lived through the run, Redis memory: the end within 10% of the level
at a tenth of the run), and event-to-state plus reconcile p99 under 1 s during steady churn.

Usage: python bench/soak.py [--nodes 100] [--duration 600] [--seed 1] [--faults LIST]
       [--faults-per-kind N] [--redis single|cluster] [--pool-fill 2.1]
       [--big-per-pool-node 0.25] [--rescue-after S] [--work-dir DIR] [--json F] [--keep]
       python bench/soak.py --rejudge REPORT.json  (a saved run's resources judged again)
(`--pool-fill` and `--big-per-pool-node` set how much rescue work there is: replicas per node of
the rescue pool and the 4-GPU pods kept pending there; higher values leave fewer pool nodes free,
so more rescues, and so evictions.)
The last line: `soak: <D> s, <N> nodes[, Redis Cluster], faults <kind> <n> ..., workflows
started <s> done <d> rolled back <r> abandoned <a> open <o> lost <l>, invariant violations <V>,
rss at 10% <M> MiB at end <E> MiB`. Exit status 1 when V > 0.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Awaitable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from _common import REPO  # noqa: F401  (puts the repository on sys.path)
from aiohttp import web
from kubernetes_asyncio import config as kconfig
from scale import Api, ApiError, _die_with_parent, bucket_quantile, proc_memory

from pyctl.dev.control_plane import (
    APISERVER,
    KWOK,
    Component,
    ControlPlane,
    ensure_binaries,
    etcd_compact,
    etcd_revision,
    free_port,
)
from pyctl.dev.gpu_nodes import GPU, GpuNodeSpec, node_manifest
from pyctl.dev.mig_manager import STATE_LABEL, MigManagerSim, a100_all_1g, create_mig_node
from pyctl.state.keys import Keys
from pyctl.state.redis_client import RedisConfig, close_client, connect
from pyctl.state.redis_workflows import RedisWorkflowStore
from pyctl.workflows.base import FINISHED
from pyctl.workflows.engine import decode
from pyctl.workflows.kinds import builtin_registry
from tests.redis_servers import RedisClusterServers, RedisServer, find_binaries

NS = "soak"
SYSTEM_NS = "pyctl-system"
GPU_NS = "gpu-operator"
CONFIGMAP = "pyctl-mig-parted-config"
CLUSTER = "soak"
#: the workflow kinds pyctl runs (their records are read as the engine reads them)
REGISTRY = builtin_registry()
LEASE = "pyctl-leader"
REPLICAS = ("pyctl-a", "pyctl-b")
#: the replica that reaches the API server through the fault-injecting proxy
PROXIED = "pyctl-b"
FAULT_KINDS = (
    "kill",
    "stop",
    "apiserver",
    "compact",
    "redis-empty",
    "redis-keep",
    "proxy",
    "mig-fail",
    "node-delete",
)
#: the fault kinds with `--redis cluster`: a master failover instead of the single server's
#: outages
CLUSTER_FAULT_KINDS = (
    "kill",
    "stop",
    "apiserver",
    "compact",
    "redis-failover",
    "proxy",
    "mig-fail",
    "node-delete",
)
#: the Redis Cluster of `--redis cluster`: masters, a replica each, and `cluster-node-timeout`
#: (a master that does not answer this long is failed over)
CLUSTER_MASTERS = 3
CLUSTER_NODE_TIMEOUT_MS = 2000
#: profiles the MIG demand alternates between (the nodes start as all-1g.5gb)
MIG_DEMANDS = (("3g.20gb", 2), ("2g.10gb", 3))
TAINT_PREFIX = "pyctl.io/"
#: the label and taint of the rescue pool: nodes only the PDB-covered `svc-*` replicas and the
#: 4-GPU pods run on, so that a 4-GPU pod waits for pyctl to free one
POOL_KEY = "soak.pyctl.io/pool"
MIG_TAINT = "pyctl.io/mig-reconfiguration"

#: pyctl's configuration in the soak (environment of both replicas); the limits are what the
#: rate-limit invariant checks against
LEASE_DURATION = 6.0
WORKFLOW_INTERVAL = 5.0
RESCUE_DEADLINE = 180.0
MIG_TIMEOUT = 120.0
LIMITS = {
    "global": (10, 30.0),
    "node": (2, 6.0),
    "namespace": (10, 30.0),
}
DISRUPTIONS_PER_HOUR = 300
MIG_CONCURRENCY = 1
#: time between pyctl taking a token and its eviction reaching the API server, allowed for
BUCKET_SLACK_S = 2.0


def pyctl_env() -> dict[str, str]:
    env = {
        "PYCTL_CLUSTER": CLUSTER,
        "PYCTL_LEASE_NAMESPACE": SYSTEM_NS,
        "PYCTL_LEASE_NAME": LEASE,
        "PYCTL_LEASE_DURATION": str(LEASE_DURATION),
        "PYCTL_LOG_FORMAT": "json",
        "PYCTL_LOG_LEVEL": "info",
        "PYCTL_WORKFLOW_INTERVAL": str(WORKFLOW_INTERVAL),
        "PYCTL_SUMMARY_INTERVAL": "1",
        "PYCTL_WORKFLOW_RESCUE_DEADLINE": str(RESCUE_DEADLINE),
        "PYCTL_MIG_ACQUIRE_TIMEOUT": str(MIG_TIMEOUT),
        "PYCTL_MIG_APPLY_TIMEOUT": str(MIG_TIMEOUT),
        "PYCTL_MIG_DRAIN_TIMEOUT": str(MIG_TIMEOUT),
        "PYCTL_MIG_NODE_HOLDOFF_SECONDS": "0",
        "PYCTL_LIMIT_NODE_COOLDOWN_SECONDS": "5",
        "PYCTL_LIMIT_DISRUPTIONS_PER_HOUR": str(DISRUPTIONS_PER_HOUR),
        "PYCTL_LIMIT_WORKLOAD_BURST": "4",
        "PYCTL_LIMIT_WORKLOAD_PER_MINUTE": "12",
    }
    for scope, (burst, per_minute) in LIMITS.items():
        env[f"PYCTL_LIMIT_{scope.upper()}_BURST"] = str(burst)
        env[f"PYCTL_LIMIT_{scope.upper()}_PER_MINUTE"] = str(per_minute)
    return env


def deadline_of(kind: str) -> float:
    """How long a workflow of `kind` may take from its start to its end: its own deadlines, plus
    two minutes for the retries' backoff (60 s at most), the rounds and a take-over."""
    if "mig" in kind:  # waiting to start, draining, applying, rolling back
        return 4 * MIG_TIMEOUT + 120.0
    return RESCUE_DEADLINE + 120.0


def ts(text: str) -> float:
    """An RFC 3339 timestamp of the API server (UTC) as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --------------------------------------------------------------------------------------------------
# pyctl replicas, as deployed


@dataclass
class Incarnation:
    pid: int
    started: float
    log: Path
    ended: float = math.nan


class Replica:
    """One `pyctl run --mode enforce` replica: started again (same identity) after a kill."""

    def __init__(
        self, name: str, kubeconfig: Path, redis_url: str, logs: Path, redis_cluster: bool = False
    ) -> None:
        self.name = name
        self.port = free_port()
        self.extender_port = free_port()
        self.logs = logs
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
        env.update(pyctl_env())
        env["PYCTL_LEASE_IDENTITY"] = name
        if redis_cluster:  # as deployed (the chart's redis.external.cluster)
            env["PYCTL_REDIS_CLUSTER"] = "true"
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        self.env = env
        self.argv = [
            sys.executable,
            "-m",
            "pyctl.cli.main",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--redis",
            redis_url,
            "--mode",
            "enforce",
            "--metrics-port",
            str(self.port),
            "--extender-port",
            str(self.extender_port),
            "--no-live",
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives: list[Incarnation] = []
        self.stopped = False
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self) -> None:
        """Start a process (from the event loop's thread: children die with the thread that
        started them)."""
        log = self.logs / f"{self.name}-{len(self.lives) + 1:02d}.log"
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.lives.append(Incarnation(self.proc.pid, time.time(), log))

    def signal(self, sig: signal.Signals) -> None:
        """`sig` to the process group (the controller and its extender's process)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash: the harness starts it again (`start`)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
            self.lives[-1].ended = time.time()
        self.proc = None  # not an exit of its own (`exited`)

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def terminate(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.lives[-1].ended = time.time()

    def pids(self) -> list[int]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        out = [self.proc.pid]
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.pid:
                out.append(int(d.name))
        return out

    def resources(self) -> dict[str, float] | None:
        """RSS (bytes), open file descriptors and threads, summed over its processes."""
        pids = self.pids()
        if not pids:
            return None
        out = {"rss": 0.0, "fds": 0.0, "threads": 0.0}
        for pid in pids:
            try:
                out["rss"] += proc_memory(pid).get("VmRSS", 0)
                out["fds"] += len(os.listdir(f"/proc/{pid}/fd"))
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("Threads:"):
                        out["threads"] += int(line.split()[1])
            except OSError:
                if pid == pids[0]:
                    return None
        return out

    def metrics(self) -> str:
        try:
            with self._opener.open(f"http://127.0.0.1:{self.port}/metrics", timeout=3) as r:
                return str(r.read().decode())
        except OSError:
            return ""


def sample(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rpartition(" ")[2])
    return None


def buckets(text: str, name: str) -> dict[float, float]:
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            head, _, value = line.rpartition(" ")
            le = head.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = out.get(float(le), 0.0) + float(value)
    return out


# --------------------------------------------------------------------------------------------------
# The proxy in front of the API server for one replica


class FaultProxy:
    """An HTTPS reverse proxy on loopback (the API server's own certificate, so the replica's
    kubeconfig trusts it); it forwards the replica's token. While `active`, a share of requests
    is answered 500 or 429 (Retry-After: 1), dropped, or has its body sent slowly."""

    MODES = ("500", "429", "drop", "slow")

    def __init__(self, upstream: str, pki: Path, rng: random.Random, share: float = 0.3) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.pki = pki
        self.rng = rng
        self.share = share
        self.active = False
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        client_ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_ctx, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(str(self.pki / "apiserver.crt"), str(self.pki / "apiserver.key"))
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=server_ctx).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    @staticmethod
    def _status(code: int, reason: str) -> str:
        return json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": code,
                "reason": reason,
                "message": f"soak proxy: injected {code}",
            }
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        mode = ""
        if self.active and self.rng.random() < self.share:
            mode = self.rng.choice(self.MODES)
            self.injected[mode] += 1
        if mode == "500":
            return web.Response(
                status=500, text=self._status(500, "InternalError"), content_type="application/json"
            )
        if mode == "429":
            return web.Response(
                status=429,
                headers={"Retry-After": "1"},
                text=self._status(429, "TooManyRequests"),
                content_type="application/json",
            )
        if mode == "drop":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=503)
        self.forwarded += 1
        data = await request.read()
        hop = {"host", "connection", "keep-alive", "transfer-encoding", "content-length"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        try:
            async with self._session.request(
                request.method,
                self.upstream + request.path_qs,
                data=data or None,
                headers=headers,
                allow_redirects=False,
            ) as up:
                resp = web.StreamResponse(status=up.status)
                for k, v in up.headers.items():
                    if k.lower() not in hop:
                        resp.headers[k] = v
                await resp.prepare(request)
                first = True
                async for chunk in up.content.iter_any():
                    if mode == "slow" and first:
                        await asyncio.sleep(self.rng.uniform(1.0, 4.0))
                    first = False
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError, TimeoutError):
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=502)


# --------------------------------------------------------------------------------------------------
# What the harness records, and the invariants over it


@dataclass
class Write:
    """A write request of a replica (audit log): when the API server received it."""

    t: float
    user: str
    verb: str
    resource: str
    namespace: str
    name: str
    code: int


@dataclass
class WorkflowSeen:
    id: str
    kind: str
    node: str
    created: float
    step: str = ""
    updated: float = 0.0
    #: the record vanished from Redis while unfinished (Redis came back empty)
    lost_with_redis: bool = False
    #: "workflow finished" in a replica's log
    finished_in_log: bool = False
    #: its result once finished ("bound_elsewhere: the pending pod was bound to gpu-0076")
    result: str = ""


#: the least time after a replica's start before its resources are its level (short runs)
WARM_UP_MIN = 60.0


@dataclass
class Flat:
    """`resource_checks`' answer."""

    #: "replica[#life] key" -> [level a tenth of the run into the life, level at its end]
    levels: dict[str, list[float]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    rss_early: list[float] = field(default_factory=list)
    rss_late: list[float] = field(default_factory=list)

    def into(self, report: Report) -> None:
        """The levels, what was not checked and the RSS at a tenth and at the end, into
        `report` (its violations are the caller's: recorded live, or taken from a saved run)."""
        report.resources.update(self.levels)
        report.unchecked.extend(self.unchecked)
        if self.rss_early:
            report.rss_10_mib, report.rss_end_mib = max(self.rss_early), max(self.rss_late)


def resource_checks(series: list[dict[str, Any]], duration: float) -> Flat:
    """RSS, file descriptors and threads flat over each life of each replica (a life: one
    process, from a start to its kill or the run's end): the median of its last three samples
    within 10% (+2 descriptors or threads: a connection, a worker) of the median of its first
    three a tenth of the run (at least a minute: a process connecting, taking or losing the
    Lease) after it started. A life shorter than twice that is not judged (reported
    unchecked)."""
    warm = max(duration / 10, WARM_UP_MIN)
    lives: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for row in series:
        if "rss_mib" in row and row["t"] <= duration:
            lives[(row["replica"], row["life"])].append(row)
    several = Counter(replica for replica, _ in lives)
    out = Flat()
    for (replica, life), rows in sorted(lives.items()):
        rows.sort(key=lambda row: row["t"])
        name = f"{replica}#{life}" if several[replica] > 1 else replica
        start, end = rows[0]["t"], rows[-1]["t"]
        early = [row for row in rows if row["t"] >= start + warm][:3]
        late = rows[-3:]
        if end - start < 2 * warm or not early:
            out.unchecked.append(
                f"resources of {name}: lived {end - start:.0f} s, less than {2 * warm:.0f} s"
            )
            continue
        for key in ("rss_mib", "fds", "threads"):
            a, b = _middle(row[key] for row in early), _middle(row[key] for row in late)
            out.levels[f"{name} {key}"] = [round(a, 1), round(b, 1)]
            slack = 2 if key in ("fds", "threads") else 0
            if b > 1.1 * a + slack:
                out.violations.append(
                    f"{name} {key}: {a:.1f} at {start + warm:.0f} s, {b:.1f} at {end:.0f} s"
                )
            if key == "rss_mib":
                out.rss_early.append(a)
                out.rss_late.append(b)
    return out


def _middle(values: Iterable[float]) -> float:
    """The middle value (the upper of the two middle ones of an even count)."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def rescue_outcomes(workflows: list[WorkflowSeen]) -> dict[str, int]:
    """The finished rescues by outcome (the first word of their result, `pyctl.workflows.rescue`
    `OUTCOMES`); those bound elsewhere split by where: a node another rescue, under way at the
    same time, was freeing (the freed room went to another pending pod: nothing keeps it for its
    own pod under the default scheduler) or any other node (room freed by a departure)."""
    rescues = [w for w in workflows if w.kind == "rescue"]
    out: Counter[str] = Counter()
    for w in rescues:
        if not w.result:
            continue
        outcome, _, why = w.result.partition(":")
        if outcome == "bound_elsewhere":
            node = why.rsplit(" ", 1)[-1]
            end = w.updated or math.inf
            freeing = any(
                o.node == node
                and o.id != w.id
                and o.created <= end
                and (o.updated or math.inf) >= w.created
                for o in rescues
            )
            outcome += " (to a node another rescue freed)" if freeing else " (to another node)"
        out[outcome] += 1
    return dict(out)


def lease_violations(
    lease_writes: list[tuple[float, str]], writes: list[Write], duration: float
) -> list[str]:
    """Writes made by a replica that did not hold the Lease when the API server received them:
    the last successful Lease write before a write must be that replica's own, less than
    `duration` before it (its acquisition or renewal; another replica's later write is its
    take-over)."""
    order = sorted(lease_writes)
    times = [t for t, _ in order]
    out = []
    import bisect

    for w in writes:
        i = bisect.bisect_right(times, w.t) - 1
        if i < 0:
            out.append(
                f"{w.user} {w.verb} {w.resource} {w.namespace}/{w.name} at {w.t:.3f}: "
                "before any Lease write"
            )
            continue
        t_lease, holder = order[i]
        if holder != w.user:
            out.append(
                f"{w.user} {w.verb} {w.resource} {w.namespace}/{w.name} (code {w.code}) at "
                f"{w.t:.3f}: the Lease was last written by {holder} at {t_lease:.3f}"
            )
        elif w.t - t_lease > duration:
            out.append(
                f"{w.user} {w.verb} {w.resource} {w.namespace}/{w.name} (code {w.code}) at "
                f"{w.t:.3f}: its last renewal was {w.t - t_lease:.1f} s before (Lease "
                f"{duration:g} s)"
            )
    return out


def bucket_violations(times: list[float], burst: int, per_minute: float, what: str) -> list[str]:
    """Token-bucket conformance: in every window [t_i, t_j] at most burst + rate * (t_j - t_i +
    slack) events."""
    t = sorted(times)
    out = []
    rate = per_minute / 60.0
    for i in range(len(t)):
        for j in range(i, len(t)):
            allowed = burst + rate * (t[j] - t[i] + BUCKET_SLACK_S)
            if j - i + 1 > allowed + 1e-9:
                out.append(
                    f"rate limit {what}: {j - i + 1} evictions in {t[j] - t[i]:.1f} s "
                    f"(burst {burst}, {per_minute:g}/min allow {allowed:.1f})"
                )
                return out
    return out


def window_violations(times: list[float], limit: int, window: float, what: str) -> list[str]:
    t = sorted(times)
    j = 0
    for i in range(len(t)):
        while t[i] - t[j] >= window:
            j += 1
        if i - j + 1 > limit:
            return [f"{what}: {i - j + 1} evictions within {window:.0f} s (limit {limit})"]
    return []


@dataclass
class Report:
    duration: float = 0.0
    nodes: int = 0
    seed: int = 0
    #: `single` (one redis-server) or `cluster` (Redis Cluster, a replica per master)
    redis: str = "single"
    #: the fault kinds of this Redis mode, in the order of the last line
    fault_kinds: list[str] = field(default_factory=lambda: list(FAULT_KINDS))
    faults: dict[str, int] = field(default_factory=dict)
    #: (time from start, kind, detail) of each fault
    fault_log: list[tuple[float, str, str]] = field(default_factory=list)
    workflows: dict[str, int] = field(default_factory=dict)
    workflows_by_kind: dict[str, int] = field(default_factory=dict)
    #: the rescues' outcomes (`bound_elsewhere` split: to a node another rescue was freeing)
    rescues: dict[str, int] = field(default_factory=dict)
    #: the pending pods asked for and served ("big asked", "big served", "mig served")
    demand: dict[str, int] = field(default_factory=dict)
    evictions: int = 0
    evictions_refused: int = 0
    replica_writes: dict[str, int] = field(default_factory=dict)
    takeovers: int = 0
    proxy_injected: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    #: invariant -> violations (0 for each invariant checked)
    checks: dict[str, int] = field(default_factory=dict)
    #: what could not be checked, and why
    unchecked: list[str] = field(default_factory=list)
    rss_10_mib: float = math.nan
    rss_end_mib: float = math.nan
    resources: dict[str, list[float]] = field(default_factory=dict)
    lag_p99_ms: float = math.nan
    reconcile_p99_ms: float = math.nan
    #: time series: t (s from start), replica, rss MiB, fds, threads, redis MiB, queue depth,
    #: event-to-state p99 ms and reconcile p99 ms of the leader over the last window
    series: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        faults = " ".join(f"{k} {self.faults.get(k, 0)}" for k in self.fault_kinds)
        w = self.workflows
        redis = ", Redis Cluster" if self.redis == "cluster" else ""
        return (
            f"soak: {self.duration:.0f} s, {self.nodes} nodes{redis}, faults {faults}, workflows "
            f"started {w.get('started', 0)} done {w.get('done', 0)} rolled back "
            f"{w.get('rolled back', 0)} abandoned {w.get('abandoned', 0)} open "
            f"{w.get('open', 0)} lost {w.get('lost', 0)}"
            + (
                f" ended with its record gone {w['ended, record gone']}"
                if w.get("ended, record gone")
                else ""
            )
            + ", invariant violations "
            f"{len(self.violations)}, rss at 10% {self.rss_10_mib:.0f} MiB at end "
            f"{self.rss_end_mib:.0f} MiB"
        )


# --------------------------------------------------------------------------------------------------
# The soak


def pod(
    name: str,
    gpus: int = 0,
    app: str = "",
    labels: dict[str, str] | None = None,
    resources: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    pool: bool = False,
) -> dict[str, Any]:
    """A pod of the soak; `pool`: it runs on the rescue pool's nodes only (their selector and
    a toleration of their taint)."""
    res = dict(resources or {})
    if gpus:
        res[GPU] = str(gpus)
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/serve:1",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi", **res}, "limits": res},
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    if pool:
        spec["nodeSelector"] = {POOL_KEY: "rescue"}
        spec["tolerations"] = [{"key": POOL_KEY, "value": "rescue", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {"app": app or name, **(labels or {})},
        },
        "spec": spec,
    }


def fault_kinds(args: argparse.Namespace) -> tuple[str, ...]:
    return CLUSTER_FAULT_KINDS if args.redis == "cluster" else FAULT_KINDS


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.report = Report(
            nodes=args.nodes, seed=args.seed, redis=args.redis, fault_kinds=list(fault_kinds(args))
        )
        self.plane: ControlPlane | None = None
        self.redis: RedisServer | None = None
        #: with `--redis cluster` (then `redis` is the node pyctl's URL names)
        self.redis_cluster: RedisClusterServers | None = None
        self.replicas: dict[str, Replica] = {}
        self.proxy: FaultProxy | None = None
        self.mgr: MigManagerSim | None = None
        self.kapi: Any = None
        self.t0 = 0.0
        self.end_at = 0.0
        self.stopping = False
        self.gpu_nodes: list[str] = []
        self.mig_nodes: list[str] = []
        self.deleted_nodes: set[str] = set()
        self.pod_node: dict[str, str] = {}
        self.workflows: dict[str, WorkflowSeen] = {}
        self.redis_up = True
        self.redis_emptied_at: list[float] = []
        #: when a replica took over the slot of pyctl's keys (`redis-failover`)
        self.redis_failed_over_at: list[float] = []
        self.audit_offset = 0
        self.lease_writes: list[tuple[float, str]] = []
        self.writes: list[Write] = []
        self.evictions: list[Write] = []
        self.refused: list[Write] = []
        self.deploy_scaled: dict[str, float] = {}
        self.pdb_deficit: dict[str, float] = {}
        self.taint_orphan: dict[str, float] = {}
        self.violations: dict[str, list[str]] = defaultdict(list)
        self.violated: set[str] = set()
        self.mig_tainted_max = 0
        self.users: dict[str, str] = {}
        self.lag_before: dict[float, float] = {}
        self.lag_owner: tuple[str, int] = ("", 0)
        self.rec_before: dict[float, float] = {}
        self.lag_all: list[tuple[dict[float, float], dict[float, float]]] = []
        self.deployments: list[str] = []
        self.pool: list[str] = []
        self.churners: list[str] = []
        self.seq = 0

    def now(self) -> float:
        return time.time() - self.t0

    def violate(self, invariant: str, what: str, key: str = "") -> None:
        """Record a violation once per `key` (the object it is about; default: the message)."""
        key = f"{invariant}: {key or what}"
        if key not in self.violated:
            self.violated.add(key)
            self.violations[invariant].append(what)
            print(
                f"[soak {self.now():7.1f}s] VIOLATION {invariant}: {what}",
                file=sys.stderr,
                flush=True,
            )

    def say(self, what: str) -> None:
        print(f"[soak {self.now():7.1f}s] {what}", file=sys.stderr, flush=True)

    # -- set-up ------------------------------------------------------------------------------------

    def start_processes(self) -> None:
        binaries = ensure_binaries(self.work / "build.log")
        self.plane = ControlPlane(
            binaries,
            self.work / "cp",
            audit=True,
            extra_args={KWOK: ["--node-lease-duration-seconds=0"]},
        )
        self.plane.start()
        if self.args.redis == "cluster":
            self.redis_cluster = RedisClusterServers(
                find_binaries(),
                self.work / "redis-cluster",
                CLUSTER_MASTERS,
                replicas=1,
                node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS,
            )
            self.redis_cluster.start()
            self.redis = self.redis_cluster.nodes[0]
        else:
            self.redis = RedisServer(find_binaries(), self.work, name="redis")
            self.redis.start()

    def redis_config(self) -> RedisConfig:
        """How the soak reads Redis (as the replicas are configured)."""
        assert self.redis is not None
        return RedisConfig(url=self.redis.url, cluster=self.redis_cluster is not None)

    def redis_memory_port(self) -> int:
        """The server whose memory is sampled: the one redis-server, or the master serving
        pyctl's keys (all on one slot)."""
        assert self.redis is not None
        if self.redis_cluster is None:
            return self.redis.port
        return self.redis_cluster.master_of(Keys(CLUSTER).schema).port

    async def setup(self, api: Api) -> dict[str, Path]:
        assert self.plane is not None
        for ns in (NS, SYSTEM_NS):
            await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201, 409))
        kubeconfigs: dict[str, Path] = {}
        ca = base64.b64encode((self.plane.pki / "ca.crt").read_bytes()).decode()
        for name in REPLICAS:
            await api.call(
                "POST",
                f"/api/v1/namespaces/{SYSTEM_NS}/serviceaccounts",
                {"metadata": {"name": name}},
                ok=(201, 409),
            )
            await api.call(
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "metadata": {"name": f"soak-{name}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": SYSTEM_NS}],
                },
                ok=(201, 409),
            )
            tok = await api.call(
                "POST",
                f"/api/v1/namespaces/{SYSTEM_NS}/serviceaccounts/{name}/token",
                {"spec": {"expirationSeconds": int(self.args.duration) + 4 * 3600}},
            )
            server = self.plane.server
            if name == PROXIED:
                assert self.proxy is not None
                server = f"https://127.0.0.1:{self.proxy.port}"
            path = self.work / f"{name}.kubeconfig"
            path.write_text(
                json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [
                            {
                                "name": "c",
                                "cluster": {"server": server, "certificate-authority-data": ca},
                            }
                        ],
                        "users": [{"name": name, "user": {"token": tok["status"]["token"]}}],
                        "contexts": [{"name": "c", "context": {"cluster": "c", "user": name}}],
                        "current-context": "c",
                    }
                )
            )
            kubeconfigs[name] = path
            self.users[f"system:serviceaccount:{SYSTEM_NS}:{name}"] = name
        # nodes: one in ten a MIG node (at least one), the others 4 GPUs in one NUMA zone
        n_mig = max(1, self.args.nodes // 10)
        self.mig_nodes = [f"mig-{i:04d}" for i in range(n_mig)]
        self.gpu_nodes = [f"gpu-{i:04d}" for i in range(self.args.nodes - n_mig)]
        specs = [
            GpuNodeSpec(
                n,
                product="NVIDIA-H100-80GB-HBM3",
                gpu_memory_mib=81559,
                numa_zones=1,
                gpus_per_zone=4,
                labels={"nvidia.com/mig.capable": "false"},
            )
            for n in self.gpu_nodes
        ]
        self.pool = self.gpu_nodes[: max(3, len(self.gpu_nodes) // 6)]
        manifests: list[Any] = [node_manifest(s) for s in specs]
        for m in manifests:
            if m["metadata"]["name"] in self.pool:
                m["metadata"]["labels"][POOL_KEY] = "rescue"
                m["spec"]["taints"] = [{"key": POOL_KEY, "value": "rescue", "effect": "NoSchedule"}]
        await api.many("POST", (("/api/v1/nodes", m) for m in manifests))
        mig_specs = [a100_all_1g(n) for n in self.mig_nodes]
        kapi = await kconfig.new_client_from_config(
            config_file=str(self.plane.kubeconfig), persist_config=False
        )
        self.kapi = kapi
        await create_mig_node(kapi, mig_specs[0], CONFIGMAP, GPU_NS)
        if len(mig_specs) > 1:
            from pyctl.dev.gpu_nodes import create_gpu_nodes

            await create_gpu_nodes(kapi, mig_specs[1:])
        self.mgr = MigManagerSim(kapi, mig_specs, namespace=GPU_NS, configmap=CONFIGMAP, delay=2.0)
        names = set(self.gpu_nodes) | set(self.mig_nodes)
        deadline = time.monotonic() + 120
        while (missing := await api.not_ready(names)) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(1)
        if missing:
            raise RuntimeError(f"{missing} nodes not Ready after 120 s")
        # Deployments under PDBs, and those of the churn (no PDB)
        # `--pool-fill` replicas per pool node (3.5 per Deployment on average; the default, about
        # 2, leaves few pool nodes free)
        n_svc = round(self.args.pool_fill / 3.5 * len(self.pool))
        self.deployments = [f"svc-{i}" for i in range(max(2, n_svc))]
        self.churners = [f"churn-{i}" for i in range(max(3, len(self.gpu_nodes) // 5))]
        start = round(2.4 * len(self.gpu_nodes) / len(self.churners))
        for d in self.deployments + self.churners:
            tmpl = pod("x", gpus=1, app=d, pool=d in self.deployments)
            await api.call(
                "POST",
                f"/apis/apps/v1/namespaces/{NS}/deployments",
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": d, "namespace": NS},
                    "spec": {
                        "replicas": 3 if d in self.deployments else start,
                        "selector": {"matchLabels": {"app": d}},
                        "template": {"metadata": {"labels": {"app": d}}, "spec": tmpl["spec"]},
                    },
                },
            )
            self.deploy_scaled[d] = time.time()
            if d not in self.deployments:
                continue
            await api.call(
                "POST",
                f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
                {
                    "metadata": {"name": d, "namespace": NS},
                    "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": d}}},
                },
            )
        return kubeconfigs

    # -- load --------------------------------------------------------------------------------------

    def _name(self, prefix: str) -> str:
        self.seq += 1
        return f"{prefix}-{self.seq:06d}"

    async def _create(self, api: Api, manifest: dict[str, Any]) -> None:
        with contextlib.suppress(ApiError, aiohttp.ClientError, OSError, TimeoutError):
            await api.call("POST", f"/api/v1/namespaces/{NS}/pods", manifest)

    async def _delete(self, api: Api, name: str) -> None:
        with contextlib.suppress(ApiError, aiohttp.ClientError, OSError, TimeoutError):
            await api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}", ok=(200, 202, 404))

    async def churn(self, api: Api) -> None:
        """1-GPU pods of the `churn-*` Deployments (owned by their ReplicaSets, as the pods pyctl
        may move are): about 2.4 per GPU node, each Deployment rescaled at random so that about
        one pod in `--pod-life` s is replaced per pod, with a burst (ten times as many changes
        for 10 s) every few minutes."""
        target = 2.4 * len(self.gpu_nodes)
        mean = target / len(self.churners)
        # a rescale changes about mean / 4 pods; creations and deletions per second ~ rate
        changes = (target / self.args.pod_life) / max(1.0, mean / 4)
        next_burst = time.time() + self.rng.uniform(60, 180)
        while not self.stopping:
            if time.time() >= next_burst + 10:
                next_burst = time.time() + self.rng.uniform(120, 300)
            per_second = changes * (10 if next_burst <= time.time() else 1)
            k = int(per_second) + (1 if self.rng.random() < per_second % 1 else 0)
            jobs: list[Awaitable[None]] = []
            for d in self.rng.sample(self.churners, min(k, len(self.churners))):
                replicas = self.rng.randint(round(0.5 * mean), round(1.5 * mean))
                jobs.append(self._scale(api, d, replicas))
            await asyncio.gather(*jobs)
            await asyncio.sleep(1.0)

    async def _scale(self, api: Api, deployment: str, replicas: int) -> None:
        with contextlib.suppress(ApiError, aiohttp.ClientError, OSError, TimeoutError):
            await api.call(
                "PATCH",
                f"/apis/apps/v1/namespaces/{NS}/deployments/{deployment}/scale",
                {"spec": {"replicas": replicas}},
                content_type="application/merge-patch+json",
            )
            self.deploy_scaled[deployment] = time.time()

    async def scale_deployments(self, api: Api) -> None:
        """The Deployments under PDBs, scaled up and down (2 to 5 replicas) every 15-30 s."""
        while not self.stopping:
            await asyncio.sleep(self.rng.uniform(15, 30))
            await self._scale(api, self.rng.choice(self.deployments), self.rng.randint(2, 5))

    async def demand(self, api: Api) -> None:
        """4-GPU pods no node has room for (pyctl rescues them) and MIG pods for a profile the
        MIG nodes do not offer (pyctl re-partitions one); each withdrawn a while after it was
        served, or after `deadline_of` if it never was."""
        big: dict[str, float] = {}
        mig: dict[str, float] = {}
        served: dict[str, float] = {}
        cycle = 0
        next_mig = time.time() + 20
        while not self.stopping:
            now = time.time()
            pods = {
                p["metadata"]["name"]: p
                async for p in api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector="demand")
            }
            for name, p in pods.items():
                if p.get("spec", {}).get("nodeName") and name not in served:
                    served[name] = now
                    kind = "big" if name in big else "mig" if name in mig else "other"
                    self.report.demand[f"{kind} served"] = (
                        self.report.demand.get(f"{kind} served", 0) + 1
                    )
            for group, limit in ((big, RESCUE_DEADLINE + 60), (mig, 3 * MIG_TIMEOUT + 60)):
                for name, t in list(group.items()):
                    done = name in served and now - served[name] > 30
                    if done or now - t > limit or (name not in pods and now - t > 30):
                        await self._delete(api, name)
                        group.pop(name)
            want_big = max(1, int(self.args.big_per_pool_node * len(self.pool)))
            while len(big) < want_big:
                name = self._name("big")
                big[name] = now
                self.report.demand["big asked"] = self.report.demand.get("big asked", 0) + 1
                await self._create(
                    api, pod(name, gpus=4, app="big", labels={"demand": "big"}, pool=True)
                )
            live_mig = [n for n in self.mig_nodes if n not in self.deleted_nodes]
            if not mig and live_mig and now >= next_mig:
                profile, count = MIG_DEMANDS[cycle % len(MIG_DEMANDS)]
                node = live_mig[cycle % len(live_mig)]
                cycle += 1
                for _ in range(count):
                    name = self._name("mig")
                    mig[name] = now
                    res = {f"nvidia.com/mig-{profile}": "1"}
                    await self._create(
                        api,
                        pod(
                            name,
                            app="mig",
                            labels={"demand": "mig"},
                            resources=res,
                            node_selector={"kubernetes.io/hostname": node},
                        ),
                    )
                next_mig = now + self.rng.uniform(30, 60)
            await asyncio.sleep(5)

    async def run_mig_manager(self) -> None:
        assert self.mgr is not None
        while True:
            try:
                await self.mgr.run()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API server restarts under it: list and watch again
                self.say(f"mig-manager stand-in: {type(e).__name__}; watching again")
                await asyncio.sleep(1)

    # -- faults ------------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        kinds = [k for k in self.args.faults.split(",") if k]
        todo = [k for k in kinds for _ in range(self.args.faults_per_kind)]
        self.rng.shuffle(todo)
        d = self.args.duration
        times = sorted(self.rng.uniform(0.12 * d, 0.8 * d) for _ in todo)
        return list(zip(times, todo, strict=True))

    async def leader(self, within: float = 60.0) -> Replica | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            for r in self.replicas.values():
                text = await asyncio.to_thread(r.metrics)
                if sample(text, "pyctl_leader") == 1.0:
                    return r
            await asyncio.sleep(0.5)
        return None

    def open_workflows(self) -> list[WorkflowSeen]:
        return [
            w for w in self.workflows.values() if w.step not in FINISHED and not w.lost_with_redis
        ]

    async def _mid_workflow(self, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not self.open_workflows():  # noqa: ASYNC110
            await asyncio.sleep(0.5)

    async def restart_apiserver(self) -> None:
        assert self.plane is not None
        old = next(c for c in self.plane.started if c.name == APISERVER)
        old.kill()
        new = Component(old.name, list(old.argv), old.log, old.env)
        new.start()
        self.plane.started[self.plane.started.index(old)] = new
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                status, _ = await asyncio.to_thread(
                    self.plane._get, f"{self.plane.server}/readyz", self.plane.ssl_context()
                )
            except OSError:  # not listening yet
                status = 0
            if status == 200:
                return
            await asyncio.sleep(0.5)
        raise RuntimeError("kube-apiserver not ready 90 s after its restart")

    async def inject(self, kind: str, api: Api) -> str:
        assert self.redis is not None
        assert self.proxy is not None
        assert self.mgr is not None
        if kind in ("kill", "stop"):
            await self._mid_workflow(30)
            r = await self.leader(30)
            if r is None:
                return "no leader"
            wf = len(self.open_workflows())
            if kind == "kill":
                r.kill()
                await asyncio.sleep(1)
                r.start()
                return f"{r.name} killed with {wf} workflows open, started again"
            r.signal(signal.SIGSTOP)
            t = time.monotonic()
            await asyncio.sleep(LEASE_DURATION + 2)
            other = None
            while time.monotonic() - t < 60:
                other = await self.leader(2)
                if other is not None and other is not r:
                    break
            await asyncio.sleep(2)
            r.signal(signal.SIGCONT)
            took = other.name if other is not None and other is not r else "nobody"
            return f"{r.name} stopped {time.monotonic() - t:.0f} s with {wf} open; {took} led"
        if kind == "apiserver":
            await self.restart_apiserver()
            return "kube-apiserver restarted"
        if kind == "compact":
            assert self.plane is not None
            rev = await asyncio.to_thread(etcd_revision, self.plane)
            await asyncio.to_thread(etcd_compact, self.plane, rev)
            await self.restart_apiserver()
            return f"etcd compacted to {rev}, kube-apiserver restarted"
        if kind in ("redis-empty", "redis-keep"):
            keep = kind == "redis-keep"
            dump = self.redis.dir / "dump.rdb"
            if keep:
                with contextlib.suppress(Exception):
                    import redis as redis_py

                    redis_py.Redis(host="127.0.0.1", port=self.redis.port).save()
            self.redis.kill()
            self.redis_up = False
            if not keep:
                dump.unlink(missing_ok=True)
            await asyncio.sleep(self.args.redis_outage)
            self.redis.start()
            self.redis_up = True
            if not keep:
                self.redis_emptied_at.append(time.time())
            return f"redis-server gone {self.args.redis_outage:.0f} s, back " + (
                "with its data" if keep else "empty"
            )
        if kind == "redis-failover":
            assert self.redis_cluster is not None
            await self._mid_workflow(30)
            wf = len(self.open_workflows())
            key = Keys(CLUSTER).schema
            self.redis_up = False
            began = time.monotonic()
            try:
                old, new = await asyncio.to_thread(self.redis_cluster.failover, key)
            finally:
                self.redis_up = True
            promoted_in = time.monotonic() - began
            self.redis_failed_over_at.append(time.time())
            await asyncio.to_thread(self.redis_cluster.rejoin, old)
            return (
                f"master :{old.port} of pyctl's slot killed with {wf} workflows open, replica "
                f":{new.port} promoted {promoted_in:.1f} s later; the old master back as a replica"
            )
        if kind == "proxy":
            self.proxy.active = True
            before = sum(self.proxy.injected.values())
            await asyncio.sleep(self.args.proxy_window)
            self.proxy.active = False
            return f"proxy: {sum(self.proxy.injected.values()) - before} responses spoiled"
        if kind == "mig-fail":
            self.mgr.fail_next += 1
            return "the next MIG reconfiguration fails"
        if kind == "node-delete":
            await self._mid_workflow(60)
            busy = [w.node for w in self.open_workflows() if w.node not in self.deleted_nodes]
            live = [n for n in self.gpu_nodes if n not in self.deleted_nodes]
            node = busy[0] if busy else self.rng.choice(live)
            with contextlib.suppress(ApiError):
                await api.call("DELETE", f"/api/v1/nodes/{node}", ok=(200, 202, 404))
            self.deleted_nodes.add(node)
            return f"node {node} deleted ({'mid-workflow' if busy else 'no workflow open'})"
        raise AssertionError(kind)

    async def faults(self, api: Api) -> None:
        for at, kind in self.schedule():
            delay = self.t0 + at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.stopping:
                return
            t = self.now()
            self.say(f"fault {kind}")
            try:
                detail = await self.inject(kind, api)
            except Exception as e:
                detail = f"failed: {type(e).__name__}: {e}"
            self.report.faults[kind] = self.report.faults.get(kind, 0) + 1
            self.report.fault_log.append((round(t, 1), kind, detail))
            self.say(f"fault {kind}: {detail}")

    # -- observation -------------------------------------------------------------------------------

    def read_audit(self) -> None:
        assert self.plane is not None
        assert self.plane.audit_log is not None
        try:
            if self.plane.audit_log.stat().st_size < self.audit_offset:
                self.audit_offset = 0  # rotated
            with self.plane.audit_log.open("rb") as f:
                f.seek(self.audit_offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.audit_offset += end
        for line in data[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            user = self.users.get(ev.get("user", {}).get("username", ""))
            if user is None or ev.get("stage") != "ResponseComplete":
                continue
            verb = ev.get("verb", "")
            if verb not in ("create", "update", "patch", "delete", "deletecollection"):
                continue
            ref = ev.get("objectRef") or {}
            res = ref.get("resource", "")
            if ref.get("subresource"):
                res += "/" + ref["subresource"]
            code = int((ev.get("responseStatus") or {}).get("code", 0))
            t = ts(ev["requestReceivedTimestamp"])
            w = Write(t, user, verb, res, ref.get("namespace", ""), ref.get("name", ""), code)
            if res == "leases" and w.name == LEASE:
                if code < 300:
                    self.lease_writes.append((t, user))
                continue
            if res == "events" or res.endswith("reviews"):
                continue
            self.writes.append(w)
            if res == "pods/eviction":
                (self.evictions if code < 300 else self.refused).append(w)

    async def poll_workflows(self, store: RedisWorkflowStore) -> None:
        try:
            recs = await store.list()
        except Exception:  # Redis away: nothing to read
            return
        seen = set()
        for wid, rec in recs.items():
            try:
                wf = decode(rec.data, REGISTRY)
            except ValueError:
                continue
            seen.add(wid)
            w = self.workflows.get(wid)
            if w is None:
                w = self.workflows[wid] = WorkflowSeen(wid, wf.kind, wf.node, wf.created)
            # a record lost with Redis and started again (the same id) is a new workflow
            w.step, w.updated, w.created, w.lost_with_redis = wf.step, wf.updated, wf.created, False
            w.result = wf.result if wf.step in FINISHED else w.result
        # a record gone after Redis came back empty, or after a failover (what the old master
        # had not yet sent to its replica is lost: asynchronous replication)
        lost_at = self.redis_emptied_at[-1:] + self.redis_failed_over_at[-1:]
        if lost_at and self.redis_up:
            for w in self.open_workflows():
                if w.id not in seen and w.created < max(lost_at):
                    w.lost_with_redis = True

    def read_logs(self) -> None:
        """'workflow started' and 'workflow finished' from every replica's logs (a workflow
        whose record went with Redis is still counted)."""
        for r in self.replicas.values():
            for life in r.lives:
                with contextlib.suppress(OSError), life.log.open("rb") as f:
                    for line in f:
                        if b"workflow " not in line:
                            continue
                        try:
                            rec = json.loads(line)
                        except ValueError:
                            continue
                        wid = rec.get("workflow", "")
                        if rec.get("msg") == "workflow started" and wid not in self.workflows:
                            self.workflows[wid] = WorkflowSeen(
                                wid,
                                rec.get("kind", "?"),
                                rec.get("node", ""),
                                ts(rec["ts"] + "Z") if "ts" in rec else 0.0,
                            )
                        elif rec.get("msg") == "workflow finished" and wid in self.workflows:
                            self.workflows[wid].finished_in_log = True
                            self.workflows[wid].result = str(rec.get("result", ""))
                        elif rec.get("msg", "").startswith("taking over a step"):
                            self.report.takeovers += 1

    async def observe(self, api: Api) -> None:
        """Every 2 s: the audit log, Redis' workflows, nodes, PDBs and pods, resources and
        pyctl's metrics; the continuous invariants over them."""
        rc = self.redis_config()
        redis_client = connect(rc)
        store = RedisWorkflowStore(redis_client, rc, CLUSTER)
        last_series = 0.0
        try:
            while True:
                await self.observe_once(api, store)
                if time.time() - last_series >= self.args.sample_every:
                    last_series = time.time()
                    await self.sample_series()
                await asyncio.sleep(2)
        finally:
            await close_client(redis_client)

    async def observe_once(self, api: Api, store: RedisWorkflowStore) -> None:
        self.read_audit()
        await self.poll_workflows(store)
        now = time.time()
        try:
            nodes = [n async for n in api.items("/api/v1/nodes")]
            pods = [p async for p in api.items(f"/api/v1/namespaces/{NS}/pods")]
            pdb_path = f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets"
            pdbs = [p async for p in api.items(pdb_path)]
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError):
            return  # the API server restarts
        for p in pods:
            node = p.get("spec", {}).get("nodeName")
            if node:
                self.pod_node[p["metadata"]["name"]] = node
        open_nodes = {w.node for w in self.open_workflows()}
        mig_tainted = 0
        for n in nodes:
            name = n["metadata"]["name"]
            ours = [
                t["key"]
                for t in n.get("spec", {}).get("taints") or []
                if t.get("key", "").startswith(TAINT_PREFIX)
            ]
            mig_tainted += MIG_TAINT in ours
            if ours and name not in open_nodes and self.redis_up:
                since = self.taint_orphan.setdefault(name, now)
                if now - since > 3 * WORKFLOW_INTERVAL + 30:
                    self.violate(
                        "taint left behind",
                        f"{name} carries {ours} {now - since:.0f} s with no open workflow",
                        key=name,
                    )
            else:
                self.taint_orphan.pop(name, None)
        self.mig_tainted_max = max(self.mig_tainted_max, mig_tainted)
        if mig_tainted > MIG_CONCURRENCY:
            self.violate(
                "rate limit", f"{mig_tainted} nodes re-partitioning at once", key="MIG concurrency"
            )
        for pdb in pdbs:
            name = pdb["metadata"]["name"]
            st = pdb.get("status") or {}
            deficit = st.get("desiredHealthy", 0) - st.get("currentHealthy", 0)
            steady = now - self.deploy_scaled.get(name, 0) > 30
            if deficit > 0 and steady:
                since = self.pdb_deficit.setdefault(name, now)
                if now - since >= 5:
                    self.violate(
                        "PDB",
                        f"{name}: {st.get('currentHealthy')} healthy, desired "
                        f"{st.get('desiredHealthy')} (Deployment steady)",
                        key=name,
                    )
            else:
                self.pdb_deficit.pop(name, None)
        for w in self.open_workflows():
            if now - w.created > deadline_of(w.kind):
                self.violate(
                    "deadline",
                    f"workflow {w.id} ({w.kind} on {w.node}) open "
                    f"{now - w.created:.0f} s, step {w.step or '?'}",
                    key=w.id,
                )

    async def sample_series(self) -> None:
        assert self.redis is not None
        t = round(self.now(), 1)
        redis_mib = math.nan
        with contextlib.suppress(Exception):
            import redis as redis_py

            port = await asyncio.to_thread(self.redis_memory_port)
            info = await asyncio.to_thread(
                redis_py.Redis(host="127.0.0.1", port=port, socket_timeout=2).info, "memory"
            )
            redis_mib = info["used_memory"] / 2**20
        leader_text = ""
        for r in self.replicas.values():
            text = await asyncio.to_thread(r.metrics)
            if sample(text, "pyctl_leader") == 1.0:
                leader_text = text
            res = r.resources()
            row: dict[str, Any] = {
                "t": t,
                "replica": r.name,
                "life": len(r.lives),
                "redis_mib": redis_mib,
            }
            if res is not None:
                row.update(rss_mib=res["rss"] / 2**20, fds=res["fds"], threads=res["threads"])
            depth = sample(text, "pyctl_workqueue_depth")
            row["queue"] = depth
            lag = buckets(text, "pyctl_event_to_state_seconds")
            rec = buckets(text, "pyctl_reconcile_duration_seconds")
            if text is leader_text and lag:
                owner = (r.name, len(r.lives))
                if owner != self.lag_owner:  # another process: its own histograms
                    self.lag_owner, self.lag_before, self.rec_before = owner, {}, {}
                if self.lag_before and sum(lag.values()) >= sum(self.lag_before.values()):
                    row["lag_p99_ms"] = 1000 * bucket_quantile(self.lag_before, lag, 0.99)
                    row["reconcile_p99_ms"] = 1000 * bucket_quantile(self.rec_before, rec, 0.99)
                    self.lag_all.append((self.lag_before, lag))
                self.lag_before, self.rec_before = lag, rec
            self.report.series.append(row)

    # -- the end -----------------------------------------------------------------------------------

    async def drain(self, api: Api) -> None:
        """Demand withdrawn: wait (at most `--drain` s) until no workflow is open and no node
        carries a pyctl taint."""
        with contextlib.suppress(ApiError, aiohttp.ClientError, OSError):
            await api.call(
                "DELETE", f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": "demand"}
            )
        deadline = time.time() + self.args.drain
        while time.time() < deadline:
            tainted = [
                n
                async for n in api.items("/api/v1/nodes")
                if any(
                    t.get("key", "").startswith(TAINT_PREFIX)
                    for t in n.get("spec", {}).get("taints") or []
                )
            ]
            if not self.open_workflows() and not tainted:
                return
            await asyncio.sleep(2)

    async def final_checks(self, api: Api) -> None:
        self.read_audit()
        self.read_logs()
        self.check_writes()
        await self.check_left_behind(api)
        self.check_workflows()
        self.check_resources()
        self.check_freshness()
        rep = self.report
        assert self.proxy is not None
        rep.proxy_injected = dict(self.proxy.injected)
        for name in (
            "write without the Lease",
            "evicted twice",
            "PDB",
            "rate limit",
            "taint left behind",
            "MIG label left behind",
            "DeviceTaintRule left behind",
            "deadline",
            "resources",
            "freshness",
            "replica exited",
        ):
            rep.checks[name] = len(self.violations.get(name, []))
        rep.violations = [f"{k}: {v}" for k, vs in self.violations.items() for v in vs]

    def check_writes(self) -> None:
        """The Lease, the evictions and the rate limits, from the audit log."""
        rep = self.report
        # the Lease: no write without it
        for v in lease_violations(self.lease_writes, self.writes, LEASE_DURATION):
            self.violate("write without the Lease", v)
        rep.replica_writes = dict(Counter(f"{w.user} {w.verb} {w.resource}" for w in self.writes))
        # evictions: never twice for one pod
        evicted = Counter(f"{w.namespace}/{w.name}" for w in self.evictions)
        for key, times_evicted in evicted.items():
            if times_evicted > 1:
                self.violate("evicted twice", f"{key} evicted {times_evicted} times")
        rep.evictions, rep.evictions_refused = len(self.evictions), len(self.refused)
        # rate limits
        times = [w.t for w in self.evictions]
        burst, per_minute = LIMITS["global"]
        for v in bucket_violations(times, burst, per_minute, "global"):
            self.violate("rate limit", v)
        by_node: dict[str, list[float]] = defaultdict(list)
        by_ns: dict[str, list[float]] = defaultdict(list)
        for w in self.evictions:
            by_node[self.pod_node.get(w.name, "?")].append(w.t)
            by_ns[w.namespace].append(w.t)
        for node, ts_ in by_node.items():
            if node != "?":
                for v in bucket_violations(ts_, *LIMITS["node"], f"node {node}"):
                    self.violate("rate limit", v)
        for ns, ts_ in by_ns.items():
            for v in bucket_violations(ts_, *LIMITS["namespace"], f"namespace {ns}"):
                self.violate("rate limit", v)
        for v in window_violations(times, DISRUPTIONS_PER_HOUR, 3600, "disruptions per hour"):
            self.violate("rate limit", v)

    async def check_left_behind(self, api: Api) -> None:
        """No pyctl taint, MIG label or DeviceTaintRule left at the end."""
        rep = self.report
        # nothing left behind
        nodes = [n async for n in api.items("/api/v1/nodes")]
        for n in nodes:
            name = n["metadata"]["name"]
            for t in n.get("spec", {}).get("taints") or []:
                if t.get("key", "").startswith(TAINT_PREFIX):
                    self.violate("taint left behind", f"{name} carries {t['key']} at the end")
            labels = n["metadata"].get("labels", {})
            if name in self.mig_nodes and labels.get(STATE_LABEL) not in ("success", None):
                self.violate(
                    "MIG label left behind",
                    f"{name}: {STATE_LABEL}={labels.get(STATE_LABEL)} at the end",
                )
        try:
            rules = [r async for r in api.items("/apis/resource.k8s.io/v1/devicetaintrules")]
            for rule in rules:
                self.violate("DeviceTaintRule left behind", rule["metadata"]["name"])
        except ApiError as e:
            rep.unchecked.append(f"DeviceTaintRules: {e}"[:200])

    def check_workflows(self) -> None:
        """Every workflow counted by how it ended, each within its deadline or still young."""
        rep = self.report
        # workflows: counted, each ended within its deadline or still young
        now = time.time()
        outcome: Counter[str] = Counter()
        for wf in self.workflows.values():
            outcome["started"] += 1
            rep.workflows_by_kind[wf.kind] = rep.workflows_by_kind.get(wf.kind, 0) + 1
            if wf.step == "done":
                outcome["done"] += 1
            elif wf.step == "failed":
                outcome["rolled back"] += 1
            elif wf.step == "abandoned":
                outcome["abandoned"] += 1
            elif wf.lost_with_redis:
                outcome["lost"] += 1
            elif wf.finished_in_log:
                outcome["ended, record gone"] += 1  # its last step went with Redis
            else:
                outcome["open"] += 1
                if now - wf.created > deadline_of(wf.kind):
                    self.violate("deadline", f"workflow {wf.id} ({wf.kind}) never ended", key=wf.id)
            if wf.step in ("done", "failed", "abandoned") and wf.updated - wf.created > deadline_of(
                wf.kind
            ):
                self.violate(
                    "deadline",
                    f"workflow {wf.id} ({wf.kind}) took {wf.updated - wf.created:.0f} s",
                    key=wf.id,
                )
        rep.workflows = dict(outcome)
        rep.rescues = rescue_outcomes(list(self.workflows.values()))

    def check_resources(self) -> None:
        """RSS, file descriptors and threads flat over each replica's lives, Redis memory from
        a tenth of the run on."""
        rep = self.report
        # resources flat: each life of a replica long enough to tell (a kill starts another)
        flat = resource_checks(rep.series, self.args.duration)
        flat.into(rep)
        for v in flat.violations:
            self.violate("resources", v)
        red = [s["redis_mib"] for s in rep.series if not math.isnan(s.get("redis_mib", math.nan))]
        reds = [s for s in rep.series if not math.isnan(s.get("redis_mib", math.nan))]
        if red and not self.redis_emptied_at and not self.redis_failed_over_at:
            a = [s["redis_mib"] for s in reds if s["t"] >= self.args.duration / 10][:3]
            b = [s["redis_mib"] for s in reds][-3:]
            if a and b and sorted(b)[1 if len(b) > 2 else 0] > 1.1 * sorted(a)[len(a) // 2] + 1:
                self.violate("resources", f"redis used_memory {a} at 10%, {b} at end")
            rep.resources["redis_mib"] = [round(a[0], 2) if a else math.nan, round(b[-1], 2)]
        elif red and self.redis_failed_over_at:
            rep.unchecked.append(
                "Redis memory: the master of pyctl's slot was replaced during the run (failover)"
            )
        elif red:
            rep.unchecked.append("Redis memory: Redis came back empty during the run")

    def check_freshness(self) -> None:
        """The leader's event-to-state and reconcile p99 over the run."""
        rep = self.report
        # freshness: event-to-state p99 and reconcile p99 over the run, from the leader
        lags = [s.get("lag_p99_ms") for s in rep.series if s.get("lag_p99_ms") is not None]
        recs = [
            s.get("reconcile_p99_ms") for s in rep.series if s.get("reconcile_p99_ms") is not None
        ]
        finite = [x for x in lags if x is not None and math.isfinite(x)]
        if finite:
            rep.lag_p99_ms = sorted(finite)[len(finite) // 2]
            finite_r = [x for x in recs if x is not None and math.isfinite(x)]
            rep.reconcile_p99_ms = sorted(finite_r)[len(finite_r) // 2] if finite_r else math.nan
            if rep.lag_p99_ms + (rep.reconcile_p99_ms if finite_r else 0) >= 1000:
                self.violate(
                    "freshness",
                    f"event-to-state p99 {rep.lag_p99_ms:.0f} ms + "
                    f"reconcile p99 {rep.reconcile_p99_ms:.0f} ms",
                )
        else:
            rep.unchecked.append("freshness: no leader metrics sampled")

    async def watch_replicas(self) -> None:
        """A replica that exits by itself (not killed here) is a violation: it is started
        again so that the soak goes on."""
        while True:
            for r in self.replicas.values():
                code = r.exited()
                if code is not None:
                    self.violate(
                        "replica exited", f"{r.name} exited with {code} ({r.lives[-1].log})"
                    )
                    r.lives[-1].ended = time.time()
                    r.start()
            await asyncio.sleep(1)

    async def run(self) -> Report:
        assert self.plane is not None
        self.proxy = FaultProxy(self.plane.server, self.plane.pki, random.Random(self.args.seed))
        await self.proxy.start()
        async with Api(self.plane.server, self.plane.ssl_context()) as api:
            kubeconfigs = await self.setup(api)
            assert self.redis is not None
            logs = self.work / "logs"
            logs.mkdir(exist_ok=True)
            for name in REPLICAS:
                self.replicas[name] = Replica(
                    name, kubeconfigs[name], self.redis.url, logs, self.redis_cluster is not None
                )
                if self.args.rescue_after:
                    after = str(self.args.rescue_after)
                    self.replicas[name].env["PYCTL_WORKFLOW_RESCUE_AFTER"] = after
                self.replicas[name].start()
            if await self.leader(90) is None:
                raise RuntimeError(f"no replica leads 90 s after start: see {logs}")
            self.t0 = time.time()
            self.say(f"{self.args.nodes} nodes, two replicas, one leads; the soak starts")
            tasks = [
                asyncio.create_task(c)
                for c in (
                    self.churn(api),
                    self.scale_deployments(api),
                    self.demand(api),
                    self.run_mig_manager(),
                    self.observe(api),
                    self.faults(api),
                    self.watch_replicas(),
                )
            ]
            try:
                await asyncio.sleep(self.args.duration)
                self.stopping = True
                # a fault under way is seen through (a stopped leader is resumed) before the end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(tasks[5]), 180)
                self.say("load and faults over; demand withdrawn, waiting for the workflows")
                await self.drain(api)
                self.report.duration = self.now()
                await self.final_checks(api)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for r in self.replicas.values():
                    r.terminate()
                await self.proxy.stop()
                await self.kapi.close()
        return self.report

    def stop(self) -> None:
        for r in self.replicas.values():
            with contextlib.suppress(Exception):
                r.terminate()
        if self.redis_cluster is not None:
            self.redis_cluster.stop()
        elif self.redis is not None:
            self.redis.stop()
        if self.plane is not None:
            self.plane.stop()


def rejudge(path: Path) -> int:
    """A saved report's resources judged again by `resource_checks` (the other invariants were
    checked while the run went on and are taken as recorded): its last line as this version
    prints it."""
    data = json.loads(path.read_text())
    known = {f.name for f in dataclasses.fields(Report)}
    report = Report(**{k: v for k, v in data.items() if k in known})
    report.unchecked = [u for u in report.unchecked if not u.startswith("resources of ")]
    report.violations = [
        v
        for v in report.violations
        if not v.startswith("resources: ") or v.startswith("resources: redis")
    ]
    flat = resource_checks(report.series, report.duration)
    report.resources = {k: v for k, v in report.resources.items() if k == "redis_mib"}
    flat.into(report)
    report.violations.extend(f"resources: {v}" for v in flat.violations)
    report.checks["resources"] = len(flat.violations) + sum(
        v.startswith("resources: redis") for v in report.violations
    )
    print(f"rejudged {path}: resources {report.resources}; not checked: {report.unchecked}")
    print(report.line())
    return 1 if report.violations else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load and faults")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--faults",
        help="fault kinds, comma-separated (default: every kind of the Redis mode: "
        f"{','.join(FAULT_KINDS)}; with --redis cluster {','.join(CLUSTER_FAULT_KINDS)})",
    )
    p.add_argument("--faults-per-kind", type=int, default=1)
    p.add_argument(
        "--redis",
        choices=("single", "cluster"),
        default="single",
        help="one redis-server, or a Redis Cluster of 3 masters with a replica each",
    )
    p.add_argument("--redis-outage", type=float, default=30.0)
    p.add_argument("--proxy-window", type=float, default=60.0)
    p.add_argument("--pod-life", type=float, default=120.0, help="mean life of a churn pod, s")
    p.add_argument(
        "--pool-fill",
        type=float,
        default=2.1,
        help="1-GPU replicas under PDBs per rescue-pool node, on average",
    )
    p.add_argument(
        "--big-per-pool-node",
        type=float,
        default=0.25,
        help="pending 4-GPU pods kept asked for, per rescue-pool node",
    )
    p.add_argument(
        "--rescue-after",
        type=float,
        default=0.0,
        help="the replicas' workflow.rescue_after: seconds before a pending pod is rescued",
    )
    p.add_argument(
        "--drain",
        type=float,
        default=300.0,
        help="at most this long after the run for the open workflows to end",
    )
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--work-dir", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--rejudge",
        type=Path,
        metavar="REPORT",
        help="run nothing: judge a saved --json report's sampled resources again with this "
        "version's check, and print its last line",
    )
    args = p.parse_args(argv)
    if args.rejudge is not None:
        return rejudge(args.rejudge)
    known = fault_kinds(args)
    if args.faults is None:
        args.faults = ",".join(known)
    for k in args.faults.split(","):
        if k and k not in known:
            p.error(f"fault {k!r} is not one of --redis {args.redis}: {', '.join(known)}")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="pyctl-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    no_proxy = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1,localhost"]))
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = no_proxy
    soak = Soak(args, work)
    try:
        soak.start_processes()
        report = asyncio.run(soak.run())
    finally:
        soak.stop()
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    for v in report.violations:
        print(f"violation: {v}")
    for t, kind, detail in report.fault_log:
        print(f"fault at {t:.0f} s: {kind}: {detail}")
    print(f"checks: {report.checks}; not checked: {report.unchecked or 'none'}")
    print(
        f"evictions {report.evictions} (refused {report.evictions_refused}), take-overs "
        f"{report.takeovers}, proxy {report.proxy_injected}, workflows by kind "
        f"{report.workflows_by_kind}, rescues {report.rescues}, demand {report.demand}, "
        f"event-to-state p99 {report.lag_p99_ms:.0f} ms, "
        f"reconcile p99 {report.reconcile_p99_ms:.0f} ms, resources {report.resources}"
    )
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=1, default=str))
    print(report.line())
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
