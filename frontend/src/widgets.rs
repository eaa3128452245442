//! Pieces every page shares: how a refused API call shows, and the resources the shell provides to pages. Pages
//! import them from here, never from the shell (`app.rs`), which imports the pages.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::signin::SessionView;
use tessera_api::tenants::TenantView;

use crate::api::{Problem, ProblemExt};

/// The session of the page's viewer (`Err` with status 401 when nobody is signed in).
pub type SessionResource = Resource<Result<SessionView, Problem>>;

/// The tenants the viewer may see (names for ids).
pub type TenantsResource = Resource<Result<Vec<TenantView>, Problem>>;

/// What a page shows when the API refused: a sign-in link for 401, otherwise what happened and what to do next
/// in a sentence (the stable code stays in `data-code` and the tooltip, for reports).
pub fn problem_view(problem: &Problem) -> AnyView {
    if problem.needs_sign_in() {
        view! {
            <div class="notice" role="status">
                <p>"Sign in to see this page."</p>
                <A href="/signin">"Sign in"</A>
            </div>
        }
        .into_any()
    } else {
        let code = problem.code.clone();
        view! {
            <div class="notice error" role="alert" data-code=code.clone() title=(!code.is_empty()).then(|| format!("code: {code}"))>
                <p>{problem.message()}</p>
            </div>
        }
        .into_any()
    }
}

/// Messages after an action (`(ok, text)`, oldest first), read out politely as they change.
#[component]
pub fn Messages(
    messages: RwSignal<Vec<(bool, String)>>,
    #[prop(optional)] testid: Option<&'static str>,
) -> impl IntoView {
    view! {
        <ul class="messages" aria-live="polite" data-testid=testid>
            {move || messages.get().into_iter().map(|(ok, m)| view! { <li class:ok=ok class:error=!ok>{m}</li> }).collect_view()}
        </ul>
    }
}

/// Copies `text` to the clipboard; says "Copied" once done. `label` names what it copies for screen readers.
#[component]
pub fn CopyButton(text: String, #[prop(optional, into)] label: String) -> impl IntoView {
    let copied = RwSignal::new(false);
    let on_click = move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(w) = web_sys::window() {
            let _ = w.navigator().clipboard().write_text(&text);
            copied.set(true);
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
    };
    let aria = if label.is_empty() { "Copy".to_string() } else { format!("Copy {label}") };
    view! { <button class="button small copy" type="button" aria-label=aria on:click=on_click>{move || if copied.get() { "Copied" } else { "Copy" }}</button> }
}

/// The words of quotas and usage, explained once.
#[component]
pub fn Glossary() -> impl IntoView {
    view! {
        <details class="glossary card" id="glossary" data-testid="glossary">
            <summary>"What the units mean"</summary>
            <dl>
                <dt>"Compute slice"</dt>
                <dd>"The unit of GPU compute that MIG hands out: an H100 or A100 has 7 (a 1g instance is 1 slice, a 3g instance 3, a whole GPU 7), an A30 has 4. Quotas count compute slices across all kinds of slices; time-slice and MPS shares count as their share of the GPU's slices."</dd>
                <dt>"GPU memory (GiB)"</dt>
                <dd>"The memory that comes with a slice: a 1g.10gb instance brings 10 GB, a whole H100-80GB 80 GB."</dd>
                <dt>"Slice-hour"</dt>
                <dd>"One compute slice held for one hour: a 3g instance held for 2 hours is 6 slice-hours. Usage and chargeback count these."</dd>
                <dt>"GPU-hour"</dt>
                <dd>"A whole GPU for one hour; a slice counts as its share of the GPU (a 3g instance of an H100 held for 7 hours is 3 GPU-hours)."</dd>
                <dt>"Idle"</dt>
                <dd>"An active allocation whose device stayed under the chosen utilisation for the chosen number of hours: a candidate to release."</dd>
                <dt>"Pending"</dt>
                <dd>"Asked for, waiting for an admin (or for a MIG layout change to be approved); it counts against the quota until decided."</dd>
            </dl>
        </details>
    }
}
