"""Requests for the rate-limiter tests."""

from __future__ import annotations

from pyctl.state.ratelimit import Bucket, Budget, Cooldown, Request, Slot


def every_kind_of_limit() -> Request:
    """A request that touches each kind of limit once."""
    return Request(
        buckets=(Bucket("global", 10, 1.0), Bucket("node/gpu-1", 2, 0.1)),
        cooldowns=(Cooldown("node/gpu-1", 30),),
        slot=Slot("mig-reconfiguration", "wf-1", 1, 60),
        budgets=(Budget("disruptions", 5, 3600),),
    )
