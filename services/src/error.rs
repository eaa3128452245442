//! Errors as `application/problem+json` (RFC 9457) with a stable machine `code`; one place maps every failure.
//! Below the HTTP layer: services return these, and the HTTP layer answers with them.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

pub use tessera_api::problem::{Problem, ProblemItem};
use tessera_store::StoreError;

/// Every way a request can fail.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 401: no credentials, or credentials that are not valid.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: known caller, not allowed (only for objects the caller may see).
    #[error("{0}")]
    Forbidden(String),
    /// 401 or 403 with a specific code (`invalid_token`, `csrf_failed`, `node_credential`, ...).
    #[error("{detail}")]
    Denied {
        /// 401 or 403.
        status: StatusCode,
        /// Stable code.
        code: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// 404: no such object, or one the caller may not see.
    #[error("{0}")]
    NotFound(String),
    /// 409: the request conflicts with the current state.
    #[error("{detail}")]
    Conflict {
        /// Stable code.
        code: &'static str,
        /// What conflicts.
        detail: String,
        /// Individual problems.
        errors: Vec<ProblemItem>,
    },
    /// 409 `quota_exceeded`: the request does not fit the tenant's quota; the problem names each limit and the
    /// limits that would let it through (`ask_for`). The detail is in people's words (resources by name, amounts
    /// with their unit); each of `errors` keeps the resource key.
    #[error("{}", .0.iter().map(tessera_core::quota::QuotaError::in_words).collect::<Vec<_>>().join(" "))]
    QuotaExceeded(Vec<tessera_core::quota::QuotaError>),
    /// 400/422: the request itself is wrong.
    #[error("{detail}")]
    Invalid {
        /// 400 for unreadable bodies, 422 for readable but wrong ones.
        status: StatusCode,
        /// Stable code.
        code: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// 429: the caller did this too often; `Retry-After` says when it may again.
    #[error("{detail}")]
    TooManyRequests {
        /// Stable code.
        code: &'static str,
        /// What was refused and when to try again.
        detail: String,
        /// Seconds until the caller may try again (the `Retry-After` header).
        retry_after_s: u64,
    },
    /// 503: a dependency (the database) is not available.
    #[error("{0}")]
    Unavailable(String),
    /// 500: a fault of ours; the cause is logged, not shown.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// A 401 with `code`.
    pub fn unauthorized(code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::Denied { status: StatusCode::UNAUTHORIZED, code, detail: detail.into() }
    }

    /// A 403 with `code`.
    pub fn forbidden(code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::Denied { status: StatusCode::FORBIDDEN, code, detail: detail.into() }
    }

    /// A 409 with `code`.
    pub fn conflict(code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::Conflict { code, detail: detail.into(), errors: Vec::new() }
    }

    /// A 422 with `code`.
    pub fn invalid(code: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::Invalid { status: StatusCode::UNPROCESSABLE_ENTITY, code, detail: detail.into() }
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "unauthenticated", "Not authenticated"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Not allowed"),
            ApiError::Denied { status, code, .. } if *status == StatusCode::UNAUTHORIZED => {
                (*status, code, "Not authenticated")
            }
            ApiError::Denied { status, code, .. } => (*status, code, "Not allowed"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found", "Not found"),
            ApiError::Conflict { code, .. } => (StatusCode::CONFLICT, code, "Conflict"),
            ApiError::QuotaExceeded(_) => (StatusCode::CONFLICT, "quota_exceeded", "Conflict"),
            ApiError::Invalid { status, code, .. } => (*status, code, "Invalid request"),
            ApiError::TooManyRequests { code, .. } => (StatusCode::TOO_MANY_REQUESTS, code, "Too many requests"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error"),
        }
    }
}

impl ApiError {
    /// The problem report this error answers with.
    pub fn problem(&self) -> Problem {
        let (status, code, title) = self.parts();
        let errors = match self {
            ApiError::Conflict { errors, .. } => errors.clone(),
            ApiError::QuotaExceeded(errors) => {
                errors.iter().map(|e| ProblemItem { code: e.code().to_string(), message: e.to_string() }).collect()
            }
            _ => Vec::new(),
        };
        let ask_for = match self {
            ApiError::QuotaExceeded(errors) => Some(
                tessera_core::quota_request::needed_limits(errors)
                    .into_iter()
                    .map(|(r, m)| (r.to_string(), m as f64 / tessera_core::quota::MILLI as f64))
                    .collect(),
            ),
            _ => None,
        };
        Problem {
            kind: format!("urn:tessera:problem:{code}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail: self.to_string(),
            code: code.to_string(),
            errors,
            ask_for,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, _) = self.parts();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(cause = %cause, "request failed");
        }
        let problem = self.problem();
        let mut response = (status, Json(problem)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/problem+json"));
        if let ApiError::TooManyRequests { retry_after_s, .. } = &self
            && let Ok(v) = header::HeaderValue::from_str(&retry_after_s.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        if status == StatusCode::UNAUTHORIZED {
            let challenge = if code == "unauthenticated" { "Bearer" } else { "Bearer error=\"invalid_token\"" };
            response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static(challenge));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound { what } => ApiError::NotFound(what),
            StoreError::Conflict { constraint } if constraint == "version" => ApiError::Conflict {
                code: "version_conflict",
                detail: "the object changed since you read it; read it again and retry".to_string(),
                errors: vec![],
            },
            StoreError::Conflict { constraint } => ApiError::Conflict {
                code: "already_exists",
                detail: format!("an object with the same {constraint} already exists"),
                errors: vec![],
            },
            StoreError::Quota(errors) => ApiError::QuotaExceeded(errors),
            // Already met: the request is fine, the limits in force moved past it (a conflict with the present).
            StoreError::QuotaAsk(e @ tessera_core::quota_request::AskError::AlreadyMet { .. }) => {
                ApiError::conflict(e.code(), e.to_string())
            }
            StoreError::QuotaAsk(e) => ApiError::invalid(e.code(), e.to_string()),
            StoreError::Rule { code, detail } => ApiError::invalid(code, detail),
            StoreError::InUse { code, detail } => ApiError::conflict(code, detail),
            s @ StoreError::QuotaState { .. } => {
                ApiError::Conflict { code: "quota_request_invalid_transition", detail: s.to_string(), errors: vec![] }
            }
            StoreError::Transition(t) => {
                ApiError::Conflict { code: "request_invalid_transition", detail: t.to_string(), errors: vec![] }
            }
            StoreError::Other(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("40001") | Some("40P01")) =>
            {
                ApiError::Conflict {
                    code: "concurrent_update",
                    detail: "a concurrent change to the same objects won; retry".to_string(),
                    errors: vec![],
                }
            }
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 1024 * 1024;

// The extractors' rejections (axum's) as problem reports; the extractors themselves are the HTTP layer's.

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        let status = match &r {
            JsonRejection::JsonDataError(_) => StatusCode::UNPROCESSABLE_ENTITY,
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            // A chunked body that grew past the limit while it was read.
            JsonRejection::BytesRejection(_) if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                return body_too_large();
            }
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::Invalid { status, code: "invalid_body", detail: r.body_text() }
    }
}

impl From<axum::extract::rejection::BytesRejection> for ApiError {
    fn from(r: axum::extract::rejection::BytesRejection) -> ApiError {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return body_too_large();
        }
        ApiError::Invalid { status: StatusCode::BAD_REQUEST, code: "invalid_body", detail: r.body_text() }
    }
}

/// The 413 for a body over [`BODY_LIMIT`].
pub fn body_too_large() -> ApiError {
    ApiError::Invalid {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "body_too_large",
        detail: format!("a request body has at most {} bytes", BODY_LIMIT),
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::Invalid { status: StatusCode::BAD_REQUEST, code: "invalid_query", detail: r.body_text() }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        match r {
            // A route whose handler takes a parameter its path does not have: ours to fix, not the client's.
            PathRejection::MissingPathParams(_) => ApiError::Internal(r.body_text()),
            _ => ApiError::Invalid { status: StatusCode::BAD_REQUEST, code: "invalid_path", detail: r.body_text() },
        }
    }
}
