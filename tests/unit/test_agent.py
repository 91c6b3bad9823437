"""`pyctl.agent`: the node's view read through the NVML test double driven by the real H200
capture (tests/data/gpu-probe) and by hand-written 8-GPU boards, the sysfs NUMA rule, the catalog
check, isolation of one failing GPU, and the real pynvml adapter's surface."""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from pyctl.agent import nvml as n
from pyctl.agent.fixture import FixtureNvml
from pyctl.agent.sysfs import read_numa, sysfs_bus_id
from pyctl.agent.view import read_node, view_json
from pyctl.core import mig

from . import agent_boards as boards

#: `nvidia-smi mig -lgipp` of the captured H200, as it printed them
LGIPP = boards.DATA / "h200-nvidia-smi.txt"


def _lgipp() -> dict[int, list[tuple[int, int]]]:
    """The placements nvidia-smi printed ("Profile ID  9 Placements: {0,4}:4")."""
    out = {}
    for m in re.finditer(
        r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", LGIPP.read_text()
    ):
        size = int(m.group(3))
        out[int(m.group(1))] = [(int(s), size) for s in m.group(2).split(",")]
    return out


def _h200(tmp_path: Path) -> dict[str, Any]:
    cap = boards.capture()
    root = boards.sysfs(tmp_path / "sys", cap, [-1])
    return view_json(read_node(FixtureNvml(cap), root))


def test_h200_capture_reads_as_the_device_said(tmp_path: Path) -> None:
    view = _h200(tmp_path)
    assert view["v"] == 1
    assert (view["driver"], view["failed"]) == ("580.159.04", [])
    [gpu] = view["gpus"]
    assert gpu["model"] == "H200-141GB"
    assert gpu["pci_device_id"] == "0x233510DE"
    # sysfs says -1: unknown, never node 0; the CPU list only as a measure
    assert gpu["numa"]["node"] is None
    assert "numa_node=-1" in gpu["numa"]["source"]
    assert gpu["numa"]["local_cpulist"] == "0-15"
    assert (gpu["mig_current"], gpu["mig_pending"]) == (False, False)
    assert gpu["gpu_instances"] == []
    # Not Supported is recorded, not a failure
    assert gpu["not_supported"] == ["nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkState"]
    assert gpu["nvlink_active_links"] is None
    assert (gpu["clique"], gpu["nvlink_peers"], view["nvlink_groups"]) == (None, [], [])
    # the 7 profiles, with the placements nvidia-smi -lgipp printed on the same GPU
    got = {p["id"]: [tuple(x) for x in p["placements"]] for p in gpu["profiles"]}
    assert got == _lgipp()
    assert sorted(got) == [0, 5, 9, 14, 15, 19, 20]
    mib = {p["id"]: p["memory_mib"] for p in gpu["profiles"]}
    assert mib == {19: 16384, 20: 16384, 15: 33280, 14: 33280, 9: 71424, 5: 71424, 0: 143360}
    assert gpu["disagreements"] == []
    assert view["catalog_disagreements"] == 0


def test_h200_placements_equal_the_catalogs(tmp_path: Path) -> None:
    [gpu] = _h200(tmp_path)["gpus"]
    catalog = mig.model("H200-141GB")
    assert not catalog.placements_inferred  # captured, with its source
    device = {
        p["id"]: (p["name"], p["compute_slices"], p["max_count"], p["placements"])
        for p in gpu["profiles"]
    }
    want = {
        p.id: (p.name, p.compute_slices, p.max_count, [list(x) for x in p.placements])
        for p in catalog.profiles
    }
    assert device == want


def test_catalog_disagreements_are_reported_and_the_device_wins(tmp_path: Path) -> None:
    cap = boards.capture()
    profiles = cap["devices"][0]["gpu_instance_profiles"]
    three_g = next(p for p in profiles if p.get("id") == 9)
    three_g["placements"] = [{"start": 0, "size": 4}]
    three_g["instanceCount"] = 1
    # the device does not list 1g.35gb (profile index 9)
    profiles[:] = [p for p in profiles if p.get("id") != 15]
    root = boards.sysfs(tmp_path / "sys", cap, [-1])
    view: Any = view_json(read_node(FixtureNvml(cap), root))
    [gpu] = view["gpus"]
    got = {(d["profile_id"], d["what"]): (d["device"], d["catalog"]) for d in gpu["disagreements"]}
    assert got == {
        (9, "max_count"): (1, 2),
        (9, "placements"): ([[0, 4]], [[0, 4], [4, 4]]),
        (15, "profile missing on the device"): (None, "1g.35gb"),
    }
    # the device wins: the view lists what the device said
    assert next(p for p in gpu["profiles"] if p["id"] == 9)["placements"] == [[0, 4]]


def _board_view(tmp_path: Path, b: dict[str, Any], numa: list[int]) -> dict[str, Any]:
    root = boards.sysfs(tmp_path / "sys", b, numa)
    return view_json(read_node(FixtureNvml(b), root))


def test_nvswitch_board_is_one_nvlink_group_in_its_clique(tmp_path: Path) -> None:
    view = _board_view(tmp_path, boards.nvswitch(clique=7), [0] * 8)
    assert view["failed"] == []
    assert view["nvlink_groups"] == [list(range(8))]
    for g in view["gpus"]:
        assert (g["nvlink_active_links"], g["nvlink_switch_links"]) == (18, 18)
        assert g["nvlink_peers"] == []  # no direct GPU link: all go through the switches
        assert g["p2p_nvlink_peers"] == [j for j in range(8) if j != g["index"]]
        assert g["clique"] == "0123456789abcdef0123456789abcdef.7"


def test_nvlink_pairs_board(tmp_path: Path) -> None:
    view = _board_view(tmp_path, boards.nvlink_pairs(), [0] * 8)
    assert view["nvlink_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for g in view["gpus"]:
        assert (g["nvlink_active_links"], g["nvlink_switch_links"]) == (4, 0)
        assert g["nvlink_peers"] == [g["index"] ^ 1]
        assert g["p2p_nvlink_peers"] == [g["index"] ^ 1]
        assert g["clique"] is None  # fabric state 0: no fabric


def test_two_numa_nodes_board(tmp_path: Path) -> None:
    view = _board_view(tmp_path, boards.board(), [0, 0, 0, 0, 1, 1, 1, 1])
    got = [(g["index"], g["numa"]["node"], g["numa"]["local_cpulist"]) for g in view["gpus"]]
    assert got == [(i, i // 4, None) for i in range(8)]
    assert view["gpus"][5]["numa"]["source"] == "sysfs numa_node=1"


def test_mig_board_lists_live_instances_with_their_placements(tmp_path: Path) -> None:
    view = _board_view(tmp_path, boards.mig_board(), [0] * 8)
    g0, g1 = view["gpus"][0], view["gpus"][1]
    assert (g0["mig_current"], g0["mig_pending"]) == (True, True)
    got = [(i["id"], i["profile"], i["start"], i["size"]) for i in g0["gpu_instances"]]
    assert got == [(5, "2g.35gb", 0, 2), (13, "1g.18gb", 3, 1), (1, "3g.71gb", 4, 4)]
    assert [c["size"] for i in g0["gpu_instances"] for c in i["compute_instances"]] == [2, 1, 3]
    # each GPU instance's MIG devices (the device plugin's device ids for it)
    assert [i["mig_devices"] for i in g0["gpu_instances"]] == [
        [boards.mig_uuid(5)],
        [boards.mig_uuid(13)],
        [boards.mig_uuid(1)],
    ]
    assert (g1["mig_current"], g1["mig_pending"]) == (False, True)
    assert g1["gpu_instances"] == []
    assert view["catalog_disagreements"] == 0


def test_one_failing_gpu_is_isolated_and_the_others_are_unchanged(tmp_path: Path) -> None:
    good = boards.nvlink_pairs()
    bad = copy.deepcopy(good)
    bad["devices"][3]["uuid"] = {"nvml_error": "GPU is lost"}
    bad["devices"][5]["gpu_instance_profiles"][0] = {
        "profile_index": 0,
        "nvml_error": "Unknown Error",
    }
    numa = [0, 0, 0, 0, 1, 1, 1, 1]
    want = _board_view(tmp_path / "a", good, numa)
    got = _board_view(tmp_path / "b", bad, numa)
    assert got["failed"] == [
        {"index": 3, "reason": "NVML: GPU is lost"},
        {"index": 5, "reason": "NVML: Unknown Error"},
    ]
    keep = [g for g in want["gpus"] if g["index"] not in (3, 5)]
    # GPU 2 and 4 lose their (failed) pair peer from the P2P list, nothing else changes
    for g in keep:
        g["p2p_nvlink_peers"] = [p for p in g["p2p_nvlink_peers"] if p not in (3, 5)]
        g["nvlink_peers"] = [p for p in g["nvlink_peers"] if p not in (3, 5)]
    assert got["gpus"] == keep
    assert got["nvlink_groups"] == [[0, 1], [6, 7]]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("-1\n", "numa_node=-1"),
        ("garbage", "not a number"),
        ("5000", "outside 0..1023"),
        (None, "unreadable"),
    ],
)
def test_sysfs_numa_is_unknown_unless_the_kernel_says(
    tmp_path: Path, content: str | None, reason: str
) -> None:
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:3b:00.0"
    dev.mkdir(parents=True)
    if content is not None:
        (dev / "numa_node").write_text(content)
    numa = read_numa(tmp_path, "00000000:3B:00.0")
    assert numa.node is None
    assert reason in numa.source


def test_sysfs_bus_id() -> None:
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("0001:c1:00.1") == "0001:c1:00.1"
    for bad in ("", "3b:00.0", "0000:3b:00.9", "100000000:00:00.0", "../../etc:00:00.0"):
        with pytest.raises(ValueError, match="PCI"):
            sysfs_bus_id(bad)
    assert read_numa(Path("/nonexistent"), "../x").node is None


def _adapter_calls() -> set[str]:
    """Every `nv.<name>` the real adapter uses."""
    tree = ast.parse(inspect.getsource(n.PynvmlBackend))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "nv"
    }


def test_the_pynvml_adapter_calls_only_what_nvidia_ml_py_has() -> None:
    pynvml = importlib.import_module("pynvml")
    calls = _adapter_calls()
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in calls
    assert len(calls) > 20
    assert sorted(c for c in calls if not hasattr(pynvml, c)) == []
    # the numbers the agent relies on are pynvml's
    assert n.NOT_SUPPORTED == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert n.INVALID_ARGUMENT == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert n.LIBRARY_NOT_FOUND == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert n.GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert n.GPU_INSTANCE_PROFILE_COUNT == pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT
    assert n.COMPUTE_INSTANCE_PROFILE_COUNT == pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT
    assert n.NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS
    assert n.FABRIC_STATE_COMPLETED == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert n.P2P_CAPS_INDEX_NVLINK == pynvml.NVML_P2P_CAPS_INDEX_NVLINK
    assert n.NVLINK_REMOTE_SWITCH == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    for code, name in n.ERROR_NAMES.items():
        assert str(pynvml.NVMLError(code)) == name


def test_the_real_adapter_here(tmp_path: Path) -> None:
    """On this machine the real pynvml either finds no NVML (no driver: the error says so) or,
    on a GPU machine, reads the node without a failure."""
    error: n.NvmlError | None = None
    try:
        nv = n.PynvmlBackend()
    except n.NvmlError as e:
        error = e
    if error is not None:
        assert error.code in (n.LIBRARY_NOT_FOUND, 9), str(error)  # 9: driver not loaded
        return
    try:
        view = read_node(nv, Path("/sys"))
    finally:
        nv.close()
    assert view.failed == []
