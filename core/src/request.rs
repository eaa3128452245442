//! Slice requests: what a tenant asks for, and the states a request moves through.
//!
//! ```text
//! pending ──approve──> approved ──provision──> provisioning ──activate──> active ──release──> released
//!    │ reject            │                        │                        │ expire
//!    │ cancel            │ cancel / fail / expire │ cancel / fail          │ fail
//!    └ expire            └                        └                        └
//! ```
//! Terminal states: released, rejected, cancelled, expired, failed. Every other move is refused with a
//! [`TransitionError`] that names both states; the server audits each accepted move.

use serde::{Deserialize, Serialize};

/// What one slice of a request is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "mode", rename_all = "snake_case", deny_unknown_fields)]
pub enum SliceSpec {
    /// A MIG instance of `profile`, on any GPU model offering it unless `model` is given.
    Mig {
        /// Profile name, e.g. `1g.10gb`.
        profile: String,
        /// Only GPUs of this model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
    },
    /// One of `replicas` time-sliced shares of a whole GPU of `model`.
    Timeslice {
        /// GPU model.
        model: String,
        /// Shares the GPU is cut into (2 or more).
        replicas: u32,
    },
    /// One of `replicas` MPS clients on a whole GPU of `model`.
    Mps {
        /// GPU model.
        model: String,
        /// Clients per GPU (2 to 48).
        replicas: u32,
    },
    /// A whole GPU of `model`, not shared.
    Exclusive {
        /// GPU model.
        model: String,
    },
}

/// Where a request is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    /// Waiting for an admin (or for the auto-approval policy).
    Pending,
    /// Approved against the quota; placement chosen, configuration not yet pushed.
    Approved,
    /// The node agent is applying the configuration.
    Provisioning,
    /// The agent reported the slice: it is usable.
    Active,
    /// Given back by the tenant.
    Released,
    /// Refused by an admin, with a reason.
    Rejected,
    /// Withdrawn by the tenant before it became active.
    Cancelled,
    /// Its duration ran out (or it waited too long).
    Expired,
    /// Could not be provisioned or was lost.
    Failed,
}

/// Every state, in life order.
pub const ALL_STATES: [RequestState; 9] = [
    RequestState::Pending,
    RequestState::Approved,
    RequestState::Provisioning,
    RequestState::Active,
    RequestState::Released,
    RequestState::Rejected,
    RequestState::Cancelled,
    RequestState::Expired,
    RequestState::Failed,
];

impl RequestState {
    /// Whether a request in this state counts against the tenant's quota (pending, approved, provisioning and
    /// active all do: a quota is never overshot by approving what is already queued).
    pub fn holds_quota(self) -> bool {
        matches!(
            self,
            RequestState::Pending | RequestState::Approved | RequestState::Provisioning | RequestState::Active
        )
    }

    /// Whether nothing can happen to the request any more.
    pub fn is_terminal(self) -> bool {
        !self.holds_quota()
    }

    /// The states this one may move to.
    pub fn next_states(self) -> &'static [RequestState] {
        use RequestState::*;
        match self {
            Pending => &[Approved, Rejected, Cancelled, Expired],
            Approved => &[Provisioning, Cancelled, Failed, Expired],
            Provisioning => &[Active, Cancelled, Failed],
            Active => &[Released, Expired, Failed],
            Released | Rejected | Cancelled | Expired | Failed => &[],
        }
    }

    /// What a request holding slices on a GPU being drained becomes at the drain's deadline: an active one is
    /// released, one approved or being set up is cancelled; `None` for one that holds nothing.
    pub fn ended_by_drain(self) -> Option<RequestState> {
        use RequestState::*;
        match self {
            Active => Some(Released),
            Approved | Provisioning => Some(Cancelled),
            Pending | Released | Rejected | Cancelled | Expired | Failed => None,
        }
    }

    /// Moves to `to`, or says why not.
    pub fn transition(self, to: RequestState) -> Result<RequestState, TransitionError> {
        if self.next_states().contains(&to) { Ok(to) } else { Err(TransitionError { from: self, to }) }
    }

    /// The name used on the wire and in messages.
    pub fn as_str(self) -> &'static str {
        use RequestState::*;
        match self {
            Pending => "pending",
            Approved => "approved",
            Provisioning => "provisioning",
            Active => "active",
            Released => "released",
            Rejected => "rejected",
            Cancelled => "cancelled",
            Expired => "expired",
            Failed => "failed",
        }
    }
}

impl std::fmt::Display for RequestState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RequestState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ALL_STATES.into_iter().find(|st| st.as_str() == s).ok_or_else(|| {
            format!("unknown request state `{s}`; states are {}", ALL_STATES.map(RequestState::as_str).join(", "))
        })
    }
}

/// A state change the request's life does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a request that is {from} cannot become {to}{}", hint(*from))]
pub struct TransitionError {
    /// Current state.
    pub from: RequestState,
    /// State asked for.
    pub to: RequestState,
}

impl TransitionError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        "request_invalid_transition"
    }
}

fn hint(from: RequestState) -> String {
    let next = from.next_states();
    if next.is_empty() {
        format!(" ({from} is final)")
    } else {
        format!(" (from {from} it can become {})", next.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "))
    }
}
