//! Allocations: the instances requests hold.

use serde::{Deserialize, Serialize};

/// A slice in a tenant's hands, with what a workload needs to find it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AllocationView {
    /// Id.
    pub id: String,
    /// The request it serves.
    pub request: String,
    /// `reserved` (approved, the instance may still be waiting for its layout), `prepared` (a reservation's
    /// instance made before its window: not usable, metered or counted until the start) or `active`.
    pub state: String,
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub gpu_uuid: String,
    /// GPU index on the node.
    pub gpu_index: u32,
    /// GPU model (`H100-80GB`, ...).
    pub model: String,
    /// MIG profile, or how a whole GPU is shared (`exclusive`, `timeslice:<n>`, `mps:<n>`).
    pub profile: String,
    /// Start unit of the MIG instance, or the share's index on a whole GPU.
    pub start: u8,
    /// Kubernetes extended resource: `nvidia.com/mig-<profile>` (mixed strategy) or `nvidia.com/gpu`.
    pub k8s_resource: String,
    /// Whether the instance waits for a layout change to be approved and applied.
    pub waiting_for_layout: bool,
    /// The device serving it once active: the MIG device UUID (`MIG-...`) or the GPU UUID.
    pub device_uuid: Option<String>,
    /// What a workload on the node sets `CUDA_VISIBLE_DEVICES` to (once active).
    pub cuda_visible_devices: Option<String>,
    /// When its request expires and the slice is taken back (UTC milliseconds); `None` while it has no end.
    pub expires_at_ms: Option<i64>,
    /// Its request holds more than the tenant's guarantee, borrowed from the cohort.
    #[serde(default)]
    pub borrowed: bool,
    /// When the slice is taken back because a lender of the cohort needs its guarantee (UTC milliseconds): save
    /// work before then. `None` while nobody needs it back.
    #[serde(default)]
    pub reclaim_at_ms: Option<i64>,
    /// The tenant (name) it is taken back for, when known.
    #[serde(default)]
    pub reclaim_for: Option<String>,
    /// Its Kubernetes ResourceClaims, one in each of its tenant's namespaces of the cluster its node is in, as the
    /// cluster last showed them. Empty while its node is in no cluster, on a device-plugin cluster, for a share
    /// (which no claim can pin), or before the controller has written them.
    #[serde(default)]
    pub claims: Vec<ClaimView>,
    /// Who runs on it: the processes its node's agent last reported on its device that run under it.
    #[serde(default)]
    pub processes: Vec<crate::nodes::ProcessView>,
}

/// A ResourceClaim of an allocation, as its cluster last showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimView {
    /// The cluster's name.
    pub cluster: String,
    /// The namespace.
    pub namespace: String,
    /// The claim's name: a pod in the namespace references it (`resourceClaims[].resourceClaimName`).
    pub name: String,
    /// The DRA driver allocated it its device.
    pub allocated: bool,
    /// The pods it is reserved for: the pods using the slice.
    pub pods: Vec<String>,
    /// When the cluster showed this, UTC milliseconds.
    pub observed_at_ms: i64,
}

/// Query.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct AllocationQuery {
    /// Tenant id.
    pub tenant: String,
}
