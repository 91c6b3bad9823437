//! Python face of the trace replay: `replay_run(nodes, tasks, shapes, ...)` with columns in and
//! a dict of results out. Conversion only; the engine is `crate::replay`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{field_error, fields, value_error, Read};
use super::inputs::{
    event_compaction, replay_compaction, replay_instances, replay_nodes, replay_tasks, shape,
};
use crate::replay::events::{run_events, EventCompaction, EventConfig, EventResult, InstanceSpec};
use crate::replay::{
    run, Compaction, Config, NodeSpec, Policy, ReplayResult, ShapeSpec, TaskSpec, POLICY_NAMES,
};

/// The common length of parallel columns; an error names the first that differs.
fn same_len(lens: &[(&str, usize)], what: &str) -> PyResult<usize> {
    let Some(&(first, n)) = lens.first() else {
        return Ok(0);
    };
    for (k, l) in lens {
        if *l != n {
            return Err(field_error(
                &format!("{what}.{k}"),
                format!("{l} entries, but {first} has {n}"),
            ));
        }
    }
    Ok(n)
}

/// An optional column: absent (empty) is `n` defaults, else its length must be `n`.
fn or_default<T: Clone + Default>(col: Vec<T>, n: usize, field: &str) -> PyResult<Vec<T>> {
    match col.len() {
        0 => Ok(vec![T::default(); n]),
        l if l == n => Ok(col),
        l => Err(field_error(
            field,
            format!("{l} entries, but the other columns have {n}"),
        )),
    }
}

fn parse_policy(policy: &str) -> PyResult<Policy> {
    Policy::parse(policy).ok_or_else(|| {
        field_error(
            "policy",
            format!("unknown policy {policy:?}; one of {POLICY_NAMES:?}"),
        )
    })
}

/// replay_run(nodes, tasks, shapes, policy="fgd", seed=42, ...) -> dict: one replay
/// (`crate::replay::run`), nodes and tasks in columns, the workload's shapes as dicts.
#[pyfunction]
#[pyo3(signature = (nodes, tasks, shapes, policy = "fgd", seed = 42, tune = 1.3, shuffle = true, numa = false, compaction = None, max_pct = 130, placements = false))]
#[allow(clippy::too_many_arguments)]
fn replay_run<'py>(
    py: Python<'py>,
    nodes: &Bound<'py, PyAny>,
    tasks: &Bound<'py, PyAny>,
    shapes: &Bound<'py, PyAny>,
    policy: &str,
    seed: i64,
    tune: f64,
    shuffle: bool,
    numa: bool,
    compaction: Option<&Bound<'py, PyAny>>,
    max_pct: u32,
    placements: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let policy = parse_policy(policy)?;
    let node_specs = read_nodes(nodes)?;
    let task_specs = task_specs(replay_tasks::Input::named(tasks, "tasks")?, "tasks")?;
    let shape_specs = read_shapes(shapes)?;
    let cfg = Config {
        policy,
        seed: seed as u64,
        tune,
        shuffle,
        numa,
        compaction: read_compaction(compaction)?,
        max_pct,
    };
    let res = py
        .detach(|| run(&node_specs, &task_specs, &shape_specs, &cfg))
        .map_err(value_error)?;
    result_dict(py, policy, seed, &res, placements)
}

/// Rows of `$t` from the parallel columns of `$c` (`field: column`), whose lengths must agree
/// (an error names the first that differs, `$what.column`).
macro_rules! rows {
    ($what:expr, $c:ident; $t:ident { $($f:ident: $col:ident),* }) => {{
        let n = same_len(&[$( (stringify!($col), $c.$col.len()) ),*], $what)?;
        (0..n).map(|i| $t { $($f: $c.$col[i].clone()),* }).collect()
    }};
}

/// The nodes' columns (`ReplayNodes`: one entry per node each; rdma, percent of one RNIC, 100
/// per RNIC, absent: 0).
fn read_nodes(nodes: &Bound<'_, PyAny>) -> PyResult<Vec<NodeSpec>> {
    let mut c = replay_nodes::Input::named(nodes, "nodes")?;
    c.rdma = or_default(c.rdma, c.name.len(), "nodes.rdma")?;
    Ok(rows!("nodes", c; NodeSpec {
        name: name, cpu_milli: cpu_milli, memory_mib: memory_mib, gpus: gpu, model: model,
        rdma: rdma
    }))
}

/// The tasks' columns (`ReplayTasks`; gpu_models absent: any model, rdma absent: 0), with
/// errors naming `what` ("tasks", "instances": `ReplayInstances` declares the same task
/// columns, which a test checks).
fn task_specs(mut c: replay_tasks::Input, what: &str) -> PyResult<Vec<TaskSpec>> {
    let m = c.cpu_milli.len();
    c.gpu_models = or_default(c.gpu_models, m, &format!("{what}.gpu_models"))?;
    c.rdma = or_default(c.rdma, m, &format!("{what}.rdma"))?;
    Ok(rows!(what, c; TaskSpec {
        cpu_milli: cpu_milli, memory_mib: memory_mib, num_gpu: num_gpu, gpu_milli: gpu_milli,
        models: gpu_models, rdma: rdma
    }))
}

/// The workload's shapes (`ShapeInput`, read as every shape is); the replay uses their CPU,
/// GPU request, models and weight, and the replay's own key `rdma` (percent of one RNIC).
fn read_shapes(shapes: &Bound<'_, PyAny>) -> PyResult<Vec<ShapeSpec>> {
    Ok(Vec::<shape::Input>::named(shapes, "shapes")?
        .into_iter()
        .map(|s| ShapeSpec {
            // read as a non-negative i64: it fits
            cpu_milli: i64::try_from(s.cpu_milli).unwrap_or(i64::MAX),
            num_gpu: s.gpus.into(),
            gpu_milli: s.gpu_milli.into(),
            models: s.gpu_models,
            weight: s.weight,
            rdma: i64::try_from(s.rdma).unwrap_or(i64::MAX),
        })
        .collect())
}

/// The compaction settings (absent keys: the defaults).
fn read_compaction(c: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Compaction>> {
    let Some(c) = c.filter(|c| !c.is_none()) else {
        return Ok(None);
    };
    let c = replay_compaction::Input::named(c, "compaction")?;
    if c.every < 1 || c.rescue_depth > 8 {
        return Err(field_error(
            "compaction",
            "every must be >= 1, rescue_depth 0..=8",
        ));
    }
    Ok(Some(c))
}

/// The result as `pyctl/_core.pyi`'s `ReplayResult`: counts, checkpoints, and with
/// `placements` the node of every replayed task.
fn result_dict<'py>(
    py: Python<'py>,
    policy: Policy,
    seed: i64,
    res: &ReplayResult,
    placements: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let out = fields!(
        py, res;
        gpu_capacity_milli, tasks, placed, failed, failed_admission, evictions, compaction_rounds
    );
    out.set_item("policy", policy.name())?;
    out.set_item("seed", seed)?;
    let cps = PyList::empty(py);
    for c in &res.checkpoints {
        cps.append(fields!(
            py, c;
            arrived_pct, arrived_milli, allocated_milli, frag_milli, idle_milli, numa_split_milli,
            arrived_tasks, failed_tasks, evictions
        ))?;
    }
    out.set_item("checkpoints", cps)?;
    if placements {
        out.set_item("node_of", &res.node_of)?;
        out.set_item("task_of", &res.task_of)?;
    }
    Ok(out)
}

/// The instances' columns (`ReplayInstances`): the tasks' (`task_specs`) plus app,
/// max_per_node (0 or less: no limit), arrive and depart (seconds; None or NaN: before the start
/// / after the end).
fn read_instances(d: &Bound<'_, PyAny>) -> PyResult<Vec<InstanceSpec>> {
    let c = replay_instances::Input::named(d, "instances")?;
    let tasks = task_specs(
        replay_tasks::Input {
            cpu_milli: c.cpu_milli,
            memory_mib: c.memory_mib,
            num_gpu: c.num_gpu,
            gpu_milli: c.gpu_milli,
            gpu_models: c.gpu_models,
            rdma: c.rdma,
        },
        "instances",
    )?;
    same_len(
        &[
            (replay_instances::cpu_milli, tasks.len()),
            (replay_instances::app, c.app.len()),
            (replay_instances::max_per_node, c.max_per_node.len()),
            (replay_instances::arrive, c.arrive.len()),
            (replay_instances::depart, c.depart.len()),
        ],
        "instances",
    )?;
    let rows = tasks.into_iter().zip(c.app).zip(c.max_per_node);
    Ok(rows
        .zip(c.arrive)
        .zip(c.depart)
        .map(|((((task, app), cap), arrive), depart)| InstanceSpec {
            task,
            app,
            max_per_node: cap.clamp(0, u32::MAX as i64) as u32,
            arrive: arrive.0.unwrap_or(0.0),
            depart: depart.0,
        })
        .collect())
}

fn read_event_compaction(c: Option<&Bound<'_, PyAny>>) -> PyResult<Option<EventCompaction>> {
    let Some(c) = c.filter(|c| !c.is_none()) else {
        return Ok(None);
    };
    let c = event_compaction::Input::named(c, "compaction")?;
    if c.rescue_depth > 8 {
        return Err(field_error("compaction", "rescue_depth must be 0..=8"));
    }
    Ok(Some(c))
}

/// replay_events(nodes, instances, shapes, policy, seed, end, ...) -> dict: the inference
/// replay (`crate::replay::events::run_events`), instances arriving and leaving.
#[pyfunction]
#[pyo3(signature = (nodes, instances, shapes, policy = "fgd", seed = 42, end = 0.0, shuffle = true, compaction = None, sample_every = 0.0, log = false))]
#[allow(clippy::too_many_arguments)]
fn replay_events<'py>(
    py: Python<'py>,
    nodes: &Bound<'py, PyAny>,
    instances: &Bound<'py, PyAny>,
    shapes: &Bound<'py, PyAny>,
    policy: &str,
    seed: i64,
    end: f64,
    shuffle: bool,
    compaction: Option<&Bound<'py, PyAny>>,
    sample_every: f64,
    log: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let policy = parse_policy(policy)?;
    let node_specs = read_nodes(nodes)?;
    let inst = read_instances(instances)?;
    let shape_specs = read_shapes(shapes)?;
    let cfg = EventConfig {
        policy,
        seed: seed as u64,
        shuffle,
        end,
        compaction: read_event_compaction(compaction)?,
        sample_every,
        log,
    };
    let res = py
        .detach(|| run_events(&node_specs, &inst, &shape_specs, &cfg))
        .map_err(value_error)?;
    events_dict(py, policy, seed, &res)
}

fn events_dict<'py>(
    py: Python<'py>,
    policy: Policy,
    seed: i64,
    r: &EventResult,
) -> PyResult<Bound<'py, PyDict>> {
    let out = fields!(
        py, r;
        gpu_capacity_milli, end, instances, arrived, placed_on_arrival, placed_after_wait,
        never_placed, evictions, compaction_rounds, rescues, frag_milli_s, idle_milli_s,
        allocated_milli_s, pending_s, running_s
    );
    out.set_item("policy", policy.name())?;
    out.set_item("seed", seed)?;
    let samples = PyList::empty(py);
    for s in &r.samples {
        samples.append(fields!(
            py, s;
            t, allocated_milli, idle_milli, frag_milli, pending, running, evictions
        ))?;
    }
    out.set_item("samples", samples)?;
    let log = PyList::empty(py);
    for e in &r.log {
        let kind = ["place", "depart", "move", "wait"][e.kind as usize];
        log.append((e.t, kind, e.instance, e.node, e.to))?;
    }
    out.set_item("log", log)?;
    Ok(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay_run, m)?)?;
    m.add_function(wrap_pyfunction!(replay_events, m)?)?;
    m.add("REPLAY_POLICIES", PyList::new(m.py(), POLICY_NAMES)?)?;
    Ok(())
}
