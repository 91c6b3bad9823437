//! Python face of the topology merge: `merge_hints(...)` and its `MergeResult`.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use super::convert::{entries, field_error, sequence, value_error, Path, Read};
use super::inputs::hint;
use crate::bitmask::NumaMask;
use crate::topology::{
    NumaInfo, OptionValue, Policy, PolicyOptions, ProviderHints, ResourceHints, TopologyHint,
    TopologyManager,
};

/// The merged hint and the admit decision.
#[pyclass(
    frozen,
    eq,
    hash,
    get_all,
    module = "pyctl._core",
    name = "MergeResult"
)]
#[derive(PartialEq, Eq, Hash)]
pub struct PyMergeResult {
    affinity: Option<Vec<u32>>,
    preferred: bool,
    admit: bool,
}

#[pymethods]
impl PyMergeResult {
    fn __repr__(&self) -> String {
        let aff = match &self.affinity {
            None => "None".to_string(),
            Some(v) => format!("{v:?}"),
        };
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "MergeResult(affinity={aff}, preferred={}, admit={})",
            py_bool(self.preferred),
            py_bool(self.admit)
        )
    }
}

/// A hint (`TopologyHintInput`, or a `TopologyHint` object); None is not a hint.
impl Read for TopologyHint {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if obj.is_none() {
            return Err(field_error(
                &at(),
                "expected a hint {\"affinity\": ..., \"preferred\": ...}, got None",
            ));
        }
        let h = hint::Input::read(obj, at)?;
        let mask = match h.affinity {
            None => None,
            Some(ids) => Some(
                NumaMask::from_ids(&ids, "")
                    .map_err(|e| field_error(&format!("{}.affinity", at()), e.message))?,
            ),
        };
        Ok(TopologyHint::new(mask, h.preferred))
    }
}

fn read_provider(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<ProviderHints> {
    if obj.is_none() {
        return Ok(ProviderHints(None));
    }
    let at = || format!("providers[{index}]");
    let what = "None or a mapping of resource name to hints";
    let hints = entries::<Option<Vec<TopologyHint>>>(obj, &at, what)?.into_iter();
    let resources = hints.map(|(resource, hints)| ResourceHints { resource, hints });
    Ok(ProviderHints(Some(resources.collect())))
}

/// A policy option's value: a bool, an integer or a string.
impl Read for OptionValue {
    fn read(obj: &Bound<'_, PyAny>, at: Path<'_>) -> PyResult<Self> {
        if obj.is_instance_of::<PyBool>() {
            Ok(OptionValue::Bool(bool::read(obj, at)?))
        } else if obj.is_instance_of::<PyInt>() {
            Ok(OptionValue::Int(i64::read(obj, at)?))
        } else if obj.is_instance_of::<PyString>() {
            Ok(OptionValue::Str(String::read(obj, at)?))
        } else {
            Err(field_error(
                &at(),
                "expected a bool, an integer or a string",
            ))
        }
    }
}

fn read_options(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, OptionValue)>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(Vec::new()),
        Some(o) => entries(o, &|| "options".into(), "a mapping of option name to value"),
    }
}

/// Distance rows as `(NUMA id, row indexed by id)`.
type DistanceRows = Vec<(i64, Vec<i64>)>;

fn read_distances(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DistanceRows>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(None);
    };
    let map = obj.cast::<PyDict>().map_err(|_| {
        field_error(
            "distances",
            "expected a mapping of NUMA id to a row of distances",
        )
    })?;
    let mut rows = Vec::with_capacity(map.len());
    for (key, value) in map.iter() {
        // JSON object keys are strings: accept "0" as well as 0.
        let id = if let Ok(s) = key.cast::<PyString>() {
            let s = s.to_string();
            s.trim()
                .parse::<i64>()
                .map_err(|_| field_error("distances", format!("key {s:?} is not a NUMA id")))?
        } else {
            i64::named(&key, "distances")?
        };
        rows.push((
            id,
            Vec::<i64>::read(&value, &|| format!("distances[{id}]"))?,
        ));
    }
    Ok(Some(rows))
}

/// merge_hints(providers, policy, numa_nodes, options=None, distances=None) -> MergeResult
#[pyfunction]
#[pyo3(signature = (providers, policy, numa_nodes, options=None, distances=None))]
fn merge_hints(
    py: Python<'_>,
    providers: &Bound<'_, PyAny>,
    policy: &Bound<'_, PyAny>,
    numa_nodes: &Bound<'_, PyAny>,
    options: Option<&Bound<'_, PyAny>>,
    distances: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMergeResult> {
    let policy_name: String = policy
        .cast::<PyString>()
        .map_err(|_| field_error("policy", "expected a policy name"))?
        .to_string();
    let policy = Policy::parse(&policy_name).map_err(value_error)?;
    let nodes = Vec::<i64>::named(numa_nodes, "numa_nodes")?;
    let options = PolicyOptions::parse(&read_options(options)?).map_err(value_error)?;
    let rows = read_distances(distances)?;
    let numa = NumaInfo::new(&nodes, rows.as_deref()).map_err(value_error)?;
    let items = sequence(providers, &|| "providers".to_string())?;
    let mut parsed = Vec::with_capacity(items.len());
    for (i, p) in items.iter().enumerate() {
        parsed.push(read_provider(p, i)?);
    }
    let manager = TopologyManager::new(policy, options, numa).map_err(value_error)?;
    // The merge holds no Python object: let other threads run while it computes.
    let result = py.detach(|| manager.merge(&parsed)).map_err(value_error)?;
    Ok(PyMergeResult {
        affinity: result.hint.mask.map(|m| m.ids()),
        preferred: result.hint.preferred,
        admit: result.admit,
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMergeResult>()?;
    m.add_function(wrap_pyfunction!(merge_hints, m)?)?;
    Ok(())
}
