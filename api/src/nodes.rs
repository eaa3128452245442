//! Nodes and GPUs, what their agents report, offerings, node credentials.

use serde::{Deserialize, Serialize};
use tessera_core::api::{ObservedInstance, StepError};
use tessera_core::layout::PlacedInstance;

/// A node to register.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewNode {
    /// Unique name (host name).
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<NewGpuBody>,
}

/// A GPU of a node to register.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewGpuBody {
    /// Index on the node.
    pub index: u32,
    /// NVML UUID (`GPU-...`).
    pub uuid: String,
    /// Model key, product name as NVML reports it, or PCI device id.
    pub model: String,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// Current MIG instances.
    #[serde(default)]
    pub instances: Vec<PlacedInstance>,
}

/// A node and its GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// GPUs, by index.
    pub gpus: Vec<GpuView>,
    /// `ready` (heard from, spec applied without errors), `applying` (a newer spec than the applied one),
    /// `failed` (applied with errors, e.g. `instance_busy`), `not-ready` (no heartbeat for 20 s) or `not-joined`
    /// (no agent ever reported).
    pub state: String,
    /// Spec generation: bumped at every change of the node's desired layouts or sharing.
    pub generation: i64,
    /// The generation the agent last finished applying.
    pub observed_generation: i64,
    /// When the agent was last heard from, UTC milliseconds.
    pub last_seen_ms: Option<i64>,
    /// Agent version, backend and driver, from the agent's inventory.
    pub agent: Option<AgentInfo>,
    /// Errors of the last apply not tied to one GPU.
    pub errors: Vec<StepError>,
}

/// The agent of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentInfo {
    /// Agent version.
    pub version: String,
    /// `nvml`, `sim` or `kube`.
    pub backend: String,
    /// NVIDIA driver version.
    pub driver_version: Option<String>,
}

/// A GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuView {
    /// Id.
    pub id: String,
    /// Index on the node.
    pub index: u32,
    /// NVML UUID.
    pub uuid: String,
    /// Catalog model key.
    pub model: String,
    /// MIG mode.
    pub mig_enabled: bool,
    /// Gets nothing new while cordoned.
    pub cordoned: bool,
    /// Current MIG instances.
    pub layout: Vec<PlacedInstance>,
    /// Bumped on every layout change.
    pub layout_version: i64,
    /// Layout changes apply without an admin's approval.
    pub auto_layout: bool,
    /// The MIG instances the agent last reported, with their UUIDs and processes (`None` before any report).
    pub applied: Option<Vec<ObservedInstance>>,
    /// Steps of the last apply on this GPU that failed or wait.
    pub errors: Vec<StepError>,
    /// Instances (or shares) held by allocations, reserved or active: a layout change must keep them.
    pub in_use: Vec<InUse>,
    /// Its health as judged from what its agent reads from the driver.
    pub health: GpuHealth,
    /// Its drain for maintenance, while it is draining or drained (until it is uncordoned).
    #[serde(default)]
    pub drain: Option<GpuDrain>,
    /// What its agent read last, while that is at most a minute old (`None`: no recent sample).
    #[serde(default)]
    pub now: Option<GpuNow>,
    /// The layout change waiting for an admin's decision on it (the proposal's id), if any: work it would place
    /// waits for it.
    #[serde(default)]
    pub layout_waiting: Option<String>,
    /// Every compute process its agent last reported on it and its MIG devices, with whose it is.
    #[serde(default)]
    pub processes: Vec<ProcessView>,
}

/// A GPU's latest sample: the whole GPU's utilisation (SM activity) and frame-buffer memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuNow {
    /// When its agent read it, UTC milliseconds.
    pub at_ms: i64,
    /// Utilisation in percent (0-100).
    pub util_pct: f32,
    /// Frame-buffer memory used, MiB.
    pub mem_used_mib: f32,
    /// Frame-buffer memory in all, MiB.
    pub mem_total_mib: f32,
}

/// Cordon a GPU (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CordonBody {
    /// Why, kept in the audit log (at most 2,000 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Drain a GPU for maintenance.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema, utoipa::IntoParams))]
#[serde(deny_unknown_fields)]
pub struct DrainBody {
    /// Seconds its holders keep their slices (0 to 604,800; default 3,600); then their requests end (an active
    /// one is released, one not yet active cancelled).
    #[serde(default)]
    pub deadline_s: Option<u32>,
    /// Why, told to its holders (at most 2,000 characters).
    #[serde(default)]
    pub reason: Option<String>,
}

/// A GPU's drain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuDrain {
    /// When its holders' slices end, at the latest.
    pub deadline_ms: i64,
    /// When it started.
    pub started_ms: i64,
    /// Who started it.
    pub started_by: String,
    /// Why.
    pub reason: String,
    /// When it held nothing any more (`None`: still draining).
    pub drained_at_ms: Option<i64>,
    /// The requests still holding slices on it.
    pub holders: Vec<String>,
}

/// A GPU's health: `healthy`, `degraded` (serves; something to look at) or `unhealthy` (cordoned until an admin
/// returns it to service), the findings behind it, and the latest report its agent sent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GpuHealth {
    /// `healthy`, `degraded` or `unhealthy`.
    pub state: tessera_core::health::HealthState,
    /// Why, worst first (for an unhealthy GPU, what made it so).
    pub findings: Vec<tessera_core::health::Finding>,
    /// Since when the state holds (`None`: healthy since it joined).
    pub since_ms: Option<i64>,
    /// The latest report of its agent (`None` before one, or from an agent that does not read health).
    pub report: Option<tessera_core::health::GpuHealthReport>,
}

/// An instance an allocation holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InUse {
    /// MIG profile, or the sharing key of a whole-GPU share.
    pub profile: String,
    /// Start unit, or the share index.
    pub start: u8,
    /// The allocation's request.
    pub request: String,
    /// The tenant's id.
    pub tenant: String,
    /// `reserved` or `active`.
    pub state: String,
}

/// What the fleet offers, per GPU model, for a request form: any signed-in user may see it (counts only, no node
/// names or tenants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Offerings {
    /// Per GPU model present in the fleet, by key.
    pub models: Vec<ModelOffer>,
    /// Requests waiting for an admin now, across the platform.
    pub pending_requests: u64,
    /// When the oldest of them was made, UTC ms.
    pub oldest_pending_ms: Option<i64>,
}

/// One GPU model in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelOffer {
    /// Catalog model key.
    pub model: String,
    /// Product name.
    pub product: String,
    /// GPUs of the model that take new work (not cordoned).
    pub gpus: u32,
    /// Of those, GPUs in MIG mode (MIG requests).
    pub mig_gpus: u32,
    /// Of those, GPUs not in MIG mode (whole GPUs, time-slicing, MPS).
    pub whole_gpus: u32,
    /// MIG profiles of the model, smallest first (offered when `mig_gpus` > 0).
    pub profiles: Vec<String>,
}

/// A node credential. The secret is shown only in this response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeCredential {
    /// Credential id.
    pub id: String,
    /// The node.
    pub node_id: String,
    /// The secret: the agent sends it as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// How many credentials were revoked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Revoked {
    /// Live credentials that were revoked.
    pub revoked: u64,
}

/// A compute process on a device, as its node's agent last reported it, with whose it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessView {
    /// The device it runs on (MIG device or GPU UUID).
    pub device: String,
    /// Process id on the node.
    pub pid: u32,
    /// The user it runs as.
    pub user: Option<String>,
    /// Its command.
    pub command: Option<String>,
    /// Its pod and container, on a Kubernetes node.
    pub pod: Option<tessera_core::attribution::PodRef>,
    /// The allocation it runs under; null for unallocated use.
    pub allocation: Option<String>,
    /// Why it is unallocated use; null when an allocation covers it.
    pub unallocated: Option<tessera_core::attribution::Stray>,
    /// When it was first seen on the device, UTC milliseconds.
    pub since_ms: i64,
}
