//! The replay's cluster in columns (one entry per node in each array) and FGD's F_n(M) kernel.
//!
//! The kernel computes exactly what `crate::fragment::score` computes for a node without MIG,
//! with memory ignored (M's shapes carry no memory, as in FGD), under policy `none` (one zone) or
//! `single-numa-node` with GPUs aligned and CPUs not (two zones); `tests` checks the two agree.
//! It is a separate, allocation-free loop because the replay evaluates it millions of times.

/// Most GPUs a node may have in the replay.
pub const MAX_GPUS: usize = 16;
/// Clustering's affinity tags: 0 = shared GPU, k = k whole GPUs (k <= MAX_GPUS).
pub const TAGS: usize = MAX_GPUS + 1;

/// A shape of the target workload M, resolved for the kernel.
#[derive(Clone, Copy, Debug)]
pub struct KShape {
    pub cpu: i64,
    /// RDMA bandwidth, percent of one RNIC (0: none).
    pub rdma: i64,
    pub milli: u16,
    pub num: u8,
    /// Bit j: node model j is allowed.
    pub mask: u64,
    pub w: f64,
}

/// A task, resolved.
#[derive(Clone, Copy, Debug)]
pub struct KTask {
    pub cpu: i64,
    pub mem: i64,
    /// RDMA bandwidth, percent of one RNIC (0: none).
    pub rdma: i64,
    pub num: u8,
    pub milli: u16,
    pub mask: u64,
}

impl KTask {
    pub fn is_share(&self) -> bool {
        self.num == 1 && self.milli < 1000
    }
    pub fn gpu_milli_total(&self) -> u64 {
        self.num as u64 * self.milli as u64
    }
    /// Clustering's affinity tag (None for a CPU-only task).
    pub fn tag(&self) -> Option<usize> {
        if self.num == 0 {
            None
        } else if self.is_share() {
            Some(0)
        } else {
            Some((self.num as usize).min(MAX_GPUS))
        }
    }
}

/// F_n(M) of one node state. `split` = 0 for one zone (or a NUMA-blind view); otherwise GPUs
/// `0..split` are zone 0 and `split..` zone 1, and a GPU shape must fit within one zone. RDMA
/// bandwidth is a node resource like CPU: a shape that needs more than `rdma_left` does not fit
/// (all idle GPU is fragment for it; shapes without RDMA never lack it).
#[inline]
pub fn frag(
    shapes: &[KShape],
    model_bit: u64,
    cpu_left: i64,
    rdma_left: i64,
    free: &[u16],
    split: usize,
) -> f64 {
    let idle: u32 = free.iter().map(|&g| g as u32).sum();
    if idle == 0 {
        return 0.0;
    }
    let idle_f = idle as f64;
    let mut acc = 0.0;
    for s in shapes {
        if s.num == 0 || s.mask & model_bit == 0 || cpu_left < s.cpu || rdma_left < s.rdma {
            acc += s.w * idle_f;
            continue;
        }
        let mut small = 0u32;
        if split == 0 {
            let mut cnt = 0u8;
            for &g in free {
                if g >= s.milli {
                    cnt += 1;
                } else {
                    small += g as u32;
                }
            }
            acc += s.w * if cnt >= s.num { small as f64 } else { idle_f };
        } else {
            let (mut c0, mut c1, mut b0, mut b1) = (0u8, 0u8, 0u32, 0u32);
            for (i, &g) in free.iter().enumerate() {
                if g >= s.milli {
                    if i < split {
                        c0 += 1;
                        b0 += g as u32;
                    } else {
                        c1 += 1;
                        b1 += g as u32;
                    }
                } else {
                    small += g as u32;
                }
            }
            let (ok0, ok1) = (c0 >= s.num, c1 >= s.num);
            let f = if !ok0 && !ok1 {
                idle
            } else {
                small + if ok0 { 0 } else { b0 } + if ok1 { 0 } else { b1 }
            };
            acc += s.w * f as f64;
        }
    }
    acc
}

/// Whether a node with these free amounts takes `t`: model, CPU, memory, RDMA and, for a GPU
/// task, enough GPUs with `t`'s share free (within one zone when `split` != 0).
#[inline]
pub fn fits_on(
    cpu_left: i64,
    mem_left: i64,
    rdma_left: i64,
    model_bit: u64,
    free: &[u16],
    split: usize,
    t: &KTask,
) -> bool {
    if cpu_left < t.cpu || mem_left < t.mem || rdma_left < t.rdma {
        return false;
    }
    if t.num == 0 {
        return true;
    }
    if t.mask & model_bit == 0 {
        return false;
    }
    if split != 0 {
        let (mut c0, mut c1) = (0u8, 0u8);
        for (g, &f) in free.iter().enumerate() {
            if f >= t.milli {
                if g < split {
                    c0 += 1
                } else {
                    c1 += 1
                }
            }
        }
        c0 >= t.num || c1 >= t.num
    } else {
        free.iter().filter(|&&f| f >= t.milli).count() >= t.num as usize
    }
}

/// Idle GPU of a node that is fragment only because of the NUMA split: F under the zone rule
/// minus F under the blind rule (never negative).
pub fn numa_split(
    shapes: &[KShape],
    model_bit: u64,
    cpu_left: i64,
    rdma_left: i64,
    free: &[u16],
    split: usize,
) -> f64 {
    if split == 0 {
        return 0.0;
    }
    let f = |s| frag(shapes, model_bit, cpu_left, rdma_left, free, s);
    (f(split) - f(0)).max(0.0)
}

/// A placed pod.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    pub task: u32,
    pub node: u32,
    /// Bit g: GPU g of the node carries this pod's share.
    pub gpus: u16,
}

/// The cluster's mutable state, in columns.
#[derive(Clone, Debug)]
pub struct State {
    pub cpu_cap: Vec<i64>,
    pub cpu_left: Vec<i64>,
    pub mem_cap: Vec<i64>,
    pub mem_left: Vec<i64>,
    /// RDMA bandwidth (percent of one RNIC; a node with r RNICs has 100 r).
    pub rdma_cap: Vec<i64>,
    pub rdma_left: Vec<i64>,
    pub ngpu: Vec<u8>,
    /// GPUs `0..split` are zone 0, the rest zone 1; 0 = one zone.
    pub split: Vec<u8>,
    pub model_bit: Vec<u64>,
    pub free: Vec<[u16; MAX_GPUS]>,
    /// F_n(M) as the kubelet admits (zone-aware), maintained incrementally.
    pub frag: Vec<f64>,
    /// F_n(M) as a NUMA-blind scheduler sees it (equal to `frag` on one-zone nodes).
    pub frag_blind: Vec<f64>,
    pub idle: Vec<u32>,
    pub affinity: Vec<[u16; TAGS]>,
    pub pods_on: Vec<Vec<u32>>,
}

impl State {
    pub fn node_count(&self) -> usize {
        self.cpu_left.len()
    }

    #[inline]
    pub fn gpus(&self, i: usize) -> &[u16] {
        &self.free[i][..self.ngpu[i] as usize]
    }

    pub fn refresh(&mut self, i: usize, shapes: &[KShape]) {
        let free = &self.free[i][..self.ngpu[i] as usize];
        self.idle[i] = free.iter().map(|&g| g as u32).sum();
        let s = self.split[i] as usize;
        let (cpu, rdma) = (self.cpu_left[i], self.rdma_left[i]);
        self.frag[i] = frag(shapes, self.model_bit[i], cpu, rdma, free, s);
        self.frag_blind[i] = if s == 0 {
            self.frag[i]
        } else {
            frag(shapes, self.model_bit[i], cpu, rdma, free, 0)
        };
    }

    /// Puts a task's resources on node `i` (GPUs by mask). The caller checked the fit.
    pub fn take(&mut self, i: usize, t: &KTask, gpus: u16, shapes: &[KShape]) {
        self.cpu_left[i] -= t.cpu;
        self.mem_left[i] -= t.mem;
        self.rdma_left[i] -= t.rdma;
        let mut m = gpus;
        while m != 0 {
            let g = m.trailing_zeros() as usize;
            self.free[i][g] -= t.milli;
            m &= m - 1;
        }
        if let Some(tag) = t.tag() {
            self.affinity[i][tag] += 1;
        }
        self.refresh(i, shapes);
    }

    /// Gives a task's resources back.
    pub fn give(&mut self, i: usize, t: &KTask, gpus: u16, shapes: &[KShape]) {
        self.cpu_left[i] += t.cpu;
        self.mem_left[i] += t.mem;
        self.rdma_left[i] += t.rdma;
        let mut m = gpus;
        while m != 0 {
            let g = m.trailing_zeros() as usize;
            self.free[i][g] += t.milli;
            m &= m - 1;
        }
        if let Some(tag) = t.tag() {
            self.affinity[i][tag] = self.affinity[i][tag].saturating_sub(1);
        }
        self.refresh(i, shapes);
    }

    /// Whether node `i` passes the resource filter for `t` (model, CPU, memory, GPUs). With
    /// `aware`, a GPU task must fit within one zone of a split node (what the kubelet admits);
    /// without, node-wide (what a NUMA-blind scheduler filters on).
    #[inline]
    pub fn fits(&self, i: usize, t: &KTask, aware: bool) -> bool {
        let split = if aware { self.split[i] as usize } else { 0 };
        fits_on(
            self.cpu_left[i],
            self.mem_left[i],
            self.rdma_left[i],
            self.model_bit[i],
            self.gpus(i),
            split,
            t,
        )
    }

    /// The lowest-indexed `num` whole free GPUs within `lo..hi`, if there are enough.
    pub fn whole_gpus(&self, i: usize, num: u8, lo: usize, hi: usize) -> Option<u16> {
        let mut mask = 0u16;
        let mut need = num;
        for (g, &f) in self.gpus(i).iter().enumerate().take(hi).skip(lo) {
            if need == 0 {
                break;
            }
            if f == 1000 {
                mask |= 1 << g;
                need -= 1;
            }
        }
        (need == 0).then_some(mask)
    }

    /// Zone ranges of node `i` (one range unless split).
    pub fn zones(&self, i: usize) -> [(usize, usize); 2] {
        let n = self.ngpu[i] as usize;
        let s = self.split[i] as usize;
        if s == 0 {
            [(0, n), (0, 0)]
        } else {
            [(0, s), (s, n)]
        }
    }

    /// The GPUs the kubelet would give a whole-GPU task on node `i` with the scheduler's own
    /// choice `want` (blind): kept when it lies within one zone, else the first zone that has
    /// enough whole GPUs, else None (admission failure).
    pub fn admit_whole(&self, i: usize, t: &KTask, want: u16) -> Option<u16> {
        let s = self.split[i] as usize;
        if s == 0 {
            return Some(want);
        }
        let zone0 = (1u16 << s) - 1;
        if want & !zone0 == 0 || want & zone0 == 0 {
            return Some(want);
        }
        self.zones(i)
            .iter()
            .find_map(|&(lo, hi)| self.whole_gpus(i, t.num, lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::score::score_node;
    use crate::fragment::{Cluster, ClusterColumns, Shape};

    fn fragment_node(cpu: i64, used: &[i64], numa: bool, shapes: &[Shape]) -> f64 {
        let n = used.len();
        let half = n / 2;
        let (zones, gpu_offsets) = if numa {
            (vec![0i64, 1], vec![0usize, half, n])
        } else {
            (vec![0i64], vec![0usize, n])
        };
        let zc = zones.len();
        let c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["G2".into()],
            node_policies: vec![if numa { "single-numa-node" } else { "none" }.into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, zc],
            zone_numa: zones,
            zone_cpu_milli: vec![96000 / zc as i64; zc],
            zone_cpu_used: (0..zc)
                .map(|_| (96000 - cpu) / zc as i64)
                .collect::<Vec<_>>(),
            zone_memory_mib: vec![1 << 20; zc],
            zone_memory_used: vec![0; zc],
            gpu_offsets,
            gpu_ids: (0..n as i64).collect(),
            gpu_used_milli: used.to_vec(),
            mig_offsets: vec![0; zc + 1],
            instance_offsets: vec![0],
            ..Default::default()
        };
        let cl = Cluster::from_columns(&c).unwrap();
        let mut memo = Default::default();
        score_node(&cl.nodes[0], shapes, &mut memo).fragment_gpu_milli
    }

    #[test]
    fn kernel_equals_fragment_module() {
        let shapes = vec![
            Shape {
                cpu_milli: 4000,
                memory_mib: 0,
                gpus: 1,
                gpu_milli: 500,
                mig_profile: None,
                gpu_models: vec![],
                weight: 0.3,
                ..Default::default()
            },
            Shape {
                cpu_milli: 8000,
                memory_mib: 0,
                gpus: 2,
                gpu_milli: 1000,
                mig_profile: None,
                gpu_models: vec![],
                weight: 0.3,
                ..Default::default()
            },
            Shape {
                cpu_milli: 2000,
                memory_mib: 0,
                gpus: 0,
                gpu_milli: 0,
                mig_profile: None,
                gpu_models: vec![],
                weight: 0.2,
                ..Default::default()
            },
            Shape {
                cpu_milli: 2000,
                memory_mib: 0,
                gpus: 1,
                gpu_milli: 1000,
                mig_profile: None,
                gpu_models: vec!["T4".into()],
                weight: 0.2,
                ..Default::default()
            },
        ];
        let ks: Vec<KShape> = shapes
            .iter()
            .map(|s| KShape {
                cpu: s.cpu_milli as i64,
                rdma: 0,
                milli: s.gpu_milli as u16,
                num: s.gpus as u8,
                mask: if s.gpu_models.is_empty() { u64::MAX } else { 2 },
                w: s.weight,
            })
            .collect();
        let cases: &[(i64, &[i64])] = &[
            (96000, &[0, 0, 0, 0, 0, 0, 0, 0]),
            (6000, &[300, 1000, 0, 700, 1000, 1000, 0, 200]),
            (3000, &[500, 600, 1000, 1000, 0, 0, 1000, 1000]),
            (50000, &[1000, 1000, 1000, 0, 1000, 0, 1000, 1000]),
            (40000, &[400, 500]),
        ];
        for &(cpu, used) in cases {
            let free: Vec<u16> = used.iter().map(|&u| (1000 - u) as u16).collect();
            for numa in [false, true] {
                let want = fragment_node(cpu, used, numa, &shapes);
                let split = if numa { used.len() / 2 } else { 0 };
                let got = frag(&ks, 1, cpu, 0, &free, split);
                assert!(
                    (want - got).abs() < 1e-6,
                    "{cpu} {used:?} numa={numa}: {want} vs {got}"
                );
            }
        }
    }
}
