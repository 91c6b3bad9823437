//! Exact placement search: can these GPU instances exist together on one GPU, with some of them
//! kept where they are? The rule (`shared/docs/mig.md` §a, from NVML and the MIG User Guide):
//! every instance gets one of its profile's placements, the memory-slice ranges are pairwise
//! disjoint, no profile is used more than its `max_count`, and the compute slices add up to at
//! most the GPU's total.
//!
//! The search keeps occupied memory slices in a bit mask, places the largest profiles first,
//! treats the instances of one profile as one group (their starts are chosen in increasing order,
//! so equal instances are never permuted), and remembers the (group, occupied slices) states that
//! failed. On 8 memory slices that is at most a few hundred states; it allocates only the answer.

use super::catalog::{GpuModel, MAX_PROFILES};

/// At most this many instances fit on any GPU (each takes at least one of 16 memory slices).
const MAX_INSTANCES: usize = 16;

/// Exact placement search. `pinned`: instances that stay where they are, as (profile index,
/// memory-slice start); `unpinned`: profile indices to place anywhere valid. Returns the starts
/// chosen for `unpinned` (same order), or `None` when impossible: overlapping pins, a pinned
/// start that is not one of the profile's placements, a profile over its `max_count`, compute
/// slices over the GPU's total, or no disjoint placement for the unpinned ones. A profile index
/// out of range is also `None` (never a panic). Deterministic: among the solutions it returns the
/// first in the search order (largest profiles first, lowest starts first).
pub fn place(model: &GpuModel, pinned: &[(usize, u8)], unpinned: &[usize]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; unpinned.len()];
    if search(model, pinned, unpinned, Some(&mut out)) {
        Some(out)
    } else {
        None
    }
}

/// `place(...).is_some()`, without allocating.
pub fn feasible(model: &GpuModel, pinned: &[(usize, u8)], unpinned: &[usize]) -> bool {
    search(model, pinned, unpinned, None)
}

/// The occupied memory slices, per-profile counts and compute slices of `pinned`, or `None` if
/// the pins themselves are impossible (see [`place`]).
pub(crate) fn pin(model: &GpuModel, pinned: &[(usize, u8)]) -> Option<Pinned> {
    let mut st = Pinned {
        occupied: 0,
        counts: [0; MAX_PROFILES],
        compute: 0,
    };
    for &(p, start) in pinned {
        let prof = model.profiles.get(p)?;
        let mask = prof.placement_at(start)?.mask();
        if st.occupied & mask != 0 {
            return None;
        }
        st.occupied |= mask;
        st.counts[p] = st.counts[p].checked_add(1)?;
        if st.counts[p] > prof.max_count {
            return None;
        }
        st.compute += prof.compute_slices as u32;
    }
    if st.compute > model.compute_slices as u32 {
        return None;
    }
    Some(st)
}

#[derive(Copy, Clone, Debug)]
pub(crate) struct Pinned {
    pub occupied: u16,
    pub counts: [u8; MAX_PROFILES],
    pub compute: u32,
}

fn search(
    model: &GpuModel,
    pinned: &[(usize, u8)],
    unpinned: &[usize],
    out: Option<&mut [u8]>,
) -> bool {
    let Some(st) = pin(model, pinned) else {
        return false;
    };
    search_from(model, &st, unpinned, out)
}

/// Place `unpinned` on a GPU already holding `st`.
pub(crate) fn search_from(
    model: &GpuModel,
    st: &Pinned,
    unpinned: &[usize],
    out: Option<&mut [u8]>,
) -> bool {
    let mut counts = st.counts;
    let mut compute = st.compute;
    let mut memory = 0u32;
    let free = (model.full_mask() & !st.occupied).count_ones();
    for &p in unpinned {
        let Some(prof) = model.profiles.get(p) else {
            return false;
        };
        counts[p] = counts[p].saturating_add(1);
        if counts[p] > prof.max_count {
            return false;
        }
        compute += prof.compute_slices as u32;
        memory += prof.memory_slices as u32;
        if compute > model.compute_slices as u32 || memory > free {
            return false;
        }
    }
    // Now at most MAX_INSTANCES unpinned instances (each takes a free memory slice).
    if unpinned.len() == 1 {
        let prof = &model.profiles[unpinned[0]];
        for pl in &prof.placements {
            if pl.mask() & st.occupied == 0 {
                if let Some(o) = out {
                    o[0] = pl.start;
                }
                return true;
            }
        }
        return false;
    }
    if unpinned.is_empty() {
        return true;
    }

    // Groups: one per profile, largest memory size first, then fewest placements first.
    let mut groups = [(0u8, 0u8); MAX_PROFILES];
    let mut ng = 0usize;
    for (p, &c) in counts.iter().enumerate().take(model.profiles.len()) {
        let k = c - st.counts[p];
        if k > 0 {
            groups[ng] = (p as u8, k);
            ng += 1;
        }
    }
    let groups = &mut groups[..ng];
    groups.sort_by_key(|&(p, _)| {
        let prof = &model.profiles[p as usize];
        (
            std::cmp::Reverse(prof.memory_slices),
            prof.placements.len(),
            p,
        )
    });
    let mut s = Search {
        model,
        groups,
        chosen: [0; MAX_INSTANCES],
        failed: [0; MEMO_WORDS],
        memo: model.memory_slices <= MEMO_SLICES,
    };
    if !s.group(0, 0, st.occupied) {
        return false;
    }
    if let Some(o) = out {
        // Hand the chosen starts (grouped, ascending within a group) back in `unpinned` order.
        let mut next = [0u8; MAX_PROFILES];
        let mut offset = 0u8;
        for &(p, k) in s.groups.iter() {
            next[p as usize] = offset;
            offset += k;
        }
        for (slot, &p) in o.iter_mut().zip(unpinned) {
            *slot = s.chosen[next[p] as usize];
            next[p] += 1;
        }
    }
    true
}

/// The failure memo covers GPUs of up to this many memory slices (all MIG GPUs have 8 or 4).
const MEMO_SLICES: u8 = 8;
const MEMO_WORDS: usize = MAX_PROFILES * (1 << MEMO_SLICES) / 64;

struct Search<'a> {
    model: &'a GpuModel,
    groups: &'a [(u8, u8)],
    chosen: [u8; MAX_INSTANCES],
    /// Bit (group << 8 | occupied) set: placing groups[group..] on `occupied` failed.
    failed: [u64; MEMO_WORDS],
    memo: bool,
}

impl Search<'_> {
    /// Place groups[g..], the first `pos` starts already chosen, on `occupied`.
    fn group(&mut self, g: usize, pos: usize, occupied: u16) -> bool {
        if g == self.groups.len() {
            return true;
        }
        let key = (g << MEMO_SLICES) | occupied as usize;
        if self.memo && self.failed[key / 64] >> (key % 64) & 1 != 0 {
            return false;
        }
        let (p, k) = self.groups[g];
        let ok = self.choose(g, p as usize, k as usize, 0, pos, occupied);
        if !ok && self.memo {
            self.failed[key / 64] |= 1 << (key % 64);
        }
        ok
    }

    /// Choose `left` more placements of profile `p` among placements[from..] (ascending).
    fn choose(
        &mut self,
        g: usize,
        p: usize,
        left: usize,
        from: usize,
        pos: usize,
        occ: u16,
    ) -> bool {
        if left == 0 {
            return self.group(g + 1, pos, occ);
        }
        let model = self.model;
        let placements = &model.profiles[p].placements;
        if placements.len() < from + left {
            return false;
        }
        let last = placements.len() - left;
        for (i, pl) in placements.iter().enumerate().take(last + 1).skip(from) {
            let m = pl.mask();
            if m & occ == 0 {
                self.chosen[pos] = pl.start;
                if self.choose(g, p, left - 1, i + 1, pos + 1, occ | m) {
                    return true;
                }
            }
        }
        false
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mig::catalog::Catalog;

    /// A tiny deterministic PRNG for the cross-checks (no dependency).
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The rule, literally: try every assignment of placements to the unpinned instances.
    pub(crate) fn brute_force(
        model: &GpuModel,
        pinned: &[(usize, u8)],
        unpinned: &[usize],
    ) -> bool {
        let n = model.profiles.len();
        let mut counts = vec![0usize; n];
        let mut compute = 0usize;
        let mut occ = 0u32;
        for &(p, s) in pinned {
            let Some(prof) = model.profiles.get(p) else {
                return false;
            };
            let Some(pl) = prof.placements.iter().find(|pl| pl.start == s) else {
                return false;
            };
            let m = u32::from(pl.mask());
            if occ & m != 0 {
                return false;
            }
            occ |= m;
            counts[p] += 1;
            compute += prof.compute_slices as usize;
        }
        for &p in unpinned {
            if p >= n {
                return false;
            }
            counts[p] += 1;
            compute += model.profiles[p].compute_slices as usize;
        }
        if compute > model.compute_slices as usize
            || counts
                .iter()
                .zip(&model.profiles)
                .any(|(&c, p)| c > p.max_count as usize)
        {
            return false;
        }
        fn rec(model: &GpuModel, unpinned: &[usize], occ: u32) -> bool {
            let Some((&p, rest)) = unpinned.split_first() else {
                return true;
            };
            model.profiles[p].placements.iter().any(|pl| {
                let m = u32::from(pl.mask());
                occ & m == 0 && rec(model, rest, occ | m)
            })
        }
        rec(model, unpinned, occ)
    }

    fn check_answer(model: &GpuModel, pinned: &[(usize, u8)], unpinned: &[usize], starts: &[u8]) {
        let all: Vec<(usize, u8)> = pinned
            .iter()
            .copied()
            .chain(unpinned.iter().copied().zip(starts.iter().copied()))
            .collect();
        assert!(
            brute_force(model, &all, &[]),
            "{all:?} is not a valid layout"
        );
    }

    fn idx(m: &GpuModel, names: &[&str]) -> Vec<usize> {
        names.iter().map(|n| m.profile_index(n).unwrap()).collect()
    }

    #[test]
    fn documented_examples() {
        let c = Catalog::builtin();
        let a100 = c.model("A100-SXM4-40GB").unwrap();
        let ok = |names: &[&str]| feasible(a100, &[], &idx(a100, names));
        assert!(ok(&["4g.20gb", "3g.20gb"]), "4g+3g is valid from R510");
        assert!(ok(&["4g.20gb", "2g.10gb", "1g.5gb"]));
        assert_eq!(
            place(a100, &[], &idx(a100, &["1g.5gb", "2g.10gb", "4g.20gb"])),
            Some(vec![6, 4, 0]),
            "the guide's 4-2-1 example: 0:4, 4:2, 6:1"
        );
        assert!(ok(&["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]));
        assert!(ok(&[
            "2g.10gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"
        ]));
        assert!(ok(&["1g.5gb"; 7]));
        assert!(!ok(&["1g.5gb"; 8]));
        assert!(!ok(&["7g.40gb", "1g.5gb"]));
        assert!(!ok(&["4g.20gb", "4g.20gb"]));
        assert!(!ok(&["3g.20gb", "3g.20gb", "1g.5gb"]));
        assert!(!ok(&["4g.20gb", "2g.10gb", "2g.10gb"]));
        assert!(ok(&["4g.20gb", "1g.10gb", "1g.10gb"]));
        // 7×1g leaves slice 7 empty; only 1g.10gb@6, 3g@4 and 7g reach it.
        let one = a100.profile_index("1g.5gb").unwrap();
        assert!(!feasible(a100, &[(one, 7)], &[]));
        // Pinned: a used 1g.5gb at slice 1 and one at 5 leave no 4-slice window.
        let three = a100.profile_index("3g.20gb").unwrap();
        assert!(!feasible(a100, &[(one, 1), (one, 5)], &[three]));
        assert_eq!(place(a100, &[(one, 1)], &[three]), Some(vec![4]));
        assert_eq!(place(a100, &[(one, 4)], &[three]), Some(vec![0]));
        // Overlapping pins, out-of-range indices.
        assert!(!feasible(a100, &[(three, 0), (one, 3)], &[]));
        assert!(!feasible(a100, &[(99, 0)], &[]));
        assert!(!feasible(a100, &[], &[99]));
        assert_eq!(place(a100, &[], &[]), Some(vec![]));
        // H100 PCIe (Scaleway): -cgi 9,19,19,19 → 4:4, 0:1, 1:1, 2:1.
        let h100 = c.model("H100-80GB").unwrap();
        let wanted = idx(h100, &["3g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]);
        check_answer(h100, &[], &wanted, &place(h100, &[], &wanted).unwrap());
        // A30: 4 memory slices, 4 compute slices.
        let a30 = c.model("A30-24GB").unwrap();
        assert!(feasible(
            a30,
            &[],
            &idx(a30, &["2g.12gb", "1g.6gb", "1g.6gb"])
        ));
        assert!(!feasible(a30, &[], &idx(a30, &["4g.24gb", "1g.6gb"])));
        assert!(feasible(a30, &[], &idx(a30, &["2g.12gb", "2g.12gb+me"])));
        assert!(!feasible(
            a30,
            &[],
            &idx(a30, &["2g.12gb+me", "2g.12gb+me"])
        ));
    }

    #[test]
    fn agrees_with_brute_force_on_random_inputs_for_every_model() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for model in Catalog::builtin().models() {
            let n = model.profiles.len();
            let (mut yes, mut no) = (0, 0);
            for _ in 0..4000 {
                // Pins drawn from real placements (sometimes a bogus start), unpinned 0..5.
                let mut pinned = Vec::new();
                for _ in 0..rng.below(4) {
                    let p = rng.below(n);
                    let pls = &model.profiles[p].placements;
                    let start = if rng.below(10) == 0 {
                        rng.below(model.memory_slices as usize + 1) as u8
                    } else {
                        pls[rng.below(pls.len())].start
                    };
                    pinned.push((p, start));
                }
                let unpinned: Vec<usize> = (0..rng.below(6)).map(|_| rng.below(n)).collect();
                let want = brute_force(model, &pinned, &unpinned);
                let got = place(model, &pinned, &unpinned);
                assert_eq!(
                    got.is_some(),
                    want,
                    "{} {pinned:?} {unpinned:?}",
                    model.name
                );
                assert_eq!(feasible(model, &pinned, &unpinned), want);
                if let Some(starts) = got {
                    check_answer(model, &pinned, &unpinned, &starts);
                    yes += 1;
                } else {
                    no += 1;
                }
            }
            assert!(
                yes > 300 && no > 300,
                "{}: {yes} valid, {no} invalid",
                model.name
            );
        }
    }

    #[test]
    fn every_small_multiset_agrees_with_brute_force() {
        // Every multiset of up to 4 unpinned profiles, with each single pin, on every model.
        for model in Catalog::builtin().models() {
            let n = model.profiles.len();
            let mut pins: Vec<Vec<(usize, u8)>> = vec![vec![]];
            for p in 0..n {
                for pl in &model.profiles[p].placements {
                    pins.push(vec![(p, pl.start)]);
                }
            }
            let mut multisets: Vec<Vec<usize>> = vec![vec![]];
            for len in 1..=4 {
                let mut cur = vec![0usize; len];
                loop {
                    multisets.push(cur.clone());
                    // next non-decreasing tuple
                    let mut i = len;
                    while i > 0 && cur[i - 1] == n - 1 {
                        i -= 1;
                    }
                    if i == 0 {
                        break;
                    }
                    cur[i - 1] += 1;
                    let v = cur[i - 1];
                    for x in cur.iter_mut().skip(i) {
                        *x = v;
                    }
                }
            }
            for pinned in &pins {
                for unpinned in &multisets {
                    let want = brute_force(model, pinned, unpinned);
                    assert_eq!(
                        feasible(model, pinned, unpinned),
                        want,
                        "{pinned:?} {unpinned:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn never_panics_on_odd_input() {
        let m = Catalog::builtin().model("A100-SXM4-40GB").unwrap();
        let seven = m.profile_index("7g.40gb").unwrap();
        assert!(place(m, &[(seven, 255)], &[]).is_none());
        assert!(place(m, &[(usize::MAX, 0)], &[usize::MAX]).is_none());
        assert!(place(m, &[], &vec![0; 1000]).is_none());
        assert!(place(m, &vec![(0, 0); 300], &[]).is_none());
    }
}
