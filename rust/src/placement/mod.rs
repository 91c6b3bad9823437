//! pyctl's placement policy, written once: how the feasible placements of a task are ranked,
//! on one node and across a node set. The scheduler extender (`FragmentModel.rank`), the
//! simulated cluster's scheduler and the trace replay's `pyctl` policy all call `choose` /
//! `rank_nodes`; the compaction planner (`crate::compaction`) predicts where an evicted pod
//! lands with `choose` too.
//!
//! The policy sees a cluster through the `View` trait, which yields, per node, the placements
//! the kubelet would admit and what each would do (`Features`). Two views exist: the
//! controller's full model (`ClusterView`, zones, MIG, memory; `cluster_view.rs`) and the
//! replay's allocation-free kernel (`crate::replay::state::Kernel`); a test pins the kernel's
//! features to the full model's on random nodes.
//!
//! The rank of one placement, smallest first (`rank`):
//! - a GPU task: FGD's quantised score of the node's fragment increase
//!   (`int(sigmoid(ΔF/1000)·100)`, negated), then placements that do not make the node
//!   CPU-short (leave it a smaller share of its CPU than of its GPU when it was not: F_n(M) sees
//!   CPU only once a shape no longer fits, and by then the GPUs are stranded; the replay's
//!   kernel, which models RDMA as a node resource, applies the same rule to RDMA), then the GPU
//!   left with the least free share (best fit) for a sharing task;
//! - a CPU-only task: the node with the least idle GPU first (GPU tasks do not need its CPU),
//!   then FGD's score.
//!
//! Ties go to the first node in the view's order: the replay's seeded node order (the FGD
//! artifact's tie rule); a stable order in the controller.

pub mod cluster_view;

pub use cluster_view::ClusterView;

/// What the policy knows of one candidate placement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Features {
    /// The node's F_n(M) after minus before (milli-GPU; a MIG slice counts as its share of a
    /// GPU).
    pub inc: f64,
    /// The placement makes the node CPU-short (see the module doc; in a view that models RDMA,
    /// also RDMA-short).
    pub cpu_short: bool,
    /// Free share left (milli-GPU) on the GPU a sharing task takes; 0 otherwise.
    pub left: i64,
    /// The node's idle GPU (milli-GPU) before the placement.
    pub idle: i64,
}

/// A placement's rank: smaller is better.
pub type Rank = (i64, i64, i64);

/// FGD's score plugin: `int(sigmoid(delta / 1000) * 100)` of a fragment fall `delta`.
pub fn sigmoid_score(delta_milli: f64) -> i64 {
    if !delta_milli.is_finite() {
        return if delta_milli > 0.0 { 100 } else { 0 };
    }
    (100.0 / (1.0 + (-(delta_milli / 1000.0)).exp())) as i64
}

/// The rank of a placement with features `f` of a task (`cpu_only`: it asks for no GPU).
pub fn rank(cpu_only: bool, f: &Features) -> Rank {
    let q = -sigmoid_score(-f.inc);
    if cpu_only {
        (f.idle, q, 0)
    } else {
        (q, f.cpu_short as i64, f.left)
    }
}

/// A cluster as the policy sees it.
pub trait View: Sized {
    type Task;
    type Place: Clone;
    /// Equal for tasks the policy treats alike (same requests and constraints).
    type Key: std::hash::Hash + Eq;

    fn node_count(&self) -> usize;
    fn is_cpu_only(&self, t: &Self::Task) -> bool;
    /// Calls `f` with every distinct placement of `t` on node `i` that the node admits.
    fn candidates<F: FnMut(Self::Place, Features)>(&self, i: usize, t: &Self::Task, f: F);
    /// Places `t` at `p` on node `i` (the caller got `p` from `candidates`).
    fn take(&mut self, i: usize, t: &Self::Task, p: &Self::Place);
    /// Removes `t` from `p` on node `i`.
    fn give(&mut self, i: usize, t: &Self::Task, p: &Self::Place);
    /// The node's F_n(M) now (milli-GPU, as `Features::inc`).
    fn frag(&self, i: usize) -> f64;
    /// The node's F_n(M) if `t` at `p` were removed (never negative, as `frag`: the planner
    /// bounds a pod's fall by its node's F_n(M)).
    fn frag_without(&self, i: usize, t: &Self::Task, p: &Self::Place) -> f64;
    fn task_key(&self, t: &Self::Task) -> Self::Key;
    /// The GPU the task asks for on node `i`, milli-GPU (MIG: the instance's share of its GPU;
    /// a replica or memory request: its share on that node).
    fn gpu_milli(&self, i: usize, t: &Self::Task) -> u64;
    /// Whether node `i` would admit `t` with the tasks `removed` gone from it (a quick
    /// necessary check a view may answer without changing itself; the default does change it,
    /// and back).
    fn fits_without(
        &mut self,
        i: usize,
        t: &Self::Task,
        removed: &[(&Self::Task, &Self::Place)],
    ) -> bool {
        for (rt, rp) in removed {
            self.give(i, rt, rp);
        }
        let fits = best_on(self, i, t).is_some();
        for (rt, rp) in removed.iter().rev() {
            self.take(i, rt, rp);
        }
        fits
    }
}

/// One ranked placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked<P> {
    pub node: usize,
    pub place: P,
    pub rank: Rank,
    pub features: Features,
}

/// The best placement of `t` on node `i` (ties: the first candidate), or None.
pub fn best_on<V: View>(v: &V, i: usize, t: &V::Task) -> Option<Ranked<V::Place>> {
    let cpu_only = v.is_cpu_only(t);
    let mut best: Option<Ranked<V::Place>> = None;
    v.candidates(i, t, |place, features| {
        let r = rank(cpu_only, &features);
        if best.as_ref().is_none_or(|b| r < b.rank) {
            best = Some(Ranked {
                node: i,
                place,
                rank: r,
                features,
            });
        }
    });
    best
}

/// The policy's choice for `t` among the nodes `allowed` accepts: the best rank, ties to the
/// first node in order. None when no allowed node admits it.
pub fn choose<V: View>(
    v: &V,
    t: &V::Task,
    allowed: impl Fn(usize) -> bool,
) -> Option<Ranked<V::Place>> {
    let mut best: Option<Ranked<V::Place>> = None;
    for i in 0..v.node_count() {
        if !allowed(i) {
            continue;
        }
        if let Some(r) = best_on(v, i, t) {
            if best.as_ref().is_none_or(|b| r.rank < b.rank) {
                best = Some(r);
            }
        }
    }
    best
}

/// The best placement on each of `nodes` (None: the node does not admit `t`).
pub fn rank_nodes<V: View>(v: &V, t: &V::Task, nodes: &[usize]) -> Vec<Option<Ranked<V::Place>>> {
    nodes
        .iter()
        .map(|&i| (i < v.node_count()).then(|| best_on(v, i, t)).flatten())
        .collect()
}

/// The kube-scheduler extender's `MaxExtenderPriority`.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;
/// The kube-scheduler's `MaxNodeScore`.
pub const MAX_NODE_SCORE: i64 = 100;
/// The extender's weight in `deploy/scheduler/extender-config.yaml` (a test pins the two).
pub const EXTENDER_WEIGHT: i64 = 100;

/// kube-scheduler v1.37's default scoring plugins that tell nodes apart by their resources, for a
/// pod requesting `cpu` milli-CPU and `mem` MiB on a node with those capacities and free
/// amounts: NodeResourcesFit with the `LeastAllocated` strategy (CPU and memory, weight 1 each,
/// `(capacity - requested) * 100 / capacity` averaged) plus NodeResourcesBalancedAllocation
/// (`(1 - std of the requested fractions) * 100`), the pod's requests included. Each plugin's
/// weight is 1 in the default profile.
pub fn kube_default_scores(
    cpu_cap: i64,
    cpu_left: i64,
    mem_cap: i64,
    mem_left: i64,
    cpu: i64,
    mem: i64,
) -> i64 {
    let frac = |cap: i64, left: i64, req: i64| -> (i64, f64) {
        if cap <= 0 {
            return (0, 0.0);
        }
        let requested = (cap.saturating_sub(left).saturating_add(req)).clamp(0, cap);
        (
            ((cap - requested) as i128 * MAX_NODE_SCORE as i128 / cap as i128) as i64,
            requested as f64 / cap as f64,
        )
    };
    let (cpu_score, cpu_frac) = frac(cpu_cap, cpu_left, cpu);
    let (mem_score, mem_frac) = frac(mem_cap, mem_left, mem);
    let least = (cpu_score + mem_score) / 2;
    // the standard deviation of the two fractions is half their difference
    let std = (cpu_frac - mem_frac).abs() / 2.0;
    let balanced = ((1.0 - std) * MAX_NODE_SCORE as f64) as i64;
    least + balanced
}

/// The node the policy chooses among candidates whose ranks are given in the view's node order:
/// the first with the best rank (None when no candidate admits the task). `extender_scores` gives
/// it 10; the extender's `choose` answers with it.
pub fn extender_choice(ranks: &[Option<Rank>]) -> Option<usize> {
    let mut best: Option<(usize, Rank)> = None;
    for (i, r) in ranks.iter().enumerate() {
        if let Some(r) = *r {
            if best.is_none_or(|(_, b)| r < b) {
                best = Some((i, r));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Extender scores (0..=10) from ranks, given in the view's node order: the policy's choice
/// (`extender_choice`: the first node with the best rank) scores 10, other nodes with that rank
/// 9, the rest 1..=8 by their quantised fragment score between the best and the worst (`rank.0`:
/// the FGD score of a GPU task, the idle GPU of a CPU-only one); a node that does not admit the
/// task scores 0. With the extender's weight far above the default plugins' (deploy/scheduler),
/// the scheduler then places where `choose` would.
pub fn extender_scores(ranks: &[Option<Rank>]) -> Vec<i64> {
    let Some(choice) = extender_choice(ranks) else {
        return vec![0; ranks.len()];
    };
    let best = ranks[choice].unwrap_or_default();
    let worst = ranks.iter().flatten().map(|r| r.0).max().unwrap_or(best.0);
    ranks
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            None => 0,
            Some(_) if i == choice => MAX_EXTENDER_PRIORITY,
            Some(r) if *r == best => MAX_EXTENDER_PRIORITY - 1,
            Some(r) => {
                let span = (worst - best.0).max(1) as f64;
                let x = (worst - r.0) as f64 / span; // 1 at the best primary key, 0 at the worst
                (1 + (x * 7.0).floor() as i64).clamp(1, MAX_EXTENDER_PRIORITY - 2)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_matches_fgd_and_saturates() {
        assert_eq!(sigmoid_score(0.0), 50);
        assert_eq!(sigmoid_score(1000.0), 73);
        assert_eq!(sigmoid_score(-1000.0), 26);
        assert_eq!(sigmoid_score(f64::INFINITY), 100);
        assert_eq!(sigmoid_score(f64::NEG_INFINITY), 0);
        assert_eq!(sigmoid_score(f64::NAN), 0);
    }

    #[test]
    fn rank_orders_by_fragment_then_cpu_then_fit() {
        let f = |inc: f64, cpu_short: bool, left: i64| Features {
            inc,
            cpu_short,
            left,
            idle: 0,
        };
        assert!(rank(false, &f(-500.0, true, 900)) < rank(false, &f(0.0, false, 0)));
        assert!(rank(false, &f(0.0, false, 900)) < rank(false, &f(0.0, true, 0)));
        assert!(rank(false, &f(0.0, false, 100)) < rank(false, &f(0.0, false, 900)));
        // CPU-only: the least idle GPU first
        let idle = |idle: i64| Features {
            inc: 0.0,
            cpu_short: false,
            left: 0,
            idle,
        };
        assert!(rank(true, &idle(0)) < rank(true, &idle(1000)));
    }

    #[test]
    fn extender_scores_give_ten_to_the_policys_choice_only() {
        let s = extender_scores(&[
            Some((-40, 0, 0)),
            Some((-50, 1, 0)),
            None,
            Some((-50, 0, 0)),
        ]);
        assert_eq!(s, vec![1, 8, 0, 10]);
        assert_eq!(extender_scores(&[None, None]), vec![0, 0]);
        // ties: the first in order is the choice
        assert_eq!(
            extender_scores(&[Some((3, 0, 0)), Some((3, 0, 0))]),
            vec![10, 9]
        );
    }

    #[test]
    fn the_choice_is_the_node_scored_ten() {
        let cases: [&[Option<Rank>]; 5] = [
            &[
                Some((-40, 0, 0)),
                Some((-50, 1, 0)),
                None,
                Some((-50, 0, 0)),
            ],
            &[None, None],
            &[],
            &[Some((3, 0, 0)), Some((3, 0, 0))],
            &[
                None,
                Some((7, 2, 1)),
                Some((7, 2, 0)),
                Some((7, 2, 0)),
                None,
            ],
        ];
        for ranks in cases {
            let scores = extender_scores(ranks);
            let tens: Vec<usize> = (0..ranks.len())
                .filter(|&i| scores[i] == MAX_EXTENDER_PRIORITY)
                .collect();
            assert_eq!(tens, extender_choice(ranks).into_iter().collect::<Vec<_>>());
        }
        assert_eq!(
            extender_choice(&[None, Some((7, 2, 1)), Some((7, 2, 0))]),
            Some(2)
        );
    }
}
