"""The workflow loops' ticking (`run_every`): the first round after the loop's phase, then one
every interval after the last ended; a failing round is retried; the loops' phases keep their
first rounds apart (the compactor's at once)."""

from __future__ import annotations

import types

import pytest

from pyctl.workflows import loop
from pyctl.workflows.loop import COMPACTION_PHASE, DRA_STEERING_PHASE, MIG_PHASE, run_every


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Stop(Exception):
    pass


def _script(monkeypatch: pytest.MonkeyPatch, events: list[str], sleeps: int) -> None:
    """`loop`'s sleeps recorded in `events`; the `sleeps`-th one ends the loop."""

    async def sleep(seconds: float) -> None:
        events.append(f"sleep {seconds:g}")
        if sum(e.startswith("sleep") for e in events) >= sleeps:
            raise _Stop

    monkeypatch.setattr(loop, "anyio", types.SimpleNamespace(sleep=sleep))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("phase", "first"), [(COMPACTION_PHASE, "sleep 0"), (MIG_PHASE, "sleep 15"), (1.0, "sleep 30")]
)
async def test_the_first_round_after_the_phase_then_every_interval(
    monkeypatch: pytest.MonkeyPatch, phase: float, first: str
) -> None:
    events: list[str] = []
    _script(monkeypatch, events, 3)
    leader = iter([True, False])

    async def tick(is_leader: bool) -> None:
        events.append(f"tick {is_leader}")

    with pytest.raises(_Stop):
        await run_every(30.0, tick, lambda: next(leader), "t", phase)
    assert events == [first, "tick True", "sleep 30", "tick False", "sleep 30"]


@pytest.mark.anyio
async def test_a_failing_round_is_retried_an_interval_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    _script(monkeypatch, events, 3)
    calls: list[int] = []

    async def tick(_: bool) -> None:
        calls.append(1)
        raise RuntimeError("round failed")

    with pytest.raises(_Stop):
        await run_every(30.0, tick, lambda: True, "t", COMPACTION_PHASE)
    assert len(calls) == 2
    assert events == ["sleep 0", "sleep 30", "sleep 30"]


def test_the_loops_first_rounds_are_apart() -> None:
    """Compaction at once, then DRA steering, then MIG, all inside the first interval."""
    got = [COMPACTION_PHASE, DRA_STEERING_PHASE, MIG_PHASE]
    assert got == sorted(set(got))
    assert got[0] == 0.0
    assert got[-1] < 1.0
