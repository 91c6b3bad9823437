"""The kube-scheduler extender: wire format (k8s.io/kube-scheduler/extender/v1) and decisions."""

from __future__ import annotations

import json
import random
from typing import Any

import aiohttp
import anyio
import pytest
from prometheus_client import CollectorRegistry

from pyctl.cluster.kube.extender import MAX_EXTENDER_PRIORITY, ExtenderInputError, parse_args
from pyctl.controller.placement import HOT_SECONDS, PlacementAdvisor, RankTable
from pyctl.core.fragmentation import FragmentationModel
from pyctl.core.policy import choose
from pyctl.core.policy import rank as policy_rank
from pyctl.model import Gpu, Node, Shape, Snapshot, Workload, Zone
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer
from pyctl.serve.health import HealthServer

W = Workload(
    (
        Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.5),
        Shape(cpu_milli=1000, gpus=4, gpu_milli=1000, weight=0.5),
    )
)


class PlacementExtender:
    """The extender as the scheduler sees it: request bodies in, JSON answers out."""

    def __init__(self, models: dict[str, Node], workload: Any) -> None:
        self.advisor = PlacementAdvisor(models, workload)
        self.handler = ExtenderHandler(self.advisor)

    def handle(self, verb: str, body: bytes) -> bytes:
        return self.handler.handle(verb, body)

    def _call(self, verb: str, body: bytes | dict[str, Any]) -> Any:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return json.loads(self.handler.handle(verb, raw))

    def filter(self, body: bytes | dict[str, Any]) -> Any:
        return self._call("filter", body)

    def prioritize(self, body: bytes | dict[str, Any]) -> Any:
        return self._call("prioritize", body)

    def choose(self, body: bytes | dict[str, Any]) -> Any:
        return self._call("choose", body)

    def _model(self, name: str) -> Any:
        node = self.advisor._models.get(name)
        return None if node is None else self.advisor.ranks._model(name, node)


def node(name: str, used0: int, used1: int, policy: str = "single-numa-node") -> Node:
    zones = []
    gid = 0
    for z, used in ((0, used0), (1, used1)):
        gpus = []
        for j in range(4):
            gpus.append(Gpu(gid, 1000 if j < used else 0))
            gid += 1
        zones.append(Zone(z, 64000, 0, 512 * 1024, 0, tuple(gpus), ()))
    return Node(name=name, gpu_model="A100", topology_policy=policy, zones=tuple(zones))  # type: ignore[arg-type]


def pod(gpus: int, name: str = "p", cpu: str = "1") -> dict[str, Any]:
    req: dict[str, str] = {"cpu": cpu}
    if gpus:
        req["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": "u-1"},
        "spec": {
            "schedulerName": "pyctl",
            "containers": [{"name": "c", "image": "x", "resources": {"requests": req}}],
        },
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def ext() -> PlacementExtender:
    models = {
        "empty": node("empty", 0, 0),
        "three": node("three", 3, 0),  # one free GPU in zone 0, zone 1 free
        "split": node("split", 2, 2),  # 4 free GPUs, but 2 + 2: no aligned zone for 4
        "loose": node("loose", 2, 2, policy="none"),  # same, but no alignment needed
    }
    return PlacementExtender(models, lambda: W)


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


def test_filter_removes_nodes_without_an_aligned_zone(ext: PlacementExtender) -> None:
    names = ["empty", "three", "split", "loose", "unknown"]
    got = ext.filter(json.dumps(args(pod(4), names)).encode())
    assert got["Error"] == ""
    assert got["NodeNames"] == ["empty", "three", "loose", "unknown"]
    assert set(got["FailedNodes"]) == {"split"}
    assert "single-numa-node" in got["FailedNodes"]["split"]
    assert got["FailedAndUnresolvableNodes"] == {}
    assert got["Nodes"] is None
    # the wire keys are the Go field names of ExtenderFilterResult
    assert set(got) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


def test_filter_keeps_everything_a_one_gpu_or_cpu_pod_fits(ext: PlacementExtender) -> None:
    names = ["empty", "three", "split", "loose"]
    assert ext.filter(args(pod(1), names))["NodeNames"] == names
    assert ext.filter(args(pod(0, cpu="100"), names))["NodeNames"] == names  # CPU-only: no opinion


def test_filter_with_whole_nodes_answers_a_node_list(ext: PlacementExtender) -> None:
    items = [{"metadata": {"name": n}, "status": {}} for n in ("empty", "split")]
    req = {"Pod": pod(4), "Nodes": {"kind": "NodeList", "items": items}, "NodeNames": None}
    got = ext.filter(req)
    assert got["NodeNames"] is None
    assert [i["metadata"]["name"] for i in got["Nodes"]["items"]] == ["empty"]
    assert set(got["FailedNodes"]) == {"split"}


def test_prioritize_ranks_by_the_placement_policy(ext: PlacementExtender) -> None:
    got = ext.prioritize(args(pod(1), ["empty", "three", "unknown"]))
    by = {h["Host"]: h["Score"] for h in got}
    assert set(got[0]) == {"Host", "Score"}
    # one GPU on the emptiest node breaks a zone a 4-GPU pod could use; on "three" it fills the
    # stranded GPU: the policy's choice scores 10
    assert by == {"empty": 1, "three": MAX_EXTENDER_PRIORITY, "unknown": 0}
    four = {h["Host"]: h["Score"] for h in ext.prioritize(args(pod(4), ["empty", "split"]))}
    assert four["split"] == 0  # not admitted
    assert four["empty"] == MAX_EXTENDER_PRIORITY


def test_equal_ranks_go_to_the_first_node_by_name_and_only_it_scores_ten() -> None:
    # the node a replica was just evicted from (1 + 1 GPUs used) and a fuller one (3 + 3): one
    # GPU ranks the same on both; the policy's tie rule (the first node, by name) picks one
    e = PlacementExtender(
        {"b-left": node("b-left", 1, 1), "a-full": node("a-full", 3, 3)}, lambda: W
    )
    by = {h["Host"]: h["Score"] for h in e.prioritize(args(pod(1), ["b-left", "a-full"]))}
    assert by == {"a-full": MAX_EXTENDER_PRIORITY, "b-left": MAX_EXTENDER_PRIORITY - 1}


def test_scores_agree_with_the_policys_choice() -> None:
    models = {
        n: node(n, u0, u1) for n, u0, u1 in [("a", 2, 1), ("b", 3, 0), ("c", 0, 0), ("d", 4, 3)]
    }
    e = PlacementExtender(models, lambda: W)
    model = FragmentationModel(Snapshot(tuple(models[n] for n in sorted(models))))
    for gpus in (1, 2, 4):
        shape = Shape(cpu_milli=1000, gpus=gpus, gpu_milli=1000)
        best = choose(model, shape, W)
        by = {h["Host"]: h["Score"] for h in e.prioritize(args(pod(gpus), sorted(models)))}
        top = [n for n, v in by.items() if v == MAX_EXTENDER_PRIORITY]
        assert best is not None
        assert top == [best.node], (gpus, by, best)


def test_reserved_nodes_and_departures_keep_other_pods_off() -> None:
    models = {"a": node("a", 0, 0), "b": node("b", 0, 0)}
    big = {**pod(4, "big"), "metadata": {"name": "big", "namespace": "default", "uid": "u-b"}}
    e = PlacementExtender(models, lambda: W)
    e.advisor.reservations = lambda: {"a": "default/big"}
    other = ext_filter(e, pod(1, "x"), ["a", "b"])
    assert other["NodeNames"] == ["b"]
    assert "reserved for pending pod default/big" in other["FailedNodes"]["a"]
    assert ext_filter(e, big, ["a", "b"])["NodeNames"] == ["a", "b"]
    prio = {h["Host"]: h["Score"] for h in e.prioritize(args(big, ["a", "b"]))}
    assert prio["a"] == MAX_EXTENDER_PRIORITY
    e.advisor.reservations = dict
    p = pod(1, "web-2")
    p["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web", "controller": True}]
    e.advisor.departures = lambda: {"default/ReplicaSet/web": "a"}
    got = ext_filter(e, p, ["a", "b"])
    assert got["NodeNames"] == ["b"]


@pytest.mark.parametrize(
    ("gpus", "names"),
    [
        (1, ["empty", "three", "split", "loose", "unknown"]),
        (4, ["empty", "three", "split", "loose", "unknown"]),
        (4, ["split"]),  # nothing admits it: the filter's answer
        (1, ["unknown"]),  # nothing known: no preference, the filter's answer
        (0, ["empty", "three"]),  # CPU-only
    ],
)
def test_choose_is_the_filter_narrowed_to_the_top_of_prioritize(
    ext: PlacementExtender, gpus: int, names: list[str]
) -> None:
    body = args(pod(gpus), names)
    filtered = ext.filter(body)
    scores = {h["Host"]: h["Score"] for h in ext.prioritize(args(pod(gpus), filtered["NodeNames"]))}
    top = max(scores.values(), default=0)
    got = ext.choose(body)
    assert set(got) == set(filtered)  # an ExtenderFilterResult
    if top == 0:
        assert got == filtered
        return
    want = [n for n in filtered["NodeNames"] if scores[n] == top]
    assert got["NodeNames"] == want
    assert len(want) == 1  # one policy choice: the scheduler has nothing left to score
    # the filter's failures with its reasons; the candidates not chosen are left out of the
    # answer (the scheduler drops them without a status), so the answer does not grow with them
    assert got["FailedNodes"] == filtered["FailedNodes"]
    assert got["FailedAndUnresolvableNodes"] == {}


@pytest.mark.parametrize("seed", range(4))
def test_choose_is_the_top_of_prioritize_on_random_clusters(seed: int) -> None:
    """`choose` finds the policy's choice without scoring every candidate: on random clusters,
    candidate lists (with nodes pyctl does not model, and repeats), rescues' reservations and
    compaction's departures, its answer is still the filter's narrowed to the candidates
    `prioritize` scores highest."""
    rng = random.Random(seed)
    for case in range(150):
        n = rng.randint(1, 9)
        models = {f"n{i}": node(f"n{i}", rng.randint(0, 4), rng.randint(0, 4)) for i in range(n)}
        names = [rng.choice([*models, "unknown"]) for _ in range(rng.randint(1, 12))]
        e = PlacementExtender(models, lambda: W)
        p = {**pod(rng.choice([0, 1, 1, 2, 3, 4]), "x"), "metadata": {"name": "x", "uid": "u"}}
        p["metadata"]["namespace"] = "default"
        holders = ["default/x", "default/other"]
        held = rng.sample(sorted(models), rng.randint(0, min(2, n)))
        reserved = {m: rng.choice(holders) for m in held}
        e.advisor.reservations = lambda r=reserved: r  # type: ignore[misc]
        filtered = e.filter(args(p, names))
        scores = {h["Host"]: h["Score"] for h in e.prioritize(args(p, filtered["NodeNames"]))}
        top = max(scores.values(), default=0)
        got = e.choose(args(p, names))
        want = [m for m in filtered["NodeNames"] if scores[m] == top] if top > 0 else None
        assert got["FailedNodes"] == filtered["FailedNodes"], (seed, case)
        assert got["NodeNames"] == (want if want is not None else filtered["NodeNames"]), (
            seed, case, models, names, reserved, scores,
        )  # fmt: skip


def test_choose_keeps_a_rescues_node_for_its_pod_beside_the_policys_choice() -> None:
    models = {"a": node("a", 0, 0), "b": node("b", 3, 0), "c": node("c", 0, 0)}
    e = PlacementExtender(models, lambda: W)
    e.advisor.reservations = lambda: {"c": "default/x"}
    x = {**pod(1, "x"), "metadata": {"name": "x", "namespace": "default", "uid": "u-x"}}
    # b (one free GPU beside 3 used) is the policy's choice; c was freed for x by a rescue:
    # both score 10, so both are left to the scheduler
    assert ext_filter(e, x, ["a", "b", "c"])["NodeNames"] == ["a", "b", "c"]
    assert e.choose(args(x, ["a", "b", "c"]))["NodeNames"] == ["b", "c"]
    assert e.choose(args(x, ["a", "b", "c"]))["FailedNodes"] == {}  # a: not chosen, left out


@pytest.mark.parametrize("verb", ["filter", "prioritize", "choose"])
def test_an_answer_from_kept_ranks_is_the_answer_or_none(verb: str) -> None:
    """`answer_kept` (what the server answers on its own thread) is `answer` once every
    candidate's rank is kept; before, and after a candidate's model changed, it is None and
    neither computes nor counts anything. Candidates pyctl does not model need no rank."""
    models = {"a": node("a", 0, 0), "b": node("b", 3, 0), "c": node("c", 2, 2)}
    e = PlacementExtender(models, lambda: W)
    # 4 GPUs: c (2 + 2 free) is filtered out, a and b are ranked
    body = json.dumps(args(pod(4), ["a", "b", "c", "not-a-node"])).encode()
    assert e.handler.answer_kept(verb, body) is None
    assert (e.advisor.ranks.computed, e.advisor.filtered, e.advisor.advised) == (0, 0, 0)
    want = e.handler.answer(verb, body)
    counts = (e.advisor.ranks.computed, e.advisor.filtered, e.advisor.advised)
    assert counts[0] == 3
    assert counts[1:] == {"filter": (1, 0), "prioritize": (0, 1), "choose": (1, 1)}[verb]
    assert e.handler.answer_kept(verb, body) == want
    assert e.advisor.ranks.computed == 3
    assert (e.advisor.filtered, e.advisor.advised) == (2 * counts[1], 2 * counts[2])
    models["b"] = node("b", 4, 0)  # b changed: its kept rank is stale
    assert e.handler.answer_kept(verb, body) is None
    assert e.advisor.ranks.computed == 3
    # a request pyctl cannot read needs no rank: it is answered (as a bad request) at once
    assert e.handler.answer_kept(verb, b"[1, 2") == e.handler.answer(verb, b"[1, 2")


def ext_filter(e: PlacementExtender, p: dict[str, Any], names: list[str]) -> Any:
    return e.filter(args(p, names))


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        json.dumps({"Pod": {"metadata": {"name": "p"}}}).encode(),  # no nodes
        json.dumps({"Pod": "x", "NodeNames": []}).encode(),
        json.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": [1]}).encode(),
        json.dumps({"Pod": {"metadata": {"name": 5}}, "NodeNames": ["a"]}).encode(),
        json.dumps({"Pod": pod(1), "Nodes": {"items": [{"metadata": {}}]}}).encode(),
        b"\xff\xfe",
    ],
)
def test_bad_input_is_an_error_answer_not_a_crash(ext: PlacementExtender, body: bytes) -> None:
    got = ext.filter(body)
    assert got["Error"].startswith("pyctl: ")
    assert got["NodeNames"] is None
    assert ext.choose(body) == got
    assert ext.prioritize(body) == []
    assert json.loads(ext.handle("filter", body))["Error"]


def test_parse_accepts_other_casings() -> None:
    a = parse_args({"pod": pod(2, "x"), "nodenames": ["n"]})
    assert a.pod.name == "x"
    assert a.pod.gpus == 2
    assert a.names == ("n",)


@pytest.mark.parametrize(
    "wire",
    [
        {"Pod": pod(2, "x"), "NodeNames": ["n", "m"]},  # as kube-scheduler sends it
        {"pod": pod(2, "x"), "nodeNames": ["n", "m"]},
        {"Pod": pod(2, "x"), "Nodes": None, "NodeNames": ["n", "m"], "extra": {"a": [1]}},
        {"Pod": pod(2, "x"), "NodeNames": ["n", "m"], "Nodes": {"items": []}},
    ],
)
def test_a_body_reads_the_same_whichever_path_decodes_it(wire: dict[str, Any]) -> None:
    a = parse_args(json.dumps(wire).encode())
    assert (a.pod.name, a.pod.gpus, a.names, a.items) == ("x", 2, ("n", "m"), None)
    assert a == parse_args(wire)  # the general path, from the decoded object


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        ({"Pod": pod(1), "NodeNames": ["n", 3]}, "NodeNames must be a list of strings"),
        ({"Pod": [], "NodeNames": ["n"]}, "Pod is missing"),
        ({"Pod": {"metadata": {}}, "NodeNames": ["n"]}, "no metadata.name"),
    ],
)
def test_a_bad_body_is_explained_by_the_general_path(wire: dict[str, Any], message: str) -> None:
    with pytest.raises(ExtenderInputError, match=message):
        parse_args(json.dumps(wire).encode())


def test_invalid_utf8_inside_a_string_is_a_bad_request(ext: PlacementExtender) -> None:
    body = b'{"Pod": {"metadata": {"name": "x"}}, "NodeNames": ["\xa6"]}'
    with pytest.raises(ExtenderInputError, match="not JSON"):
        parse_args(body)
    for verb in ("choose", "filter", "prioritize"):
        assert ext.handler.answer(verb, body)[1] == "bad-request"


def test_models_are_rebuilt_only_when_a_node_changes() -> None:
    models = {"n": node("n", 0, 0)}
    e = PlacementExtender(models, lambda: W)
    m1 = e._model("n")
    assert e._model("n") is m1
    models["n"] = node("n", 4, 0)
    m2 = e._model("n")
    assert m2 is not m1
    assert e.filter(args(pod(4), ["n"]))["NodeNames"] == ["n"]  # zone 1 is still free
    models["n"] = node("n", 4, 1)
    assert e.filter(args(pod(4), ["n"]))["NodeNames"] == []
    del models["n"]
    assert e.filter(args(pod(4), ["n"]))["NodeNames"] == ["n"]  # unknown: passes


@pytest.mark.anyio
async def test_served_by_the_extender_server(ext: PlacementExtender) -> None:
    handler = ext.handler
    server = ExtenderServer(lambda: handler, ExtenderOptions(port=0))
    port = await server.start()
    try:
        base = f"http://127.0.0.1:{port}/scheduler"
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{base}/filter", json=args(pod(4), ["split", "empty"])) as r:
                assert r.status == 200
                got = await r.json()
            assert got["NodeNames"] == ["empty"]
            async with s.post(f"{base}/prioritize", json=args(pod(1), ["empty", "three"])) as r:
                assert r.status == 200
                assert await r.json() == [
                    {"Host": "empty", "Score": 1},
                    {"Host": "three", "Score": 10},
                ]
            async with s.post(f"{base}/filter", data=b"{") as r:
                assert r.status == 200
                assert (await r.json())["Error"]
            async with s.post(f"{base}/bind", data=b"{}") as r:
                assert r.status == 404
            async with s.get(f"{base}/filter") as r:
                assert r.status == 405
    finally:
        await server.stop()
    # the metrics port does not answer the extender
    plain = HealthServer(CollectorRegistry(), lambda: (True, "ok"))
    port = await plain.start()
    try:
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{port}/scheduler/filter"
            async with s.post(url, data=b"{}") as r:
                assert r.status == 404
    finally:
        await plain.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("process", [True, False], ids=["own-process", "in-process"])
async def test_pyctl_run_serves_the_extender_from_the_controllers_models(process: bool) -> None:
    """In its own process (the default: its counts reach the controller's /metrics within a
    flush) and in the controller's."""
    import socket

    from pyctl.app.config import Config, ExtenderSection, MetricsSection
    from pyctl.app.wiring import start_servers
    from pyctl.cluster.sim.scenario import inference_day
    from pyctl.cluster.sim.source import SimClusterSource
    from pyctl.controller.controller import Controller
    from pyctl.state.memory import MemoryStore

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    free, metrics_port = free_port(), free_port()
    ctl = Controller("sim", SimClusterSource(inference_day(), speed=None), MemoryStore())
    cfg = Config(
        metrics=MetricsSection(port=metrics_port),
        extender=ExtenderSection(port=free, process=process),
    )
    servers = await start_servers(ctl, cfg)
    assert servers.extender is not None
    assert servers.health is not None
    try:
        await ctl.run(until_source_ends=True)
        names = sorted(ctl.reconciler.models)
        assert names
        if process:  # its view follows the controller's within POLL_SECONDS (M's last change)
            await anyio.sleep(0.5)
        async with aiohttp.ClientSession() as s:
            url = f"http://127.0.0.1:{free}/scheduler/filter"
            async with s.post(url, json=args(pod(1), [*names, "not-a-node"])) as r:
                got = await r.json()
            url = f"http://127.0.0.1:{free}/scheduler/prioritize"
            async with s.post(url, json=args(pod(1), names)) as r:
                ranked = await r.json()
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            done = 'pyctl_extender_request_seconds_count{cluster="default",verb="prioritize"} 1.0'
            for _ in range(100):
                async with s.get(url) as r:
                    exposition = await r.text()
                if done in exposition:
                    break
                await anyio.sleep(0.05)
    finally:
        await servers.stop()
    assert got["Error"] == ""
    assert "not-a-node" in got["NodeNames"]
    assert set(got["NodeNames"]) | set(got["FailedNodes"]) == {*names, "not-a-node"}
    assert [h["Host"] for h in ranked] == names
    assert all(0 <= h["Score"] <= MAX_EXTENDER_PRIORITY for h in ranked)
    # counted by verb and outcome on the controller's registry
    for verb in ("filter", "prioritize"):
        line = f'pyctl_extender_requests_total{{cluster="default",outcome="ok",verb="{verb}"}} 1.0'
        assert line in exposition
        # and timed: first byte to answer
        name = "pyctl_extender_request_seconds"
        assert f'{name}_count{{cluster="default",verb="{verb}"}} 1.0' in exposition

    # and the advice itself: the filter ranked every node (nothing was kept yet) on a worker;
    # the prioritize after it found them kept, and was answered on the server's thread (in
    # a process of its own the extender may have ranked the pending pods' shapes ahead before
    # the filter asked: then both were answered on the server's thread)
    def work(verb: str, thread: str) -> str:
        labels = f'cluster="default",thread="{thread}",verb="{verb}"'
        return f"pyctl_extender_work_seconds_count{{{labels}}} "

    assert work("prioritize", "server") + "1.0" in exposition
    assert work("prioritize", "worker") + "0.0" in exposition
    ahead = process and work("filter", "server") + "1.0" in exposition
    assert work("filter", "worker") + ("0.0" if ahead else "1.0") in exposition
    assert work("filter", "server") + ("1.0" if ahead else "0.0") in exposition
    assert 'pyctl_extender_request_seconds_count{cluster="default",verb="choose"} 0.0' in exposition


def test_kept_ranks_are_each_nodes_own_as_nodes_change() -> None:
    """The advisor keeps each node's rank per shape and M; whatever was kept, a rank must be the
    one the node gets alone: on a cold cache, after a node is replaced or gone, with a name
    pyctl never saw, and after many nodes changed among kept ones."""
    policies = ("single-numa-node", "best-effort", "none", "restricted")
    models = {
        f"n{i:02d}": node(f"n{i:02d}", i % 5, (i * 3) % 5, policies[i % 4]) for i in range(24)
    }
    wl = Workload(
        (
            Shape(cpu_milli=1000, gpus=1, gpu_milli=1000, weight=0.4),
            Shape(cpu_milli=4000, gpus=2, gpu_milli=1000, weight=0.3),
            Shape(cpu_milli=8000, gpus=4, gpu_milli=1000, weight=0.3),
        )
    )
    advisor = PlacementAdvisor(models, lambda: wl)

    def alone(shape: Shape, names: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for n in names:
            m = models.get(n)
            out[n] = "unknown" if m is None else rank(Snapshot((m,)), shape, wl, n)
        return out

    names = [*sorted(models), "never-seen"]
    for shape in (Shape(cpu_milli=2000, gpus=4, gpu_milli=1000), Shape(cpu_milli=500, gpus=3)):
        got = advisor.rank(shape, tuple(names))  # nothing kept yet
        assert got == alone(shape, names)
        assert sum(1 for r in got.values() if r is None) > 0  # not vacuous: some refuse
        assert sum(1 for r in got.values() if r not in (None, "unknown")) > 1
        models["n03"] = node("n03", 4, 4)  # one miss
        del models["n07"]
        assert advisor.rank(shape, tuple(names)) == alone(shape, names)
        models["n03"] = node("n03", 0, 0)
        models["n07"] = node("n07", 1, 2)
        models["n11"] = node("n11", 3, 3)  # a few changed among kept ones
        assert advisor.rank(shape, tuple(reversed(names))) == alone(shape, names)
        for i in range(0, 16, 2):  # many changed among kept ones
            models[f"n{i:02d}"] = node(f"n{i:02d}", (i + 1) % 5, i % 3)
        assert advisor.rank(shape, tuple(names)) == alone(shape, names)


def rank(snap: Snapshot, shape: Shape, wl: Workload, name: str) -> Any:
    (r,) = policy_rank(FragmentationModel(snap), shape, wl, [name])
    return r


def test_the_reconciler_ranks_ahead_what_a_request_would_rank() -> None:
    """Wired as `pyctl run` wires it, the reconciler computes a re-scored node's ranks for the
    shapes asked about recently: after pods land, and after M changes, a request computes
    nothing, and its answer is what a table with nothing kept computes on the request. A shape
    not asked about for `HOT_SECONDS` is not ranked ahead."""
    import anyio

    from pyctl.cluster.records import Event, PodRecord
    from pyctl.cluster.sim.scenario import inference_day
    from pyctl.cluster.sim.source import SimClusterSource
    from pyctl.controller.controller import Controller
    from pyctl.metrics import Metrics
    from pyctl.state.memory import MemoryStore

    ctl = Controller("sim", SimClusterSource(inference_day(), speed=None), MemoryStore())
    anyio.run(lambda: ctl.run(until_source_ends=True))
    r = ctl.reconciler
    now = [0.0]
    metrics = Metrics()
    table = RankTable(r.models, lambda: r.workload, metrics, "sim", clock=lambda: now[0])
    r.on_scored.append(table.refreshed)
    names = tuple(sorted(r.models))
    assert len(names) > 4
    shapes = (Shape(cpu_milli=1000, gpus=1, gpu_milli=1000), Shape(cpu_milli=4000, gpus=2))

    def fresh(shape: Shape) -> dict[str, Any]:
        return RankTable(r.models, lambda: r.workload).rank(shape, names)

    for shape in shapes:
        assert table.rank(shape, names) == fresh(shape)
    assert table.computed == 2 * len(names)
    assert table.ahead == 0
    # pods land on three nodes: each is re-scored, its ranks computed then
    changed = names[:3]
    for i, name in enumerate(changed):
        p = PodRecord("default", f"landed-{i}", f"u-{i}", node=name, phase="Running",
                      cpu_milli=1000, gpus=1, owner_kind="ReplicaSet", owner_name="x")  # fmt: skip
        r.cache.apply([Event("ADDED", p)])
        before = r.models[name]
        r.reconcile(name)
        assert r.models[name] is not before  # not vacuous: the model changed
    assert table.ahead == 2 * len(changed)
    for shape in shapes:
        assert table.rank(shape, names) == fresh(shape)
    assert table.computed == 2 * len(names)  # nothing computed on the request
    # M changes: every node re-scored; the ranks under the new M are left to `keep_warm`
    r.workload = Workload((Shape(cpu_milli=2000, gpus=2, gpu_milli=1000),))
    for name in names:
        r.reconcile(name)
    assert table.ahead == 2 * len(changed)
    anyio.run(lambda: table._warm(chunk=5))  # one pass of keep_warm
    assert table.ahead == 2 * len(changed) + 2 * len(names)
    for shape in shapes:
        assert table.rank(shape, names) == fresh(shape)
    assert table.computed == 2 * len(names)
    for when, n in (("ahead", table.ahead), ("request", table.computed)):
        labels = {"cluster": "sim", "when": when}
        assert metrics.registry.get_sample_value("pyctl_extender_ranks_total", labels) == n
    # a shape not asked about for a while is no longer ranked ahead
    now[0] += HOT_SECONDS + 1
    r.cache.apply([Event("DELETED", PodRecord("default", "landed-0", "u-0", node=changed[0]))])
    r.reconcile(changed[0])
    assert table.ahead == 2 * len(changed) + 2 * len(names)
    assert table.rank(shapes[0], names) == fresh(shapes[0])
    assert table.computed == 2 * len(names) + 1


def test_the_shapes_of_pending_pods_are_ranked_before_the_scheduler_asks() -> None:
    """`keep_warm` ranks every node for the shapes of the pods waiting for the scheduler, in
    chunks on the event loop, so the first call for a new workload's pod finds them ready; a
    pod the core cannot model is left out, and ranks stay each node's own."""
    import anyio

    from pyctl.cluster.records import Event, PodRecord
    from pyctl.cluster.sim.scenario import inference_day
    from pyctl.cluster.sim.source import SimClusterSource
    from pyctl.controller.controller import Controller
    from pyctl.state.memory import MemoryStore

    ctl = Controller("sim", SimClusterSource(inference_day(), speed=None), MemoryStore())
    anyio.run(lambda: ctl.run(until_source_ends=True))
    r = ctl.reconciler
    waiting = [
        PodRecord("default", f"w{i}", f"uw-{i}", phase="Pending", cpu_milli=3000, gpus=2)
        for i in range(100)  # more than any other pending shape of the day
    ]
    r.cache.apply([Event("ADDED", p) for p in waiting])
    shapes = r.pending_shapes()
    want = r.shape_of(waiting[0])
    assert want is not None
    assert shapes[0] == want  # the most common first
    # a pod the core cannot model (GPUs and a MIG profile at once) is left out, and so are
    # pods the scheduler found unschedulable (it asks for them again on its own time)
    odd = PodRecord("default", "odd", "u-odd", phase="Pending", gpus=1, mig=(("1g.5gb", 1),))
    stuck = [
        PodRecord("default", f"s{i}", f"us-{i}", phase="Pending", gpus=3, unschedulable=True)
        for i in range(200)
    ]
    r.cache.apply([Event("ADDED", p) for p in [odd, *stuck]])
    assert r.pending_shapes() == shapes
    table = RankTable(r.models, lambda: r.workload)
    names = tuple(sorted(r.models))
    busy = [True]

    async def warm_for_a_while() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: table.keep_warm(r.pending_shapes, lambda: busy[0], interval=0.01, chunk=3)
            )
            await anyio.sleep(0.2)
            assert table.ahead == 0  # nodes to score: nothing ranked ahead meanwhile
            busy[0] = False
            with anyio.move_on_after(5):
                while not table.hot() or table.ahead < len(names) * len(table.hot()):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()

    anyio.run(warm_for_a_while)
    assert table.ahead == len(names) * len(table.hot())
    got = table.rank(want, names)
    assert table.computed == 0  # nothing left for the request
    assert got == RankTable(r.models, lambda: r.workload).rank(want, names)
