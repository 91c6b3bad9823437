"""Device taints for DRA (DeviceTaintRule, `resource.k8s.io/v1`, GA in Kubernetes 1.37; used only
where the API server serves it).

- **Steering**: on a DynamicMIG GPU the scheduler's allocator takes the first free placement of a
  profile in the driver's device order, with no thought for the memory slices it strands. For each
  MIG profile the workload M asks through DRA, pyctl scores every free placement on every dynamic
  GPU (the fragment of the node after allocating it, the core's measure) and taints the placements
  that would strand more than the best one (`NoSchedule`, key `pyctl.io/strands-mig-slices`): the
  allocator then skips them, and picks a placement that leaves the slices usable.

Rules are named after the device (`pyctl-<purpose>-<pool>-<device>`) and labelled
`app.kubernetes.io/managed-by: pyctl`; `desired_rules` is the whole set, so applying it is a
reconcile (create what is missing, delete what is no longer wanted). Where DeviceTaintRules are
not served, `pyctl plan` prints what it would do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pyctl.cluster.dra.devices import placement_start
from pyctl.cluster.dra.zones import DraModel, ModelGpu
from pyctl.core.fragmentation import FragmentationModel
from pyctl.model import Node, Snapshot, Workload

STEER_KEY: Final = "pyctl.io/strands-mig-slices"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "pyctl"}


@dataclass(frozen=True)
class TaintRule:
    """One DeviceTaintRule: taint `device` of `driver`/`pool` with `key=value:NoSchedule`."""

    name: str
    driver: str
    pool: str
    device: str
    key: str
    value: str
    #: why, in words (pyctl plan, Events)
    why: str

    def manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {"name": self.name, "labels": dict(MANAGED_BY)},
            "spec": {
                "deviceSelector": {"driver": self.driver, "pool": self.pool, "device": self.device},
                "taint": {"key": self.key, "value": self.value, "effect": "NoSchedule"},
            },
        }


def rule_name(purpose: str, pool: str, device: str) -> str:
    name = f"pyctl-{purpose}-{pool}-{device}".lower()
    if len(name) > 200:  # a DNS subdomain: keep it short and unique
        name = f"pyctl-{purpose}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return name


def _mig_position(node: Node, dm: DraModel, g: ModelGpu) -> tuple[int, int] | None:
    """Where a DRA MIG GPU sits in the node's model (zone position, MIG position)."""
    zones = [z.numa for z in node.zones]
    if g.zone not in zones:
        return None
    zi = zones.index(g.zone)
    dyn = [m for m in dm.gpus if m.zone == g.zone and not m.whole]
    mig_dra = [mi for mi, m in enumerate(node.zones[zi].mig) if m.dra]
    k = dyn.index(g)
    return (zi, mig_dra[k]) if k < len(mig_dra) else None


def steering_rules(
    models: Mapping[str, Node], dra_models: Mapping[str, DraModel], workload: Workload
) -> list[TaintRule]:
    """The placements to taint so that the allocator picks placements that strand the fewest
    memory slices, for the DRA MIG profiles of the workload M."""
    profiles = sorted({s.mig_profile for s in workload.shapes if s.dra and s.mig_profile})
    if not profiles:
        return []
    out: list[TaintRule] = []
    for name in sorted(dra_models):
        dm, node = dra_models[name], models.get(name)
        if node is None:
            continue
        for g in dm.gpus:
            if not g.dynamic:
                continue
            pos = _mig_position(node, dm, g)
            if pos is None:
                continue
            zi, mi = pos
            for prof in profiles:
                scored: list[tuple[float, int]] = []
                starts = sorted(
                    {
                        s
                        for d in g.gpu.parts
                        if d.profile == prof and (s := placement_start(d)) is not None
                    }
                )
                for start in starts:
                    fm = FragmentationModel(Snapshot((node,)))
                    try:
                        fm.apply(name, {"mig_new": (zi, mi, prof, start)})
                    except ValueError:
                        continue  # not free now
                    after = fm.score(workload).nodes[0]
                    scored.append((after.fragment_mig_slices, start))
                if len(scored) < 2:
                    continue
                best = min(f for f, _ in scored)
                worse = {s for f, s in scored if f > best + 1e-9}
                for d in g.gpu.parts:
                    if d.profile == prof and placement_start(d) in worse:
                        out.append(
                            TaintRule(
                                rule_name("steer", d.id.pool, d.id.device),
                                d.id.driver,
                                d.id.pool,
                                d.id.device,
                                STEER_KEY,
                                prof,
                                f"{name} {g.gpu.key}: {prof} at memory slice "
                                f"{placement_start(d)} strands more slices than at another "
                                "free placement",
                            )
                        )
    return out


def describe(rules: Sequence[TaintRule], served: bool) -> list[str]:
    """What `pyctl plan` says about them."""
    if not rules:
        return []
    head = (
        "DeviceTaintRules pyctl would create (NoSchedule):"
        if served
        else "the API server does not serve DeviceTaintRules; where it does, pyctl would taint "
        "(NoSchedule):"
    )
    return [head] + [f"  {r.driver}/{r.pool}/{r.device} {r.key}={r.value}: {r.why}" for r in rules]
