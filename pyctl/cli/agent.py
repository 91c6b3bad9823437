"""`pyctl agent`: the node's own view from NVML and sysfs (docs/agent.md).

pyctl agent --once [--json]
    read the node once and print it: per GPU the UUID, PCI ids, catalog model, NUMA node (sysfs;
    -1 is unknown), MIG mode and live instances, NVLink, fabric clique, every profile's possible
    placements, and where pyctl's MIG catalog disagrees with the device
pyctl agent [--interval S] [--metrics-port P] [--kubeconfig PATH | --in-cluster] [--node NAME]
    read every S seconds and publish: the metrics on /metrics (with /healthz and /readyz) and,
    with a cluster, the annotation pyctl.io/node-topology on this node (only this one)

Only reads: nothing on the device is changed. `--nvml-fixture FILE` (or PYCTL_AGENT_NVML_FIXTURE)
answers from a captured-device file instead of NVML: for tests only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Final

from pyctl.agent.kubelet import KUBELET_SOCKET
from pyctl.agent.nvml import NvmlError
from pyctl.app.agent import AgentOptions, read_once, run_agent
from pyctl.cli.errors import UserError
from pyctl.jsontypes import JsonObject, JsonValue, as_list, as_object
from pyctl.log import setup_logging

FIXTURE_ENV = "PYCTL_AGENT_NVML_FIXTURE"
#: NVML could not be read (no driver, no library): one line on stderr
EXIT_NO_NVML = 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "agent",
        help="the node's own view from NVML and sysfs (read-only)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--once", action="store_true", help="read once, print, exit")
    p.add_argument("--json", action="store_true", help="with --once: print JSON")
    p.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node's name (env NODE_NAME)"
    )
    p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted (default /sys)")
    p.add_argument(
        "--pod-resources-socket",
        default=KUBELET_SOCKET,
        help=f"the kubelet's PodResources socket (default {KUBELET_SOCKET}; '' : not read)",
    )
    p.add_argument(
        "--kubeconfig", help="publish the node's topology annotation through this kubeconfig"
    )
    p.add_argument(
        "--in-cluster",
        action="store_true",
        help="publish through the pod's service account (the DaemonSet)",
    )
    p.add_argument("--interval", type=float, default=60.0, help="seconds between reads")
    p.add_argument("--metrics-host", default="0.0.0.0", help="address of /metrics")
    p.add_argument("--metrics-port", type=int, default=9465, help="port of /metrics (0: none)")
    p.add_argument(
        "--nvml-fixture",
        default=os.environ.get(FIXTURE_ENV),
        help=f"for tests only: a captured-device file instead of NVML (env {FIXTURE_ENV})",
    )
    p.set_defaults(handler=_agent)


def _options(args: argparse.Namespace) -> AgentOptions:
    if not args.interval > 0:
        raise UserError(f"--interval must be above 0 (got {args.interval})")
    if args.kubeconfig and args.in_cluster:
        raise UserError("give --kubeconfig or --in-cluster, not both")
    if (args.kubeconfig or args.in_cluster) and not args.node:
        raise UserError("publishing needs the node's name: --node or NODE_NAME")
    if not 0 <= args.metrics_port <= 65535:
        raise UserError(f"--metrics-port must be 0..65535 (got {args.metrics_port})")
    return AgentOptions(
        node=args.node,
        sysfs_root=Path(args.sysfs_root),
        interval=args.interval,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port or None,
        nvml_fixture=Path(args.nvml_fixture) if args.nvml_fixture else None,
        pod_resources_socket=Path(args.pod_resources_socket) if args.pod_resources_socket else None,
    )


def _agent(args: argparse.Namespace) -> int:
    opts = _options(args)
    if not args.once:
        setup_logging()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(run_agent(opts, args.kubeconfig, args.in_cluster))
        return 0
    try:
        doc = asyncio.run(read_once(opts))
    except NvmlError as e:
        print(f"pyctl: error: NVML: {e}", file=sys.stderr)
        return EXIT_NO_NVML
    except (OSError, ValueError) as e:
        raise UserError(f"--nvml-fixture: {e}") from None
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print(doc)
    return 0


_MIG: Final[dict[bool | None, str]] = {None: "not supported", True: "enabled", False: "disabled"}


def _mig(value: JsonValue) -> str:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"MIG mode: {value!r}")
    return _MIG[value]


def _print(doc: JsonObject) -> None:
    """The agent's view (`pyctl.agent.view.view_json`) as text; `ValueError` when `doc` is not
    one."""
    gpus = [as_object(g, "gpus") for g in as_list(doc["gpus"], "gpus")]
    print(f"driver {doc['driver']}, NVML {doc['nvml_version']}, {len(gpus)} GPU(s)")
    for g in gpus:
        numa = as_object(g["numa"], "numa")
        where = f"NUMA node {numa['node']}" if numa["node"] is not None else "NUMA node unknown"
        where += f" ({numa['source']})"
        if numa.get("local_cpulist"):
            where += f"; local_cpulist {numa['local_cpulist']}"
        print(
            f"GPU {g['index']} {g['name']} {g['uuid']} bus {g['pci_bus_id']} "
            f"model {g['model'] or '(not in the MIG catalog)'}"
        )
        print(f"  {where}")
        print(f"  MIG {_mig(g['mig_current'])} (pending: {_mig(g['mig_pending'])})")
        if g["clique"]:
            print(f"  fabric clique {g['clique']}")
        if g["nvlink_active_links"] is not None:
            print(
                f"  NVLink: {g['nvlink_active_links']} active link(s), "
                f"{g['nvlink_switch_links']} to NVSwitch, peers {g['nvlink_peers']}, "
                f"P2P over NVLink {g['p2p_nvlink_peers']}"
            )
        for pv in as_list(g["profiles"], "profiles"):
            p = as_object(pv, "profiles")
            starts = ",".join(
                str(as_list(x, "placements")[0]) for x in as_list(p["placements"], "placements")
            )
            size = p["memory_slices"] if p["memory_slices"] is not None else "?"
            print(f"  profile {p['id']:>2} {p['name']:<12} {{{starts}}}:{size}")
        for iv in as_list(g["gpu_instances"], "gpu_instances"):
            i = as_object(iv, "gpu_instances")
            print(f"  instance {i['id']} {i['profile']} at {i['start']}:{i['size']}")
        if g["not_supported"]:
            unsupported = as_list(g["not_supported"], "not_supported")
            print(f"  not supported: {', '.join(map(str, unsupported))}")
        for dv in as_list(g["disagreements"], "disagreements"):
            d = as_object(dv, "disagreements")
            print(
                f"  catalog disagrees, profile {d['profile_id']} {d['what']}: "
                f"device {d['device']}, catalog {d['catalog']} (the device wins)"
            )
    for fv in as_list(doc["failed"], "failed"):
        f = as_object(fv, "failed")
        print(f"GPU {f['index']} left out: {f['reason']}")
    pr = doc.get("pod_resources")
    if isinstance(pr, dict) and "error" in pr:
        print(f"PodResources: {pr['error']}")
    elif pr is not None:
        for cv in as_list(as_object(pr, "pod_resources")["containers"], "containers"):
            c = as_object(cv, "containers")
            for dv in as_list(c["devices"], "devices"):
                d = as_object(dv, "devices")
                gpu = f"GPU {d['gpu_index']}" if d["gpu_index"] is not None else d["unresolved"]
                where = f"{c['namespace']}/{c['pod']}/{c['container']}"
                print(f"{where}: {d['source']} {d['id']} -> {gpu}")
    if doc["nvlink_groups"]:
        print(f"NVLink groups: {doc['nvlink_groups']}")
