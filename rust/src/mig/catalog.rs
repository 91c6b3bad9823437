//! The MIG profile catalog: every MIG-capable GPU model with its GPU-instance profiles and their
//! placements, read from `pyctl/data/mig_profiles.json` (sources and provenance notes in that
//! file and in `shared/docs/mig.md`), embedded at build time and parsed once.
//!
//! Placements count memory slices (`nvidia-smi mig -lgipp` `{starts}:size`, NVML
//! `nvmlGpuInstancePlacement_t`). A model whose placements are not taken from a real `-lgipp`
//! capture but inferred from NVIDIA's memory fractions is marked `placements_inferred`.

use std::sync::OnceLock;

use serde::Deserialize;

use crate::error::{CoreError, CoreResult};

/// The data file, embedded: the core does no I/O.
pub const BUILTIN_JSON: &str = include_str!("../../../pyctl/data/mig_profiles.json");

/// Largest memory-slice axis the core accepts (every MIG GPU today has 8, the A30 4); masks of
/// occupied slices are `u16`.
pub const MAX_MEMORY_SLICES: u8 = 16;
/// Largest number of profiles per model (the placement search keeps per-profile counts on the
/// stack).
pub const MAX_PROFILES: usize = 32;

/// One place a GPU instance can be created: memory slices `[start, start + size)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement {
    pub start: u8,
    pub size: u8,
}

impl Placement {
    /// The memory slices it occupies, as a bit mask (bit i = memory slice i).
    pub fn mask(self) -> u16 {
        (((1u32 << self.size) - 1) << self.start) as u16
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// `nvidia-smi` short name, e.g. `3g.20gb`, `1g.5gb+me`.
    pub name: String,
    /// GPU-instance profile ID as `nvidia-smi mig -lgip` prints it (not NVML's enum index).
    pub id: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    /// `Instances Total`: at most this many instances of the profile on one GPU.
    pub max_count: u8,
    /// Ascending by start; every one has `size == memory_slices`.
    pub placements: Vec<Placement>,
    /// A `+me` profile (media extensions).
    pub media_extensions: bool,
    pub placements_inferred: bool,
}

impl Profile {
    /// The placement starting at memory slice `start`, if the profile has one.
    pub fn placement_at(&self, start: u8) -> Option<Placement> {
        self.placements.iter().copied().find(|p| p.start == start)
    }

    /// The profile name without a `+me` (or other `+attribute`) suffix.
    pub fn base_name(&self) -> &str {
        self.name.split('+').next().unwrap_or(&self.name)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    /// The catalog key, e.g. `A100-SXM4-40GB`.
    pub name: String,
    /// Other names of the same part (parenthetical remarks of the data file removed).
    pub aliases: Vec<String>,
    /// PCI device ids as mig-parted's `device-filter` writes them, e.g. `0x20B010DE`.
    pub pci_device_ids: Vec<String>,
    pub memory_slices: u8,
    pub compute_slices: u8,
    /// In data-file order (by the catalog, smallest first).
    pub profiles: Vec<Profile>,
    /// Any profile's placements are inferred rather than documented.
    pub placements_inferred: bool,
    /// The data file's notes on the model (provenance), possibly empty.
    pub notes: String,
}

impl GpuModel {
    /// Profile index by name: `3g.20gb`, `1g.5gb+me`; also accepted: any letter case, the
    /// Kubernetes resource forms `nvidia.com/mig-1g.5gb.me` / `mig-1g.5gb` (where `+` is
    /// written `.`). Unknown → error naming the profile and the model.
    pub fn profile_index(&self, name: &str) -> CoreResult<usize> {
        let trimmed = name.trim();
        if let Some(i) = self.profiles.iter().position(|p| p.name == trimmed) {
            return Ok(i);
        }
        let lower = trimmed.to_ascii_lowercase();
        let bare = lower
            .strip_prefix("nvidia.com/")
            .unwrap_or(&lower)
            .trim_start_matches("mig-");
        for (i, p) in self.profiles.iter().enumerate() {
            let pname = p.name.to_ascii_lowercase();
            if pname == bare || pname.replace('+', ".") == bare {
                return Ok(i);
            }
        }
        let known: Vec<&str> = self.profiles.iter().map(|p| p.name.as_str()).collect();
        Err(CoreError::new(
            "profile",
            format!(
                "unknown MIG profile {name:?} for {} (its profiles: {})",
                self.name,
                known.join(", ")
            ),
        ))
    }

    pub fn profile(&self, index: usize) -> Option<&Profile> {
        self.profiles.get(index)
    }

    /// All memory slices, as a mask.
    pub fn full_mask(&self) -> u16 {
        ((1u32 << self.memory_slices) - 1) as u16
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalog {
    models: Vec<GpuModel>,
}

static BUILTIN: OnceLock<Catalog> = OnceLock::new();

impl Catalog {
    /// The catalog of `pyctl/data/mig_profiles.json`, parsed on first use. (The embedded file is
    /// checked by the unit tests; were it ever unreadable this would be an empty catalog, in
    /// which every model lookup fails with an error, rather than a panic.)
    pub fn builtin() -> &'static Catalog {
        BUILTIN.get_or_init(|| Catalog::from_json(BUILTIN_JSON).unwrap_or_default())
    }

    /// Parse and check a catalog in the data file's schema (`mig_profiles/v1`).
    pub fn from_json(text: &str) -> CoreResult<Catalog> {
        let raw: RawFile = serde_json::from_str(text)
            .map_err(|e| CoreError::new("mig_profiles.json", format!("unreadable: {e}")))?;
        let mut models = Vec::with_capacity(raw.gpus.len());
        for (key, g) in raw.gpus {
            models.push(convert_model(key, g)?);
        }
        Ok(Catalog { models })
    }

    pub fn models(&self) -> &[GpuModel] {
        &self.models
    }

    /// Resolve a model by catalog name, alias or PCI device id, also in the forms Kubernetes
    /// shows in `nvidia.com/gpu.product` (`NVIDIA-A100-SXM4-40GB`, `NVIDIA-H100-80GB-HBM3`,
    /// `NVIDIA-H100-NVL`, `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`, ...), case-insensitively.
    /// Unknown → error naming the model.
    pub fn model(&self, name: &str) -> CoreResult<&GpuModel> {
        let norm = normalize(name);
        if !norm.is_empty() {
            let exact = self.models.iter().find(|m| {
                normalize(&m.name) == norm
                    || m.aliases.iter().any(|a| normalize(a) == norm)
                    || m.pci_device_ids
                        .iter()
                        .any(|p| p.eq_ignore_ascii_case(&norm))
            });
            if let Some(m) = exact {
                return Ok(m);
            }
            if let Some(key) = family_rule(&norm) {
                if let Some(m) = self.models.iter().find(|m| m.name == key) {
                    return Ok(m);
                }
            }
        }
        let known: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
        Err(CoreError::new(
            "gpu_model",
            format!(
                "unknown MIG-capable GPU model {name:?} (known: {})",
                known.join(", ")
            ),
        ))
    }
}

/// Upper case, `-` for blanks and `_`, without a leading `NVIDIA-`, a `-MIG-<profile>` suffix
/// (GFD's single-strategy product label) or a `-SHARED` suffix (time-slicing).
fn normalize(name: &str) -> String {
    let mut s: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_whitespace() || c == '_' {
                '-'
            } else {
                c.to_ascii_uppercase()
            }
        })
        .collect();
    if let Some(rest) = s.strip_prefix("NVIDIA-") {
        s = rest.to_string();
    }
    if let Some(rest) = s.strip_suffix("-SHARED") {
        s = rest.to_string();
    }
    if let Some(i) = s.find("-MIG-") {
        s.truncate(i);
    }
    if s.ends_with("-MIG-INVALID") || s.ends_with("-MIG") {
        s.truncate(s.len() - 4);
    }
    s
}

/// Product names that are not spelled out in the data file, by GPU family and the memory size
/// in the name (e.g. `H100-PCIE` is the 80 GB part, `GH200-480GB` carries the 96 GB H100).
fn family_rule(norm: &str) -> Option<&'static str> {
    let tokens: Vec<&str> = norm.split('-').collect();
    let has = |t: &str| tokens.contains(&t);
    let mem = |prefix: &str| tokens.iter().any(|t| t.starts_with(prefix));
    if has("GH200") {
        return Some(if mem("144") {
            "GH200-144GB"
        } else {
            "H100-96GB"
        });
    }
    if has("H200") {
        return Some("H200-141GB");
    }
    if has("B200") {
        return Some("B200-180GB");
    }
    if has("H100") || has("H800") {
        return Some(if has("NVL") || mem("94") {
            "H100-94GB"
        } else if mem("96") {
            "H100-96GB"
        } else {
            "H100-80GB"
        });
    }
    if has("H20") {
        return Some("H100-96GB");
    }
    if has("A100") || has("A800") {
        if mem("80") {
            return Some("A100-80GB");
        }
        if mem("40") {
            return Some("A100-SXM4-40GB");
        }
        return None;
    }
    if has("A30") {
        return Some("A30-24GB");
    }
    None
}

// ---- the data file's schema --------------------------------------------------------------------

#[derive(Deserialize)]
struct RawFile {
    /// Kept in file order (serde_json's map is sorted; a Vec of pairs keeps the file's order).
    #[serde(deserialize_with = "ordered_map")]
    gpus: Vec<(String, RawGpu)>,
}

#[derive(Deserialize)]
struct RawGpu {
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    pci_device_ids: Vec<String>,
    memory_slices: u32,
    compute_slices: u32,
    profiles: Vec<RawProfile>,
    #[serde(default)]
    notes: Option<String>,
}

#[derive(Deserialize)]
struct RawProfile {
    name: String,
    id: u32,
    compute_slices: u32,
    memory_slices: u32,
    max_count: u32,
    placements: Vec<RawPlacement>,
    #[serde(default)]
    media_extensions: bool,
    #[serde(default)]
    provenance: Option<RawProvenance>,
}

#[derive(Deserialize)]
struct RawPlacement {
    start: u32,
    size: u32,
}

#[derive(Deserialize)]
struct RawProvenance {
    #[serde(default)]
    placements: Option<String>,
}

fn ordered_map<'de, D, V>(d: D) -> Result<Vec<(String, V)>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Visit<V>(std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Visit<V> {
        type Value = Vec<(String, V)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map of GPU model name to model")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut a: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = a.next_entry::<String, V>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    d.deserialize_map(Visit(std::marker::PhantomData))
}

/// `"A800-40GB (same gpu-operator device-filter group)"` → `"A800-40GB"`.
fn strip_remark(alias: &str) -> String {
    alias.split(" (").next().unwrap_or(alias).trim().to_string()
}

fn small(v: u32, field: impl Fn() -> String, max: u32) -> CoreResult<u8> {
    if v > max {
        return Err(CoreError::new(field(), format!("{v} is above {max}")));
    }
    Ok(v as u8)
}

/// One profile of a GPU with `memory_slices` and `compute_slices`: slices within the GPU's, a
/// count, and placements of its size inside the GPU, each listed once (sorted).
fn convert_profile(
    p: RawProfile,
    pf: impl Fn(&str) -> String,
    memory_slices: u8,
    compute_slices: u8,
) -> CoreResult<Profile> {
    let cs = small(
        p.compute_slices,
        || pf("compute_slices"),
        compute_slices as u32,
    )?;
    let ms = small(
        p.memory_slices,
        || pf("memory_slices"),
        memory_slices as u32,
    )?;
    let max_count = small(p.max_count, || pf("max_count"), 255)?;
    if cs == 0 || ms == 0 || max_count == 0 || p.placements.is_empty() {
        return Err(CoreError::new(
            pf("placements"),
            "a profile needs slices, a count and a placement",
        ));
    }
    let mut placements = Vec::with_capacity(p.placements.len());
    for (j, pl) in p.placements.iter().enumerate() {
        let plf = || pf(&format!("placements[{j}]"));
        if pl.size != p.memory_slices || pl.start + pl.size > memory_slices as u32 {
            return Err(CoreError::new(
                plf(),
                format!(
                    "{{start {}, size {}}} is not {} slices inside the GPU's {memory_slices}",
                    pl.start, pl.size, p.memory_slices
                ),
            ));
        }
        let placement = Placement {
            start: pl.start as u8,
            size: pl.size as u8,
        };
        if placements.contains(&placement) {
            return Err(CoreError::new(plf(), "listed twice"));
        }
        placements.push(placement);
    }
    placements.sort();
    let placements_inferred = p
        .provenance
        .and_then(|pv| pv.placements)
        .is_some_and(|s| s.trim_start().starts_with("inferred"));
    Ok(Profile {
        name: p.name,
        id: p.id,
        compute_slices: cs,
        memory_slices: ms,
        max_count,
        placements,
        media_extensions: p.media_extensions,
        placements_inferred,
    })
}

/// One GPU model of the data file: its slices, profiles (1..=`MAX_PROFILES`, names unique) and
/// aliases (parenthetical remarks removed).
fn convert_model(key: String, g: RawGpu) -> CoreResult<GpuModel> {
    let f = |s: &str| format!("gpus[{key:?}].{s}");
    let memory_slices = small(
        g.memory_slices,
        || f("memory_slices"),
        MAX_MEMORY_SLICES as u32,
    )?;
    let compute_slices = small(g.compute_slices, || f("compute_slices"), 255)?;
    if memory_slices == 0 || compute_slices == 0 {
        return Err(CoreError::new(
            f("memory_slices"),
            "a GPU has at least one slice",
        ));
    }
    if g.profiles.is_empty() || g.profiles.len() > MAX_PROFILES {
        return Err(CoreError::new(
            f("profiles"),
            format!("expected 1..={MAX_PROFILES} profiles"),
        ));
    }
    let mut profiles: Vec<Profile> = Vec::with_capacity(g.profiles.len());
    for (i, p) in g.profiles.into_iter().enumerate() {
        let pf = |s: &str| format!("gpus[{key:?}].profiles[{i}].{s}");
        if profiles.iter().any(|q| q.name == p.name) || p.name.is_empty() {
            return Err(CoreError::new(
                pf("name"),
                format!("duplicate or empty name {:?}", p.name),
            ));
        }
        profiles.push(convert_profile(p, pf, memory_slices, compute_slices)?);
    }
    let placements_inferred = profiles.iter().any(|p| p.placements_inferred);
    Ok(GpuModel {
        aliases: g.aliases.iter().map(|a| strip_remark(a)).collect(),
        pci_device_ids: g.pci_device_ids,
        name: key,
        memory_slices,
        compute_slices,
        profiles,
        placements_inferred,
        notes: g.notes.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &Catalog) -> Vec<&str> {
        c.models().iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn builtin_parses_every_model() {
        let c = Catalog::from_json(BUILTIN_JSON).unwrap();
        assert_eq!(
            names(&c),
            [
                "A100-SXM4-40GB",
                "A100-80GB",
                "A30-24GB",
                "H100-80GB",
                "H100-94GB",
                "H100-96GB",
                "H200-141GB",
                "GH200-144GB",
                "B200-180GB"
            ]
        );
        assert_eq!(Catalog::builtin(), &c);
        let a100 = c.model("A100-SXM4-40GB").unwrap();
        assert_eq!((a100.memory_slices, a100.compute_slices), (8, 7));
        assert!(!a100.placements_inferred);
        let p = &a100.profiles[a100.profile_index("3g.20gb").unwrap()];
        assert_eq!(
            (p.id, p.compute_slices, p.memory_slices, p.max_count),
            (9, 3, 4, 2)
        );
        assert_eq!(
            p.placements,
            [
                Placement { start: 0, size: 4 },
                Placement { start: 4, size: 4 }
            ]
        );
        let a30 = c.model("A30").unwrap();
        assert_eq!((a30.memory_slices, a30.compute_slices), (4, 4));
        assert!(!a30.placements_inferred);
        for inferred in ["A100-80GB", "H100-96GB", "GH200-144GB", "B200-180GB"] {
            assert!(c.model(inferred).unwrap().placements_inferred, "{inferred}");
        }
        for documented in [
            "A100-SXM4-40GB",
            "A30-24GB",
            "H100-80GB",
            "H100-94GB",
            "H200-141GB",
        ] {
            assert!(
                !c.model(documented).unwrap().placements_inferred,
                "{documented}"
            );
        }
    }

    #[test]
    fn kubernetes_product_names_resolve() {
        let c = Catalog::builtin();
        for (label, want) in [
            ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
            ("nvidia-a100-sxm4-40gb", "A100-SXM4-40GB"),
            ("A100-PCIE-40GB", "A100-SXM4-40GB"),
            ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-SXM4-40GB"),
            ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
            ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
            ("NVIDIA-A800-SXM4-80GB", "A100-80GB"),
            ("NVIDIA-A30", "A30-24GB"),
            ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
            ("NVIDIA-H100-PCIe", "H100-80GB"),
            ("NVIDIA-H100-NVL", "H100-94GB"),
            ("H100 NVL", "H100-94GB"),
            ("NVIDIA-H200", "H200-141GB"),
            ("NVIDIA-H200-NVL", "H200-141GB"),
            ("NVIDIA-GH200-480GB", "H100-96GB"),
            ("NVIDIA-GH200-144G-HBM3e", "GH200-144GB"),
            ("NVIDIA-B200", "B200-180GB"),
            ("0x233010de", "H100-80GB"),
            ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED", "H100-80GB"),
        ] {
            assert_eq!(c.model(label).map(|m| m.name.as_str()), Ok(want), "{label}");
        }
        for bad in ["", "T4", "NVIDIA-A100", "NVIDIA-L40S", "A10"] {
            let e = c.model(bad).unwrap_err();
            assert_eq!(e.field, "gpu_model");
            assert!(e.message.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn profile_names() {
        let m = Catalog::builtin().model("A100-SXM4-40GB").unwrap();
        let me = m.profile_index("1g.5gb+me").unwrap();
        assert!(m.profiles[me].media_extensions);
        assert_eq!(m.profiles[me].base_name(), "1g.5gb");
        assert_eq!(m.profile_index("nvidia.com/mig-1g.5gb.me"), Ok(me));
        assert_eq!(m.profile_index("3G.20GB"), m.profile_index("3g.20gb"));
        let e = m.profile_index("3g.40gb").unwrap_err();
        assert_eq!(e.field, "profile");
        assert!(e.message.contains("\"3g.40gb\"") && e.message.contains("A100-SXM4-40GB"));
    }

    #[test]
    fn bad_catalogs_are_errors() {
        assert!(Catalog::from_json("{").is_err());
        let bad = r#"{"gpus": {"X": {"memory_slices": 8, "compute_slices": 7, "profiles": [
            {"name": "1g", "id": 1, "compute_slices": 1, "memory_slices": 1, "max_count": 1,
             "placements": [{"start": 8, "size": 1}]}]}}}"#;
        let e = Catalog::from_json(bad).unwrap_err();
        assert!(e.field.contains("placements[0]"), "{e}");
        let big = bad.replace("\"memory_slices\": 8", "\"memory_slices\": 99");
        assert!(Catalog::from_json(&big).is_err());
    }
}
