//! The cluster model the scorer works on, in columns: nodes own a range of zones, zones own a
//! range of whole/shared GPUs and a range of MIG GPUs, MIG GPUs own a range of instances.
//! Built once from flat arrays (the Python side flattens its records), validated here so that the
//! scorer can index without checks: used never above capacity, no negative amounts, no duplicate
//! NUMA or GPU ids on a node, MIG instances of known profiles at valid, non-overlapping placements.

use crate::error::{CoreError, CoreResult};
use crate::mig::catalog::Catalog;
use crate::mig::placement::place;
use crate::topology::Policy;

/// Most NUMA zones a node may have (the width of a NUMA mask).
pub const MAX_ZONES: usize = 64;
/// Whole-GPU share, in milli-GPU.
pub const GPU_MILLI: u32 = 1000;

#[derive(Clone, Debug, PartialEq)]
pub struct MigInstance {
    /// Index of the profile in the node's GPU model.
    pub profile: usize,
    pub start: u8,
    pub compute_slices: u8,
    pub used: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MigGpu {
    pub id: u32,
    pub instances: Vec<MigInstance>,
    /// Compute slices covered by no instance (need a re-partition to be used; on a dynamic GPU,
    /// free for any placement that fits `free_mask`).
    pub unpartitioned_slices: u8,
    /// Published by a DRA driver (usable by DRA requests only); else by the device plugin.
    pub dra: bool,
    /// Partitioned on demand (the NVIDIA DRA driver's DynamicMIG): `instances` are the allocated
    /// placements (all used), and any placement within `free_mask` can be allocated.
    pub dynamic: bool,
    /// Free memory slices (bit i = slice i); on a dynamic GPU, the published counters' view.
    pub free_mask: u16,
}

impl MigGpu {
    /// Compute slices not in use: free instances plus slices no instance covers.
    pub fn idle_slices(&self) -> u64 {
        self.unpartitioned_slices as u64
            + self
                .instances
                .iter()
                .filter(|i| !i.used)
                .map(|i| i.compute_slices as u64)
                .sum::<u64>()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Zone {
    pub numa: u32,
    pub cpu_milli: u64,
    pub cpu_free: u64,
    pub memory_mib: u64,
    pub memory_free: u64,
    /// Whole or shared GPUs of the device plugin: (id, free milli-GPU).
    pub gpus: Vec<(u32, u32)>,
    pub mig: Vec<MigGpu>,
    /// Whole GPUs published by a DRA driver (usable by DRA requests only): (id, free milli-GPU).
    pub dra_gpus: Vec<(u32, u32)>,
}

impl Zone {
    pub fn idle_gpu_milli(&self) -> u64 {
        self.gpus
            .iter()
            .chain(&self.dra_gpus)
            .map(|&(_, f)| f as u64)
            .sum()
    }

    /// Whole/shared GPUs of one source (DRA or the device plugin).
    pub fn gpus_of(&self, dra: bool) -> &[(u32, u32)] {
        if dra {
            &self.dra_gpus
        } else {
            &self.gpus
        }
    }

    pub fn idle_mig_slices(&self) -> u64 {
        self.mig.iter().map(MigGpu::idle_slices).sum()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub gpu_model: String,
    /// Index of the model in the MIG catalog, when the node has MIG GPUs.
    pub mig_model: Option<usize>,
    pub policy: Policy,
    pub cpu_static: bool,
    pub memory_static: bool,
    pub zones: Vec<Zone>,
    /// The sharing pool of its whole/shared GPUs (see `Shape::gpu_pool`; "" by default).
    pub gpu_pool: String,
    /// Replicas per GPU its device plugin advertises (time-slicing, MPS); 1: not replicated.
    pub gpu_replicas: u32,
    /// Memory of each GPU in MiB (0: unknown), for shapes that ask for GPU memory.
    pub gpu_memory_mib: u64,
}

impl Node {
    pub fn idle_gpu_milli(&self) -> u64 {
        self.zones.iter().map(Zone::idle_gpu_milli).sum()
    }

    pub fn idle_mig_slices(&self) -> u64 {
        self.zones.iter().map(Zone::idle_mig_slices).sum()
    }
}

/// The flat input arrays (see `pyctl/core/fragmentation.py`, which builds them from records).
#[derive(Clone, Debug, Default)]
pub struct ClusterColumns {
    pub node_names: Vec<String>,
    pub node_models: Vec<String>,
    pub node_policies: Vec<String>,
    pub node_cpu_static: Vec<bool>,
    pub node_memory_static: Vec<bool>,
    /// `len = nodes + 1`; node i owns zones `zone_offsets[i]..zone_offsets[i + 1]`.
    pub zone_offsets: Vec<usize>,
    pub zone_numa: Vec<i64>,
    pub zone_cpu_milli: Vec<i64>,
    pub zone_cpu_used: Vec<i64>,
    pub zone_memory_mib: Vec<i64>,
    pub zone_memory_used: Vec<i64>,
    pub gpu_offsets: Vec<usize>,
    pub gpu_ids: Vec<i64>,
    pub gpu_used_milli: Vec<i64>,
    pub mig_offsets: Vec<usize>,
    pub mig_gpu_ids: Vec<i64>,
    pub instance_offsets: Vec<usize>,
    pub instance_profiles: Vec<String>,
    pub instance_starts: Vec<i64>,
    pub instance_used: Vec<bool>,
    /// DRA whole GPUs per zone (optional: empty means none): `len = zones + 1` offsets.
    pub dra_gpu_offsets: Vec<usize>,
    pub dra_gpu_ids: Vec<i64>,
    pub dra_gpu_used_milli: Vec<i64>,
    /// Per MIG GPU (optional: empty means all false / derived): DRA, dynamic, free memory slices
    /// (-1: the slices no instance covers).
    pub mig_dra: Vec<bool>,
    pub mig_dynamic: Vec<bool>,
    pub mig_free_slices: Vec<i64>,
    /// Optional (empty: every node "", 1, 0): per node, its GPU sharing pool, replicas per GPU
    /// and per-GPU memory in MiB.
    pub node_gpu_pools: Vec<String>,
    pub node_gpu_replicas: Vec<i64>,
    pub node_gpu_memory_mib: Vec<i64>,
}

/// Most replicas per GPU a node may advertise (a replica is at least 1 milli-GPU).
pub const MAX_REPLICAS: i64 = GPU_MILLI as i64;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub nodes: Vec<Node>,
}

fn offsets_ok(offsets: &[usize], parents: usize, children: usize, what: &str) -> CoreResult<()> {
    if offsets.len() != parents + 1
        || offsets[0] != 0
        || offsets[parents] != children
        || offsets.windows(2).any(|w| w[0] > w[1])
    {
        return Err(CoreError::new(
            what,
            "offsets do not describe the arrays (internal conversion error)",
        ));
    }
    Ok(())
}

fn amount(v: i64, field: impl Fn() -> String) -> CoreResult<u64> {
    if v < 0 {
        return Err(CoreError::new(
            field(),
            format!("must not be negative, got {v}"),
        ));
    }
    Ok(v as u64)
}

impl Cluster {
    pub fn from_columns(c: &ClusterColumns) -> CoreResult<Cluster> {
        let n = c.node_names.len();
        for (what, len) in [
            ("node_models", c.node_models.len()),
            ("node_policies", c.node_policies.len()),
            ("node_cpu_static", c.node_cpu_static.len()),
            ("node_memory_static", c.node_memory_static.len()),
        ] {
            if len != n {
                return Err(CoreError::new(what, "length differs from node_names"));
            }
        }
        for (what, len) in [
            ("node_gpu_pools", c.node_gpu_pools.len()),
            ("node_gpu_replicas", c.node_gpu_replicas.len()),
            ("node_gpu_memory_mib", c.node_gpu_memory_mib.len()),
        ] {
            if len != n && len != 0 {
                return Err(CoreError::new(
                    what,
                    "length differs from node_names (give one per node, or none)",
                ));
            }
        }
        let z = c.zone_numa.len();
        for (what, len) in [
            ("zone_cpu_milli", c.zone_cpu_milli.len()),
            ("zone_cpu_used", c.zone_cpu_used.len()),
            ("zone_memory_mib", c.zone_memory_mib.len()),
            ("zone_memory_used", c.zone_memory_used.len()),
        ] {
            if len != z {
                return Err(CoreError::new(what, "length differs from zone_numa"));
            }
        }
        if c.gpu_ids.len() != c.gpu_used_milli.len() {
            return Err(CoreError::new(
                "gpu_used_milli",
                "length differs from gpu_ids",
            ));
        }
        let ni = c.instance_profiles.len();
        if c.instance_starts.len() != ni || c.instance_used.len() != ni {
            return Err(CoreError::new(
                "instance_starts",
                "length differs from instance_profiles",
            ));
        }
        // the DRA columns are optional (callers without DRA devices leave them empty)
        let no_dra_offsets = vec![0usize; z + 1];
        let dra_offsets: &[usize] = if c.dra_gpu_offsets.is_empty() {
            &no_dra_offsets
        } else {
            &c.dra_gpu_offsets
        };
        if c.dra_gpu_ids.len() != c.dra_gpu_used_milli.len() {
            return Err(CoreError::new(
                "dra_gpu_used_milli",
                "length differs from dra_gpu_ids",
            ));
        }
        let nm = c.mig_gpu_ids.len();
        for (what, len) in [
            ("mig_dra", c.mig_dra.len()),
            ("mig_dynamic", c.mig_dynamic.len()),
            ("mig_free_slices", c.mig_free_slices.len()),
        ] {
            if len != 0 && len != nm {
                return Err(CoreError::new(what, "length differs from mig_gpu_ids"));
            }
        }
        offsets_ok(&c.zone_offsets, n, z, "zone_offsets")?;
        offsets_ok(dra_offsets, z, c.dra_gpu_ids.len(), "dra_gpu_offsets")?;
        offsets_ok(&c.gpu_offsets, z, c.gpu_ids.len(), "gpu_offsets")?;
        offsets_ok(&c.mig_offsets, z, c.mig_gpu_ids.len(), "mig_offsets")?;
        offsets_ok(
            &c.instance_offsets,
            c.mig_gpu_ids.len(),
            ni,
            "instance_offsets",
        )?;

        let mut names = std::collections::HashSet::with_capacity(n);
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            let name = &c.node_names[i];
            let nf = |f: &str| format!("nodes[{name:?}].{f}");
            if !names.insert(name.as_str()) {
                return Err(CoreError::new(nf("name"), "duplicate node name"));
            }
            let policy = Policy::parse(&c.node_policies[i])
                .map_err(|e| CoreError::new(nf("topology_policy"), e.message))?;
            let zr = c.zone_offsets[i]..c.zone_offsets[i + 1];
            if zr.is_empty() {
                return Err(CoreError::new(
                    nf("zones"),
                    "a node needs at least one NUMA zone",
                ));
            }
            if zr.len() > MAX_ZONES {
                return Err(CoreError::new(
                    nf("zones"),
                    format!("{} zones; at most {MAX_ZONES}", zr.len()),
                ));
            }
            if matches!(policy, Policy::Restricted | Policy::SingleNumaNode) && zr.len() > 16 {
                return Err(CoreError::new(
                    nf("zones"),
                    format!("{} NUMA zones under {:?}: at most 16 are supported (the kubelet allows 8 without max-allowable-numa-nodes)", zr.len(), policy.name()),
                ));
            }
            let mut numa_seen = 0u64;
            let mut gpu_seen = std::collections::HashSet::new();
            let mut zones = Vec::with_capacity(zr.len());
            let has_mig = zr
                .clone()
                .any(|zi| c.mig_offsets[zi] != c.mig_offsets[zi + 1]);
            let model = if has_mig {
                let cat = Catalog::builtin();
                let m = cat
                    .model(&c.node_models[i])
                    .map_err(|e| CoreError::new(nf("gpu_model"), e.message))?;
                Some(m)
            } else {
                None
            };
            let mig_model = match model {
                Some(m) => Catalog::builtin()
                    .models()
                    .iter()
                    .position(|x| std::ptr::eq(x, m)),
                None => None,
            };
            for zi in zr {
                let numa = c.zone_numa[zi];
                let zf = |f: &str| format!("nodes[{name:?}].zones[numa={numa}].{f}");
                if !(0..MAX_ZONES as i64).contains(&numa) {
                    return Err(CoreError::new(
                        zf("numa"),
                        format!("NUMA id {numa} is outside 0..=63"),
                    ));
                }
                if numa_seen & (1 << numa) != 0 {
                    return Err(CoreError::new(zf("numa"), "duplicate NUMA id on the node"));
                }
                numa_seen |= 1 << numa;
                let cpu = amount(c.zone_cpu_milli[zi], || zf("cpu_milli"))?;
                let cpu_used = amount(c.zone_cpu_used[zi], || zf("cpu_milli_used"))?;
                let mem = amount(c.zone_memory_mib[zi], || zf("memory_mib"))?;
                let mem_used = amount(c.zone_memory_used[zi], || zf("memory_mib_used"))?;
                if cpu_used > cpu {
                    return Err(CoreError::new(
                        zf("cpu_milli_used"),
                        format!("{cpu_used} is above capacity {cpu}"),
                    ));
                }
                if mem_used > mem {
                    return Err(CoreError::new(
                        zf("memory_mib_used"),
                        format!("{mem_used} is above capacity {mem}"),
                    ));
                }
                let mut gpus = Vec::new();
                for gi in c.gpu_offsets[zi]..c.gpu_offsets[zi + 1] {
                    let id = c.gpu_ids[gi];
                    let gf =
                        |f: &str| format!("nodes[{name:?}].zones[numa={numa}].gpus[id={id}].{f}");
                    if !(0..=u32::MAX as i64).contains(&id) || !gpu_seen.insert(id) {
                        return Err(CoreError::new(
                            gf("id"),
                            "GPU id must be a non-negative integer, unique on the node",
                        ));
                    }
                    let used = c.gpu_used_milli[gi];
                    if !(0..=GPU_MILLI as i64).contains(&used) {
                        return Err(CoreError::new(
                            gf("used_milli"),
                            format!("{used} is outside 0..=1000"),
                        ));
                    }
                    gpus.push((id as u32, GPU_MILLI - used as u32));
                }
                let mut dra_gpus = Vec::new();
                for gi in dra_offsets[zi]..dra_offsets[zi + 1] {
                    let id = c.dra_gpu_ids[gi];
                    let gf = |f: &str| {
                        format!("nodes[{name:?}].zones[numa={numa}].dra_gpus[id={id}].{f}")
                    };
                    if !(0..=u32::MAX as i64).contains(&id) || !gpu_seen.insert(id) {
                        return Err(CoreError::new(
                            gf("id"),
                            "GPU id must be a non-negative integer, unique on the node",
                        ));
                    }
                    let used = c.dra_gpu_used_milli[gi];
                    if !(0..=GPU_MILLI as i64).contains(&used) {
                        return Err(CoreError::new(
                            gf("used_milli"),
                            format!("{used} is outside 0..=1000"),
                        ));
                    }
                    dra_gpus.push((id as u32, GPU_MILLI - used as u32));
                }
                let mut mig = Vec::new();
                for mi in c.mig_offsets[zi]..c.mig_offsets[zi + 1] {
                    let id = c.mig_gpu_ids[mi];
                    let mf =
                        |f: &str| format!("nodes[{name:?}].zones[numa={numa}].mig[gpu={id}].{f}");
                    if !(0..=u32::MAX as i64).contains(&id) || !gpu_seen.insert(id) {
                        return Err(CoreError::new(
                            mf("gpu"),
                            "GPU id must be a non-negative integer, unique on the node",
                        ));
                    }
                    let model = model.ok_or_else(|| {
                        CoreError::new(mf("gpu"), "internal: MIG GPU without a model")
                    })?;
                    let mut instances = Vec::new();
                    let mut pinned = Vec::new();
                    let mut used_compute = 0u32;
                    for ii in c.instance_offsets[mi]..c.instance_offsets[mi + 1] {
                        let pname = &c.instance_profiles[ii];
                        let pf = || {
                            format!(
                                "nodes[{name:?}].zones[numa={numa}].mig[gpu={id}].instances[{}]",
                                ii - c.instance_offsets[mi]
                            )
                        };
                        let p = model
                            .profile_index(pname)
                            .map_err(|e| CoreError::new(pf(), e.message))?;
                        let start = c.instance_starts[ii];
                        let prof = &model.profiles[p];
                        if !(0..=255).contains(&start)
                            || !prof.placements.iter().any(|pl| pl.start as i64 == start)
                        {
                            let starts: Vec<u8> =
                                prof.placements.iter().map(|pl| pl.start).collect();
                            return Err(CoreError::new(
                                pf(),
                                format!("{pname} cannot start at memory slice {start} on {} (valid starts {starts:?})", model.name),
                            ));
                        }
                        pinned.push((p, start as u8));
                        used_compute += prof.compute_slices as u32;
                        instances.push(MigInstance {
                            profile: p,
                            start: start as u8,
                            compute_slices: prof.compute_slices,
                            used: c.instance_used[ii],
                        });
                    }
                    let dra = c.mig_dra.get(mi).copied().unwrap_or(false);
                    let dynamic = c.mig_dynamic.get(mi).copied().unwrap_or(false);
                    if dynamic && instances.iter().any(|i| !i.used) {
                        return Err(CoreError::new(
                            mf("instances"),
                            "a dynamic (DynamicMIG) GPU lists only allocated placements: every instance must be used",
                        ));
                    }
                    let mut used_mask = 0u16;
                    for &(p, start) in &pinned {
                        if let Some(pl) = model.profiles[p].placement_at(start) {
                            used_mask |= pl.mask();
                        }
                    }
                    let full = model.full_mask();
                    let free_mask = match c.mig_free_slices.get(mi).copied().unwrap_or(-1) {
                        -1 => full & !used_mask,
                        f if (0..=full as i64).contains(&f) && (f as u16) & !full == 0 => {
                            if (f as u16) & used_mask != 0 {
                                return Err(CoreError::new(
                                    mf("free_slices"),
                                    format!("free memory slices {f:#b} overlap the allocated placements {used_mask:#b}"),
                                ));
                            }
                            f as u16
                        }
                        f => {
                            return Err(CoreError::new(
                                mf("free_slices"),
                                format!(
                                    "{f:#b} is not a set of the GPU's {} memory slices",
                                    model.memory_slices
                                ),
                            ))
                        }
                    };
                    if !dynamic && free_mask != full & !used_mask {
                        return Err(CoreError::new(
                            mf("free_slices"),
                            "free memory slices are only given for dynamic GPUs",
                        ));
                    }
                    if place(model, &pinned, &[]).is_none() {
                        return Err(CoreError::new(
                            mf("instances"),
                            format!(
                                "these instances overlap or exceed the GPU ({}): {:?}",
                                model.name,
                                instances
                                    .iter()
                                    .map(|i| format!(
                                        "{}@{}",
                                        model.profiles[i.profile].name, i.start
                                    ))
                                    .collect::<Vec<_>>()
                            ),
                        ));
                    }
                    let unpartitioned =
                        (model.compute_slices as u32).saturating_sub(used_compute) as u8;
                    mig.push(MigGpu {
                        id: id as u32,
                        instances,
                        unpartitioned_slices: unpartitioned,
                        dra,
                        dynamic,
                        free_mask,
                    });
                }
                zones.push(Zone {
                    numa: numa as u32,
                    cpu_milli: cpu,
                    cpu_free: cpu - cpu_used,
                    memory_mib: mem,
                    memory_free: mem - mem_used,
                    gpus,
                    mig,
                    dra_gpus,
                });
            }
            let gpu_replicas = match c.node_gpu_replicas.get(i) {
                None => 1,
                Some(&r) if (1..=MAX_REPLICAS).contains(&r) => r as u32,
                Some(&r) => {
                    return Err(CoreError::new(
                        nf("gpu_replicas"),
                        format!("{r} is outside 1..={MAX_REPLICAS}"),
                    ))
                }
            };
            let gpu_memory_mib = match c.node_gpu_memory_mib.get(i) {
                None => 0,
                Some(&m) => amount(m, || nf("gpu_memory_mib"))?,
            };
            nodes.push(Node {
                name: name.clone(),
                gpu_model: c.node_models[i].clone(),
                mig_model,
                policy,
                cpu_static: c.node_cpu_static[i],
                memory_static: c.node_memory_static[i],
                zones,
                gpu_pool: c.node_gpu_pools.get(i).cloned().unwrap_or_default(),
                gpu_replicas,
                gpu_memory_mib,
            });
        }
        Ok(Cluster { nodes })
    }
}
