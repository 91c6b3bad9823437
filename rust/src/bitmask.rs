//! The NUMA affinity mask: bit *i* set = NUMA node *i* included, for node ids 0..=63,
//! with the kubelet's ordering rules (`bitmask/bitmask.go`).

use crate::error::{CoreError, CoreResult};

/// Number of NUMA node ids a mask can hold.
pub const MAX_NUMA_NODES: usize = 64;

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumaMask(pub u64);

impl NumaMask {
    pub const EMPTY: NumaMask = NumaMask(0);

    /// A mask from node ids; an id outside 0..=63 is an error naming `field`.
    pub fn from_ids(ids: &[i64], field: &str) -> CoreResult<Self> {
        let mut bits = 0u64;
        for &id in ids {
            if !(0..MAX_NUMA_NODES as i64).contains(&id) {
                return Err(CoreError::new(
                    field,
                    format!("NUMA id {id} is outside 0..=63 (a NUMA mask holds 64 nodes)"),
                ));
            }
            bits |= 1u64 << id;
        }
        Ok(NumaMask(bits))
    }

    pub fn count(self) -> u32 {
        self.0.count_ones()
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn and(self, other: NumaMask) -> NumaMask {
        NumaMask(self.0 & other.0)
    }

    pub fn contains(self, id: u32) -> bool {
        id < 64 && self.0 & (1u64 << id) != 0
    }

    pub fn is_subset_of(self, other: NumaMask) -> bool {
        self.0 & !other.0 == 0
    }

    /// Kubelet `IsNarrowerThan`: fewer nodes, or as many nodes and numerically smaller.
    pub fn is_narrower_than(self, other: NumaMask) -> bool {
        let (a, b) = (self.count(), other.count());
        if a == b {
            self.0 < other.0
        } else {
            a < b
        }
    }

    /// The set node ids, ascending.
    pub fn ids(self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.count() as usize);
        let mut rest = self.0;
        while rest != 0 {
            let id = rest.trailing_zeros();
            out.push(id);
            rest &= rest - 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_ids_and_back() {
        let m = NumaMask::from_ids(&[3, 0, 63], "f").unwrap();
        assert_eq!(m.ids(), vec![0, 3, 63]);
        assert_eq!(m.count(), 3);
        assert!(NumaMask::from_ids(&[64], "x")
            .unwrap_err()
            .message
            .contains("64"));
        assert_eq!(NumaMask::from_ids(&[-1], "hint").unwrap_err().field, "hint");
    }

    #[test]
    fn narrower_is_a_strict_total_order() {
        let masks: Vec<NumaMask> = (0u64..64).map(NumaMask).collect();
        for &a in &masks {
            assert!(!a.is_narrower_than(a));
            for &b in &masks {
                if a != b {
                    assert_ne!(a.is_narrower_than(b), b.is_narrower_than(a));
                }
            }
        }
        // {0,1} vs {2}: fewer nodes wins; {0,1} vs {0,2}: numerically smaller wins.
        assert!(NumaMask(0b100).is_narrower_than(NumaMask(0b011)));
        assert!(NumaMask(0b011).is_narrower_than(NumaMask(0b101)));
    }
}
