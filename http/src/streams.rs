//! What every long-lived stream shares: a place under the caps ([`tessera_services::streams`]), a reconnect hint,
//! a lifetime, and its caller's right checked again every [`RIGHT_RECHECK`] while it runs, so that a revoked
//! token, an ended session, a removal from a tenant or a changed role ends the stream within 5 s on every
//! replica.

use std::convert::Infallible;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::sse::Event;
use futures_util::{Stream, StreamExt};

use super::auth::Right;
use super::error::ApiError;
use crate::listen::ClientAddr;
use tessera_services::app::AppState;
use tessera_services::streams::{Held, RIGHT_RECHECK, StreamKind};

/// How long a client waits before it opens the next stream (the `retry` field of the first event).
const RECONNECT: Duration = Duration::from_secs(2);

/// A place for a stream of `kind`, or `429 too_many_streams` saying which cap was reached.
pub fn place(state: &AppState, kind: StreamKind, right: &Right, addr: Option<&ClientAddr>) -> Result<Held, ApiError> {
    state.streams.open(kind, &right.principal.user.id, addr.map(|a| a.0)).map_err(|refused| ApiError::Invalid {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "too_many_streams",
        detail: refused.detail(kind),
    })
}

/// `events` as a stream that starts with a reconnect hint, keeps its place while it runs, and ends after
/// its lifetime ([`tessera_services::streams::StreamLimits::lifetime`]), when its caller's right no longer holds,
/// or when the replica begins to shut down.
pub fn guarded(
    state: AppState,
    right: Right,
    held: Held,
    events: impl Stream<Item = Event> + Send + 'static,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let lifetime = state.streams.limits().lifetime;
    let end = async move {
        let lifetime = tokio::time::sleep(lifetime);
        tokio::pin!(lifetime);
        let draining = state.draining.clone();
        let shutting_down = draining.begun();
        tokio::pin!(shutting_down);
        loop {
            tokio::select! {
                () = &mut lifetime => return,
                // The client reconnects after its `retry` hint, through the load balancer to a replica that stays.
                () = &mut shutting_down => return,
                () = tokio::time::sleep(RIGHT_RECHECK) => {
                    if !right.holds(&state).await {
                        tracing::info!(user = %right.principal.user.name, "stream ended: the caller's right changed");
                        return;
                    }
                }
            }
        }
    };
    let hint = futures_util::stream::once(async { Event::default().retry(RECONNECT).comment("connected") });
    hint.chain(events).take_until(end).map(move |e| {
        let _place = &held;
        Ok(e)
    })
}
