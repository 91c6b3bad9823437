//! Scoring and placement with DRA devices: whole GPUs published by a DRA driver (usable by DRA
//! shapes only), claims that ask their devices to share a NUMA node, and dynamic MIG GPUs (the
//! NVIDIA driver's DynamicMIG: placements allocated on demand within the free memory slices).

use super::delta::{apply, place_delta, remove_delta, Assignment};
use super::model::{Cluster, ClusterColumns, Node};
use super::score::{score_node, Category, RecoverMemo};
use super::workload::Shape;

/// One node, `zones` zones; per zone (plugin GPUs used milli, DRA GPUs used milli, dynamic MIG
/// GPUs as lists of (profile, start) allocated placements).
#[allow(clippy::type_complexity)]
fn node(model: &str, zones: &[(&[i64], &[i64], &[&[(&str, i64)]])]) -> Node {
    let mut c = ClusterColumns::default();
    c.node_names.push("n".into());
    c.node_models.push(model.into());
    c.node_policies.push("single-numa-node".into());
    c.node_cpu_static.push(true);
    c.node_memory_static.push(false);
    c.zone_offsets.push(0);
    c.gpu_offsets.push(0);
    c.dra_gpu_offsets.push(0);
    c.mig_offsets.push(0);
    c.instance_offsets.push(0);
    let mut id = 0;
    for (z, (plugin, dra, dynamic)) in zones.iter().enumerate() {
        c.zone_numa.push(z as i64);
        c.zone_cpu_milli.push(64000);
        c.zone_cpu_used.push(0);
        c.zone_memory_mib.push(0);
        c.zone_memory_used.push(0);
        for &u in *plugin {
            c.gpu_ids.push(id);
            c.gpu_used_milli.push(u);
            id += 1;
        }
        c.gpu_offsets.push(c.gpu_ids.len());
        for &u in *dra {
            c.dra_gpu_ids.push(id);
            c.dra_gpu_used_milli.push(u);
            id += 1;
        }
        c.dra_gpu_offsets.push(c.dra_gpu_ids.len());
        for insts in *dynamic {
            c.mig_gpu_ids.push(id);
            c.mig_dra.push(true);
            c.mig_dynamic.push(true);
            c.mig_free_slices.push(-1);
            id += 1;
            for &(p, s) in *insts {
                c.instance_profiles.push(p.into());
                c.instance_starts.push(s);
                c.instance_used.push(true);
            }
            c.instance_offsets.push(c.instance_profiles.len());
        }
        c.mig_offsets.push(c.mig_gpu_ids.len());
    }
    c.zone_offsets.push(c.zone_numa.len());
    Cluster::from_columns(&c).unwrap().nodes.remove(0)
}

fn dra(gpus: u32, aligned: bool) -> Shape {
    Shape {
        cpu_milli: 1000,
        gpus,
        gpu_milli: 1000,
        weight: 1.0,
        dra: true,
        numa_aligned: aligned,
        ..Default::default()
    }
}

fn dra_mig(profile: &str) -> Shape {
    Shape {
        cpu_milli: 1000,
        gpus: 1,
        mig_profile: Some(profile.into()),
        weight: 1.0,
        dra: true,
        ..Default::default()
    }
}

fn cat(s: &super::score::NodeScore, c: Category) -> f64 {
    s.categories[c as usize]
}

fn mig_cat(s: &super::score::NodeScore, c: Category) -> f64 {
    s.mig_categories[c as usize]
}

#[test]
fn an_aligned_claim_no_zone_holds_is_numa_split() {
    // two zones of 4 DRA GPUs, one used in each: 6 idle, no zone with 4
    let n = node(
        "H100",
        &[(&[], &[1000, 0, 0, 0], &[]), (&[], &[1000, 0, 0, 0], &[])],
    );
    let mut memo = RecoverMemo::new();
    let s = score_node(&n, &[dra(4, true)], &mut memo);
    assert_eq!(s.idle_gpu_milli, 6000.0);
    assert_eq!(cat(&s, Category::NumaSplit), 6000.0);
    assert!(place_delta(&n, &dra(4, true), &[dra(4, true)], &mut memo).is_none());
    // without the constraint the allocator may take devices of both zones: nothing stranded
    let s = score_node(&n, &[dra(4, false)], &mut memo);
    assert_eq!(s.fragment_gpu_milli, 0.0);
    let d = place_delta(&n, &dra(4, false), &[dra(4, false)], &mut memo).unwrap();
    assert_eq!(d.assignment.dra_gpus.len(), 4);
    // the node's Topology Manager policy (single-numa-node) does not apply to DRA devices
    assert!(d.assignment.gpus.is_empty());
}

#[test]
fn each_kind_of_request_uses_only_its_own_devices() {
    // zone 0: 4 device-plugin GPUs; zone 1: 4 DRA GPUs
    let n = node(
        "H100",
        &[(&[0, 0, 0, 0], &[], &[]), (&[], &[0, 0, 0, 0], &[])],
    );
    let mut memo = RecoverMemo::new();
    let plugin = Shape {
        dra: false,
        numa_aligned: false,
        ..dra(1, false)
    };
    let s = score_node(&n, std::slice::from_ref(&plugin), &mut memo);
    assert_eq!(cat(&s, Category::NoAccess), 4000.0);
    assert_eq!(s.zones[1].fragment_gpu_milli, 4000.0);
    let s = score_node(&n, &[dra(1, false)], &mut memo);
    assert_eq!(cat(&s, Category::NoAccess), 4000.0);
    assert_eq!(s.zones[0].fragment_gpu_milli, 4000.0);
    // both count in the idle total, neither twice
    assert_eq!(s.idle_gpu_milli, 8000.0);
    let d = place_delta(&n, &plugin, std::slice::from_ref(&plugin), &mut memo).unwrap();
    assert_eq!(
        (d.assignment.gpus.len(), d.assignment.dra_gpus.len()),
        (1, 0)
    );
    let d = place_delta(&n, &dra(1, false), &[dra(1, false)], &mut memo).unwrap();
    assert_eq!(
        (d.assignment.gpus.len(), d.assignment.dra_gpus.len()),
        (0, 1)
    );
}

#[test]
fn dynamic_mig_counts_what_placements_can_still_take() {
    // H100-80GB, 3g.40gb allocated at start 4: slices 0-3 free, 4 compute slices idle
    let n = node("H100-80GB", &[(&[], &[], &[&[("3g.40gb", 4)]])]);
    let mut memo = RecoverMemo::new();
    let s = score_node(&n, &[dra_mig("3g.40gb")], &mut memo);
    assert_eq!(s.idle_mig_slices, 4.0);
    // one more 3g.40gb fits (3 compute slices); the 4th compute slice is stranded
    assert_eq!(s.fragment_mig_slices, 1.0);
    assert_eq!(mig_cat(&s, Category::MigGeometry), 1.0);
    // 4g.40gb at start 0 takes the 4 free slices
    let s = score_node(&n, &[dra_mig("4g.40gb")], &mut memo);
    assert_eq!(s.fragment_mig_slices, 0.0);
    // a whole GPU cannot be had while a partition is allocated
    let s = score_node(&n, &[dra(1, false)], &mut memo);
    assert_eq!(mig_cat(&s, Category::MigGeometry), 4.0);
    // a device-plugin MIG request cannot use DRA partitions
    let plugin = Shape {
        dra: false,
        ..dra_mig("3g.40gb")
    };
    let s = score_node(&n, &[plugin], &mut memo);
    assert_eq!(mig_cat(&s, Category::NoAccess), 4.0);
    // no re-partition recovers anything: the driver allocates placements on demand
    assert_eq!(s.recoverable_mig_slices, 0.0);
}

#[test]
fn a_placement_that_strands_slices_is_worse() {
    // On an empty H100-80GB, 4g.40gb has one placement (slices 0-3): a 1g.10gb at start 0-3
    // strands it, at 4-6 it does not. The allocator would take the first free device; the
    // delta takes the placement that strands least.
    let n = node("H100-80GB", &[(&[], &[], &[&[]])]);
    let mut memo = RecoverMemo::new();
    let m = [dra_mig("4g.40gb")];
    let d = place_delta(&n, &dra_mig("1g.10gb"), &m, &mut memo).unwrap();
    let (zi, mi, _, start) = d.assignment.mig_new.unwrap();
    assert_eq!((zi, mi), (0, 0));
    assert!(
        start >= 4,
        "1g.10gb placed at {start}: strands the 4g.40gb window"
    );
    // before: 7 idle compute slices, 4 usable by 4g.40gb; after: 6 idle, still 4 usable
    assert_eq!(d.fragment_mig_slices, -1.0);
    let mut placed = n.clone();
    apply(&mut placed, &d.assignment, true).unwrap();
    let after = score_node(&placed, &m, &mut memo);
    assert_eq!(after.idle_mig_slices, 6.0);
    // at start 0 the 4g.40gb window is gone: all 6 idle slices are fragment
    let mut bad = n.clone();
    let at0 = Assignment {
        mig_new: Some((0, 0, 0, 0)),
        ..Default::default()
    };
    apply(&mut bad, &at0, true).unwrap();
    assert_eq!(score_node(&bad, &m, &mut memo).fragment_mig_slices, 6.0);
    // removing it restores the GPU exactly
    let r = remove_delta(&placed, &d.assignment, &m, &mut memo).unwrap();
    assert!((r.fragment_mig_slices + d.fragment_mig_slices).abs() < 1e-9);
    apply(&mut placed, &d.assignment, false).unwrap();
    assert_eq!(placed, n);
}

#[test]
fn a_free_dynamic_gpu_is_a_whole_gpu_for_dra() {
    let n = node("H100-80GB", &[(&[], &[], &[&[], &[("1g.10gb", 0)]])]);
    let mut memo = RecoverMemo::new();
    let s = score_node(&n, &[dra(1, false)], &mut memo);
    // the free GPU (7 slices) is usable whole; the other's 6 idle slices are not
    assert_eq!(s.idle_mig_slices, 13.0);
    assert_eq!(mig_cat(&s, Category::MigGeometry), 6.0);
    let d = place_delta(&n, &dra(1, false), &[dra(1, false)], &mut memo).unwrap();
    assert_eq!(d.assignment.dyn_whole, vec![(0, 0)]);
    let mut placed = n.clone();
    apply(&mut placed, &d.assignment, true).unwrap();
    assert_eq!(placed.zones[0].mig[0].free_mask, 0);
    // a placement on a GPU taken whole is refused, and the node is unchanged
    let bad = Assignment {
        mig_new: Some((0, 0, 0, 1)),
        ..Default::default()
    };
    let before = placed.clone();
    assert!(apply(&mut placed, &bad, true).is_err());
    assert_eq!(placed, before);
}

#[test]
fn under_a_level_of_link_groups_a_dynamic_gpu_taken_whole_is_a_group_of_its_own() {
    // DRA GPUs 0 and 1 in one partition of two, and a free dynamic MIG GPU (id 2) that no
    // level lists: a DRA pair that needs one group can use the partition, not the MIG GPU
    let mut n = node("H100-80GB", &[(&[], &[0, 0], &[&[]])]);
    let pair = Shape {
        link_group: true,
        ..dra(2, false)
    };
    let m = [pair.clone()];
    let mut memo = RecoverMemo::new();
    let s = score_node(&n, &m, &mut memo);
    // no level yet: every device usable
    assert_eq!((s.fragment_gpu_milli, s.fragment_mig_slices), (0.0, 0.0));
    n.links = vec![super::model::LinkLevel {
        size: 2,
        groups: vec![(0, 0), (1, 0)],
        plugin: false,
        dra: true,
    }];
    let s = score_node(&n, &m, &mut memo);
    assert_eq!(s.fragment_gpu_milli, 0.0);
    assert_eq!(mig_cat(&s, Category::LinkSplit), 7.0);
    let d = place_delta(&n, &pair, &m, &mut memo).unwrap();
    assert_eq!(d.assignment.dra_gpus, vec![(0, 0, 1000), (0, 1, 1000)]);
    assert!(d.assignment.dyn_whole.is_empty());
    // with one of the partition's GPUs used, the pair has no placement
    n.zones[0].dra_gpus[1].1 = 0;
    assert!(place_delta(&n, &pair, &m, &mut memo).is_none());
    let s = score_node(&n, &m, &mut memo);
    assert_eq!(cat(&s, Category::LinkSplit), 1000.0);
}
