//! The workload M: task shapes with weights summing to 1.

use crate::error::{CoreError, CoreResult};
use crate::mig::catalog::Catalog;

use super::model::GPU_MILLI;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shape {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// GPUs (devices) requested: 0 for CPU-only; 1 for a MIG shape.
    pub gpus: u32,
    /// Per-GPU share in milli-GPU (1000 = whole GPU); 0 for CPU-only and MIG shapes.
    pub gpu_milli: u32,
    /// The MIG profile name a MIG shape needs one free instance of.
    pub mig_profile: Option<String>,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
    pub weight: f64,
    /// Asked through a DRA ResourceClaim: only devices a DRA driver publishes serve it, and the
    /// kubelet's Topology Manager takes no part (admission is the claim's own constraints).
    pub dra: bool,
    /// A DRA claim whose devices must share a NUMA node (`matchAttribute` on
    /// `resource.kubernetes.io/numaNode`, or `pcieRoot` where zones are PCIe roots).
    pub numa_aligned: bool,
}

/// Everything about a shape but its weight: two shapes with equal keys are placed alike.
pub type ShapeKey = (u64, u64, u32, u32, Option<String>, Vec<String>, bool, bool);

impl Shape {
    /// The shape without its weight (a cache key).
    pub fn key(&self) -> ShapeKey {
        (
            self.cpu_milli,
            self.memory_mib,
            self.gpus,
            self.gpu_milli,
            self.mig_profile.clone(),
            self.gpu_models.clone(),
            self.dra,
            self.numa_aligned,
        )
    }

    pub fn is_cpu_only(&self) -> bool {
        self.gpus == 0 && self.mig_profile.is_none()
    }

    /// Whether a node with this GPU model may run the shape. Model names compare
    /// case-insensitively, and a name matches a model it is a suffix of
    /// ("A100-SXM4-40GB" matches "NVIDIA-A100-SXM4-40GB").
    pub fn allows_model(&self, model: &str) -> bool {
        self.gpu_models.is_empty() || self.allows_lowercase_model(&model.to_ascii_lowercase())
    }

    /// `allows_model` for a model name already in lower case (callers that check many shapes
    /// against one node lower-case its model once).
    pub fn allows_lowercase_model(&self, model_lc: &str) -> bool {
        self.gpu_models.is_empty()
            || self
                .gpu_models
                .iter()
                .any(|g| model_matches(model_lc, &g.to_ascii_lowercase()))
    }
}

/// Whether two lower-case model names name the same model: equal, or one is the other with a
/// vendor prefix ("nvidia-a100-sxm4-40gb" and "a100-sxm4-40gb").
fn model_matches(a: &str, b: &str) -> bool {
    let suffix = |long: &str, short: &str| {
        long.len() > short.len()
            && long.ends_with(short)
            && long.as_bytes()[long.len() - short.len() - 1] == b'-'
    };
    a == b || suffix(a, b) || suffix(b, a)
}

/// Validates shapes: non-negative amounts, a sane GPU request, a known MIG profile, weights that are
/// positive and finite. Weights are normalised to sum to 1 (a workload file may give counts).
pub fn validate_shapes(shapes: &mut [Shape]) -> CoreResult<()> {
    if shapes.is_empty() {
        return Err(CoreError::new(
            "shapes",
            "the workload needs at least one shape",
        ));
    }
    let mut total = 0.0;
    for (i, s) in shapes.iter().enumerate() {
        let f = |x: &str| format!("shapes[{i}].{x}");
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(CoreError::new(
                f("weight"),
                format!("must be positive, got {}", s.weight),
            ));
        }
        total += s.weight;
        if s.numa_aligned && !s.dra {
            return Err(CoreError::new(
                f("numa_aligned"),
                "only a DRA shape (dra: true) carries its own NUMA alignment",
            ));
        }
        if let Some(p) = &s.mig_profile {
            if s.gpus > 1 {
                return Err(CoreError::new(
                    f("gpus"),
                    "a MIG shape asks for one MIG instance (gpus 0 or 1)",
                ));
            }
            let cat = Catalog::builtin();
            let known = cat.models().iter().any(|m| {
                (s.gpu_models.is_empty() || s.allows_model(&m.name)) && m.profile_index(p).is_ok()
            });
            if !known {
                return Err(CoreError::new(
                    f("mig_profile"),
                    format!(
                        "unknown MIG profile {p:?} (no known GPU model{} has it)",
                        if s.gpu_models.is_empty() {
                            ""
                        } else {
                            " of gpu_models"
                        }
                    ),
                ));
            }
        } else if s.gpus == 0 {
            if s.gpu_milli != 0 {
                return Err(CoreError::new(
                    f("gpu_milli"),
                    "a CPU-only shape (gpus 0) must have gpu_milli 0",
                ));
            }
        } else {
            if s.gpu_milli == 0 || s.gpu_milli > GPU_MILLI {
                return Err(CoreError::new(
                    f("gpu_milli"),
                    format!("must be in 1..=1000 when gpus >= 1, got {}", s.gpu_milli),
                ));
            }
            if s.gpu_milli < GPU_MILLI && s.gpus > 1 {
                return Err(CoreError::new(
                    f("gpu_milli"),
                    "a share below 1000 is only allowed with gpus 1",
                ));
            }
        }
    }
    for s in shapes.iter_mut() {
        s.weight /= total;
    }
    Ok(())
}
