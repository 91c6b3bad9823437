//! The placement policy's view of the replay's state (`crate::placement::View`): the same
//! features the full model gives (`crate::placement::ClusterView`), from the allocation-free
//! F_n(M) kernel. A placement is a GPU mask. `tests::kernel_features_equal_the_full_model`
//! pins the two views together.

use super::state::{fits_on, frag, KShape, KTask, State, MAX_GPUS};
use crate::placement::{Features, View};

/// The replay's cluster and the workload M.
#[derive(Clone)]
pub struct Kernel<'a> {
    pub st: State,
    pub shapes: &'a [KShape],
}

/// F_n(M) of node `i` after hypothetically taking `t` on GPUs `gpus`, under the zone split
/// `split` (0: one zone).
#[inline]
pub fn frag_after(
    st: &State,
    shapes: &[KShape],
    i: usize,
    t: &KTask,
    gpus: u16,
    split: usize,
) -> f64 {
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
        st.rdma_left[i] - t.rdma,
        &free[..n],
        split,
    )
}

/// Whether taking `t` on GPUs `gpus` would make node `i` short of CPU or of RDMA: leave it a
/// smaller share of that resource than of its GPU, when it was not before (its idle GPUs would
/// then be the first to be stranded for want of it: F_n(M) counts a node's idle GPU as stranded
/// for a shape once the shape's CPU or RDMA no longer fits). A node already short of a resource
/// is not held against a placement: using its GPUs is what it needs. RDMA counts only on nodes
/// that have some and for tasks that ask for it (the openb traces have none).
#[inline]
pub fn makes_short(st: &State, i: usize, t: &KTask, gpus: u16) -> bool {
    let gpu_cap = st.ngpu[i] as i128 * 1000;
    if gpu_cap == 0 {
        return false;
    }
    let idle = st.idle[i] as i64;
    let idle_after = idle - gpus.count_ones() as i64 * t.milli as i64;
    // `left` of `cap` is a smaller share than `idle` of the GPU
    let short =
        |left: i64, cap: i64, idle: i64| (left as i128) * gpu_cap < (idle as i128) * (cap as i128);
    let becomes = |left: i64, cap: i64, take: i64| {
        !short(left, cap, idle) && short(left - take, cap, idle_after)
    };
    becomes(st.cpu_left[i], st.cpu_cap[i], t.cpu)
        || (t.rdma > 0 && st.rdma_cap[i] > 0 && becomes(st.rdma_left[i], st.rdma_cap[i], t.rdma))
}

/// GPU masks a sharing task could take on node `i` (one per GPU with enough free share).
pub fn share_candidates(st: &State, i: usize, t: &KTask, out: &mut [u16; MAX_GPUS]) -> usize {
    let mut n = 0;
    for (g, &f) in st.gpus(i).iter().enumerate() {
        if f >= t.milli {
            out[n] = 1 << g;
            n += 1;
        }
    }
    n
}

impl View for Kernel<'_> {
    type Task = KTask;
    type Place = u16;
    type Key = (i64, i64, i64, u8, u16, u64);

    fn node_count(&self) -> usize {
        self.st.node_count()
    }

    fn is_cpu_only(&self, t: &KTask) -> bool {
        t.num == 0
    }

    fn candidates<F: FnMut(u16, Features)>(&self, i: usize, t: &KTask, mut f: F) {
        let st = &self.st;
        if !st.fits(i, t, true) {
            return;
        }
        let split = st.split[i] as usize;
        let old = st.frag[i];
        let mut consider = |gpus: u16| {
            let inc = frag_after(st, self.shapes, i, t, gpus, split) - old;
            let left = if t.is_share() {
                st.free[i][gpus.trailing_zeros() as usize] as i64 - t.milli as i64
            } else {
                0
            };
            f(
                gpus,
                Features {
                    inc,
                    cpu_short: t.num > 0 && makes_short(st, i, t, gpus),
                    left,
                    idle: st.idle[i] as i64,
                },
            );
        };
        if t.is_share() {
            // GPUs of one zone with the same free share give the same node: try one of them
            let mut cands = [0u16; MAX_GPUS];
            let k = share_candidates(st, i, t, &mut cands);
            let mut seen = [(u16::MAX, 0u8); MAX_GPUS];
            let mut nseen = 0;
            for &c in &cands[..k] {
                let g = c.trailing_zeros() as usize;
                let key = (st.free[i][g], (split != 0 && g >= split) as u8);
                if seen[..nseen].contains(&key) {
                    continue;
                }
                seen[nseen] = key;
                nseen += 1;
                consider(c);
            }
        } else if t.num > 0 {
            for (lo, hi) in st.zones(i) {
                if hi > lo {
                    if let Some(g) = st.whole_gpus(i, t.num, lo, hi) {
                        consider(g);
                    }
                }
            }
        } else {
            consider(0);
        }
    }

    fn take(&mut self, i: usize, t: &KTask, p: &u16) {
        self.st.take(i, t, *p, self.shapes);
    }

    fn give(&mut self, i: usize, t: &KTask, p: &u16) {
        self.st.give(i, t, *p, self.shapes);
    }

    fn frag(&self, i: usize) -> f64 {
        self.st.frag[i]
    }

    fn frag_without(&self, i: usize, t: &KTask, p: &u16) -> f64 {
        let st = &self.st;
        let ng = st.ngpu[i] as usize;
        let mut free = st.free[i];
        let mut m = *p;
        while m != 0 {
            let g = m.trailing_zeros() as usize;
            free[g] += t.milli;
            m &= m - 1;
        }
        frag(
            self.shapes,
            st.model_bit[i],
            st.cpu_left[i] + t.cpu,
            st.rdma_left[i] + t.rdma,
            &free[..ng],
            st.split[i] as usize,
        )
    }

    fn task_key(&self, t: &KTask) -> Self::Key {
        (t.cpu, t.mem, t.rdma, t.num, t.milli, t.mask)
    }

    fn gpu_milli(&self, _i: usize, t: &KTask) -> u64 {
        t.gpu_milli_total()
    }

    fn fits_without(&mut self, i: usize, t: &KTask, removed: &[(&KTask, &u16)]) -> bool {
        let st = &self.st;
        let n = st.ngpu[i] as usize;
        let mut free = st.free[i];
        let (mut cpu, mut mem, mut rdma) = (st.cpu_left[i], st.mem_left[i], st.rdma_left[i]);
        for (rt, &mask) in removed {
            cpu += rt.cpu;
            mem += rt.mem;
            rdma += rt.rdma;
            let mut m = mask;
            while m != 0 {
                let g = m.trailing_zeros() as usize;
                free[g] += rt.milli;
                m &= m - 1;
            }
        }
        fits_on(
            cpu,
            mem,
            rdma,
            st.model_bit[i],
            &free[..n],
            st.split[i] as usize,
            t,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::{Cluster, ClusterColumns, Shape};
    use crate::placement::{best_on, ClusterView};
    use crate::replay::rng::Rng;

    /// The full model of one replay node: `split` zones of its GPUs (0: one zone), CPU not
    /// NUMA-aligned (as the replay admits), memory ignored by the shapes.
    /// A kernel shape in the full model's terms.
    fn full_shape(k: &KShape) -> Shape {
        Shape {
            cpu_milli: k.cpu as u64,
            gpus: k.num as u32,
            gpu_milli: if k.num > 0 { k.milli as u32 } else { 0 },
            weight: k.w,
            rdma: k.rdma as u64,
            ..Default::default()
        }
    }

    /// One task (CPU, GPUs, share, RDMA) in both views: the kernel's and the full model's.
    fn task_pair(cpu: i64, num: u8, milli: u16, rdma: i64) -> (KTask, Shape) {
        let k = KShape {
            cpu,
            rdma,
            milli,
            num,
            mask: u64::MAX,
            w: 1.0,
        };
        let t = KTask {
            cpu,
            mem: 0,
            rdma,
            num,
            milli,
            mask: u64::MAX,
        };
        (t, full_shape(&k))
    }

    fn full_node(st: &State, i: usize) -> Cluster {
        let n = st.ngpu[i] as usize;
        let split = st.split[i] as usize;
        let bounds: Vec<(usize, usize)> = if split == 0 {
            vec![(0, n)]
        } else {
            vec![(0, split), (split, n)]
        };
        let zc = bounds.len() as i64;
        let cap = st.cpu_cap[i];
        let used = cap - st.cpu_left[i];
        let mut c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["G0".into()],
            node_policies: vec![if split == 0 {
                "none"
            } else {
                "single-numa-node"
            }
            .into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, bounds.len()],
            mig_offsets: vec![0; bounds.len() + 1],
            instance_offsets: vec![0],
            node_rdma: vec![st.rdma_cap[i]],
            node_rdma_used: vec![st.rdma_cap[i] - st.rdma_left[i]],
            ..Default::default()
        };
        c.gpu_offsets.push(0);
        for (z, &(lo, hi)) in bounds.iter().enumerate() {
            c.zone_numa.push(z as i64);
            // CPU split evenly, the remainder on zone 0
            let zcap = cap / zc + if z == 0 { cap % zc } else { 0 };
            let zused = used / zc + if z == 0 { used % zc } else { 0 };
            c.zone_cpu_milli.push(zcap);
            c.zone_cpu_used.push(zused);
            c.zone_memory_mib.push(1 << 30);
            c.zone_memory_used.push(0);
            for g in lo..hi {
                c.gpu_ids.push(g as i64);
                c.gpu_used_milli.push(1000 - st.free[i][g] as i64);
            }
            c.gpu_offsets.push(c.gpu_ids.len());
        }
        Cluster::from_columns(&c).unwrap()
    }

    /// A replay state of `n` random nodes, and the full model of the same nodes.
    fn random_cluster(rng: &mut Rng, n: usize, shapes: &[KShape]) -> (State, Cluster) {
        let mut st = random_state(rng, shapes);
        for _ in 1..n {
            let one = random_state(rng, shapes);
            st.cpu_cap.push(one.cpu_cap[0]);
            st.cpu_left.push(one.cpu_left[0]);
            st.mem_cap.push(one.mem_cap[0]);
            st.mem_left.push(one.mem_left[0]);
            st.rdma_cap.push(one.rdma_cap[0]);
            st.rdma_left.push(one.rdma_left[0]);
            st.ngpu.push(one.ngpu[0]);
            st.split.push(one.split[0]);
            st.model_bit.push(1);
            st.free.push(one.free[0]);
            st.frag.push(one.frag[0]);
            st.frag_blind.push(one.frag_blind[0]);
            st.idle.push(one.idle[0]);
            st.affinity.push(one.affinity[0]);
            st.pods_on.push(vec![]);
        }
        let mut full = Cluster::default();
        for i in 0..n {
            let mut node = full_node(&st, i).nodes.remove(0);
            node.name = format!("n{i}");
            full.nodes.push(node);
        }
        (st, full)
    }

    /// The replay and the controller make the same decision: on random clusters and tasks, the
    /// replay's choice (the policy over the kernel) is the node the full model ranks best (what
    /// the extender scores 10), and the planner plans the same moves over both.
    #[test]
    fn the_replays_choice_and_moves_are_the_controllers() {
        use crate::compaction::{plan, Input, Limits, Movable};
        use crate::fragment::delta::Assignment;
        use crate::placement::{choose, extender_scores, rank_nodes};
        let mut rng = Rng::new(11);
        let kshapes = vec![
            KShape {
                cpu: 2000,
                rdma: 0,
                milli: 500,
                num: 1,
                mask: u64::MAX,
                w: 0.4,
            },
            KShape {
                cpu: 4000,
                rdma: 100,
                milli: 1000,
                num: 2,
                mask: u64::MAX,
                w: 0.3,
            },
            KShape {
                cpu: 1000,
                rdma: 0,
                milli: 1000,
                num: 1,
                mask: u64::MAX,
                w: 0.3,
            },
        ];
        let shapes: Vec<Shape> = kshapes.iter().map(full_shape).collect();
        let mut chosen = 0;
        let mut planned = 0;
        for _ in 0..60 {
            let n = 2 + rng.below(6) as usize;
            let (st, cluster) = random_cluster(&mut rng, n, &kshapes);
            let k = Kernel {
                st: st.clone(),
                shapes: &kshapes,
            };
            let full = ClusterView::new(cluster.clone(), &shapes);
            let nodes: Vec<usize> = (0..n).collect();
            for &(cpu, num, milli, rdma) in &[
                (2000, 1, 300, 0),
                (3000, 1, 1000, 0),
                (4000, 2, 1000, 0),
                (500, 0, 0, 0),
                (3000, 1, 1000, 80),
                (4000, 2, 1000, 150),
            ] {
                let (kt, ft) = task_pair(cpu, num, milli, rdma);
                let a = choose(&k, &kt, |_| true).map(|r| r.node);
                let ranks: Vec<_> = rank_nodes(&full, &ft, &nodes)
                    .into_iter()
                    .map(|r| r.map(|r| r.rank))
                    .collect();
                let scores = extender_scores(&ranks);
                let b = scores.iter().position(|&s| s == 10);
                assert_eq!(a, b, "{scores:?}");
                chosen += a.is_some() as usize;
            }
            // one 1-GPU pod on each GPU that is whole-used: the movable pods, in both views
            let mut km = Vec::new();
            let mut fm = Vec::new();
            for i in 0..n {
                let split = st.split[i] as usize;
                for g in 0..st.ngpu[i] as usize {
                    if st.free[i][g] == 0 {
                        let t = KTask {
                            cpu: 0,
                            mem: 0,
                            rdma: 0,
                            num: 1,
                            milli: 1000,
                            mask: u64::MAX,
                        };
                        km.push(Movable {
                            node: i,
                            task: t,
                            place: 1u16 << g,
                            allowed: None,
                            pdb: None,
                            group: None,
                        });
                        let (z, pos) = if split != 0 && g >= split {
                            (1, g - split)
                        } else {
                            (0, g)
                        };
                        let shape = Shape {
                            cpu_milli: 0,
                            memory_mib: 0,
                            gpus: 1,
                            gpu_milli: 1000,
                            mig_profile: None,
                            gpu_models: vec![],
                            weight: 1.0,
                            ..Default::default()
                        };
                        let place = Assignment {
                            cpu: vec![],
                            memory: vec![],
                            gpus: vec![(z, pos, 1000)],
                            mig: None,
                            ..Default::default()
                        };
                        fm.push(Movable {
                            node: i,
                            task: shape,
                            place,
                            allowed: None,
                            pdb: None,
                            group: None,
                        });
                    }
                }
            }
            let limits = Limits {
                max_moves: 4,
                rescue_depth: 0,
                ..Limits::default()
            };
            let mut kv = Kernel {
                st: st.clone(),
                shapes: &kshapes,
            };
            let mut fv = ClusterView::new(cluster, &shapes);
            let kp = plan(
                &mut kv,
                &Input {
                    movable: &km,
                    pending: &[],
                    node_sets: &[],
                    pdb_headroom: &[],
                },
                &limits,
            );
            let fp = plan(
                &mut fv,
                &Input {
                    movable: &fm,
                    pending: &[],
                    node_sets: &[],
                    pdb_headroom: &[],
                },
                &limits,
            );
            let kmoves: Vec<_> = kp.moves.iter().map(|m| (m.pod, m.from, m.to)).collect();
            let fmoves: Vec<_> = fp.moves.iter().map(|m| (m.pod, m.from, m.to)).collect();
            assert_eq!(kmoves, fmoves);
            planned += kmoves.len();
        }
        assert!(chosen > 100 && planned > 5, "{chosen} {planned}");
    }

    fn random_state(rng: &mut Rng, shapes: &[KShape]) -> State {
        let ngpu = [1u8, 2, 4, 8][rng.below(4) as usize];
        let split = if ngpu >= 2 && rng.below(2) == 0 {
            ngpu / 2
        } else {
            0
        };
        let cap = 1000 * (8 + rng.below(120) as i64);
        let mut free = [0u16; MAX_GPUS];
        for f in free.iter_mut().take(ngpu as usize) {
            *f = [0u16, 1000, 1000, 500, 250, 750, 100][rng.below(7) as usize];
        }
        let cpu_left = rng.below(cap as u64 + 1) as i64;
        // a quarter of the nodes without RDMA, the others with 100..400 of it
        let rdma = [0i64, 100, 200, 400][rng.below(4) as usize];
        let mut st = State {
            cpu_cap: vec![cap],
            cpu_left: vec![cpu_left],
            mem_cap: vec![1 << 30],
            mem_left: vec![1 << 30],
            rdma_cap: vec![rdma],
            rdma_left: vec![rng.below(rdma as u64 + 1) as i64],
            ngpu: vec![ngpu],
            split: vec![split],
            model_bit: vec![1],
            free: vec![free],
            frag: vec![0.0],
            frag_blind: vec![0.0],
            idle: vec![0],
            affinity: vec![[0; super::super::state::TAGS]],
            pods_on: vec![vec![]],
        };
        st.refresh(0, shapes);
        st
    }

    /// The replay's kernel and the controller's full model give every placement the same
    /// features, so the policy ranks them alike: on random nodes and tasks, the best placement
    /// on a node has the same rank and features in both views.
    #[test]
    fn kernel_features_equal_the_full_model() {
        let mut rng = Rng::new(7);
        // (CPU, GPUs, share, RDMA)
        let specs = [
            (4000, 1, 500, 0),
            (8000, 2, 1000, 100),
            (2000, 0, 0, 0),
            (2000, 1, 1000, 50),
            (1000, 4, 1000, 200),
        ];
        let weights = [0.3, 0.2, 0.1, 0.3, 0.1];
        let kshapes: Vec<KShape> = specs
            .iter()
            .zip(weights)
            .map(|(&(cpu, num, milli, rdma), w)| KShape {
                cpu,
                rdma,
                milli,
                num,
                mask: u64::MAX,
                w,
            })
            .collect();
        let shapes: Vec<Shape> = kshapes.iter().map(full_shape).collect();
        let (mut compared, mut with_rdma, mut short_by_rdma) = (0, 0, 0);
        for _ in 0..400 {
            let st = random_state(&mut rng, &kshapes);
            let k = Kernel {
                st: st.clone(),
                shapes: &kshapes,
            };
            let full = ClusterView::new(full_node(&st, 0), &shapes);
            for (j, &(cpu, num, milli, rdma)) in [
                (3000, 1, 300, 0),
                (6000, 1, 1000, 0),
                (1000, 2, 1000, 0),
                (500, 0, 0, 0),
                (9000, 4, 1000, 0),
                (2000, 1, 750, 0),
                (2000, 1, 1000, 60),
                (1000, 2, 1000, 150),
                (500, 0, 0, 30),
            ]
            .iter()
            .enumerate()
            {
                let (kt, ft) = task_pair(cpu, num, milli, rdma);
                let a = best_on(&k, 0, &kt);
                let b = best_on(&full, 0, &ft);
                match (&a, &b) {
                    (None, None) => {}
                    (Some(a), Some(b)) => {
                        compared += 1;
                        with_rdma += (rdma > 0) as usize;
                        short_by_rdma += (rdma > 0 && a.features.cpu_short) as usize;
                        assert_eq!(a.rank, b.rank, "task {j}: {a:?} vs {b:?} on {st:?}");
                        assert!((a.features.inc - b.features.inc).abs() < 1e-6);
                        assert_eq!(a.features.cpu_short, b.features.cpu_short);
                        assert_eq!(
                            (a.features.left, a.features.idle),
                            (b.features.left, b.features.idle)
                        );
                    }
                    _ => panic!("task {j}: admitted by one view only: {a:?} vs {b:?} on {st:?}"),
                }
            }
        }
        assert!(
            compared > 1000 && with_rdma > 200 && short_by_rdma > 20,
            "{compared} {with_rdma} {short_by_rdma}"
        );
    }
}
