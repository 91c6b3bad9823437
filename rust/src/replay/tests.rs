//! Engine tests on small hand-made clusters: each policy's placement rule and the metric.

use super::*;

fn node(name: &str, cpu: i64, gpus: i64) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_milli: cpu,
        memory_mib: 1 << 20,
        gpus,
        model: "G2".into(),
        rdma: 0,
    }
}

fn task(cpu: i64, num: i64, milli: i64) -> TaskSpec {
    TaskSpec {
        cpu_milli: cpu,
        memory_mib: 0,
        num_gpu: num,
        gpu_milli: milli,
        models: vec![],
        rdma: 0,
    }
}

fn shape(cpu: i64, num: i64, milli: i64, w: f64) -> ShapeSpec {
    ShapeSpec {
        cpu_milli: cpu,
        num_gpu: num,
        gpu_milli: milli,
        models: vec![],
        weight: w,
        rdma: 0,
    }
}

fn cfg(policy: Policy) -> Config {
    Config {
        policy,
        tune: 0.0,
        shuffle: false,
        ..Default::default()
    }
}

fn nodes_of(r: &ReplayResult) -> Vec<i64> {
    r.node_of.clone()
}

#[test]
fn bestfit_packs_the_fuller_node() {
    let nodes = vec![node("a", 32000, 2), node("b", 32000, 2)];
    let tasks = vec![task(1000, 1, 1000), task(1000, 1, 1000)];
    let r = run(
        &nodes,
        &tasks,
        &[shape(1000, 1, 1000, 1.0)],
        &cfg(Policy::BestFit),
    )
    .unwrap();
    let n = nodes_of(&r);
    assert_eq!(n[0], n[1], "best fit stacks on the same node: {n:?}");
}

#[test]
fn packing_prefers_a_shared_gpu() {
    let nodes = vec![node("a", 32000, 2), node("b", 32000, 2)];
    let tasks = vec![task(1000, 1, 500), task(1000, 1, 300)];
    let r = run(
        &nodes,
        &tasks,
        &[shape(1000, 1, 500, 1.0)],
        &cfg(Policy::Packing),
    )
    .unwrap();
    assert_eq!(r.node_of[0], r.node_of[1]);
    assert_eq!(r.checkpoints.last().unwrap().allocated_milli, 800);
}

#[test]
fn fgd_keeps_whole_gpus_for_whole_gpu_shapes() {
    // Node a has one GPU half used; a 0.5 task should go there (FGD: fills the stranded half).
    let nodes = vec![node("a", 32000, 2), node("b", 32000, 2)];
    let tasks = vec![task(1000, 1, 500), task(1000, 1, 500)];
    let shapes = [shape(1000, 1, 1000, 0.5), shape(1000, 1, 500, 0.5)];
    for p in [Policy::Fgd, Policy::Pyctl] {
        let r = run(&nodes, &tasks, &shapes, &cfg(p)).unwrap();
        assert_eq!(r.node_of[0], r.node_of[1], "{p:?}");
        let last = r.checkpoints.last().unwrap();
        assert!(last.frag_milli.abs() < 1e-9, "{p:?}: {}", last.frag_milli);
    }
}

#[test]
fn clustering_groups_same_affinity() {
    let nodes = vec![
        node("a", 32000, 4),
        node("b", 32000, 4),
        node("c", 32000, 4),
    ];
    let tasks = vec![task(1000, 1, 300), task(1000, 2, 1000), task(1000, 1, 300)];
    let r = run(
        &nodes,
        &tasks,
        &[shape(1000, 1, 300, 1.0)],
        &cfg(Policy::Clustering),
    )
    .unwrap();
    assert_eq!(r.node_of[0], r.node_of[2]);
    assert_ne!(r.node_of[0], r.node_of[1]);
}

#[test]
fn random_and_dotprod_place_everything_that_fits() {
    let nodes = vec![node("a", 32000, 2), node("b", 32000, 2)];
    let tasks = vec![task(1000, 1, 1000); 4];
    for p in [Policy::Random, Policy::DotProd] {
        let r = run(&nodes, &tasks, &[shape(1000, 1, 1000, 1.0)], &cfg(p)).unwrap();
        assert_eq!(r.placed, 4, "{p:?}");
        assert_eq!(r.failed, 0);
    }
}

#[test]
fn failed_tasks_are_not_retried_and_checkpoints_track_arrivals() {
    let nodes = vec![node("a", 4000, 1)];
    let tasks = vec![task(1000, 1, 600), task(1000, 1, 600), task(1000, 1, 400)];
    let r = run(
        &nodes,
        &tasks,
        &[shape(1000, 1, 600, 1.0)],
        &cfg(Policy::Fgd),
    )
    .unwrap();
    assert_eq!(r.node_of, vec![0, -1, 0]);
    assert_eq!(r.failed, 1);
    // arrived 600 (60%), 1200 (120%), 1600 (160%, beyond 130).
    let at = |k: u32| {
        r.checkpoints
            .iter()
            .find(|c| c.arrived_pct == k)
            .unwrap()
            .clone()
    };
    assert_eq!(at(60).allocated_milli, 600);
    assert_eq!(at(61).allocated_milli, 600);
    assert_eq!(at(120).allocated_milli, 600);
    assert_eq!(at(121).allocated_milli, 1000);
    assert_eq!(r.checkpoints.last().unwrap().arrived_pct, 130);
}

#[test]
fn tune_resamples_to_the_target_and_is_deterministic() {
    let nodes = vec![node("a", 1 << 40, 8); 10];
    let tasks: Vec<TaskSpec> = (0..20).map(|i| task(1000, 1, 100 + 20 * i)).collect();
    let prep = prepare(&nodes, &tasks, &[], false).unwrap();
    let c = Config::default();
    let a = replay_order(&prep.tasks, prep.capacity_milli, &c, &mut Rng::new(7));
    let b = replay_order(&prep.tasks, prep.capacity_milli, &c, &mut Rng::new(7));
    assert_eq!(a, b);
    let total: u64 = a
        .iter()
        .map(|&j| prep.tasks[j as usize].gpu_milli_total())
        .sum();
    let target = (1.3 * prep.capacity_milli as f64) as u64;
    assert!(
        total <= target && total + 500 > target,
        "{total} vs {target}"
    );
}

#[test]
fn numa_blind_scheduler_hits_admission_failures() {
    // 8-GPU node split 2x4: a 5-GPU task passes a blind filter, then the kubelet refuses it.
    let nodes = vec![node("a", 64000, 8), node("b", 64000, 8)];
    let tasks = vec![task(1000, 5, 1000), task(1000, 4, 1000)];
    let shapes = [shape(1000, 1, 1000, 1.0)];
    let mut c = cfg(Policy::Fgd);
    c.numa = true;
    let r = run(&nodes, &tasks, &shapes, &c).unwrap();
    assert_eq!(r.failed_admission, 1);
    assert_eq!(r.placed, 1);
    c.policy = Policy::Pyctl;
    let r = run(&nodes, &tasks, &shapes, &c).unwrap();
    assert_eq!((r.failed, r.failed_admission), (1, 0));
    // The split strands the other zone for a 4-GPU shape only when it is partly used.
    let last = r.checkpoints.last().unwrap();
    assert!(last.numa_split_milli >= 0.0);
}

#[test]
fn compaction_moves_only_when_fragment_drops_and_respects_budget() {
    let nodes = vec![node("a", 64000, 2), node("b", 64000, 2)];
    let tasks = vec![task(1000, 1, 500), task(1000, 1, 500), task(1000, 1, 500)];
    let shapes = [shape(1000, 1, 1000, 1.0)];
    let mut c = cfg(Policy::Pyctl);
    c.compaction = Some(Compaction {
        every: 1,
        budget: 1.0,
        max_moves: 4,
        ..Default::default()
    });
    let r = run(&nodes, &tasks, &shapes, &c).unwrap();
    let last = r.checkpoints.last().unwrap();
    assert!(last.frag_milli <= 500.0 + 1e-9, "{}", last.frag_milli);
    c.compaction = Some(Compaction {
        every: 1,
        budget: 0.0,
        max_moves: 4,
        ..Default::default()
    });
    let r = run(&nodes, &tasks, &shapes, &c).unwrap();
    assert_eq!(r.evictions, 0);
}

/// a: 0.47 + 0.32 on its one GPU (0.21 left), b: 0.65 (0.35 left), c: empty.
fn repairable(shapes: &[ShapeSpec]) -> Prepared {
    let nodes = vec![
        node("a", 64000, 1),
        node("b", 64000, 1),
        node("c", 64000, 1),
    ];
    let tasks = vec![task(1000, 1, 470), task(1000, 1, 320), task(1000, 1, 650)];
    prepare(&nodes, &tasks, shapes, false).unwrap()
}

#[test]
fn compaction_takes_a_move_that_only_pays_off_across_two_nodes() {
    let shapes = [
        shape(1000, 1, 1000, 0.5),
        shape(1000, 1, 470, 0.25),
        shape(1000, 1, 320, 0.25),
    ];
    let prep = repairable(&shapes);
    let mut run = Run {
        k: Kernel {
            st: prep.state,
            shapes: &prep.shapes,
        },
        tasks: &prep.tasks,
        placed: Vec::new(),
        evictions: 0,
        rounds: 0,
        policy: Policy::Pyctl,
    };
    let mut rng = Rng::new(1);
    let one = |node| policy::Choice { node, gpus: 1 };
    for (task, node) in [(0, 0), (1, 0), (2, 1)] {
        run.place(task, one(node));
    }
    let total = |run: &Run| run.k.st.frag.iter().sum::<f64>();
    // F: a's 0.21 is fragment for every shape (210), b's 0.35 for the two larger (262.5).
    assert!((total(&run) - 472.5).abs() < 1e-6, "{}", total(&run));
    // Taking the 0.32 off a alone raises a's F_n(M) (0.53 left, fragment for whole GPUs).
    let reserve_all = Compaction {
        every: 1,
        budget: 1.0,
        max_moves: 4,
        min_gain: 1.0,
        reserve: 1.0,
        ..Default::default()
    };
    run.compact(&reserve_all, 3, true, &mut rng);
    assert_eq!(
        run.evictions, 0,
        "with a task pending, a full reserve stops periodic moves"
    );
    run.compact(&reserve_all, 3, false, &mut rng);
    assert_eq!(run.evictions, 1, "the reserve holds only while tasks fail");
    assert_eq!(run.placed[1].node, 1, "the 0.32 joins the 0.65 on b");
    // a: 0.53 for whole GPUs (265); b: 0.03 for every shape (30).
    assert!((total(&run) - 295.0).abs() < 1e-6, "{}", total(&run));
    // No further move lowers F(M).
    run.compact(&reserve_all, 3, false, &mut rng);
    assert_eq!(run.evictions, 1);
}

#[test]
fn shuffle_breaks_ties_in_a_seeded_node_order_and_reports_the_callers_index() {
    let nodes: Vec<NodeSpec> = (0..16).map(|i| node(&format!("n{i}"), 32000, 2)).collect();
    let tasks = vec![task(1000, 1, 1000)];
    let shapes = [shape(1000, 1, 1000, 1.0)];
    let mut c = cfg(Policy::BestFit);
    assert_eq!(run(&nodes, &tasks, &shapes, &c).unwrap().node_of, vec![0]);
    c.shuffle = true;
    let order = node_order(nodes.len(), &c);
    assert_ne!(
        order,
        (0..16).collect::<Vec<_>>(),
        "seed 42 permutes 16 nodes"
    );
    let r = run(&nodes, &tasks, &shapes, &c).unwrap();
    assert_eq!(
        r.node_of,
        vec![order[0] as i64],
        "all tie: the first of the seeded order"
    );
    c.seed = 43;
    assert_ne!(node_order(nodes.len(), &c), order);
    // Errors still name the caller's index.
    let mut bad = nodes.clone();
    bad[5].cpu_milli = -1;
    let e = run(&bad, &tasks, &shapes, &c).unwrap_err();
    assert!(e.field.starts_with("nodes[5] (n5)"), "{e}");
}

#[test]
fn bad_input_is_an_error_naming_the_field() {
    let nodes = vec![node("a", 64000, 2)];
    let e = run(&nodes, &[task(1000, 2, 500)], &[], &cfg(Policy::Fgd)).unwrap_err();
    assert!(e.field.contains("tasks[0].gpu_milli"), "{e}");
    let e = run(&[], &[], &[], &cfg(Policy::Fgd)).unwrap_err();
    assert_eq!(e.field, "nodes");
    let e = run(&[node("a", -1, 1)], &[], &[], &cfg(Policy::Fgd)).unwrap_err();
    assert!(e.field.contains("cpu_milli"));
    let mut c = cfg(Policy::Pyctl);
    for (bad, field) in [
        (
            Compaction {
                reserve: 1.5,
                ..Default::default()
            },
            "compaction.reserve",
        ),
        (
            Compaction {
                min_gain: f64::NAN,
                ..Default::default()
            },
            "compaction.min_gain",
        ),
        (
            Compaction {
                budget: -0.1,
                ..Default::default()
            },
            "compaction.budget",
        ),
    ] {
        c.compaction = Some(bad);
        let e = run(&[node("a", 1000, 1)], &[], &[], &c).unwrap_err();
        assert_eq!(e.field, field);
    }
}
