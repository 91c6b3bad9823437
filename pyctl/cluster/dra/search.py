"""Admission (`allocate`): whether the scheduler's allocator could allocate claims on a node
now, by a search over the node's devices as the allocator does it (requests in order, devices in
slice order, selectors, taints and tolerations, devices in use, counters, consumable capacity,
matchAttribute/distinctAttribute with list attributes as sets), bounded in steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.claims import Catalogue, Unknown, effective, request_matches
from pyctl.cluster.dra.devices import DeviceId, DeviceView
from pyctl.cluster.dra.node import NodeDevices
from pyctl.cluster.dra_records import ClaimSpec, DeviceToleration, Request

#: steps of the allocation search before it gives up ("unknown")
SEARCH_STEPS: Final = 20_000


def _tolerates(t: DeviceToleration, key: str, value: str, effect: str) -> bool:
    if t.effect and t.effect != effect:
        return False
    if t.key and t.key != key:
        return False
    if t.operator == "Exists":
        return True
    return t.value == value


def taint_blocks(d: DeviceView, req: Request) -> bool:
    """A NoSchedule/NoExecute taint of the device that the request does not tolerate."""
    for t in d.device.taints:
        if t.effect in ("NoSchedule", "NoExecute") and not any(
            _tolerates(tol, t.key, t.value, t.effect) for tol in req.tolerations
        ):
            return True
    return False


def _attr_set(d: DeviceView, name: str) -> frozenset[tuple[str, Any]] | None:
    v = d.attribute(name)
    if v is None:
        return None
    vals = v if isinstance(v, list) else [v]
    return frozenset((type(x).__name__, x) for x in vals)


@dataclass
class AllocationResult:
    ok: bool | None  # None: unknown
    devices: list[tuple[int, str, DeviceView]] = field(default_factory=list)
    reason: str = ""


def allocate(
    specs: Sequence[tuple[str, ClaimSpec]],
    nd: NodeDevices,
    cat: Catalogue,
    steps: int = SEARCH_STEPS,
    extra_in_use: Iterable[DeviceId] = (),
) -> AllocationResult:
    """Whether the scheduler's allocator could allocate these claims (`(name, spec)`) on the
    node now, and with which devices (the first solution in its order: requests in order,
    devices in slice order)."""
    taken = {d.id for d in nd.devices if nd.in_use(d) and not d.shared}
    taken |= set(extra_in_use)
    used = nd.counters_used()
    # shared devices: what their allocations consume, and which ones already hold shares (a
    # further share does not charge the device's counters again, as in the allocator)
    cap_used = {d.id: nd.capacity_used(d) for d in nd.devices if d.shared}
    sharing = {d.id for d in nd.devices if d.shared and nd.in_use(d)}
    capacity = {
        (drv, pool, cs, c): v
        for (drv, pool, cs), cnt in nd.counter_sets.items()
        for c, v in cnt.items()
    }
    # slots: one per device to allocate
    slots: list[tuple[int, Request, list[DeviceView]]] = []
    try:
        for ci, (name, spec) in enumerate(specs):
            for raw in spec.requests:
                req = effective(raw)
                cls = cat.classes.get(req.class_name)
                cands = [
                    d
                    for d in nd.devices
                    if request_matches(req, cls, d, name) and not taint_blocks(d, req)
                ]
                if req.mode == "All":
                    if any(d.id in taken for d in cands) and not req.admin_access:
                        return AllocationResult(
                            False, reason=f"{name}: request {req.name}: a device is in use"
                        )
                    count = len(cands)
                else:
                    count = req.count
                for _ in range(count):
                    slots.append((ci, req, cands))
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    # constraints per claim: (requests or None, attribute, match?)
    constraints = [
        [
            (
                {r.split("/")[0] for r in c.requests} or None,
                c.match_attribute or c.distinct_attribute,
                bool(c.match_attribute),
            )
            for c in spec.constraints
            if c.match_attribute or c.distinct_attribute
        ]
        for _, spec in specs
    ]
    chosen: list[tuple[int, str, DeviceView]] = []
    state: dict[tuple[int, int], Any] = {}
    budget = [steps]

    def fits_counters(d: DeviceView) -> bool:
        if d.id in sharing:
            return True
        for (cs, c), v in d.consumes.items():
            key = (d.id.driver, d.id.pool, cs, c)
            if key not in capacity or used[key] + v > capacity[key]:
                return False
        return True

    def search(i: int) -> bool:
        if i == len(slots):
            return True
        ci, req, cands = slots[i]
        base = req.name.split("/")[0]
        for d in cands:
            budget[0] -= 1
            if budget[0] < 0:
                raise Unknown("the allocation search ran out of steps")
            if not req.admin_access and (d.id in taken or not fits_counters(d)):
                continue
            if not d.shared and any(d.id == x.id for _, _, x in chosen):
                continue
            need: dict[str, Fraction] = {}
            if d.caps and (req.capacity or d.shared):
                # the capacity check the allocator makes of every device it tries
                got = dc.consumed(d.caps, req.capacity)
                if got is None or not dc.fits(d.caps, cap_used.get(d.id, {}), got):
                    continue
                if d.shared and not req.admin_access:
                    need = got
            saved = []
            ok = True
            for k, (reqs, attr, match) in enumerate(constraints[ci]):
                if reqs is not None and base not in reqs:
                    continue
                vals = _attr_set(d, attr)
                cur = state.get((ci, k))
                if vals is None:
                    ok = False
                    break
                if match:
                    new = vals if cur is None else cur & vals
                    if not new:
                        ok = False
                        break
                else:
                    if cur is not None and cur & vals:
                        ok = False
                        break
                    new = vals if cur is None else cur | vals
                saved.append(((ci, k), cur))
                state[(ci, k)] = new
            if ok:
                charge = not req.admin_access and d.id not in sharing
                if charge:
                    for (cs, c), v in d.consumes.items():
                        used[(d.id.driver, d.id.pool, cs, c)] += v
                if not req.admin_access:
                    if d.shared:
                        sharing.add(d.id)
                        held = cap_used.setdefault(d.id, {})
                        for n, v in need.items():
                            held[n] = held.get(n, Fraction(0)) + v
                    else:
                        taken.add(d.id)
                chosen.append((ci, req.name, d))
                if search(i + 1):
                    return True
                chosen.pop()
                if not req.admin_access:
                    if d.shared:
                        held = cap_used[d.id]
                        for n, v in need.items():
                            held[n] -= v
                        if charge:
                            sharing.discard(d.id)
                    else:
                        taken.discard(d.id)
                if charge:
                    for (cs, c), v in d.consumes.items():
                        used[(d.id.driver, d.id.pool, cs, c)] -= v
            for key, cur in reversed(saved):
                if cur is None:
                    state.pop(key, None)
                else:
                    state[key] = cur
        return False

    try:
        if search(0):
            return AllocationResult(True, list(chosen))
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    except RecursionError:
        return AllocationResult(None, reason="the allocation search is too deep")
    names = ", ".join(n for n, _ in specs)
    return AllocationResult(
        False, reason=f"{names}: no devices of node {nd.node} satisfy the claim"
    )
