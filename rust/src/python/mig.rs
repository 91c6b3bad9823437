//! Python face of the MIG geometry and planner: plain data in (names, dicts, lists), plain data
//! out (dicts, lists, tuples). Profile and model names are resolved here; errors name the field.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::convert::{entries, field_error, fields, value_error, Path, Read};
use super::inputs::{mig_gpu, mig_limits, mig_pending, mig_workload};
use crate::mig::planner::{Demand, Executor, GpuInstance, GpuPlan, Limits, MigGpu, Plan};
use crate::mig::{self, Catalog, GpuModel, Rules};

fn model_of(name: &Bound<'_, PyAny>) -> PyResult<&'static GpuModel> {
    let name: String = name
        .cast::<PyString>()
        .map_err(|_| field_error("gpu_model", "expected a GPU model name"))?
        .to_string();
    Catalog::builtin().model(&name).map_err(value_error)
}

/// The index of a profile of `model` named by `name` (the field `at`).
fn profile_index(model: &GpuModel, name: &str, at: Path<'_>) -> PyResult<usize> {
    model
        .profile_index(name)
        .map_err(|e| field_error(&at(), e.message))
}

fn profile_of(model: &GpuModel, obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<usize> {
    profile_index(model, &String::read(obj, at)?, at)
}

/// A list of profile names of `model` (the field `name`), as indices.
fn profile_list(model: &GpuModel, obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Vec<usize>> {
    let names = Vec::<String>::named(obj, name)?.into_iter().enumerate();
    names
        .map(|(i, p)| profile_index(model, &p, &|| format!("{name}[{i}]")))
        .collect()
}

/// An executor by name (`limits.executor`).
impl Read for Executor {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        Executor::parse(&String::read(obj, at)?).map_err(value_error)
    }
}

fn model_dict<'py>(py: Python<'py>, m: &GpuModel) -> PyResult<Bound<'py, PyDict>> {
    let d = fields!(
        py, m;
        name, aliases, pci_device_ids, memory_slices, compute_slices, placements_inferred, notes
    );
    let profiles = PyList::empty(py);
    for p in &m.profiles {
        let pd = fields!(
            py, p;
            name, id, compute_slices, memory_slices, max_count, media_extensions,
            placements_inferred
        );
        let pls: Vec<(u8, u8)> = p.placements.iter().map(|x| (x.start, x.size)).collect();
        pd.set_item("placements", pls)?;
        profiles.append(pd)?;
    }
    d.set_item("profiles", profiles)?;
    Ok(d)
}

/// mig_models() -> list[dict]: every model of the built-in catalog.
#[pyfunction]
fn mig_models(py: Python<'_>) -> PyResult<Vec<Bound<'_, PyDict>>> {
    Catalog::builtin()
        .models()
        .iter()
        .map(|m| model_dict(py, m))
        .collect()
}

/// mig_model(gpu_model) -> dict: one model, resolved from a name, alias or product label.
#[pyfunction]
fn mig_model<'py>(py: Python<'py>, gpu_model: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
    model_dict(py, model_of(gpu_model)?)
}

/// mig_validate(gpu_model, instances, pre_r510=False) -> (valid, [(profile, start)], reason)
/// The placements (canonical profile names, memory-slice starts) only when valid.
#[pyfunction]
#[pyo3(signature = (gpu_model, instances, pre_r510=false))]
fn mig_validate(
    gpu_model: &Bound<'_, PyAny>,
    instances: &Bound<'_, PyAny>,
    pre_r510: bool,
) -> PyResult<(bool, NamedLayout, String)> {
    let model = model_of(gpu_model)?;
    let texts = Vec::<String>::named(instances, "instances")?;
    let parsed = mig::parse_instances(model, &texts).map_err(value_error)?;
    let v = mig::check(model, &parsed, Rules { pre_r510 }).map_err(value_error)?;
    let placements = if v.valid {
        parsed
            .iter()
            .zip(&v.starts)
            .map(|(i, &s)| (model.profiles[i.profile].name.clone(), s))
            .collect()
    } else {
        Vec::new()
    };
    Ok((v.valid, placements, v.reason))
}

/// mig_profile_name(gpu_model, profile) -> str: the canonical name of a profile of the model.
#[pyfunction]
fn mig_profile_name(gpu_model: &Bound<'_, PyAny>, profile: &Bound<'_, PyAny>) -> PyResult<String> {
    let model = model_of(gpu_model)?;
    let i = profile_of(model, profile, &|| "profile".to_string())?;
    Ok(model.profiles[i].name.clone())
}

/// Layouts as lists of (profile name, start).
type NamedLayout = Vec<(String, u8)>;

/// mig_layouts(gpu_model, profiles=None, media_extensions=False, pre_r510=False)
///   -> (number of valid non-empty multisets, maximal layouts)
#[pyfunction]
#[pyo3(signature = (gpu_model, profiles=None, media_extensions=false, pre_r510=false))]
fn mig_layouts(
    py: Python<'_>,
    gpu_model: &Bound<'_, PyAny>,
    profiles: Option<&Bound<'_, PyAny>>,
    media_extensions: bool,
    pre_r510: bool,
) -> PyResult<(usize, Vec<NamedLayout>)> {
    let model = model_of(gpu_model)?;
    let chosen: Vec<usize> = match profiles.filter(|p| !p.is_none()) {
        Some(list) => profile_list(model, list, "profiles")?,
        None if media_extensions => (0..model.profiles.len()).collect(),
        None => mig::default_profiles(model),
    };
    let e = py
        .detach(|| mig::enumerate(model, &chosen, Rules { pre_r510 }))
        .map_err(value_error)?;
    let name = |p: usize| model.profiles[p].name.clone();
    let layouts = e
        .maximal
        .iter()
        .map(|l| l.instances.iter().map(|&(p, s)| (name(p), s)).collect())
        .collect();
    Ok((e.valid_multisets, layouts))
}

/// mig_place(gpu_model, pinned, unpinned) -> list[int] | None
/// `pinned`: (profile, start) pairs kept in place; `unpinned`: profile names.
#[pyfunction]
fn mig_place(
    gpu_model: &Bound<'_, PyAny>,
    pinned: &Bound<'_, PyAny>,
    unpinned: &Bound<'_, PyAny>,
) -> PyResult<Option<Vec<u32>>> {
    let model = model_of(gpu_model)?;
    let mut pins = Vec::new();
    for (i, (name, start)) in Vec::<(String, i64)>::named(pinned, "pinned")?
        .into_iter()
        .enumerate()
    {
        let p = profile_index(model, &name, &|| format!("pinned[{i}][0]"))?;
        let Ok(s) = u8::try_from(start) else {
            return Ok(None);
        };
        pins.push((p, s));
    }
    let free = profile_list(model, unpinned, "unpinned")?;
    let starts = mig::place(model, &pins, &free);
    Ok(starts.map(|v| v.into_iter().map(u32::from).collect()))
}

fn read_gpus(model: &GpuModel, obj: &Bound<'_, PyAny>) -> PyResult<Vec<MigGpu>> {
    let mut gpus = Vec::new();
    for (g, gpu) in Vec::<mig_gpu::Input>::named(obj, "gpus")?
        .into_iter()
        .enumerate()
    {
        let mut instances = Vec::with_capacity(gpu.instances.len());
        for (i, x) in gpu.instances.into_iter().enumerate() {
            let at = || format!("gpus[{g}].instances[{i}].profile");
            let profile = profile_index(model, &x.profile, &at)?;
            let (start, used, pod) = (x.start, x.used, x.pod);
            instances.push(GpuInstance {
                profile,
                start,
                used,
                pod,
            });
        }
        gpus.push(MigGpu {
            id: gpu.gpu,
            instances,
        });
    }
    Ok(gpus)
}

/// The pending requests (`{profile: count}` or `[{"profile", "count"?}]`) and the workload.
fn read_demand(
    model: &GpuModel,
    pending: &Bound<'_, PyAny>,
    workload: Option<&Bound<'_, PyAny>>,
) -> PyResult<Demand> {
    let mut demand = Demand::default();
    if pending.is_instance_of::<PyDict>() {
        for (name, count) in entries::<u32>(pending, &|| "pending".into(), "a mapping")? {
            let at = || format!("pending[{name:?}]");
            demand
                .pending
                .push((profile_index(model, &name, &at)?, count));
        }
    } else {
        for (i, p) in Vec::<mig_pending::Input>::named(pending, "pending")?
            .into_iter()
            .enumerate()
        {
            let at = || format!("pending[{i}].profile");
            demand
                .pending
                .push((profile_index(model, &p.profile, &at)?, p.count.unwrap_or(1)));
        }
    }
    if let Some(w) = workload.filter(|w| !w.is_none()) {
        for (i, w) in Vec::<mig_workload::Input>::named(w, "workload")?
            .into_iter()
            .enumerate()
        {
            let at = || format!("workload[{i}].profile");
            demand
                .workload
                .push((profile_index(model, &w.profile, &at)?, w.weight));
        }
    }
    Ok(demand)
}

fn plan_dict<'py>(
    py: Python<'py>,
    model: &GpuModel,
    plan: &Plan,
    limits: &Limits,
) -> PyResult<Bound<'py, PyDict>> {
    let name = |p: usize| model.profiles[p].name.as_str();
    let d = fields!(
        py, plan;
        exact, net_served, used_destroyed, free_destroyed, changed_gpus, fragment_before,
        fragment_after
    );
    d.set_item("gpu_model", &model.name)?;
    d.set_item("placements_inferred", model.placements_inferred)?;
    d.set_item("executor", limits.executor.name())?;
    let wanted = PyList::empty(py);
    for &(p, weight) in &plan.wanted {
        let x = PyDict::new(py);
        x.set_item("profile", name(p))?;
        x.set_item("weight", weight)?;
        wanted.append(x)?;
    }
    d.set_item("wanted", wanted)?;
    let demand = PyList::empty(py);
    for l in &plan.demand {
        let x = fields!(py, l; pending, served_before, served_after, moved, rehoused);
        x.set_item("profile", name(l.profile))?;
        demand.append(x)?;
    }
    d.set_item("demand", demand)?;
    let gpus = PyList::empty(py);
    for g in &plan.gpus {
        gpus.append(gpu_plan_dict(py, model, g)?)?;
    }
    d.set_item("gpus", gpus)?;
    Ok(d)
}

/// One GPU of a plan: its layout after the plan (each instance with its fate), what it
/// destroys, the pods to move and what it serves.
fn gpu_plan_dict<'py>(
    py: Python<'py>,
    model: &GpuModel,
    g: &GpuPlan,
) -> PyResult<Bound<'py, PyDict>> {
    let name = |p: usize| model.profiles[p].name.as_str();
    let x = fields!(py, g; changed, pods_to_move, fragment_before, fragment_after);
    x.set_item("gpu", g.id)?;
    let layout = PyList::empty(py);
    for i in &g.layout {
        let y = fields!(py, i; start, pod);
        y.set_item("profile", name(i.profile))?;
        y.set_item("state", i.fate.name())?;
        layout.append(y)?;
    }
    x.set_item("layout", layout)?;
    let destroyed = PyList::empty(py);
    for i in &g.destroyed {
        let y = fields!(py, i; start, used, pod);
        y.set_item("profile", name(i.profile))?;
        destroyed.append(y)?;
    }
    x.set_item("destroyed", destroyed)?;
    let serves = PyList::empty(py);
    for &(p, count) in &g.serves {
        let y = PyDict::new(py);
        y.set_item("profile", name(p))?;
        y.set_item("count", count)?;
        serves.append(y)?;
    }
    x.set_item("serves", serves)?;
    Ok(x)
}

/// mig_plan(gpu_model, gpus, pending, workload=None, limits=None) -> dict
#[pyfunction]
#[pyo3(signature = (gpu_model, gpus, pending, workload=None, limits=None))]
fn mig_plan<'py>(
    py: Python<'py>,
    gpu_model: &Bound<'py, PyAny>,
    gpus: &Bound<'py, PyAny>,
    pending: &Bound<'py, PyAny>,
    workload: Option<&Bound<'py, PyAny>>,
    limits: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let model = model_of(gpu_model)?;
    let gpus = read_gpus(model, gpus)?;
    let demand = read_demand(model, pending, workload)?;
    let limits = match limits.filter(|l| !l.is_none()) {
        None => Limits::default(),
        Some(l) => mig_limits::Input::named(l, "limits")?,
    };
    let plan = py
        .detach(|| mig::plan(model, &gpus, &demand, &limits))
        .map_err(value_error)?;
    plan_dict(py, model, &plan, &limits)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mig_models, m)?)?;
    m.add_function(wrap_pyfunction!(mig_model, m)?)?;
    m.add_function(wrap_pyfunction!(mig_validate, m)?)?;
    m.add_function(wrap_pyfunction!(mig_profile_name, m)?)?;
    m.add_function(wrap_pyfunction!(mig_layouts, m)?)?;
    m.add_function(wrap_pyfunction!(mig_place, m)?)?;
    m.add_function(wrap_pyfunction!(mig_plan, m)?)?;
    Ok(())
}
