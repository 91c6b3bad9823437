"""What the tests read from a kubectl dump, the one way the commands read it
(`pyctl.cluster.kube.dump.read_dump`, then the controller's view)."""

from __future__ import annotations

from typing import Any

from pyctl.cluster.dra.context import DraContext
from pyctl.cluster.kube.dump import read_dump
from pyctl.cluster.records import NodeRecord, NrtRecord, PdbRecord, PodRecord
from pyctl.controller.view import view_of
from pyctl.model import Shape, Snapshot


def records(
    data: Any,
) -> tuple[list[NodeRecord], list[PodRecord], list[NrtRecord], list[PdbRecord]]:
    listed = read_dump(data)
    return listed.nodes, listed.pods, listed.nrts, listed.pdbs


def dra_context(data: Any) -> DraContext | None:
    return read_dump(data).dra()


def pod_shapes(data: Any) -> list[Shape]:
    """The shapes of the live pods the core can model."""
    return view_of(read_dump(data)).shapes()


def snapshot_from_dump(data: Any) -> Snapshot:
    return view_of(read_dump(data)).snapshot()
