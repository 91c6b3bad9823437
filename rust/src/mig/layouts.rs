//! Every maximal layout of a GPU model: the multisets of GPU instances that can exist together
//! and to which no further instance of the considered profiles can be added.
//!
//! Which profiles are considered is the caller's choice. By default (`default_profiles`) the
//! `+me` (media-extension) variants are left out: a `+me` instance has exactly the geometry of
//! its base profile (same slices, same placements) and differs only in its engines, so counting
//! it would multiply layouts without describing a different partition of the GPU. With them
//! included, a `+me` profile is just one more profile with its own `max_count` (1), which is all
//! the sources say about it (`shared/docs/mig.md`: 44 maximal layouts on A100-40GB).
//!
//! Layouts are multisets (a partition does not depend on which of two equal instances sits
//! where); each comes with one concrete placement from the placement search.

use super::catalog::GpuModel;
use super::placement::{place, search_from, Pinned};
use super::validate::Rules;
use crate::error::{CoreError, CoreResult};
use crate::mig::catalog::MAX_PROFILES;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// (profile index, memory-slice start), ascending by start.
    pub instances: Vec<(usize, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enumeration {
    /// Number of valid non-empty multisets of the considered profiles.
    pub valid_multisets: usize,
    /// The maximal ones, largest profiles first (descending counts, profiles taken from the most
    /// compute slices to the fewest).
    pub maximal: Vec<Layout>,
}

/// The profiles considered by default: all but the `+me` variants.
pub fn default_profiles(model: &GpuModel) -> Vec<usize> {
    (0..model.profiles.len())
        .filter(|&i| !model.profiles[i].media_extensions)
        .collect()
}

/// Enumerate the valid and maximal layouts built from `profiles` (indices; duplicates ignored).
pub fn enumerate(model: &GpuModel, profiles: &[usize], rules: Rules) -> CoreResult<Enumeration> {
    let mut order: Vec<usize> = Vec::new();
    for (i, &p) in profiles.iter().enumerate() {
        if p >= model.profiles.len() {
            return Err(CoreError::new(
                format!("profiles[{i}]"),
                format!("profile index {p} is not a profile of {}", model.name),
            ));
        }
        if !order.contains(&p) {
            order.push(p);
        }
    }
    // Largest first: the enumeration order is the output order.
    order.sort_by_key(|&p| {
        let pr = &model.profiles[p];
        (
            std::cmp::Reverse(pr.compute_slices),
            std::cmp::Reverse(pr.memory_slices),
            p,
        )
    });
    let mut e = Enum {
        model,
        order: &order,
        rules,
        counts: [0; MAX_PROFILES],
        multiset: Vec::new(),
        valid: 0,
        maximal: Vec::new(),
    };
    e.rec(0);
    Ok(Enumeration {
        valid_multisets: e.valid,
        maximal: e.maximal,
    })
}

struct Enum<'a> {
    model: &'a GpuModel,
    order: &'a [usize],
    rules: Rules,
    counts: [u8; MAX_PROFILES],
    multiset: Vec<usize>,
    valid: usize,
    maximal: Vec<Layout>,
}

impl Enum<'_> {
    fn ok(&self) -> bool {
        let empty = Pinned {
            occupied: 0,
            counts: [0; MAX_PROFILES],
            compute: 0,
        };
        !self
            .rules
            .forbids(self.model, &self.counts[..self.model.profiles.len()])
            && search_from(self.model, &empty, &self.multiset, None)
    }

    /// Counts for order[i..], largest count first (so the output runs from the largest layouts).
    fn rec(&mut self, i: usize) {
        if i == self.order.len() {
            if self.multiset.is_empty() {
                return;
            }
            self.valid += 1;
            if self.is_maximal() {
                let starts = place(self.model, &[], &self.multiset).unwrap_or_default();
                let mut instances: Vec<(usize, u8)> =
                    self.multiset.iter().copied().zip(starts).collect();
                instances.sort_by_key(|&(p, s)| (s, p));
                self.maximal.push(Layout { instances });
            }
            return;
        }
        let p = self.order[i];
        // How many of p fit on top of what is chosen (validity is monotone: fewer always fits).
        let mut k = 0;
        loop {
            self.multiset.push(p);
            self.counts[p] += 1;
            let fits = self.ok();
            self.multiset.pop();
            self.counts[p] -= 1;
            if !fits {
                break;
            }
            self.multiset.push(p);
            self.counts[p] += 1;
            k += 1;
        }
        loop {
            self.rec(i + 1);
            if k == 0 {
                break;
            }
            self.multiset.pop();
            self.counts[p] -= 1;
            k -= 1;
        }
    }

    fn is_maximal(&mut self) -> bool {
        for idx in 0..self.order.len() {
            let p = self.order[idx];
            self.multiset.push(p);
            self.counts[p] += 1;
            let fits = self.ok();
            self.multiset.pop();
            self.counts[p] -= 1;
            if fits {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::Catalog;

    fn idx(m: &GpuModel, names: &[&str]) -> Vec<usize> {
        names.iter().map(|n| m.profile_index(n).unwrap()).collect()
    }

    fn show(m: &GpuModel, l: &Layout) -> String {
        let mut names: Vec<&str> = l
            .instances
            .iter()
            .map(|&(p, _)| m.profiles[p].name.as_str())
            .collect();
        names.sort_by_key(|n| std::cmp::Reverse(n.to_string()));
        names.join("+")
    }

    #[test]
    fn documented_counts() {
        let c = Catalog::builtin();
        let a100 = c.model("A100-SXM4-40GB").unwrap();
        let base = idx(
            a100,
            &["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        );
        let e = enumerate(a100, &base, Rules::default()).unwrap();
        assert_eq!((e.valid_multisets, e.maximal.len()), (37, 12));
        let full_compute = e
            .maximal
            .iter()
            .filter(|l| {
                l.instances
                    .iter()
                    .map(|&(p, _)| a100.profiles[p].compute_slices)
                    .sum::<u8>()
                    == 7
            })
            .count();
        assert_eq!(full_compute, 11);
        let e = enumerate(a100, &base, Rules { pre_r510: true }).unwrap();
        assert_eq!(e.maximal.len(), 11);
        let e = enumerate(a100, &default_profiles(a100), Rules::default()).unwrap();
        assert_eq!((e.valid_multisets, e.maximal.len()), (77, 28));
        let all: Vec<usize> = (0..a100.profiles.len()).collect();
        let e = enumerate(a100, &all, Rules::default()).unwrap();
        assert_eq!((e.valid_multisets, e.maximal.len()), (127, 44));
        let h100 = c.model("H100-80GB").unwrap();
        let e = enumerate(h100, &default_profiles(h100), Rules::default()).unwrap();
        assert_eq!((e.valid_multisets, e.maximal.len()), (77, 28));
    }

    #[test]
    fn the_twelve_base_layouts() {
        let a100 = Catalog::builtin().model("A100-SXM4-40GB").unwrap();
        let base = idx(
            a100,
            &["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
        );
        let e = enumerate(a100, &base, Rules::default()).unwrap();
        let got: Vec<String> = e.maximal.iter().map(|l| show(a100, l)).collect();
        let mut want = vec![
            "7g.40gb",
            "4g.20gb+3g.20gb",
            "4g.20gb+2g.10gb+1g.5gb",
            "4g.20gb+1g.5gb+1g.5gb+1g.5gb",
            "3g.20gb+3g.20gb",
            "3g.20gb+2g.10gb+2g.10gb",
            "3g.20gb+2g.10gb+1g.5gb+1g.5gb",
            "3g.20gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb",
            "2g.10gb+2g.10gb+2g.10gb+1g.5gb",
            "2g.10gb+2g.10gb+1g.5gb+1g.5gb+1g.5gb",
            "2g.10gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb",
            "1g.5gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb+1g.5gb",
        ];
        let mut got_sorted = got.clone();
        got_sorted.sort();
        want.sort();
        assert_eq!(got_sorted, want);
        assert_eq!(got[0], "7g.40gb");
        assert_eq!(got[1], "4g.20gb+3g.20gb");
        // Every maximal layout's placement is valid.
        for l in &e.maximal {
            let pinned: Vec<(usize, u8)> = l.instances.clone();
            assert!(crate::mig::placement::feasible(a100, &pinned, &[]));
        }
    }

    #[test]
    fn a30_and_errors() {
        let a30 = Catalog::builtin().model("A30-24GB").unwrap();
        let e = enumerate(a30, &default_profiles(a30), Rules::default()).unwrap();
        assert_eq!(e.maximal.len(), 4); // 4g; 2g+2g; 2g+1g+1g; 4x1g
        assert!(enumerate(a30, &[99], Rules::default()).is_err());
        assert_eq!(
            enumerate(a30, &[], Rules::default()).unwrap().maximal.len(),
            0
        );
    }
}
