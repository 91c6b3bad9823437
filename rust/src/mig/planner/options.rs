//! The options of one GPU: unchanged, or a maximal set of wanted free instances beside the used
//! instances kept in place, with the concrete layout that reuses the most current instances.

use std::collections::HashMap;

use super::{Executor, Fate, MigGpu};
use crate::mig::catalog::{GpuModel, MAX_PROFILES};
use crate::mig::placement::{pin, search_from, Pinned};

/// Maximal free-instance vectors by (occupied slices, compute, counts of R profiles) of the
/// instances kept in place.
pub(super) type VectorCache = HashMap<(u16, u32, Vec<u8>, Vec<usize>), Vec<Vec<u8>>>;

/// One way to leave a GPU.
#[derive(Clone, Debug)]
pub(super) struct Opt {
    pub(super) changed: bool,
    /// Free R-instances of the new layout, per R position.
    pub(super) n: Vec<u8>,
    /// Destroyed used instances, per R position.
    pub(super) moved: Vec<u8>,
    pub(super) moved_total: u32,
    pub(super) destroyed_free: u32,
    /// Fixed point, see `WEIGHT_ONE`.
    pub(super) fragment: i64,
    /// (profile, start, fate, index of the current instance it keeps).
    pub(super) layout: Vec<(usize, u8, Fate, Option<usize>)>,
}

pub(super) struct Ctx<'a> {
    pub(super) model: &'a GpuModel,
    pub(super) relevant: &'a [usize],
    /// Profiles with pending demand or weight in M (ascending).
    pub(super) demanded: &'a [usize],
    pub(super) r_of: &'a [usize; MAX_PROFILES],
    /// (profile, weight in units of 2^-32).
    pub(super) wanted: &'a [(usize, i64)],
}

impl Ctx<'_> {
    /// Fragment in fixed point (compute slices x 2^32).
    fn fragment(&self, idle: u32, n: &[u8]) -> i64 {
        let mut f = 0i64;
        for &(p, w) in self.wanted {
            let c = self.model.profiles[p].compute_slices as i64;
            f += w * (idle as i64 - c * n[self.r_of[p]] as i64);
        }
        f
    }

    /// The options of one GPU; the first is "unchanged". The others, when the GPU may be
    /// touched: for every set of used instances it may destroy, every maximal vector of new
    /// free instances beside the rest (`destroying`).
    pub(super) fn options(
        &self,
        gpu: &MigGpu,
        touchable: bool,
        limit: u32,
        executor: Executor,
        cache: &mut VectorCache,
    ) -> Vec<Opt> {
        let mut inst: Vec<usize> = (0..gpu.instances.len()).collect();
        inst.sort_by_key(|&i| (gpu.instances[i].start, gpu.instances[i].profile));
        let (used, free): (Vec<usize>, Vec<usize>) =
            inst.iter().partition(|&&i| gpu.instances[i].used);
        let mut out = vec![self.unchanged(gpu, &inst)];
        if !touchable {
            return out;
        }
        let cur = Current {
            gpu,
            count: inst.len(),
            used: &used,
            free: &free,
        };
        for u in destroy_sets(&used, limit, executor) {
            self.destroying(&cur, &u, executor, cache, &mut out);
        }
        out
    }

    /// The GPU left as it is (instances in `inst` order).
    fn unchanged(&self, gpu: &MigGpu, inst: &[usize]) -> Opt {
        let model = self.model;
        let nr = self.relevant.len();
        let mut n0 = vec![0u8; nr];
        let mut used_compute = 0u32;
        for &i in inst {
            let x = &gpu.instances[i];
            if x.used {
                used_compute += model.profiles[x.profile].compute_slices as u32;
            } else if self.r_of[x.profile] != usize::MAX {
                n0[self.r_of[x.profile]] += 1;
            }
        }
        Opt {
            changed: false,
            fragment: self.fragment(model.compute_slices as u32 - used_compute, &n0),
            n: n0,
            moved: vec![0; nr],
            moved_total: 0,
            destroyed_free: 0,
            layout: inst
                .iter()
                .map(|&i| {
                    let x = &gpu.instances[i];
                    let fate = if x.used {
                        Fate::KeptUsed
                    } else {
                        Fate::KeptFree
                    };
                    (x.profile, x.start, fate, Some(i))
                })
                .collect(),
        }
    }

    /// The changed options that destroy the used instances `u` (positions in the GPU's
    /// instances) and keep the other used ones in place: one per maximal vector of new free
    /// instances (cached by what is kept), appended to `out`.
    fn destroying(
        &self,
        cur: &Current<'_>,
        u: &[usize],
        executor: Executor,
        cache: &mut VectorCache,
        out: &mut Vec<Opt>,
    ) {
        let (gpu, model, nr) = (cur.gpu, self.model, self.relevant.len());
        // New instances only of the profiles with demand, and of the destroyed ones (their
        // pods need an instance again).
        let mut creatable: Vec<usize> = self.demanded.to_vec();
        for &i in u {
            let p = gpu.instances[i].profile;
            if !creatable.contains(&p) {
                creatable.push(p);
            }
        }
        creatable.sort_unstable();
        let kept_used: Vec<usize> = cur
            .used
            .iter()
            .copied()
            .filter(|i| !u.contains(i))
            .collect();
        let pins: Vec<(usize, u8)> = kept_used
            .iter()
            .map(|&i| (gpu.instances[i].profile, gpu.instances[i].start))
            .collect();
        let Some(st) = pin(model, &pins) else {
            return;
        };
        let key_counts: Vec<u8> = creatable.iter().map(|&p| st.counts[p]).collect();
        let key = (st.occupied, st.compute, key_counts, creatable.clone());
        let vectors = cache
            .entry(key)
            .or_insert_with(|| maximal_vectors(model, &creatable, &st));
        let mut moved = vec![0u8; nr];
        for &i in u {
            moved[self.r_of[gpu.instances[i].profile]] += 1;
        }
        let idle = model.compute_slices as u32 - st.compute;
        // Current free instances that a new layout may keep: all, under placement;
        // none under mig-parted (it re-creates everything on a GPU it changes).
        let reusable: &[usize] = match executor {
            Executor::Placement => cur.free,
            Executor::MigParted => &[],
        };
        for nc in vectors.iter() {
            let layout = self.concrete(gpu, &st, &kept_used, reusable, &creatable, nc);
            let kept_free = layout.iter().filter(|l| l.2 == Fate::KeptFree).count() as u32;
            if u.is_empty() && kept_free as usize == cur.free.len() && layout.len() == cur.count {
                continue; // the unchanged layout again
            }
            // Free instances of the new layout per R position (new and kept ones).
            let mut n = vec![0u8; nr];
            for l in layout.iter().filter(|l| l.2 != Fate::KeptUsed) {
                if self.r_of[l.0] != usize::MAX {
                    n[self.r_of[l.0]] += 1;
                }
            }
            out.push(Opt {
                changed: true,
                fragment: self.fragment(idle, &n),
                n,
                moved: moved.clone(),
                moved_total: u.len() as u32,
                destroyed_free: cur.free.len() as u32 - kept_free,
                layout,
            });
        }
    }

    /// Place `n` beside the kept used instances, reusing the most current free instances (then
    /// the first such placement in search order), and keep every other current free instance
    /// that still fits.
    fn concrete(
        &self,
        gpu: &MigGpu,
        st: &Pinned,
        kept_used: &[usize],
        reusable: &[usize],
        creatable: &[usize],
        n: &[u8],
    ) -> Vec<(usize, u8, Fate, Option<usize>)> {
        let model = self.model;
        let mut layout: Vec<(usize, u8, Fate, Option<usize>)> = kept_used
            .iter()
            .map(|&i| {
                (
                    gpu.instances[i].profile,
                    gpu.instances[i].start,
                    Fate::KeptUsed,
                    Some(i),
                )
            })
            .collect();
        let groups = search_groups(model, creatable, n);
        let mut reuse = Reuse::new(model, gpu, &groups, reusable);
        reuse.group(0, st.occupied, 0);
        let mut room = Room {
            occupied: st.occupied,
            counts: st.counts,
            compute: st.compute,
        };
        for (p, s) in reuse.best.unwrap_or_default() {
            room.take(model, p, s);
            let src = reusable
                .iter()
                .copied()
                .find(|&i| gpu.instances[i].profile == p && gpu.instances[i].start == s);
            match src {
                Some(i) => layout.push((p, s, Fate::KeptFree, Some(i))),
                None => layout.push((p, s, Fate::New, None)),
            }
        }
        // every other current free instance that still fits stays
        for &i in reusable {
            let x = &gpu.instances[i];
            if !layout.iter().any(|l| l.3 == Some(i)) && room.fits(model, x.profile, x.start) {
                room.take(model, x.profile, x.start);
                layout.push((x.profile, x.start, Fate::KeptFree, Some(i)));
            }
        }
        layout.sort_by_key(|l| (l.1, l.0));
        layout
    }
}

/// What a layout being built takes of a GPU: memory slices, instances per profile, compute.
struct Room {
    occupied: u16,
    counts: [u8; MAX_PROFILES],
    compute: u32,
}

impl Room {
    /// Whether an instance of profile `p` at `start` fits beside what is taken.
    fn fits(&self, model: &GpuModel, p: usize, start: u8) -> bool {
        let prof = &model.profiles[p];
        prof.placement_at(start).is_some_and(|pl| {
            self.occupied & pl.mask() == 0
                && self.counts[p] < prof.max_count
                && self.compute + prof.compute_slices as u32 <= model.compute_slices as u32
        })
    }

    fn take(&mut self, model: &GpuModel, p: usize, start: u8) {
        let prof = &model.profiles[p];
        self.occupied |= prof.placement_at(start).map_or(0, |pl| pl.mask());
        self.counts[p] += 1;
        self.compute += prof.compute_slices as u32;
    }
}

/// A GPU's current instances: how many, the used and the free ones (positions, by start).
struct Current<'a> {
    gpu: &'a MigGpu,
    count: usize,
    used: &'a [usize],
    free: &'a [usize],
}

/// Sets of used instances (positions) a GPU's options may destroy, smallest first, then by
/// instance order: with the `placement` executor any set of at most `limit`; with `mig-parted`
/// (which re-creates every instance of a GPU it changes) none or all of them.
fn destroy_sets(used: &[usize], limit: u32, executor: Executor) -> Vec<Vec<usize>> {
    match executor {
        Executor::Placement => {
            let k_max = (limit as usize).min(used.len());
            let mut all = Vec::new();
            for k in 0..=k_max {
                combinations(used.len(), k, &mut |c| {
                    all.push(c.iter().map(|&j| used[j]).collect());
                });
            }
            all
        }
        Executor::MigParted => {
            if used.is_empty() {
                vec![vec![]]
            } else if used.len() <= limit as usize {
                vec![used.to_vec()]
            } else {
                vec![]
            }
        }
    }
}

/// Branch and bound: the placement of the groups with the most reused instances.
struct Reuse<'a> {
    model: &'a GpuModel,
    gpu: &'a MigGpu,
    groups: &'a [(usize, usize)],
    reusable: &'a [usize],
    cur: Vec<(usize, u8)>,
    best: Option<Vec<(usize, u8)>>,
    best_matches: usize,
    remaining: usize,
    /// No placement reuses more than this (per group, its count or the current free instances
    /// of its profile): once reached, the first placement found that reaches it is the answer.
    ceiling: usize,
}

/// The profiles to create with their counts, in the placement search's order (largest memory
/// first, then fewest placements).
fn search_groups(model: &GpuModel, creatable: &[usize], n: &[u8]) -> Vec<(usize, usize)> {
    let mut groups: Vec<(usize, usize)> = creatable
        .iter()
        .zip(n)
        .filter(|(_, &k)| k > 0)
        .map(|(&p, &k)| (p, k as usize))
        .collect();
    groups.sort_by_key(|&(p, _)| {
        let pr = &model.profiles[p];
        (std::cmp::Reverse(pr.memory_slices), pr.placements.len(), p)
    });
    groups
}

impl<'a> Reuse<'a> {
    fn new(
        model: &'a GpuModel,
        gpu: &'a MigGpu,
        groups: &'a [(usize, usize)],
        reusable: &'a [usize],
    ) -> Self {
        let ceiling = groups
            .iter()
            .map(|&(p, k)| {
                let current = reusable
                    .iter()
                    .filter(|&&i| gpu.instances[i].profile == p)
                    .count();
                k.min(current)
            })
            .sum();
        Reuse {
            model,
            gpu,
            groups,
            reusable,
            cur: Vec::new(),
            best: None,
            best_matches: 0,
            remaining: groups.iter().map(|g| g.1).sum(),
            ceiling,
        }
    }

    fn is_current(&self, p: usize, s: u8) -> bool {
        self.reusable
            .iter()
            .any(|&i| self.gpu.instances[i].profile == p && self.gpu.instances[i].start == s)
    }

    fn group(&mut self, g: usize, occ: u16, matches: usize) {
        if g == self.groups.len() {
            if self.best.is_none() || matches > self.best_matches {
                self.best = Some(self.cur.clone());
                self.best_matches = matches;
            }
            return;
        }
        let (p, k) = self.groups[g];
        self.choose(g, p, k, 0, occ, matches);
    }

    fn choose(&mut self, g: usize, p: usize, left: usize, from: usize, occ: u16, matches: usize) {
        if self.best.is_some()
            && (matches + self.remaining <= self.best_matches || self.best_matches == self.ceiling)
        {
            return;
        }
        if left == 0 {
            self.group(g + 1, occ, matches);
            return;
        }
        let placements = &self.model.profiles[p].placements;
        if placements.len() < from + left {
            return;
        }
        let last = placements.len() - left;
        for (i, pl) in placements.iter().enumerate().take(last + 1).skip(from) {
            let m = pl.mask();
            if m & occ != 0 {
                continue;
            }
            let hit = self.is_current(p, pl.start) as usize;
            self.cur.push((p, pl.start));
            self.remaining -= 1;
            self.choose(g, p, left - 1, i + 1, occ | m, matches + hit);
            self.remaining += 1;
            self.cur.pop();
        }
    }
}

/// Every maximal vector of counts of the `creatable` profiles that fits on `st` (no further
/// instance of a creatable profile fits), in lexicographic order (each count from 0 up). The
/// feasible vectors form a downward-closed set: it is enumerated once into a dense table, and a
/// vector is maximal when no one-step-larger vector is in it.
fn maximal_vectors(model: &GpuModel, creatable: &[usize], st: &Pinned) -> Vec<Vec<u8>> {
    let room: Vec<usize> = creatable
        .iter()
        .map(|&p| model.profiles[p].max_count.saturating_sub(st.counts[p]) as usize)
        .collect();
    let mut stride = vec![1usize; creatable.len()];
    let mut size = 1usize;
    for r in (0..creatable.len()).rev() {
        stride[r] = size;
        size = size.saturating_mul(room[r] + 1);
    }
    let mut e = Vectors {
        model,
        creatable,
        st,
        stride: &stride,
        table: vec![false; size.min(MAX_TABLE)],
        dense: size <= MAX_TABLE,
        n: vec![0; creatable.len()],
        multiset: Vec::new(),
        feasible: Vec::new(),
    };
    e.rec(0, 0);
    let mut out = Vec::new();
    for (n, idx) in &e.feasible {
        let maximal = (0..creatable.len()).all(|r| {
            if (n[r] as usize) >= room[r] {
                return true;
            }
            if e.dense {
                return !e.table[idx + stride[r]];
            }
            e.multiset.clear();
            for (k, &p) in creatable.iter().enumerate() {
                e.multiset.extend(std::iter::repeat_n(p, n[k] as usize));
            }
            e.multiset.push(creatable[r]);
            !search_from(model, st, &e.multiset, None)
        });
        if maximal {
            out.push(n.clone());
        }
    }
    out
}

/// Largest dense table of feasible vectors (bigger catalogs fall back to one search per check).
const MAX_TABLE: usize = 1 << 20;

struct Vectors<'a> {
    model: &'a GpuModel,
    creatable: &'a [usize],
    st: &'a Pinned,
    stride: &'a [usize],
    table: Vec<bool>,
    dense: bool,
    n: Vec<u8>,
    multiset: Vec<usize>,
    /// (vector, table index), in lexicographic order.
    feasible: Vec<(Vec<u8>, usize)>,
}

impl Vectors<'_> {
    fn rec(&mut self, i: usize, idx: usize) {
        if i == self.creatable.len() {
            if self.dense {
                self.table[idx] = true;
            }
            self.feasible.push((self.n.clone(), idx));
            return;
        }
        let p = self.creatable[i];
        let base = self.multiset.len();
        let mut idx = idx;
        loop {
            self.rec(i + 1, idx);
            self.multiset.push(p);
            if !search_from(self.model, self.st, &self.multiset, None) {
                self.multiset.pop();
                break;
            }
            self.n[i] += 1;
            idx += self.stride[i];
        }
        self.multiset.truncate(base);
        self.n[i] = 0;
    }
}

fn combinations(n: usize, k: usize, f: &mut dyn FnMut(&[usize])) {
    let mut c: Vec<usize> = (0..k).collect();
    if k > n {
        return;
    }
    loop {
        f(&c);
        let mut i = k;
        while i > 0 && c[i - 1] == n - k + i - 1 {
            i -= 1;
        }
        if i == 0 {
            return;
        }
        c[i - 1] += 1;
        for j in i..k {
            c[j] = c[j - 1] + 1;
        }
    }
}

/// Drop an option when another option of the same GPU is at least as good on every criterion
/// and either strictly better on fragment, destroyed or changed, or earlier: replacing it in any
/// plan gives a plan at least as good that wins the tie-break, so the optimum never uses it.
/// (More free instances never lower the net served.) The first option ("unchanged") stays, and
/// the order of the others is kept, so option indices compare as before.
pub(super) fn prune_dominated(opts: Vec<Opt>) -> Vec<Opt> {
    let beats = |i: usize, j: usize| {
        let (a, b) = (&opts[i], &opts[j]);
        let dominates = a.moved == b.moved
            && a.n.iter().zip(&b.n).all(|(x, y)| x >= y)
            && a.fragment <= b.fragment
            && a.destroyed_free <= b.destroyed_free
            && (a.changed as u8) <= (b.changed as u8);
        let strictly = a.fragment < b.fragment
            || a.destroyed_free < b.destroyed_free
            || (a.changed as u8) < (b.changed as u8);
        dominates && (strictly || i < j)
    };
    let keep: Vec<bool> = (0..opts.len())
        .map(|j| j == 0 || !(0..opts.len()).any(|i| i != j && beats(i, j)))
        .collect();
    opts.into_iter()
        .zip(keep)
        .filter(|(_, k)| *k)
        .map(|(o, _)| o)
        .collect()
}
