"""The kubelet's PodResources API v1 (gRPC on a unix socket): which devices each container
holds, with their NUMA topology, by device plugin and by DRA claim, attributed to this node's
GPUs exactly.

`read_pod_resources(socket)` calls `List` and `GetAllocatableResources` (the stubs generated
from the kubelet's own proto, `pyctl/agent/podresources/`); `attribute(...)` maps every device
to a GPU of the node's NVML view:

- device plugin (`nvidia.com/gpu`, ...): the device id is the GPU's UUID (the NVIDIA device
  plugin's default), `UUID::n` for a time-sliced replica, or the GPU's index (its `index`
  strategy); MIG device UUIDs are not resolved (the view does not read MIG device UUIDs yet);
- DRA (`gpu.nvidia.com`): the NVIDIA DRA driver names devices `gpu-<minor>` and
  `gpu-<minor>-mig-<profile>-<profile id>-<start>`: the GPU by its minor, and the MIG
  instance's profile id and placement start.

A device that maps to no GPU is kept as unresolved (it says why), never guessed; a NUMA id out of
bounds is dropped and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pyctl.agent.view import Gpu

if TYPE_CHECKING:  # grpcio and protobuf come with the extra `agent`: imported when used
    from pyctl.agent.podresources import api_pb2
from pyctl.cluster.bounds import MAX_ITEMS, MAX_NUMA_ID, MAX_TEXT_CHARS, MAX_VALUES
from pyctl.jsontypes import JsonObject, as_object, plain

KUBELET_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: the largest answer read (the kubelet's own server limit is 16 MiB as well)
MAX_MESSAGE_BYTES: Final = 16 << 20
NVIDIA_DRA_DRIVER: Final = "gpu.nvidia.com"
_DRA_GPU: Final = re.compile(r"^gpu-(\d{1,4})$")
_DRA_MIG: Final = re.compile(r"^gpu-(\d{1,4})-mig-[0-9a-z+]{1,32}-(\d{1,3})-(\d{1,2})$")
_REPLICA: Final = re.compile(r"^(.*)::\d{1,6}$")


class PodResourcesError(Exception):
    """The kubelet's socket could not be read."""


@dataclass(frozen=True, slots=True)
class Device:
    #: "device-plugin" or "dra"
    source: str
    #: the extended resource (device plugin) or the DRA driver
    resource: str
    #: the device id (device plugin) or the DRA device name
    id: str
    #: the NUMA nodes the kubelet gives (device plugin topology)
    numa: list[int] = field(default_factory=list)
    #: the GPU it is on, when known
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    #: a DRA MIG device: its GPU-instance profile id and placement start
    mig_profile_id: int | None = None
    mig_start: int | None = None
    #: why it maps to no GPU
    unresolved: str | None = None
    #: DRA: the claim, as namespace/name, and the pool
    claim: str | None = None
    pool: str | None = None


@dataclass(frozen=True, slots=True)
class Container:
    namespace: str
    pod: str
    container: str
    devices: list[Device]


@dataclass(slots=True)
class PodResources:
    containers: list[Container]
    #: the devices the kubelet can hand out (device plugins), with their NUMA nodes
    allocatable: list[Device]
    #: values left out: NUMA ids out of bounds, lists cut at their bound
    dropped: int = 0


def _text(s: str) -> str:
    return s[:MAX_TEXT_CHARS]


class _Resolver:
    def __init__(self, gpus: list[Gpu]) -> None:
        self.by_uuid = {g.uuid.lower(): g for g in gpus}
        self.by_index = {g.index: g for g in gpus}
        self.by_minor = {g.minor: g for g in gpus}
        #: MIG device UUID -> its GPU and GPU instance
        self.by_mig = {
            u.lower(): (g, gi) for g in gpus for gi in g.gpu_instances for u in gi.mig_devices
        }
        self.dropped = 0

    def numa(self, topology: api_pb2.TopologyInfo) -> list[int]:
        out = []
        for node in topology.nodes[:MAX_ITEMS]:
            if 0 <= node.ID <= MAX_NUMA_ID:
                out.append(int(node.ID))
            else:
                self.dropped += 1
        return sorted(set(out))

    def plugin(self, resource: str, device_id: str, numa: list[int]) -> Device:
        base = device_id
        m = _REPLICA.match(device_id)
        if m:
            base = m.group(1)
        g = self.by_uuid.get(base.lower())
        if g is None and base.isdecimal() and len(base) <= 4:
            g = self.by_index.get(int(base))
        profile = start = None
        if g is None and (mig := self.by_mig.get(base.lower())) is not None:
            g, gi = mig
            profile, start = gi.profile_id, gi.start
        why = None
        if g is None:
            why = (
                "a MIG device UUID that no live MIG device of this node has"
                if base.startswith("MIG-")
                else "no GPU of this node has this UUID or index"
            )
        return Device(
            "device-plugin",
            _text(resource),
            _text(device_id),
            numa,
            g.index if g else None,
            g.uuid if g else None,
            mig_profile_id=profile,
            mig_start=start,
            unresolved=why,
        )

    def dra(self, claim: str, r: api_pb2.ClaimResource) -> Device:
        g = None
        profile = start = None
        why: str | None = None
        if r.driver_name != NVIDIA_DRA_DRIVER:
            why = f"driver {r.driver_name[:64]!r} is not {NVIDIA_DRA_DRIVER}"
        elif m := _DRA_GPU.match(r.device_name):
            g = self.by_minor.get(int(m.group(1)))
        elif m := _DRA_MIG.match(r.device_name):
            g = self.by_minor.get(int(m.group(1)))
            profile, start = int(m.group(2)), int(m.group(3))
        else:
            why = "not a device name of the NVIDIA DRA driver (gpu-<minor>[-mig-...])"
        if g is None and why is None:
            why = "no GPU of this node has this minor number"
        return Device(
            "dra",
            _text(r.driver_name),
            _text(r.device_name),
            [],
            g.index if g else None,
            g.uuid if g else None,
            profile if g else None,
            start if g else None,
            why,
            claim,
            _text(r.pool_name),
        )


def attribute(
    listed: api_pb2.ListPodResourcesResponse,
    allocatable: api_pb2.AllocatableResourcesResponse,
    gpus: list[Gpu],
) -> PodResources:
    """Every container's devices, each attributed to a GPU of `gpus` or marked unresolved."""
    r = _Resolver(gpus)
    containers: list[Container] = []
    pods = listed.pod_resources
    if len(pods) > MAX_ITEMS:
        r.dropped += len(pods) - MAX_ITEMS
    for pod in pods[:MAX_ITEMS]:
        for c in pod.containers[:MAX_ITEMS]:
            devices: list[Device] = []
            for d in c.devices[:MAX_ITEMS]:
                numa = r.numa(d.topology)
                for dev_id in d.device_ids[:MAX_VALUES]:
                    devices.append(r.plugin(d.resource_name, dev_id, numa))
            for dyn in c.dynamic_resources[:MAX_ITEMS]:
                claim = _text(f"{dyn.claim_namespace}/{dyn.claim_name}")
                for cr in dyn.claim_resources[:MAX_ITEMS]:
                    devices.append(r.dra(claim, cr))
            if devices:
                containers.append(
                    Container(_text(pod.namespace), _text(pod.name), _text(c.name), devices)
                )
    alloc = []
    for d in allocatable.devices[:MAX_ITEMS]:
        numa = r.numa(d.topology)
        for dev_id in d.device_ids[:MAX_VALUES]:
            alloc.append(r.plugin(d.resource_name, dev_id, numa))
    return PodResources(containers, alloc, r.dropped)


async def read_pod_resources(
    socket: Path, deadline_s: float = 10.0
) -> tuple[api_pb2.ListPodResourcesResponse, api_pb2.AllocatableResourcesResponse]:
    """`List` and `GetAllocatableResources` from the kubelet's socket (each call given
    `deadline_s` seconds, as gRPC deadlines)."""
    if not await asyncio.to_thread(socket.exists):
        raise PodResourcesError(f"{socket}: no such socket (is the kubelet's directory mounted?)")
    import grpc

    from pyctl.agent.podresources import api_pb2, api_pb2_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=deadline_s)
            alloc = await stub.GetAllocatableResources(
                api_pb2.AllocatableResourcesRequest(), timeout=deadline_s
            )
    except grpc.aio.AioRpcError as e:
        raise PodResourcesError(f"{socket}: {e.code().name}: {e.details()}") from None
    return listed, alloc


def pod_resources_json(pr: PodResources) -> JsonObject:
    """The attribution as the agent prints and publishes it."""
    return as_object(plain(dataclasses.asdict(pr)), "the pod-resources attribution")
