"""Reading the clusters the commands take: pyctl's snapshot format, a kubectl dump, or (for
`kubectl pyctl`) one list of a live cluster. A dump and a live cluster are read one way, the
controller's (`pyctl.cluster.kube.dump`, `pyctl.controller.view`): an object the controller
leaves out is left out here, said in one line on stderr each; only a file that is not a dump
at all is refused."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pyctl.cli.errors import UserError, load_json, one_line
from pyctl.cluster.kube.dump import DumpError, Listed, is_dump, read_dump
from pyctl.cluster.kube.reflector import ReflectorOptions
from pyctl.controller.view import ListedView, left_out_line, view_of
from pyctl.model import Snapshot, Workload
from pyctl.snapshot import load_snapshot


def add_rdma_option(p: argparse.ArgumentParser) -> None:
    """`--rdma-resource`: the controller's `reflector_rdma_resource`, for a command that reads
    a dump or a live cluster."""
    p.add_argument(
        "--rdma-resource",
        default="",
        metavar="NAME",
        help="the extended resource read as nodes' and pods' RDMA, as the controller's "
        "reflector_rdma_resource (e.g. rdma/hca_shared_devices_a; default: none)",
    )


def rdma_resource(args: argparse.Namespace) -> str:
    """The command's `--rdma-resource`, checked as the controller checks it."""
    name: str = getattr(args, "rdma_resource", "") or ""
    try:
        ReflectorOptions(rdma_resource=name)
    except ValueError as e:
        raise UserError(f"--rdma-resource: {e}") from None
    return name


def listed_of(raw: Any, name: str, rdma: str = "") -> Listed:
    """A parsed dump's objects (`rdma`: the RDMA resource's name); `UserError` when it is
    not a dump."""
    try:
        return read_dump(raw, name, rdma)
    except DumpError as e:
        raise UserError(str(e)) from None


def read_listed(args: argparse.Namespace, source_arg: str) -> Listed:
    """The cluster a command was given: the live listing `kubectl pyctl` put in `args.listed`,
    or the dump file named by `args.<source_arg>`."""
    listed = getattr(args, "listed", None)
    if isinstance(listed, Listed):
        return listed
    path = getattr(args, source_arg)
    return listed_of(load_json(path), path, rdma_resource(args))


def cluster_view(listed: Listed, workload: Workload | None = None) -> ListedView:
    """The controller's view of `listed`, under `workload` or M derived as the controller
    derives it (with its default `workload` settings); a command says what was left out
    (`say_left_out`) once it has its result, so that a command that then fails on bad input
    still says one line."""
    from pyctl.app.config import Config  # the controller's defaults (imported when used)
    from pyctl.app.wiring import workload_scope

    cfg = Config()
    return view_of(
        listed,
        workload=workload,
        default_policy=cfg.default_topology_policy,
        scope=workload_scope(cfg),
    )


def derived_workload(view: ListedView, name: str) -> Workload:
    """M of the view; `UserError` when there was none to derive (no GPU or MIG pod)."""
    if view.reconciler.workload_unset:
        left = view.left_out()
        why = f" ({len(left)} objects left out)" if left else ""
        raise UserError(f"{name}: no GPU pods to derive a workload from{why}; give --workload")
    return view.workload


def say_left_out(view: ListedView | None) -> None:
    """One line on stderr for each object left out."""
    for i in view.left_out() if view is not None else ():
        print(one_line(f"pyctl: {left_out_line(i)}"), file=sys.stderr)


def load_cluster(data: Any, name: str = "snapshot") -> tuple[Snapshot, ListedView | None]:
    """A snapshot from parsed JSON: a `kubectl get ... -o json` dump (the controller's view of
    it, returned too, for `say_left_out`), or pyctl's format."""
    if is_dump(data):
        view = cluster_view(listed_of(data, name))
        return view.snapshot(), view
    return load_snapshot(data), None
