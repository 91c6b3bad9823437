//! Python face of the trace replay: `replay_run(nodes, tasks, shapes, ...)` with columns in and
//! a dict of results out. Conversion only; the engine is `crate::replay`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{field_error, int_list, item, sequence, string_list, value_error};
use super::inputs::{
    event_compaction as ekey, replay_compaction as ckey, replay_instances as ikey,
    replay_nodes as nkey, replay_tasks as tkey, shape as skey,
};
use super::shape::read_shape_list;
use crate::replay::events::{run_events, EventCompaction, EventConfig, EventResult, InstanceSpec};
use crate::replay::{
    run, Compaction, Config, NodeSpec, Policy, ReplayResult, ShapeSpec, TaskSpec, POLICY_NAMES,
};

fn column<'py>(d: &Bound<'py, PyDict>, key: &str, what: &str) -> PyResult<Bound<'py, PyAny>> {
    item(d, key, what)
}

fn ints(d: &Bound<'_, PyDict>, key: &str, what: &str) -> PyResult<Vec<i64>> {
    int_list(&column(d, key, what)?, || format!("{what}.{key}"))
}

fn strs(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Vec<String>> {
    string_list(obj, || field.to_string())
}

fn model_lists(
    d: &Bound<'_, PyDict>,
    key: &str,
    what: &str,
    n: usize,
) -> PyResult<Vec<Vec<String>>> {
    match d.get_item(key)? {
        None => Ok(vec![Vec::new(); n]),
        Some(v) => sequence(&v, || format!("{what}.{key}"))?
            .iter()
            .enumerate()
            .map(|(i, x)| strs(x, &format!("{what}.{key}[{i}]")))
            .collect(),
    }
}

/// An optional integer column (absent: `n` zeros); its length must be `n`.
fn optional_ints(d: &Bound<'_, PyDict>, key: &str, what: &str, n: usize) -> PyResult<Vec<i64>> {
    match d.get_item(key)? {
        None => Ok(vec![0; n]),
        Some(v) => {
            let out = int_list(&v, || format!("{what}.{key}"))?;
            if out.len() != n {
                return Err(field_error(
                    &format!("{what}.{key}"),
                    format!("{} entries, but the other columns have {n}", out.len()),
                ));
            }
            Ok(out)
        }
    }
}

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

/// replay_run(nodes, tasks, shapes, policy="fgd", seed=42, ...) -> dict: one replay
/// (`crate::replay::run`), nodes and tasks in columns, the workload's shapes as dicts.
#[pyfunction]
#[pyo3(signature = (nodes, tasks, shapes, policy = "fgd", seed = 42, tune = 1.3, shuffle = true, numa = false, compaction = None, max_pct = 130, placements = false))]
#[allow(clippy::too_many_arguments)]
fn replay_run<'py>(
    py: Python<'py>,
    nodes: &Bound<'py, PyDict>,
    tasks: &Bound<'py, PyDict>,
    shapes: &Bound<'py, PyAny>,
    policy: &str,
    seed: i64,
    tune: f64,
    shuffle: bool,
    numa: bool,
    compaction: Option<&Bound<'py, PyDict>>,
    max_pct: u32,
    placements: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let policy = Policy::parse(policy).ok_or_else(|| {
        field_error(
            "policy",
            format!("unknown policy {policy:?}; one of {POLICY_NAMES:?}"),
        )
    })?;
    let node_specs = read_nodes(nodes)?;
    let task_specs = read_tasks(tasks)?;
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

/// The nodes' columns: name, cpu_milli, memory_mib, gpu, model (one entry per node each), and
/// optionally rdma (percent of one RNIC: 100 per RNIC; absent: 0).
fn read_nodes(nodes: &Bound<'_, PyDict>) -> PyResult<Vec<NodeSpec>> {
    let names = strs(&column(nodes, nkey::name, "nodes")?, "nodes.name")?;
    let cpu = ints(nodes, nkey::cpu_milli, "nodes")?;
    let mem = ints(nodes, nkey::memory_mib, "nodes")?;
    let gpu = ints(nodes, nkey::gpu, "nodes")?;
    let models = strs(&column(nodes, nkey::model, "nodes")?, "nodes.model")?;
    let n = same_len(
        &[
            (nkey::name, names.len()),
            (nkey::cpu_milli, cpu.len()),
            (nkey::memory_mib, mem.len()),
            (nkey::gpu, gpu.len()),
            (nkey::model, models.len()),
        ],
        "nodes",
    )?;
    let rdma = optional_ints(nodes, nkey::rdma, "nodes", n)?;
    let rows = names.into_iter().zip(cpu).zip(mem).zip(gpu).zip(models);
    Ok(rows
        .zip(rdma)
        .map(
            |(((((name, cpu_milli), memory_mib), gpus), model), rdma)| NodeSpec {
                name,
                cpu_milli,
                memory_mib,
                gpus,
                model,
                rdma,
            },
        )
        .collect())
}

/// The tasks' columns: cpu_milli, memory_mib, num_gpu, gpu_milli, and optionally gpu_models
/// (a list of model names per task) and rdma (percent of one RNIC; absent: 0).
fn read_tasks(tasks: &Bound<'_, PyDict>) -> PyResult<Vec<TaskSpec>> {
    read_task_columns(tasks, "tasks")
}

/// `read_tasks` with errors naming `what` ("tasks", "instances": `ReplayInstances` declares the
/// same task columns as `ReplayTasks`, which a test checks).
fn read_task_columns(tasks: &Bound<'_, PyDict>, what: &str) -> PyResult<Vec<TaskSpec>> {
    let cpu = ints(tasks, tkey::cpu_milli, what)?;
    let mem = ints(tasks, tkey::memory_mib, what)?;
    let num = ints(tasks, tkey::num_gpu, what)?;
    let milli = ints(tasks, tkey::gpu_milli, what)?;
    let m = same_len(
        &[
            (tkey::cpu_milli, cpu.len()),
            (tkey::memory_mib, mem.len()),
            (tkey::num_gpu, num.len()),
            (tkey::gpu_milli, milli.len()),
        ],
        what,
    )?;
    let models = model_lists(tasks, tkey::gpu_models, what, m)?;
    if models.len() != m {
        return Err(field_error(
            &format!("{what}.gpu_models"),
            "length differs from cpu_milli",
        ));
    }
    let rdma = optional_ints(tasks, tkey::rdma, what, m)?;
    let rows = cpu.into_iter().zip(mem).zip(num).zip(milli).zip(models);
    Ok(rows
        .zip(rdma)
        .map(
            |(((((cpu_milli, memory_mib), num_gpu), gpu_milli), models), rdma)| TaskSpec {
                cpu_milli,
                memory_mib,
                num_gpu,
                gpu_milli,
                models,
                rdma,
            },
        )
        .collect())
}

/// The workload's shapes (read as every shape is: `super::shape`); the replay uses their CPU,
/// GPU request, models and weight, and the replay's own optional key `rdma` (percent of one
/// RNIC; absent: 0).
fn read_shapes(shapes: &Bound<'_, PyAny>) -> PyResult<Vec<ShapeSpec>> {
    let mut rdma = Vec::new();
    for (i, s) in sequence(shapes, || "shapes".to_string())?
        .iter()
        .enumerate()
    {
        let r = match s
            .cast::<PyDict>()
            .ok()
            .and_then(|d| d.get_item(skey::rdma).ok().flatten())
        {
            None => 0,
            Some(v) => v
                .extract::<i64>()
                .map_err(|_| field_error(&format!("shapes[{i}].rdma"), "expected an integer"))?,
        };
        rdma.push(r);
    }
    Ok(read_shape_list(shapes)?
        .into_iter()
        .zip(rdma)
        .map(|(s, rdma)| ShapeSpec {
            // read as a non-negative i64: it fits
            cpu_milli: i64::try_from(s.cpu_milli).unwrap_or(i64::MAX),
            num_gpu: s.gpus as i64,
            gpu_milli: s.gpu_milli as i64,
            models: s.gpu_models,
            weight: s.weight,
            rdma,
        })
        .collect())
}

/// The compaction settings (absent keys: the defaults); counts must be whole and in range.
fn read_compaction(c: Option<&Bound<'_, PyDict>>) -> PyResult<Option<Compaction>> {
    let Some(c) = c else { return Ok(None) };
    let get = |k: &str, dflt: f64| -> PyResult<f64> {
        match c.get_item(k)? {
            None => Ok(dflt),
            Some(v) => v
                .extract::<f64>()
                .map_err(|_| field_error(&format!("compaction.{k}"), "expected a number")),
        }
    };
    let d = Compaction::default();
    let every = get(ckey::every, d.every as f64)?;
    let max_moves = get(ckey::max_moves, d.max_moves as f64)?;
    let depth = get(ckey::rescue_depth, d.rescue_depth as f64)?;
    let rescue_budget = get(ckey::rescue_budget, d.rescue_budget as f64)?;
    if !(1.0..=1e9).contains(&every)
        || !(0.0..=1e9).contains(&max_moves)
        || !(0.0..=8.0).contains(&depth)
        || !(0.0..=1e9).contains(&rescue_budget)
    {
        return Err(field_error(
            "compaction",
            "every must be >= 1, max_moves and rescue_budget >= 0, rescue_depth 0..=8",
        ));
    }
    Ok(Some(Compaction {
        every: every as u32,
        budget: get(ckey::budget, d.budget)?,
        max_moves: max_moves as u32,
        min_gain: get(ckey::min_gain, d.min_gain)?,
        reserve: get(ckey::reserve, d.reserve)?,
        rescue_depth: depth as u32,
        rescue_budget: rescue_budget as u32,
    }))
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
    let out = PyDict::new(py);
    out.set_item("policy", policy.name())?;
    out.set_item("seed", seed)?;
    out.set_item("gpu_capacity_milli", res.gpu_capacity_milli)?;
    out.set_item("tasks", res.tasks)?;
    out.set_item("placed", res.placed)?;
    out.set_item("failed", res.failed)?;
    out.set_item("failed_admission", res.failed_admission)?;
    out.set_item("evictions", res.evictions)?;
    out.set_item("compaction_rounds", res.compaction_rounds)?;
    let cps = PyList::empty(py);
    for c in &res.checkpoints {
        let d = PyDict::new(py);
        d.set_item("arrived_pct", c.arrived_pct)?;
        d.set_item("arrived_milli", c.arrived_milli)?;
        d.set_item("allocated_milli", c.allocated_milli)?;
        d.set_item("frag_milli", c.frag_milli)?;
        d.set_item("idle_milli", c.idle_milli)?;
        d.set_item("numa_split_milli", c.numa_split_milli)?;
        d.set_item("arrived_tasks", c.arrived_tasks)?;
        d.set_item("failed_tasks", c.failed_tasks)?;
        d.set_item("evictions", c.evictions)?;
        cps.append(d)?;
    }
    out.set_item("checkpoints", cps)?;
    if placements {
        out.set_item("node_of", &res.node_of)?;
        out.set_item("task_of", &res.task_of)?;
    }
    Ok(out)
}

/// A column of times in seconds (None or NaN: absent).
fn times(d: &Bound<'_, PyDict>, key: &str, what: &str) -> PyResult<Vec<Option<f64>>> {
    sequence(&column(d, key, what)?, || format!("{what}.{key}"))?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            if v.is_none() {
                return Ok(None);
            }
            let x = v.extract::<f64>().map_err(|_| {
                field_error(&format!("{what}.{key}[{i}]"), "expected a number or None")
            })?;
            Ok((!x.is_nan()).then_some(x))
        })
        .collect()
}

/// The instances' columns: the tasks' (`read_tasks`) plus app, max_per_node (0 or less: no
/// limit), arrive and depart (seconds; None or NaN: before the start / after the end).
fn read_instances(d: &Bound<'_, PyDict>) -> PyResult<Vec<InstanceSpec>> {
    let tasks = read_task_columns(d, "instances")?;
    let n = tasks.len();
    let apps = ints(d, ikey::app, "instances")?;
    let caps = ints(d, ikey::max_per_node, "instances")?;
    let arrive = times(d, ikey::arrive, "instances")?;
    let depart = times(d, ikey::depart, "instances")?;
    same_len(
        &[
            (ikey::cpu_milli, n),
            (ikey::app, apps.len()),
            (ikey::max_per_node, caps.len()),
            (ikey::arrive, arrive.len()),
            (ikey::depart, depart.len()),
        ],
        "instances",
    )?;
    let mut out = Vec::with_capacity(n);
    for (i, ((((task, app), cap), a), dep)) in tasks
        .into_iter()
        .zip(apps)
        .zip(caps)
        .zip(arrive)
        .zip(depart)
        .enumerate()
    {
        let app = u32::try_from(app).map_err(|_| {
            field_error(
                &format!("instances.app[{i}]"),
                format!("{app} is outside 0..2^32"),
            )
        })?;
        out.push(InstanceSpec {
            task,
            app,
            max_per_node: cap.clamp(0, u32::MAX as i64) as u32,
            arrive: a.unwrap_or(0.0),
            depart: dep,
        });
    }
    Ok(out)
}

fn read_event_compaction(c: Option<&Bound<'_, PyDict>>) -> PyResult<Option<EventCompaction>> {
    let Some(c) = c else { return Ok(None) };
    let get = |k: &str, dflt: f64| -> PyResult<f64> {
        match c.get_item(k)? {
            None => Ok(dflt),
            Some(v) => v
                .extract::<f64>()
                .map_err(|_| field_error(&format!("compaction.{k}"), "expected a number")),
        }
    };
    let d = EventCompaction::default();
    let max_moves = get(ekey::max_moves, d.max_moves as f64)?;
    let depth = get(ekey::rescue_depth, d.rescue_depth as f64)?;
    let rescue_budget = get(ekey::rescue_budget, d.rescue_budget as f64)?;
    if !(0.0..=1e9).contains(&max_moves)
        || !(0.0..=8.0).contains(&depth)
        || !(0.0..=1e9).contains(&rescue_budget)
    {
        return Err(field_error(
            "compaction",
            "max_moves and rescue_budget must be >= 0, rescue_depth 0..=8",
        ));
    }
    Ok(Some(EventCompaction {
        interval: get(ekey::interval, d.interval)?,
        budget_per_day: get(ekey::budget_per_day, d.budget_per_day)?,
        max_moves: max_moves as u32,
        min_gain: get(ekey::min_gain, d.min_gain)?,
        rescue_depth: depth as u32,
        rescue_budget: rescue_budget as u32,
    }))
}

/// replay_events(nodes, instances, shapes, policy, seed, end, ...) -> dict: the inference
/// replay (`crate::replay::events::run_events`), instances arriving and leaving.
#[pyfunction]
#[pyo3(signature = (nodes, instances, shapes, policy = "fgd", seed = 42, end = 0.0, shuffle = true, compaction = None, sample_every = 0.0, log = false))]
#[allow(clippy::too_many_arguments)]
fn replay_events<'py>(
    py: Python<'py>,
    nodes: &Bound<'py, PyDict>,
    instances: &Bound<'py, PyDict>,
    shapes: &Bound<'py, PyAny>,
    policy: &str,
    seed: i64,
    end: f64,
    shuffle: bool,
    compaction: Option<&Bound<'py, PyDict>>,
    sample_every: f64,
    log: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let policy = Policy::parse(policy).ok_or_else(|| {
        field_error(
            "policy",
            format!("unknown policy {policy:?}; one of {POLICY_NAMES:?}"),
        )
    })?;
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
    let out = PyDict::new(py);
    out.set_item("policy", policy.name())?;
    out.set_item("seed", seed)?;
    out.set_item("gpu_capacity_milli", r.gpu_capacity_milli)?;
    out.set_item("end", r.end)?;
    out.set_item("instances", r.instances)?;
    out.set_item("arrived", r.arrived)?;
    out.set_item("placed_on_arrival", r.placed_on_arrival)?;
    out.set_item("placed_after_wait", r.placed_after_wait)?;
    out.set_item("never_placed", r.never_placed)?;
    out.set_item("evictions", r.evictions)?;
    out.set_item("compaction_rounds", r.compaction_rounds)?;
    out.set_item("rescues", r.rescues)?;
    out.set_item("frag_milli_s", r.frag_milli_s)?;
    out.set_item("idle_milli_s", r.idle_milli_s)?;
    out.set_item("allocated_milli_s", r.allocated_milli_s)?;
    out.set_item("pending_s", r.pending_s)?;
    out.set_item("running_s", r.running_s)?;
    let samples = PyList::empty(py);
    for s in &r.samples {
        let d = PyDict::new(py);
        d.set_item("t", s.t)?;
        d.set_item("allocated_milli", s.allocated_milli)?;
        d.set_item("idle_milli", s.idle_milli)?;
        d.set_item("frag_milli", s.frag_milli)?;
        d.set_item("pending", s.pending)?;
        d.set_item("running", s.running)?;
        d.set_item("evictions", s.evictions)?;
        samples.append(d)?;
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
