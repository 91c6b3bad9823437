"""pyctl's scheduler extender next to a real kube-scheduler on the local control plane: the shipped
KubeSchedulerConfiguration (deploy/scheduler/extender-config.yaml, rendered from the chart) made
to point at a local extender, and `LocalExtender`, which serves the extender in this process from
a controller's models and runs an extra kube-scheduler that asks it (the e2e tests)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

import yaml

from pyctl.controller.placement import PlacementAdvisor
from pyctl.controller.reconcile import Reconciler
from pyctl.core.policy import EXTENDER_WEIGHT
from pyctl.dev.control_plane import REPO, ControlPlane, ExtraScheduler
from pyctl.serve.extender import ExtenderHandler
from pyctl.serve.extender_server import ExtenderOptions, ExtenderServer

EXTENDER_CONFIG = REPO / "deploy" / "scheduler" / "extender-config.yaml"
#: the scheduler name the e2e tests' pods ask for
TEST_SCHEDULER = "pyctl-e2e"
#: so that a pod the extender turned down is retried within seconds, not minutes
RETRY_FLAGS = ("--pod-max-in-unschedulable-pods-duration=5s",)


#: the chart's `extender.mode: rank` (filter and prioritize at the chart's weight; the shipped
#: file is `choose`): what a test of that mode sets (tests/deploy/test_chart.py pins it to the
#: chart's rendering)
RANK_VERBS: dict[str, Any] = {
    "filterVerb": "filter",
    "prioritizeVerb": "prioritize",
    "weight": EXTENDER_WEIGHT,
}


def extender_config(
    url: str, scheduler_name: str | None = None, strict: bool = False, mode: str = "choose"
) -> dict[str, Any]:
    """The shipped configuration for a local scheduler: its extender at `url`, no leader
    election; `scheduler_name`: its profile's schedulerName (None: the shipped one). `strict`
    (tests): plain HTTP, extender errors not ignored (a broken extender fails the test) and a
    5 s timeout; otherwise the shipped HTTPS, ignorable and timeout settings stay. `mode`: the
    chart's `extender.mode` (`choose`, shipped, or `rank`)."""
    shipped: dict[str, Any] = yaml.safe_load(EXTENDER_CONFIG.read_text())
    for key in ("leaderElection", "apiVersion", "kind"):
        shipped.pop(key, None)
    if scheduler_name is not None:
        shipped["profiles"] = [{"schedulerName": scheduler_name}]
    (ext,) = shipped["extenders"]
    ext["urlPrefix"] = url
    if mode == "rank":
        ext.update(RANK_VERBS)
    elif mode != "choose":
        raise ValueError(f"extender mode {mode!r}: choose or rank")
    if strict:
        # the tests that need TLS set it themselves (test_extender_tls_e2e.py)
        ext["enableHTTPS"] = False
        ext.pop("tlsConfig", None)
        ext["ignorable"] = False
        ext["httpTimeout"] = "5s"
    return shipped


class LocalExtender:
    """pyctl's extender served in this process from `reconciler`'s models (the policy the
    deployed extender runs), and an extra kube-scheduler `name` whose profile `scheduler_name`
    asks it (strictly: see `extender_config`; the scheduler's pods read with the reflector's
    `rdma_resource`). `start()` serves the extender (or enter it as
    an async context manager); `scheduler.start()` when the test is ready; `stop()` stops both."""

    def __init__(
        self,
        plane: ControlPlane,
        reconciler: Reconciler,
        name: str,
        scheduler_name: str = TEST_SCHEDULER,
        flags: Sequence[str] = RETRY_FLAGS,
        mode: str = "choose",
        rdma_resource: str = "",
    ) -> None:
        self.plane = plane
        self.name = name
        self.scheduler_name = scheduler_name
        self.flags = tuple(flags)
        self.mode = mode
        self.server = ExtenderServer(
            lambda: ExtenderHandler(PlacementAdvisor.for_reconciler(reconciler), rdma_resource),
            ExtenderOptions(),
        )
        self._scheduler: ExtraScheduler | None = None

    @property
    def scheduler(self) -> ExtraScheduler:
        if self._scheduler is None:
            raise RuntimeError("LocalExtender: enter it first (the server's port names the URL)")
        return self._scheduler

    async def start(self) -> None:
        """Serve the extender, and make (not start) the scheduler that asks it."""
        port = await self.server.start()
        url = f"http://127.0.0.1:{port}/scheduler"
        self._scheduler = ExtraScheduler(
            self.plane,
            self.name,
            strict_config(url, self.scheduler_name, self.mode),
            list(self.flags),
        )

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.stop()
        await self.server.stop()

    async def __aenter__(self) -> LocalExtender:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def strict_config(
    url: str, scheduler_name: str = TEST_SCHEDULER, mode: str = "choose"
) -> dict[str, Any]:
    """`extender_config` as the e2e tests use it: their own scheduler name, strict."""
    return extender_config(url, scheduler_name, strict=True, mode=mode)
