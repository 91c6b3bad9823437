"""A local Kubernetes cluster to try pyctl on (`pyctl dev up`, `make cluster`): the real control
plane (`control_plane.py`), kwok GPU nodes shown as the NVIDIA stack shows them (`gpu_nodes.py`),
NFD's topology-updater and the GPU Operator's mig-manager played by simulators (`topology.py`,
`mig_manager.py`), a fragmenting workload, and pyctl with its scheduler extender (`cluster.py`).

The top layer: it imports the rest of pyctl and is imported by nothing but the CLI (and the e2e
tests, which run the same control plane). It needs a checkout of pyctl's repository: the control
plane is built by its `scripts/control-plane`.
"""
