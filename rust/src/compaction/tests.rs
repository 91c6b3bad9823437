//! The planner over the full model (`ClusterView`): defragmentation as before, the rescues that
//! take several moves, budgets, groups and allowed nodes.

use super::*;
use crate::fragment::delta::{place_delta, Assignment};
use crate::fragment::model::{Cluster, ClusterColumns};
use crate::fragment::score::RecoverMemo;
use crate::fragment::Shape;
use crate::placement::ClusterView;

/// Nodes of two 4-GPU zones under single-numa-node (or one zone of `gpus` GPUs with
/// `one_zone`); `used[node][gpu]` in milli.
fn cluster(used: &[Vec<i64>], one_zone: bool) -> Cluster {
    let mut c = ClusterColumns::default();
    c.zone_offsets.push(0);
    c.gpu_offsets.push(0);
    c.mig_offsets.push(0);
    c.instance_offsets.push(0);
    for (ni, u) in used.iter().enumerate() {
        c.node_names.push(format!("n{ni}"));
        c.node_models.push("H100".into());
        c.node_policies.push("single-numa-node".into());
        c.node_cpu_static.push(true);
        c.node_memory_static.push(false);
        let zones: Vec<&[i64]> = if one_zone {
            vec![&u[..]]
        } else {
            vec![&u[..4], &u[4..]]
        };
        for (z, gpus) in zones.iter().enumerate() {
            c.zone_numa.push(z as i64);
            c.zone_cpu_milli.push(32000);
            c.zone_cpu_used.push(0);
            c.zone_memory_mib.push(0);
            c.zone_memory_used.push(0);
            for (g, &x) in gpus.iter().enumerate() {
                c.gpu_ids.push((z * 4 + g) as i64);
                c.gpu_used_milli.push(x);
            }
            c.gpu_offsets.push(c.gpu_ids.len());
            c.mig_offsets.push(0);
        }
        c.zone_offsets.push(c.zone_numa.len());
    }
    Cluster::from_columns(&c).unwrap()
}

fn gpus(n: u32) -> Shape {
    Shape {
        cpu_milli: 1000,
        memory_mib: 0,
        gpus: n,
        gpu_milli: 1000,
        mig_profile: None,
        gpu_models: vec![],
        weight: 1.0,
        ..Default::default()
    }
}

fn on(node: usize, zone: usize, gpu: usize) -> Movable<Shape, Assignment> {
    Movable {
        node,
        task: gpus(1),
        place: Assignment {
            cpu: vec![],
            memory: vec![],
            gpus: vec![(zone, gpu, 1000)],
            mig: None,
            ..Default::default()
        },
        allowed: None,
        pdb: None,
        group: None,
    }
}

fn input<'a>(
    movable: &'a [Movable<Shape, Assignment>],
    pending: &'a [Pending<Shape>],
    node_sets: &'a [NodeSet],
    pdb: &'a [u32],
) -> Input<'a, Shape, Assignment> {
    Input {
        movable,
        pending,
        node_sets,
        pdb_headroom: pdb,
    }
}

/// The textbook case: three 4-GPU nodes (one zone each), each running two 1-GPU
/// replicas of one Deployment; a pending 4-GPU pod fits nowhere. No single move lowers F(M),
/// but two moves free a node.
fn textbook() -> (Cluster, Vec<Movable<Shape, Assignment>>) {
    let used = vec![vec![1000, 1000, 0, 0]; 3];
    let c = cluster(&used, true);
    let movable = (0..3)
        .flat_map(|n| [on(n, 0, 0), on(n, 0, 1)])
        .collect::<Vec<_>>();
    (c, movable)
}

#[test]
fn defragmentation_alone_cannot_free_a_node_in_the_textbook_case() {
    let (c, movable) = textbook();
    let shapes = vec![
        gpus(4),
        Shape {
            weight: 1.0,
            ..gpus(1)
        },
    ];
    let mut v = ClusterView::new(c, &shapes);
    let limits = Limits {
        rescue_depth: 0,
        ..Limits::default()
    };
    let p = plan(&mut v, &input(&movable, &[], &[], &[]), &limits);
    assert!(p.moves.is_empty(), "{:?}", p.moves);
}

#[test]
fn a_rescue_of_two_moves_frees_a_node_for_the_pending_pod() {
    let (c, movable) = textbook();
    let shapes = vec![gpus(1)];
    let pending = vec![Pending {
        task: gpus(4),
        allowed: None,
    }];
    let mut v = ClusterView::new(c.clone(), &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &[], &[]),
        &Limits::default(),
    );
    assert_eq!(p.rescues.len(), 1, "{p:?}");
    let r = &p.rescues[0];
    assert_eq!(r.moves.len(), 2);
    assert_eq!(r.waits, 0);
    let target = r.node;
    for &mi in &r.moves {
        let mv = &p.moves[mi];
        assert_eq!(mv.from, target);
        assert_ne!(mv.to, target);
        assert_eq!(mv.rescue, Some(0));
    }
    // on the cluster the plan leaves, the 4-GPU pod is placed on the freed node and the two
    // moved pods sit on the others
    let n = &v.cluster.nodes;
    assert_eq!(n[target].idle_gpu_milli(), 0);
    let idle: u64 = n.iter().map(|x| x.idle_gpu_milli()).sum();
    assert_eq!(idle, 2000);
    // and carrying out the moves on the original cluster makes room exactly there
    let mut after = c.clone();
    let mut memo = RecoverMemo::new();
    for mv in &p.moves {
        let m = &movable[mv.pod];
        crate::fragment::delta::apply(&mut after.nodes[mv.from], &m.place, false).unwrap();
        crate::fragment::delta::apply(&mut after.nodes[mv.to], &mv.to_place, true).unwrap();
    }
    assert!(place_delta(&after.nodes[target], &gpus(4), &shapes, &mut memo).is_some());
}

#[test]
fn the_rescue_prefers_pods_whose_budget_allows_them_to_go_together() {
    // node 0's two pods share a budget with headroom 1 (one must wait for the other), node 1's
    // pods have none: the rescue takes node 1's.
    let used = vec![
        vec![1000, 1000, 0, 0],
        vec![1000, 1000, 0, 0],
        vec![1000, 0, 0, 0],
    ];
    let c = cluster(&used, true);
    let mut movable = vec![on(0, 0, 0), on(0, 0, 1), on(1, 0, 0), on(1, 0, 1)];
    movable[0].pdb = Some(0);
    movable[1].pdb = Some(0);
    let shapes = vec![gpus(1)];
    let pending = vec![Pending {
        task: gpus(4),
        allowed: None,
    }];
    let mut v = ClusterView::new(c, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &[], &[1]),
        &Limits::default(),
    );
    let r = &p.rescues[0];
    assert_eq!((r.node, r.waits), (1, 0), "{p:?}");
    // with only node 0 to free, the plan says one eviction waits for the other
    let movable0 = &movable[..2];
    let mut v = ClusterView::new(cluster(&used, true), &shapes);
    let sets = vec![vec![0b001u64]];
    let pending0 = vec![Pending {
        task: gpus(4),
        allowed: Some(0),
    }];
    let p = plan(
        &mut v,
        &input(movable0, &pending0, &sets, &[1]),
        &Limits::default(),
    );
    assert_eq!((p.rescues[0].node, p.rescues[0].waits), (0, 1), "{p:?}");
}

#[test]
fn allowed_nodes_bound_both_the_pending_pod_and_the_moved_ones() {
    let (c, mut movable) = textbook();
    // node 2 is the only node the pending pod may use; its pods may only go to node 0
    let sets = vec![vec![0b100u64], vec![0b001u64]];
    movable[4].allowed = Some(1);
    movable[5].allowed = Some(1);
    let shapes = vec![gpus(1)];
    let pending = vec![Pending {
        task: gpus(4),
        allowed: Some(0),
    }];
    let mut v = ClusterView::new(c, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &sets, &[]),
        &Limits::default(),
    );
    let r = &p.rescues[0];
    assert_eq!(r.node, 2);
    for &mi in &r.moves {
        assert_eq!(p.moves[mi].to, 0);
    }
    // nowhere to go at all: no rescue
    let sets = vec![vec![0b100u64], vec![0u64]];
    let mut v = ClusterView::new(textbook().0, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &sets, &[]),
        &Limits::default(),
    );
    assert!(p.rescues.is_empty());
    assert_eq!(p.unrescued, vec![0]);
}

#[test]
fn one_pod_of_a_group_moves_per_plan() {
    let (c, mut movable) = textbook();
    for m in &mut movable {
        m.group = Some(7);
    }
    let shapes = vec![gpus(1)];
    let pending = vec![Pending {
        task: gpus(4),
        allowed: None,
    }];
    let mut v = ClusterView::new(c, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &[], &[]),
        &Limits::default(),
    );
    assert!(p.rescues.is_empty(), "two moves of one group: {p:?}");
}

#[test]
fn frees_an_aligned_zone_for_a_four_gpu_replica() {
    // n0: one 1-GPU pod in each zone; n1: zone 0 has 3 used GPUs, zone 1 is full. A 4-GPU
    // replica fits nowhere.
    let used = vec![
        vec![1000, 0, 0, 0, 1000, 0, 0, 0],
        vec![1000, 1000, 1000, 0, 1000, 1000, 1000, 1000],
    ];
    let c = cluster(&used, false);
    let movable = vec![on(0, 0, 0), on(0, 1, 0)];
    let shapes = vec![
        Shape {
            weight: 0.5,
            ..gpus(4)
        },
        Shape {
            weight: 0.5,
            ..gpus(1)
        },
    ];
    let pending = vec![Pending {
        task: gpus(4),
        allowed: None,
    }];
    let mut v = ClusterView::new(c, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &[], &[]),
        &Limits::default(),
    );
    // one move frees a zone: the fewest evictions
    let r = &p.rescues[0];
    assert_eq!(r.moves.len(), 1, "{p:?}");
    assert_eq!(r.node, 0);
    let mv = &p.moves[r.moves[0]];
    assert_eq!((mv.from, mv.to), (0, 1));
    assert_eq!(
        mv.to_place.gpus,
        vec![(0, 3, 1000)],
        "onto n1's fuller zone"
    );
}

#[test]
fn nothing_to_gain_means_no_move_and_bad_indices_are_ignored() {
    let used = vec![vec![1000, 1000, 1000, 1000, 0, 0, 0, 0], vec![0; 8]];
    let c = cluster(&used, false);
    let shapes = vec![gpus(4)];
    let mut movable = vec![on(0, 0, 0)];
    let mut v = ClusterView::new(c.clone(), &shapes);
    assert!(
        plan(&mut v, &input(&movable, &[], &[], &[]), &Limits::default())
            .moves
            .is_empty()
    );
    movable[0].node = 9; // not a node: never moved
    movable[0].allowed = Some(5); // not a set: allows nothing
    let mut v = ClusterView::new(c, &shapes);
    assert!(
        plan(&mut v, &input(&movable, &[], &[], &[]), &Limits::default())
            .moves
            .is_empty()
    );
}

#[test]
fn combinations_enumerate_every_subset_once() {
    let mut c = vec![0, 1];
    let mut seen = vec![c.clone()];
    while next_combination(&mut c, 4) {
        seen.push(c.clone());
    }
    assert_eq!(seen.len(), 6);
    assert_eq!(seen.last().unwrap(), &vec![2, 3]);
}

/// The old greedy defragmentation, recomputing every pod's fall and every destination before
/// each move: the incremental one must make the same moves.
fn naive_defragment(
    v: &mut ClusterView,
    movable: &[Movable<Shape, Assignment>],
    max_moves: usize,
    min_gain: f64,
) -> Vec<(usize, usize, f64)> {
    let mut moved = vec![false; movable.len()];
    let mut out = Vec::new();
    while out.len() < max_moves {
        let mut best: Option<(usize, Ranked<Assignment>, f64)> = None;
        for (k, m) in movable.iter().enumerate() {
            if moved[k] {
                continue;
            }
            let Some(to) = choose(v, &m.task, |j| j != m.node) else {
                continue;
            };
            let fall = v.frag(m.node) - v.frag_without(m.node, &m.task, &m.place);
            let change = to.features.inc - fall;
            if best.as_ref().is_none_or(|b| change < b.2 - 1e-9) {
                best = Some((k, to, change));
            }
        }
        let Some((k, to, change)) = best else { break };
        if -change < min_gain {
            break;
        }
        let m = &movable[k];
        v.give(m.node, &m.task, &m.place);
        v.take(to.node, &m.task, &to.place);
        moved[k] = true;
        out.push((k, to.node, -change));
    }
    out
}

#[test]
fn incremental_defragmentation_makes_the_moves_of_the_full_recomputation() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut total = 0;
    for round in 0..25 {
        let nodes = 4 + next(10) as usize;
        let mut used = vec![vec![0i64; 8]; nodes];
        let mut movable = Vec::new();
        for (n, u) in used.iter_mut().enumerate() {
            for (g, x) in u.iter_mut().enumerate() {
                if next(100) < 45 {
                    *x = 1000;
                    movable.push(on(n, g / 4, g % 4));
                }
            }
        }
        let c = cluster(&used, false);
        let shapes = vec![
            Shape {
                weight: 0.5,
                ..gpus(1)
            },
            Shape {
                weight: 0.3,
                ..gpus(2)
            },
            Shape {
                weight: 0.2,
                ..gpus(4)
            },
        ];
        let limits = Limits {
            max_moves: 6,
            rescue_depth: 0,
            ..Limits::default()
        };
        let mut v = ClusterView::new(c.clone(), &shapes);
        let p = plan(&mut v, &input(&movable, &[], &[], &[]), &limits);
        let got: Vec<(usize, usize, f64)> = p.moves.iter().map(|m| (m.pod, m.to, m.gain)).collect();
        let mut w = ClusterView::new(c, &shapes);
        let want = naive_defragment(&mut w, &movable, limits.max_moves, limits.min_gain);
        assert_eq!(got.len(), want.len(), "round {round}: {got:?} vs {want:?}");
        total += got.len();
        for (a, b) in got.iter().zip(&want) {
            assert_eq!((a.0, a.1), (b.0, b.1), "round {round}: {got:?} vs {want:?}");
            assert!(
                (a.2 - b.2).abs() < 1e-9,
                "round {round}: {got:?} vs {want:?}"
            );
        }
    }
    // the cases are not trivial: most rounds make several moves
    assert!(total > 50, "{total} moves in all");
}

#[test]
fn pending_tasks_of_a_shape_no_rescue_can_place_are_all_unrescued() {
    // an 8-GPU task on 4-GPU nodes: neither fits nor has a rescue; the second and third of the
    // same shape get the first one's answer, a 4-GPU one after them is still rescued
    let (c, movable) = textbook();
    let shapes = vec![gpus(1)];
    let mut pending: Vec<Pending<Shape>> = (0..3)
        .map(|_| Pending {
            task: gpus(8),
            allowed: None,
        })
        .collect();
    pending.push(Pending {
        task: gpus(4),
        allowed: None,
    });
    let mut v = ClusterView::new(c, &shapes);
    let p = plan(
        &mut v,
        &input(&movable, &pending, &[], &[]),
        &Limits::default(),
    );
    assert_eq!(p.unrescued, vec![0, 1, 2], "{p:?}");
    assert_eq!(p.rescues.len(), 1);
    assert_eq!(p.rescues[0].pending, 3);
}
