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

/// The queue a pending request waits in: requests of one class compete for the same slices. MIG requests queue by
/// profile (`mig:<profile>`), on their model or on any; whole-GPU requests (exclusive, time-sliced, MPS) by model
/// (`gpu`). Two requests compete when their kinds match and their models do, a request for any model competing with
/// every model's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueClass {
    /// `mig:<profile>` or `gpu`.
    pub kind: String,
    /// The catalog key of the model asked for (as asked where the catalog does not know it); `None`: any model.
    pub model: Option<String>,
}

impl QueueClass {
    /// The class of `spec`, models by their catalog key.
    pub fn of(spec: &SliceSpec, catalog: &crate::catalog::Catalog) -> QueueClass {
        let key = |m: &str| catalog.resolve(m).map_or_else(|| m.trim().to_string(), |(m, _)| m.key.clone());
        match spec {
            SliceSpec::Mig { profile, model } => {
                QueueClass { kind: format!("mig:{profile}"), model: model.as_deref().map(key) }
            }
            SliceSpec::Exclusive { model } | SliceSpec::Timeslice { model, .. } | SliceSpec::Mps { model, .. } => {
                QueueClass { kind: "gpu".to_string(), model: Some(key(model)) }
            }
        }
    }

    /// Whether requests of the two classes compete for the same slices.
    pub fn competes(&self, other: &QueueClass) -> bool {
        self.kind == other.kind && (self.model.is_none() || other.model.is_none() || self.model == other.model)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_queue_with_those_that_compete_for_the_same_slices() {
        let catalog = crate::catalog::Catalog::builtin();
        let class = |json: &str| QueueClass::of(&serde_json::from_str(json).expect("spec"), catalog);
        let on_h100 = class(r#"{"mode":"mig","profile":"1g.10gb","model":"H100-80GB"}"#);
        let anywhere = class(r#"{"mode":"mig","profile":"1g.10gb"}"#);
        let on_a100 = class(r#"{"mode":"mig","profile":"1g.10gb","model":"A100-80GB"}"#);
        let bigger = class(r#"{"mode":"mig","profile":"3g.40gb","model":"H100-80GB"}"#);
        let whole = class(r#"{"mode":"exclusive","model":"H100-80GB"}"#);
        let shared = class(r#"{"mode":"timeslice","model":"H100-80GB","replicas":4}"#);
        assert_eq!(on_h100, QueueClass { kind: "mig:1g.10gb".into(), model: Some("H100-80GB".into()) });
        assert!(on_h100.competes(&anywhere) && anywhere.competes(&on_a100));
        assert!(!on_h100.competes(&on_a100) && !on_h100.competes(&bigger) && !on_h100.competes(&whole));
        assert!(whole.competes(&shared), "whole GPUs of one model, however shared, queue together");
        // A model by its product name queues with its catalog key.
        let h100 = catalog.model("H100-80GB").expect("H100");
        let by_product = QueueClass::of(&SliceSpec::Exclusive { model: h100.products[0].clone() }, catalog);
        assert_eq!(by_product, whole);
    }
}
