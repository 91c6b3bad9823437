//! The choice of one option per GPU: a dynamic programme over the GPUs, and the literal walk
//! over every combination that the tests check it against.
//!
//! The net served, Σ_r min(pending_r + moved_r, free_r) − moved_r, equals Σ_r min(pending_r,
//! free_r − moved_r). So a state needs, per R position, only d_r = free_r − moved_r, plus the
//! number of pods moved so far (for the limit and the second criterion). d_r is capped at
//! pending_r + the moves still allowed: above that every continuation serves all of pending_r.
//! States keep their option prefix as a parent pointer plus its rank among the layer's prefixes
//! in lexicographic order, which is all the tie-break needs.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::options::Opt;
use super::MAX_STATES;

/// R positions a state can hold (a model has at most 7 profiles).
pub(super) const MAX_R: usize = 8;

/// What the objective needs to know about the demand.
pub(super) struct Goal<'a> {
    /// Per R position: pending pods.
    pub pending: &'a [u32],
    pub limit: u32,
}

/// (d_r per R position, pods moved so far).
type Key = ([i32; MAX_R], u32);

#[derive(Copy, Clone)]
struct State {
    key: Key,
    fragment: i64,
    destroyed_free: u32,
    changed: u32,
    /// Index of the previous layer's state, and the option taken here.
    parent: u32,
    option: u16,
    /// Rank of this state's option prefix among the layer's prefixes (lexicographic).
    rank: u32,
}

impl State {
    fn moved(&self) -> u32 {
        self.key.1
    }

    /// This state's key followed by `opt`; None when over the limit.
    fn add(key: &Key, opt: &Opt, goal: &Goal<'_>) -> Option<Key> {
        let moved = key.1.checked_add(opt.moved_total)?;
        if moved > goal.limit {
            return None;
        }
        let left = (goal.limit - moved) as i64;
        let mut d = [0i32; MAX_R];
        for (r, &pending) in goal.pending.iter().enumerate() {
            let v = key.0[r] as i64 + opt.n[r] as i64 - opt.moved[r] as i64;
            let cap = (pending as i64 + left).min(i32::MAX as i64);
            d[r] = v.min(cap) as i32;
        }
        Some((d, moved))
    }

    /// Within one key (same net, same moved): less fragment, fewer destroyed, fewer changed,
    /// then the smaller prefix.
    fn additive_cmp(&self, o: &State, by_prefix: impl Fn(&State, &State) -> Ordering) -> Ordering {
        self.fragment
            .cmp(&o.fragment)
            .then(self.destroyed_free.cmp(&o.destroyed_free))
            .then(self.changed.cmp(&o.changed))
            .then_with(|| by_prefix(self, o))
    }

    /// Σ_r min(pending_r, d_r).
    fn net(&self, goal: &Goal<'_>) -> i64 {
        goal.pending
            .iter()
            .enumerate()
            .map(|(r, &p)| (p as i64).min(self.key.0[r] as i64))
            .sum()
    }

    /// The full objective among states of one layer, best first: larger net, fewer moved,
    /// then `additive_cmp` with the layer's ranks.
    fn objective_cmp(&self, o: &State, goal: &Goal<'_>) -> Ordering {
        o.net(goal)
            .cmp(&self.net(goal))
            .then(self.moved().cmp(&o.moved()))
            .then_with(|| self.additive_cmp(o, |a, b| a.rank.cmp(&b.rank)))
    }
}

/// A small multiplicative hasher for the keys (no need for DoS resistance here).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type KeyMap = HashMap<Key, usize, BuildHasherDefault<KeyHasher>>;

/// The option index chosen for every GPU, and whether no state was pruned.
pub(super) fn choose(options: &[Vec<Opt>], goal: &Goal<'_>) -> (Vec<usize>, bool) {
    let root = State {
        key: ([0; MAX_R], 0),
        fragment: 0,
        destroyed_free: 0,
        changed: 0,
        parent: 0,
        option: 0,
        rank: 0,
    };
    let mut layers: Vec<Vec<State>> = vec![vec![root]];
    let mut exact = true;
    let mut index = KeyMap::default();
    for opts in options {
        let prev = layers.last().map_or(&[][..], |l| &l[..]);
        let mut next: Vec<State> = Vec::new();
        index.clear();
        // Candidates of this layer compare prefixes by (parent rank, option).
        let prefix = |a: &State, b: &State| {
            prev[a.parent as usize]
                .rank
                .cmp(&prev[b.parent as usize].rank)
                .then(a.option.cmp(&b.option))
        };
        for (si, s) in prev.iter().enumerate() {
            for (o, opt) in opts.iter().enumerate() {
                let Some(key) = State::add(&s.key, opt, goal) else {
                    continue;
                };
                let cand = State {
                    key,
                    fragment: s.fragment + opt.fragment,
                    destroyed_free: s.destroyed_free + opt.destroyed_free,
                    changed: s.changed + opt.changed as u32,
                    parent: si as u32,
                    option: o as u16,
                    rank: 0,
                };
                match index.get(&cand.key) {
                    Some(&at) => {
                        if cand.additive_cmp(&next[at], prefix).is_lt() {
                            next[at] = cand;
                        }
                    }
                    None => {
                        index.insert(cand.key, next.len());
                        next.push(cand);
                    }
                }
            }
        }
        // Ranks: the lexicographic order of the surviving prefixes.
        let mut order: Vec<usize> = (0..next.len()).collect();
        order.sort_by(|&a, &b| prefix(&next[a], &next[b]));
        for (rank, &i) in order.iter().enumerate() {
            next[i].rank = rank as u32;
        }
        let mut next = drop_dominated(next, goal.pending.len());
        if next.len() > MAX_STATES {
            exact = false;
            next.sort_by(|a, b| a.objective_cmp(b, goal));
            next.truncate(MAX_STATES);
        }
        layers.push(next);
    }
    let last = layers.last().map_or(&[][..], |l| &l[..]);
    let Some(best) = (0..last.len()).min_by(|&a, &b| last[a].objective_cmp(&last[b], goal)) else {
        return (Vec::new(), exact);
    };
    // Walk the parents back.
    let mut choice = vec![0usize; options.len()];
    let mut at = best;
    for g in (0..options.len()).rev() {
        let s = &layers[g + 1][at];
        choice[g] = s.option as usize;
        at = s.parent as usize;
    }
    (choice, exact)
}

/// Drop a state when another one with the same moves has at least its d_r everywhere and a
/// better additive value (or the same and a smaller prefix): whatever the remaining GPUs add,
/// the other one's plan serves at least as much with the same moves and wins the remaining
/// criteria, so this one is never the optimum. The survivors keep their order.
fn drop_dominated(states: Vec<State>, nr: usize) -> Vec<State> {
    let mut order: Vec<usize> = (0..states.len()).collect();
    // By moves, then best additive value first: a dominating state comes earlier.
    order.sort_by(|&a, &b| {
        let (x, y) = (&states[a], &states[b]);
        x.moved()
            .cmp(&y.moved())
            .then_with(|| x.additive_cmp(y, |p, q| p.rank.cmp(&q.rank)))
    });
    let covers = |a: &[i32; MAX_R], b: &[i32; MAX_R]| (0..nr).all(|r| a[r] >= b[r]);
    let mut keep = vec![false; states.len()];
    let mut front: Vec<[i32; MAX_R]> = Vec::new();
    let mut group: Option<u32> = None;
    for &i in &order {
        let s = &states[i];
        if group != Some(s.moved()) {
            group = Some(s.moved());
            front.clear();
        }
        if !front.iter().any(|f| covers(f, &s.key.0)) {
            front.push(s.key.0);
            keep[i] = true;
        }
    }
    states
        .into_iter()
        .zip(keep)
        .filter_map(|(s, k)| k.then_some(s))
        .collect()
}

/// Every combination of options, literally, with the net served computed from its definition
/// (tests only: exponential in the GPUs).
pub(super) fn choose_exhaustive(options: &[Vec<Opt>], goal: &Goal<'_>) -> Vec<usize> {
    let nr = goal.pending.len();
    let mut idx = vec![0usize; options.len()];
    // (net, moved, fragment, destroyed, changed, indices)
    type Score = (i64, u32, i64, u32, u32, Vec<usize>);
    let mut best: Option<Score> = None;
    loop {
        let (mut free, mut moved) = (vec![0i64; nr], vec![0i64; nr]);
        let (mut moved_total, mut fragment, mut destroyed, mut changed) = (0u32, 0i64, 0u32, 0u32);
        for (g, &o) in idx.iter().enumerate() {
            let opt = &options[g][o];
            for r in 0..nr {
                free[r] += opt.n[r] as i64;
                moved[r] += opt.moved[r] as i64;
            }
            moved_total += opt.moved_total;
            fragment += opt.fragment;
            destroyed += opt.destroyed_free;
            changed += opt.changed as u32;
        }
        let net: i64 = (0..nr)
            .map(|r| (goal.pending[r] as i64 + moved[r]).min(free[r]) - moved[r])
            .sum();
        let score: Score = (-net, moved_total, fragment, destroyed, changed, idx.clone());
        if moved_total <= goal.limit && best.as_ref().is_none_or(|b| score < *b) {
            best = Some(score);
        }
        // The next index vector, last GPU fastest.
        let mut g = options.len();
        loop {
            if g == 0 {
                return best.map_or_else(Vec::new, |b| b.5);
            }
            g -= 1;
            idx[g] += 1;
            if idx[g] < options[g].len() {
                break;
            }
            idx[g] = 0;
        }
    }
}
