//! Slice requests over HTTP: create (with `Idempotency-Key`), list with cursor pagination, get (with `ETag`), and
//! the actions approve, reject, cancel and release (with `If-Match`, so that of two admins acting at once one wins
//! and the other gets 409).

use crate::auth::Caller;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tessera_core::request::RequestState;
use tessera_services::auth::Permissions;

use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::precondition::{IfMatch, IfMatchParam, etag, versioned};
pub use tessera_api::requests::{
    ApprovalView, ListQuery, NewRequestBody, RejectBody, ReleaseBody, RequestPage, RequestPreview, RequestView,
    ReservedInstance, Waiting,
};
use tessera_services::app::AppState;
use tessera_services::requests::{self, Action};
use tessera_store::{RequestFilter, SliceRequest};

/// What a request body asks for, as the services take it.
fn ask_of(body: &NewRequestBody) -> requests::Ask<'_> {
    requests::Ask {
        tenant: &body.tenant,
        spec: &body.spec,
        count: body.count,
        reason: &body.reason,
        duration_s: body.duration_s,
        priority: body.priority,
    }
}

/// A request with its `ETag` and, while it waits, why (`waiting`), as of this answer.
async fn with_waiting(
    state: &AppState,
    p: &tessera_store::Principal,
    status: StatusCode,
    request: SliceRequest,
) -> Result<Response, ApiError> {
    let mut ctx = tessera_services::waits::Context::read(state, p).await?;
    let waiting = tessera_services::waits::explain(state, &mut ctx, &request).await?;
    let (version, location) = (request.version, format!("/api/v1/requests/{}", request.id));
    let view = RequestView { waiting, ..RequestView::from(request) };
    Ok(versioned(status, version, &location, view))
}

fn with_etag(status: StatusCode, request: SliceRequest) -> Response {
    let (version, location) = (request.version, format!("/api/v1/requests/{}", request.id));
    versioned(status, version, &location, RequestView::from(request))
}

/// Ask for slices. Within quota it is pending (or approved at once where the tenant's policy allows); over quota it
/// is refused with every limit it would exceed. Retrying with the same `Idempotency-Key` returns the first request.
/// The answer says why it waits (`waiting`) as `GET` does, from a reading begun after the request was made, but
/// without its place in the queue (`queue_position` is null): `GET` its `Location` for that. (`waiting` is null
/// too, with the request made, in the rare case that reading fails.)
#[utoipa::path(post, path = "/api/v1/requests", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])), request_body = NewRequestBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "retry key, 1-200 characters")),
    responses((status = 201, body = RequestView, description = "created"),
        (status = 200, body = RequestView, description = "an earlier request with the same Idempotency-Key"),
        (status = 404, body = Problem), (status = 409, body = Problem, description = "quota_exceeded or budget_exhausted"),
        (status = 422, body = Problem)))]
pub async fn create_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    headers: HeaderMap,
    ApiJson(body): ApiJson<NewRequestBody>,
) -> Result<Response, ApiError> {
    let key = headers.get("idempotency-key").map(|v| v.to_str().unwrap_or(""));
    let ask = ask_of(&body);
    let (request, created) = requests::create(&state, &p, ask, key).await?;
    // The reading an explanation needs is bounded by the fleet (the requests holding slices), shared per wave of
    // callers; the queue is not read, so a creation costs the same however long the queue is.
    // The request is made: a failure to explain its wait leaves `waiting` null rather than answer an error for a
    // request that exists (a client would make it again).
    let waiting = match tessera_services::waits::explain_created(&state, &p, &request, created).await {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(request = %request.id, error = %e, "explaining the new request's wait failed");
            None
        }
    };
    let (version, location) = (request.version, format!("/api/v1/requests/{}", request.id));
    let view = RequestView { waiting, ..RequestView::from(request) };
    Ok(versioned(if created { StatusCode::CREATED } else { StatusCode::OK }, version, &location, view))
}

/// What creating this request would do now, without writing anything: the quota it takes (and whether it would be
/// refused, with the problem creation would answer), whether the tenant's policy approves it, where the planner
/// would place it (and whether a layout change needs an admin), and, if it would wait, why and from when it could
/// start. The same checks and rules as creation, so a preview that says `approved_now` and a creation a moment later
/// with nothing changed in between agree.
#[utoipa::path(post, path = "/api/v1/requests/preview", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])), request_body = NewRequestBody,
    responses((status = 200, body = RequestPreview), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_reason, invalid_count, invalid_duration, request_invalid")))]
pub async fn preview_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NewRequestBody>,
) -> Result<ApiJson<RequestPreview>, ApiError> {
    let ask = ask_of(&body);
    Ok(ApiJson(requests::preview(&state, &p, ask).await?))
}

/// List requests, a page at a time: oldest first, or newest first (`order=newest`); live ones only (`open=true`)
/// or ended ones only (`open=false`).
#[utoipa::path(get, path = "/api/v1/requests", tag = "requests", security(("token" = ["user"]), ("session" = ["user"])), params(ListQuery),
    responses((status = 200, body = RequestPage), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn list_requests(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit.unwrap_or(100);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::invalid("invalid_limit", "limit must be between 1 and 500"));
    }
    let tenant = p.listing_tenant(q.tenant.as_deref())?;
    // The page depends only on the filter (visibility was settled above), so one cached body serves every caller.
    // JSON, so that no value can pass for another field however it is spelt.
    let newest_first = q.order == Some(tessera_api::requests::ListOrder::Newest);
    let key = serde_json::json!([
        "requests",
        tenant,
        q.state.map(RequestState::as_str),
        q.cursor,
        limit,
        q.open,
        newest_first
    ])
    .to_string();
    let generation = state.store.generation();
    if let Some(body) = generation.and_then(|g| state.reads.get(&key, g)) {
        return Ok(json_body(body));
    }
    let filter = RequestFilter {
        tenant: tenant.as_deref(),
        state: q.state,
        after: q.cursor.as_deref(),
        limit: limit + 1,
        open: q.open,
        newest_first,
    };
    let mut items = state.store.list_requests(filter).await?;
    let next_cursor = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|r| r.id.clone())
    } else {
        None
    };
    let page = RequestPage { items: items.into_iter().map(RequestView::from).collect(), next_cursor };
    let body = axum::body::Bytes::from(serde_json::to_vec(&page).map_err(|e| ApiError::Internal(e.to_string()))?);
    if let Some(g) = generation {
        state.reads.put(key, g, body.clone());
    }
    Ok(json_body(body))
}

fn json_body(body: axum::body::Bytes) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// A request, with its `ETag`; while it waits, why (`waiting`: the reason, its place in the queue, its earliest
/// start), as of this answer.
#[utoipa::path(get, path = "/api/v1/requests/{id}", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = RequestView), (status = 404, body = Problem)))]
pub async fn get_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let request = requests::get(&state, &p, &id).await?;
    with_waiting(&state, &p, StatusCode::OK, request).await
}

/// Why each of a tenant's waiting requests (pending, approved, provisioning) waits, oldest first (at most 500):
/// the reason, its place in the queue, its earliest start. Read now, so always current.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/waiting", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")),
    responses((status = 200, body = Vec<Waiting>), (status = 404, body = Problem)))]
pub async fn tenant_waiting(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Vec<Waiting>>, ApiError> {
    let t = tessera_services::tenants::get(&state, &p, &id).await?;
    let all = tessera_services::waits::waiting(&state, &p, Some(&t.id)).await?;
    Ok(ApiJson(all.into_iter().map(|(_, w)| w).collect()))
}

/// Approve a pending request (platform admins). A MIG request is placed by the planner on exact instances; layout
/// changes it needs become proposals (or apply at once on auto-layout GPUs). `If-Match` is optional: send the `ETag`
/// you saw so that of two admins acting at once one wins; a value that is not a quoted `ETag` is refused.
#[utoipa::path(post, path = "/api/v1/requests/{id}/approve", tag = "requests", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam),
    responses((status = 200, body = ApprovalView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem,
            description = "version_conflict, request_invalid_transition, no_capacity, reserved or plan_stale")))]
pub async fn approve_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
) -> Result<Response, ApiError> {
    let approval = tessera_services::approvals::approve(&state, &p, &id, version).await?;
    let tag = etag(approval.request.version);
    let view = ApprovalView {
        reservations: approval
            .reservations
            .into_iter()
            .map(|r| ReservedInstance { gpu: r.gpu_id, profile: r.profile, start: r.start, new: r.change.is_some() })
            .collect(),
        layout_proposals: approval.proposals.into_iter().map(Into::into).collect(),
        request: approval.request.into(),
    };
    let mut response = ApiJson(view).into_response();
    response.headers_mut().insert(header::ETAG, tag);
    Ok(response)
}

/// Reject a pending request with a reason (platform admins).
#[utoipa::path(post, path = "/api/v1/requests/{id}/reject", tag = "requests", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam), request_body = RejectBody,
    responses((status = 200, body = RequestView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem), (status = 422, body = Problem, description = "reason_required")))]
pub async fn reject_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
    ApiJson(body): ApiJson<RejectBody>,
) -> Result<Response, ApiError> {
    let rejected = requests::act(&state, &p, &id, Action::Reject, version, Some(&body.reason)).await?;
    Ok(with_etag(StatusCode::OK, rejected))
}

/// Cancel a request that is not active yet (the tenant's members).
#[utoipa::path(post, path = "/api/v1/requests/{id}/cancel", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path), IfMatchParam),
    responses((status = 200, body = RequestView), (status = 404, body = Problem), (status = 409, body = Problem)))]
pub async fn cancel_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, requests::act(&state, &p, &id, Action::Cancel, version, None).await?))
}

/// Release an active request: its instances and quota are given back and its node is told. The tenant's members
/// release their own; a platform admin may reclaim any tenant's (an idle allocation, say), giving a reason when not
/// a member of that tenant. The body is optional.
#[utoipa::path(post, path = "/api/v1/requests/{id}/release", tag = "requests", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path), IfMatchParam),
    request_body(content = Option<ReleaseBody>, description = "optional; an empty body is no reason"),
    responses((status = 200, body = RequestView), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "request_invalid_transition (not active) or version_conflict"),
        (status = 422, body = Problem, description = "reason_required")))]
pub async fn release_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: ReleaseBody = super::error::optional_json(&body, "a release")?;
    let released = requests::act(&state, &p, &id, Action::Release, version, body.reason.as_deref()).await?;
    Ok(with_etag(StatusCode::OK, released))
}
