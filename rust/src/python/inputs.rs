//! The core's inputs, declared once: for each dict (or dict of columns) the extension reads, its
//! keys, the Python type each holds and whether the reader requires it.
//!
//! `inputs!` makes, per input type, a module with one constant per key (the readers look keys up
//! by these constants, interned with `intern!`, so a key cannot be read under another name than
//! the declared one) and the table `KEYS`; `input_types()` returns every table to Python, where
//! `tests/unit/test_core_types.py` checks them against the TypedDicts of `pyctl.core.types`
//! (the same names, keys, `Required`/`NotRequired` and annotations).
//!
//! A key's kind is the annotation of the TypedDict key, written as Python writes it
//! (`list[int]`, `int | None`, the name of another input type). `required` means the reader
//! refuses the dict without the key; `optional` keys may be absent (the reader's default).

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One key of an input type.
pub struct Key {
    pub name: &'static str,
    pub kind: &'static str,
    pub required: bool,
}

/// An input type: its name (the TypedDict's) and its keys.
pub struct InputType {
    pub name: &'static str,
    pub keys: &'static [Key],
}

macro_rules! inputs {
    ($( $(#[$doc:meta])* $module:ident => $name:literal {
        $( $key:ident : $kind:literal $req:ident ),* $(,)?
    } )*) => {
        $(
            $(#[$doc])*
            #[allow(non_upper_case_globals, dead_code)]
            pub mod $module {
                $( pub const $key: &str = stringify!($key); )*
                pub const KEYS: &[super::Key] = &[
                    $( super::Key { name: $key, kind: $kind, required: inputs!(@required $req) } ),*
                ];
            }
        )*
        /// Every input type, in declaration order.
        pub const ALL: &[InputType] = &[ $( InputType { name: $name, keys: $module::KEYS } ),* ];
    };
    (@required required) => { true };
    (@required optional) => { false };
}

inputs! {
    /// A task shape (`super::shape`): absent or None is 0, empty or false; `weight` is required
    /// of a workload's shapes (a single task's is ignored); `rdma` is read by the replay only.
    shape => "ShapeInput" {
        cpu_milli: "int" optional,
        memory_mib: "int" optional,
        gpus: "int" optional,
        gpu_milli: "int" optional,
        mig_profile: "str | None" optional,
        gpu_models: "list[str]" optional,
        gpu_pool: "str" optional,
        gpu_memory_mib: "int" optional,
        weight: "float" required,
        dra: "bool" optional,
        numa_aligned: "bool" optional,
        link_group: "bool" optional,
        rdma: "int" optional,
    }

    /// A cluster in columns (`FragmentModel(columns)`; `crate::fragment::ClusterColumns`).
    columns => "ClusterColumns" {
        node_names: "list[str]" required,
        node_models: "list[str]" required,
        node_policies: "list[str]" required,
        node_cpu_static: "list[bool]" required,
        node_memory_static: "list[bool]" required,
        zone_offsets: "list[int]" required,
        zone_numa: "list[int]" required,
        zone_cpu_milli: "list[int]" required,
        zone_cpu_used: "list[int]" required,
        zone_memory_mib: "list[int]" required,
        zone_memory_used: "list[int]" required,
        gpu_offsets: "list[int]" required,
        gpu_ids: "list[int]" required,
        gpu_used_milli: "list[int]" required,
        gpu_link_groups: "list[int]" optional,
        mig_offsets: "list[int]" required,
        mig_gpu_ids: "list[int]" required,
        instance_offsets: "list[int]" required,
        instance_profiles: "list[str]" required,
        instance_starts: "list[int]" required,
        instance_used: "list[bool]" required,
        dra_gpu_offsets: "list[int]" optional,
        dra_gpu_ids: "list[int]" optional,
        dra_gpu_used_milli: "list[int]" optional,
        mig_dra: "list[bool]" optional,
        mig_dynamic: "list[bool]" optional,
        mig_free_slices: "list[int]" optional,
        node_gpu_pools: "list[str]" optional,
        node_gpu_replicas: "list[int]" optional,
        node_gpu_memory_mib: "list[int]" optional,
    }

    /// Where a task sits on a node, as the core returns it (`Assignment`) or any part of it:
    /// an absent key is nothing taken.
    assignment => "AssignmentInput" {
        cpu: "Sequence[tuple[int, int]]" optional,
        memory: "Sequence[tuple[int, int]]" optional,
        gpus: "Sequence[tuple[int, int, int]]" optional,
        mig: "tuple[int, int, int] | None" optional,
        dra_gpus: "Sequence[tuple[int, int, int]]" optional,
        dyn_whole: "Sequence[tuple[int, int]]" optional,
        mig_new: "tuple[int, int, str, int] | None" optional,
    }

    /// A pod the compaction planner may move (`FragmentModel.plan`'s `movable`); `allowed` is
    /// an index into `node_sets`, `pdb` into `pdb_headroom`.
    movable => "MovableInput" {
        node: "int" required,
        assignment: "Assignment | AssignmentInput" required,
        shape: "ShapeInput" required,
        allowed: "int | None" optional,
        pdb: "int | None" optional,
        group: "int | None" optional,
    }

    /// A pending pod of `FragmentModel.plan`.
    pending => "PendingInput" {
        shape: "ShapeInput" required,
        allowed: "int | None" optional,
    }

    /// The planner's limits (`crate::compaction::Limits`; absent or None: the default).
    plan_limits => "PlanLimitsInput" {
        max_moves: "int | None" optional,
        min_gain: "float" optional,
        max_moves_per_node: "int | None" optional,
        rescue_depth: "int | None" optional,
        max_rescues: "int | None" optional,
        rescue_budget: "int | None" optional,
        defragment: "bool" optional,
    }

    /// The replay's nodes in columns (`replay_run`, `replay_events`).
    replay_nodes => "ReplayNodes" {
        name: "list[str]" required,
        cpu_milli: "list[int]" required,
        memory_mib: "list[int]" required,
        gpu: "list[int]" required,
        model: "list[str]" required,
        rdma: "list[int]" optional,
    }

    /// The replay's tasks in columns (`replay_run`).
    replay_tasks => "ReplayTasks" {
        cpu_milli: "list[int]" required,
        memory_mib: "list[int]" required,
        num_gpu: "list[int]" required,
        gpu_milli: "list[int]" required,
        gpu_models: "list[list[str]]" optional,
        rdma: "list[int]" optional,
    }

    /// The inference replay's instances in columns (`replay_events`): a task's columns and
    /// when it arrives and departs (seconds; None or NaN: before the start, after the end).
    replay_instances => "ReplayInstances" {
        cpu_milli: "list[int]" required,
        memory_mib: "list[int]" required,
        num_gpu: "list[int]" required,
        gpu_milli: "list[int]" required,
        gpu_models: "list[list[str]]" optional,
        rdma: "list[int]" optional,
        app: "list[int]" required,
        max_per_node: "list[int]" required,
        arrive: "list[float | None]" required,
        depart: "list[float | None]" required,
    }

    /// The trace replay's compaction settings (`replay_run`; absent: the default).
    replay_compaction => "ReplayCompaction" {
        every: "float" optional,
        budget: "float" optional,
        max_moves: "float" optional,
        min_gain: "float" optional,
        reserve: "float" optional,
        rescue_depth: "float" optional,
        rescue_budget: "float" optional,
    }

    /// The inference replay's compaction settings (`replay_events`; absent: the default).
    event_compaction => "EventCompaction" {
        interval: "float" optional,
        budget_per_day: "float" optional,
        max_moves: "float" optional,
        min_gain: "float" optional,
        rescue_depth: "float" optional,
        rescue_budget: "float" optional,
    }

    /// A GPU of `mig_plan`: its index and its MIG instances.
    mig_gpu => "MigGpuInput" {
        gpu: "int" required,
        instances: "list[MigInstanceInput] | None" optional,
    }

    /// A MIG instance of a GPU of `mig_plan`.
    mig_instance => "MigInstanceInput" {
        profile: "str" required,
        start: "int" required,
        used: "bool | None" optional,
        pod: "str | None" optional,
    }

    /// A pending request of `mig_plan` (count absent or None: 1).
    mig_pending => "MigPendingInput" {
        profile: "str" required,
        count: "int | None" optional,
    }

    /// A profile of `mig_plan`'s workload and its weight.
    mig_workload => "MigWorkloadInput" {
        profile: "str" required,
        weight: "float" required,
    }

    /// `mig_plan`'s limits (absent or None: no limit, the default executor).
    mig_limits => "MigLimitsInput" {
        gpus: "list[int] | None" optional,
        max_used_destroyed: "int | None" optional,
        executor: "str | None" optional,
    }

    /// A topology hint of `merge_hints`' providers (affinity None: any NUMA node).
    hint => "TopologyHintInput" {
        affinity: "list[int] | None" required,
        preferred: "bool" required,
    }
}

/// input_types() -> {type name: {key: (kind, required)}}: the declarations above.
#[pyfunction]
fn input_types(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for t in ALL {
        let keys = PyDict::new(py);
        for k in t.keys {
            keys.set_item(k.name, (k.kind, k.required))?;
        }
        out.set_item(t.name, keys)?;
    }
    Ok(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(input_types, m)?)?;
    Ok(())
}
