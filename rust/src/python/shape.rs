//! Task shapes as Python gives them (`ShapeInput`, declared in `super::inputs`), read in one
//! place for the scorer, the placement policy, the compaction planner and the trace replay, and
//! validated by the core. Errors name the field (`shapes[2].gpus`).

use pyo3::prelude::*;

use super::convert::{value_error, Path, Read};
use super::inputs::shape;
use crate::error::CoreError;
use crate::fragment::{validate_shapes, Shape};

impl From<shape::Input> for Shape {
    fn from(s: shape::Input) -> Shape {
        Shape {
            cpu_milli: s.cpu_milli,
            memory_mib: s.memory_mib,
            gpus: s.gpus,
            gpu_milli: s.gpu_milli,
            mig_profile: s.mig_profile,
            gpu_models: s.gpu_models,
            weight: s.weight,
            dra: s.dra,
            numa_aligned: s.numa_aligned,
            gpu_pool: s.gpu_pool,
            gpu_memory_mib: s.gpu_memory_mib,
            link_group: s.link_group,
            rdma: s.rdma,
        }
    }
}

/// The workload's shapes, validated by the core (weights normalised).
pub fn read_shapes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Shape>> {
    let mut shapes: Vec<Shape> = Vec::<shape::Input>::named(obj, "shapes")?
        .into_iter()
        .map(Shape::from)
        .collect();
    validate_shapes(&mut shapes).map_err(value_error)?;
    Ok(shapes)
}

/// A single task's shape at `at` (its weight is ignored), validated by the core.
pub fn read_task(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Shape> {
    let mut one = vec![Shape::from(shape::Input::read(obj, at)?)];
    one[0].weight = 1.0;
    validate_shapes(&mut one).map_err(|e| {
        value_error(CoreError::new(
            e.field.replace("shapes[0]", &at()),
            e.message,
        ))
    })?;
    Ok(one.remove(0))
}
