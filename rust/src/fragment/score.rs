//! Per-NUMA fragmentation scoring: how much idle GPU capacity each task shape of the workload
//! could not use on each node, under the node's Topology Manager policy, and why.
//!
//! The contract is issue 3 (README, "Fragmentation"): FGD's F_n(m) (Weng et al., ATC '23) with
//! admission decided as the kubelet's Topology Manager would, and MIG instances usable only by a
//! shape asking for exactly their profile. Under policy `none`, on a node without MIG, the GPU
//! fragment is exactly FGD's.

use std::borrow::Cow;
use std::collections::HashMap;

use super::model::{Cluster, LinkLevel, MigGpu, Node, Zone, GPU_MILLI};
use super::workload::Shape;
use crate::mig::catalog::{Catalog, GpuModel, Placement};
use crate::mig::placement::place;
use crate::topology::Policy;

/// Why idle capacity is stranded for a shape (FGD's quadrants plus NUMA and MIG).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Category {
    /// Neither enough GPUs nor enough CPU/memory on the node (FGD Q1).
    LackBoth = 0,
    /// Not enough GPUs with the share the shape needs (FGD Q2).
    LackGpu = 1,
    /// Enough GPUs, not enough CPU, memory or RDMA (FGD Q4, and XR for CPU-only shapes).
    LackCpu = 2,
    /// The node's GPU model is not one the shape accepts.
    NoAccess = 3,
    /// The shape fits, but this GPU's free share is below what it needs (FGD Q3), or the shape
    /// uses no GPU at all (FGD XL).
    Stranded = 4,
    /// The shape fits node-wide, but the Topology Manager cannot admit it with this GPU
    /// (no NUMA-aligned placement uses it).
    NumaSplit = 5,
    /// MIG capacity of the wrong kind: instances of another profile, unpartitioned slices, or
    /// whole GPUs for a MIG shape and MIG instances for a whole-GPU shape.
    MigGeometry = 6,
    /// The shape needs its GPUs in one link group (`Shape::link_group`), and this GPU's group
    /// lacks room: too few usable GPUs in it.
    LinkSplit = 7,
}

pub const CATEGORY_COUNT: usize = 8;
pub const CATEGORY_NAMES: [&str; CATEGORY_COUNT] = [
    "lack_both",
    "lack_gpu",
    "lack_cpu",
    "no_access",
    "stranded",
    "numa_split",
    "mig_geometry",
    "link_split",
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ZoneScore {
    pub numa: u32,
    pub idle_gpu_milli: f64,
    pub fragment_gpu_milli: f64,
    pub idle_mig_slices: f64,
    pub fragment_mig_slices: f64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeScore {
    pub idle_gpu_milli: f64,
    pub fragment_gpu_milli: f64,
    /// Weighted fragment milli-GPU by category (sums to `fragment_gpu_milli`).
    pub categories: [f64; CATEGORY_COUNT],
    pub idle_mig_slices: f64,
    pub fragment_mig_slices: f64,
    /// Weighted fragment MIG compute slices by category (sums to `fragment_mig_slices`).
    pub mig_categories: [f64; CATEGORY_COUNT],
    /// Idle compute slices that are fragment now and that re-partitioning only the free slices
    /// (used instances stay where they are) could turn into instances of profiles M wants.
    pub recoverable_mig_slices: f64,
    pub zones: Vec<ZoneScore>,
}

/// Whether `shape` may use the node's GPUs at all: its GPU model is allowed and, for a whole or
/// shared GPU shape, the node's GPUs are in the shape's sharing pool.
pub fn allows_node(shape: &Shape, node: &Node) -> bool {
    (shape.mig_profile.is_some() || shape.dra || shape.gpu_pool == node.gpu_pool)
        && shape.allows_model(&node.gpu_model)
}

/// The shape with the share it needs on this node (replicas and memory requests depend on the
/// node: `Shape::share_on`); other shapes as they are.
pub fn on_node<'a>(shape: &'a Shape, node: &Node) -> Cow<'a, Shape> {
    if shape.is_node_relative() {
        let mut s = shape.clone();
        s.gpu_milli = shape.share_on(node.gpu_replicas, node.gpu_memory_mib);
        s.gpu_memory_mib = 0;
        Cow::Owned(s)
    } else {
        Cow::Borrowed(shape)
    }
}

/// A shape as seen on one node: which MIG profile index (if any) it needs on this node's model.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MigNeed {
    /// A whole/shared GPU shape or a CPU-only shape.
    None,
    /// A MIG shape whose profile exists on this node's model, at this index.
    Profile(usize),
    /// A MIG shape whose profile this node cannot have (no MIG, or another model).
    Unavailable,
}

pub fn mig_need(node: &Node, shape: &Shape) -> MigNeed {
    match &shape.mig_profile {
        None => MigNeed::None,
        Some(p) => match node.mig_model {
            None => MigNeed::Unavailable,
            Some(mi) => match Catalog::builtin().models()[mi].profile_index(p) {
                Ok(i) => MigNeed::Profile(i),
                Err(_) => MigNeed::Unavailable,
            },
        },
    }
}

/// Capacities of one resource per zone, largest first, as running sums: the narrowest number of
/// zones that can hold a request by capacity is the first k whose sum reaches it.
#[derive(Clone, Debug, Default)]
struct CapacityPrefix(Vec<u64>);

impl CapacityPrefix {
    fn new(caps: &[u64]) -> Self {
        let mut sorted = caps.to_vec();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut sum = 0u64;
        CapacityPrefix(
            sorted
                .into_iter()
                .map(|c| {
                    sum = sum.saturating_add(c);
                    sum
                })
                .collect(),
        )
    }

    fn narrowest(&self, req: u64) -> Option<u32> {
        self.0.iter().position(|&s| s >= req).map(|k| k as u32 + 1)
    }
}

/// Node facts that do not depend on the shape, computed once per node.
pub struct NodeCtx<'a> {
    pub node: &'a Node,
    zones: usize,
    cpu_free_total: u64,
    mem_free_total: u64,
    cpu_free: [u64; 64],
    mem_free: [u64; 64],
    gpu_count: [u64; 64],
    gpu_prefix: CapacityPrefix,
    cpu_prefix: CapacityPrefix,
    mem_prefix: CapacityPrefix,
    zone_idle_gpu: [f64; 64],
    zone_idle_mig: [f64; 64],
    model_lc: String,
    /// Some device of the node comes from a DRA driver.
    has_dra: bool,
}

impl<'a> NodeCtx<'a> {
    pub fn new(node: &'a Node) -> Self {
        let zones = node.zones.len().min(64);
        let mut c = NodeCtx {
            node,
            zones,
            cpu_free_total: 0,
            mem_free_total: 0,
            cpu_free: [0; 64],
            mem_free: [0; 64],
            gpu_count: [0; 64],
            gpu_prefix: CapacityPrefix::default(),
            cpu_prefix: CapacityPrefix::default(),
            mem_prefix: CapacityPrefix::default(),
            zone_idle_gpu: [0.0; 64],
            zone_idle_mig: [0.0; 64],
            model_lc: node.gpu_model.to_ascii_lowercase(),
            has_dra: node_has_dra(node),
        };
        let mut cpu_cap = [0u64; 64];
        let mut mem_cap = [0u64; 64];
        for (zi, z) in node.zones.iter().take(64).enumerate() {
            c.cpu_free[zi] = z.cpu_free;
            c.mem_free[zi] = z.memory_free;
            c.cpu_free_total += z.cpu_free;
            c.mem_free_total += z.memory_free;
            cpu_cap[zi] = z.cpu_milli;
            mem_cap[zi] = z.memory_mib;
            c.gpu_count[zi] = z.gpus.len() as u64;
            c.zone_idle_gpu[zi] = z.idle_gpu_milli() as f64;
            c.zone_idle_mig[zi] = z.idle_mig_slices() as f64;
        }
        c.gpu_prefix = CapacityPrefix::new(&c.gpu_count[..zones]);
        c.cpu_prefix = CapacityPrefix::new(&cpu_cap[..zones]);
        c.mem_prefix = CapacityPrefix::new(&mem_cap[..zones]);
        c
    }

    fn allows(&self, shape: &Shape) -> bool {
        (shape.mig_profile.is_some() || shape.gpu_pool == self.node.gpu_pool)
            && shape.allows_lowercase_model(&self.model_lc)
    }
}

/// Whether and where the Topology Manager could admit a shape on a node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Why the shape cannot be admitted at all, if it cannot.
    pub fail: Option<Category>,
    /// Bit i: the node's i-th zone is part of some admissible placement.
    pub usable: u64,
}

/// The node's MIG model (catalog entry), when it has MIG GPUs.
pub fn node_model(node: &Node) -> Option<&'static GpuModel> {
    node.mig_model.map(|mi| &Catalog::builtin().models()[mi])
}

/// The placements of profile `p` that can be allocated now on a dynamic GPU, earliest end first:
/// within its free memory slices, with enough free compute slices and under the profile's
/// per-GPU limit.
pub fn dynamic_placements(model: &GpuModel, p: usize, g: &MigGpu) -> Vec<Placement> {
    let prof = &model.profiles[p];
    let used = g.instances.iter().filter(|i| i.profile == p).count();
    if used >= prof.max_count as usize || prof.compute_slices > g.unpartitioned_slices {
        return Vec::new();
    }
    let mut out: Vec<Placement> = prof
        .placements
        .iter()
        .copied()
        .filter(|pl| pl.mask() & !g.free_mask == 0)
        .collect();
    out.sort_by_key(|pl| (pl.start + pl.size, pl.start));
    out
}

/// How many instances of profile `p` a dynamic GPU could hold at once now: disjoint placements
/// within its free memory slices (interval scheduling, earliest end first, is optimal for
/// intervals), bounded by its free compute slices and the profile's per-GPU limit.
pub fn dynamic_fit(model: &GpuModel, p: usize, g: &MigGpu) -> u64 {
    let prof = &model.profiles[p];
    let used = g.instances.iter().filter(|i| i.profile == p).count() as u64;
    let by_count = (prof.max_count as u64).saturating_sub(used);
    let by_compute = if prof.compute_slices == 0 {
        u64::MAX
    } else {
        g.unpartitioned_slices as u64 / prof.compute_slices as u64
    };
    let limit = by_count.min(by_compute);
    let mut taken = 0u16;
    let mut k = 0u64;
    for pl in dynamic_placements(model, p, g) {
        if k >= limit {
            break;
        }
        if pl.mask() & taken == 0 {
            taken |= pl.mask();
            k += 1;
        }
    }
    k
}

/// Whether a whole-GPU DRA shape could take this dynamic GPU as a whole (the driver's full
/// device consumes every counter, so only while no partition is allocated).
fn dynamic_whole(shape: &Shape, g: &MigGpu) -> bool {
    shape.dra && g.dra && g.dynamic && shape.gpu_milli == GPU_MILLI && g.instances.is_empty()
}

/// Per-zone eligible devices for a shape (whole/shared GPUs with enough free share, or free
/// instances of the MIG profile), and how many devices it needs. Capacities are the zones' GPU
/// counts, or their instance counts of the profile. Only devices of the shape's source (DRA or
/// the device plugin) count; for a DRA shape, dynamic MIG GPUs count by what they can still
/// allocate (a whole GPU while nothing is allocated on it, or placements of the profile).
pub fn device_view(node: &Node, shape: &Shape, need: MigNeed) -> ([u64; 64], [u64; 64], u64) {
    let mut elig = [0u64; 64];
    let mut cap = [0u64; 64];
    let d: u64;
    match need {
        MigNeed::None => {
            d = shape.gpus as u64;
            for (zi, z) in node.zones.iter().take(64).enumerate() {
                let list = z.gpus_of(shape.dra);
                cap[zi] = list.len() as u64;
                elig[zi] = list.iter().filter(|&&(_, f)| f >= shape.gpu_milli).count() as u64;
                if shape.dra {
                    for g in z.mig.iter().filter(|g| g.dra && g.dynamic) {
                        cap[zi] += 1;
                        elig[zi] += dynamic_whole(shape, g) as u64;
                    }
                }
            }
        }
        MigNeed::Profile(p) => {
            d = 1;
            let model = node_model(node);
            for (zi, z) in node.zones.iter().take(64).enumerate() {
                for g in z.mig.iter().filter(|g| g.dra == shape.dra) {
                    if g.dynamic {
                        if let Some(m) = model {
                            let k = dynamic_fit(m, p, g);
                            cap[zi] += k;
                            elig[zi] += k;
                        }
                        continue;
                    }
                    for i in g.instances.iter().filter(|i| i.profile == p) {
                        cap[zi] += 1;
                        elig[zi] += (!i.used) as u64;
                    }
                }
            }
        }
        MigNeed::Unavailable => d = 1,
    }
    (elig, cap, d)
}

/// Sum of `free` over the zones of `mask`.
fn sum_over(free: &[u64; 64], mask: u64) -> u64 {
    let mut sum = 0u64;
    let mut m = mask;
    while m != 0 {
        sum += free[m.trailing_zeros() as usize];
        m &= m - 1;
    }
    sum
}

/// Which of the kubelet's resource managers take part in the Topology Manager's alignment for
/// a shape on a node (the device managers always do).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Providers {
    /// The static CPU manager, for a request of whole CPUs.
    pub cpu: bool,
    /// The static memory manager, for a request with memory.
    pub mem: bool,
}

impl Providers {
    pub(crate) fn of(node: &Node, shape: &Shape) -> Self {
        Providers {
            cpu: node.cpu_static && shape.cpu_milli > 0 && shape.cpu_milli % 1000 == 0,
            mem: node.memory_static && shape.memory_mib > 0,
        }
    }
}

impl Admission {
    /// Admitted where `usable` says, or refused as NUMA split when no zone is usable.
    fn of_usable(usable: u64) -> Self {
        if usable == 0 {
            Admission {
                fail: Some(Category::NumaSplit),
                usable: 0,
            }
        } else {
            Admission { fail: None, usable }
        }
    }
}

/// The mask of a node's `zones` zones.
fn all_zones_mask(zones: usize) -> u64 {
    if zones >= 64 {
        u64::MAX
    } else {
        (1u64 << zones) - 1
    }
}

/// Why a shape cannot be admitted for lack of devices or of CPU/memory, if it cannot.
fn lack(gpu_ok: bool, cpu_ok: bool) -> Option<Category> {
    match (gpu_ok, cpu_ok) {
        (false, false) => Some(Category::LackBoth),
        (false, true) => Some(Category::LackGpu),
        (true, false) => Some(Category::LackCpu),
        (true, true) => None,
    }
}

/// Admission of a GPU or MIG shape (not CPU-only, model allowed), given the eligible devices.
fn admit(
    ctx: &NodeCtx<'_>,
    shape: &Shape,
    need: MigNeed,
    elig: &[u64; 64],
    d: u64,
    cpu_ok: bool,
) -> Admission {
    let zones = ctx.zones;
    let gpu_ok = elig[..zones].iter().sum::<u64>() >= d;
    let fail = lack(gpu_ok, cpu_ok);
    if fail.is_some() {
        return Admission { fail, usable: 0 };
    }
    let all_zones = all_zones_mask(zones);
    if shape.dra {
        return dra_admission(shape, elig, zones, d, all_zones);
    }
    let policy = ctx.node.policy;
    if matches!(policy, Policy::None | Policy::BestEffort) {
        return Admission {
            fail: None,
            usable: all_zones,
        };
    }
    let prov = Providers::of(ctx.node, shape);
    let usable = match aligned_width(ctx, shape, need, d, prov) {
        None => 0,
        Some(w) if policy == Policy::SingleNumaNode && w != 1 => 0,
        Some(w) if w as usize > zones => 0,
        Some(w) => fitting_sets(ctx, shape, elig, d, w, prov, all_zones),
    };
    Admission::of_usable(usable)
}

/// Admission of a DRA shape: the kubelet's Topology Manager does not see DRA devices, so the
/// claim's own constraint decides (all its devices on one NUMA node, or anywhere).
fn dra_admission(
    shape: &Shape,
    elig: &[u64; 64],
    zones: usize,
    d: u64,
    all_zones: u64,
) -> Admission {
    if !shape.numa_aligned || d <= 1 {
        return Admission {
            fail: None,
            usable: all_zones,
        };
    }
    let mut usable = 0u64;
    for (zi, &e) in elig.iter().enumerate().take(zones) {
        if e >= d {
            usable |= 1 << zi;
        }
    }
    Admission::of_usable(usable)
}

/// The narrowest number of zones every provider could serve the shape from (by capacity), or
/// None when the providers disagree: the width of the kubelet's preferred merged hint.
fn aligned_width(
    ctx: &NodeCtx<'_>,
    shape: &Shape,
    need: MigNeed,
    d: u64,
    prov: Providers,
) -> Option<u32> {
    let dev_width = match need {
        MigNeed::None => ctx.gpu_prefix.narrowest(d),
        _ => {
            let (_, cap, _) = device_view(ctx.node, shape, need);
            CapacityPrefix::new(&cap[..ctx.zones]).narrowest(d)
        }
    };
    let mut width = dev_width;
    for (on, w) in [
        (prov.cpu, ctx.cpu_prefix.narrowest(shape.cpu_milli)),
        (prov.mem, ctx.mem_prefix.narrowest(shape.memory_mib)),
    ] {
        if on && w != width {
            width = None;
        }
    }
    width
}

/// The union of every set of `w` zones that holds the shape now (its devices, and its CPUs and
/// memory where their managers align): the zones some admissible placement uses.
fn fitting_sets(
    ctx: &NodeCtx<'_>,
    shape: &Shape,
    elig: &[u64; 64],
    d: u64,
    w: u32,
    prov: Providers,
    all_zones: u64,
) -> u64 {
    let fits = |mask: u64| {
        sum_over(elig, mask) >= d
            && (!prov.cpu || sum_over(&ctx.cpu_free, mask) >= shape.cpu_milli)
            && (!prov.mem || sum_over(&ctx.mem_free, mask) >= shape.memory_mib)
    };
    let mut union = 0u64;
    let mut mask: u64 = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
    // every mask of `w` bits among the node's zones (Gosper's hack)
    while mask & !all_zones == 0 {
        if mask & !union != 0 && fits(mask) {
            union |= mask;
        }
        let c = mask & mask.wrapping_neg();
        let r = mask.wrapping_add(c);
        if r == 0 {
            break;
        }
        mask = (((r ^ mask) >> 2) / c) | r;
    }
    union
}

/// Admission of a shape on a node (for callers outside the scoring loop; the shape as resolved
/// by `on_node`).
pub fn admission(node: &Node, shape: &Shape, need: MigNeed, cpu_ok: bool) -> Admission {
    let ctx = NodeCtx::new(node);
    let (elig, _, d) = device_view(node, shape, need);
    admit(&ctx, shape, need, &elig, d, cpu_ok)
}

/// Accumulates one shape's weighted fragment into a node score.
struct Acc<'a> {
    score: &'a mut NodeScore,
    w: f64,
}

impl Acc<'_> {
    fn gpu(&mut self, zone: usize, milli: f64, cat: Category) {
        let v = self.w * milli;
        self.score.fragment_gpu_milli += v;
        self.score.categories[cat as usize] += v;
        self.score.zones[zone].fragment_gpu_milli += v;
    }
    fn mig(&mut self, zone: usize, slices: f64, cat: Category) {
        let v = self.w * slices;
        self.score.fragment_mig_slices += v;
        self.score.mig_categories[cat as usize] += v;
        self.score.zones[zone].fragment_mig_slices += v;
    }
    /// Everything idle on the node is fragment, for one reason.
    fn all(&mut self, ctx: &NodeCtx<'_>, cat: Category) {
        for zi in 0..ctx.zones {
            if ctx.zone_idle_gpu[zi] > 0.0 {
                self.gpu(zi, ctx.zone_idle_gpu[zi], cat);
            }
            if ctx.zone_idle_mig[zi] > 0.0 {
                self.mig(zi, ctx.zone_idle_mig[zi], cat);
            }
        }
    }
}

/// Adds `weight` x F_n(shape) to `score` (which must have been initialised for the node).
pub fn add_shape_fragment(
    ctx: &NodeCtx<'_>,
    shape: &Shape,
    need: MigNeed,
    weight: f64,
    score: &mut NodeScore,
) {
    let node = ctx.node;
    let mut acc = Acc { score, w: weight };
    let cpu_ok = ctx.cpu_free_total >= shape.cpu_milli
        && ctx.mem_free_total >= shape.memory_mib
        && node.rdma_free >= shape.rdma;
    if shape.is_cpu_only() {
        acc.all(
            ctx,
            if cpu_ok {
                Category::Stranded
            } else {
                Category::LackCpu
            },
        );
        return;
    }
    if !ctx.allows(shape) {
        acc.all(ctx, Category::NoAccess);
        return;
    }
    let plain = !shape.dra && !ctx.has_dra;
    let (elig, d) = match need {
        MigNeed::None if plain => {
            let mut elig = [0u64; 64];
            for (zi, z) in node.zones.iter().take(64).enumerate() {
                elig[zi] = z
                    .gpus
                    .iter()
                    .filter(|&&(_, f)| f >= shape.gpu_milli)
                    .count() as u64;
            }
            (elig, shape.gpus as u64)
        }
        _ => {
            let (elig, _, d) = device_view(node, shape, need);
            (elig, d)
        }
    };
    let Admission { fail, usable } = admit(ctx, shape, need, &elig, d, cpu_ok);
    // Idle capacity of the kind the shape cannot use at all.
    let other = if cpu_ok {
        Category::MigGeometry
    } else {
        fail.unwrap_or(Category::LackCpu)
    };
    if plain {
        plain_zones(ctx, shape, need, fail, usable, other, &mut acc);
    } else {
        // Capacity of the other allocation mechanism (DRA vs the device plugin).
        let foreign = if cpu_ok {
            Category::NoAccess
        } else {
            fail.unwrap_or(Category::LackCpu)
        };
        let view = DraView {
            shape,
            need,
            rooms: link_rooms(node, shape, need, fail, usable),
            model: node_model(node),
            fail,
            other,
            foreign,
        };
        dra_zones(ctx, &view, usable, &mut acc);
    }
}

/// Whether any device of the node comes from a DRA driver.
pub fn node_has_dra(node: &Node) -> bool {
    node.zones
        .iter()
        .any(|z| !z.dra_gpus.is_empty() || z.mig.iter().any(|g| g.dra))
}

/// The fragment of a shape on a node without DRA devices (the device plugin's GPUs and MIG).
fn plain_zones(
    ctx: &NodeCtx<'_>,
    shape: &Shape,
    need: MigNeed,
    fail: Option<Category>,
    usable: u64,
    other: Category,
    acc: &mut Acc<'_>,
) {
    let node = ctx.node;
    let rooms = link_rooms(node, shape, need, fail, usable);
    for (zi, z) in node.zones.iter().take(64).enumerate() {
        let in_u = usable & (1u64 << zi) != 0;
        match need {
            MigNeed::None => {
                for &(id, f) in &z.gpus {
                    if f == 0 {
                        continue;
                    }
                    let cat = if let Some(c) = fail {
                        c
                    } else if f < shape.gpu_milli {
                        Category::Stranded
                    } else if !in_u {
                        Category::NumaSplit
                    } else if lacks_room(&rooms, id, shape.gpus) {
                        Category::LinkSplit
                    } else {
                        continue;
                    };
                    acc.gpu(zi, f as f64, cat);
                }
                if ctx.zone_idle_mig[zi] > 0.0 {
                    acc.mig(zi, ctx.zone_idle_mig[zi], other);
                }
            }
            MigNeed::Profile(_) | MigNeed::Unavailable => {
                if ctx.zone_idle_gpu[zi] > 0.0 {
                    acc.gpu(zi, ctx.zone_idle_gpu[zi], other);
                }
                for g in &z.mig {
                    if g.unpartitioned_slices > 0 {
                        acc.mig(zi, g.unpartitioned_slices as f64, other);
                    }
                    for i in g.instances.iter().filter(|i| !i.used) {
                        let cat = if MigNeed::Profile(i.profile) != need {
                            other
                        } else if let Some(c) = fail {
                            c
                        } else if !in_u {
                            Category::NumaSplit
                        } else {
                            continue;
                        };
                        acc.mig(zi, i.compute_slices as f64, cat);
                    }
                }
            }
        }
    }
}

/// The level of link groups a shape that needs its GPUs in one group uses on `node`
/// (`Node::link_level`); None: no constraint (the shape does not ask, asks one GPU, is a MIG
/// shape, or the node publishes no level for it).
pub(crate) fn link_level<'a>(
    node: &'a Node,
    shape: &Shape,
    need: MigNeed,
) -> Option<&'a LinkLevel> {
    if !shape.link_group || shape.gpus < 2 || need != MigNeed::None {
        return None;
    }
    node.link_level(shape.dra, shape.gpus)
}

/// The usable GPUs of each link group at a shape's level: a GPU of the shape's source is
/// usable when it has the shape's share and its zone is one the shape is admitted in.
struct Rooms<'a> {
    level: &'a LinkLevel,
    /// The group of each usable GPU, sorted.
    groups: Vec<u32>,
}

impl Rooms<'_> {
    /// Whether GPU `id`'s group has fewer than `want` usable GPUs.
    fn lacks(&self, id: u32, want: u32) -> bool {
        let g = self.level.group_of(id);
        let from = self.groups.partition_point(|&x| x < g);
        let to = self.groups.partition_point(|&x| x <= g);
        ((to - from) as u64) < want as u64
    }
}

/// The rooms of a shape that needs one link group (None: no constraint, or the shape is not
/// admitted at all).
fn link_rooms<'a>(
    node: &'a Node,
    shape: &Shape,
    need: MigNeed,
    fail: Option<Category>,
    usable: u64,
) -> Option<Rooms<'a>> {
    if fail.is_some() {
        return None;
    }
    let level = link_level(node, shape, need)?;
    let mut groups = Vec::new();
    for (zi, z) in node.zones.iter().take(64).enumerate() {
        if usable & (1u64 << zi) == 0 {
            continue;
        }
        for &(id, f) in z.gpus_of(shape.dra) {
            if f >= shape.gpu_milli && f > 0 {
                groups.push(level.group_of(id));
            }
        }
    }
    groups.sort_unstable();
    Some(Rooms { level, groups })
}

/// Whether GPU `id` lacks room in its link group (`rooms`; None is no constraint).
fn lacks_room(rooms: &Option<Rooms<'_>>, id: u32, want: u32) -> bool {
    rooms.as_ref().is_some_and(|r| r.lacks(id, want))
}

/// One shape's view of a node with DRA devices: why each kind of idle capacity is fragment.
struct DraView<'a> {
    shape: &'a Shape,
    need: MigNeed,
    /// The shape's link groups with room, when it needs one group.
    rooms: Option<Rooms<'a>>,
    model: Option<&'static GpuModel>,
    /// Why the shape cannot be admitted at all, if it cannot.
    fail: Option<Category>,
    /// The reason for capacity of a kind the shape cannot use (MIG for a GPU shape, ...).
    other: Category,
    /// The reason for capacity of the other allocation mechanism (DRA vs the device plugin).
    foreign: Category,
}

impl DraView<'_> {
    /// Why capacity the shape could use is fragment (`fail`, or NUMA split outside the usable
    /// zones); None when it is not fragment.
    fn unusable(&self, in_u: bool) -> Option<Category> {
        if let Some(c) = self.fail {
            Some(c)
        } else if !in_u {
            Some(Category::NumaSplit)
        } else {
            None
        }
    }

    /// Whole/shared GPUs of both sources in one zone.
    fn whole_gpus(&self, zi: usize, in_u: bool, z: &Zone, acc: &mut Acc<'_>) {
        for (dra, list) in [(false, &z.gpus), (true, &z.dra_gpus)] {
            for &(id, f) in list {
                if f == 0 {
                    continue;
                }
                let cat = if dra != self.shape.dra {
                    self.foreign
                } else if self.need != MigNeed::None {
                    self.other
                } else if let Some(c) = self.fail {
                    c
                } else if f < self.shape.gpu_milli {
                    Category::Stranded
                } else if !in_u {
                    Category::NumaSplit
                } else if lacks_room(&self.rooms, id, self.shape.gpus) {
                    Category::LinkSplit
                } else {
                    continue;
                };
                acc.gpu(zi, f as f64, cat);
            }
        }
    }

    /// One MIG GPU: of the other source, foreign; dynamic, what the shape could allocate on it
    /// now; else its free instances by profile and its unpartitioned slices.
    fn mig_gpu(&self, zi: usize, in_u: bool, g: &MigGpu, acc: &mut Acc<'_>) {
        let idle = g.idle_slices();
        if g.dra != self.shape.dra {
            if idle > 0 {
                acc.mig(zi, idle as f64, self.foreign);
            }
            return;
        }
        if g.dynamic {
            self.dynamic_gpu(zi, in_u, g, idle, acc);
            return;
        }
        if g.unpartitioned_slices > 0 {
            acc.mig(zi, g.unpartitioned_slices as f64, self.other);
        }
        for i in g.instances.iter().filter(|i| !i.used) {
            let cat = if MigNeed::Profile(i.profile) != self.need {
                self.other
            } else if let Some(c) = self.unusable(in_u) {
                c
            } else {
                continue;
            };
            acc.mig(zi, i.compute_slices as f64, cat);
        }
    }

    /// A dynamic MIG GPU with `idle` compute slices: the slices placements of the shape's
    /// profile (or the whole GPU) would cover are usable, the rest is fragment.
    fn dynamic_gpu(&self, zi: usize, in_u: bool, g: &MigGpu, idle: u64, acc: &mut Acc<'_>) {
        match (self.need, self.model) {
            (MigNeed::Profile(p), Some(m)) => {
                let per = m.profiles.get(p).map_or(0, |pr| pr.compute_slices as u64);
                let fit = (dynamic_fit(m, p, g) * per).min(idle);
                if idle > fit {
                    acc.mig(zi, (idle - fit) as f64, self.other);
                }
                if fit > 0 {
                    if let Some(c) = self.unusable(in_u) {
                        acc.mig(zi, fit as f64, c);
                    }
                }
            }
            (MigNeed::None, _) if dynamic_whole(self.shape, g) => {
                // under a level of link groups the GPU is a group of its own (no level lists
                // a MIG GPU): no room for a shape of several GPUs
                let cat = self
                    .unusable(in_u)
                    .or(self.rooms.as_ref().map(|_| Category::LinkSplit));
                if let (true, Some(c)) = (idle > 0, cat) {
                    acc.mig(zi, idle as f64, c);
                }
            }
            _ => {
                if idle > 0 {
                    acc.mig(zi, idle as f64, self.other);
                }
            }
        }
    }
}

/// The fragment of a shape on a node with DRA devices: capacity of the other source is
/// `foreign`; dynamic MIG GPUs count what the shape could allocate on them now.
fn dra_zones(ctx: &NodeCtx<'_>, view: &DraView<'_>, usable: u64, acc: &mut Acc<'_>) {
    for (zi, z) in ctx.node.zones.iter().take(64).enumerate() {
        let in_u = usable & (1u64 << zi) != 0;
        view.whole_gpus(zi, in_u, z, acc);
        for g in &z.mig {
            view.mig_gpu(zi, in_u, g, acc);
        }
    }
}

/// An empty score for a node: idle amounts filled in, no fragment yet.
pub fn empty_score(node: &Node) -> NodeScore {
    let zones: Vec<ZoneScore> = node
        .zones
        .iter()
        .map(|z| ZoneScore {
            numa: z.numa,
            idle_gpu_milli: z.idle_gpu_milli() as f64,
            fragment_gpu_milli: 0.0,
            idle_mig_slices: z.idle_mig_slices() as f64,
            fragment_mig_slices: 0.0,
        })
        .collect();
    NodeScore {
        idle_gpu_milli: zones.iter().map(|z| z.idle_gpu_milli).sum(),
        idle_mig_slices: zones.iter().map(|z| z.idle_mig_slices).sum(),
        zones,
        ..NodeScore::default()
    }
}

/// Memo of the best re-partition coverage per (model, used instances kept, wanted profiles).
pub type RecoverMemo = HashMap<(usize, Vec<(usize, u8)>, u64), u64>;

/// Largest number of compute slices that instances of `wanted` profiles can cover on a GPU whose
/// `pinned` (used) instances stay where they are.
fn best_cover(model: &GpuModel, pinned: &[(usize, u8)], wanted: &[usize]) -> u64 {
    struct Search<'a> {
        model: &'a GpuModel,
        pinned: &'a [(usize, u8)],
        wanted: &'a [usize],
        chosen: Vec<usize>,
        best: u64,
    }
    impl Search<'_> {
        fn dfs(&mut self, from: usize, room: u64, sum: u64) {
            self.best = self.best.max(sum);
            for k in from..self.wanted.len() {
                let p = self.wanted[k];
                let c = self.model.profiles[p].compute_slices as u64;
                if c == 0 || c > room {
                    continue;
                }
                self.chosen.push(p);
                if place(self.model, self.pinned, &self.chosen).is_some() {
                    self.dfs(k, room - c, sum + c);
                }
                self.chosen.pop();
            }
        }
    }
    let used: u64 = pinned
        .iter()
        .map(|&(p, _)| model.profiles[p].compute_slices as u64)
        .sum();
    let room = (model.compute_slices as u64).saturating_sub(used);
    let mut s = Search {
        model,
        pinned,
        wanted,
        chosen: Vec::new(),
        best: 0,
    };
    s.dfs(0, room, 0);
    s.best
}

/// Recoverable MIG slices of a node for the set of wanted profile indices (bit i = profile i).
pub fn recoverable_slices(node: &Node, wanted_mask: u64, memo: &mut RecoverMemo) -> f64 {
    let Some(mi) = node.mig_model else { return 0.0 };
    if wanted_mask == 0 {
        return 0.0;
    }
    let model = &Catalog::builtin().models()[mi];
    let wanted: Vec<usize> = (0..model.profiles.len())
        .filter(|&p| p < 64 && wanted_mask & (1 << p) != 0)
        .collect();
    let mut total = 0u64;
    for z in &node.zones {
        for g in z.mig.iter().filter(|g| !g.dynamic) {
            let mut pinned: Vec<(usize, u8)> = g
                .instances
                .iter()
                .filter(|i| i.used)
                .map(|i| (i.profile, i.start))
                .collect();
            pinned.sort_unstable();
            let usable_now: u64 = g
                .instances
                .iter()
                .filter(|i| !i.used && i.profile < 64 && wanted_mask & (1 << i.profile) != 0)
                .map(|i| i.compute_slices as u64)
                .sum();
            let key = (mi, pinned, wanted_mask);
            let cover = match memo.get(&key) {
                Some(&c) => c,
                None => {
                    let c = best_cover(model, &key.1, &wanted);
                    memo.insert(key, c);
                    c
                }
            };
            total += cover.saturating_sub(usable_now);
        }
    }
    total as f64
}

/// Scores every node against the workload.
pub fn score_cluster(cluster: &Cluster, shapes: &[Shape]) -> Vec<NodeScore> {
    let mut memo = RecoverMemo::new();
    cluster
        .nodes
        .iter()
        .map(|n| score_node(n, shapes, &mut memo))
        .collect()
}

pub fn score_node(node: &Node, shapes: &[Shape], memo: &mut RecoverMemo) -> NodeScore {
    let ctx = NodeCtx::new(node);
    let mut score = empty_score(node);
    let mut wanted = 0u64;
    for s in shapes {
        let s = on_node(s, node);
        let need = mig_need(node, &s);
        if let MigNeed::Profile(p) = need {
            if p < 64 && ctx.allows(&s) {
                wanted |= 1 << p;
            }
        }
        add_shape_fragment(&ctx, &s, need, s.weight, &mut score);
    }
    score.recoverable_mig_slices = recoverable_slices(node, wanted, memo);
    score
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::model::ClusterColumns;

    /// One node, one zone, GPUs with `used` milli, in `pool`, shared `replicas` ways, with
    /// `memory` MiB per GPU.
    fn node(used: &[i64], pool: &str, replicas: i64, memory: i64) -> Node {
        let c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["A100-SXM4-80GB".into()],
            node_policies: vec!["none".into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 1],
            zone_numa: vec![0],
            zone_cpu_milli: vec![64000],
            zone_cpu_used: vec![0],
            zone_memory_mib: vec![1 << 20],
            zone_memory_used: vec![0],
            gpu_offsets: vec![0, used.len()],
            gpu_ids: (0..used.len() as i64).collect(),
            gpu_used_milli: used.to_vec(),
            mig_offsets: vec![0, 0],
            instance_offsets: vec![0],
            node_gpu_pools: vec![pool.into()],
            node_gpu_replicas: vec![replicas],
            node_gpu_memory_mib: vec![memory],
            ..Default::default()
        };
        Cluster::from_columns(&c).unwrap().nodes.remove(0)
    }

    fn shape(gpus: u32, milli: u32, pool: &str, memory: u64) -> Shape {
        Shape {
            cpu_milli: 1000,
            memory_mib: 0,
            gpus,
            gpu_milli: milli,
            mig_profile: None,
            gpu_models: vec![],
            weight: 1.0,
            gpu_pool: pool.into(),
            gpu_memory_mib: memory,
            ..Default::default()
        }
    }

    fn score(n: &Node, s: Shape) -> NodeScore {
        score_node(n, &[s], &mut RecoverMemo::new())
    }

    #[test]
    fn another_pool_is_no_access() {
        let n = node(&[0, 500], "nvidia.com/gpu.shared", 4, 0);
        let s = score(&n, shape(1, 1000, "", 0));
        assert_eq!(s.fragment_gpu_milli, 1500.0);
        assert_eq!(s.categories[Category::NoAccess as usize], 1500.0);
        let s = score(&n, shape(1, 0, "nvidia.com/gpu.shared", 0));
        assert_eq!(s.fragment_gpu_milli, 0.0);
    }

    #[test]
    fn a_replica_is_sized_by_the_node() {
        // 3 replicas per GPU: 333 milli each; GPU 0 holds one (1000 - 2 x 333 = 334 used), GPU 1
        // all three; GPU 2 none (the remainder 1 is counted as used)
        let n = node(&[334, 1000, 1], "", 3, 0);
        let s = score(&n, shape(1, 0, "", 0));
        assert_eq!(s.idle_gpu_milli, 666.0 + 999.0);
        assert_eq!(s.fragment_gpu_milli, 0.0);
        // two replicas on two GPUs: still fits; on an unshared node a replica is a whole GPU
        assert_eq!(score(&n, shape(2, 0, "", 0)).fragment_gpu_milli, 0.0);
        let whole = node(&[0, 1000, 400], "", 1, 0);
        let s = score(&whole, shape(1, 0, "", 0));
        assert_eq!(s.categories[Category::Stranded as usize], 600.0);
    }

    #[test]
    fn a_memory_request_is_a_fraction_of_the_gpu_memory() {
        // 20000 MiB of an 80000 MiB GPU: 250 milli; GPU 1 has 200 free: stranded
        let n = node(&[0, 800], "hami", 1, 80000);
        let s = score(&n, shape(1, 1, "hami", 20000));
        assert_eq!(s.categories[Category::Stranded as usize], 200.0);
        assert_eq!(s.fragment_gpu_milli, 200.0);
        // the core share wins when larger
        let s = score(&n, shape(1, 300, "hami", 20000));
        assert_eq!(s.categories[Category::Stranded as usize], 200.0);
        let s = score(&n, shape(1, 100, "hami", 0));
        assert_eq!(s.fragment_gpu_milli, 0.0);
        assert_eq!(shape(1, 1, "hami", 20000).share_on(1, 0), 1000);
    }

    #[test]
    fn shares_of_several_gpus_need_that_many_gpus_with_the_share() {
        // two GPUs of 250 each: GPUs 0 and 2 have room, GPU 1 (100 free) is stranded
        let n = node(&[0, 900, 700], "hami", 1, 0);
        let s = score(&n, shape(2, 250, "hami", 0));
        assert_eq!(s.categories[Category::Stranded as usize], 100.0);
        assert_eq!(s.fragment_gpu_milli, 100.0);
        let s = score(&n, shape(3, 250, "hami", 0));
        assert_eq!(
            s.categories[Category::LackGpu as usize],
            1000.0 + 100.0 + 300.0
        );
    }

    #[test]
    fn placing_a_replica_takes_the_nodes_share() {
        let n = node(&[0, 1000], "nvidia.com/gpu.shared", 4, 0);
        let s = shape(1, 0, "nvidia.com/gpu.shared", 0);
        let shapes = std::slice::from_ref(&s);
        let d =
            crate::fragment::delta::place_delta(&n, &s, shapes, &mut RecoverMemo::new()).unwrap();
        assert_eq!(d.assignment.gpus, vec![(0, 0, 250)]);
        let other = shape(1, 0, "", 0);
        assert!(
            crate::fragment::delta::place_delta(&n, &other, &[s], &mut RecoverMemo::new())
                .is_none()
        );
    }

    #[test]
    fn replicas_out_of_range_are_refused() {
        let mut c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["x".into()],
            node_policies: vec!["none".into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 1],
            zone_numa: vec![0],
            zone_cpu_milli: vec![0],
            zone_cpu_used: vec![0],
            zone_memory_mib: vec![0],
            zone_memory_used: vec![0],
            gpu_offsets: vec![0, 0],
            mig_offsets: vec![0, 0],
            instance_offsets: vec![0],
            node_gpu_replicas: vec![0],
            ..Default::default()
        };
        let e = Cluster::from_columns(&c).unwrap_err();
        assert_eq!(e.field, "nodes[\"n\"].gpu_replicas");
        c.node_gpu_replicas = vec![1001];
        assert!(Cluster::from_columns(&c).is_err());
        c.node_gpu_replicas = vec![1, 2];
        assert!(Cluster::from_columns(&c).is_err());
    }

    /// One node of zones (free CPU milli of 16000, device-plugin GPUs' used milli), with 64 GiB
    /// per zone, under `policy`, with the static CPU manager or not.
    fn zoned(policy: &str, cpu_static: bool, zones: &[(i64, &[i64])]) -> Node {
        let mut c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["L40S".into()],
            node_policies: vec![policy.into()],
            node_cpu_static: vec![cpu_static],
            node_memory_static: vec![false],
            zone_offsets: vec![0, zones.len()],
            gpu_offsets: vec![0],
            mig_offsets: vec![0; zones.len() + 1],
            instance_offsets: vec![0],
            ..Default::default()
        };
        for (z, &(cpu_free, used)) in zones.iter().enumerate() {
            c.zone_numa.push(z as i64);
            c.zone_cpu_milli.push(16000);
            c.zone_cpu_used.push(16000 - cpu_free);
            c.zone_memory_mib.push(65536);
            c.zone_memory_used.push(0);
            for &u in used {
                c.gpu_ids.push(c.gpu_ids.len() as i64);
                c.gpu_used_milli.push(u);
            }
            c.gpu_offsets.push(c.gpu_ids.len());
        }
        Cluster::from_columns(&c).unwrap().nodes.remove(0)
    }

    fn gpus(n: u32, milli: u32, cpu: u64) -> Shape {
        Shape {
            cpu_milli: cpu,
            gpus: n,
            gpu_milli: milli,
            weight: 1.0,
            ..Default::default()
        }
    }

    fn cat(s: &NodeScore, c: Category) -> f64 {
        s.categories[c as usize]
    }

    #[test]
    fn fgd_quadrants_on_one_zone() {
        // idle: 1000 + 1000 + 300 + 0 = 2300 milli-GPU, 8 free CPUs
        let n = zoned("none", false, &[(8000, &[0, 0, 700, 1000])]);
        assert_eq!(empty_score(&n).idle_gpu_milli, 2300.0);
        // half a GPU: only the 300 left on GPU 2 is too small for it (Q3)
        let s = score(&n, gpus(1, 500, 1000));
        assert_eq!(
            (s.fragment_gpu_milli, cat(&s, Category::Stranded)),
            (300.0, 300.0)
        );
        assert_eq!(s.zones[0].fragment_gpu_milli, 300.0);
        // four whole GPUs: only two are free, every idle milli is fragment (Q2)
        let s = score(&n, gpus(4, 1000, 1000));
        assert_eq!(cat(&s, Category::LackGpu), 2300.0);
        // more CPU than the node has free (Q4), and both (Q1)
        assert_eq!(
            cat(&score(&n, gpus(1, 500, 9000)), Category::LackCpu),
            2300.0
        );
        assert_eq!(
            cat(&score(&n, gpus(4, 1000, 9000)), Category::LackBoth),
            2300.0
        );
        // a CPU-only task uses no GPU (XL); with too little CPU it is Q4 (XR)
        assert_eq!(
            cat(&score(&n, gpus(0, 0, 1000)), Category::Stranded),
            2300.0
        );
        assert_eq!(cat(&score(&n, gpus(0, 0, 9000)), Category::LackCpu), 2300.0);
        // a model the shape does not accept
        let h100 = Shape {
            gpu_models: vec!["H100-80GB".into()],
            ..gpus(1, 500, 1000)
        };
        assert_eq!(cat(&score(&n, h100), Category::NoAccess), 2300.0);
        // M is weighted: 0.25 x 300 + 0.75 x 2300 (weights as given: validate_shapes
        // normalises them before the core scores)
        let m = [
            Shape {
                weight: 0.25,
                ..gpus(1, 500, 1000)
            },
            Shape {
                weight: 0.75,
                ..gpus(4, 1000, 1000)
            },
        ];
        let s = score_node(&n, &m, &mut RecoverMemo::new());
        assert_eq!(s.fragment_gpu_milli, 0.25 * 300.0 + 0.75 * 2300.0);
        assert_eq!(cat(&s, Category::Stranded), 75.0);
        assert_eq!(cat(&s, Category::LackGpu), 1725.0);
    }

    #[test]
    fn numa_alignment_strands_what_no_zone_can_hold() {
        // two zones of two idle GPUs each: four GPUs need both zones
        let both: &[(i64, &[i64])] = &[(16000, &[0, 0]), (16000, &[0, 0])];
        let four = gpus(4, 1000, 1000);
        let s = score(&zoned("single-numa-node", false, both), four.clone());
        assert_eq!(cat(&s, Category::NumaSplit), 4000.0);
        assert_eq!(s.zones[0].fragment_gpu_milli, 2000.0);
        // restricted admits the narrowest alignment there is (both zones)
        assert_eq!(
            score(&zoned("restricted", false, both), four.clone()).fragment_gpu_milli,
            0.0
        );
        // best-effort and none admit anything that fits node-wide
        assert_eq!(
            score(&zoned("best-effort", false, both), four).fragment_gpu_milli,
            0.0
        );
        // zone 0 has the idle GPU, zone 1 the free CPUs: with the static CPU manager whole CPUs
        // must come from the GPU's zone, so the GPU is stranded by NUMA; without it, it is not
        let split: &[(i64, &[i64])] = &[(0, &[0]), (16000, &[1000])];
        let task = gpus(1, 1000, 2000);
        let s = score(&zoned("single-numa-node", true, split), task.clone());
        assert_eq!(cat(&s, Category::NumaSplit), 1000.0);
        let a = admission(
            &zoned("single-numa-node", true, split),
            &task,
            MigNeed::None,
            true,
        );
        assert_eq!(
            a,
            Admission {
                fail: Some(Category::NumaSplit),
                usable: 0
            }
        );
        let s = score(&zoned("single-numa-node", false, split), task.clone());
        assert_eq!(s.fragment_gpu_milli, 0.0);
        let a = admission(
            &zoned("single-numa-node", false, split),
            &task,
            MigNeed::None,
            true,
        );
        assert_eq!(
            a,
            Admission {
                fail: None,
                usable: 0b01
            }
        );
        // a fractional CPU request is not pinned by the CPU manager
        let s = score(&zoned("single-numa-node", true, split), gpus(1, 1000, 1500));
        assert_eq!(s.fragment_gpu_milli, 0.0);
    }

    /// A100-SXM4-40GB with 1g.5gb@0 and @1 free and 3g.20gb@4 used: 2 compute slices
    /// unpartitioned, 4 idle in all.
    fn mig_node() -> Node {
        let c = ClusterColumns {
            node_names: vec!["m".into()],
            node_models: vec!["A100-SXM4-40GB".into()],
            node_policies: vec!["none".into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 1],
            zone_numa: vec![0],
            zone_cpu_milli: vec![16000],
            zone_cpu_used: vec![0],
            zone_memory_mib: vec![65536],
            zone_memory_used: vec![0],
            gpu_offsets: vec![0, 0],
            mig_offsets: vec![0, 1],
            mig_gpu_ids: vec![0],
            instance_offsets: vec![0, 3],
            instance_profiles: vec!["1g.5gb".into(), "1g.5gb".into(), "3g.20gb".into()],
            instance_starts: vec![0, 1, 4],
            instance_used: vec![false, false, true],
            ..Default::default()
        };
        Cluster::from_columns(&c).unwrap().nodes.remove(0)
    }

    fn mig(profile: &str) -> Shape {
        Shape {
            cpu_milli: 1000,
            gpus: 1,
            mig_profile: Some(profile.into()),
            weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn mig_capacity_of_the_wrong_geometry() {
        let n = mig_node();
        let geometry = |s: &NodeScore| s.mig_categories[Category::MigGeometry as usize];
        // 1g.5gb: the two free 1g instances serve it; the 2 unpartitioned slices do not
        let s = score(&n, mig("1g.5gb"));
        assert_eq!((s.idle_mig_slices, s.fragment_mig_slices), (4.0, 2.0));
        assert_eq!(geometry(&s), 2.0);
        assert_eq!(s.fragment_gpu_milli, 0.0);
        // re-partitioning the free memory slices 0-3 (the used 3g stays) would hold four 1g
        // instances: two more than now
        assert_eq!(s.recoverable_mig_slices, 2.0);
        // 2g.10gb: no instance of it, so every idle slice; two 2g.10gb would fit in slices 0-3
        let s = score(&n, mig("2g.10gb"));
        assert_eq!((s.fragment_mig_slices, geometry(&s)), (4.0, 4.0));
        assert_eq!(s.recoverable_mig_slices, 4.0);
        // a whole-GPU shape cannot use MIG instances at all
        let s = score(&n, gpus(1, 1000, 1000));
        assert_eq!(geometry(&s), 4.0);
        assert_eq!(s.recoverable_mig_slices, 0.0);
        // a MIG shape of a profile the model lacks
        assert_eq!(mig_need(&n, &mig("1g.10gb+me")), MigNeed::Unavailable);
        assert_eq!(score(&n, mig("1g.10gb+me")).fragment_mig_slices, 4.0);
    }

    #[test]
    fn capacity_prefix_gives_the_narrowest_width() {
        let p = CapacityPrefix::new(&[2, 0, 3, 1]);
        assert_eq!(p.narrowest(0), Some(1));
        assert_eq!(p.narrowest(3), Some(1));
        assert_eq!(p.narrowest(4), Some(2));
        // sorted 3, 2, 1, 0: running sums 3, 5, 6, 6
        assert_eq!(p.narrowest(6), Some(3));
        assert_eq!(p.narrowest(7), None);
    }

    #[test]
    fn scores_add_up_on_random_nodes() {
        use crate::replay::rng::Rng;
        let policies = ["none", "best-effort", "restricted", "single-numa-node"];
        let uses = [0i64, 0, 100, 500, 700, 1000];
        let mut rng = Rng::new(5);
        let mut memo = RecoverMemo::new();
        for _ in 0..500 {
            let zones: Vec<(i64, Vec<i64>)> = (0..1 + rng.below(4))
                .map(|_| {
                    let cpu = 1000 * rng.below(17) as i64;
                    let g = (0..rng.below(5))
                        .map(|_| uses[rng.below(6) as usize])
                        .collect();
                    (cpu, g)
                })
                .collect();
            let spec: Vec<(i64, &[i64])> = zones.iter().map(|(c, g)| (*c, g.as_slice())).collect();
            let n = zoned(policies[rng.below(4) as usize], rng.below(2) == 0, &spec);
            let shapes: Vec<Shape> = (0..1 + rng.below(4))
                .map(|_| {
                    let k = rng.below(3) as u32;
                    let milli = if k == 1 {
                        [250, 500, 1000][rng.below(3) as usize]
                    } else {
                        1000 * (k > 0) as u32
                    };
                    Shape {
                        weight: 1.0 + rng.below(3) as f64,
                        ..gpus(k, milli, 1000 * rng.below(12))
                    }
                })
                .collect();
            let whole = score_node(&n, &shapes, &mut memo);
            // the categories, the zones and the shapes each add up to the fragment, which never
            // exceeds what is idle (times the total weight)
            let total_w: f64 = shapes.iter().map(|s| s.weight).sum();
            let by_cat: f64 = whole.categories.iter().sum();
            let by_zone: f64 = whole.zones.iter().map(|z| z.fragment_gpu_milli).sum();
            let by_shape: f64 = shapes
                .iter()
                .map(|s| score_node(&n, std::slice::from_ref(s), &mut memo).fragment_gpu_milli)
                .sum();
            for v in [by_cat, by_zone, by_shape] {
                assert!(
                    (v - whole.fragment_gpu_milli).abs() < 1e-6,
                    "{v} vs {whole:?}"
                );
            }
            assert!(whole.fragment_gpu_milli <= total_w * whole.idle_gpu_milli + 1e-6);
            assert_eq!(whole.idle_gpu_milli, n.idle_gpu_milli() as f64);
            // a policy never admits more than `none` does: aligning only adds fragment
            let mut free = n.clone();
            free.policy = Policy::None;
            let loose = score_node(&free, &shapes, &mut memo);
            assert!(loose.fragment_gpu_milli <= whole.fragment_gpu_milli + 1e-6);
        }
    }
}
