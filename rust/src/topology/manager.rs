//! A Topology Manager as the kubelet builds it (policy + options + NUMA info, with the
//! NUMA-count limit checked at construction), and its merge-and-admit step.

use super::hint::{filter_providers_hints, filter_single_numa_hints, ProviderHints, TopologyHint};
use super::merge::{merge_lists, Fitter};
use super::numa::NumaInfo;
use super::policy::{Policy, PolicyOptions, MAX_ALLOWABLE_NUMA_NODES};
use crate::error::{CoreError, CoreResult};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MergeResult {
    pub hint: TopologyHint,
    pub admit: bool,
}

#[derive(Clone, Debug)]
pub struct TopologyManager {
    policy: Policy,
    options: PolicyOptions,
    numa: NumaInfo,
}

impl TopologyManager {
    /// Fails as the kubelet's `NewManager` does: more NUMA nodes than `max-allowable-numa-nodes`
    /// (policy `none` excepted, which parses nothing). A missing distance matrix with
    /// `prefer-closest-numa-nodes` is an error only when a merge needs a distance.
    pub fn new(policy: Policy, options: PolicyOptions, numa: NumaInfo) -> CoreResult<Self> {
        if policy != Policy::None {
            let n = numa.nodes().len() as i64;
            if n > options.max_allowable_numa_nodes {
                return Err(CoreError::new(
                    "numa_nodes",
                    format!(
                        "unsupported on machines with more than {} NUMA Nodes (this one has {n}); set the option {MAX_ALLOWABLE_NUMA_NODES:?} to allow more",
                        options.max_allowable_numa_nodes
                    ),
                ));
            }
        }
        Ok(Self {
            policy,
            options,
            numa,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn numa(&self) -> &NumaInfo {
        &self.numa
    }

    /// Every non-nil mask must name only the machine's NUMA nodes.
    fn check_ids(&self, providers: &[ProviderHints]) -> CoreResult<()> {
        let machine = self.numa.default_mask();
        for (p, provider) in providers.iter().enumerate() {
            for r in provider.0.iter().flatten() {
                for (i, h) in r.hints.iter().flatten().enumerate() {
                    if let Some(m) = h.mask {
                        if !m.is_subset_of(machine) {
                            let foreign = crate::bitmask::NumaMask(m.0 & !machine.0).ids();
                            return Err(CoreError::new(
                                format!("providers[{p}][{:?}][{i}].affinity", r.resource),
                                format!(
                                    "NUMA id {} is not one of numa_nodes {:?}",
                                    foreign[0],
                                    self.numa.nodes()
                                ),
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Merges the providers' hints under the policy and says whether the kubelet would admit.
    pub fn merge(&self, providers: &[ProviderHints]) -> CoreResult<MergeResult> {
        self.check_ids(providers)?;
        let default = self.numa.default_mask();
        let result = match self.policy {
            Policy::None => MergeResult {
                hint: TopologyHint::new(None, false),
                admit: true,
            },
            Policy::BestEffort | Policy::Restricted => {
                let fitter = if self.options.prefer_closest_numa {
                    Fitter::Closest(&self.numa)
                } else {
                    Fitter::Narrowest
                };
                let lists = filter_providers_hints(providers);
                let hint = merge_lists(&lists, default, fitter)?;
                let admit = self.policy == Policy::BestEffort || hint.preferred;
                MergeResult { hint, admit }
            }
            Policy::SingleNumaNode => {
                let lists = filter_single_numa_hints(&filter_providers_hints(providers));
                let mut hint = merge_lists(&lists, default, Fitter::Narrowest)?;
                if hint.mask == Some(default) {
                    hint.mask = None;
                }
                MergeResult {
                    hint,
                    admit: hint.preferred,
                }
            }
        };
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bitmask::NumaMask;
    use crate::topology::hint::ResourceHints;

    fn provider(resource: &str, hints: Vec<TopologyHint>) -> ProviderHints {
        ProviderHints(Some(vec![ResourceHints {
            resource: resource.into(),
            hints: Some(hints),
        }]))
    }

    fn manager(policy: Policy, nodes: &[i64]) -> TopologyManager {
        TopologyManager::new(
            policy,
            PolicyOptions::default(),
            NumaInfo::new(nodes, None).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn more_than_eight_nodes_needs_the_option() {
        let nodes: Vec<i64> = (0..9).collect();
        let err = TopologyManager::new(
            Policy::Restricted,
            PolicyOptions::default(),
            NumaInfo::new(&nodes, None).unwrap(),
        );
        assert!(err.unwrap_err().message.contains("more than 8 NUMA Nodes"));
        let opts = PolicyOptions {
            max_allowable_numa_nodes: 9,
            ..PolicyOptions::default()
        };
        assert!(TopologyManager::new(
            Policy::Restricted,
            opts,
            NumaInfo::new(&nodes, None).unwrap()
        )
        .is_ok());
        assert!(TopologyManager::new(
            Policy::None,
            PolicyOptions::default(),
            NumaInfo::new(&nodes, None).unwrap()
        )
        .is_ok());
    }

    #[test]
    fn foreign_ids_are_errors_naming_the_hint() {
        let m = manager(Policy::BestEffort, &[0, 1]);
        let p = provider("gpu", vec![TopologyHint::new(Some(NumaMask(0b100)), true)]);
        let err = m.merge(&[p]).unwrap_err();
        assert_eq!(err.field, "providers[0][\"gpu\"][0].affinity");
        assert!(err.message.contains("NUMA id 2"));
    }

    #[test]
    fn single_numa_node_on_one_node_machine_reports_nil() {
        let m = manager(Policy::SingleNumaNode, &[0]);
        let p = provider("gpu", vec![TopologyHint::new(Some(NumaMask(1)), true)]);
        let r = m.merge(&[p]).unwrap();
        assert_eq!(r.hint, TopologyHint::new(None, true));
        assert!(r.admit);
    }

    #[test]
    fn restricted_rejects_misaligned_widths() {
        // GPUs need {0,1}, CPUs can do {0}: intersection {0} is not preferred (since v1.24)
        let m = manager(Policy::Restricted, &[0, 1]);
        let gpus = provider("gpu", vec![TopologyHint::new(Some(NumaMask(0b11)), true)]);
        let cpus = provider(
            "cpu",
            vec![
                TopologyHint::new(Some(NumaMask(0b01)), true),
                TopologyHint::new(Some(NumaMask(0b10)), true),
                TopologyHint::new(Some(NumaMask(0b11)), false),
            ],
        );
        let r = m.merge(&[gpus, cpus]).unwrap();
        assert!(!r.admit);
        assert_eq!(r.hint, TopologyHint::new(Some(NumaMask(0b11)), false));
    }
}
