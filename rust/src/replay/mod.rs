//! Trace replay (issue 8): the FGD artifact's arrival-only protocol on a columnar cluster, every
//! policy's node and GPU choice, and pyctl's compaction. Pure and deterministic: the same input
//! and seed give the same result; errors are `CoreError`s naming the field.
//!
//! Protocol (the caller may pass tasks already ordered and resampled, with `shuffle = false` and
//! `tune = 0`): resample the tasks to `tune` x the cluster's GPU capacity (random clones or
//! random removals), shuffle them and the nodes' tie order with the seed (`node_order`), then
//! schedule them one by one; a task that fits nowhere fails and is not retried. After each
//! arrival the state is sampled at every whole percent of capacity that the arrived GPU request
//! has reached.

pub mod events;
pub mod kernel;
pub mod policy;
pub mod rng;
pub mod state;

use crate::compaction::{Input, Limits, Movable, NodeSet, Pending, Plan};
use crate::error::{CoreError, CoreResult};
use crate::placement::View;
use kernel::Kernel;
pub use policy::{Policy, POLICY_NAMES};
use rng::Rng;
use state::{numa_split, KShape, KTask, Placed, State, MAX_GPUS, TAGS};

#[derive(Clone, Debug, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub gpus: i64,
    pub model: String,
    /// RDMA bandwidth, percent of one RNIC (100 per RNIC; 0: none).
    pub rdma: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpec {
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub num_gpu: i64,
    pub gpu_milli: i64,
    /// Allowed GPU models (empty = any).
    pub models: Vec<String>,
    /// RDMA bandwidth, percent of one RNIC (0: none).
    pub rdma: i64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ShapeSpec {
    pub cpu_milli: i64,
    pub num_gpu: i64,
    pub gpu_milli: i64,
    pub models: Vec<String>,
    pub weight: f64,
    /// RDMA bandwidth, percent of one RNIC (0: none).
    pub rdma: i64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Compaction {
    /// Run a compaction round every this many arrivals.
    pub every: u32,
    /// Eviction budget: evictions never exceed this fraction of the arrived pods.
    pub budget: f64,
    /// Most moves per round.
    pub max_moves: u32,
    /// Smallest fall of F(M), milli-GPU, a periodic move must bring (the replay spends a fixed
    /// eviction budget; the controller's configured default is 1000, one GPU, per restart).
    pub min_gain: f64,
    /// Fraction of the budget periodic compaction leaves to pending-driven moves once a task
    /// has failed.
    pub reserve: f64,
    /// Most evictions one rescue of a failing task may take (0: no rescues).
    pub rescue_depth: u32,
    /// Most candidate sets of pods one rescue evaluates.
    pub rescue_budget: u32,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            every: 20,
            budget: 0.02,
            max_moves: 20,
            min_gain: 1.0,
            reserve: 0.25,
            rescue_depth: 2,
            rescue_budget: 64,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub policy: Policy,
    pub seed: u64,
    /// Resample to this multiple of GPU capacity (0 = keep the tasks as given).
    pub tune: f64,
    /// Shuffle the task order and the nodes' tie order (`node_order`) with the seed.
    pub shuffle: bool,
    /// Split each node's GPUs over two NUMA zones under `single-numa-node`.
    pub numa: bool,
    pub compaction: Option<Compaction>,
    /// Highest arrived percentage to sample.
    pub max_pct: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::Fgd,
            seed: 42,
            tune: 1.3,
            shuffle: true,
            numa: false,
            compaction: None,
            max_pct: 130,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub arrived_pct: u32,
    pub arrived_milli: u64,
    pub allocated_milli: u64,
    /// F(M), milli-GPU.
    pub frag_milli: f64,
    pub idle_milli: u64,
    /// Of `frag_milli`, the part that is fragment only because of NUMA split.
    pub numa_split_milli: f64,
    pub arrived_tasks: u64,
    pub failed_tasks: u64,
    pub evictions: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayResult {
    pub gpu_capacity_milli: u64,
    pub tasks: u64,
    pub placed: u64,
    pub failed: u64,
    /// Failed because the kubelet's topology admission refused the scheduler's node.
    pub failed_admission: u64,
    pub evictions: u64,
    pub compaction_rounds: u64,
    pub checkpoints: Vec<Checkpoint>,
    /// The caller's node index per replayed task (-1 = failed), in replay order; the task index
    /// per slot.
    pub node_of: Vec<i64>,
    pub task_of: Vec<u32>,
}

fn resolve_models(models: &[String], index: &[String]) -> u64 {
    if models.is_empty() {
        return u64::MAX;
    }
    let mut mask = 0u64;
    for (j, m) in index.iter().enumerate() {
        let ml = m.to_ascii_lowercase();
        if models.iter().any(|x| x.to_ascii_lowercase() == ml) {
            mask |= 1 << j;
        }
    }
    mask
}

fn nonneg(v: i64, field: impl FnOnce() -> String) -> CoreResult<i64> {
    if v < 0 {
        Err(CoreError::new(
            field(),
            format!("must not be negative, got {v}"),
        ))
    } else {
        Ok(v)
    }
}

fn gpu_request(num: i64, milli: i64, field: &str) -> CoreResult<(u8, u16)> {
    if !(0..=MAX_GPUS as i64).contains(&num) {
        return Err(CoreError::new(
            format!("{field}.num_gpu"),
            format!("{num} is outside 0..={MAX_GPUS}"),
        ));
    }
    if num == 0 {
        return Ok((0, 0));
    }
    if !(1..=1000).contains(&milli) {
        return Err(CoreError::new(
            format!("{field}.gpu_milli"),
            format!("{milli} is outside 1..=1000 for a GPU task"),
        ));
    }
    if num > 1 && milli != 1000 {
        return Err(CoreError::new(
            format!("{field}.gpu_milli"),
            format!("a task with {num} GPUs must take whole GPUs (1000), got {milli}"),
        ));
    }
    Ok((num as u8, milli as u16))
}

/// The resolved replay input.
pub struct Prepared {
    pub state: State,
    pub shapes: Vec<KShape>,
    pub tasks: Vec<KTask>,
    pub capacity_milli: u64,
}

pub fn prepare(
    nodes: &[NodeSpec],
    tasks: &[TaskSpec],
    shapes: &[ShapeSpec],
    numa: bool,
) -> CoreResult<Prepared> {
    let order: Vec<usize> = (0..nodes.len()).collect();
    prepare_in_order(nodes, &order, tasks, shapes, numa)
}

/// `prepare` with the cluster's node k being `nodes[order[k]]` (errors name the caller's index).
fn prepare_in_order(
    nodes: &[NodeSpec],
    order: &[usize],
    tasks: &[TaskSpec],
    shapes: &[ShapeSpec],
    numa: bool,
) -> CoreResult<Prepared> {
    debug_assert_eq!(order.len(), nodes.len());
    if nodes.is_empty() {
        return Err(CoreError::new("nodes", "the cluster has no nodes"));
    }
    let models = gpu_models(nodes)?;
    let (mut st, capacity) = node_state(nodes, order, &models, numa)?;
    let ks = kernel_shapes(shapes, &models)?;
    let kt = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let f = format!("tasks[{i}]");
            let cpu = nonneg(t.cpu_milli, || format!("{f}.cpu_milli"))?;
            let mem = nonneg(t.memory_mib, || format!("{f}.memory_mib"))?;
            let (num, milli) = gpu_request(t.num_gpu, t.gpu_milli, &f)?;
            Ok(KTask {
                cpu,
                mem,
                rdma: nonneg(t.rdma, || format!("{f}.rdma"))?,
                num,
                milli,
                mask: resolve_models(&t.models, &models),
            })
        })
        .collect::<CoreResult<Vec<_>>>()?;
    for i in 0..nodes.len() {
        st.refresh(i, &ks);
    }
    Ok(Prepared {
        state: st,
        shapes: ks,
        tasks: kt,
        capacity_milli: capacity,
    })
}

/// The distinct GPU models of the nodes (case-insensitive), in order of appearance: a model's
/// position is its bit in model masks (at most 64).
fn gpu_models(nodes: &[NodeSpec]) -> CoreResult<Vec<String>> {
    let mut models: Vec<String> = Vec::new();
    for n in nodes {
        if !models.iter().any(|m| m.eq_ignore_ascii_case(&n.model)) {
            models.push(n.model.clone());
        }
    }
    if models.len() > 64 {
        return Err(CoreError::new(
            "nodes.model",
            "more than 64 distinct GPU models",
        ));
    }
    Ok(models)
}

/// The replay state of the nodes in `order` (all idle; each node's GPUs split over two zones
/// with `numa`), and the cluster's GPU capacity in milli-GPU.
fn node_state(
    nodes: &[NodeSpec],
    order: &[usize],
    models: &[String],
    numa: bool,
) -> CoreResult<(State, u64)> {
    let k = nodes.len();
    let mut st = State {
        cpu_cap: Vec::with_capacity(k),
        cpu_left: Vec::with_capacity(k),
        mem_cap: Vec::with_capacity(k),
        mem_left: Vec::with_capacity(k),
        rdma_cap: Vec::with_capacity(k),
        rdma_left: Vec::with_capacity(k),
        ngpu: Vec::with_capacity(k),
        split: Vec::with_capacity(k),
        model_bit: Vec::with_capacity(k),
        free: Vec::with_capacity(k),
        frag: vec![0.0; k],
        frag_blind: vec![0.0; k],
        idle: vec![0; k],
        affinity: vec![[0u16; TAGS]; k],
        pods_on: vec![Vec::new(); k],
    };
    let mut capacity = 0u64;
    for &i in order {
        let n = nodes
            .get(i)
            .ok_or_else(|| CoreError::new("nodes", "internal: node order"))?;
        let f = |x: &str| format!("nodes[{i}] ({}).{x}", n.name);
        let cpu = nonneg(n.cpu_milli, || f("cpu_milli"))?;
        let mem = nonneg(n.memory_mib, || f("memory_mib"))?;
        if !(0..=MAX_GPUS as i64).contains(&n.gpus) {
            return Err(CoreError::new(
                f("gpu"),
                format!("{} GPUs; the replay supports 0..={MAX_GPUS}", n.gpus),
            ));
        }
        let g = n.gpus as u8;
        capacity += g as u64 * 1000;
        st.cpu_cap.push(cpu);
        st.cpu_left.push(cpu);
        st.mem_cap.push(mem);
        st.mem_left.push(mem);
        let rdma = nonneg(n.rdma, || f("rdma"))?;
        st.rdma_cap.push(rdma);
        st.rdma_left.push(rdma);
        st.ngpu.push(g);
        st.split.push(if numa && g >= 2 { g / 2 } else { 0 });
        let j = models
            .iter()
            .position(|m| m.eq_ignore_ascii_case(&n.model))
            .unwrap_or(0);
        st.model_bit.push(1u64 << j);
        let mut free = [0u16; MAX_GPUS];
        for x in free.iter_mut().take(g as usize) {
            *x = 1000;
        }
        st.free.push(free);
    }
    Ok((st, capacity))
}

/// The workload's shapes for the kernel, weights normalised to 1 (errors name the shape).
fn kernel_shapes(shapes: &[ShapeSpec], models: &[String]) -> CoreResult<Vec<KShape>> {
    let mut ks = Vec::with_capacity(shapes.len());
    for (i, s) in shapes.iter().enumerate() {
        let f = format!("shapes[{i}]");
        let cpu = nonneg(s.cpu_milli, || format!("{f}.cpu_milli"))?;
        let (num, milli) = gpu_request(s.num_gpu, s.gpu_milli, &f)?;
        if !(s.weight.is_finite() && s.weight >= 0.0) {
            return Err(CoreError::new(
                format!("{f}.weight"),
                format!("must be a finite non-negative number, got {}", s.weight),
            ));
        }
        ks.push(KShape {
            cpu,
            rdma: nonneg(s.rdma, || format!("{f}.rdma"))?,
            milli,
            num,
            mask: resolve_models(&s.models, models),
            w: s.weight,
        });
    }
    let total_w: f64 = ks.iter().map(|s| s.w).sum();
    if !ks.is_empty() && total_w <= 0.0 {
        return Err(CoreError::new("shapes", "weights sum to zero"));
    }
    for s in &mut ks {
        s.w /= total_w;
    }
    Ok(ks)
}

/// The order in which ties between nodes are broken: the caller's, or with `shuffle` a seeded
/// permutation. The artifact renames every node `<perm[i]:04>-<name>` with a seeded permutation
/// before creating it (`syncClusterResourceList` in its `pkg/simulator/simulator.go`), and its
/// kube-scheduler fork (`github.com/mental2008/kubernetes v1.20.5-minor`, `selectHost`) gives a
/// tie to the smallest node name: ties go to the first node of a random order fixed per seed.
pub fn node_order(n: usize, cfg: &Config) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if cfg.shuffle {
        // Its own stream, so the task order does not depend on the cluster's size.
        Rng::new(cfg.seed ^ 0x4E4F_4445_5F4F_5244).shuffle(&mut order);
    }
    order
}

/// The replay order: task indices, resampled to `tune` x capacity and shuffled.
pub fn replay_order(tasks: &[KTask], capacity: u64, cfg: &Config, rng: &mut Rng) -> Vec<u32> {
    let mut order: Vec<u32> = (0..tasks.len() as u32).collect();
    if cfg.tune > 0.0 && !tasks.is_empty() {
        let target = (cfg.tune * capacity as f64) as u64;
        let mut total: u64 = tasks.iter().map(|t| t.gpu_milli_total()).sum();
        let has_gpu = tasks.iter().any(|t| t.num > 0);
        if has_gpu {
            while total < target {
                let j = rng.below(tasks.len() as u64) as u32;
                order.push(j);
                total += tasks[j as usize].gpu_milli_total();
            }
            while total > target && !order.is_empty() {
                let p = rng.below(order.len() as u64) as usize;
                let j = order.swap_remove(p);
                total -= tasks[j as usize].gpu_milli_total();
            }
            order.sort_unstable();
        }
    }
    if cfg.shuffle {
        rng.shuffle(&mut order);
    }
    order
}

struct Run<'a> {
    k: Kernel<'a>,
    tasks: &'a [KTask],
    placed: Vec<Placed>,
    evictions: u64,
    rounds: u64,
    policy: Policy,
}

impl Run<'_> {
    fn place(&mut self, task: u32, c: policy::Choice) -> u32 {
        let t = &self.tasks[task as usize];
        self.k.take(c.node, t, &c.gpus);
        let id = self.placed.len() as u32;
        self.placed.push(Placed {
            task,
            node: c.node as u32,
            gpus: c.gpus,
        });
        self.k.st.pods_on[c.node].push(id);
        id
    }

    /// The pods compaction may move (the simulator's evictor filter): pods on one GPU or a
    /// share of one; multi-GPU replicas and CPU-only pods stay. With their placed ids.
    fn movable(&self) -> (Vec<Movable<KTask, u16>>, Vec<u32>) {
        let mut items = Vec::new();
        let mut ids = Vec::new();
        for (node, pods) in self.k.st.pods_on.iter().enumerate() {
            for &pid in pods {
                let p = self.placed[pid as usize];
                let t = self.tasks[p.task as usize];
                if t.num != 1 {
                    continue;
                }
                items.push(Movable {
                    node,
                    task: t,
                    place: p.gpus,
                    allowed: None,
                    pdb: None,
                    group: None,
                });
                ids.push(pid);
            }
        }
        (items, ids)
    }

    /// Carries out a plan's moves: the evicted pod leaves its node and its replacement is placed
    /// where the planner said (pyctl: the policy's choice, which the plan already made on the
    /// state) or where the deployed scheduler puts it (`choose_deployed`, with the extender
    /// keeping it off the node it left).
    fn carry_out(&mut self, plan: &Plan<u16>, ids: &[u32], applied: bool, rng: &mut Rng) {
        for mv in &plan.moves {
            let pid = ids[mv.pod];
            let from = mv.from;
            let p = self.placed[pid as usize];
            let t = self.tasks[p.task as usize];
            let to = if applied {
                policy::Choice {
                    node: mv.to,
                    gpus: mv.to_place,
                }
            } else {
                self.k.give(from, &t, &p.gpus);
                // the extender keeps a moved pod's replacement off the node it left (and off a
                // rescue's node, which pyctl also taints)
                let got = policy::choose_deployed(&self.k, &t, rng, |i| i != from).unwrap_or(
                    policy::Choice {
                        node: from,
                        gpus: p.gpus,
                    },
                );
                self.k.take(got.node, &t, &got.gpus);
                got
            };
            self.k.st.pods_on[from].retain(|&x| x != pid);
            self.placed[pid as usize].node = to.node as u32;
            self.placed[pid as usize].gpus = to.gpus;
            self.k.st.pods_on[to.node].push(pid);
            self.evictions += 1;
        }
    }

    /// Plans with the compaction planner (`crate::compaction::plan`): pyctl plans on the state
    /// itself (the moves it plans are the moves made); as deployed, on a copy, and the moves
    /// are then carried out with the deployed scheduler's placements.
    fn plan(&mut self, pending: &[Pending<KTask>], limits: &Limits, rng: &mut Rng) -> Plan<u16> {
        let (items, ids) = self.movable();
        self.plan_over(&items, &ids, pending, &[], limits, rng)
    }

    /// `plan` over the given movable pods (with their placed ids) and node sets.
    fn plan_over(
        &mut self,
        items: &[Movable<KTask, u16>],
        ids: &[u32],
        pending: &[Pending<KTask>],
        node_sets: &[NodeSet],
        limits: &Limits,
        rng: &mut Rng,
    ) -> Plan<u16> {
        let input = Input {
            movable: items,
            pending,
            node_sets,
            pdb_headroom: &[],
        };
        if self.policy == Policy::PyctlDeployed {
            let mut scratch = self.k.clone();
            let plan = crate::compaction::plan(&mut scratch, &input, limits);
            self.carry_out(&plan, ids, false, rng);
            plan
        } else {
            let plan = crate::compaction::plan(&mut self.k, &input, limits);
            self.carry_out(&plan, ids, true, rng);
            plan
        }
    }

    /// Periodic compaction: the planner's defragmentation, up to `max_moves` a round and within
    /// the eviction budget. Once a task has failed (`pending`: pods wait for capacity), periodic
    /// moves stop at `1 - reserve` of the budget; the rest is kept for rescues.
    fn compact(&mut self, c: &Compaction, arrived: u64, pending: bool, rng: &mut Rng) {
        self.rounds += 1;
        let share = if pending { 1.0 - c.reserve } else { 1.0 };
        let budget = (c.budget * share * arrived as f64).floor() as u64;
        let room = budget
            .saturating_sub(self.evictions)
            .min(c.max_moves as u64) as usize;
        if room == 0 {
            return;
        }
        let limits = Limits {
            max_moves: room,
            min_gain: c.min_gain,
            rescue_depth: 0,
            ..Limits::default()
        };
        self.plan(&[], &limits, rng);
    }

    /// A task that fits nowhere: the planner's rescue (move up to `rescue_depth` pods off one
    /// node so that it fits there), within the eviction budget. Returns where it then goes.
    fn rescue(
        &mut self,
        t: &KTask,
        c: &Compaction,
        arrived: u64,
        rng: &mut Rng,
    ) -> Option<policy::Choice> {
        let budget = (c.budget * arrived as f64).floor() as u64;
        if self.evictions >= budget || t.num == 0 || c.rescue_depth == 0 {
            return None;
        }
        let limits = Limits {
            max_moves: (budget - self.evictions) as usize,
            rescue_depth: c.rescue_depth as usize,
            rescue_budget: c.rescue_budget as usize,
            max_rescues: 1,
            defragment: false,
            ..Limits::default()
        };
        let pending = [Pending {
            task: *t,
            allowed: None,
        }];
        let plan = self.plan(&pending, &limits, rng);
        let r = plan.rescues.first()?;
        if self.policy == Policy::Pyctl {
            // the plan placed the task on the state: the caller places it (and counts it)
            self.k.give(r.node, t, &r.place);
        }
        let fits = self.k.st.fits(r.node, t, true);
        fits.then_some(policy::Choice {
            node: r.node,
            gpus: if self.policy == Policy::Pyctl {
                r.place
            } else {
                crate::placement::best_on(&self.k, r.node, t).map_or(r.place, |b| b.place)
            },
        })
    }

    fn checkpoint(&self, pct: u32, arrived_milli: u64, arrived: u64, failed: u64) -> Checkpoint {
        let st = &self.k.st;
        let shapes = self.k.shapes;
        let n = st.node_count();
        let idle: u64 = st.idle.iter().map(|&x| x as u64).sum();
        let cap: u64 = st.ngpu.iter().map(|&g| g as u64 * 1000).sum();
        let frag: f64 = st.frag.iter().sum();
        let mut split = 0.0;
        for i in 0..n {
            if st.split[i] != 0 {
                split += numa_split(
                    shapes,
                    st.model_bit[i],
                    st.cpu_left[i],
                    st.rdma_left[i],
                    st.gpus(i),
                    st.split[i] as usize,
                );
            }
        }
        Checkpoint {
            arrived_pct: pct,
            arrived_milli,
            allocated_milli: cap - idle,
            frag_milli: frag,
            idle_milli: idle,
            numa_split_milli: split,
            arrived_tasks: arrived,
            failed_tasks: failed,
            evictions: self.evictions,
        }
    }
}

/// Runs one replay.
pub fn run(
    nodes: &[NodeSpec],
    tasks: &[TaskSpec],
    shapes: &[ShapeSpec],
    cfg: &Config,
) -> CoreResult<ReplayResult> {
    check_config(cfg)?;
    let node_ids = node_order(nodes.len(), cfg);
    let prep = prepare_in_order(nodes, &node_ids, tasks, shapes, cfg.numa)?;
    let mut rng = Rng::new(cfg.seed);
    let order = replay_order(&prep.tasks, prep.capacity_milli, cfg, &mut rng);
    let cap = prep.capacity_milli;
    let mut run = Run {
        k: Kernel {
            st: prep.state,
            shapes: &prep.shapes,
        },
        tasks: &prep.tasks,
        placed: Vec::with_capacity(order.len()),
        evictions: 0,
        rounds: 0,
        policy: cfg.policy,
    };
    let mut res = ReplayResult {
        gpu_capacity_milli: cap,
        tasks: order.len() as u64,
        ..Default::default()
    };
    let mut next_pct = 0u32;
    let mut arrived_milli = 0u64;
    let mut arrived = 0u64;
    if cap > 0 {
        res.checkpoints.push(run.checkpoint(0, 0, 0, 0));
        next_pct = 1;
    }
    for &ti in &order {
        let Some(&t) = prep.tasks.get(ti as usize) else {
            continue;
        };
        arrived += 1;
        arrived_milli += t.gpu_milli_total();
        let node = run
            .arrive(ti, &t, cfg, arrived, &mut rng, &mut res)
            .map_or(-1, |k| node_ids[k] as i64);
        res.node_of.push(node);
        res.task_of.push(ti);
        if let Some(c) = &cfg.compaction {
            if arrived % c.every as u64 == 0 {
                run.compact(c, arrived, res.failed > 0, &mut rng);
            }
        }
        while cap > 0 && next_pct <= cfg.max_pct && arrived_milli * 100 >= next_pct as u64 * cap {
            let cp = run.checkpoint(next_pct, arrived_milli, arrived, res.failed);
            res.checkpoints.push(cp);
            next_pct += 1;
        }
    }
    res.evictions = run.evictions;
    res.compaction_rounds = run.rounds;
    Ok(res)
}

/// Checks the compaction settings (a round at least every arrival, fractions in 0..=1, a
/// gain >= 0) and the resampling factor (0..=100).
fn check_config(cfg: &Config) -> CoreResult<()> {
    if let Some(c) = &cfg.compaction {
        if c.every == 0 {
            return Err(CoreError::new("compaction.every", "must be at least 1"));
        }
        for (name, v) in [("budget", c.budget), ("reserve", c.reserve)] {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(CoreError::new(
                    format!("compaction.{name}"),
                    format!("must be a fraction in 0..=1, got {v}"),
                ));
            }
        }
        if !(c.min_gain.is_finite() && c.min_gain >= 0.0) {
            return Err(CoreError::new(
                "compaction.min_gain",
                format!("must be a finite number >= 0, got {}", c.min_gain),
            ));
        }
    }
    if !(cfg.tune.is_finite() && cfg.tune >= 0.0 && cfg.tune <= 100.0) {
        return Err(CoreError::new(
            "tune",
            format!("must be in 0..=100, got {}", cfg.tune),
        ));
    }
    Ok(())
}

impl Run<'_> {
    /// One task arrives: the policy's choice (or, for pyctl, a rescue when nothing fits), then
    /// the kubelet's admission on the chosen node. Places it and returns the node (the kernel's
    /// index), or counts it failed.
    fn arrive(
        &mut self,
        ti: u32,
        t: &KTask,
        cfg: &Config,
        arrived: u64,
        rng: &mut Rng,
        res: &mut ReplayResult,
    ) -> Option<usize> {
        let mut choice = policy::choose(cfg.policy, &self.k, t, rng, None);
        if choice.is_none() && cfg.policy.is_pyctl() {
            if let Some(c) = &cfg.compaction {
                choice = self.rescue(t, c, arrived, rng);
            }
        }
        let Some(c) = choice else {
            res.failed += 1;
            return None;
        };
        let Some(c) = self.admitted(c, t) else {
            res.failed += 1;
            res.failed_admission += 1;
            return None;
        };
        self.place(ti, c);
        res.placed += 1;
        Some(c.node)
    }

    /// The kubelet's admission on a split node (a blind scheduler may pick a node whose whole
    /// GPUs are not within one zone): the choice, with the GPUs admission gives, or None.
    fn admitted(&self, mut c: policy::Choice, t: &KTask) -> Option<policy::Choice> {
        if self.k.st.split[c.node] != 0 && t.num > 0 && !t.is_share() {
            c.gpus = self.k.st.admit_whole(c.node, t, c.gpus)?;
        }
        Some(c)
    }
}

#[cfg(test)]
mod tests;
