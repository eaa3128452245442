//! The HTTP side of errors: extractors whose rejections are problem reports, and the answers that layers give by
//! themselves turned into problem reports. The error type itself is [`tessera_services::error`].

use axum::Json;
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use tessera_services::error::{ApiError, Problem, ProblemItem, body_too_large};

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

/// An optional JSON body: none (or only white space) is `T::default()`; anything else must be a `what`, refused as
/// [`ApiJson`] refuses a body: `invalid_body` with 400 when it is not JSON, 422 when it is JSON of another shape.
pub fn optional_json<T: serde::de::DeserializeOwned + Default>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::Invalid {
        status: match e.classify() {
            serde_json::error::Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        },
        code: "invalid_body",
        detail: format!("not {what}: {e}"),
    })
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

/// Turns the answers that layers and the router give by themselves into problem reports: 413 from the body limit,
/// 408 from the timeout, 405 for a method a path does not take (its `Allow` header kept), 404 for a path no route
/// has, and any other client error given as plain text or with no body (an extractor's own rejection). Everything
/// else (pages, problem reports, successes) passes unchanged.
pub async fn problem_for_bare_errors(response: Response) -> Response {
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if content_type.starts_with("application/problem+json") {
        return response;
    }
    let bare = content_type.is_empty() || content_type.starts_with("text/plain");
    let status = response.status();
    let error = match status {
        StatusCode::PAYLOAD_TOO_LARGE => body_too_large(),
        StatusCode::REQUEST_TIMEOUT => ApiError::Invalid {
            status,
            code: "request_timeout",
            detail: format!("the request took longer than {} s", super::REQUEST_TIMEOUT.as_secs()),
        },
        StatusCode::METHOD_NOT_ALLOWED if bare => {
            let allow = response.headers().get(header::ALLOW).cloned();
            let detail = match allow.as_ref().and_then(|a| a.to_str().ok()) {
                Some(methods) => format!("this path takes {methods} only"),
                None => "this path does not take this method".to_string(),
            };
            let mut answer = ApiError::Invalid { status, code: "method_not_allowed", detail }.into_response();
            if let Some(allow) = allow {
                answer.headers_mut().insert(header::ALLOW, allow);
            }
            return answer;
        }
        StatusCode::NOT_FOUND if bare => ApiError::NotFound("no such path".to_string()),
        _ if status.is_client_error() && bare => {
            // An extractor's rejection (a WebSocket upgrade without its headers, say): its text is the detail,
            // unless it was compressed on its way out.
            let encoded = response.headers().contains_key(header::CONTENT_ENCODING);
            let text = match encoded {
                true => Default::default(),
                false => axum::body::to_bytes(response.into_body(), 4096).await.unwrap_or_default(),
            };
            let detail = match String::from_utf8_lossy(&text).trim() {
                "" => status.canonical_reason().unwrap_or("invalid request").to_string(),
                t => t.to_string(),
            };
            let code = if status == StatusCode::BAD_REQUEST { "bad_request" } else { "invalid_request" };
            ApiError::Invalid { status, code, detail }
        }
        _ => return response,
    };
    error.into_response()
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

/// `Path` whose rejections are problem reports too: a path segment that is not what the route takes (not UTF-8
/// once percent-decoded, say) is a 400 `invalid_path`.
#[derive(Debug, Clone, Copy, Default, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);
