//! `/tokens` ("Account"): the viewer's API tokens, and its password where it signs in locally. Create a token (its
//! secret is shown once, here, and never again: the server keeps only its hash), see when each was made, revoke.

use leptos::prelude::*;

use tessera_api::people::{CreatedToken, NewPassword, NewToken, TokenView};

use crate::api::{self, ProblemExt};
use crate::pages::{ago, now_ms};
use crate::widgets::{CopyButton, SessionResource, problem_view};

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
    let session = expect_context::<SessionResource>();
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
                Err(p) => error.set(Some(p.message())),
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
                Err(p) => error.set(Some(p.message())),
            }
        });
    };
    view! {
        <section class="page">
            <h1>"Your account"</h1>
            <h2>"API tokens"</h2>
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
            // Users of single sign-on have no local password to set.
            <Transition fallback=|| ()>
                {move || session.get().and_then(Result::ok).filter(|s| !s.single_sign_on).map(|_| view! { <PasswordCard /> })}
            </Transition>
        </section>
    }
}

/// Checks a new password as the server does (at least 12 characters) and against its repetition.
pub fn password_error(password: &str, again: &str) -> Option<&'static str> {
    if password.chars().count() < 12 {
        Some("A password has at least 12 characters.")
    } else if password != again {
        Some("The two new passwords differ.")
    } else {
        None
    }
}

/// Sets the viewer's own password (after a sign-in link, or to change it).
#[component]
fn PasswordCard() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let (current, password, again) =
        (RwSignal::new(String::new()), RwSignal::new(String::new()), RwSignal::new(String::new()));
    let message = RwSignal::new(None::<(bool, String)>);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (c, p, a) = (current.get_untracked(), password.get_untracked(), again.get_untracked());
        if let Some(e) = password_error(&p, &a) {
            message.set(Some((false, e.to_string())));
            return;
        }
        leptos::task::spawn_local(async move {
            let me = match session.await {
                Ok(s) => s.user.id,
                Err(p) => return message.set(Some((false, p.message()))),
            };
            let body = NewPassword { password: p, current_password: (!c.is_empty()).then_some(c) };
            match api::send_json::<()>("PUT", format!("/api/v1/users/{me}/password"), body).await {
                Ok(()) => {
                    message.set(Some((
                        true,
                        "Password set: sign in with your name and this password from now on.".into(),
                    )));
                    current.set(String::new());
                    password.set(String::new());
                    again.set(String::new());
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <form class="card" data-testid="password-form" on:submit=submit>
            <h2>"Password"</h2>
            <p class="muted">"Set a password to sign in with your name. Leave the current password empty if you have none yet (you came in with a sign-in link)."</p>
            <div class="toolbar">
                <label>"Current password"<input type="password" name="current-password" autocomplete="current-password" bind:value=current /></label>
                <label>"New password"<input type="password" name="new-password" autocomplete="new-password" minlength="12" bind:value=password /></label>
                <label>"Again"<input type="password" name="new-password-again" autocomplete="new-password" bind:value=again /></label>
                <button class="button primary" type="submit">"Set password"</button>
            </div>
            {move || message.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="status">{m}</p> })}
        </form>
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_names_are_checked_like_the_server_does() {
        assert!(super::token_name_error("  ").is_some());
        assert!(super::token_name_error(&"x".repeat(101)).is_some());
        assert_eq!(super::token_name_error(" ci "), None);
    }

    #[test]
    fn new_passwords_are_checked_like_the_server_does() {
        assert!(super::password_error("short", "short").is_some());
        assert!(super::password_error("long enough password", "long enough passwort").is_some());
        assert_eq!(super::password_error("long enough password", "long enough password"), None);
    }
}
