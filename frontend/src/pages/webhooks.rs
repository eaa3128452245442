//! `/webhooks`: the webhook endpoints the viewer manages (its tenants' as their admin; the platform's as a platform
//! admin). Make one (its signing secret is shown once), send a test event, read its delivery log and send a
//! delivery again, rotate its secret, delete it.

use leptos::prelude::*;
use tessera_api::notifications::{DeliveryView, TestSent, WebhookCreate, WebhookSecret, WebhookView};
use tessera_api::people::Role;

use crate::api::{self, ProblemExt};
use crate::pages::inbox::describe;
use crate::pages::{ago, now_ms};
use crate::widgets::{CopyButton, SessionResource, TenantsResource, problem_view};

/// The API path of an owner's endpoints: a tenant's (its id), or the platform's (empty).
pub fn owner_path(owner: &str) -> String {
    if owner.is_empty() { "/api/v1/webhooks".to_string() } else { format!("/api/v1/tenants/{owner}/webhooks") }
}

/// The type patterns typed in one field: split on commas and spaces, blanks dropped.
pub fn patterns(text: &str) -> Vec<String> {
    text.split([',', ' ', '\n']).map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// The owners of endpoints the viewer manages, `(id, label)`: the platform (empty id) for platform admins, then
/// the tenants it administers (every one of its tenants for platform admins).
pub fn owners_of(s: &tessera_api::signin::SessionView) -> Vec<(String, String)> {
    let mut owners: Vec<(String, String)> = Vec::new();
    if s.user.platform_admin {
        owners.push((String::new(), "Platform-wide (every tenant's events)".to_string()));
    }
    for m in s.memberships.iter().filter(|m| s.user.platform_admin || m.role == Role::TenantAdmin) {
        owners.push((m.tenant.clone(), format!("Tenant {}", m.tenant)));
    }
    owners
}

/// The owner shown: the one chosen, else the first the viewer manages.
async fn current(chosen: Option<String>, session: SessionResource) -> Result<Option<String>, tessera_api::Problem> {
    match chosen {
        Some(o) => Ok(Some(o)),
        None => Ok(owners_of(&session.await?).into_iter().next().map(|(id, _)| id)),
    }
}

/// The webhooks page.
#[component]
pub fn WebhooksPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let tenants = expect_context::<TenantsResource>();
    // Only what the viewer picked; until then the first owner it manages (never set while rendering).
    let owner = RwSignal::new(None::<String>);
    let changed = RwSignal::new(0u64);
    let hooks = Resource::new(
        move || (owner.get(), changed.get()),
        move |(chosen, _)| async move {
            match current(chosen, session).await? {
                Some(o) => api::get_json::<Vec<WebhookView>>(owner_path(&o)).await.map(Some),
                None => Ok(None),
            }
        },
    );
    let (url, format, types, description) = (
        RwSignal::new(String::new()),
        RwSignal::new("standard".to_string()),
        RwSignal::new(String::new()),
        RwSignal::new(String::new()),
    );
    let secret = RwSignal::new(None::<WebhookSecret>);
    let message = RwSignal::new(None::<(bool, String)>);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let chosen = owner.get_untracked();
        let body = WebhookCreate {
            url: url.get_untracked().trim().to_string(),
            format: Some(format.get_untracked()),
            types: patterns(&types.get_untracked()),
            description: description.get_untracked(),
        };
        leptos::task::spawn_local(async move {
            let o = match current(chosen, session).await {
                Ok(Some(o)) => o,
                Ok(None) => return,
                Err(p) => return message.set(Some((false, p.message()))),
            };
            match api::send_json::<WebhookSecret>("POST", owner_path(&o), body).await {
                Ok(made) => {
                    secret.set(Some(made));
                    message.set(None);
                    url.set(String::new());
                    types.set(String::new());
                    description.set(String::new());
                    changed.update(|n| *n += 1);
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <section class="page">
            <h1>"Webhooks"</h1>
            <p class="muted">"Events are posted to your endpoints as CloudEvents JSON, signed per the Standard Webhooks specification, or as Slack-compatible messages; a failed delivery is tried again for 24 hours."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let s = match session.await {
                        Ok(s) => s,
                        Err(p) => return problem_view(&p),
                    };
                    let names = tenants.await.unwrap_or_default();
                    let owners: Vec<(String, String)> = owners_of(&s)
                        .into_iter()
                        .map(|(id, label)| match names.iter().find(|t| t.id == id) {
                            Some(t) => (id, format!("Tenant {}", t.name)),
                            None => (id, label),
                        })
                        .collect();
                    if owners.is_empty() {
                        return view! { <p class="muted" data-testid="no-webhook-owner">"Webhooks are managed by tenant admins and platform admins."</p> }.into_any();
                    }
                    let first = owners[0].0.clone();
                    view! {
                        <label>"Endpoints of "
                            <select name="webhook-owner" data-testid="webhook-owner" on:change=move |ev| owner.set(Some(event_target_value(&ev)))>
                                {owners.into_iter().map(|(id, label)| {
                                    let selected = owner.get_untracked().unwrap_or_else(|| first.clone()) == id;
                                    view! { <option value=id selected=selected>{label}</option> }
                                }).collect_view()}
                            </select>
                        </label>
                    }.into_any()
                })}
            </Transition>
            <form class="card toolbar" data-testid="webhook-form" on:submit=create>
                <label class="grow">"URL"<input type="url" name="webhook-url" required maxlength="2048" placeholder="https://hooks.example.com/tessera" bind:value=url /></label>
                <label>"Format"
                    <select name="webhook-format" on:change=move |ev| format.set(event_target_value(&ev))>
                        <option value="standard" selected=true>"CloudEvents, signed"</option>
                        <option value="slack">"Slack-compatible"</option>
                    </select>
                </label>
                <label class="grow">"Event types"<input type="text" name="webhook-types" placeholder="empty: all; e.g. request.*, layout.failed" bind:value=types /></label>
                <label class="grow">"Description"<input type="text" name="webhook-description" maxlength="200" bind:value=description /></label>
                <button class="button primary" type="submit">"Add endpoint"</button>
            </form>
            {move || message.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="alert">{m}</p> })}
            {move || secret.get().map(|made| view! {
                <div class="card secret" data-testid="webhook-secret" role="status">
                    <p><strong>{format!("Signing secret of {}.", made.webhook.url)}</strong>" Copy it now: it is not shown again. Receivers verify each delivery with it."</p>
                    <code class="secret" data-testid="secret">{made.secret.clone()}</code>
                    <CopyButton text=made.secret.clone() />
                    <button class="button small" on:click=move |_| secret.set(None)>"Done"</button>
                </div>
            })}
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match hooks.await {
                        Err(p) => problem_view(&p),
                        Ok(None) => ().into_any(),
                        Ok(Some(list)) if list.is_empty() => view! { <p class="muted" data-testid="no-webhooks">"No endpoints yet."</p> }.into_any(),
                        Ok(Some(list)) => view! {
                            <ul class="plain webhooks" data-testid="webhooks">
                                {list.into_iter().map(|w| view! { <Endpoint hook=w changed=changed secret=secret /> }).collect_view()}
                            </ul>
                        }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// One endpoint with its actions and, when opened, its delivery log.
#[component]
fn Endpoint(hook: WebhookView, changed: RwSignal<u64>, secret: RwSignal<Option<WebhookSecret>>) -> impl IntoView {
    let open = RwSignal::new(false);
    let reload = RwSignal::new(0u64);
    let id = hook.id.clone();
    let log_id = id.clone();
    let log = Resource::new(
        move || (open.get(), reload.get()),
        move |(open, _)| {
            let path = format!("/api/v1/webhooks/{log_id}/deliveries?limit=50");
            async move { if open { api::get_json::<Vec<DeliveryView>>(path).await.map(Some) } else { Ok(None) } }
        },
    );
    let note = RwSignal::new(None::<(bool, String)>);
    let act = move |method: &'static str, path: String, done: &'static str| {
        leptos::task::spawn_local(async move {
            let r = if method == "DELETE" {
                api::send_empty::<()>(method, path).await.map(|_| None)
            } else if path.ends_with("/rotate-secret") {
                api::send_empty::<WebhookSecret>(method, path).await.map(Some)
            } else if path.ends_with("/test") {
                api::send_empty::<TestSent>(method, path).await.map(|_| None)
            } else {
                api::send_empty::<DeliveryView>(method, path).await.map(|_| None)
            };
            match r {
                Ok(rotated) => {
                    if let Some(r) = rotated {
                        secret.set(Some(r));
                    }
                    note.set(Some((true, done.to_string())));
                    if method == "DELETE" {
                        changed.update(|n| *n += 1);
                    } else {
                        open.set(true);
                        reload.update(|n| *n += 1);
                    }
                }
                Err(p) => note.set(Some((false, p.message()))),
            }
        });
    };
    let types = if hook.types.is_empty() { "every event".to_string() } else { hook.types.join(", ") };
    let (test_id, rotate_id, delete_id, row_id) = (id.clone(), id.clone(), id.clone(), id.clone());
    view! {
        <li class="card" data-testid="webhook" data-webhook=row_id>
            <p><strong class="url">{hook.url.clone()}</strong>
                <span class="muted">{format!(" · {} · {types}{}", hook.format,
                    if hook.description.is_empty() { String::new() } else { format!(" · {}", hook.description) })}</span></p>
            <div class="toolbar">
                <button class="button small" data-testid="webhook-test" on:click=move |_| act("POST", format!("/api/v1/webhooks/{test_id}/test"), "Test event queued.")>"Send test event"</button>
                <button class="button small" data-testid="webhook-log" aria-expanded=move || open.get().to_string() on:click=move |_| open.update(|o| *o = !*o)>"Deliveries"</button>
                <button class="button small" data-testid="webhook-rotate" on:click=move |_| act("POST", format!("/api/v1/webhooks/{rotate_id}/rotate-secret"), "New secret made; the old one signs too for 24 hours.")>"Rotate secret"</button>
                <button class="button small danger" data-testid="webhook-delete" on:click=move |_| act("DELETE", format!("/api/v1/webhooks/{delete_id}"), "Deleted.")>"Delete"</button>
                <button class="button small" on:click=move |_| reload.update(|n| *n += 1)>"Refresh"</button>
            </div>
            {move || note.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="status">{m}</p> })}
            <Transition fallback=|| ()>
                {move || {
                    let id = id.clone();
                    Suspend::new(async move {
                        match log.await {
                            Err(p) => problem_view(&p),
                            Ok(None) => ().into_any(),
                            Ok(Some(list)) if list.is_empty() => view! { <p class="muted" data-testid="no-deliveries">"No deliveries yet."</p> }.into_any(),
                            Ok(Some(list)) => {
                                let now = now_ms();
                                view! {
                                    <div class="table-wrap">
                                    <table data-testid="deliveries">
                                        <thead><tr><th scope="col">"Event"</th><th scope="col">"State"</th><th scope="col">"Attempts"</th><th scope="col">"Last answer"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                        <tbody>
                                            {list.into_iter().map(|d| {
                                                let again = format!("/api/v1/webhooks/{id}/deliveries/{}/redeliver", d.id);
                                                let answer = match (d.last_status, d.last_error.is_empty()) {
                                                    (Some(s), true) => s.to_string(),
                                                    (_, false) => d.last_error.clone(),
                                                    (None, true) => "none yet".to_string(),
                                                };
                                                view! {
                                                    <tr data-delivery=d.id.to_string() data-state=d.state.clone() data-type=d.kind.clone()>
                                                        <td>{format!("{} · {} · {}", describe(&d.kind), d.subject, ago(d.first_at_ms, now))}</td>
                                                        <td>{d.state.clone()}</td>
                                                        <td>{d.attempts}</td>
                                                        <td class="wrap">{answer}</td>
                                                        <td class="actions"><button class="button small" data-testid="redeliver" on:click=move |_| act("POST", again.clone(), "Sent again.")>"Redeliver"</button></td>
                                                    </tr>
                                                }
                                            }).collect_view()}
                                        </tbody>
                                    </table>
                                    </div>
                                }.into_any()
                            }
                        }
                    })
                }}
            </Transition>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_and_patterns_read_as_the_api_takes_them() {
        assert_eq!(owner_path(""), "/api/v1/webhooks");
        assert_eq!(owner_path("t1"), "/api/v1/tenants/t1/webhooks");
        assert_eq!(patterns(" request.*, layout.failed  ,,"), ["request.*", "layout.failed"]);
        assert!(patterns("  ").is_empty());
    }
}
