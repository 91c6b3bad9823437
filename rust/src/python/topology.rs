//! Python face of the topology merge: `merge_hints(...)` and its `MergeResult`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use super::convert::{boolean, field_error, int, int_list, required, sequence, value_error, Field};
use crate::bitmask::NumaMask;
use crate::topology::{
    NumaInfo, OptionValue, Policy, PolicyOptions, ProviderHints, ResourceHints, TopologyHint,
    TopologyManager,
};

/// The merged hint and the admit decision.
#[pyclass(frozen, module = "pyctl._core", name = "MergeResult")]
pub struct PyMergeResult {
    #[pyo3(get)]
    affinity: Option<Vec<u32>>,
    #[pyo3(get)]
    preferred: bool,
    #[pyo3(get)]
    admit: bool,
}

#[pymethods]
impl PyMergeResult {
    fn __repr__(&self) -> String {
        let aff = match &self.affinity {
            None => "None".to_string(),
            Some(v) => format!("{v:?}"),
        };
        format!(
            "MergeResult(affinity={aff}, preferred={}, admit={})",
            py_bool(self.preferred),
            py_bool(self.admit)
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PyMergeResult>() {
            Ok(o) => {
                let o = o.get();
                o.affinity == self.affinity
                    && o.preferred == self.preferred
                    && o.admit == self.admit
            }
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        let mask = self
            .affinity
            .as_ref()
            .map(|v| v.iter().fold(0u64, |m, &i| m | 1 << i));
        mask.map_or(u64::MAX, |m| m.rotate_left(2))
            ^ (self.preferred as u64)
            ^ ((self.admit as u64) << 1)
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn read_hint(obj: &Bound<'_, PyAny>, field: impl Field) -> PyResult<TopologyHint> {
    let py = obj.py();
    if obj.is_none() {
        return Err(field_error(
            &field(),
            "expected a hint {\"affinity\": ..., \"preferred\": ...}, got None",
        ));
    }
    let affinity = required(obj, intern!(py, super::inputs::hint::affinity), &field)?;
    let mask = if affinity.is_none() {
        None
    } else {
        let aff_field = || format!("{}.affinity", field());
        let ids = int_list(&affinity, aff_field)?;
        Some(NumaMask::from_ids(&ids, "").map_err(|e| field_error(&aff_field(), e.message))?)
    };
    let preferred = required(obj, intern!(py, super::inputs::hint::preferred), &field)?;
    let preferred = boolean(&preferred, || format!("{}.preferred", field()))?;
    Ok(TopologyHint::new(mask, preferred))
}

fn read_provider(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<ProviderHints> {
    if obj.is_none() {
        return Ok(ProviderHints(None));
    }
    let map = obj.cast::<PyDict>().map_err(|_| {
        field_error(
            &format!("providers[{index}]"),
            "expected None or a mapping of resource name to hints",
        )
    })?;
    let mut resources = Vec::with_capacity(map.len());
    for (key, value) in map.iter() {
        let name: String = key
            .cast::<PyString>()
            .map_err(|_| {
                field_error(
                    &format!("providers[{index}]"),
                    "resource names must be strings",
                )
            })?
            .to_string();
        let hints = if value.is_none() {
            None
        } else {
            let rfield = || format!("providers[{index}][{name:?}]");
            let items = sequence(&value, rfield)?;
            let mut hints = Vec::with_capacity(items.len());
            for (i, h) in items.iter().enumerate() {
                hints.push(read_hint(h, || format!("{}[{i}]", rfield()))?);
            }
            Some(hints)
        };
        resources.push(ResourceHints {
            resource: name,
            hints,
        });
    }
    Ok(ProviderHints(Some(resources)))
}

fn read_options(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, OptionValue)>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    let map = obj
        .cast::<PyDict>()
        .map_err(|_| field_error("options", "expected a mapping of option name to value"))?;
    let mut out = Vec::with_capacity(map.len());
    for (key, value) in map.iter() {
        let name: String = key
            .cast::<PyString>()
            .map_err(|_| field_error("options", "option names must be strings"))?
            .to_string();
        let field = format!("options[{name:?}]");
        let v = if value.is_instance_of::<PyBool>() {
            OptionValue::Bool(value.extract()?)
        } else if value.is_instance_of::<PyInt>() {
            OptionValue::Int(int(&value, || field.clone())?)
        } else if let Ok(s) = value.cast::<PyString>() {
            OptionValue::Str(s.to_string())
        } else {
            return Err(field_error(
                &field,
                "expected a bool, an integer or a string",
            ));
        };
        out.push((name, v));
    }
    Ok(out)
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
            int(&key, || "distances".to_string())?
        };
        rows.push((id, int_list(&value, || format!("distances[{id}]"))?));
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
    let nodes = int_list(numa_nodes, || "numa_nodes".to_string())?;
    let options = PolicyOptions::parse(&read_options(options)?).map_err(value_error)?;
    let rows = read_distances(distances)?;
    let numa = NumaInfo::new(&nodes, rows.as_deref()).map_err(value_error)?;
    let items = sequence(providers, || "providers".to_string())?;
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
