"""The Lease as read from the API server is checked: a Lease that is not an object, or a spec
field of the wrong type, is a failed attempt, counted, never an exception out of the loop."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
import anyio
import pytest

from pyctl.cluster.kube.client import KubeClient, Query, Response, Timeouts
from pyctl.cluster.kube.lease import LeaderElector, LeaseConfig

CFG = LeaseConfig("ns", "pyctl", "me")


class FakeKube(KubeClient):
    """Answers GET with `lease` (raw JSON) and echoes each PUT body back."""

    def __init__(self, lease: bytes) -> None:
        super().__init__(None, Timeouts())
        self.lease = lease
        self.put: list[Mapping[str, Any]] = []

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = (),
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> Response:
        if method == "GET":
            return Response(200, self.lease, {})
        assert method == "PUT"
        assert body is not None
        self.put.append(json.loads(json.dumps(body)))
        return Response(200, json.dumps(body).encode(), {})


def _attempt(lease: object) -> tuple[bool, LeaderElector, FakeKube]:
    kube = FakeKube(json.dumps(lease).encode())
    elector = LeaderElector(kube, CFG)
    return anyio.run(elector._attempt), elector, kube


def test_a_free_lease_is_taken() -> None:
    lease = {"metadata": {"name": "pyctl"}, "spec": {"holderIdentity": "", "leaseTransitions": 2}}
    ok, elector, kube = _attempt(lease)
    assert ok
    assert elector.errors == 0
    assert elector.holder == "me"
    [put] = kube.put
    assert put["spec"]["holderIdentity"] == "me"
    assert put["spec"]["leaseTransitions"] == 3


@pytest.mark.parametrize("spec", [None, {}])
def test_a_lease_without_a_spec_is_taken(spec: object) -> None:
    ok, elector, kube = _attempt({"metadata": {"name": "pyctl"}, "spec": spec})
    assert ok
    assert elector.errors == 0
    assert kube.put[0]["spec"]["leaseTransitions"] == 1


@pytest.mark.parametrize(
    "lease",
    [
        [],
        "a lease",
        {"spec": []},
        {"spec": {"holderIdentity": 7}},
        {"spec": {"holderIdentity": "other", "leaseDurationSeconds": "15"}},
        {"spec": {"holderIdentity": "other", "leaseDurationSeconds": True}},
        {"spec": {"holderIdentity": "", "leaseTransitions": [1]}},
    ],
)
def test_a_lease_of_the_wrong_shape_is_a_counted_failure(lease: object) -> None:
    ok, elector, kube = _attempt(lease)
    assert not ok
    assert elector.errors == 1
    assert kube.put == []
    assert not elector.is_leader
