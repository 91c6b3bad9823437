"""Dynamic Resource Allocation, from records to what pyctl reasons about (docs/dra.md).

Each module holds one idea; import a name from the module that defines it. Highest first: a module
imports only those on the lines below its own (`pyproject.toml`'s layers contract for the package):

- `context`
- `search` | `shapes` | `zones`
- `claims` | `node`
- `devices`
- `capacity` | `cel`

What each holds:

- `context`: the cluster's DRA view (`DraContext`), pods whose devices span NUMA nodes.
- `search`: admission (`allocate`), the scheduler's allocator's search over a node's devices.
- `shapes`: claims -> what a pod asks of GPUs (`DraNeed`).
- `zones`: the model of a node's DRA GPUs (`DraModel`): zones, usage, MIG geometry.
- `claims`: a pod's claims and their specs, selectors (`request_matches`), the index of device
  kinds, `Unknown`.
- `node`: a node's devices (`NodeDevices`): complete pools, physical GPUs, allocations.
- `devices`: one published device as pyctl reads it (`DeviceView`).
- `capacity`: consumable capacity (KEP-5075), the allocator's arithmetic and shares.
- `cel`: CEL device selectors, evaluated with cel-rust.

The records they read are `pyctl.cluster.dra_records` (below `pyctl.cluster.records`).
"""
