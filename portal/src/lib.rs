//! The portal's hosting: the Leptos pages of `tessera-frontend`, rendered here and hydrated in the browser.
//! `tessera_http::router` serves them beside the API, behind the same middleware; this crate does not depend on
//! the API's crates, so it compiles while they do.
//!
//! Pages read the REST API through [`InProcessApi`]: the page request's `Cookie` / `Authorization` run through the
//! API router in-process, so a page shows exactly what its viewer may see through the API, with no second set of
//! rules and no network hop. The stylesheet is embedded; the hydration script and wasm that `cargo xtask site` builds
//! are read once, at start, from the site folder ([`Site`]), so the server and the wasm build independently (and
//! at the same time). Without them, pages are still rendered here, without their live parts.
//!
//! A page is rendered whole before it is sent ([`whole_pages`]): Leptos' streaming renderer can, rarely and under
//! load, stop between two `<Suspense>` chunks and never finish the response (leptos-rs/leptos#4851 and #4647 report
//! it; this server saw about one `/fleet` render in a hundred stall while its tests ran in parallel). A render that
//! does not finish in time is dropped and done again, so a page always arrives whole or as a clear 503.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
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

/// The portal's browser half as `cargo xtask site` leaves it: `tessera.js` and `tessera_bg.wasm`, read into memory.
#[derive(Clone)]
pub struct Site {
    /// The folder they were read from.
    pub dir: PathBuf,
    js: Bytes,
    wasm: Bytes,
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("dir", &self.dir)
            .field("js", &self.js.len())
            .field("wasm", &self.wasm.len())
            .finish()
    }
}

impl Site {
    /// Where the site is read from: `TESSERA_SITE_DIR` when set, else where a build from this repository leaves
    /// it, seen from the running binary (`target/site/pkg` beside `target/{release,demo,debug}/tessera`).
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("TESSERA_SITE_DIR").filter(|d| !d.is_empty()) {
            return Some(PathBuf::from(dir));
        }
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.parent()?.join("site").join("pkg"))
    }

    /// Reads the site from `dir`: `Ok(None)` when the folder has neither file (no site was built), an error when
    /// one is there without the other, when one cannot be read, or when the site's `views` file (written by `cargo
    /// xtask site`) says its views were compiled otherwise than this binary's.
    pub fn load(dir: &Path) -> Result<Option<Site>, String> {
        let read = |name: &str| {
            let path = dir.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(Bytes::from(bytes))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("{}: {e}", path.display())),
            }
        };
        match (read("tessera.js")?, read("tessera_bg.wasm")?) {
            (Some(js), Some(wasm)) => {
                // The browser half hydrates the view tree this binary renders: both erased or both typed.
                let built = read("views")?.map(|b| String::from_utf8_lossy(&b).trim().to_string());
                let here = if cfg!(erase_components) { "erased" } else { "typed" };
                match built.as_deref() {
                    Some(kind) if kind == here => Ok(Some(Site { dir: dir.to_path_buf(), js, wasm })),
                    kind => Err(format!(
                        "{} holds a browser half built with {} views and this server renders {here} views, so \
                         the browser could not take over its pages (Leptos's erase_components, set in \
                         .cargo/config.toml; a RUSTFLAGS in the environment replaces it): build both with the \
                         same flags (`cargo xtask site`, then the server)",
                        dir.display(),
                        kind.unwrap_or("unrecorded"),
                    )),
                }
            }
            (None, None) => Ok(None),
            _ => Err(format!(
                "{} has only one of tessera.js and tessera_bg.wasm: run `cargo xtask site` again",
                dir.display()
            )),
        }
    }

    /// Bytes of script and wasm.
    pub fn size(&self) -> usize {
        self.js.len() + self.wasm.len()
    }
}

/// Largest API answer a page reads.
const MAX_API_BODY: usize = 32 << 20;

/// The portal's routes; `api` is the API router the pages read through, `site` the browser half (without it, pages
/// are rendered here only).
pub fn routes(api: Router, site: Option<Site>) -> Router {
    let hydrates = site.is_some();
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
    let pages: Router = Router::new()
        .leptos_routes_with_context(
            &options,
            generate_route_list(tessera_frontend::App),
            move || provide_context(call.clone()),
            move || tessera_frontend::shell(shell_options.clone(), hydrates),
        )
        .with_state(options)
        .layer(axum::middleware::from_fn(whole_pages));
    let (js, wasm) = match site {
        Some(site) => (Some(site.js), Some(site.wasm)),
        None => (None, None),
    };
    Router::new()
        .merge(pages)
        .route(
            "/pkg/tessera.css",
            get(|| async { asset("text/css; charset=utf-8", Bytes::from_static(CSS.as_bytes())) }),
        )
        .route("/pkg/icon.svg", get(|| async { asset("image/svg+xml", Bytes::from_static(ICON.as_bytes())) }))
        .route("/favicon.ico", get(|| async { asset("image/svg+xml", Bytes::from_static(ICON.as_bytes())) }))
        .route(
            "/pkg/tessera.js",
            get(move || {
                let js = js.clone();
                async move { built("text/javascript; charset=utf-8", js) }
            }),
        )
        .route(
            "/pkg/tessera_bg.wasm",
            get(move || {
                let wasm = wasm.clone();
                async move { built("application/wasm", wasm) }
            }),
        )
}

/// How long each try at rendering a page may take before it is dropped and tried again; the sum stays under the
/// server's request timeout.
pub const RENDER_TRIES: [Duration; 3] = [Duration::from_secs(4), Duration::from_secs(8), Duration::from_secs(12)];

/// Largest page sent.
const MAX_PAGE: usize = 16 << 20;

/// Renders a page whole (its streamed body collected) within [`RENDER_TRIES`], trying again when a render stalls;
/// 503 with `Retry-After` when every try stalled. Requests other than `GET` and `HEAD` go through as they are.
async fn whole_pages(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if request.method() != axum::http::Method::GET && request.method() != axum::http::Method::HEAD {
        return next.run(request).await;
    }
    let (parts, _) = request.into_parts();
    let path = parts.uri.path().to_string();
    for (i, limit) in RENDER_TRIES.iter().enumerate() {
        let again = axum::http::Request::from_parts(parts.clone(), Body::empty());
        let render = async {
            let response = next.clone().run(again).await;
            let (head, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, MAX_PAGE).await;
            (head, bytes)
        };
        match tokio::time::timeout(*limit, render).await {
            Ok((head, Ok(bytes))) => {
                if i > 0 {
                    tracing::info!(path = %path, tries = i + 1, "page rendered after a stalled render");
                }
                return Response::from_parts(head, Body::from(bytes));
            }
            Ok((_, Err(e))) => {
                tracing::error!(path = %path, error = %e, "page render failed");
                return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered")
                    .into_response();
            }
            Err(_) => {
                tracing::warn!(path = %path, try_ = i + 1, limit_s = limit.as_secs(), "page render stalled; rendering it again")
            }
        }
    }
    let mut response =
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "the page did not render in time: reload it").into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn asset(content_type: &'static str, bytes: Bytes) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            // Assets change with the binary and the site; a restart after an upgrade serves the new ones within the
            // hour.
            (header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=3600")),
        ],
        bytes,
    )
        .into_response()
}

/// A file of the site, or 404 with what to do when this server has none.
fn built(content_type: &'static str, bytes: Option<Bytes>) -> Response {
    match bytes {
        Some(bytes) => asset(content_type, bytes),
        None => (
            axum::http::StatusCode::NOT_FOUND,
            "this server has no portal wasm: run `cargo xtask site`, then start it again",
        )
            .into_response(),
    }
}
