//! What the portal reads from the API: the fields it shows, with the core's own types where the API uses them.

use serde::{Deserialize, Serialize};
use tessera_core::api::{ObservedInstance, StepError};
use tessera_core::layout::PlacedInstance;
use tessera_core::request::{RequestState, SliceSpec};

/// `GET /api/v1/session`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    /// The user.
    pub user: SessionUser,
    /// Tenant memberships.
    #[serde(default)]
    pub memberships: Vec<Membership>,
}

/// The signed-in user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionUser {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Platform admin.
    #[serde(default)]
    pub platform_admin: bool,
}

/// A membership.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Membership {
    /// Tenant id.
    pub tenant: String,
    /// `member` or `admin`.
    pub role: String,
}

/// `GET /auth/methods`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignInMethods {
    /// Single sign-on is configured.
    pub sso: bool,
    /// The identity provider's name.
    #[serde(default)]
    pub sso_name: Option<String>,
    /// Local accounts are accepted.
    pub local: bool,
}

/// A node of `GET /api/v1/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// `ready`, `applying`, `failed`, `not-ready` or `not-joined`.
    pub state: String,
    /// Desired generation.
    pub generation: i64,
    /// Applied generation.
    pub observed_generation: i64,
    /// Last heartbeat, UTC ms.
    #[serde(default)]
    pub last_seen_ms: Option<i64>,
    /// Its agent.
    #[serde(default)]
    pub agent: Option<AgentInfo>,
    /// Node-level errors of the last apply.
    #[serde(default)]
    pub errors: Vec<StepError>,
    /// GPUs.
    pub gpus: Vec<FleetGpu>,
}

/// A node's agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Version.
    pub version: String,
    /// `nvml`, `sim` or `kube`.
    pub backend: String,
    /// Driver.
    #[serde(default)]
    pub driver_version: Option<String>,
}

/// A GPU of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetGpu {
    /// Id.
    pub id: String,
    /// Index on the node.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Catalog model.
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// Cordoned.
    #[serde(default)]
    pub cordoned: bool,
    /// Desired layout.
    #[serde(default)]
    pub layout: Vec<PlacedInstance>,
    /// What the agent reported.
    #[serde(default)]
    pub applied: Option<Vec<ObservedInstance>>,
    /// Errors of the last apply.
    #[serde(default)]
    pub errors: Vec<StepError>,
    /// Bumped on every layout change.
    #[serde(default)]
    pub layout_version: i64,
    /// Layout changes apply without an admin.
    #[serde(default)]
    pub auto_layout: bool,
    /// Instances held by allocations.
    #[serde(default)]
    pub in_use: Vec<InUse>,
}

/// An instance an allocation holds (`in_use` of a GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InUse {
    /// Profile or sharing key.
    pub profile: String,
    /// Start unit or share index.
    pub start: u8,
    /// Request id.
    pub request: String,
    /// Tenant id.
    pub tenant: String,
    /// `reserved` or `active`.
    pub state: String,
}

impl FleetNode {
    /// A node of one GPU (enough to name the GPU where a node list is expected).
    pub fn with_gpu(name: String, gpu: FleetGpu) -> FleetNode {
        FleetNode {
            id: String::new(),
            name,
            state: String::new(),
            generation: 0,
            observed_generation: 0,
            last_seen_ms: None,
            agent: None,
            errors: Vec::new(),
            gpus: vec![gpu],
        }
    }
}

impl FleetGpu {
    /// `ready`, `applying` (the agent has not shown the desired layout yet), `failed` or `cordoned`: what the
    /// fleet page shows per GPU.
    pub fn state(&self, node_state: &str) -> &'static str {
        if !self.errors.is_empty() {
            return "failed";
        }
        if self.cordoned {
            return "cordoned";
        }
        let matches = self.applied.as_ref().is_some_and(|applied| {
            applied.len() == self.layout.len()
                && self
                    .layout
                    .iter()
                    .all(|want| applied.iter().any(|a| a.profile == want.profile && a.start == want.start))
        });
        match node_state {
            "not-ready" | "not-joined" => "unknown",
            _ if !self.mig_enabled || matches => "ready",
            _ => "applying",
        }
    }
}

/// A tenant (`GET /api/v1/tenants`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tenant {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Requests within quota and small enough are approved without an admin.
    pub auto_approve: bool,
    /// Largest auto-approved request, in weighted compute slices.
    pub auto_approve_max_compute_slices: u32,
}

impl Tenant {
    /// The tenant's approval policy, as the core decides with it.
    pub fn policy(&self) -> tessera_core::quota::ApprovalPolicy {
        tessera_core::quota::ApprovalPolicy {
            auto_approve: self.auto_approve,
            auto_approve_max_compute_slices: self.auto_approve_max_compute_slices,
        }
    }
}

/// `GET /api/v1/tenants/{id}/quotas`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quotas {
    /// Tenant id.
    pub tenant: String,
    /// Per resource.
    pub resources: Vec<QuotaLine>,
}

/// One resource of a tenant's quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaLine {
    /// Resource key (`compute_slices`, `mig/H100-80GB/1g.10gb`, ...).
    pub resource: String,
    /// Held by live requests (pending, approved, provisioning, active).
    pub held: f64,
    /// The limit; `None`: unlimited.
    #[serde(default)]
    pub limit: Option<f64>,
}

/// A request (`GET /api/v1/requests`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SliceRequest {
    /// Id.
    pub id: String,
    /// Tenant id.
    pub tenant: String,
    /// What each slice is.
    pub spec: SliceSpec,
    /// How many.
    pub count: u32,
    /// State.
    pub state: RequestState,
    /// Why (the requester's reason, or the rejection's).
    #[serde(default)]
    pub reason: String,
    /// Version (for `If-Match`).
    pub version: i64,
    /// Made, UTC ms.
    pub created_at_ms: i64,
    /// Last change, UTC ms.
    pub updated_at_ms: i64,
    /// Duration asked for.
    #[serde(default)]
    pub duration_s: Option<i64>,
    /// When it expires.
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
}

/// A page of requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestPage {
    /// Requests, oldest first.
    pub items: Vec<SliceRequest>,
    /// The next page's cursor.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// A slice in a tenant's hands (`GET /api/v1/allocations`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// Id.
    pub id: String,
    /// Its request.
    pub request: String,
    /// `reserved` or `active`.
    pub state: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU index.
    pub gpu_index: u32,
    /// MIG profile or sharing key.
    pub profile: String,
    /// Start unit or share index.
    pub start: u8,
    /// Kubernetes resource name.
    pub k8s_resource: String,
    /// Waiting for a layout change.
    #[serde(default)]
    pub waiting_for_layout: bool,
    /// The device serving it.
    #[serde(default)]
    pub device_uuid: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` on the node.
    #[serde(default)]
    pub cuda_visible_devices: Option<String>,
}

/// `GET /api/v1/offerings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offerings {
    /// Models in the fleet.
    pub models: Vec<ModelOffer>,
    /// Requests waiting for an admin.
    pub pending_requests: u64,
    /// The oldest of them, UTC ms.
    #[serde(default)]
    pub oldest_pending_ms: Option<i64>,
}

/// A model in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelOffer {
    /// Catalog key.
    pub model: String,
    /// Product name.
    pub product: String,
    /// GPUs taking new work.
    pub gpus: u32,
    /// In MIG mode.
    pub mig_gpus: u32,
    /// Not in MIG mode.
    pub whole_gpus: u32,
    /// MIG profiles.
    #[serde(default)]
    pub profiles: Vec<String>,
}

/// A layout proposal (`GET /api/v1/layouts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutProposal {
    /// Id.
    pub id: String,
    /// GPU id.
    pub gpu: String,
    /// The GPU's layout version it was made against.
    pub base_version: i64,
    /// The proposed layout.
    pub layout: Vec<PlacedInstance>,
    /// Instances it creates.
    #[serde(default)]
    pub created: Vec<PlacedInstance>,
    /// Instances it destroys.
    #[serde(default)]
    pub destroyed: Vec<PlacedInstance>,
    /// `proposed`, `approved` or `rejected`.
    pub state: String,
    /// Why.
    #[serde(default)]
    pub reason: String,
    /// By whom.
    pub created_by: String,
    /// When.
    pub created_at_ms: i64,
}

/// What approving a request did (`POST /api/v1/requests/{id}/approve`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    /// The request now.
    pub request: SliceRequest,
    /// Layout changes waiting for an admin because of it.
    #[serde(default)]
    pub layout_proposals: Vec<LayoutProposal>,
}

/// An audit entry (`GET /api/v1/audit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When, UTC ms.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub object: String,
}

/// `GET /api/v1/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageReport {
    /// Period start, UTC ms.
    pub from_ms: i64,
    /// Period end.
    pub to_ms: i64,
    /// Per tenant.
    pub tenants: Vec<TenantUsage>,
    /// Per GPU model and profile.
    #[serde(default)]
    pub profiles: Vec<ProfileUsage>,
    /// Per allocation.
    pub allocations: Vec<AllocationUsage>,
    /// Idle threshold, % utilisation.
    #[serde(default)]
    pub idle_below: f64,
    /// Idle window, hours.
    #[serde(default)]
    pub idle_hours: f64,
}

/// A tenant's usage in the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantUsage {
    /// Tenant id.
    pub tenant_id: String,
    /// Name.
    pub tenant: String,
    /// Allocations metered.
    pub allocations: u64,
    /// Weighted slice-seconds.
    pub slice_seconds: f64,
    /// GPU-hours (a whole GPU for an hour is 1).
    pub gpu_hours: f64,
}

/// A profile's usage in the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileUsage {
    /// GPU model.
    pub model: String,
    /// Profile or sharing key.
    pub profile: String,
    /// Allocations metered.
    pub allocations: u64,
    /// Weighted slice-seconds.
    pub slice_seconds: f64,
    /// GPU-hours.
    pub gpu_hours: f64,
}

/// One allocation's usage in the period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocationUsage {
    /// Allocation id.
    pub allocation: String,
    /// Its request.
    #[serde(default)]
    pub request: String,
    /// Tenant id.
    #[serde(default)]
    pub tenant_id: String,
    /// Tenant name.
    pub tenant: String,
    /// Node.
    pub node: String,
    /// Device serving it.
    #[serde(default)]
    pub device_uuid: Option<String>,
    /// Model.
    pub model: String,
    /// Profile or sharing key.
    pub profile: String,
    /// Compute slices it weighs.
    #[serde(default)]
    pub weight: f64,
    /// State.
    pub state: String,
    /// Seconds in use in the period.
    pub seconds: f64,
    /// GPU-hours.
    pub gpu_hours: f64,
    /// Mean utilisation over the idle window, %.
    #[serde(default)]
    pub util_mean: Option<f64>,
    /// Allocated but idle.
    #[serde(default)]
    pub idle: bool,
}

/// A page of the audit log (`GET /api/v1/audit/entries`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    /// Entries, newest first.
    pub entries: Vec<AuditRecord>,
    /// Cursor of the next page.
    #[serde(default)]
    pub next: Option<String>,
}

/// An audit entry with its before and after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When, UTC ms.
    pub at_ms: i64,
    /// Who.
    pub actor: String,
    /// What.
    pub action: String,
    /// On what.
    pub object: String,
    /// Before, JSON text.
    #[serde(default)]
    pub before: Option<String>,
    /// After, JSON text.
    #[serde(default)]
    pub after: Option<String>,
}

/// One of the viewer's API tokens (`GET /api/v1/tokens`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiToken {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Created, UTC ms.
    pub created_at_ms: i64,
    /// Revoked, UTC ms.
    #[serde(default)]
    pub revoked_at_ms: Option<i64>,
}

/// A token just created: the only time its secret is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedToken {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Secret.
    pub secret: String,
}

/// A user (`GET /api/v1/users`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Platform admin.
    pub platform_admin: bool,
}

/// A tenant's member (`GET /api/v1/tenants/{id}/members`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// User id.
    pub id: String,
    /// User name.
    pub name: String,
    /// `member` or `tenant-admin`.
    pub role: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_is_applying_until_the_agent_shows_its_layout() {
        let mut gpu: FleetGpu = serde_json::from_value(serde_json::json!({
            "id": "g", "index": 0, "uuid": "GPU-1", "model": "H100-80GB", "mig_enabled": true,
            "layout": [{"profile": "3g.40gb", "start": 4}], "applied": []
        }))
        .expect("gpu");
        assert_eq!(gpu.state("applying"), "applying");
        gpu.applied = Some(vec![serde_json::from_value(serde_json::json!({
            "profile": "3g.40gb", "start": 4, "uuid": "MIG-1", "gi_id": 1, "ci_id": 0, "device_name": "MIG 3g.40gb Device 0", "processes": []
        }))
        .expect("instance")]);
        assert_eq!(gpu.state("ready"), "ready");
        assert_eq!(gpu.state("not-ready"), "unknown");
        gpu.cordoned = true;
        assert_eq!(gpu.state("ready"), "cordoned");
    }
}
