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

/// What a page shows when the API refused: a sign-in link for 401, the API's message otherwise.
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
            <div class="notice error" role="alert">
                <p>{problem.message()}</p>
                {(!code.is_empty()).then(|| view! { <code>{code}</code> })}
            </div>
        }
        .into_any()
    }
}
