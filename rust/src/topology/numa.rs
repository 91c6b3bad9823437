//! NUMA information of a machine: its node ids (the default affinity) and, when the
//! `prefer-closest-numa-nodes` option is on, the distance matrix (rows indexed by node id).

use crate::bitmask::{NumaMask, MAX_NUMA_NODES};
use crate::error::{CoreError, CoreResult};

/// Largest accepted distance entry (ACPI SLIT uses 10..=255; be generous, but bounded so that
/// sums over 64x64 entries cannot overflow).
pub const MAX_DISTANCE: i64 = 1 << 24;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaInfo {
    nodes: Vec<u32>,
    default_mask: NumaMask,
    /// `distances[i][j]` for node ids i, j; empty when not given.
    distances: Vec<Vec<u64>>,
}

impl NumaInfo {
    /// `nodes`: the machine's NUMA node ids. `distances`: `(node id, row indexed by node id)`.
    pub fn new(nodes: &[i64], distances: Option<&[(i64, Vec<i64>)]>) -> CoreResult<Self> {
        if nodes.is_empty() {
            return Err(CoreError::new(
                "numa_nodes",
                "must name at least one NUMA node",
            ));
        }
        if nodes.len() > MAX_NUMA_NODES {
            return Err(CoreError::new(
                "numa_nodes",
                format!(
                    "{} NUMA nodes given; at most 64 are supported (ids 0..=63)",
                    nodes.len()
                ),
            ));
        }
        let mut default_mask = NumaMask::EMPTY;
        let mut ids = Vec::with_capacity(nodes.len());
        for (i, &id) in nodes.iter().enumerate() {
            let field = format!("numa_nodes[{i}]");
            let bit = NumaMask::from_ids(&[id], &field)?;
            if !default_mask.and(bit).is_empty() {
                return Err(CoreError::new(
                    field,
                    format!("NUMA id {id} is listed twice"),
                ));
            }
            default_mask = NumaMask(default_mask.0 | bit.0);
            ids.push(id as u32);
        }
        let mut info = NumaInfo {
            nodes: ids,
            default_mask,
            distances: Vec::new(),
        };
        if let Some(rows) = distances {
            info.distances = info.check_distances(rows)?;
        }
        Ok(info)
    }

    fn check_distances(&self, rows: &[(i64, Vec<i64>)]) -> CoreResult<Vec<Vec<u64>>> {
        let width = self.nodes.iter().copied().max().unwrap_or(0) as usize + 1;
        let mut matrix: Vec<Vec<u64>> = vec![Vec::new(); width];
        let mut seen = NumaMask::EMPTY;
        for (id, row) in rows {
            let field = format!("distances[{id}]");
            let in_machine =
                (0..MAX_NUMA_NODES as i64).contains(id) && self.default_mask.contains(*id as u32);
            if !in_machine {
                return Err(CoreError::new(
                    field,
                    format!(
                        "a row for NUMA id {id}, which is not one of numa_nodes {:?}",
                        self.nodes
                    ),
                ));
            }
            if seen.contains(*id as u32) {
                return Err(CoreError::new(field, "row given twice"));
            }
            seen = NumaMask(seen.0 | 1u64 << id);
            if row.len() != width {
                return Err(CoreError::new(
                    field,
                    format!(
                        "row has {} entries; expected {width} (one per NUMA id 0..={}, indexed by id)",
                        row.len(),
                        width - 1
                    ),
                ));
            }
            let mut out = Vec::with_capacity(width);
            for (j, &d) in row.iter().enumerate() {
                if !(0..=MAX_DISTANCE).contains(&d) {
                    return Err(CoreError::new(
                        format!("distances[{id}][{j}]"),
                        format!("distance {d} is outside 0..={MAX_DISTANCE}"),
                    ));
                }
                out.push(d as u64);
            }
            matrix[*id as usize] = out;
        }
        if seen != self.default_mask {
            let missing: Vec<u32> = NumaMask(self.default_mask.0 & !seen.0).ids();
            return Err(CoreError::new(
                "distances",
                format!(
                    "no row for NUMA node(s) {missing:?}; the matrix must have one row per node"
                ),
            ));
        }
        Ok(matrix)
    }

    pub fn nodes(&self) -> &[u32] {
        &self.nodes
    }

    pub fn default_mask(&self) -> NumaMask {
        self.default_mask
    }

    pub fn has_distances(&self) -> bool {
        !self.distances.is_empty()
    }

    /// Sum of `distances[i][j]` over all ordered pairs of set bits, i == j included.
    /// Comparing these sums for masks of equal width is comparing their average distances.
    /// Ids outside the machine contribute nothing (masks are ANDed with the default first).
    pub fn distance_sum(&self, mask: NumaMask) -> u64 {
        if self.distances.is_empty() {
            return 0;
        }
        let ids = mask.and(self.default_mask).ids();
        let mut sum = 0u64;
        for &i in &ids {
            let row = &self.distances[i as usize];
            for &j in &ids {
                sum += row[j as usize];
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four() -> NumaInfo {
        let rows = vec![
            (0, vec![10, 11, 12, 12]),
            (1, vec![11, 10, 12, 12]),
            (2, vec![12, 12, 10, 11]),
            (3, vec![12, 12, 11, 10]),
        ];
        NumaInfo::new(&[0, 1, 2, 3], Some(&rows)).unwrap()
    }

    #[test]
    fn average_distances_of_the_kubelet_tests() {
        let n = four();
        assert_eq!(n.distance_sum(NumaMask(0b1)), 10);
        assert_eq!(n.distance_sum(NumaMask(0b101)), 44); // {0,2}: average 11
        assert_eq!(n.distance_sum(NumaMask(0b1101)), 100); // {0,2,3}: 100/9
    }

    #[test]
    fn bad_shapes_are_named() {
        assert_eq!(NumaInfo::new(&[], None).unwrap_err().field, "numa_nodes");
        assert_eq!(
            NumaInfo::new(&[0, 0], None).unwrap_err().field,
            "numa_nodes[1]"
        );
        assert_eq!(
            NumaInfo::new(&[64], None).unwrap_err().field,
            "numa_nodes[0]"
        );
        let short = vec![(0, vec![10]), (1, vec![11, 10])];
        assert_eq!(
            NumaInfo::new(&[0, 1], Some(&short)).unwrap_err().field,
            "distances[0]"
        );
        let missing = vec![(0, vec![10, 11])];
        assert!(NumaInfo::new(&[0, 1], Some(&missing))
            .unwrap_err()
            .message
            .contains("[1]"));
        let foreign = vec![(0, vec![10, 11]), (1, vec![11, 10]), (2, vec![1, 1])];
        assert_eq!(
            NumaInfo::new(&[0, 1], Some(&foreign)).unwrap_err().field,
            "distances[2]"
        );
        let negative = vec![(0, vec![10, -1]), (1, vec![11, 10])];
        assert_eq!(
            NumaInfo::new(&[0, 1], Some(&negative)).unwrap_err().field,
            "distances[0][1]"
        );
        let too_many: Vec<i64> = (0..65).collect();
        assert!(NumaInfo::new(&too_many, None)
            .unwrap_err()
            .message
            .contains("at most 64"));
    }
}
