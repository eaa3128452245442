//! Sign-in: the identity provider's button, and the local form when local accounts are on.

use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

use tessera_api::signin::{LocalSignIn, SessionView, SignInMethods};

use crate::api::{self, ProblemExt};
use crate::widgets::problem_view;

/// `/signin?return_to=/path`.
#[component]
pub fn SignInPage() -> impl IntoView {
    let methods = Resource::new(|| (), |_| api::get_json::<SignInMethods>("/auth/methods".into()));
    let query = use_query_map();
    let return_to = move || {
        query
            .read()
            .get("return_to")
            .filter(|p| p.starts_with('/') && !p.starts_with("//"))
            .unwrap_or_else(|| "/".into())
    };
    view! {
        <section class="page narrow">
            <h1>"Sign in to Tessera"</h1>
            {move || (query.read().get("link").as_deref() == Some("invalid")).then(|| view! {
                <p class="notice" data-testid="link-invalid">
                    "That sign-in link has been used or has expired: each works once. Ask a platform admin for a new one, or run "
                    <code>"tessera user sign-in-link NAME"</code>" on the server."
                </p>
            })}
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match methods.await {
                        Err(p) => problem_view(&p),
                        Ok(m) => {
                            let sso_href = format!("/auth/login?return_to={}", encode(&return_to()));
                            let name = m.sso_name.clone().unwrap_or_else(|| "your identity provider".into());
                            view! {
                                {m.sso.then(|| view! {
                                    <a class="button primary wide" href=sso_href rel="external" data-testid="sso">{format!("Sign in with {name}")}</a>
                                })}
                                {m.local.then(|| view! { <LocalForm return_to=return_to() /> })}
                                {(!m.sso && !m.local).then(|| view! {
                                    <p class="notice">"No sign-in method is configured on this server; use an API token."</p>
                                })}
                            }
                            .into_any()
                        }
                    }
                })}
            </Suspense>
        </section>
    }
}

fn encode(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[component]
fn LocalForm(return_to: String) -> impl IntoView {
    let name = RwSignal::new(String::new());
    let password = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        busy.set(true);
        let body = LocalSignIn { name: name.get_untracked(), password: password.get_untracked() };
        let target = return_to.clone();
        let call = api::send_json::<SessionView>("POST", "/auth/local".into(), body);
        leptos::task::spawn_local(async move {
            match call.await {
                Ok(_) => {
                    #[cfg(feature = "hydrate")]
                    if let Some(w) = web_sys::window() {
                        let _ = w.location().set_href(&target);
                    }
                    let _ = target;
                }
                Err(p) => {
                    error.set(Some(p.message()));
                    busy.set(false);
                }
            }
        });
    };
    view! {
        <form class="card stack" on:submit=on_submit>
            <h2>"Local account"</h2>
            <label>"User name" <input name="name" autocomplete="username" required bind:value=name /></label>
            <label>"Password" <input name="password" type="password" autocomplete="current-password" required bind:value=password /></label>
            {move || error.get().map(|e| view! { <p class="error" role="alert">{e}</p> })}
            <button class="button" type="submit" disabled=move || busy.get()>"Sign in"</button>
        </form>
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn return_paths_are_percent_encoded() {
        assert_eq!(super::encode("/fleet?x=1&y"), "/fleet%3Fx%3D1%26y");
    }
}
