"""The workflow kinds pyctl runs, registered explicitly at start-up."""

from __future__ import annotations

from pyctl.workflows import compaction, mig_reconfig, rescue
from pyctl.workflows.base import Registry


def builtin_registry() -> Registry:
    """Compaction, rescues of pending pods, and MIG reconfiguration."""
    r = Registry()
    r.add(compaction.workflow_kind())
    r.add(rescue.workflow_kind())
    r.add(mig_reconfig.workflow_kind())
    return r
