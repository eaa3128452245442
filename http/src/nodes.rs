//! The fleet (the `fleet` tag): nodes and GPUs registered by an admin or joined by agents, listing, cordoning,
//! auto-layout, node credentials and join tokens, what the fleet offers, and the planner's placement for a request.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;
use tessera_services::auth::Permissions;

use super::auth::{NodeAuth, new_node_secret, token_hash};
use super::error::{ApiError, ApiJson, ApiPath, Problem};
use std::collections::HashMap;
use tessera_services::app::AppState;
use tessera_services::auth::secrets::JOIN_TOKEN_PREFIX;
use tessera_services::fleet::valid_node_name;
use tessera_services::fleet::{self, GpuReport};

use tessera_store::Node;
use tessera_store::agents::AgentRecord;

/// Longest a join token may live.
const JOIN_TOKEN_MAX_TTL_S: u64 = 7 * 24 * 3600;
pub use tessera_api::agents::{JoinTokenView, NewJoinToken};
pub use tessera_api::layouts::AutoLayout;
pub use tessera_api::nodes::{
    AgentInfo, CordonBody, DrainBody, GpuDrain, GpuNow, GpuView, InUse, ModelOffer, NewNode, NodeCredential, NodeView,
    Offerings, Revoked,
};
use tessera_core::api::{Inventory, NodeStatus};

/// The node with what its agent last reported.
pub fn node_view(node: Node, record: Option<&AgentRecord>, state: &AppState, now: i64) -> NodeView {
    let mut view = NodeView::from(node);
    let Some(record) = record else { return view };
    let status: Option<NodeStatus> = record.status.as_deref().and_then(|s| serde_json::from_str(s).ok());
    let inventory: Option<Inventory> = record.inventory.as_deref().and_then(|s| serde_json::from_str(s).ok());
    let (ready, last_seen) = tessera_services::agents::ready(state, &view.id, record.last_seen_ms, now);
    view.generation = record.generation;
    view.observed_generation = record.observed_generation;
    view.last_seen_ms = last_seen;
    view.agent =
        inventory.map(|i| AgentInfo { version: i.agent_version, backend: i.backend, driver_version: i.driver_version });
    if let Some(status) = &status {
        view.errors = status.errors.clone();
        for gpu in &mut view.gpus {
            if let Some(seen) = status.gpus.iter().find(|s| s.uuid == gpu.uuid) {
                gpu.applied = Some(seen.instances.clone());
                gpu.errors = seen.errors.clone();
                gpu.health.report = seen.health.clone();
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

/// Register a node and its GPUs (platform admins). Models are checked against the catalog and layouts against the
/// MIG rules; nothing is stored unless all of it is valid.
#[utoipa::path(post, path = "/api/v1/nodes", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewNode,
    responses((status = 201, body = NodeView), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn register_node(
    State(state): State<AppState>,
    Caller(p): Caller,
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
pub async fn list_nodes(State(state): State<AppState>, Caller(p): Caller) -> Result<ApiJson<Vec<NodeView>>, ApiError> {
    p.require_platform_admin()?;
    let records = state.store.agent_records().await?;
    let live = state.store.live_allocations().await?;
    let drains = state.store.drains().await?;
    let waiting = state.store.proposals(Some("proposed")).await?;
    let processes = state.store.gpu_processes().await?;
    let now = tessera_store::now_ms();
    // The whole GPU's sample (its device is its own UUID), while at most a minute old.
    let samples: std::collections::HashMap<String, GpuNow> = state
        .telemetry
        .latest(None)
        .into_iter()
        .filter(|l| l.device == l.gpu && now - l.sample.t < 60_000)
        .map(|l| {
            let s = l.sample;
            (
                l.gpu,
                GpuNow { at_ms: s.t, util_pct: s.util, mem_used_mib: s.mem_used_mib, mem_total_mib: s.mem_total_mib },
            )
        })
        .collect();
    // Everything per node or GPU looked up by id: 10,000 nodes and 80,000 GPUs cost lookups, not a scan of every
    // list per GPU.
    let records: HashMap<&str, &AgentRecord> = records.iter().map(|r| (r.node_id.as_str(), r)).collect();
    // The first of each per GPU, as the lists come.
    let mut drains_on: HashMap<&str, &tessera_store::DrainRecord> = HashMap::new();
    for d in &drains {
        drains_on.entry(d.gpu_id.as_str()).or_insert(d);
    }
    let mut waiting_on: HashMap<&str, &str> = HashMap::new();
    for w in &waiting {
        waiting_on.entry(w.gpu_id.as_str()).or_insert(w.id.as_str());
    }
    let mut processes_on: HashMap<&str, Vec<&tessera_store::attribution::ProcessRow>> = HashMap::new();
    for p in &processes {
        processes_on.entry(p.gpu_id.as_str()).or_default().push(p);
    }
    let mut live_on: HashMap<&str, Vec<&tessera_store::Allocation>> = HashMap::new();
    for a in &live {
        live_on.entry(a.gpu_id.as_str()).or_default().push(a);
    }
    let views = state
        .store
        .nodes()
        .await?
        .into_iter()
        .map(|n| {
            let record = records.get(n.id.as_str()).copied();
            let mut view = node_view(n, record, &state, now);
            for gpu in &mut view.gpus {
                gpu.drain =
                    drains_on.get(gpu.id.as_str()).map(|d| tessera_services::fleet::drain_of((*d).clone(), &live));
                gpu.now = samples.get(&gpu.uuid).cloned();
                gpu.layout_waiting = waiting_on.get(gpu.id.as_str()).map(|w| (*w).to_string());
                gpu.processes =
                    processes_on.get(gpu.id.as_str()).into_iter().flatten().map(|p| (*p).clone().into()).collect();
                gpu.in_use = live_on
                    .get(gpu.id.as_str())
                    .into_iter()
                    .flatten()
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

/// Cordon a GPU: it gets nothing new (platform admins). The reason, optional, is kept in the audit log.
#[utoipa::path(post, path = "/api/v1/gpus/{id}/cordon", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    request_body(content = Option<CordonBody>, description = "optional; an empty body is no reason"),
    responses((status = 200, body = GpuView), (status = 400, body = Problem, description = "invalid_body"), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_reason, invalid_body (JSON of another shape)")))]
pub async fn cordon_gpu(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<ApiJson<GpuView>, ApiError> {
    let body: CordonBody = super::error::optional_json(&body, "a cordon")?;
    Ok(ApiJson(tessera_services::agents::set_cordoned(&state, &p, &id, true, body.reason.as_deref()).await?.into()))
}

/// Drain a GPU for maintenance (platform admins): it is cordoned at once and its holders are told (`gpu.draining`);
/// at the deadline the requests still holding slices on it end (an active one released, one not yet active
/// cancelled); once it holds nothing it is drained (`gpu.drained`) and stays cordoned until uncordoned, which also
/// ends a drain. The node's other GPUs keep serving. Draining it again moves the deadline.
#[utoipa::path(post, path = "/api/v1/gpus/{id}/drain", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    request_body = DrainBody,
    responses((status = 200, body = GpuDrain), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "drain_bad_deadline, invalid_reason")))]
pub async fn drain_gpu(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<DrainBody>,
) -> Result<ApiJson<GpuDrain>, ApiError> {
    Ok(ApiJson(tessera_services::fleet::drain(&state, &p, &id, &body).await?))
}

/// Uncordon a GPU (platform admins): it takes new work again, an unhealthy one returns to service and a drain
/// ends. The reason, optional, is kept in the audit log.
#[utoipa::path(post, path = "/api/v1/gpus/{id}/uncordon", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    request_body(content = Option<CordonBody>, description = "optional; an empty body is no reason"),
    responses((status = 200, body = GpuView), (status = 400, body = Problem, description = "invalid_body"), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_reason, invalid_body (JSON of another shape)")))]
pub async fn uncordon_gpu(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<ApiJson<GpuView>, ApiError> {
    let body: CordonBody = super::error::optional_json(&body, "an uncordon")?;
    Ok(ApiJson(tessera_services::agents::set_cordoned(&state, &p, &id, false, body.reason.as_deref()).await?.into()))
}

/// What the fleet offers: GPU models with their counts and MIG profiles, and the approval queue's length.
#[utoipa::path(get, path = "/api/v1/offerings", tag = "fleet", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Offerings), (status = 401, body = Problem)))]
pub async fn offerings(State(state): State<AppState>, Caller(_p): Caller) -> Result<ApiJson<Offerings>, ApiError> {
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
    let filter = tessera_store::RequestFilter {
        tenant: None,
        state: Some(tessera_core::request::RequestState::Pending),
        after: None,
        limit: 10_000,
        open: None,
        newest_first: false,
    };
    let pending = state.store.list_requests(filter).await?;
    Ok(ApiJson(Offerings {
        models: models.into_values().collect(),
        pending_requests: pending.len() as u64,
        oldest_pending_ms: pending.iter().map(|r| r.created_at_ms).min(),
    }))
}

/// Issue a credential for a node's agent (platform admins). It can call only the agent routes, for its own node.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/credentials", tag = "fleet",
    security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 201, body = NodeCredential), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn create_node_credential(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, ApiJson<NodeCredential>), ApiError> {
    p.require_platform_admin()?;
    let secret = new_node_secret();
    let credential = state.store.create_node_credential(&id, &token_hash(&secret), &p.actor()).await?;
    Ok((StatusCode::CREATED, ApiJson(NodeCredential { id: credential, node_id: id, secret })))
}

/// Revoke every credential of a node (platform admins), e.g. when one leaked; its agent must join again.
#[utoipa::path(delete, path = "/api/v1/nodes/{id}/credentials", tag = "fleet",
    security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 200, body = Revoked), (status = 403, body = Problem)))]
pub async fn revoke_node_credentials(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Revoked>, ApiError> {
    p.require_platform_admin()?;
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
    let now = tessera_store::now_ms();
    found
        .map(|n| ApiJson(node_view(n, record.as_ref(), &state, now)))
        .ok_or_else(|| ApiError::NotFound("node not found".into()))
}

/// Create a join token (platform admins): an agent exchanges it once for its node's credential. The secret is in
/// this answer only.
#[utoipa::path(post, path = "/api/v1/join-tokens", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), request_body = NewJoinToken,
    responses((status = 201, body = JoinTokenView), (status = 403, body = Problem), (status = 422, body = Problem)))]
pub async fn create_join_token(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewJoinToken>,
) -> Result<(StatusCode, ApiJson<JoinTokenView>), ApiError> {
    p.require_platform_admin()?;
    if let Some(name) = &body.node_name
        && !valid_node_name(name)
    {
        return Err(ApiError::invalid(
            "invalid_name",
            "a node name is 1-253 characters of a-z, A-Z, 0-9, '-', '.', '_'",
        ));
    }
    let ttl = body.ttl_s.unwrap_or(3600);
    if ttl == 0 || ttl > JOIN_TOKEN_MAX_TTL_S {
        return Err(ApiError::invalid("invalid_ttl", format!("ttl_s is 1 to {JOIN_TOKEN_MAX_TTL_S} seconds")));
    }
    let secret = format!("{JOIN_TOKEN_PREFIX}{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let expires = tessera_store::now_ms() + i64::try_from(ttl * 1000).unwrap_or(i64::MAX);
    let stored =
        state.store.create_join_token(&token_hash(&secret), body.node_name.as_deref(), expires, &p.actor()).await?;
    let mut view = JoinTokenView::from(stored);
    view.token = Some(secret);
    Ok((StatusCode::CREATED, ApiJson(view)))
}

/// Every join token, newest first (platform admins).
#[utoipa::path(get, path = "/api/v1/join-tokens", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<JoinTokenView>), (status = 403, body = Problem)))]
pub async fn list_join_tokens(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<JoinTokenView>>, ApiError> {
    p.require_platform_admin()?;
    Ok(ApiJson(state.store.join_tokens().await?.into_iter().map(Into::into).collect()))
}

/// Delete a join token (platform admins).
#[utoipa::path(delete, path = "/api/v1/join-tokens/{id}", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])), params(("id" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn delete_join_token(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    p.require_platform_admin()?;
    state.store.delete_join_token(&id, &p.actor()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Turn auto-layout on or off for a GPU (platform admins).
#[utoipa::path(put, path = "/api/v1/gpus/{id}/auto-layout", tag = "fleet", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path)), request_body = AutoLayout,
    responses((status = 200, body = GpuView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn set_auto_layout(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AutoLayout>,
) -> Result<ApiJson<GpuView>, ApiError> {
    Ok(ApiJson(tessera_services::approvals::set_auto_layout(&state, &p, &id, body.enabled).await?.into()))
}
