//! The closed hours of the quota standing's 30-day look-back, kept once worked out, so that a standing reads the
//! requests and allocations of the hours since the last one (and the live ones), not 30 days of them each time.
//!
//! An hour that has ended does not change: a request holds from its creation until it ends (a live one until now),
//! an allocation is used from its activation until its release, and both times are written when they happen. What
//! an ended hour held at its peak and used on average is therefore the same at every later read, on every replica.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use tessera_core::quota::{Milli, Resource};

/// One hour of one tenant: the most it held at once, and what it used on average (thousandths).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HourFigures {
    /// The peak held.
    pub peak: Milli,
    /// The mean used.
    pub used: f64,
}

/// One resource's ended hours worked out: by hour start, per tenant (tenants with nothing that hour left out).
type Hours = BTreeMap<i64, HashMap<String, HourFigures>>;

/// The ended hours worked out per resource.
#[derive(Debug, Default)]
pub struct StandingHours(Mutex<HashMap<Resource, Hours>>);

impl StandingHours {
    /// The hours of `resource` from `from_ms` kept without a gap, as `(hour start, per tenant)` in order, and the
    /// first hour from `from_ms` that is not kept (`until_ms` when all up to it are).
    pub fn kept(&self, resource: &Resource, from_ms: i64, until_ms: i64, hour_ms: i64) -> (Vec<HourTenants>, i64) {
        let Ok(map) = self.0.lock() else { return (Vec::new(), from_ms) };
        let mut out = Vec::new();
        let mut next = from_ms;
        if let Some(hours) = map.get(resource) {
            for (start, tenants) in hours.range(from_ms..until_ms) {
                if *start != next {
                    break;
                }
                out.push((*start, tenants.clone()));
                next += hour_ms;
            }
        }
        (out, next)
    }

    /// Keeps the ended hours worked out for `resource`, and forgets its hours before `keep_from_ms`.
    pub fn keep(&self, resource: &Resource, hours: Vec<HourTenants>, keep_from_ms: i64) {
        let Ok(mut map) = self.0.lock() else { return };
        let kept = map.entry(resource.clone()).or_default();
        kept.extend(hours);
        *kept = kept.split_off(&keep_from_ms);
    }
}

/// One hour's start and its figures per tenant.
pub type HourTenants = (i64, HashMap<String, HourFigures>);
