//! Python face of the trace replay: `replay_run(nodes, tasks, shapes, ...)` with columns in and
//! a dict of results out. Conversion only; the engine is `crate::replay`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{field_error, int_list, item, sequence, string_list, value_error};
use crate::replay::{run, Compaction, Config, NodeSpec, Policy, ShapeSpec, TaskSpec, POLICY_NAMES};

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

fn same_len(lens: &[(&str, usize)], what: &str) -> PyResult<usize> {
    let n = lens[0].1;
    for (k, l) in lens {
        if *l != n {
            return Err(field_error(
                &format!("{what}.{k}"),
                format!("{l} entries, but {} has {n}", lens[0].0),
            ));
        }
    }
    Ok(n)
}

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
    let names = strs(&column(nodes, "name", "nodes")?, "nodes.name")?;
    let cpu = ints(nodes, "cpu_milli", "nodes")?;
    let mem = ints(nodes, "memory_mib", "nodes")?;
    let gpu = ints(nodes, "gpu", "nodes")?;
    let models = strs(&column(nodes, "model", "nodes")?, "nodes.model")?;
    let n = same_len(
        &[
            ("name", names.len()),
            ("cpu_milli", cpu.len()),
            ("memory_mib", mem.len()),
            ("gpu", gpu.len()),
            ("model", models.len()),
        ],
        "nodes",
    )?;
    let node_specs: Vec<NodeSpec> = (0..n)
        .map(|i| NodeSpec {
            name: names[i].clone(),
            cpu_milli: cpu[i],
            memory_mib: mem[i],
            gpus: gpu[i],
            model: models[i].clone(),
        })
        .collect();
    let tcpu = ints(tasks, "cpu_milli", "tasks")?;
    let tmem = ints(tasks, "memory_mib", "tasks")?;
    let tnum = ints(tasks, "num_gpu", "tasks")?;
    let tmilli = ints(tasks, "gpu_milli", "tasks")?;
    let m = same_len(
        &[
            ("cpu_milli", tcpu.len()),
            ("memory_mib", tmem.len()),
            ("num_gpu", tnum.len()),
            ("gpu_milli", tmilli.len()),
        ],
        "tasks",
    )?;
    let tmodels = model_lists(tasks, "gpu_models", "tasks", m)?;
    if tmodels.len() != m {
        return Err(field_error(
            "tasks.gpu_models",
            "length differs from cpu_milli",
        ));
    }
    let task_specs: Vec<TaskSpec> = (0..m)
        .map(|i| TaskSpec {
            cpu_milli: tcpu[i],
            memory_mib: tmem[i],
            num_gpu: tnum[i],
            gpu_milli: tmilli[i],
            models: tmodels[i].clone(),
        })
        .collect();
    let mut shape_specs = Vec::new();
    for (i, s) in sequence(shapes, || "shapes".to_string())?
        .iter()
        .enumerate()
    {
        let d = s
            .cast::<PyDict>()
            .map_err(|_| field_error(&format!("shapes[{i}]"), "expected a dict"))?;
        let get_i = |k: &str| -> PyResult<i64> {
            match d.get_item(k)? {
                None => Ok(0),
                Some(v) if v.is_none() => Ok(0),
                Some(v) => v
                    .extract::<i64>()
                    .map_err(|_| field_error(&format!("shapes[{i}].{k}"), "expected an integer")),
            }
        };
        let weight: f64 = match d.get_item("weight")? {
            None => return Err(field_error(&format!("shapes[{i}].weight"), "missing")),
            Some(v) => v
                .extract()
                .map_err(|_| field_error(&format!("shapes[{i}].weight"), "expected a number"))?,
        };
        let models = match d.get_item("gpu_models")? {
            None => Vec::new(),
            Some(v) if v.is_none() => Vec::new(),
            Some(v) => strs(&v, &format!("shapes[{i}].gpu_models"))?,
        };
        shape_specs.push(ShapeSpec {
            cpu_milli: get_i("cpu_milli")?,
            num_gpu: get_i("gpus")?,
            gpu_milli: get_i("gpu_milli")?,
            models,
            weight,
        });
    }
    let compaction = match compaction {
        None => None,
        Some(c) => {
            let get = |k: &str, dflt: f64| -> PyResult<f64> {
                match c.get_item(k)? {
                    None => Ok(dflt),
                    Some(v) => v
                        .extract::<f64>()
                        .map_err(|_| field_error(&format!("compaction.{k}"), "expected a number")),
                }
            };
            let d = Compaction::default();
            let every = get("every", d.every as f64)?;
            let max_moves = get("max_moves", d.max_moves as f64)?;
            let depth = get("rescue_depth", d.rescue_depth as f64)?;
            let rescue_budget = get("rescue_budget", d.rescue_budget as f64)?;
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
            Some(Compaction {
                every: every as u32,
                budget: get("budget", d.budget)?,
                max_moves: max_moves as u32,
                min_gain: get("min_gain", d.min_gain)?,
                reserve: get("reserve", d.reserve)?,
                rescue_depth: depth as u32,
                rescue_budget: rescue_budget as u32,
            })
        }
    };
    let cfg = Config {
        policy,
        seed: seed as u64,
        tune,
        shuffle,
        numa,
        compaction,
        max_pct,
    };
    let res = py
        .detach(|| run(&node_specs, &task_specs, &shape_specs, &cfg))
        .map_err(value_error)?;
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
        out.set_item("node_of", res.node_of)?;
        out.set_item("task_of", res.task_of)?;
    }
    Ok(out)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay_run, m)?)?;
    m.add("REPLAY_POLICIES", PyList::new(m.py(), POLICY_NAMES)?)?;
    Ok(())
}
