//! Python face of the fragmentation scorer: `FragmentModel` (a cluster in columns) with
//! `score`, `place_delta`, `remove_delta` and `apply`.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::convert::{
    field_error, int, int_list, item, sequence, string, string_list, type_name, value_error,
};
use crate::fragment::delta::{apply, place_delta, remove_delta, Assignment, Delta};
use crate::fragment::score::{score_node, RecoverMemo};
use crate::fragment::{validate_shapes, Cluster, ClusterColumns, Shape, CATEGORY_NAMES};

fn ints(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<i64>> {
    int_list(&item(d, key, "columns")?, || key.to_string())
}

fn offsets(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<usize>> {
    ints(d, key)?
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| field_error(key, "negative offset")))
        .collect()
}

fn strings(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<String>> {
    string_list(&item(d, key, "columns")?, || key.to_string())
}

/// A column that may be left out (then empty: the core's defaults).
fn optional<T>(
    d: &Bound<'_, PyDict>,
    key: &str,
    read: fn(&Bound<'_, PyDict>, &str) -> PyResult<Vec<T>>,
) -> PyResult<Vec<T>> {
    if d.contains(key)? {
        read(d, key)
    } else {
        Ok(Vec::new())
    }
}

fn bools(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<bool>> {
    sequence(&item(d, key, "columns")?, || key.to_string())?
        .iter()
        .map(|x| x.is_truthy())
        .collect()
}

fn read_shape(obj: &Bound<'_, PyAny>, prefix: &str) -> PyResult<Shape> {
    let py = obj.py();
    let f = |k: &str| format!("{prefix}.{k}");
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| field_error(prefix, "expected an object"))?;
    let num = |k: &Bound<'_, PyString>, name: &str| -> PyResult<u64> {
        match d.get_item(k)? {
            None => Ok(0),
            Some(v) if v.is_none() => Ok(0),
            Some(v) => {
                let x = int(&v, || f(name))?;
                u64::try_from(x)
                    .map_err(|_| field_error(&f(name), format!("must not be negative, got {x}")))
            }
        }
    };
    let cpu_milli = num(intern!(py, "cpu_milli"), "cpu_milli")?;
    let memory_mib = num(intern!(py, "memory_mib"), "memory_mib")?;
    let gpus = num(intern!(py, "gpus"), "gpus")?;
    let gpu_milli = num(intern!(py, "gpu_milli"), "gpu_milli")?;
    let gpus = u32::try_from(gpus).map_err(|_| field_error(&f("gpus"), "too large"))?;
    let gpu_milli =
        u32::try_from(gpu_milli).map_err(|_| field_error(&f("gpu_milli"), "too large"))?;
    let mig_profile = match d.get_item(intern!(py, "mig_profile"))? {
        Some(v) if !v.is_none() => Some(string(&v, || f("mig_profile"))?),
        _ => None,
    };
    let gpu_models = match d.get_item(intern!(py, "gpu_models"))? {
        Some(v) if !v.is_none() => string_list(&v, || f("gpu_models"))?,
        _ => Vec::new(),
    };
    let gpu_pool = match d.get_item(intern!(py, "gpu_pool"))? {
        Some(v) if !v.is_none() => string(&v, || f("gpu_pool"))?,
        _ => String::new(),
    };
    let gpu_memory_mib = num(intern!(py, "gpu_memory_mib"), "gpu_memory_mib")?;
    let weight: f64 = match d.get_item(intern!(py, "weight"))? {
        None => return Err(field_error(&f("weight"), "missing")),
        Some(v) => v.extract::<f64>().map_err(|_| {
            field_error(
                &f("weight"),
                format!("expected a number, got {}", type_name(&v)),
            )
        })?,
    };
    Ok(Shape {
        cpu_milli,
        memory_mib,
        gpus,
        gpu_milli,
        mig_profile,
        gpu_models,
        weight,
        gpu_pool,
        gpu_memory_mib,
    })
}

fn read_shapes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Shape>> {
    let items = sequence(obj, || "shapes".to_string())?;
    let mut shapes: Vec<Shape> = items
        .iter()
        .enumerate()
        .map(|(i, x)| read_shape(x, &format!("shapes[{i}]")))
        .collect::<PyResult<_>>()?;
    validate_shapes(&mut shapes).map_err(value_error)?;
    Ok(shapes)
}

/// A single task shape (its weight, if any, is ignored).
fn read_task(obj: &Bound<'_, PyAny>) -> PyResult<Shape> {
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| field_error("task", "expected an object"))?
        .copy()?;
    d.set_item("weight", 1.0)?;
    let mut one = vec![read_shape(d.as_any(), "task")?];
    validate_shapes(&mut one).map_err(|e| {
        value_error(crate::error::CoreError::new(
            e.field.replace("shapes[0]", "task"),
            e.message,
        ))
    })?;
    Ok(one.remove(0))
}

fn assignment_dict<'py>(py: Python<'py>, a: &Assignment) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("cpu", a.cpu.clone())?;
    d.set_item("memory", a.memory.clone())?;
    d.set_item("gpus", a.gpus.clone())?;
    d.set_item("mig", a.mig)?;
    Ok(d)
}

/// Rows of non-negative integers of a fixed arity (lists or tuples).
fn rows(obj: &Bound<'_, PyAny>, field: &str, arity: usize) -> PyResult<Vec<Vec<u64>>> {
    let what = || field.to_string();
    let mut out = Vec::new();
    for (i, row) in sequence(obj, what)?.iter().enumerate() {
        let vals = super::convert::int_list(row, || format!("{field}[{i}]"))?;
        if vals.len() != arity || vals.iter().any(|&v| v < 0) {
            return Err(field_error(
                &format!("{field}[{i}]"),
                format!("expected {arity} non-negative integers"),
            ));
        }
        out.push(vals.into_iter().map(|v| v as u64).collect());
    }
    Ok(out)
}

fn read_assignment(obj: &Bound<'_, PyAny>) -> PyResult<Assignment> {
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| field_error("assignment", "expected an object"))?;
    let mut a = Assignment::default();
    let big = |_| field_error("assignment", "value out of range");
    if let Some(v) = d.get_item("cpu")? {
        a.cpu = rows(&v, "assignment.cpu", 2)?
            .into_iter()
            .map(|r| (r[0] as usize, r[1]))
            .collect();
    }
    if let Some(v) = d.get_item("memory")? {
        a.memory = rows(&v, "assignment.memory", 2)?
            .into_iter()
            .map(|r| (r[0] as usize, r[1]))
            .collect();
    }
    if let Some(v) = d.get_item("gpus")? {
        a.gpus = rows(&v, "assignment.gpus", 3)?
            .into_iter()
            .map(|r| {
                Ok((
                    r[0] as usize,
                    r[1] as usize,
                    u32::try_from(r[2]).map_err(big)?,
                ))
            })
            .collect::<PyResult<_>>()?;
    }
    if let Some(v) = d.get_item("mig")? {
        if !v.is_none() {
            let r = super::convert::int_list(&v, || "assignment.mig".to_string())?;
            if r.len() != 3 || r.iter().any(|&x| x < 0) {
                return Err(field_error(
                    "assignment.mig",
                    "expected [zone, gpu, instance]",
                ));
            }
            a.mig = Some((r[0] as usize, r[1] as usize, r[2] as usize));
        }
    }
    Ok(a)
}

/// A cluster snapshot prepared for scoring (build once, score many times).
#[pyclass(module = "pyctl._core", name = "FragmentModel")]
pub struct PyFragmentModel {
    cluster: Cluster,
}

fn delta_dict<'py>(py: Python<'py>, d: &Delta) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("fragment_gpu_milli", d.fragment_gpu_milli)?;
    out.set_item("fragment_mig_slices", d.fragment_mig_slices)?;
    out.set_item("assignment", assignment_dict(py, &d.assignment)?)?;
    Ok(out)
}

#[pymethods]
impl PyFragmentModel {
    #[new]
    fn new(columns: &Bound<'_, PyDict>) -> PyResult<Self> {
        let c = ClusterColumns {
            node_names: strings(columns, "node_names")?,
            node_models: strings(columns, "node_models")?,
            node_policies: strings(columns, "node_policies")?,
            node_cpu_static: bools(columns, "node_cpu_static")?,
            node_memory_static: bools(columns, "node_memory_static")?,
            zone_offsets: offsets(columns, "zone_offsets")?,
            zone_numa: ints(columns, "zone_numa")?,
            zone_cpu_milli: ints(columns, "zone_cpu_milli")?,
            zone_cpu_used: ints(columns, "zone_cpu_used")?,
            zone_memory_mib: ints(columns, "zone_memory_mib")?,
            zone_memory_used: ints(columns, "zone_memory_used")?,
            gpu_offsets: offsets(columns, "gpu_offsets")?,
            gpu_ids: ints(columns, "gpu_ids")?,
            gpu_used_milli: ints(columns, "gpu_used_milli")?,
            mig_offsets: offsets(columns, "mig_offsets")?,
            mig_gpu_ids: ints(columns, "mig_gpu_ids")?,
            instance_offsets: offsets(columns, "instance_offsets")?,
            instance_profiles: strings(columns, "instance_profiles")?,
            instance_starts: ints(columns, "instance_starts")?,
            instance_used: bools(columns, "instance_used")?,
            node_gpu_pools: optional(columns, "node_gpu_pools", strings)?,
            node_gpu_replicas: optional(columns, "node_gpu_replicas", ints)?,
            node_gpu_memory_mib: optional(columns, "node_gpu_memory_mib", ints)?,
        };
        let cluster = Cluster::from_columns(&c).map_err(value_error)?;
        Ok(Self { cluster })
    }

    #[getter]
    fn node_count(&self) -> usize {
        self.cluster.nodes.len()
    }

    /// Scores every node; returns columns (see pyctl/core/fragmentation.py).
    fn score<'py>(
        &self,
        py: Python<'py>,
        shapes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let shapes = read_shapes(shapes)?;
        let cluster = &self.cluster;
        let scores = py.detach(|| {
            let mut memo = RecoverMemo::new();
            cluster
                .nodes
                .iter()
                .map(|n| score_node(n, &shapes, &mut memo))
                .collect::<Vec<_>>()
        });
        let out = PyDict::new(py);
        let col = |f: &dyn Fn(&crate::fragment::NodeScore) -> f64| {
            scores.iter().map(f).collect::<Vec<f64>>()
        };
        out.set_item("idle_gpu_milli", col(&|s| s.idle_gpu_milli))?;
        out.set_item("fragment_gpu_milli", col(&|s| s.fragment_gpu_milli))?;
        out.set_item("idle_mig_slices", col(&|s| s.idle_mig_slices))?;
        out.set_item("fragment_mig_slices", col(&|s| s.fragment_mig_slices))?;
        out.set_item("recoverable_mig_slices", col(&|s| s.recoverable_mig_slices))?;
        let cats = PyDict::new(py);
        let mig_cats = PyDict::new(py);
        for (k, name) in CATEGORY_NAMES.iter().enumerate() {
            cats.set_item(*name, col(&|s| s.categories[k]))?;
            mig_cats.set_item(*name, col(&|s| s.mig_categories[k]))?;
        }
        out.set_item("categories", cats)?;
        out.set_item("mig_categories", mig_cats)?;
        let zcol = |f: &dyn Fn(&crate::fragment::ZoneScore) -> f64| {
            scores
                .iter()
                .flat_map(|s| s.zones.iter().map(f))
                .collect::<Vec<f64>>()
        };
        out.set_item("zone_idle_gpu_milli", zcol(&|z| z.idle_gpu_milli))?;
        out.set_item("zone_fragment_gpu_milli", zcol(&|z| z.fragment_gpu_milli))?;
        out.set_item("zone_idle_mig_slices", zcol(&|z| z.idle_mig_slices))?;
        out.set_item("zone_fragment_mig_slices", zcol(&|z| z.fragment_mig_slices))?;
        Ok(out)
    }

    /// The best placement of `task` on node `node` and its fragment delta, or None.
    fn place_delta<'py>(
        &self,
        py: Python<'py>,
        node: usize,
        task: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let n = self.node(node)?;
        let task = read_task(task)?;
        let shapes = read_shapes(shapes)?;
        let d = py.detach(|| place_delta(n, &task, &shapes, &mut RecoverMemo::new()));
        d.map(|d| delta_dict(py, &d)).transpose()
    }

    /// The fragment delta of removing the task at `assignment` from node `node`.
    fn remove_delta<'py>(
        &self,
        py: Python<'py>,
        node: usize,
        assignment: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let n = self.node(node)?;
        let a = read_assignment(assignment)?;
        let shapes = read_shapes(shapes)?;
        let d = py
            .detach(|| remove_delta(n, &a, &shapes, &mut RecoverMemo::new()))
            .map_err(value_error)?;
        delta_dict(py, &d)
    }

    /// Compaction plan: `movable` is a list of {"node": index, "assignment": ..., "shape": ...};
    /// returns moves {"pod", "from", "to", "assignment", "remove_delta", "place_delta", "gain"}.
    #[pyo3(signature = (movable, shapes, max_moves=10, min_gain=1.0, max_moves_per_node=None))]
    fn plan_compaction<'py>(
        &self,
        py: Python<'py>,
        movable: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
        max_moves: usize,
        min_gain: f64,
        max_moves_per_node: Option<usize>,
    ) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let shapes = read_shapes(shapes)?;
        let mut items = Vec::new();
        for (i, m) in sequence(movable, || "movable".to_string())?
            .iter()
            .enumerate()
        {
            let d = m
                .cast::<PyDict>()
                .map_err(|_| field_error(&format!("movable[{i}]"), "expected an object"))?;
            let node = int(&item(d, "node", &format!("movable[{i}]"))?, || {
                format!("movable[{i}].node")
            })?;
            let node = usize::try_from(node)
                .map_err(|_| field_error(&format!("movable[{i}].node"), "negative"))?;
            let assignment = read_assignment(&item(d, "assignment", &format!("movable[{i}]"))?)?;
            let shape = read_task(&item(d, "shape", &format!("movable[{i}]"))?)?;
            items.push(crate::compaction::Movable {
                node,
                assignment,
                shape,
            });
        }
        let limits = crate::compaction::CompactionLimits {
            max_moves,
            min_gain,
            max_moves_per_node: max_moves_per_node.unwrap_or(usize::MAX),
        };
        let cluster = &self.cluster;
        let moves = py
            .detach(|| crate::compaction::plan(cluster, &items, &shapes, &limits))
            .map_err(value_error)?;
        moves
            .iter()
            .map(|mv| {
                let out = PyDict::new(py);
                out.set_item("pod", mv.pod)?;
                out.set_item("from", mv.from)?;
                out.set_item("to", mv.to)?;
                out.set_item("assignment", assignment_dict(py, &mv.to_assignment)?)?;
                out.set_item("remove_delta", mv.remove_delta)?;
                out.set_item("place_delta", mv.place_delta)?;
                out.set_item("gain", mv.gain())?;
                Ok(out)
            })
            .collect()
    }

    /// Index of a node by name, or None.
    fn node_index(&self, name: &str) -> Option<usize> {
        self.index_of().get(name).copied()
    }

    /// Places (`place=True`) or removes the task at `assignment` on node `node`, in place.
    fn apply(&mut self, node: usize, assignment: &Bound<'_, PyAny>, place: bool) -> PyResult<()> {
        let a = read_assignment(assignment)?;
        let count = self.cluster.nodes.len();
        let n = self.cluster.nodes.get_mut(node).ok_or_else(|| {
            field_error("node", format!("index {node} out of range (0..{count})"))
        })?;
        apply(n, &a, place).map_err(value_error)
    }
}

impl PyFragmentModel {
    fn index_of(&self) -> std::collections::HashMap<&str, usize> {
        self.cluster
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect()
    }

    fn node(&self, i: usize) -> PyResult<&crate::fragment::Node> {
        self.cluster.nodes.get(i).ok_or_else(|| {
            field_error(
                "node",
                format!("index {i} out of range (0..{})", self.cluster.nodes.len()),
            )
        })
    }
}

/// mig_pack(gpu_model, counts, gpus) -> per GPU [(profile, start), ...]
#[pyfunction]
fn mig_pack(
    gpu_model: &str,
    counts: Vec<(String, u32)>,
    gpus: usize,
) -> PyResult<Vec<Vec<(String, u8)>>> {
    crate::fragment::mig_pack::pack_instances(gpu_model, &counts, gpus).map_err(value_error)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFragmentModel>()?;
    m.add_function(wrap_pyfunction!(mig_pack, m)?)?;
    m.add("CATEGORY_NAMES", PyList::new(m.py(), CATEGORY_NAMES)?)?;
    Ok(())
}
