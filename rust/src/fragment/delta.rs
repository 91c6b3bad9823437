//! The fragment delta of a hypothetical change on one node (FGD's gradient): placing one task
//! where the node would put it with the least fragment growth, or removing a task that is there.
//! `delta = F_n(M) after - F_n(M) before` (negative: the change reduces fragmentation).

use super::model::LinkLevel;
use super::model::{MigGpu, MigInstance, Node, GPU_MILLI};
use super::score::{
    admission, allows_node, device_view, dynamic_placements, link_level, mig_need, node_model,
    on_node, score_node, MigNeed, Providers, RecoverMemo,
};
use super::workload::Shape;
use crate::error::{CoreError, CoreResult};
use crate::topology::Policy;

/// Where a task sits on a node: amounts taken per zone (by zone position on the node), the
/// whole/shared GPUs it uses, and the MIG instance it uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// (zone position, cpu milli)
    pub cpu: Vec<(usize, u64)>,
    /// (zone position, memory MiB)
    pub memory: Vec<(usize, u64)>,
    /// (zone position, GPU position in the zone, milli-GPU)
    pub gpus: Vec<(usize, usize, u32)>,
    /// (zone position, MIG GPU position in the zone, instance position)
    pub mig: Option<(usize, usize, usize)>,
    /// (zone position, DRA GPU position in the zone, milli-GPU)
    pub dra_gpus: Vec<(usize, usize, u32)>,
    /// Dynamic MIG GPUs taken whole (the DRA driver's full device): (zone, MIG GPU position)
    pub dyn_whole: Vec<(usize, usize)>,
    /// A placement on a dynamic MIG GPU: (zone, MIG GPU position, profile index, start)
    pub mig_new: Option<(usize, usize, usize, u8)>,
    /// Of the node's RDMA resource (node-wide).
    pub rdma: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Delta {
    pub fragment_gpu_milli: f64,
    pub fragment_mig_slices: f64,
    pub assignment: Assignment,
}

fn total_fragment(node: &Node, shapes: &[Shape], memo: &mut RecoverMemo) -> (f64, f64) {
    let s = score_node(node, shapes, memo);
    (s.fragment_gpu_milli, s.fragment_mig_slices)
}

/// An error about the assignment (it does not fit the node).
fn bad(what: &str) -> CoreError {
    CoreError::new("assignment", what.to_string())
}

/// Applies (`place = true`) or undoes an assignment. Fails, leaving the node unchanged, when the
/// assignment does not fit the node (out of range, not enough free, instance busy or idle).
pub fn apply(node: &mut Node, a: &Assignment, place: bool) -> CoreResult<()> {
    let mut n = node.clone();
    apply_host(&mut n, a, place)?;
    apply_gpus(&mut n, a, place)?;
    apply_mig(&mut n, a, place)?;
    *node = n;
    Ok(())
}

/// Takes `v` from (`place`) or gives it back to a free amount of capacity `cap`.
fn take_amount(free: &mut u64, cap: u64, v: u64, place: bool, what: &str) -> CoreResult<()> {
    *free = if place {
        free.checked_sub(v)
            .ok_or_else(|| bad(&format!("not enough free {what}")))?
    } else {
        free.checked_add(v)
            .filter(|&f| f <= cap)
            .ok_or_else(|| bad(&format!("removing more {what} than is used")))?
    };
    Ok(())
}

/// CPU and memory per zone, RDMA of the node.
fn apply_host(n: &mut Node, a: &Assignment, place: bool) -> CoreResult<()> {
    for &(zi, v) in &a.cpu {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        take_amount(&mut z.cpu_free, z.cpu_milli, v, place, "CPU")?;
    }
    for &(zi, v) in &a.memory {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        take_amount(&mut z.memory_free, z.memory_mib, v, place, "memory")?;
    }
    take_amount(&mut n.rdma_free, n.rdma, a.rdma, place, "RDMA")
}

/// Shares of whole/shared GPUs, of the device plugin and of DRA drivers.
fn apply_gpus(n: &mut Node, a: &Assignment, place: bool) -> CoreResult<()> {
    for (list, dra, missing) in [
        (&a.gpus, false, "GPU out of range"),
        (&a.dra_gpus, true, "DRA GPU out of range"),
    ] {
        for &(zi, gi, v) in list {
            let z = n
                .zones
                .get_mut(zi)
                .ok_or_else(|| bad("zone out of range"))?;
            let gpus = if dra { &mut z.dra_gpus } else { &mut z.gpus };
            let g = gpus.get_mut(gi).ok_or_else(|| bad(missing))?;
            let mut free = g.1 as u64;
            take_amount(&mut free, GPU_MILLI as u64, v as u64, place, "GPU share")?;
            g.1 = free as u32;
        }
    }
    Ok(())
}

/// MIG: dynamic GPUs taken whole, a new placement on a dynamic GPU, an existing instance.
fn apply_mig(n: &mut Node, a: &Assignment, place: bool) -> CoreResult<()> {
    let model = node_model(n);
    for &(zi, mi) in &a.dyn_whole {
        let m = model.ok_or_else(|| bad("no MIG model on the node"))?;
        let full = whole_gpu_profile(m)?;
        take_placement(dynamic_gpu(n, zi, mi)?, m, full, 0, place)?;
    }
    if let Some((zi, mi, p, start)) = a.mig_new {
        let m = model.ok_or_else(|| bad("no MIG model on the node"))?;
        take_placement(dynamic_gpu(n, zi, mi)?, m, p, start, place)?;
    }
    if let Some((zi, mi, ii)) = a.mig {
        let inst = n
            .zones
            .get_mut(zi)
            .and_then(|z| z.mig.get_mut(mi))
            .filter(|g| !g.dynamic)
            .and_then(|g| g.instances.get_mut(ii))
            .ok_or_else(|| bad("MIG instance out of range"))?;
        if inst.used == place {
            return Err(bad(if place {
                "MIG instance already in use"
            } else {
                "MIG instance is not in use"
            }));
        }
        inst.used = place;
    }
    Ok(())
}

/// Dynamic MIG GPU `mi` of zone `zi`.
fn dynamic_gpu(n: &mut Node, zi: usize, mi: usize) -> CoreResult<&mut MigGpu> {
    n.zones
        .get_mut(zi)
        .and_then(|z| z.mig.get_mut(mi))
        .filter(|g| g.dynamic)
        .ok_or_else(|| bad("dynamic MIG GPU out of range"))
}

/// The profile that takes the whole GPU (every memory and compute slice).
fn whole_gpu_profile(m: &crate::mig::catalog::GpuModel) -> CoreResult<usize> {
    m.profiles
        .iter()
        .position(|p| p.memory_slices == m.memory_slices && p.compute_slices == m.compute_slices)
        .ok_or_else(|| bad("the GPU model has no whole-GPU profile"))
}

/// Allocates (`place`) or releases the placement of profile `p` at `start` on a dynamic GPU.
fn take_placement(
    g: &mut MigGpu,
    m: &crate::mig::catalog::GpuModel,
    p: usize,
    start: u8,
    place: bool,
) -> CoreResult<()> {
    let prof = m
        .profiles
        .get(p)
        .ok_or_else(|| bad("MIG profile out of range"))?;
    let mask = prof
        .placement_at(start)
        .ok_or_else(|| bad("no such MIG placement"))?
        .mask();
    if place {
        if mask & !g.free_mask != 0 || prof.compute_slices > g.unpartitioned_slices {
            return Err(bad("MIG placement not free"));
        }
        g.free_mask &= !mask;
        g.unpartitioned_slices -= prof.compute_slices;
        g.instances.push(MigInstance {
            profile: p,
            start,
            compute_slices: prof.compute_slices,
            used: true,
        });
    } else {
        let ii = g
            .instances
            .iter()
            .position(|i| i.profile == p && i.start == start)
            .ok_or_else(|| bad("MIG placement is not allocated"))?;
        g.instances.remove(ii);
        g.free_mask |= mask & m.full_mask();
        g.unpartitioned_slices += prof.compute_slices;
    }
    Ok(())
}

/// Amounts per zone position.
type ZoneAmounts = Vec<(usize, u64)>;

/// Takes `amount` from the zones in `order` (first the ones listed), as far as each has free.
fn take(free: &[u64], order: &[usize], amount: u64) -> Option<Vec<(usize, u64)>> {
    let mut left = amount;
    let mut out = Vec::new();
    for &zi in order {
        if left == 0 {
            break;
        }
        let t = free[zi].min(left);
        if t > 0 {
            out.push((zi, t));
            left -= t;
        }
    }
    (left == 0).then_some(out)
}

fn zones_of(mask: u64, n: usize) -> Vec<usize> {
    (0..n).filter(|&i| mask & (1u64 << i) != 0).collect()
}

/// Candidate zone sets to place a task in: the admissible sets under restricted/single-numa-node;
/// otherwise the narrowest sets with enough eligible devices.
fn candidate_sets(node: &Node, shape: &Shape, need: MigNeed, usable: u64) -> Vec<u64> {
    let zones = node.zones.len();
    let (elig, _, d) = device_view(node, shape, need);
    let count = |m: u64| zones_of(m, zones).iter().map(|&i| elig[i]).sum::<u64>();
    let mut sets = Vec::new();
    for w in 1..=zones {
        let mut mask: u64 = if w >= 64 { u64::MAX } else { (1u64 << w) - 1 };
        let limit = if zones >= 64 {
            u64::MAX
        } else {
            (1u64 << zones) - 1
        };
        while mask & !limit == 0 {
            if mask & !usable == 0 && count(mask) >= d {
                sets.push(mask);
            }
            let c = mask & mask.wrapping_neg();
            let r = mask.wrapping_add(c);
            if r == 0 {
                break;
            }
            mask = (((r ^ mask) >> 2) / c) | r;
        }
        if !sets.is_empty() {
            return sets;
        }
    }
    sets
}

/// Where a task's CPU and memory can come from on a node: from a placement's zones first, and
/// only from them when the kubelet's manager for that resource takes part in the alignment.
struct Host<'a> {
    shape: &'a Shape,
    zones: usize,
    cpu_free: Vec<u64>,
    mem_free: Vec<u64>,
    rdma_free: u64,
    /// CPUs only from the placement's zones (static CPU manager, whole CPUs, an aligning
    /// policy; the Topology Manager does not align DRA devices, so not for DRA shapes).
    cpu_inside: bool,
    /// Memory only from the placement's zones (static memory manager, an aligning policy).
    mem_inside: bool,
}

impl<'a> Host<'a> {
    fn new(node: &Node, shape: &'a Shape) -> Self {
        let strict =
            !shape.dra && matches!(node.policy, Policy::Restricted | Policy::SingleNumaNode);
        let prov = Providers::of(node, shape);
        Host {
            shape,
            zones: node.zones.len(),
            cpu_free: node.zones.iter().map(|z| z.cpu_free).collect(),
            mem_free: node.zones.iter().map(|z| z.memory_free).collect(),
            rdma_free: node.rdma_free,
            cpu_inside: strict && prov.cpu,
            mem_inside: strict && prov.mem,
        }
    }

    /// Whether the node has the CPU, memory and RDMA at all.
    fn enough(&self) -> bool {
        self.cpu_free.iter().sum::<u64>() >= self.shape.cpu_milli
            && self.mem_free.iter().sum::<u64>() >= self.shape.memory_mib
            && self.rdma_free >= self.shape.rdma
    }

    /// The CPU and memory taken per zone for a placement on the zones of `set`.
    fn take(&self, set: u64) -> Option<(ZoneAmounts, ZoneAmounts)> {
        let inside = zones_of(set, self.zones);
        let mut all = inside.clone();
        all.extend((0..self.zones).filter(|i| set & (1u64 << i) == 0));
        let cpu_order = if self.cpu_inside { &inside } else { &all };
        let mem_order = if self.mem_inside { &inside } else { &all };
        Some((
            take(&self.cpu_free, cpu_order, self.shape.cpu_milli)?,
            take(&self.mem_free, mem_order, self.shape.memory_mib)?,
        ))
    }

    /// A CPU-only task: on the zone with the most free CPU (the first of equals).
    fn cpu_only(&self) -> Vec<Assignment> {
        let best = (0..self.zones)
            .max_by_key(|&i| (self.cpu_free[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        self.take(1u64 << best)
            .map(|(cpu, memory)| {
                vec![Assignment {
                    cpu,
                    memory,
                    rdma: self.shape.rdma,
                    ..Assignment::default()
                }]
            })
            .unwrap_or_default()
    }
}

/// Every placement of `shape` the node could admit now, in FGD's order of trial: per candidate
/// zone set, its CPU and memory and each way to give it its devices.
pub(crate) fn candidates(node: &Node, shape: &Shape) -> Vec<Assignment> {
    let shape = &*on_node(shape, node);
    let host = Host::new(node, shape);
    if !host.enough() {
        return Vec::new();
    }
    if shape.is_cpu_only() {
        return host.cpu_only();
    }
    if !allows_node(shape, node) {
        return Vec::new();
    }
    let need = mig_need(node, shape);
    let adm = admission(node, shape, need, true);
    if adm.fail.is_some() {
        return Vec::new();
    }
    let level = link_level(node, shape, need);
    let mut out = Vec::new();
    for set in candidate_sets(node, shape, need, adm.usable) {
        let Some((cpu, memory)) = host.take(set) else {
            continue;
        };
        let base = Assignment {
            cpu,
            memory,
            rdma: shape.rdma,
            ..Assignment::default()
        };
        let zones = zones_of(set, node.zones.len());
        match need {
            MigNeed::Profile(p) => mig_candidates(node, shape, &zones, p, &base, &mut out),
            MigNeed::Unavailable => {}
            MigNeed::None if shape.dra => {
                dra_candidates(node, shape, need, level, zones, &base, &mut out)
            }
            MigNeed::None if shape.gpus == 1 => {
                // every eligible GPU in the set is a candidate (FGD tries each)
                for &zi in &zones {
                    for (gi, &(_, f)) in node.zones[zi].gpus.iter().enumerate() {
                        if f >= shape.gpu_milli {
                            out.push(Assignment {
                                gpus: vec![(zi, gi, shape.gpu_milli)],
                                ..base.clone()
                            });
                        }
                    }
                }
            }
            MigNeed::None if level.is_some() => {
                link_candidates(node, shape, level, &zones, &base, &mut out)
            }
            MigNeed::None => out.extend(whole_gpus_candidate(node, shape, zones, base)),
        }
    }
    out
}

/// A MIG shape on zones `zones`: per zone, the first free instance of the profile on a GPU of
/// the shape's source, and on dynamic GPUs every placement that can be allocated now.
fn mig_candidates(
    node: &Node,
    shape: &Shape,
    zones: &[usize],
    p: usize,
    base: &Assignment,
    out: &mut Vec<Assignment>,
) {
    for &zi in zones {
        let found = node.zones[zi].mig.iter().enumerate().find_map(|(mi, g)| {
            if g.dra != shape.dra || g.dynamic {
                return None;
            }
            g.instances
                .iter()
                .position(|i| i.profile == p && !i.used)
                .map(|ii| (zi, mi, ii))
        });
        if let Some(slot) = found {
            out.push(Assignment {
                mig: Some(slot),
                ..base.clone()
            });
        }
        let Some(m) = node_model(node) else { continue };
        for (mi, g) in node.zones[zi].mig.iter().enumerate() {
            if !(g.dynamic && g.dra == shape.dra) {
                continue;
            }
            for pl in dynamic_placements(m, p, g) {
                out.push(Assignment {
                    mig_new: Some((zi, mi, p, pl.start)),
                    ..base.clone()
                });
            }
        }
    }
}

/// A DRA device (zone, DRA GPU position, or dynamic MIG GPU position taken whole).
type DraDevice = (usize, Option<usize>, Option<usize>);

/// A whole/shared-GPU DRA shape on zones `zones`: whole/shared DRA GPUs with the share, and free
/// dynamic MIG GPUs taken whole; zones with the fewest eligible devices first. One GPU: each
/// device is a candidate; several: the first ones in that order, or, under a level of link
/// groups (`level`), the first ones of each group with room (a dynamic MIG GPU is a group of
/// its own).
fn dra_candidates(
    node: &Node,
    shape: &Shape,
    need: MigNeed,
    level: Option<&LinkLevel>,
    mut zones: Vec<usize>,
    base: &Assignment,
    out: &mut Vec<Assignment>,
) {
    let (elig, _, _) = device_view(node, shape, need);
    zones.sort_by_key(|&zi| (elig[zi], zi));
    let mut devices: Vec<DraDevice> = Vec::new();
    for &zi in &zones {
        let z = &node.zones[zi];
        for (gi, &(_, f)) in z.dra_gpus.iter().enumerate() {
            if f >= shape.gpu_milli {
                devices.push((zi, Some(gi), None));
            }
        }
        if shape.gpu_milli == GPU_MILLI {
            for (mi, g) in z.mig.iter().enumerate() {
                if g.dra && g.dynamic && g.instances.is_empty() {
                    devices.push((zi, None, Some(mi)));
                }
            }
        }
    }
    let as_assignment = |picked: &[DraDevice]| {
        let mut a = base.clone();
        for &(zi, gi, mi) in picked {
            if let Some(gi) = gi {
                a.dra_gpus.push((zi, gi, shape.gpu_milli));
            }
            if let Some(mi) = mi {
                a.dyn_whole.push((zi, mi));
            }
        }
        a
    };
    let want = shape.gpus as usize;
    if want == 1 {
        out.extend(
            devices
                .iter()
                .map(|dev| as_assignment(std::slice::from_ref(dev))),
        );
    } else if let Some(level) = level {
        let mut groups: Vec<(u32, Vec<DraDevice>)> = Vec::new();
        for &dev in &devices {
            let (zi, Some(gi), _) = dev else { continue };
            let g = level.group_of(node.zones[zi].dra_gpus[gi].0);
            match groups.iter_mut().find(|x| x.0 == g) {
                Some(x) => x.1.push(dev),
                None => groups.push((g, vec![dev])),
            }
        }
        for (_, picked) in groups {
            if let Some(picked) = picked.get(..want) {
                out.push(as_assignment(picked));
            }
        }
    } else if let Some(picked) = devices.get(..want) {
        out.push(as_assignment(picked));
    }
}

/// Several whole/shared GPUs of the device plugin on zones `zones`: from the zones with the
/// fewest eligible GPUs first (packing), lowest position first within a zone.
fn whole_gpus_candidate(
    node: &Node,
    shape: &Shape,
    mut zones: Vec<usize>,
    base: Assignment,
) -> Option<Assignment> {
    let elig = |zi: usize| {
        node.zones[zi]
            .gpus
            .iter()
            .filter(|&&(_, f)| f >= shape.gpu_milli)
            .count()
    };
    zones.sort_by_key(|&zi| (elig(zi), zi));
    let want = shape.gpus as usize;
    let gpus: Vec<(usize, usize, u32)> = zones
        .iter()
        .flat_map(|&zi| {
            node.zones[zi]
                .gpus
                .iter()
                .enumerate()
                .filter(|&(_, &(_, f))| f >= shape.gpu_milli)
                .map(move |(gi, _)| (zi, gi, shape.gpu_milli))
        })
        .take(want)
        .collect();
    (gpus.len() == want).then_some(Assignment { gpus, ..base })
}

/// Several GPUs in one link group of `level` on zones `zones`: per group with enough eligible
/// GPUs there, its first ones (lowest zone, then position), groups in the order their first GPU
/// is found.
fn link_candidates(
    node: &Node,
    shape: &Shape,
    level: Option<&LinkLevel>,
    zones: &[usize],
    base: &Assignment,
    out: &mut Vec<Assignment>,
) {
    let Some(level) = level else { return };
    let want = shape.gpus as usize;
    // (group, its eligible GPUs as (zone, position, milli))
    type Slots = Vec<(usize, usize, u32)>;
    let mut groups: Vec<(u32, Slots)> = Vec::new();
    for &zi in zones {
        for (gi, &(id, f)) in node.zones[zi].gpus.iter().enumerate() {
            if f < shape.gpu_milli || f == 0 {
                continue;
            }
            let g = level.group_of(id);
            let slot = (zi, gi, shape.gpu_milli);
            match groups.iter_mut().find(|x| x.0 == g) {
                Some(x) => x.1.push(slot),
                None => groups.push((g, vec![slot])),
            }
        }
    }
    for (_, mut gpus) in groups {
        if gpus.len() >= want {
            gpus.truncate(want);
            out.push(Assignment {
                gpus,
                ..base.clone()
            });
        }
    }
}

/// The best placement of `task` on `node` for the workload `shapes`: the admissible candidate with
/// the smallest fragment after (ties: the first candidate). None if the task cannot be admitted.
pub fn place_delta(
    node: &Node,
    task: &Shape,
    shapes: &[Shape],
    memo: &mut RecoverMemo,
) -> Option<Delta> {
    let (gpu0, mig0) = total_fragment(node, shapes, memo);
    let mut best: Option<Delta> = None;
    for a in candidates(node, task) {
        let mut n = node.clone();
        if apply(&mut n, &a, true).is_err() {
            continue;
        }
        let (gpu1, mig1) = total_fragment(&n, shapes, memo);
        let d = Delta {
            fragment_gpu_milli: gpu1 - gpu0,
            fragment_mig_slices: mig1 - mig0,
            assignment: a,
        };
        let better = match &best {
            None => true,
            Some(b) => {
                (d.fragment_gpu_milli, d.fragment_mig_slices)
                    < (b.fragment_gpu_milli, b.fragment_mig_slices)
            }
        };
        if better {
            best = Some(d);
        }
    }
    best
}

/// The fragment delta of removing a task that sits at `a`.
pub fn remove_delta(
    node: &Node,
    a: &Assignment,
    shapes: &[Shape],
    memo: &mut RecoverMemo,
) -> CoreResult<Delta> {
    let (gpu0, mig0) = total_fragment(node, shapes, memo);
    let mut n = node.clone();
    apply(&mut n, a, false)?;
    let (gpu1, mig1) = total_fragment(&n, shapes, memo);
    Ok(Delta {
        fragment_gpu_milli: gpu1 - gpu0,
        fragment_mig_slices: mig1 - mig0,
        assignment: a.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::model::{Cluster, ClusterColumns};
    use crate::fragment::score::score_node;
    use crate::replay::rng::Rng;

    /// A MIG instance: (profile, start, used).
    type Inst = (&'static str, i64, bool);
    /// A zone: device-plugin GPUs' used milli, MIG GPUs' instances.
    type ZoneSpec<'a> = (&'a [i64], &'a [&'a [Inst]]);

    /// One node under `policy`, a zone per entry of `zones` (NUMA ids 0, 1, ...), each with 16
    /// CPUs, 64 GiB and device-plugin GPUs used by the given milli-GPU; MIG GPUs (A100-40GB)
    /// per zone as lists of (profile, start, used).
    fn node(policy: &str, zones: &[ZoneSpec<'_>]) -> Node {
        let mut c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["A100-SXM4-40GB".into()],
            node_policies: vec![policy.into()],
            node_cpu_static: vec![true],
            node_memory_static: vec![false],
            zone_offsets: vec![0, zones.len()],
            gpu_offsets: vec![0],
            mig_offsets: vec![0],
            instance_offsets: vec![0],
            ..Default::default()
        };
        let mut id = 0;
        for (z, (gpus, migs)) in zones.iter().enumerate() {
            c.zone_numa.push(z as i64);
            c.zone_cpu_milli.push(16000);
            c.zone_cpu_used.push(0);
            c.zone_memory_mib.push(65536);
            c.zone_memory_used.push(0);
            for &u in *gpus {
                c.gpu_ids.push(id);
                c.gpu_used_milli.push(u);
                id += 1;
            }
            c.gpu_offsets.push(c.gpu_ids.len());
            for insts in *migs {
                c.mig_gpu_ids.push(id);
                id += 1;
                for &(p, s, used) in *insts {
                    c.instance_profiles.push(p.into());
                    c.instance_starts.push(s);
                    c.instance_used.push(used);
                }
                c.instance_offsets.push(c.instance_profiles.len());
            }
            c.mig_offsets.push(c.mig_gpu_ids.len());
        }
        Cluster::from_columns(&c).unwrap().nodes.remove(0)
    }

    fn gpu_shape(gpus: u32, milli: u32) -> Shape {
        Shape {
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus,
            gpu_milli: milli,
            weight: 1.0,
            ..Default::default()
        }
    }

    fn mig_shape(profile: &str) -> Shape {
        Shape {
            cpu_milli: 1000,
            gpus: 1,
            mig_profile: Some(profile.into()),
            weight: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn placing_a_half_gpu_fills_the_half_used_gpu() {
        // GPU 0 idle, GPU 1 half used; M = one whole GPU: GPU 1's 500 are fragment (stranded).
        // A half-GPU task on GPU 0 would strand 500 more (+500); on GPU 1 it frees the node of
        // fragment (-500): the delta picks GPU 1.
        let n = node("none", &[(&[0, 500], &[])]);
        let m = [gpu_shape(1, 1000)];
        let mut memo = RecoverMemo::new();
        assert_eq!(score_node(&n, &m, &mut memo).fragment_gpu_milli, 500.0);
        let all = candidates(&n, &gpu_shape(1, 500));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].gpus, vec![(0, 0, 500)]);
        assert_eq!(all[0].cpu, vec![(0, 1000)]);
        assert_eq!(all[0].memory, vec![(0, 1024)]);
        let d = place_delta(&n, &gpu_shape(1, 500), &m, &mut memo).unwrap();
        assert_eq!(d.fragment_gpu_milli, -500.0);
        assert_eq!(d.fragment_mig_slices, 0.0);
        assert_eq!(d.assignment.gpus, vec![(0, 1, 500)]);
        // removing it again: +500
        let mut after = n.clone();
        apply(&mut after, &d.assignment, true).unwrap();
        assert_eq!(after.zones[0].gpus, vec![(0, 1000), (1, 0)]);
        assert_eq!(after.zones[0].cpu_free, 15000);
        let r = remove_delta(&after, &d.assignment, &m, &mut memo).unwrap();
        assert_eq!(r.fragment_gpu_milli, 500.0);
        // a task that fits nowhere has no delta
        assert!(place_delta(&n, &gpu_shape(3, 1000), &m, &mut memo).is_none());
    }

    #[test]
    fn whole_gpus_come_from_one_zone_under_single_numa_node() {
        // one idle GPU in each of two zones: two GPUs need both zones
        let split = [(&[0i64][..], &[][..]), (&[0i64][..], &[][..])];
        let two = gpu_shape(2, 1000);
        assert!(candidates(&node("single-numa-node", &split), &two).is_empty());
        let any = candidates(&node("none", &split), &two);
        assert_eq!(any.len(), 1);
        assert_eq!(any[0].gpus, vec![(0, 0, 1000), (1, 0, 1000)]);
        // two idle GPUs in zone 1: the narrowest set is zone 1 alone, under any policy, and the
        // task's CPUs come from it first
        let packed = node("single-numa-node", &[(&[0], &[]), (&[0, 0], &[])]);
        let got = candidates(&packed, &two);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].gpus, vec![(1, 0, 1000), (1, 1, 1000)]);
        assert_eq!(got[0].cpu, vec![(1, 1000)]);
    }

    #[test]
    fn a_cpu_only_task_goes_to_the_zone_with_most_free_cpu() {
        let mut n = node("none", &[(&[], &[]), (&[], &[])]);
        n.zones[0].cpu_free = 4000;
        let task = Shape {
            cpu_milli: 6000,
            weight: 1.0,
            ..Default::default()
        };
        let got = candidates(&n, &task);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].cpu, vec![(1, 6000)]);
        assert!(got[0].gpus.is_empty() && got[0].mig.is_none());
        // more than the node has: none
        let huge = Shape {
            cpu_milli: 40000,
            ..task
        };
        assert!(candidates(&n, &huge).is_empty());
    }

    #[test]
    fn a_mig_task_takes_a_free_instance_of_its_profile() {
        // 1g.5gb@0 and @1 free, 3g.20gb@4 used: 1 + 1 + 3 of 7 compute slices, 2 unpartitioned.
        // M = 2g.10gb: every idle slice (2 free 1g + 2 unpartitioned) is fragment; placing a
        // 1g.5gb task uses one: -1 slice.
        let layout: &[Inst] = &[
            ("1g.5gb", 0, false),
            ("1g.5gb", 1, false),
            ("3g.20gb", 4, true),
        ];
        let n = node("none", &[(&[], &[layout])]);
        let m = [mig_shape("2g.10gb")];
        let mut memo = RecoverMemo::new();
        let before = score_node(&n, &m, &mut memo);
        assert_eq!(before.idle_mig_slices, 4.0);
        assert_eq!(before.fragment_mig_slices, 4.0);
        let d = place_delta(&n, &mig_shape("1g.5gb"), &m, &mut memo).unwrap();
        assert_eq!(d.assignment.mig, Some((0, 0, 0)));
        assert_eq!(d.fragment_mig_slices, -1.0);
        assert_eq!(d.fragment_gpu_milli, 0.0);
        // no free instance of the profile: no placement (a re-partition is the MIG planner's)
        assert!(place_delta(&n, &mig_shape("2g.10gb"), &m, &mut memo).is_none());
        // removing a free instance's task is refused, a used one's is fine
        let free = Assignment {
            mig: Some((0, 0, 1)),
            ..Assignment::default()
        };
        let e = remove_delta(&n, &free, &m, &mut memo).unwrap_err();
        assert_eq!(e.message, "MIG instance is not in use");
        let used = Assignment {
            mig: Some((0, 0, 2)),
            ..Assignment::default()
        };
        let r = remove_delta(&n, &used, &m, &mut memo).unwrap();
        // the freed 3g.20gb is 3 more idle slices, all fragment for 2g.10gb
        assert_eq!(r.fragment_mig_slices, 3.0);
    }

    #[test]
    fn an_assignment_that_does_not_fit_leaves_the_node_unchanged() {
        let n = node("none", &[(&[0, 500], &[])]);
        let cases = [
            (
                Assignment {
                    cpu: vec![(0, 1000)],
                    gpus: vec![(0, 5, 100)],
                    ..Assignment::default()
                },
                true,
                "GPU out of range",
            ),
            (
                Assignment {
                    cpu: vec![(0, 1000)],
                    memory: vec![(3, 1)],
                    ..Assignment::default()
                },
                true,
                "zone out of range",
            ),
            (
                Assignment {
                    cpu: vec![(0, 16001)],
                    ..Assignment::default()
                },
                true,
                "not enough free CPU",
            ),
            (
                Assignment {
                    gpus: vec![(0, 1, 600)],
                    ..Assignment::default()
                },
                true,
                "not enough free GPU share",
            ),
            (
                Assignment {
                    gpus: vec![(0, 1, 600)],
                    ..Assignment::default()
                },
                false,
                "removing more GPU share than is used",
            ),
            (
                Assignment {
                    memory: vec![(0, 1)],
                    ..Assignment::default()
                },
                false,
                "removing more memory than is used",
            ),
            (
                // would overflow the counter
                Assignment {
                    cpu: vec![(0, u64::MAX)],
                    ..Assignment::default()
                },
                false,
                "removing more CPU than is used",
            ),
            (
                Assignment {
                    dra_gpus: vec![(0, 0, 1)],
                    ..Assignment::default()
                },
                true,
                "DRA GPU out of range",
            ),
            (
                Assignment {
                    mig: Some((0, 0, 0)),
                    ..Assignment::default()
                },
                true,
                "MIG instance out of range",
            ),
            (
                Assignment {
                    mig_new: Some((0, 0, 0, 0)),
                    ..Assignment::default()
                },
                true,
                "no MIG model on the node",
            ),
        ];
        for (a, place, message) in cases {
            let mut m = n.clone();
            let e = apply(&mut m, &a, place).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.message.as_str()),
                ("assignment", message)
            );
            assert_eq!(m, n);
        }
    }

    /// A random node of 1-3 zones under a random policy: GPUs with random use, a MIG GPU now
    /// and then (1g.5gb / 2g.10gb at random, used or not).
    fn random_node(rng: &mut Rng) -> Node {
        let policies = ["none", "best-effort", "restricted", "single-numa-node"];
        let policy = policies[rng.below(4) as usize];
        let uses = [0i64, 0, 250, 500, 750, 1000];
        let zones: Vec<(Vec<i64>, Vec<Vec<Inst>>)> = (0..1 + rng.below(3))
            .map(|_| {
                let gpus = (0..rng.below(4))
                    .map(|_| uses[rng.below(uses.len() as u64) as usize])
                    .collect();
                let mut migs = Vec::new();
                if rng.below(3) == 0 {
                    let mut layout = Vec::new();
                    for s in [0, 2, 4] {
                        match rng.below(3) {
                            0 => {}
                            1 => layout.push(("2g.10gb", s, rng.below(2) == 0)),
                            _ => layout.push(("1g.5gb", s, rng.below(2) == 0)),
                        }
                    }
                    migs.push(layout);
                }
                (gpus, migs)
            })
            .collect();
        let views: Vec<Vec<&[Inst]>> = zones
            .iter()
            .map(|(_, m)| m.iter().map(|l| l.as_slice()).collect())
            .collect();
        let spec: Vec<ZoneSpec<'_>> = zones
            .iter()
            .zip(&views)
            .map(|((g, _), v)| (g.as_slice(), v.as_slice()))
            .collect();
        node(policy, &spec)
    }

    fn random_shape(rng: &mut Rng) -> Shape {
        match rng.below(5) {
            0 => mig_shape(["1g.5gb", "2g.10gb"][rng.below(2) as usize]),
            1 => gpu_shape(1 + rng.below(3) as u32, 1000),
            2 => Shape {
                cpu_milli: 1000 * (1 + rng.below(8)),
                weight: 1.0,
                ..Default::default()
            },
            _ => gpu_shape(1, [100, 250, 500, 1000][rng.below(4) as usize]),
        }
    }

    #[test]
    fn every_candidate_fits_and_removing_it_restores_the_node() {
        let mut rng = Rng::new(3);
        let mut memo = RecoverMemo::new();
        let mut placed = 0;
        for _ in 0..300 {
            let n = random_node(&mut rng);
            let task = random_shape(&mut rng);
            let m = [random_shape(&mut rng), random_shape(&mut rng)];
            let before = score_node(&n, &m, &mut memo);
            for a in candidates(&n, &task) {
                let mut after = n.clone();
                apply(&mut after, &a, true).unwrap();
                assert_ne!(after, n, "{a:?} changed nothing");
                // the delta of removing it is exactly the reverse of placing it
                let back = remove_delta(&after, &a, &m, &mut memo).unwrap();
                let s = score_node(&after, &m, &mut memo);
                assert!(
                    (back.fragment_gpu_milli + s.fragment_gpu_milli - before.fragment_gpu_milli)
                        .abs()
                        < 1e-9
                );
                apply(&mut after, &a, false).unwrap();
                assert_eq!(after, n);
                placed += 1;
            }
            // the best placement is a candidate with the least fragment growth
            if let Some(d) = place_delta(&n, &task, &m, &mut memo) {
                let mut after = n.clone();
                apply(&mut after, &d.assignment, true).unwrap();
                let s = score_node(&after, &m, &mut memo);
                let grew = s.fragment_gpu_milli - before.fragment_gpu_milli;
                assert!((grew - d.fragment_gpu_milli).abs() < 1e-9);
                for a in candidates(&n, &task) {
                    let mut other = n.clone();
                    apply(&mut other, &a, true).unwrap();
                    let o = score_node(&other, &m, &mut memo).fragment_gpu_milli;
                    assert!(o - before.fragment_gpu_milli >= d.fragment_gpu_milli - 1e-9);
                }
            } else {
                assert!(candidates(&n, &task).is_empty());
            }
        }
        assert!(placed > 100, "only {placed} placements tried");
    }
}
