//! Tenants, their approval policies and quotas.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A tenant to create.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewTenant {
    /// Unique name: 1-63 characters of `a-z`, `0-9` and `-`, not starting with `-`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$"))]
    pub name: String,
    /// Approve requests within quota without an admin.
    #[serde(default)]
    pub auto_approve: bool,
    /// Largest request (weighted compute slices) approved automatically.
    #[serde(default)]
    pub auto_approve_max_compute_slices: u32,
}

/// A tenant's approval policy, replaced whole (absent fields take the same defaults as at creation).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    /// Approve requests within quota without an admin.
    #[serde(default)]
    pub auto_approve: bool,
    /// Largest request (weighted compute slices) approved automatically.
    #[serde(default)]
    pub auto_approve_max_compute_slices: u32,
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TenantView {
    /// Id (UUIDv7).
    pub id: String,
    /// Unique name.
    pub name: String,
    /// Whether requests within quota are approved automatically.
    pub auto_approve: bool,
    /// Largest request approved automatically, in weighted compute slices.
    pub auto_approve_max_compute_slices: u32,
    /// Creation time, UTC milliseconds.
    pub created_at_ms: i64,
    /// The cohort (id) it lends to and borrows from, if any.
    #[serde(default)]
    pub cohort: Option<String>,
    /// Its weight in sharing borrowed capacity: of two tenants borrowing, the one borrowing most for its weight
    /// gives back first.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// New limits, by resource (`mig/<model>/<profile>`, `gpu/<model>`, `timeslice/<model>`, `mps/<model>`,
/// `compute_slices`, `memory_gib`); amounts may be fractional (`1.75`). `null` removes a limit, leaving the
/// resource unlimited; limits not named are left as they are.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QuotaUpdate {
    /// Resource -> limit (the tenant's guarantee), or `null` to remove it.
    #[serde(default)]
    pub limits: BTreeMap<String, Option<f64>>,
    /// Resource -> the most the tenant may hold by borrowing from its cohort (at least the guarantee), or `null`
    /// for none (the guarantee is the most). The resource needs a limit.
    #[serde(default)]
    pub maximums: BTreeMap<String, Option<f64>>,
    /// Resource -> the most of its unused guarantee the tenant lends to its cohort, or `null` for all of it. The
    /// resource needs a limit.
    #[serde(default)]
    pub lending_limits: BTreeMap<String, Option<f64>>,
    /// Why (kept in the limits' history; 0-2000 characters).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 2000))]
    pub reason: String,
}

/// A tenant's quota: every limited or held resource.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaView {
    /// Tenant id.
    pub tenant: String,
    /// One line per resource.
    pub resources: Vec<QuotaLine>,
}

/// One resource of a quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaLine {
    /// Resource key.
    pub resource: String,
    /// Limit, if any (unlimited otherwise): what the tenant is guaranteed.
    pub limit: Option<f64>,
    /// Held by pending, approved, provisioning and active requests.
    pub held: f64,
    /// Whether more is held than the limit allows (after a limit was lowered or a temporary increase ended):
    /// new requests charging this resource are refused until it is back under. In a cohort, the maximum is the
    /// bound.
    pub over: bool,
    /// The most the tenant may hold by borrowing from its cohort, if set.
    #[serde(default)]
    pub maximum: Option<f64>,
    /// The most of its unused guarantee it lends, if set (otherwise all of it).
    #[serde(default)]
    pub lending_limit: Option<f64>,
    /// In a cohort, what it holds above its guarantee up to its maximum, borrowed from the other members. Always 0
    /// outside a cohort: holding more than the limit there is being `over` it.
    #[serde(default)]
    pub borrowed: f64,
    /// How much more it may take now, borrowing included: up to its maximum, and above its guarantee only what the
    /// other tenants of its cohort can lend (`None`: unlimited).
    #[serde(default)]
    pub available: Option<f64>,
}
