//! Integration tests of tessera-core: one binary, one module per area.

mod catalog;
mod cohort;
mod layout;
mod planner;
mod planner_quality;
mod quota;
mod quota_request;
mod request;
mod sharing;
mod support;
mod timeline;
