//! Business logic between the HTTP handlers and the store: each service runs the core's rules and the store's
//! transactions for one kind of object.
//!
//! The state a service keeps between requests ([`hub::Hub`], [`queue::CreateQueue`], [`telemetry::Telemetry`])
//! lives in modules that do not know `AppState`, so `app.rs` holds them without an import circle.

pub mod agents;
pub mod app;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod budgets;
pub mod calendar;
pub mod clusters;
pub mod cohorts;
pub mod connections;
pub mod efficiency;
pub mod email;
pub mod email_prefs;
pub mod error;
pub mod fleet;
pub mod governance;
pub mod hub;
pub mod idle;
pub mod lookup;
pub mod notifications;
pub mod outbound;
pub mod people;
pub mod placement;
pub mod queue;
pub mod quotas;
pub mod redact;
pub mod requests;
pub mod reservations;
pub mod rightsize;
pub mod sealed;
pub mod state;
pub mod streams;
pub mod telemetry;
pub mod tenants;
pub mod throttle;
pub mod usage;
pub mod use_hours;
pub mod waits;
