//! Notifications: webhook endpoints (a tenant's, managed by its admins; the platform's, by platform admins), the
//! worker that delivers events to them, and the inbox of events a user may read.
//!
//! Events come from the store's outbox (see [`tessera_store::notifications`]). The worker ([`start_background`])
//! dispatches new events into deliveries, claims due deliveries for a lease, posts them concurrently and records the
//! answers. A `standard` endpoint gets the event as CloudEvents JSON (structured mode), signed per the Standard
//! Webhooks specification: `webhook-id` (the event id, the same on every retry), `webhook-timestamp` (seconds) and
//! `webhook-signature` (`v1,` and base64 of HMAC-SHA256 over `id.timestamp.body` with the endpoint's secret; during a
//! rotation's overlap, a second signature with the previous secret). A `slack` endpoint gets `{"text": ...}`.
//! Redirects are not followed, and an answer counts as delivered only when it is 2xx. Where endpoints may connect,
//! and what the delivery log says of a failure, is [`super::outbound`]'s. Secrets are stored sealed
//! ([`crate::sealed`]); a test or a redelivery is throttled ([`super::throttle`]).

use crate::auth::Permissions;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use futures_util::StreamExt;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tessera_api::notifications::{
    DeliveryView, EventTypeView, EventView, InboxCount, TestSent, WebhookCreate, WebhookSecret, WebhookView,
};
use tessera_core::event::{self, TypeFilter};

use super::outbound::{Clients, FAILURES, classify, classify_status};
use crate::app::AppState;
use crate::error::ApiError;
pub use crate::state::delivery::Delivery;
pub use crate::state::inbox::{INBOX_POLL, InboxWatch};
use tessera_store::notifications::{Claimed, DeliveryRecord, EventRecord, NewWebhook, Sent, WebhookRecord};
use tessera_store::{Principal, Store, now_ms};

/// Prefix of webhook signing secrets (the Standard Webhooks form).
pub const SECRET_PREFIX: &str = "whsec_";
/// Longest endpoint URL, bytes.
pub const MAX_URL: usize = 2048;
/// Longest description, characters.
pub const MAX_DESCRIPTION: usize = 200;
/// Most endpoints per tenant, and platform-wide.
pub const MAX_WEBHOOKS: usize = 20;
/// How long the secret before a rotation keeps signing: 24 hours.
pub const ROTATION_OVERLAP_MS: i64 = 24 * 3_600_000;
/// How long a claimed delivery is kept from other senders (longer than any attempt).
const LEASE_MS: i64 = 60_000;
/// Deliveries sent at once.
const CLAIM_BATCH: u32 = 200;
/// How long events and finished deliveries are kept: 30 days (the inbox and the delivery log reach that far back).
pub const KEEP_MS: i64 = 30 * 24 * 3_600_000;
/// How often the worker forgets what is older than [`KEEP_MS`].
const PURGE_EVERY: Duration = Duration::from_secs(3600);
/// Deliveries in flight to one endpoint at once.
const PER_ENDPOINT: usize = 16;
/// How often the worker looks for work when it found none.
const POLL: Duration = Duration::from_millis(100);

/// A fresh signing secret: `whsec_` and base64 of 32 random bytes.
pub fn new_secret() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::Internal(format!("no randomness: {e}")))?;
    Ok(format!("{SECRET_PREFIX}{}", B64.encode(bytes)))
}

/// The Standard Webhooks signature of `body` for event `id` at `timestamp` (seconds) with `secret`: `v1,<base64>`.
pub fn sign(secret: &str, id: &str, timestamp: i64, body: &[u8]) -> Option<String> {
    let key = B64.decode(secret.strip_prefix(SECRET_PREFIX).unwrap_or(secret)).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).ok()?;
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    Some(format!("v1,{}", B64.encode(mac.finalize().into_bytes())))
}

/// The event as the inbox and CloudEvents `data` show it.
pub fn event_view(e: &EventRecord) -> EventView {
    let data: serde_json::Value = serde_json::from_str(&e.data).unwrap_or(serde_json::Value::Null);
    let actor = data.get("actor").and_then(|a| a.as_str()).unwrap_or("system").to_string();
    EventView {
        seq: e.seq,
        id: e.id.clone(),
        kind: e.kind.clone(),
        tenant: e.tenant_id.clone(),
        subject: e.subject.clone(),
        at_ms: e.at_ms,
        text: event::sentence(&e.kind, &e.subject, e.tenant_id.as_deref(), &actor),
        data,
    }
}

/// The body posted to an endpoint and its content type.
pub fn body(w: &WebhookRecord, e: &EventRecord) -> (Vec<u8>, &'static str) {
    let view = event_view(e);
    if w.format == "slack" {
        let text = serde_json::json!({ "text": view.text });
        return (text.to_string().into_bytes(), "application/json");
    }
    let mut ce = serde_json::json!({
        "specversion": "1.0",
        "id": e.id,
        "source": "/tessera",
        "type": e.kind,
        "subject": e.subject,
        "time": tessera_core::clock::iso8601(e.at_ms),
        "datacontenttype": "application/json",
        "data": view.data,
    });
    if let Some(t) = &e.tenant_id {
        ce["tenant"] = serde_json::Value::String(t.clone());
    }
    (ce.to_string().into_bytes(), "application/cloudevents+json")
}

fn view(w: &WebhookRecord) -> WebhookView {
    WebhookView {
        id: w.id.clone(),
        tenant: w.tenant_id.clone(),
        url: w.url.clone(),
        format: w.format.clone(),
        types: w.types.clone(),
        description: w.description.clone(),
        previous_secret_until_ms: w.previous_secret.as_ref().and(w.previous_until_ms),
        created_by: w.created_by.clone(),
        created_at_ms: w.created_at_ms,
    }
}

/// What the delivery log shows of an attempt's failure: its class only (empty when it did not fail). Rows from
/// before classes were stored hold what the target answered, which is never shown.
fn failure_class(status: Option<i64>, stored: String) -> String {
    if stored.is_empty() || FAILURES.contains(&stored.as_str()) {
        return stored;
    }
    match status {
        Some(s) if (300..400).contains(&s) => "redirect_refused",
        Some(_) => "http_status",
        None => "request_failed",
    }
    .to_string()
}

fn delivery_view(d: DeliveryRecord) -> DeliveryView {
    DeliveryView {
        id: d.id,
        event_id: d.event_id,
        kind: d.kind,
        subject: d.subject,
        state: d.state,
        attempts: d.attempts,
        first_at_ms: d.first_at_ms,
        next_at_ms: d.next_at_ms,
        last_status: d.last_status,
        last_error: failure_class(d.last_status, d.last_error),
        delivered_at_ms: d.delivered_at_ms,
    }
}

/// Checks a new endpoint (URL, format, types, description): its format and its URL as parsed.
fn check(body: &WebhookCreate) -> Result<(&'static str, String), ApiError> {
    if body.url.len() > MAX_URL {
        return Err(ApiError::invalid("webhook_bad_url", format!("the URL is longer than {MAX_URL} bytes")));
    }
    let url =
        reqwest::Url::parse(&body.url).map_err(|e| ApiError::invalid("webhook_bad_url", format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ApiError::invalid("webhook_bad_url", "the URL must be http:// or https:// with a host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiError::invalid("webhook_bad_url", "the URL may not carry a user name or password"));
    }
    let format = match body.format.as_deref() {
        None | Some("standard") => "standard",
        Some("slack") => "slack",
        Some(_) => return Err(ApiError::invalid("webhook_bad_format", "format is `standard` or `slack`")),
    };
    TypeFilter::new(&body.types).map_err(|e| ApiError::invalid("webhook_bad_type", e.0))?;
    if body.description.chars().count() > MAX_DESCRIPTION {
        return Err(ApiError::invalid(
            "webhook_bad_description",
            format!("the description is longer than {MAX_DESCRIPTION} characters"),
        ));
    }
    if let Some(c) = body.description.chars().find(|&c| tessera_core::text::is_invisible(c)) {
        return Err(ApiError::invalid(
            "webhook_bad_description",
            format!("the description contains U+{:04X}, an invisible or control character", u32::from(c)),
        ));
    }
    Ok((format, url.to_string()))
}

/// The endpoints' owner named by `tenant` (its id; `None`: the platform), if the caller manages them: a tenant's
/// admins and platform admins, or platform admins.
async fn scope(state: &AppState, p: &Principal, tenant: Option<&str>) -> Result<Option<String>, ApiError> {
    match tenant {
        Some(t) => {
            let t = crate::lookup::tenant(state, p, t).await?;
            p.require_tenant_admin_to(&t.id, "manage webhooks")?;
            Ok(Some(t.id))
        }
        None => {
            p.require_platform_admin()?;
            Ok(None)
        }
    }
}

/// Makes an endpoint for `tenant` (its admins and platform admins) or, with `None`, platform-wide (platform admins).
pub async fn create(
    state: &AppState,
    p: &Principal,
    tenant: Option<&str>,
    body: &WebhookCreate,
) -> Result<WebhookSecret, ApiError> {
    let tenant_id = scope(state, p, tenant).await?;
    let (format, url) = check(body)?;
    if tenant_id.is_some()
        && let Some(why) = reqwest::Url::parse(&url).ok().as_ref().and_then(|u| state.webhooks.reach.refusal(u))
    {
        return Err(ApiError::invalid(
            "webhook_internal_address",
            format!("{why}: a tenant's webhook reaches internet addresses only (a platform admin's may reach any)"),
        ));
    }
    if state.store.webhooks(tenant_id.as_deref()).await?.len() >= MAX_WEBHOOKS {
        return Err(ApiError::invalid("webhook_too_many", format!("at most {MAX_WEBHOOKS} endpoints")));
    }
    let secret = new_secret()?;
    let sealed = state.secrets.seal(&secret).map_err(|e| ApiError::Internal(e.to_string()))?;
    let w = state
        .store
        .create_webhook(NewWebhook {
            tenant_id: tenant_id.as_deref(),
            url: &url,
            format,
            types: &body.types,
            description: &body.description,
            secret: &sealed,
            actor: &p.actor(),
        })
        .await?;
    Ok(WebhookSecret { webhook: view(&w), secret })
}

/// The endpoints of `tenant` (its admins and platform admins) or the platform's (platform admins).
pub async fn list(state: &AppState, p: &Principal, tenant: Option<&str>) -> Result<Vec<WebhookView>, ApiError> {
    let tenant_id = scope(state, p, tenant).await?;
    Ok(state.store.webhooks(tenant_id.as_deref()).await?.iter().map(view).collect())
}

/// An endpoint the caller manages: a tenant's for its admins (others of the tenant get 403, outsiders 404), a
/// platform one for platform admins (others get 404).
async fn managed(state: &AppState, p: &Principal, id: &str) -> Result<WebhookRecord, ApiError> {
    let w = match state.store.webhook(id).await {
        Ok(w) => w,
        Err(tessera_store::StoreError::NotFound { .. }) => {
            return Err(ApiError::NotFound("webhook not found".to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    match &w.tenant_id {
        Some(t) => {
            p.require_visible(t, "webhook")?;
            p.require_tenant_admin_to(t, "manage webhooks")?;
        }
        None if p.is_platform_admin() => {}
        None => return Err(ApiError::NotFound("webhook not found".to_string())),
    }
    Ok(w)
}

/// One endpoint.
pub async fn get(state: &AppState, p: &Principal, id: &str) -> Result<WebhookView, ApiError> {
    Ok(view(&managed(state, p, id).await?))
}

/// Deletes an endpoint and its delivery log.
pub async fn delete(state: &AppState, p: &Principal, id: &str) -> Result<(), ApiError> {
    let w = managed(state, p, id).await?;
    state.store.delete_webhook(&w.id, &p.actor()).await?;
    Ok(())
}

/// A new secret for an endpoint; the old one keeps signing for [`ROTATION_OVERLAP_MS`].
pub async fn rotate(state: &AppState, p: &Principal, id: &str) -> Result<WebhookSecret, ApiError> {
    let w = managed(state, p, id).await?;
    let secret = new_secret()?;
    let sealed = state.secrets.seal(&secret).map_err(|e| ApiError::Internal(e.to_string()))?;
    let w = state.store.rotate_webhook_secret(&w.id, &sealed, now_ms() + ROTATION_OVERLAP_MS, &p.actor()).await?;
    Ok(WebhookSecret { webhook: view(&w), secret })
}

/// Takes the turn of `key` in the sending throttle, or answers 429 `rate_limited` with when to try again.
pub(crate) fn throttled(state: &AppState, key: &str, what: &str) -> Result<(), ApiError> {
    state.sends.take(key).map_err(|wait| {
        let retry_after_s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        ApiError::TooManyRequests {
            code: "rate_limited",
            detail: format!(
                "{what} at most once every {} s; try again in {retry_after_s} s",
                super::throttle::SEND_EVERY.as_secs()
            ),
            retry_after_s,
        }
    })
}

/// Seals, with the current key, every stored secret that is not yet: plain text from before sealing, or sealed with
/// an old key (the second half of a key rotation, see [`crate::sealed`]). How many endpoints it sealed again.
pub async fn seal_secrets(store: &Store, keys: &crate::sealed::Keyring) -> Result<usize, tessera_store::StoreError> {
    let mut sealed = 0;
    for old in store.webhook_secrets().await? {
        let stale = |s: &str| !keys.is_current(s);
        if !stale(&old.secret) && !old.previous_secret.as_deref().is_some_and(stale) {
            continue;
        }
        let again = |s: &str| keys.open(s).and_then(|plain| keys.seal(&plain));
        let new = match (again(&old.secret), old.previous_secret.as_deref().map(again).transpose()) {
            (Ok(secret), Ok(previous_secret)) => {
                tessera_store::notifications::StoredSecrets { id: old.id.clone(), secret, previous_secret }
            }
            (Err(e), _) | (_, Err(e)) => {
                // Its deliveries fail (`secret_unreadable`) until the key is given back or the secret rotated.
                tracing::warn!(webhook = %old.id, error = %e, "a webhook secret cannot be opened to seal it again");
                continue;
            }
        };
        if store.reseal_webhook_secrets(&old, &new).await? {
            sealed += 1;
        }
    }
    if sealed > 0 {
        tracing::info!(endpoints = sealed, key = keys.key_id(), "webhook secrets sealed with the current key");
    }
    Ok(sealed)
}

/// Queues a `webhook.test` event for this endpoint only; one per endpoint per [`super::throttle::SEND_EVERY`].
pub async fn test(state: &AppState, p: &Principal, id: &str) -> Result<TestSent, ApiError> {
    let w = managed(state, p, id).await?;
    throttled(state, &format!("test/{}", w.id), "an endpoint is tested")?;
    Ok(TestSent { event_id: state.store.test_webhook(&w, &p.actor()).await? })
}

/// An endpoint's deliveries, newest first.
pub async fn deliveries(
    state: &AppState,
    p: &Principal,
    id: &str,
    before: Option<i64>,
    limit: Option<u32>,
) -> Result<Vec<DeliveryView>, ApiError> {
    let w = managed(state, p, id).await?;
    let limit = page_limit(limit, 100)?;
    Ok(state.store.deliveries(&w.id, before, limit).await?.into_iter().map(delivery_view).collect())
}

/// Sends a delivery again; each delivery once per [`super::throttle::SEND_EVERY`].
pub async fn redeliver(state: &AppState, p: &Principal, id: &str, delivery: i64) -> Result<DeliveryView, ApiError> {
    let w = managed(state, p, id).await?;
    throttled(state, &format!("redeliver/{}/{delivery}", w.id), "a delivery is sent again")?;
    match state.store.redeliver(&w.id, delivery).await {
        Ok(d) => Ok(delivery_view(d)),
        Err(tessera_store::StoreError::NotFound { .. }) => Err(ApiError::NotFound("delivery not found".to_string())),
        Err(e) => Err(e.into()),
    }
}

/// The events the caller may read, newest first: its tenants' (every tenant's and the platform's for platform
/// admins).
pub async fn inbox(
    state: &AppState,
    p: &Principal,
    before: Option<i64>,
    limit: Option<u32>,
) -> Result<Vec<EventView>, ApiError> {
    let limit = page_limit(limit, 50)?;
    let tenants: Vec<String> = p.memberships.iter().map(|(t, _)| t.clone()).collect();
    let events = state.store.events_for(&tenants, p.is_platform_admin(), before, limit).await?;
    Ok(events.iter().map(event_view).collect())
}

/// Most unread events counted.
pub const UNREAD_CAP: u32 = 100;

/// How much of the caller's inbox is unread.
pub async fn unread(state: &AppState, p: &Principal) -> Result<InboxCount, ApiError> {
    let tenants: Vec<String> = p.memberships.iter().map(|(t, _)| t.clone()).collect();
    let (unread, latest_seq) = state.store.unread(&p.user.id, &tenants, p.is_platform_admin(), UNREAD_CAP).await?;
    Ok(InboxCount { unread, latest_seq })
}

/// Marks the caller's inbox read up to `up_to`; what is unread then.
pub async fn mark_read(state: &AppState, p: &Principal, up_to: i64) -> Result<InboxCount, ApiError> {
    if up_to < 0 {
        return Err(ApiError::invalid("invalid_seq", "`up_to` is an event's `seq`, 0 or more"));
    }
    state.store.mark_read(&p.user.id, up_to).await?;
    state.inbox.bump_reads(&p.user.id);
    unread(state, p).await
}

/// How often a stream counts again without a new event (an inbox read on another replica).
const INBOX_RECOUNT: Duration = Duration::from_secs(15);

/// The caller's unread count at once, then again each time it changes: after a new event the caller may read, or
/// after the caller's inbox was read on this replica (every [`INBOX_RECOUNT`] for reads on others). Endless: the
/// HTTP layer holds its place under the caps, ends it after its lifetime or when the caller's right changes.
pub fn inbox_stream(state: AppState, p: Principal) -> impl futures_util::Stream<Item = InboxCount> + Send {
    let changes = state.inbox.subscribe(&state.store);
    let reads = state.inbox.subscribe_reads(&p.user.id);
    let start = (state, p, changes, reads, None::<InboxCount>);
    futures_util::stream::unfold(start, move |(state, p, mut changes, mut reads, last)| async move {
        let mut first = last.is_none();
        loop {
            if !first {
                let _ = tokio::time::timeout(INBOX_RECOUNT, async {
                    tokio::select! {
                        _ = changes.changed() => {}
                        _ = reads.changed() => {}
                    }
                })
                .await;
            }
            first = false;
            changes.borrow_and_update();
            reads.borrow_and_update();
            match unread(&state, &p).await {
                Ok(count) if last.as_ref() != Some(&count) => {
                    return Some((count.clone(), (state, p, changes, reads, Some(count))));
                }
                Ok(_) => {}
                // The database is away: wait for the next change or recount rather than ask again at once.
                Err(e) => tracing::debug!(error = %e, "inbox stream: count not read"),
            }
        }
    })
}

/// Tells tenants of active slices that sit idle (`allocation.idle`: mean utilisation under
/// [`super::idle::DEFAULT_IDLE_BELOW`] % over the last [`super::idle::DEFAULT_IDLE_HOURS`] hours, as usage reports
/// judge it), once per idle spell: a slice used again is told again when next idle. How many it told.
pub async fn warn_idle(state: &AppState, now: i64) -> Result<usize, ApiError> {
    use super::idle::{DEFAULT_IDLE_BELOW, DEFAULT_IDLE_HOURS, device_utilisation, is_idle, lookback_start};
    let active = state.store.active_devices().await?;
    if active.is_empty() {
        return Ok(0);
    }
    let util = device_utilisation(state, DEFAULT_IDLE_HOURS, now, None).await?;
    let from = lookback_start(now, DEFAULT_IDLE_HOURS);
    let mut told = 0;
    let mut busy = Vec::new();
    for (id, request, tenant, profile, device, activated) in active {
        let mean = util.get(&device).copied();
        let key = format!("idle/{id}");
        if is_idle(true, activated, from, mean, DEFAULT_IDLE_BELOW) {
            let after = serde_json::json!({"allocation_id": id, "request_id": request, "tenant_id": tenant,
                "profile": profile, "device_uuid": device, "util_mean": mean, "idle_below": DEFAULT_IDLE_BELOW,
                "idle_hours": DEFAULT_IDLE_HOURS});
            let subject = format!("request/{request}");
            if state.store.tell_once(&key, "allocation.idle", Some(&tenant), &subject, "system:idle", after).await? {
                told += 1;
            }
        } else if mean.is_some_and(|m| m >= DEFAULT_IDLE_BELOW) {
            busy.push(key);
        }
    }
    state.store.forget_notices(&busy).await?;
    Ok(told)
}

/// Every event type.
pub fn types() -> Vec<EventTypeView> {
    event::TYPES.iter().map(|(t, d)| EventTypeView { kind: (*t).to_string(), description: (*d).to_string() }).collect()
}

fn page_limit(limit: Option<u32>, default: u32) -> Result<u32, ApiError> {
    match limit {
        None => Ok(default),
        Some(n @ 1..=500) => Ok(n),
        Some(_) => Err(ApiError::invalid("invalid_limit", "`limit` is from 1 to 500")),
    }
}

/// Starts the delivery worker: dispatch new events, send what is due, record the answers; again at once while there
/// is work, else after [`POLL`].
pub fn start_background(
    store: Store,
    settings: Delivery,
    keys: crate::sealed::Keyring,
    email: Option<super::email::EmailSettings>,
    draining: crate::state::draining::Draining,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mailer = match email.as_ref().map(super::email::Mailer::new) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                tracing::error!(error = %e, "mail cannot be sent: the SMTP settings do not make a transport");
                None
            }
            None => None,
        };
        let clients = match Clients::new(settings.reach.clone()) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "webhook delivery cannot start: no HTTP client");
                return;
            }
        };
        let mut purged = tokio::time::Instant::now();
        loop {
            // A replica that shuts down claims nothing more once its round is done (what it claimed is posted and
            // recorded): the other replicas deliver the rest, without waiting for a claim's lease to run out.
            if draining.is_draining() {
                tracing::info!("delivery stopped: this replica is shutting down");
                return;
            }
            if purged.elapsed() >= PURGE_EVERY {
                purged = tokio::time::Instant::now();
                if let Err(e) = store.purge_notifications(now_ms() - KEEP_MS).await {
                    tracing::warn!(error = %e, "forgetting old events failed");
                }
            }
            let mut busy = match round(&store, &clients, &keys, settings.retry_cap_ms, mailer.is_some()).await {
                Ok(n) => n > 0,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook delivery round failed");
                    false
                }
            };
            if let Some(m) = &mailer {
                match m.round(&store, settings.retry_cap_ms).await {
                    Ok(n) => busy |= n > 0,
                    Err(e) => tracing::warn!(error = %e, "mail delivery round failed"),
                }
            }
            if !busy {
                tokio::time::sleep(POLL).await;
            }
        }
    })
}

/// One round: dispatch (mail deliveries too when `email`), then send due webhook deliveries (their secrets opened
/// with `keys`; the longest wait between attempts `retry_cap_ms`); how much it did.
pub async fn round(
    store: &Store,
    clients: &Clients,
    keys: &crate::sealed::Keyring,
    retry_cap_ms: i64,
    email: bool,
) -> Result<usize, ApiError> {
    let mut did = store.dispatch_events(1000, email).await?;
    let claimed = store.claim_deliveries(CLAIM_BATCH, LEASE_MS).await?;
    did += claimed.len();
    if claimed.is_empty() {
        return Ok(did);
    }
    // Per endpoint, at most `PER_ENDPOINT` at once (a slow receiver is not flooded); endpoints in parallel.
    let mut by_hook: Vec<Vec<Claimed>> = Vec::new();
    for c in claimed {
        match by_hook.iter_mut().find(|g| g[0].webhook.id == c.webhook.id) {
            Some(g) => g.push(c),
            None => by_hook.push(vec![c]),
        }
    }
    let clients = Arc::new(clients.clone());
    let groups = by_hook.into_iter().map(|group| {
        let clients = clients.clone();
        async move {
            futures_util::stream::iter(group)
                .map(|c| {
                    let clients = clients.clone();
                    async move { send(&clients, keys, c).await }
                })
                .buffer_unordered(PER_ENDPOINT)
                .collect::<Vec<Sent>>()
                .await
        }
    });
    let sent: Vec<Sent> = futures_util::future::join_all(groups).await.into_iter().flatten().collect();
    store.finish_deliveries(&sent, retry_cap_ms).await?;
    Ok(did)
}

/// Posts one delivery.
async fn send(clients: &Clients, keys: &crate::sealed::Keyring, c: Claimed) -> Sent {
    let failed = |c: &Claimed, status: Option<u16>, class: &str| Sent {
        delivery: c.delivery,
        attempts: c.attempts,
        first_at_ms: c.first_at_ms,
        status,
        error: class.to_string(),
    };
    let client = match clients.for_hook(&c.webhook) {
        Ok(client) => client,
        Err(class) => return failed(&c, None, class),
    };
    let secret = match keys.open(&c.webhook.secret) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(webhook = %c.webhook.id, error = %e, "webhook secret cannot be opened");
            return failed(&c, None, "secret_unreadable");
        }
    };
    let (body, content_type) = body(&c.webhook, &c.event);
    let now = now_ms();
    let ts = now / 1000;
    let mut sigs: Vec<String> = sign(&secret, &c.event.id, ts, &body).into_iter().collect();
    if let (Some(prev), Some(until)) = (&c.webhook.previous_secret, c.webhook.previous_until_ms)
        && until > now
    {
        match keys.open(prev) {
            Ok(prev) => sigs.extend(sign(&prev, &c.event.id, ts, &body)),
            Err(e) => tracing::warn!(webhook = %c.webhook.id, error = %e, "previous webhook secret cannot be opened"),
        }
    }
    let answer = client
        .post(&c.webhook.url)
        .header("content-type", content_type)
        .header("webhook-id", &c.event.id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sigs.join(" "))
        .body(body)
        .send()
        .await;
    // What the target answered is never kept: only its status and a class (see `super::outbound::FAILURES`).
    match answer {
        Ok(r) if r.status().is_success() => Sent { error: String::new(), ..failed(&c, Some(r.status().as_u16()), "") },
        Ok(r) => failed(&c, Some(r.status().as_u16()), classify_status(r.status())),
        Err(e) => {
            tracing::debug!(webhook = %c.webhook.id, error = %e, "webhook delivery failed");
            failed(&c, None, classify(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reading_an_inbox_wakes_only_its_users_streams() {
        let watch = InboxWatch::default();
        let mut mine = watch.subscribe_reads("u1");
        let also_mine = watch.subscribe_reads("u1");
        let mut theirs = watch.subscribe_reads("u2");
        watch.bump_reads("u1");
        assert!(mine.has_changed().expect("open") && also_mine.has_changed().expect("open"));
        assert!(!theirs.has_changed().expect("open"), "another user's stream does not count again");
        mine.borrow_and_update();
        watch.bump_reads("nobody");
        assert!(!mine.has_changed().expect("open") && !theirs.has_changed().expect("open"));
        theirs.borrow_and_update();
        drop((mine, also_mine, theirs));
    }

    #[test]
    fn signatures_follow_the_standard_webhooks_example() {
        // The specification's example: secret, id, timestamp and body give this signature.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body).as_deref(),
            Some("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
        );
        assert!(sign("whsec_not base64!", "id", 1, b"x").is_none());
    }

    #[test]
    fn the_delivery_log_shows_a_failure_class_never_the_answer() {
        let class = |status: Option<i64>, stored: &str| failure_class(status, stored.to_string());
        assert_eq!(class(Some(500), "http_status"), "http_status");
        assert_eq!(class(None, "dns_failed"), "dns_failed");
        // Rows from before classes were stored: what the target answered is not shown.
        assert_eq!(class(Some(500), "answered 500: root:x:0:0:root:/root:/bin/bash"), "http_status");
        assert_eq!(class(Some(302), "answered 302: x"), "redirect_refused");
        assert_eq!(class(None, "error sending request for url (http://10.0.0.1/)"), "request_failed");
        assert_eq!(class(Some(204), ""), "");
    }

    #[test]
    fn secrets_are_fresh_and_in_the_standard_form() {
        let (a, b) = (new_secret().expect("valid"), new_secret().expect("valid"));
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(B64.decode(&a[SECRET_PREFIX.len()..]).expect("valid").len(), 32);
    }

    #[test]
    fn endpoints_are_checked_before_anything_is_written() {
        let ok = WebhookCreate {
            url: "https://hooks.example/x".into(),
            format: None,
            types: vec![],
            description: "".into(),
        };
        assert_eq!(check(&ok).expect("valid"), ("standard", "https://hooks.example/x".to_string()));
        for (url, code) in [
            ("ftp://x/y", "webhook_bad_url"),
            ("not a url", "webhook_bad_url"),
            ("https://user:pw@x/y", "webhook_bad_url"),
        ] {
            let e = check(&WebhookCreate { url: url.into(), ..ok.clone() }).expect_err("refused");
            assert_eq!(e.problem().code, code, "{url}");
        }
        let long = format!("https://x/{}", "a".repeat(MAX_URL));
        assert_eq!(
            check(&WebhookCreate { url: long, ..ok.clone() }).expect_err("refused").problem().code,
            "webhook_bad_url"
        );
        let bad = WebhookCreate { format: Some("xml".into()), ..ok.clone() };
        assert_eq!(check(&bad).expect_err("refused").problem().code, "webhook_bad_format");
        let bad = WebhookCreate { types: vec!["request.nope".into()], ..ok.clone() };
        assert_eq!(check(&bad).expect_err("refused").problem().code, "webhook_bad_type");
        let bad = WebhookCreate { description: "d".repeat(MAX_DESCRIPTION + 1), ..ok.clone() };
        assert_eq!(check(&bad).expect_err("refused").problem().code, "webhook_bad_description");
        let bad = WebhookCreate { description: "a\u{0}b".into(), ..ok };
        assert_eq!(check(&bad).expect_err("refused").problem().code, "webhook_bad_description");
    }
}
