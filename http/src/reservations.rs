//! Reservations over HTTP: a tenant's members book slices for a window ahead (`POST /tenants/{id}/reservations`,
//! accepted at once where the tenant's policy approves them on its own), preview a booking, list and read them,
//! cancel; platform admins accept or reject pending ones and set the policies that bound them. Each change takes
//! `If-Match`, so that of two callers acting on the same version one wins.

use crate::auth::Caller;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;

use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use super::precondition::{IfMatch, IfMatchParam, versioned};
pub use tessera_api::requests::RejectBody;
pub use tessera_api::reservations::{
    CalendarQuery, CalendarView, NewReservationBody, ReservationPage, ReservationPolicy, ReservationPolicyView,
    ReservationPreview, ReservationQuery, ReservationView,
};
use tessera_services::app::AppState;
use tessera_services::reservations;
use tessera_store::reservations::ReservationRecord;

/// The view of a stored reservation at `now`.
pub fn view(r: ReservationRecord, now: i64) -> ReservationView {
    let ending_soon = r.state == tessera_api::reservations::ReservationState::Started
        && r.end_ms - now <= reservations::ENDING_SOON_MS
        && r.end_ms > now;
    ReservationView {
        id: r.id,
        tenant: r.tenant_id,
        spec: r.spec,
        count: r.count,
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        state: r.state,
        reason: r.reason,
        decision: r.decision,
        request: r.request_id,
        created_by: r.created_by,
        decided_by: r.decided_by,
        version: r.version,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        ending_soon,
    }
}

/// A booking's window is two times in `0..=MAX_TIME_MS` (422 `invalid_time` otherwise), so that no arithmetic on
/// them can overflow.
fn window_times(body: &NewReservationBody) -> Result<(), ApiError> {
    super::time_param("start_ms", Some(body.start_ms))?;
    super::time_param("end_ms", Some(body.end_ms))?;
    Ok(())
}

fn with_etag(status: StatusCode, r: ReservationRecord) -> Response {
    let (version, location) = (r.version, format!("/api/v1/reservations/{}", r.id));
    versioned(status, version, &location, view(r, tessera_store::now_ms()))
}

/// Book slices for a window ahead (the tenant's members): accepted at once where the tenant's policy approves the
/// slices on its own, else pending for a platform admin. The tenant's quota is checked for the window (what it will
/// hold then), and the fleet must have room for the whole window with every accepted reservation and every
/// allocation whose end is known; from then on that room is protected.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/reservations", tag = "reservations", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = NewReservationBody,
    responses((status = 201, body = ReservationView, description = "booked: `accepted`, or `pending` for a platform admin"),
        (status = 404, body = Problem),
        (status = 409, body = Problem, description = "no_room_in_window, quota_exceeded or calendar_busy"),
        (status = 422, body = Problem, description = "invalid_time, invalid_window, reservation_too_long, reservation_too_far_ahead, \
            too_many_reservations, invalid_count, invalid_reason, unknown_model or unknown_profile")))]
pub async fn create_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewReservationBody>,
) -> Result<Response, ApiError> {
    window_times(&body)?;
    Ok(with_etag(StatusCode::CREATED, reservations::book(&state, &p, &id, &body).await?))
}

/// What booking would do, without writing anything: whether it fits, whether the policy accepts it on its own, and
/// how many slices of the spec the window has room for.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/reservations/preview", tag = "reservations", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = NewReservationBody,
    responses((status = 200, body = ReservationPreview), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_time (a window time outside 0 to 253402300799999), \
            invalid_count, invalid_reason, request_invalid (an unknown model or profile, replicas out of range): a \
            body booking would refuse as malformed; what booking would refuse for the policy, quota or room is in \
            `refused`")))]
pub async fn preview_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewReservationBody>,
) -> Result<ApiJson<ReservationPreview>, ApiError> {
    window_times(&body)?;
    Ok(ApiJson(reservations::preview(&state, &p, &id, &body).await?))
}

/// Reservations by start: every tenant's for platform admins, one tenant's otherwise.
#[utoipa::path(get, path = "/api/v1/reservations", tag = "reservations", security(("token" = ["user"]), ("session" = ["user"])),
    params(ReservationQuery),
    responses((status = 200, body = ReservationPage), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "tenant_required, invalid_limit, invalid_time or invalid_query")))]
pub async fn list_reservations(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<ReservationQuery>,
) -> Result<ApiJson<ReservationPage>, ApiError> {
    super::time_param("from_ms", q.from_ms)?;
    super::time_param("to_ms", q.to_ms)?;
    let now = tessera_store::now_ms();
    let items = reservations::list(&state, &p, &q).await?.into_iter().map(|r| view(r, now)).collect();
    Ok(ApiJson(ReservationPage { items }))
}

/// A reservation, with its `ETag`.
#[utoipa::path(get, path = "/api/v1/reservations/{id}", tag = "reservations", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path)), responses((status = 200, body = ReservationView), (status = 404, body = Problem)))]
pub async fn get_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, reservations::get(&state, &p, &id).await?))
}

/// Accept a pending reservation (platform admins), if the fleet still has room for its window.
#[utoipa::path(post, path = "/api/v1/reservations/{id}/approve", tag = "reservations", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam),
    responses((status = 200, body = ReservationView), (status = 400, body = Problem, description = "invalid_if_match"),
        (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "version_conflict, reservation_invalid_transition, reservation_started, no_room_in_window or calendar_busy")))]
pub async fn approve_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, reservations::approve(&state, &p, &id, version).await?))
}

/// Reject a pending reservation with a reason (platform admins).
#[utoipa::path(post, path = "/api/v1/reservations/{id}/reject", tag = "reservations", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path), IfMatchParam),
    request_body = RejectBody,
    responses((status = 200, body = ReservationView), (status = 400, body = Problem, description = "invalid_if_match"),
        (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 409, body = Problem, description = "version_conflict or reservation_invalid_transition"),
        (status = 422, body = Problem, description = "reason_required or invalid_reason")))]
pub async fn reject_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
    ApiJson(body): ApiJson<RejectBody>,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, reservations::reject(&state, &p, &id, version, &body.reason).await?))
}

/// Withdraw a reservation (the tenant's members, platform admins): a pending or accepted one is cancelled; a started
/// one releases its slices and ends.
#[utoipa::path(post, path = "/api/v1/reservations/{id}/cancel", tag = "reservations", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path), IfMatchParam),
    responses((status = 200, body = ReservationView), (status = 400, body = Problem, description = "invalid_if_match"),
        (status = 404, body = Problem),
        (status = 409, body = Problem, description = "version_conflict or reservation_invalid_transition")))]
pub async fn cancel_reservation(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    IfMatch(version): IfMatch,
) -> Result<Response, ApiError> {
    Ok(with_etag(StatusCode::OK, reservations::cancel(&state, &p, &id, version).await?))
}

/// The reservation policy every tenant without its own follows (anyone signed in may read it).
#[utoipa::path(get, path = "/api/v1/reservation-policy", tag = "reservations", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = ReservationPolicyView)))]
pub async fn get_global_policy(
    State(state): State<AppState>,
    Caller(_p): Caller,
) -> Result<ApiJson<ReservationPolicyView>, ApiError> {
    let (policy, source) = match state.store.reservation_policy(reservations::GLOBAL).await? {
        Some(p) => (p, "global"),
        None => (ReservationPolicy::default(), "default"),
    };
    Ok(ApiJson(ReservationPolicyView { policy, source: source.to_string() }))
}

/// Set the reservation policy of every tenant without its own (platform admins).
#[utoipa::path(put, path = "/api/v1/reservation-policy", tag = "reservations", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    request_body = ReservationPolicy,
    responses((status = 200, body = ReservationPolicyView), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "invalid_policy")))]
pub async fn set_global_policy(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<ReservationPolicy>,
) -> Result<ApiJson<ReservationPolicyView>, ApiError> {
    reservations::set_policy(&state, &p, None, Some(&body)).await?;
    Ok(ApiJson(ReservationPolicyView { policy: body, source: "global".to_string() }))
}

/// The reservation policy a tenant follows, and where it comes from (the tenant's members).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/reservation-policy", tag = "reservations", security(("token" = ["tenant-member"]), ("session" = ["tenant-member"])),
    params(("id" = String, Path, description = "The tenant's id or its name")),
    responses((status = 200, body = ReservationPolicyView), (status = 404, body = Problem)))]
pub async fn get_tenant_policy(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<ReservationPolicyView>, ApiError> {
    let tenant = tessera_services::tenants::get(&state, &p, &id).await?;
    let (policy, source) = reservations::policy(&state, &tenant.id).await?;
    Ok(ApiJson(ReservationPolicyView { policy, source: source.to_string() }))
}

/// Set a tenant's own reservation policy (platform admins).
#[utoipa::path(put, path = "/api/v1/tenants/{id}/reservation-policy", tag = "reservations", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = ReservationPolicy,
    responses((status = 200, body = ReservationPolicyView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_policy")))]
pub async fn set_tenant_policy(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ReservationPolicy>,
) -> Result<ApiJson<ReservationPolicyView>, ApiError> {
    reservations::set_policy(&state, &p, Some(&id), Some(&body)).await?;
    Ok(ApiJson(ReservationPolicyView { policy: body, source: "tenant".to_string() }))
}

/// The fleet's calendar (anyone signed in): per GPU, live allocations until their known end and accepted
/// reservations where the planner would place them at their start, over a range of at most 31 days. Blocks of
/// tenants the caller may not see carry no tenant.
#[utoipa::path(get, path = "/api/v1/calendar", tag = "reservations", security(("token" = ["user"]), ("session" = ["user"])),
    params(CalendarQuery),
    responses((status = 200, body = CalendarView), (status = 422, body = Problem, description = "invalid_range, invalid_time, unknown_model or invalid_query")))]
pub async fn calendar(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<CalendarQuery>,
) -> Result<ApiJson<CalendarView>, ApiError> {
    super::time_param("from_ms", q.from_ms)?;
    super::time_param("to_ms", q.to_ms)?;
    Ok(ApiJson(reservations::calendar(&state, &p, &q).await?))
}
