"""The agent's Event on its own Node when the MIG catalog disagrees with the device
(`pyctl.agent.events`): one per distinct set of disagreements, bounded, retried after a failure,
posted by the agent's loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pytest

from pyctl.agent.events import MAX_MESSAGE, DisagreementEvents, disagreement_lines, message
from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.view import NodeView, read_node
from pyctl.app.agent import Agent, AgentOptions
from pyctl.cluster.kube.client import KubeApiError, KubeClient, Response

from . import agent_boards as boards


class Kube:
    """Records the requests; answers `status` (201: created)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, Any]] = []
        self.status = 201

    async def request(self, method: str, path: str, **kw: Any) -> Response:
        self.sent.append((method, path, kw.get("body")))
        return Response(self.status, b"{}", {})


def view(tmp_path: Path, disagree: bool, max_count: int = 1) -> NodeView:
    cap = boards.capture()
    if disagree:
        profiles = cap["devices"][0]["gpu_instance_profiles"]
        three_g = next(p for p in profiles if p.get("id") == 9)
        three_g["instanceCount"] = max_count
    root = boards.sysfs(tmp_path / "sys", cap, [-1])
    return read_node(FixtureNvml(cap), root)


def test_one_event_per_distinct_set_of_disagreements(tmp_path: Path) -> None:
    kube = Kube()
    events = DisagreementEvents(cast(KubeClient, kube), "gpu-1", clock=lambda: 0.0)
    agree, one, other = view(tmp_path, False), view(tmp_path, True, 1), view(tmp_path, True, 3)
    assert disagreement_lines(agree) == []
    assert disagreement_lines(one) == [
        "GPU 0 (H200-141GB) profile 9 3g.71gb: max_count device 1, catalog 2"
    ]
    for v in (agree, one, one, one, other, agree, agree, one):
        asyncio.run(events(v))
    # the first disagreement, a different one, then the first again after it had cleared
    assert events.posted == 3
    method, path, body = kube.sent[0]
    assert (method, path) == ("POST", "/api/v1/namespaces/default/events")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"}
    assert (body["type"], body["reason"], body["firstTimestamp"]) == (
        "Warning",
        "MigCatalogDisagrees",
        "1970-01-01T00:00:00Z",
    )
    assert body["message"] == (
        "pyctl's MIG catalog disagrees with the device in 1 place(s); pyctl uses the device's "
        "answer: GPU 0 (H200-141GB) profile 9 3g.71gb: max_count device 1, catalog 2"
    )
    assert "device 3, catalog 2" in kube.sent[1][2]["message"]


def test_a_failed_post_is_tried_again_at_the_next_read(tmp_path: Path) -> None:
    kube = Kube()
    kube.status = 403
    events = DisagreementEvents(cast(KubeClient, kube), "gpu-1")
    one = view(tmp_path, True)
    with pytest.raises(KubeApiError):
        asyncio.run(events(one))
    kube.status = 201
    asyncio.run(events(one))
    assert (len(kube.sent), events.posted) == (2, 1)


def test_the_message_is_bounded() -> None:
    lines = [
        f"GPU {i} (X) profile {i} p: placements device {'x' * 300}, catalog y" for i in range(20)
    ]
    text = message(lines)
    assert len(text) == MAX_MESSAGE
    assert text.startswith("pyctl's MIG catalog disagrees with the device in 20 place(s)")
    short = message(lines[:10])
    assert len(short) == MAX_MESSAGE  # 8 long lines are already over the bound
    few = message([f"GPU {i}: x" for i in range(10)])
    assert few.endswith("GPU 7: x; and 2 more")


def test_the_agents_loop_announces_and_a_failure_never_stops_it(tmp_path: Path) -> None:
    cap = boards.capture()
    next(p for p in cap["devices"][0]["gpu_instance_profiles"] if p.get("id") == 9)[
        "instanceCount"
    ] = 1
    fixture = tmp_path / "cap.json"
    fixture.write_text(json.dumps(cap))
    root = boards.sysfs(tmp_path / "sys", cap, [-1])
    seen: list[int] = []

    async def announce(v: NodeView) -> None:
        seen.append(len(disagreement_lines(v)))
        raise RuntimeError("the API server is away")

    opts = AgentOptions(node="gpu-1", sysfs_root=root, interval=0.01, nvml_fixture=fixture)
    agent = Agent(opts, None, announce)
    asyncio.run(agent.run(iterations=2))
    assert seen == [1, 1]
    assert agent.last is not None
