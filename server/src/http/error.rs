//! API errors as `application/problem+json` (RFC 9457) with a stable machine `code`; one place maps every failure.

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::store::StoreError;

/// A problem report.
#[derive(Debug, Clone, Serialize, ToSchema)]
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ProblemItem>,
}

/// One of several problems.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProblemItem {
    /// Stable machine-readable code.
    pub code: String,
    /// What is wrong, for people.
    pub message: String,
}

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
            ApiError::Invalid { status, code, .. } => (*status, code, "Invalid request"),
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, title) = self.parts();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(cause = %cause, "request failed");
        }
        let errors = match &self {
            ApiError::Conflict { errors, .. } => errors.clone(),
            _ => Vec::new(),
        };
        let problem = Problem {
            kind: format!("urn:tessera:problem:{code}"),
            title: title.to_string(),
            status: status.as_u16(),
            detail: self.to_string(),
            code: code.to_string(),
            errors,
        };
        let mut response = (status, Json(problem)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/problem+json"));
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
            StoreError::Quota(errors) => ApiError::Conflict {
                code: "quota_exceeded",
                detail: errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
                errors: errors
                    .iter()
                    .map(|e| ProblemItem { code: e.code().to_string(), message: e.to_string() })
                    .collect(),
            },
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

/// `Json` whose rejections are problem reports too. Bodies are JSON objects: a top-level array is refused (serde
/// would otherwise read a struct from an array of its fields in order).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::Invalid {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                code: "invalid_body",
                detail: "Expected request with `Content-Type: application/json`".to_string(),
            });
        }
        let bytes = axum::body::Bytes::from_request(req, state).await?;
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
            return Err(ApiError::invalid("invalid_body", "the body must be a JSON object, not an array"));
        }
        Ok(ApiJson(Json::<T>::from_bytes(&bytes)?.0))
    }
}

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        Json(self.0).into_response()
    }
}

/// Whether `Content-Type` says JSON: `application/json` or `application/<anything>+json`, any parameters.
fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else { return false };
    let essence = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

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

/// The 413 for a body over [`super::BODY_LIMIT`].
pub fn body_too_large() -> ApiError {
    ApiError::Invalid {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "body_too_large",
        detail: format!("a request body has at most {} bytes", super::BODY_LIMIT),
    }
}

/// Turns the answers that layers give by themselves (413 from the body limit, 408 from the timeout) into problem
/// reports; everything else passes unchanged.
pub async fn problem_for_bare_errors(response: Response) -> Response {
    let problem_already = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/problem+json"));
    if problem_already {
        return response;
    }
    match response.status() {
        StatusCode::PAYLOAD_TOO_LARGE => body_too_large().into_response(),
        StatusCode::REQUEST_TIMEOUT => ApiError::Invalid {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "request_timeout",
            detail: format!("the request took longer than {} s", super::REQUEST_TIMEOUT.as_secs()),
        }
        .into_response(),
        _ => response,
    }
}

/// The answer for a handler that panicked: a 500 problem report (the panic is logged, not shown).
pub fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    ApiError::Internal(format!("handler panicked: {message}")).into_response()
}

/// `Query` whose rejections are problem reports too.
#[derive(Debug, Clone, Copy, Default, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::Invalid { status: StatusCode::BAD_REQUEST, code: "invalid_query", detail: r.body_text() }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{StatusCode, header};

    #[tokio::test]
    async fn a_panic_is_a_500_problem_report_without_its_message() {
        let response = super::panic_response(Box::new("index out of bounds: secret detail"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/problem+json");
        let body = axum::body::to_bytes(response.into_body(), 4096).await.expect("body");
        let problem: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(problem["code"], "internal");
        assert!(!problem.to_string().contains("secret detail"), "{problem}");
    }
}
