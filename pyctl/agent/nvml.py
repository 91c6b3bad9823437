"""The agent's view of NVML: a small typed protocol (`Nvml`), the real implementation over the
official bindings nvidia-ml-py (`PynvmlBackend`, import name `pynvml`; the optional extra
`pyctl[agent]`), and the error type both raise.

Every call here only reads: nothing creates, destroys or changes an instance, a mode or a clock.
An NVML failure is an `NvmlError` carrying NVML's return code; `not_supported` tells the one
answer that is recorded rather than treated as a failure (NVML_ERROR_NOT_SUPPORTED).
The test double driven by captured devices is `pyctl.agent.fixture.FixtureNvml`.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass
from typing import Any, Final, Protocol

#: NVML return codes (nvml.h `nvmlReturn_t`, the same numbers pynvml exports)
INVALID_ARGUMENT: Final = 2
NOT_SUPPORTED: Final = 3
NO_PERMISSION: Final = 4
NOT_FOUND: Final = 6
LIBRARY_NOT_FOUND: Final = 12
GPU_IS_LOST: Final = 15
UNKNOWN: Final = 999

#: NVML's names of its return codes (as `NVMLError.__str__` prints them)
ERROR_NAMES: Final[dict[int, str]] = {
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    NOT_FOUND: "Not Found",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    GPU_IS_LOST: "GPU is lost",
    UNKNOWN: "Unknown Error",
}

#: profile indexes NVML knows (pynvml NVML_GPU_INSTANCE_PROFILE_COUNT, nvml.h 13.x)
GPU_INSTANCE_PROFILE_COUNT: Final = 0x12
#: compute-instance profile indexes (NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
COMPUTE_INSTANCE_PROFILE_COUNT: Final = 0x9
#: NVLink links per GPU at most (NVML_NVLINK_MAX_LINKS)
NVLINK_MAX_LINKS: Final = 36
#: nvmlDeviceGetNvLinkRemoteDeviceType: the link's other end
NVLINK_REMOTE_GPU: Final = 0
NVLINK_REMOTE_SWITCH: Final = 2
#: nvmlDeviceGetGpuFabricInfo state: the GPU is registered with the fabric manager
FABRIC_STATE_COMPLETED: Final = 3
#: nvmlDeviceGetP2PStatus: the NVLink capability (NVML_P2P_CAPS_INDEX_NVLINK), and OK
P2P_CAPS_INDEX_NVLINK: Final = 2
P2P_STATUS_OK: Final = 0
#: the live instances one call lists at most (7 GPU instances of 8 memory slices, with room)
MAX_INSTANCES: Final = 64


class NvmlError(Exception):
    """An NVML call answered something other than success."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or ERROR_NAMES.get(code, f"NVML error {code}"))

    @property
    def not_supported(self) -> bool:
        return self.code == NOT_SUPPORTED


@dataclass(frozen=True, slots=True)
class Pci:
    #: as NVML prints it: 8 hex digits of domain ("00000000:00:06.0")
    bus_id: str
    #: the 32-bit PCI device id, device << 16 | vendor (0x233510DE)
    device_id: int


@dataclass(frozen=True, slots=True)
class Fabric:
    #: 32 hex digits
    cluster_uuid: str
    clique_id: int
    state: int
    #: an NVML return code: the fabric registration's own status
    status: int


@dataclass(frozen=True, slots=True)
class GiProfile:
    """nvmlGpuInstanceProfileInfo_v2_t, the fields the agent uses."""

    id: int
    #: compute (SM) slices
    slice_count: int
    #: instances at most (nvidia-smi's "Instances Total")
    instance_count: int
    multiprocessor_count: int
    memory_size_mb: int
    name: str


@dataclass(frozen=True, slots=True)
class Instance:
    """A live GPU instance (nvmlGpuInstanceInfo_t) or compute instance
    (nvmlComputeInstanceInfo_t): its id, profile id and placement."""

    id: int
    profile_id: int
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device (what the device plugin hands out under `nvidia.com/mig-*`): its UUID
    (`MIG-...`) and the GPU and compute instance it is."""

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int


class Nvml(Protocol):
    """What the agent reads from NVML. `Handle` is whatever the implementation uses."""

    def driver_version(self) -> str: ...
    def nvml_version(self) -> str: ...
    def device_count(self) -> int: ...
    def handle(self, index: int) -> object: ...
    def name(self, h: object) -> str: ...
    def uuid(self, h: object) -> str: ...
    def minor(self, h: object) -> int: ...
    def pci(self, h: object) -> Pci: ...
    def numa_node_id(self, h: object) -> int: ...
    def mig_mode(self, h: object) -> tuple[int, int]: ...
    def fabric(self, h: object) -> Fabric: ...
    def nvlink_state(self, h: object, link: int) -> int: ...
    def nvlink_remote_type(self, h: object, link: int) -> int: ...
    def nvlink_remote_bus_id(self, h: object, link: int) -> str: ...
    def p2p_nvlink_status(self, h: object, peer: object) -> int: ...
    def gi_profile(self, h: object, index: int) -> GiProfile: ...
    def gi_placements(self, h: object, profile_id: int) -> list[tuple[int, int]]: ...
    def gpu_instances(self, h: object, profile_id: int) -> list[Instance]: ...
    def compute_instances(self, h: object, gpu_instance_id: int) -> list[Instance]: ...
    def mig_devices(self, h: object) -> list[MigDevice]: ...
    def close(self) -> None: ...


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class PynvmlBackend:
    """`Nvml` over nvidia-ml-py. Initialises NVML on construction (`NvmlError` when the library or
    the driver is missing); `close()` shuts it down. Each method is one read-only NVML call
    (or, for the lists, the calls that fill one list)."""

    def __init__(self) -> None:
        try:
            self.nv: Any = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlError(
                LIBRARY_NOT_FOUND,
                "nvidia-ml-py is not installed (pip install 'pyctl[agent]')",
            ) from None
        self._guard(self.nv.nvmlInit)

    def _guard(self, fn: Any, *args: Any) -> Any:
        nv = self.nv
        try:
            return fn(*args)
        except nv.NVMLError as e:
            raise NvmlError(int(e.value), str(e)) from None

    def close(self) -> None:
        nv = self.nv
        self._guard(nv.nvmlShutdown)

    def driver_version(self) -> str:
        nv = self.nv
        return _text(self._guard(nv.nvmlSystemGetDriverVersion))

    def nvml_version(self) -> str:
        nv = self.nv
        return _text(self._guard(nv.nvmlSystemGetNVMLVersion))

    def device_count(self) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetCount))

    def handle(self, index: int) -> object:
        nv = self.nv
        return self._guard(nv.nvmlDeviceGetHandleByIndex, index)

    def name(self, h: object) -> str:
        nv = self.nv
        return _text(self._guard(nv.nvmlDeviceGetName, h))

    def uuid(self, h: object) -> str:
        nv = self.nv
        return _text(self._guard(nv.nvmlDeviceGetUUID, h))

    def minor(self, h: object) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetMinorNumber, h))

    def pci(self, h: object) -> Pci:
        nv = self.nv
        info = self._guard(nv.nvmlDeviceGetPciInfo, h)
        return Pci(bus_id=_text(info.busId), device_id=int(info.pciDeviceId))

    def numa_node_id(self, h: object) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetNumaNodeId, h))

    def mig_mode(self, h: object) -> tuple[int, int]:
        nv = self.nv
        current, pending = self._guard(nv.nvmlDeviceGetMigMode, h)
        return int(current), int(pending)

    def fabric(self, h: object) -> Fabric:
        nv = self.nv
        info = nv.c_nvmlGpuFabricInfo_t()
        self._guard(nv.nvmlDeviceGetGpuFabricInfo, h, ctypes.byref(info))
        return Fabric(
            cluster_uuid=bytes(info.clusterUuid).hex(),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
        )

    def nvlink_state(self, h: object, link: int) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetNvLinkState, h, link))

    def nvlink_remote_type(self, h: object, link: int) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link))

    def nvlink_remote_bus_id(self, h: object, link: int) -> str:
        nv = self.nv
        return _text(self._guard(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link).busId)

    def p2p_nvlink_status(self, h: object, peer: object) -> int:
        nv = self.nv
        return int(self._guard(nv.nvmlDeviceGetP2PStatus, h, peer, P2P_CAPS_INDEX_NVLINK))

    def gi_profile(self, h: object, index: int) -> GiProfile:
        nv = self.nv
        info = self._guard(nv.nvmlDeviceGetGpuInstanceProfileInfo, h, index)
        return GiProfile(
            id=int(info.id),
            slice_count=int(info.sliceCount),
            instance_count=int(info.instanceCount),
            multiprocessor_count=int(info.multiprocessorCount),
            memory_size_mb=int(info.memorySizeMB),
            name=_text(info.name),
        )

    def gi_placements(self, h: object, profile_id: int) -> list[tuple[int, int]]:
        nv = self.nv
        count = ctypes.c_uint(0)
        # NULL placements: NVML answers how many there are
        self._guard(
            nv.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, None, ctypes.byref(count)
        )
        n = min(count.value, MAX_INSTANCES)
        buf = (nv.c_nvmlGpuInstancePlacement_t * max(n, 1))()
        count = ctypes.c_uint(n)
        self._guard(
            nv.nvmlDeviceGetGpuInstancePossiblePlacements, h, profile_id, buf, ctypes.byref(count)
        )
        return [(int(buf[i].start), int(buf[i].size)) for i in range(min(count.value, n))]

    def gpu_instances(self, h: object, profile_id: int) -> list[Instance]:
        nv = self.nv
        buf = (nv.c_nvmlGpuInstance_t * MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        self._guard(nv.nvmlDeviceGetGpuInstances, h, profile_id, buf, ctypes.byref(count))
        out = []
        for i in range(min(count.value, MAX_INSTANCES)):
            info = self._guard(nv.nvmlGpuInstanceGetInfo, buf[i])
            out.append(
                Instance(
                    id=int(info.id),
                    profile_id=int(info.profileId),
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                )
            )
        return out

    def compute_instances(self, h: object, gpu_instance_id: int) -> list[Instance]:
        nv = self.nv
        gi = self._guard(nv.nvmlDeviceGetGpuInstanceById, h, gpu_instance_id)
        out: list[Instance] = []
        for index in range(COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                prof = self._guard(
                    nv.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                    gi,
                    index,
                    nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
            except NvmlError as e:
                if e.code in (NOT_SUPPORTED, INVALID_ARGUMENT):
                    continue  # a profile this GPU instance cannot hold
                raise
            buf = (nv.c_nvmlComputeInstance_t * MAX_INSTANCES)()
            count = ctypes.c_uint(0)
            self._guard(
                nv.nvmlGpuInstanceGetComputeInstances, gi, prof.id, buf, ctypes.byref(count)
            )
            for i in range(min(count.value, MAX_INSTANCES)):
                info = self._guard(nv.nvmlComputeInstanceGetInfo, buf[i])
                out.append(
                    Instance(
                        id=int(info.id),
                        profile_id=int(info.profileId),
                        start=int(info.placement.start),
                        size=int(info.placement.size),
                    )
                )
        return out

    def mig_devices(self, h: object) -> list[MigDevice]:
        nv = self.nv
        count = int(self._guard(nv.nvmlDeviceGetMaxMigDeviceCount, h))
        out = []
        for i in range(min(count, MAX_INSTANCES)):
            try:
                mh = self._guard(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
            except NvmlError as e:
                if e.code in (NOT_FOUND, INVALID_ARGUMENT):
                    continue  # no MIG device at this index
                raise
            out.append(
                MigDevice(
                    uuid=_text(self._guard(nv.nvmlDeviceGetUUID, mh)),
                    gpu_instance_id=int(self._guard(nv.nvmlDeviceGetGpuInstanceId, mh)),
                    compute_instance_id=int(self._guard(nv.nvmlDeviceGetComputeInstanceId, mh)),
                )
            )
        return out
