//! MIG geometry: the profile catalog of every MIG-capable GPU model, the exact placement search
//! that decides which sets of GPU instances can exist together, validity of user-written
//! instance lists, the maximal layouts of a model, and the partition planner (facts and sources:
//! `shared/docs/mig.md`, data: `pyctl/data/mig_profiles.json`).

pub mod catalog;
pub mod layouts;
pub mod placement;
pub mod planner;
pub mod validate;

pub use catalog::{Catalog, GpuModel, Placement, Profile};
pub use layouts::{default_profiles, enumerate, Enumeration, Layout};
pub use placement::{feasible, place};
pub use planner::{
    plan, Demand, Executor, Fate, GpuInstance, GpuPlan, Limits, MigGpu, Plan, PlannedInstance,
};
pub use validate::{check, parse_instance, parse_instances, validate, Instance, Rules, Verdict};
