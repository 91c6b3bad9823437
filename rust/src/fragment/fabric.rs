//! Fragmentation above the node: NVLink domains (a clique, a rack, a leaf block) at ordered
//! levels, and gangs that need one domain.
//!
//! A *gang* of the workload M is `pods` pods of one shape that must all sit inside one domain of
//! a level (a node label: `nvidia.com/gpu.clique`, a Topograph leaf, ...). Node scores count a
//! gang shape as its pod shape (F_n(s): what one pod could not use on the node). This pass adds
//! what only the domain sees: on a node whose domain cannot host the gang (its nodes together
//! fit fewer than `pods` pods of the shape), the idle GPU the pod could have used on the node is
//! fragment too, `domain_split`; on a node with no domain at that level it is `no_domain` (the
//! gang may not go there at all). So for a gang g, node n contributes
//! `w_g * F_n(s_g)` when its domain hosts g, and `w_g * idle_n` when it does not: FGD's rule
//! ("a task that does not fit the node strands all its idle GPU") one level up.
//!
//! A node's capacity for a shape is the number of pods of it the node admits one after another,
//! each at the first admissible placement (`delta::candidates`, FGD's order of trial), counted up
//! to `MAX_PODS`. Pure: no I/O, deterministic, no panics on any input (bad indices are errors).

use super::delta::{apply, candidates};
use super::model::{Cluster, Node, GPU_MILLI};
use super::score::{score_node, RecoverMemo};
use super::workload::Shape;
use crate::error::{CoreError, CoreResult};

/// The most pods of one shape counted on one node (a bound on work, far above any board).
pub const MAX_PODS: u32 = 4096;

/// A gang of the workload: `pods` pods of `shapes[shape]` inside one domain of `level`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gang {
    pub shape: usize,
    pub pods: u32,
    pub level: usize,
}

/// One domain of one level.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainScore {
    pub level: usize,
    /// The domain's index at its level (as the caller numbered them).
    pub domain: u32,
    pub nodes: u32,
    /// Whole/shared GPU capacity and idle share, milli-GPU (MIG GPUs count whole).
    pub gpu_milli: f64,
    pub idle_gpu_milli: f64,
    /// Weighted `domain_split` fragment of its nodes, milli-GPU.
    pub fragment_gpu_milli: f64,
    /// No GPU of the domain is in use (no share, no MIG instance).
    pub whole: bool,
    /// Per gang (in input order): pods of its shape the domain could host now; 0 for gangs of
    /// another level.
    pub capacity: Vec<u32>,
}

/// The fabric pass over a cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FabricScore {
    /// Every domain that has at least one node, by level then domain index.
    pub domains: Vec<DomainScore>,
    /// Per node: weighted idle GPU its domain's lack of room strands (milli-GPU).
    pub node_domain_split: Vec<f64>,
    /// Per node: weighted idle GPU a gang could use but may not, the node being in no domain of
    /// the gang's level (milli-GPU).
    pub node_no_domain: Vec<f64>,
}

/// Pods of `shape` that `node` admits one after another (at most `limit`).
pub fn pods_that_fit(node: &Node, shape: &Shape, limit: u32) -> u32 {
    if shape.is_cpu_only() {
        return 0;
    }
    let mut n = node.clone();
    let mut count = 0;
    while count < limit {
        let Some(a) = candidates(&n, shape).into_iter().next() else {
            break;
        };
        if apply(&mut n, &a, true).is_err() {
            break;
        }
        count += 1;
    }
    count
}

/// Whole-GPU capacity of a node and whether any of it is in use.
fn gpu_capacity(node: &Node) -> (f64, bool) {
    let mut total = 0.0;
    let mut used = false;
    for z in &node.zones {
        for &(_, free) in z.gpus.iter().chain(&z.dra_gpus) {
            total += GPU_MILLI as f64;
            used |= free < GPU_MILLI;
        }
        for g in &z.mig {
            total += GPU_MILLI as f64;
            used |= g.instances.iter().any(|i| i.used);
        }
    }
    (total, used)
}

/// The fabric pass. `node_domains[n][l]` is node n's domain index at level l (None: no domain;
/// a missing level is None); `shapes` as validated (weights sum to 1); `gangs` name shapes by
/// index and levels below `levels`.
pub fn fabric_score(
    cluster: &Cluster,
    shapes: &[Shape],
    gangs: &[Gang],
    levels: usize,
    node_domains: &[Vec<Option<u32>>],
) -> CoreResult<FabricScore> {
    let nodes = &cluster.nodes;
    if node_domains.len() != nodes.len() {
        return Err(CoreError::new(
            "node_domains",
            format!("{} rows for {} nodes", node_domains.len(), nodes.len()),
        ));
    }
    for (i, g) in gangs.iter().enumerate() {
        if g.shape >= shapes.len() {
            return Err(CoreError::new(
                format!("gangs[{i}].shape"),
                format!("{} is not a shape index (0..{})", g.shape, shapes.len()),
            ));
        }
        if g.level >= levels {
            return Err(CoreError::new(
                format!("gangs[{i}].level"),
                format!("{} is not a level (0..{levels})", g.level),
            ));
        }
        if g.pods == 0 {
            return Err(CoreError::new(
                format!("gangs[{i}].pods"),
                "must be at least 1",
            ));
        }
    }
    let domain_of = |n: usize, l: usize| node_domains[n].get(l).copied().flatten();
    // domains present, per level: index -> position in `out.domains`
    let mut out = FabricScore {
        domains: Vec::new(),
        node_domain_split: vec![0.0; nodes.len()],
        node_no_domain: vec![0.0; nodes.len()],
    };
    let mut pos: Vec<std::collections::BTreeMap<u32, usize>> = vec![Default::default(); levels];
    let mut keys: Vec<(usize, u32)> = Vec::new();
    for n in 0..nodes.len() {
        for (l, slot) in pos.iter_mut().enumerate() {
            if let Some(d) = domain_of(n, l) {
                slot.entry(d).or_insert_with(|| {
                    keys.push((l, d));
                    0
                });
            }
        }
    }
    keys.sort_unstable();
    for (i, &(l, d)) in keys.iter().enumerate() {
        pos[l].insert(d, i);
        out.domains.push(DomainScore {
            level: l,
            domain: d,
            whole: true,
            capacity: vec![0; gangs.len()],
            ..DomainScore::default()
        });
    }
    for (n, node) in nodes.iter().enumerate() {
        let (total, used) = gpu_capacity(node);
        let idle = node.idle_gpu_milli() as f64;
        for (l, slot) in pos.iter().enumerate() {
            if let Some(d) = domain_of(n, l) {
                let ds = &mut out.domains[slot[&d]];
                ds.nodes += 1;
                ds.gpu_milli += total;
                ds.idle_gpu_milli += idle;
                ds.whole &= !used;
            }
        }
    }
    if gangs.is_empty() {
        return Ok(out);
    }
    // per gang and node: pods that fit, and the idle GPU one pod could use there
    let mut memo = RecoverMemo::new();
    let mut usable = vec![vec![0.0f64; nodes.len()]; gangs.len()];
    for (gi, g) in gangs.iter().enumerate() {
        let mut alone = shapes[g.shape].clone();
        alone.weight = 1.0;
        let single = [alone];
        for (n, node) in nodes.iter().enumerate() {
            let s = score_node(node, &single, &mut memo);
            usable[gi][n] = (s.idle_gpu_milli - s.fragment_gpu_milli).max(0.0);
            if let Some(d) = domain_of(n, g.level) {
                let fit = if usable[gi][n] > 0.0 {
                    pods_that_fit(node, &single[0], MAX_PODS)
                } else {
                    0
                };
                let ds = &mut out.domains[pos[g.level][&d]];
                ds.capacity[gi] = ds.capacity[gi].saturating_add(fit);
            }
        }
    }
    for (gi, g) in gangs.iter().enumerate() {
        let w = shapes[g.shape].weight;
        for (n, &u) in usable[gi].iter().enumerate() {
            let v = w * u;
            if v == 0.0 {
                continue;
            }
            match domain_of(n, g.level) {
                None => out.node_no_domain[n] += v,
                Some(d) => {
                    let ds = &mut out.domains[pos[g.level][&d]];
                    if ds.capacity[gi] < g.pods {
                        ds.fragment_gpu_milli += v;
                        out.node_domain_split[n] += v;
                    }
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::model::ClusterColumns;

    /// Nodes of `gpus` whole GPUs each on one zone, `used[i]` of them in use on node i.
    fn cluster(gpus: usize, used: &[usize]) -> Cluster {
        let n = used.len();
        let mut c = ClusterColumns {
            node_names: (0..n).map(|i| format!("n{i}")).collect(),
            node_models: vec!["H100".into(); n],
            node_policies: vec!["none".into(); n],
            node_cpu_static: vec![false; n],
            node_memory_static: vec![false; n],
            zone_offsets: (0..=n).collect(),
            zone_numa: vec![0; n],
            zone_cpu_milli: vec![64_000; n],
            zone_cpu_used: vec![0; n],
            zone_memory_mib: vec![1 << 20; n],
            zone_memory_used: vec![0; n],
            gpu_offsets: (0..=n).map(|i| i * gpus).collect(),
            mig_offsets: vec![0; n + 1],
            instance_offsets: vec![0],
            ..ClusterColumns::default()
        };
        for &u in used {
            for g in 0..gpus {
                c.gpu_ids.push(g as i64);
                c.gpu_used_milli.push(if g < u { 1000 } else { 0 });
            }
        }
        Cluster::from_columns(&c).unwrap()
    }

    fn shape(gpus: u32, weight: f64) -> Shape {
        Shape {
            cpu_milli: 1000,
            gpus,
            gpu_milli: 1000,
            weight,
            ..Shape::default()
        }
    }

    /// Twelve 4-GPU nodes in three cliques of four, six of them full, two empty in each
    /// clique; a gang of 4 pods x 4 GPUs per clique: 24 idle GPUs, none usable by the gang.
    #[test]
    fn the_clique_case_is_all_domain_split() {
        let used = [4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0];
        let c = cluster(4, &used);
        let doms: Vec<Vec<Option<u32>>> = (0..12).map(|i| vec![Some(i as u32 / 4)]).collect();
        let shapes = [shape(4, 1.0)];
        let gangs = [Gang {
            shape: 0,
            pods: 4,
            level: 0,
        }];
        let f = fabric_score(&c, &shapes, &gangs, 1, &doms).unwrap();
        assert_eq!(f.domains.len(), 3);
        for d in &f.domains {
            assert_eq!(d.capacity, vec![2]);
            assert_eq!(d.idle_gpu_milli, 8000.0);
            assert_eq!(d.fragment_gpu_milli, 8000.0);
            assert!(!d.whole);
        }
        let total: f64 = f.node_domain_split.iter().sum();
        assert_eq!(total, 24_000.0);
        // the same cluster with one clique freed: that clique hosts the gang, nothing strands
        let used = [4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0];
        let f = fabric_score(&cluster(4, &used), &shapes, &gangs, 1, &doms).unwrap();
        assert_eq!(f.domains[2].capacity, vec![4]);
        assert!(f.domains[2].whole);
        assert_eq!(f.domains[1].fragment_gpu_milli, 8000.0);
        assert_eq!(f.domains[2].fragment_gpu_milli, 0.0);
    }

    #[test]
    fn a_node_without_a_domain_is_no_domain_and_weights_count() {
        let c = cluster(4, &[0, 0]);
        let doms = vec![vec![Some(0)], vec![None]];
        let shapes = [shape(1, 0.25), shape(4, 0.75)];
        let gangs = [Gang {
            shape: 1,
            pods: 1,
            level: 0,
        }];
        let f = fabric_score(&c, &shapes, &gangs, 1, &doms).unwrap();
        assert_eq!(f.node_domain_split, vec![0.0, 0.0]);
        assert_eq!(f.node_no_domain, vec![0.0, 3000.0]);
        assert_eq!(f.domains[0].capacity, vec![1]);
    }

    #[test]
    fn bad_indices_are_errors_never_panics() {
        let c = cluster(4, &[0]);
        let shapes = [shape(1, 1.0)];
        let g = |shape, pods, level| Gang { shape, pods, level };
        let doms = vec![vec![Some(0)]];
        assert!(fabric_score(&c, &shapes, &[g(1, 1, 0)], 1, &doms).is_err());
        assert!(fabric_score(&c, &shapes, &[g(0, 1, 1)], 1, &doms).is_err());
        assert!(fabric_score(&c, &shapes, &[g(0, 0, 0)], 1, &doms).is_err());
        assert!(fabric_score(&c, &shapes, &[], 1, &[]).is_err());
        // a row shorter than the levels is "no domain" there
        let f = fabric_score(&c, &shapes, &[g(0, 1, 1)], 2, &[vec![]]).unwrap();
        assert_eq!(f.node_no_domain, vec![4000.0]);
    }
}

/// Link groups inside a node: the `link_split` category and link-aware placement.
#[cfg(test)]
mod link_tests {
    use crate::fragment::delta::place_delta;
    use crate::fragment::model::{Cluster, ClusterColumns};
    use crate::fragment::score::{score_node, Category, RecoverMemo};
    use crate::fragment::{Node, Shape};

    /// One 8-GPU node, one zone, four NVLink pairs (0,1) (2,3) (4,5) (6,7); `used` GPUs busy.
    fn pairs(used: &[i64]) -> Node {
        let c = ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["H100".into()],
            node_policies: vec!["none".into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 1],
            zone_numa: vec![0],
            zone_cpu_milli: vec![64_000],
            zone_cpu_used: vec![0],
            zone_memory_mib: vec![1 << 20],
            zone_memory_used: vec![0],
            gpu_offsets: vec![0, 8],
            gpu_ids: (0..8).collect(),
            gpu_used_milli: (0..8)
                .map(|g| if used.contains(&g) { 1000 } else { 0 })
                .collect(),
            gpu_link_groups: (0..8).map(|g| g / 2).collect(),
            mig_offsets: vec![0, 0],
            instance_offsets: vec![0],
            ..ClusterColumns::default()
        };
        Cluster::from_columns(&c).unwrap().nodes.remove(0)
    }

    fn shape(gpus: u32, link: bool, weight: f64) -> Shape {
        Shape {
            cpu_milli: 1000,
            gpus,
            gpu_milli: 1000,
            weight,
            link_group: link,
            ..Shape::default()
        }
    }

    #[test]
    fn one_idle_gpu_per_pair_is_link_split_for_a_pair_shape() {
        let n = pairs(&[0, 2, 4, 6]);
        let s = score_node(&n, &[shape(2, true, 1.0)], &mut RecoverMemo::new());
        assert_eq!(s.idle_gpu_milli, 4000.0);
        assert_eq!(s.fragment_gpu_milli, 4000.0);
        assert_eq!(s.categories[Category::LinkSplit as usize], 4000.0);
        // the same GPUs without the link requirement: all usable
        let s = score_node(&n, &[shape(2, false, 1.0)], &mut RecoverMemo::new());
        assert_eq!(s.fragment_gpu_milli, 0.0);
        // two idle GPUs in one pair: those two usable, the two single ones link_split
        let n = pairs(&[0, 2, 6, 7]);
        let s = score_node(&n, &[shape(2, true, 1.0)], &mut RecoverMemo::new());
        assert_eq!(s.categories[Category::LinkSplit as usize], 2000.0);
        assert_eq!(s.fragment_gpu_milli, 2000.0);
    }

    /// Two 1-GPU pods arrive on a node whose pairs (4,5) and (6,7) are half used. With M's
    /// 2-GPU shape needing a pair, the policy fills the broken pairs and two pairs stay whole;
    /// link-blind, the first GPUs are taken and one pair is left.
    #[test]
    fn placement_keeps_pairs_whole() {
        for (link, whole_pairs) in [(true, 2), (false, 1)] {
            let m = [shape(1, false, 0.5), shape(2, link, 0.5)];
            let mut n = pairs(&[5, 7]);
            for _ in 0..2 {
                let d = place_delta(&n, &shape(1, false, 1.0), &m, &mut RecoverMemo::new())
                    .expect("fits");
                crate::fragment::delta::apply(&mut n, &d.assignment, true).unwrap();
            }
            let free: Vec<bool> = n.zones[0].gpus.iter().map(|&(_, f)| f == 1000).collect();
            let whole = (0..4).filter(|p| free[2 * p] && free[2 * p + 1]).count();
            assert_eq!(whole, whole_pairs, "link {link}: free {free:?}");
        }
        // and a pair shape itself takes a whole pair
        let n = pairs(&[0, 2, 4]);
        let d = place_delta(
            &n,
            &shape(2, true, 1.0),
            &[shape(2, true, 1.0)],
            &mut RecoverMemo::new(),
        )
        .expect("fits");
        let ids: Vec<usize> = d.assignment.gpus.iter().map(|&(_, g, _)| g).collect();
        assert_eq!(ids, vec![6, 7]);
    }
}

/// Link groups at several sizes (the NVIDIA DRA driver's Fabric Manager partitions): a shape
/// of g GPUs needs a group of the smallest level of at least g GPUs.
#[cfg(test)]
mod partition_tests {
    use crate::fragment::delta::{apply, place_delta};
    use crate::fragment::model::{Cluster, ClusterColumns, ANY_SIZE};
    use crate::fragment::score::{score_node, Category, RecoverMemo};
    use crate::fragment::{Node, Shape};

    /// Link entries: (level size, GPU id, group).
    type Entries = Vec<(i64, i64, i64)>;

    /// The partitions of an 8-GPU board as Fabric Manager numbers them: one of 8 (id 0), two
    /// of 4 (1, 2), four of 2 (3..=6), eight of 1 (7..=14); (size, GPU, partition id).
    fn partitions() -> Entries {
        let mut out = Vec::new();
        for size in [1i64, 2, 4, 8] {
            for g in 0..8 {
                out.push((size, g, 8 / size - 1 + g / size));
            }
        }
        out
    }

    /// One 8-GPU node, one zone, its GPUs of the device plugin or (`dra`) a DRA driver, in
    /// the partitions of `links`; `used` GPUs busy.
    fn node_with(used: &[i64], dra: bool, links: &[(i64, i64, i64)]) -> ClusterColumns {
        let ids: Vec<i64> = (0..8).collect();
        let used: Vec<i64> = (0..8)
            .map(|g| if used.contains(&g) { 1000 } else { 0 })
            .collect();
        let (plugin, drag) = if dra { (0, 8) } else { (8, 0) };
        ClusterColumns {
            node_names: vec!["n".into()],
            node_models: vec!["H100".into()],
            node_policies: vec!["none".into()],
            node_cpu_static: vec![false],
            node_memory_static: vec![false],
            zone_offsets: vec![0, 1],
            zone_numa: vec![0],
            zone_cpu_milli: vec![64_000],
            zone_cpu_used: vec![0],
            zone_memory_mib: vec![1 << 20],
            zone_memory_used: vec![0],
            gpu_offsets: vec![0, plugin],
            gpu_ids: if dra { vec![] } else { ids.clone() },
            gpu_used_milli: if dra { vec![] } else { used.clone() },
            dra_gpu_offsets: vec![0, drag],
            dra_gpu_ids: if dra { ids } else { vec![] },
            dra_gpu_used_milli: if dra { used } else { vec![] },
            mig_offsets: vec![0, 0],
            instance_offsets: vec![0],
            node_link_offsets: vec![0, links.len()],
            link_sizes: links.iter().map(|l| l.0).collect(),
            link_gpu_ids: links.iter().map(|l| l.1).collect(),
            link_groups: links.iter().map(|l| l.2).collect(),
            ..ClusterColumns::default()
        }
    }

    fn fm(used: &[i64], dra: bool) -> Node {
        Cluster::from_columns(&node_with(used, dra, &partitions()))
            .unwrap()
            .nodes
            .remove(0)
    }

    fn shape(gpus: u32, dra: bool) -> Shape {
        Shape {
            cpu_milli: 1000,
            gpus,
            gpu_milli: 1000,
            weight: 1.0,
            link_group: true,
            dra,
            ..Shape::default()
        }
    }

    fn link_split(n: &Node, s: Shape) -> (f64, f64) {
        let sc = score_node(n, &[s], &mut RecoverMemo::new());
        (
            sc.categories[Category::LinkSplit as usize],
            sc.fragment_gpu_milli,
        )
    }

    #[test]
    fn the_levels_are_read_smallest_first() {
        let n = fm(&[], true);
        let sizes: Vec<u32> = n.links.iter().map(|l| l.size).collect();
        assert_eq!(sizes, vec![1, 2, 4, 8]);
        assert!(n.links.iter().all(|l| l.dra && !l.plugin));
        // a shape of g GPUs: the smallest level of at least g, of its own source
        let size = |dra: bool, g: u32| n.link_level(dra, g).map(|l| l.size);
        assert_eq!(size(true, 2), Some(2));
        assert_eq!(size(true, 3), Some(4));
        assert_eq!(size(true, 8), Some(8));
        assert_eq!(size(true, 9), None);
        assert_eq!(size(false, 2), None);
    }

    #[test]
    fn one_idle_gpu_per_partition2_is_link_split_for_a_two_gpu_partition_shape() {
        for dra in [true, false] {
            let n = fm(&[1, 3, 5, 7], dra);
            assert_eq!(link_split(&n, shape(2, dra)), (4000.0, 4000.0), "dra {dra}");
            // two idle GPUs in each partition4: link_split for four GPUs too
            assert_eq!(link_split(&n, shape(4, dra)), (4000.0, 4000.0), "dra {dra}");
            // one GPU needs no group; nor does a shape that does not ask
            assert_eq!(link_split(&n, shape(1, dra)), (0.0, 0.0));
            let blind = Shape {
                link_group: false,
                ..shape(2, dra)
            };
            assert_eq!(link_split(&n, blind), (0.0, 0.0));
        }
    }

    #[test]
    fn one_partition4_free_serves_four_gpus_and_two_pairs() {
        for dra in [true, false] {
            let n = fm(&[4, 5, 6, 7], dra);
            assert_eq!(link_split(&n, shape(4, dra)), (0.0, 0.0), "dra {dra}");
            assert_eq!(link_split(&n, shape(2, dra)), (0.0, 0.0), "dra {dra}");
            // a pair shape takes a whole partition2; two of them fill the partition4
            let mut n = n;
            let m = [shape(2, dra), shape(4, dra)];
            let mut taken = Vec::new();
            for _ in 0..2 {
                let d = place_delta(&n, &shape(2, dra), &m, &mut RecoverMemo::new()).expect("fits");
                let a = &d.assignment;
                let mut ids: Vec<usize> = a.gpus.iter().chain(&a.dra_gpus).map(|g| g.1).collect();
                ids.sort_unstable();
                taken.push(ids);
                apply(&mut n, &d.assignment, true).unwrap();
            }
            taken.sort();
            assert_eq!(taken, vec![vec![0, 1], vec![2, 3]], "dra {dra}");
        }
    }

    #[test]
    fn placement_keeps_partitions_whole() {
        // idle GPUs 0, 2, 3, 5: only partition2 (2,3) can take a pair
        for dra in [true, false] {
            let n = fm(&[1, 4, 6, 7], dra);
            let d = place_delta(
                &n,
                &shape(2, dra),
                &[shape(2, dra)],
                &mut RecoverMemo::new(),
            )
            .expect("fits");
            let a = &d.assignment;
            let ids: Vec<usize> = a.gpus.iter().chain(&a.dra_gpus).map(|g| g.1).collect();
            assert_eq!(ids, vec![2, 3], "dra {dra}");
            // no partition4 has four idle GPUs: a four-GPU shape has no placement
            assert!(
                place_delta(
                    &n,
                    &shape(4, dra),
                    &[shape(2, dra)],
                    &mut RecoverMemo::new()
                )
                .is_none(),
                "dra {dra}"
            );
        }
    }

    #[test]
    fn a_level_of_one_source_does_not_bind_the_other() {
        // the device plugin's NVLink groups (a level of any size) on GPUs 0..8, with 4 DRA
        // GPUs beside them that publish no groups: a DRA pair shape is unconstrained
        let mut c = node_with(&[0, 2, 4, 6], false, &[]);
        c.gpu_link_groups = (0..8).map(|g| g / 2).collect();
        c.dra_gpu_offsets = vec![0, 4];
        c.dra_gpu_ids = (8..12).collect();
        c.dra_gpu_used_milli = vec![0, 1000, 0, 1000];
        let n = Cluster::from_columns(&c).unwrap().nodes.remove(0);
        assert_eq!(n.links.len(), 1);
        assert_eq!(n.links[0].size, ANY_SIZE);
        let s = score_node(&n, &[shape(2, true)], &mut RecoverMemo::new());
        assert_eq!(s.categories[Category::LinkSplit as usize], 0.0);
        // the plugin pair shape: the four lone GPUs are link_split (the DRA GPUs: no access)
        let s = score_node(&n, &[shape(2, false)], &mut RecoverMemo::new());
        assert_eq!(s.categories[Category::LinkSplit as usize], 4000.0);
        assert_eq!(s.categories[Category::NoAccess as usize], 2000.0);
        // idle DRA GPUs 8, 9, 10: in one group of a level of any size (entries of size 0),
        // and 8 and 10 in two groups of a level of size 2 (9 unlisted there: alone)
        c.dra_gpu_used_milli = vec![0, 0, 0, 1000];
        c.node_link_offsets = vec![0, 5];
        c.link_sizes = vec![2, 2, 0, 0, 0];
        c.link_gpu_ids = vec![8, 10, 8, 9, 10];
        c.link_groups = vec![0, 1, 0, 0, 0];
        let n = Cluster::from_columns(&c).unwrap().nodes.remove(0);
        let sizes: Vec<(u32, bool, bool)> =
            n.links.iter().map(|l| (l.size, l.plugin, l.dra)).collect();
        assert_eq!(sizes, vec![(2, false, true), (ANY_SIZE, true, true)]);
        // a DRA pair uses the level of size 2: no two idle GPUs share a group
        let s = score_node(&n, &[shape(2, true)], &mut RecoverMemo::new());
        assert_eq!(s.categories[Category::LinkSplit as usize], 3000.0);
        // three DRA GPUs: the level of any size, where the three are one group
        let s = score_node(&n, &[shape(3, true)], &mut RecoverMemo::new());
        assert_eq!(s.categories[Category::LinkSplit as usize], 0.0);
        assert_eq!(s.fragment_gpu_milli, 4000.0); // the plugin's idle GPUs: no access
    }

    #[test]
    fn bad_link_entries_are_refused_naming_the_node() {
        let bad: Vec<(&str, Entries)> = vec![
            ("not a whole GPU", vec![(2, 8, 0)]),
            ("listed twice", vec![(2, 0, 0), (2, 0, 1)]),
            ("holds 3 GPUs", vec![(2, 0, 0), (2, 1, 0), (2, 2, 0)]),
            ("level size -1", vec![(-1, 0, 0)]),
            ("out of range", vec![(2, 0, -1)]),
            ("out of range", vec![(2, 0, i64::MAX)]),
            ("out of range", vec![(2, -3, 0)]),
        ];
        for (why, links) in bad {
            let e = Cluster::from_columns(&node_with(&[], true, &links)).unwrap_err();
            assert_eq!(e.field, "nodes[\"n\"].links", "{why}: {e}");
            assert!(e.message.contains(why), "{why}: {e}");
        }
        // the offsets must describe the entries
        let mut c = node_with(&[], true, &partitions());
        c.node_link_offsets = vec![0, 3];
        let e = Cluster::from_columns(&c).unwrap_err();
        assert_eq!(e.field, "node_link_offsets");
        let mut c = node_with(&[], true, &partitions());
        c.link_groups.pop();
        let e = Cluster::from_columns(&c).unwrap_err();
        assert_eq!(e.field, "link_groups");
    }
}
