//! `/tokens`: the viewer's API tokens. Create one (its secret is shown once, here, and never again: the server
//! keeps only its hash), see when each was made, revoke.

use leptos::prelude::*;

use tessera_api::people::{CreatedToken, NewToken, TokenView};

use crate::api::{self, ProblemExt};
use crate::pages::{ago, now_ms};
use crate::widgets::problem_view;

/// Checks a token name as the server does (1-100 characters once trimmed).
pub fn token_name_error(name: &str) -> Option<&'static str> {
    let n = name.trim().chars().count();
    if n == 0 {
        Some("Give the token a name, e.g. what will use it.")
    } else if n > 100 {
        Some("A token name has at most 100 characters.")
    } else {
        None
    }
}

/// The tokens page.
#[component]
pub fn TokensPage() -> impl IntoView {
    let tokens = Resource::new(|| (), |_| api::get_json::<Vec<TokenView>>("/api/v1/tokens".into()));
    let name = RwSignal::new(String::new());
    let created = RwSignal::new(None::<CreatedToken>);
    let error = RwSignal::new(None::<String>);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let n = name.get_untracked();
        if let Some(e) = token_name_error(&n) {
            error.set(Some(e.to_string()));
            return;
        }
        leptos::task::spawn_local(async move {
            let body = NewToken { name: n.trim().to_string() };
            match api::send_json::<CreatedToken>("POST", "/api/v1/tokens".into(), body).await {
                Ok(t) => {
                    created.set(Some(t));
                    error.set(None);
                    name.set(String::new());
                    tokens.refetch();
                }
                Err(p) => error.set(Some(format!("{} ({})", p.message(), p.code))),
            }
        });
    };
    let revoke = move |id: String| {
        leptos::task::spawn_local(async move {
            match api::send_empty::<()>("POST", format!("/api/v1/tokens/{id}/revoke")).await {
                Ok(_) => {
                    error.set(None);
                    tokens.refetch();
                }
                Err(p) => error.set(Some(format!("{} ({})", p.message(), p.code))),
            }
        });
    };
    view! {
        <section class="page">
            <h1>"API tokens"</h1>
            <p class="muted">"A token acts as you on the REST API and the CLI: " <code>"Authorization: Bearer tsr_…"</code> ". Revoke it when it is no longer used."</p>
            <form class="card toolbar" data-testid="token-form" on:submit=create>
                <label class="grow">"Name"<input type="text" name="token-name" maxlength="100" placeholder="e.g. ci-pipeline" bind:value=name /></label>
                <button class="button primary" type="submit">"Create token"</button>
            </form>
            {move || error.get().map(|e| view! { <p class="notice error" role="alert">{e}</p> })}
            {move || created.get().map(|t| view! {
                <div class="card secret" data-testid="new-token" role="status">
                    <p><strong>{format!("Token “{}” created.", t.name)}</strong>" Copy the secret now: it is not shown again."</p>
                    <code class="secret" data-testid="secret">{t.secret.clone()}</code>
                    <CopyButton text=t.secret.clone() />
                    <button class="button small" on:click=move |_| created.set(None)>"Done"</button>
                </div>
            })}
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match tokens.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="muted" data-testid="no-tokens">"You have no tokens."</p> }.into_any(),
                        Ok(list) => {
                            let now = now_ms();
                            view! {
                                <div class="table-wrap">
                                <table data-testid="tokens">
                                    <thead><tr><th scope="col">"Name"</th><th scope="col">"Created"</th><th scope="col">"State"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                    <tbody>
                                        {list.into_iter().map(|t| {
                                            let id = t.id.clone();
                                            let revoked = t.revoked_at_ms.is_some();
                                            view! {
                                                <tr data-token=t.id.clone() data-state=if revoked { "revoked" } else { "active" }>
                                                    <td>{t.name.clone()}</td>
                                                    <td>{ago(t.created_at_ms, now)}</td>
                                                    <td>{match t.revoked_at_ms { Some(at) => format!("revoked {}", ago(at, now)), None => "active".into() }}</td>
                                                    <td class="actions">{(!revoked).then(|| view! {
                                                        <button class="button small danger" data-testid="revoke" on:click=move |_| revoke(id.clone())>"Revoke"</button>
                                                    })}</td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table>
                                </div>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

/// Copies `text` to the clipboard.
#[component]
pub fn CopyButton(text: String) -> impl IntoView {
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
    view! { <button class="button small" on:click=on_click>{move || if copied.get() { "Copied" } else { "Copy" }}</button> }
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_names_are_checked_like_the_server_does() {
        assert!(super::token_name_error("  ").is_some());
        assert!(super::token_name_error(&"x".repeat(101)).is_some());
        assert_eq!(super::token_name_error(" ci "), None);
    }
}
