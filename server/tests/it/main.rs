//! Integration tests of the `tessera` binary: one test binary, one module per area.

mod admin;
mod agents;
mod api;
mod cli_mig;
mod cohorts;
mod cost;
mod defrag;
mod governance;
mod harness;
mod hostile;
mod http_parts;
mod isolation;
mod links;
mod logging;
mod notifications;
mod prometheus;
mod quotas;
mod reservations;
mod sso;
mod store;
mod streams;
mod telemetry;
mod upgrade;
mod waiting;
mod webhook_guards;
mod wire;
