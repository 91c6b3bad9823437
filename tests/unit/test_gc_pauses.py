"""The cycle collector: every collection is timed by generation (`pyctl_gc_pause_seconds`), a
planning round runs with the collector paused, also when the rounds of both loops overlap
(`collector_paused`), and `pyctl run` runs the full collections itself
(`pyctl.app.collector`)."""

from __future__ import annotations

import gc
import threading
from typing import Any

import anyio

from pyctl.app.collector import full_collections, take_over_full_collections
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


def test_pyctl_run_turns_automatic_full_collections_off_and_runs_them_itself() -> None:
    """The oldest generation's threshold is out of reach, and `full_collections` runs full
    collections on its interval. Counted, not timed: a full collection of the test process's
    heap on a loaded machine may take longer than the interval."""
    before = gc.get_threshold()
    try:
        got = take_over_full_collections()
        assert got == before
        t0, t1, t2 = gc.get_threshold()
        assert (t0, t1) == before[:2]
        assert t2 >= 2**31 - 1
        full: list[int] = []

        def seen(phase: str, info: dict[str, Any]) -> None:
            if phase == "stop" and info["generation"] == 2:
                full.append(1)

        gc.callbacks.append(seen)
        try:

            async def main() -> None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(full_collections, 0.05)
                    with anyio.move_on_after(60):
                        while len(full) < 3:  # noqa: ASYNC110
                            await anyio.sleep(0.01)
                    tg.cancel_scope.cancel()

            anyio.run(main)
        finally:
            gc.callbacks.remove(seen)
        assert len(full) >= 3
        # and none without it: the thresholds alone never reach the oldest generation
        full.clear()
        gc.callbacks.append(seen)
        try:
            junk = [[i] for i in range(200_000)]  # many gen-0 and gen-1 collections
            del junk
        finally:
            gc.callbacks.remove(seen)
        assert full == []
    finally:
        gc.set_threshold(*before)
