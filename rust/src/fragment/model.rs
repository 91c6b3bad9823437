//! The cluster model the scorer works on, in columns: nodes own a range of zones, zones own a
//! range of whole/shared GPUs and a range of MIG GPUs, MIG GPUs own a range of instances.
//! Built once from flat arrays (the Python side flattens its records), validated here so that the
//! scorer can index without checks: used never above capacity, no negative amounts, no duplicate
//! NUMA or GPU ids on a node, MIG instances of known profiles at valid, non-overlapping placements.

use std::collections::HashSet;

use crate::error::{CoreError, CoreResult};
use crate::mig::catalog::{Catalog, GpuModel};
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
    /// Link groups of its whole GPUs (device plugin and DRA), level by level, smallest size
    /// first: GPUs of one group share an NVLink bridge, switch or Fabric Manager partition.
    /// Empty: nothing is known of the links (no constraint).
    pub links: Vec<LinkLevel>,
    /// Its RDMA resource (the extended resource the controller is told meters RDMA: shared HCA
    /// devices, bandwidth shares): allocatable and free, node-wide. 0: none.
    pub rdma: u64,
    pub rdma_free: u64,
}

/// The size of a level of link groups of any size (a one-level source: NVLink groups, HAMi's
/// link scores, nested NodeResourceTopology zones).
pub const ANY_SIZE: u32 = u32::MAX;

/// One level of a node's link groups: groups of at most `size` GPUs (the Fabric Manager
/// partitions of that size), or of any size (`ANY_SIZE`). A GPU it does not list is a group of
/// its own at this level.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkLevel {
    pub size: u32,
    /// (GPU id, group), sorted by id.
    pub groups: Vec<(u32, u32)>,
    /// It lists some GPU of the device plugin / of a DRA driver.
    pub plugin: bool,
    pub dra: bool,
}

impl LinkLevel {
    /// The group of GPU `id` at this level.
    pub fn group_of(&self, id: u32) -> u32 {
        match self.groups.binary_search_by_key(&id, |&(g, _)| g) {
            Ok(i) => self.groups[i].1,
            // a group of its own, apart from every listed group
            Err(_) => u32::MAX - (id % (u32::MAX / 2)),
        }
    }
}

impl Node {
    /// The level of link groups a shape of `gpus` GPUs from one source (`dra`) that needs one
    /// group uses: the smallest level at least that large that lists a GPU of that source.
    /// None: no constraint (no such level).
    pub fn link_level(&self, dra: bool, gpus: u32) -> Option<&LinkLevel> {
        self.links
            .iter()
            .find(|l| l.size >= gpus && if dra { l.dra } else { l.plugin })
    }

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
    /// Optional, aligned with `gpu_ids`: each GPU's link group at the level of any size (-1:
    /// none).
    pub gpu_link_groups: Vec<i64>,
    /// Optional (empty: none): link groups of whole GPUs of either source at given sizes. Node
    /// i owns entries `node_link_offsets[i]..node_link_offsets[i + 1]`; entry k puts GPU
    /// `link_gpu_ids[k]` in group `link_groups[k]` of the level of size `link_sizes[k]` (0:
    /// the level of any size).
    pub node_link_offsets: Vec<usize>,
    pub link_sizes: Vec<i64>,
    pub link_gpu_ids: Vec<i64>,
    pub link_groups: Vec<i64>,
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
    /// Optional (empty: none anywhere): per node, its RDMA resource's allocatable and the
    /// amount its pods request.
    pub node_rdma: Vec<i64>,
    pub node_rdma_used: Vec<i64>,
}

/// Most replicas per GPU a node may advertise (a replica is at least 1 milli-GPU).
pub const MAX_REPLICAS: i64 = GPU_MILLI as i64;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub nodes: Vec<Node>,
}

/// Checks that `offsets` split `children` items among `parents`: one more offset than parents,
/// starting at 0, ending at `children`, never decreasing.
fn offsets_ok(offsets: &[usize], parents: usize, children: usize, what: &str) -> CoreResult<()> {
    let ok = offsets.len() == parents + 1
        && offsets.first() == Some(&0)
        && offsets.last() == Some(&children)
        && offsets.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(CoreError::new(
            what,
            "offsets do not describe the arrays (internal conversion error)",
        ));
    }
    Ok(())
}

/// A non-negative amount, or an error naming the field.
fn amount(v: i64, field: impl Fn() -> String) -> CoreResult<u64> {
    if v < 0 {
        return Err(CoreError::new(
            field(),
            format!("must not be negative, got {v}"),
        ));
    }
    Ok(v as u64)
}

/// Fails naming `what` when a column's length is not `expected` (or 0, when `optional`).
fn same_length(
    what: &str,
    len: usize,
    expected: usize,
    optional: bool,
    of: &str,
) -> CoreResult<()> {
    if len == expected || (optional && len == 0) {
        return Ok(());
    }
    let message = if optional {
        format!("length differs from {of} (give one per node, or none)")
    } else {
        format!("length differs from {of}")
    };
    Err(CoreError::new(what, message))
}

/// Checks that parallel columns have the same length (optional ones may be empty), and that
/// every offsets column describes the arrays it indexes. After it, the columns can be indexed
/// through the offsets without bounds errors.
fn check_columns(c: &ClusterColumns, dra_offsets: &[usize]) -> CoreResult<()> {
    let n = c.node_names.len();
    for (what, len) in [
        ("node_models", c.node_models.len()),
        ("node_policies", c.node_policies.len()),
        ("node_cpu_static", c.node_cpu_static.len()),
        ("node_memory_static", c.node_memory_static.len()),
    ] {
        same_length(what, len, n, false, "node_names")?;
    }
    for (what, len) in [
        ("node_gpu_pools", c.node_gpu_pools.len()),
        ("node_gpu_replicas", c.node_gpu_replicas.len()),
        ("node_gpu_memory_mib", c.node_gpu_memory_mib.len()),
        ("node_rdma", c.node_rdma.len()),
        ("node_rdma_used", c.node_rdma_used.len()),
    ] {
        same_length(what, len, n, true, "node_names")?;
    }
    let z = c.zone_numa.len();
    for (what, len) in [
        ("zone_cpu_milli", c.zone_cpu_milli.len()),
        ("zone_cpu_used", c.zone_cpu_used.len()),
        ("zone_memory_mib", c.zone_memory_mib.len()),
        ("zone_memory_used", c.zone_memory_used.len()),
    ] {
        same_length(what, len, z, false, "zone_numa")?;
    }
    let g = c.gpu_ids.len();
    same_length(
        "gpu_used_milli",
        c.gpu_used_milli.len(),
        g,
        false,
        "gpu_ids",
    )?;
    same_length(
        "gpu_link_groups",
        c.gpu_link_groups.len(),
        g,
        true,
        "gpu_ids",
    )?;
    let ni = c.instance_profiles.len();
    if c.instance_starts.len() != ni || c.instance_used.len() != ni {
        return Err(CoreError::new(
            "instance_starts",
            "length differs from instance_profiles",
        ));
    }
    let d = c.dra_gpu_ids.len();
    same_length(
        "dra_gpu_used_milli",
        c.dra_gpu_used_milli.len(),
        d,
        false,
        "dra_gpu_ids",
    )?;
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
    let l = c.link_gpu_ids.len();
    for (what, len) in [
        ("link_sizes", c.link_sizes.len()),
        ("link_groups", c.link_groups.len()),
    ] {
        same_length(what, len, l, false, "link_gpu_ids")?;
    }
    if !(c.node_link_offsets.is_empty() && l == 0) {
        offsets_ok(&c.node_link_offsets, n, l, "node_link_offsets")?;
    }
    offsets_ok(&c.zone_offsets, n, z, "zone_offsets")?;
    offsets_ok(dra_offsets, z, d, "dra_gpu_offsets")?;
    offsets_ok(&c.gpu_offsets, z, g, "gpu_offsets")?;
    offsets_ok(&c.mig_offsets, z, nm, "mig_offsets")?;
    offsets_ok(&c.instance_offsets, nm, ni, "instance_offsets")
}

/// Reads one node's columns into its model. Indexing is safe here: `check_columns` has
/// checked every length and offsets column.
struct NodeReader<'a> {
    c: &'a ClusterColumns,
    dra_offsets: &'a [usize],
    /// Position of the node in the columns.
    i: usize,
    name: &'a str,
    /// The node's MIG model, when it has MIG GPUs.
    model: Option<&'static GpuModel>,
    /// NUMA ids seen on the node (bit i = id i).
    numa_seen: u64,
    /// GPU ids seen on the node, of every kind (they share one id space).
    gpu_seen: HashSet<i64>,
}

impl<'a> NodeReader<'a> {
    /// `nodes["name"].<f>`
    fn field(&self, f: &str) -> String {
        format!("nodes[{:?}].{f}", self.name)
    }

    /// The node's zone range, checked: at least one zone, at most `MAX_ZONES`, at most 16
    /// under the policies that align to NUMA (the merge's limit).
    fn zone_range(&self, policy: Policy) -> CoreResult<std::ops::Range<usize>> {
        let zr = self.c.zone_offsets[self.i]..self.c.zone_offsets[self.i + 1];
        if zr.is_empty() {
            return Err(CoreError::new(
                self.field("zones"),
                "a node needs at least one NUMA zone",
            ));
        }
        if zr.len() > MAX_ZONES {
            return Err(CoreError::new(
                self.field("zones"),
                format!("{} zones; at most {MAX_ZONES}", zr.len()),
            ));
        }
        if matches!(policy, Policy::Restricted | Policy::SingleNumaNode) && zr.len() > 16 {
            return Err(CoreError::new(
                self.field("zones"),
                format!("{} NUMA zones under {:?}: at most 16 are supported (the kubelet allows 8 without max-allowable-numa-nodes)", zr.len(), policy.name()),
            ));
        }
        Ok(zr)
    }

    /// The node's MIG model from the catalog, looked up only when some zone has MIG GPUs;
    /// with its index in the catalog.
    fn mig_model(
        &self,
        zones: std::ops::Range<usize>,
    ) -> CoreResult<Option<(&'static GpuModel, usize)>> {
        let c = self.c;
        if !zones
            .into_iter()
            .any(|zi| c.mig_offsets[zi] != c.mig_offsets[zi + 1])
        {
            return Ok(None);
        }
        let cat = Catalog::builtin();
        let m = cat
            .model(&c.node_models[self.i])
            .map_err(|e| CoreError::new(self.field("gpu_model"), e.message))?;
        let index = cat.models().iter().position(|x| std::ptr::eq(x, m));
        Ok(index.map(|index| (m, index)))
    }

    /// Zone `zi`: a NUMA id unique on the node, CPU and memory used within capacity, and its
    /// whole/shared, DRA and MIG GPUs.
    fn zone(&mut self, zi: usize) -> CoreResult<Zone> {
        let c = self.c;
        let numa = c.zone_numa[zi];
        let name = self.name;
        let zf = |f: &str| zone_field(name, numa, f);
        if !(0..MAX_ZONES as i64).contains(&numa) {
            return Err(CoreError::new(
                zf("numa"),
                format!("NUMA id {numa} is outside 0..=63"),
            ));
        }
        if self.numa_seen & (1 << numa) != 0 {
            return Err(CoreError::new(zf("numa"), "duplicate NUMA id on the node"));
        }
        self.numa_seen |= 1 << numa;
        let cpu = amount(c.zone_cpu_milli[zi], || zf("cpu_milli"))?;
        let cpu_used = amount(c.zone_cpu_used[zi], || zf("cpu_milli_used"))?;
        let mem = amount(c.zone_memory_mib[zi], || zf("memory_mib"))?;
        let mem_used = amount(c.zone_memory_used[zi], || zf("memory_mib_used"))?;
        let cpu_free = free_within(cpu, cpu_used, || zf("cpu_milli_used"))?;
        let memory_free = free_within(mem, mem_used, || zf("memory_mib_used"))?;
        let plugin = c.gpu_offsets[zi]..c.gpu_offsets[zi + 1];
        let gpus = self.gpus(
            numa,
            "gpus",
            &c.gpu_ids[plugin.clone()],
            &c.gpu_used_milli[plugin],
        )?;
        let dra = self.dra_offsets[zi]..self.dra_offsets[zi + 1];
        let dra_gpus = self.gpus(
            numa,
            "dra_gpus",
            &c.dra_gpu_ids[dra.clone()],
            &c.dra_gpu_used_milli[dra],
        )?;
        let mig = (c.mig_offsets[zi]..c.mig_offsets[zi + 1])
            .map(|mi| self.mig_gpu(numa, mi))
            .collect::<CoreResult<Vec<_>>>()?;
        Ok(Zone {
            numa: numa as u32,
            cpu_milli: cpu,
            cpu_free,
            memory_mib: mem,
            memory_free,
            gpus,
            mig,
            dra_gpus,
        })
    }

    /// Records a GPU id: non-negative, within u32, not yet seen on the node.
    fn gpu_id(&mut self, id: i64, field: impl Fn() -> String) -> CoreResult<u32> {
        if !(0..=u32::MAX as i64).contains(&id) || !self.gpu_seen.insert(id) {
            return Err(CoreError::new(
                field(),
                "GPU id must be a non-negative integer, unique on the node",
            ));
        }
        Ok(id as u32)
    }

    /// Whole/shared GPUs of one kind (`what`: "gpus" or "dra_gpus") as (id, free milli-GPU).
    fn gpus(
        &mut self,
        numa: i64,
        what: &str,
        ids: &[i64],
        used: &[i64],
    ) -> CoreResult<Vec<(u32, u32)>> {
        let mut out = Vec::with_capacity(ids.len());
        let name = self.name;
        for (&id, &used) in ids.iter().zip(used) {
            let gf = |f: &str| zone_field(name, numa, &format!("{what}[id={id}].{f}"));
            let gid = self.gpu_id(id, || gf("id"))?;
            if !(0..=GPU_MILLI as i64).contains(&used) {
                return Err(CoreError::new(
                    gf("used_milli"),
                    format!("{used} is outside 0..=1000"),
                ));
            }
            out.push((gid, GPU_MILLI - used as u32));
        }
        Ok(out)
    }

    /// MIG GPU `mi`: a unique id, its instances (known profiles at valid starts that fit the
    /// GPU together), its DRA and dynamic flags, and its free memory slices.
    fn mig_gpu(&mut self, numa: i64, mi: usize) -> CoreResult<MigGpu> {
        let c = self.c;
        let id = c.mig_gpu_ids[mi];
        let name = self.name;
        let mf = |f: &str| zone_field(name, numa, &format!("mig[gpu={id}].{f}"));
        let gid = self.gpu_id(id, || mf("gpu"))?;
        let model = self
            .model
            .ok_or_else(|| CoreError::new(mf("gpu"), "internal: MIG GPU without a model"))?;
        let instances = self.instances(model, numa, id, mi)?;
        let dra = c.mig_dra.get(mi).copied().unwrap_or(false);
        let dynamic = c.mig_dynamic.get(mi).copied().unwrap_or(false);
        if dynamic && instances.iter().any(|i| !i.used) {
            return Err(CoreError::new(
                mf("instances"),
                "a dynamic (DynamicMIG) GPU lists only allocated placements: every instance must be used",
            ));
        }
        let pinned: Vec<(usize, u8)> = instances.iter().map(|i| (i.profile, i.start)).collect();
        let given = c.mig_free_slices.get(mi).copied().unwrap_or(-1);
        let free_mask = free_mask(model, &pinned, given, dynamic, || mf("free_slices"))?;
        if place(model, &pinned, &[]).is_none() {
            return Err(CoreError::new(
                mf("instances"),
                format!(
                    "these instances overlap or exceed the GPU ({}): {:?}",
                    model.name,
                    instances
                        .iter()
                        .map(|i| format!("{}@{}", model.profiles[i.profile].name, i.start))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        let used_compute: u32 = instances.iter().map(|i| i.compute_slices as u32).sum();
        Ok(MigGpu {
            id: gid,
            instances,
            unpartitioned_slices: (model.compute_slices as u32).saturating_sub(used_compute) as u8,
            dra,
            dynamic,
            free_mask,
        })
    }

    /// The instances of MIG GPU `mi` (GPU id `id`): each a profile of the model at one of the
    /// profile's placements.
    fn instances(
        &self,
        model: &GpuModel,
        numa: i64,
        id: i64,
        mi: usize,
    ) -> CoreResult<Vec<MigInstance>> {
        let c = self.c;
        let first = c.instance_offsets[mi];
        let mut out = Vec::with_capacity(c.instance_offsets[mi + 1] - first);
        for ii in first..c.instance_offsets[mi + 1] {
            let pname = &c.instance_profiles[ii];
            let pf = || {
                zone_field(
                    self.name,
                    numa,
                    &format!("mig[gpu={id}].instances[{}]", ii - first),
                )
            };
            let p = model
                .profile_index(pname)
                .map_err(|e| CoreError::new(pf(), e.message))?;
            let prof = &model.profiles[p];
            let start = c.instance_starts[ii];
            if !(0..=255).contains(&start)
                || !prof.placements.iter().any(|pl| pl.start as i64 == start)
            {
                let starts: Vec<u8> = prof.placements.iter().map(|pl| pl.start).collect();
                return Err(CoreError::new(
                    pf(),
                    format!("{pname} cannot start at memory slice {start} on {} (valid starts {starts:?})", model.name),
                ));
            }
            out.push(MigInstance {
                profile: p,
                start: start as u8,
                compute_slices: prof.compute_slices,
                used: c.instance_used[ii],
            });
        }
        Ok(out)
    }

    /// The node: a unique name, a known policy, its zones, sharing pool, replicas per GPU and
    /// per-GPU memory.
    fn node(mut self, names: &mut HashSet<&'a str>) -> CoreResult<Node> {
        let c = self.c;
        let i = self.i;
        if !names.insert(self.name) {
            return Err(CoreError::new(self.field("name"), "duplicate node name"));
        }
        let policy = Policy::parse(&c.node_policies[i])
            .map_err(|e| CoreError::new(self.field("topology_policy"), e.message))?;
        let zr = self.zone_range(policy)?;
        let mig = self.mig_model(zr.clone())?;
        self.model = mig.map(|(m, _)| m);
        let zones = zr
            .clone()
            .map(|zi| self.zone(zi))
            .collect::<CoreResult<Vec<_>>>()?;
        let links = self.links(zr, &zones)?;
        let gpu_replicas = match c.node_gpu_replicas.get(i) {
            None => 1,
            Some(&r) if (1..=MAX_REPLICAS).contains(&r) => r as u32,
            Some(&r) => {
                return Err(CoreError::new(
                    self.field("gpu_replicas"),
                    format!("{r} is outside 1..={MAX_REPLICAS}"),
                ))
            }
        };
        let gpu_memory_mib = match c.node_gpu_memory_mib.get(i) {
            None => 0,
            Some(&m) => amount(m, || self.field("gpu_memory_mib"))?,
        };
        let rdma = match c.node_rdma.get(i) {
            None => 0,
            Some(&r) => amount(r, || self.field("rdma"))?,
        };
        let rdma_used = match c.node_rdma_used.get(i) {
            None => 0,
            Some(&u) => amount(u, || self.field("rdma_used"))?,
        };
        let rdma_free = free_within(rdma, rdma_used, || self.field("rdma_used"))?;
        Ok(Node {
            name: self.name.to_string(),
            gpu_model: c.node_models[i].clone(),
            mig_model: mig.map(|(_, index)| index),
            policy,
            cpu_static: c.node_cpu_static[i],
            memory_static: c.node_memory_static[i],
            zones,
            gpu_pool: c.node_gpu_pools.get(i).cloned().unwrap_or_default(),
            gpu_replicas,
            gpu_memory_mib,
            links,
            rdma,
            rdma_free,
        })
    }

    /// The node's levels of link groups, smallest size first: the device-plugin GPUs' groups
    /// of any size (`gpu_link_groups`, zones `zr`), then the node's link entries. An entry
    /// names a whole GPU of the node, once per level, with a group in 0..u32::MAX/2; a level
    /// of size N has no group of more than N GPUs.
    fn links(&self, zr: std::ops::Range<usize>, zones: &[Zone]) -> CoreResult<Vec<LinkLevel>> {
        let c = self.c;
        let field = || self.field("links");
        // (size, GPU id, group)
        let mut entries: Vec<(u32, u32, u32)> = Vec::new();
        if !c.gpu_link_groups.is_empty() && !zr.is_empty() {
            for gi in c.gpu_offsets[zr.start]..c.gpu_offsets[zr.end] {
                let group = c.gpu_link_groups[gi];
                if group >= 0 {
                    entries.push((
                        ANY_SIZE,
                        link_id(c.gpu_ids[gi], field)?,
                        link_group(group, field)?,
                    ));
                }
            }
        }
        if !c.node_link_offsets.is_empty() {
            for k in c.node_link_offsets[self.i]..c.node_link_offsets[self.i + 1] {
                let size = match c.link_sizes[k] {
                    0 => ANY_SIZE,
                    s if (1..ANY_SIZE as i64).contains(&s) => s as u32,
                    s => {
                        return Err(CoreError::new(
                            field(),
                            format!("level size {s} is out of range (0: any, else 1..{ANY_SIZE})"),
                        ))
                    }
                };
                let id = link_id(c.link_gpu_ids[k], field)?;
                entries.push((size, id, link_group(c.link_groups[k], field)?));
            }
        }
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        // the node's whole GPUs: id -> published by a DRA driver
        let mut whole: Vec<(u32, bool)> = zones
            .iter()
            .flat_map(|z| {
                z.gpus
                    .iter()
                    .map(|&(id, _)| (id, false))
                    .chain(z.dra_gpus.iter().map(|&(id, _)| (id, true)))
            })
            .collect();
        whole.sort_unstable();
        entries.sort_unstable();
        let mut levels: Vec<LinkLevel> = Vec::new();
        for (k, &(size, id, group)) in entries.iter().enumerate() {
            let Ok(w) = whole.binary_search_by_key(&id, |&(g, _)| g) else {
                return Err(CoreError::new(
                    field(),
                    format!("GPU {id} is not a whole GPU of the node"),
                ));
            };
            if k > 0 && entries[k - 1].0 == size && entries[k - 1].1 == id {
                return Err(CoreError::new(
                    field(),
                    format!("GPU {id} is listed twice at level {}", size_name(size)),
                ));
            }
            if levels.last().map(|l| l.size) != Some(size) {
                levels.push(LinkLevel {
                    size,
                    groups: Vec::new(),
                    plugin: false,
                    dra: false,
                });
            }
            if let Some(level) = levels.last_mut() {
                level.groups.push((id, group));
                if whole[w].1 {
                    level.dra = true;
                } else {
                    level.plugin = true;
                }
            }
        }
        for level in levels.iter().filter(|l| l.size != ANY_SIZE) {
            let mut groups: Vec<u32> = level.groups.iter().map(|&(_, g)| g).collect();
            groups.sort_unstable();
            for run in groups.chunk_by(|a, b| a == b) {
                if run.len() > level.size as usize {
                    return Err(CoreError::new(
                        field(),
                        format!(
                            "group {} of level {} holds {} GPUs",
                            run[0],
                            level.size,
                            run.len()
                        ),
                    ));
                }
            }
        }
        Ok(levels)
    }
}

/// A level's size in words.
fn size_name(size: u32) -> String {
    if size == ANY_SIZE {
        "any".into()
    } else {
        size.to_string()
    }
}

/// A GPU id of a link entry, within u32.
fn link_id(id: i64, field: impl Fn() -> String) -> CoreResult<u32> {
    u32::try_from(id).map_err(|_| {
        CoreError::new(
            field(),
            format!("GPU id {id} of a link group is out of range"),
        )
    })
}

/// A link group number, within 0..u32::MAX/2 (the numbers above are the unlisted GPUs').
fn link_group(group: i64, field: impl Fn() -> String) -> CoreResult<u32> {
    match u32::try_from(group) {
        Ok(g) if g < u32::MAX / 2 => Ok(g),
        _ => Err(CoreError::new(
            field(),
            format!("link group {group} is out of range (0..{})", u32::MAX / 2),
        )),
    }
}

/// `nodes["name"].zones[numa=N].<f>`
fn zone_field(name: &str, numa: i64, f: &str) -> String {
    format!("nodes[{name:?}].zones[numa={numa}].{f}")
}

/// What is free of an amount whose use must not exceed its capacity.
fn free_within(cap: u64, used: u64, field: impl Fn() -> String) -> CoreResult<u64> {
    match cap.checked_sub(used) {
        Some(free) => Ok(free),
        None => Err(CoreError::new(
            field(),
            format!("{used} is above capacity {cap}"),
        )),
    }
}

/// The free memory slices of a MIG GPU: those no instance covers, unless the column gives
/// them (`given` >= 0), which only a dynamic GPU may do, and then within the GPU's slices and
/// clear of the allocated placements.
fn free_mask(
    model: &GpuModel,
    pinned: &[(usize, u8)],
    given: i64,
    dynamic: bool,
    field: impl Fn() -> String,
) -> CoreResult<u16> {
    let mut used_mask = 0u16;
    for &(p, start) in pinned {
        if let Some(pl) = model.profiles.get(p).and_then(|pr| pr.placement_at(start)) {
            used_mask |= pl.mask();
        }
    }
    let full = model.full_mask();
    let free = match given {
        -1 => full & !used_mask,
        f if (0..=full as i64).contains(&f) && (f as u16) & !full == 0 => {
            if (f as u16) & used_mask != 0 {
                return Err(CoreError::new(
                    field(),
                    format!(
                        "free memory slices {f:#b} overlap the allocated placements {used_mask:#b}"
                    ),
                ));
            }
            f as u16
        }
        f => {
            return Err(CoreError::new(
                field(),
                format!(
                    "{f:#b} is not a set of the GPU's {} memory slices",
                    model.memory_slices
                ),
            ))
        }
    };
    if !dynamic && free != full & !used_mask {
        return Err(CoreError::new(
            field(),
            "free memory slices are only given for dynamic GPUs",
        ));
    }
    Ok(free)
}

impl Cluster {
    /// Builds the model from flat columns, validating every value (errors name the node, zone,
    /// GPU or instance and the field): column lengths and offsets first, then node by node.
    pub fn from_columns(c: &ClusterColumns) -> CoreResult<Cluster> {
        // the DRA columns are optional (callers without DRA devices leave them empty)
        let no_dra_offsets;
        let dra_offsets: &[usize] = if c.dra_gpu_offsets.is_empty() {
            no_dra_offsets = vec![0usize; c.zone_numa.len() + 1];
            &no_dra_offsets
        } else {
            &c.dra_gpu_offsets
        };
        check_columns(c, dra_offsets)?;
        let mut names = HashSet::with_capacity(c.node_names.len());
        let mut nodes = Vec::with_capacity(c.node_names.len());
        for (i, name) in c.node_names.iter().enumerate() {
            let reader = NodeReader {
                c,
                dra_offsets,
                i,
                name,
                model: None,
                numa_seen: 0,
                gpu_seen: HashSet::new(),
            };
            nodes.push(reader.node(&mut names)?);
        }
        Ok(Cluster { nodes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::rng::Rng;

    /// One node "n" (A100-SXM4-40GB, restricted, static CPU manager) with two zones:
    /// zone NUMA 0: 32 CPUs (8 used), 64 GiB (1 GiB used), GPU 0 idle, GPU 1 at 250 milli,
    /// DRA GPU 3 fully used; zone NUMA 1: 32 idle CPUs, 64 GiB, MIG GPU 2 holding 3g.20gb@0
    /// (used) and 2g.10gb@4 (free).
    fn fixture() -> ClusterColumns {
        ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["A100-SXM4-40GB".into()],
            node_policies: vec!["restricted".into()],
            node_cpu_static: vec![true],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 2],
            zone_numa: vec![0, 1],
            zone_cpu_milli: vec![32000, 32000],
            zone_cpu_used: vec![8000, 0],
            zone_memory_mib: vec![65536, 65536],
            zone_memory_used: vec![1024, 0],
            gpu_offsets: vec![0, 2, 2],
            gpu_ids: vec![0, 1],
            gpu_used_milli: vec![0, 250],
            mig_offsets: vec![0, 0, 1],
            mig_gpu_ids: vec![2],
            instance_offsets: vec![0, 2],
            instance_profiles: vec!["3g.20gb".into(), "2g.10gb".into()],
            instance_starts: vec![0, 4],
            instance_used: vec![true, false],
            dra_gpu_offsets: vec![0, 1, 1],
            dra_gpu_ids: vec![3],
            dra_gpu_used_milli: vec![1000],
            ..Default::default()
        }
    }

    /// A change to the fixture's columns.
    type Change = Box<dyn FnOnce(&mut ClusterColumns)>;

    /// The error `from_columns` gives for the fixture changed by `change`.
    fn rejected(change: impl FnOnce(&mut ClusterColumns)) -> CoreError {
        let mut c = fixture();
        change(&mut c);
        match Cluster::from_columns(&c) {
            Ok(_) => panic!("accepted: {c:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn the_fixture_reads_as_worked_out_by_hand() {
        let cl = Cluster::from_columns(&fixture()).unwrap();
        assert_eq!(cl.nodes.len(), 1);
        let n = &cl.nodes[0];
        assert_eq!(n.policy, Policy::Restricted);
        assert!(n.cpu_static && !n.memory_static);
        // optional columns absent: no pool, not replicated, GPU memory unknown
        assert_eq!(
            (n.gpu_pool.as_str(), n.gpu_replicas, n.gpu_memory_mib),
            ("", 1, 0)
        );
        let cat = Catalog::builtin();
        assert_eq!(cat.models()[n.mig_model.unwrap()].name, "A100-SXM4-40GB");
        let z0 = &n.zones[0];
        assert_eq!((z0.numa, z0.cpu_milli, z0.cpu_free), (0, 32000, 24000));
        assert_eq!((z0.memory_mib, z0.memory_free), (65536, 64512));
        assert_eq!(z0.gpus, vec![(0, 1000), (1, 750)]);
        assert_eq!(z0.dra_gpus, vec![(3, 0)]);
        assert_eq!(z0.gpus_of(true), &[(3, 0)]);
        assert!(z0.mig.is_empty());
        let z1 = &n.zones[1];
        assert!(z1.gpus.is_empty() && z1.dra_gpus.is_empty());
        let g = &z1.mig[0];
        assert_eq!(g.id, 2);
        assert!(!g.dra && !g.dynamic);
        // 3g (3 compute) + 2g (2 compute) of 7: 2 unpartitioned; memory slices 0-3 and 4-5
        // taken, 6-7 free
        assert_eq!(g.unpartitioned_slices, 2);
        assert_eq!(g.free_mask, 0b1100_0000);
        let profiles: Vec<&str> = g
            .instances
            .iter()
            .map(|i| {
                cat.models()[n.mig_model.unwrap()].profiles[i.profile]
                    .name
                    .as_str()
            })
            .collect();
        assert_eq!(profiles, ["3g.20gb", "2g.10gb"]);
        assert_eq!(g.instances[1].compute_slices, 2);
        // idle: 1000 + 750 + 0 milli-GPU; 2 unpartitioned + the free 2g's 2 compute slices
        assert_eq!(n.idle_gpu_milli(), 1750);
        assert_eq!(z1.idle_mig_slices(), 4);
        assert_eq!(n.idle_mig_slices(), 4);
    }

    #[test]
    fn optional_columns_are_read_per_node() {
        let mut c = fixture();
        c.node_gpu_pools = vec!["hami".into()];
        c.node_gpu_replicas = vec![4];
        c.node_gpu_memory_mib = vec![40960];
        c.mig_dra = vec![true];
        c.mig_dynamic = vec![false];
        c.mig_free_slices = vec![-1];
        c.node_rdma = vec![400];
        c.node_rdma_used = vec![150];
        let n = Cluster::from_columns(&c).unwrap().nodes.remove(0);
        assert_eq!(
            (n.gpu_pool.as_str(), n.gpu_replicas, n.gpu_memory_mib),
            ("hami", 4, 40960)
        );
        assert_eq!((n.rdma, n.rdma_free), (400, 250));
        assert!(n.zones[1].mig[0].dra);
        // absent: none
        let n = Cluster::from_columns(&fixture()).unwrap().nodes.remove(0);
        assert_eq!((n.rdma, n.rdma_free), (0, 0));
    }

    #[test]
    fn a_dynamic_gpu_takes_its_free_slices_from_the_column() {
        let mut c = fixture();
        c.instance_used = vec![true, true];
        c.mig_dynamic = vec![true];
        // the published counters see only slice 7 free (6 is held by something else)
        c.mig_free_slices = vec![0b1000_0000];
        let n = Cluster::from_columns(&c).unwrap().nodes.remove(0);
        let g = &n.zones[1].mig[0];
        assert!(g.dynamic);
        assert_eq!(g.free_mask, 0b1000_0000);
        // an unused instance on a dynamic GPU is refused
        let e = rejected(|c| {
            c.mig_dynamic = vec![true];
        });
        assert_eq!(e.field, "nodes[\"n\"].zones[numa=1].mig[gpu=2].instances");
    }

    #[test]
    fn a_node_without_mig_needs_no_known_model() {
        let mut c = fixture();
        c.node_models = vec!["Tesla-T4".into()];
        c.mig_offsets = vec![0, 0, 0];
        c.mig_gpu_ids.clear();
        c.instance_offsets = vec![0];
        c.instance_profiles.clear();
        c.instance_starts.clear();
        c.instance_used.clear();
        let n = Cluster::from_columns(&c).unwrap().nodes.remove(0);
        assert_eq!(n.mig_model, None);
        assert_eq!(n.idle_mig_slices(), 0);
    }

    #[test]
    fn columns_of_the_wrong_length_are_named() {
        let cases: Vec<(&str, Change)> = vec![
            ("node_models", Box::new(|c| c.node_models.clear())),
            (
                "node_policies",
                Box::new(|c| c.node_policies.push("none".into())),
            ),
            ("node_cpu_static", Box::new(|c| c.node_cpu_static.clear())),
            (
                "node_memory_static",
                Box::new(|c| c.node_memory_static.clear()),
            ),
            (
                "node_gpu_pools",
                Box::new(|c| c.node_gpu_pools = vec!["".into(); 2]),
            ),
            (
                "node_gpu_replicas",
                Box::new(|c| c.node_gpu_replicas = vec![1, 1]),
            ),
            (
                "node_gpu_memory_mib",
                Box::new(|c| c.node_gpu_memory_mib = vec![0, 0]),
            ),
            ("node_rdma", Box::new(|c| c.node_rdma = vec![0, 0])),
            (
                "node_rdma_used",
                Box::new(|c| c.node_rdma_used = vec![0, 0]),
            ),
            (
                "zone_cpu_milli",
                Box::new(|c| c.zone_cpu_milli.pop().map(drop).unwrap_or(())),
            ),
            ("zone_cpu_used", Box::new(|c| c.zone_cpu_used.push(0))),
            ("zone_memory_mib", Box::new(|c| c.zone_memory_mib.clear())),
            ("zone_memory_used", Box::new(|c| c.zone_memory_used.clear())),
            ("gpu_used_milli", Box::new(|c| c.gpu_used_milli.push(0))),
            ("instance_starts", Box::new(|c| c.instance_starts.clear())),
            ("instance_starts", Box::new(|c| c.instance_used.push(true))),
            (
                "dra_gpu_used_milli",
                Box::new(|c| c.dra_gpu_used_milli.clear()),
            ),
            ("mig_dra", Box::new(|c| c.mig_dra = vec![false, false])),
            (
                "mig_dynamic",
                Box::new(|c| c.mig_dynamic = vec![false, true]),
            ),
            (
                "mig_free_slices",
                Box::new(|c| c.mig_free_slices = vec![-1, -1]),
            ),
        ];
        for (field, change) in cases {
            let e = rejected(change);
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.starts_with("length differs from"), "{e}");
        }
    }

    #[test]
    fn offsets_that_do_not_describe_the_arrays_are_named() {
        let cases: Vec<(&str, Change)> = vec![
            ("zone_offsets", Box::new(|c| c.zone_offsets = vec![0, 1])),
            ("zone_offsets", Box::new(|c| c.zone_offsets = vec![1, 2])),
            ("zone_offsets", Box::new(|c| c.zone_offsets = vec![0, 2, 2])),
            ("gpu_offsets", Box::new(|c| c.gpu_offsets = vec![0, 3, 2])),
            ("gpu_offsets", Box::new(|c| c.gpu_offsets = vec![0, 2])),
            ("mig_offsets", Box::new(|c| c.mig_offsets = vec![0, 1, 0])),
            (
                "instance_offsets",
                Box::new(|c| c.instance_offsets = vec![0, 1]),
            ),
            ("instance_offsets", Box::new(|c| c.instance_offsets.clear())),
            (
                "dra_gpu_offsets",
                Box::new(|c| c.dra_gpu_offsets = vec![0, 0, 0]),
            ),
        ];
        for (field, change) in cases {
            let e = rejected(change);
            assert_eq!(e.field, field, "{e}");
        }
        // DRA offsets are optional when there are no DRA GPUs
        let mut c = fixture();
        c.dra_gpu_offsets.clear();
        c.dra_gpu_ids.clear();
        c.dra_gpu_used_milli.clear();
        assert!(Cluster::from_columns(&c).is_ok());
    }

    #[test]
    fn bad_values_are_named_by_node_zone_gpu_and_field() {
        let z0 = "nodes[\"n\"].zones[numa=0]";
        let mig = "nodes[\"n\"].zones[numa=1].mig[gpu=2]";
        let cases: Vec<(String, Change)> = vec![
            (
                "nodes[\"n\"].topology_policy".into(),
                Box::new(|c| c.node_policies[0] = "strict".into()),
            ),
            (
                "nodes[\"n\"].zones".into(),
                Box::new(|c| {
                    // every zone moved to a second node: "n" has none
                    c.node_names.push("m".into());
                    c.node_models.push("A100-SXM4-40GB".into());
                    c.node_policies.push("none".into());
                    c.node_cpu_static.push(false);
                    c.node_memory_static.push(false);
                    c.zone_offsets = vec![0, 0, 2];
                }),
            ),
            (format!("{z0}.numa"), Box::new(|c| c.zone_numa[1] = 0)),
            (
                "nodes[\"n\"].zones[numa=64].numa".into(),
                Box::new(|c| c.zone_numa[0] = 64),
            ),
            (
                "nodes[\"n\"].zones[numa=-1].numa".into(),
                Box::new(|c| c.zone_numa[0] = -1),
            ),
            (
                format!("{z0}.cpu_milli"),
                Box::new(|c| c.zone_cpu_milli[0] = -1),
            ),
            (
                format!("{z0}.cpu_milli_used"),
                Box::new(|c| c.zone_cpu_used[0] = 32001),
            ),
            (
                format!("{z0}.memory_mib"),
                Box::new(|c| c.zone_memory_mib[0] = -5),
            ),
            (
                format!("{z0}.memory_mib_used"),
                Box::new(|c| c.zone_memory_used[0] = 65537),
            ),
            (
                format!("{z0}.gpus[id=-1].id"),
                Box::new(|c| c.gpu_ids[0] = -1),
            ),
            (
                format!("{z0}.gpus[id=0].id"),
                Box::new(|c| c.gpu_ids[1] = 0),
            ),
            (
                format!("{z0}.gpus[id=1].used_milli"),
                Box::new(|c| c.gpu_used_milli[1] = 1001),
            ),
            (
                format!("{z0}.gpus[id=0].used_milli"),
                Box::new(|c| c.gpu_used_milli[0] = -1),
            ),
            // GPU ids are unique across kinds: a DRA GPU with a plugin GPU's id
            (
                format!("{z0}.dra_gpus[id=0].id"),
                Box::new(|c| c.dra_gpu_ids[0] = 0),
            ),
            (
                format!("{z0}.dra_gpus[id=3].used_milli"),
                Box::new(|c| c.dra_gpu_used_milli[0] = 2000),
            ),
            // a MIG GPU with a plugin GPU's id
            (
                "nodes[\"n\"].zones[numa=1].mig[gpu=1].gpu".into(),
                Box::new(|c| c.mig_gpu_ids[0] = 1),
            ),
            (
                "nodes[\"n\"].gpu_model".into(),
                Box::new(|c| c.node_models[0] = "Tesla-T4".into()),
            ),
            (
                format!("{mig}.instances[1]"),
                Box::new(|c| c.instance_profiles[1] = "5g.25gb".into()),
            ),
            (
                format!("{mig}.instances[1]"),
                Box::new(|c| c.instance_starts[1] = 3),
            ),
            (
                format!("{mig}.instances[0]"),
                Box::new(|c| c.instance_starts[0] = 256),
            ),
            // two placements that overlap: 3g.20gb@4 (slices 4-7) and 2g.10gb@4
            (
                format!("{mig}.instances"),
                Box::new(|c| c.instance_starts[0] = 4),
            ),
            (
                format!("{mig}.free_slices"),
                Box::new(|c| c.mig_free_slices = vec![0b1000_0000]),
            ),
            (
                format!("{mig}.free_slices"),
                Box::new(|c| c.mig_free_slices = vec![0x1FF]),
            ),
            (
                format!("{mig}.free_slices"),
                Box::new(|c| {
                    c.instance_used = vec![true, true];
                    c.mig_dynamic = vec![true];
                    c.mig_free_slices = vec![0b0000_0001]; // slice 0 is the 3g's
                }),
            ),
            (
                "nodes[\"n\"].gpu_replicas".into(),
                Box::new(|c| c.node_gpu_replicas = vec![0]),
            ),
            (
                "nodes[\"n\"].gpu_replicas".into(),
                Box::new(|c| c.node_gpu_replicas = vec![MAX_REPLICAS + 1]),
            ),
            (
                "nodes[\"n\"].gpu_memory_mib".into(),
                Box::new(|c| c.node_gpu_memory_mib = vec![-1]),
            ),
            (
                "nodes[\"n\"].rdma".into(),
                Box::new(|c| c.node_rdma = vec![-1]),
            ),
            (
                "nodes[\"n\"].rdma_used".into(),
                Box::new(|c| {
                    c.node_rdma = vec![400];
                    c.node_rdma_used = vec![401];
                }),
            ),
        ];
        for (field, change) in cases {
            let e = rejected(change);
            assert_eq!(e.field, field, "{e}");
            assert!(!e.message.is_empty());
        }
    }

    #[test]
    fn node_names_are_unique_and_zone_counts_bounded() {
        let mut c = fixture();
        let more = c.clone();
        // a second node "n"
        c.node_names.push("n".into());
        c.node_models.push("x".into());
        c.node_policies.push("none".into());
        c.node_cpu_static.push(false);
        c.node_memory_static.push(false);
        c.zone_offsets.push(3);
        c.zone_numa.push(0);
        c.zone_cpu_milli.push(0);
        c.zone_cpu_used.push(0);
        c.zone_memory_mib.push(0);
        c.zone_memory_used.push(0);
        c.gpu_offsets.push(2);
        c.mig_offsets.push(1);
        c.dra_gpu_offsets.push(1);
        let e = Cluster::from_columns(&c).unwrap_err();
        assert_eq!(e.field, "nodes[\"n\"].name");
        c.node_names[1] = "m".into();
        assert_eq!(Cluster::from_columns(&c).unwrap().nodes.len(), 2);
        // 17 zones: fine under none, refused under restricted (the merge handles 16)
        let mut c = more;
        c.node_policies = vec!["none".into()];
        for z in 2..17 {
            c.zone_numa.push(z);
            c.zone_cpu_milli.push(0);
            c.zone_cpu_used.push(0);
            c.zone_memory_mib.push(0);
            c.zone_memory_used.push(0);
            c.gpu_offsets.push(2);
            c.mig_offsets.push(1);
            c.dra_gpu_offsets.push(1);
        }
        c.zone_offsets = vec![0, 17];
        assert_eq!(Cluster::from_columns(&c).unwrap().nodes[0].zones.len(), 17);
        c.node_policies = vec!["restricted".into()];
        let e = Cluster::from_columns(&c).unwrap_err();
        assert_eq!(e.field, "nodes[\"n\"].zones");
        assert!(e.message.contains("at most 16"), "{e}");
    }

    /// Random columns: `nodes` nodes of 1-4 zones with plugin, DRA and MIG GPUs (random valid
    /// layouts of 1g.5gb and 2g.10gb instances), amounts within capacity.
    fn random_columns(rng: &mut Rng, nodes: usize) -> ClusterColumns {
        let mut c = ClusterColumns::default();
        c.zone_offsets.push(0);
        c.gpu_offsets.push(0);
        c.dra_gpu_offsets.push(0);
        c.mig_offsets.push(0);
        c.instance_offsets.push(0);
        c.node_link_offsets.push(0);
        for i in 0..nodes {
            c.node_names.push(format!("node-{i}"));
            c.node_models.push("A100-SXM4-40GB".into());
            c.node_policies.push(
                ["none", "best-effort", "restricted", "single-numa-node"][rng.below(4) as usize]
                    .into(),
            );
            c.node_cpu_static.push(rng.below(2) == 0);
            c.node_memory_static.push(rng.below(2) == 0);
            c.node_gpu_pools.push(String::new());
            c.node_gpu_replicas.push(1 + rng.below(4) as i64);
            c.node_gpu_memory_mib.push(40960);
            let rdma = rng.below(3) as i64 * 200;
            c.node_rdma.push(rdma);
            c.node_rdma_used.push(rng.below(rdma as u64 + 1) as i64);
            let mut id = 0;
            for z in 0..1 + rng.below(4) as i64 {
                let cpu = rng.below(64_000) as i64;
                let mem = rng.below(1 << 20) as i64;
                c.zone_numa.push(z);
                c.zone_cpu_milli.push(cpu);
                c.zone_cpu_used.push(rng.below(cpu as u64 + 1) as i64);
                c.zone_memory_mib.push(mem);
                c.zone_memory_used.push(rng.below(mem as u64 + 1) as i64);
                for _ in 0..rng.below(4) {
                    c.gpu_ids.push(id);
                    c.gpu_used_milli.push(rng.below(1001) as i64);
                    id += 1;
                }
                c.gpu_offsets.push(c.gpu_ids.len());
                for _ in 0..rng.below(2) {
                    c.dra_gpu_ids.push(id);
                    c.dra_gpu_used_milli.push(rng.below(1001) as i64);
                    id += 1;
                }
                c.dra_gpu_offsets.push(c.dra_gpu_ids.len());
                for _ in 0..rng.below(2) {
                    c.mig_gpu_ids.push(id);
                    c.mig_dra.push(false);
                    c.mig_dynamic.push(false);
                    c.mig_free_slices.push(-1);
                    id += 1;
                    // 2g.10gb at 0, 2 or 4, or 1g.5gb, each pair of slices at most once
                    for s in [0i64, 2, 4] {
                        match rng.below(3) {
                            0 => {}
                            1 => c.instance_profiles.push("2g.10gb".into()),
                            _ => c.instance_profiles.push("1g.5gb".into()),
                        }
                        if c.instance_profiles.len() > c.instance_starts.len() {
                            c.instance_starts.push(s);
                            c.instance_used.push(rng.below(2) == 0);
                        }
                    }
                    c.instance_offsets.push(c.instance_profiles.len());
                }
                c.mig_offsets.push(c.mig_gpu_ids.len());
            }
            c.zone_offsets.push(c.zone_numa.len());
            // some whole GPUs (ids of either source) in groups of two at a level of size 2
            let first = c.zone_offsets[i];
            let wholes: Vec<i64> = c.gpu_ids[c.gpu_offsets[first]..]
                .iter()
                .chain(&c.dra_gpu_ids[c.dra_gpu_offsets[first]..])
                .copied()
                .collect();
            for id in wholes {
                if rng.below(2) == 0 {
                    c.link_sizes.push(2);
                    c.link_gpu_ids.push(id);
                    c.link_groups.push(id / 2);
                }
            }
            c.node_link_offsets.push(c.link_gpu_ids.len());
        }
        c
    }

    #[test]
    fn random_valid_columns_keep_their_totals() {
        let mut rng = Rng::new(15);
        for _ in 0..200 {
            let nodes = 1 + rng.below(5) as usize;
            let c = random_columns(&mut rng, nodes);
            let cl = Cluster::from_columns(&c).unwrap();
            assert_eq!(cl.nodes.len(), c.node_names.len());
            let listed: usize = cl
                .nodes
                .iter()
                .flat_map(|n| &n.links)
                .map(|l| l.groups.len())
                .sum();
            assert_eq!(listed, c.link_gpu_ids.len());
            let zones: Vec<&Zone> = cl.nodes.iter().flat_map(|n| &n.zones).collect();
            assert_eq!(zones.len(), c.zone_numa.len());
            // free = capacity - used, zone by zone
            for (k, z) in zones.iter().enumerate() {
                assert_eq!(z.cpu_free as i64, c.zone_cpu_milli[k] - c.zone_cpu_used[k]);
                assert_eq!(
                    z.memory_free as i64,
                    c.zone_memory_mib[k] - c.zone_memory_used[k]
                );
            }
            let idle: u64 = cl.nodes.iter().map(Node::idle_gpu_milli).sum();
            let used: i64 = c.gpu_used_milli.iter().chain(&c.dra_gpu_used_milli).sum();
            let gpus = (c.gpu_ids.len() + c.dra_gpu_ids.len()) as i64;
            assert_eq!(idle as i64, gpus * 1000 - used);
            // every compute slice of a MIG GPU is used, free in an instance, or unpartitioned
            for g in zones.iter().flat_map(|z| &z.mig) {
                let used: u64 = g
                    .instances
                    .iter()
                    .filter(|i| i.used)
                    .map(|i| i.compute_slices as u64)
                    .sum();
                assert_eq!(g.idle_slices() + used, 7);
            }
        }
    }

    #[test]
    fn no_corruption_of_a_column_panics() {
        // Hostile input: random values written over random entries, and random truncations;
        // from_columns answers Ok or an error naming a field, never panics.
        let mut rng = Rng::new(16);
        let values = [
            i64::MIN,
            -1,
            0,
            1,
            7,
            63,
            64,
            255,
            256,
            1000,
            1001,
            i64::MAX,
        ];
        for round in 0..2000 {
            let mut c = random_columns(&mut rng, 2);
            for _ in 0..1 + rng.below(3) {
                let v = values[rng.below(values.len() as u64) as usize];
                let cols: [&mut Vec<i64>; 18] = [
                    &mut c.link_sizes,
                    &mut c.link_gpu_ids,
                    &mut c.link_groups,
                    &mut c.zone_numa,
                    &mut c.zone_cpu_milli,
                    &mut c.zone_cpu_used,
                    &mut c.zone_memory_mib,
                    &mut c.zone_memory_used,
                    &mut c.gpu_ids,
                    &mut c.gpu_used_milli,
                    &mut c.mig_gpu_ids,
                    &mut c.instance_starts,
                    &mut c.dra_gpu_used_milli,
                    &mut c.mig_free_slices,
                    &mut c.node_gpu_replicas,
                    &mut c.node_gpu_memory_mib,
                    &mut c.node_rdma,
                    &mut c.node_rdma_used,
                ];
                let k = rng.below(cols.len() as u64) as usize;
                let col = cols.into_iter().nth(k).unwrap();
                if round % 5 == 0 {
                    col.truncate(rng.below(col.len() as u64 + 1) as usize);
                } else if !col.is_empty() {
                    let at = rng.below(col.len() as u64) as usize;
                    col[at] = v;
                }
                let offs: [&mut Vec<usize>; 6] = [
                    &mut c.node_link_offsets,
                    &mut c.zone_offsets,
                    &mut c.gpu_offsets,
                    &mut c.mig_offsets,
                    &mut c.instance_offsets,
                    &mut c.dra_gpu_offsets,
                ];
                if round % 7 == 0 {
                    let k = rng.below(offs.len() as u64) as usize;
                    let o = offs.into_iter().nth(k).unwrap();
                    if !o.is_empty() {
                        let at = rng.below(o.len() as u64) as usize;
                        o[at] = if v < 0 { usize::MAX } else { v as usize };
                    }
                }
            }
            match Cluster::from_columns(&c) {
                Ok(cl) => assert_eq!(cl.nodes.len(), 2),
                Err(e) => assert!(!e.field.is_empty() && !e.message.is_empty()),
            }
        }
    }
}
