//! Each user's choice of the event types mailed to them, and the mail sent to them lately. Sending is `email.rs`'s.

use tessera_api::notifications::{EmailDeliveryView, NotificationSettings, NotificationSettingsUpdate};
use tessera_core::event::TypeFilter;

use crate::app::AppState;
use crate::error::ApiError;
use tessera_store::Principal;
use tessera_store::notifications::EmailRecord;

/// The latest deliveries shown with a user's settings.
const RECENT: u32 = 20;

/// What reaches the caller by e-mail.
pub async fn settings(state: &AppState, p: &Principal) -> Result<NotificationSettings, ApiError> {
    let email_types = state.store.email_prefs(&p.user.id).await?;
    let recent = state.store.email_deliveries(&p.user.id, RECENT).await?.into_iter().map(view).collect();
    let address = state.store.user_email(&p.user.id).await?;
    Ok(NotificationSettings { email_enabled: state.email.is_some(), email: address, email_types, recent })
}

/// Sets which event types reach the caller by e-mail (from now on).
pub async fn update(
    state: &AppState,
    p: &Principal,
    body: &NotificationSettingsUpdate,
) -> Result<NotificationSettings, ApiError> {
    TypeFilter::new(&body.email_types).map_err(|e| ApiError::invalid("email_bad_type", e.0))?;
    if body.email_types.iter().any(|t| t == "webhook.test") {
        return Err(ApiError::invalid("email_bad_type", "`webhook.test` goes to one webhook endpoint, never by mail"));
    }
    state.store.set_email_prefs(&p.user.id, &body.email_types).await?;
    settings(state, p).await
}

fn view(r: EmailRecord) -> EmailDeliveryView {
    EmailDeliveryView {
        id: r.id,
        address: r.address,
        event_id: r.event_id,
        kind: r.kind,
        subject: r.subject,
        state: r.state,
        attempts: r.attempts,
        last_error: r.last_error,
        delivered_at_ms: r.delivered_at_ms,
    }
}
