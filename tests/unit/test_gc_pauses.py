"""The cycle collector and the planning rounds: every collection is timed by generation
(`pyctl_gc_pause_seconds`), and a planning round runs with the collector paused, also when the
rounds of both loops overlap (`collector_paused`)."""

from __future__ import annotations

import gc
import threading

from pyctl.metrics import Metrics
from pyctl.workflows.loop import collector_paused


def _count(m: Metrics, generation: str) -> float:
    got = m.registry.get_sample_value(
        "pyctl_gc_pause_seconds_count", {"cluster": "c", "generation": generation}
    )
    return got or 0.0


def test_every_collection_is_timed_by_generation_until_stopped() -> None:
    m = Metrics()
    stop = m.watch_collections("c")
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
        assert _count(m, "0") >= 1
        assert _count(m, "2") >= 2
        total = m.registry.get_sample_value(
            "pyctl_gc_pause_seconds_sum", {"cluster": "c", "generation": "2"}
        )
        assert total is not None
        assert total > 0
    finally:
        stop()
    before = _count(m, "2")
    gc.collect(2)
    assert _count(m, "2") == before
    stop()  # twice: harmless


def test_the_collector_is_paused_while_any_round_runs_and_restored_after() -> None:
    assert gc.isenabled()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def round_a() -> None:
        with collector_paused():
            a_in.set()
            b_in.wait(5)
            seen.append(gc.isenabled())
        a_out.set()

    def round_b() -> None:
        a_in.wait(5)
        with collector_paused():
            b_in.set()
            a_out.wait(5)  # a ended first: b still holds the pause
            seen.append(gc.isenabled())

    ts = [threading.Thread(target=round_a), threading.Thread(target=round_b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert seen == [False, False]
    assert gc.isenabled()


def test_a_pause_leaves_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
    with collector_paused():
        raised = False
        try:
            with collector_paused():
                raise RuntimeError("a failing round")
        except RuntimeError:
            raised = True
        assert raised
        assert not gc.isenabled()
    assert gc.isenabled()
