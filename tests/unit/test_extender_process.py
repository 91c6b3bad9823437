"""The extender in a process of its own (`pyctl.serve.extender_process`): it answers every request
as the extender in the controller's process does, forwards what it cannot answer alone, is
started again when it dies, and ends with the controller."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import aiohttp
import anyio
import pytest
from prometheus_client import CollectorRegistry

from pyctl.app.config import Config
from pyctl.app.wiring import advisor, start_servers
from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller.controller import Controller
from pyctl.controller.domains import DomainIdle
from pyctl.controller.placement import PlacementAdvisor, RankTable
from pyctl.dev.control_plane import free_port
from pyctl.model import Node, Workload
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_process import (
    CHUNK,
    VERSION,
    Answer,
    Call,
    Collection,
    Counts,
    Event,
    ExtenderProcess,
    MessageRefused,
    Publisher,
    Ranks,
    Recorder,
    Refused,
    Replica,
    Request,
    Update,
    Work,
    _Child,
    chunks,
)
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer, HttpMetrics
from pyctl.serve.health import MetricsOptions
from pyctl.state.memory import MemoryStore


def _pod(rng: random.Random, i: int, names: list[str]) -> dict[str, Any]:
    """A pod of every kind a scheduler asks about, and some it should not."""
    kind = rng.choice(["gpu", "gpu", "gpu", "mig", "cpu", "claims", "node", "replica"])
    req: dict[str, str] = {"cpu": str(rng.choice([1, 4, 16])), "memory": "8Gi"}
    spec: dict[str, Any] = {"schedulerName": "pyctl"}
    if kind == "gpu":
        req["nvidia.com/gpu"] = str(rng.choice([1, 1, 2, 4, 8]))
    elif kind == "mig":
        req["nvidia.com/mig-1g.5gb"] = "1"
    elif kind == "replica":
        req["nvidia.com/gpu.shared"] = "1"
    elif kind == "claims":  # DRA: its shape needs the controller's claims (forwarded)
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"claim-{i}"}]
    elif kind == "node":  # names a node (forwarded)
        spec["nodeName"] = rng.choice(names)
        req["nvidia.com/gpu"] = "1"
    spec["containers"] = [{"name": "c", "image": "x", "resources": {"requests": req}}]
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"rs-{i % 3}",
             "uid": f"o-{i % 3}", "controller": True}  # fmt: skip
    meta = {"name": f"p-{i}", "namespace": "default", "uid": f"u-{i}", "ownerReferences": [owner]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Pending"}}  # fmt: skip


@pytest.fixture
async def controller() -> Controller:
    ctl = Controller("sim", SimClusterSource(inference_day(duration=3600.0), speed=None),
                     MemoryStore())  # fmt: skip
    await ctl.run(until_source_ends=True)
    assert ctl.reconciler.models
    return ctl


@pytest.mark.anyio
async def test_its_answers_are_the_controllers_own(controller: Controller) -> None:
    """Random requests of every verb (GPU, MIG, shared, CPU-only pods; pods with DRA claims and
    pods naming a node, which it forwards; unknown nodes, repeated names, broken bodies), under
    reservations and departures that change between rounds: byte for byte the answers of the
    extender in the controller's process, on the same controller."""
    ctl = controller
    r = ctl.reconciler
    reserved: dict[str, str] = {}
    departed: dict[str, str] = {}
    ranks = RankTable(r.models, lambda: r.workload)
    r.on_scored.append(ranks.refreshed)

    class Flows:  # the rescues' nodes, as `pyctl.app.wiring.advisor` reads them from workflows
        class compactor:
            reservations = reserved
            departures = departed

    def handler() -> ExtenderHandler:
        return ExtenderHandler(advisor(ctl, Flows, ranks))  # type: ignore[arg-type]

    here = ExtenderServer(handler, ExtenderOptions(port=0))
    registry = CollectorRegistry()
    metrics = HttpMetrics(registry, "t")
    there = ExtenderProcess(
        Publisher(r, lambda: reserved, lambda: departed),
        handler,
        ExtenderOptions(port=0),
        metrics,
    )
    ports = (await here.start(), await there.start())
    rng = random.Random(5)
    names = sorted(r.models)
    compared = 0
    try:
        async with aiohttp.ClientSession() as s:
            for rnd in range(4):
                reserved.clear()
                departed.clear()
                for n in rng.sample(names, 3):
                    reserved[n] = f"default/p-{rng.randrange(40)}"
                departed["default/ReplicaSet/rs-1"] = rng.choice(names)
                await anyio.sleep(0.3)  # the process's view follows within POLL_SECONDS
                for i in range(40):
                    verb = rng.choice(["filter", "prioritize", "choose"])
                    cands = rng.sample(names, rng.randint(1, len(names)))
                    cands += ["not-a-node", cands[0]]
                    if rng.random() < 0.1:
                        body = b'{"Pod": [1, 2'  # broken
                    else:
                        body = json.dumps({"Pod": _pod(rng, i + 40 * rnd, names),
                                           "Nodes": None, "NodeNames": cands}).encode()  # fmt: skip
                    got = []
                    for port in ports:
                        url = f"http://127.0.0.1:{port}/scheduler/{verb}"
                        async with s.post(url, data=body) as resp:
                            assert resp.status == 200
                            got.append(await resp.read())
                    assert got[0] == got[1], (verb, body[:300])
                    compared += 1
    finally:
        await there.stop()
        await here.stop()
    assert compared == 160
    assert there.forwarded > 0  # the pods with claims and those naming a node
    assert there.restarts == 0


@pytest.mark.anyio
async def test_a_dead_process_is_started_again_on_its_port(controller: Controller) -> None:
    r = controller.reconciler
    registry = CollectorRegistry()
    metrics = HttpMetrics(registry, "t")
    there = ExtenderProcess(
        Publisher(r, dict, dict),
        lambda: ExtenderHandler(advisor(controller)),
        ExtenderOptions(port=0),
        metrics,
    )
    port = await there.start()
    names = sorted(r.models)
    body = json.dumps({"Pod": _pod(random.Random(1), 0, names) | {},
                       "Nodes": None, "NodeNames": names}).encode()  # fmt: skip
    url = f"http://127.0.0.1:{port}/scheduler/choose"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(url, data=body) as resp:
                first = await resp.read()
            assert there.pid is not None
            os.kill(there.pid, signal.SIGKILL)
            again = b""
            with anyio.fail_after(30):
                while True:
                    await anyio.sleep(0.2)
                    try:
                        async with s.post(url, data=body) as resp:
                            again = await resp.read()
                        break
                    except aiohttp.ClientError:
                        continue
    finally:
        await there.stop()
    assert again == first  # the whole view was sent again
    assert there.restarts == 1
    assert metrics.restarts.labels("t")._value.get() == 1


def test_it_ends_with_the_controller(tmp_path: Any) -> None:
    """The controller killed outright (SIGKILL: nothing of it runs to stop the child): the child
    sees its pipe close and exits."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import asyncio, sys
        from prometheus_client import CollectorRegistry
        from pyctl.cluster.sim.scenario import inference_day
        from pyctl.cluster.sim.source import SimClusterSource
        from pyctl.controller.controller import Controller
        from pyctl.serve.extender import ExtenderHandler
        from pyctl.controller.placement import PlacementAdvisor
        from pyctl.serve.extender_process import ExtenderProcess, Publisher
        from pyctl.serve.extender_server import ExtenderOptions, HttpMetrics
        from pyctl.state.memory import MemoryStore

        async def main():
            src = SimClusterSource(inference_day(duration=600.0), speed=None)
            ctl = Controller("sim", src, MemoryStore())
            await ctl.run(until_source_ends=True)
            r = ctl.reconciler
            p = ExtenderProcess(Publisher(r, dict, dict),
                                lambda: ExtenderHandler(PlacementAdvisor.for_reconciler(r)),
                                ExtenderOptions(port=0), HttpMetrics(CollectorRegistry(), "t"))
            await p.start()
            print(p.pid, flush=True)
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        os.kill(child, 0)  # running
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            try:
                with open(f"/proc/{child}/stat") as f:
                    if f.read().split(") ")[1].startswith("Z"):
                        break  # exited (a zombie until init reaps it)
            except FileNotFoundError:
                break
            time.sleep(0.1)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the extender's process outlived the controller")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_big_message_goes_in_chunks_that_add_up_to_it() -> None:
    nodes = {f"n{i}": Node(f"n{i}") for i in range(2 * CHUNK + 3)}
    m = Workload()
    msg = Update(nodes=dict(nodes), workload=m, pending=())
    parts = chunks(msg)
    assert msg.nodes == nodes  # the message is not consumed
    assert len(parts) == 3
    assert all(len(p.nodes) <= CHUNK for p in parts)
    assert [p.more for p in parts] == [True, True, False]
    # the rest of the message comes with the first part
    assert (parts[0].workload, parts[0].pending) == (m, ())
    assert all(p.workload is None and p.pending is None for p in parts[1:])
    joined: dict[str, Node] = {}
    for p in parts:
        joined.update(p.nodes)
    assert joined == nodes
    assert chunks(Update(workload=m)) == [Update(workload=m)]
    assert chunks(Update(nodes={"a": Node("a")})) == [Update(nodes={"a": Node("a")})]


@pytest.mark.anyio
async def test_a_port_in_use_fails_the_start_and_leaves_nothing_behind(
    controller: Controller,
) -> None:
    import socket

    r = controller.reconciler
    listeners = list(r.on_scored)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        there = ExtenderProcess(
            Publisher(r, dict, dict),
            lambda: ExtenderHandler(advisor(controller)),
            ExtenderOptions(port=port),
            HttpMetrics(CollectorRegistry(), "t"),
        )
        with pytest.raises(RuntimeError, match="could not serve: OSError"):
            await there.start()
    assert there.pid is None  # no child kept
    assert r.on_scored == listeners


def test_the_processs_counts_land_on_the_controllers_metrics() -> None:
    """What the child records (`Recorder`: requests, their work, refusals, its cycle
    collections; the ranks it computed) is what the controller's metrics count."""
    import gc

    from pyctl.metrics import Metrics

    rec = Recorder()
    stop = rec.collections()
    try:
        gc.collect()
    finally:
        stop()
    rec.request("choose", "ok", 0.004)
    rec.request("filter", "deadline", 1.6)
    rec.work("choose", 0.002, "server")
    rec.on_reject("extender")("body-too-large")
    rec.refused_message("version")
    events = rec.take()
    assert rec.take() == []
    assert [type(e) for e in events] == [
        Collection,
        Request,
        Request,
        Work,
        Refused,
        MessageRefused,
    ]
    assert isinstance(events[0], Collection)
    assert events[0].generation == 2  # a full collection
    registry = CollectorRegistry()
    core = Metrics(registry)
    proc = ExtenderProcess(
        Publisher(None, dict, dict),  # type: ignore[arg-type]  # not started: no reconciler read
        lambda: None,  # type: ignore[arg-type,return-value]
        ExtenderOptions(),
        HttpMetrics(registry, "t"),
        core,
        "t",
    )
    for e in [*events, Ranks(3, 40)]:
        proc._count(e)

    def value(name: str, **labels: str) -> float:
        got = registry.get_sample_value(name, {"cluster": "t", **labels})
        return -1.0 if got is None else got

    assert value("pyctl_gc_pause_seconds_count", generation="2") == 1
    assert value("pyctl_extender_requests_total", verb="choose", outcome="ok") == 1
    assert value("pyctl_extender_requests_total", verb="filter", outcome="deadline") == 1
    assert value("pyctl_extender_request_seconds_sum", verb="filter") == 1.6
    assert value("pyctl_extender_work_seconds_count", verb="choose", thread="server") == 1
    assert value("pyctl_http_refused_total", server="extender", reason="body-too-large") == 1
    assert value("pyctl_extender_ranks_total", when="request") == 3
    assert value("pyctl_extender_ranks_total", when="ahead") == 40
    assert value("pyctl_extender_messages_refused_total", side="process", reason="version") == 1


def test_counts_are_added_and_taken_while_every_allocation_collects() -> None:
    """A cycle collection can start inside any allocation, also one made while the counts are
    being added or taken, and its callback adds a count then: with every allocation collecting,
    counting and taking go on, and the collections are counted."""
    import gc
    import threading

    rec = Recorder()
    stop = rec.collections()
    before = gc.get_threshold()
    done = threading.Event()
    taken: list[Event] = []

    def work() -> None:
        for _ in range(200):
            rec.request("choose", "ok", 0.001)
            taken.extend(rec.take())
        done.set()

    gc.set_threshold(1, 1, 1)
    try:
        threading.Thread(target=work, daemon=True).start()
        finished = done.wait(20)
    finally:
        gc.set_threshold(*before)
        stop()
    assert finished
    kinds = [type(e) for e in taken]
    assert kinds.count(Request) == 200
    assert Collection in kinds


def test_the_publisher_sends_each_change_once() -> None:
    """A scored model is sent once (the same object again: not sent); a node scored and gone
    before the next message goes as gone, not as a node; M and the rescues' nodes when they
    change; once a second a model replaced without a score, and the pending pods' shapes."""
    from types import SimpleNamespace

    from pyctl.model import Node, Workload

    a, b, c = Node("a"), Node("b"), Node("c")
    index = DomainIdle()
    r = SimpleNamespace(
        models={"a": a, "b": b}, workload=Workload(), pending_shapes=list, domain_idle=lambda: index
    )
    reserved: dict[str, str] = {}
    pub = Publisher(r, lambda: reserved, dict)  # type: ignore[arg-type]
    first = pub.full(0.0)
    assert first.nodes == {"a": a, "b": b}
    assert pub.changes(0.5) is None  # nothing changed
    a2 = Node("a", gpu_model="H100")
    r.models["a"] = a2
    pub.scored("a", a2, None)  # type: ignore[arg-type]
    pub.scored("b", b, None)  # type: ignore[arg-type]  # the same object: not sent again
    assert pub.changes(0.6) == Update(nodes={"a": a2})
    assert pub.changes(0.7) is None
    reserved["b"] = "default/p"
    r.workload = Workload()  # another object
    got = pub.changes(0.8)
    assert got is not None
    assert got.reservations == {"b": "default/p"}
    assert got.workload is r.workload
    assert got.nodes == {}
    assert got.departures is None  # unchanged
    # scored, then gone before the next message; and c replaced without a score
    r.models["c"] = c
    pub.scored("b", Node("b", gpu_model="A100"), None)  # type: ignore[arg-type]
    del r.models["b"]
    pub.pending = ()
    got = pub.changes(2.0)  # the once-a-second pass
    assert got is not None
    assert got.gone == ("b",)
    assert got.nodes == {"c": c}
    assert got.pending == ()
    assert pub.changes(2.1) is None


def test_the_domains_reach_the_process_and_follow_the_controllers() -> None:
    """The topology domains' index (the advice's tie order) goes to the process in full, then
    row by row as it changes once a second, nodes gone as gone, and in full again when its
    levels change: the process's copy stays the controller's."""
    from types import SimpleNamespace

    clique, leaf = "nvidia.com/gpu.clique", "network.topology.nvidia.com/leaf"
    index = DomainIdle((clique,))
    for i in range(6):
        index.update(f"n{i}", {clique: "abc"[i % 3]}, 4000)
    r = SimpleNamespace(models={}, workload=Workload(), domain_idle=lambda: index)
    pub = Publisher(r, dict, dict)  # type: ignore[arg-type]
    replica = Replica()
    replica.apply(pub.full(0.0))
    assert replica.domains.levels == (clique,)
    assert replica.domains.rows() == index.rows()
    index.update("n0", {clique: "a"}, 1000)  # a pod landed
    index.update("n5", None, 0)  # gone
    assert pub.changes(0.5) is None  # rows go with the once-a-second pass
    msg = pub.changes(1.5)
    assert msg is not None
    assert (msg.domain_levels, msg.domain_rows, msg.domain_gone) == (
        None,
        {"n0": (("a",), 1000)},
        ("n5",),
    )
    replica.apply(msg)
    assert replica.domains.rows() == index.rows()
    assert replica.domains.idle(clique, "a") == 5000
    # clique c (n2 alone: 4 idle), then a (n0 1 + n3 4), then b (n1 4 + n4 4)
    assert replica.domains.order(["n1", "n0", "n2"]) == ["n2", "n0", "n1"]
    index.relevel((clique, leaf), [("n9", {clique: "z", leaf: "l"}, 8000)])
    msg = pub.changes(3.0)
    assert msg is not None
    assert msg.domain_levels == (clique, leaf)
    replica.apply(msg)
    assert (replica.domains.levels, replica.domains.rows()) == (index.levels, index.rows())


@pytest.mark.anyio
async def test_the_process_breaks_ties_by_the_domains_as_the_controller_does() -> None:
    """Twelve 4-GPU nodes in three cliques, named so that name order alternates cliques, one
    clique broken: the process, fed by the controller, answers a one-GPU pod's `choose` with the
    broken clique's node, as the advisor in the controller's process does (not the first node
    by name)."""
    from pyctl.cluster.records import Event, PodRecord
    from pyctl.controller.cache import ClusterCache
    from pyctl.controller.reconcile import Reconciler
    from pyctl.metrics import Metrics
    from pyctl.model import Gang, Shape
    from tests.unit.test_domain_advice import ONE, records

    cache = ClusterCache()
    cache.apply([Event("ADDED", rec) for rec in records()])
    busy = PodRecord("default", "busy", "u-busy", node="n01", phase="Running", cpu_milli=1000,
                     gpus=4, owner_kind="ReplicaSet", owner_name="web")  # fmt: skip
    cache.apply([Event("ADDED", busy)])
    gang = Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, gang=Gang(4, "nvidia.com/gpu.clique"))
    r = Reconciler(cache, Metrics(), "c", workload=Workload((ONE, gang)))
    for name in cache.nodes:
        r.reconcile(name)

    def handler() -> ExtenderHandler:
        return ExtenderHandler(PlacementAdvisor.for_reconciler(r))

    here = ExtenderServer(handler, ExtenderOptions(port=0))
    there = ExtenderProcess(
        Publisher(r, dict, dict),
        handler,
        ExtenderOptions(port=0),
        HttpMetrics(CollectorRegistry(), "t"),
    )
    ports = (await here.start(), await there.start())
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "default", "uid": "u-p"},
           "spec": {"containers": [{"name": "c", "image": "x", "resources": {
               "requests": {"cpu": "1", "nvidia.com/gpu": "1"}}}]},
           "status": {"phase": "Pending"}}  # fmt: skip
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sorted(cache.nodes)}).encode()
    try:
        await anyio.sleep(1.5)  # the rows go with the once-a-second pass
        got = []
        async with aiohttp.ClientSession() as s:
            for port in ports:
                async with s.post(f"http://127.0.0.1:{port}/scheduler/choose", data=body) as resp:
                    assert resp.status == 200
                    got.append(json.loads(await resp.read()))
    finally:
        await there.stop()
        await here.stop()
    assert got[0] == got[1]
    # n01's clique (b: n01, n04, n07, n10) is broken; its first empty node by name is n04
    assert got[0]["NodeNames"] == ["n04"], got[0]


@pytest.mark.anyio
async def test_readyz_says_when_the_process_is_not_serving(controller: Controller) -> None:
    """`/readyz` (as `start_servers` wires it) answers 503 while the extender's process is being
    started again, and 200 once it serves."""
    cfg = Config(
        metrics=MetricsOptions(port=free_port()),
        extender=ExtenderOptions(port=free_port(), process=True),
    )
    servers = await start_servers(controller, cfg)
    assert servers.health is not None
    url = f"http://127.0.0.1:{cfg.metrics.port}/readyz"
    seen: list[tuple[int, str]] = []
    try:
        async with aiohttp.ClientSession() as s:

            async def readyz() -> tuple[int, str]:
                async with s.get(url) as resp:
                    return resp.status, await resp.text()

            assert (await readyz())[0] == 200
            proc = servers.extender
            assert isinstance(proc, ExtenderProcess)
            assert proc.pid is not None
            os.kill(proc.pid, signal.SIGKILL)
            with anyio.fail_after(30):
                while not seen or seen[-1][0] != 200 or len(seen) < 2:
                    seen.append(await readyz())
                    await anyio.sleep(0.02)
            assert proc.restarts == 1
    finally:
        await servers.stop()
    down = [body for code, body in seen if code == 503]
    assert down, seen  # the restart waits RESTART_SECONDS: a poll every 20 ms sees it
    assert all("extender's process is not serving" in body for body in down)


@pytest.mark.anyio
async def test_its_header_limit_holds_however_the_header_arrives(controller: Controller) -> None:
    """The extender's 16 KiB of request line and headers (docs/http.md), in its own process:
    65,000 bytes sent in one write were answered 200 before."""
    from tests.unit.test_http_servers import REFUSED, header_statuses

    registry = CollectorRegistry()
    there = ExtenderProcess(
        Publisher(controller.reconciler, dict, dict),
        lambda: ExtenderHandler(advisor(controller)),
        ExtenderOptions(port=0),
        HttpMetrics(registry, "t"),
    )
    port = await there.start()
    try:
        got = await header_statuses(port, "POST", "/scheduler/filter", 16 << 10)
    finally:
        await there.stop()
    assert got == {"under": 200, **REFUSED}


def test_a_message_of_another_version_or_type_is_refused_and_counted() -> None:
    """The controller refuses a message of the child's of another version, of another type, or
    that does not unpickle: logged, counted, and the next one is taken."""
    import multiprocessing

    registry = CollectorRegistry()
    answered: list[tuple[str, bytes]] = []

    class Handler:
        def answer(self, verb: str, body: bytes) -> tuple[bytes, str]:
            answered.append((verb, body))
            return b"{}", "ok"

    proc = ExtenderProcess(
        Publisher(None, dict, dict),  # type: ignore[arg-type]  # not started: no reconciler read
        lambda: None,  # type: ignore[arg-type,return-value]
        ExtenderOptions(),
        HttpMetrics(registry, "t"),
    )
    proc._handler = Handler()  # type: ignore[assignment]
    here, there = multiprocessing.Pipe(duplex=True)
    try:
        proc._take(here, Call(key=1, verb="filter", body=b"x", v=VERSION + 1))
        proc._take(here, ("call", 2, "filter", b"x"))  # the tuples of an older pyctl
        proc._take(here, Answer(key=3, answer=b"", outcome="ok"))  # not the child's to send
        assert answered == []
        assert not there.poll(0.05)  # nothing answered
        proc._take(here, Call(key=4, verb="filter", body=b"x"))
        assert answered == [("filter", b"x")]
        assert there.recv() == Answer(key=4, answer=b"{}", outcome="ok")
    finally:
        here.close()
        there.close()

    def refused(reason: str) -> float:
        got = registry.get_sample_value(
            "pyctl_extender_messages_refused_total",
            {"cluster": "t", "side": "controller", "reason": reason},
        )
        return -1.0 if got is None else got

    assert refused("version") == 1
    assert refused("unexpected") == 2


def test_the_process_refuses_what_it_cannot_take_and_goes_on() -> None:
    """The child's reader of the controller's updates refuses a message of another version,
    another type, or one that does not unpickle (counted with its next counts), and applies the
    next one: it does not exit."""
    import multiprocessing
    import threading

    updates_here, updates_there = multiprocessing.Pipe(duplex=True)
    calls_here, calls_there = multiprocessing.Pipe(duplex=True)
    child = _Child(ExtenderOptions(), updates_there, calls_there)
    reader = threading.Thread(target=child.read_updates, daemon=True)
    reader.start()
    try:
        updates_here.send(Update(nodes={"a": Node("a")}, v=VERSION + 1))
        updates_here.send({"nodes": {"a": Node("a")}})  # an older pyctl's dict
        updates_here.send_bytes(b"not a pickle")
        updates_here.send(Update(nodes={"b": Node("b")}))
        for _ in range(200):
            if "b" in child.replica.models:
                break
            threading.Event().wait(0.01)
        assert set(child.replica.models) == {"b"}
        assert not child.done.is_set()  # still reading
        refused = [e for e in child.recorder.take() if isinstance(e, MessageRefused)]
        assert [e.reason for e in refused] == ["version", "unexpected", "malformed"]
    finally:
        updates_here.close()
        reader.join(5)
        for conn in (updates_there, calls_here, calls_there):
            conn.close()
    assert child.done.is_set()  # the pipe closed: it ends
    assert Counts(events=()).v == VERSION
