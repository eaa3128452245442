//! What the store reads and writes: tenants, requests, users and principals, nodes and GPUs, allocations, layout
//! proposals, audit entries, and the inputs of the writing methods.

use serde::{Deserialize, Serialize};
use tessera_api::Role;
use tessera_core::cohort::Priority;
use tessera_core::layout::PlacedInstance;
use tessera_core::quota::{ApprovalPolicy, Usage};
use tessera_core::request::{RequestState, SliceSpec};

use super::{StoreError, new_id, spec_from, state_from};

/// A tenant (team).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// UUIDv7.
    pub id: String,
    /// Unique name.
    pub name: String,
    /// How its requests are approved.
    pub policy: ApprovalPolicy,
    /// Creation time, UTC milliseconds.
    pub created_at_ms: i64,
    /// The cohort it lends to and borrows from, if any.
    #[serde(default)]
    pub cohort_id: Option<String>,
    /// Its weight in sharing borrowed capacity (1 to `tessera_core::cohort::MAX_WEIGHT`).
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// A slice request as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliceRequest {
    /// UUIDv7.
    pub id: String,
    /// Owning tenant.
    pub tenant_id: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Where it is in its life.
    pub state: RequestState,
    /// Why it was asked for, or why it was rejected.
    pub reason: String,
    /// Bumped on every change; clients send it back (`If-Match`) to change it.
    pub version: i64,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub updated_at_ms: i64,
    /// How long the slices are wanted once active, in seconds (`None`: until released).
    pub duration_s: Option<u64>,
    /// When an active request with a duration expires, UTC milliseconds.
    pub expires_at_ms: Option<i64>,
    /// Its priority within its tenant.
    #[serde(default)]
    pub priority: Priority,
    /// It holds more than its tenant's guarantee, borrowed from the tenant's cohort.
    #[serde(default)]
    pub borrowed: bool,
    /// When it is released because a lender needs its guarantee back, UTC milliseconds.
    #[serde(default)]
    pub reclaim_at_ms: Option<i64>,
    /// The tenant (id) it is reclaimed for.
    #[serde(default)]
    pub reclaim_for: Option<String>,
}

/// A request row (the columns of `writes::REQUEST_COLUMNS`, or on SQLite an array of `writes::REQUEST_JSON`); the
/// spec is JSON.
#[derive(Debug, sqlx::FromRow, serde::Deserialize)]
pub(crate) struct RequestRow {
    id: String,
    tenant_id: String,
    spec: String,
    count: i64,
    state: String,
    reason: String,
    version: i64,
    created_at_ms: i64,
    updated_at_ms: i64,
    duration_s: Option<i64>,
    expires_at_ms: Option<i64>,
    priority: String,
    #[serde(deserialize_with = "crate::json_rows::flag")]
    borrowed: bool,
    reclaim_at_ms: Option<i64>,
    reclaim_for: Option<String>,
}

pub(crate) fn request_from(row: RequestRow) -> Result<SliceRequest, StoreError> {
    let RequestRow {
        id,
        tenant_id,
        spec,
        count,
        state,
        reason,
        version,
        created_at_ms,
        updated_at_ms,
        duration_s,
        expires_at_ms,
        priority,
        borrowed,
        reclaim_at_ms,
        reclaim_for,
    } = row;
    let priority = Priority::parse(&priority).ok_or_else(|| StoreError::Corrupt(format!("priority `{priority}`")))?;
    Ok(SliceRequest {
        id,
        tenant_id,
        spec: spec_from(&spec)?,
        count: u32::try_from(count).map_err(|_| StoreError::Corrupt(format!("request count {count}")))?,
        state: state_from(&state)?,
        reason,
        version,
        created_at_ms,
        updated_at_ms,
        duration_s: duration_s.and_then(|d| u64::try_from(d).ok()),
        expires_at_ms,
        priority,
        borrowed,
        reclaim_at_ms,
        reclaim_for,
    })
}

/// When a request moving to `state` at `now` expires: an active request with a duration expires after it.
pub(crate) fn expiry(state: RequestState, duration_s: Option<u64>, now: i64, current: Option<i64>) -> Option<i64> {
    match (state, duration_s) {
        (RequestState::Active, Some(d)) => Some(now.saturating_add(i64::try_from(d).unwrap_or(i64::MAX / 1000) * 1000)),
        _ => current,
    }
}

/// A person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// UUIDv7.
    pub id: String,
    /// Unique name (login or e-mail).
    pub name: String,
    /// Manages every tenant, quota and approval.
    pub platform_admin: bool,
    /// UTC milliseconds.
    pub created_at_ms: i64,
}

/// A stored role name as a [`Role`].
pub(crate) fn role_from(text: &str) -> Result<Role, StoreError> {
    text.parse().map_err(|_| StoreError::Corrupt(format!("role `{text}`")))
}

/// Who is acting: a user, with the tenants they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user.
    pub user: User,
    /// `(tenant id, role)` per membership.
    pub memberships: Vec<(String, Role)>,
}

impl Principal {
    /// The user's role in `tenant_id`, if any.
    pub fn role_in(&self, tenant_id: &str) -> Option<Role> {
        self.memberships.iter().find(|(t, _)| t == tenant_id).map(|&(_, r)| r)
    }

    /// Whether the user may see `tenant_id`'s objects.
    pub fn can_see(&self, tenant_id: &str) -> bool {
        self.user.platform_admin || self.role_in(tenant_id).is_some()
    }

    /// Audit-log actor name.
    pub fn actor(&self) -> String {
        format!("user:{}", self.user.name)
    }
}

/// A GPU node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// UUIDv7.
    pub id: String,
    /// Unique name (host name).
    pub name: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// Its GPUs, by index.
    pub gpus: Vec<Gpu>,
}

/// A GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// UUIDv7.
    pub id: String,
    /// Node id.
    pub node_id: String,
    /// Index on the node (as NVML numbers them).
    pub index: u32,
    /// NVML UUID (`GPU-...`).
    pub uuid: String,
    /// Catalog model key.
    pub model: String,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// A cordoned GPU gets nothing new.
    pub cordoned: bool,
    /// Current MIG instances.
    pub layout: Vec<tessera_core::layout::PlacedInstance>,
    /// Bumped on every layout change.
    pub layout_version: i64,
    /// Layout changes for this GPU apply without an admin's approval.
    pub auto_layout: bool,
    /// Its health as last judged.
    pub health: GpuHealth,
}

/// A GPU's drain for maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct DrainRecord {
    /// The GPU.
    pub gpu_id: String,
    /// When its holders' slices end at the latest.
    pub deadline_ms: i64,
    /// When it started.
    pub started_ms: i64,
    /// Who started it.
    pub started_by: String,
    /// Why.
    pub reason: String,
    /// When it held nothing any more.
    pub drained_at_ms: Option<i64>,
}

/// A GPU's health as the server judged it from its agent's reports ([`tessera_core::health::judge`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// The state.
    pub state: tessera_core::health::HealthState,
    /// Why, worst first.
    pub findings: Vec<tessera_core::health::Finding>,
    /// Since when (`None`: healthy since it joined).
    pub since_ms: Option<i64>,
}

/// A slice of a request bound to an exact MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// UUIDv7.
    pub id: String,
    /// The request it serves.
    pub request_id: String,
    /// The request's tenant.
    pub tenant_id: String,
    /// The GPU.
    pub gpu_id: String,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// `reserved` (approved, not in use yet), `active` or `released`.
    pub state: String,
    /// The layout proposal that creates its instance, when it does not exist yet.
    pub proposal_id: Option<String>,
}

/// A new layout for one GPU, waiting for an admin or already decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutProposal {
    /// UUIDv7.
    pub id: String,
    /// The GPU.
    pub gpu_id: String,
    /// The GPU's layout version it was planned on; it applies only on that version.
    pub base_version: i64,
    /// The complete new layout.
    pub layout: Vec<PlacedInstance>,
    /// Instances it creates.
    pub created: Vec<PlacedInstance>,
    /// Instances it destroys (never one in use).
    pub destroyed: Vec<PlacedInstance>,
    /// `proposed`, `approved` or `rejected`.
    pub state: String,
    /// Why it was rejected.
    pub reason: String,
    /// Who caused it (the approver of the request).
    pub created_by: String,
    /// Who decided it.
    pub decided_by: Option<String>,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// When it was decided, UTC milliseconds.
    pub decided_at_ms: Option<i64>,
}

/// A layout change an approval needs.
#[derive(Debug, Clone)]
pub struct LayoutChange {
    /// The GPU.
    pub gpu_id: String,
    /// Its layout version the plan is based on.
    pub base_version: i64,
    /// The complete new layout.
    pub layout: Vec<PlacedInstance>,
    /// Instances created.
    pub created: Vec<PlacedInstance>,
    /// Instances destroyed.
    pub destroyed: Vec<PlacedInstance>,
    /// Apply now (the GPU has auto-layout) rather than propose.
    pub auto_apply: bool,
}

/// An instance an approval reserves for one slice.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The GPU.
    pub gpu_id: String,
    /// Profile name.
    pub profile: String,
    /// Start unit.
    pub start: u8,
    /// Index into the approval's changes of the one that creates the instance, if it does not exist yet.
    pub change: Option<usize>,
}

/// A GPU to register.
#[derive(Debug, Clone)]
pub struct NewGpu {
    /// Index on the node.
    pub index: u32,
    /// NVML UUID.
    pub uuid: String,
    /// Catalog model key (already resolved).
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// Current MIG instances (already validated).
    pub layout: Vec<tessera_core::layout::PlacedInstance>,
}

/// What an approval's placement was checked against: the reservation calendar's version it read (the approval
/// commits only if no reservation was accepted since), and the time the request must end by so that it leaves an
/// accepted reservation its room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guard {
    /// `reservation_calendar.bookings_version` as read before placing.
    pub bookings_version: i64,
    /// The request ends by then at the latest, UTC milliseconds.
    pub ends_by_ms: Option<i64>,
}

/// A request to create.
#[derive(Debug, Clone, Copy)]
pub struct NewRequest<'a> {
    /// Owning tenant.
    pub tenant_id: &'a str,
    /// What one slice is.
    pub spec: &'a SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Why.
    pub reason: &'a str,
    /// What it charges (from `tessera_core::quota::charge`).
    pub charge: &'a Usage,
    /// Initial state: `pending`, or `approved` where the tenant's policy auto-approves.
    pub state: RequestState,
    /// Who asks (for the audit log).
    pub actor: &'a str,
    /// `(user id, Idempotency-Key)`: a retry with the same key returns the first request instead of a new one.
    pub idempotency: Option<(&'a str, &'a str)>,
    /// How long the slices are wanted once active, in seconds.
    pub duration_s: Option<u64>,
    /// Its priority within its tenant.
    pub priority: Priority,
    /// The active request of the same tenant it replaces: released in the transaction that makes this one active.
    pub replaces: Option<&'a str>,
}

impl NewRequest<'_> {
    /// The request as stored when it is created at `now`.
    pub(super) fn to_request(self, now: i64) -> SliceRequest {
        SliceRequest {
            id: new_id(),
            tenant_id: self.tenant_id.to_string(),
            spec: self.spec.clone(),
            count: self.count,
            state: self.state,
            reason: self.reason.to_string(),
            version: 1,
            created_at_ms: now,
            updated_at_ms: now,
            duration_s: self.duration_s,
            expires_at_ms: None,
            priority: self.priority,
            borrowed: false,
            reclaim_at_ms: None,
            reclaim_for: None,
        }
    }
}

/// Which requests to list, oldest first.
#[derive(Debug, Clone, Copy)]
pub struct RequestFilter<'a> {
    /// Only this tenant's.
    pub tenant: Option<&'a str>,
    /// Only in this state.
    pub state: Option<RequestState>,
    /// Only after this id (the cursor): later ids oldest first, earlier ones newest first.
    pub after: Option<&'a str>,
    /// At most this many.
    pub limit: u32,
    /// `Some(true)`: only live requests (pending to active); `Some(false)`: only ended ones.
    pub open: Option<bool>,
    /// Newest first (by id, a UUIDv7: by creation time).
    pub newest_first: bool,
}

impl RequestFilter<'_> {
    /// SQL conditions and their values, numbered from `$1`.
    pub(crate) fn conditions(&self) -> (String, Vec<String>) {
        let mut sql = String::new();
        let mut values = Vec::new();
        for (column, op, value) in [
            ("tenant_id", "=", self.tenant.map(str::to_string)),
            ("state", "=", self.state.map(|s| s.as_str().to_string())),
            ("id", if self.newest_first { "<" } else { ">" }, self.after.map(str::to_string)),
        ] {
            if let Some(v) = value {
                values.push(v);
                sql.push_str(&format!(" AND {column} {op} ${}", values.len()));
            }
        }
        match self.open {
            Some(true) => sql.push_str(" AND state IN ('pending', 'approved', 'provisioning', 'active')"),
            Some(false) => sql.push_str(" AND state NOT IN ('pending', 'approved', 'provisioning', 'active')"),
            None => {}
        }
        (sql, values)
    }
}

/// A state change to apply.
#[derive(Debug, Clone, Copy)]
pub struct Transition<'a> {
    /// The request.
    pub id: &'a str,
    /// The version the caller saw; `None` skips the check (internal callers).
    pub expected_version: Option<i64>,
    /// Target state.
    pub to: RequestState,
    /// New reason (rejections), or `None` to keep it.
    pub reason: Option<&'a str>,
    /// Who acts (for the audit log).
    pub actor: &'a str,
}

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// UTC milliseconds.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// What, e.g. `request.create`.
    pub action: String,
    /// On what, e.g. `request/<id>`.
    pub object: String,
    /// State before, as JSON.
    pub before: Option<String>,
    /// State after, as JSON.
    pub after: Option<String>,
}
