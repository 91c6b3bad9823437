//! The core's inputs, declared once: for each dict (or dict of columns) the extension reads, its
//! keys, the Rust type each is read as, the Python type it holds and whether it is required.
//!
//! `inputs!` makes, per input type, a module with one constant per key and the table `KEYS`, the
//! type `Input` the dict is read into (a struct of the declared fields, or the core's own struct
//! named after `as`), and `Input`'s `Read`: each key looked up by its constant (interned with
//! `intern!`), read by its Rust type's `Read` (`super::convert`), errors naming the field
//! (`movable[3].assignment.gpus[0]`). An optional key absent or None keeps `Input::default()`'s
//! value; a required key absent is an error. `input_types()` returns every table to Python,
//! where `tests/unit/test_core_types.py` checks them against the TypedDicts of
//! `pyctl.core.inputs` (the same names, keys, `Required`/`NotRequired` and annotations).
//!
//! A key's kind is the annotation of the TypedDict key, written as Python writes it
//! (`list[int]`, `int | None`, the name of another input type).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{Obj, Object, Path, Read, Time};
use crate::mig::planner::Executor;

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
    ($( $(#[$doc:meta])* $module:ident => $name:literal $(as $target:path)? {
        $( $key:ident : $ty:ty = $kind:literal $req:ident ),* $(,)?
    } )*) => {
        $(
            $(#[$doc])*
            #[allow(non_upper_case_globals, dead_code)]
            pub mod $module {
                #[allow(unused_imports)]
                use super::*;
                $( pub const $key: &str = stringify!($key); )*
                pub const KEYS: &[super::Key] = &[
                    $( super::Key { name: $key, kind: $kind, required: inputs!(@required $req) } ),*
                ];
                inputs!(@input [$($target)?] { $( $key : $ty ),* });
                impl Read for Input {
                    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
                        let py = obj.py();
                        let src = Object::of(obj, at)?;
                        let mut out = Self::default();
                        $( src.field(pyo3::intern!(py, $key), inputs!(@required $req), at,
                            &mut out.$key)?; )*
                        Ok(out)
                    }
                }
            }
        )*
        /// Every input type, in declaration order.
        pub const ALL: &[InputType] = &[ $( InputType { name: $name, keys: $module::KEYS } ),* ];
    };
    (@input [] { $( $key:ident : $ty:ty ),* }) => {
        #[derive(Debug, Default)]
        pub struct Input { $( pub $key: $ty ),* }
    };
    (@input [$target:path] { $( $key:ident : $ty:ty ),* }) => {
        pub type Input = $target;
        /// The declared types are the target's (a mismatch does not compile).
        fn _declared(i: &Input) { $( let _: &$ty = &i.$key; )* }
    };
    (@required required) => { true };
    (@required optional) => { false };
}

inputs! {
    /// A task shape (`super::shape`): absent or None is 0, empty or false; a single task's
    /// `weight` is ignored; `rdma` is of the node's RDMA resource (the replay's: percent of
    /// one RNIC).
    shape => "ShapeInput" {
        cpu_milli: u64 = "int" optional,
        memory_mib: u64 = "int" optional,
        gpus: u32 = "int" optional,
        gpu_milli: u32 = "int" optional,
        mig_profile: Option<String> = "str | None" optional,
        gpu_models: Vec<String> = "list[str]" optional,
        gpu_pool: String = "str" optional,
        gpu_memory_mib: u64 = "int" optional,
        weight: f64 = "float" required,
        dra: bool = "bool" optional,
        numa_aligned: bool = "bool" optional,
        link_group: bool = "bool" optional,
        rdma: u64 = "int" optional,
    }

    /// A cluster in columns (`FragmentModel(columns)`; `crate::fragment::ClusterColumns`).
    columns => "ClusterColumns" as crate::fragment::ClusterColumns {
        node_names: Vec<String> = "list[str]" required,
        node_models: Vec<String> = "list[str]" required,
        node_policies: Vec<String> = "list[str]" required,
        node_cpu_static: Vec<bool> = "list[bool]" required,
        node_memory_static: Vec<bool> = "list[bool]" required,
        zone_offsets: Vec<usize> = "list[int]" required,
        zone_numa: Vec<i64> = "list[int]" required,
        zone_cpu_milli: Vec<i64> = "list[int]" required,
        zone_cpu_used: Vec<i64> = "list[int]" required,
        zone_memory_mib: Vec<i64> = "list[int]" required,
        zone_memory_used: Vec<i64> = "list[int]" required,
        gpu_offsets: Vec<usize> = "list[int]" required,
        gpu_ids: Vec<i64> = "list[int]" required,
        gpu_used_milli: Vec<i64> = "list[int]" required,
        gpu_link_groups: Vec<i64> = "list[int]" optional,
        node_link_offsets: Vec<usize> = "list[int]" optional,
        link_sizes: Vec<i64> = "list[int]" optional,
        link_gpu_ids: Vec<i64> = "list[int]" optional,
        link_groups: Vec<i64> = "list[int]" optional,
        mig_offsets: Vec<usize> = "list[int]" required,
        mig_gpu_ids: Vec<i64> = "list[int]" required,
        instance_offsets: Vec<usize> = "list[int]" required,
        instance_profiles: Vec<String> = "list[str]" required,
        instance_starts: Vec<i64> = "list[int]" required,
        instance_used: Vec<bool> = "list[bool]" required,
        dra_gpu_offsets: Vec<usize> = "list[int]" optional,
        dra_gpu_ids: Vec<i64> = "list[int]" optional,
        dra_gpu_used_milli: Vec<i64> = "list[int]" optional,
        mig_dra: Vec<bool> = "list[bool]" optional,
        mig_dynamic: Vec<bool> = "list[bool]" optional,
        mig_free_slices: Vec<i64> = "list[int]" optional,
        node_gpu_pools: Vec<String> = "list[str]" optional,
        node_gpu_replicas: Vec<i64> = "list[int]" optional,
        node_gpu_memory_mib: Vec<i64> = "list[int]" optional,
        node_rdma: Vec<i64> = "list[int]" optional,
        node_rdma_used: Vec<i64> = "list[int]" optional,
    }

    /// Where a task sits on a node, as the core returns it (`Assignment`) or any part of it:
    /// an absent key is nothing taken.
    assignment => "AssignmentInput" {
        cpu: Vec<[u64; 2]> = "Sequence[tuple[int, int]]" optional,
        memory: Vec<[u64; 2]> = "Sequence[tuple[int, int]]" optional,
        gpus: Vec<[u64; 3]> = "Sequence[tuple[int, int, int]]" optional,
        mig: Option<[u64; 3]> = "tuple[int, int, int] | None" optional,
        dra_gpus: Vec<[u64; 3]> = "Sequence[tuple[int, int, int]]" optional,
        dyn_whole: Vec<[u64; 2]> = "Sequence[tuple[int, int]]" optional,
        mig_new: Option<(usize, usize, String, u8)> = "tuple[int, int, str, int] | None" optional,
        rdma: u64 = "int" optional,
    }

    /// A pod the compaction planner may move (`FragmentModel.plan`'s `movable`); `allowed` is
    /// an index into `node_sets`, `pdb` into `pdb_headroom`.
    movable => "MovableInput" {
        node: usize = "int" required,
        assignment: Obj = "Assignment | AssignmentInput" required,
        shape: Obj = "ShapeInput" required,
        allowed: Option<usize> = "int | None" optional,
        pdb: Option<usize> = "int | None" optional,
        group: Option<u32> = "int | None" optional,
    }

    /// A pending pod of `FragmentModel.plan`.
    pending => "PendingInput" {
        shape: Obj = "ShapeInput" required,
        allowed: Option<usize> = "int | None" optional,
    }

    /// The planner's limits (`crate::compaction::Limits`; absent or None: the default).
    plan_limits => "PlanLimitsInput" as crate::compaction::Limits {
        max_moves: usize = "int | None" optional,
        min_gain: f64 = "float" optional,
        max_moves_per_node: usize = "int | None" optional,
        rescue_depth: usize = "int | None" optional,
        max_rescues: usize = "int | None" optional,
        rescue_budget: usize = "int | None" optional,
        defragment: bool = "bool" optional,
    }

    /// The replay's nodes in columns (`replay_run`, `replay_events`).
    replay_nodes => "ReplayNodes" {
        name: Vec<String> = "list[str]" required,
        cpu_milli: Vec<i64> = "list[int]" required,
        memory_mib: Vec<i64> = "list[int]" required,
        gpu: Vec<i64> = "list[int]" required,
        model: Vec<String> = "list[str]" required,
        rdma: Vec<i64> = "list[int]" optional,
    }

    /// The replay's tasks in columns (`replay_run`).
    replay_tasks => "ReplayTasks" {
        cpu_milli: Vec<i64> = "list[int]" required,
        memory_mib: Vec<i64> = "list[int]" required,
        num_gpu: Vec<i64> = "list[int]" required,
        gpu_milli: Vec<i64> = "list[int]" required,
        gpu_models: Vec<Vec<String>> = "list[list[str]]" optional,
        rdma: Vec<i64> = "list[int]" optional,
    }

    /// The inference replay's instances in columns (`replay_events`): a task's columns and
    /// when it arrives and departs (seconds; None or NaN: before the start, after the end).
    replay_instances => "ReplayInstances" {
        cpu_milli: Vec<i64> = "list[int]" required,
        memory_mib: Vec<i64> = "list[int]" required,
        num_gpu: Vec<i64> = "list[int]" required,
        gpu_milli: Vec<i64> = "list[int]" required,
        gpu_models: Vec<Vec<String>> = "list[list[str]]" optional,
        rdma: Vec<i64> = "list[int]" optional,
        app: Vec<u32> = "list[int]" required,
        max_per_node: Vec<i64> = "list[int]" required,
        arrive: Vec<Time> = "list[float | None]" required,
        depart: Vec<Time> = "list[float | None]" required,
    }

    /// The trace replay's compaction settings (`replay_run`; absent: the default).
    replay_compaction => "ReplayCompaction" as crate::replay::Compaction {
        every: u32 = "int" optional,
        budget: f64 = "float" optional,
        max_moves: u32 = "int" optional,
        min_gain: f64 = "float" optional,
        reserve: f64 = "float" optional,
        rescue_depth: u32 = "int" optional,
        rescue_budget: u32 = "int" optional,
    }

    /// The inference replay's compaction settings (`replay_events`; absent: the default).
    event_compaction => "EventCompaction" as crate::replay::events::EventCompaction {
        interval: f64 = "float" optional,
        budget_per_day: f64 = "float" optional,
        max_moves: u32 = "int" optional,
        min_gain: f64 = "float" optional,
        rescue_depth: u32 = "int" optional,
        rescue_budget: u32 = "int" optional,
        min_pod_age: f64 = "float" optional,
    }

    /// A GPU of `mig_plan`: its index and its MIG instances.
    mig_gpu => "MigGpuInput" {
        gpu: u32 = "int" required,
        instances: Vec<mig_instance::Input> = "list[MigInstanceInput] | None" optional,
    }

    /// A MIG instance of a GPU of `mig_plan`.
    mig_instance => "MigInstanceInput" {
        profile: String = "str" required,
        start: u8 = "int" required,
        used: bool = "bool | None" optional,
        pod: Option<String> = "str | None" optional,
    }

    /// A pending request of `mig_plan` (count absent or None: 1).
    mig_pending => "MigPendingInput" {
        profile: String = "str" required,
        count: Option<u32> = "int | None" optional,
    }

    /// A profile of `mig_plan`'s workload and its weight.
    mig_workload => "MigWorkloadInput" {
        profile: String = "str" required,
        weight: f64 = "float" required,
    }

    /// `mig_plan`'s limits (absent or None: no limit, the default executor).
    mig_limits => "MigLimitsInput" as crate::mig::planner::Limits {
        gpus: Option<Vec<u32>> = "list[int] | None" optional,
        max_used_destroyed: u32 = "int | None" optional,
        executor: Executor = "str | None" optional,
    }

    /// A topology hint of `merge_hints`' providers (affinity None: any NUMA node).
    hint => "TopologyHintInput" {
        affinity: Option<Vec<i64>> = "list[int] | None" required,
        preferred: bool = "bool" required,
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
