//! The rules of a reservation: its life ([`ReservationState`]), what a tenant may book ([`ReservationPolicy`]), why
//! a booking is refused ([`ReservationError`]), the tenant's quota over a window ([`check_window`]), and what a
//! reservation is as the calendar sees it ([`Booking`], [`Hold`], [`CalGpu`], [`Shortfall`]). No simulation here:
//! the calendar engine builds on these.

use serde::{Deserialize, Serialize};

use crate::quota::{QuotaError, Usage, accumulate};
use crate::request::SliceSpec;
use crate::sharing::Sharing;

/// How long before its start a reservation's slices are placed (layout changes proposed or applied), in
/// milliseconds: 10 minutes.
pub const LEAD_MS: i64 = 10 * 60 * 1000;
/// Shortest reservation, in seconds.
pub const MIN_DURATION_S: u64 = 60;
/// How far in the past a start may lie when booked (a clock skew allowance), in milliseconds.
pub const START_SLACK_MS: i64 = 60_000;

/// Where a reservation is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ReservationState {
    /// Waiting for a platform admin (the tenant's policy does not approve it on its own).
    Pending,
    /// Booked: its capacity is protected for its window.
    Accepted,
    /// Its request is made and its slices are being placed and prepared on their nodes (from the lead time on):
    /// nothing is usable, metered or counted as held before its start. Stored as `started`; read as `preparing`
    /// until `start_ms`.
    Preparing,
    /// Its window has begun: its slices are usable (or its request still waits for room, and says why).
    Started,
    /// Its window is over, or its slices were released early.
    Ended,
    /// Refused by an admin.
    Rejected,
    /// Withdrawn by the tenant before it started.
    Cancelled,
    /// Its slices could not be placed by its start, or it was still pending at its start.
    Failed,
}

impl ReservationState {
    /// The states this one may move to.
    pub fn next_states(self) -> &'static [ReservationState] {
        use ReservationState::*;
        match self {
            Pending => &[Accepted, Rejected, Cancelled, Failed],
            Accepted => &[Preparing, Started, Cancelled, Failed],
            Preparing => &[Started, Ended],
            Started => &[Ended],
            Ended | Rejected | Cancelled | Failed => &[],
        }
    }

    /// Whether nothing can happen to it any more.
    pub fn is_terminal(self) -> bool {
        self.next_states().is_empty()
    }

    /// Moves to `to`, or says why not.
    pub fn transition(self, to: ReservationState) -> Result<ReservationState, ReservationError> {
        if self.next_states().contains(&to) {
            Ok(to)
        } else {
            Err(ReservationError::Transition { from: self.as_str(), to: to.as_str() })
        }
    }

    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        use ReservationState::*;
        match self {
            Pending => "pending",
            Accepted => "accepted",
            Preparing => "preparing",
            Started => "started",
            Ended => "ended",
            Rejected => "rejected",
            Cancelled => "cancelled",
            Failed => "failed",
        }
    }

    /// Parses [`ReservationState::as_str`]'s form.
    pub fn parse(text: &str) -> Option<ReservationState> {
        use ReservationState::*;
        [Pending, Accepted, Preparing, Started, Ended, Rejected, Cancelled, Failed]
            .into_iter()
            .find(|s| s.as_str() == text)
    }

    /// The word the store keeps: a reservation whose request is made is stored as `started` whether or not its
    /// window has begun, and read back through [`ReservationState::at`].
    pub fn stored(self) -> &'static str {
        match self {
            ReservationState::Preparing => ReservationState::Started.as_str(),
            other => other.as_str(),
        }
    }

    /// The state at `now` of a reservation stored in this one whose window starts at `start_ms`: a started one is
    /// preparing until its start, and started from it.
    pub fn at(self, start_ms: i64, now: i64) -> ReservationState {
        match self {
            ReservationState::Preparing | ReservationState::Started if now < start_ms => ReservationState::Preparing,
            ReservationState::Preparing | ReservationState::Started => ReservationState::Started,
            other => other,
        }
    }
}

impl std::fmt::Display for ReservationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Limits on what a tenant may book, per tenant or for every tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReservationPolicy {
    /// Longest window, in seconds (60 to 90 days).
    #[cfg_attr(feature = "openapi", schema(minimum = 60, maximum = 7_776_000))]
    pub max_duration_s: u64,
    /// Furthest a start may lie ahead, in seconds (up to 365 days).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 31_536_000))]
    pub max_ahead_s: u64,
    /// Most reservations a tenant may have pending, accepted or started at once (0 to 1000).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 1000))]
    pub max_concurrent: u32,
}

impl Default for ReservationPolicy {
    fn default() -> Self {
        ReservationPolicy { max_duration_s: 7 * 24 * 3600, max_ahead_s: 30 * 24 * 3600, max_concurrent: 10 }
    }
}

impl ReservationPolicy {
    /// Longest `max_duration_s` a policy may set.
    pub const DURATION_BOUND_S: u64 = 90 * 24 * 3600;
    /// Longest `max_ahead_s` a policy may set.
    pub const AHEAD_BOUND_S: u64 = 365 * 24 * 3600;
    /// Largest `max_concurrent` a policy may set.
    pub const CONCURRENT_BOUND: u32 = 1000;

    /// Whether the policy's own values are within their bounds.
    pub fn validate(&self) -> Result<(), ReservationError> {
        if !(MIN_DURATION_S..=Self::DURATION_BOUND_S).contains(&self.max_duration_s)
            || self.max_ahead_s > Self::AHEAD_BOUND_S
            || self.max_concurrent > Self::CONCURRENT_BOUND
        {
            return Err(ReservationError::PolicyOutOfBounds);
        }
        Ok(())
    }

    /// Checks a window `[start_ms, end_ms)` booked at `now_ms` by a tenant that has `open` reservations already.
    pub fn check(&self, now_ms: i64, start_ms: i64, end_ms: i64, open: u32) -> Result<(), ReservationError> {
        if end_ms <= start_ms {
            return Err(ReservationError::EmptyWindow);
        }
        if start_ms < now_ms - START_SLACK_MS {
            return Err(ReservationError::StartInPast);
        }
        let duration_s = ((end_ms - start_ms) / 1000) as u64;
        if duration_s < MIN_DURATION_S {
            return Err(ReservationError::TooShort);
        }
        if duration_s > self.max_duration_s {
            return Err(ReservationError::TooLong { max_s: self.max_duration_s });
        }
        let ahead_s = ((start_ms - now_ms).max(0) / 1000) as u64;
        if ahead_s > self.max_ahead_s {
            return Err(ReservationError::TooFarAhead { max_s: self.max_ahead_s });
        }
        if open >= self.max_concurrent {
            return Err(ReservationError::TooMany { max: self.max_concurrent });
        }
        Ok(())
    }
}

/// Why a reservation cannot be made or moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReservationError {
    /// A move its life does not allow.
    #[error("a {from} reservation cannot become {to}")]
    Transition {
        /// From.
        from: &'static str,
        /// To.
        to: &'static str,
    },
    /// `end` is not after `start`.
    #[error("the window is empty: its end must come after its start")]
    EmptyWindow,
    /// `start` has passed.
    #[error("the window starts in the past: choose a start from now on")]
    StartInPast,
    /// Shorter than [`MIN_DURATION_S`].
    #[error("the window is shorter than a minute")]
    TooShort,
    /// Longer than the policy allows.
    #[error("the window is longer than the policy allows ({max_s} s)")]
    TooLong {
        /// The policy's longest window, in seconds.
        max_s: u64,
    },
    /// Further ahead than the policy allows.
    #[error("the window starts further ahead than the policy allows ({max_s} s)")]
    TooFarAhead {
        /// The policy's furthest start, in seconds from now.
        max_s: u64,
    },
    /// The tenant has as many open reservations as the policy allows.
    #[error("the tenant has {max} open reservations, the most the policy allows")]
    TooMany {
        /// The policy's most open reservations.
        max: u32,
    },
    /// A policy value outside its bounds.
    #[error("max_duration_s must be 60 to 7776000, max_ahead_s at most 31536000 and max_concurrent at most 1000")]
    PolicyOutOfBounds,
}

impl ReservationError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ReservationError::Transition { .. } => "invalid_transition",
            ReservationError::EmptyWindow | ReservationError::StartInPast | ReservationError::TooShort => {
                "invalid_window"
            }
            ReservationError::TooLong { .. } => "reservation_too_long",
            ReservationError::TooFarAhead { .. } => "reservation_too_far_ahead",
            ReservationError::TooMany { .. } => "too_many_reservations",
            ReservationError::PolicyOutOfBounds => "invalid_policy",
        }
    }
}

/// A GPU as the calendar sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CalGpu {
    /// GPU id.
    pub id: String,
    /// The node it is on: time-slicing and MPS never share a node ([`crate::sharing::validate_node`]), so a share
    /// goes only where no other GPU of the node is shared the other way at that moment.
    pub node: String,
    /// Catalog model key.
    pub model: String,
    /// In MIG mode.
    pub mig: bool,
    /// Cordoned: nothing new goes there.
    pub cordoned: bool,
    /// Its MIG instances now `(profile, start)`.
    pub layout: Vec<(String, u8)>,
}

/// A slice held on a GPU until a known time (or for ever): a live allocation, or a reservation's slice placed by
/// the simulation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// GPU id.
    pub gpu: String,
    /// MIG profile, or the sharing key of a whole-GPU share (`exclusive`, `timeslice:4`, ...).
    pub profile: String,
    /// Start unit, or share index.
    pub start: u8,
    /// When it ends, UTC milliseconds; `None`: not known (for ever).
    pub until_ms: Option<i64>,
}

impl Hold {
    /// Whether it is held at `t`.
    pub fn at(&self, t: i64) -> bool {
        self.until_ms.is_none_or(|u| u > t)
    }
}

/// An accepted reservation, as the calendar sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    /// Reservation id.
    pub id: String,
    /// What one slice is.
    pub spec: SliceSpec,
    /// How many slices.
    pub count: u32,
    /// Window start, UTC milliseconds.
    pub start_ms: i64,
    /// Window end, UTC milliseconds.
    pub end_ms: i64,
}

impl Booking {
    /// Whether its window contains `t`.
    pub fn at(&self, t: i64) -> bool {
        self.start_ms <= t && t < self.end_ms
    }
}

/// A reservation the simulation could not place at its start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shortfall {
    /// Reservation id.
    pub booking: String,
    /// Its start, UTC milliseconds.
    pub start_ms: i64,
    /// Slices it wants.
    pub wanted: u32,
    /// Slices that found room.
    pub placed: u32,
}

/// The reason of the request a reservation's start makes: `reservation <id>: <its reason>`, or `reservation <id>`
/// when it gave none (never a dangling colon).
pub fn request_reason(id: &str, reason: &str) -> String {
    match reason.trim() {
        "" => format!("reservation {id}"),
        r => format!("reservation {id}: {r}"),
    }
}

/// How a whole-GPU slice shares its GPU, and how many slices one GPU takes that way. `None` for MIG slices.
pub fn share_of(spec: &SliceSpec) -> Option<(&str, Sharing, u32)> {
    match spec {
        SliceSpec::Mig { .. } => None,
        SliceSpec::Exclusive { model } => Some((model, Sharing::Exclusive, 1)),
        SliceSpec::Timeslice { model, replicas } => {
            Some((model, Sharing::Timeslice { replicas: *replicas }, *replicas))
        }
        SliceSpec::Mps { model, replicas } => Some((model, Sharing::Mps { replicas: *replicas }, *replicas)),
    }
}

/// What a tenant will hold at `t`: its live requests that last past `t` (`(charge, until)`; `None`: for ever),
/// and its accepted reservations whose window contains `t` (`(charge, start, end)`).
pub fn held_at(live: &[(Usage, Option<i64>)], booked: &[(Usage, i64, i64)], t: i64) -> Usage {
    let mut held = Usage::new();
    for (charge, until) in live {
        if until.is_none_or(|u| u > t) {
            accumulate(&mut held, charge);
        }
    }
    for (charge, start, end) in booked {
        if *start <= t && t < *end {
            accumulate(&mut held, charge);
        }
    }
    held
}

/// Checks a tenant's quota over the window `[start, end)` of a reservation charging `charge`: at its start and at
/// each start of the tenant's other reservations within it (what the tenant holds only falls between those
/// moments), what it will hold then plus `charge` stays within `limits`.
pub fn check_window(
    limits: &Usage,
    live: &[(Usage, Option<i64>)],
    booked: &[(Usage, i64, i64)],
    start_ms: i64,
    end_ms: i64,
    charge: &Usage,
) -> Result<(), Vec<QuotaError>> {
    let mut points: Vec<i64> = vec![start_ms];
    points.extend(booked.iter().map(|b| b.1).filter(|s| *s > start_ms && *s < end_ms));
    for t in points {
        crate::quota::check(limits, &held_at(live, booked, t), charge)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_reservations_request_says_whose_it_is_without_a_dangling_colon() {
        assert_eq!(request_reason("r1", "offsite eval"), "reservation r1: offsite eval");
        assert_eq!(request_reason("r1", ""), "reservation r1");
        assert_eq!(request_reason("r1", "  "), "reservation r1");
    }

    #[test]
    fn policy_bounds_each_window() {
        let p = ReservationPolicy::default();
        let now = 1_000_000_000;
        assert_eq!(p.check(now, now + 60_000, now + 3_660_000, 0), Ok(()));
        assert_eq!(p.check(now, now + 60_000, now + 60_000, 0), Err(ReservationError::EmptyWindow));
        assert_eq!(p.check(now, now - 120_000, now + 60_000, 0), Err(ReservationError::StartInPast));
        assert_eq!(p.check(now, now, now + 59_000, 0), Err(ReservationError::TooShort));
        let week = 7 * 24 * 3_600_000;
        assert_eq!(
            p.check(now, now, now + week + 1000, 0),
            Err(ReservationError::TooLong { max_s: week as u64 / 1000 })
        );
        assert!(matches!(
            p.check(now, now + 31 * 86_400_000, now + 32 * 86_400_000, 0),
            Err(ReservationError::TooFarAhead { .. })
        ));
        assert_eq!(p.check(now, now, now + 60_000, 10), Err(ReservationError::TooMany { max: 10 }));
        assert!(ReservationPolicy { max_duration_s: 59, ..p }.validate().is_err());
        assert!(p.validate().is_ok());
    }

    #[test]
    fn states_move_only_forward() {
        use ReservationState::*;
        assert!(Pending.transition(Accepted).is_ok());
        assert!(Accepted.transition(Started).is_ok());
        assert!(Started.transition(Cancelled).is_err());
        assert!(Preparing.transition(Cancelled).is_err() && Preparing.transition(Ended).is_ok());
        assert!(Ended.is_terminal() && !Accepted.is_terminal());
        for s in [Pending, Accepted, Preparing, Started, Ended, Rejected, Cancelled, Failed] {
            assert_eq!(ReservationState::parse(s.as_str()), Some(s));
        }
        // Stored as started, read as preparing until the start.
        assert_eq!((Preparing.stored(), Started.stored(), Accepted.stored()), ("started", "started", "accepted"));
        assert_eq!((Started.at(100, 99), Started.at(100, 100), Preparing.at(100, 150)), (Preparing, Started, Started));
        assert_eq!(Accepted.at(100, 99), Accepted);
    }
    #[test]
    fn window_quota_counts_what_is_held_then() {
        let r = crate::quota::Resource::ComputeSlices;
        let u = |n: u64| Usage::from([(r.clone(), n * 1000)]);
        let limits = u(7);
        let live = vec![(u(3), Some(100)), (u(2), None)];
        let booked = vec![(u(4), 150, 300)];
        assert!(check_window(&limits, &live, &booked, 50, 120, &u(3)).is_err());
        assert!(check_window(&limits, &live, &booked, 100, 140, &u(5)).is_ok());
        // 100-200 overlaps the booking from 150: 2 + 4 + 2 = 8 > 7.
        assert!(check_window(&limits, &live, &booked, 100, 200, &u(2)).is_err());
        assert!(check_window(&limits, &live, &booked, 100, 200, &u(1)).is_ok());
    }
}
