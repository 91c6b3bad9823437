"""The periodic summary reads indexes kept as events arrive (the cache's pending pods and pods
with claims, each scored node's row, the scheduling window's count of bindings) instead of
walking every pod and every score each second. Differential tests: the indexes against walking
the pods after every change, and every summary of a whole simulated day against the summary
computed by walking everything, value for value."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pyctl.cluster.dra_records import PodClaim
from pyctl.cluster.records import Event, PodRecord
from pyctl.cluster.sim.scenario import inference_day
from pyctl.cluster.sim.source import SimClusterSource
from pyctl.controller.cache import ClusterCache
from pyctl.controller.controller import Controller
from pyctl.controller.reconcile import Reconciler
from pyctl.controller.summary import Summary
from pyctl.core.fragmentation import CATEGORIES
from pyctl.state.memory import MemoryStore


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def walked_pending(c: ClusterCache) -> list[PodRecord]:
    return [p for p in c.pods.values() if not p.node and not p.terminated and not p.deleting]


def walked_claims(c: ClusterCache) -> list[PodRecord]:
    return [p for p in c.pods.values() if not p.terminated and p.claims]


def random_pod(rnd: random.Random, name: str) -> PodRecord:
    return PodRecord(
        "ns",
        name,
        node=rnd.choice(["", "", "n1", "n2"]),
        phase=rnd.choice(["", "Pending", "Running", "Succeeded", "Failed"]),
        unschedulable=rnd.random() < 0.5,
        deleting=rnd.random() < 0.2,
        claims=(PodClaim("gpu", claim="c"),) if rnd.random() < 0.4 else (),
        cpu_milli=rnd.randrange(4),
    )


@pytest.mark.parametrize("seed", range(20))
def test_the_cache_indexes_agree_with_walking_the_pods(seed: int) -> None:
    """Pods come, change (bound, unbound again, finished, deleting, claims added and dropped),
    go and come back, in events and in relists: after each change the indexes hold exactly
    the pods the walk finds, in the same order."""
    rnd = random.Random(seed)
    names = [f"p{i}" for i in range(25)]
    c = ClusterCache()
    seen_pending = seen_claims = 0
    for _ in range(300):
        if rnd.random() < 0.05:
            pods = [random_pod(rnd, n) for n in rnd.sample(names, rnd.randrange(len(names)))]
            keep = [p for p in c.pods.values() if rnd.random() < 0.5]
            c.replace("Pod", keep + [p for p in pods if p.key not in {k.key for k in keep}])
        else:
            events = []
            for _ in range(rnd.randrange(1, 4)):
                p = random_pod(rnd, rnd.choice(names))
                events.append(Event("DELETED" if rnd.random() < 0.25 else "MODIFIED", p))
            c.apply(events)
        assert c.pending_pods() == walked_pending(c)
        assert c.pending_count() == len(walked_pending(c))
        assert c.claim_pods() == walked_claims(c)
        seen_pending += bool(c.pending_pods())
        seen_claims += bool(c.claim_pods())
    # not vacuous
    assert seen_pending > 50
    assert seen_claims > 50


def walked_summary(r: Reconciler, blocked: dict[str, int]) -> Summary:
    """The summary as computed by walking every score, model and pod (the definition)."""
    scores = list(r.scores.values())
    by_model: dict[str, tuple[float, float]] = {}
    for name, s in r.scores.items():
        model = r.models[name].gpu_model or "unknown"
        i, f = by_model.get(model, (0.0, 0.0))
        by_model[model] = (i + s.idle_gpu_milli, f + s.fragment_gpu_milli)
    shared = [g for n in r.models.values() if n.sharing for z in n.zones for g in z.gpus]
    events = [ok for _, ok in r.window._events]  # pruned to the window by `ratio(now)`
    return Summary(
        cluster=r.cluster,
        nodes=len(scores),
        idle_gpu_milli=sum(s.idle_gpu_milli for s in scores),
        fragment_gpu_milli=sum(s.fragment_gpu_milli for s in scores),
        categories={c: sum(s.categories[c] for s in scores) for c in CATEGORIES},
        idle_mig_slices=sum(s.idle_mig_slices for s in scores),
        fragment_mig_slices=sum(s.fragment_mig_slices for s in scores),
        recoverable_mig_slices=sum(s.recoverable_mig_slices for s in scores),
        pending=len(walked_pending(r.cache)),
        blocked=blocked,
        scheduling_success=sum(1 for ok in events if ok) / len(events) if events else 1.0,
        worst=sorted(
            ((s.name, s.idle_gpu_milli, s.fragment_gpu_milli) for s in scores),
            key=lambda t: (-t[2], t[0]),
        )[:10],
        by_model=by_model,
        shared_gpus=len(shared),
        shared_used_milli=float(sum(g.used_milli for g in shared)),
        shared_pods=len({pod for g in shared for pod, _ in g.holders}),
    )


@pytest.mark.anyio
async def test_every_summary_of_a_day_is_the_walked_summary() -> None:
    """A whole simulated day on its virtual clock, a summary every 20 ms of wall time: each
    one equals the summary computed by walking everything, every float to the last bit (the
    rows are added up in the scores' order, as the walk adds them), the blocked pods' counts
    in the same key order, the worst nodes in the same order."""
    seen: list[tuple[Summary, Summary]] = []
    ctl: Controller | None = None

    def check(s: Summary) -> None:
        assert ctl is not None
        r = ctl.reconciler
        seen.append((s, walked_summary(r, s.blocked)))

    src = SimClusterSource(inference_day(), speed=None)
    # the virtual clock: the scheduling window (300 s) slides over the day's events
    ctl = Controller(
        "sim", src, MemoryStore(), summary_interval=0.02, on_summary=check, clock=src.now
    )
    await ctl.run(until_source_ends=True)
    assert len(seen) > 20
    for got, want in seen:
        assert got == want
        assert list(got.blocked) == list(want.blocked)
        assert list(got.by_model) == list(want.by_model)
    # not vacuous: the day has scored nodes, pending pods, blocked pods and a moving window
    assert all(got.nodes for got, _ in seen)
    assert sum(1 for got, _ in seen if got.pending) > 3
    assert sum(1 for got, _ in seen if got.blocked) > 3
    assert len(Counter(got.scheduling_success for got, _ in seen)) > 3
    assert len(Counter(got.fragment_gpu_milli for got, _ in seen)) > 3
