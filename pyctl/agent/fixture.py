"""A test double of `Nvml` driven by a captured device file: for tests and for `pyctl agent
--nvml-fixture FILE` in tests only (never the agent's default).

The file is the format of `tests/data/gpu-probe/h200-nvml.json`, what nvidia-ml-py read on a real
H200: ``{"nvml_version", "driver", "devices": [{"index", "name", "uuid", "minor", "pci":
{"busId", "pciDeviceId"}, "numa_node_id", "mig_mode": {"current", "pending"}, "fabric":
{"clusterUuid", "cliqueId", "state", "status"}, "nvlink": [{"link", ...}],
"gpu_instance_profiles": [{"profile_index", "id", "sliceCount", "instanceCount",
"multiprocessorCount", "memorySizeMB", "name", "placements": [{"start", "size"}]}]}]}``.
Any value may instead be ``{"nvml_error": "Not Supported"}`` (NVML's name of the code): the call
reading it raises that error, as the real device did. Hand-written boards add, per device:
``"nvlink": [{"link", "state", "remote_type", "remote_bus_id"}]`` (a link missing from the list
answers Invalid Argument, as NVML does past a GPU's last link), ``"p2p_nvlink": {"<peer index>":
status}`` (a peer missing answers status 5, not supported) and ``"gpu_instances": [{"id",
"profile_id", "placement": {"start", "size"}, "compute_instances": [same]}]``.
"""

from __future__ import annotations

from typing import Any, Final

from pyctl.agent.nvml import (
    ERROR_NAMES,
    INVALID_ARGUMENT,
    NOT_FOUND,
    UNKNOWN,
    Fabric,
    GiProfile,
    Instance,
    MigDevice,
    NvmlError,
    Pci,
)
from pyctl.jsontypes import JsonObject, JsonValue

_CODES: Final = {name: code for code, name in ERROR_NAMES.items()}
#: nvmlDeviceGetP2PStatus: NVML_P2P_STATUS_NOT_SUPPORTED
_P2P_NOT_SUPPORTED: Final = 5


def _answer(value: Any) -> Any:
    """The captured value, or the captured error raised."""
    if isinstance(value, dict) and "nvml_error" in value:
        name = str(value["nvml_error"])
        raise NvmlError(_CODES.get(name, UNKNOWN), name)
    return value


def _list(value: JsonValue) -> list[JsonValue]:
    """A list as captured; anything else (absent included) lists nothing."""
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    v = _answer(value)
    if isinstance(v, str):
        return int(v, 0)
    if not isinstance(v, int) or isinstance(v, bool):
        raise NvmlError(UNKNOWN, f"fixture: {v!r} is not an integer")
    return v


class FixtureNvml:
    """`Nvml` answering from a captured (or hand-written) device file. A handle is the index."""

    def __init__(self, data: JsonObject) -> None:
        devices = data.get("devices")
        if not isinstance(devices, list):
            raise ValueError("fixture: 'devices' is not a list")
        self.data = data
        self.devices: list[JsonObject] = [d if isinstance(d, dict) else {} for d in devices]

    def _dev(self, h: object) -> JsonObject:
        if not isinstance(h, int) or not 0 <= h < len(self.devices):
            raise NvmlError(INVALID_ARGUMENT)
        return self.devices[h]

    def _field(self, h: object, key: str) -> Any:
        d = self._dev(h)
        if key not in d:
            raise NvmlError(UNKNOWN, f"fixture: device {h} has no {key!r}")
        return _answer(d[key])

    def close(self) -> None:
        return None

    def driver_version(self) -> str:
        return str(_answer(self.data.get("driver", "")))

    def nvml_version(self) -> str:
        return str(_answer(self.data.get("nvml_version", "")))

    def device_count(self) -> int:
        return len(self.devices)

    def handle(self, index: int) -> object:
        self._dev(index)
        return index

    def name(self, h: object) -> str:
        return str(self._field(h, "name"))

    def uuid(self, h: object) -> str:
        return str(self._field(h, "uuid"))

    def minor(self, h: object) -> int:
        return _int(self._field(h, "minor"))

    def pci(self, h: object) -> Pci:
        p = self._field(h, "pci")
        return Pci(bus_id=str(_answer(p["busId"])), device_id=_int(p["pciDeviceId"]))

    def numa_node_id(self, h: object) -> int:
        return _int(self._field(h, "numa_node_id"))

    def mig_mode(self, h: object) -> tuple[int, int]:
        m = self._field(h, "mig_mode")
        return _int(m["current"]), _int(m["pending"])

    def fabric(self, h: object) -> Fabric:
        f = self._field(h, "fabric")
        return Fabric(
            cluster_uuid=str(f["clusterUuid"]).lower(),
            clique_id=_int(f["cliqueId"]),
            state=_int(f["state"]),
            status=_int(f["status"]),
        )

    def _link(self, h: object, link: int) -> JsonObject:
        for entry in _list(self._dev(h).get("nvlink")):
            if isinstance(entry, dict) and entry.get("link") == link:
                return _answer(entry) if "nvml_error" in entry else entry
        raise NvmlError(INVALID_ARGUMENT)

    def nvlink_state(self, h: object, link: int) -> int:
        return _int(self._link(h, link).get("state", 0))

    def nvlink_remote_type(self, h: object, link: int) -> int:
        return _int(self._link(h, link).get("remote_type", 0))

    def nvlink_remote_bus_id(self, h: object, link: int) -> str:
        entry = self._link(h, link)
        if "remote_bus_id" not in entry:
            raise NvmlError(NOT_FOUND)
        return str(_answer(entry["remote_bus_id"]))

    def p2p_nvlink_status(self, h: object, peer: object) -> int:
        p2p = self._dev(h).get("p2p_nvlink")
        if not isinstance(p2p, dict):
            p2p = {}
        self._dev(peer)
        return _int(p2p.get(str(peer), _P2P_NOT_SUPPORTED))

    def _profiles(self, h: object) -> list[JsonObject]:
        return [p for p in _list(self._dev(h).get("gpu_instance_profiles")) if isinstance(p, dict)]

    def gi_profile(self, h: object, index: int) -> GiProfile:
        for p in self._profiles(h):
            if p.get("profile_index") == index:
                _answer(p)
                return GiProfile(
                    id=_int(p["id"]),
                    slice_count=_int(p["sliceCount"]),
                    instance_count=_int(p["instanceCount"]),
                    multiprocessor_count=_int(p["multiprocessorCount"]),
                    memory_size_mb=_int(p["memorySizeMB"]),
                    name=str(p["name"]),
                )
        raise NvmlError(INVALID_ARGUMENT)

    def gi_placements(self, h: object, profile_id: int) -> list[tuple[int, int]]:
        for p in self._profiles(h):
            if "nvml_error" not in p and p.get("id") == profile_id:
                places = _answer(p.get("placements", []))
                return [(_int(x["start"]), _int(x["size"])) for x in places]
        raise NvmlError(INVALID_ARGUMENT)

    def _instances(self, h: object) -> list[JsonObject]:
        return [g for g in _answer(self._dev(h).get("gpu_instances", [])) if isinstance(g, dict)]

    def gpu_instances(self, h: object, profile_id: int) -> list[Instance]:
        d = self._dev(h)
        mode = _answer(d.get("mig_mode", {"current": 0}))
        if not _int(mode.get("current", 0)):
            # NVML answers Not Supported on a GPU whose MIG mode is disabled
            raise NvmlError(_CODES["Not Supported"])
        return [_instance(g) for g in self._instances(h) if g.get("profile_id") == profile_id]

    def compute_instances(self, h: object, gpu_instance_id: int) -> list[Instance]:
        for g in self._instances(h):
            if g.get("id") == gpu_instance_id:
                return [_instance(c) for c in _answer(g.get("compute_instances", []))]
        raise NvmlError(NOT_FOUND)

    def mig_devices(self, h: object) -> list[MigDevice]:
        d = self._dev(h)
        mode = _answer(d.get("mig_mode", {"current": 0}))
        if not _int(mode.get("current", 0)):
            return []  # no MIG device on a GPU whose MIG mode is disabled
        return [
            MigDevice(str(m["uuid"]), _int(m["gpu_instance_id"]), _int(m["compute_instance_id"]))
            for m in _answer(d.get("mig_devices", []))
            if isinstance(m, dict)
        ]


def _instance(raw: JsonObject) -> Instance:
    place = _answer(raw["placement"])
    return Instance(
        id=_int(raw["id"]),
        profile_id=_int(raw["profile_id"]),
        start=_int(place["start"]),
        size=_int(place["size"]),
    )
