"""Safety limits for tests: one global token bucket and nothing else, so a test meets only the
limit it sets."""

from __future__ import annotations

from pyctl.state.ratelimit import BucketLimit, SafetyLimits


def global_only(capacity: int, per_second: float) -> SafetyLimits:
    return SafetyLimits(
        global_bucket=BucketLimit(capacity, per_second),
        node_bucket=None,
        namespace_bucket=None,
        workload_bucket=None,
        node_cooldown_seconds=0,
        disruptions_per_hour=None,
    )
