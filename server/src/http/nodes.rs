//! Nodes and GPUs: registration by an admin (until node agents join by themselves), listing, cordoning; and the
//! planner's placement for a request.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use tessera_core::layout::PlacedInstance;
use utoipa::ToSchema;

use super::auth::{NodeAuth, new_node_secret, require_platform_admin, token_hash};
use super::error::{ApiError, ApiJson, Problem};
use crate::app::AppState;
use crate::services::fleet::{self, GpuReport};
use crate::store::agents::AgentRecord;
use crate::store::{Gpu, Node, Principal};
use tessera_core::api::{Inventory, NodeStatus, ObservedInstance, StepError};

/// A node to register.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewNode {
    /// Unique name (host name).
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<NewGpuBody>,
}

/// A GPU of a node to register.
#[derive(Debug, Deserialize, ToSchema)]
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
#[derive(Debug, Serialize, ToSchema)]
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
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentInfo {
    /// Agent version.
    pub version: String,
    /// `nvml`, `sim` or `kube`.
    pub backend: String,
    /// NVIDIA driver version.
    pub driver_version: Option<String>,
}

/// A GPU.
#[derive(Debug, Serialize, ToSchema)]
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
}

/// An instance an allocation holds.
#[derive(Debug, Serialize, ToSchema)]
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

impl From<Gpu> for GpuView {
    fn from(g: Gpu) -> Self {
        GpuView {
            id: g.id,
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            mig_enabled: g.mig_enabled,
            cordoned: g.cordoned,
            layout: g.layout,
            layout_version: g.layout_version,
            auto_layout: g.auto_layout,
            applied: None,
            errors: Vec::new(),
            in_use: Vec::new(),
        }
    }
}

impl From<Node> for NodeView {
    fn from(n: Node) -> Self {
        NodeView {
            id: n.id,
            name: n.name,
            created_at_ms: n.created_at_ms,
            gpus: n.gpus.into_iter().map(Into::into).collect(),
            state: "not-joined".to_string(),
            generation: 0,
            observed_generation: 0,
            last_seen_ms: None,
            agent: None,
            errors: Vec::new(),
        }
    }
}

impl NodeView {
    /// The node with what its agent last reported.
    pub fn with_agent(node: Node, record: Option<&AgentRecord>, state: &AppState, now: i64) -> NodeView {
        let mut view = NodeView::from(node);
        let Some(record) = record else { return view };
        let status: Option<NodeStatus> = record.status.as_deref().and_then(|s| serde_json::from_str(s).ok());
        let inventory: Option<Inventory> = record.inventory.as_deref().and_then(|s| serde_json::from_str(s).ok());
        let (ready, last_seen) = crate::services::agents::ready(state, &view.id, record.last_seen_ms, now);
        view.generation = record.generation;
        view.observed_generation = record.observed_generation;
        view.last_seen_ms = last_seen;
        view.agent = inventory.map(|i| AgentInfo {
            version: i.agent_version,
            backend: i.backend,
            driver_version: i.driver_version,
        });
        if let Some(status) = &status {
            view.errors = status.errors.clone();
            for gpu in &mut view.gpus {
                if let Some(seen) = status.gpus.iter().find(|s| s.uuid == gpu.uuid) {
                    gpu.applied = Some(seen.instances.clone());
                    gpu.errors = seen.errors.clone();
                }
            }
        }
        let failed = !view.errors.is_empty() || view.gpus.iter().any(|g| !g.errors.is_empty());
        view.state = if last_seen.is_none() {
            "not-joined"
        } else if !ready {
            "not-ready"
        } else if record.observed_generation < record.generation || status.as_ref().is_some_and(|s| s.applying) {
            "applying"
        } else if failed {
            "failed"
        } else {
            "ready"
        }
        .to_string();
        view
    }
}

/// Register a node and its GPUs (platform admins). Models are checked against the catalog and layouts against the
/// MIG rules; nothing is stored unless all of it is valid.
#[utoipa::path(post, path = "/api/v1/nodes", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewNode,
    responses((status = 201, body = NodeView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn register_node(
    State(state): State<AppState>,
    p: Principal,
    ApiJson(body): ApiJson<NewNode>,
) -> Result<(StatusCode, ApiJson<NodeView>), ApiError> {
    let gpus: Vec<GpuReport> = body
        .gpus
        .into_iter()
        .map(|g| GpuReport {
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            mig_enabled: g.mig_enabled,
            instances: g.instances,
        })
        .collect();
    let node = fleet::register(&state, &p, &body.name, &gpus).await?;
    Ok((StatusCode::CREATED, ApiJson(node.into())))
}

/// Every node and GPU (platform admins).
#[utoipa::path(get, path = "/api/v1/nodes", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<NodeView>), (status = 403, body = Problem)))]
pub async fn list_nodes(State(state): State<AppState>, p: Principal) -> Result<ApiJson<Vec<NodeView>>, ApiError> {
    require_platform_admin(&p)?;
    let records = state.store.agent_records().await?;
    let live = state.store.live_allocations().await?;
    let now = crate::store::now_ms();
    let views = state
        .store
        .nodes()
        .await?
        .into_iter()
        .map(|n| {
            let record = records.iter().find(|r| r.node_id == n.id);
            let mut view = NodeView::with_agent(n, record, &state, now);
            for gpu in &mut view.gpus {
                gpu.in_use = live
                    .iter()
                    .filter(|a| a.gpu_id == gpu.id)
                    .map(|a| InUse {
                        profile: a.profile.clone(),
                        start: a.start,
                        request: a.request_id.clone(),
                        tenant: a.tenant_id.clone(),
                        state: a.state.clone(),
                    })
                    .collect();
            }
            view
        })
        .collect();
    Ok(ApiJson(views))
}

/// Cordon a GPU: it gets nothing new (platform admins).
#[utoipa::path(post, path = "/api/v1/gpus/{id}/cordon", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 200, body = GpuView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn cordon_gpu(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<GpuView>, ApiError> {
    require_platform_admin(&p)?;
    Ok(ApiJson(state.store.set_cordoned(&id, true, &p.actor()).await?.into()))
}

/// Uncordon a GPU (platform admins).
#[utoipa::path(post, path = "/api/v1/gpus/{id}/uncordon", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 200, body = GpuView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn uncordon_gpu(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<GpuView>, ApiError> {
    require_platform_admin(&p)?;
    Ok(ApiJson(state.store.set_cordoned(&id, false, &p.actor()).await?.into()))
}

/// What the fleet offers, per GPU model, for a request form: any signed-in user may see it (counts only, no node
/// names or tenants).
#[derive(Debug, Serialize, ToSchema)]
pub struct Offerings {
    /// Per GPU model present in the fleet, by key.
    pub models: Vec<ModelOffer>,
    /// Requests waiting for an admin now, across the platform.
    pub pending_requests: u64,
    /// When the oldest of them was made, UTC ms.
    pub oldest_pending_ms: Option<i64>,
}

/// One GPU model in the fleet.
#[derive(Debug, Serialize, ToSchema)]
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

/// What the fleet offers: GPU models with their counts and MIG profiles, and the approval queue's length.
#[utoipa::path(get, path = "/api/v1/offerings", tag = "fleet", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Offerings), (status = 401, body = Problem)))]
pub async fn offerings(State(state): State<AppState>, _p: Principal) -> Result<ApiJson<Offerings>, ApiError> {
    let catalog = tessera_core::catalog::Catalog::builtin();
    let mut models: std::collections::BTreeMap<String, ModelOffer> = std::collections::BTreeMap::new();
    for gpu in state.store.nodes().await?.iter().flat_map(|n| &n.gpus).filter(|g| !g.cordoned) {
        let offer = models.entry(gpu.model.clone()).or_insert_with(|| {
            let m = catalog.resolve(&gpu.model).map(|(m, _)| m);
            ModelOffer {
                model: gpu.model.clone(),
                product: m.and_then(|m| m.products.first().cloned()).unwrap_or_else(|| gpu.model.clone()),
                gpus: 0,
                mig_gpus: 0,
                whole_gpus: 0,
                profiles: m.map(|m| m.profiles.iter().map(|p| p.name.clone()).collect()).unwrap_or_default(),
            }
        });
        offer.gpus += 1;
        if gpu.mig_enabled {
            offer.mig_gpus += 1;
        } else {
            offer.whole_gpus += 1;
        }
    }
    let filter = crate::store::RequestFilter {
        tenant: None,
        state: Some(tessera_core::request::RequestState::Pending),
        after: None,
        limit: 10_000,
    };
    let pending = state.store.list_requests(filter).await?;
    Ok(ApiJson(Offerings {
        models: models.into_values().collect(),
        pending_requests: pending.len() as u64,
        oldest_pending_ms: pending.iter().map(|r| r.created_at_ms).min(),
    }))
}

/// A node credential. The secret is shown only in this response.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeCredential {
    /// Credential id.
    pub id: String,
    /// The node.
    pub node_id: String,
    /// The secret: the agent sends it as `Authorization: Bearer <secret>`.
    pub secret: String,
}

/// Issue a credential for a node's agent (platform admins). It can call only the agent routes, for its own node.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/credentials", tag = "fleet",
    security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 201, body = NodeCredential), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn create_node_credential(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<(StatusCode, ApiJson<NodeCredential>), ApiError> {
    require_platform_admin(&p)?;
    let secret = new_node_secret();
    let credential = state.store.create_node_credential(&id, &token_hash(&secret), &p.actor()).await?;
    Ok((StatusCode::CREATED, ApiJson(NodeCredential { id: credential, node_id: id, secret })))
}

/// How many credentials were revoked.
#[derive(Debug, Serialize, ToSchema)]
pub struct Revoked {
    /// Live credentials that were revoked.
    pub revoked: u64,
}

/// Revoke every credential of a node (platform admins), e.g. when one leaked; its agent must join again.
#[utoipa::path(delete, path = "/api/v1/nodes/{id}/credentials", tag = "fleet",
    security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 200, body = Revoked), (status = 403, body = Problem)))]
pub async fn revoke_node_credentials(
    State(state): State<AppState>,
    p: Principal,
    Path(id): Path<String>,
) -> Result<ApiJson<Revoked>, ApiError> {
    require_platform_admin(&p)?;
    let revoked = state.store.revoke_node_credentials(&id, &p.actor()).await?;
    state.principals.clear();
    Ok(ApiJson(Revoked { revoked }))
}

/// The calling agent's node (node credentials).
#[utoipa::path(get, path = "/api/v1/agent/node", tag = "fleet", security(("node" = [])),
    responses((status = 200, body = NodeView), (status = 401, body = Problem), (status = 403, body = Problem)))]
pub async fn agent_node(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
) -> Result<ApiJson<NodeView>, ApiError> {
    let found = state.store.nodes().await?.into_iter().find(|n| n.id == node.node_id);
    let record = state.store.agent_record(&node.node_id).await.ok();
    let now = crate::store::now_ms();
    found
        .map(|n| ApiJson(NodeView::with_agent(n, record.as_ref(), &state, now)))
        .ok_or_else(|| ApiError::NotFound("node not found".into()))
}
