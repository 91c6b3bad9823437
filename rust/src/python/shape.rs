//! Task shapes as Python gives them, read in one place for the scorer, the placement policy,
//! the compaction planner and the trace replay: a dict with `cpu_milli`, `memory_mib`, `gpus`,
//! `gpu_milli`, `gpu_memory_mib` (non-negative integers), `mig_profile`, `gpu_pool` (strings),
//! `gpu_models` (a list of strings), `dra`, `numa_aligned`, `link_group` (truthy) and `weight` (a number);
//! an absent key or None is 0, empty or false. Errors name the field (`shapes[2].gpus`).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use super::convert::{field_error, int, sequence, string, string_list, type_name};
use super::inputs::shape as key;
use crate::fragment::Shape;

/// Whether a shape carries a weight (the workload's shapes) or not (a single task: weight 1).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Weight {
    Required,
    Ignored,
}

/// `d[k]` unless absent or None.
fn present<'py>(
    d: &Bound<'py, PyDict>,
    k: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(k)?.filter(|v| !v.is_none()))
}

/// One shape at `prefix` (`shapes[0]`, `task`), before the core's validation.
pub fn read_shape(obj: &Bound<'_, PyAny>, prefix: &str, weight: Weight) -> PyResult<Shape> {
    let py = obj.py();
    let f = |k: &str| format!("{prefix}.{k}");
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| field_error(prefix, "expected an object"))?;
    let num = |k: &Bound<'_, PyString>, name: &str| -> PyResult<u64> {
        let Some(v) = present(d, k)? else {
            return Ok(0);
        };
        let x = int(&v, || f(name))?;
        u64::try_from(x)
            .map_err(|_| field_error(&f(name), format!("must not be negative, got {x}")))
    };
    let cpu_milli = num(intern!(py, key::cpu_milli), key::cpu_milli)?;
    let memory_mib = num(intern!(py, key::memory_mib), key::memory_mib)?;
    let gpus = num(intern!(py, key::gpus), key::gpus)?;
    let gpu_milli = num(intern!(py, key::gpu_milli), key::gpu_milli)?;
    let gpus = u32::try_from(gpus).map_err(|_| field_error(&f(key::gpus), "too large"))?;
    let gpu_milli =
        u32::try_from(gpu_milli).map_err(|_| field_error(&f(key::gpu_milli), "too large"))?;
    let mig_profile = match present(d, intern!(py, key::mig_profile))? {
        Some(v) => Some(string(&v, || f(key::mig_profile))?),
        None => None,
    };
    let gpu_models = match present(d, intern!(py, key::gpu_models))? {
        Some(v) => string_list(&v, || f(key::gpu_models))?,
        None => Vec::new(),
    };
    let gpu_pool = match present(d, intern!(py, key::gpu_pool))? {
        Some(v) => string(&v, || f(key::gpu_pool))?,
        None => String::new(),
    };
    let gpu_memory_mib = num(intern!(py, key::gpu_memory_mib), key::gpu_memory_mib)?;
    let weight = match weight {
        Weight::Ignored => 1.0,
        Weight::Required => match d.get_item(intern!(py, key::weight))? {
            None => return Err(field_error(&f(key::weight), "missing")),
            Some(v) => v.extract::<f64>().map_err(|_| {
                field_error(
                    &f(key::weight),
                    format!("expected a number, got {}", type_name(&v)),
                )
            })?,
        },
    };
    let flag = |k: &Bound<'_, PyString>| -> PyResult<bool> {
        Ok(match present(d, k)? {
            Some(v) => v.is_truthy()?,
            None => false,
        })
    };
    let dra = flag(intern!(py, key::dra))?;
    let numa_aligned = flag(intern!(py, key::numa_aligned))?;
    let link_group = flag(intern!(py, key::link_group))?;
    Ok(Shape {
        cpu_milli,
        memory_mib,
        gpus,
        gpu_milli,
        mig_profile,
        gpu_models,
        weight,
        dra,
        numa_aligned,
        gpu_pool,
        gpu_memory_mib,
        link_group,
    })
}

/// A list of weighted shapes (`shapes[i]`), before the core's validation.
pub fn read_shape_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Shape>> {
    sequence(obj, || "shapes".to_string())?
        .iter()
        .enumerate()
        .map(|(i, x)| read_shape(x, &format!("shapes[{i}]"), Weight::Required))
        .collect()
}
