//! Node agents as admins see them: join tokens, the spec query, what a status report changed.

use serde::{Deserialize, Serialize};

/// A join token to create.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewJoinToken {
    /// The name the joining node takes; by default its host name.
    #[serde(default)]
    pub node_name: Option<String>,
    /// Seconds until it expires (default one hour, at most 7 days).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 604_800))]
    pub ttl_s: Option<u64>,
}

/// A join token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JoinTokenView {
    /// Id.
    pub id: String,
    /// The secret (`tsj_...`), only in the answer to its creation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The name the joining node takes.
    pub node_name: Option<String>,
    /// Who created it.
    pub created_by: String,
    /// UTC milliseconds.
    pub created_at_ms: i64,
    /// UTC milliseconds.
    pub expires_at_ms: i64,
    /// When a node joined with it (a token is good for one join).
    pub used_at_ms: Option<i64>,
    /// The node that joined with it.
    pub node_id: Option<String>,
}

/// Long-poll query.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
pub struct SpecQuery {
    /// The generation the agent has; the answer waits for a newer one.
    #[serde(default)]
    pub after: Option<i64>,
    /// Seconds to wait for a newer generation (0 to 20, default 20).
    #[serde(default)]
    pub wait_s: Option<u64>,
}

/// What a status report changed.
#[derive(Debug, Default, Clone, PartialEq, Copy, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatusOutcome {
    /// Whether the status was newer than the stored one (an older one is ignored).
    pub stored: bool,
    /// Allocations that turned active.
    pub activated: usize,
    /// Requests that turned active.
    pub requests_active: usize,
}
