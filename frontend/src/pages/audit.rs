//! `/audit` (platform admins): who changed what and when, newest first, filtered by object, actor and action,
//! a page at a time; each entry opens to show the object before and after.

use std::collections::HashMap;

use leptos::prelude::*;
use tessera_api::audit::{AuditPage, AuditView};
use tessera_api::nodes::NodeView;
use tessera_api::people::UserView;
use tessera_api::tenants::TenantView;
use tessera_core::catalog::Catalog;
use tessera_core::quota::Resource as QuotaResource;

use crate::api::{self, ProblemExt};
use crate::pages::shared::{encode, short};
use crate::pages::{ago, datetime, now_ms};
use crate::widgets::problem_view;

/// Page size.
const LIMIT: u32 = 50;

/// What the page knows to call things by: ids of tenants, users, nodes and GPUs -> their names.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Names(HashMap<String, String>);

impl Names {
    /// From the lists an admin can read (any of them may be missing: its ids then show short).
    pub fn new(tenants: &[TenantView], users: &[UserView], nodes: &[NodeView]) -> Self {
        let mut m = HashMap::new();
        m.extend(tenants.iter().map(|t| (t.id.clone(), t.name.clone())));
        m.extend(users.iter().map(|u| (u.id.clone(), u.name.clone())));
        for n in nodes {
            m.insert(n.id.clone(), n.name.clone());
            m.extend(n.gpus.iter().map(|g| (g.id.clone(), format!("{} · GPU {}", n.name, g.index))));
        }
        Names(m)
    }

    pub fn of(&self, id: &str) -> String {
        // Unknown ids show as the rest of the portal shows ids: their last 8 characters (UUIDv7s share their
        // first ones, the time).
        self.0.get(id).cloned().unwrap_or_else(|| short(id))
    }
}

/// An audit object path in words: `tenant/<id>/quota/mig/H100-80GB/2g.20gb` -> `tenant vision · quota on
/// H100-80GB 2g.20gb instances`, `gpu/<id>` -> `GPU demo-node-1 · GPU 0`, `request/<id>` -> `request 8fe89747`.
/// Kinds it does not know are shown as they are.
pub fn object_in_words(object: &str, names: &Names) -> String {
    let mut parts = object.split('/');
    let mut out = Vec::new();
    while let Some(kind) = parts.next() {
        let word = match kind {
            "tenant" | "user" | "member" | "node" | "request" | "allocation" | "token" | "gpu" => {
                let label = if kind == "gpu" { "GPU" } else { kind };
                match parts.next() {
                    Some(id) => format!("{label} {}", names.of(id)),
                    None => label.to_string(),
                }
            }
            "quota" => {
                let key = parts.by_ref().collect::<Vec<_>>().join("/");
                match QuotaResource::parse(Catalog::builtin(), &key) {
                    Ok(r) => format!("quota on {}", r.describe().0),
                    Err(_) => format!("quota {key}"),
                }
            }
            other => other.to_string(),
        };
        out.push(word);
    }
    out.join(" · ")
}

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
    // Names for the ids in object paths, read in the browser once the page is live; until then (and when a list
    // fails to load) ids show short. A plain signal, not a resource: the server renders the rows with the ids as
    // the browser first hydrates them, whenever the names arrive (a local resource read inside the rows left the
    // server's table empty, and a browser that had the names before hydrating then found a different page).
    let names = RwSignal::new(Names::default());
    Effect::new(move |_| {
        leptos::task::spawn_local(async move {
            let (tenants, users, nodes) = futures_util::future::join3(
                api::get_json::<Vec<TenantView>>("/api/v1/tenants".into()),
                api::get_json::<Vec<UserView>>("/api/v1/users".into()),
                api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()),
            )
            .await;
            names.set(Names::new(&tenants.unwrap_or_default(), &users.unwrap_or_default(), &nodes.unwrap_or_default()));
        });
    });
    let names: Signal<Names> = names.into();
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
                Err(p) => error.set(Some(p.message())),
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
                                        {page.entries.into_iter().map(|e| row(e, now, names)).collect_view()}
                                        {move || more.get().into_iter().map(|e| row(e, now, names)).collect_view()}
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

fn row(e: AuditView, now: i64, names: Signal<Names>) -> impl IntoView {
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
            <td title=ago(e.at_ms, now)><time datetime=tessera_core::clock::iso8601(e.at_ms)>{datetime(e.at_ms)}</time></td>
            <td>{e.actor.clone()}</td>
            <td><code>{e.action.clone()}</code></td>
            <td class="object" title=e.object.clone() data-object=e.object.clone()>{
                let object = e.object.clone();
                move || names.with(|n| object_in_words(&object, n))
            }</td>
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

    #[test]
    fn objects_read_with_names_and_units() {
        let tenants = vec![TenantView {
            id: "t-1".into(),
            name: "vision".into(),
            auto_approve: false,
            auto_approve_max_compute_slices: 0,
            created_at_ms: 0,
            cohort: None,
            weight: 1,
        }];
        let users = vec![UserView { id: "u-1".into(), name: "ada".into(), platform_admin: false }];
        let names = Names::new(&tenants, &users, &[]);
        assert_eq!(
            object_in_words("tenant/t-1/quota/mig/H100-80GB/2g.20gb", &names),
            "tenant vision · quota on H100-80GB 2g.20gb instances"
        );
        assert_eq!(object_in_words("tenant/t-1/member/u-1", &names), "tenant vision · member ada");
        assert_eq!(
            object_in_words("tenant/t-1/quota/compute_slices", &names),
            "tenant vision · quota on Compute slices"
        );
        assert_eq!(
            object_in_words("request/01a2115b-6fed-77df-b682-ff07d4fd86c1", &names),
            "request d4fd86c1",
            "unknown ids show short, by their last characters"
        );
        assert_eq!(object_in_words("history", &names), "history");
        assert_eq!(object_in_words("user/u-1/token/01a2115c-5abc-77a8", &names), "user ada · token abc-77a8");
    }
}
