//! Cohorts: tenants that lend each other what they guarantee but do not use.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A cohort to create.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewCohort {
    /// Unique name: 1-63 characters of `a-z`, `0-9` and `-`, not starting with `-`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$"))]
    pub name: String,
    /// Seconds between telling holders their borrowed slices are taken back and releasing them (0 to 7 days;
    /// default 600).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 604_800))]
    pub grace_s: Option<u32>,
}

/// A change to a cohort.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CohortUpdate {
    /// New grace period in seconds (0 to 7 days); deadlines already given stand.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 604_800))]
    pub grace_s: u32,
}

/// A tenant's place in a cohort.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CohortMembership {
    /// The cohort's id or name; `null` takes the tenant out of its cohort. Required, so that a body naming only the
    /// weight never takes a tenant out by accident.
    #[serde(deserialize_with = "present")]
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub cohort: Option<String>,
    /// Weight in sharing borrowed capacity (1-1000, default 1).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub weight: Option<u32>,
}

/// A cohort, with what each member guarantees, holds, borrows and lends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CohortView {
    /// Id (UUIDv7).
    pub id: String,
    /// Unique name.
    pub name: String,
    /// Grace period in seconds.
    pub grace_s: u32,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// Members, by name.
    pub members: Vec<CohortMember>,
    /// Resource -> what the members borrow beyond what the others can lend: borrowed slices are being taken back
    /// to cover it. Empty when the cohort is balanced.
    pub deficits: BTreeMap<String, f64>,
}

/// One member of a cohort.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CohortMember {
    /// Tenant id.
    pub tenant: String,
    /// Tenant name.
    pub name: String,
    /// Weight.
    pub weight: u32,
    /// One line per limited resource.
    pub resources: Vec<CohortLine>,
}

/// One resource of a cohort member.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CohortLine {
    /// Resource key.
    pub resource: String,
    /// Guarantee (the limit).
    pub guaranteed: f64,
    /// The most it may hold by borrowing.
    pub maximum: f64,
    /// Held by its live requests.
    pub held: f64,
    /// Held above the guarantee.
    pub borrowed: f64,
    /// Guaranteed but not held, up to its lending limit: what it can lend now.
    pub lendable: f64,
}

/// A field that must be present, `null` allowed.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d)
}
