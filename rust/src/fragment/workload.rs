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
    /// The GPU sharing pool its GPUs must come from: the resource the scheduler matches it by
    /// ("" is `nvidia.com/gpu` as the NVIDIA device plugin serves it; `nvidia.com/gpu.shared`
    /// for renamed time-slicing/MPS replicas; `hami` for HAMi). Not checked for MIG shapes.
    pub gpu_pool: String,
    /// GPU memory per GPU (MiB) the shape needs (HAMi's `nvidia.com/gpumem`): on a node, its
    /// share is at least this fraction of the node's per-GPU memory. 0: none.
    pub gpu_memory_mib: u64,
    /// Its GPUs must share one link group of the node (an NVLink pair, an NVSwitch partition:
    /// `Node::links`); on a node that publishes no links, any GPUs do.
    pub link_group: bool,
    /// Of the node's RDMA resource (`Node::rdma`, the extended resource the controller is told
    /// meters RDMA): a node-level amount, like CPU but not per NUMA zone. 0: none.
    pub rdma: u64,
}

/// Everything about a shape but its weight: two shapes with equal keys are placed alike.
pub type ShapeKey = (
    u64,
    u64,
    u32,
    u32,
    Option<String>,
    Vec<String>,
    bool,
    bool,
    String,
    u64,
    bool,
    u64,
);

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
            self.gpu_pool.clone(),
            self.gpu_memory_mib,
            self.link_group,
            self.rdma,
        )
    }

    pub fn is_cpu_only(&self) -> bool {
        self.gpus == 0 && self.mig_profile.is_none()
    }

    /// Whether the shape's share depends on the node: a replica (one device-plugin unit per
    /// GPU: `gpu_milli` 0) or a memory request.
    pub fn is_node_relative(&self) -> bool {
        self.mig_profile.is_none()
            && self.gpus > 0
            && (self.gpu_milli == 0 || self.gpu_memory_mib > 0)
    }

    /// The per-GPU share (milli-GPU) the shape needs on a node whose GPUs are shared
    /// `replicas` ways (1: not shared) with `gpu_memory_mib` of memory each (0: unknown): a
    /// replica is `1000 / replicas` (rounded down); a memory request is its fraction of the
    /// GPU's memory (rounded up; a whole GPU when the memory is unknown), or `gpu_milli` if
    /// that is larger.
    pub fn share_on(&self, replicas: u32, gpu_memory_mib: u64) -> u32 {
        if self.gpu_memory_mib > 0 {
            let mem = if gpu_memory_mib == 0 {
                GPU_MILLI
            } else {
                let m =
                    (self.gpu_memory_mib.saturating_mul(GPU_MILLI as u64)).div_ceil(gpu_memory_mib);
                m.min(GPU_MILLI as u64) as u32
            };
            return mem.max(self.gpu_milli);
        }
        if self.gpu_milli == 0 {
            return GPU_MILLI / replicas.max(1);
        }
        self.gpu_milli
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
        } else if s.gpu_milli > GPU_MILLI {
            // 0: one replica (device-plugin unit) of each GPU, sized by the node
            return Err(CoreError::new(
                f("gpu_milli"),
                format!("must be in 0..=1000 when gpus >= 1, got {}", s.gpu_milli),
            ));
        }
        if s.gpu_memory_mib > 0 && (s.gpus == 0 || s.mig_profile.is_some()) {
            return Err(CoreError::new(
                f("gpu_memory_mib"),
                "only a shape asking for whole or shared GPUs (gpus >= 1, no MIG profile) can ask for GPU memory",
            ));
        }
    }
    for s in shapes.iter_mut() {
        s.weight /= total;
    }
    Ok(())
}
