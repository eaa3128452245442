//! Quota arithmetic: the resources a tenant's quota names, what a request charges to each, and whether a request
//! fits under the limits given what the tenant already holds.
//!
//! Resources (keys as written in the API, matched case-insensitively):
//! - `mig/<model>/<profile>`: MIG instances of one profile on one model, counted in instances;
//! - `gpu/<model>`: whole GPUs (exclusive), counted in GPUs;
//! - `timeslice/<model>`, `mps/<model>`: shares of whole GPUs, counted in shares;
//! - `compute_slices`: the weighted aggregate of compute: a MIG instance weighs its compute slices, a whole GPU its
//!   model's total, a share its GPU's total divided by the replicas;
//! - `memory_gib`: the weighted aggregate of memory in GiB, weighed the same way.
//!
//! Amounts are kept in thousandths ([`Milli`]) so that a quarter of a 7-slice GPU weighs exactly 1.75 compute slices;
//! fractions round up, so a request is never charged less than it takes. A MIG request that names no model charges
//! the aggregates at its most expensive candidate model (its per-model `mig/...` resource is charged once placement
//! fixes the model).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::{Catalog, GpuModel};
use crate::request::SliceSpec;

/// An amount in thousandths of a unit.
pub type Milli = u64;

/// Thousandths in one unit.
pub const MILLI: Milli = 1000;

/// A resource a quota can limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// Instances of one MIG profile on one model.
    Mig {
        /// Catalog model key.
        model: String,
        /// Profile name.
        profile: String,
    },
    /// Whole GPUs of a model.
    Gpu {
        /// Catalog model key.
        model: String,
    },
    /// Time-slice shares on GPUs of a model.
    Timeslice {
        /// Catalog model key.
        model: String,
    },
    /// MPS clients on GPUs of a model.
    Mps {
        /// Catalog model key.
        model: String,
    },
    /// Weighted compute slices over everything.
    ComputeSlices,
    /// Weighted memory in GiB over everything.
    MemoryGib,
}

impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Mig { model, profile } => write!(f, "mig/{model}/{profile}"),
            Resource::Gpu { model } => write!(f, "gpu/{model}"),
            Resource::Timeslice { model } => write!(f, "timeslice/{model}"),
            Resource::Mps { model } => write!(f, "mps/{model}"),
            Resource::ComputeSlices => f.write_str("compute_slices"),
            Resource::MemoryGib => f.write_str("memory_gib"),
        }
    }
}

impl Serialize for Resource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Resource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Resource::parse(Catalog::builtin(), &text).map_err(serde::de::Error::custom)
    }
}

impl Resource {
    /// What people call the resource, and the unit of its amounts: `("Compute slices", "slices")`,
    /// `("GPU memory", "GiB")`, `("H100-80GB 1g.10gb instances", "instances")`, ...
    pub fn describe(&self) -> (String, &'static str) {
        match self {
            Resource::Mig { model, profile } => (format!("{model} {profile} instances"), "instances"),
            Resource::Gpu { model } => (format!("Whole {model} GPUs"), "GPUs"),
            Resource::Timeslice { model } => (format!("{model} time-slice shares"), "shares"),
            Resource::Mps { model } => (format!("{model} MPS clients"), "clients"),
            Resource::ComputeSlices => ("Compute slices".to_string(), "slices"),
            Resource::MemoryGib => ("GPU memory".to_string(), "GiB"),
        }
    }

    /// Parses a resource key against the catalog, canonicalising model keys and profile names.
    pub fn parse(catalog: &Catalog, text: &str) -> Result<Resource, QuotaError> {
        let bad = |why: String| QuotaError::BadResource { resource: text.to_string(), why };
        let model = |m: &str| catalog.resolve(m).map(|(m, _)| m).ok_or_else(|| bad(format!("unknown GPU model `{m}`")));
        let parts: Vec<&str> = text.trim().split('/').collect();
        match parts.as_slice() {
            [k] if k.eq_ignore_ascii_case("compute_slices") => Ok(Resource::ComputeSlices),
            [k] if k.eq_ignore_ascii_case("memory_gib") => Ok(Resource::MemoryGib),
            [k, m, p] if k.eq_ignore_ascii_case("mig") => {
                let m = model(m)?;
                let p = m.profile(p).ok_or_else(|| bad(format!("{} has no MIG profile `{p}`", m.key)))?;
                Ok(Resource::Mig { model: m.key.clone(), profile: p.name.clone() })
            }
            [k, m] if k.eq_ignore_ascii_case("gpu") => Ok(Resource::Gpu { model: model(m)?.key.clone() }),
            [k, m] if k.eq_ignore_ascii_case("timeslice") => Ok(Resource::Timeslice { model: model(m)?.key.clone() }),
            [k, m] if k.eq_ignore_ascii_case("mps") => Ok(Resource::Mps { model: model(m)?.key.clone() }),
            _ => Err(bad(
                "expected mig/<model>/<profile>, gpu/<model>, timeslice/<model>, mps/<model>, compute_slices or memory_gib"
                    .to_string(),
            )),
        }
    }
}

/// Amounts per resource, in thousandths.
pub type Usage = BTreeMap<Resource, Milli>;

/// Quota problems.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// A resource key that names nothing.
    #[error("`{resource}` is not a quota resource: {why}")]
    BadResource {
        /// The key given.
        resource: String,
        /// Why not.
        why: String,
    },
    /// A request that cannot be charged (unknown model or profile, bad replicas).
    #[error("{0}")]
    BadRequest(String),
    /// The request would take a resource over its limit.
    #[error("{resource}: {} held + {} requested would exceed the limit of {}", show(*held), show(*requested), show(*limit))]
    Exceeded {
        /// The resource.
        resource: Resource,
        /// Its limit.
        limit: Milli,
        /// Already held (pending, approved, provisioning, active).
        held: Milli,
        /// Asked for.
        requested: Milli,
    },
    /// The request would borrow above the tenant's guarantee more than its cohort has to lend.
    #[error(
        "{resource}: {} held + {} requested would borrow above the guarantee of {}, and the cohort has {} to lend",
        show(*held), show(*requested), show(*guaranteed), show(*available)
    )]
    NothingToBorrow {
        /// The resource.
        resource: Resource,
        /// The tenant's guarantee.
        guaranteed: Milli,
        /// Already held.
        held: Milli,
        /// Asked for.
        requested: Milli,
        /// What the other members can lend now.
        available: Milli,
    },
}

impl QuotaError {
    /// The error in people's words, resources by name and amounts with their unit: `Compute slices: 3 held and 5
    /// asked for would pass the limit of 7 slices.` (The `Display` text keeps the resource key, for logs and the API.)
    pub fn in_words(&self) -> String {
        match self {
            QuotaError::Exceeded { resource, limit, held, requested } => {
                let (name, unit) = resource.describe();
                let n = |m: Milli| show_places(m, 1);
                format!(
                    "{name}: {} held and {} asked for would pass the limit of {} {unit}.",
                    n(*held),
                    n(*requested),
                    n(*limit)
                )
            }
            QuotaError::NothingToBorrow { resource, guaranteed, held, requested, available } => {
                let (name, unit) = resource.describe();
                let n = |m: Milli| show_places(m, 1);
                format!(
                    "{name}: {} held and {} asked for would pass the guarantee of {} {unit}, and the other tenants \
                     of the cohort have {} {unit} to lend now.",
                    n(*held),
                    n(*requested),
                    n(*guaranteed),
                    n(*available)
                )
            }
            other => other.to_string(),
        }
    }

    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            QuotaError::BadResource { .. } => "quota_bad_resource",
            QuotaError::BadRequest(_) => "request_invalid",
            QuotaError::Exceeded { .. } => "quota_exceeded",
            QuotaError::NothingToBorrow { .. } => "quota_nothing_to_borrow",
        }
    }
}

/// Formats thousandths as a decimal with no trailing zeros: 1750 -> `1.75`, 2000 -> `2`.
pub fn show(m: Milli) -> String {
    show_places(m, 3)
}

/// `m` with at most `places` decimals (rounded), without trailing zeros: `19.625` GiB is `19.6` at one place.
pub fn show_places(m: Milli, places: u32) -> String {
    let places = places.min(3);
    let step = 10_u64.pow(3 - places);
    let m = m.saturating_add(step / 2) / step * step;
    show_exact(m)
}

fn show_exact(m: Milli) -> String {
    let (whole, frac) = (m / MILLI, m % MILLI);
    if frac == 0 { whole.to_string() } else { format!("{whole}.{}", format!("{frac:03}").trim_end_matches('0')) }
}

/// `a * b / c`, rounded up, in u128 so nothing overflows.
fn mul_div_ceil(a: u64, b: u64, c: u64) -> Milli {
    let (a, b, c) = (u128::from(a), u128::from(b), u128::from(c.max(1)));
    ((a * b).div_ceil(c)).min(u128::from(u64::MAX)) as Milli
}

/// Memory of a whole GPU in MiB: observed where known, else nominal GB as GiB.
fn gpu_memory_mib(m: &GpuModel) -> u64 {
    m.total_memory_mib_observed.map_or(u64::from(m.total_memory_gb_nominal) * 1024, u64::from)
}

/// Memory of a MIG profile in MiB: known, or the model's memory times the profile's share of memory slices.
fn profile_memory_mib(m: &GpuModel, p: &crate::catalog::Profile) -> u64 {
    p.memory_mib.map_or_else(
        || gpu_memory_mib(m) * u64::from(p.memory_slices) / u64::from(m.memory_slices_total.max(1)),
        u64::from,
    )
}

/// What `count` slices of `spec` charge to each resource.
pub fn charge(catalog: &Catalog, spec: &SliceSpec, count: u32) -> Result<Usage, QuotaError> {
    let bad = QuotaError::BadRequest;
    let model = |m: &str| catalog.resolve(m).map(|(m, _)| m).ok_or_else(|| bad(format!("unknown GPU model `{m}`")));
    let n = u64::from(count);
    let mut usage = Usage::new();
    let mut aggregates = |compute_milli: Milli, memory_mib_milli: Milli| {
        usage.insert(Resource::ComputeSlices, compute_milli);
        usage.insert(Resource::MemoryGib, memory_mib_milli.div_ceil(1024));
    };
    match spec {
        SliceSpec::Mig { profile, model: Some(m) } => {
            let m = model(m)?;
            let p = m.profile(profile).ok_or_else(|| bad(format!("{} has no MIG profile `{profile}`", m.key)))?;
            aggregates(n * u64::from(p.compute_slices) * MILLI, n * profile_memory_mib(m, p) * MILLI);
            usage.insert(Resource::Mig { model: m.key.clone(), profile: p.name.clone() }, n * MILLI);
        }
        SliceSpec::Mig { profile, model: None } => {
            let costs = catalog
                .models
                .iter()
                .filter_map(|m| m.profile(profile).map(|p| (u64::from(p.compute_slices), profile_memory_mib(m, p))));
            let (compute, memory) = costs
                .fold(None, |acc: Option<(u64, u64)>, (c, mem)| {
                    Some(acc.map_or((c, mem), |(ac, am)| (ac.max(c), am.max(mem))))
                })
                .ok_or_else(|| bad(format!("no GPU model has a MIG profile `{profile}`")))?;
            aggregates(n * compute * MILLI, n * memory * MILLI);
        }
        SliceSpec::Exclusive { model: m } => {
            let m = model(m)?;
            aggregates(n * u64::from(m.compute_slices_total) * MILLI, n * gpu_memory_mib(m) * MILLI);
            usage.insert(Resource::Gpu { model: m.key.clone() }, n * MILLI);
        }
        SliceSpec::Timeslice { model: m, replicas } | SliceSpec::Mps { model: m, replicas } => {
            let m = model(m)?;
            let (min, max, resource) = match spec {
                SliceSpec::Mps { .. } => (2, crate::sharing::MPS_MAX_CLIENTS, Resource::Mps { model: m.key.clone() }),
                _ => (2, crate::sharing::TIMESLICE_MAX_REPLICAS, Resource::Timeslice { model: m.key.clone() }),
            };
            if !(min..=max).contains(replicas) {
                return Err(bad(format!("replicas must be between {min} and {max}, got {replicas}")));
            }
            let r = u64::from(*replicas);
            aggregates(
                mul_div_ceil(n * MILLI, u64::from(m.compute_slices_total), r),
                mul_div_ceil(n * MILLI, gpu_memory_mib(m), r),
            );
            usage.insert(resource, n * MILLI);
        }
    }
    Ok(usage)
}

/// The metering weight of one allocation, in compute slices: a MIG instance weighs its profile's compute slices, a
/// whole GPU all of its model's, and a time-slice or MPS share of a GPU that divided by the replica count.
/// `profile` is the MIG profile, or the sharing key (`exclusive`, `timeslice:4`, `mps:2`) of a whole-GPU share.
pub fn weight(model: &GpuModel, profile: &str) -> Option<f64> {
    if let Some(p) = model.profile(profile) {
        return Some(f64::from(p.compute_slices));
    }
    let sharing = crate::sharing::Sharing::from_key(profile)?;
    Some(f64::from(model.compute_slices_total) / f64::from(sharing.replicas().max(1)))
}

/// Adds `add` into `into`.
pub fn accumulate(into: &mut Usage, add: &Usage) {
    for (r, a) in add {
        let e = into.entry(r.clone()).or_default();
        *e = e.saturating_add(*a);
    }
}

/// Checks that `held + requested` stays within every limit that names a resource the request charges. Returns
/// every limit that would be exceeded. Resources without a limit are unlimited.
pub fn check(limits: &Usage, held: &Usage, requested: &Usage) -> Result<(), Vec<QuotaError>> {
    let errors: Vec<QuotaError> = requested
        .iter()
        .filter(|(_, amount)| **amount > 0)
        .filter_map(|(resource, &amount)| {
            let limit = *limits.get(resource)?;
            let have = held.get(resource).copied().unwrap_or(0);
            (have.saturating_add(amount) > limit).then(|| QuotaError::Exceeded {
                resource: resource.clone(),
                limit,
                held: have,
                requested: amount,
            })
        })
        .collect();
    if errors.is_empty() { Ok(()) } else { Err(errors) }
}

/// A tenant's approval policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPolicy {
    /// Whether requests within quota may be approved without an admin.
    pub auto_approve: bool,
    /// Largest request (in weighted compute slices) that is auto-approved.
    pub auto_approve_max_compute_slices: u32,
}

/// What happens to a request that fits the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Approved at once.
    AutoApprove,
    /// Waits for an admin.
    NeedsAdmin,
}

impl ApprovalPolicy {
    /// Decides for a request that fits the quota, by its weighted size.
    pub fn decide(&self, requested: &Usage) -> Decision {
        let compute = requested.get(&Resource::ComputeSlices).copied().unwrap_or(0);
        if self.auto_approve && compute <= u64::from(self.auto_approve_max_compute_slices) * MILLI {
            Decision::AutoApprove
        } else {
            Decision::NeedsAdmin
        }
    }
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn amounts_and_resources_read_naturally() {
        assert_eq!(show(19_625), "19.625");
        let over =
            QuotaError::Exceeded { resource: Resource::MemoryGib, limit: 40_000, held: 19_625, requested: 39_250 };
        assert_eq!(over.in_words(), "GPU memory: 19.6 held and 39.3 asked for would pass the limit of 40 GiB.");
        assert!(over.to_string().starts_with("memory_gib: "), "the API's text keeps the key");
        assert_eq!(show_places(19_625, 1), "19.6");
        assert_eq!(show_places(19_650, 1), "19.7");
        assert_eq!(show_places(2_000, 1), "2");
        assert_eq!(show_places(u64::MAX, 0), show_exact(u64::MAX / 1000 * 1000));
        assert_eq!(Resource::MemoryGib.describe(), ("GPU memory".to_string(), "GiB"));
        let mig = Resource::Mig { model: "H100-80GB".into(), profile: "1g.10gb".into() };
        assert_eq!(mig.describe().0, "H100-80GB 1g.10gb instances");
    }
}
