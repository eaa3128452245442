//! Reading and writing the REST API, on either side.
//!
//! - On the server (`ssr`), [`InProcessApi`] (provided by the `tessera` binary as context) runs a request through
//!   the API router in-process, with the `Cookie` and `Authorization` headers of the page request.
//! - In the browser (`hydrate`), `fetch` with the session cookie; state changes echo the CSRF cookie in
//!   `X-CSRF-Token`, as the API requires of cookie sessions.
//!
//! Either way the answer is the API's JSON, or its problem+json error turned into a [`Problem`].

use std::future::Future;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// An API error, as problem+json carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// HTTP status (0: the request did not get an answer).
    #[serde(default)]
    pub status: u16,
    /// Stable code, e.g. `unauthenticated`, `quota_exceeded`.
    #[serde(default)]
    pub code: String,
    /// Short summary.
    #[serde(default)]
    pub title: String,
    /// What went wrong.
    #[serde(default)]
    pub detail: String,
}

impl Problem {
    fn transport(detail: impl Into<String>) -> Problem {
        Problem {
            status: 0,
            code: "unreachable".into(),
            title: "The server did not answer".into(),
            detail: detail.into(),
        }
    }

    /// Whether the caller must sign in first.
    pub fn needs_sign_in(&self) -> bool {
        self.status == 401
    }

    /// One line for people.
    pub fn message(&self) -> String {
        match (self.detail.is_empty(), self.title.is_empty()) {
            (false, _) => self.detail.clone(),
            (true, false) => self.title.clone(),
            (true, true) => format!("HTTP {}", self.status),
        }
    }
}

fn decode<T: DeserializeOwned>(status: u16, body: &str) -> Result<T, Problem> {
    if (200..300).contains(&status) {
        return serde_json::from_str(body).map_err(|e| Problem {
            status,
            code: "bad_response".into(),
            title: "Unexpected answer".into(),
            detail: e.to_string(),
        });
    }
    let mut problem: Problem = serde_json::from_str(body).unwrap_or_else(|_| Problem {
        status,
        code: String::new(),
        title: String::new(),
        detail: body.chars().take(200).collect(),
    });
    problem.status = status;
    Err(problem)
}

/// The server's in-process API: takes a request, answers with status and body.
#[cfg(feature = "ssr")]
#[derive(Clone)]
pub struct InProcessApi(
    #[allow(clippy::type_complexity)]
    pub  std::sync::Arc<
        dyn Fn(http::Request<String>) -> std::pin::Pin<Box<dyn Future<Output = (u16, String)> + Send>> + Send + Sync,
    >,
);

#[cfg(feature = "ssr")]
impl std::fmt::Debug for InProcessApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcessApi")
    }
}

/// `GET path` (e.g. `/api/v1/nodes`), decoded. Call it inside a reactive scope (a resource's fetcher): the
/// server side takes the page request from the context before the first `.await`.
pub fn get_json<T: DeserializeOwned + 'static>(path: String) -> impl Future<Output = Result<T, Problem>> + Send {
    let call = send("GET", path, None);
    async move {
        let (status, body) = call.await?;
        decode(status, &body)
    }
}

/// A state change (`POST`, `PUT`, `DELETE`) with a JSON body, decoded.
pub fn send_json<T: DeserializeOwned + 'static>(
    method: &'static str,
    path: String,
    body: Option<serde_json::Value>,
) -> impl Future<Output = Result<T, Problem>> + Send {
    let call = send(method, path, body.map(|b| b.to_string()));
    async move {
        let (status, body) = call.await?;
        let body = if body.trim().is_empty() { "null".to_string() } else { body };
        decode(status, &body)
    }
}

#[cfg(feature = "ssr")]
fn send(
    method: &'static str,
    path: String,
    body: Option<String>,
) -> impl Future<Output = Result<(u16, String), Problem>> + Send {
    use leptos::prelude::use_context;
    let api = use_context::<InProcessApi>();
    let parts = use_context::<http::request::Parts>();
    async move {
        let api = api.ok_or_else(|| Problem::transport("no API in this context"))?;
        let mut request = http::Request::builder().method(method).uri(&path).header("accept", "application/json");
        if let Some(parts) = &parts {
            for name in ["cookie", "authorization", "x-csrf-token"] {
                if let Some(v) = parts.headers.get(name) {
                    request = request.header(name, v.clone());
                }
            }
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(body.unwrap_or_default()).map_err(|e| Problem::transport(e.to_string()))?;
        Ok((api.0)(request).await)
    }
}

#[cfg(all(feature = "hydrate", not(feature = "ssr")))]
fn send(
    method: &'static str,
    path: String,
    body: Option<String>,
) -> impl Future<Output = Result<(u16, String), Problem>> + Send {
    send_wrapper::SendWrapper::new(async move { browser::fetch(method, &path, body).await })
}

#[cfg(not(any(feature = "ssr", feature = "hydrate")))]
fn send(
    _method: &'static str,
    path: String,
    _body: Option<String>,
) -> impl Future<Output = Result<(u16, String), Problem>> + Send {
    async move { Err(Problem::transport(format!("{path}: built without `ssr` or `hydrate`"))) }
}

/// Browser-only helpers.
#[cfg(feature = "hydrate")]
pub mod browser {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;

    use super::Problem;

    /// The session's CSRF token (readable cookie `tessera_csrf`).
    pub fn csrf_token() -> Option<String> {
        let document = web_sys::window()?.document()?;
        let cookies = js_sys::Reflect::get(&document, &"cookie".into()).ok()?.as_string()?;
        cookies.split(';').find_map(|c| c.trim().strip_prefix("tessera_csrf=").map(str::to_string))
    }

    /// `fetch`, same-origin credentials, CSRF header on state changes.
    pub async fn fetch(method: &str, path: &str, body: Option<String>) -> Result<(u16, String), Problem> {
        let err = |e: wasm_bindgen::JsValue| Problem::transport(format!("{e:?}"));
        let window = web_sys::window().ok_or_else(|| Problem::transport("no window"))?;
        let init = web_sys::RequestInit::new();
        init.set_method(method);
        init.set_credentials(web_sys::RequestCredentials::SameOrigin);
        if let Some(b) = &body {
            init.set_body(&wasm_bindgen::JsValue::from_str(b));
        }
        let request = web_sys::Request::new_with_str_and_init(path, &init).map_err(err)?;
        let headers = request.headers();
        headers.set("accept", "application/json").map_err(err)?;
        if body.is_some() {
            headers.set("content-type", "application/json").map_err(err)?;
        }
        if let Some(token) = csrf_token().filter(|_| method != "GET") {
            headers.set("x-csrf-token", &token).map_err(err)?;
        }
        let response: web_sys::Response =
            JsFuture::from(window.fetch_with_request(&request)).await.map_err(err)?.dyn_into().map_err(err)?;
        let text = JsFuture::from(response.text().map_err(err)?).await.map_err(err)?;
        Ok((response.status(), text.as_string().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_keep_the_api_code_and_status() {
        let body =
            r#"{"type":"about:blank","title":"Forbidden","status":403,"code":"forbidden","detail":"admins only"}"#;
        let err = decode::<serde_json::Value>(403, body).expect_err("403");
        assert_eq!((err.status, err.code.as_str(), err.message()), (403, "forbidden", "admins only".to_string()));
        let err = decode::<serde_json::Value>(502, "Bad Gateway").expect_err("502");
        assert_eq!((err.status, err.message()), (502, "Bad Gateway".to_string()));
        assert!(decode::<serde_json::Value>(401, "{}").expect_err("401").needs_sign_in());
        assert_eq!(decode::<Vec<u8>>(200, "[1,2]"), Ok(vec![1, 2]));
    }
}
