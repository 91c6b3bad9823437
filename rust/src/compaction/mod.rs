//! The compaction planner, written once for every caller: the controller (over its full model,
//! `crate::placement::ClusterView`) and the trace replay (over its kernel) run this code.
//!
//! A plan has two parts, in this order:
//!
//! 1. **Rescues** of pending tasks. A pending task that no allowed node admits gets room by
//!    moving pods off one node: the planner looks for the cheapest set of pods to move — fewest
//!    evictions first, then the fewest waits on PodDisruptionBudgets (pods of one budget beyond
//!    its headroom must go one after the other), then the smallest fragment after — such that
//!    the task fits on that node once they are gone and each of them fits elsewhere, where the
//!    placement policy (`crate::placement::choose`) would put it (never back on that node).
//!    The search is exact up to `rescue_depth` evictions, within a bounded number of candidate
//!    sets (`rescue_budget`); a rescue node is never the destination of another move in the
//!    plan.
//! 2. **Defragmentation**: greedily the single move (one pod off its node, re-placed where the
//!    policy puts it, not on its own node) that lowers the cluster's F(M) the most, counting the
//!    fall on the source and the rise on the destination, while the fall exceeds `min_gain`.
//!
//! Which pods may move at all (the evictor's rules, budgets with no headroom) is decided by the
//! caller, and so is where each may go (`allowed`: its scheduling constraints, NodeFit). Pods
//! with constraints that depend on other pods (inter-pod (anti-)affinity, topology spread) carry
//! a `group`: at most one pod of a group moves in one plan, so the caller's check of each move
//! against the others stays valid.

use std::collections::HashMap;

use crate::placement::{best_on, choose, Rank, Ranked, View};

/// Allowed nodes: bit i of word i/64 is node i.
pub type NodeSet = Vec<u64>;

fn contains(set: &NodeSet, i: usize) -> bool {
    set.get(i / 64).is_some_and(|w| w & (1u64 << (i % 64)) != 0)
}

/// A pod that may be moved.
#[derive(Clone, Debug)]
pub struct Movable<T, P> {
    pub node: usize,
    pub task: T,
    pub place: P,
    /// Index into the plan's node sets (None: any node).
    pub allowed: Option<usize>,
    /// Index of its PodDisruptionBudget in `Input::pdb_headroom` (None: no budget).
    pub pdb: Option<usize>,
    /// At most one pod of a group moves in a plan (None: no such constraint).
    pub group: Option<u32>,
}

/// A pending task to rescue.
#[derive(Clone, Debug)]
pub struct Pending<T> {
    pub task: T,
    pub allowed: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Limits {
    /// Most moves in a plan (rescue moves included).
    pub max_moves: usize,
    /// Smallest fall of F(M) (milli-GPU) a defragmentation move must bring.
    pub min_gain: f64,
    /// Most moves off one node (defragmentation only).
    pub max_moves_per_node: usize,
    /// Most evictions one rescue may take (0: no rescues).
    pub rescue_depth: usize,
    /// Most rescues in a plan.
    pub max_rescues: usize,
    /// Most candidate sets of pods evaluated per rescue (bounds the search's time).
    pub rescue_budget: usize,
    /// Run the defragmentation part.
    pub defragment: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_moves: 10,
            min_gain: 1.0,
            max_moves_per_node: usize::MAX,
            rescue_depth: 3,
            max_rescues: 1,
            rescue_budget: 4096,
            defragment: true,
        }
    }
}

/// What the planner plans over.
pub struct Input<'a, T, P> {
    pub movable: &'a [Movable<T, P>],
    pub pending: &'a [Pending<T>],
    pub node_sets: &'a [NodeSet],
    /// Disruptions each budget allows now (by index).
    pub pdb_headroom: &'a [u32],
}

/// One eviction and where the pod is expected to land.
#[derive(Clone, Debug, PartialEq)]
pub struct Move<P> {
    /// Index into the movable list.
    pub pod: usize,
    pub from: usize,
    pub to: usize,
    pub to_place: P,
    /// Fall of F(M) by this move alone (milli-GPU; positive is good).
    pub gain: f64,
    /// The rescue this move belongs to (index into `Plan::rescues`), if any.
    pub rescue: Option<usize>,
}

/// Room made for a pending task: its moves (indices into `Plan::moves`, in order) and where
/// the task then fits.
#[derive(Clone, Debug, PartialEq)]
pub struct Rescue<P> {
    pub pending: usize,
    pub node: usize,
    pub place: P,
    pub moves: Vec<usize>,
    /// Evictions beyond a budget's headroom (each waits for an earlier one's replacement).
    pub waits: u32,
    /// Change of F(M) by the whole rescue, the pending task placed (milli-GPU).
    pub delta: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan<P> {
    pub moves: Vec<Move<P>>,
    pub rescues: Vec<Rescue<P>>,
    /// Pending tasks no rescue within the limits could place (indices).
    pub unrescued: Vec<usize>,
    /// A rescue search stopped at `rescue_budget` candidate sets (a deeper search might have
    /// found one).
    pub truncated: bool,
}

struct Planner<'a, 'v, V: View> {
    v: &'v mut V,
    input: &'a Input<'a, V::Task, V::Place>,
    limits: &'a Limits,
    moved: Vec<bool>,
    groups_moved: Vec<u32>,
    /// Nodes whose room is promised to a rescued task: no other move goes there.
    reserved: Vec<usize>,
    /// Movable pods by the node they are on now.
    on_node: Vec<Vec<usize>>,
    plan: Plan<V::Place>,
}

/// Plans on `v`, which it changes: every planned move (and each rescued task's placement) is
/// applied to it, so the caller sees the cluster as the plan leaves it.
pub fn plan<V: View>(
    v: &mut V,
    input: &Input<'_, V::Task, V::Place>,
    limits: &Limits,
) -> Plan<V::Place> {
    let n = v.node_count();
    let mut on_node = vec![Vec::new(); n];
    for (k, m) in input.movable.iter().enumerate() {
        if m.node < n {
            on_node[m.node].push(k);
        }
    }
    let mut p = Planner {
        v,
        input,
        limits,
        moved: vec![false; input.movable.len()],
        groups_moved: Vec::new(),
        reserved: Vec::new(),
        on_node,
        plan: Plan {
            moves: Vec::new(),
            rescues: Vec::new(),
            unrescued: Vec::new(),
            truncated: false,
        },
    };
    p.rescue_all();
    if limits.defragment {
        p.defragment();
    }
    p.plan
}

/// A candidate rescue: the pods moved (movable indices, in eviction order) and where each goes.
struct Candidate<P> {
    node: usize,
    place: P,
    pods: Vec<(usize, Ranked<P>)>,
    cost: (usize, u32, f64),
}

impl<V: View> Planner<'_, '_, V> {
    fn allowed(&self, set: Option<usize>, i: usize) -> bool {
        match set {
            None => true,
            Some(s) => self
                .input
                .node_sets
                .get(s)
                .is_some_and(|ns| contains(ns, i)),
        }
    }

    fn may_move(&self, k: usize) -> bool {
        let m = &self.input.movable[k];
        !self.moved[k] && m.group.is_none_or(|g| !self.groups_moved.contains(&g))
    }

    /// Where the policy sends movable pod `k` if it leaves `from` (never `from`, never a
    /// reserved node, never `avoid`).
    fn destination(&self, k: usize, from: usize, avoid: usize) -> Option<Ranked<V::Place>> {
        let m = &self.input.movable[k];
        choose(self.v, &m.task, |j| {
            j != from && j != avoid && !self.reserved.contains(&j) && self.allowed(m.allowed, j)
        })
    }

    fn room_left(&self) -> bool {
        self.plan.moves.len() < self.limits.max_moves
    }

    fn mark_moved(&mut self, k: usize) {
        self.moved[k] = true;
        if let Some(g) = self.input.movable[k].group {
            self.groups_moved.push(g);
        }
        let from = self.input.movable[k].node;
        self.on_node[from].retain(|&x| x != k);
    }

    // ---- rescues -----------------------------------------------------------------------------

    fn rescue_all(&mut self) {
        if self.limits.rescue_depth == 0 {
            self.plan.unrescued = (0..self.input.pending.len()).collect();
            return;
        }
        // (shape, allowed set) of pending tasks that neither fit nor have a rescue on the
        // cluster as it is: the same answer for the next one alike, until the cluster changes
        let mut hopeless: Vec<(V::Key, Option<usize>)> = Vec::new();
        for (pi, pend) in self.input.pending.iter().enumerate() {
            let key = (self.v.task_key(&pend.task), pend.allowed);
            if hopeless.contains(&key) {
                self.plan.unrescued.push(pi);
                continue;
            }
            let fits_now = choose(self.v, &pend.task, |j| {
                !self.reserved.contains(&j) && self.allowed(pend.allowed, j)
            });
            if let Some(r) = fits_now {
                // it fits somewhere already: the scheduler will place it; keep its room
                self.v.take(r.node, &pend.task, &r.place);
                hopeless.clear();
                continue;
            }
            if self.plan.rescues.len() >= self.limits.max_rescues || !self.room_left() {
                self.plan.unrescued.push(pi);
                continue;
            }
            match self.find_rescue(pi) {
                Some(c) => {
                    self.apply_rescue(pi, c);
                    hopeless.clear();
                }
                None => {
                    self.plan.unrescued.push(pi);
                    hopeless.push(key);
                }
            }
        }
    }

    fn one_per_group(&self, pods: &[usize]) -> bool {
        let mut groups: Vec<u32> = pods
            .iter()
            .filter_map(|&k| self.input.movable[k].group)
            .collect();
        let n = groups.len();
        groups.sort_unstable();
        groups.dedup();
        groups.len() == n
    }

    fn pdb_waits(&self, pods: &[usize]) -> u32 {
        let mut count: HashMap<usize, u32> = HashMap::new();
        for &k in pods {
            if let Some(b) = self.input.movable[k].pdb {
                *count.entry(b).or_default() += 1;
            }
        }
        count
            .iter()
            .map(|(&b, &c)| {
                let h = self.input.pdb_headroom.get(b).copied().unwrap_or(0).max(1);
                c.saturating_sub(h)
            })
            .sum()
    }

    fn find_rescue(&mut self, pi: usize) -> Option<Candidate<V::Place>> {
        let pend = &self.input.pending[pi];
        let max_k = self
            .limits
            .rescue_depth
            .min(self.limits.max_moves.saturating_sub(self.plan.moves.len()));
        let mut budget = self.limits.rescue_budget;
        // nodes where the task would fit were every movable pod gone
        let mut nodes = Vec::new();
        for i in 0..self.v.node_count() {
            if self.reserved.contains(&i) || !self.allowed(pend.allowed, i) {
                continue;
            }
            // the largest first: the first sets tried free the most
            let mut pods: Vec<usize> = self.on_node[i]
                .iter()
                .copied()
                .filter(|&k| self.may_move(k))
                .collect();
            pods.sort_by_key(|&k| {
                std::cmp::Reverse(self.v.gpu_milli(i, &self.input.movable[k].task))
            });
            if pods.is_empty() {
                continue;
            }
            let removed: Vec<(&V::Task, &V::Place)> = pods
                .iter()
                .map(|&k| (&self.input.movable[k].task, &self.input.movable[k].place))
                .collect();
            if self.v.fits_without(i, &pend.task, &removed) {
                nodes.push((i, pods));
            }
        }
        // nodes with fewer pods first: fewer sets to try, and as likely to hold a small one
        nodes.sort_by_key(|(i, pods)| (pods.len(), *i));
        let mut first: DestCache2<V> = HashMap::new();
        for k in 1..=max_k {
            let mut best: Option<Candidate<V::Place>> = None;
            for (i, pods) in &nodes {
                if pods.len() < k {
                    continue;
                }
                let mut combo: Vec<usize> = (0..k).collect();
                loop {
                    if budget == 0 {
                        self.plan.truncated = true;
                        return best;
                    }
                    budget -= 1;
                    let set: Vec<usize> = combo.iter().map(|&c| pods[c]).collect();
                    if !self.one_per_group(&set) {
                        // two pods of one group in a set: not a plan this planner makes
                    } else if let Some(c) = self.try_set(pi, *i, &set, &mut first) {
                        if best.as_ref().is_none_or(|b| cost_lt(&c.cost, &b.cost)) {
                            best = Some(c);
                        }
                    }
                    if !next_combination(&mut combo, pods.len()) {
                        break;
                    }
                }
            }
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// Whether moving the pods `set` off node `i` makes room for pending task `pi` there, each
    /// of them landing elsewhere; the state is left as it was.
    /// Where pod `k` goes when it alone leaves node `i` of the unchanged cluster.
    fn first_destination(
        &self,
        k: usize,
        i: usize,
        cache: &mut DestCache2<V>,
    ) -> Option<Ranked<V::Place>> {
        let m = &self.input.movable[k];
        let key = (self.v.task_key(&m.task), m.allowed);
        let top = cache.entry(key).or_insert_with(|| {
            let first = self.destination(k, usize::MAX, usize::MAX);
            let second = first
                .as_ref()
                .and_then(|f| self.destination(k, f.node, usize::MAX));
            [first, second]
        });
        match &top[0] {
            Some(r) if r.node == i => top[1].clone(),
            other => other.clone(),
        }
    }

    fn try_set(
        &mut self,
        pi: usize,
        i: usize,
        set: &[usize],
        first: &mut DestCache2<V>,
    ) -> Option<Candidate<V::Place>> {
        let pend = &self.input.pending[pi];
        let before: f64 = self.v.frag(i);
        // the pods go elsewhere, the largest first (where the policy puts them); the first meets
        // the cluster as it is now (node `i` aside), so its two best destinations are computed
        // once per shape for the whole search, before anything changes
        let mut order = set.to_vec();
        order.sort_by_key(|&k| std::cmp::Reverse(self.v.gpu_milli(i, &self.input.movable[k].task)));
        let first_dest = self.first_destination(order[0], i, first);
        first_dest.as_ref()?;
        for &k in set {
            let m = &self.input.movable[k];
            self.v.give(i, &m.task, &m.place);
        }
        let mut result = None;
        if let Some(target) = best_on(self.v, i, &pend.task) {
            let mut placed: Vec<(usize, Ranked<V::Place>)> = Vec::new();
            let mut delta = 0.0;
            let mut ok = true;
            for (n, &k) in order.iter().enumerate() {
                let dest = if n == 0 {
                    first_dest.clone()
                } else {
                    self.destination(k, i, i)
                };
                match dest {
                    Some(r) => {
                        let m = &self.input.movable[k];
                        let f0 = self.v.frag(r.node);
                        self.v.take(r.node, &m.task, &r.place);
                        delta += self.v.frag(r.node) - f0;
                        placed.push((k, r));
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                let after = self.v.frag(i) + target.features.inc;
                delta += after - before;
                let cost = (set.len(), self.pdb_waits(set), delta);
                result = Some(Candidate {
                    node: i,
                    place: target.place.clone(),
                    pods: placed.clone(),
                    cost,
                });
            }
            for (k, r) in placed.iter().rev() {
                let m = &self.input.movable[*k];
                self.v.give(r.node, &m.task, &r.place);
            }
        }
        for &k in set.iter().rev() {
            let m = &self.input.movable[k];
            self.v.take(i, &m.task, &m.place);
        }
        result
    }

    fn apply_rescue(&mut self, pi: usize, c: Candidate<V::Place>) {
        let ri = self.plan.rescues.len();
        let mut moves = Vec::new();
        for (k, r) in c.pods {
            let m = &self.input.movable[k];
            let f_src = self.v.frag(c.node);
            self.v.give(c.node, &m.task, &m.place);
            let fall_src = f_src - self.v.frag(c.node);
            let f_dst = self.v.frag(r.node);
            self.v.take(r.node, &m.task, &r.place);
            let rise_dst = self.v.frag(r.node) - f_dst;
            moves.push(self.plan.moves.len());
            self.plan.moves.push(Move {
                pod: k,
                from: c.node,
                to: r.node,
                to_place: r.place,
                gain: fall_src - rise_dst,
                rescue: Some(ri),
            });
            self.mark_moved(k);
        }
        let task = &self.input.pending[pi].task;
        self.v.take(c.node, task, &c.place);
        self.reserved.push(c.node);
        self.plan.rescues.push(Rescue {
            pending: pi,
            node: c.node,
            place: c.place,
            moves,
            waits: c.cost.1,
            delta: c.cost.2,
        });
    }

    // ---- defragmentation ---------------------------------------------------------------------

    /// Greedy moves. Between two moves only the two nodes the last one touched change, so each
    /// pod's fall (`frag - frag_without` on its node) and each shape's rank on every node are
    /// kept and refreshed for those two nodes alone: one pass over the pods and, per shape, one
    /// over the nodes for the first move, then work in proportion to what a move changes (the
    /// result is the same as recomputing all).
    fn defragment(&mut self) {
        let n = self.v.node_count();
        let mut per_node = vec![0usize; n];
        let mut fall: Vec<Option<f64>> = vec![None; self.input.movable.len()];
        // each pod's (task, allowed set), as a dense index into `dests`, computed once
        let mut ids: HashMap<(V::Key, Option<usize>), usize> = HashMap::new();
        let slot: Vec<usize> = (self.input.movable.iter())
            .map(|m| {
                let next = ids.len();
                *ids.entry((self.v.task_key(&m.task), m.allowed))
                    .or_insert(next)
            })
            .collect();
        let mut dests: Vec<Option<Dest<V::Place>>> = Vec::new();
        dests.resize_with(ids.len(), || None);
        while self.room_left() {
            let Some((k, to, change)) = self.best_move(&per_node, &mut fall, &slot, &mut dests)
            else {
                break;
            };
            if -change < self.limits.min_gain {
                break;
            }
            let m = &self.input.movable[k];
            let from = m.node;
            self.v.give(from, &m.task, &m.place);
            self.v.take(to.node, &m.task, &to.place);
            per_node[from] += 1;
            let touched = [from, to.node];
            self.plan.moves.push(Move {
                pod: k,
                from,
                to: to.node,
                to_place: to.place,
                gain: -change,
                rescue: None,
            });
            self.mark_moved(k);
            for &t in &touched {
                for &x in &self.on_node[t] {
                    fall[x] = None;
                }
            }
            for d in dests.iter_mut().flatten() {
                for &t in &touched {
                    if let Some(r) = d.ranks.get_mut(t) {
                        *r = self.rank_on(d.pod, t);
                    }
                }
                d.best = None;
                d.second = None;
            }
        }
    }

    /// The rank of movable pod `k`'s shape on node `i` as a destination (None: not reserved,
    /// allowed and admitting it).
    fn rank_on(&self, k: usize, i: usize) -> Option<Rank> {
        let m = &self.input.movable[k];
        if self.reserved.contains(&i) || !self.allowed(m.allowed, i) {
            return None;
        }
        best_on(self.v, i, &m.task).map(|r| r.rank)
    }

    /// Where `choose` sends the shape of `d` among the nodes but `skip`: the lowest rank, ties to
    /// the lowest node index, read from its ranks (the placement recomputed on that node).
    fn pick(&self, d: &Dest<V::Place>, skip: usize) -> Option<Ranked<V::Place>> {
        let mut best: Option<(usize, Rank)> = None;
        for (i, r) in d.ranks.iter().enumerate() {
            if let Some(r) = r {
                if i != skip && best.is_none_or(|(_, b)| *r < b) {
                    best = Some((i, *r));
                }
            }
        }
        let (i, _) = best?;
        best_on(self.v, i, &self.input.movable[d.pod].task)
    }

    /// The single move that lowers F(M) the most: (pod, destination, change of F(M)).
    fn best_move(
        &self,
        per_node: &[usize],
        fall: &mut [Option<f64>],
        slot: &[usize],
        dests: &mut [Option<Dest<V::Place>>],
    ) -> Option<(usize, Ranked<V::Place>, f64)> {
        // the policy's choice per (task, allowed set): shared by the pods of one shape; for the
        // pods on that very node, the best other node (also shared)
        let mut best: Option<(usize, Ranked<V::Place>, f64)> = None;
        for (k, m) in self.input.movable.iter().enumerate() {
            let off = per_node.get(m.node).copied().unwrap_or(0);
            if !self.may_move(k) || off >= self.limits.max_moves_per_node {
                continue;
            }
            if self.reserved.contains(&m.node) {
                continue; // a rescue's node keeps its pods (its room is counted on them)
            }
            let Some(d) = slot.get(k).and_then(|&s| dests.get_mut(s)) else {
                continue;
            };
            let d = d.get_or_insert_with(|| Dest {
                pod: k,
                ranks: (0..self.v.node_count())
                    .map(|i| self.rank_on(k, i))
                    .collect(),
                best: None,
                second: None,
            });
            if d.best.is_none() {
                d.best = Some(self.pick(d, usize::MAX));
            }
            let to = match d.best.clone().flatten() {
                Some(r) if r.node == m.node => {
                    if d.second.is_none() {
                        d.second = Some(self.pick(d, m.node));
                    }
                    d.second.clone().flatten()
                }
                other => other,
            };
            let Some(to) = to else { continue };
            let change = match fall[k] {
                Some(f) => to.features.inc - f,
                None => {
                    // the fall is at most the node's F_n(M) (F_n is never negative): a move
                    // that could not beat the best so far even then is not scored further
                    let here = self.v.frag(m.node);
                    if best
                        .as_ref()
                        .is_some_and(|b| to.features.inc - here >= b.2 - 1e-9)
                    {
                        continue;
                    }
                    let without = self.v.frag_without(m.node, &m.task, &m.place);
                    debug_assert!(without >= 0.0, "F_n(M) is never negative");
                    let f = here - without;
                    fall[k] = Some(f);
                    to.features.inc - f
                }
            };
            if best.as_ref().is_none_or(|b| change < b.2 - 1e-9) {
                best = Some((k, to, change));
            }
        }
        best
    }
}

/// A shape's destinations during defragmentation: its rank on every node (None: not a
/// destination), the policy's choice (`best`, once asked for) and the best other node
/// (`second`, for the pods on `best`'s node, once asked for); `pod` is a movable pod of the
/// shape (its task and allowed set are the shape's).
struct Dest<P> {
    pod: usize,
    ranks: Vec<Option<Rank>>,
    best: Option<Option<Ranked<P>>>,
    second: Option<Option<Ranked<P>>>,
}

/// The two best destinations per (task, allowed set), on different nodes.
type DestCache2<V> =
    HashMap<(<V as View>::Key, Option<usize>), [Option<Ranked<<V as View>::Place>>; 2]>;

fn cost_lt(a: &(usize, u32, f64), b: &(usize, u32, f64)) -> bool {
    (a.0, a.1) < (b.0, b.1) || ((a.0, a.1) == (b.0, b.1) && a.2 < b.2 - 1e-9)
}

/// The next k-combination of 0..n in lexicographic order; false after the last.
fn next_combination(c: &mut [usize], n: usize) -> bool {
    let k = c.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if c[i] < n - k + i {
            c[i] += 1;
            for j in i + 1..k {
                c[j] = c[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests;
