//! Shared conversion helpers: reading plain Python data (dicts, lists, ints, bools, or objects
//! with the same attributes) with errors that name the field.
//!
//! Field names are built only when an error is raised (`Field` is a closure), so converting
//! well-formed input allocates nothing for them.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::error::CoreError;

/// The name of a field, produced on demand.
pub trait Field: Fn() -> String {}
impl<F: Fn() -> String> Field for F {}

/// Items a long conversion reads between two chances for another Python thread to take the GIL.
const YIELD_EVERY: usize = 1024;

/// Called once per item of a long conversion (tens of thousands of items, read with the GIL
/// held): every `YIELD_EVERY` items the GIL is released and taken again, so a thread waiting
/// for it (the controller's event loop, the extender's server) gets its turn when its switch
/// request is pending, instead of waiting for the whole conversion (hundreds of milliseconds
/// at 50,000 pods). A caller mutating the objects being read meanwhile gets a result of
/// whichever values it read, never a crash.
pub fn let_others_run(py: Python<'_>, i: usize) {
    if i % YIELD_EVERY == YIELD_EVERY - 1 {
        py.detach(|| ());
    }
}

pub fn value_error(e: CoreError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

pub fn field_error(field: &str, message: impl Into<String>) -> PyErr {
    value_error(CoreError::new(field, message))
}

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// A Python int that is not a bool.
pub fn int(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(field_error(
            &field(),
            format!("expected an integer, got {}", type_name(obj)),
        ));
    }
    obj.extract::<i64>()
        .map_err(|_| field_error(&field(), "integer out of range"))
}

pub fn boolean(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<bool> {
    if !obj.is_instance_of::<PyBool>() {
        return Err(field_error(
            &field(),
            format!("expected true or false, got {}", type_name(obj)),
        ));
    }
    obj.extract::<bool>()
}

/// Items of a list or tuple (or another iterable that is not a string or a mapping).
pub fn sequence<'py>(
    obj: &Bound<'py, PyAny>,
    field: impl Field,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    let not_a_list = || field_error(&field(), format!("expected a list, got {}", type_name(obj)));
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(not_a_list());
    }
    obj.try_iter().map_err(|_| not_a_list())?.collect()
}

pub fn int_list(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<Vec<i64>> {
    let items = sequence(obj, &field)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, x) in items.iter().enumerate() {
        out.push(int(x, || format!("{}[{i}]", field()))?);
    }
    Ok(out)
}

/// `obj[key]` for a dict, `obj.key` for any other object; `Ok(None)` when absent.
pub fn member<'py>(
    obj: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if let Ok(d) = obj.cast::<PyDict>() {
        return d.get_item(key);
    }
    match obj.getattr(key) {
        Ok(v) => Ok(Some(v)),
        Err(_) => Ok(None),
    }
}

pub fn required<'py>(
    obj: &Bound<'py, PyAny>,
    key: &Bound<'py, PyString>,
    field: impl Field,
) -> PyResult<Bound<'py, PyAny>> {
    member(obj, key)?.ok_or_else(|| field_error(&field(), format!("missing {:?}", key.to_string())))
}

/// A Python str.
pub fn string(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<String> {
    obj.cast::<PyString>().map(|s| s.to_string()).map_err(|_| {
        field_error(
            &field(),
            format!("expected a string, got {}", type_name(obj)),
        )
    })
}

pub fn string_list(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<Vec<String>> {
    let items = sequence(obj, &field)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, x) in items.iter().enumerate() {
        out.push(string(x, || format!("{}[{i}]", field()))?);
    }
    Ok(out)
}

/// `d[key]` of a dict that must have it; the error names `field`.
pub fn item<'py>(d: &Bound<'py, PyDict>, key: &str, field: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?
        .ok_or_else(|| field_error(field, format!("missing {key:?}")))
}
