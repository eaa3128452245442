//! Integration tests of the `tessera` binary: one test binary, one module per area.

mod api;
mod cli_mig;
mod sso;
mod store;
