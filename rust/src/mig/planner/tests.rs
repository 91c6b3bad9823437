//! Planner tests: hand-worked nodes, the limits, and the dynamic programme against every
//! combination of options on random small nodes.

use super::*;
use crate::mig::catalog::Catalog;
use crate::mig::placement::feasible;
use crate::mig::placement::tests::Rng;

fn a100() -> &'static GpuModel {
    Catalog::builtin().model("A100-SXM4-40GB").unwrap()
}

fn inst(m: &GpuModel, name: &str, start: u8, pod: Option<&str>) -> GpuInstance {
    GpuInstance {
        profile: m.profile_index(name).unwrap(),
        start,
        used: pod.is_some(),
        pod: pod.map(str::to_string),
    }
}

fn pending(m: &GpuModel, list: &[(&str, u32)]) -> Demand {
    Demand {
        pending: list
            .iter()
            .map(|&(n, c)| (m.profile_index(n).unwrap(), c))
            .collect(),
        workload: Vec::new(),
    }
}

fn layout_names(m: &GpuModel, g: &GpuPlan) -> Vec<String> {
    g.layout
        .iter()
        .map(|i| {
            format!(
                "{}@{}:{}",
                m.profiles[i.profile].name,
                i.start,
                i.fate.name()
            )
        })
        .collect()
}

fn assert_valid(m: &GpuModel, p: &Plan) {
    for g in &p.gpus {
        let pins: Vec<(usize, u8)> = g.layout.iter().map(|i| (i.profile, i.start)).collect();
        assert!(
            feasible(m, &pins, &[]),
            "GPU {} gets an invalid layout {pins:?}",
            g.id
        );
    }
}

#[test]
fn repartitioning_free_instances_serves_a_pending_3g() {
    let m = a100();
    // A used 3g at 0; the other half is cut into free 1g instances, no 4-slice window is free.
    let gpus = vec![MigGpu {
        id: 0,
        instances: vec![
            inst(m, "3g.20gb", 0, Some("ns/a")),
            inst(m, "1g.5gb", 4, None),
            inst(m, "1g.5gb", 5, None),
            inst(m, "1g.10gb", 6, None),
        ],
    }];
    let d = pending(m, &[("3g.20gb", 1)]);
    let p = plan(m, &gpus, &d, &Limits::default()).unwrap();
    assert_valid(m, &p);
    let g = &p.gpus[0];
    assert!(g.changed);
    assert_eq!(layout_names(m, g), ["3g.20gb@0:kept-used", "3g.20gb@4:new"]);
    assert_eq!(g.destroyed.len(), 3);
    assert!(g.pods_to_move.is_empty());
    assert_eq!(p.used_destroyed, 0);
    let line = &p.demand[0];
    assert_eq!(
        (line.pending, line.served_before, line.served_after),
        (1, 0, 1)
    );
    assert_eq!(g.serves, vec![(m.profile_index("3g.20gb").unwrap(), 1)]);
    assert!(p.fragment_after < p.fragment_before);
    assert!(p.exact);
}

fn blocked_node(m: &GpuModel) -> Vec<MigGpu> {
    // Used 1g instances at slices 1 and 5 block both 4-slice windows.
    vec![MigGpu {
        id: 3,
        instances: vec![
            inst(m, "1g.5gb", 0, None),
            inst(m, "1g.5gb", 1, Some("ns/b")),
            inst(m, "1g.5gb", 2, None),
            inst(m, "1g.5gb", 5, Some("ns/c")),
            inst(m, "1g.5gb", 6, None),
        ],
    }]
}

#[test]
fn serving_needs_moving_one_pod_and_a_limit_forbids_it() {
    let m = a100();
    let gpus = blocked_node(m);
    let d = pending(m, &[("3g.20gb", 1)]);
    // Default limit (0): nothing is destroyed that is used, the demand stays unserved.
    let p = plan(m, &gpus, &d, &Limits::default()).unwrap();
    assert_valid(m, &p);
    assert_eq!(p.used_destroyed, 0);
    assert!(p.gpus[0].pods_to_move.is_empty());
    let three = m.profile_index("3g.20gb").unwrap();
    let line = p.demand.iter().find(|l| l.profile == three).unwrap();
    assert_eq!(line.served_after, 0);
    // Allowing one: pod c moves (freeing 4..8 destroys one free instance, freeing 0..4 two),
    // the 3g fits at 4, c gets a new 1g on the same GPU.
    let limits = Limits {
        max_used_destroyed: 1,
        ..Limits::default()
    };
    let p = plan(m, &gpus, &d, &limits).unwrap();
    assert_valid(m, &p);
    assert_eq!(p.used_destroyed, 1);
    assert_eq!(p.gpus[0].pods_to_move, vec!["ns/c".to_string()]);
    let line = p.demand.iter().find(|l| l.profile == three).unwrap();
    assert_eq!(line.served_after, 1);
    let one = m.profile_index("1g.5gb").unwrap();
    let back = p.demand.iter().find(|l| l.profile == one).unwrap();
    assert_eq!((back.moved, back.rehoused), (1, 1));
    assert_eq!(p.net_served, 1);
    let names = layout_names(m, &p.gpus[0]);
    assert_eq!(
        names,
        [
            "1g.5gb@0:kept-free",
            "1g.5gb@1:kept-used",
            "1g.5gb@2:kept-free",
            "1g.5gb@3:new",
            "3g.20gb@4:new"
        ]
    );
    assert_eq!(p.free_destroyed, 1);
    // The GPU may not be touched: nothing changes.
    let limits = Limits {
        max_used_destroyed: 1,
        gpus: Some(vec![0, 1]),
        ..Limits::default()
    };
    let p = plan(m, &gpus, &d, &limits).unwrap();
    assert!(!p.gpus[0].changed);
    // mig-parted re-creates every instance of a GPU it changes: 2 used instances, limit 1.
    let limits = Limits {
        max_used_destroyed: 1,
        executor: Executor::MigParted,
        ..Limits::default()
    };
    let p = plan(m, &gpus, &d, &limits).unwrap();
    assert!(!p.gpus[0].changed);
    let limits = Limits {
        max_used_destroyed: 2,
        executor: Executor::MigParted,
        ..Limits::default()
    };
    let p = plan(m, &gpus, &d, &limits).unwrap();
    assert_valid(m, &p);
    assert!(p.gpus[0].changed);
    assert_eq!(p.gpus[0].pods_to_move.len(), 2);
    assert!(p.gpus[0].layout.iter().all(|i| i.fate == Fate::New));
    assert_eq!(p.net_served, 1);
}

#[test]
fn no_demand_changes_nothing_and_a_satisfied_node_stays() {
    let m = a100();
    let gpus = blocked_node(m);
    let p = plan(m, &gpus, &Demand::default(), &Limits::default()).unwrap();
    assert!(p.gpus.iter().all(|g| !g.changed));
    assert_eq!(p.fragment_before, 0.0);
    // Pending 1g.5gb: the free 1g instances already serve it.
    let p = plan(m, &gpus, &pending(m, &[("1g.5gb", 2)]), &Limits::default()).unwrap();
    assert_eq!(p.demand[0].served_before, 2);
    assert_eq!(p.demand[0].served_after, 2);
}

#[test]
fn workload_weights_shape_the_free_slices() {
    let m = a100();
    // An empty GPU and a workload that wants 2g.10gb only: cut it into 3 x 2g (+ nothing else).
    let gpus = vec![MigGpu {
        id: 0,
        instances: vec![],
    }];
    let d = Demand {
        pending: vec![],
        workload: vec![(m.profile_index("2g.10gb").unwrap(), 1.0)],
    };
    let p = plan(m, &gpus, &d, &Limits::default()).unwrap();
    assert_valid(m, &p);
    let names = layout_names(m, &p.gpus[0]);
    assert_eq!(names, ["2g.10gb@0:new", "2g.10gb@2:new", "2g.10gb@4:new"]);
    assert_eq!(p.fragment_before, 7.0);
    assert_eq!(p.fragment_after, 1.0);
}

#[test]
fn bad_input_is_an_error_naming_the_field() {
    let m = a100();
    let dup = vec![
        MigGpu {
            id: 1,
            instances: vec![],
        },
        MigGpu {
            id: 1,
            instances: vec![],
        },
    ];
    let e = plan(m, &dup, &Demand::default(), &Limits::default()).unwrap_err();
    assert_eq!(e.field, "gpus[1].gpu");
    let overlap = vec![MigGpu {
        id: 0,
        instances: vec![inst(m, "3g.20gb", 0, None), inst(m, "1g.5gb", 2, None)],
    }];
    let e = plan(m, &overlap, &Demand::default(), &Limits::default()).unwrap_err();
    assert_eq!(e.field, "gpus[0].instances[1]");
    let bad_start = vec![MigGpu {
        id: 0,
        instances: vec![inst(m, "3g.20gb", 0, None)],
    }];
    let mut g = bad_start.clone();
    g[0].instances[0].start = 2;
    assert_eq!(
        plan(m, &g, &Demand::default(), &Limits::default())
            .unwrap_err()
            .field,
        "gpus[0].instances[0].start"
    );
    let d = Demand {
        pending: vec![],
        workload: vec![(0, -1.0)],
    };
    assert_eq!(
        plan(m, &bad_start, &d, &Limits::default())
            .unwrap_err()
            .field,
        "workload[0].weight"
    );
    let d = Demand {
        pending: vec![(99, 1)],
        workload: vec![],
    };
    assert_eq!(
        plan(m, &bad_start, &d, &Limits::default())
            .unwrap_err()
            .field,
        "pending[0].profile"
    );
    assert!(Executor::parse("nvml").is_err());
}

/// A random current layout: profiles added while they fit, some used.
pub(crate) fn random_gpu(m: &GpuModel, id: u32, rng: &mut Rng) -> MigGpu {
    let mut pins: Vec<(usize, u8)> = Vec::new();
    let mut instances = Vec::new();
    for _ in 0..rng.below(9) {
        let p = rng.below(m.profiles.len());
        let pls = &m.profiles[p].placements;
        let s = pls[rng.below(pls.len())].start;
        pins.push((p, s));
        if feasible(m, &pins, &[]) {
            let used = rng.below(2) == 0;
            instances.push(GpuInstance {
                profile: p,
                start: s,
                used,
                pod: used.then(|| format!("ns/p{id}-{s}")),
            });
        } else {
            pins.pop();
        }
    }
    MigGpu { id, instances }
}

#[test]
fn the_programme_finds_the_best_combination_on_random_nodes() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for model in Catalog::builtin().models() {
        for case in 0..150 {
            let n_gpus = 1 + rng.below(3);
            let gpus: Vec<MigGpu> = (0..n_gpus)
                .map(|g| random_gpu(model, g as u32, &mut rng))
                .collect();
            let np = model.profiles.len();
            let demand = Demand {
                pending: (0..rng.below(4))
                    .map(|_| (rng.below(np), 1 + rng.below(3) as u32))
                    .collect(),
                workload: (0..rng.below(3))
                    .map(|_| (rng.below(np), 1.0 + rng.below(4) as f64))
                    .collect(),
            };
            let limits = Limits {
                gpus: (rng.below(4) == 0).then(|| vec![0]),
                max_used_destroyed: rng.below(4) as u32,
                executor: if rng.below(4) == 0 {
                    Executor::MigParted
                } else {
                    Executor::Placement
                },
            };
            let fast = plan(model, &gpus, &demand, &limits).unwrap();
            let slow = plan_with(
                model,
                &gpus,
                &demand,
                &limits,
                How {
                    prune: false,
                    exhaustive: true,
                },
            )
            .unwrap();
            assert_eq!(fast, slow, "{} case {case}", model.name);
            assert_valid(model, &fast);
            assert!(fast.used_destroyed <= limits.max_used_destroyed);
            // Never worse than doing nothing.
            let before: i64 = fast.demand.iter().map(|l| l.served_before as i64).sum();
            assert!(fast.net_served >= before, "{} case {case}", model.name);
        }
    }
}
