//! `ETag` and `If-Match`, shared by every versioned object (requests, quota requests, reservations): answers carry
//! the object's version as `ETag: "v<version>"`; changes take it back as `If-Match`, so that of two callers acting
//! on the same version one wins and the other gets 409 `version_conflict`.
//!
//! `If-Match` is optional: without it a change applies to whatever version is current. The portal and the
//! `tessera` CLI send none, and API tokens written against earlier versions may not either; a client that wants
//! protection against a concurrent change sends it. When sent it must match the documented pattern
//! `^(\*|(W/)?"v(0|[1-9][0-9]{0,17})")$` exactly (at most 18 digits, no leading zeros), as one value in one header,
//! or the change is refused with 400 `invalid_if_match`: a value read loosely could name a version the client never
//! saw.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ApiJson};

/// The `ETag` of version `version`.
pub fn etag(version: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"v{version}\"")).unwrap_or(HeaderValue::from_static("\"v0\""))
}

/// The version an `If-Match` header names (`"v3"` or `W/"v3"`); `None` for `*` (any) or no header; 400
/// `invalid_if_match` for anything else, several headers included.
pub fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let mut values = headers.get_all(header::IF_MATCH).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(invalid("send one If-Match header"));
    }
    parse(value.as_bytes())
}

/// A change's `If-Match`, read by [`if_match`] before the handler runs: the version it names, `None` for `*` or
/// none sent. Every versioned change takes it, so the header is read one way everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IfMatch(pub Option<i64>);

impl<S: Send + Sync> FromRequestParts<S> for IfMatch {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        if_match(&parts.headers).map(IfMatch)
    }
}

/// The `If-Match` header as the API document states it, once for every versioned change's `params(...)`.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IfMatchParam {
    // One line: the document's description is this comment, line breaks included.
    /// Optional: the `ETag` read (`"v3"`, `W/"v3"` or `*`; no leading zeros). Of two callers acting on the same version, one wins and the other gets 409 `version_conflict`; without it the change applies to the current version. A value off the pattern, or two headers, is 400 `invalid_if_match`
    #[param(rename = "If-Match", pattern = r#"^(\*|(W/)?"v(0|[1-9][0-9]{0,17})")$"#)]
    pub if_match: Option<String>,
}

/// `value` read strictly to the documented pattern, with no leading zeros (`"v0"` is version 0; `"v01"` is refused).
pub fn parse(value: &[u8]) -> Result<Option<i64>, ApiError> {
    if value == b"*" {
        return Ok(None);
    }
    let tag = value.strip_prefix(b"W/").unwrap_or(value);
    let digits = tag.strip_prefix(b"\"v").and_then(|t| t.strip_suffix(b"\"")).unwrap_or_default();
    let well_formed = (1..=18).contains(&digits.len())
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1);
    if !well_formed {
        return Err(invalid("If-Match must be `*` or an ETag this API gave, e.g. \"v3\" or W/\"v3\""));
    }
    // At most 18 digits: always an i64.
    std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).map(Some).ok_or_else(|| invalid("not a version"))
}

fn invalid(detail: &str) -> ApiError {
    ApiError::Invalid { status: StatusCode::BAD_REQUEST, code: "invalid_if_match", detail: detail.to_string() }
}

/// `view` with its version as `ETag` and, when it was just created (201), its address as `Location`.
pub fn versioned<V: serde::Serialize>(status: StatusCode, version: i64, location: &str, view: V) -> Response {
    let mut response = (status, ApiJson(view)).into_response();
    response.headers_mut().insert(header::ETAG, etag(version));
    if status == StatusCode::CREATED
        && let Ok(l) = HeaderValue::from_str(location)
    {
        response.headers_mut().insert(header::LOCATION, l);
    }
    response
}
