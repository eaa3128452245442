//! The HTTP side of errors: extractors whose rejections are problem reports, and the answers that layers give by
//! themselves turned into problem reports. The error type itself is [`crate::error`].

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use crate::error::{ApiError, Problem, ProblemItem};

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
