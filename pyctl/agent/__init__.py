"""`pyctl agent`: the node's own view from NVML, sysfs and the kubelet, read-only.

Layer: above `pyctl.core`, `pyctl.model` and `pyctl.cluster.bounds`; only `pyctl.cli` and
`pyctl.app` import it (docs/agent.md).
"""
