//! tessera-server: the control plane behind the `tessera` binary.
//!
//! For now it carries the `tessera mig` commands over the core engine; the HTTP API, store and services arrive
//! in `http/`, `store/`, `services/` and `auth/`.

pub mod cli;
pub mod store;
