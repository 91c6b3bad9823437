//! Replica compaction planning: which pods to evict, and where each would land, so that the
//! cluster's fragment falls the most per eviction (FGD's gradient, as the simulator's
//! `fragMultiPod` descheduler does it), checking by simulated re-placement with NUMA alignment
//! that every evicted pod fits somewhere better (the descheduler's NodeFit, done for devices and
//! NUMA zones). Pending shapes can be added to the workload so that moves which make them
//! admissible (freeing whole GPUs, zones or nodes) count.
//!
//! Which pods may move at all (DaemonSets, PDBs, priorities, annotations) is decided by the caller.

use std::collections::HashMap;

use crate::error::{CoreError, CoreResult};
use crate::fragment::delta::{apply, place_delta, remove_delta, Assignment};
use crate::fragment::score::RecoverMemo;
use crate::fragment::{Cluster, Shape};

/// A pod that may be moved: where it is, and its shape.
#[derive(Clone, Debug)]
pub struct Movable {
    pub node: usize,
    pub assignment: Assignment,
    pub shape: Shape,
}

/// One planned eviction and re-placement.
#[derive(Clone, Debug, PartialEq)]
pub struct Move {
    /// Index into the movable list.
    pub pod: usize,
    pub from: usize,
    pub to: usize,
    pub to_assignment: Assignment,
    /// Fragment change on the source node by the removal (milli-GPU; negative is good).
    pub remove_delta: f64,
    /// Fragment change on the destination node by the placement.
    pub place_delta: f64,
}

impl Move {
    pub fn gain(&self) -> f64 {
        -(self.remove_delta + self.place_delta)
    }
}

#[derive(Clone, Debug)]
pub struct CompactionLimits {
    pub max_moves: usize,
    /// Smallest fragment reduction (milli-GPU) a move must bring.
    pub min_gain: f64,
    /// Optional: at most this many moves off one node.
    pub max_moves_per_node: usize,
}

impl Default for CompactionLimits {
    fn default() -> Self {
        Self {
            max_moves: 10,
            min_gain: 1.0,
            max_moves_per_node: usize::MAX,
        }
    }
}

type ShapeKey = (u64, u64, u32, u32, Option<String>, Vec<String>, String, u64);

fn shape_key(s: &Shape) -> ShapeKey {
    (
        s.cpu_milli,
        s.memory_mib,
        s.gpus,
        s.gpu_milli,
        s.mig_profile.clone(),
        s.gpu_models.clone(),
        s.gpu_pool.clone(),
        s.gpu_memory_mib,
    )
}

type PlaceCache = HashMap<(usize, ShapeKey), Option<(f64, Assignment)>>;

/// Plans up to `limits.max_moves` moves, greedily the best first, on a copy of `cluster`.
pub fn plan(
    cluster: &Cluster,
    movable: &[Movable],
    shapes: &[Shape],
    limits: &CompactionLimits,
) -> CoreResult<Vec<Move>> {
    let n = cluster.nodes.len();
    for (i, m) in movable.iter().enumerate() {
        if m.node >= n {
            return Err(CoreError::new(
                format!("movable[{i}].node"),
                format!("index {} out of range (0..{n})", m.node),
            ));
        }
    }
    let mut work = cluster.clone();
    let mut memo = RecoverMemo::new();
    let mut moved = vec![false; movable.len()];
    let mut per_node = vec![0usize; n];
    let mut place_cache: PlaceCache = HashMap::new();
    let mut remove_cache: HashMap<usize, f64> = HashMap::new();
    let mut out = Vec::new();
    while out.len() < limits.max_moves {
        let mut best: Option<Move> = None;
        for (i, m) in movable.iter().enumerate() {
            if moved[i] || per_node[m.node] >= limits.max_moves_per_node {
                continue;
            }
            let rd = match remove_cache.get(&i) {
                Some(&d) => d,
                None => {
                    let d = remove_delta(&work.nodes[m.node], &m.assignment, shapes, &mut memo)?
                        .fragment_gpu_milli;
                    remove_cache.insert(i, d);
                    d
                }
            };
            let key = shape_key(&m.shape);
            for to in 0..n {
                if to == m.node {
                    continue; // never back where it came from
                }
                let entry = place_cache.entry((to, key.clone())).or_insert_with(|| {
                    place_delta(&work.nodes[to], &m.shape, shapes, &mut memo)
                        .map(|d| (d.fragment_gpu_milli, d.assignment))
                });
                let Some((pd, ref assignment)) = *entry else {
                    continue;
                };
                let cand = Move {
                    pod: i,
                    from: m.node,
                    to,
                    to_assignment: assignment.clone(),
                    remove_delta: rd,
                    place_delta: pd,
                };
                let better = match &best {
                    None => true,
                    Some(b) => cand.gain() > b.gain() + 1e-9,
                };
                if better {
                    best = Some(cand);
                }
            }
        }
        let Some(mv) = best else { break };
        if mv.gain() < limits.min_gain {
            break;
        }
        apply(&mut work.nodes[mv.from], &movable[mv.pod].assignment, false)?;
        apply(&mut work.nodes[mv.to], &mv.to_assignment, true)?;
        moved[mv.pod] = true;
        per_node[mv.from] += 1;
        // both nodes changed: forget what was computed on them
        place_cache.retain(|(node, _), _| *node != mv.from && *node != mv.to);
        remove_cache.retain(|&i, _| movable[i].node != mv.from && movable[i].node != mv.to);
        out.push(mv);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fragment::model::{Cluster, ClusterColumns};

    /// Two 2-zone nodes of 4+4 GPUs under single-numa-node; `used[node][gpu]` in milli.
    fn cluster(used: [[i64; 8]; 2]) -> Cluster {
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
            for z in 0..2 {
                c.zone_numa.push(z);
                c.zone_cpu_milli.push(32000);
                c.zone_cpu_used.push(0);
                c.zone_memory_mib.push(0);
                c.zone_memory_used.push(0);
                for g in 0..4 {
                    c.gpu_ids.push(z * 4 + g);
                    c.gpu_used_milli.push(u[(z * 4 + g) as usize]);
                }
                c.gpu_offsets.push(c.gpu_ids.len());
                c.mig_offsets.push(0);
            }
            c.zone_offsets.push(c.zone_numa.len());
        }
        Cluster::from_columns(&c).unwrap()
    }

    fn one_gpu() -> Shape {
        Shape {
            cpu_milli: 1000,
            memory_mib: 0,
            gpus: 1,
            gpu_milli: 1000,
            mig_profile: None,
            gpu_models: vec![],
            weight: 1.0,
            gpu_pool: String::new(),
            gpu_memory_mib: 0,
        }
    }

    #[test]
    fn frees_an_aligned_zone_for_a_four_gpu_replica() {
        // n0: one 1-GPU pod in each zone; n1: zone 0 has 3 used GPUs. A 4-GPU replica fits nowhere.
        let c = cluster([
            [1000, 0, 0, 0, 1000, 0, 0, 0],
            [1000, 1000, 1000, 0, 0, 0, 0, 0],
        ]);
        let four = Shape {
            gpus: 4,
            ..one_gpu()
        };
        let movable = vec![
            Movable {
                node: 0,
                assignment: Assignment {
                    cpu: vec![],
                    memory: vec![],
                    gpus: vec![(0, 0, 1000)],
                    mig: None,
                },
                shape: one_gpu(),
            },
            Movable {
                node: 0,
                assignment: Assignment {
                    cpu: vec![],
                    memory: vec![],
                    gpus: vec![(1, 0, 1000)],
                    mig: None,
                },
                shape: one_gpu(),
            },
        ];
        let shapes = vec![
            Shape {
                weight: 0.5,
                gpu_pool: String::new(),
                gpu_memory_mib: 0,
                ..four.clone()
            },
            Shape {
                weight: 0.5,
                gpu_pool: String::new(),
                gpu_memory_mib: 0,
                ..one_gpu()
            },
        ];
        let moves = plan(&c, &movable, &shapes, &CompactionLimits::default()).unwrap();
        assert!(!moves.is_empty());
        // the first move takes a pod off n0 onto n1's fuller zone 0, not back onto n0
        assert_eq!((moves[0].from, moves[0].to), (0, 1));
        assert!(moves[0].gain() > 0.0);
        assert_eq!(moves[0].to_assignment.gpus, vec![(0, 3, 1000)]);
        // after the planned moves, the 4-GPU replica is admissible on n0 (a whole zone is free)
        let mut after = c.clone();
        let mut memo = RecoverMemo::new();
        assert!(place_delta(&after.nodes[0], &four, &shapes, &mut memo).is_none());
        for mv in &moves {
            apply(
                &mut after.nodes[mv.from],
                &movable[mv.pod].assignment,
                false,
            )
            .unwrap();
            apply(&mut after.nodes[mv.to], &mv.to_assignment, true).unwrap();
        }
        assert!(place_delta(&after.nodes[0], &four, &shapes, &mut memo).is_some());
    }

    #[test]
    fn nothing_to_gain_means_no_move() {
        let c = cluster([[1000, 1000, 1000, 1000, 0, 0, 0, 0], [0; 8]]);
        let movable = vec![Movable {
            node: 0,
            assignment: Assignment {
                cpu: vec![],
                memory: vec![],
                gpus: vec![(0, 0, 1000)],
                mig: None,
            },
            shape: one_gpu(),
        }];
        let shapes = vec![Shape {
            gpus: 4,
            ..one_gpu()
        }];
        assert!(plan(&c, &movable, &shapes, &CompactionLimits::default())
            .unwrap()
            .is_empty());
        let bad = vec![Movable {
            node: 9,
            ..movable[0].clone()
        }];
        assert!(plan(&c, &bad, &shapes, &CompactionLimits::default()).is_err());
    }
}
