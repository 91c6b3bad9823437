"""Admission (`allocate`): whether the scheduler's allocator could allocate claims on a node
now, by a search over the node's devices as the allocator does it (requests in order, devices in
slice order, selectors, taints and tolerations, devices in use, counters, consumable capacity,
matchAttribute/distinctAttribute with list attributes as sets), bounded in steps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final, TypeAlias

from pyctl.cluster.dra import capacity as dc
from pyctl.cluster.dra.claims import Catalogue, Unknown, effective, request_matches
from pyctl.cluster.dra.devices import DeviceId, DeviceView
from pyctl.cluster.dra.node import NodeDevices
from pyctl.cluster.dra_records import ClaimSpec, DeviceToleration, Request

#: steps of the allocation search before it gives up ("unknown")
SEARCH_STEPS: Final = 20_000

#: a counter of a node: (driver, pool, counter set, counter)
CounterKey: TypeAlias = tuple[str, str, str, str]
#: one device to allocate: the claim's index, its request, the devices the request may get
Slot: TypeAlias = tuple[int, Request, list[DeviceView]]
#: a claim's matchAttribute/distinctAttribute: the requests it covers (None: all of the
#: claim's), the attribute, whether the values must match (else be distinct)
Constraint: TypeAlias = tuple[set[str] | None, str, bool]
#: an attribute's values as a set (a list attribute is the set of its items), each with its type
AttrValues: TypeAlias = frozenset[tuple[str, int | bool | str]]


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


def _attr_set(d: DeviceView, name: str) -> AttrValues | None:
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
    try:
        slots = _slots(specs, nd, cat, taken)
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    if isinstance(slots, AllocationResult):
        return slots
    search = _Search.start(nd, taken, slots, _constraints(specs), steps)
    try:
        if search.search(0):
            return AllocationResult(True, list(search.chosen))
    except Unknown as e:
        return AllocationResult(None, reason=str(e))
    except RecursionError:
        return AllocationResult(None, reason="the allocation search is too deep")
    names = ", ".join(n for n, _ in specs)
    return AllocationResult(
        False, reason=f"{names}: no devices of node {nd.node} satisfy the claim"
    )


def _slots(
    specs: Sequence[tuple[str, ClaimSpec]], nd: NodeDevices, cat: Catalogue, taken: set[DeviceId]
) -> list[Slot] | AllocationResult:
    """One slot per device to allocate, in the allocator's order (claims, their requests, and
    `count` devices of each; in `All` mode, every device the request matches), each with the
    devices its request may get (selectors, taints); a failed result when a device an `All`
    request needs is in use; raises `Unknown`."""
    slots: list[Slot] = []
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
    return slots


def _constraints(specs: Sequence[tuple[str, ClaimSpec]]) -> list[list[Constraint]]:
    """Each claim's matchAttribute and distinctAttribute constraints."""
    return [
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


@dataclass
class _Search:
    """The allocator's depth-first search over the slots: what the allocation so far holds,
    changed as a device is taken and put back as the search backtracks."""

    slots: list[Slot]
    #: each claim's constraints
    constraints: list[list[Constraint]]
    #: devices no further request may get: in use or chosen (shared devices never are)
    taken: set[DeviceId]
    #: what the node's counters publish, and what is consumed of them
    capacity: dict[CounterKey, Fraction]
    used: defaultdict[CounterKey, Fraction]
    #: shared devices: what their allocations consume, and which ones already hold shares (a
    #: further share does not charge the device's counters again, as in the allocator)
    cap_used: dict[DeviceId, dict[str, Fraction]]
    sharing: set[DeviceId]
    #: steps left
    budget: int
    chosen: list[tuple[int, str, DeviceView]] = field(default_factory=list)
    #: (claim, constraint) -> the values the devices chosen for it leave possible (match) or
    #: have taken (distinct)
    state: dict[tuple[int, int], AttrValues] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        nd: NodeDevices,
        taken: set[DeviceId],
        slots: list[Slot],
        constraints: list[list[Constraint]],
        steps: int,
    ) -> _Search:
        capacity = {
            (drv, pool, cs, c): v
            for (drv, pool, cs), cnt in nd.counter_sets.items()
            for c, v in cnt.items()
        }
        return cls(
            slots,
            constraints,
            taken,
            capacity,
            defaultdict(Fraction, nd.counters_used()),
            {d.id: nd.capacity_used(d) for d in nd.devices if d.shared},
            {d.id for d in nd.devices if d.shared and nd.in_use(d)},
            steps,
        )

    def search(self, i: int) -> bool:
        """Whether slots `i`.. can be allocated after the choices so far; the first solution in
        the allocator's order is left in `chosen`. Raises `Unknown` when out of steps."""
        if i == len(self.slots):
            return True
        ci, req, cands = self.slots[i]
        for d in cands:
            self.budget -= 1
            if self.budget < 0:
                raise Unknown("the allocation search ran out of steps")
            need = self._admits(req, d)
            if need is None:
                continue
            ok, saved = self._constrain(ci, req, d)
            if ok:
                charge = self._take(req, d, need)
                self.chosen.append((ci, req.name, d))
                if self.search(i + 1):
                    return True
                self.chosen.pop()
                self._put_back(req, d, need, charge)
            self._restore(saved)
        return False

    def _fits_counters(self, d: DeviceView) -> bool:
        if d.id in self.sharing:
            return True
        for (cs, c), v in d.consumes.items():
            key = (d.id.driver, d.id.pool, cs, c)
            if key not in self.capacity or self.used[key] + v > self.capacity[key]:
                return False
        return True

    def _admits(self, req: Request, d: DeviceView) -> dict[str, Fraction] | None:
        """What the request would consume of device `d`'s capacities (empty unless `d` is
        shared), or None when it cannot get `d`: in use, over its counters, chosen already,
        or short of capacity."""
        if not req.admin_access and (d.id in self.taken or not self._fits_counters(d)):
            return None
        if not d.shared and any(d.id == x.id for _, _, x in self.chosen):
            return None
        need: dict[str, Fraction] = {}
        if d.caps and (req.capacity or d.shared):
            # the capacity check the allocator makes of every device it tries
            got = dc.consumed(d.caps, req.capacity)
            if got is None or not dc.fits(d.caps, self.cap_used.get(d.id, {}), got):
                return None
            if d.shared and not req.admin_access:
                need = got
        return need

    def _constrain(
        self, ci: int, req: Request, d: DeviceView
    ) -> tuple[bool, list[tuple[tuple[int, int], AttrValues | None]]]:
        """Device `d` for the request, in its claim's constraints: whether they still hold, and
        the values they had before (what `_restore` puts back, whether they hold or not)."""
        base = req.name.split("/")[0]
        saved: list[tuple[tuple[int, int], AttrValues | None]] = []
        for k, (reqs, attr, match) in enumerate(self.constraints[ci]):
            if reqs is not None and base not in reqs:
                continue
            vals = _attr_set(d, attr)
            cur = self.state.get((ci, k))
            if vals is None:
                return False, saved
            if match:
                new = vals if cur is None else cur & vals
                if not new:
                    return False, saved
            else:
                if cur is not None and cur & vals:
                    return False, saved
                new = vals if cur is None else cur | vals
            saved.append(((ci, k), cur))
            self.state[(ci, k)] = new
        return True, saved

    def _restore(self, saved: list[tuple[tuple[int, int], AttrValues | None]]) -> None:
        for key, cur in reversed(saved):
            if cur is None:
                self.state.pop(key, None)
            else:
                self.state[key] = cur

    def _take(self, req: Request, d: DeviceView, need: dict[str, Fraction]) -> bool:
        """Device `d` for the request: its counters consumed (unless it holds a share already),
        and it taken or, shared, its capacities consumed by `need`; whether its counters were
        charged (admin access takes nothing)."""
        charge = not req.admin_access and d.id not in self.sharing
        if charge:
            for (cs, c), v in d.consumes.items():
                self.used[(d.id.driver, d.id.pool, cs, c)] += v
        if not req.admin_access:
            if d.shared:
                self.sharing.add(d.id)
                held = self.cap_used.setdefault(d.id, {})
                for n, v in need.items():
                    held[n] = held.get(n, Fraction(0)) + v
            else:
                self.taken.add(d.id)
        return charge

    def _put_back(
        self, req: Request, d: DeviceView, need: dict[str, Fraction], charge: bool
    ) -> None:
        """Undo `_take`."""
        if not req.admin_access:
            if d.shared:
                held = self.cap_used[d.id]
                for n, v in need.items():
                    held[n] -= v
                if charge:
                    self.sharing.discard(d.id)
            else:
                self.taken.discard(d.id)
        if charge:
            for (cs, c), v in d.consumes.items():
                self.used[(d.id.driver, d.id.pool, cs, c)] -= v
