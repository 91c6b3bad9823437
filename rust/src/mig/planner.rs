//! The partition planner: given a node's MIG GPUs (their instances, which are used and by which
//! pods), the pending demand (MIG profile requests of pending pods), the workload M (MIG shapes
//! with weights) and limits, choose a new layout per GPU.
//!
//! The definition (the Python twin `tests/reference/mig.py` implements it the literal way):
//!
//! * Demanded profiles: those with pending pods or weight in M. Wanted profiles (for the
//!   fragment) are those with weight: M's weights normalised to 1, or without M the pending
//!   counts normalised.
//! * Relevant profiles R: the demanded ones, plus the profiles of used instances that may be
//!   destroyed (when `max_used_destroyed > 0`): a pod that must move needs an instance again.
//! * Options of a GPU: unchanged; or, when it may be touched, for every set U of its used
//!   instances that may be destroyed (with the `placement` executor any set of at most
//!   `max_used_destroyed`; with `mig-parted`, which re-creates every instance of a GPU it changes,
//!   none or all of them), every *maximal* vector of new free instances that fits beside the
//!   used instances kept in place, counting only the demanded profiles and those of the
//!   destroyed instances (no further such instance fits): a plan never creates an instance
//!   nobody asks for. Its concrete layout reuses as many of the current free instances as
//!   possible (same profile and start; then the first placement in the search order) and keeps
//!   every other current free instance that still fits. Its free R-instances n count both.
//! * Fragment of a layout (compute slices, this module's own measure until the scorer exists):
//!   Σ over wanted profiles m of w_m · (idle compute slices − compute slices of the free
//!   instances of profile m), idle = the GPU's compute slices minus those of used instances.
//!   As in the fragmentation measure, an idle slice is fragment for m unless it is in a free
//!   instance of exactly m's profile.
//! * The plan picks one option per GPU, at most `max_used_destroyed` used instances destroyed
//!   in total, maximising lexicographically: (1) net demand served = Σ_p min(pending_p +
//!   moved_p, free_p) − Σ_p moved_p (a moved pod re-served on the node counts zero, one left
//!   without an instance counts −1); (2) fewer pods moved; (3) less fragment after; (4) fewer
//!   free instances destroyed; (5) fewer GPUs changed; (6) the smallest vector of option indices
//!   (GPUs in input order, options in generation order). So a plan never destroys a used
//!   instance unless that serves more demand, and it never proposes an invalid layout: every
//!   layout comes out of the exact placement search.
//!
//! How it is computed: options that another option of the same GPU beats on every criterion are
//! dropped; the choice is a dynamic programme over the GPUs (`planner/choose.rs`) whose state is,
//! per R position, free minus moved (capped), and the number of pods moved; within a state the
//! best additive value (fragment, destroyed, changed, option prefix) wins and dominated states
//! are dropped, so the answer is exactly the lexicographic optimum above. When the plan without
//! moves already serves every pending pod it is the answer (moves cannot serve more), and the
//! search for moves is skipped. Beyond `MAX_STATES` states per GPU the programme keeps the best
//! ones by the partial objective and says so (`exact: false`); the tests and the benchmark never
//! reach it.

use self::choose::{choose, choose_exhaustive, Goal, MAX_R};
use self::options::{prune_dominated, Ctx, Opt, VectorCache};
use super::catalog::{GpuModel, MAX_PROFILES};
use super::placement::pin;
use crate::error::{CoreError, CoreResult};

/// States kept per GPU by the dynamic programme before it starts pruning.
pub const MAX_STATES: usize = 1 << 16;

/// Fragment is compared in fixed point: weights are rounded to multiples of 2^-32, so sums are
/// exact and the optimum does not depend on the order of floating-point additions.
pub const WEIGHT_ONE: f64 = 4_294_967_296.0;

/// A GPU instance as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInstance {
    pub profile: usize,
    pub start: u8,
    pub used: bool,
    /// The pod using it (`namespace/name`), when known.
    pub pod: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigGpu {
    /// The GPU index on the node (what mig-parted's `devices` selects).
    pub id: u32,
    pub instances: Vec<GpuInstance>,
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Executor {
    /// Instances kept in place; only the destroyed ones are torn down (NVML
    /// `CreateGpuInstanceWithPlacement`, DRA DynamicMIG).
    #[default]
    Placement,
    /// mig-parted / mig-manager: a GPU whose layout changes loses every instance, used or not.
    MigParted,
}

impl Executor {
    pub fn parse(s: &str) -> CoreResult<Self> {
        match s {
            "placement" => Ok(Executor::Placement),
            "mig-parted" => Ok(Executor::MigParted),
            other => Err(CoreError::new(
                "limits.executor",
                format!("unknown executor {other:?} (one of \"placement\", \"mig-parted\")"),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Executor::Placement => "placement",
            Executor::MigParted => "mig-parted",
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// GPUs that may be re-partitioned (ids); `None` = all. Ids the node lacks are ignored.
    pub gpus: Option<Vec<u32>>,
    /// Used instances that may be destroyed in total (their pods must move).
    pub max_used_destroyed: u32,
    pub executor: Executor,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand {
    /// (profile index, pending pods asking for it).
    pub pending: Vec<(usize, u32)>,
    /// (profile index, weight > 0): the MIG shapes of the workload M.
    pub workload: Vec<(usize, f64)>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    KeptUsed,
    KeptFree,
    New,
}

impl Fate {
    pub fn name(self) -> &'static str {
        match self {
            Fate::KeptUsed => "kept-used",
            Fate::KeptFree => "kept-free",
            Fate::New => "new",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedInstance {
    pub profile: usize,
    pub start: u8,
    pub fate: Fate,
    pub pod: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct GpuPlan {
    pub id: u32,
    pub changed: bool,
    /// The new layout, ascending by start.
    pub layout: Vec<PlannedInstance>,
    /// Current instances that the plan destroys (used ones: their pods must move).
    pub destroyed: Vec<GpuInstance>,
    pub pods_to_move: Vec<String>,
    /// (profile, count): demand expected to land on this GPU's free instances.
    pub serves: Vec<(usize, u32)>,
    pub fragment_before: f64,
    pub fragment_after: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub gpus: Vec<GpuPlan>,
    /// (profile, normalised weight) of the wanted profiles.
    pub wanted: Vec<(usize, f64)>,
    /// Per profile with pending demand, weight in M, or moved pods: (profile, pending, served
    /// before, served after, moved, rehoused).
    /// "served before": pending pods the current free instances can take; "served after":
    /// pending pods the new layout can take; "rehoused": moved pods it takes back.
    pub demand: Vec<DemandLine>,
    pub used_destroyed: u32,
    pub free_destroyed: u32,
    pub changed_gpus: u32,
    /// Σ served after + rehoused − moved (the planner's first criterion).
    pub net_served: i64,
    pub fragment_before: f64,
    pub fragment_after: f64,
    /// False only if the dynamic programme had to prune states (see the module docs).
    pub exact: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemandLine {
    pub profile: usize,
    pub pending: u32,
    pub served_before: u32,
    pub served_after: u32,
    pub moved: u32,
    pub rehoused: u32,
}

/// Plan one node. Errors name the field: unknown profile index, an invalid current layout,
/// a duplicate GPU id, a weight that is not positive and finite.
pub fn plan(
    model: &GpuModel,
    gpus: &[MigGpu],
    demand: &Demand,
    limits: &Limits,
) -> CoreResult<Plan> {
    plan_with(model, gpus, demand, limits, How::default())
}

/// How to search; the defaults are what `plan` does, the others exist to check it.
#[derive(Copy, Clone, Debug)]
pub(crate) struct How {
    pub prune: bool,
    pub exhaustive: bool,
}

impl Default for How {
    fn default() -> Self {
        How {
            prune: true,
            exhaustive: false,
        }
    }
}

/// Plans one node (see the module docs): checks the input, finds the relevant profiles, lists
/// each GPU's options, chooses one per GPU and writes the answer.
pub(crate) fn plan_with(
    model: &GpuModel,
    gpus: &[MigGpu],
    demand: &Demand,
    limits: &Limits,
    how: How,
) -> CoreResult<Plan> {
    check_gpus(model, gpus)?;
    let wants = Wants::read(model, demand)?;
    let limit = limits.max_used_destroyed;
    // Moving pods can only add to the demand served when some pending pod is left unserved
    // without moving any (net served is at most the pending count, and fewer moves come
    // first): then the plan without moves is the plan. Skip the costlier search for moves.
    if limit > 0 && !how.exhaustive {
        let no_moves = Limits {
            max_used_destroyed: 0,
            ..limits.clone()
        };
        let p = plan_with(model, gpus, demand, &no_moves, how)?;
        if p.demand.iter().all(|l| l.served_after == l.pending) {
            return Ok(p);
        }
    }
    let touchable: Vec<bool> = gpus
        .iter()
        .map(|g| limits.gpus.as_ref().is_none_or(|ids| ids.contains(&g.id)))
        .collect();
    let (relevant, r_of) = relevant_profiles(&wants.demanded, gpus, &touchable, limit)?;
    let ctx = Ctx {
        model,
        relevant: &relevant,
        demanded: &wants.demanded,
        r_of: &r_of,
        wanted: &wants.wanted_fixed,
    };
    let mut cache = VectorCache::new();
    let options: Vec<Vec<Opt>> = gpus
        .iter()
        .zip(&touchable)
        .map(|(gpu, &t)| {
            let opts = ctx.options(gpu, t, limit, limits.executor, &mut cache);
            if how.prune {
                prune_dominated(opts)
            } else {
                opts
            }
        })
        .collect();
    let pending_r: Vec<u32> = relevant.iter().map(|&p| wants.pending[p]).collect();
    let goal = Goal {
        pending: &pending_r,
        limit,
    };
    let (choice, exact) = if how.exhaustive {
        (choose_exhaustive(&options, &goal), true)
    } else {
        choose(&options, &goal)
    };
    let chosen: Vec<&Opt> = options.iter().zip(&choice).map(|(o, &c)| &o[c]).collect();
    Ok(answer(
        model, gpus, &wants, &relevant, &options, &chosen, exact,
    ))
}

/// Checks the current layouts: GPU ids listed once, instances of the model's profiles at valid
/// starts that fit the GPU together.
fn check_gpus(model: &GpuModel, gpus: &[MigGpu]) -> CoreResult<()> {
    for (g, gpu) in gpus.iter().enumerate() {
        if gpus[..g].iter().any(|o| o.id == gpu.id) {
            return Err(CoreError::new(
                format!("gpus[{g}].gpu"),
                format!("GPU {} is listed twice", gpu.id),
            ));
        }
        let mut pins = Vec::with_capacity(gpu.instances.len());
        for (i, inst) in gpu.instances.iter().enumerate() {
            let Some(prof) = model.profiles.get(inst.profile) else {
                return Err(CoreError::new(
                    format!("gpus[{g}].instances[{i}].profile"),
                    format!(
                        "profile index {} is not a profile of {}",
                        inst.profile, model.name
                    ),
                ));
            };
            if prof.placement_at(inst.start).is_none() {
                return Err(CoreError::new(
                    format!("gpus[{g}].instances[{i}].start"),
                    format!(
                        "GPU {}: {} cannot start at memory slice {}",
                        gpu.id, prof.name, inst.start
                    ),
                ));
            }
            pins.push((inst.profile, inst.start));
            if pin(model, &pins).is_none() {
                return Err(CoreError::new(
                    format!("gpus[{g}].instances[{i}]"),
                    format!(
                        "GPU {}: {}@{} overlaps another instance or exceeds the GPU's limits",
                        gpu.id, prof.name, inst.start
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The demand per profile of the model: pending pods, the weights of M, the wanted profiles
/// and their weights normalised (M's, or without M the pending counts').
struct Wants {
    /// Pending pods per profile index.
    pending: Vec<u32>,
    /// Profiles with pending pods or weight in M, ascending.
    demanded: Vec<usize>,
    /// (profile, normalised weight).
    wanted: Vec<(usize, f64)>,
    /// The same weights in fixed point (`WEIGHT_ONE`).
    wanted_fixed: Vec<(usize, i64)>,
}

impl Wants {
    /// Reads the demand; errors name a profile index the model lacks or a weight that is not
    /// positive and finite.
    fn read(model: &GpuModel, demand: &Demand) -> CoreResult<Wants> {
        let np = model.profiles.len();
        let mut pending = vec![0u32; np];
        for (i, &(p, c)) in demand.pending.iter().enumerate() {
            let slot = pending.get_mut(p).ok_or_else(|| {
                CoreError::new(
                    format!("pending[{i}].profile"),
                    format!("profile index {p} is not a profile of {}", model.name),
                )
            })?;
            *slot = slot.saturating_add(c);
        }
        let mut weight = vec![0f64; np];
        for (i, &(p, w)) in demand.workload.iter().enumerate() {
            let slot = weight.get_mut(p).ok_or_else(|| {
                CoreError::new(
                    format!("workload[{i}].profile"),
                    format!("profile index {p} is not a profile of {}", model.name),
                )
            })?;
            if !(w.is_finite() && w > 0.0) {
                return Err(CoreError::new(
                    format!("workload[{i}].weight"),
                    format!("weight {w} is not a positive number"),
                ));
            }
            *slot += w;
        }
        if weight.iter().all(|&w| w == 0.0) {
            for (w, &c) in weight.iter_mut().zip(&pending) {
                *w = c as f64;
            }
        }
        let total_w: f64 = weight.iter().sum();
        let wanted: Vec<(usize, f64)> = (0..np)
            .filter(|&p| weight[p] > 0.0)
            .map(|p| (p, weight[p] / total_w))
            .collect();
        let wanted_fixed = wanted
            .iter()
            .map(|&(p, w)| (p, (w * WEIGHT_ONE + 0.5).floor() as i64))
            .collect();
        let demanded = (0..np)
            .filter(|&p| pending[p] > 0 || weight[p] > 0.0)
            .collect();
        Ok(Wants {
            pending,
            demanded,
            wanted,
            wanted_fixed,
        })
    }
}

/// The relevant profiles R (the demanded ones, plus those of used instances that may be
/// destroyed), ascending, and each profile's position in R (`usize::MAX`: not in R). At most
/// `MAX_R`.
fn relevant_profiles(
    demanded: &[usize],
    gpus: &[MigGpu],
    touchable: &[bool],
    limit: u32,
) -> CoreResult<(Vec<usize>, [usize; MAX_PROFILES])> {
    let mut relevant = demanded.to_vec();
    for (gpu, &t) in gpus.iter().zip(touchable) {
        for inst in gpu.instances.iter().filter(|i| i.used) {
            if t && limit > 0 && !relevant.contains(&inst.profile) {
                relevant.push(inst.profile);
            }
        }
    }
    relevant.sort_unstable();
    let nr = relevant.len();
    if nr > MAX_R {
        return Err(CoreError::new(
            "pending",
            format!(
                "{nr} MIG profiles in play (demanded or used); the planner handles at most {MAX_R}"
            ),
        ));
    }
    let mut r_of = [usize::MAX; MAX_PROFILES];
    for (r, &p) in relevant.iter().enumerate() {
        if let Some(slot) = r_of.get_mut(p) {
            *slot = r;
        }
    }
    Ok((relevant, r_of))
}

/// The plan for the chosen option of every GPU: the demand lines, then per GPU its layout, what
/// it destroys, the pods that must move and the demand it serves, and the totals.
fn answer(
    model: &GpuModel,
    gpus: &[MigGpu],
    wants: &Wants,
    relevant: &[usize],
    options: &[Vec<Opt>],
    chosen: &[&Opt],
    exact: bool,
) -> Plan {
    let unchanged: Vec<&Opt> = options.iter().map(|o| &o[0]).collect();
    let (demand, mut remaining, net_served) = demand_lines(wants, relevant, &unchanged, chosen);
    let mut out = Plan {
        gpus: Vec::with_capacity(gpus.len()),
        wanted: wants.wanted.clone(),
        demand,
        used_destroyed: 0,
        free_destroyed: 0,
        changed_gpus: 0,
        net_served,
        fragment_before: 0.0,
        fragment_after: 0.0,
        exact,
    };
    let (mut before, mut after) = (0i64, 0i64);
    for ((gpu, opt), was) in gpus.iter().zip(chosen).zip(&unchanged) {
        let g = gpu_plan(model, gpu, opt, was, relevant, &mut remaining);
        out.used_destroyed += g.destroyed.iter().filter(|i| i.used).count() as u32;
        out.free_destroyed += opt.destroyed_free;
        out.changed_gpus += opt.changed as u32;
        before += was.fragment;
        after += opt.fragment;
        out.gpus.push(g);
    }
    out.fragment_before = slices(before);
    out.fragment_after = slices(after);
    out
}

/// Per relevant profile with demand or moved pods: pending, served before and after, moved and
/// rehoused; with the pods each profile still has to place (pending and moved, for
/// `gpu_plan`'s `serves`) and the net demand served.
fn demand_lines(
    wants: &Wants,
    relevant: &[usize],
    unchanged: &[&Opt],
    chosen: &[&Opt],
) -> (Vec<DemandLine>, Vec<u32>, i64) {
    let nr = relevant.len();
    let mut moved_r = vec![0u32; nr];
    let mut free_r = vec![0u32; nr];
    let mut free_before_r = vec![0u32; nr];
    for (opt, was) in chosen.iter().zip(unchanged) {
        for r in 0..nr {
            moved_r[r] += opt.moved[r] as u32;
            free_r[r] += opt.n[r] as u32;
            free_before_r[r] += was.n[r] as u32;
        }
    }
    let mut lines = Vec::with_capacity(nr);
    let mut remaining = vec![0u32; nr];
    let mut net: i64 = 0;
    for (r, &p) in relevant.iter().enumerate() {
        let pending = wants.pending[p];
        let total = (pending + moved_r[r]).min(free_r[r]);
        let rehoused = moved_r[r].min(total);
        net += total as i64 - moved_r[r] as i64;
        remaining[r] = pending + moved_r[r];
        if !wants.demanded.contains(&p) && moved_r[r] == 0 {
            continue;
        }
        lines.push(DemandLine {
            profile: p,
            pending,
            served_before: pending.min(free_before_r[r]),
            served_after: total - rehoused,
            moved: moved_r[r],
            rehoused,
        });
    }
    (lines, remaining, net)
}

/// One GPU's plan for its chosen option `opt` (`was`: its unchanged option): the new layout
/// ascending by start, the current instances destroyed, the pods that must move, and the
/// demand its free instances take (from `remaining`, in R order).
fn gpu_plan(
    model: &GpuModel,
    gpu: &MigGpu,
    opt: &Opt,
    was: &Opt,
    relevant: &[usize],
    remaining: &mut [u32],
) -> GpuPlan {
    let mut kept = vec![false; gpu.instances.len()];
    for &(_, _, _, src) in &opt.layout {
        if let Some(k) = src.and_then(|i| kept.get_mut(i)) {
            *k = true;
        }
    }
    let destroyed: Vec<GpuInstance> = gpu
        .instances
        .iter()
        .zip(&kept)
        .filter(|(_, &k)| !k)
        .map(|(i, _)| i.clone())
        .collect();
    let pods_to_move: Vec<String> = destroyed
        .iter()
        .filter(|i| i.used)
        .map(|i| {
            i.pod.clone().unwrap_or_else(|| {
                let name = model
                    .profiles
                    .get(i.profile)
                    .map_or("?", |p| p.name.as_str());
                format!("(GPU {} {name}@{})", gpu.id, i.start)
            })
        })
        .collect();
    let mut layout: Vec<PlannedInstance> = opt
        .layout
        .iter()
        .map(|&(p, s, fate, src)| PlannedInstance {
            profile: p,
            start: s,
            fate,
            pod: src
                .and_then(|i| gpu.instances.get(i))
                .and_then(|i| i.pod.clone())
                .filter(|_| fate == Fate::KeptUsed),
        })
        .collect();
    layout.sort_by_key(|i| (i.start, i.profile));
    let mut serves = Vec::new();
    for (r, &p) in relevant.iter().enumerate() {
        let take = remaining[r].min(opt.n[r] as u32);
        if take > 0 {
            serves.push((p, take));
            remaining[r] -= take;
        }
    }
    GpuPlan {
        id: gpu.id,
        changed: opt.changed,
        layout,
        destroyed,
        pods_to_move,
        serves,
        fragment_before: slices(was.fragment),
        fragment_after: slices(opt.fragment),
    }
}

/// Fixed-point fragment to compute slices.
fn slices(fixed: i64) -> f64 {
    fixed as f64 / WEIGHT_ONE
}

mod choose;
mod options;

#[cfg(test)]
mod tests;
