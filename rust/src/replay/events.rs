//! The inference replay (issue 35): instances that arrive **and leave**, in time order, on the
//! replay's kernel and with the same policies and planner as the arrival-only replay (`super`).
//!
//! Protocol:
//! - Events in time order; at one instant departures before arrivals, arrivals in input order
//!   (the instances present at the start, `arrive <= 0`, in a seeded random order with
//!   `shuffle`). Ties between nodes follow the seed's node order (`super::node_order`).
//! - An arrival is placed by the policy among the nodes its app's anti-affinity allows (at most
//!   `max_per_node` instances of one app on a node: a filter before any score). pyctl with
//!   compaction first tries the planner's rescue (moves within the eviction budget that make
//!   room on one node). An instance nothing takes waits in a FIFO queue.
//! - The queue is retried in arrival order after every departure and after every compaction
//!   round (capacity changes at no other time); an instance still waiting at its deletion time
//!   leaves the queue unplaced (nothing places it at that instant, before its departure comes).
//!   An instance deleted at the instant it is created (or before the start) never runs: it is
//!   not replayed and not counted as arrived.
//! - pyctl with compaction: a round every `interval` seconds of trace time, first a rescue of
//!   the oldest waiting instance, then the planner's defragmentation, with at most one instance
//!   of an app moved per round (so each move's anti-affinity check stays valid), within an
//!   eviction budget of `budget_per_day` x the instance-days run so far; a pod younger than
//!   `min_pod_age` (placed or last moved less long ago) is not moved, as the controller's
//!   evictor keeps it.
//! - Figures are integrals over `0..end` of the state between events (time-weighted): F(M),
//!   idle and allocated GPU, waiting and running instances.

use super::policy::{choose_in, Choice, Policy};
use super::rng::Rng;
use super::state::KTask;
use super::{node_order, prepare_in_order, Config, Kernel, NodeSpec, Run, ShapeSpec, TaskSpec};
use crate::compaction::{Limits, Movable, NodeSet, Pending};
use crate::error::{CoreError, CoreResult};
use crate::placement::View;

/// One instance of the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceSpec {
    pub task: TaskSpec,
    /// The app (anti-affinity key).
    pub app: u32,
    /// Most instances of the app on one node (0: no limit).
    pub max_per_node: u32,
    /// Arrival, seconds from the trace start (<= 0: present at the start).
    pub arrive: f64,
    /// Deletion (None: after the end).
    pub depart: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventCompaction {
    /// Seconds of trace time between compaction rounds.
    pub interval: f64,
    /// Evictions never exceed this fraction of the instance-days run so far.
    pub budget_per_day: f64,
    /// Most moves per round.
    pub max_moves: u32,
    /// Smallest fall of F(M), milli-GPU, a defragmentation move must bring.
    pub min_gain: f64,
    /// Most evictions one rescue may take (0: no rescues).
    pub rescue_depth: u32,
    /// Most candidate sets of pods one rescue evaluates.
    pub rescue_budget: u32,
    /// Seconds a pod must have run before it may be evicted (the controller's evictor setting
    /// `evictor_min_pod_age_seconds`): an instance placed or last moved (a moved instance is a
    /// new pod) less than this long ago is not moved. 0: any pod.
    pub min_pod_age: f64,
}

impl Default for EventCompaction {
    fn default() -> Self {
        EventCompaction {
            interval: 3600.0,
            budget_per_day: 0.01,
            max_moves: 20,
            min_gain: 1.0,
            rescue_depth: 2,
            rescue_budget: 64,
            min_pod_age: 0.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct EventConfig {
    pub policy: Policy,
    pub seed: u64,
    /// Shuffle the nodes' tie order and the order of the instances present at the start.
    pub shuffle: bool,
    /// The end of the trace (s): figures are integrated over 0..end.
    pub end: f64,
    pub compaction: Option<EventCompaction>,
    /// Seconds between samples of the state (0: none); a sample at an event's instant sees the
    /// state before the event, and a last one is taken at `end`.
    pub sample_every: f64,
    /// Keep the log of placements, moves and departures.
    pub log: bool,
}

/// The state at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub allocated_milli: u64,
    pub idle_milli: u64,
    pub frag_milli: f64,
    pub pending: u64,
    pub running: u64,
    pub evictions: u64,
}

/// What happened to an instance (the log).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Placed on `node`.
    Place = 0,
    /// Left (`node`: where it ran, -1 if it was waiting).
    Depart = 1,
    /// Evicted from `node` and placed on `to`.
    Move = 2,
    /// Arrived and waits.
    Wait = 3,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogEntry {
    pub t: f64,
    pub kind: Kind,
    pub instance: u32,
    /// The caller's node index (-1: none).
    pub node: i64,
    pub to: i64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventResult {
    pub gpu_capacity_milli: u64,
    pub end: f64,
    pub instances: u64,
    /// Instances that arrived within 0..end.
    pub arrived: u64,
    pub placed_on_arrival: u64,
    pub placed_after_wait: u64,
    /// Left while waiting, or still waiting at the end.
    pub never_placed: u64,
    pub evictions: u64,
    pub compaction_rounds: u64,
    pub rescues: u64,
    /// Time integrals over 0..end: F(M) (milli-GPU x s), idle and allocated GPU, waiting and
    /// running instances (instance x s).
    pub frag_milli_s: f64,
    pub idle_milli_s: f64,
    pub allocated_milli_s: f64,
    pub pending_s: f64,
    pub running_s: f64,
    pub samples: Vec<Sample>,
    pub log: Vec<LogEntry>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Status {
    Absent,
    Waiting(f64),
    Running(u32),
    Gone,
}

const DAY: f64 = 86400.0;
/// Most samples, and most compaction rounds, over a replay (bounds its time).
const MAX_TICKS: f64 = 1e6;

struct Sim<'a> {
    run: Run<'a>,
    inst: &'a [InstanceSpec],
    status: Vec<Status>,
    /// Instances of each app on each node: `app_on[node * apps + app]`.
    app_on: Vec<u16>,
    apps: usize,
    queue: Vec<u32>,
    /// When each instance's pod was created: placed, or last moved.
    since: Vec<f64>,
    node_ids: Vec<usize>,
    now: f64,
    res: EventResult,
    cfg: &'a EventConfig,
    rng: Rng,
}

impl Sim<'_> {
    fn app_ok(&self, inst: usize, node: usize) -> bool {
        let s = &self.inst[inst];
        s.max_per_node == 0
            || (self.app_on[node * self.apps + s.app as usize] as u32) < s.max_per_node
    }

    fn caller(&self, node: usize) -> i64 {
        self.node_ids[node] as i64
    }

    fn log(&mut self, kind: Kind, instance: u32, node: i64, to: i64) {
        if self.cfg.log {
            self.res.log.push(LogEntry {
                t: self.now,
                kind,
                instance,
                node,
                to,
            });
        }
    }

    /// Integrates the state from `now` to `t` (not past the end).
    fn advance(&mut self, t: f64) {
        let to = t.min(self.cfg.end);
        if to > self.now {
            let dt = to - self.now;
            let st = &self.run.k.st;
            let frag: f64 = st.frag.iter().sum();
            let idle: u64 = st.idle.iter().map(|&x| x as u64).sum();
            self.res.frag_milli_s += frag * dt;
            self.res.idle_milli_s += idle as f64 * dt;
            self.res.allocated_milli_s += (self.res.gpu_capacity_milli - idle) as f64 * dt;
            self.res.pending_s += self.queue.len() as f64 * dt;
            self.res.running_s += self.running() as f64 * dt;
        }
        self.now = self.now.max(to);
    }

    fn running(&self) -> u64 {
        self.run.k.st.pods_on.iter().map(|p| p.len() as u64).sum()
    }

    fn sample(&mut self, t: f64) {
        let st = &self.run.k.st;
        let idle: u64 = st.idle.iter().map(|&x| x as u64).sum();
        let s = Sample {
            t,
            allocated_milli: self.res.gpu_capacity_milli - idle,
            idle_milli: idle,
            frag_milli: st.frag.iter().sum(),
            pending: self.queue.len() as u64,
            running: self.running(),
            evictions: self.run.evictions,
        };
        self.res.samples.push(s);
    }

    /// Places instance `i` with `c` (the policy's or a rescue's choice).
    fn put(&mut self, i: usize, c: Choice) {
        let pid = self.run.place(i as u32, c);
        let app = self.inst[i].app as usize;
        self.app_on[c.node * self.apps + app] += 1;
        self.status[i] = Status::Running(pid);
        self.since[i] = self.now;
        self.log(Kind::Place, i as u32, self.caller(c.node), -1);
    }

    /// The policy's choice for instance `i` among the nodes its anti-affinity allows.
    fn choose(&mut self, i: usize) -> Option<Choice> {
        let t = self.run.tasks[i];
        let k = &self.run.k;
        let (policy, rng) = (self.run.policy, &mut self.rng);
        let inst = self.inst;
        let (app_on, apps) = (&self.app_on, self.apps);
        let s = &inst[i];
        choose_in(policy, k, &t, rng, |n| {
            s.max_per_node == 0 || (app_on[n * apps + s.app as usize] as u32) < s.max_per_node
        })
    }

    fn budget_room(&self, c: &EventCompaction) -> u64 {
        let allowed = (c.budget_per_day * self.res.running_s / DAY).floor() as u64;
        allowed.saturating_sub(self.run.evictions)
    }

    fn arrive(&mut self, i: usize) {
        self.res.arrived += 1;
        if let Some(c) = self.choose(i) {
            self.put(i, c);
            self.res.placed_on_arrival += 1;
            return;
        }
        if self.rescue(i) {
            self.res.placed_on_arrival += 1;
            return;
        }
        self.status[i] = Status::Waiting(self.now);
        self.queue.push(i as u32);
        self.log(Kind::Wait, i as u32, -1, -1);
    }

    fn depart(&mut self, i: usize) {
        match self.status[i] {
            Status::Running(pid) => {
                let p = self.run.placed[pid as usize];
                let node = p.node as usize;
                let t = self.run.tasks[p.task as usize];
                self.run.k.give(node, &t, &p.gpus);
                self.run.k.st.pods_on[node].retain(|&x| x != pid);
                let app = self.inst[i].app as usize;
                let c = &mut self.app_on[node * self.apps + app];
                *c = c.saturating_sub(1);
                self.status[i] = Status::Gone;
                self.log(Kind::Depart, i as u32, self.caller(node), -1);
                self.retry();
            }
            Status::Waiting(_) => {
                self.queue.retain(|&x| x as usize != i);
                self.res.never_placed += 1;
                self.status[i] = Status::Gone;
                self.log(Kind::Depart, i as u32, -1, -1);
            }
            Status::Absent | Status::Gone => {}
        }
    }

    /// Whether instance `i` leaves at this instant (its departure, due now, not yet processed: a
    /// waiting instance leaves unplaced, so nothing places it now).
    fn leaving(&self, i: usize) -> bool {
        self.inst[i].depart.is_some_and(|d| d <= self.now)
    }

    /// Tries the waiting instances in arrival order (not those leaving at this instant); an
    /// instance with the same request and app as one that found no node in this pass is not
    /// tried again.
    fn retry(&mut self) {
        if self.queue.is_empty() {
            return;
        }
        let mut failed = Vec::new();
        let queue = std::mem::take(&mut self.queue);
        let mut left = Vec::with_capacity(queue.len());
        for &i in &queue {
            let i = i as usize;
            let key = (self.run.k.task_key(&self.run.tasks[i]), self.inst[i].app);
            if failed.contains(&key) || self.leaving(i) {
                left.push(i as u32);
                continue;
            }
            match self.choose(i) {
                Some(c) => {
                    self.put(i, c);
                    self.res.placed_after_wait += 1;
                }
                None => {
                    failed.push(key);
                    left.push(i as u32);
                }
            }
        }
        self.queue = left;
    }

    /// The movable pods (one GPU or a share of one, not of `except_app`), each with its app's
    /// anti-affinity as a node set and its app as its group (at most one instance of an app
    /// moves per plan); and the node sets.
    #[allow(clippy::type_complexity)]
    fn movable(
        &self,
        except_app: Option<u32>,
    ) -> (
        Vec<Movable<KTask, u16>>,
        Vec<u32>,
        Vec<NodeSet>,
        Vec<Option<usize>>,
    ) {
        let (all, all_ids) = self.run.movable();
        let mut items = Vec::with_capacity(all.len());
        let mut ids = Vec::with_capacity(all.len());
        let mut sets: Vec<NodeSet> = Vec::new();
        let mut set_of: Vec<Option<usize>> = vec![None; self.apps];
        let min_age = self.cfg.compaction.map_or(0.0, |c| c.min_pod_age);
        for (mut m, pid) in all.into_iter().zip(all_ids) {
            let i = self.run.placed[pid as usize].task as usize;
            let s = &self.inst[i];
            if Some(s.app) == except_app {
                continue;
            }
            if self.now - self.since[i] < min_age {
                continue; // the evictor's minimum pod age
            }
            if s.max_per_node > 0 {
                m.allowed = Some(self.app_set(i, &mut sets, &mut set_of));
            }
            m.group = Some(s.app);
            items.push(m);
            ids.push(pid);
        }
        (items, ids, sets, set_of)
    }

    /// The node set of instance `i`'s app (nodes below its cap), made once per plan.
    fn app_set(&self, i: usize, sets: &mut Vec<NodeSet>, set_of: &mut [Option<usize>]) -> usize {
        let app = self.inst[i].app as usize;
        if let Some(k) = set_of[app] {
            return k;
        }
        let n = self.run.k.st.node_count();
        let mut set = vec![0u64; n.div_ceil(64)];
        for node in 0..n {
            if self.app_ok(i, node) {
                set[node / 64] |= 1u64 << (node % 64);
            }
        }
        sets.push(set);
        set_of[app] = Some(sets.len() - 1);
        sets.len() - 1
    }

    /// Plans and carries out (pyctl: the planner plans on the state), keeps the anti-affinity
    /// counts and the log, and places a rescued instance. Returns whether `rescue_of` was
    /// placed.
    fn plan(&mut self, rescue_of: Option<usize>, limits: &Limits) -> bool {
        let except = rescue_of.map(|i| self.inst[i].app);
        let (items, ids, mut sets, mut set_of) = self.movable(except);
        let pending: Vec<Pending<KTask>> = rescue_of
            .map(|i| {
                let allowed = (self.inst[i].max_per_node > 0)
                    .then(|| self.app_set(i, &mut sets, &mut set_of));
                Pending {
                    task: self.run.tasks[i],
                    allowed,
                }
            })
            .into_iter()
            .collect();
        let before: Vec<u32> = ids
            .iter()
            .map(|&p| self.run.placed[p as usize].node)
            .collect();
        let plan = self
            .run
            .plan_over(&items, &ids, &pending, &sets, limits, &mut self.rng);
        for mv in &plan.moves {
            let pid = ids[mv.pod];
            let i = self.run.placed[pid as usize].task as usize;
            let app = self.inst[i].app as usize;
            let from = before[mv.pod] as usize;
            let to = self.run.placed[pid as usize].node as usize;
            self.app_on[from * self.apps + app] -= 1;
            self.app_on[to * self.apps + app] += 1;
            self.since[i] = self.now;
            self.log(Kind::Move, i as u32, self.caller(from), self.caller(to));
        }
        let (Some(i), Some(r)) = (rescue_of, plan.rescues.first()) else {
            return false;
        };
        // the plan placed the task on the state: give it back and place it as an arrival
        let t = self.run.tasks[i];
        self.run.k.give(r.node, &t, &r.place);
        if !(self.run.k.st.fits(r.node, &t, true) && self.app_ok(i, r.node)) {
            return false;
        }
        self.put(
            i,
            Choice {
                node: r.node,
                gpus: r.place,
            },
        );
        self.res.rescues += 1;
        true
    }

    /// pyctl with compaction: the planner's rescue of instance `i`, within the budget.
    fn rescue(&mut self, i: usize) -> bool {
        let Some(c) = self.cfg.compaction else {
            return false;
        };
        let room = self.budget_room(&c);
        if !self.run.policy.is_pyctl()
            || room == 0
            || c.rescue_depth == 0
            || self.run.tasks[i].num == 0
        {
            return false;
        }
        let limits = Limits {
            max_moves: room.min(c.max_moves as u64) as usize,
            rescue_depth: c.rescue_depth as usize,
            rescue_budget: c.rescue_budget as usize,
            max_rescues: 1,
            defragment: false,
            ..Limits::default()
        };
        self.plan(Some(i), &limits)
    }

    /// A compaction round: the oldest waiting instance's rescue, then defragmentation.
    fn compact(&mut self, c: &EventCompaction) {
        self.res.compaction_rounds += 1;
        if let Some(&first) = self.queue.first() {
            let i = first as usize;
            if !self.leaving(i) && self.rescue(i) {
                self.queue.retain(|&x| x != first);
                self.res.placed_after_wait += 1;
            }
        }
        let room = self.budget_room(c).min(c.max_moves as u64) as usize;
        if room > 0 {
            let limits = Limits {
                max_moves: room,
                min_gain: c.min_gain,
                rescue_depth: 0,
                ..Limits::default()
            };
            self.plan(None, &limits);
        }
        self.retry();
    }
}

fn check(inst: &[InstanceSpec], cfg: &EventConfig) -> CoreResult<()> {
    if !(cfg.end.is_finite() && cfg.end > 0.0) {
        return Err(CoreError::new(
            "end",
            format!("must be a positive number of seconds, got {}", cfg.end),
        ));
    }
    if !(cfg.sample_every.is_finite() && cfg.sample_every >= 0.0) {
        return Err(CoreError::new(
            "sample_every",
            format!("must be >= 0, got {}", cfg.sample_every),
        ));
    }
    if cfg.sample_every > 0.0 && cfg.end / cfg.sample_every > MAX_TICKS {
        return Err(CoreError::new(
            "sample_every",
            format!("more than {MAX_TICKS} samples over 0..{}", cfg.end),
        ));
    }
    if let Some(c) = &cfg.compaction {
        if !(c.interval.is_finite() && c.interval > 0.0) {
            return Err(CoreError::new(
                "compaction.interval",
                format!("must be a positive number of seconds, got {}", c.interval),
            ));
        }
        if cfg.end / c.interval > MAX_TICKS {
            return Err(CoreError::new(
                "compaction.interval",
                format!("more than {MAX_TICKS} rounds over 0..{}", cfg.end),
            ));
        }
        if !(c.budget_per_day.is_finite() && (0.0..=1.0).contains(&c.budget_per_day)) {
            return Err(CoreError::new(
                "compaction.budget_per_day",
                format!("must be a fraction in 0..=1, got {}", c.budget_per_day),
            ));
        }
        if !(c.min_gain.is_finite() && c.min_gain >= 0.0) {
            return Err(CoreError::new(
                "compaction.min_gain",
                format!("must be a finite number >= 0, got {}", c.min_gain),
            ));
        }
        if !(c.min_pod_age.is_finite() && c.min_pod_age >= 0.0) {
            return Err(CoreError::new(
                "compaction.min_pod_age",
                format!(
                    "must be a finite number of seconds >= 0, got {}",
                    c.min_pod_age
                ),
            ));
        }
        if cfg.policy == Policy::PyctlDeployed {
            return Err(CoreError::new(
                "compaction",
                "the inference replay compacts with pyctl's policy only",
            ));
        }
    }
    for (k, s) in inst.iter().enumerate() {
        if !s.arrive.is_finite() {
            return Err(CoreError::new(
                format!("instances[{k}].arrive"),
                format!("must be a finite time, got {}", s.arrive),
            ));
        }
        if let Some(d) = s.depart {
            if !(d.is_finite() && d >= s.arrive) {
                return Err(CoreError::new(
                    format!("instances[{k}].depart"),
                    format!("must be a finite time >= its arrival {}, got {d}", s.arrive),
                ));
            }
        }
    }
    Ok(())
}

/// Runs the inference replay.
pub fn run_events(
    nodes: &[NodeSpec],
    inst: &[InstanceSpec],
    shapes: &[ShapeSpec],
    cfg: &EventConfig,
) -> CoreResult<EventResult> {
    check(inst, cfg)?;
    let order_cfg = Config {
        seed: cfg.seed,
        shuffle: cfg.shuffle,
        ..Config::default()
    };
    let node_ids = node_order(nodes.len(), &order_cfg);
    let tasks: Vec<TaskSpec> = inst.iter().map(|s| s.task.clone()).collect();
    let prep = prepare_in_order(nodes, &node_ids, &tasks, shapes, false)?;
    let apps = inst.iter().map(|s| s.app as usize + 1).max().unwrap_or(0);
    let n = nodes.len();
    // events: (time, 0 = departure / 1 = arrival, position, instance)
    let mut rng = Rng::new(cfg.seed);
    let mut initial: Vec<u32> = (0..inst.len() as u32)
        .filter(|&i| inst[i as usize].arrive <= 0.0)
        .collect();
    if cfg.shuffle {
        rng.shuffle(&mut initial);
    }
    let mut pos = vec![0u32; inst.len()];
    for (p, &i) in initial.iter().enumerate() {
        pos[i as usize] = p as u32;
    }
    let mut events: Vec<(f64, u8, u32, u32)> = Vec::with_capacity(2 * inst.len());
    for (i, s) in inst.iter().enumerate() {
        let t = s.arrive.max(0.0);
        // deleted at the instant it is created (or before the start): it never runs; at one
        // instant its departure would come before its arrival and be lost
        let at_once = s.depart.is_some_and(|d| d.max(0.0) <= t);
        if t < cfg.end && !at_once {
            let p = if s.arrive <= 0.0 { pos[i] } else { i as u32 };
            events.push((t, 1, p, i as u32));
            if let Some(d) = s.depart {
                if d < cfg.end {
                    events.push((d.max(0.0), 0, i as u32, i as u32));
                }
            }
        }
    }
    events.sort_by(|a, b| {
        a.0.total_cmp(&b.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    let mut sim = Sim {
        run: Run {
            k: Kernel {
                st: prep.state,
                shapes: &prep.shapes,
            },
            tasks: &prep.tasks,
            placed: Vec::with_capacity(inst.len()),
            evictions: 0,
            rounds: 0,
            policy: cfg.policy,
        },
        inst,
        status: vec![Status::Absent; inst.len()],
        app_on: vec![0; n * apps],
        apps,
        queue: Vec::new(),
        since: vec![0.0; inst.len()],
        node_ids,
        now: 0.0,
        res: EventResult {
            gpu_capacity_milli: prep.capacity_milli,
            end: cfg.end,
            instances: inst.len() as u64,
            ..Default::default()
        },
        cfg,
        rng,
    };
    let comp = cfg.compaction.filter(|_| cfg.policy.is_pyctl());
    let mut next_round = comp.map_or(f64::INFINITY, |c| c.interval);
    let mut next_sample = if cfg.sample_every > 0.0 {
        cfg.sample_every
    } else {
        f64::INFINITY
    };
    let mut ev = events.into_iter().peekable();
    loop {
        let t_ev = ev.peek().map_or(cfg.end, |e| e.0);
        // periodic work due before (or at) the next event: samples first, then rounds
        let tick = next_round.min(next_sample);
        if tick <= t_ev && tick < cfg.end {
            sim.advance(tick);
            if next_sample <= next_round {
                sim.sample(next_sample);
                next_sample += cfg.sample_every;
            } else if let Some(c) = comp {
                sim.compact(&c);
                next_round += c.interval;
            }
            continue;
        }
        let Some((t, kind, _, i)) = ev.next() else {
            break;
        };
        sim.advance(t);
        if kind == 0 {
            sim.depart(i as usize);
        } else {
            sim.arrive(i as usize);
        }
    }
    sim.advance(cfg.end);
    if cfg.sample_every > 0.0 {
        sim.sample(cfg.end);
    }
    sim.res.never_placed += sim.queue.len() as u64;
    sim.res.evictions = sim.run.evictions;
    Ok(sim.res)
}

#[cfg(test)]
mod tests;
