//! Per-NUMA fragmentation scoring (issue 3): the cluster model in columns, the workload, the
//! score, and the delta of a hypothetical change.

pub mod delta;
pub mod fabric;
pub mod mig_pack;
pub mod model;
pub mod score;
pub mod workload;

pub use model::{Cluster, ClusterColumns, Node, Zone};
pub use score::{score_cluster, Category, NodeScore, ZoneScore, CATEGORY_NAMES};
pub use workload::{validate_shapes, Shape};

#[cfg(test)]
mod dra_tests;
