//! The node agents' own routes (the `agent` tag): joining with a join token, then with the node's credential the
//! inventory, the node's spec pushed over a WebSocket or long-polled, status and heartbeats. (Their telemetry
//! batches go to `telemetry.rs`, beside the window they feed.)

use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tessera_core::api::{
    AgentMessage, Inventory, JoinRequest, Joined, NodeSpec, NodeStatus, ServerMessage, node_credential_well_formed,
};

use super::auth::{NodeAuth, new_node_secret, token_hash};
use super::error::{ApiError, ApiJson, ApiQuery, Problem};
use tessera_services::agents::{self as svc, HEARTBEAT, StatusOutcome};
use tessera_services::app::AppState;
use tessera_services::fleet::valid_node_name;
use tessera_store::StoreError;
use tessera_store::auth::NodePrincipal;

pub use tessera_api::agents::{JoinTokenView, NewJoinToken, SpecQuery};
pub use tessera_services::auth::secrets::JOIN_TOKEN_PREFIX;
/// Longest a long-poll waits for a new spec.
const LONG_POLL_MAX_S: u64 = 20;

/// Join: exchange a join token for a node credential, reporting the node's inventory. The token is good once; a
/// node whose name exists already takes it over (its old credentials stop working). An agent that proposes its
/// own credential may send the same join again (its answer was lost): it gets the same answer.
#[utoipa::path(post, path = "/api/v1/agent/join", tag = "agent", security(()), request_body = JoinRequest,
    responses((status = 201, body = Joined), (status = 401, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn join(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<JoinRequest>,
) -> Result<(StatusCode, ApiJson<Joined>), ApiError> {
    if !body.token.starts_with(JOIN_TOKEN_PREFIX) {
        return Err(ApiError::unauthorized("join_token_invalid", "a join token starts with tsj_"));
    }
    if !valid_node_name(&body.inventory.hostname) {
        return Err(ApiError::invalid(
            "invalid_name",
            "the host name is 1-253 characters of a-z, A-Z, 0-9, '-', '.', '_'",
        ));
    }
    let credential = match body.credential {
        Some(proposed) if node_credential_well_formed(&proposed) => proposed,
        Some(_) => {
            return Err(ApiError::invalid(
                "invalid_credential",
                "a proposed node credential is tsn_ and 64 lowercase hex digits",
            ));
        }
        None => new_node_secret(),
    };
    let gpus = svc::inventory_gpus(&state, &body.inventory)?;
    let joined = state
        .store
        .join_node(&token_hash(&body.token), &body.inventory.hostname, &gpus, &token_hash(&credential), &body.inventory)
        .await;
    let (node_id, node_name) = match joined {
        Ok(j) => j,
        Err(StoreError::NotFound { .. }) => {
            return Err(ApiError::unauthorized(
                "join_token_invalid",
                "the join token is unknown, used already or expired; ask an admin for a new one",
            ));
        }
        Err(StoreError::Conflict { constraint }) if constraint == "nodes.name" => {
            return Err(ApiError::Conflict {
                code: "node_name_taken",
                detail: format!(
                    "a node named `{}` exists: joining as it needs a join token made for that node name",
                    body.inventory.hostname
                ),
                errors: vec![],
            });
        }
        Err(e) => return Err(gpu_conflict(e)),
    };
    state.principals.clear();
    if let Err(e) = svc::refresh(&state, Some(std::slice::from_ref(&node_id))).await {
        tracing::warn!(error = %e, "cannot refresh the new node's spec");
    }
    Ok((StatusCode::CREATED, ApiJson(Joined { node_id, node_name, credential })))
}

/// A GPU UUID taken by another node is `gpu_on_other_node`.
fn gpu_conflict(e: StoreError) -> ApiError {
    match e {
        StoreError::Conflict { constraint } if constraint == "gpus.uuid" => ApiError::Conflict {
            code: "gpu_on_other_node",
            detail: "a GPU of this node is registered on another node".to_string(),
            errors: vec![],
        },
        e => e.into(),
    }
}

/// Report the node's inventory (agents do at every start): new GPUs are registered, known ones updated.
#[utoipa::path(put, path = "/api/v1/agent/inventory", tag = "agent", security(("node" = [])), request_body = Inventory,
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
pub async fn put_inventory(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
    ApiJson(body): ApiJson<Inventory>,
) -> Result<StatusCode, ApiError> {
    let gpus = svc::inventory_gpus(&state, &body)?;
    state.store.update_inventory(&node.node_id, &gpus, &body, &node.actor()).await.map_err(gpu_conflict)?;
    state.node_gpus.forget(&node.node_id);
    state.hub.seen(&node.node_id);
    svc::refresh(&state, Some(std::slice::from_ref(&node.node_id))).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The node's spec: at once without `after`, else as soon as its generation passes `after` (204 when none
/// came within `wait_s`, at once when the replica begins to shut down, within a second while it does). The fallback
/// to the WebSocket; each call counts as a heartbeat.
#[utoipa::path(get, path = "/api/v1/agent/spec", tag = "agent", security(("node" = [])), params(SpecQuery),
    responses((status = 200, body = NodeSpec), (status = 204), (status = 401, body = Problem), (status = 403, body = Problem)))]
pub async fn get_spec(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
    ApiQuery(q): ApiQuery<SpecQuery>,
) -> Result<Response, ApiError> {
    state.hub.seen(&node.node_id);
    let mut changes = state.hub.subscribe(&node.node_id);
    let spec = svc::current_spec(&state, &node.node_id).await?;
    let Some(after) = q.after else { return Ok(ApiJson(spec).into_response()) };
    if spec.generation > after {
        return Ok(ApiJson(spec).into_response());
    }
    let mut wait = Duration::from_secs(q.wait_s.unwrap_or(LONG_POLL_MAX_S).min(LONG_POLL_MAX_S));
    // A replica that begins to shut down answers the polls it holds at once, so that the next ones go to a
    // replica that stays; one that is shutting down already holds a poll a second at most, so that an agent the
    // balancer still sends here polls once a second, not in a loop.
    let draining = state.draining.clone();
    let already = draining.is_draining();
    if already {
        wait = wait.min(Duration::from_secs(1));
    }
    let deadline = tokio::time::Instant::now() + wait;
    let shutting_down = async {
        if already {
            std::future::pending::<()>().await;
        }
        draining.begun().await;
    };
    tokio::pin!(shutting_down);
    loop {
        // `Some(true)`: past `after`; `Some(false)`: a change not past it; `None`: time is up, or shutting down.
        let changed = tokio::select! {
            changed = tokio::time::timeout_at(deadline, changes.changed()) => match changed {
                Ok(Ok(())) => Some(*changes.borrow_and_update() > after),
                Ok(Err(_)) | Err(_) => None,
            },
            () = &mut shutting_down => None,
        };
        match changed {
            Some(true) => {
                let spec = svc::current_spec(&state, &node.node_id).await?;
                if spec.generation > after {
                    return Ok(ApiJson(spec).into_response());
                }
            }
            Some(false) => {}
            None => {
                // Time is up: one last look (a change may have come from a replica whose notice was lost).
                let spec = svc::current_spec(&state, &node.node_id).await?;
                state.hub.seen(&node.node_id);
                return Ok(if spec.generation > after {
                    ApiJson(spec).into_response()
                } else {
                    StatusCode::NO_CONTENT.into_response()
                });
            }
        }
    }
}

/// Report what the node has now. Allocations whose instance it shows turn active. The processes it lists (per GPU,
/// on the GPU or its MIG devices) are judged against the devices' allocations: one no allocation covers is
/// unallocated use (`gpu.unallocated_use`, the first time it is seen). A status older than the stored one (lower
/// `observed_generation`) is ignored.
#[utoipa::path(put, path = "/api/v1/agent/status", tag = "agent", security(("node" = [])), request_body = NodeStatus,
    responses((status = 200, body = StatusOutcome), (status = 401, body = Problem), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "too_many_gpus, too_many_instances, invalid_uuid, duplicate_gpu, invalid_health, too_many_processes, invalid_process_device, invalid_process")))]
pub async fn put_status(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
    ApiJson(body): ApiJson<NodeStatus>,
) -> Result<ApiJson<StatusOutcome>, ApiError> {
    Ok(ApiJson(svc::ingest_status(&state, &node, &body).await?))
}

/// A heartbeat, for agents on the long-poll fallback (WebSocket agents send theirs on the socket).
#[utoipa::path(post, path = "/api/v1/agent/heartbeat", tag = "agent", security(("node" = [])),
    responses((status = 204), (status = 401, body = Problem), (status = 403, body = Problem)))]
pub async fn heartbeat(NodeAuth(node): NodeAuth, State(state): State<AppState>) -> StatusCode {
    state.hub.seen(&node.node_id);
    StatusCode::NO_CONTENT
}

/// The push channel: a WebSocket on which the server sends the node's spec (`{"type":"spec"}`) on connect and at
/// every new generation, and the agent sends heartbeats and status (`{"type":"heartbeat"}`,
/// `{"type":"status"}`). The server closes a socket that stays silent for three heartbeat intervals, and closes
/// it at once (code 4401) when the node's credential is revoked or the node joins again, and with code 1012 (service
/// restart: connect again at once) when the replica shuts down; a replica shutting down refuses new sockets (503
/// `shutting_down`). A node holds at most
/// four sockets on one server replica.
#[utoipa::path(get, path = "/api/v1/agent/ws", tag = "agent", security(("node" = [])),
    responses((status = 101, description = "Switching to the WebSocket protocol"), (status = 401, body = Problem),
        (status = 403, body = Problem), (status = 429, body = Problem, description = "too_many_sockets"),
        (status = 503, body = Problem, description = "shutting_down")))]
pub async fn websocket(
    State(state): State<AppState>,
    NodeAuth(node): NodeAuth,
    headers: axum::http::HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    if state.draining.is_draining() {
        // Its agent connects again after its backoff, through the balancer to a replica that stays.
        return Err(ApiError::Invalid {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "shutting_down",
            detail: "this replica is shutting down: connect to another".into(),
        });
    }
    let credential = super::auth::node_credential_hash(&headers).unwrap_or_default();
    let slot = state.hub.open_socket(&node.node_id).ok_or_else(|| ApiError::Invalid {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "too_many_sockets",
        detail: format!("node {} has {} sockets open already", node.node_name, svc::MAX_SOCKETS_PER_NODE),
    })?;
    // Agent messages are a few KiB: small buffers (they grow for a larger message) keep a thousand sockets cheap;
    // the 128 KiB default read buffer would cost 125 MiB for a thousand agents.
    Ok(upgrade
        .max_message_size(super::BODY_LIMIT)
        .read_buffer_size(8 * 1024)
        .write_buffer_size(8 * 1024)
        .on_upgrade(move |socket| push(state, node, credential, slot, socket)))
}

/// The close code a socket gets when its credential stops being valid.
const CLOSE_REVOKED: u16 = 4401;
/// The close code a socket gets when the replica shuts down (RFC 6455's "service restart"): the agent connects
/// again at once, through the load balancer to a replica that stays.
pub const CLOSE_RESTARTING: u16 = 1012;

async fn push(state: AppState, node: NodePrincipal, credential: String, _slot: svc::SocketSlot, mut socket: WebSocket) {
    state.hub.seen(&node.node_id);
    let mut changes = state.hub.subscribe(&node.node_id);
    let mut revoked = state.store.node_credential_revocations();
    let mut sent = 0;
    let silent_limit = HEARTBEAT * 3;
    // Also looks at the store now and then, in case a change notice from another replica was lost.
    let mut recheck = tokio::time::interval(Duration::from_secs(30));
    let mut last_heard = tokio::time::Instant::now();
    let draining = state.draining.clone();
    let shutting_down = draining.begun();
    tokio::pin!(shutting_down);
    loop {
        let wake = tokio::select! {
            () = &mut shutting_down => {
                let frame = axum::extract::ws::CloseFrame { code: CLOSE_RESTARTING, reason: "server restarting".into() };
                let _ = socket.send(Message::Close(Some(frame))).await;
                return;
            }
            got = revoked.recv() => {
                let mine = match got {
                    Ok(node_id) => node_id == node.node_id,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let valid = |found: Result<Option<NodePrincipal>, StoreError>| {
                    found.is_ok_and(|n| n.is_some_and(|n| n.node_id == node.node_id))
                };
                if mine && !valid(state.store.node_by_credential(&credential).await) {
                    tracing::info!(node = %node.node_name, "node credential revoked; closing its socket");
                    let frame = axum::extract::ws::CloseFrame { code: CLOSE_REVOKED, reason: "credential revoked".into() };
                    let _ = socket.send(Message::Close(Some(frame))).await;
                    return;
                }
                false
            }
            _ = recheck.tick() => true,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                *changes.borrow_and_update() > sent
            }
            got = tokio::time::timeout_at(last_heard + silent_limit, socket.recv()) => {
                let msg = match got {
                    Err(_) => {
                        tracing::info!(node = %node.node_name, "agent went silent; closing its socket");
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    Ok(None | Some(Err(_))) => return,
                    Ok(Some(Ok(msg))) => msg,
                };
                last_heard = tokio::time::Instant::now();
                state.hub.seen(&node.node_id);
                match msg {
                    Message::Text(text) => match serde_json::from_str::<AgentMessage>(&text) {
                        Ok(AgentMessage::Heartbeat) => {}
                        Ok(AgentMessage::Status { status }) => {
                            if let Err(e) = svc::ingest_status(&state, &node, &status).await {
                                tracing::warn!(node = %node.node_name, error = %e, "status not taken");
                            }
                        }
                        Err(e) => tracing::warn!(node = %node.node_name, error = %e, "unreadable agent message"),
                    },
                    Message::Close(_) => return,
                    _ => {}
                }
                false
            }
        };
        if !wake {
            continue;
        }
        match svc::current_spec(&state, &node.node_id).await {
            Ok(spec) if spec.generation > sent => {
                let generation = spec.generation;
                let text = match serde_json::to_string(&ServerMessage::Spec { spec }) {
                    Ok(t) => t,
                    Err(_) => return,
                };
                if socket.send(Message::Text(text.into())).await.is_err() {
                    return;
                }
                sent = generation;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(node = %node.node_name, error = %e, "cannot read the node's spec"),
        }
    }
}
