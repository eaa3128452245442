//! Integration tests of tessera-core: one binary, one module per area.

mod catalog;
mod layout;
mod planner;
mod planner_quality;
mod sharing;
mod support;
