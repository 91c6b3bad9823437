"""The DRA steering loop: keeps pyctl's DeviceTaintRules equal to what `dra_taints.steering_rules`
wants for the current view (docs/dra.md), at a bounded rate. Only the Lease holder acts, every
create and delete through the gate (observe mode: dry run); where the API server does not serve
DeviceTaintRules nothing is applied and that is said once (`pyctl plan` shows the rules)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyctl.controller.reconcile import Reconciler
from pyctl.workflows.dra_taints import TaintRule, steering_rules
from pyctl.workflows.gate import Gate
from pyctl.workflows.loop import DRA_STEERING_PHASE, WORKFLOW_INTERVAL, run_every

log = logging.getLogger("pyctl.dra_steering")


class DraSteering:
    def __init__(
        self, reconciler: Reconciler, gate: Gate, interval: float = WORKFLOW_INTERVAL
    ) -> None:
        self.reconciler = reconciler
        self.gate = gate
        self.interval = interval
        self.desired: list[TaintRule] = []
        #: whether the API server serves DeviceTaintRules (None: not asked yet)
        self.served: bool | None = None
        #: rules created and deleted by this replica
        self.created = 0
        self.deleted = 0

    def plan(self) -> list[TaintRule]:
        r = self.reconciler
        self.desired = steering_rules(r.models, r.dra_models, r.workload)
        return self.desired

    async def tick(self, leader: bool) -> None:
        desired = {t.name: t for t in self.plan()}
        if not leader:
            return
        current = await self.gate.device_taint_rules()
        if current is None:
            if self.served is not False:
                log.info(
                    "the API server does not serve DeviceTaintRules: DRA steering only planned",
                    extra={"rules": len(desired)},
                )
            self.served = False
            return
        self.served = True
        for name, rule in sorted(desired.items()):
            if name not in current:
                got = await self.gate.device_taint_rule(rule.manifest(), on=True)
                if got.outcome == "done":
                    self.created += 1
                    log.info("DeviceTaintRule created", extra={"rule": name, "why": rule.why})
        for name, manifest in sorted(current.items()):
            if name not in desired and name.startswith("pyctl-steer-"):
                got = await self.gate.device_taint_rule(manifest, on=False)
                if got.outcome == "done":
                    self.deleted += 1

    async def run(self, leader: Callable[[], bool]) -> None:
        await run_every(self.interval, self.tick, leader, "DRA steering", DRA_STEERING_PHASE)
