"""Moved to `pyctl.dev.mig_manager` (the local cluster of `pyctl dev up` uses it too); the e2e tests
import it from there through this module."""

from pyctl.dev.mig_manager import (  # noqa: F401
    BASE_CONFIGS,
    MERGE,
    STATE_LABEL,
    MigManagerSim,
    a100_all_1g,
    apply_config,
    capacity,
    create_mig_node,
    mig_pod,
)
