//! The hint merge: which merged hint the kubelet's `HintMerger` picks from per-resource lists.
//!
//! The kubelet walks the full cartesian product of the lists, keeping a running best. The result
//! depends only on the *set* of merged candidates (mask, preferred) and on the target width *b*
//! (`maxOfMinAffinityCounts`), so this implementation computes that set by dynamic programming over
//! the lists, deduplicating partial states, and then applies the closed form of the choice
//! (see `shared/docs/topologymanager.md` §7.4). The state after k lists is the AND of the masks so
//! far plus where preference stands (broken, no mask seen yet, or every mask identical to `m`),
//! so the work is bounded by (number of distinct states) x (hints), not by the product of the
//! list lengths. A literal sequential implementation lives in this file's tests and in
//! `tests/reference/topology.py`, and both are checked against this one on random inputs.

use super::hint::TopologyHint;
use super::numa::NumaInfo;
use crate::bitmask::NumaMask;
use crate::error::{CoreError, CoreResult};

/// How two masks of a merge are compared ("fitter" = smaller rank key).
#[derive(Copy, Clone, Debug)]
pub enum Fitter<'a> {
    /// Fewer nodes, then the numerically smaller mask.
    Narrowest,
    /// Fewer nodes, then the smaller average distance, then the numerically smaller mask.
    Closest(&'a NumaInfo),
}

impl Fitter<'_> {
    /// The total order key: (width, distance sum if Closest, mask value).
    pub fn rank(&self, mask: NumaMask) -> (u32, u64, u64) {
        let dist = match self {
            Fitter::Narrowest => 0,
            Fitter::Closest(numa) => numa.distance_sum(mask),
        };
        (mask.count(), dist, mask.0)
    }
}

/// `maxOfMinAffinityCounts`: per list the width of its narrowest non-nil mask (lists with only nil
/// masks are skipped), and the largest of those; 0 if none.
pub fn best_non_preferred_affinity_count(lists: &[Vec<TopologyHint>]) -> u32 {
    lists
        .iter()
        .filter_map(|list| list.iter().filter_map(|h| h.mask).map(|m| m.count()).min())
        .max()
        .unwrap_or(0)
}

/// Where preference stands for a partial combination.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Pref {
    /// Some hint was not preferred, or two non-nil masks differed.
    Broken,
    /// Every hint so far was preferred and had a nil mask.
    AllNil,
    /// Every hint so far was preferred and every non-nil mask was exactly this raw mask.
    Same(u64),
}

/// The distinct merged candidates (mask after the AND with the default affinity, preferred) of
/// all combinations, without those whose mask is empty. An empty list yields no candidates.
pub fn merged_candidates(lists: &[Vec<TopologyHint>], default: NumaMask) -> Vec<(NumaMask, bool)> {
    let mut states: Vec<(u64, Pref)> = vec![(default.0, Pref::AllNil)];
    let mut next: Vec<(u64, Pref)> = Vec::new();
    for list in lists {
        next.clear();
        for &(and, pref) in &states {
            for hint in list {
                let (and2, pref2) = match hint.mask {
                    None => (and, if hint.preferred { pref } else { Pref::Broken }),
                    Some(m) => {
                        let and2 = and & m.0;
                        let pref2 = if !hint.preferred {
                            Pref::Broken
                        } else {
                            match pref {
                                Pref::Broken => Pref::Broken,
                                Pref::AllNil => Pref::Same(m.0),
                                Pref::Same(x) if x == m.0 => Pref::Same(x),
                                Pref::Same(_) => Pref::Broken,
                            }
                        };
                        (and2, pref2)
                    }
                };
                // ANDs only shrink: a state whose mask is empty can never become a candidate.
                if and2 != 0 {
                    next.push((and2, pref2));
                }
            }
        }
        next.sort_unstable();
        next.dedup();
        std::mem::swap(&mut states, &mut next);
        if states.is_empty() {
            return Vec::new();
        }
    }
    let mut out: Vec<(NumaMask, bool)> = states
        .into_iter()
        .map(|(and, pref)| (NumaMask(and), pref != Pref::Broken))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The merged hint the kubelet's `HintMerger.Merge` returns for these lists (before any
/// policy-specific post-processing).
pub fn merge_lists(
    lists: &[Vec<TopologyHint>],
    default: NumaMask,
    fitter: Fitter<'_>,
) -> CoreResult<TopologyHint> {
    let candidates = merged_candidates(lists, default);
    choose(
        &candidates,
        best_non_preferred_affinity_count(lists),
        default,
        fitter,
    )
}

/// The fittest of `masks`. With the Closest fitter and no distance matrix, masks of equal width
/// cannot be ordered: that is an error rather than a guess (the kubelet refuses to start without
/// the matrix; its tests leave it out only where widths differ).
fn fittest(masks: &[NumaMask], fitter: Fitter<'_>) -> CoreResult<Option<NumaMask>> {
    if let Fitter::Closest(numa) = fitter {
        if !numa.has_distances() {
            if let Some(w) = masks.iter().map(|m| m.count()).min() {
                let tied: Vec<NumaMask> =
                    masks.iter().copied().filter(|m| m.count() == w).collect();
                if tied.len() > 1 {
                    return Err(CoreError::new(
                        "distances",
                        format!(
                            "the option \"prefer-closest-numa-nodes\" needs the NUMA distance matrix to choose between NUMA {:?} and {:?}",
                            tied[0].ids(),
                            tied[1].ids()
                        ),
                    ));
                }
            }
        }
    }
    Ok(masks.iter().copied().min_by_key(|m| fitter.rank(*m)))
}

/// The closed form of the kubelet's running-best choice (topologymanager.md §7.4).
pub fn choose(
    candidates: &[(NumaMask, bool)],
    b: u32,
    default: NumaMask,
    fitter: Fitter<'_>,
) -> CoreResult<TopologyHint> {
    let group = |pred: &dyn Fn(NumaMask, bool) -> bool| -> Vec<NumaMask> {
        candidates
            .iter()
            .filter(|(m, p)| pred(*m, *p))
            .map(|(m, _)| *m)
            .collect()
    };
    if let Some(m) = fittest(&group(&|_, p| p), fitter)? {
        return Ok(TopologyHint::new(Some(m), true));
    }
    if let Some(m) = fittest(&group(&|m, _| m.count() == b), fitter)? {
        return Ok(TopologyHint::new(Some(m), false));
    }
    let widest_below = candidates
        .iter()
        .map(|(m, _)| m.count())
        .filter(|&w| w < b)
        .max();
    if let Some(w) = widest_below {
        if let Some(m) = fittest(&group(&|m, _| m.count() == w), fitter)? {
            return Ok(TopologyHint::new(Some(m), false));
        }
    }
    Ok(match fittest(&group(&|_, _| true), fitter)? {
        Some(m) => TopologyHint::new(Some(m), false),
        None => TopologyHint::new(Some(default), false),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The kubelet's algorithm, literally: walk the cartesian product in order and keep a running
    /// best (topologymanager.md §6, §7.3). Used only to check the fast path.
    pub(crate) fn merge_sequential(
        lists: &[Vec<TopologyHint>],
        default: NumaMask,
        fitter: Fitter<'_>,
    ) -> TopologyHint {
        let b = best_non_preferred_affinity_count(lists);
        if lists.iter().any(|l| l.is_empty()) {
            return TopologyHint::new(Some(default), false);
        }
        let fitter_of = |cur: NumaMask, cand: NumaMask| -> NumaMask {
            if cur == cand || fitter.rank(cur) < fitter.rank(cand) {
                cur
            } else {
                cand
            }
        };
        let mut best: Option<TopologyHint> = None;
        let mut idx = vec![0usize; lists.len()];
        loop {
            let combo: Vec<TopologyHint> = idx.iter().zip(lists).map(|(&i, l)| l[i]).collect();
            let mut mask = default;
            let mut preferred = true;
            let mut first_raw: Option<NumaMask> = None;
            for h in &combo {
                preferred &= h.preferred;
                if let Some(m) = h.mask {
                    mask = mask.and(m);
                    match first_raw {
                        None => first_raw = Some(m),
                        Some(f) if f != m => preferred = false,
                        Some(_) => {}
                    }
                }
            }
            if mask.count() > 0 {
                let cand = TopologyHint::new(Some(mask), preferred);
                best = Some(match best {
                    None => cand,
                    Some(cur) => {
                        let (cm, xm) = (cur.mask.unwrap(), mask);
                        match (cur.preferred, preferred) {
                            (false, true) => cand,
                            (true, false) => cur,
                            (true, true) => TopologyHint::new(Some(fitter_of(cm, xm)), true),
                            (false, false) => {
                                let (wb, wc) = (cm.count(), xm.count());
                                let pick = if wb > b {
                                    fitter_of(cm, xm)
                                } else if wb == b {
                                    if wc == b {
                                        fitter_of(cm, xm)
                                    } else {
                                        cm
                                    }
                                } else if wc > b {
                                    cm
                                } else if wc == b || wb < wc {
                                    xm
                                } else if wc < wb {
                                    cm
                                } else {
                                    fitter_of(cm, xm)
                                };
                                TopologyHint::new(Some(pick), false)
                            }
                        }
                    }
                });
            }
            // next combination, last list fastest
            let mut k = lists.len();
            loop {
                if k == 0 {
                    return best.unwrap_or(TopologyHint::new(Some(default), false));
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < lists[k].len() {
                    break;
                }
                idx[k] = 0;
            }
        }
    }

    /// A small deterministic generator, so the tests need no dependency.
    pub(crate) struct Lcg(pub u64);
    impl Lcg {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    pub(crate) fn random_lists(rng: &mut Lcg, nodes: u32) -> Vec<Vec<TopologyHint>> {
        let n_lists = rng.below(5) as usize;
        (0..n_lists)
            .map(|_| {
                let len = rng.below(5) as usize;
                (0..len)
                    .map(|_| {
                        let mask = match rng.below(6) {
                            0 => None,
                            1 => Some(NumaMask::EMPTY),
                            // sometimes a bit outside the machine, which must vanish in the AND
                            _ => Some(NumaMask(rng.next() & ((1u64 << (nodes + 1)) - 1))),
                        };
                        TopologyHint::new(mask, rng.below(3) != 0)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn fast_merge_equals_the_sequential_kubelet_walk() {
        let mut rng = Lcg(7);
        for round in 0..20_000 {
            let nodes = 1 + rng.below(8) as u32;
            let default = NumaMask((1u64 << nodes) - 1);
            let lists = random_lists(&mut rng, nodes);
            let fast = merge_lists(&lists, default, Fitter::Narrowest).unwrap();
            let slow = merge_sequential(&lists, default, Fitter::Narrowest);
            assert_eq!(fast, slow, "round {round}: {lists:?}");
        }
    }

    #[test]
    fn closest_fitter_agrees_too() {
        let rows: Vec<(i64, Vec<i64>)> = (0..8)
            .map(|i| {
                let row = (0..8)
                    .map(|j| {
                        if i == j {
                            10
                        } else if i / 4 == j / 4 {
                            11 + (i + j) % 3
                        } else {
                            30
                        }
                    })
                    .collect();
                (i, row)
            })
            .collect();
        let numa = NumaInfo::new(&(0..8).collect::<Vec<i64>>(), Some(&rows)).unwrap();
        let mut rng = Lcg(11);
        for _ in 0..5_000 {
            let lists = random_lists(&mut rng, 8);
            let fast = merge_lists(&lists, numa.default_mask(), Fitter::Closest(&numa)).unwrap();
            let slow = merge_sequential(&lists, numa.default_mask(), Fitter::Closest(&numa));
            assert_eq!(fast, slow, "{lists:?}");
        }
    }

    #[test]
    fn target_width_rules() {
        let h = |bits: u64, p: bool| TopologyHint::new(Some(NumaMask(bits)), p);
        // b is the largest of the per-list narrowest widths
        let lists = vec![
            vec![h(0b0011, false), h(0b0001, false)],
            vec![h(0b1111, false)],
        ];
        assert_eq!(best_non_preferred_affinity_count(&lists), 4);
        // b = 2 here, and a width-2 candidate beats a narrower one
        let lists = vec![
            vec![h(0b0011, false)],
            vec![h(0b0111, false), h(0b0001, false)],
        ];
        assert_eq!(best_non_preferred_affinity_count(&lists), 2);
        let got = merge_lists(&lists, NumaMask(0b1111), Fitter::Narrowest).unwrap();
        assert_eq!(got, h(0b0011, false));
        // no lists: the default affinity, preferred
        assert_eq!(
            merge_lists(&[], NumaMask(0b11), Fitter::Narrowest).unwrap(),
            h(0b11, true)
        );
        // an empty list: no candidate, the default affinity, not preferred
        assert_eq!(
            merge_lists(&[vec![]], NumaMask(0b11), Fitter::Narrowest).unwrap(),
            h(0b11, false)
        );
    }
}
