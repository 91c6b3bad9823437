//! Topology hints as providers return them, and the kubelet's `filterProvidersHints`,
//! which turns a list of provider maps into one hint list per resource.

use crate::bitmask::NumaMask;

/// A topology hint: a mask, or `None` for the nil mask ("any NUMA node"), and whether the
/// provider considers that placement optimal. `Some(NumaMask::EMPTY)` is the non-nil empty mask,
/// which constrains to nothing.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologyHint {
    pub mask: Option<NumaMask>,
    pub preferred: bool,
}

impl TopologyHint {
    pub const fn new(mask: Option<NumaMask>, preferred: bool) -> Self {
        Self { mask, preferred }
    }
}

/// One resource in a provider's answer: `hints == None` is "no preference" (a nil list),
/// `Some(vec![])` is "this resource cannot be placed anywhere".
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceHints {
    pub resource: String,
    pub hints: Option<Vec<TopologyHint>>,
}

/// One provider's answer: `None` is a nil map; `Some(vec![])` an empty map.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProviderHints(pub Option<Vec<ResourceHints>>);

const DONT_CARE: TopologyHint = TopologyHint::new(None, true);
const IMPOSSIBLE: TopologyHint = TopologyHint::new(None, false);

/// Flattens the providers' maps into one list per resource, as the kubelet does:
/// a provider naming no resource contributes one preferred don't-care list; a resource with a
/// nil list a preferred don't-care list; a resource with an empty list a non-preferred
/// don't-care list; any other list is taken as it is.
pub fn filter_providers_hints(providers: &[ProviderHints]) -> Vec<Vec<TopologyHint>> {
    let mut lists = Vec::new();
    for provider in providers {
        match &provider.0 {
            None => lists.push(vec![DONT_CARE]),
            Some(resources) if resources.is_empty() => lists.push(vec![DONT_CARE]),
            Some(resources) => {
                for r in resources {
                    match &r.hints {
                        None => lists.push(vec![DONT_CARE]),
                        Some(h) if h.is_empty() => lists.push(vec![IMPOSSIBLE]),
                        Some(h) => lists.push(h.clone()),
                    }
                }
            }
        }
    }
    lists
}

/// The single-numa-node pre-filter: keep only preferred hints whose mask is nil or one node.
pub fn filter_single_numa_hints(lists: &[Vec<TopologyHint>]) -> Vec<Vec<TopologyHint>> {
    lists
        .iter()
        .map(|list| {
            list.iter()
                .copied()
                .filter(|h| h.preferred && h.mask.is_none_or(|m| m.count() == 1))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(name: &str, hints: Option<Vec<TopologyHint>>) -> ResourceHints {
        ResourceHints {
            resource: name.into(),
            hints,
        }
    }

    #[test]
    fn provider_shapes_flatten_like_the_kubelet() {
        let one = TopologyHint::new(Some(NumaMask(1)), true);
        let providers = vec![
            ProviderHints(None),
            ProviderHints(Some(vec![])),
            ProviderHints(Some(vec![res("a", None), res("b", Some(vec![]))])),
            ProviderHints(Some(vec![res("c", Some(vec![one]))])),
        ];
        let lists = filter_providers_hints(&providers);
        assert_eq!(
            lists,
            vec![
                vec![DONT_CARE],
                vec![DONT_CARE],
                vec![DONT_CARE],
                vec![IMPOSSIBLE],
                vec![one]
            ]
        );
    }

    #[test]
    fn single_numa_filter_drops_wide_and_non_preferred() {
        let lists = vec![vec![
            TopologyHint::new(Some(NumaMask(0b01)), true),
            TopologyHint::new(Some(NumaMask(0b11)), true),
            TopologyHint::new(Some(NumaMask(0b10)), false),
            TopologyHint::new(None, true),
            TopologyHint::new(None, false),
            TopologyHint::new(Some(NumaMask::EMPTY), true),
        ]];
        let f = filter_single_numa_hints(&lists);
        assert_eq!(
            f,
            vec![vec![
                TopologyHint::new(Some(NumaMask(0b01)), true),
                TopologyHint::new(None, true)
            ]]
        );
    }
}
