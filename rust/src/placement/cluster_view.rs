//! The policy's view of the controller's full cluster model (`crate::fragment::Cluster`): NUMA
//! zones under each node's Topology Manager policy, whole and shared GPUs, MIG instances, CPU
//! and memory. A placement is an `Assignment` (what `FragmentModel.apply` takes).

use std::borrow::Cow;
use std::cell::RefCell;

use super::{Features, View};
use crate::fragment::delta::{apply, candidates, Assignment};
use crate::fragment::model::{Node, GPU_MILLI};
use crate::fragment::score::{on_node, score_node, RecoverMemo};
use crate::fragment::workload::ShapeKey;
use crate::fragment::{Cluster, Shape};
use crate::mig::catalog::Catalog;

/// A cluster and the workload M, with each node's F_n(M) computed when first asked for and kept
/// current. The cluster is borrowed until the view changes it (planning), then copied.
pub struct ClusterView<'a> {
    pub cluster: Cow<'a, Cluster>,
    shapes: &'a [Shape],
    frag: RefCell<Vec<Option<f64>>>,
    memo: RefCell<RecoverMemo>,
}

/// One node's F_n(M) in milli-GPU: the GPU fragment plus each stranded MIG compute slice at its
/// share of the GPU (1000 / the model's compute slices).
fn node_frag(node: &Node, shapes: &[Shape], memo: &mut RecoverMemo) -> f64 {
    let s = score_node(node, shapes, memo);
    s.fragment_gpu_milli + s.fragment_mig_slices * mig_slice_milli(node)
}

fn mig_slice_milli(node: &Node) -> f64 {
    match node.mig_model {
        Some(mi) => {
            let slices = Catalog::builtin().models()[mi].compute_slices.max(1);
            GPU_MILLI as f64 / slices as f64
        }
        None => 0.0,
    }
}

/// Whether taking `t` (with `gpu_milli_taken` of the node's GPUs) would leave `node` a smaller
/// share of its CPU, or of its RDMA, than of its GPU when it was not before: the rule of
/// `crate::replay::kernel::makes_short`, on the full model.
fn short_after(node: &Node, t: &Shape, gpu_milli_taken: u64) -> bool {
    let gpu_cap: u64 = node
        .zones
        .iter()
        .map(|z| z.gpus.len() as u64 * GPU_MILLI as u64)
        .sum();
    if gpu_cap == 0 {
        return false;
    }
    let idle = node.idle_gpu_milli();
    let idle_after = idle.saturating_sub(gpu_milli_taken);
    // `left` of `cap` is a smaller share than `idle` of the GPU
    let short = |left: u64, cap: u64, idle: u64| {
        (left as u128) * (gpu_cap as u128) < (idle as u128) * (cap as u128)
    };
    let becomes = |left: u64, cap: u64, take: u64| {
        !short(left, cap, idle) && short(left.saturating_sub(take), cap, idle_after)
    };
    let cpu_cap: u64 = node.zones.iter().map(|z| z.cpu_milli).sum();
    let cpu_left: u64 = node.zones.iter().map(|z| z.cpu_free).sum();
    becomes(cpu_left, cpu_cap, t.cpu_milli)
        || (t.rdma > 0 && node.rdma > 0 && becomes(node.rdma_free, node.rdma, t.rdma))
}

impl<'a> ClusterView<'a> {
    /// A view that owns (and may change) `cluster`.
    pub fn new(cluster: Cluster, shapes: &'a [Shape]) -> Self {
        Self::with(Cow::Owned(cluster), shapes)
    }

    /// A view of `cluster` that copies it only if it changes it.
    pub fn of(cluster: &'a Cluster, shapes: &'a [Shape]) -> Self {
        Self::with(Cow::Borrowed(cluster), shapes)
    }

    fn with(cluster: Cow<'a, Cluster>, shapes: &'a [Shape]) -> Self {
        let n = cluster.nodes.len();
        ClusterView {
            cluster,
            shapes,
            frag: RefCell::new(vec![None; n]),
            memo: RefCell::new(RecoverMemo::new()),
        }
    }

    fn score(&self, node: &Node) -> f64 {
        node_frag(node, self.shapes, &mut self.memo.borrow_mut())
    }

    fn place(&mut self, i: usize, p: &Assignment, on: bool) {
        if apply(&mut self.cluster.to_mut().nodes[i], p, on).is_ok() {
            self.frag.borrow_mut()[i] = None;
        }
    }
}

impl View for ClusterView<'_> {
    type Task = Shape;
    type Place = Assignment;
    type Key = ShapeKey;

    fn node_count(&self) -> usize {
        self.cluster.nodes.len()
    }

    fn is_cpu_only(&self, t: &Shape) -> bool {
        t.is_cpu_only()
    }

    fn candidates<F: FnMut(Assignment, Features)>(&self, i: usize, t: &Shape, mut f: F) {
        let Some(node) = self.cluster.nodes.get(i) else {
            return;
        };
        let before = self.frag(i);
        let idle = node.idle_gpu_milli() as i64;
        // a replica's or a memory request's share depends on the node
        let sized = on_node(t, node);
        let share = t.gpus == 1 && sized.gpu_milli < GPU_MILLI && t.mig_profile.is_none();
        // GPUs of one zone with the same free share give the same node: try one of them
        let mut seen: Vec<(usize, u32)> = Vec::new();
        for a in candidates(node, t) {
            let mut left = 0i64;
            if share {
                if let Some(&(zi, gi, _)) = a.gpus.first() {
                    let free = node.zones[zi].gpus[gi].1;
                    if seen.contains(&(zi, free)) {
                        continue;
                    }
                    seen.push((zi, free));
                    left = free as i64 - sized.gpu_milli as i64;
                }
            }
            let mut after = node.clone();
            if apply(&mut after, &a, true).is_err() {
                continue;
            }
            let taken: u64 = a.gpus.iter().map(|g| g.2 as u64).sum();
            let features = Features {
                inc: self.score(&after) - before,
                cpu_short: !t.is_cpu_only() && short_after(node, t, taken),
                left,
                idle,
            };
            f(a, features);
        }
    }

    fn take(&mut self, i: usize, _t: &Shape, p: &Assignment) {
        self.place(i, p, true);
    }

    fn give(&mut self, i: usize, _t: &Shape, p: &Assignment) {
        self.place(i, p, false);
    }

    fn frag(&self, i: usize) -> f64 {
        if let Some(f) = self.frag.borrow()[i] {
            return f;
        }
        let f = self.score(&self.cluster.nodes[i]);
        self.frag.borrow_mut()[i] = Some(f);
        f
    }

    fn frag_without(&self, i: usize, _t: &Shape, p: &Assignment) -> f64 {
        let mut n = self.cluster.nodes[i].clone();
        if apply(&mut n, p, false).is_err() {
            return self.frag(i);
        }
        self.score(&n)
    }

    fn gpu_milli(&self, i: usize, t: &Shape) -> u64 {
        if let Some(p) = &t.mig_profile {
            // "<g>g.<mem>": g compute slices of (at most) seven
            let g: u64 = p
                .split('g')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(1);
            return g * GPU_MILLI as u64 / 7;
        }
        let milli = match self.cluster.nodes.get(i) {
            Some(node) => on_node(t, node).gpu_milli,
            None => t.gpu_milli,
        };
        t.gpus as u64 * milli as u64
    }

    fn task_key(&self, t: &Shape) -> Self::Key {
        t.key()
    }
}
