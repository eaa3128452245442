//! Notifications: webhook endpoints (a tenant's or the platform's), their deliveries, and the events a user may
//! read (the inbox).

use serde::{Deserialize, Serialize};

/// A new webhook endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WebhookCreate {
    /// Where deliveries are posted: an `http` or `https` URL, at most 2,048 bytes.
    pub url: String,
    /// `standard` (the default): CloudEvents JSON signed per the Standard Webhooks specification (`webhook-id`,
    /// `webhook-timestamp`, `webhook-signature`); `slack`: `{"text": ...}` for a Slack-compatible incoming webhook.
    #[serde(default)]
    pub format: Option<String>,
    /// Event types (`request.active`), areas (`request.*`) or `*`; empty or absent: every type. At most 64.
    #[serde(default)]
    pub types: Vec<String>,
    /// Free text, at most 200 characters.
    #[serde(default)]
    pub description: String,
}

/// A webhook endpoint. Its secret is shown only when it is made or rotated.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookView {
    /// Its id.
    pub id: String,
    /// Its tenant; `null` for a platform-wide endpoint (which receives every tenant's events).
    pub tenant: Option<String>,
    /// Where deliveries are posted.
    pub url: String,
    /// `standard` or `slack`.
    pub format: String,
    /// The event types it wants (empty: every type).
    pub types: Vec<String>,
    /// Free text.
    pub description: String,
    /// Until when (UTC ms) the secret before the last rotation signs deliveries too; `null` without an overlap.
    pub previous_secret_until_ms: Option<i64>,
    /// Who made it.
    pub created_by: String,
    /// When, UTC ms.
    pub created_at_ms: i64,
}

/// An endpoint just made or whose secret was just rotated, with its signing secret (shown this once).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookSecret {
    /// The endpoint.
    pub webhook: WebhookView,
    /// The signing secret, `whsec_` and base64 of 32 random bytes (the Standard Webhooks form).
    pub secret: String,
}

/// One event sent, or to be sent, to one endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// Its id.
    pub id: i64,
    /// The event's id (the `webhook-id` header and the CloudEvents `id`).
    pub event_id: String,
    /// The event's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// What the event is about, e.g. `request/<id>`.
    pub subject: String,
    /// `pending` (not yet answered with a 2xx; tried again with exponential backoff), `delivered`, or `failed`
    /// (tried for 24 hours).
    pub state: String,
    /// Attempts so far.
    pub attempts: i64,
    /// When it was first due, UTC ms.
    pub first_at_ms: i64,
    /// When it is tried next (pending), UTC ms.
    pub next_at_ms: i64,
    /// The last answer's HTTP status, if any.
    pub last_status: Option<i64>,
    /// Why the last attempt failed, as a class (empty when it did not): `http_status` (see `last_status`),
    /// `redirect_refused` (redirects are not followed), `timeout`, `connect_failed`, `dns_failed`,
    /// `address_not_allowed` (the host is, or resolves only to, an address the endpoint may not reach), `tls_failed`,
    /// `secret_unreadable` or `request_failed`. What the target answered is never shown.
    pub last_error: String,
    /// When it was delivered, UTC ms.
    pub delivered_at_ms: Option<i64>,
}

/// A page of an endpoint's deliveries, newest first.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct DeliveriesQuery {
    /// Only deliveries older than this id (the last id of the previous page).
    pub before: Option<i64>,
    /// At most this many (1 to 500, default 100).
    pub limit: Option<u32>,
}

/// The answer to a test: the event queued for the endpoint.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TestSent {
    /// The test event's id; its delivery shows in the endpoint's deliveries.
    pub event_id: String,
}

/// One event as the inbox shows it, and as webhooks carry it in the CloudEvents `data`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventView {
    /// Position in the event log: newer events have larger ones.
    pub seq: i64,
    /// The event's id.
    pub id: String,
    /// Its type, e.g. `request.active`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The tenant it concerns; `null` for a platform event.
    pub tenant: Option<String>,
    /// What it is about, e.g. `request/<id>`.
    pub subject: String,
    /// When, UTC ms.
    pub at_ms: i64,
    /// One line about it.
    pub text: String,
    /// The change: `actor`, `action`, and the object `before` and `after` it (as the audit log has them).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub data: serde_json::Value,
}

/// A page of the inbox, newest first.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct EventsQuery {
    /// Only events older than this `seq` (the last of the previous page).
    pub before: Option<i64>,
    /// At most this many (1 to 500, default 50).
    pub limit: Option<u32>,
}

/// An event type.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventTypeView {
    /// The type, e.g. `request.active`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What it tells.
    pub description: String,
}

/// How much of the inbox is unread.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InboxCount {
    /// Events newer than what the caller has read, counted up to 100 (100 means "100 or more").
    pub unread: u32,
    /// The newest event's `seq` the caller may read (0 without any): send it back to mark everything read.
    pub latest_seq: i64,
}

/// Marks the inbox read up to an event.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InboxRead {
    /// Every event with this `seq` or an older one counts as read (a lower value than before changes nothing).
    pub up_to: i64,
}

/// What reaches the caller by e-mail.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NotificationSettings {
    /// Whether this server sends e-mail at all (an SMTP server is configured).
    pub email_enabled: bool,
    /// Where the caller's mail goes: the address their identity provider gave, else their name when it is an
    /// address; `null` when they have none (nothing is mailed then).
    pub email: Option<String>,
    /// The event types (`request.active`), areas (`request.*`) or `*` mailed to the caller; empty: none. Only events
    /// the caller may read in the inbox are mailed, and only those made after the choice.
    pub email_types: Vec<String>,
    /// The latest e-mail deliveries to the caller, newest first (at most 20).
    pub recent: Vec<EmailDeliveryView>,
}

/// Which event types reach the caller by e-mail.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NotificationSettingsUpdate {
    /// Event types, areas (`request.*`) or `*`; empty: no mail. At most 64.
    pub email_types: Vec<String>,
}

/// One event mailed, or to be mailed, to the caller.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EmailDeliveryView {
    /// Its id.
    pub id: i64,
    /// The address it went to.
    pub address: String,
    /// The event's id.
    pub event_id: String,
    /// The event's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's subject.
    pub subject: String,
    /// `pending`, `delivered` or `failed`.
    pub state: String,
    /// Attempts so far.
    pub attempts: i64,
    /// The last attempt's error; empty when none.
    pub last_error: String,
    /// When the mail server took it, UTC ms.
    pub delivered_at_ms: Option<i64>,
}
