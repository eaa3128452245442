//! tessera-server: the control plane behind the `tessera` binary.
//!
//! `http/` holds the REST API (axum + utoipa), `services/` the business logic, `store/` the SQLite and PostgreSQL
//! persistence, `cli/` the command line. `serve::prepare` + `serve::serve` start the server.

pub mod app;
pub mod auth;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod http;
pub mod listen;
pub mod malformed;
pub mod portal;
pub mod redact;
pub mod sealed;
pub mod serve;
pub mod services;
pub mod store;
