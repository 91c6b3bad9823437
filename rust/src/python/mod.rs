//! The `pyctl._core` extension module: conversions between Python values and the core's types,
//! and nothing else. Core errors become `ValueError`s carrying the field name.

mod convert;
mod fragment;
mod inputs;
mod mig;
mod replay;
mod shape;
mod topology;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    topology::register(m)?;
    fragment::register(m)?;
    mig::register(m)?;
    replay::register(m)?;
    inputs::register(m)?;
    Ok(())
}
