//! Tessera's domain core: the GPU catalog, MIG layouts and their validation, sharing rules and the planner.
//!
//! Pure computation with no I/O, so the server, the node agent and the browser portal (compiled to wasm32) all run
//! the same rules.

pub mod address;
pub mod api;
pub mod attribution;
pub mod budget;
pub mod catalog;
pub mod clock;
pub mod cluster;
pub mod cohort;
pub mod defrag;
pub mod efficiency;
pub mod event;
pub mod health;
pub mod layout;
pub mod pending;
pub mod planner;
pub mod quota;
pub mod quota_request;
pub mod request;
pub mod reservation;
pub mod rightsize;
pub mod rollup;
pub mod sharing;
pub mod text;
pub mod timeline;

pub use catalog::{Catalog, GpuModel, Profile};
