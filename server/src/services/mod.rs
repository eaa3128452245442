//! Business logic between the HTTP handlers and the store: each service runs the core's rules and the store's
//! transactions for one kind of object.

pub mod agents;
pub mod approvals;
pub mod fleet;
pub mod idle;
pub mod requests;
pub mod telemetry;
pub mod usage;
