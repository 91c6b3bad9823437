//! Python face of the fragmentation scorer: `FragmentModel` (a cluster in columns) with
//! `score`, `place_delta`, `remove_delta` and `apply`.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::convert::{columns, field_error, fields, value_error, Obj, Path, Read};
use super::inputs::{assignment, columns, movable, pending, plan_limits};
use super::shape::{read_shapes, read_task};
use crate::compaction::{self, Input, Limits, Movable, NodeSet, Pending, Plan};
use crate::fragment::delta::{apply, place_delta, remove_delta, Assignment, Delta};
use crate::fragment::fabric::{fabric_score, Gang};
use crate::fragment::score::{node_model, score_node, RecoverMemo};
use crate::fragment::{Cluster, Node, Shape, CATEGORY_NAMES};
use crate::placement::{self, ClusterView, Ranked};

fn assignment_dict<'py>(
    py: Python<'py>,
    a: &Assignment,
    node: &Node,
) -> PyResult<Bound<'py, PyDict>> {
    let d = fields!(py, a; cpu, memory, gpus, mig);
    if !a.dra_gpus.is_empty() {
        d.set_item("dra_gpus", &a.dra_gpus)?;
    }
    if !a.dyn_whole.is_empty() {
        d.set_item("dyn_whole", &a.dyn_whole)?;
    }
    if let Some(v) = mig_new_out(a, node) {
        d.set_item("mig_new", v)?;
    }
    if a.rdma > 0 {
        d.set_item("rdma", a.rdma)?;
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

/// Where a task sits on `node` (`AssignmentInput`, as `assignment_dict` writes it); the MIG
/// profile of `mig_new` is resolved in the node's model.
fn read_assignment(obj: &Bound<'_, PyAny>, at: Path<'_>, node: &Node) -> PyResult<Assignment> {
    let a = assignment::Input::read(obj, at)?;
    let pairs = |rows: Vec<[u64; 2]>| rows.into_iter().map(|[z, v]| (z as usize, v));
    let gpus = |rows: Vec<[u64; 3]>, key: &str| -> PyResult<Vec<(usize, usize, u32)>> {
        let too_large = || field_error(&format!("{}.{key}", at()), "value out of range");
        rows.into_iter()
            .map(|[z, g, m]| {
                Ok((
                    z as usize,
                    g as usize,
                    u32::try_from(m).map_err(|_| too_large())?,
                ))
            })
            .collect()
    };
    let mig_new = match a.mig_new {
        None => None,
        Some((zi, mi, name, start)) => {
            let model = node_model(node).ok_or_else(|| {
                field_error(
                    &format!("{}.mig_new", at()),
                    "the node has no MIG GPU model",
                )
            })?;
            Some((
                zi,
                mi,
                model.profile_index(&name).map_err(value_error)?,
                start,
            ))
        }
    };
    Ok(Assignment {
        cpu: pairs(a.cpu).collect(),
        memory: pairs(a.memory).collect(),
        gpus: gpus(a.gpus, assignment::gpus)?,
        mig: a.mig.map(|[z, g, i]| (z as usize, g as usize, i as usize)),
        dra_gpus: gpus(a.dra_gpus, assignment::dra_gpus)?,
        dyn_whole: pairs(a.dyn_whole).map(|(z, g)| (z, g as usize)).collect(),
        mig_new,
        rdma: a.rdma,
    })
}

/// A cluster snapshot prepared for scoring (build once, score many times).
#[pyclass(module = "pyctl._core", name = "FragmentModel")]
pub struct PyFragmentModel {
    cluster: Cluster,
}

fn delta_dict<'py>(py: Python<'py>, d: &Delta, node: &Node) -> PyResult<Bound<'py, PyDict>> {
    let out = fields!(py, d; fragment_gpu_milli, fragment_mig_slices);
    out.set_item("assignment", assignment_dict(py, &d.assignment, node)?)?;
    Ok(out)
}

#[pymethods]
impl PyFragmentModel {
    #[new]
    fn new(columns: &Bound<'_, PyAny>) -> PyResult<Self> {
        let c = columns::Input::named(columns, "columns")?;
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
        let rows = scores.iter();
        let out = columns!(
            py, rows, "";
            idle_gpu_milli, fragment_gpu_milli, idle_mig_slices, fragment_mig_slices,
            recoverable_mig_slices
        );
        let (cats, mig_cats) = (PyDict::new(py), PyDict::new(py));
        for (k, name) in CATEGORY_NAMES.iter().enumerate() {
            cats.set_item(
                *name,
                rows.clone().map(|s| s.categories[k]).collect::<Vec<_>>(),
            )?;
            mig_cats.set_item(
                *name,
                rows.clone()
                    .map(|s| s.mig_categories[k])
                    .collect::<Vec<_>>(),
            )?;
        }
        out.set_item("categories", cats)?;
        out.set_item("mig_categories", mig_cats)?;
        let zones = scores.iter().flat_map(|s| &s.zones);
        let zone = columns!(
            py, zones, "zone_";
            idle_gpu_milli, fragment_gpu_milli, idle_mig_slices, fragment_mig_slices
        );
        out.update(zone.as_mapping())?;
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
        let task = read_task(task, &|| "task".into())?;
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
        let a = read_assignment(assignment, &|| "assignment".into(), n)?;
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
        let task = read_task(task, &|| "task".into())?;
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
        let task = read_task(task, &|| "task".into())?;
        let shapes = read_shapes(shapes)?;
        let cluster = &self.cluster;
        let count = cluster.nodes.len();
        let mut allowed = vec![nodes.is_none(); count];
        for i in nodes.into_iter().flatten().filter(|&i| i < count) {
            allowed[i] = true;
        }
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
        limits: Option<&Bound<'py, PyAny>>,
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
        let out = fields!(py, f; node_domain_split, node_no_domain);
        let domains = PyList::empty(py);
        for d in &f.domains {
            domains.append(fields!(
                py, d;
                level, domain, nodes, gpu_milli, idle_gpu_milli, fragment_gpu_milli, whole,
                capacity
            ))?;
        }
        out.set_item("domains", domains)?;
        Ok(out)
    }

    /// Index of a node by name, or None.
    fn node_index(&self, name: &str) -> Option<usize> {
        self.index_of().get(name).copied()
    }

    /// Places (`place=True`) or removes the task at `assignment` on node `node`, in place.
    fn apply(&mut self, node: usize, assignment: &Bound<'_, PyAny>, place: bool) -> PyResult<()> {
        let a = read_assignment(assignment, &|| "assignment".into(), self.node(node)?)?;
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
    let d = fields!(py, r.features; inc, cpu_short, left, idle);
    d.set_item("node", r.node)?;
    d.set_item("rank", r.rank)?;
    let on = &cluster.nodes[r.node];
    d.set_item("assignment", assignment_dict(py, &r.place, on)?)?;
    Ok(d)
}

/// A task shape read once per distinct object: the planner's callers share one shape dict among
/// the pods of the same shape (the pods hold the dict for the whole call, so an address names
/// one object throughout).
#[derive(Default)]
struct TaskCache(HashMap<usize, Shape>);

impl TaskCache {
    fn read(&mut self, py: Python<'_>, obj: &Obj, at: Path<'_>) -> PyResult<Shape> {
        let key = obj.0.as_ptr() as usize;
        if let Some(s) = self.0.get(&key) {
            return Ok(s.clone());
        }
        let s = read_task(obj.0.bind(py), at)?;
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
    let all = Vec::<movable::Input>::named(obj, "movable")?;
    let mut items = Vec::with_capacity(all.len());
    for (i, m) in all.into_iter().enumerate() {
        let at = |k: &str| format!("movable[{i}].{k}");
        let on = cluster.nodes.get(m.node).ok_or_else(|| {
            let n = cluster.nodes.len();
            field_error(
                &at("node"),
                format!("index {} out of range (0..{n})", m.node),
            )
        })?;
        items.push(Movable {
            node: m.node,
            task: tasks.read(py, &m.shape, &|| at("shape"))?,
            place: read_assignment(m.assignment.0.bind(py), &|| at("assignment"), on)?,
            allowed: m.allowed,
            pdb: m.pdb,
            group: m.group,
        });
    }
    Ok(items)
}

fn read_pending(obj: &Bound<'_, PyAny>, tasks: &mut TaskCache) -> PyResult<Vec<Pending<Shape>>> {
    let all = Vec::<pending::Input>::named(obj, "pending")?;
    let mut out = Vec::with_capacity(all.len());
    for (i, p) in all.into_iter().enumerate() {
        let task = tasks.read(obj.py(), &p.shape, &|| format!("pending[{i}].shape"))?;
        out.push(Pending {
            task,
            allowed: p.allowed,
        });
    }
    Ok(out)
}

/// The planner's limits (None: the default); a rescue takes at most 8 evictions.
fn read_limits(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Limits> {
    let mut l = match obj {
        None => Limits::default(),
        Some(d) => plan_limits::Input::named(d, "limits")?,
    };
    l.rescue_depth = l.rescue_depth.min(8);
    if !(l.min_gain.is_finite() && l.min_gain >= 0.0) {
        return Err(field_error(
            "limits.min_gain",
            "must be a finite number >= 0",
        ));
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
        let d = fields!(py, mv; pod, from, to, gain, rescue);
        d.set_item(
            "assignment",
            assignment_dict(py, &mv.to_place, &cluster.nodes[mv.to])?,
        )?;
        moves.append(d)?;
    }
    let rescues = PyList::empty(py);
    for r in &p.rescues {
        let d = fields!(py, r; pending, node, moves, waits, delta);
        d.set_item(
            "assignment",
            assignment_dict(py, &r.place, &cluster.nodes[r.node])?,
        )?;
        rescues.append(d)?;
    }
    let out = fields!(py, p; unrescued, truncated);
    out.set_item("moves", moves)?;
    out.set_item("rescues", rescues)?;
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
