"""Hand-written 8-GPU boards for the agent's NVML test double, in the capture's format
(`tests/data/gpu-probe/h200-nvml.json`, see `pyctl/agent/fixture.py`): each GPU is the captured
H200 with its own UUID, minor and PCI bus id, plus what the board adds (NVLink, P2P, fabric,
MIG mode and live instances). `sysfs(tree, board, numa)` writes the matching sysfs tree."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu-probe"
H200_CAPTURE = DATA / "h200-nvml.json"

#: nvmlDeviceGetNvLinkRemoteDeviceType
GPU, SWITCH = 0, 2


def capture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(H200_CAPTURE.read_text())
    return data


def bus_id(i: int) -> str:
    """NVML's form: 8 hex digits of domain."""
    return f"00000000:{0x18 + 0x10 * i:02X}:00.0"


def board(n: int = 8) -> dict[str, Any]:
    """`n` H200s, MIG off, no NVLink (links answer Not Supported), no fabric."""
    cap = capture()
    template = cap["devices"][0]
    devices = []
    for i in range(n):
        d = copy.deepcopy(template)
        d.update(index=i, minor=i, uuid=f"GPU-00000000-0000-0000-0000-00000000000{i}")
        d["pci"]["busId"] = bus_id(i)
        devices.append(d)
    return {**{k: v for k, v in cap.items() if k != "devices"}, "devices": devices}


def nvswitch(clique: int | None = None) -> dict[str, Any]:
    """HGX: every GPU's 18 links go to NVSwitches; P2P over NVLink between every pair."""
    b = board()
    for i, d in enumerate(b["devices"]):
        d["nvlink"] = [{"link": k, "state": 1, "remote_type": SWITCH} for k in range(18)]
        d["p2p_nvlink"] = {str(j): 0 for j in range(8) if j != i}
        if clique is not None:
            d["fabric"] = {
                "clusterUuid": "0123456789abcdef0123456789abcdef",
                "cliqueId": clique,
                "state": 3,
                "status": 0,
            }
    return b


def nvlink_pairs() -> dict[str, Any]:
    """NVLink bridges: GPU 2k and 2k+1 joined by 4 links each; P2P over NVLink within a pair."""
    b = board()
    for i, d in enumerate(b["devices"]):
        peer = i ^ 1
        d["nvlink"] = [
            {"link": k, "state": 1, "remote_type": GPU, "remote_bus_id": bus_id(peer)}
            for k in range(4)
        ] + [{"link": k, "state": 0} for k in range(4, 18)]
        d["p2p_nvlink"] = {str(peer): 0}
    return b


def mig_uuid(gpu_instance: int) -> str:
    """The MIG device UUID of GPU 0's GPU instance `gpu_instance` on `mig_board`."""
    return f"MIG-0a0b0c0d-0000-4000-8000-0000000000{gpu_instance:02d}"


def mig_board() -> dict[str, Any]:
    """GPU 0 in MIG mode with live instances; GPU 1 with MIG enabling pending (a reset away)."""
    b = board()
    g0 = b["devices"][0]
    g0["mig_mode"] = {"current": 1, "pending": 1}

    def gi(gid: int, profile: int, start: int, size: int, slices: int) -> dict[str, Any]:
        return {
            "id": gid,
            "profile_id": profile,
            "placement": {"start": start, "size": size},
            "compute_instances": [
                {"id": 0, "profile_id": 0, "placement": {"start": 0, "size": slices}}
            ],
        }

    g0["gpu_instances"] = [
        gi(1, 9, 4, 4, 3),  # 3g.71gb at slices 4-7
        gi(5, 14, 0, 2, 2),  # 2g.35gb at 0-1
        gi(13, 19, 3, 1, 1),  # 1g.18gb at 3
    ]
    # one MIG device per compute instance, as nvmlDeviceGetMigDeviceHandleByIndex lists them
    g0["mig_devices"] = [
        {"uuid": mig_uuid(gid), "gpu_instance_id": gid, "compute_instance_id": 0}
        for gid in (1, 5, 13)
    ]
    b["devices"][1]["mig_mode"] = {"current": 0, "pending": 1}
    return b


def sysfs(root: Path, b: dict[str, Any], numa: list[int]) -> Path:
    """A sysfs tree with each GPU's numa_node (one value per GPU) and local_cpulist."""
    for d, node in zip(b["devices"], numa, strict=True):
        dom, rest = d["pci"]["busId"].split(":", 1)
        dev = root / "bus" / "pci" / "devices" / f"{int(dom, 16):04x}:{rest.lower()}"
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "numa_node").write_text(f"{node}\n")
        (dev / "local_cpulist").write_text("0-15\n" if node <= 0 else "16-31\n")
    return root
