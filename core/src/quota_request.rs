//! Quota requests: a tenant's admin asks for new limits with a reason, optionally only until an end date; a
//! platform admin grants them in full or in part, or refuses. The rules every side runs (the server before it
//! writes, the portal as people type):
//!
//! - **Asking** ([`check_ask`]): 1 to [`MAX_LINES`] resources, each a new limit from 0 to [`MAX_LIMIT`] units that
//!   differs from the limit in force. A temporary request ends between [`MIN_TEMPORARY_MS`] and
//!   [`MAX_TEMPORARY_MS`] from now, and each of its lines raises a limit that exists (there is nothing to give back
//!   on an unlimited resource, or after a decrease).
//! - **Granting** ([`check_grant`]): each granted amount is one that was asked for, and lies between the limit in
//!   force when the admin decides and the amount asked (inclusive), in the direction asked: an admin may give less
//!   than asked, never more, and never take away by approving (an increase never lowers a limit an admin raised
//!   meanwhile). A line the limits in force already give ([`met`]) has nothing left to grant: approving in full
//!   skips it, and a request whose every line is met is refused with [`AskError::AlreadyMet`] (409
//!   `quota_ask_already_met`: reject or withdraw it). A grant that changes nothing is a refusal, and is refused as
//!   a grant.
//! - **Ending** ([`revert`]): at its end a temporary grant takes back exactly the increment it gave, so a limit
//!   nobody touched meanwhile returns to its value before the grant, and a change an admin made meanwhile is kept.
//!   Ending never releases anything held: a tenant holding more than its limit is over it, and the quota check
//!   refuses its new requests until it is back under.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::quota::{MILLI, Milli, Resource, Usage, show};

/// Most resources one quota request names.
pub const MAX_LINES: usize = 32;
/// Largest limit, in whole units.
pub const MAX_LIMIT: u64 = 1_000_000_000_000;
/// Shortest temporary increase: its end is at least this far ahead when asked.
pub const MIN_TEMPORARY_MS: i64 = 60 * 60 * 1000;
/// Longest temporary increase: its end is at most this far ahead when asked.
pub const MAX_TEMPORARY_MS: i64 = 366 * 24 * 60 * 60 * 1000;

/// Where a quota request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QuotaRequestState {
    /// Waiting for a platform admin.
    Pending,
    /// Granted (in full or in part); the limits changed when it was.
    Approved,
    /// Refused by a platform admin, with a reason.
    Rejected,
    /// Withdrawn by the tenant before a decision.
    Cancelled,
    /// A temporary grant whose end date passed: the increment it gave was taken back.
    Ended,
}

impl QuotaRequestState {
    /// Every state, in life order.
    pub const ALL: [QuotaRequestState; 5] = [
        QuotaRequestState::Pending,
        QuotaRequestState::Approved,
        QuotaRequestState::Rejected,
        QuotaRequestState::Cancelled,
        QuotaRequestState::Ended,
    ];

    /// The name used on the wire, in the database and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaRequestState::Pending => "pending",
            QuotaRequestState::Approved => "approved",
            QuotaRequestState::Rejected => "rejected",
            QuotaRequestState::Cancelled => "cancelled",
            QuotaRequestState::Ended => "ended",
        }
    }

    /// The state named `text` (as [`QuotaRequestState::as_str`] writes it).
    pub fn parse(text: &str) -> Option<QuotaRequestState> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The states this one may move to: a pending request is decided or withdrawn; only an approved one with an
    /// end date ends.
    pub fn next_states(self) -> &'static [QuotaRequestState] {
        use QuotaRequestState::*;
        match self {
            Pending => &[Approved, Rejected, Cancelled],
            Approved => &[Ended],
            Rejected | Cancelled | Ended => &[],
        }
    }
}

impl std::fmt::Display for QuotaRequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One resource of a quota request: the limit asked for, and the limit in force when it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The resource.
    pub resource: Resource,
    /// The new limit asked for, in thousandths.
    pub asked: Milli,
    /// The limit when asked (`None`: unlimited).
    pub before: Option<Milli>,
}

/// A limit a decision changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The resource.
    pub resource: Resource,
    /// The limit before (`None`: unlimited).
    pub before: Option<Milli>,
    /// The limit after.
    pub after: Milli,
}

/// Why an ask or a grant is refused. Each has a stable [`code`](AskError::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No resource named.
    #[error("name at least one resource and the limit you need")]
    Empty,
    /// More resources than [`MAX_LINES`].
    #[error("a quota request names at most {MAX_LINES} resources; this one names {0}")]
    TooMany(usize),
    /// Two keys that name the same resource.
    #[error("{0} is named twice")]
    Duplicate(Resource),
    /// An amount that is not a number from 0 to [`MAX_LIMIT`].
    #[error("{resource}: a limit is a number from 0 to {MAX_LIMIT}")]
    BadAmount {
        /// The resource.
        resource: String,
    },
    /// Asking for the limit already in force.
    #[error("{resource}: the limit is already {}", show(*limit))]
    Unchanged {
        /// The resource.
        resource: Resource,
        /// Its limit.
        limit: Milli,
    },
    /// A temporary line that does not raise an existing limit.
    #[error("{resource}: a temporary change raises a limit that exists ({})", match before { Some(b) => format!("now {}", show(*b)), None => "now unlimited".to_string() })]
    TemporaryNotIncrease {
        /// The resource.
        resource: Resource,
        /// Its limit now.
        before: Option<Milli>,
    },
    /// An end date outside the bounds.
    #[error("a temporary change ends between 1 hour and 366 days from now")]
    BadEnd,
    /// A grant of a resource nobody asked for.
    #[error("{0} was not asked for")]
    NotAsked(Resource),
    /// A grant outside the range between the limit in force and the amount asked.
    #[error("{resource}: grant an amount from {} to {}", show(*low), high.map_or("unlimited".to_string(), show))]
    OutOfRange {
        /// The resource.
        resource: Resource,
        /// The least that may be granted.
        low: Milli,
        /// The most that may be granted (`None`: no upper end).
        high: Option<Milli>,
    },
    /// A grant that changes no limit.
    #[error("this grant changes no limit; reject the request instead")]
    Nothing,
    /// The limits in force already give what was asked (an admin changed them since): approving would change
    /// nothing, or take away what was given meanwhile.
    #[error("{resource}: the limit in force ({}) already gives what was asked; nothing is left to grant", limit.map_or("unlimited".to_string(), show))]
    AlreadyMet {
        /// The resource (the first asked for, when every line is met).
        resource: Resource,
        /// Its limit in force (`None`: unlimited).
        limit: Option<Milli>,
    },
}

impl AskError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            AskError::Empty | AskError::TooMany(_) | AskError::Duplicate(_) => "quota_request_invalid",
            AskError::BadAmount { .. } => "quota_bad_limit",
            AskError::Unchanged { .. } => "quota_unchanged",
            AskError::TemporaryNotIncrease { .. } => "quota_temporary_not_increase",
            AskError::BadEnd => "invalid_time",
            AskError::NotAsked(_) | AskError::OutOfRange { .. } | AskError::Nothing => "quota_grant_invalid",
            AskError::AlreadyMet { .. } => "quota_ask_already_met",
        }
    }
}

/// An amount in whole units (as people and the API write it) in thousandths, or why not: finite, 0 to
/// [`MAX_LIMIT`], rounded to the nearest thousandth.
pub fn amount(resource: &str, units: f64) -> Result<Milli, AskError> {
    if !units.is_finite() || !(0.0..=MAX_LIMIT as f64).contains(&units) {
        return Err(AskError::BadAmount { resource: resource.to_string() });
    }
    Ok((units * MILLI as f64).round() as Milli)
}

/// Checks what a tenant asks for against the limits in force (`limits`) at `now_ms`, and returns its lines.
pub fn check_ask(
    asked: &[(Resource, Milli)],
    limits: &Usage,
    until_ms: Option<i64>,
    now_ms: i64,
) -> Result<Vec<Line>, AskError> {
    if asked.is_empty() {
        return Err(AskError::Empty);
    }
    if asked.len() > MAX_LINES {
        return Err(AskError::TooMany(asked.len()));
    }
    if let Some(until) = until_ms
        && !(now_ms.saturating_add(MIN_TEMPORARY_MS)..=now_ms.saturating_add(MAX_TEMPORARY_MS)).contains(&until)
    {
        return Err(AskError::BadEnd);
    }
    let mut lines: Vec<Line> = Vec::with_capacity(asked.len());
    for (resource, amount) in asked {
        if *amount > MAX_LIMIT * MILLI {
            return Err(AskError::BadAmount { resource: resource.to_string() });
        }
        if lines.iter().any(|l| &l.resource == resource) {
            return Err(AskError::Duplicate(resource.clone()));
        }
        let before = limits.get(resource).copied();
        if before == Some(*amount) {
            return Err(AskError::Unchanged { resource: resource.clone(), limit: *amount });
        }
        if until_ms.is_some() && before.is_none_or(|b| *amount <= b) {
            return Err(AskError::TemporaryNotIncrease { resource: resource.clone(), before });
        }
        lines.push(Line { resource: resource.clone(), asked: *amount, before });
    }
    lines.sort_by(|a, b| a.resource.cmp(&b.resource));
    Ok(lines)
}

/// Which way a line moves its limit: up (an increase, the usual ask) or down (a tenant giving some back).
pub fn raises(line: &Line) -> bool {
    line.before.is_some_and(|b| line.asked > b)
}

/// Whether the limit in force (`now`) already gives what `line` asked for: for an increase, a limit at or above
/// the amount asked (or none: unlimited); for a decrease, a limit at or below it.
pub fn met(line: &Line, now: Option<Milli>) -> bool {
    if raises(line) { now.is_none_or(|n| n >= line.asked) } else { now.is_some_and(|n| n <= line.asked) }
}

/// The amounts a grant may give `line` when the limit in force is `now`: from the limit in force to the amount
/// asked, in the direction the line asked (an increase never lowers a limit, a decrease never raises one; a
/// decrease from unlimited has no upper end). `None` when the limit in force already gives what was asked
/// ([`met`]): there is nothing to grant.
pub fn grant_range(line: &Line, now: Option<Milli>) -> Option<(Milli, Option<Milli>)> {
    if met(line, now) {
        return None;
    }
    match now {
        Some(n) if raises(line) => Some((n, Some(line.asked))),
        Some(n) => Some((line.asked, Some(n))),
        None => Some((line.asked, None)),
    }
}

/// Checks a decision on `lines` against the limits in force (`limits`): `granted` names the amounts given (`None`:
/// everything as asked that the limits in force do not already give); resources it leaves out are not granted.
/// Returns the limits that change; [`AskError::AlreadyMet`] when every line asked for is already given.
pub fn check_grant(
    lines: &[Line],
    granted: Option<&BTreeMap<Resource, Milli>>,
    limits: &Usage,
) -> Result<Vec<Change>, AskError> {
    let open: Vec<&Line> = lines.iter().filter(|l| !met(l, limits.get(&l.resource).copied())).collect();
    if open.is_empty() {
        let line = lines.first().ok_or(AskError::Nothing)?;
        return Err(AskError::AlreadyMet {
            resource: line.resource.clone(),
            limit: limits.get(&line.resource).copied(),
        });
    }
    let all: BTreeMap<Resource, Milli>;
    let granted = match granted {
        Some(g) => g,
        None => {
            all = open.iter().map(|l| (l.resource.clone(), l.asked)).collect();
            &all
        }
    };
    let mut changes = Vec::new();
    for (resource, &amount) in granted {
        let line =
            lines.iter().find(|l| &l.resource == resource).ok_or_else(|| AskError::NotAsked(resource.clone()))?;
        let now = limits.get(resource).copied();
        let Some((low, high)) = grant_range(line, now) else {
            return Err(AskError::AlreadyMet { resource: resource.clone(), limit: now });
        };
        if amount < low || high.is_some_and(|h| amount > h) {
            return Err(AskError::OutOfRange { resource: resource.clone(), low, high });
        }
        if now != Some(amount) {
            changes.push(Change { resource: resource.clone(), before: now, after: amount });
        }
    }
    if changes.is_empty() {
        return Err(AskError::Nothing);
    }
    Ok(changes)
}

/// The limit after a temporary grant ends: the limit in force (`now`) less the increment the grant gave (`granted`
/// over `before`), never below zero. A resource made unlimited meanwhile stays unlimited.
pub fn revert(now: Option<Milli>, before: Option<Milli>, granted: Milli) -> Option<Milli> {
    let increment = granted.saturating_sub(before.unwrap_or(granted));
    now.map(|n| n.saturating_sub(increment))
}

/// The limits that would let a request refused for quota through as it stands: for each limit it would exceed,
/// what is held plus what was asked (the body of a quota request asking for exactly what is missing).
pub fn needed_limits(errors: &[crate::quota::QuotaError]) -> BTreeMap<Resource, Milli> {
    errors
        .iter()
        .filter_map(|e| match e {
            crate::quota::QuotaError::Exceeded { resource, held, requested, .. }
            | crate::quota::QuotaError::NothingToBorrow { resource, held, requested, .. } => {
                Some((resource.clone(), held.saturating_add(*requested)))
            }
            _ => None,
        })
        .collect()
}
