//! Quota requests over HTTP: a tenant's admin asks (`POST /tenants/{id}/quota-requests`), platform admins grant
//! or refuse, the tenant's admins withdraw (each with `If-Match`, so that of two admins one wins); the history of
//! a tenant's limits.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::precondition::{IfMatch, IfMatchParam, versioned};
pub use tessera_api::quotas::{
    GrantBody, LimitChangeView, NewQuotaRequest, QuotaRequestPage, QuotaRequestQuery, QuotaRequestView, QuotaStanding,
    QuotaSuggestion, QuotaTimeline, TimelineQuery,
};
pub use tessera_api::requests::RejectBody;
use tessera_services::app::AppState;
use tessera_services::quotas;
use tessera_store::quotas::QuotaRequest;

fn with_etag(status: StatusCode, request: QuotaRequest) -> Response {
    let (version, location) = (request.version, format!("/api/v1/quota-requests/{}", request.id));
    versioned(status, version, &location, QuotaRequestView::from(request))
}

/// Ask for new limits for a tenant (its admins and platform admins): each resource with the limit needed and a
/// reason; with `until_ms`, a temporary increase that is taken back at that time.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/quota-requests", tag = "tenants", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = NewQuotaRequest,
    responses((status = 201, body = QuotaRequestView, description = "created, pending for a platform admin"),
        (status = 403, body = Problem, description = "a member who is not the tenant's admin"),
        (status = 404, body = Problem),
        (status = 422, body = Problem, description = "quota_request_invalid, quota_bad_resource, quota_bad_limit, \
            quota_unchanged, quota_temporary_not_increase, invalid_time, reason_required or invalid_reason")))]
pub async fn create_quota_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewQuotaRequest>,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::CREATED, quotas::ask(&state, &p, &id, &body).await?))
}

/// Pass an ask for more quota to the tenant's admins (any member; the platform admins where the tenant has none):
/// the same body as a quota request; nothing changes but an event (`quota_request.suggested`) in the inbox of the
/// tenant's members (its admins among them) and of platform admins, and a line in the audit log. One every 10 s per
/// member and tenant.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/quota-suggestions", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = NewQuotaRequest,
    responses((status = 202, body = QuotaSuggestion, description = "passed to the tenant's admins"),
        (status = 404, body = Problem),
        (status = 422, body = Problem, description = "quota_bad_resource, quota_bad_limit, reason_required or invalid_reason"),
        (status = 429, body = Problem, description = "rate_limited")))]
pub async fn suggest_quota(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewQuotaRequest>,
) -> Result<(StatusCode, ApiJson<QuotaSuggestion>), ApiError> {
    Ok((StatusCode::ACCEPTED, ApiJson(quotas::suggest(&state, &p, &id, &body).await?)))
}

/// Quota requests, newest first: every tenant's for platform admins, your tenants' otherwise.
#[utoipa::path(get, path = "/api/v1/quota-requests", tag = "tenants", security(("token" = ["user"]), ("session" = ["user"])),
    params(QuotaRequestQuery),
    responses((status = 200, body = QuotaRequestPage), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn list_quota_requests(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<QuotaRequestQuery>,
) -> Result<ApiJson<QuotaRequestPage>, ApiError> {
    let (items, next_cursor) = quotas::list(&state, &p, &q).await?;
    Ok(ApiJson(QuotaRequestPage { items: items.into_iter().map(Into::into).collect(), next_cursor }))
}

/// A quota request, with its `ETag`.
#[utoipa::path(get, path = "/api/v1/quota-requests/{id}", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = QuotaRequestView), (status = 404, body = Problem)))]
pub async fn get_quota_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, quotas::get(&state, &p, &id).await?))
}

/// Grant a pending quota request (platform admins): everything as asked, or the amounts in `limits` (each from the
/// limit in force to the amount asked; resources left out are not granted). The limits change at once. A grant
/// never lowers a limit an increase asked to raise: lines the limits in force already give are skipped, and when
/// every line is already given the answer is 409 `quota_ask_already_met` (reject or withdraw the request).
#[utoipa::path(post, path = "/api/v1/quota-requests/{id}/approve", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam),
    request_body(content = Option<GrantBody>, description = "optional; an empty body grants everything as asked"),
    responses((status = 200, body = QuotaRequestView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 400, body = Problem, description = "invalid_if_match or invalid_body"),
        (status = 409, body = Problem, description = "version_conflict, quota_request_invalid_transition or quota_ask_already_met"),
        (status = 422, body = Problem, description = "quota_grant_invalid, quota_bad_resource, quota_bad_limit or invalid_reason")))]
pub async fn approve_quota_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let body: GrantBody = super::error::optional_json(&body, "a grant")?;
    Ok(with_etag(StatusCode::OK, quotas::approve(&state, &p, &id, version, &body).await?))
}

/// Refuse a pending quota request with a reason (platform admins).
#[utoipa::path(post, path = "/api/v1/quota-requests/{id}/reject", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam),
    request_body = RejectBody,
    responses((status = 200, body = QuotaRequestView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "version_conflict or quota_request_invalid_transition"),
        (status = 422, body = Problem, description = "reason_required or invalid_reason")))]
pub async fn reject_quota_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
    ApiJson(body): ApiJson<RejectBody>,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, quotas::reject(&state, &p, &id, version, &body.reason).await?))
}

/// Withdraw a pending quota request (the tenant's admins, platform admins).
#[utoipa::path(post, path = "/api/v1/quota-requests/{id}/cancel", tag = "tenants", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), IfMatchParam),
    responses((status = 200, body = QuotaRequestView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "version_conflict or quota_request_invalid_transition")))]
pub async fn cancel_quota_request(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, quotas::cancel(&state, &p, &id, version).await?))
}

/// How many limit changes a history read returns.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryQuery {
    /// At most this many, newest first: 1-1000 (default 200).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// Every change of a tenant's limits, newest first: who, when, why, and the quota request that made it.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/quota-history", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name"), HistoryQuery),
    responses((status = 200, body = Vec<LimitChangeView>), (status = 404, body = Problem), (status = 422, body = Problem)))]
pub async fn quota_history(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<ApiJson<Vec<LimitChangeView>>, ApiError> {
    let changes = quotas::history(&state, &p, &id, q.limit.unwrap_or(200)).await?;
    Ok(ApiJson(changes.into_iter().map(Into::into).collect()))
}

/// A tenant's limit, maximum, held and used amounts of one resource, hour by hour over the last `days` days: what
/// it was allowed, what it asked for and what ran.
#[utoipa::path(get, path = "/api/v1/tenants/{id}/quota-timeline", tag = "tenants", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name"), TimelineQuery),
    responses((status = 200, body = QuotaTimeline), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_days or quota_bad_resource")))]
pub async fn quota_timeline(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<TimelineQuery>,
) -> Result<ApiJson<QuotaTimeline>, ApiError> {
    Ok(ApiJson(tessera_services::governance::timeline(&state, &p, &id, &q).await?))
}

/// Where every tenant stands (platform admins): who borrows from its cohort, who waits within its guarantee, who
/// holds quota it did not use in 30 days, and how far its budgets are spent.
#[utoipa::path(get, path = "/api/v1/quota-standing", tag = "tenants", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = QuotaStanding), (status = 403, body = Problem)))]
pub async fn quota_standing(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<QuotaStanding>, ApiError> {
    Ok(ApiJson(tessera_services::governance::standing(&state, &p).await?))
}
