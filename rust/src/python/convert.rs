//! Reading plain Python data (dicts, lists, ints, bools, or objects with the same attributes)
//! with errors that name the field: the `Read` trait, implemented here for the values the core
//! takes and by `super::inputs` for each declared input type.
//!
//! A field's name is built only when an error is raised (`Path` is a closure), so converting
//! well-formed input allocates nothing for names.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::error::CoreError;

/// The name of the field being read, produced on demand.
pub type Path<'a> = &'a dyn Fn() -> String;

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

fn expected(obj: &Bound<'_, PyAny>, at: Path<'_>, what: &str) -> PyErr {
    field_error(&at(), format!("expected {what}, got {}", type_name(obj)))
}

/// A value read from Python: `read` takes the object and the name of its field.
pub trait Read: Sized {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self>;

    /// `T::read` with the field named `name`.
    fn named(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        Self::read(obj, &|| name.to_string())
    }
}

/// A Python int that is not a bool.
impl Read for i64 {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
            return Err(expected(obj, at, "an integer"));
        }
        obj.extract::<i64>()
            .map_err(|_| field_error(&at(), "integer out of range"))
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        /// A Python int that is not a bool, not negative and within the type's range.
        impl Read for $t {
            fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
                let x = i64::read(obj, at)?;
                <$t>::try_from(x).map_err(|_| match x {
                    ..0 => field_error(&at(), format!("must not be negative, got {x}")),
                    _ => field_error(&at(), "too large"),
                })
            }
        }
    )*};
}
unsigned!(u8, u32, u64, usize);

impl Read for bool {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if !obj.is_instance_of::<PyBool>() {
            return Err(expected(obj, at, "true or false"));
        }
        obj.extract::<bool>()
    }
}

/// A Python int or float (not a bool).
impl Read for f64 {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if obj.is_instance_of::<PyFloat>() {
            return obj.extract::<f64>();
        }
        Ok(i64::read(obj, at).map_err(|_| expected(obj, at, "a number"))? as f64)
    }
}

impl Read for String {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        obj.cast::<PyString>()
            .map(|s| s.to_string())
            .map_err(|_| expected(obj, at, "a string"))
    }
}

/// None, or the value.
impl<T: Read> Read for Option<T> {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if obj.is_none() {
            return Ok(None);
        }
        T::read(obj, at).map(Some)
    }
}

/// A time in seconds: a number, or None or NaN for none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Time(pub Option<f64>);

impl Read for Time {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        let x = Option::<f64>::read(obj, &|| at())
            .map_err(|_| expected(obj, at, "a number or None"))?;
        Ok(Time(x.filter(|x| !x.is_nan())))
    }
}

/// Items of a list or tuple (or another iterable that is not a string or a mapping).
pub fn sequence<'py>(obj: &Bound<'py, PyAny>, at: Path<'_>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(list) = obj.cast::<PyList>() {
        return Ok(list.iter().collect());
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return Ok(tuple.iter().collect());
    }
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(expected(obj, at, "a list"));
    }
    obj.try_iter()
        .map_err(|_| expected(obj, at, "a list"))?
        .collect()
}

impl<T: Read> Read for Vec<T> {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        let items = sequence(obj, at)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, x) in items.iter().enumerate() {
            let_others_run(obj.py(), i);
            out.push(T::read(x, &|| format!("{}[{i}]", at()))?);
        }
        Ok(out)
    }
}

/// A row of exactly `N` non-negative integers (a list or a tuple).
impl<const N: usize> Read for [u64; N] {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        let row = Vec::<i64>::read(obj, at)?;
        match <[i64; N]>::try_from(row) {
            Ok(r) if r.iter().all(|&x| x >= 0) => Ok(r.map(|x| x as u64)),
            _ => Err(field_error(
                &at(),
                format!("expected {N} non-negative integers"),
            )),
        }
    }
}

macro_rules! tuples {
    ($($n:literal: $($t:ident $i:tt),+;)*) => {$(
        /// A row of as many values (a list or a tuple).
        impl<$($t: Read),+> Read for ($($t,)+) {
            fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
                let row = <[Bound<'_, PyAny>; $n]>::try_from(sequence(obj, at)?)
                    .map_err(|_| field_error(&at(), concat!("expected ", $n, " items")))?;
                Ok(($($t::read(&row[$i], &|| format!("{}[{}]", at(), $i))?,)+))
            }
        }
    )*};
}
tuples! {
    2: A 0, B 1;
    4: A 0, B 1, C 2, D 3;
}

/// A Python object kept for the caller to read (None until read).
#[derive(Debug)]
pub struct Obj(pub Py<PyAny>);

impl Default for Obj {
    fn default() -> Self {
        Obj(Python::attach(|py| py.None()))
    }
}

impl Read for Obj {
    fn read(obj: &Bound<'_, PyAny>, _at: Path<'_>) -> PyResult<Self> {
        Ok(Obj(obj.clone().unbind()))
    }
}

/// The entries of a dict with string keys, each value read as `T` (its field `at[key]`);
/// `what` says what `obj` should have been when it is not a dict.
pub fn entries<T: Read>(
    obj: &Bound<'_, PyAny>,
    at: Path<'_>,
    what: &str,
) -> PyResult<Vec<(String, T)>> {
    let map = obj
        .cast::<PyDict>()
        .map_err(|_| field_error(&at(), format!("expected {what}")))?;
    map.iter()
        .map(|(k, v)| {
            let key = String::read(&k, &|| format!("{} key", at()))?;
            let value = T::read(&v, &|| format!("{}[{key:?}]", at()))?;
            Ok((key, value))
        })
        .collect()
}

/// A dict, or an object whose attributes hold the keys (a dataclass); not a str, a number, a
/// list or None.
pub enum Object<'py> {
    Dict(Bound<'py, PyDict>),
    Attrs(Bound<'py, PyAny>),
}

impl<'py> Object<'py> {
    pub fn of(obj: &Bound<'py, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if let Ok(d) = obj.cast::<PyDict>() {
            return Ok(Object::Dict(d.clone()));
        }
        let plain = obj.is_none()
            || obj.is_instance_of::<PyString>()
            || obj.is_instance_of::<PyBytes>()
            || obj.is_instance_of::<PyInt>()
            || obj.is_instance_of::<PyFloat>()
            || obj.is_instance_of::<PyList>()
            || obj.is_instance_of::<PyTuple>();
        if plain {
            return Err(field_error(&at(), "expected an object"));
        }
        Ok(Object::Attrs(obj.clone()))
    }

    /// `obj[key]` or `obj.key`; None when absent.
    pub fn get(&self, key: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self {
            Object::Dict(d) => d.get_item(key),
            Object::Attrs(o) => Ok(o.getattr(key).ok()),
        }
    }

    /// Reads `key` into `slot`: absent (or None, for an optional key) leaves `slot` as it is;
    /// a required key absent is an error naming the object.
    pub fn field<T: Read>(
        &self,
        key: &Bound<'py, PyString>,
        required: bool,
        at: Path<'_>,
        slot: &mut T,
    ) -> PyResult<()> {
        match self.get(key)? {
            Some(v) if required || !v.is_none() => {
                *slot = T::read(&v, &|| format!("{}.{}", at(), key.to_string_lossy()))?;
            }
            Some(_) => {}
            None if required => {
                return Err(field_error(
                    &at(),
                    format!("missing {:?}", key.to_string_lossy()),
                ))
            }
            None => {}
        }
        Ok(())
    }
}

/// A dict of `$src`'s fields, each under its own name: `fields!(py, src; a, b, c)`.
macro_rules! fields {
    ($py:expr, $src:expr; $($f:ident),+ $(,)?) => {{
        let d = pyo3::types::PyDict::new($py);
        $( pyo3::types::PyDictMethods::set_item(&d, stringify!($f), &$src.$f)?; )+
        d
    }};
}
pub(crate) use fields;

/// A dict of columns, one per field of the rows `$rows` (an iterator, cloned per column), each
/// under its name after `$prefix`: `columns!(py, rows, "zone_"; a, b)`.
macro_rules! columns {
    ($py:expr, $rows:expr, $prefix:literal; $($f:ident),+ $(,)?) => {{
        let d = pyo3::types::PyDict::new($py);
        $( pyo3::types::PyDictMethods::set_item(
            &d,
            concat!($prefix, stringify!($f)),
            $rows.clone().map(|r| r.$f).collect::<Vec<_>>(),
        )?; )+
        d
    }};
}
pub(crate) use columns;
