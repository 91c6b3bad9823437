"""`SimClusterSource`: plays a scenario in virtual time and hands the records a real cluster would
show to the controller, through the same `EventSink` as the Kubernetes adapter.

Virtual time is the scenario's; `speed` only paces it against the wall clock. With a `Lockstep`,
the controller is the only other party and follows virtual time too: after every change the
source waits until the controller has taken it in (`settle`), and every `every` virtual seconds it
lets the controller act (`tick`: its planning rounds and workflow steps, on the virtual clock
`now`). A run is then the same at any speed. A `Recorder` measures the run on the cluster's own
state (pyctl/cluster/sim/record.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import anyio
import anyio.lowlevel

from pyctl.cluster.records import DRA_KINDS, FABRIC_KINDS, Event, Kind, Record
from pyctl.cluster.sim.cluster import Clock, SimCluster, SimPod
from pyctl.cluster.sim.record import Recorder
from pyctl.cluster.sim.scenario import Scenario
from pyctl.cluster.source import EventSink
from pyctl.model import Workload


@dataclass
class SimStats:
    arrived: int = 0
    bound: int = 0
    unschedulable: int = 0
    departed: int = 0
    events: int = 0
    virtual_time: float = 0.0
    done: bool = False


#: the virtual clock's origin (2026-01-01T00:00:00Z, epoch seconds)
EPOCH = 1_767_225_600.0


@dataclass
class Lockstep:
    """The controller in virtual time: `settle` returns once it has taken in every change
    published so far; `tick(now)` runs its planning rounds and workflow steps at virtual time
    `now`, every `every` virtual seconds."""

    settle: Callable[[], Awaitable[None]]
    tick: Callable[[float], Awaitable[None]]
    every: float = 30.0


@dataclass
class SimClusterSource:
    scenario: Scenario
    #: virtual seconds per wall second; None plays as fast as possible
    speed: float | None = None
    forever: bool = False
    name: str = "sim"
    stats: SimStats = field(default_factory=SimStats)
    on_tick: Callable[[SimStats], None] | None = None
    lockstep: Lockstep | None = None

    def __post_init__(self) -> None:
        w = Workload(tuple(replace(r.shape, weight=r.share) for r in self.scenario.replicas))
        self.cluster = SimCluster(self.scenario.nodes, w)
        self.recorder = Recorder(self.cluster)
        self._sink: EventSink | None = None
        #: original pod name -> the name of its current incarnation (after evictions)
        self._alias: dict[str, str] = {}
        self.evicted = 0
        #: virtual seconds before the current loop of the scenario (`forever`)
        self._offset = 0.0

    def now(self) -> float:
        """The virtual clock (epoch seconds): what the controller's clocks read in lockstep."""
        return EPOCH + self._offset + self.stats.virtual_time

    def _vt(self) -> float:
        """Virtual seconds since the start of the run."""
        return self._offset + self.stats.virtual_time

    async def _publish_events(self, events: list[Event], rvs: dict[Kind, str]) -> None:
        """Hand a change to the controller; in lockstep, wait until it has taken it in; then
        measure the cluster as the change left it."""
        if self._sink is None:
            return
        self.stats.events += len(events)
        await self._sink.apply(events, rvs)
        if self.lockstep is not None:
            await self.lockstep.settle()
        self.recorder.observe(self._vt())

    async def evict(self, namespace: str, name: str) -> bool:
        """The Eviction API on the simulated cluster: the pod goes, its ReplicaSet creates a
        replacement, and the scheduler places it (with pyctl's placement advice, if on)."""
        c = self.cluster
        pod = c.pods.get(name)
        if self._sink is None or pod is None or not pod.node or namespace != c.namespace:
            return True  # already gone: eviction is idempotent
        old_node = c.remove(pod)
        del c.pods[name]
        self.evicted += 1
        root = next((k for k, v in self._alias.items() if v == name), name)
        new = SimPod(f"{root}-m{self.evicted}", pod.shape, root=pod.root)
        c.pods[new.name] = new
        self._alias[root] = new.name
        self.recorder.evicted(self._vt())
        now = time.monotonic()
        events = [
            Event("DELETED", c.pod_record(pod), now),
            Event("MODIFIED", c.nrt_record(old_node), now),
        ]
        if c.schedule(new):
            events += [
                Event("ADDED", c.pod_record(new), now),
                Event("MODIFIED", c.nrt_record(new.node), now),
            ]
        else:
            c.pending.append(new.name)
            events.append(Event("ADDED", c.pod_record(new), now))
        await self._publish_events(events, {"Pod": c.rv(), "NodeResourceTopology": c.rv()})
        return True

    async def run(self, sink: EventSink) -> None:
        self._sink = sink
        c = self.cluster
        rv = c.rv
        await sink.replace("Node", [c.node_record(n) for n in c.nodes], rv())
        await sink.replace("NodeResourceTopology", [c.nrt_record(n.name) for n in c.nodes], rv())
        await sink.replace("PodDisruptionBudget", [], rv())
        # the simulated cluster has no DRA driver, and no Topology or ComputeDomainClique objects
        for kind in (*DRA_KINDS, *FABRIC_KINDS):
            await sink.replace(kind, [], rv())
        await sink.replace("Pod", [], rv())
        if self.lockstep is not None:
            await self.lockstep.settle()
        self.recorder.observe(0.0)
        loop = 0
        while True:
            await self._play(sink, loop)
            if not self.forever:
                break
            loop += 1
            self._offset += self.scenario.duration
        self.recorder.finish(self._offset + self.scenario.duration)
        self.stats.done = True
        if self.on_tick:
            self.on_tick(self.stats)

    async def _play(self, sink: EventSink, loop: int) -> None:
        c = self.cluster
        sc = self.scenario
        clock = Clock()
        arrivals = {f"{a.pod}-r{loop}" if loop else a.pod: a for a in sc.arrivals}
        for name, a in arrivals.items():
            clock.push(a.t, "arrive", name)
        if self.lockstep is not None:
            every = max(self.lockstep.every, 1.0)
            k = 1
            while k * every <= sc.duration:
                clock.push(k * every, "tick", "")
                k += 1
        start_wall = time.monotonic()
        while (item := clock.pop()) is not None:
            t, what, name = item
            if t > sc.duration:
                break
            if self.speed:
                delay = start_wall + t / self.speed - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
            else:
                await anyio.lowlevel.checkpoint()
            self.stats.virtual_time = t
            if what == "tick":
                if self.lockstep is not None:
                    await self.lockstep.tick(self.now())
                continue
            batch: list[Record] = []
            deleted: list[Record] = []
            if what == "arrive":
                a = arrivals[name]
                pod = SimPod(name, a.replica.shape)
                c.pods[name] = pod
                self.stats.arrived += 1
                # the demand lasts its life whether it is served or not (a replica that cannot
                # be placed is scaled away when its load goes)
                clock.push(t + a.life, "depart", name)
                if c.schedule(pod):
                    self.stats.bound += 1
                    batch += [c.pod_record(pod), c.nrt_record(pod.node)]
                else:
                    self.stats.unschedulable += 1
                    c.pending.append(name)
                    batch.append(c.pod_record(pod))
                self.recorder.arrival(self._offset + t, bool(pod.node))
            else:
                current = self._alias.pop(name, name)
                if current not in c.pods:
                    continue
                pod = c.pods.pop(current)
                if not pod.node:
                    # an evicted replica whose replacement is still pending leaves the queue
                    if pod.name in c.pending:
                        c.pending.remove(pod.name)
                    self.stats.departed += 1
                    ev = [Event("DELETED", c.pod_record(pod), time.monotonic())]
                    await self._publish_events(ev, {"Pod": c.rv()})
                    continue
                node = c.remove(pod)
                self.stats.departed += 1
                deleted.append(c.pod_record(pod))
                batch.append(c.nrt_record(node))
                # the scheduler retries pending pods where capacity freed up (queueing hints);
                # a shape that does not fit there now is not tried again in this round
                failed: set[object] = set()
                for pname in list(c.pending):
                    p = c.pods[pname]
                    if p.shape in failed:
                        continue
                    if c.schedule(p, only=node):
                        c.pending.remove(pname)
                        self.stats.bound += 1
                        batch += [c.pod_record(p), c.nrt_record(p.node)]
                    else:
                        failed.add(p.shape)
            events = [Event("DELETED", r, time.monotonic()) for r in deleted]
            events += [Event("MODIFIED", r, time.monotonic()) for r in batch]
            rvs: dict[Kind, str] = {"Pod": c.rv(), "NodeResourceTopology": c.rv()}
            await self._publish_events(events, rvs)
            if self.on_tick:
                self.on_tick(self.stats)
        # leftover pods leave at the end of a loop
        for name in list(c.pods):
            pod = c.pods.pop(name)
            events = []
            if pod.node:
                node = c.remove(pod)
                events = [Event("DELETED", c.pod_record(pod), time.monotonic())]
                events.append(Event("MODIFIED", c.nrt_record(node), time.monotonic()))
            else:
                events = [Event("DELETED", c.pod_record(pod), time.monotonic())]
            await self._publish_events(events, {"Pod": c.rv()})
        c.pending.clear()

    # -- node isolation and MIG reconfiguration (driven by SimActuator) --------------------------

    async def _publish(self, name: str, records: list[Record]) -> None:
        if self._sink is None:
            return
        c = self.cluster
        now = time.monotonic()
        events = [Event("MODIFIED", c.node_record(c.by_name[name]), now)]
        events += [Event("MODIFIED", r, now) for r in records]
        rvs: dict[Kind, str] = {"Node": c.rv(), "Pod": c.rv(), "NodeResourceTopology": c.rv()}
        await self._publish_events(events, rvs)

    def _retry_pending(self, name: str) -> list[Record]:
        """The scheduler retries pending pods on a node that changed (queueing hints)."""
        c = self.cluster
        out: list[Record] = []
        for pname in list(c.pending):
            p = c.pods[pname]
            if c.schedule(p, only=name):
                c.pending.remove(pname)
                self.stats.bound += 1
                out += [c.pod_record(p), c.nrt_record(name)]
        return out

    async def isolate(
        self, name: str, *, taint: str = "", cordon: bool | None = None, on: bool = True
    ) -> None:
        """Add/remove a NoSchedule taint, or (un)cordon; pending pods are retried after."""
        c = self.cluster
        if name not in c.by_name:
            return
        if taint:
            keys = c.taints.setdefault(name, set())
            keys.add(taint) if on else keys.discard(taint)
        if cordon is not None:
            c.cordoned.add(name) if cordon else c.cordoned.discard(name)
        await self._publish(name, self._retry_pending(name))

    async def mig_config(
        self, name: str, config: str, layouts: list[dict[str, int] | None] | None
    ) -> None:
        """The simulated mig-manager: acts only when the config name changes; `pending`, then
        the layouts applied (`success`) or `failed` (None: unknown config; a changed GPU in
        use). Then the device plugin's new capacity shows in the node record."""
        c = self.cluster
        if name not in c.by_name or c.mig_labels.get(name, ("", ""))[0] == config:
            return
        c.mig_labels[name] = (config, "pending")
        await self._publish(name, [])
        ok = layouts is not None and c.reconfigure_mig(name, layouts)
        c.mig_labels[name] = (config, "success" if ok else "failed")
        await self._publish(name, [c.nrt_record(name), *self._retry_pending(name)])
