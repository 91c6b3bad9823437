//! Validity of a list of GPU instances written as the user writes them: a profile name
//! (`"3g.20gb"`, placed anywhere valid) or a name pinned at a memory-slice start
//! (`"1g.10gb@3"`, kept exactly there).
//!
//! Bad input is an error naming the instance: an unknown profile, a pin outside the GPU, two pins
//! that overlap. A well-formed list that cannot exist on the GPU is a verdict `valid: false` with
//! the reason: a pin at a start that is not one of the profile's placements, a profile over its
//! instance count, too many compute slices, no room for the unpinned instances, or (when asked
//! for, drivers before R510) a 4-compute/4-memory profile together with a 3-compute/4-memory one.

use super::catalog::GpuModel;
use super::placement::place;
use crate::error::{CoreError, CoreResult};

/// One instance of a validity question.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub profile: usize,
    /// `Some(start)`: pinned at that memory slice.
    pub start: Option<u8>,
}

/// Driver-dependent rules.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// Drivers before R510: a (4 memory, 4 compute) profile cannot be combined with a
    /// (4 memory, 3 compute) one, e.g. 4g.20gb + 3g.20gb on A100 (MIG User Guide, Concepts).
    pub pre_r510: bool,
}

impl Rules {
    /// Whether per-profile counts break the driver rule (the placement rule is checked apart).
    pub fn forbids(&self, model: &GpuModel, counts: &[u8]) -> bool {
        if !self.pre_r510 {
            return false;
        }
        let has = |c: u8, m: u8| {
            model
                .profiles
                .iter()
                .zip(counts)
                .any(|(p, &n)| n > 0 && p.compute_slices == c && p.memory_slices == m)
        };
        has(4, 4) && has(3, 4)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub valid: bool,
    /// When valid: the memory-slice start of every instance, in input order.
    pub starts: Vec<u8>,
    /// When invalid: why, in words.
    pub reason: String,
}

/// Parse `"3g.20gb"` or `"1g.10gb@3"`; errors name `instances[index]`.
pub fn parse_instance(model: &GpuModel, text: &str, index: usize) -> CoreResult<Instance> {
    let field = || format!("instances[{index}]");
    let (name, start) = match text.split_once('@') {
        None => (text, None),
        Some((name, s)) => {
            let start: u8 = s.trim().parse().map_err(|_| {
                CoreError::new(
                    field(),
                    format!(
                        "{text:?}: the part after '@' must be a memory-slice index (0, 1, ...)"
                    ),
                )
            })?;
            (name, Some(start))
        }
    };
    let profile = model
        .profile_index(name)
        .map_err(|e| CoreError::new(field(), e.message))?;
    if let Some(s) = start {
        let size = model.profiles[profile].memory_slices;
        if s as u32 + size as u32 > model.memory_slices as u32 {
            return Err(CoreError::new(
                field(),
                format!(
                    "{text:?} is outside the GPU: it would occupy memory slices {s}..{} but {} has \
                     memory slices 0..{}",
                    s as u32 + size as u32 - 1,
                    model.name,
                    model.memory_slices - 1
                ),
            ));
        }
    }
    Ok(Instance { profile, start })
}

pub fn parse_instances<S: AsRef<str>>(model: &GpuModel, texts: &[S]) -> CoreResult<Vec<Instance>> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| parse_instance(model, t.as_ref(), i))
        .collect()
}

fn show(model: &GpuModel, inst: &Instance) -> String {
    let name = &model.profiles[inst.profile].name;
    match inst.start {
        Some(s) => format!("{name}@{s}"),
        None => name.clone(),
    }
}

/// Can these instances exist together on one GPU of `model`? Pins stay where they are.
/// Bad input is an error; a well-formed list that cannot exist is a verdict with the reason.
pub fn check(model: &GpuModel, instances: &[Instance], rules: Rules) -> CoreResult<Verdict> {
    check_input(model, instances)?;
    let reason = misplaced_pin(model, instances).or_else(|| over_limits(model, instances, rules));
    if let Some(reason) = reason {
        return Ok(invalid(reason));
    }
    let pinned: Vec<(usize, u8)> = instances
        .iter()
        .filter_map(|i| i.start.map(|s| (i.profile, s)))
        .collect();
    let unpinned: Vec<usize> = instances
        .iter()
        .filter(|i| i.start.is_none())
        .map(|i| i.profile)
        .collect();
    let Some(chosen) = place(model, &pinned, &unpinned) else {
        return Ok(invalid(
            "no placement: the free memory slices cannot hold the unpinned instances without overlap"
                .to_string(),
        ));
    };
    let mut next = chosen.into_iter();
    let starts = instances
        .iter()
        .map(|i| i.start.or_else(|| next.next()).unwrap_or(0))
        .collect();
    Ok(Verdict {
        valid: true,
        starts,
        reason: String::new(),
    })
}

/// A verdict `valid: false` with its reason.
fn invalid(reason: String) -> Verdict {
    Verdict {
        valid: false,
        starts: Vec::new(),
        reason,
    }
}

/// Bad input: a profile index the model lacks, a pin outside the GPU, two pins that share
/// memory slices. Errors name the instance.
fn check_input(model: &GpuModel, instances: &[Instance]) -> CoreResult<()> {
    let mut spans: Vec<(usize, u32)> = Vec::new();
    for (i, inst) in instances.iter().enumerate() {
        let Some(prof) = model.profiles.get(inst.profile) else {
            return Err(CoreError::new(
                format!("instances[{i}]"),
                format!(
                    "profile index {} is not a profile of {}",
                    inst.profile, model.name
                ),
            ));
        };
        let Some(s) = inst.start else { continue };
        let end = s as u32 + prof.memory_slices as u32;
        if end > model.memory_slices as u32 {
            return Err(CoreError::new(
                format!("instances[{i}]"),
                format!("{} is outside the GPU", show(model, inst)),
            ));
        }
        let mask = ((1u32 << prof.memory_slices) - 1) << s;
        if let Some(&(j, _)) = spans.iter().find(|&&(_, m)| m & mask != 0) {
            return Err(CoreError::new(
                format!("instances[{i}]"),
                format!(
                    "{} overlaps instances[{j}] ({}): pinned instances cannot share memory slices",
                    show(model, inst),
                    show(model, &instances[j])
                ),
            ));
        }
        spans.push((i, mask));
    }
    Ok(())
}

/// A pin at a start that is not one of its profile's placements (input already checked).
fn misplaced_pin(model: &GpuModel, instances: &[Instance]) -> Option<String> {
    instances.iter().find_map(|inst| {
        let prof = &model.profiles[inst.profile];
        let s = inst.start?;
        if prof.placement_at(s).is_some() {
            return None;
        }
        let starts: Vec<String> = prof
            .placements
            .iter()
            .map(|p| p.start.to_string())
            .collect();
        Some(format!(
            "{} cannot start at memory slice {s} (its placements start at {})",
            prof.name,
            starts.join(", ")
        ))
    })
}

/// A profile over its instance count, more compute slices than the GPU has, or a combination
/// the driver forbids.
fn over_limits(model: &GpuModel, instances: &[Instance], rules: Rules) -> Option<String> {
    let mut counts = vec![0u8; model.profiles.len()];
    let mut compute = 0u32;
    for inst in instances {
        let c = &mut counts[inst.profile];
        *c = c.saturating_add(1);
        compute += model.profiles[inst.profile].compute_slices as u32;
    }
    for (p, &c) in model.profiles.iter().zip(&counts) {
        if c > p.max_count {
            return Some(format!(
                "{c} x {} but at most {} fit on one {}",
                p.name, p.max_count, model.name
            ));
        }
    }
    if compute > model.compute_slices as u32 {
        return Some(format!(
            "{compute} compute slices but {} has {}",
            model.name, model.compute_slices
        ));
    }
    if rules.forbids(model, &counts) {
        return Some(
            "a 4g and a 3g profile on 4 memory slices each cannot be combined before driver R510"
                .to_string(),
        );
    }
    None
}

/// `check` on profile strings: `validate(model, ["3g.20gb", "1g.10gb@6"])`.
pub fn validate<S: AsRef<str>>(
    model: &GpuModel,
    instances: &[S],
    rules: Rules,
) -> CoreResult<Verdict> {
    let parsed = parse_instances(model, instances)?;
    check(model, &parsed, rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::Catalog;

    fn a100() -> &'static GpuModel {
        Catalog::builtin().model("A100-SXM4-40GB").unwrap()
    }

    fn ok(list: &[&str]) -> bool {
        validate(a100(), list, Rules::default()).unwrap().valid
    }

    #[test]
    fn documented_combinations() {
        assert!(ok(&["4g.20gb", "3g.20gb"]));
        assert!(
            !validate(a100(), &["4g.20gb", "3g.20gb"], Rules { pre_r510: true })
                .unwrap()
                .valid
        );
        assert!(
            validate(a100(), &["3g.20gb", "3g.20gb"], Rules { pre_r510: true })
                .unwrap()
                .valid
        );
        assert!(ok(&["4g.20gb", "2g.10gb", "1g.5gb"]));
        assert!(ok(&["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]));
        assert!(ok(&["1g.10gb@6", "3g.20gb@0"]));
        assert!(!ok(&["1g.5gb@7"]));
        assert!(!ok(&["3g.20gb@2"]));
        assert!(!ok(&["1g.5gb@1", "1g.5gb@5", "3g.20gb"]));
        let v = validate(a100(), &["1g.5gb@1", "3g.20gb"], Rules::default()).unwrap();
        assert_eq!((v.valid, v.starts), (true, vec![1, 4]));
        let v = validate(a100(), &["1g.5gb"; 8], Rules::default()).unwrap();
        assert!(!v.valid && v.reason.contains("at most 7"), "{}", v.reason);
        let v = validate(a100(), &["4g.20gb", "2g.10gb", "2g.10gb"], Rules::default()).unwrap();
        assert!(!v.valid && v.reason.contains("compute"), "{}", v.reason);
    }

    #[test]
    fn bad_input_names_the_instance() {
        let e = validate(a100(), &["3g.20gb", "1g.10gb@7"], Rules::default()).unwrap_err();
        assert_eq!(e.field, "instances[1]");
        assert!(e.message.contains("outside the GPU"), "{e}");
        let e = validate(a100(), &["3g.20gb@0", "1g.5gb@3"], Rules::default()).unwrap_err();
        assert_eq!(e.field, "instances[1]");
        assert!(e.message.contains("overlaps instances[0]"), "{e}");
        let e = validate(a100(), &["5g.25gb"], Rules::default()).unwrap_err();
        assert_eq!(e.field, "instances[0]");
        assert!(e.message.contains("\"5g.25gb\""), "{e}");
        let e = validate(a100(), &["1g.5gb@x"], Rules::default()).unwrap_err();
        assert!(e.message.contains("memory-slice index"), "{e}");
        assert!(validate(a100(), &["1g.5gb@300"], Rules::default()).is_err());
        assert!(validate(a100(), &["1g.5gb@-1"], Rules::default()).is_err());
        let none: [&str; 0] = [];
        assert!(validate(a100(), &none, Rules::default()).unwrap().valid);
    }
}
