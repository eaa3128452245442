//! What the application state (`app.rs`) holds beside the store: caches, watches and settings that several
//! services share. Nothing here reads `AppState` or a service, so the application state sits above these and
//! below every service.

pub mod budgets;
pub mod coalesced;
pub mod delivery;
pub mod draining;
pub mod inbox;
pub mod kubernetes;
pub mod pace;
pub mod prepared;
