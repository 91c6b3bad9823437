"""Reading the cluster files the commands take: pyctl's snapshot format or a kubectl dump."""

from __future__ import annotations

from typing import Any

from pyctl.cluster.kube.dump import is_dump, snapshot_from_dump
from pyctl.model import Snapshot
from pyctl.snapshot import load_snapshot


def load_cluster(data: Any) -> Snapshot:
    """A snapshot from parsed JSON: a `kubectl get ... -o json` dump, or pyctl's format."""
    if is_dump(data):
        return snapshot_from_dump(data)
    return load_snapshot(data)
