//! Webhook endpoints (a tenant's, managed by its admins; platform-wide, by platform admins), their delivery logs,
//! the event types, and the inbox of events the caller may read.

use crate::auth::Caller;
use axum::extract::{Extension, State};
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

use super::auth::Right;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, Problem};
use crate::listen::ClientAddr;
pub use tessera_api::notifications::{
    DeliveriesQuery, DeliveryView, EventTypeView, EventView, EventsQuery, InboxCount, InboxRead, NotificationSettings,
    NotificationSettingsUpdate, TestSent, WebhookCreate, WebhookSecret, WebhookView,
};
use tessera_services::app::AppState;
use tessera_services::notifications;
use tessera_services::streams::StreamKind;

/// Make a webhook endpoint for a tenant (its admins and platform admins). It receives the tenant's events only.
/// The answer holds the signing secret, shown this once.
#[utoipa::path(post, path = "/api/v1/tenants/{id}/webhooks", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")), request_body = WebhookCreate,
    responses((status = 201, body = WebhookSecret), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "webhook_bad_url, webhook_internal_address, webhook_bad_format, webhook_bad_type, webhook_bad_description or webhook_too_many")))]
pub async fn create_tenant_webhook(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<WebhookCreate>,
) -> Result<(StatusCode, ApiJson<WebhookSecret>), ApiError> {
    Ok((StatusCode::CREATED, ApiJson(notifications::create(&state, &p, Some(&id), &body).await?)))
}

/// A tenant's webhook endpoints (its admins and platform admins).
#[utoipa::path(get, path = "/api/v1/tenants/{id}/webhooks", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path, description = "The tenant's id or its name")),
    responses((status = 200, body = Vec<WebhookView>), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn list_tenant_webhooks(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<Vec<WebhookView>>, ApiError> {
    Ok(ApiJson(notifications::list(&state, &p, Some(&id)).await?))
}

/// Make a platform-wide webhook endpoint (platform admins). It receives every tenant's events and the platform's.
/// The answer holds the signing secret, shown this once.
#[utoipa::path(post, path = "/api/v1/webhooks", tag = "notifications", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    request_body = WebhookCreate,
    responses((status = 201, body = WebhookSecret), (status = 403, body = Problem),
        (status = 422, body = Problem, description = "webhook_bad_url, webhook_bad_format, webhook_bad_type, webhook_bad_description or webhook_too_many")))]
pub async fn create_webhook(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<WebhookCreate>,
) -> Result<(StatusCode, ApiJson<WebhookSecret>), ApiError> {
    Ok((StatusCode::CREATED, ApiJson(notifications::create(&state, &p, None, &body).await?)))
}

/// The platform-wide webhook endpoints (platform admins).
#[utoipa::path(get, path = "/api/v1/webhooks", tag = "notifications", security(("token" = ["platform-admin"]), ("session" = ["platform-admin"])),
    responses((status = 200, body = Vec<WebhookView>), (status = 403, body = Problem)))]
pub async fn list_webhooks(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<Vec<WebhookView>>, ApiError> {
    Ok(ApiJson(notifications::list(&state, &p, None).await?))
}

/// One webhook endpoint (who manages it: the tenant's admins, or platform admins).
#[utoipa::path(get, path = "/api/v1/webhooks/{id}", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path)),
    responses((status = 200, body = WebhookView), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn get_webhook(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<WebhookView>, ApiError> {
    Ok(ApiJson(notifications::get(&state, &p, &id).await?))
}

/// Delete a webhook endpoint and its delivery log.
#[utoipa::path(delete, path = "/api/v1/webhooks/{id}", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path)),
    responses((status = 204), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn delete_webhook(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    notifications::delete(&state, &p, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Rotate an endpoint's signing secret: the answer holds the new one (shown this once); deliveries carry a
/// signature with each secret for 24 hours, so a receiver can switch without losing any.
#[utoipa::path(post, path = "/api/v1/webhooks/{id}/rotate-secret", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path)),
    responses((status = 200, body = WebhookSecret), (status = 403, body = Problem), (status = 404, body = Problem)))]
pub async fn rotate_secret(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<ApiJson<WebhookSecret>, ApiError> {
    Ok(ApiJson(notifications::rotate(&state, &p, &id).await?))
}

/// Send a `webhook.test` event to this endpoint only; its delivery shows in the endpoint's log.
///
/// Once per endpoint every 10 s (on each replica).
#[utoipa::path(post, path = "/api/v1/webhooks/{id}/test", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path)),
    responses((status = 202, body = TestSent), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 429, body = Problem, description = "rate_limited: the endpoint was tested less than 10 s ago; `Retry-After` says when it may be again",
            headers(("Retry-After" = u64, description = "seconds until the endpoint may be tested again")))))]
pub async fn test_webhook(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, ApiJson<TestSent>), ApiError> {
    Ok((StatusCode::ACCEPTED, ApiJson(notifications::test(&state, &p, &id).await?)))
}

/// An endpoint's delivery log, newest first: each event sent or to be sent, its attempts and the last answer.
#[utoipa::path(get, path = "/api/v1/webhooks/{id}/deliveries", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), DeliveriesQuery),
    responses((status = 200, body = Vec<DeliveryView>), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 422, body = Problem, description = "invalid_limit")))]
pub async fn list_deliveries(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeliveriesQuery>,
) -> Result<ApiJson<Vec<DeliveryView>>, ApiError> {
    Ok(ApiJson(notifications::deliveries(&state, &p, &id, q.before, q.limit).await?))
}

/// Send a delivery again (pending from now, retried for another 24 hours), with the same event id.
///
/// Once per delivery every 10 s (on each replica).
#[utoipa::path(post, path = "/api/v1/webhooks/{id}/deliveries/{delivery}/redeliver", tag = "notifications", security(("token" = ["tenant-admin"]), ("session" = ["tenant-admin"])),
    params(("id" = String, Path), ("delivery" = i64, Path)),
    responses((status = 202, body = DeliveryView), (status = 403, body = Problem), (status = 404, body = Problem),
        (status = 429, body = Problem, description = "rate_limited: the delivery was sent again less than 10 s ago; `Retry-After` says when it may be again",
            headers(("Retry-After" = u64, description = "seconds until the delivery may be sent again")))))]
pub async fn redeliver(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiPath((id, delivery)): ApiPath<(String, String)>,
) -> Result<(StatusCode, ApiJson<DeliveryView>), ApiError> {
    // Read here, not by the extractor, so that a number past 64 bits is a problem report like any unknown id.
    let delivery = delivery.parse::<i64>().map_err(|_| ApiError::NotFound("delivery not found".to_string()))?;
    Ok((StatusCode::ACCEPTED, ApiJson(notifications::redeliver(&state, &p, &id, delivery).await?)))
}

/// Every event type, with what it tells (for webhook filters).
#[utoipa::path(get, path = "/api/v1/event-types", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = Vec<EventTypeView>)))]
pub async fn event_types(Caller(_p): Caller) -> ApiJson<Vec<EventTypeView>> {
    ApiJson(notifications::types())
}

/// The caller's inbox, newest first: events of the tenants it belongs to (every tenant's and the platform's for
/// platform admins).
#[utoipa::path(get, path = "/api/v1/inbox", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    params(EventsQuery),
    responses((status = 200, body = Vec<EventView>), (status = 422, body = Problem, description = "invalid_limit")))]
pub async fn inbox(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<ApiJson<Vec<EventView>>, ApiError> {
    Ok(ApiJson(notifications::inbox(&state, &p, q.before, q.limit).await?))
}

/// How much of the caller's inbox is unread (the portal's bell).
#[utoipa::path(get, path = "/api/v1/inbox/unread", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = InboxCount)))]
pub async fn inbox_unread(State(state): State<AppState>, Caller(p): Caller) -> Result<ApiJson<InboxCount>, ApiError> {
    Ok(ApiJson(notifications::unread(&state, &p).await?))
}

/// Server-sent events: an `inbox` event with the caller's unread count at once, and again whenever it changes (a new
/// event the caller may read, within a second; or its inbox was read). Each data line is an `InboxCount`. A stream
/// lasts 5 minutes and asks the client to reconnect after 2 s (`retry`), which `EventSource` does by itself; it
/// ends within 5 s when the caller's credential is revoked, their session ends, or their memberships or roles
/// change. A user holds at most 32 inbox streams on one replica, a client address at most 64 streams, and streams
/// together at most half the server's connections (`429 too_many_streams` past any of them).
#[utoipa::path(get, path = "/api/v1/inbox/stream", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, description = "`text/event-stream` of `inbox` events, each an `InboxCount`", content_type = "text/event-stream"),
        (status = 429, body = Problem, description = "too_many_streams")))]
pub async fn inbox_stream(
    State(state): State<AppState>,
    right: Right,
    addr: Option<Extension<ClientAddr>>,
) -> Result<Response, ApiError> {
    let held = super::streams::place(&state, StreamKind::Inbox, &right, addr.as_deref())?;
    let events = notifications::inbox_stream(state.clone(), right.principal.clone())
        .map(|count| Event::default().event("inbox").json_data(&count).unwrap_or_default());
    let events = super::streams::guarded(state, right, held, events);
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
}

/// Mark the caller's inbox read up to an event.
#[utoipa::path(post, path = "/api/v1/inbox/read", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    request_body = InboxRead,
    responses((status = 200, body = InboxCount), (status = 422, body = Problem, description = "invalid_seq")))]
pub async fn inbox_read(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<InboxRead>,
) -> Result<ApiJson<InboxCount>, ApiError> {
    Ok(ApiJson(notifications::mark_read(&state, &p, body.up_to).await?))
}

/// What reaches the caller by e-mail: whether this server sends mail, the caller's address, the event types they
/// chose and their latest deliveries.
#[utoipa::path(get, path = "/api/v1/notification-settings", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    responses((status = 200, body = NotificationSettings)))]
pub async fn notification_settings(
    State(state): State<AppState>,
    Caller(p): Caller,
) -> Result<ApiJson<NotificationSettings>, ApiError> {
    Ok(ApiJson(tessera_services::email_prefs::settings(&state, &p).await?))
}

/// Choose which event types reach the caller by e-mail (from now on; only events the caller may read).
#[utoipa::path(put, path = "/api/v1/notification-settings", tag = "notifications", security(("token" = ["user"]), ("session" = ["user"])),
    request_body = NotificationSettingsUpdate,
    responses((status = 200, body = NotificationSettings), (status = 422, body = Problem, description = "email_bad_type")))]
pub async fn set_notification_settings(
    State(state): State<AppState>,
    Caller(p): Caller,
    ApiJson(body): ApiJson<NotificationSettingsUpdate>,
) -> Result<ApiJson<NotificationSettings>, ApiError> {
    Ok(ApiJson(tessera_services::email_prefs::update(&state, &p, &body).await?))
}
