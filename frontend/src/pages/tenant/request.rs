//! `/requests/:id`: one request on a page of its own: what it asks for and where it stands, why it waits, its
//! slices with what a workload needs to reach them, and its history (the audit trail), read again every 3 s.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_api::allocations::AllocationView;
use tessera_api::audit::AuditView;
use tessera_api::requests::RequestView;
use tessera_api::tenants::TenantView;

use super::allocations::AllocationsList;
use super::requests::waiting_text;
use crate::api;
use crate::pages::shared::{describe, short, state_name};
use crate::pages::{ago, datetime, now_ms};
use crate::widgets::problem_view;

/// The page.
#[component]
pub fn RequestPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let tick = RwSignal::new(0u64);
    // The request and its tenant's name, read in one resource (so that the page hydrates from what the server
    // read).
    let request = Resource::new(
        move || (id(), tick.get()),
        |(id, _)| async move {
            let r = api::get_json::<RequestView>(format!("/api/v1/requests/{id}")).await?;
            let name = api::get_json::<TenantView>(format!("/api/v1/tenants/{}", r.tenant)).await;
            let name = name.map(|t| t.name).unwrap_or_else(|_| short(&r.tenant));
            Ok::<_, api::Problem>((r, name))
        },
    );
    // Its slices: the tenant's allocations that serve it.
    let allocations = Resource::new(
        move || (id(), tick.get()),
        |(id, _)| async move {
            let r = api::get_json::<RequestView>(format!("/api/v1/requests/{id}")).await?;
            let all = api::get_json::<Vec<AllocationView>>(format!("/api/v1/allocations?tenant={}", r.tenant)).await?;
            Ok(all.into_iter().filter(|a| a.request == id).collect::<Vec<_>>())
        },
    );
    let history = Resource::new(
        move || (id(), tick.get()),
        |(id, _)| api::get_json::<Vec<AuditView>>(format!("/api/v1/audit?object=request/{id}")),
    );
    let now = RwSignal::new(now_ms());
    #[cfg(feature = "hydrate")]
    {
        let refresh = move || {
            now.set(now_ms());
            tick.update(|t| *t += 1);
        };
        if let Ok(handle) = set_interval_with_handle(refresh, std::time::Duration::from_secs(3)) {
            on_cleanup(move || handle.clear());
        }
    }
    view! {
        <section class="page" data-testid="request-page">
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let (r, tenant_name) = match request.await {
                        Ok(r) => r,
                        Err(p) => return problem_view(&p),
                    };
                    let at = now.get_untracked();
                    let ends = match (r.expires_at_ms, r.duration_s) {
                        (Some(t), _) => format!("Expires {} (in {}).", datetime(t), crate::pages::countdown(t, at)),
                        (None, Some(s)) => format!("Held for {} once active.", crate::pages::count(s / 3600, "hour")),
                        (None, None) => "Held until released.".to_string(),
                    };
                    view! {
                        <div class="title-row">
                            <h1>{format!("Request {}", short(&r.id))}</h1>
                            <span class=format!("rstate {}", state_name(r.state)) data-testid="request-state">{state_name(r.state)}</span>
                        </div>
                        <p>
                            <strong>{describe(&r.spec, r.count)}</strong>" for "
                            <a href=format!("/t/{tenant_name}")>{tenant_name.clone()}</a>
                            <span class="muted">{format!(" · asked {} · priority {}", ago(r.created_at_ms, at), r.priority.as_str())}</span>
                        </p>
                        {(!r.reason.is_empty()).then(|| view! { <p class="muted">{format!("“{}”", r.reason)}</p> })}
                        <p class="small">{ends}{r.borrowed.then_some(" Borrowed from the cohort.")}</p>
                        {r.waiting.as_ref().map(|w| view! {
                            <div class="card warn" data-testid="why" data-code=w.reason.code()>
                                <h2>"Why it waits"</h2>
                                <p>{waiting_text(w, at)}</p>
                            </div>
                        })}
                    }
                    .into_any()
                })}
            </Transition>
            <div class="card">
                <h2>"Its slices"</h2>
                <AllocationsList allocations empty_text="No slice yet: they appear here once it is approved and placed." />
            </div>
            <div class="card">
                <h2>"History"</h2>
                <Transition fallback=|| view! { <p>"Loading…"</p> }>
                    {move || Suspend::new(async move {
                        match history.await {
                            Ok(entries) => view! {
                                <ol class="timeline" data-testid="request-history">
                                    {entries.into_iter().map(|e| view! {
                                        <li data-action=e.action.clone() data-actor=e.actor.clone()><span class="muted">{datetime(e.at_ms)}</span>" "<strong>{e.action.clone()}</strong>" by "{e.actor.clone()}</li>
                                    }).collect_view()}
                                </ol>
                            }.into_any(),
                            Err(p) => problem_view(&p),
                        }
                    })}
                </Transition>
            </div>
        </section>
    }
}
