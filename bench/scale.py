"""pyctl at scale on the real control plane: start-up, memory, freshness under churn, the extender
in the scheduler's path, planning, and how each cost grows with the cluster.

One control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok; the
harness of the e2e tests, `pyctl/dev/control_plane.py`) is grown through the sizes (default 1,000,
2,000 and 5,000 nodes). The nodes are kwok GPU nodes as `pyctl/dev/gpu_nodes.py` makes them (8
GPUs in 2 NUMA zones under `single-numa-node`, a NodeResourceTopology each, GFD labels): H100s,
and a share of A100-80GB nodes whose first 4 GPUs are in MIG mode (all-1g.10gb, all-2g.20gb or
all-3g.40gb). Each node gets about 10 pods bound to it (3 DaemonSet pods, GPU replicas of 1, 2
and 4 GPUs of ReplicaSets within one NUMA zone, MIG replicas, CPU-only replicas; its
NodeResourceTopology shows their usage per zone) and a few pods stay pending (8-GPU pods no node
can hold, MIG pods asking for 7g.80gb instances no GPU has; `--pending`, as many at every size):
the default scheduler marks them Unschedulable. At each size `pyctl run --kubeconfig ...
--redis ...` starts as deployed (a subprocess, observe mode, a real redis-server of its own) and
is measured:

1. start-up: from the process start to its log line "every node scored" (every kind listed, M
   derived, each node scored) and to /readyz answering 200; and the same from the end of the
   last initial list (pyctl's "listed" log lines), with the CPU time pyctl's processes and the
   rest of the machine used in that stretch (/proc, sampled every 50 ms); pyctl is started
   `--starts` times (each with a Redis of its own) and the least of each is kept: the same
   work's CPU time moved by a third between runs on this shared machine, and noise only adds;
2. memory: the controller's peak RSS (VmHWM; with the extender's own process: the sum of the
   two) and its steady RSS (after start-up settled), per node
   and per pod as the slope of a line through the sizes; Redis `used_memory` per node;
3. freshness under churn: for `--churn-seconds`, pod writes at `--churn-rate` per second on random
   nodes (1-GPU pods created bound to a node, and deleted), and on top of them probes: on 4 probe
   nodes (NUMA zone 1 full, zone 0 empty) a 1-GPU pod is created or deleted and pyctl's extender
   is asked, every 5 ms, whether a 4-GPU pod fits the node (single-numa-node: it does exactly
   when zone 0 is empty); event-to-score is the time from sending the write to the first answer
   that reflects it (the extender answers from the same per-node model the score is computed
   on, replaced together with it); p50/p99, and the controller's CPU over the churn;
4. the extender in the scheduler's path: 1,000 GPU pods (1 or 2 GPUs) for a second
   kube-scheduler, created before it starts; it schedules them without an extender and with
   pyctl's extender as deploy/scheduler configures it, twice each, interleaved (without, with,
   without, with; each burst once pyctl's work queue is empty): pods per second from the first
   bind to the last (a watch), the mean of each pair, with / without; pyctl's own timing of
   those calls (`pyctl_extender_request_seconds`, `pyctl_extender_work_seconds`); then a last
   burst with the extender, each call through a small measuring proxy in its own process (its
   p50/p99 per call, as the scheduler waits for it; the proxy's own cost is kept out of the
   ratio). During the bursts the machine is split as a deployment splits it (`--split-cores`):
   pyctl's two processes and its Redis on one core (the chart allows pyctl a core), the control
   plane, the measured scheduler and the bench on the other; the scheduler runs at pyctl's
   priority (`--scheduler-nice`, 0). Each burst's CPU accounting, first bind to last: the
   scheduler's CPU per pod, pyctl's CPU, the machine's busy share. Without the split the two
   cores were busy through every burst, and pyctl's extender work (2 to 3 ms of CPU per pod
   more than without it) was taken from the scheduler's side: the ratio measured the machine;
5. planning: every compaction and MIG planning round over the whole cluster after start-up (at
   the default interval of 30 s, while the churn and the bursts above share the process), from
   pyctl's log line per round: their median (and the longest compaction round), and the median
   of the round thread's CPU time;
6. growth: each cost fitted against size on log-log axes; the exponent (1.0 = linear; n log n
   between 1,000 and 5,000 nodes is 1.13). The last line's exponent is the worst of the costs
   judged: every cost but the planning rounds' wall times (a MIG round's tens of ms are decided
   by what else holds the GIL or a core meanwhile), whose CPU times are judged instead;
7. the machine's speed (`--reference R`, 1,000 by default): before each start and after the
   planning rounds, `bench/startup.py`'s start-up of its fixed R-node cluster in a process of
   its own (the same work as the start-up measured in 1, on the same input every time), its
   least seconds to every node scored per size. The costs that are pyctl's own CPU work (the
   first score after the lists, its CPU time, the planning rounds' CPU times) are judged for
   growth in units of their size's reference: the same code's first score after the lists at
   5,000 nodes took 2.16 to 2.65 s in runs an hour apart, and a run's sizes are measured minutes
   apart, so a slower quarter hour at one size alone moved the exponent by more than its
   margin. Their exponents in seconds are printed beside.

The machine is shared: on 2 cores the API server alone takes most of one at 5,000 nodes, and a
controller deployed with a CPU request of its own would not wait for it. So the control plane's
processes run at niceness `--others-nice` (10 by default; the kernel then gives pyctl's processes
about nine tenths of a core they contend for), pyctl, its Redis and the bench's own load at the
default priority; the run's line says the niceness, and `--others-nice 0` measures with every
process sharing the cores equally (the runs before this option did).

Tuning for thousands of kwok nodes (the harness's defaults otherwise): kwok's node leases off
(`--node-lease-duration-seconds=0`; kwok would renew 5,000 Leases every 10 s, 500 writes/s that
pyctl never reads); kube-controller-manager runs only the disruption and namespace controllers
(the pods carry ReplicaSet owner references, which the bench places itself; the replicaset and
garbage-collector controllers would recreate or delete them).

Usage: python bench/scale.py [--sizes 1000,2000,5000] [--churn-seconds 60] [--burst 1000]
       [--work-dir DIR] [--plot PATH] [--json PATH] [--keep]
One line per size, a line of exponents, then the last line: `scale: <N> nodes, first score <S> s,
rss <M> MiB, p99 event-to-score <L> ms, scheduler with extender <R>x of without, growth
exponent <E>` (at the largest size; E is the largest exponent among the costs).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import json
import math
import multiprocessing
import os
import random
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis
from _common import REPO  # noqa: F401  (puts the repository on sys.path)

from pyctl.dev.control_plane import (
    CONTROLLER_MANAGER,
    KWOK,
    ControlPlane,
    ExtraScheduler,
    ensure_binaries,
    free_port,
)
from pyctl.dev.extender import extender_config
from pyctl.dev.gpu_nodes import (
    GPU,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    mig_resource,
    node_manifest,
    nrt_crd_manifest,
    nrt_manifest,
)
from tests.redis_servers import RedisServer, find_binaries

NS = "bench"
SYSTEM_NS = "bench-system"
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
#: MIG layouts of the MIG nodes' first 4 GPUs (mig-parted's all-* configs of the A100-80GB)
MIG_LAYOUTS = (
    ("all-1g.10gb", "1g.10gb", 7),
    ("all-2g.20gb", "2g.20gb", 3),
    ("all-3g.40gb", "3g.40gb", 2),
)
DAEMONSETS = ("node-exporter", "dcgm-exporter", "nvidia-device-plugin")
PROBES = 4
PROBE_QUERY_GPUS = 4
#: n log n against n between 1,000 and 5,000 nodes, as an exponent
NLOGN = 1 + math.log(math.log(5000) / math.log(1000)) / math.log(5)


# --------------------------------------------------------------------------------------------------
# The cluster's plan: nodes and the pods bound to them


@dataclass
class PodPlan:
    name: str
    node: str
    app: str
    owner: str  # ReplicaSet or DaemonSet
    zone: int = 0
    gpus: int = 0
    mig: str = ""
    cpu_milli: int = 500
    mem_gib: int = 2
    namespace: str = NS


@dataclass
class NodePlan:
    spec: GpuNodeSpec
    pods: list[PodPlan] = field(default_factory=list)
    #: free whole GPUs per zone after the pods (the churn takes from these)
    free: list[int] = field(default_factory=lambda: [4, 4])
    probe: bool = False

    def used(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {0: {}, 1: {}}
        cpu = {0: 0, 1: 0}
        for p in self.pods:
            z = out[p.zone]
            cpu[p.zone] += p.cpu_milli
            z["memory"] = z.get("memory", 0) + p.mem_gib
            if p.gpus:
                z[GPU] = z.get(GPU, 0) + p.gpus
            if p.mig:
                z[mig_resource(p.mig)] = z.get(mig_resource(p.mig), 0) + 1
        for zone, milli in cpu.items():
            out[zone]["cpu"] = -(-milli // 1000)
        return out


def _gpu_pods(node: str, zone: int, room: int, rng: random.Random, fill: float) -> list[PodPlan]:
    out: list[PodPlan] = []
    want = round(room * fill)
    used = 0
    while used < want:
        size = rng.choices((1, 2, 4), (0.65, 0.25, 0.10))[0]
        if used + size > want:
            size = 1 if used + 1 <= want else 0
        if not size:
            break
        app = f"llm-{size}g-{rng.randrange(40)}"
        out.append(
            PodPlan(
                f"{node}-g{len(out)}{zone}", node, app, f"ReplicaSet/{app}-5d8f", zone, gpus=size,
                cpu_milli=4000 * size, mem_gib=32 * size,
            )
        )  # fmt: skip
        used += size
    return out


def plan_node(i: int, rng: random.Random, mig_share: float) -> NodePlan:
    name = f"gpu-{i:05d}"
    if i < PROBES:
        spec = GpuNodeSpec(name, product=H100, gpu_memory_mib=81559,
                           labels={"nvidia.com/mig.capable": "false"})  # fmt: skip
        plan = NodePlan(spec, probe=True)
        # NUMA zone 1 full (one 4-GPU replica), zone 0 empty: a 4-GPU pod fits exactly in zone 0
        plan.pods.append(
            PodPlan(f"{name}-g0", name, "llm-4g-probe", "ReplicaSet/llm-4g-probe-5d8f", 1, gpus=4,
                    cpu_milli=16000, mem_gib=128)
        )  # fmt: skip
        plan.free = [4, 0]
    elif rng.random() < mig_share:
        config, profile, per_gpu = MIG_LAYOUTS[i % len(MIG_LAYOUTS)]
        spec = GpuNodeSpec(
            name,
            product=A100,
            gpu_memory_mib=81920,
            mig={g: {profile: per_gpu} for g in range(4)},
            mig_config=config,
            # GFD's gpu.count: every physical GPU (the MIG ones too)
            labels={"nvidia.com/gpu.count": "8"},
        )
        plan = NodePlan(spec)
        instances = 4 * per_gpu
        taken = round(instances * rng.uniform(0.2, 0.6))
        for k in range(taken):
            app = f"mig-{profile.split('.')[0]}-{rng.randrange(20)}"
            plan.pods.append(
                PodPlan(f"{name}-m{k}", name, app, f"ReplicaSet/{app}-7c4b", 0, mig=profile,
                        cpu_milli=2000, mem_gib=8)
            )  # fmt: skip
        whole = _gpu_pods(name, 1, 4, rng, rng.uniform(0.25, 1.0))
        plan.pods += whole
        plan.free = [0, 4 - sum(p.gpus for p in whole)]
    else:
        spec = GpuNodeSpec(name, product=H100, gpu_memory_mib=81559,
                           labels={"nvidia.com/mig.capable": "false"})  # fmt: skip
        plan = NodePlan(spec)
        fill = rng.uniform(0.5, 1.0)
        for zone in (0, 1):
            pods = _gpu_pods(name, zone, 4, rng, fill)
            plan.pods += pods
            plan.free[zone] = 4 - sum(p.gpus for p in pods)
    for ds in DAEMONSETS:
        plan.pods.append(
            PodPlan(f"{name}-{ds}", name, ds, f"DaemonSet/{ds}", 0, cpu_milli=100, mem_gib=1,
                    namespace=SYSTEM_NS)
        )  # fmt: skip
    # CPU-only replicas (routers, tokenizers) up to about 10 pods on the node
    for k in range(max(0, rng.randint(8, 12) - len(plan.pods))):
        app = f"router-{rng.randrange(30)}"
        zone = k % 2
        plan.pods.append(
            PodPlan(f"{name}-c{k}", name, app, f"ReplicaSet/{app}-6b9c", zone, cpu_milli=1000,
                    mem_gib=4)
        )  # fmt: skip
    return plan


def _cordoned(node: dict[str, Any]) -> dict[str, Any]:
    node["spec"] = {**node.get("spec", {}), "unschedulable": True}
    return node


def _owner(owner: str) -> dict[str, Any]:
    kind, name = owner.split("/")
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, owner)),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod_manifest(
    name: str,
    *,
    node: str = "",
    gpus: int = 0,
    mig: str = "",
    cpu_milli: int = 500,
    mem_gib: int = 2,
    app: str = "",
    owner: str = "",
    namespace: str = NS,
    labels: dict[str, str] | None = None,
    scheduler: str = "",
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": f"{cpu_milli}m", "memory": f"{mem_gib}Gi"}
    limits: dict[str, str] = {}
    if gpus:
        requests[GPU] = limits[GPU] = str(gpus)
    if mig:
        requests[mig_resource(mig)] = limits[mig_resource(mig)] = "1"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": app or name, **(labels or {})},
    }
    if owner:
        meta["ownerReferences"] = [_owner(owner)]
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": "registry.example/serve:1",
                "resources": {"requests": requests, "limits": limits},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def planned_pod(p: PodPlan) -> dict[str, Any]:
    return pod_manifest(
        p.name, node=p.node, gpus=p.gpus, mig=p.mig, cpu_milli=p.cpu_milli, mem_gib=p.mem_gib,
        app=p.app, owner=p.owner, namespace=p.namespace,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# A lean API client (aiohttp, the admin certificate), for creating tens of thousands of objects


class ApiError(RuntimeError):
    pass


class Api:
    def __init__(self, server: str, ctx: ssl.SSLContext, limit: int = 64) -> None:
        self.server = server
        self.ctx = ctx
        self.limit = limit
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ctx, limit=self.limit),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        ok: Sequence[int] = (200, 201, 202),
        content_type: str = "application/json",
    ) -> Any:
        assert self.session is not None
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        for attempt in range(6):
            async with self.session.request(
                method, self.server + path, data=data, params=params, headers=headers
            ) as resp:
                raw = await resp.read()
                if resp.status in ok:
                    return json.loads(raw) if raw else {}
                if resp.status in (429, 500, 503, 504) and attempt < 5:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise ApiError(f"{method} {path}: {resp.status} {raw[:300]!r}")
        raise AssertionError("unreachable")

    async def many(
        self, method: str, jobs: Iterable[tuple[str, Any]], concurrency: int = 48,
        ok: Sequence[int] = (200, 201, 202), content_type: str = "application/json",
    ) -> int:  # fmt: skip
        """Run the requests with bounded concurrency; returns how many there were."""
        sem = asyncio.Semaphore(concurrency)
        count = 0

        async def one(path: str, body: Any) -> None:
            async with sem:
                await self.call(method, path, body, ok=ok, content_type=content_type)

        tasks = []
        for path, body in jobs:
            count += 1
            tasks.append(asyncio.create_task(one(path, body)))
            if len(tasks) >= 4 * concurrency:
                await asyncio.gather(*tasks)
                tasks = []
        await asyncio.gather(*tasks)
        return count

    async def items(self, path: str, **params: str) -> AsyncIterator[dict[str, Any]]:
        """Every item of the list at `path` (with `params`: selectors), 500 to a page."""
        query = {"limit": "500", **{k: v for k, v in params.items() if v}}
        while True:
            got = await self.call("GET", path, params=query)
            for item in got.get("items", []):
                yield item
            cont = got.get("metadata", {}).get("continue")
            if not cont:
                return
            query["continue"] = cont

    async def count_pods(self, field_selector: str = "", label_selector: str = "") -> int:
        selectors = {"fieldSelector": field_selector, "labelSelector": label_selector}
        return sum([1 async for _ in self.items("/api/v1/pods", **selectors)])

    async def not_ready(self, names: set[str]) -> int:
        """How many of the nodes `names` kwok does not report Ready yet."""
        ready = [
            n
            async for n in self.items("/api/v1/nodes")
            if n["metadata"]["name"] in names
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(names) - len(ready)


# --------------------------------------------------------------------------------------------------
# pyctl, as deployed


def proc_cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` (/proc; OSError when it is gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid`, bytes (/proc; OSError when it is gone)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def machine_busy() -> float:
    """CPU seconds the machine's cores were busy since boot (/proc/stat: all but idle and
    iowait)."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """If this process is killed, take pyctl down too (Linux; as the harness does)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Pyctl:
    """`pyctl run --kubeconfig ... --redis ...` in a subprocess: its log lines timestamped as they
    arrive, its RSS and CPU from /proc (its process and the extender's own, a child of it)."""

    def __init__(
        self, kubeconfig: Path, redis_url: str, log: Path, workflow_interval: float | None = None
    ) -> None:
        self.port = free_port()
        self.extender_port = free_port()
        self.log_path = log
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
        env.update(
            PYCTL_CLUSTER="bench",
            PYCTL_LEASE_NAMESPACE="pyctl-system",
            PYCTL_LOG_FORMAT="json",
            PYCTL_LOG_LEVEL="info",
            PYCTL_EXTENDER_PORT=str(self.extender_port),
        )
        if workflow_interval is not None:
            env["PYCTL_WORKFLOW_INTERVAL"] = str(workflow_interval)
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        self.argv = [
            sys.executable, "-m", "pyctl.cli.main", "run", "--kubeconfig", str(kubeconfig),
            "--redis", redis_url, "--metrics-port", str(self.port), "--no-live",
        ]  # fmt: skip
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.lines: list[tuple[float, dict[str, Any]]] = []
        self.rss: list[tuple[float, int]] = []
        #: (time, pyctl's CPU seconds, the machine's busy CPU seconds)
        self.cpu: list[tuple[float, float, float]] = []
        self._pids: list[int] = []
        self._stop = threading.Event()
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        with self.log_path.open("wb") as out:
            for line in self.proc.stderr:
                now = time.monotonic()
                out.write(line)
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = {"msg": line.decode(errors="replace").rstrip()}
                self.lines.append((now, rec))

    def _sample(self) -> None:
        """RSS every 0.25 s; CPU (pyctl's, and the whole machine's busy time) every 0.05 s."""
        k = 0
        while not self._stop.is_set() and self.proc is not None and self.proc.poll() is None:
            if k % 5 == 0:
                got = self.status()
                if got:
                    self.rss.append((time.monotonic(), got["VmRSS"]))
            self.cpu.append((time.monotonic(), self.cpu_seconds(k % 20 == 0), machine_busy()))
            k += 1
            self._stop.wait(0.05)

    def cpu_at(self, t: float) -> tuple[float, float]:
        """pyctl's CPU seconds and the machine's busy CPU seconds at `t` (interpolated between
        the samples around it)."""
        samples = list(self.cpu)
        for (t0, a0, b0), (t1, a1, b1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return a0 + f * (a1 - a0), b0 + f * (b1 - b0)
        return float("nan"), float("nan")

    def pids(self) -> list[int]:
        """pyctl's process and its children (the extender's own process)."""
        assert self.proc is not None
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

    def status(self) -> dict[str, int]:
        """VmRSS and VmHWM (bytes), summed over pyctl's processes (the sum of their peaks: at
        least the peak of their sum)."""
        out: dict[str, int] = {}
        pids = self.pids()
        for pid in pids:
            try:
                for key, value in proc_memory(pid).items():
                    out[key] = out.get(key, 0) + value
            except OSError:
                if pid == pids[0]:
                    return {}  # pyctl exited
        return out

    def cpu_seconds(self, look: bool = True) -> float:
        """User and system CPU time of pyctl's processes (`look`: find its children again, else
        those found last)."""
        if look or not self._pids:
            self._pids = self.pids()
        total = 0.0
        for pid in self._pids:
            with contextlib.suppress(OSError):
                total += proc_cpu_seconds(pid)
        return total

    def first(self, pred: Any) -> float | None:
        for t, rec in list(self.lines):
            if pred(rec):
                return t
        return None

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        try:
            with self._opener.open(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except OSError as e:
            return 0, str(e)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        status, text = self.get("/metrics", timeout=30)
        if status != 200:
            return None
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if labels and not all(f'{k}="{v}"' in head for k, v in labels.items()):
                continue
            return float(value)
        return None

    def buckets(self, name: str, labels: dict[str, str]) -> dict[float, float]:
        """A histogram's cumulative bucket counts (upper bound -> count), summed over the
        series that match `labels`; {} if not exported."""
        status, text = self.get("/metrics", timeout=30)
        out: dict[float, float] = {}
        if status != 200:
            return out
        for line in text.splitlines():
            if not line.startswith(name + "_bucket{"):
                continue
            head, _, value = line.rpartition(" ")
            if not all(f'{k}="{v}"' in head for k, v in labels.items()):
                continue
            le = head.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = out.get(float(le), 0.0) + float(value)
        return out

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        self._stop.set()
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------------
# A measuring proxy between the scheduler and pyctl's extender (HTTP/1.1 with Content-Length)


class Proxy:
    """Forwards the scheduler's extender calls to pyctl and times each one, from its request's
    headers to the last byte of pyctl's answer. In a process of its own (spawned), so that this
    process's threads (the bind watch decodes every event of the burst) do not delay its reads:
    its figures are pyctl's answers and the hop to them."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.port = free_port()
        self.calls: list[tuple[str, float]] = []
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_proxy_main, args=(upstream_port, self.port, child), daemon=True
        )

    def start(self) -> None:
        self._proc.start()
        if not self._conn.poll(60):
            raise RuntimeError("the measuring proxy did not start")
        self._conn.recv()

    def stop(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._conn.send("stop")
            if self._conn.poll(30):
                self.calls = self._conn.recv()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


def _proxy_main(upstream: int, port: int, conn: Any) -> None:
    """The proxy's process: serves until told to stop, then sends its timings back."""
    calls: list[tuple[str, float]] = []

    async def message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value.strip())
            if key.strip().lower() == b"transfer-encoding":
                raise ValueError("chunked messages are not handled by this proxy")
        return head, await reader.readexactly(length)

    async def forward(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        try:
            while True:
                try:
                    head, body = await message(cr)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                t0 = time.perf_counter()
                uw.write(head + body)
                rhead, rbody = await message(ur)
                calls.append((head.split(b" ", 2)[1].decode(), time.perf_counter() - t0))
                cw.write(rhead + rbody)
                await cw.drain()
        finally:
            uw.close()
            cw.close()

    async def serve() -> None:
        server = await asyncio.start_server(forward, "127.0.0.1", port)
        conn.send("ready")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # "stop"
        server.close()
        conn.send(calls)

    asyncio.run(serve())


# --------------------------------------------------------------------------------------------------
# Watching binds from a thread (the scheduler is started from the main thread, which blocks)


class BindWatch:
    """Records when each pod of a label selector is first seen bound (its own thread)."""

    def __init__(self, server: str, ctx: ssl.SSLContext, selector: str, rv: str) -> None:
        self.url = (
            f"{server}/api/v1/namespaces/{NS}/pods?watch=true&labelSelector={selector}"
            f"&resourceVersion={rv}&timeoutSeconds=900"
        )
        self.ctx = ctx
        self.bound: dict[str, float] = {}
        self._resp: Any = None
        self.error = ""

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.ctx)
        )
        try:
            with opener.open(self.url, timeout=900) as resp:
                self._resp = resp
                for line in resp:
                    now = time.monotonic()
                    ev = json.loads(line)
                    obj = ev.get("object", {})
                    name = obj.get("metadata", {}).get("name", "")
                    if obj.get("spec", {}).get("nodeName") and name not in self.bound:
                        self.bound[name] = now
        except Exception as e:  # closed by stop(), or the server ended it
            self.error = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        # shutting the socket down wakes the reading thread (closing it from here would wait for
        # that thread's read)
        with contextlib.suppress(Exception):
            if self._resp is not None:
                self._resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)


# --------------------------------------------------------------------------------------------------
# Measurements


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile (0..1) of the observations a histogram took between two reads of its
    cumulative buckets, interpolated within a bucket as Prometheus' histogram_quantile does."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return float("nan")
    rank = q * counts[-1]
    lo, below = 0.0, 0.0
    for b, c in zip(bounds, counts, strict=True):
        if c >= rank:
            if math.isinf(b):
                return lo
            return lo + (b - lo) * ((rank - below) / (c - below) if c > below else 1.0)
        lo, below = b, c
    return lo


def _rates(rates: Sequence[float]) -> str:
    return " and ".join(f"{r:.0f}" for r in rates)


def _interpolate(samples: Sequence[tuple[float, float]], t: float) -> float:
    """The value at `t` of a series sampled as (time, value), linear between the samples around
    it; NaN outside them."""
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
    return float("nan")


def _burst_cpu(bursts: Sequence[tuple[float, float, float]]) -> str:
    return " and ".join(f"{a:.1f} ms, {b:.1f} s, {100 * c:.0f}%" for a, b, c in bursts)


def _starts(starts: Sequence[tuple[float, float, float]]) -> str:
    return ", ".join(f"{a:.2f} s (CPU {c:.2f} s, rest {o:.2f} s)" for a, c, o in starts)


def pin(pids: Iterable[int], cpus: set[int]) -> None:
    """Every thread of each process onto `cpus` (the threads they start later inherit it); a
    process gone meanwhile is skipped."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cpus)


@contextlib.contextmanager
def split_cores(plane: ControlPlane, ours: Sequence[int], enabled: bool) -> Iterator[str]:
    """The machine split as a deployment splits it (`--split-cores`): `ours` (pyctl's processes
    and its Redis) on the last core, the control plane, the bench and what it starts meanwhile
    (the schedulers measured) on the others; every process back on every core after. Yields the
    split, in words."""
    cores = sorted(os.sched_getaffinity(0))
    if not enabled or len(cores) < 2:
        yield "not split"
        return
    mine, theirs = {cores[-1]}, set(cores[:-1])
    plane_pids = [c.process.pid for c in plane.started if c.process is not None]
    try:
        pin(ours, mine)
        pin([*plane_pids, os.getpid()], theirs)
        yield f"pyctl and its Redis on core {cores[-1]}, the rest on {len(theirs)}"
    finally:
        pin([*ours, *plane_pids, os.getpid()], set(cores))


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


@dataclass
class SizeResult:
    nodes: int
    pods: int
    pending: int
    mig_nodes: int
    first_score_s: float = float("nan")
    first_score_after_list_s: float = float("nan")
    #: pyctl's CPU time in that stretch (both processes), and the rest of the machine's
    first_score_after_list_cpu_s: float = float("nan")
    others_cpu_after_list_s: float = float("nan")
    list_s: float = float("nan")
    ready_s: float = float("nan")
    rss_peak_mib: float = float("nan")
    rss_steady_mib: float = float("nan")
    redis_mib: float = float("nan")
    churn_rate: float = float("nan")
    probes: int = 0
    probe_timeouts: int = 0
    probe_no_advice: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    cpu_pct: float = float("nan")
    sched_without: float = float("nan")
    sched_with: float = float("nan")
    sched_ratio: float = float("nan")
    sched_timed: float = float("nan")
    #: each burst's least bound (of two), and each burst's rate by mode
    bound_without: int = 0
    bound_with: int = 0
    rates: dict[str, list[float]] = field(default_factory=lambda: {"without": [], "with": []})
    bound: dict[str, list[int]] = field(default_factory=lambda: {"without": [], "with": []})
    #: how the machine's cores were split during the bursts (`split_cores`)
    burst_split: str = ""
    #: each burst's CPU accounting, from its first bind to its last, by mode: (the measured
    #: scheduler's CPU ms per bound pod, pyctl's CPU s, the machine's busy share of its 2 cores)
    burst_cpu: dict[str, list[tuple[float, float, float]]] = field(
        default_factory=lambda: {"without": [], "with": []}
    )
    ext_calls: int = 0
    ext_p50_ms: float = float("nan")
    ext_p99_ms: float = float("nan")
    #: the `with` burst's requests as pyctl measured them (`pyctl_extender_request_seconds`,
    #: first byte to answer; `pyctl_extender_work_seconds`, the advice on its worker), p50 and
    #: p99 from the histograms' buckets
    srv_p50_ms: float = float("nan")
    srv_p99_ms: float = float("nan")
    work_p50_ms: float = float("nan")
    work_p99_ms: float = float("nan")
    #: in the `with` bursts, node ranks computed while the scheduler waited and ahead of its
    #: calls (`pyctl_extender_ranks_total`)
    ranks_request: int = 0
    ranks_ahead: int = 0
    #: extender calls in the with-bursts, and those answered on the server's own thread
    calls_all: int = 0
    calls_on_server: int = 0
    #: compaction rounds after start-up: how many, their median and the longest
    compaction_rounds: int = 0
    compaction_s: float = float("nan")
    compaction_max_s: float = float("nan")
    #: the first round after start-up (it derives every node) and its CPU time
    compaction_first_s: float = float("nan")
    compaction_first_cpu_s: float = float("nan")
    #: the rounds' own work: the median of the round thread's CPU time
    compaction_cpu_s: float = float("nan")
    #: MIG rounds after start-up: their median, and the median of their CPU time
    mig_plan_s: float = float("nan")
    mig_plan_cpu_s: float = float("nan")
    #: Python's full cycle collections in pyctl over its life (`pyctl_gc_pause_seconds`,
    #: generation 2): how many, and the GIL time they took in all
    gc_full: int = 0
    gc_full_s: float = float("nan")
    #: every start-up measured at this size (`--starts`): (after the lists s, pyctl's CPU in
    #: it s, the rest of the machine's CPU s); the fields above hold the least of each
    starts: list[tuple[float, float, float]] = field(default_factory=list)
    #: the machine's speed at this size (`--reference`): `bench/startup.py`'s fixed cluster,
    #: its seconds to every node scored, run before each start and after the planning rounds;
    #: `reference_s` the least of them
    references: list[float] = field(default_factory=list)
    reference_s: float = float("nan")

    def line(self) -> str:
        return (
            f"size {self.nodes}: {self.nodes} nodes ({self.mig_nodes} MIG), {self.pods} pods "
            f"({self.pending} pending); first score {self.first_score_s:.1f} s from start, "
            f"{self.first_score_after_list_s:.2f} s after the lists ({self.list_s:.1f} s; "
            f"in it pyctl's CPU {self.first_score_after_list_cpu_s:.2f} s, the rest of the "
            f"machine's {self.others_cpu_after_list_s:.2f} s; the least of "
            f"{len(self.starts)} starts: {_starts(self.starts)}), "
            f"/readyz {self.ready_s:.1f} s; rss peak {self.rss_peak_mib:.0f} MiB, steady "
            f"{self.rss_steady_mib:.0f} MiB; redis {self.redis_mib:.1f} MiB "
            f"({self.redis_mib * 1024 / self.nodes:.1f} KiB/node); churn {self.churn_rate:.1f} "
            f"writes/s + probes: event-to-score p50 {self.p50_ms:.0f} ms, p99 {self.p99_ms:.0f} ms "
            f"({self.probes} probes, {self.probe_timeouts} timed out, {self.probe_no_advice} "
            f"answers without advice), controller CPU "
            f"{self.cpu_pct:.0f}%; scheduler (two bursts each, interleaved): without "
            f"{self.sched_without:.0f} pods/s ({_rates(self.rates['without'])}; "
            f"{self.bound_without} bound), with extender {self.sched_with:.0f} pods/s "
            f"({_rates(self.rates['with'])}; {self.bound_with} bound), {self.sched_ratio:.2f}x "
            f"(scheduler CPU per pod, pyctl's CPU, the machine busy: without "
            f"{_burst_cpu(self.burst_cpu['without'])}; with {_burst_cpu(self.burst_cpu['with'])}; "
            f"{self.burst_split}), "
            f"extender p50 "
            f"{self.ext_p50_ms:.1f} ms p99 {self.ext_p99_ms:.1f} ms ({self.ext_calls} calls, "
            f"{self.sched_timed:.0f} pods/s through the proxy; in pyctl p50 "
            f"{self.srv_p50_ms:.1f} ms p99 {self.srv_p99_ms:.1f} ms, of which the advice p50 "
            f"{self.work_p50_ms:.1f} ms p99 {self.work_p99_ms:.1f} ms; node ranks computed "
            f"{self.ranks_request} on requests, {self.ranks_ahead} ahead; "
            f"{self.calls_on_server} of {self.calls_all} calls answered on the server's "
            f"thread); "
            f"plan: compaction {self.compaction_s:.2f} s (median of {self.compaction_rounds} "
            f"rounds, longest {self.compaction_max_s:.2f} s, the first "
            f"{self.compaction_first_s:.2f} s with CPU time {self.compaction_first_cpu_s:.2f} s; "
            f"CPU time median {self.compaction_cpu_s:.2f} s), MIG {self.mig_plan_s:.2f} s (CPU "
            f"time median {self.mig_plan_cpu_s:.3f} s); "
            f"gc: {self.gc_full} full collections, {self.gc_full_s:.2f} s in all; "
            f"reference {self.reference_s:.3f} s (the least of "
            f"{', '.join(f'{r:.3f}' for r in self.references)})"
        )


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.rng = random.Random(args.seed)
        self.plans: list[NodePlan] = []
        self.plane: ControlPlane | None = None
        self.redis_bins = find_binaries()
        self.pending = 0
        self.churn_seq = 0
        #: extender answers "no advice" to the probes (per size)
        self.no_advice = 0

    # -- the control plane -------------------------------------------------------------------------

    def start_plane(self) -> ControlPlane:
        binaries = ensure_binaries(self.work / "control-plane-build.log")
        plane = ControlPlane(
            binaries,
            self.work / "plane",
            timeout=120.0,
            nice=self.args.others_nice,
            extra_args={
                KWOK: ["--node-lease-duration-seconds=0"],
                CONTROLLER_MANAGER: ["--controllers=disruption-controller,namespace-controller"],
            },
        )
        plane.start()
        self.plane = plane
        return plane

    async def setup(self, api: Api) -> None:
        for ns in (NS, SYSTEM_NS, "pyctl-system"):
            await api.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}}, ok=(201, 409))
        crd: Any = nrt_crd_manifest()
        await api.call(
            "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, ok=(201, 409)
        )
        name = crd["metadata"]["name"]
        for _ in range(300):
            got = await api.call(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conds = got.get("status", {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return
            await asyncio.sleep(0.1)
        raise ApiError("the NodeResourceTopology CRD is not Established")

    async def grow(self, api: Api, n: int) -> None:
        """Add nodes up to `n`, their NodeResourceTopology and pods, and the pending pods."""
        t0 = time.monotonic()
        start = len(self.plans)
        new = [plan_node(i, self.rng, self.args.mig_share) for i in range(start, n)]
        self.plans += new
        # cordoned until their pods are there: the pending pods must not land on empty nodes
        await api.many("POST", (("/api/v1/nodes", _cordoned(node_manifest(p.spec))) for p in new))
        nrt_path = f"/apis/{NRT_GROUP}/{NRT_VERSION}/{NRT_PLURAL}"
        await api.many("POST", ((nrt_path, nrt_manifest(p.spec, p.used())) for p in new))
        # kwok skips a pod bound to a node it has not taken on yet, and never looks at it again:
        # the pods come once it reports every new node Ready
        names = {p.spec.name for p in new}
        deadline = time.monotonic() + 900
        while left := await api.not_ready(names):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{left} nodes not Ready after 900 s")
            await asyncio.sleep(1)
        pods = [pp for p in new for pp in p.pods]
        await api.many(
            "POST",
            ((f"/api/v1/namespaces/{pp.namespace}/pods", planned_pod(pp)) for pp in pods),
        )
        await api.many(
            "PATCH",
            ((f"/api/v1/nodes/{p.spec.name}", {"spec": {"unschedulable": None}}) for p in new),
            content_type="application/merge-patch+json",
        )
        # a few pending pods: 8-GPU replicas no node can hold, MIG pods asking for 7g.80gb; as
        # many at every size (`--pending`), so that each cost's growth is the cluster's, not the
        # demand's (a MIG round's work per node grows with the pods it plans for: mig_plan.py)
        want = self.args.pending
        jobs = []
        while self.pending < want:
            k = self.pending
            if k % 2 == 0:
                m = pod_manifest(f"pending-llm-8g-{k}", gpus=8, cpu_milli=32000, mem_gib=256,
                                 app="llm-8g", owner="ReplicaSet/llm-8g-5d8f")  # fmt: skip
            else:
                m = pod_manifest(f"pending-mig-7g-{k}", mig="7g.80gb", cpu_milli=8000, mem_gib=64,
                                 app="mig-7g", owner="ReplicaSet/mig-7g-7c4b")  # fmt: skip
            jobs.append((f"/api/v1/namespaces/{NS}/pods", m))
            self.pending += 1
        await api.many("POST", jobs)
        created = time.monotonic() - t0
        # kwok plays the kubelets: every bound pod Running; the scheduler marks the rest
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            left = await api.count_pods("spec.nodeName!=,status.phase!=Running")
            unsched = await self._unschedulable(api)
            if left == 0 and unsched == self.pending:
                break
            await asyncio.sleep(2)
        else:
            raise RuntimeError(f"pods not Running after 900 s ({left} left)")
        print(
            f"[scale] {n} nodes: +{len(new)} nodes and {len(pods)} pods created in {created:.0f} s,"
            f" all Running after {time.monotonic() - t0:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    async def _unschedulable(self, api: Api) -> int:
        got = await api.call(
            "GET", f"/api/v1/namespaces/{NS}/pods", params={"fieldSelector": "spec.nodeName="}
        )
        return sum(
            1
            for p in got.get("items", [])
            if any(
                c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
                for c in p.get("status", {}).get("conditions", [])
            )
        )

    # -- one size ----------------------------------------------------------------------------------

    async def measure(self, api: Api, n: int) -> SizeResult:
        pods = sum(len(p.pods) for p in self.plans) + self.pending
        res = SizeResult(n, pods, self.pending, sum(1 for p in self.plans if p.spec.mig))
        for k in range(1, self.args.starts):
            await self._reference(res)
            await self._start_only(f"{n}-{k}", res)
        await self._reference(res)
        rs, ctl = self._launch(f"{n}")
        r = redis.Redis(host="127.0.0.1", port=rs.port)
        base_mem = int(r.info("memory")["used_memory"])
        spy = None
        try:
            ctl.start()
            if self.args.profile:
                spy = self._profile(ctl, n)
            scored = await self._startup(ctl, res)
            await asyncio.sleep(self.args.settle)
            res.rss_steady_mib = ctl.status().get("VmRSS", 0) / 2**20
            res.redis_mib = (int(r.info("memory")["used_memory"]) - base_mem) / 2**20
            await self._churn(api, ctl, res)
            ours = [*ctl.pids(), *([rs.process.pid] if rs.process else [])]
            assert self.plane is not None
            with split_cores(self.plane, ours, self.args.split_cores) as how:
                res.burst_split = how
                await self._bursts(api, ctl, res)
            # planning: every round of each loop since every node was scored (the loops start
            # then; they run every 30 s), from
            # pyctl's log line per round (the rounds shared the process with the churn and the
            # bursts above: their median and their longest)
            deadline = time.monotonic() + 90
            while True:
                rounds = self._rounds(ctl, scored)
                if all(rounds.values()) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1)
            comp, migp = rounds["compaction"], rounds["mig"]
            res.compaction_rounds = len(comp)
            res.compaction_s = statistics.median(comp) if comp else float("nan")
            res.compaction_max_s = max(comp, default=float("nan"))
            cpus = self._rounds(ctl, scored, "cpu_seconds")
            cpu, mig_cpu = cpus["compaction"], cpus["mig"]
            if comp:
                res.compaction_first_s, res.compaction_first_cpu_s = comp[0], cpu[0]
            res.compaction_cpu_s = statistics.median(cpu) if cpu else float("nan")
            res.mig_plan_s = statistics.median(migp) if migp else float("nan")
            res.mig_plan_cpu_s = statistics.median(mig_cpu) if mig_cpu else float("nan")
            res.rss_peak_mib = ctl.status().get("VmHWM", 0) / 2**20
            full = {"generation": "2"}
            n_full = ctl.metric("pyctl_gc_pause_seconds_count", full)
            s_full = ctl.metric("pyctl_gc_pause_seconds_sum", full)
            res.gc_full = -1 if n_full is None else int(n_full)
            res.gc_full_s = float("nan") if s_full is None else s_full
            if ctl.exited() is not None:
                raise RuntimeError(f"pyctl exited with {ctl.exited()}; log {ctl.log_path}")
        finally:
            ctl.stop()
            if spy is not None:
                spy.wait(timeout=60)
            r.close()
            rs.stop()
        await self._reference(res)
        return res

    async def _reference(self, res: SizeResult) -> None:
        """The machine's speed now (`--reference R`): `bench/startup.py`'s controller start-up on
        its fixed cluster of R nodes, in a process of its own, its seconds from the Pod list to
        every node scored (the same work as the start-up measured here, on the same input each
        time: what moves it is the machine)."""
        if not self.args.reference:
            return
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("startup.py")),
            "--one", str(self.args.reference), "--seed", str(self.args.seed),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"the reference run failed ({proc.returncode}): {err[-2000:]!r}")
        got = json.loads(out.decode().strip().splitlines()[-1])
        res.references.append(float(got["scored_s"]))
        res.reference_s = min(res.references)

    def _launch(self, tag: str) -> tuple[RedisServer, Pyctl]:
        """A redis-server of its own, started, and pyctl for it (not started yet); their files
        named by `tag`."""
        plane = self.plane
        assert plane is not None
        rs = RedisServer(self.redis_bins, self.work, name=f"redis-{tag}")
        rs.start()
        ctl = Pyctl(
            plane.kubeconfig, rs.url, self.work / f"pyctl-{tag}.log", self.args.workflow_interval
        )
        return rs, ctl

    async def _start_only(self, tag: str, res: SizeResult) -> None:
        """A start-up measured alone (`--starts`): pyctl with a Redis of its own until every
        node is scored, then stopped."""
        rs, ctl = self._launch(tag)
        try:
            ctl.start()
            await self._startup(ctl, res)
        finally:
            ctl.stop()
            rs.stop()

    @staticmethod
    def _rounds(ctl: Pyctl, since: float, key: str = "seconds") -> dict[str, list[float]]:
        """The planning rounds' durations (s) per loop, from pyctl's log, since `since`:
        `seconds` (wall) or `cpu_seconds` (the round thread's CPU time)."""
        out: dict[str, list[float]] = {"compaction": [], "mig": []}
        for t, rec in list(ctl.lines):
            if t >= since and rec.get("msg") == "planning round" and rec.get("loop") in out:
                out[rec["loop"]].append(float(rec.get(key, "nan")))
        return out

    def _profile(self, ctl: Pyctl, n: int) -> subprocess.Popen[bytes]:
        """py-spy sampling pyctl for its whole life (raw collapsed stacks, `--profile DIR`)."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out = self.args.profile / f"pyctl-{n}.txt"
        self.args.profile.mkdir(parents=True, exist_ok=True)
        assert ctl.proc is not None
        return subprocess.Popen(
            [spy, "record", "--pid", str(ctl.proc.pid), "--format", "raw", "--rate", "50",
             "--nonblocking", "-o", str(out)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=(self.work / f"py-spy-{n}.log").open("wb"),
        )  # fmt: skip

    async def _startup(self, ctl: Pyctl, res: SizeResult) -> float:
        """Waits for every node scored and /readyz; returns when the bench read the log line
        `every node scored` (monotonic)."""
        deadline = time.monotonic() + 600
        ready = None
        while time.monotonic() < deadline:
            if ctl.exited() is not None:
                raise RuntimeError(f"pyctl exited with {ctl.exited()}; log {ctl.log_path}")
            if ready is None:
                status, _ = await asyncio.to_thread(ctl.get, "/readyz", 1.0)
                if status == 200:
                    ready = time.monotonic()
            scored = ctl.first(lambda rec: rec.get("msg") == "every node scored")
            if scored is not None and ready is not None:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"pyctl did not score every node within 600 s; log {ctl.log_path}")
        listed = [
            t for t, rec in ctl.lines if rec.get("msg", "").split(": ", 1)[-1].startswith("listed ")
        ]
        res.first_score_s = scored - ctl.started
        res.ready_s = ready - ctl.started
        res.list_s = max(listed) - ctl.started if listed else float("nan")
        if listed:
            await asyncio.sleep(0.2)  # a CPU sample after `scored`
            (c0, b0), (c1, b1) = ctl.cpu_at(max(listed)), ctl.cpu_at(scored)
            res.starts.append((scored - max(listed), c1 - c0, (b1 - b0) - (c1 - c0)))
            # the least of each over the starts so far: the machine's noise only adds to a cost
            res.first_score_after_list_s = min(a for a, _, _ in res.starts)
            res.first_score_after_list_cpu_s = min(c for _, c, _ in res.starts)
            res.others_cpu_after_list_s = min(o for _, _, o in res.starts)
        return scored

    # -- freshness under churn ---------------------------------------------------------------------

    async def _filter_fits(
        self, session: aiohttp.ClientSession, ctl: Pyctl, node: str
    ) -> bool | None:
        """Whether pyctl's filter keeps `node` for a 4-GPU pod; None: it gave no advice (its
        deadline passed: counted, and asked again)."""
        query = pod_manifest("probe-query", gpus=PROBE_QUERY_GPUS, cpu_milli=1000, mem_gib=4,
                             app="probe-query")  # fmt: skip
        body = {"Pod": query, "Nodes": None, "NodeNames": [node]}
        async with session.post(
            f"http://127.0.0.1:{ctl.extender_port}/scheduler/filter", json=body
        ) as resp:
            got = await resp.json(content_type=None)
        error = got.get("Error")
        if error and "no advice" in error:
            self.no_advice += 1
            return None
        if error:
            raise RuntimeError(f"extender filter: {error}")
        return node in (got.get("NodeNames") or [])

    async def _probe_chain(
        self, api: Api, ctl: Pyctl, nodes: list[str], until: float, out: list[float],
        timeouts: list[int],
    ) -> None:  # fmt: skip
        async with aiohttp.ClientSession() as session:
            for node in nodes:  # each probe node starts with zone 0 empty
                t_end = time.monotonic() + 60
                while await self._filter_fits(session, ctl, node) is not True:
                    if time.monotonic() > t_end:
                        raise RuntimeError(f"probe node {node}: pyctl never says a 4-GPU pod fits")
                    await asyncio.sleep(0.1)
            k = 0
            while time.monotonic() < until:
                node = nodes[k % len(nodes)]
                # a fresh name each time: kwok may still be finishing the last one of a name
                self.churn_seq += 1
                name = f"probe-{node}-{self.churn_seq}"
                for create in (True, False):
                    t0 = time.monotonic()
                    if create:
                        m = pod_manifest(name, node=node, gpus=1, cpu_milli=1000, mem_gib=4,
                                         app="probe", owner="ReplicaSet/probe-5d8f")  # fmt: skip
                        await api.call("POST", f"/api/v1/namespaces/{NS}/pods", m)
                    else:
                        await api.call(
                            "DELETE", f"/api/v1/namespaces/{NS}/pods/{name}",
                            {"gracePeriodSeconds": 0},
                        )  # fmt: skip
                    want = not create  # the 4-GPU pod fits again once the probe pod is gone
                    while True:
                        if await self._filter_fits(session, ctl, node) == want:
                            out.append(time.monotonic() - t0)
                            break
                        if time.monotonic() - t0 > 30:
                            timeouts[0] += 1
                            break
                        await asyncio.sleep(0.005)
                    await asyncio.sleep(0.1)
                k += 1

    async def _churn(self, api: Api, ctl: Pyctl, res: SizeResult) -> None:
        rate = self.args.churn_rate
        seconds = self.args.churn_seconds
        pool_size = max(10, int(rate * 5))
        candidates = [p for p in self.plans if not p.probe and p.free[0] + p.free[1] > 0]
        live: list[tuple[str, NodePlan, int]] = []
        latencies: list[float] = []
        timeouts = [0]
        self.no_advice = 0
        writes = 0
        errors = 0
        sem = asyncio.Semaphore(64)

        async def op(method: str, path: str, body: Any) -> None:
            nonlocal errors
            async with sem:
                try:
                    await api.call(method, path, body)
                except (ApiError, aiohttp.ClientError, TimeoutError):
                    errors += 1

        t_start = time.monotonic()
        until = t_start + seconds
        cpu0, w0 = ctl.cpu_seconds(), time.monotonic()
        probe_nodes = [p.spec.name for p in self.plans if p.probe]
        chains = [
            asyncio.create_task(
                self._probe_chain(api, ctl, probe_nodes[i::2], until, latencies, timeouts)
            )
            for i in range(2)
        ]
        tasks: list[asyncio.Task[None]] = []
        i = 0
        while True:
            at = t_start + i / rate
            if at >= until:
                break
            delay = at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            i += 1
            plan = self.rng.choice(candidates)
            zones = [z for z in (0, 1) if plan.free[z] > 0]
            if live and (len(live) >= pool_size or not zones):
                name, plan, zone = live.pop(0)
                plan.free[zone] += 1
                path = f"/api/v1/namespaces/{NS}/pods/{name}"
                tasks.append(asyncio.create_task(op("DELETE", path, {"gracePeriodSeconds": 0})))
            elif zones:
                zone = zones[0]
                plan.free[zone] -= 1
                self.churn_seq += 1
                name = f"churn-{self.churn_seq}"
                m = pod_manifest(name, node=plan.spec.name, gpus=1, cpu_milli=4000, mem_gib=32,
                                 app="churn", owner="ReplicaSet/churn-5d8f")  # fmt: skip
                live.append((name, plan, zone))
                tasks.append(asyncio.create_task(op("POST", f"/api/v1/namespaces/{NS}/pods", m)))
            else:
                continue
            writes += 1
        await asyncio.gather(*chains)
        cpu1, w1 = ctl.cpu_seconds(), time.monotonic()
        await asyncio.gather(*tasks)
        res.churn_rate = writes / seconds
        res.cpu_pct = 100 * (cpu1 - cpu0) / (w1 - w0)
        res.probes = len(latencies)
        res.probe_timeouts = timeouts[0]
        res.probe_no_advice = self.no_advice
        res.p50_ms = 1000 * pct(latencies, 50)
        res.p99_ms = 1000 * pct(latencies, 99)
        # the churn pods go; the probe nodes are back as they were
        await api.many(
            "DELETE",
            ((f"/api/v1/namespaces/{NS}/pods/{name}", {"gracePeriodSeconds": 0})
             for name, _, _ in live),
            ok=(200, 202, 404),
        )  # fmt: skip
        for _, plan, zone in live:
            plan.free[zone] += 1
        if errors:
            print(f"[scale] churn: {errors} writes failed", file=sys.stderr, flush=True)

    # -- the extender in the scheduler's path ------------------------------------------------------

    async def _burst(
        self, api: Api, ctl: Pyctl, mode: str, label: str
    ) -> tuple[float, int, Proxy | None, tuple[float, float, float]]:
        """One burst for a scheduler of its own (named after `label`): `without` an extender,
        `with` pyctl's extender as deployed, or `timed`: with it, each call through the
        measuring proxy. It starts once pyctl has reconciled what came before (its work queue
        empty, for up to a minute), so that no burst pays for the one before."""
        plane = self.plane
        assert plane is not None
        deadline = time.monotonic() + 60
        while (ctl.metric("pyctl_workqueue_depth") or 0) > 0 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        scheduler = f"bench-{label}"
        n = self.args.burst
        rng = random.Random(self.args.seed + n)
        jobs = []
        for k in range(n):
            gpus = 1 if rng.random() < 0.75 else 2
            name = f"burst-{label}-{len(self.plans)}-{k}"
            m = pod_manifest(name, gpus=gpus, cpu_milli=4000 * gpus,
                             mem_gib=32 * gpus, app=f"burst-{gpus}g",
                             owner=f"ReplicaSet/burst-{gpus}g-5d8f", labels={"burst": label},
                             scheduler=scheduler)  # fmt: skip
            jobs.append((f"/api/v1/namespaces/{NS}/pods", m))
        await api.many("POST", jobs)
        listed = await api.call(
            "GET", f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": f"burst={label}",
                                                           "limit": "1"}
        )  # fmt: skip
        watch = BindWatch(plane.server, plane.ssl_context(), f"burst%3D{label}",
                          listed["metadata"]["resourceVersion"])  # fmt: skip
        watch.start()
        proxy = None
        if mode == "without":
            config: dict[str, Any] = {"profiles": [{"schedulerName": scheduler}]}
        else:
            port = ctl.extender_port
            if mode == "timed":
                proxy = Proxy(ctl.extender_port)
                proxy.start()
                port = proxy.port
            config = extender_config(f"http://127.0.0.1:{port}/scheduler")
            config["profiles"] = [{"schedulerName": scheduler}]
        sched = ExtraScheduler(plane, label, config, nice=self.args.scheduler_nice)
        sched.start()  # blocks until healthy (the watch and the proxy run in their threads)
        # the scheduler's CPU seconds, pyctl's and the machine's busy seconds, sampled together
        # in this loop from before the first bind to after the last (not from the background
        # sampler: a stretch it missed while the burst crowded its core left a burst unaccounted)
        sched_cpu: list[tuple[float, float]] = []
        ours_cpu: list[tuple[float, float]] = []
        busy_cpu: list[tuple[float, float]] = []

        def sample() -> None:
            pid = sched.pid
            if pid is not None:
                with contextlib.suppress(OSError):
                    s, now = proc_cpu_seconds(pid), time.monotonic()
                    sched_cpu.append((now, s))
                    ours_cpu.append((now, ctl.cpu_seconds(look=False)))
                    busy_cpu.append((now, machine_busy()))

        sample()
        try:
            deadline = time.monotonic() + 600
            last = (0, time.monotonic())
            while len(watch.bound) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                sample()
                if len(watch.bound) != last[0]:
                    last = (len(watch.bound), time.monotonic())
                elif watch.bound and time.monotonic() - last[1] > 20:
                    break  # nothing bound for 20 s: the rest do not fit
            sample()  # after the last bind the loop saw
        finally:
            sched.stop()
            watch.stop()
            if proxy is not None:
                proxy.stop()
        times = sorted(watch.bound.values())
        rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
        acct = (float("nan"),) * 3
        if len(times) > 1:
            s0, s1 = (_interpolate(sched_cpu, t) for t in (times[0], times[-1]))
            c0, c1 = (_interpolate(ours_cpu, t) for t in (times[0], times[-1]))
            b0, b1 = (_interpolate(busy_cpu, t) for t in (times[0], times[-1]))
            wall = times[-1] - times[0]
            cores = os.cpu_count() or 1
            acct = (1000 * (s1 - s0) / (len(times) - 1), c1 - c0, (b1 - b0) / (cores * wall))
        await api.call(
            "DELETE", f"/api/v1/namespaces/{NS}/pods",
            params={"labelSelector": f"burst={label}", "gracePeriodSeconds": "0"},
        )  # fmt: skip
        while await api.count_pods(label_selector=f"burst={label}"):  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        return rate, len(times), proxy, acct

    async def _bursts(self, api: Api, ctl: Pyctl, res: SizeResult) -> None:
        # without and with, twice, interleaved: a drift of the machine (the other processes on
        # its 2 cores) falls on both; each throughput is the mean of its two bursts
        labels = {"verb": "choose"}
        names = ("pyctl_extender_request_seconds", "pyctl_extender_work_seconds")
        before = [ctl.buckets(name, labels) for name in names]
        server_before = ctl.buckets(names[1], {**labels, "thread": "server"})

        def total(buckets: dict[float, float]) -> float:  # the +Inf bucket: every call
            return max(buckets.values(), default=0.0)

        ranks = {"request": 0.0, "ahead": 0.0}
        for i in (1, 2):
            for mode in ("without", "with"):
                if mode == "with":
                    at = {w: ctl.metric("pyctl_extender_ranks_total", {"when": w}) or 0.0
                          for w in ranks}  # fmt: skip
                rate, bound, _, acct = await self._burst(api, ctl, mode, f"{mode}-{i}")
                res.rates[mode].append(rate)
                res.burst_cpu[mode].append(acct)
                res.bound[mode].append(bound)
                if mode == "with":
                    for w in ranks:
                        now = ctl.metric("pyctl_extender_ranks_total", {"when": w}) or 0.0
                        ranks[w] += now - at[w]
        after = [ctl.buckets(name, labels) for name in names]
        res.ranks_request, res.ranks_ahead = int(ranks["request"]), int(ranks["ahead"])
        # the calls answered on the extender server's own thread (every rank kept), of all
        on_server = ctl.buckets(names[1], {**labels, "thread": "server"})
        res.calls_on_server = int(total(on_server) - total(server_before))
        res.calls_all = int(total(after[1]) - total(before[1]))
        res.srv_p50_ms, res.srv_p99_ms, res.work_p50_ms, res.work_p99_ms = (
            1000 * bucket_quantile(b, a, q) for b, a in zip(before, after, strict=True)
            for q in (0.5, 0.99)
        )  # fmt: skip
        res.sched_without = statistics.mean(res.rates["without"])
        res.sched_with = statistics.mean(res.rates["with"])
        res.bound_without, res.bound_with = min(res.bound["without"]), min(res.bound["with"])
        res.sched_ratio = res.sched_with / res.sched_without
        # the extender's latency per call, in a last burst (the proxy costs time of its own,
        # so the throughputs above are measured without it)
        res.sched_timed, _, proxy, _ = await self._burst(api, ctl, "timed", "timed")
        assert proxy is not None
        lat = [s for _, s in proxy.calls]
        res.ext_calls = len(lat)
        res.ext_p50_ms = 1000 * pct(lat, 50)
        res.ext_p99_ms = 1000 * pct(lat, 99)


# --------------------------------------------------------------------------------------------------
# Growth, plot, output

#: the costs fitted against size: (attribute, label, unit)
COSTS = (
    ("first_score_s", "first complete score", "s"),
    ("first_score_after_list_s", "first complete score after the lists", "s"),
    ("first_score_after_list_cpu_s", "pyctl's CPU in it", "s"),
    ("ready_s", "/readyz", "s"),
    ("rss_steady_mib", "controller RSS, steady", "MiB"),
    ("rss_peak_mib", "controller RSS, peak", "MiB"),
    ("redis_mib", "Redis used memory", "MiB"),
    ("p99_ms", "p99 event-to-score", "ms"),
    ("ext_p99_ms", "extender p99 per call", "ms"),
    ("compaction_s", "compaction planning round", "s"),
    ("compaction_cpu_s", "its CPU time", "s"),
    ("mig_plan_s", "MIG planning round", "s"),
    ("mig_plan_cpu_s", "its CPU time", "s"),
    ("cpu_pct", "controller CPU under churn", "%"),
)
#: costs reported but not judged for growth: the planning rounds' wall times, which (tens of ms
#: for a MIG round) are decided by what else holds the GIL or a core during the round (the churn,
#: the bursts); their CPU times, the rounds' own work, are judged instead
NOT_JUDGED = frozenset({"compaction_s", "mig_plan_s"})
#: costs that are pyctl's CPU work alone, judged in units of the machine's speed at their size
#: (`--reference`: each divided by that size's reference time): the same code's start-up moved
#: by a fifth between runs an hour apart, and the sizes of one run are measured minutes apart
PER_REFERENCE = (
    "first_score_after_list_s",
    "first_score_after_list_cpu_s",
    "compaction_cpu_s",
    "mig_plan_cpu_s",
)


def growth(results: Sequence[SizeResult]) -> tuple[dict[str, float], dict[str, float]]:
    """Each cost's exponent against size, and those of `PER_REFERENCE` in units of each size's
    reference time (empty without references at every size)."""
    xs = [r.nodes for r in results]
    raw = {attr: exponent(xs, [getattr(r, attr) for r in results]) for attr, _, _ in COSTS}
    if not all(r.reference_s > 0 for r in results):
        return raw, {}
    per_ref = {
        attr: exponent(xs, [getattr(r, attr) / r.reference_s for r in results])
        for attr in PER_REFERENCE
    }
    return raw, per_ref


def judged(raw: dict[str, float], per_ref: dict[str, float]) -> float:
    """The worst exponent judged: every cost but `NOT_JUDGED`, those of `PER_REFERENCE` in
    reference units when measured."""
    grow = [per_ref.get(attr, e) for attr, e in raw.items() if attr not in NOT_JUDGED]
    grow = [e for e in grow if e == e]
    return max(grow) if grow else float("nan")


def exponent(xs: Sequence[float], ys: Sequence[float]) -> float:
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if y > 0 and y == y]
    if len(pts) < 2:
        return float("nan")
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else float("nan")


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of y against x (a marginal cost)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def plot(results: list[SizeResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r.nodes for r in results]
    rows = math.ceil(len(COSTS) / 4)
    fig, axes = plt.subplots(rows, 4, figsize=(16, 3.5 * rows))
    for ax in list(axes.flat)[len(COSTS) :]:
        ax.set_visible(False)
    for ax, (attr, label, unit) in zip(axes.flat, COSTS, strict=False):
        ys = [getattr(r, attr) for r in results]
        ax.plot(xs, ys, "o-", label="measured")
        if ys and ys[0] == ys[0] and ys[0] > 0:
            ax.plot(xs, [ys[0] * x / xs[0] for x in xs], ":", color="grey", label="linear")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{label} (exp {exponent(xs, ys):.2f})", fontsize=9)
        ax.set_xlabel("nodes")
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    fig.suptitle("pyctl on the real control plane: cost against cluster size (bench/scale.py)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


async def run(args: argparse.Namespace, work: Path) -> list[SizeResult]:
    bench = Bench(args, work)
    plane = bench.start_plane()
    print(
        f"[scale] control plane up (niceness {plane.nice}; pyctl, its Redis and the bench 0): "
        f"{plane.describe()}",
        file=sys.stderr,
        flush=True,
    )
    results = []
    try:
        async with Api(plane.server, plane.ssl_context()) as api:
            await bench.setup(api)
            for n in args.sizes:
                await bench.grow(api, n)
                res = await bench.measure(api, n)
                results.append(res)
                print(res.line(), flush=True)
    finally:
        plane.stop()
    return results


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,5000", help="node counts, ascending")
    ap.add_argument("--mig-share", type=float, default=0.2, help="share of MIG nodes")
    ap.add_argument("--churn-rate", type=float, default=50.0, help="pod writes per second")
    ap.add_argument("--churn-seconds", type=float, default=60.0)
    ap.add_argument("--burst", type=int, default=1000, help="pods per scheduler burst")
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument(
        "--pending",
        type=int,
        help="pending pods at every size (default: one per 200 nodes of the largest size, "
        "at least 4)",
    )
    ap.add_argument(
        "--starts",
        type=int,
        default=3,
        help="start-ups measured per size (the first score after the lists: the least of them; "
        "the last start goes on to the other measurements)",
    )
    ap.add_argument(
        "--scheduler-nice",
        type=int,
        default=0,
        help="niceness of the scheduler the bursts measure (the default priority, as pyctl's: "
        "deployed, each has a CPU request of its own; with the others' niceness, pyctl's "
        "extender work takes the core it waits for)",
    )
    ap.add_argument(
        "--split-cores",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="during the scheduler bursts, pyctl's processes and its Redis on the last core and "
        "everything else on the others, as deployed (the chart allows pyctl a core; the "
        "scheduler runs on the control plane's nodes)",
    )
    ap.add_argument(
        "--reference",
        type=int,
        default=1000,
        help="nodes of the reference run (bench/startup.py's start-up, run before each start "
        "and at the end of each size: the machine's speed then); 0: none, every cost judged in "
        "seconds",
    )
    ap.add_argument(
        "--settle", type=float, default=5.0, help="seconds after start-up before measuring"
    )
    ap.add_argument(
        "--workflow-interval",
        type=float,
        help="pyctl's planning interval (default: pyctl's own, 30 s)",
    )
    ap.add_argument(
        "--others-nice",
        type=int,
        default=10,
        help="niceness of the control plane's processes (kube-apiserver, etcd, the schedulers, "
        "kube-controller-manager, kwok); pyctl, its Redis and the bench run at the default "
        "priority, as a controller with a CPU request of its own would (0: all share equally)",
    )
    ap.add_argument("--work-dir", type=Path, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--plot", type=Path, help="write the PNG of each cost against size here")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    ap.add_argument(
        "--profile", type=Path, help="sample pyctl with py-spy, a raw profile per size in DIR"
    )
    return ap


def main(argv: list[str]) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.sizes = sorted(int(s) for s in args.sizes.split(","))
    if args.sizes[0] < PROBES + 1:
        ap.error(f"the smallest size must be more than {PROBES} nodes")
    if args.starts < 1:
        ap.error("--starts must be at least 1")
    if args.pending is None:
        args.pending = max(4, args.sizes[-1] // 200)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="pyctl-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        results = asyncio.run(run(args, work))
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    xs = [r.nodes for r in results]
    exps, per_ref = growth(results)
    if len(results) > 1:
        rss = slope(xs, [r.rss_steady_mib for r in results])
        pods_per_node = slope(xs, [r.pods for r in results])
        rd = slope(xs, [r.redis_mib for r in results])
        print(
            "growth: "
            + ", ".join(f"{attr} {e:.2f}" for attr, e in exps.items())
            + f" (n log n = {NLOGN:.2f}; judged: all but {', '.join(sorted(NOT_JUDGED))}); "
            f"marginal: RSS {rss * 1024:.0f} KiB/node, {rss * 1024 / pods_per_node:.1f} KiB/pod; "
            f"Redis {rd * 1024:.1f} KiB/node",
            flush=True,
        )
        if per_ref:
            print(
                "growth in reference units (each size's cost / its reference "
                + ", ".join(f"{r.reference_s:.3f}" for r in results)
                + " s): "
                + ", ".join(f"{attr} {e:.2f}" for attr, e in per_ref.items())
                + " (judged in place of their exponents above)",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    if args.plot and len(results) > 1:
        plot(results, args.plot)
    last = results[-1]
    worst = judged(exps, per_ref)
    print(
        f"scale: {last.nodes} nodes, first score {last.first_score_s:.1f} s, rss "
        f"{last.rss_peak_mib:.0f} MiB, p99 event-to-score {last.p99_ms:.0f} ms, scheduler with "
        f"extender {last.sched_ratio:.2f}x of without, growth exponent {worst:.2f} "
        f"({(time.monotonic() - t0) / 60:.0f} min)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
