//! Python face of the MIG geometry and planner: plain data in (names, dicts, lists), plain data
//! out (dicts, lists, tuples). Profile and model names are resolved here; errors name the field.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyList, PyString};

use super::convert::{
    boolean, field_error, int, member, required, sequence, string, value_error, Field,
};
use super::inputs;
use crate::mig::planner::{Demand, Executor, GpuInstance, GpuPlan, Limits, MigGpu, Plan};
use crate::mig::{self, Catalog, GpuModel, Rules};

fn model_of(name: &Bound<'_, PyAny>) -> PyResult<&'static GpuModel> {
    let name: String = name
        .cast::<PyString>()
        .map_err(|_| field_error("gpu_model", "expected a GPU model name"))?
        .to_string();
    Catalog::builtin().model(&name).map_err(value_error)
}

fn profile_of(model: &GpuModel, obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<usize> {
    let name = string(obj, &field)?;
    model
        .profile_index(&name)
        .map_err(|e| field_error(&field(), e.message))
}

fn model_dict<'py>(py: Python<'py>, m: &GpuModel) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &m.name)?;
    d.set_item("aliases", &m.aliases)?;
    d.set_item("pci_device_ids", &m.pci_device_ids)?;
    d.set_item("memory_slices", m.memory_slices)?;
    d.set_item("compute_slices", m.compute_slices)?;
    d.set_item("placements_inferred", m.placements_inferred)?;
    d.set_item("notes", &m.notes)?;
    let profiles = PyList::empty(py);
    for p in &m.profiles {
        let pd = PyDict::new(py);
        pd.set_item("name", &p.name)?;
        pd.set_item("id", p.id)?;
        pd.set_item("compute_slices", p.compute_slices)?;
        pd.set_item("memory_slices", p.memory_slices)?;
        pd.set_item("max_count", p.max_count)?;
        let pls: Vec<(u8, u8)> = p.placements.iter().map(|x| (x.start, x.size)).collect();
        pd.set_item("placements", pls)?;
        pd.set_item("media_extensions", p.media_extensions)?;
        pd.set_item("placements_inferred", p.placements_inferred)?;
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
    let items = sequence(instances, || "instances".to_string())?;
    let mut texts = Vec::with_capacity(items.len());
    for (i, x) in items.iter().enumerate() {
        texts.push(string(x, || format!("instances[{i}]"))?);
    }
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
    let i = profile_of(model, profile, || "profile".to_string())?;
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
        Some(list) => {
            let items = sequence(list, || "profiles".to_string())?;
            let mut out = Vec::with_capacity(items.len());
            for (i, x) in items.iter().enumerate() {
                out.push(profile_of(model, x, || format!("profiles[{i}]"))?);
            }
            out
        }
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
    for (i, x) in sequence(pinned, || "pinned".to_string())?
        .iter()
        .enumerate()
    {
        let pair = sequence(x, || format!("pinned[{i}]"))?;
        if pair.len() != 2 {
            return Err(field_error(
                &format!("pinned[{i}]"),
                "expected (profile, start)",
            ));
        }
        let p = profile_of(model, &pair[0], || format!("pinned[{i}][0]"))?;
        let s = int(&pair[1], || format!("pinned[{i}][1]"))?;
        let Ok(s) = u8::try_from(s) else {
            return Ok(None);
        };
        pins.push((p, s));
    }
    let mut free = Vec::new();
    for (i, x) in sequence(unpinned, || "unpinned".to_string())?
        .iter()
        .enumerate()
    {
        free.push(profile_of(model, x, || format!("unpinned[{i}]"))?);
    }
    let starts = mig::place(model, &pins, &free);
    Ok(starts.map(|v| v.into_iter().map(u32::from).collect()))
}

fn opt_member<'py>(
    obj: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(member(obj, key)?.filter(|v| !v.is_none()))
}

fn read_gpus(model: &GpuModel, obj: &Bound<'_, PyAny>) -> PyResult<Vec<MigGpu>> {
    let py = obj.py();
    let items = sequence(obj, || "gpus".to_string())?;
    let mut gpus = Vec::with_capacity(items.len());
    for (g, item) in items.iter().enumerate() {
        let gf = || format!("gpus[{g}]");
        let id = int(
            &required(item, intern!(py, inputs::mig_gpu::gpu), gf)?,
            || format!("gpus[{g}].gpu"),
        )?;
        let id = u32::try_from(id).map_err(|_| {
            field_error(
                &format!("gpus[{g}].gpu"),
                format!("GPU index {id} is negative or too large"),
            )
        })?;
        let mut instances = Vec::new();
        if let Some(list) = opt_member(item, intern!(py, inputs::mig_gpu::instances))? {
            for (i, x) in sequence(&list, || format!("gpus[{g}].instances"))?
                .iter()
                .enumerate()
            {
                let f = |s: &str| format!("gpus[{g}].instances[{i}]{s}");
                let profile = profile_of(
                    model,
                    &required(x, intern!(py, inputs::mig_instance::profile), || f(""))?,
                    || f(".profile"),
                )?;
                let start = int(
                    &required(x, intern!(py, inputs::mig_instance::start), || f(""))?,
                    || f(".start"),
                )?;
                let start = u8::try_from(start).map_err(|_| {
                    field_error(
                        &f(".start"),
                        format!("memory slice {start} is outside the GPU"),
                    )
                })?;
                let used = match opt_member(x, intern!(py, inputs::mig_instance::used))? {
                    Some(v) => boolean(&v, || f(".used"))?,
                    None => false,
                };
                let pod = match opt_member(x, intern!(py, inputs::mig_instance::pod))? {
                    Some(v) => Some(string(&v, || f(".pod"))?),
                    None => None,
                };
                instances.push(GpuInstance {
                    profile,
                    start,
                    used,
                    pod,
                });
            }
        }
        gpus.push(MigGpu { id, instances });
    }
    Ok(gpus)
}

fn number(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<f64> {
    if obj.is_instance_of::<PyFloat>() {
        return obj.extract::<f64>();
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(int(obj, field)? as f64);
    }
    Err(field_error(
        &field(),
        format!("expected a number, got {}", super::convert::type_name(obj)),
    ))
}

fn read_demand(
    model: &GpuModel,
    pending: &Bound<'_, PyAny>,
    workload: Option<&Bound<'_, PyAny>>,
) -> PyResult<Demand> {
    let py = pending.py();
    let mut demand = Demand::default();
    if let Ok(map) = pending.cast::<PyDict>() {
        for (k, v) in map.iter() {
            let name = string(&k, || "pending".to_string())?;
            let f = || format!("pending[{name:?}]");
            let p = profile_of(model, &k, f)?;
            let c = int(&v, f)?;
            let c = u32::try_from(c)
                .map_err(|_| field_error(&f(), format!("count {c} is negative")))?;
            demand.pending.push((p, c));
        }
    } else {
        for (i, x) in sequence(pending, || "pending".to_string())?
            .iter()
            .enumerate()
        {
            let f = |s: &str| format!("pending[{i}]{s}");
            let p = profile_of(
                model,
                &required(x, intern!(py, inputs::mig_pending::profile), || f(""))?,
                || f(".profile"),
            )?;
            let c = match opt_member(x, intern!(py, inputs::mig_pending::count))? {
                Some(v) => int(&v, || f(".count"))?,
                None => 1,
            };
            let c = u32::try_from(c)
                .map_err(|_| field_error(&f(".count"), format!("count {c} is negative")))?;
            demand.pending.push((p, c));
        }
    }
    if let Some(w) = workload.filter(|w| !w.is_none()) {
        for (i, x) in sequence(w, || "workload".to_string())?.iter().enumerate() {
            let f = |s: &str| format!("workload[{i}]{s}");
            let p = profile_of(
                model,
                &required(x, intern!(py, inputs::mig_workload::profile), || f(""))?,
                || f(".profile"),
            )?;
            let weight = number(
                &required(x, intern!(py, inputs::mig_workload::weight), || f(""))?,
                || f(".weight"),
            )?;
            demand.workload.push((p, weight));
        }
    }
    Ok(demand)
}

fn read_limits(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Limits> {
    let mut limits = Limits::default();
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(limits);
    };
    let py = obj.py();
    if let Some(g) = opt_member(obj, intern!(py, inputs::mig_limits::gpus))? {
        let ids = super::convert::int_list(&g, || "limits.gpus".to_string())?;
        let mut out = Vec::with_capacity(ids.len());
        for (i, id) in ids.into_iter().enumerate() {
            out.push(u32::try_from(id).map_err(|_| {
                field_error(
                    &format!("limits.gpus[{i}]"),
                    format!("GPU index {id} is negative or too large"),
                )
            })?);
        }
        limits.gpus = Some(out);
    }
    if let Some(v) = opt_member(obj, intern!(py, inputs::mig_limits::max_used_destroyed))? {
        let n = int(&v, || "limits.max_used_destroyed".to_string())?;
        limits.max_used_destroyed = u32::try_from(n).map_err(|_| {
            field_error(
                "limits.max_used_destroyed",
                format!("{n} is negative or too large"),
            )
        })?;
    }
    if let Some(v) = opt_member(obj, intern!(py, inputs::mig_limits::executor))? {
        limits.executor =
            Executor::parse(&string(&v, || "limits.executor".to_string())?).map_err(value_error)?;
    }
    Ok(limits)
}

fn plan_dict<'py>(
    py: Python<'py>,
    model: &GpuModel,
    plan: &Plan,
    limits: &Limits,
) -> PyResult<Bound<'py, PyDict>> {
    let name = |p: usize| model.profiles[p].name.as_str();
    let d = PyDict::new(py);
    d.set_item("gpu_model", &model.name)?;
    d.set_item("placements_inferred", model.placements_inferred)?;
    d.set_item("executor", limits.executor.name())?;
    d.set_item("exact", plan.exact)?;
    d.set_item("net_served", plan.net_served)?;
    d.set_item("used_destroyed", plan.used_destroyed)?;
    d.set_item("free_destroyed", plan.free_destroyed)?;
    d.set_item("changed_gpus", plan.changed_gpus)?;
    d.set_item("fragment_before", plan.fragment_before)?;
    d.set_item("fragment_after", plan.fragment_after)?;
    let wanted = PyList::empty(py);
    for &(p, w) in &plan.wanted {
        let x = PyDict::new(py);
        x.set_item("profile", name(p))?;
        x.set_item("weight", w)?;
        wanted.append(x)?;
    }
    d.set_item("wanted", wanted)?;
    let demand = PyList::empty(py);
    for l in &plan.demand {
        let x = PyDict::new(py);
        x.set_item("profile", name(l.profile))?;
        x.set_item("pending", l.pending)?;
        x.set_item("served_before", l.served_before)?;
        x.set_item("served_after", l.served_after)?;
        x.set_item("moved", l.moved)?;
        x.set_item("rehoused", l.rehoused)?;
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
    let x = PyDict::new(py);
    x.set_item("gpu", g.id)?;
    x.set_item("changed", g.changed)?;
    let layout = PyList::empty(py);
    for i in &g.layout {
        let y = PyDict::new(py);
        y.set_item("profile", name(i.profile))?;
        y.set_item("start", i.start)?;
        y.set_item("state", i.fate.name())?;
        y.set_item("pod", &i.pod)?;
        layout.append(y)?;
    }
    x.set_item("layout", layout)?;
    let destroyed = PyList::empty(py);
    for i in &g.destroyed {
        let y = PyDict::new(py);
        y.set_item("profile", name(i.profile))?;
        y.set_item("start", i.start)?;
        y.set_item("used", i.used)?;
        y.set_item("pod", &i.pod)?;
        destroyed.append(y)?;
    }
    x.set_item("destroyed", destroyed)?;
    x.set_item("pods_to_move", &g.pods_to_move)?;
    let serves = PyList::empty(py);
    for &(p, c) in &g.serves {
        let y = PyDict::new(py);
        y.set_item("profile", name(p))?;
        y.set_item("count", c)?;
        serves.append(y)?;
    }
    x.set_item("serves", serves)?;
    x.set_item("fragment_before", g.fragment_before)?;
    x.set_item("fragment_after", g.fragment_after)?;
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
    let limits = read_limits(limits)?;
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
