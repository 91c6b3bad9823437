"""The controller's start-up after the lists, alone: what `bench/scale.py` measures as "first
complete score after the lists", without the API server, kwok and the scheduler that share the
machine with pyctl there, and at sizes past what that bench can create here.

Each size runs in a process of its own. The cluster is the scale bench's (`plan_node`: 8 GPUs
in 2 NUMA zones, a share of MIG nodes, about 10 pods per node, NodeResourceTopology, a few
pending pods), as the API server answers it (uid, resourceVersion, the pods Running), decoded
by the reflectors' decoder. The controller is assembled as `pyctl run` assembles it (a real
Redis, the workflows in observe mode, the extender in its own process) and its source hands it
the lists as the reflectors do: each kind's records once listed, the Pod list last. From the
Pod list's hand-over the bench times:

- `scored`: every node scored (the controller's "every node scored");
- `stored`: the store re-synced (every kind written to Redis);
- `sent`: the extender's process sent every node's model;

and the CPU time pyctl's two processes used until all three were done, and their resident
memory together 2 s later (the bench's copy of the records is the controller's: the cache holds
the same objects; the objects' JSON is freed before the lists are handed). The last line fits
each against size: `startup: <N> nodes, <S> s to every node scored, <T> s to all done, growth
exponent <E> (cpu <C>)`.

    python bench/startup.py [--sizes 1000,2000,5000,10000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from _common import REPO  # noqa: F401  (puts the repository on sys.path)
from scale import (
    NLOGN,
    NS,
    exponent,
    plan_node,
    planned_pod,
    pod_manifest,
    proc_cpu_seconds,
    proc_memory,
)

from pyctl.app.collector import take_over_full_collections
from pyctl.app.config import Config, RedisSection
from pyctl.app.wiring import attach_recommender, attach_workflows, make_store, start_servers
from pyctl.cluster.kube.decode import decode_object
from pyctl.cluster.records import KINDS, Kind, Record
from pyctl.cluster.source import EventSink
from pyctl.controller.controller import Controller
from pyctl.dev.gpu_nodes import node_manifest, nrt_manifest
from pyctl.metrics import Metrics
from pyctl.serve.extender_process import ExtenderProcess
from pyctl.serve.extender_server import ExtenderOptions
from pyctl.serve.health import MetricsOptions
from pyctl.serve.http import tune_malloc
from tests.redis_servers import RedisServer, find_binaries, free_port

STAMP = "2026-12-01T00:00:00Z"


def _served(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    """`obj` as the API server answers it."""
    meta = obj["metadata"]
    meta["uid"] = str(uuid.UUID(int=random.Random(rv).getrandbits(128)))
    meta["resourceVersion"] = str(rv)
    meta["creationTimestamp"] = STAMP
    return obj


def cluster(n: int, mig_share: float, seed: int) -> dict[Kind, list[bytes]]:
    """The scale bench's cluster of `n` nodes, as listed: each object's JSON."""
    rng = random.Random(seed)
    plans = [plan_node(i, rng, mig_share) for i in range(n)]
    out: dict[Kind, list[bytes]] = {k: [] for k in KINDS}
    rv = 1000
    for p in plans:
        rv += 1
        out["Node"].append(json.dumps(_served(node_manifest(p.spec), rv)).encode())
        rv += 1
        out["NodeResourceTopology"].append(
            json.dumps(_served(nrt_manifest(p.spec, p.used()), rv)).encode()
        )
        for pp in p.pods:
            rv += 1
            pod = _served(planned_pod(pp), rv)
            pod["status"] = {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "startTime": STAMP,
            }
            out["Pod"].append(json.dumps(pod).encode())
    for k in range(max(4, n // 200)):  # pending: 8-GPU replicas no node holds (as scale.py)
        rv += 1
        pod = _served(
            pod_manifest(f"pending-llm-8g-{k}", gpus=8, cpu_milli=32000, mem_gib=256,
                         app="llm-8g", owner="ReplicaSet/llm-8g-5d8f", namespace=NS),
            rv,
        )  # fmt: skip
        pod["status"] = {"phase": "Pending"}
        out["Pod"].append(json.dumps(pod).encode())
    return out


class ListedSource:
    """Hands the controller each kind's list, the Pod list last, then nothing (no watch)."""

    name = "bench"

    def __init__(self, lists: dict[Kind, list[Record]]) -> None:
        self.lists = lists
        self.handing = anyio.Event()
        self.handed = 0.0
        #: the CPU time of both processes then
        self.cpu = 0.0
        self.child: int | None = None

    async def run(self, sink: EventSink) -> None:
        order: list[Kind] = [k for k in KINDS if k != "Pod"] + ["Pod"]
        for i, kind in enumerate(order):
            if i == len(order) - 1:
                self.handed, self.cpu = time.monotonic(), cpu_seconds(self.child)
                self.handing.set()
            await sink.replace(kind, self.lists.get(kind, []), "2000000")
        await anyio.sleep_forever()


def rss_mib(pids: list[int | None]) -> float:
    """The resident memory of `pids` together (VmRSS), MiB."""
    return sum(proc_memory(pid)["VmRSS"] for pid in pids if pid is not None) / 2**20


def cpu_seconds(child: int | None) -> float:
    """The CPU time of this process and of `child` (the extender's process)."""
    return time.process_time() + (proc_cpu_seconds(child) if child is not None else 0.0)


async def one(n: int, mig_share: float, seed: int, work: Path) -> dict[str, Any]:
    tune_malloc()  # as `pyctl run` does
    objects = cluster(n, mig_share, seed)
    t0 = time.perf_counter()
    lists: dict[Kind, list[Record]] = {
        k: [decode_object(k, memoryview(raw)) for raw in raws]  # type: ignore[arg-type]
        for k, raws in objects.items()
    }
    decode_s = time.perf_counter() - t0
    pods = len(lists["Pod"])
    del objects
    redis = RedisServer(find_binaries(), work)
    redis.start()
    cfg = Config(
        cluster="bench",
        source="kube",
        mode="observe",
        redis=RedisSection(url=redis.url),
        metrics=MetricsOptions(port=free_port()),
        extender=ExtenderOptions(port=free_port(), process=True),
    ).validate()
    metrics = Metrics()
    metrics.watch_collections(cfg.cluster)
    take_over_full_collections()
    source = ListedSource(lists)
    ctl = Controller(
        cfg.cluster,
        source,
        make_store(cfg, metrics),
        metrics,
        summary_interval=cfg.summary_interval,
        workload_interval=cfg.workload.interval,
    )
    flows = attach_workflows(ctl, cfg)
    attach_recommender(ctl, cfg)
    servers = await start_servers(ctl, cfg, flows)
    proc = servers.extender
    assert isinstance(proc, ExtenderProcess)
    publisher = proc.publisher
    source.child = proc.pid
    done: dict[str, float] = {}
    cpu = rss = 0.0
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctl.run)
            await source.handing.wait()
            while len(done) < 3:
                now = time.monotonic()
                if "scored" not in done and ctl.scored_at is not None:
                    done["scored"] = ctl.scored_at
                if "stored" not in done and ctl.store_synced:
                    done["stored"] = now
                if "sent" not in done and publisher.sent_nodes >= n:
                    done["sent"] = now
                await anyio.sleep(0.01)
            cpu = cpu_seconds(source.child) - source.cpu
            await anyio.sleep(2.0)
            rss = rss_mib([os.getpid(), source.child])
            tg.cancel_scope.cancel()
    finally:
        await servers.stop()
        redis.stop()
    handed = source.handed
    return {
        "nodes": n,
        "pods": pods,
        "decode_s": decode_s,
        **{f"{k}_s": v - handed for k, v in done.items()},
        "all_s": max(done.values()) - handed,
        "cpu_s": cpu,
        "rss_mib": rss,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1000,2000,5000,10000", help="node counts, ascending")
    ap.add_argument("--mig-share", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=19)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args(argv)
    if args.one:
        with tempfile.TemporaryDirectory(prefix="pyctl-startup-") as work:
            res = anyio.run(one, args.one, args.mig_share, args.seed, Path(work))
        print(json.dumps(res))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    for n in sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--mig-share", str(args.mig_share),
             "--seed", str(args.seed)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(
            f"{n} nodes, {r['pods']} pods: decoded in {r['decode_s']:.2f} s; after the Pod list: "
            f"every node scored {r['scored_s']:.2f} s, stored {r['stored_s']:.2f} s, sent to "
            f"the extender {r['sent_s']:.2f} s; cpu {r['cpu_s']:.2f} s; rss {r['rss_mib']:.0f} MiB",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    xs = [float(r["nodes"]) for r in results]
    last = results[-1]
    if len(results) > 1:
        grow = {
            k: exponent(xs, [r[k] for r in results])
            for k in ("scored_s", "stored_s", "sent_s", "all_s", "cpu_s")
        }
        print("growth exponents (n log n between 1,000 and 5,000 nodes: "
              f"{NLOGN:.2f}): " + ", ".join(f"{k} {v:.2f}" for k, v in grow.items()))  # fmt: skip
        e, c = f"{grow['scored_s']:.2f}", f"{grow['cpu_s']:.2f}"
    else:
        e = c = "n/a"
    print(
        f"startup: {last['nodes']} nodes, {last['scored_s']:.2f} s to every node scored, "
        f"{last['all_s']:.2f} s to all done, growth exponent {e} (cpu {c})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
