//! The fragment delta of a hypothetical change on one node (FGD's gradient): placing one task
//! where the node would put it with the least fragment growth, or removing a task that is there.
//! `delta = F_n(M) after - F_n(M) before` (negative: the change reduces fragmentation).

use super::model::{MigInstance, Node, GPU_MILLI};
use super::score::{
    admission, allows_node, device_view, dynamic_placements, mig_need, node_model, on_node,
    score_node, MigNeed, RecoverMemo,
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

/// Applies (`place = true`) or undoes an assignment. Fails, leaving the node unchanged, when the
/// assignment does not fit the node (out of range, not enough free, instance busy or idle).
pub fn apply(node: &mut Node, a: &Assignment, place: bool) -> CoreResult<()> {
    let mut n = node.clone();
    let bad = |what: &str| CoreError::new("assignment", what.to_string());
    for &(zi, v) in &a.cpu {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        if place {
            z.cpu_free = z
                .cpu_free
                .checked_sub(v)
                .ok_or_else(|| bad("not enough free CPU"))?;
        } else {
            z.cpu_free += v;
            if z.cpu_free > z.cpu_milli {
                return Err(bad("removing more CPU than is used"));
            }
        }
    }
    for &(zi, v) in &a.memory {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        if place {
            z.memory_free = z
                .memory_free
                .checked_sub(v)
                .ok_or_else(|| bad("not enough free memory"))?;
        } else {
            z.memory_free += v;
            if z.memory_free > z.memory_mib {
                return Err(bad("removing more memory than is used"));
            }
        }
    }
    for &(zi, gi, v) in &a.gpus {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        let g = z.gpus.get_mut(gi).ok_or_else(|| bad("GPU out of range"))?;
        if place {
            g.1 =
                g.1.checked_sub(v)
                    .ok_or_else(|| bad("not enough free GPU share"))?;
        } else {
            g.1 += v;
            if g.1 > GPU_MILLI {
                return Err(bad("removing more GPU share than is used"));
            }
        }
    }
    for &(zi, gi, v) in &a.dra_gpus {
        let z = n
            .zones
            .get_mut(zi)
            .ok_or_else(|| bad("zone out of range"))?;
        let g = z
            .dra_gpus
            .get_mut(gi)
            .ok_or_else(|| bad("DRA GPU out of range"))?;
        if place {
            g.1 =
                g.1.checked_sub(v)
                    .ok_or_else(|| bad("not enough free GPU share"))?;
        } else {
            g.1 += v;
            if g.1 > GPU_MILLI {
                return Err(bad("removing more GPU share than is used"));
            }
        }
    }
    let model = node_model(&n);
    for &(zi, mi) in &a.dyn_whole {
        let m = model.ok_or_else(|| bad("no MIG model on the node"))?;
        let full = (0..m.profiles.len())
            .find(|&p| {
                m.profiles[p].memory_slices == m.memory_slices
                    && m.profiles[p].compute_slices == m.compute_slices
            })
            .ok_or_else(|| bad("the GPU model has no whole-GPU profile"))?;
        let g = n
            .zones
            .get_mut(zi)
            .and_then(|z| z.mig.get_mut(mi))
            .filter(|g| g.dynamic)
            .ok_or_else(|| bad("dynamic MIG GPU out of range"))?;
        take_placement(g, m, full, 0, place)?;
    }
    if let Some((zi, mi, p, start)) = a.mig_new {
        let m = model.ok_or_else(|| bad("no MIG model on the node"))?;
        let g = n
            .zones
            .get_mut(zi)
            .and_then(|z| z.mig.get_mut(mi))
            .filter(|g| g.dynamic)
            .ok_or_else(|| bad("dynamic MIG GPU out of range"))?;
        take_placement(g, m, p, start, place)?;
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
    *node = n;
    Ok(())
}

/// Allocates (`place`) or releases the placement of profile `p` at `start` on a dynamic GPU.
fn take_placement(
    g: &mut super::model::MigGpu,
    m: &crate::mig::catalog::GpuModel,
    p: usize,
    start: u8,
    place: bool,
) -> CoreResult<()> {
    let bad = |what: &str| CoreError::new("assignment", what.to_string());
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

pub(crate) fn candidates(node: &Node, shape: &Shape) -> Vec<Assignment> {
    let shape = &*on_node(shape, node);
    let zones = node.zones.len();
    let cpu_free: Vec<u64> = node.zones.iter().map(|z| z.cpu_free).collect();
    let mem_free: Vec<u64> = node.zones.iter().map(|z| z.memory_free).collect();
    let cpu_ok = cpu_free.iter().sum::<u64>() >= shape.cpu_milli
        && mem_free.iter().sum::<u64>() >= shape.memory_mib;
    if !cpu_ok {
        return Vec::new();
    }
    // CPU and memory: from the placement's zones first; only from them when the kubelet's
    // manager for that resource takes part in the alignment.
    // (the Topology Manager does not align DRA devices, so DRA shapes' CPUs are not held to it)
    let strict = !shape.dra && matches!(node.policy, Policy::Restricted | Policy::SingleNumaNode);
    let cpu_provider = node.cpu_static && shape.cpu_milli > 0 && shape.cpu_milli % 1000 == 0;
    let mem_provider = node.memory_static && shape.memory_mib > 0;
    let host = |set: u64| -> Option<(ZoneAmounts, ZoneAmounts)> {
        let inside = zones_of(set, zones);
        let mut all = inside.clone();
        all.extend((0..zones).filter(|i| set & (1u64 << i) == 0));
        let cpu_order = if strict && cpu_provider {
            &inside
        } else {
            &all
        };
        let mem_order = if strict && mem_provider {
            &inside
        } else {
            &all
        };
        Some((
            take(&cpu_free, cpu_order, shape.cpu_milli)?,
            take(&mem_free, mem_order, shape.memory_mib)?,
        ))
    };
    if shape.is_cpu_only() {
        // the zone with the most free CPU first
        let best = (0..zones)
            .max_by_key(|&i| (cpu_free[i], std::cmp::Reverse(i)))
            .unwrap_or(0);
        return host(1u64 << best)
            .map(|(cpu, memory)| {
                vec![Assignment {
                    cpu,
                    memory,
                    ..Assignment::default()
                }]
            })
            .unwrap_or_default();
    }
    if !allows_node(shape, node) {
        return Vec::new();
    }
    let need = mig_need(node, shape);
    let adm = admission(node, shape, need, cpu_ok);
    if adm.fail.is_some() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for set in candidate_sets(node, shape, need, adm.usable) {
        let Some((cpu, memory)) = host(set) else {
            continue;
        };
        let base = Assignment {
            cpu,
            memory,
            ..Assignment::default()
        };
        match need {
            MigNeed::Profile(p) => {
                for zi in zones_of(set, zones) {
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
                    // dynamic GPUs: every placement that can be allocated now is a candidate
                    if let Some(m) = node_model(node) {
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
            }
            MigNeed::Unavailable => {}
            MigNeed::None if shape.dra => {
                // DRA devices: whole/shared DRA GPUs, and free dynamic MIG GPUs taken whole
                let mut order = zones_of(set, zones);
                let (elig, _, _) = device_view(node, shape, need);
                order.sort_by_key(|&zi| (elig[zi], zi));
                let mut devices: Vec<(usize, Option<usize>, Option<usize>)> = Vec::new();
                for &zi in &order {
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
                let as_assignment = |picked: &[(usize, Option<usize>, Option<usize>)]| {
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
                if shape.gpus == 1 {
                    for dev in &devices {
                        out.push(as_assignment(std::slice::from_ref(dev)));
                    }
                } else if devices.len() >= shape.gpus as usize {
                    out.push(as_assignment(&devices[..shape.gpus as usize]));
                }
            }
            MigNeed::None if shape.gpus == 1 => {
                // every eligible GPU in the set is a candidate (FGD tries each)
                for zi in zones_of(set, zones) {
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
            MigNeed::None => {
                // d whole GPUs: from the set's zones with the fewest eligible GPUs first (packing),
                // lowest position first within a zone
                let mut order = zones_of(set, zones);
                let elig = |zi: usize| {
                    node.zones[zi]
                        .gpus
                        .iter()
                        .filter(|&&(_, f)| f >= shape.gpu_milli)
                        .count()
                };
                order.sort_by_key(|&zi| (elig(zi), zi));
                let mut gpus = Vec::new();
                'outer: for zi in order {
                    for (gi, &(_, f)) in node.zones[zi].gpus.iter().enumerate() {
                        if gpus.len() == shape.gpus as usize {
                            break 'outer;
                        }
                        if f >= shape.gpu_milli {
                            gpus.push((zi, gi, shape.gpu_milli));
                        }
                    }
                }
                if gpus.len() == shape.gpus as usize {
                    out.push(Assignment {
                        gpus,
                        ..base.clone()
                    });
                }
            }
        }
    }
    out
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
