//! The four GA Topology Manager policies and the policy options, parsed as the kubelet does
//! (`policy_options.go`): unknown names are errors, booleans follow Go's `strconv.ParseBool`,
//! `max-allowable-numa-nodes` is a base-10 integer of at least 8 (default 8).

use crate::error::{CoreError, CoreResult};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

impl Policy {
    pub fn parse(name: &str) -> CoreResult<Self> {
        match name {
            "none" => Ok(Policy::None),
            "best-effort" => Ok(Policy::BestEffort),
            "restricted" => Ok(Policy::Restricted),
            "single-numa-node" => Ok(Policy::SingleNumaNode),
            other => Err(CoreError::new(
                "policy",
                format!(
                    "unknown policy: {other:?} (one of \"none\", \"best-effort\", \"restricted\", \"single-numa-node\")"
                ),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::None => "none",
            Policy::BestEffort => "best-effort",
            Policy::Restricted => "restricted",
            Policy::SingleNumaNode => "single-numa-node",
        }
    }
}

pub const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
pub const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: i64 = 8;

/// An option value as given by the caller (the kubelet's are strings; JSON gives typed values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionValue {
    Bool(bool),
    Int(i64),
    Str(String),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    pub prefer_closest_numa: bool,
    pub max_allowable_numa_nodes: i64,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            prefer_closest_numa: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl PolicyOptions {
    pub fn parse(entries: &[(String, OptionValue)]) -> CoreResult<Self> {
        let mut opts = PolicyOptions::default();
        for (name, value) in entries {
            let field = format!("options[{name:?}]");
            match name.as_str() {
                PREFER_CLOSEST_NUMA_NODES => {
                    opts.prefer_closest_numa = match value {
                        OptionValue::Bool(b) => *b,
                        OptionValue::Int(0) => false,
                        OptionValue::Int(1) => true,
                        OptionValue::Str(s) => parse_go_bool(s).ok_or_else(|| {
                            CoreError::new(&field, format!("{s:?} is not a boolean"))
                        })?,
                        OptionValue::Int(i) => {
                            return Err(CoreError::new(field, format!("{i} is not a boolean")))
                        }
                    }
                }
                MAX_ALLOWABLE_NUMA_NODES => {
                    let n = match value {
                        OptionValue::Int(i) => *i,
                        OptionValue::Str(s) => s.trim().parse::<i64>().map_err(|_| {
                            CoreError::new(&field, format!("{s:?} is not a base-10 integer"))
                        })?,
                        OptionValue::Bool(b) => {
                            return Err(CoreError::new(field, format!("{b} is not an integer")))
                        }
                    };
                    if n < DEFAULT_MAX_ALLOWABLE_NUMA_NODES {
                        return Err(CoreError::new(
                            field,
                            format!("the minimum value of {MAX_ALLOWABLE_NUMA_NODES} should not be less than {DEFAULT_MAX_ALLOWABLE_NUMA_NODES}, got {n}"),
                        ));
                    }
                    opts.max_allowable_numa_nodes = n;
                }
                other => {
                    return Err(CoreError::new(
                        field,
                        format!(
                            "unknown Topology Manager Policy option {other:?} (known: {PREFER_CLOSEST_NUMA_NODES:?}, {MAX_ALLOWABLE_NUMA_NODES:?})"
                        ),
                    ))
                }
            }
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(name: &str, v: OptionValue) -> Vec<(String, OptionValue)> {
        vec![(name.to_string(), v)]
    }

    #[test]
    fn options_parse_like_the_kubelet() {
        assert_eq!(PolicyOptions::parse(&[]).unwrap(), PolicyOptions::default());
        let t = PolicyOptions::parse(&opt(
            PREFER_CLOSEST_NUMA_NODES,
            OptionValue::Str("T".into()),
        ));
        assert!(t.unwrap().prefer_closest_numa);
        assert!(PolicyOptions::parse(&opt(
            PREFER_CLOSEST_NUMA_NODES,
            OptionValue::Str("yes".into())
        ))
        .is_err());
        let m = PolicyOptions::parse(&opt(
            MAX_ALLOWABLE_NUMA_NODES,
            OptionValue::Str("16".into()),
        ));
        assert_eq!(m.unwrap().max_allowable_numa_nodes, 16);
        let low = PolicyOptions::parse(&opt(MAX_ALLOWABLE_NUMA_NODES, OptionValue::Int(7)));
        assert!(low
            .unwrap_err()
            .message
            .contains("should not be less than 8"));
        let unknown = PolicyOptions::parse(&opt(
            "prefer-most-allocated-numa-node",
            OptionValue::Bool(true),
        ));
        assert!(unknown.unwrap_err().message.contains("unknown"));
        assert!(Policy::parse("strict")
            .unwrap_err()
            .message
            .contains("unknown policy"));
        assert_eq!(
            Policy::parse("single-numa-node").unwrap().name(),
            "single-numa-node"
        );
    }
}
