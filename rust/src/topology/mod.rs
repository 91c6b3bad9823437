//! The kubelet Topology Manager's hint merge, exact to its semantics
//! (`pkg/kubelet/cm/topologymanager`, Kubernetes v1.26+; restated in
//! `shared/docs/topologymanager.md`).

pub mod hint;
pub mod manager;
pub mod merge;
pub mod numa;
pub mod policy;

pub use hint::{ProviderHints, ResourceHints, TopologyHint};
pub use manager::{MergeResult, TopologyManager};
pub use numa::NumaInfo;
pub use policy::{OptionValue, Policy, PolicyOptions};
