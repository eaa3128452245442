//! `/audit` (platform admins): who changed what and when, newest first, filtered by object, actor and action,
//! a page at a time; each entry opens to show the object before and after.

use leptos::prelude::*;
use tessera_api::audit::{AuditPage, AuditView};

use crate::api::{self, ProblemExt};
use crate::pages::{ago, now_ms};
use crate::widgets::problem_view;

/// Page size.
const LIMIT: u32 = 50;

/// The query string of a filter, empty fields left out (values URL-encoded).
pub fn audit_query(object: &str, actor: &str, action: &str, before: Option<&str>) -> String {
    let mut q = vec![format!("limit={LIMIT}")];
    let object = object.trim();
    if !object.is_empty() {
        // `request/` (or anything ending in `/`) asks for a kind of object, anything else for one object.
        let key = if object.ends_with('/') { "object_prefix" } else { "object" };
        q.push(format!("{key}={}", encode(object)));
    }
    if !actor.trim().is_empty() {
        q.push(format!("actor={}", encode(actor.trim())));
    }
    if !action.trim().is_empty() {
        q.push(format!("action={}", encode(action.trim())));
    }
    if let Some(b) = before {
        q.push(format!("before={}", encode(b)));
    }
    format!("/api/v1/audit/entries?{}", q.join("&"))
}

/// Percent-encodes everything but unreserved characters.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// JSON text, indented for reading (as it came when it does not parse).
fn pretty(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| text.to_string())
}

/// The audit log page.
#[component]
pub fn AuditLogPage() -> impl IntoView {
    let object = RwSignal::new(String::new());
    let actor = RwSignal::new(String::new());
    let action = RwSignal::new(String::new());
    // The filter applied (on submit), and the pages loaded for it.
    let applied = RwSignal::new(audit_query("", "", "", None));
    let first = Resource::new(move || applied.get(), api::get_json::<AuditPage>);
    let more = RwSignal::new(Vec::<AuditView>::new());
    let next = RwSignal::new(None::<String>);
    let error = RwSignal::new(None::<String>);
    let search = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        more.set(Vec::new());
        next.set(None);
        applied.set(audit_query(&object.get_untracked(), &actor.get_untracked(), &action.get_untracked(), None));
    };
    let load_more = move |cursor: String| {
        let path = audit_query(&object.get_untracked(), &actor.get_untracked(), &action.get_untracked(), Some(&cursor));
        leptos::task::spawn_local(async move {
            match api::get_json::<AuditPage>(path).await {
                Ok(page) => {
                    more.update(|m| m.extend(page.entries));
                    next.set(Some(page.next.unwrap_or_default()));
                }
                Err(p) => error.set(Some(format!("{} ({})", p.message(), p.code))),
            }
        });
    };
    view! {
        <section class="page">
            <h1>"Audit log"</h1>
            <form class="card toolbar" data-testid="audit-filter" on:submit=search>
                <label>"Object"<input type="text" name="object" placeholder="request/… or tenant/" bind:value=object /></label>
                <label>"Actor"<input type="text" name="actor" placeholder="user:ada" bind:value=actor /></label>
                <label>"Action"<input type="text" name="action" placeholder="request. or layout.approved" bind:value=action /></label>
                <button class="button primary" type="submit">"Filter"</button>
            </form>
            {move || error.get().map(|e| view! { <p class="notice error" role="alert">{e}</p> })}
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match first.await {
                        Err(p) => problem_view(&p),
                        Ok(page) if page.entries.is_empty() => view! { <p class="muted" data-testid="no-entries">"Nothing matches."</p> }.into_any(),
                        Ok(page) => {
                            let now = now_ms();
                            let first_next = page.next.clone();
                            view! {
                                <div class="table-wrap">
                                <table data-testid="audit">
                                    <thead><tr><th scope="col">"When"</th><th scope="col">"Who"</th><th scope="col">"What"</th><th scope="col">"On"</th><th scope="col">"Change"</th></tr></thead>
                                    <tbody>
                                        {page.entries.into_iter().map(|e| row(e, now)).collect_view()}
                                        {move || more.get().into_iter().map(|e| row(e, now)).collect_view()}
                                    </tbody>
                                </table>
                                </div>
                                {move || {
                                    // Until "more" was loaded, the first page's cursor; then the last page's.
                                    let cursor = match next.get() { None => first_next.clone(), Some(c) if c.is_empty() => None, Some(c) => Some(c) };
                                    cursor.map(|c| view! { <button class="button" data-testid="more" on:click=move |_| load_more(c.clone())>"Older entries"</button> })
                                }}
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

fn row(e: AuditView, now: i64) -> impl IntoView {
    let change = (e.before.is_some() || e.after.is_some()).then(|| {
        view! {
            <details>
                <summary>"before / after"</summary>
                <div class="cols">
                    <pre>{e.before.as_deref().map_or_else(|| "—".to_string(), pretty)}</pre>
                    <pre>{e.after.as_deref().map_or_else(|| "—".to_string(), pretty)}</pre>
                </div>
            </details>
        }
    });
    view! {
        <tr data-action=e.action.clone()>
            <td title=e.at_ms.to_string()>{ago(e.at_ms, now)}</td>
            <td>{e.actor.clone()}</td>
            <td><code>{e.action.clone()}</code></td>
            <td><code class="uuid">{e.object.clone()}</code></td>
            <td>{change}</td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_become_a_query() {
        assert_eq!(audit_query("", " ", "", None), "/api/v1/audit/entries?limit=50");
        assert_eq!(
            audit_query("request/", "user:ada", "request.", Some("c1")),
            "/api/v1/audit/entries?limit=50&object_prefix=request%2F&actor=user%3Aada&action=request.&before=c1"
        );
        assert_eq!(audit_query("tenant/abc", "", "", None), "/api/v1/audit/entries?limit=50&object=tenant%2Fabc");
    }
}
