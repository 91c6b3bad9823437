//! Packing MIG instances onto GPUs when only their counts are known (Kubernetes shows
//! `nvidia.com/mig-<profile>` counts, not placements): largest profile first, each at the first
//! GPU and placement where the exact placement search still succeeds.

use crate::error::{CoreError, CoreResult};
use crate::mig::catalog::Catalog;
use crate::mig::placement::place;

/// Per GPU, the `(profile name, memory-slice start)` of each instance. `counts` are
/// `(profile name, how many)`; `gpus` the number of MIG GPUs available.
pub fn pack_instances(
    model: &str,
    counts: &[(String, u32)],
    gpus: usize,
) -> CoreResult<Vec<Vec<(String, u8)>>> {
    let m = Catalog::builtin().model(model)?;
    let mut wanted: Vec<usize> = Vec::new();
    for (name, n) in counts {
        let p = m.profile_index(name)?;
        if *n > 64 {
            return Err(CoreError::new(
                format!("nvidia.com/mig-{name}"),
                format!("{n} instances is more than a node can have"),
            ));
        }
        wanted.extend(std::iter::repeat_n(p, *n as usize));
    }
    wanted.sort_by_key(|&p| {
        (
            std::cmp::Reverse(m.profiles[p].compute_slices),
            std::cmp::Reverse(m.profiles[p].memory_slices),
            p,
        )
    });
    // Each GPU's instances are re-placed together by the exact search every time one is added,
    // since nothing pins them (a greedy first placement can block a later instance).
    let mut layouts: Vec<Vec<usize>> = vec![Vec::new(); gpus.max(1)];
    for &p in &wanted {
        let mut done = false;
        for layout in layouts.iter_mut() {
            layout.push(p);
            if place(m, &[], layout).is_some() {
                done = true;
                break;
            }
            layout.pop();
        }
        if !done {
            return Err(CoreError::new(
                "mig",
                format!(
                    "the MIG instances {counts:?} do not fit on {} {} GPU(s)",
                    gpus.max(1),
                    m.name
                ),
            ));
        }
    }
    let mut out = Vec::new();
    for layout in layouts.into_iter().filter(|l| !l.is_empty()) {
        let starts = place(m, &[], &layout)
            .ok_or_else(|| CoreError::new("mig", "internal: a packed layout no longer places"))?;
        out.push(
            layout
                .iter()
                .zip(starts)
                .map(|(&p, s)| (m.profiles[p].name.clone(), s))
                .collect(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_largest_first_and_refuses_overflow() {
        let got = pack_instances(
            "A100-SXM4-40GB",
            &[("1g.5gb".into(), 4), ("3g.20gb".into(), 1)],
            1,
        )
        .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0][0].0, "3g.20gb");
        assert_eq!(got[0].len(), 5);
        // 3g.20gb must sit at 4 for the four 1g.5gb to fit at 0..=3
        assert_eq!(got[0][0].1, 4);
        let two = pack_instances("A100-SXM4-40GB", &[("7g.40gb".into(), 2)], 2).unwrap();
        assert_eq!(two.len(), 2);
        assert!(pack_instances("A100-SXM4-40GB", &[("7g.40gb".into(), 2)], 1).is_err());
        assert!(pack_instances("A100-SXM4-40GB", &[("9g.1tb".into(), 1)], 1).is_err());
        assert!(pack_instances("Z9000", &[("1g.5gb".into(), 1)], 1).is_err());
    }
}
