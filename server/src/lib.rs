//! tessera-server: the `tessera` binary — the command line (`cli/`), the server's start (`serve`), its settings
//! (`config`) and the demo fleet (`demo`).
//!
//! The layers below are crates of their own, so that an import against the arrow does not compile:
//! `tessera-http` (routes, listener; beside it `tessera-portal`, the portal's pages) → `tessera-services` (business logic, shared state, sign-in) →
//! `tessera-store` (SQLite and PostgreSQL) → `tessera-core` and `tessera-api`. They are re-exported here under the
//! names the tests and benchmarks use.

pub mod cli;
pub mod config;
pub mod demo;
pub mod serve;

pub use tessera_http as http;
pub use tessera_http::{listen, malformed};
pub use tessera_portal as portal;
pub use tessera_services as services;
pub use tessera_services::{app, auth, error, redact, sealed};
pub use tessera_store as store;
