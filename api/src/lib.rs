//! Tessera's REST wire types, in one place: the server serialises them (and, with the `openapi` feature, documents
//! them), the portal and the CLI decode the very same types. A field renamed on one side is a compile error on the
//! other, never a silently defaulted value.
//!
//! One module per API area, named as the server's `http/` modules are. Rules stay in `tessera-core`; these are
//! plain data.

pub mod agents;
pub mod allocations;
pub mod audit;
pub mod budgets;
pub mod catalog;
pub mod clusters;
pub mod cohorts;
pub mod efficiency;
pub mod layouts;
pub mod nodes;
pub mod notifications;
pub mod people;
pub mod problem;
pub mod quotas;
pub mod requests;
pub mod reservations;
pub mod rightsize;
pub mod signin;
pub mod telemetry;
pub mod tenants;
pub mod usage;

pub use people::Role;
pub use problem::{Problem, ProblemItem};
