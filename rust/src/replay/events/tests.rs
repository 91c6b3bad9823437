//! The inference replay on hand-made clusters: departures free capacity, waiting is counted,
//! anti-affinity and RDMA hold, the figures are time-weighted.

use super::*;

fn node(name: &str, cpu: i64, gpus: i64, rdma: i64) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        cpu_milli: cpu,
        memory_mib: 1 << 20,
        gpus,
        model: "G".into(),
        rdma,
    }
}

fn inst(cpu: i64, rdma: i64, app: u32, cap: u32, arrive: f64, depart: Option<f64>) -> InstanceSpec {
    InstanceSpec {
        task: TaskSpec {
            cpu_milli: cpu,
            memory_mib: 0,
            num_gpu: 1,
            gpu_milli: 1000,
            models: vec![],
            rdma,
        },
        app,
        max_per_node: cap,
        arrive,
        depart,
    }
}

fn shape(cpu: i64, rdma: i64) -> ShapeSpec {
    ShapeSpec {
        cpu_milli: cpu,
        num_gpu: 1,
        gpu_milli: 1000,
        models: vec![],
        weight: 1.0,
        rdma,
    }
}

fn cfg(policy: Policy, end: f64) -> EventConfig {
    EventConfig {
        policy,
        seed: 1,
        shuffle: false,
        end,
        compaction: None,
        sample_every: 0.0,
        log: true,
    }
}

const POLICIES: [Policy; 3] = [Policy::Fgd, Policy::BestFit, Policy::Pyctl];

#[test]
fn a_departure_frees_capacity_for_the_waiting() {
    // one node, two GPUs; the third instance waits from 10 s until the first leaves at 100 s
    let nodes = [node("a", 32000, 2, 0)];
    let i = [
        inst(1000, 0, 0, 0, 0.0, Some(100.0)),
        inst(1000, 0, 1, 0, 0.0, None),
        inst(1000, 0, 2, 0, 10.0, Some(150.0)),
    ];
    for p in POLICIES {
        let r = run_events(&nodes, &i, &[shape(1000, 0)], &cfg(p, 200.0)).unwrap();
        assert_eq!(
            (r.arrived, r.placed_on_arrival, r.placed_after_wait),
            (3, 2, 1)
        );
        assert_eq!(r.never_placed, 0);
        assert!((r.pending_s - 90.0).abs() < 1e-9, "{}", r.pending_s);
        // running: 2 over 0..150, 1 over 150..200
        assert!((r.running_s - (2.0 * 150.0 + 50.0)).abs() < 1e-9);
        let placed: Vec<_> = r
            .log
            .iter()
            .filter(|e| e.instance == 2 && e.kind == Kind::Place)
            .map(|e| e.t)
            .collect();
        assert_eq!(placed, vec![100.0]);
    }
}

#[test]
fn an_instance_that_leaves_while_waiting_is_never_placed() {
    let nodes = [node("a", 32000, 1, 0)];
    let i = [
        inst(1000, 0, 0, 0, 0.0, None),
        inst(1000, 0, 1, 0, 5.0, Some(25.0)),
        inst(1000, 0, 2, 0, 50.0, None),
    ];
    let r = run_events(&nodes, &i, &[shape(1000, 0)], &cfg(Policy::Fgd, 100.0)).unwrap();
    assert_eq!(r.never_placed, 2); // one left waiting, one still waits at the end
    assert!((r.pending_s - (20.0 + 50.0)).abs() < 1e-9);
}

#[test]
fn an_instance_deleted_as_it_is_created_never_runs() {
    // created and deleted at 10 s (and one before the start): at one instant departures come
    // first, so a placement then would never be undone; it is not replayed at all
    let nodes = [node("a", 32000, 2, 0)];
    let i = [
        inst(1000, 0, 0, 0, 10.0, Some(10.0)),
        inst(1000, 0, 1, 0, -5.0, Some(0.0)),
        inst(1000, 0, 2, 0, 20.0, None),
    ];
    for p in POLICIES {
        let r = run_events(&nodes, &i, &[shape(1000, 0)], &cfg(p, 100.0)).unwrap();
        assert_eq!((r.arrived, r.placed_on_arrival, r.never_placed), (1, 1, 0));
        assert!((r.running_s - 80.0).abs() < 1e-9, "{}", r.running_s);
        assert!(r.log.iter().all(|e| e.instance == 2));
    }
}

#[test]
fn a_waiting_instance_is_not_placed_at_the_instant_it_leaves() {
    // one GPU; the second and third wait; at 50 s the first leaves and so does the second
    // (after it, in input order): the GPU goes to the third, the second leaves unplaced
    let nodes = [node("a", 32000, 1, 0)];
    let i = [
        inst(1000, 0, 0, 0, 0.0, Some(50.0)),
        inst(1000, 0, 1, 0, 5.0, Some(50.0)),
        inst(1000, 0, 2, 0, 6.0, None),
    ];
    for p in POLICIES {
        let r = run_events(&nodes, &i, &[shape(1000, 0)], &cfg(p, 100.0)).unwrap();
        assert_eq!((r.placed_after_wait, r.never_placed), (1, 1), "{p:?}");
        let placed: Vec<_> = r
            .log
            .iter()
            .filter(|e| e.kind == Kind::Place)
            .map(|e| (e.instance, e.t))
            .collect();
        assert_eq!(placed, vec![(0, 0.0), (2, 50.0)]);
    }
}

#[test]
fn the_anti_affinity_cap_holds() {
    // two nodes of four GPUs; app 0 at most 2 per node: the fifth instance of app 0 waits
    // although three GPUs are free
    let nodes = [node("a", 64000, 4, 0), node("b", 64000, 4, 0)];
    let mut i: Vec<_> = (0..5)
        .map(|k| inst(1000, 0, 0, 2, k as f64, None))
        .collect();
    i.push(inst(1000, 0, 1, 0, 10.0, None));
    for p in POLICIES {
        let r = run_events(&nodes, &i, &[shape(1000, 0)], &cfg(p, 20.0)).unwrap();
        assert_eq!(r.placed_on_arrival, 5, "{p:?}");
        assert_eq!(r.never_placed, 1, "{p:?}");
        let wait: Vec<_> = r.log.iter().filter(|e| e.kind == Kind::Wait).collect();
        assert_eq!(wait.len(), 1);
        assert_eq!(wait[0].instance, 4);
        let mut per = [0; 2];
        for e in r
            .log
            .iter()
            .filter(|e| e.kind == Kind::Place && e.instance < 5)
        {
            per[e.node as usize] += 1;
        }
        assert_eq!(per, [2, 2], "{p:?}");
    }
}

#[test]
fn rdma_is_a_node_resource() {
    // 100% of one RNIC: two 50% instances fill it, the third waits with six GPUs free, and
    // those GPUs are fragment for a shape that needs RDMA
    let nodes = [node("a", 64000, 8, 100)];
    let i = [
        inst(1000, 50, 0, 0, 0.0, None),
        inst(1000, 50, 1, 0, 0.0, None),
        inst(1000, 50, 2, 0, 0.0, None),
        inst(1000, 0, 3, 0, 0.0, None),
    ];
    for p in POLICIES {
        let r = run_events(&nodes, &i, &[shape(1000, 25)], &cfg(p, 10.0)).unwrap();
        assert_eq!((r.placed_on_arrival, r.never_placed), (3, 1), "{p:?}");
        // after the arrivals at 0: 5 GPUs idle, all fragment (no RDMA left for the shape)
        assert!(
            (r.frag_milli_s - 5000.0 * 10.0).abs() < 1e-6,
            "{}",
            r.frag_milli_s
        );
        assert!((r.idle_milli_s - 5000.0 * 10.0).abs() < 1e-6);
    }
}

#[test]
fn figures_are_time_weighted() {
    // node: 2 GPUs, 4 cores; M: one GPU and 2 cores. Instance 0 takes all 4 cores and a GPU
    // over 0..50: the other GPU is fragment then (1000 milli x 50 s); after 50 both GPUs idle and
    // usable (fragment 0). Idle: 1000 x 50 + 2000 x 50; allocated: 1000 x 50.
    let nodes = [node("a", 4000, 2, 0)];
    let i = [inst(4000, 0, 0, 0, 0.0, Some(50.0))];
    let mut c = cfg(Policy::Fgd, 100.0);
    c.sample_every = 25.0;
    let r = run_events(&nodes, &i, &[shape(2000, 0)], &c).unwrap();
    assert!(
        (r.frag_milli_s - 50_000.0).abs() < 1e-6,
        "{}",
        r.frag_milli_s
    );
    assert!((r.idle_milli_s - 150_000.0).abs() < 1e-6);
    assert!((r.allocated_milli_s - 50_000.0).abs() < 1e-6);
    let ts: Vec<_> = r.samples.iter().map(|s| (s.t, s.frag_milli)).collect();
    // a sample at an event's instant sees the state before the event
    assert_eq!(
        ts,
        vec![(25.0, 1000.0), (50.0, 1000.0), (75.0, 0.0), (100.0, 0.0)]
    );
}

/// 12 nodes of 8 GPUs and 400 instances of 8 apps (caps 0, 2, 3, 4) arriving and leaving
/// over 200,000 s, each asking for CPU and RDMA.
fn churn() -> (Vec<NodeSpec>, Vec<InstanceSpec>) {
    let mut rng = Rng::new(5);
    let nodes: Vec<_> = (0..12)
        .map(|k| node(&format!("n{k}"), 48000, 8, 200))
        .collect();
    let mut i = Vec::new();
    for k in 0..400 {
        let arrive = if k < 60 {
            0.0
        } else {
            rng.below(200_000) as f64
        };
        let life = 3600.0 * (1 + rng.below(40)) as f64;
        let cpu = [4000, 8000, 8000, 12000][rng.below(4) as usize];
        let rdma = [25, 25, 50, 75][rng.below(4) as usize];
        let app = rng.below(8) as u32;
        let cap = [0, 2, 3, 4][app as usize % 4];
        i.push(inst(cpu, rdma, app, cap, arrive, Some(arrive + life)));
    }
    (nodes, i)
}

/// Every placement and move keeps each node within its GPUs, CPU, RDMA and each app's cap,
/// checked by replaying the log on its own books; compaction moves within the budget.
#[test]
fn compaction_keeps_every_constraint() {
    let (nodes, i) = churn();
    let shapes = [shape(8000, 25), shape(12000, 50)];
    let mut c = cfg(Policy::Pyctl, 250_000.0);
    c.shuffle = true;
    c.compaction = Some(EventCompaction {
        budget_per_day: 0.05,
        ..Default::default()
    });
    let r = run_events(&nodes, &i, &shapes, &c).unwrap();
    assert!(r.evictions > 0 && r.placed_after_wait > 0, "{r:?}");
    assert!(r.evictions as f64 <= 0.05 * r.running_s / DAY + 1e-9);
    let mut at: Vec<Option<usize>> = vec![None; i.len()];
    let (mut gpu, mut cpu, mut rdma) = (vec![0i64; 12], vec![0i64; 12], vec![0i64; 12]);
    let mut app = vec![[0u32; 8]; 12];
    let mut moves = 0;
    for e in &r.log {
        let s = &i[e.instance as usize];
        let mut add = |n: usize, sign: i64| {
            gpu[n] += sign;
            cpu[n] += sign * s.task.cpu_milli;
            rdma[n] += sign * s.task.rdma;
            app[n][s.app as usize] = (app[n][s.app as usize] as i64 + sign) as u32;
        };
        match e.kind {
            Kind::Place => {
                add(e.node as usize, 1);
                at[e.instance as usize] = Some(e.node as usize);
            }
            Kind::Depart => {
                if let Some(n) = at[e.instance as usize].take() {
                    add(n, -1);
                }
            }
            Kind::Move => {
                moves += 1;
                assert_eq!(at[e.instance as usize], Some(e.node as usize));
                add(e.node as usize, -1);
                add(e.to as usize, 1);
                at[e.instance as usize] = Some(e.to as usize);
            }
            Kind::Wait => {}
        }
        for n in 0..12 {
            assert!(
                gpu[n] <= 8 && cpu[n] <= 48000 && rdma[n] <= 200,
                "node {n} at {}",
                e.t
            );
            for a in 0..8 {
                let cap = [0, 2, 3, 4][a % 4];
                assert!(
                    cap == 0 || app[n][a] <= cap,
                    "app {a} on node {n} at {}",
                    e.t
                );
            }
        }
    }
    assert_eq!(moves, r.evictions);
}

#[test]
fn bad_times_are_refused_by_name() {
    let nodes = [node("a", 4000, 2, 0)];
    let i = [inst(1000, 0, 0, 0, 10.0, Some(5.0))];
    let e = run_events(&nodes, &i, &[], &cfg(Policy::Fgd, 100.0)).unwrap_err();
    assert!(e.to_string().contains("instances[0].depart"), "{e}");
    let e = run_events(&nodes, &[], &[], &cfg(Policy::Fgd, 0.0)).unwrap_err();
    assert!(e.to_string().contains("end"), "{e}");
    let mut c = cfg(Policy::Fgd, 1e300);
    c.sample_every = 21600.0;
    let e = run_events(&nodes, &[], &[], &c).unwrap_err();
    assert!(e.to_string().contains("sample_every"), "{e}");
    let mut c = cfg(Policy::Pyctl, 1e300);
    c.compaction = Some(EventCompaction::default());
    let e = run_events(&nodes, &[], &[], &c).unwrap_err();
    assert!(e.to_string().contains("compaction.interval"), "{e}");
}

/// With a minimum pod age, no instance is moved sooner than that after it was placed or last
/// moved (the log's times), and the planner still moves the older ones.
#[test]
fn a_pod_younger_than_the_minimum_age_is_not_moved() {
    let (nodes, i) = churn();
    let shapes = [shape(8000, 25), shape(12000, 50)];
    let mut c = cfg(Policy::Pyctl, 250_000.0);
    c.shuffle = true;
    let mut moved_young = 0;
    for age in [0.0, 20_000.0] {
        c.compaction = Some(EventCompaction {
            budget_per_day: 0.05,
            min_pod_age: age,
            ..Default::default()
        });
        let r = run_events(&nodes, &i, &shapes, &c).unwrap();
        assert!(r.evictions > 0, "{age}");
        let mut since = vec![f64::NAN; i.len()];
        for e in &r.log {
            match e.kind {
                Kind::Place => since[e.instance as usize] = e.t,
                Kind::Move => {
                    let young = e.t - since[e.instance as usize] < 20_000.0;
                    assert!(
                        age == 0.0 || !young,
                        "moved at {} after {}",
                        e.t,
                        since[e.instance as usize]
                    );
                    moved_young += young as u32;
                    since[e.instance as usize] = e.t;
                }
                _ => {}
            }
        }
    }
    assert!(moved_young > 0); // without the minimum, young pods are moved: the check can fail
    let bad = EventCompaction {
        min_pod_age: -1.0,
        ..Default::default()
    };
    c.compaction = Some(bad);
    assert!(run_events(&nodes, &i, &shapes, &c).is_err());
}
