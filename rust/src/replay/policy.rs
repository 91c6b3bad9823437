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
//! pyctl: FGD's score computed zone-aware (F_n(M) as the kubelet admits on NUMA-split nodes, and
//! only zone-admissible nodes and GPU sets), whole-GPU sets tried per zone, with CPU-aware
//! tie-breaks (`Rank`). Ties of the artifact policies go to the first node in node order (see
//! `choose`).

use super::rng::Rng;
use super::state::{frag, KShape, KTask, State, MAX_GPUS};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Random,
    DotProd,
    Clustering,
    Packing,
    BestFit,
    Fgd,
    Pyctl,
}

pub const POLICY_NAMES: [&str; 7] = [
    "random",
    "dotprod",
    "clustering",
    "packing",
    "bestfit",
    "fgd",
    "pyctl",
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
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        POLICY_NAMES[self as usize]
    }

    /// Whether the policy's filter and score see NUMA zones.
    pub fn numa_aware(self) -> bool {
        self == Policy::Pyctl
    }
}

const MAX_SPEC_CPU: f64 = 128000.0;
const MAX_SPEC_GPU: f64 = 8000.0;

fn sigmoid_score(delta_milli: f64) -> i64 {
    (100.0 / (1.0 + (-(delta_milli / 1000.0)).exp())) as i64
}

/// GPU masks a sharing task could take on node `i` (one per GPU with enough free share).
fn share_candidates(st: &State, i: usize, t: &KTask, out: &mut [u16; MAX_GPUS]) -> usize {
    let mut n = 0;
    for (g, &f) in st.gpus(i).iter().enumerate() {
        if f >= t.milli {
            out[n] = 1 << g;
            n += 1;
        }
    }
    n
}

fn best_fit_gpu(st: &State, i: usize, t: &KTask) -> u16 {
    let mut best: Option<(u16, usize)> = None;
    for (g, &f) in st.gpus(i).iter().enumerate() {
        if f >= t.milli && best.is_none_or(|(bf, _)| f < bf) {
            best = Some((f, g));
        }
    }
    best.map_or(0, |(_, g)| 1 << g)
}

/// F_n(M) of node `i` after hypothetically taking `t` on GPUs `gpus`.
#[inline]
fn frag_after(st: &State, shapes: &[KShape], i: usize, t: &KTask, gpus: u16, split: usize) -> f64 {
    let n = st.ngpu[i] as usize;
    let mut free = st.free[i];
    let mut m = gpus;
    while m != 0 {
        let g = m.trailing_zeros() as usize;
        free[g] -= t.milli;
        m &= m - 1;
    }
    frag(
        shapes,
        st.model_bit[i],
        st.cpu_left[i] - t.cpu,
        &free[..n],
        split,
    )
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
    st: &State,
    shapes: &[KShape],
    t: &KTask,
    rng: &mut Rng,
    skip: Option<usize>,
) -> Option<Choice> {
    if policy == Policy::Pyctl {
        return choose_pyctl(st, shapes, t, skip).map(|(c, _)| c);
    }
    let aware = policy.numa_aware();
    let n = st.node_count();
    let mut best_score = i64::MIN;
    let mut chosen: Option<Choice> = None;
    let mut feasible = 0u64;
    let mut cands = [0u16; MAX_GPUS];
    for i in 0..n {
        if Some(i) == skip || !st.fits(i, t, aware) {
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
            Policy::Pyctl => unreachable_pyctl(),
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

/// Whether taking `t` on GPUs `gpus` would make node `i` CPU-short: leave it a smaller share of
/// its CPU than of its GPU, when it was not before (its idle GPUs would then be the first to be
/// stranded for want of CPU). A node already CPU-short is not held against a placement: using its
/// GPUs is what it needs.
#[inline]
fn makes_cpu_short(st: &State, i: usize, t: &KTask, gpus: u16) -> bool {
    let gpu_cap = st.ngpu[i] as i128 * 1000;
    if gpu_cap == 0 {
        return false;
    }
    let cpu_cap = st.cpu_cap[i] as i128;
    let short = |cpu: i64, idle: i64| (cpu as i128) * gpu_cap < (idle as i128) * cpu_cap;
    let idle = st.idle[i] as i64;
    let idle_after = idle - gpus.count_ones() as i64 * t.milli as i64;
    !short(st.cpu_left[i], idle) && short(st.cpu_left[i] - t.cpu, idle_after)
}

/// pyctl's ranking of one placement, smallest first. For a GPU task: FGD's quantised score,
/// then placements that do not make the node CPU-short (`makes_cpu_short`; F_n(M) sees CPU only
/// once a shape no longer fits, and by then the GPUs are stranded), then the GPU left with the
/// least free share (best fit). For a CPU-only task: the node with the least idle GPU first (GPU
/// tasks do not need its CPU), then FGD's score. Ties go to the first node in node order, a
/// packing bias that measurably helps. Measured (default trace, 10 seeds, docs/simulator.md):
/// FGD's score alone 4.59% unallocated, with these tie-breaks 4.14%.
type Rank = (i64, i64, i64);

/// pyctl's choice and its exact fragment delta (increase of F_n(M) on the chosen node).
pub fn choose_pyctl(
    st: &State,
    shapes: &[KShape],
    t: &KTask,
    skip: Option<usize>,
) -> Option<(Choice, f64)> {
    let n = st.node_count();
    let mut best: Option<(Rank, usize, u16)> = None;
    let mut cands = [0u16; MAX_GPUS];
    for i in 0..n {
        if Some(i) == skip || !st.fits(i, t, true) {
            continue;
        }
        let split = st.split[i] as usize;
        let old = st.frag[i];
        let consider = |gpus: u16, best: &mut Option<(Rank, usize, u16)>| {
            let inc = frag_after(st, shapes, i, t, gpus, split) - old;
            let q = -sigmoid_score(-inc);
            let rank: Rank = if t.num == 0 {
                (st.idle[i] as i64, q, 0)
            } else {
                let left = if t.is_share() {
                    st.free[i][gpus.trailing_zeros() as usize] - t.milli
                } else {
                    0
                };
                (q, makes_cpu_short(st, i, t, gpus) as i64, left as i64)
            };
            if best.is_none_or(|(b, _, _)| rank < b) {
                *best = Some((rank, i, gpus));
            }
        };
        if t.is_share() {
            let k = share_candidates(st, i, t, &mut cands);
            let mut seen = [u16::MAX; MAX_GPUS];
            let mut zone_seen = [0u8; MAX_GPUS];
            let mut nseen = 0;
            for &c in &cands[..k] {
                let g = c.trailing_zeros() as usize;
                let f = st.free[i][g];
                let z = (split != 0 && g >= split) as u8;
                if seen[..nseen]
                    .iter()
                    .zip(&zone_seen[..nseen])
                    .any(|(&x, &zz)| x == f && zz == z)
                {
                    continue;
                }
                seen[nseen] = f;
                zone_seen[nseen] = z;
                nseen += 1;
                consider(c, &mut best);
            }
        } else if t.num > 0 {
            for (lo, hi) in st.zones(i) {
                if hi > lo {
                    if let Some(g) = st.whole_gpus(i, t.num, lo, hi) {
                        consider(g, &mut best);
                    }
                }
            }
        } else {
            consider(0, &mut best);
        }
    }
    best.map(|(_, node, gpus)| {
        let split = st.split[node] as usize;
        let t_inc = frag_after(st, shapes, node, t, gpus, split) - st.frag[node];
        (Choice { node, gpus }, t_inc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::{prepare, NodeSpec};

    #[test]
    fn cpu_short_counts_only_the_placement_that_makes_the_node_short() {
        let nodes = vec![NodeSpec {
            name: "a".into(),
            cpu_milli: 96000,
            memory_mib: 1 << 20,
            gpus: 8,
            model: "G2".into(),
        }];
        let mut st = prepare(&nodes, &[], &[], false).unwrap().state;
        let heavy = KTask {
            cpu: 40000,
            mem: 0,
            num: 1,
            milli: 1000,
            mask: u64::MAX,
        };
        let even = KTask {
            cpu: 12000,
            ..heavy
        };
        assert!(makes_cpu_short(&st, 0, &heavy, 1)); // 56/96 of the CPU for 7/8 of the GPU
        assert!(!makes_cpu_short(&st, 0, &even, 1)); // 84/96 for 7/8: not short
        st.cpu_left[0] = 30000; // already short (30/96 for 8/8): not held against anyone
        assert!(!makes_cpu_short(&st, 0, &even, 1));
    }
}
