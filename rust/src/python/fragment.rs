//! Python face of the fragmentation scorer: `FragmentModel` (a cluster in columns) with
//! `score`, `place_delta`, `remove_delta` and `apply`.

use std::collections::HashMap;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::convert::{
    field_error, int, int_list, item, let_others_run, required, sequence, string, string_list,
    value_error, Field,
};
use super::inputs::{
    assignment as akey, columns as ckey, movable as mkey, pending as pkey, plan_limits as lkey,
};
use super::shape::{read_shape, read_shape_list, Weight};
use crate::compaction::{self, Input, Limits, Movable, NodeSet, Pending, Plan};
use crate::fragment::delta::{apply, place_delta, remove_delta, Assignment, Delta};
use crate::fragment::fabric::{fabric_score, Gang};
use crate::fragment::score::{node_model, score_node, RecoverMemo};
use crate::fragment::{validate_shapes, Cluster, ClusterColumns, Node, Shape, CATEGORY_NAMES};
use crate::placement::{self, ClusterView, Ranked};

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

fn bools(d: &Bound<'_, PyDict>, key: &str) -> PyResult<Vec<bool>> {
    sequence(&item(d, key, "columns")?, || key.to_string())?
        .iter()
        .map(|x| x.is_truthy())
        .collect()
}

/// An optional column: empty when the key is absent.
fn optional<T>(
    d: &Bound<'_, PyDict>,
    key: &str,
    read: impl Fn(&str) -> PyResult<Vec<T>>,
) -> PyResult<Vec<T>> {
    if d.contains(key)? {
        read(key)
    } else {
        Ok(Vec::new())
    }
}

/// The workload's shapes, validated by the core (weights normalised).
fn read_shapes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Shape>> {
    let mut shapes = read_shape_list(obj)?;
    validate_shapes(&mut shapes).map_err(value_error)?;
    Ok(shapes)
}

/// A single task shape (its weight, if any, is ignored), validated by the core.
fn read_task(obj: &Bound<'_, PyAny>) -> PyResult<Shape> {
    let mut one = vec![read_shape(obj, "task", Weight::Ignored)?];
    validate_shapes(&mut one).map_err(|e| {
        value_error(crate::error::CoreError::new(
            e.field.replace("shapes[0]", "task"),
            e.message,
        ))
    })?;
    Ok(one.remove(0))
}

fn assignment_dict<'py>(
    py: Python<'py>,
    a: &Assignment,
    node: &Node,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("cpu", a.cpu.clone())?;
    d.set_item("memory", a.memory.clone())?;
    d.set_item("gpus", a.gpus.clone())?;
    d.set_item("mig", a.mig)?;
    if !a.dra_gpus.is_empty() {
        d.set_item("dra_gpus", a.dra_gpus.clone())?;
    }
    if !a.dyn_whole.is_empty() {
        d.set_item("dyn_whole", a.dyn_whole.clone())?;
    }
    if let Some(v) = mig_new_out(a, node) {
        d.set_item("mig_new", v)?;
    }
    Ok(d)
}

/// `mig_new` with the profile by name: (zone, MIG GPU, profile, start); the index is the
/// catalog's, of the node's GPU model.
fn mig_new_out(a: &Assignment, node: &Node) -> Option<(usize, usize, String, u8)> {
    let (zi, mi, p, start) = a.mig_new?;
    let name = node_model(node)?.profiles.get(p)?.name.clone();
    Some((zi, mi, name, start))
}

/// `assignment.<key>` as rows of `N` non-negative integers (lists or tuples), or none when
/// absent. `key` is an interned string (`intern!`): read for every pod of a planning round, a
/// key made anew each time would cost a string object per lookup.
fn rows<const N: usize>(
    d: &Bound<'_, PyDict>,
    key: &Bound<'_, PyString>,
) -> PyResult<Vec<[u64; N]>> {
    let Some(v) = d.get_item(key)? else {
        return Ok(Vec::new());
    };
    let field = || format!("assignment.{}", key.to_string_lossy());
    let all = sequence(&v, field)?;
    let mut out = Vec::with_capacity(all.len());
    for (i, row) in all.iter().enumerate() {
        let at = || format!("{}[{i}]", field());
        let mut vals = [0u64; N];
        let mut count = 0usize;
        let mut negative = false;
        for (j, x) in sequence(row, at)?.iter().enumerate() {
            let v = int(x, || format!("{}[{j}]", at()))?;
            negative |= v < 0;
            if let Some(slot) = vals.get_mut(j) {
                *slot = v.max(0) as u64;
            }
            count += 1;
        }
        if count != N || negative {
            return Err(field_error(
                &at(),
                format!("expected {N} non-negative integers"),
            ));
        }
        out.push(vals);
    }
    Ok(out)
}

/// `assignment.<key>` as (zone, amount) rows, or none when absent.
fn zone_rows(d: &Bound<'_, PyDict>, key: &Bound<'_, PyString>) -> PyResult<Vec<(usize, u64)>> {
    Ok(rows::<2>(d, key)?
        .into_iter()
        .map(|[z, v]| (z as usize, v))
        .collect())
}

/// `assignment.<key>` as (zone, GPU, milli-GPU) rows, or none when absent.
fn gpu_rows(
    d: &Bound<'_, PyDict>,
    key: &Bound<'_, PyString>,
) -> PyResult<Vec<(usize, usize, u32)>> {
    rows::<3>(d, key)?
        .into_iter()
        .map(|[z, g, m]| {
            let milli =
                u32::try_from(m).map_err(|_| field_error("assignment", "value out of range"))?;
            Ok((z as usize, g as usize, milli))
        })
        .collect()
}

/// Where a task sits on `node` (`Assignment`): as `assignment_dict` writes it.
fn read_assignment(obj: &Bound<'_, PyAny>, node: &Node) -> PyResult<Assignment> {
    let py = obj.py();
    let d = obj
        .cast::<PyDict>()
        .map_err(|_| field_error("assignment", "expected an object"))?;
    let mut a = Assignment {
        cpu: zone_rows(d, intern!(py, akey::cpu))?,
        memory: zone_rows(d, intern!(py, akey::memory))?,
        gpus: gpu_rows(d, intern!(py, akey::gpus))?,
        ..Assignment::default()
    };
    if let Some(v) = d.get_item(intern!(py, akey::mig))?.filter(|v| !v.is_none()) {
        let r = super::convert::int_list(&v, || "assignment.mig".to_string())?;
        if r.len() != 3 || r.iter().any(|&x| x < 0) {
            return Err(field_error(
                "assignment.mig",
                "expected [zone, gpu, instance]",
            ));
        }
        a.mig = Some((r[0] as usize, r[1] as usize, r[2] as usize));
    }
    a.dra_gpus = gpu_rows(d, intern!(py, akey::dra_gpus))?;
    a.dyn_whole = zone_rows(d, intern!(py, akey::dyn_whole))?
        .into_iter()
        .map(|(z, g)| (z, g as usize))
        .collect();
    if let Some(v) = d
        .get_item(intern!(py, akey::mig_new))?
        .filter(|v| !v.is_none())
    {
        a.mig_new = Some(read_mig_new(&v, node)?);
    }
    Ok(a)
}

/// `assignment.mig_new`: [zone, MIG GPU, profile name, start] with the profile of the node's
/// model.
fn read_mig_new(v: &Bound<'_, PyAny>, node: &Node) -> PyResult<(usize, usize, usize, u8)> {
    let f = || "assignment.mig_new".to_string();
    let bad = || field_error("assignment.mig_new", "expected [zone, gpu, profile, start]");
    let items = sequence(v, f)?;
    let [zi, mi, name, start] = items.as_slice() else {
        return Err(bad());
    };
    let zi = usize::try_from(int(zi, f)?).map_err(|_| bad())?;
    let mi = usize::try_from(int(mi, f)?).map_err(|_| bad())?;
    let name = string(name, f)?;
    let start = u8::try_from(int(start, f)?).map_err(|_| bad())?;
    let model = node_model(node)
        .ok_or_else(|| field_error("assignment.mig_new", "the node has no MIG GPU model"))?;
    let p = model.profile_index(&name).map_err(value_error)?;
    Ok((zi, mi, p, start))
}

/// A cluster snapshot prepared for scoring (build once, score many times).
#[pyclass(module = "pyctl._core", name = "FragmentModel")]
pub struct PyFragmentModel {
    cluster: Cluster,
}

fn delta_dict<'py>(py: Python<'py>, d: &Delta, node: &Node) -> PyResult<Bound<'py, PyDict>> {
    let out = PyDict::new(py);
    out.set_item("fragment_gpu_milli", d.fragment_gpu_milli)?;
    out.set_item("fragment_mig_slices", d.fragment_mig_slices)?;
    out.set_item("assignment", assignment_dict(py, &d.assignment, node)?)?;
    Ok(out)
}

#[pymethods]
impl PyFragmentModel {
    #[new]
    fn new(columns: &Bound<'_, PyDict>) -> PyResult<Self> {
        let c = ClusterColumns {
            node_names: strings(columns, ckey::node_names)?,
            node_models: strings(columns, ckey::node_models)?,
            node_policies: strings(columns, ckey::node_policies)?,
            node_cpu_static: bools(columns, ckey::node_cpu_static)?,
            node_memory_static: bools(columns, ckey::node_memory_static)?,
            zone_offsets: offsets(columns, ckey::zone_offsets)?,
            zone_numa: ints(columns, ckey::zone_numa)?,
            zone_cpu_milli: ints(columns, ckey::zone_cpu_milli)?,
            zone_cpu_used: ints(columns, ckey::zone_cpu_used)?,
            zone_memory_mib: ints(columns, ckey::zone_memory_mib)?,
            zone_memory_used: ints(columns, ckey::zone_memory_used)?,
            gpu_offsets: offsets(columns, ckey::gpu_offsets)?,
            gpu_ids: ints(columns, ckey::gpu_ids)?,
            gpu_used_milli: ints(columns, ckey::gpu_used_milli)?,
            gpu_link_groups: optional(columns, ckey::gpu_link_groups, |k| ints(columns, k))?,
            mig_offsets: offsets(columns, ckey::mig_offsets)?,
            mig_gpu_ids: ints(columns, ckey::mig_gpu_ids)?,
            instance_offsets: offsets(columns, ckey::instance_offsets)?,
            instance_profiles: strings(columns, ckey::instance_profiles)?,
            instance_starts: ints(columns, ckey::instance_starts)?,
            instance_used: bools(columns, ckey::instance_used)?,
            dra_gpu_offsets: optional(columns, ckey::dra_gpu_offsets, |k| offsets(columns, k))?,
            dra_gpu_ids: optional(columns, ckey::dra_gpu_ids, |k| ints(columns, k))?,
            dra_gpu_used_milli: optional(columns, ckey::dra_gpu_used_milli, |k| ints(columns, k))?,
            mig_dra: optional(columns, ckey::mig_dra, |k| bools(columns, k))?,
            mig_dynamic: optional(columns, ckey::mig_dynamic, |k| bools(columns, k))?,
            mig_free_slices: optional(columns, ckey::mig_free_slices, |k| ints(columns, k))?,
            node_gpu_pools: optional(columns, ckey::node_gpu_pools, |k| strings(columns, k))?,
            node_gpu_replicas: optional(columns, ckey::node_gpu_replicas, |k| ints(columns, k))?,
            node_gpu_memory_mib: optional(columns, ckey::node_gpu_memory_mib, |k| {
                ints(columns, k)
            })?,
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
        d.map(|d| delta_dict(py, &d, n)).transpose()
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
        let a = read_assignment(assignment, n)?;
        let shapes = read_shapes(shapes)?;
        let d = py
            .detach(|| remove_delta(n, &a, &shapes, &mut RecoverMemo::new()))
            .map_err(value_error)?;
        delta_dict(py, &d, n)
    }

    /// The policy's best placement of `task` on each of `nodes` (default: every node), as
    /// {"node", "rank", "inc", "cpu_short", "left", "idle", "assignment"}, or None where the
    /// node does not admit it (`crate::placement::rank_nodes`).
    #[pyo3(signature = (task, shapes, nodes=None))]
    fn rank<'py>(
        &self,
        py: Python<'py>,
        task: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
        nodes: Option<Vec<usize>>,
    ) -> PyResult<Vec<Option<Bound<'py, PyDict>>>> {
        let task = read_task(task)?;
        let shapes = read_shapes(shapes)?;
        let nodes = nodes.unwrap_or_else(|| (0..self.cluster.nodes.len()).collect());
        let cluster = &self.cluster;
        let ranked = py.detach(|| {
            let v = ClusterView::of(cluster, &shapes);
            placement::rank_nodes(&v, &task, &nodes)
        });
        ranked
            .iter()
            .map(|r| r.as_ref().map(|r| ranked_dict(py, r, cluster)).transpose())
            .collect()
    }

    /// The policy's choice for `task` among `nodes` (default: every node): the best rank, ties
    /// to the first node in order (`crate::placement::choose`); None when none admits it.
    #[pyo3(signature = (task, shapes, nodes=None))]
    fn choose<'py>(
        &self,
        py: Python<'py>,
        task: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
        nodes: Option<Vec<usize>>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let task = read_task(task)?;
        let shapes = read_shapes(shapes)?;
        let cluster = &self.cluster;
        let count = cluster.nodes.len();
        let allowed: Vec<bool> = match nodes {
            None => vec![true; count],
            Some(ns) => {
                let mut a = vec![false; count];
                for i in ns.into_iter().filter(|&i| i < count) {
                    a[i] = true;
                }
                a
            }
        };
        let got = py.detach(|| {
            let v = ClusterView::of(cluster, &shapes);
            placement::choose(&v, &task, |i| allowed[i])
        });
        got.map(|r| ranked_dict(py, &r, cluster)).transpose()
    }

    /// A compaction plan (`crate::compaction::plan`). `movable`: [{"node", "assignment",
    /// "shape", "allowed"?, "pdb"?, "group"?}]; `pending`: [{"shape", "allowed"?}];
    /// `node_sets`: lists of node indices that `allowed` refers to; `pdb_headroom`: disruptions
    /// each budget allows. Returns {"moves": [{"pod", "from", "to", "assignment", "gain",
    /// "rescue"}], "rescues": [{"pending", "node", "assignment", "moves", "waits", "delta"}],
    /// "unrescued", "truncated"}.
    #[pyo3(signature = (movable, pending, shapes, node_sets=Vec::new(), pdb_headroom=Vec::new(), limits=None))]
    #[allow(clippy::too_many_arguments)]
    fn plan<'py>(
        &self,
        py: Python<'py>,
        movable: &Bound<'py, PyAny>,
        pending: &Bound<'py, PyAny>,
        shapes: &Bound<'py, PyAny>,
        node_sets: Vec<Vec<usize>>,
        pdb_headroom: Vec<u32>,
        limits: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let shapes = read_shapes(shapes)?;
        let mut tasks = TaskCache::default();
        let items = read_movable(movable, &self.cluster, &mut tasks)?;
        let pend = read_pending(pending, &mut tasks)?;
        let limits = read_limits(limits)?;
        let count = self.cluster.nodes.len();
        let sets: Vec<NodeSet> = node_sets
            .iter()
            .map(|ns| {
                let mut words = vec![0u64; count.div_ceil(64)];
                for &i in ns.iter().filter(|&&i| i < count) {
                    words[i / 64] |= 1u64 << (i % 64);
                }
                words
            })
            .collect();
        let cluster = &self.cluster;
        let plan = py.detach(|| {
            let mut v = ClusterView::of(cluster, &shapes);
            let input = Input {
                movable: &items,
                pending: &pend,
                node_sets: &sets,
                pdb_headroom: &pdb_headroom,
            };
            compaction::plan(&mut v, &input, &limits)
        });
        plan_dict(py, &plan, cluster)
    }

    /// The fabric pass (`crate::fragment::fabric`): `gangs` are (shape index, pods, level),
    /// `node_domains[n][l]` node n's domain index at level l or None. Returns {"domains": [{
    /// "level", "domain", "nodes", "gpu_milli", "idle_gpu_milli", "fragment_gpu_milli",
    /// "whole", "capacity"}], "node_domain_split", "node_no_domain"}.
    fn fabric<'py>(
        &self,
        py: Python<'py>,
        shapes: &Bound<'py, PyAny>,
        gangs: Vec<(usize, u32, usize)>,
        levels: usize,
        node_domains: Vec<Vec<Option<u32>>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let shapes = read_shapes(shapes)?;
        let gangs: Vec<Gang> = gangs
            .into_iter()
            .map(|(shape, pods, level)| Gang { shape, pods, level })
            .collect();
        let cluster = &self.cluster;
        let f = py
            .detach(|| fabric_score(cluster, &shapes, &gangs, levels, &node_domains))
            .map_err(value_error)?;
        let out = PyDict::new(py);
        let domains = PyList::empty(py);
        for d in &f.domains {
            let row = PyDict::new(py);
            row.set_item("level", d.level)?;
            row.set_item("domain", d.domain)?;
            row.set_item("nodes", d.nodes)?;
            row.set_item("gpu_milli", d.gpu_milli)?;
            row.set_item("idle_gpu_milli", d.idle_gpu_milli)?;
            row.set_item("fragment_gpu_milli", d.fragment_gpu_milli)?;
            row.set_item("whole", d.whole)?;
            row.set_item("capacity", d.capacity.clone())?;
            domains.append(row)?;
        }
        out.set_item("domains", domains)?;
        out.set_item("node_domain_split", f.node_domain_split)?;
        out.set_item("node_no_domain", f.node_no_domain)?;
        Ok(out)
    }

    /// Index of a node by name, or None.
    fn node_index(&self, name: &str) -> Option<usize> {
        self.index_of().get(name).copied()
    }

    /// Places (`place=True`) or removes the task at `assignment` on node `node`, in place.
    fn apply(&mut self, node: usize, assignment: &Bound<'_, PyAny>, place: bool) -> PyResult<()> {
        let a = read_assignment(assignment, self.node(node)?)?;
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

fn ranked_dict<'py>(
    py: Python<'py>,
    r: &Ranked<Assignment>,
    cluster: &Cluster,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("node", r.node)?;
    d.set_item("rank", r.rank)?;
    d.set_item("inc", r.features.inc)?;
    d.set_item("cpu_short", r.features.cpu_short)?;
    d.set_item("left", r.features.left)?;
    d.set_item("idle", r.features.idle)?;
    d.set_item(
        "assignment",
        assignment_dict(py, &r.place, &cluster.nodes[r.node])?,
    )?;
    Ok(d)
}

fn opt_index(
    d: &Bound<'_, PyDict>,
    key: &Bound<'_, PyString>,
    where_: impl Field,
) -> PyResult<Option<usize>> {
    let field = || format!("{}.{}", where_(), key.to_string_lossy());
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => {
            let x = int(&v, field)?;
            usize::try_from(x)
                .map(Some)
                .map_err(|_| field_error(&field(), "negative"))
        }
    }
}

/// A task shape read once per distinct object: the planner's callers share one shape dict among
/// the pods of the same shape (the pods hold the dict for the whole call, so an address names
/// one object throughout).
#[derive(Default)]
struct TaskCache(HashMap<usize, Shape>);

impl TaskCache {
    fn read(&mut self, obj: &Bound<'_, PyAny>) -> PyResult<Shape> {
        let key = obj.as_ptr() as usize;
        if let Some(s) = self.0.get(&key) {
            return Ok(s.clone());
        }
        let s = read_task(obj)?;
        self.0.insert(key, s.clone());
        Ok(s)
    }
}

fn read_movable(
    obj: &Bound<'_, PyAny>,
    cluster: &Cluster,
    tasks: &mut TaskCache,
) -> PyResult<Vec<Movable<Shape, Assignment>>> {
    let py = obj.py();
    let all = sequence(obj, || "movable".to_string())?;
    let mut items = Vec::with_capacity(all.len());
    for (i, m) in all.iter().enumerate() {
        let_others_run(py, i);
        let w = || format!("movable[{i}]");
        let d = m
            .cast::<PyDict>()
            .map_err(|_| field_error(&w(), "expected an object"))?;
        let node = opt_index(d, intern!(py, mkey::node), w)?
            .ok_or_else(|| field_error(&w(), "node missing"))?;
        let group = opt_index(d, intern!(py, mkey::group), w)?
            .map(|g| {
                u32::try_from(g).map_err(|_| field_error(&format!("{}.group", w()), "too large"))
            })
            .transpose()?;
        let on = cluster.nodes.get(node).ok_or_else(|| {
            field_error(
                &format!("{}.node", w()),
                format!("index {node} out of range (0..{})", cluster.nodes.len()),
            )
        })?;
        items.push(Movable {
            node,
            task: tasks.read(&required(m, intern!(py, mkey::shape), w)?)?,
            place: read_assignment(&required(m, intern!(py, mkey::assignment), w)?, on)?,
            allowed: opt_index(d, intern!(py, mkey::allowed), w)?,
            pdb: opt_index(d, intern!(py, mkey::pdb), w)?,
            group,
        });
    }
    Ok(items)
}

fn read_pending(obj: &Bound<'_, PyAny>, tasks: &mut TaskCache) -> PyResult<Vec<Pending<Shape>>> {
    let py = obj.py();
    let mut out = Vec::new();
    for (i, m) in sequence(obj, || "pending".to_string())?.iter().enumerate() {
        let_others_run(py, i);
        let w = || format!("pending[{i}]");
        let d = m
            .cast::<PyDict>()
            .map_err(|_| field_error(&w(), "expected an object"))?;
        out.push(Pending {
            task: tasks.read(&required(m, intern!(py, pkey::shape), w)?)?,
            allowed: opt_index(d, intern!(py, pkey::allowed), w)?,
        });
    }
    Ok(out)
}

fn read_limits(obj: Option<&Bound<'_, PyDict>>) -> PyResult<Limits> {
    let mut l = Limits::default();
    let Some(d) = obj else { return Ok(l) };
    let size = |k: &str, dflt: usize| -> PyResult<usize> {
        match d.get_item(k)? {
            None => Ok(dflt),
            Some(v) if v.is_none() => Ok(dflt),
            Some(v) => {
                let x = int(&v, || format!("limits.{k}"))?;
                usize::try_from(x).map_err(|_| field_error(&format!("limits.{k}"), "negative"))
            }
        }
    };
    l.max_moves = size(lkey::max_moves, l.max_moves)?;
    l.max_moves_per_node = size(lkey::max_moves_per_node, l.max_moves_per_node)?;
    l.rescue_depth = size(lkey::rescue_depth, l.rescue_depth)?.min(8);
    l.max_rescues = size(lkey::max_rescues, l.max_rescues)?;
    l.rescue_budget = size(lkey::rescue_budget, l.rescue_budget)?;
    if let Some(v) = d.get_item(intern!(d.py(), lkey::min_gain))? {
        let g: f64 = v
            .extract()
            .map_err(|_| field_error("limits.min_gain", "expected a number"))?;
        if !(g.is_finite() && g >= 0.0) {
            return Err(field_error(
                "limits.min_gain",
                "must be a finite number >= 0",
            ));
        }
        l.min_gain = g;
    }
    if let Some(v) = d.get_item(intern!(d.py(), lkey::defragment))? {
        l.defragment = v.is_truthy()?;
    }
    Ok(l)
}

fn plan_dict<'py>(
    py: Python<'py>,
    p: &Plan<Assignment>,
    cluster: &Cluster,
) -> PyResult<Bound<'py, PyDict>> {
    let moves = PyList::empty(py);
    for mv in &p.moves {
        let d = PyDict::new(py);
        d.set_item("pod", mv.pod)?;
        d.set_item("from", mv.from)?;
        d.set_item("to", mv.to)?;
        d.set_item(
            "assignment",
            assignment_dict(py, &mv.to_place, &cluster.nodes[mv.to])?,
        )?;
        d.set_item("gain", mv.gain)?;
        d.set_item("rescue", mv.rescue)?;
        moves.append(d)?;
    }
    let rescues = PyList::empty(py);
    for r in &p.rescues {
        let d = PyDict::new(py);
        d.set_item("pending", r.pending)?;
        d.set_item("node", r.node)?;
        d.set_item(
            "assignment",
            assignment_dict(py, &r.place, &cluster.nodes[r.node])?,
        )?;
        d.set_item("moves", r.moves.clone())?;
        d.set_item("waits", r.waits)?;
        d.set_item("delta", r.delta)?;
        rescues.append(d)?;
    }
    let out = PyDict::new(py);
    out.set_item("moves", moves)?;
    out.set_item("rescues", rescues)?;
    out.set_item("unrescued", p.unrescued.clone())?;
    out.set_item("truncated", p.truncated)?;
    Ok(out)
}

/// kube_default_scores(cpu_cap, cpu_left, mem_cap, mem_left, cpu, memory) -> the default
/// scoring plugins' total (`crate::placement::kube_default_scores`).
#[pyfunction]
fn kube_default_scores(
    cpu_cap: i64,
    cpu_left: i64,
    mem_cap: i64,
    mem_left: i64,
    cpu: i64,
    memory: i64,
) -> i64 {
    placement::kube_default_scores(cpu_cap, cpu_left, mem_cap, mem_left, cpu, memory)
}

/// extender_scores(ranks) -> the scheduler extender's 0..10 per node (None: not admitted).
#[pyfunction]
fn extender_scores(ranks: Vec<Option<(i64, i64, i64)>>) -> Vec<i64> {
    placement::extender_scores(&ranks)
}

/// extender_choice(ranks) -> the index of the policy's choice (the node scored 10), or None.
#[pyfunction]
fn extender_choice(ranks: Vec<Option<(i64, i64, i64)>>) -> Option<usize> {
    placement::extender_choice(&ranks)
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
    m.add_function(wrap_pyfunction!(extender_scores, m)?)?;
    m.add_function(wrap_pyfunction!(extender_choice, m)?)?;
    m.add_function(wrap_pyfunction!(kube_default_scores, m)?)?;
    m.add("EXTENDER_WEIGHT", placement::EXTENDER_WEIGHT)?;
    m.add("CATEGORY_NAMES", PyList::new(m.py(), CATEGORY_NAMES)?)?;
    Ok(())
}
