"""`pyctl dev up`: a local cluster to watch pyctl act on, in the foreground, until Ctrl-C.

What runs (all on 127.0.0.1, nothing outside the work directory):

- the real control plane (`control_plane.py`: etcd, kube-apiserver, kube-controller-manager,
  kube-scheduler, kwok playing the kubelets);
- kwok GPU nodes as the NVIDIA stack shows them (`gpu_nodes.py`): ``gpu-<i>``, 8 H100 GPUs in two
  NUMA zones under ``single-numa-node`` with their NodeResourceTopology, and ``mig-0``, an A100
  node with two GPUs in MIG mode (``all-1g.5gb``), the GPU Operator's namespace and its mig-parted
  ConfigMap;
- NFD's topology-updater and the GPU Operator's mig-manager, played by simulators (`topology.py`,
  `mig_manager.py`: there is no GPU here);
- pyctl as deployed: ``pyctl run --kubeconfig ... --mode enforce`` (a subprocess, its log in the
  work directory), and a second kube-scheduler (profile ``pyctl-gpu``) with pyctl's extender;
- a fragmenting workload (`Workload`): 1-GPU replicas of ``web-small`` (scheduled by
  ``pyctl-gpu``) that churn has left one per NUMA zone on every node, then a 4-GPU replica of
  ``llm-big`` that no zone can hold: pyctl compacts (evicts a small replica through the Eviction
  API; the second scheduler re-places it where pyctl advises) and the big one lands; then two
  pods ask for ``3g.20gb`` MIG instances that ``mig-0`` does not have: pyctl re-partitions it.
  Then the demand is withdrawn, the cluster fragmented again, and the cycle repeats (the MIG
  demand alternates between ``3g.20gb`` and ``1g.5gb``).

The live view shows the nodes' GPUs per NUMA zone, the pending GPU pods, pyctl's metrics and its
Events. The kubeconfig is printed first: ``kubectl --kubeconfig PATH get nodes,pods -A`` from
another shell shows the same cluster. Ctrl-C (or SIGTERM, or ``--duration``) stops everything
started here, pyctl first, then the second scheduler and the control plane.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from kubernetes_asyncio import client, config
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pyctl.core.mig import MIG_CONFIG_LABEL
from pyctl.dev.control_plane import (
    Component,
    ControlPlane,
    ExtraScheduler,
    ensure_binaries,
    free_port,
)
from pyctl.dev.extender import extender_config
from pyctl.dev.gpu_nodes import (
    GPU,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
    wait_nodes_ready,
)
from pyctl.dev.mig_manager import STATE_LABEL, MigManagerSim, a100_all_1g, create_mig_node, mig_pod
from pyctl.dev.topology import TopologyUpdater, pod_request
from pyctl.jsontypes import JsonObject

SCHEDULER_NAME = "pyctl-gpu"
NAMESPACE = "demo"
GPU_NS = "gpu-operator"
CONFIGMAP = "pyctl-mig-parted-config"
MIG_NODE = "mig-0"
#: the MIG demand of successive cycles: (profile, pods)
MIG_DEMANDS = (("3g.20gb", 2), ("1g.5gb", 7))


@dataclass(frozen=True)
class Options:
    nodes: int = 3
    work_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "pyctl" / "dev-cluster")
    live: bool = True
    #: stop by itself after this many seconds (0: until Ctrl-C)
    duration: float = 0.0
    #: seconds between two cycles of the workload
    pause: float = 20.0
    redis_url: str = ""


def h100(name: str) -> GpuNodeSpec:
    return GpuNodeSpec(
        name,
        product="NVIDIA-H100-80GB-HBM3",
        gpu_memory_mib=81559,
        labels={"nvidia.com/mig.capable": "false"},
    )


def gpu_deployment(name: str, replicas: int, gpus: int) -> JsonObject:
    res: JsonObject = {"cpu": "1", "memory": "1Gi", GPU: str(gpus)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.example/llm-server:1",
                            "resources": {"requests": res, "limits": {GPU: str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


# --------------------------------------------------------------------------------------------------
# pyctl, as deployed


class Pyctl:
    """`pyctl run --kubeconfig ... --mode enforce` in a subprocess (its own process group)."""

    def __init__(self, kubeconfig: Path, work_dir: Path, redis_url: str) -> None:
        self.port = free_port()
        self.extender_port = free_port()
        self.log = work_dir / "pyctl.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYCTL_")}
        env.update(
            PYCTL_CLUSTER="dev",
            PYCTL_LEASE_NAMESPACE="default",
            PYCTL_METRICS_PORT=str(self.port),
            PYCTL_EXTENDER_PORT=str(self.extender_port),
            PYCTL_WORKFLOW_INTERVAL="2",
            PYCTL_SUMMARY_INTERVAL="1",
            PYCTL_LEASE_DURATION="5",
            PYCTL_LOG_FORMAT="text",
            # a demo: act within seconds, not minutes
            PYCTL_LIMIT_NODE_COOLDOWN_SECONDS="5",
            PYCTL_MIG_NODE_HOLDOFF_SECONDS="0",
            PYCTL_LIMIT_DISRUPTIONS_PER_HOUR="0",
            PYCTL_LIMIT_GLOBAL_PER_MINUTE="60",
            PYCTL_LIMIT_NODE_PER_MINUTE="30",
            PYCTL_LIMIT_NAMESPACE_PER_MINUTE="60",
            PYCTL_LIMIT_WORKLOAD_BURST="4",
            PYCTL_LIMIT_WORKLOAD_PER_MINUTE="30",
        )
        if redis_url:
            env["PYCTL_REDIS_URL"] = redis_url
        no_proxy = ",".join(filter(None, [env.get("NO_PROXY"), "127.0.0.1,localhost"]))
        env["NO_PROXY"] = env["no_proxy"] = no_proxy
        self.argv = [
            sys.executable, "-m", "pyctl.cli.main", "run", "--kubeconfig", str(kubeconfig),
            "--mode", "enforce", "--no-live",
        ]  # fmt: skip
        self.component = Component("pyctl", self.argv, self.log, env)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self) -> None:
        self.component.start()

    def stop(self) -> None:
        self.component.stop(grace=15.0)

    def exited(self) -> int | None:
        return self.component.exited()

    def metrics(self) -> dict[str, float]:
        """The samples of /metrics, summed over label sets (for the view)."""
        try:
            with self._opener.open(f"http://127.0.0.1:{self.port}/metrics", timeout=1.0) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                key = s.name
                if s.name == "pyctl_evictions_total":
                    key += f"{{{s.labels.get('result', '')}}}"
                if s.name == "pyctl_mig_reconfigurations_total":
                    key += f"{{{s.labels.get('result', '')}}}"
                out[key] = out.get(key, 0.0) + s.value
        return out


# --------------------------------------------------------------------------------------------------
# the workload


class Workload:
    """Fragments the cluster, asks for what only compaction and a MIG re-partition can give,
    withdraws it, and again."""

    def __init__(self, api: client.ApiClient, specs: list[GpuNodeSpec], updater: TopologyUpdater):
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.specs = specs
        self.updater = updater
        self.phase = "starting"
        self.pause = 20.0
        self.cycle = 0
        self.log: deque[str] = deque(maxlen=8)
        #: lines said so far (the view prints those it has not shown)
        self.said = 0

    def say(self, what: str) -> None:
        self.phase = what
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")
        self.said += 1

    async def _scale(self, name: str, replicas: int) -> None:
        await self.apps.patch_namespaced_deployment_scale(
            name, NAMESPACE, body({"spec": {"replicas": replicas}})
        )

    async def _cordon(self, node: str, on: bool) -> None:
        await self.core.patch_node(node, body({"spec": {"unschedulable": True if on else None}}))

    async def _pods(self, app: str) -> list[Any]:
        got = await self.core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}")
        return [p for p in got.items if not p.metadata.deletion_timestamp]

    async def _wait(self, check: Callable[[], Any], period: float = 0.25) -> None:
        while not await check():  # noqa: ASYNC110 (polling the API server)
            await anyio.sleep(period)

    async def fragment(self) -> None:
        """Two 1-GPU replicas on every GPU node, one in each NUMA zone: placed one node at a time
        (the others cordoned) while the topology-updater plays the history that spread them."""
        self.say("fragmenting: web-small, one 1-GPU replica per NUMA zone on every GPU node")
        await self._scale("web-small", 0)
        await self._wait(lambda: self._none("web-small"))
        self.updater.spreading = True
        try:
            for i, spec in enumerate(self.specs):
                for other in self.specs:
                    await self._cordon(other.name, other.name != spec.name)
                await self._scale("web-small", 2 * (i + 1))

                async def bound(n: int = 2 * (i + 1)) -> bool:
                    pods = await self._pods("web-small")
                    placed = [p for p in pods if p.spec.node_name]
                    uids = self.updater.uids
                    return len(placed) == n and all(
                        uids.get(f"{p.metadata.namespace}/{p.metadata.name}") == p.metadata.uid
                        for p in placed
                    )

                await self._wait(bound)
        finally:
            for spec in self.specs:
                await self._cordon(spec.name, False)
            self.updater.spreading = False

    async def _none(self, app: str) -> bool:
        return not await self._pods(app)

    async def run(self) -> None:
        await self.apps.create_namespaced_deployment(
            NAMESPACE, body(gpu_deployment("web-small", 0, 1))
        )
        await self.apps.create_namespaced_deployment(
            NAMESPACE, body(gpu_deployment("llm-big", 0, 4))
        )
        while True:
            self.cycle += 1
            await self.fragment()
            self.say(
                "llm-big: a 4-GPU replica no NUMA zone can hold (6 GPUs free per node, 3 + 3): "
                "pending until pyctl compacts"
            )
            await self._scale("llm-big", 1)

            async def big_bound() -> bool:
                pods = await self._pods("llm-big")
                return len(pods) == 1 and bool(pods[0].spec.node_name)

            t0 = time.monotonic()
            await self._wait(big_bound)
            (big,) = await self._pods("llm-big")
            self.say(f"llm-big placed on {big.spec.node_name} after {time.monotonic() - t0:.0f} s")
            profile, count = MIG_DEMANDS[(self.cycle - 1) % len(MIG_DEMANDS)]
            self.say(
                f"MIG: {count} pods ask for nvidia.com/mig-{profile}, which {MIG_NODE} does not "
                "offer now: pending until pyctl re-partitions it"
            )
            names = [f"mig-{profile.split('.')[0]}-{self.cycle}-{i}" for i in range(count)]
            for name in names:
                await self.core.create_namespaced_pod(
                    NAMESPACE, body(mig_pod(name, MIG_NODE, profile, "mig-demand"))
                )

            async def mig_bound(count: int = count) -> bool:
                pods = await self._pods("mig-demand")
                return len(pods) == count and all(p.spec.node_name for p in pods)

            t0 = time.monotonic()
            await self._wait(mig_bound)
            self.say(
                f"MIG demand served after {time.monotonic() - t0:.0f} s (mig-0 re-partitioned)"
            )
            await anyio.sleep(self.pause)
            self.say("withdrawing the demand (llm-big to 0, the MIG pods deleted)")
            await self._scale("llm-big", 0)
            await self.core.delete_collection_namespaced_pod(
                NAMESPACE, label_selector="app=mig-demand", grace_period_seconds=0
            )
            await self._wait(lambda: self._none("mig-demand"))


# --------------------------------------------------------------------------------------------------
# the view


@dataclass
class Snapshot:
    nodes: list[Any] = field(default_factory=list)
    pods: list[Any] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def _zones(used: list[int], per_zone: int) -> Text:
    t = Text()
    for z, u in enumerate(used):
        if z:
            t.append("  ")
        t.append("■" * u, style="bold red" if u and u < per_zone else "bold green")
        t.append("□" * (per_zone - u), style="dim")
    return t


def render(
    opts: Options,
    kubeconfig: Path,
    snap: Snapshot,
    updater: TopologyUpdater,
    work: Workload,
    specs: list[GpuNodeSpec],
) -> Group:
    head = Text.assemble(
        ("pyctl dev cluster", "bold"),
        f"   kubectl --kubeconfig {kubeconfig} get nodes,pods -A\n",
        ("workload: ", "bold"),
        f"cycle {work.cycle}: {work.phase}",
    )
    nodes = Table(title="GPU nodes (■ used, □ free, per NUMA zone)", expand=False)
    for col in ("node", "GPUs", "pods", "state"):
        nodes.add_column(col)
    by_node: dict[str, int] = {}
    for p in snap.pods:
        if p.spec.node_name:
            by_node[p.spec.node_name] = by_node.get(p.spec.node_name, 0) + 1
    per_spec = {s.name: s for s in specs}
    for n in snap.nodes:
        name = n.metadata.name
        labels = n.metadata.labels or {}
        state = []
        if n.spec.unschedulable:
            state.append("cordoned")
        state += [f"taint {t.key}" for t in n.spec.taints or []]
        if name in per_spec:
            gpus: Text | str = _zones(updater.gpus_used(name), per_spec[name].gpus_per_zone)
        else:
            alloc = n.status.allocatable or {}
            gpus = ", ".join(
                f"{k.split('mig-')[1]} x{v}" for k, v in sorted(alloc.items()) if "mig-" in k
            )
            state.append(
                f"mig.config={labels.get(MIG_CONFIG_LABEL, '')} ({labels.get(STATE_LABEL, '')})"
            )
        nodes.add_row(name, gpus, str(by_node.get(name, 0)), ", ".join(state))
    pending = Table(title="pending GPU pods", expand=False)
    for col in ("pod", "asks", "why"):
        pending.add_column(col)
    for p in snap.pods:
        if p.spec.node_name or p.metadata.deletion_timestamp:
            continue
        asks = ", ".join(
            f"{k}={v}"
            for c in p.spec.containers
            for k, v in ((c.resources.requests or {}) if c.resources else {}).items()
            if k.startswith("nvidia.com/")
        )
        conds = (p.status.conditions if p.status else None) or []
        why = next((c.message or c.reason or "" for c in conds if c.type == "PodScheduled"), "")
        pending.add_row(f"{p.metadata.namespace}/{p.metadata.name}", asks, (why or "")[:90])
    m = snap.metrics
    stats = Text.assemble(
        ("pyctl: ", "bold"),
        f"leader {int(m.get('pyctl_leader', 0))}  "
        f"fragmentation {m.get('pyctl_fragmentation_ratio', 0.0):.0%}  "
        f"idle GPUs {m.get('pyctl_gpu_idle_gpus', 0.0):.0f}  "
        f"stranded {m.get('pyctl_gpu_fragment_gpus', 0.0):.1f}  "
        f"evictions {m.get('pyctl_evictions_total{evicted}', 0.0):.0f}  "
        f"MIG re-partitions {m.get('pyctl_mig_reconfigurations_total{succeeded}', 0.0):.0f}"
        + ("" if m else "  (metrics not up yet)"),
    )
    events = Table(title="pyctl's Events (kubectl get events -A)", expand=False)
    for col in ("time", "object", "reason", "message"):
        events.add_column(col)
    for e in snap.events[-6:]:
        ts = e.last_timestamp or e.event_time or e.metadata.creation_timestamp
        obj = e.involved_object
        events.add_row(
            ts.strftime("%H:%M:%S") if ts else "",
            f"{obj.kind}/{obj.name}",
            e.reason,
            (e.message or "")[:80],
        )
    log = Text("\n".join(work.log), style="dim")
    return Group(head, nodes, pending, stats, events, log)


async def observe(api: client.ApiClient, pyctl: Pyctl) -> Snapshot:
    core = client.CoreV1Api(api)
    nodes = (await core.list_node()).items
    pods = (await core.list_pod_for_all_namespaces()).items
    evs = [
        e
        for e in (await core.list_event_for_all_namespaces()).items
        if (e.reason or "").startswith("Pyctl")
    ]
    evs.sort(key=lambda e: e.metadata.creation_timestamp)
    gpu_pods = [
        p
        for p in pods
        if pod_request(p, GPU)
        or any(
            k.startswith("nvidia.com/mig-")
            for c in p.spec.containers
            for k in ((c.resources.requests or {}) if c.resources else {})
        )
    ]
    return Snapshot(
        sorted(
            [n for n in nodes if not n.metadata.name.startswith("kwok-canary")],
            key=lambda n: n.metadata.name,
        ),
        gpu_pods,
        evs,
        await anyio.to_thread.run_sync(pyctl.metrics),
    )


# --------------------------------------------------------------------------------------------------
# up


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM stops the cluster as Ctrl-C does."""

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def up(opts: Options, console: Console | None = None) -> int:
    console = console or Console()
    work_dir = opts.work_dir
    if work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    console.print(
        f"[bold]pyctl dev up[/]: the control plane, kwok GPU nodes and pyctl in {work_dir}"
    )
    binaries = ensure_binaries(work_dir / "build.log")
    plane = ControlPlane(binaries, work_dir)
    pyctl: Pyctl | None = None
    sched: ExtraScheduler | None = None
    with _stop_on_sigterm():
        try:
            plane.start()
            console.print(
                f"kubeconfig: [bold]{plane.kubeconfig}[/]\n"
                f"  in another shell: kubectl --kubeconfig {plane.kubeconfig} get nodes,pods -A\n"
                f"  (kubectl: {binaries.kubectl or 'kubectl'}); logs in {plane.log_dir}; "
                "Ctrl-C stops everything"
            )
            pyctl = Pyctl(plane.kubeconfig, work_dir, opts.redis_url)
            sched = ExtraScheduler(
                plane,
                "pyctl",
                extender_config(f"http://127.0.0.1:{pyctl.extender_port}/scheduler"),
                ["--pod-max-in-unschedulable-pods-duration=5s"],
            )
            sched.start()
            pyctl.start()
            anyio.run(_run, opts, plane, pyctl, console)
        except KeyboardInterrupt:
            console.print("\nstopping (Ctrl-C)")
        finally:
            stopped = []
            if pyctl is not None:
                pyctl.stop()
                stopped.append("pyctl")
            if sched is not None:
                sched.stop()
                stopped.append(sched.name)
            stopped += [c.name for c in reversed(plane.started)]
            plane.stop()
            console.print(f"stopped: {', '.join(stopped)}; work directory kept: {work_dir}")
    return 0


async def _run(opts: Options, plane: ControlPlane, pyctl: Pyctl, console: Console) -> None:
    api = await config.new_client_from_config(
        config_file=str(plane.kubeconfig), persist_config=False
    )
    specs = [h100(f"gpu-{i}") for i in range(opts.nodes)]
    mig_spec = a100_all_1g(MIG_NODE)
    async with api:
        core = client.CoreV1Api(api)
        await apply_nrt_crd(api)
        await create_gpu_nodes(api, specs)
        await create_mig_node(api, mig_spec, CONFIGMAP, GPU_NS)
        await wait_nodes_ready(api, [s.name for s in [*specs, mig_spec]])
        await core.create_namespace(body({"metadata": {"name": NAMESPACE}}))
        updater = TopologyUpdater(api, specs, cpu_pods=False)
        mgr = MigManagerSim(api, [mig_spec], namespace=GPU_NS, configmap=CONFIGMAP, delay=2.0)
        work = Workload(api, specs, updater)
        work.pause = opts.pause
        snap = Snapshot()
        async with anyio.create_task_group() as tg:
            tg.start_soon(updater.run)
            tg.start_soon(mgr.run)
            tg.start_soon(work.run)
            started = time.monotonic()
            live = (
                Live(console=console, refresh_per_second=2, transient=False) if opts.live else None
            )
            shown = 0
            seen_events: set[str] = set()
            with live if live is not None else contextlib.nullcontext():
                while True:
                    code = pyctl.exited()
                    if code is not None:
                        raise RuntimeError(f"pyctl exited with {code}: see {pyctl.log}")
                    with contextlib.suppress(Exception):
                        snap = await observe(api, pyctl)
                    if live is not None:
                        live.update(render(opts, plane.kubeconfig, snap, updater, work, specs))
                    else:
                        new = min(work.said - shown, len(work.log))
                        for line in list(work.log)[len(work.log) - new :]:
                            console.print(line, highlight=False)
                        shown = work.said
                        for e in snap.events:
                            if e.metadata.uid not in seen_events:
                                seen_events.add(e.metadata.uid)
                                obj = e.involved_object
                                console.print(
                                    f"  event {e.reason} {obj.kind}/{obj.name}: {e.message}",
                                    highlight=False,
                                )
                    if opts.duration and time.monotonic() - started > opts.duration:
                        tg.cancel_scope.cancel()
                        break
                    await anyio.sleep(0.5)
