//! Node and GPU choice per policy, as the FGD artifact's score plugins define them
//! (hkust-adsl/kubernetes-scheduler-simulator, pkg/simulator/plugin), plus pyctl's.
//!
//! Every artifact policy yields an integer score per feasible node (0..=100, as the plugins do,
//! including FGD's `int(sigmoid(delta / 1000) * 100)` quantisation); the node is drawn uniformly
//! among those with the highest score (kube-scheduler's `selectHost`). GPU choice for a sharing
//! task: Random = random fitting GPU; FGD = the GPU with the best FGD score (first on ties);
//! the others = best fit (least free share that fits, first on ties), the simulator's default.
//! Whole-GPU tasks take the lowest-indexed free GPUs.
//!
//! pyctl: the product's placement policy (`crate::placement`), over the replay's kernel
//! (`super::kernel::Kernel`). pyctl as deployed (`PyctlDeployed`): the kube-scheduler with
//! pyctl's extender, as `deploy/scheduler/extender-config.yaml` configures it (`choose_deployed`).
//! Ties of the artifact policies go to the first node in node order (see `choose`).

use super::kernel::{frag_after, share_candidates, Kernel};
use super::rng::Rng;
use super::state::{KShape, KTask, State, MAX_GPUS};
use crate::placement::{
    self, extender_scores, sigmoid_score, EXTENDER_WEIGHT, MAX_EXTENDER_PRIORITY, MAX_NODE_SCORE,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Random,
    DotProd,
    Clustering,
    Packing,
    BestFit,
    Fgd,
    Pyctl,
    PyctlDeployed,
}

pub const POLICY_NAMES: [&str; 8] = [
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "pyctl",
    "pyctl-deployed",
];

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        Some(match s.to_ascii_lowercase().as_str() {
            "random" => Policy::Random,
            "dotprod" | "dotproduct" => Policy::DotProd,
            "clustering" | "gpuclustering" => Policy::Clustering,
            "packing" | "gpupacking" => Policy::Packing,
            "bestfit" => Policy::BestFit,
            "fgd" => Policy::Fgd,
            "pyctl" => Policy::Pyctl,
            "pyctl-deployed" | "pyctl_deployed" => Policy::PyctlDeployed,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        POLICY_NAMES[self as usize]
    }

    /// Whether the policy's filter and score see NUMA zones.
    pub fn numa_aware(self) -> bool {
        self.is_pyctl()
    }

    /// pyctl's policy, alone or as deployed.
    pub fn is_pyctl(self) -> bool {
        matches!(self, Policy::Pyctl | Policy::PyctlDeployed)
    }
}

const MAX_SPEC_CPU: f64 = 128000.0;
const MAX_SPEC_GPU: f64 = 8000.0;

fn best_fit_gpu(st: &State, i: usize, t: &KTask) -> u16 {
    let mut best: Option<(u16, usize)> = None;
    for (g, &f) in st.gpus(i).iter().enumerate() {
        if f >= t.milli && best.is_none_or(|(bf, _)| f < bf) {
            best = Some((f, g));
        }
    }
    best.map_or(0, |(_, g)| 1 << g)
}

/// The GPUs a whole-GPU task takes on node `i` as the artifact does (lowest free indices).
fn whole_default(st: &State, i: usize, t: &KTask) -> u16 {
    st.whole_gpus(i, t.num, 0, st.ngpu[i] as usize).unwrap_or(0)
}

/// A choice: node and GPU mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub node: usize,
    pub gpus: u16,
}

/// Chooses a node and GPUs for task `t` (None: no feasible node). `skip` excludes one node (the
/// source of a compaction move).
pub fn choose(
    policy: Policy,
    k: &Kernel<'_>,
    t: &KTask,
    rng: &mut Rng,
    skip: Option<usize>,
) -> Option<Choice> {
    choose_in(policy, k, t, rng, |i| Some(i) != skip)
}

/// `choose` among the nodes `allowed` accepts (a task's scheduling constraints, such as the
/// per-app anti-affinity of the inference replay: a filter before any score, as the
/// kube-scheduler's filter plugins run before its score plugins).
pub fn choose_in(
    policy: Policy,
    k: &Kernel<'_>,
    t: &KTask,
    rng: &mut Rng,
    allowed: impl Fn(usize) -> bool,
) -> Option<Choice> {
    match policy {
        // pyctl's choice: the product's placement policy over the replay's kernel
        Policy::Pyctl => {
            return placement::choose(k, t, allowed).map(|r| Choice {
                node: r.node,
                gpus: r.place,
            })
        }
        Policy::PyctlDeployed => return choose_deployed(k, t, rng, allowed),
        _ => {}
    }
    let (st, shapes) = (&k.st, k.shapes);
    let aware = policy.numa_aware();
    let n = st.node_count();
    let mut best_score = i64::MIN;
    let mut chosen: Option<Choice> = None;
    let mut feasible = 0u64;
    let mut cands = [0u16; MAX_GPUS];
    for i in 0..n {
        if !allowed(i) || !st.fits(i, t, aware) {
            continue;
        }
        feasible += 1;
        let (score, gpus) = match policy {
            Policy::Random => {
                // Reservoir over feasible nodes = uniform choice of one feasible node.
                let gpus = if t.is_share() {
                    let k = share_candidates(st, i, t, &mut cands);
                    cands[rng.below(k as u64) as usize]
                } else if t.num > 0 {
                    whole_default(st, i, t)
                } else {
                    0
                };
                if rng.below(feasible) == 0 {
                    chosen = Some(Choice { node: i, gpus });
                }
                continue;
            }
            Policy::DotProd => {
                let gpus = gpu_default(st, i, t);
                let node_cpu = st.cpu_left[i] as f64 / MAX_SPEC_CPU;
                let node_gpu = st.idle[i] as f64 / MAX_SPEC_GPU;
                let pod_cpu = t.cpu as f64 / MAX_SPEC_CPU;
                let pod_gpu = t.gpu_milli_total() as f64 / MAX_SPEC_GPU;
                let dot = (node_cpu * pod_cpu + node_gpu * pod_gpu) / 2.0;
                ((100.0 * (1.0 - dot)) as i64, gpus)
            }
            Policy::Clustering => (clustering_score(st, i, t), gpu_default(st, i, t)),
            Policy::Packing => (packing_score(st, i, t), gpu_default(st, i, t)),
            Policy::BestFit => {
                let free_cpu = (st.cpu_left[i] - t.cpu) as f64 / MAX_SPEC_CPU;
                let free_gpu = (st.idle[i] as f64 - t.gpu_milli_total() as f64) / MAX_SPEC_GPU;
                let s = 0.5 * free_cpu + 0.5 * free_gpu;
                (((1.0 - s) * 100.0) as i64, gpu_default(st, i, t))
            }
            Policy::Fgd => fgd_score(st, shapes, i, t, &mut cands),
            Policy::Pyctl | Policy::PyctlDeployed => unreachable_pyctl(),
        };
        if score > best_score {
            best_score = score;
            chosen = Some(Choice { node: i, gpus });
        }
        // Ties go to the first node in node order: what reproduces the artifact's published
        // numbers (a uniform draw among ties gives FGD about 9.7% unallocated instead of 4.8%).
    }
    chosen
}

#[inline]
fn unreachable_pyctl() -> (i64, u16) {
    (i64::MIN, 0)
}

fn gpu_default(st: &State, i: usize, t: &KTask) -> u16 {
    if t.is_share() {
        best_fit_gpu(st, i, t)
    } else if t.num > 0 {
        whole_default(st, i, t)
    } else {
        0
    }
}

fn clustering_score(st: &State, i: usize, t: &KTask) -> i64 {
    let Some(tag) = t.tag() else { return 0 };
    let aff = &st.affinity[i];
    let kinds = aff.iter().filter(|&&c| c > 0).count();
    let left = st.idle[i] as i64;
    let fill = 25 * (8000 - left) / 8000;
    if aff[tag] > 0 {
        if kinds == 1 {
            fill + 75
        } else {
            fill + 50
        }
    } else if kinds == 0 {
        fill + 25
    } else {
        fill
    }
}

fn packing_score(st: &State, i: usize, t: &KTask) -> i64 {
    if t.num == 0 {
        return 0;
    }
    let free = st.gpus(i);
    let fully = free.iter().filter(|&&f| f == 1000).count() as i64;
    if fully == free.len() as i64 {
        return (100 / 3 - fully).max(fully);
    }
    // Least free share first (stable), as the artifact sorts.
    let mut idx: [usize; MAX_GPUS] = [0; MAX_GPUS];
    let n = free.len();
    for (k, slot) in idx.iter_mut().enumerate().take(n) {
        *slot = k;
    }
    idx[..n].sort_by_key(|&g| free[g]);
    let mut need = t.num;
    let mut fully_used = 0i64;
    let mut ratio = 0i64;
    for &g in &idx[..n] {
        if need == 0 {
            break;
        }
        if free[g] >= t.milli {
            need -= 1;
            if free[g] == 1000 {
                fully_used += 1;
            }
            ratio += free[g] as i64 * 100 / 1000;
        }
    }
    if need != 0 {
        return 0;
    }
    if fully_used > 0 {
        return (50 - fully_used).max(100 / 3);
    }
    (100 - ratio / 10).max(50)
}

fn fgd_score(
    st: &State,
    shapes: &[KShape],
    i: usize,
    t: &KTask,
    cands: &mut [u16; MAX_GPUS],
) -> (i64, u16) {
    let old = st.frag_blind[i];
    if t.is_share() {
        let k = share_candidates(st, i, t, cands);
        let mut best: Option<(i64, u16)> = None;
        let mut seen: [u16; MAX_GPUS] = [u16::MAX; MAX_GPUS];
        let mut seen_score = [0i64; MAX_GPUS];
        let mut nseen = 0;
        for &c in &cands[..k] {
            let g = c.trailing_zeros() as usize;
            let f = st.free[i][g];
            // GPUs with the same free share give the same node state: score once.
            let s = match seen[..nseen].iter().position(|&x| x == f) {
                Some(p) => seen_score[p],
                None => {
                    let s = sigmoid_score(old - frag_after(st, shapes, i, t, c, 0));
                    seen[nseen] = f;
                    seen_score[nseen] = s;
                    nseen += 1;
                    s
                }
            };
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, c));
            }
        }
        best.unwrap_or((0, 0))
    } else {
        let gpus = if t.num > 0 {
            whole_default(st, i, t)
        } else {
            0
        };
        (
            sigmoid_score(old - frag_after(st, shapes, i, t, gpus, 0)),
            gpus,
        )
    }
}

fn default_scores(st: &State, i: usize, t: &KTask) -> i64 {
    placement::kube_default_scores(
        st.cpu_cap[i],
        st.cpu_left[i],
        st.mem_cap[i],
        st.mem_left[i],
        t.cpu,
        t.mem,
    )
}

/// pyctl as deployed: kube-scheduler's filter with pyctl's extender filter (the nodes the
/// kubelet would admit), then the default scoring plugins that differ between nodes here
/// (NodeResourcesFit, BalancedAllocation) plus the extender's score (0..=10) times
/// `MaxNodeScore / MaxExtenderPriority` and its weight; the highest total wins, ties drawn
/// uniformly (kube-scheduler's `selectHost`). The GPUs are those pyctl's policy picks on that
/// node (the device plugin's own choice is not modelled). The plugins that score every node
/// alike here (TaintToleration, NodeAffinity, InterPodAffinity, ImageLocality, and
/// PodTopologySpread's default constraints, which need owners the trace does not have) are left
/// out.
pub fn choose_deployed(
    k: &Kernel<'_>,
    t: &KTask,
    rng: &mut Rng,
    allowed: impl Fn(usize) -> bool,
) -> Option<Choice> {
    let nodes: Vec<usize> = (0..k.st.node_count()).filter(|&i| allowed(i)).collect();
    let ranked = placement::rank_nodes(k, t, &nodes);
    let ranks: Vec<_> = ranked.iter().map(|r| r.as_ref().map(|r| r.rank)).collect();
    let ext = extender_scores(&ranks);
    let scale = MAX_NODE_SCORE / MAX_EXTENDER_PRIORITY * EXTENDER_WEIGHT;
    let mut best: Option<(i64, Choice)> = None;
    let mut ties = 0u64;
    for ((&i, r), e) in nodes.iter().zip(&ranked).zip(&ext) {
        let Some(r) = r else { continue };
        let total = default_scores(&k.st, i, t) + e * scale;
        let c = Choice {
            node: i,
            gpus: r.place,
        };
        match best {
            Some((b, _)) if total < b => {}
            Some((b, _)) if total == b => {
                ties += 1;
                if rng.below(ties) == 0 {
                    best = Some((total, c));
                }
            }
            _ => {
                best = Some((total, c));
                ties = 1;
            }
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::kernel::makes_short;
    use crate::replay::{prepare, NodeSpec};

    /// One 8-GPU node of 96 vCPU with `rdma` percent of RDMA, and a one-GPU task.
    fn one_node(rdma: i64) -> (crate::replay::state::State, KTask) {
        let nodes = vec![NodeSpec {
            name: "a".into(),
            cpu_milli: 96000,
            memory_mib: 1 << 20,
            gpus: 8,
            model: "G2".into(),
            rdma,
        }];
        let task = KTask {
            cpu: 8000,
            mem: 0,
            rdma: 0,
            num: 1,
            milli: 1000,
            mask: u64::MAX,
        };
        (prepare(&nodes, &[], &[], false).unwrap().state, task)
    }

    #[test]
    fn cpu_short_counts_only_the_placement_that_makes_the_node_short() {
        let (mut st, task) = one_node(0);
        let heavy = KTask { cpu: 40000, ..task };
        let even = KTask { cpu: 12000, ..task };
        assert!(makes_short(&st, 0, &heavy, 1)); // 56/96 of the CPU for 7/8 of the GPU
        assert!(!makes_short(&st, 0, &even, 1)); // 84/96 for 7/8: not short
        st.cpu_left[0] = 30000; // already short (30/96 for 8/8): not held against anyone
        assert!(!makes_short(&st, 0, &even, 1));
    }

    #[test]
    fn rdma_short_is_the_same_rule_for_rdma() {
        let (mut st, task) = one_node(200);
        let fair = KTask { rdma: 25, ..task };
        let heavy = KTask { rdma: 50, ..task };
        assert!(!makes_short(&st, 0, &fair, 1)); // 175/200 of the RDMA for 7/8 of the GPU
        assert!(makes_short(&st, 0, &heavy, 1)); // 150/200 for 7/8: short
        st.rdma_left[0] = 150; // already short (150/200 for 8/8): not held against anyone
        assert!(!makes_short(&st, 0, &heavy, 1));
        // a node without RDMA, or a task that asks for none, is judged by CPU alone
        st.rdma_left[0] = 200;
        st.rdma_cap[0] = 0;
        assert!(!makes_short(&st, 0, &heavy, 1));
        st.rdma_cap[0] = 200;
        assert!(!makes_short(&st, 0, &task, 1));
    }
}
