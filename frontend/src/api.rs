//! Reading and writing the REST API, on either side.
//!
//! - On the server (`ssr`), [`InProcessApi`] (provided by the `tessera` binary as context) runs a request through
//!   the API router in-process, with the `Cookie` and `Authorization` headers of the page request.
//! - In the browser (`hydrate`), `fetch` with the session cookie; state changes echo the CSRF cookie in
//!   `X-CSRF-Token`, as the API requires of cookie sessions.
//!
//! Either way the answer is the API's JSON decoded into its `tessera_api` type, or its problem+json error as a
//! [`Problem`]. Bodies sent are `tessera_api` types too.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;
pub use tessera_api::Problem;

/// What the portal reads off a problem report.
pub trait ProblemExt {
    /// Whether the caller must sign in first.
    fn needs_sign_in(&self) -> bool;
    /// One line for people.
    fn message(&self) -> String;
}

impl ProblemExt for Problem {
    fn needs_sign_in(&self) -> bool {
        self.status == 401
    }

    fn message(&self) -> String {
        let what = match (self.detail.is_empty(), self.title.is_empty()) {
            (false, _) => self.detail.clone(),
            (true, false) => self.title.clone(),
            (true, true) => format!("HTTP {}", self.status),
        };
        let what = if what.ends_with(['.', '!', '?']) { what } else { format!("{what}.") };
        let what = capitalised(&what);
        match next_step(&self.code, self.status) {
            Some(next) => format!("{what} {next}"),
            None => what,
        }
    }
}

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// What to do next after a problem, by its stable code (or, for codes not listed, by its status): one sentence.
pub fn next_step(code: &str, status: u16) -> Option<&'static str> {
    Some(match code {
        "forbidden" => {
            "Only a platform admin (or, for a tenant's own settings, its admin) can do this: ask one of them."
        }
        "not_found" => {
            "It may have been removed, or you may not have access to it: check the address, or start again from the overview."
        }
        "unauthenticated" | "session_expired" | "not_a_session" | "token_missing" | "invalid_token" => "Sign in again.",
        "quota_exceeded" => {
            "Release a slice you no longer need, ask for fewer or smaller slices, or ask a platform admin to raise the limit."
        }
        "quota_nothing_to_borrow" => {
            "The other teams of your cohort have nothing left to lend now: ask for less, wait for them to release \
             slices, or ask a platform admin for a larger guarantee."
        }
        "budget_exhausted" => {
            "Ask a platform admin to raise the budget, or wait for next month; slices you hold keep running."
        }
        "budget_bad_unit" | "budget_bad_amount" | "budget_too_many" => {
            "Use compute_slice_hours or gpu_hours/<model> with a number of hours, 0 or more."
        }
        "invalid_weight" => "Give a weight between 1 and 1000.",
        "invalid_grace" => "Give a grace period between 0 and 7 days.",
        "quota_ask_already_met" => {
            "The limits in force already give what was asked (they changed since): reject the request with a note, \
             or leave it for the tenant to withdraw."
        }
        "quota_maximum_below_guarantee" => "Make the maximum at least the limit, or leave it empty for no borrowing.",
        "quota_bound_without_limit" => "Set the resource's limit first: a maximum or a lending limit sits beside it.",
        "invalid_days" => "Pick between 1 and 90 days.",
        "tenant_required" => "Choose a tenant first (the switcher in the header), then try again.",
        "reason_required" | "invalid_reason" => {
            "Write a short reason (what it is for, up to 2,000 characters) and send it again."
        }
        "invalid_count" => "Ask for at least 1 slice, and no more than the form allows.",
        "invalid_duration" => {
            "Give the duration in hours, more than 0, or leave it empty to keep the slice until you release it."
        }
        "invalid_ttl" => "Give an expiry in days, more than 0, or leave it empty.",
        "instance_in_use" => {
            "Release the allocation on that instance (or wait until its processes end), then try again."
        }
        "layout_stale" | "version_conflict" | "version" | "concurrent_update" | "proposal_decided" => {
            "Someone changed it at the same time: the page now shows the current state; check it and try again."
        }
        "request_invalid_transition" | "invalid_state" => {
            "It has moved on since the page was drawn (the page shows its state now); nothing was changed."
        }
        "already_exists" => "Pick another name.",
        "invalid_name" => "Use 1 to 63 lowercase letters, digits and hyphens, not starting with a hyphen.",
        "weak_password" => "Choose a longer password.",
        "bad_credentials" => "Check the name and the password; after several wrong tries the account waits 15 minutes.",
        "sso_user" | "local_accounts_disabled" => "Sign in with the single sign-on button instead.",
        "mig_layout_invalid" => {
            "Change the layout as it says: the editor shows which starts are allowed for each profile."
        }
        "mig_disabled" => "Turn MIG mode on for this GPU on its node first (a platform admin's job).",
        "layout_unchanged" => "The GPU already has this layout: change something first.",
        "invalid_limit" | "quota_bad_limit" | "quota_bad_resource" => {
            "Give each limit as a number of 0 or more, or leave it empty for no limit."
        }
        "usage_range" | "audit_range" | "heatmap_range" => "Pick a start before the end.",
        "heatmap_too_large" => "Pick a shorter range or one node.",
        "unavailable" | "too_many_connections" => "The server is busy or starting: try again in a few seconds.",
        "unreachable" => "Check the network connection; the page tries again on its own.",
        "internal" => "Try again; if it keeps failing, tell a platform admin (the server's log has the details).",
        _ => match status {
            401 => "Sign in again.",
            403 => "Ask a platform admin if you need this.",
            429 | 503 => "The server is busy: try again in a few seconds.",
            500..=599 => "Try again; if it keeps failing, tell a platform admin.",
            _ => return None,
        },
    })
}

/// A problem the portal itself reports: status 0 when the request did not get an answer, else the answer's status.
fn local_problem(status: u16, code: &str, title: &str, detail: impl Into<String>) -> Problem {
    Problem {
        kind: "about:blank".into(),
        title: title.into(),
        status,
        detail: detail.into(),
        code: code.into(),
        errors: Vec::new(),
        ask_for: None,
    }
}

fn transport(detail: impl Into<String>) -> Problem {
    local_problem(0, "unreachable", "The server did not answer", detail)
}

/// The answer as `T`, or as the problem it reports. An empty answer (204) decodes as `()`.
#[allow(
    clippy::result_large_err,
    reason = "pages keep the problem itself in their resources, so a box would be undone at once (and on wasm32 it \
              is small enough)"
)]
fn decode<T: DeserializeOwned>(status: u16, body: &str) -> Result<T, Problem> {
    if (200..300).contains(&status) {
        let body = if body.trim().is_empty() { "null" } else { body };
        return serde_json::from_str(body)
            .map_err(|e| local_problem(status, "bad_response", "Unexpected answer", e.to_string()));
    }
    // Anything but a problem report (a proxy's error page, say) shows as its first characters.
    let mut problem: Problem = serde_json::from_str(body)
        .unwrap_or_else(|_| local_problem(status, "", "", body.chars().take(200).collect::<String>()));
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

/// A state change (`POST`, `PUT`, `DELETE`) with a JSON body (one of the `tessera_api` bodies), decoded. An
/// empty answer (204) decodes as `()`.
pub fn send_json<T: DeserializeOwned + 'static>(
    method: &'static str,
    path: String,
    body: impl Serialize,
) -> impl Future<Output = Result<T, Problem>> + Send {
    // Nothing is sent when the body does not encode: the request only goes out when `call` is awaited.
    let call = serde_json::to_string(&body)
        .map(|body| send(method, path, Some(body)))
        .map_err(|e| local_problem(0, "bad_body", "The body could not be written", e.to_string()));
    async move {
        let (status, body) = call?.await?;
        decode(status, &body)
    }
}

/// A state change without a body (approve, cancel, revoke...), decoded. An empty answer (204) decodes as `()`.
pub fn send_empty<T: DeserializeOwned + 'static>(
    method: &'static str,
    path: String,
) -> impl Future<Output = Result<T, Problem>> + Send {
    let call = send(method, path, None);
    async move {
        let (status, body) = call.await?;
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
        let api = api.ok_or_else(|| transport("no API in this context"))?;
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
        let request = request.body(body.unwrap_or_default()).map_err(|e| transport(e.to_string()))?;
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
async fn send(_method: &'static str, path: String, _body: Option<String>) -> Result<(u16, String), Problem> {
    Err(transport(format!("{path}: built without `ssr` or `hydrate`")))
}

/// Browser-only helpers.
#[cfg(feature = "hydrate")]
pub mod browser {
    use wasm_bindgen::JsCast;
    use wasm_bindgen_futures::JsFuture;

    use super::{Problem, transport};

    /// The session's CSRF token (readable cookie `tessera_csrf`).
    pub fn csrf_token() -> Option<String> {
        let document = web_sys::window()?.document()?;
        let cookies = js_sys::Reflect::get(&document, &"cookie".into()).ok()?.as_string()?;
        cookies.split(';').find_map(|c| c.trim().strip_prefix("tessera_csrf=").map(str::to_string))
    }

    /// `fetch`, same-origin credentials, CSRF header on state changes.
    pub async fn fetch(method: &str, path: &str, body: Option<String>) -> Result<(u16, String), Problem> {
        let err = |e: wasm_bindgen::JsValue| transport(format!("{e:?}"));
        let window = web_sys::window().ok_or_else(|| transport("no window"))?;
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
        assert_eq!(
            (err.status, err.code.as_str(), err.message()),
            (
                403,
                "forbidden",
                "Admins only. Only a platform admin (or, for a tenant's own settings, its admin) can do this: ask one \
                 of them."
                    .to_string()
            )
        );
        let err = decode::<serde_json::Value>(502, "Bad Gateway").expect_err("502");
        assert_eq!(
            (err.status, err.message()),
            (502, "Bad Gateway. Try again; if it keeps failing, tell a platform admin.".to_string())
        );
        let err = decode::<serde_json::Value>(
            422,
            r#"{"type":"about:blank","title":"Unprocessable Entity","status":422,"code":"odd","detail":"an odd thing?"}"#,
        );
        assert_eq!(err.expect_err("422").message(), "An odd thing?", "no made-up advice for codes not known");
        assert!(decode::<serde_json::Value>(401, "{}").expect_err("401").needs_sign_in());
        assert_eq!(decode::<Vec<u8>>(200, "[1,2]"), Ok(vec![1, 2]));
        assert_eq!(decode::<()>(204, ""), Ok(()), "an empty answer is `()`");
        let err = decode::<()>(200, r#"{"id":1}"#).expect_err("not the documented type");
        assert_eq!((err.status, err.code.as_str()), (200, "bad_response"));
    }

    #[test]
    fn every_code_people_meet_in_the_portal_says_what_to_do_next() {
        for code in [
            "forbidden",
            "not_found",
            "unauthenticated",
            "quota_exceeded",
            "quota_ask_already_met",
            "tenant_required",
            "reason_required",
            "invalid_count",
            "invalid_duration",
            "instance_in_use",
            "layout_stale",
            "version_conflict",
            "request_invalid_transition",
            "already_exists",
            "invalid_name",
            "weak_password",
            "bad_credentials",
            "sso_user",
            "mig_layout_invalid",
            "invalid_limit",
            "usage_range",
            "unavailable",
            "unreachable",
            "internal",
            "quota_nothing_to_borrow",
            "budget_exhausted",
            "budget_bad_unit",
            "invalid_weight",
            "invalid_grace",
            "quota_maximum_below_guarantee",
            "quota_bound_without_limit",
            "invalid_days",
        ] {
            let hint = next_step(code, 400).unwrap_or_else(|| panic!("{code}: no next step"));
            assert!(hint.ends_with('.') && hint.chars().next().is_some_and(char::is_uppercase), "{code}: {hint}");
        }
    }
}
