//! tessera-frontend: the browser portal, in Leptos.
//!
//! The same components render on the server (feature `ssr`, inside the `tessera` binary: every page is useful HTML
//! before any script runs) and hydrate in the browser (feature `hydrate`, built for wasm32 by `cargo xtask site`).
//! Pages read the REST API and nothing else: on the server through an in-process call of the API router with the
//! request's own cookie (the same authorisation as any client, no network hop), in the browser with `fetch`. See
//! [`api`]. What they read and send are the server's own wire types from `tessera-api`, never copies of them: a
//! field renamed on the server is a compile error here.
//!
//! Rules are not copied here: layout validation and quota arithmetic come from `tessera-core`, which the server
//! runs too.

// The views of the larger pages nest deeply in types; the release build of the wasm needs more room.
#![recursion_limit = "256"]

pub mod api;
pub mod app;
pub mod pages;
pub mod widgets;
pub mod wire;

pub use app::{App, shell};
pub use tessera_core::layout::{LayoutError, validate};

/// Browser entry point: hydrates the server-rendered page.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
    // A mark that the page is interactive: what a browser test waits for before it clicks.
    if let Some(root) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.document_element()) {
        let _ = root.set_attribute("data-hydrated", "");
    }
}
