//! The portal: the Leptos pages of `tessera-frontend`, rendered here and hydrated in the browser.
//!
//! Pages read the REST API through [`InProcessApi`]: the page request's `Cookie` / `Authorization` run through the
//! API router in-process, so a page shows exactly what its viewer may see through the API, with no second set of
//! rules and no network hop. The stylesheet is always embedded; the hydration script and wasm are embedded when
//! `cargo xtask site` built them before this crate (see `build.rs`).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leptos::config::{Env, LeptosOptions};
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use tessera_frontend::api::InProcessApi;
use tower::ServiceExt;

const CSS: &str = include_str!("../../frontend/style/tessera.css");

/// The tab icon: the header's four tiles. Also answered at `/favicon.ico`, which browsers ask for on their own.
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect x=\"1\" y=\"1\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#d55e00\"/>\
<rect x=\"8\" y=\"1\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#0072b2\"/>\
<rect x=\"1\" y=\"8\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#e69f00\"/>\
<rect x=\"8\" y=\"8\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#009e73\"/></svg>";
#[cfg(portal_wasm)]
const JS: &[u8] = include_bytes!(concat!(env!("TESSERA_SITE_PKG"), "/tessera.js"));
#[cfg(portal_wasm)]
const WASM: &[u8] = include_bytes!(concat!(env!("TESSERA_SITE_PKG"), "/tessera_bg.wasm"));

/// Whether this build carries the portal's wasm (else pages are server-rendered only).
pub const HYDRATES: bool = cfg!(portal_wasm);

/// Largest API answer a page reads.
const MAX_API_BODY: usize = 32 << 20;

/// The portal's routes; `api` is the API router the pages read through.
pub fn routes(api: Router) -> Router {
    let options = LeptosOptions::builder().output_name("tessera").site_pkg_dir("pkg").env(Env::PROD).build();
    let call = InProcessApi(Arc::new(move |request: axum::http::Request<String>| {
        let api = api.clone();
        Box::pin(async move {
            let Ok(response) = api.oneshot(request.map(Body::from)).await;
            let status = response.status().as_u16();
            match axum::body::to_bytes(response.into_body(), MAX_API_BODY).await {
                Ok(bytes) => (status, String::from_utf8_lossy(&bytes).into_owned()),
                Err(e) => (502, format!("{{\"title\":\"API answer unreadable\",\"detail\":\"{e}\"}}")),
            }
        })
    }));
    let shell_options = options.clone();
    Router::new()
        .leptos_routes_with_context(
            &options,
            generate_route_list(tessera_frontend::App),
            move || provide_context(call.clone()),
            move || tessera_frontend::shell(shell_options.clone(), HYDRATES),
        )
        .route("/pkg/tessera.css", get(|| async { asset("text/css; charset=utf-8", CSS.as_bytes()) }))
        .route("/pkg/icon.svg", get(|| async { asset("image/svg+xml", ICON.as_bytes()) }))
        .route("/favicon.ico", get(|| async { asset("image/svg+xml", ICON.as_bytes()) }))
        .route("/pkg/tessera.js", get(|| async { script() }))
        .route("/pkg/tessera_bg.wasm", get(|| async { wasm() }))
        .with_state(options)
}

fn asset(content_type: &'static str, bytes: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // Assets change with the binary; a restart after an upgrade serves the new ones within the hour.
            (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600")),
        ],
        bytes,
    )
        .into_response()
}

#[cfg(not(portal_wasm))]
fn missing() -> Response {
    (axum::http::StatusCode::NOT_FOUND, "this build has no portal wasm: run `cargo xtask site` before building")
        .into_response()
}

fn script() -> Response {
    #[cfg(portal_wasm)]
    return asset("text/javascript; charset=utf-8", JS);
    #[cfg(not(portal_wasm))]
    missing()
}

fn wasm() -> Response {
    #[cfg(portal_wasm)]
    return asset("application/wasm", WASM);
    #[cfg(not(portal_wasm))]
    missing()
}
