"""Moved to `pyctl.dev.gpu_nodes` (the local cluster of `pyctl dev up` uses it too); the e2e tests
import it from there through this module."""

from pyctl.dev.gpu_nodes import (  # noqa: F401
    E2E_NODE_LABEL,
    GPU,
    NRT_CRD,
    NRT_GROUP,
    NRT_PLURAL,
    NRT_VERSION,
    GpuNodeSpec,
    apply_nrt_crd,
    body,
    create_gpu_nodes,
    delete_gpu_nodes,
    mig_resource,
    node_manifest,
    nrt_crd_manifest,
    nrt_manifest,
    wait_nodes_ready,
)
