"""The core facade: the only package that imports the Rust extension `pyctl._core`.

`fragmentation` (FGD's measure per node and NUMA zone, fragment deltas), `topology` (the kubelet
Topology Manager's hint merge), `mig` (MIG geometry and the partition planner), `policy` (the one
placement policy and compaction planner) and `replay` (the trace replay engine). Each turns plain
Python values into the core's input and the core's output into typed results."""
