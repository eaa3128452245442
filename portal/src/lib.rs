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
//! The script and wasm are served under names that carry a hash of their bytes, `immutable` for a year: a browser
//! fetches them once per build. `cargo xtask site` stores them compressed beside the originals (brotli and gzip, at
//! their highest levels); the server sends the encoding the browser accepts as stored, and never compresses them
//! itself ([`Asset`]). The stylesheet and the unhashed names are revalidated with an `ETag` on every use.
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
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use leptos::config::{Env, LeptosOptions};
use leptos::prelude::provide_context;
use leptos_axum::{LeptosRoutes, generate_route_list};
use sha2::{Digest, Sha256};
use tessera_frontend::api::InProcessApi;
use tower::ServiceExt;

const CSS: &str = include_str!("../../frontend/style/tessera.css");

/// The tab icon: the header's four tiles. Also answered at `/favicon.ico`, which browsers ask for on their own.
const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect x=\"1\" y=\"1\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#d55e00\"/>\
<rect x=\"8\" y=\"1\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#0072b2\"/>\
<rect x=\"1\" y=\"8\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#e69f00\"/>\
<rect x=\"8\" y=\"8\" width=\"7\" height=\"7\" rx=\"1.5\" fill=\"#009e73\"/></svg>";

/// The portal's browser half as `cargo xtask site` leaves it: `tessera.js` and `tessera_bg.wasm` (with their `.br`
/// and `.gz` forms where the folder has them), read into memory.
#[derive(Clone)]
pub struct Site {
    /// The folder they were read from.
    pub dir: PathBuf,
    /// 16 hex digits of a SHA-256 over the script's and the wasm's digests: part of the names they are served under.
    hash: String,
    js: Asset,
    wasm: Asset,
}

impl std::fmt::Debug for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Site")
            .field("dir", &self.dir)
            .field("hash", &self.hash)
            .field("js", &self.js)
            .field("wasm", &self.wasm)
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
                    Some(kind) if kind == here => {
                        let js = Asset::new("text/javascript; charset=utf-8", js)
                            .compressed(read("tessera.js.br")?, read("tessera.js.gz")?);
                        let wasm = Asset::new("application/wasm", wasm)
                            .compressed(read("tessera_bg.wasm.br")?, read("tessera_bg.wasm.gz")?);
                        // From the two files' own digests: each byte is hashed once.
                        let hash = hex(&Sha256::digest(format!("{} {}", js.tag, wasm.tag)))[..16].to_string();
                        Ok(Some(Site { dir: dir.to_path_buf(), hash, js, wasm }))
                    }
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
        self.js.plain.len() + self.wasm.plain.len()
    }

    /// Bytes of script and wasm as a browser that accepts brotli receives them (`None` where the folder has no
    /// compressed forms).
    pub fn brotli_size(&self) -> Option<usize> {
        Some(self.js.br.as_ref()?.len() + self.wasm.br.as_ref()?.len())
    }

    /// What the served names carry: `tessera.HASH.js` and `tessera.HASH_bg.wasm` under `/pkg/`.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The Leptos output name the hydration scripts load: `tessera.HASH` (the wasm is that name with `_bg`).
    fn output_name(&self) -> String {
        format!("tessera.{}", self.hash)
    }
}

/// A file served as stored: its bytes, and its brotli and gzip forms where there are any.
#[derive(Clone)]
struct Asset {
    content_type: &'static str,
    /// The SHA-256 of the plain bytes, first 20 hex digits; each encoding's `ETag` adds its own suffix.
    tag: String,
    plain: Bytes,
    br: Option<Bytes>,
    gzip: Option<Bytes>,
}

impl std::fmt::Debug for Asset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asset")
            .field("content_type", &self.content_type)
            .field("plain", &self.plain.len())
            .field("br", &self.br.as_ref().map(Bytes::len))
            .field("gzip", &self.gzip.as_ref().map(Bytes::len))
            .finish()
    }
}

/// How a file may be cached: `Immutable` under a name that changes with its bytes, `Revalidate` under one that
/// does not (the browser asks with `If-None-Match` each time and gets 304 while it is the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caching {
    Immutable,
    Revalidate,
}

impl Asset {
    fn new(content_type: &'static str, plain: Bytes) -> Asset {
        let tag = hex(&Sha256::digest(&plain))[..20].to_string();
        Asset { content_type, tag, plain, br: None, gzip: None }
    }

    fn compressed(mut self, br: Option<Bytes>, gzip: Option<Bytes>) -> Asset {
        self.br = br;
        self.gzip = gzip;
        self
    }

    /// The answer to a `GET` or `HEAD` with `headers`: the stored form the request accepts (brotli, then gzip, then
    /// the plain bytes), or 304 when the request already holds it.
    fn respond(&self, headers: &HeaderMap, caching: Caching) -> Response {
        let accepts = |coding: &str| accepts_encoding(headers, coding);
        let (body, coding, suffix) = match (&self.br, &self.gzip) {
            (Some(br), _) if accepts("br") => (br.clone(), Some("br"), "-br"),
            (_, Some(gz)) if accepts("gzip") => (gz.clone(), Some("gzip"), "-gz"),
            _ => (self.plain.clone(), None, ""),
        };
        let etag = format!("\"{}{suffix}\"", self.tag);
        let cache = match caching {
            Caching::Immutable => "public, max-age=31536000, immutable",
            Caching::Revalidate => "no-cache",
        };
        let mut response = if none_match(headers, &etag) {
            axum::http::StatusCode::NOT_MODIFIED.into_response()
        } else {
            let mut r = body.into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(self.content_type));
            if let Some(coding) = coding {
                r.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
            }
            r
        };
        let h = response.headers_mut();
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
        if self.br.is_some() || self.gzip.is_some() {
            h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        }
        if let Ok(v) = HeaderValue::from_str(&etag) {
            h.insert(header::ETAG, v);
        }
        response
    }
}

/// Whether `Accept-Encoding` accepts `coding` (by name or `*`, with a quality above 0).
fn accepts_encoding(headers: &HeaderMap, coding: &str) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim();
            let q = parts
                .filter_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.trim().parse::<f32>().ok()))
                .next()
                .unwrap_or(1.0);
            (name.eq_ignore_ascii_case(coding) || name == "*") && q > 0.0
        },
    )
}

/// Whether `If-None-Match` names `etag` (weak comparison, as RFC 9110 has it for `GET`) or is `*`.
fn none_match(headers: &HeaderMap, etag: &str) -> bool {
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == etag || t == "*")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Largest API answer a page reads.
const MAX_API_BODY: usize = 32 << 20;

/// The portal's routes; `api` is the API router the pages read through, `site` the browser half (without it, pages
/// are rendered here only).
pub fn routes(api: Router, site: Option<Site>) -> Router {
    let hydrates = site.is_some();
    // The hydration scripts load `/pkg/{output_name}.js` and `/pkg/{output_name}_bg.wasm`: the hashed names.
    let output_name = site.as_ref().map_or_else(|| "tessera".to_string(), Site::output_name);
    let options = LeptosOptions::builder().output_name(output_name).site_pkg_dir("pkg").env(Env::PROD).build();
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
    let css = Asset::new("text/css; charset=utf-8", Bytes::from_static(CSS.as_bytes()));
    let icon = Asset::new("image/svg+xml", Bytes::from_static(ICON.as_bytes()));
    let mut router = Router::new()
        .merge(pages)
        .route("/pkg/tessera.css", serve(css, Caching::Revalidate))
        .route("/pkg/icon.svg", serve(icon.clone(), Caching::Revalidate))
        .route("/favicon.ico", serve(icon, Caching::Revalidate));
    match site {
        Some(site) => {
            let name = site.output_name();
            router = router
                .route(&format!("/pkg/{name}.js"), serve(site.js.clone(), Caching::Immutable))
                .route(&format!("/pkg/{name}_bg.wasm"), serve(site.wasm.clone(), Caching::Immutable))
                // The names without the hash: what a page rendered before a restart may still ask for.
                .route("/pkg/tessera.js", serve(site.js, Caching::Revalidate))
                .route("/pkg/tessera_bg.wasm", serve(site.wasm, Caching::Revalidate));
        }
        None => {
            router = router.route("/pkg/tessera.js", get(no_site)).route("/pkg/tessera_bg.wasm", get(no_site));
        }
    }
    router
}

/// A `GET` (and `HEAD`) route answering `asset`.
fn serve(asset: Asset, caching: Caching) -> axum::routing::MethodRouter {
    get(move |headers: HeaderMap| {
        let asset = asset.clone();
        async move { asset.respond(&headers, caching) }
    })
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

/// 404 with what to do, for the site's files on a server that has none.
async fn no_site() -> Response {
    (axum::http::StatusCode::NOT_FOUND, "this server has no portal wasm: run `cargo xtask site`, then start it again")
        .into_response()
}
