//! Problem reports (`application/problem+json`, RFC 9457) with a stable machine `code`.

use serde::{Deserialize, Serialize};

/// A problem report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Problem {
    /// URI naming the kind of problem (`urn:tessera:problem:<code>`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the kind of problem.
    pub title: String,
    /// HTTP status.
    pub status: u16,
    /// What went wrong this time, for people.
    pub detail: String,
    /// Stable machine-readable code, e.g. `quota_exceeded`.
    pub code: String,
    /// Individual problems, when there are several (e.g. every quota limit a request exceeds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ProblemItem>,
    /// For `quota_exceeded`: resource -> the limit that would let the same request through now (what is held plus
    /// what was asked), the `limits` of a quota request asking for exactly what is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_for: Option<std::collections::BTreeMap<String, f64>>,
}

/// One of several problems.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProblemItem {
    /// Stable machine-readable code.
    pub code: String,
    /// What is wrong, for people.
    pub message: String,
}
