//! `/t/:tenant`: a tenant's dashboard: quota bars (used, pending, limit), the new-request form with live feedback,
//! requests with their history, allocations with what a workload needs to reach them, and usage.
//!
//! The form's feedback is the core's quota arithmetic (`charge`, `check`, the approval policy), the same the server
//! runs when the request is made; the server's answer is still what counts.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_api::allocations::AllocationView;
use tessera_api::nodes::Offerings;
use tessera_api::requests::{RequestPage, Waiting};
use tessera_api::tenants::{QuotaView, TenantView};
use tessera_api::usage::UsageReport;
use tessera_core::quota;

use crate::api;
use crate::pages::governance::{BudgetCard, TimelineCard};
use crate::pages::now_ms;
use crate::pages::quotas::QuotaRequestsCard;
use crate::pages::shared::AskDraft;
use crate::widgets::{Glossary, SessionResource, problem_view};

mod allocations;
mod arithmetic;
mod form;
mod request;
mod requests;
mod reservations;

use allocations::AllocationsList;
use arithmetic::{QuotaBar, quota_bars};
use form::RequestForm;
pub use request::RequestPage;
use requests::{HistoryCard, RequestsTable};
use reservations::ReservationsCard;

/// The tenant dashboard.
///
/// It refreshes every 3 s. Only the tenant is awaited around the whole page; the quota, the allocations and the
/// requests are read inside their own cards, so a refresh updates their data and never rebuilds the form or the
/// requests table (what is typed, the focus, an open history and the last answer stay as they are).
#[component]
pub fn TenantPage() -> impl IntoView {
    let params = use_params_map();
    let draft = AskDraft::new();
    provide_context(draft);
    let session = expect_context::<SessionResource>();
    // `/t/vision` or `/t/<id>`: the API takes either for the tenant itself; the other reads need its id.
    let tenant_id = move || params.read().get("tenant").unwrap_or_default();
    let tenant = Resource::new(tenant_id, |id| api::get_json::<TenantView>(format!("/api/v1/tenants/{id}")));
    // What the fleet offers, for the request form.
    let offerings = Resource::new(|| (), |_| api::get_json::<Offerings>("/api/v1/offerings".into()));
    let quotas = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        api::get_json::<QuotaView>(format!("/api/v1/tenants/{id}/quotas")).await
    });
    let requests = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        // Live requests only: ended ones are the history's, a page at a time.
        api::get_json::<RequestPage>(format!("/api/v1/requests?tenant={id}&open=true&order=newest&limit=500")).await
    });
    let allocations = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        api::get_json::<Vec<AllocationView>>(format!("/api/v1/allocations?tenant={id}")).await
    });
    let waiting = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        api::get_json::<Vec<Waiting>>(format!("/api/v1/tenants/{id}/waiting")).await
    });
    // When the data was last asked for: the ages shown count from it.
    let now = RwSignal::new(now_ms());
    let refresh = move || {
        now.set(now_ms());
        quotas.refetch();
        requests.refetch();
        allocations.refetch();
        waiting.refetch();
    };
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(refresh, std::time::Duration::from_secs(3)) {
            on_cleanup(move || handle.clear());
        }
    }
    // The form reads the quota through a signal rather than the resource: a resource read inside the form's own
    // <Suspense> would suspend it, and so rebuild it, at every refresh. Set only when it changes, so that the
    // feedback (a live region) is not redrawn for nothing.
    let latest_quotas = RwSignal::new(None::<Result<QuotaView, api::Problem>>);
    Effect::new(move |_| {
        let Some(fresh) = quotas.get() else { return };
        if latest_quotas.with_untracked(|q| q.as_ref() != Some(&fresh)) {
            latest_quotas.set(Some(fresh));
        }
    });
    let on_done = Callback::new(move |_| refresh());
    view! {
        <section class="page">
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let t = match tenant.await {
                        Ok(t) => t,
                        Err(p) => return problem_view(&p),
                    };
                    // The tenant's admins and platform admins ask for quota; the server checks it again.
                    let can_ask = session.await.is_ok_and(|s| {
                        s.user.platform_admin
                            || s.memberships.iter().any(|m| m.tenant == t.id && m.role == tessera_api::Role::TenantAdmin)
                    });
                    view! {
                        <div class="title-row"><h1>{t.name.clone()}</h1>
                            <span class="muted">{if t.auto_approve { format!("auto-approves up to {} compute slices", t.auto_approve_max_compute_slices) } else { "every request waits for an admin".to_string() }}</span>
                        </div>
                        <div class="cards two">
                            <div class="card" data-testid="quota">
                                <h2>"Quota"</h2>
                                <Transition fallback=|| view! { <p>"Loading…"</p> }>
                                    {move || Suspend::new(async move {
                                        let (q, reqs) = (quotas.await, requests.await);
                                        let items = reqs.map(|p| p.items).unwrap_or_default();
                                        match q {
                                            Ok(q) => quota_view(quota_bars(&q, &items), can_ask.then_some(draft)),
                                            Err(p) => problem_view(&p),
                                        }
                                    })}
                                </Transition>
                            </div>
                            <div class="card">
                                <h2>"New request"</h2>
                                <RequestForm tenant=t.clone() quotas=latest_quotas.into() offerings on_done />
                            </div>
                        </div>
                        <div class="card" data-testid="current-work">
                            <h2>"Current requests"</h2>
                            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                                <RequestsTable requests waiting now=now.into() on_done
                                    empty_text="Nothing waits or runs now: ask for slices with the form above; ended requests are in the history below." />
                            </Transition>
                        </div>
                        <div class="card">
                            <h2>"Allocations"</h2>
                            <AllocationsList allocations />
                        </div>
                        <BudgetCard tenant=t.id.clone() tick=now />
                        <QuotaRequestsCard tenant=t.clone() can_ask />
                        <ReservationsCard tenant=t.clone() tick=now />
                        <HistoryCard tenant=t.id.clone() waiting now=now.into() on_done />
                        <UsageCard tenant=t.id.clone() />
                        <TimelineCard tenant=t.id.clone() />
                        <Glossary />
                    }.into_any()
                })}
            </Transition>
        </section>
    }
}

fn quota_view(bars: Vec<QuotaBar>, draft: Option<AskDraft>) -> AnyView {
    if bars.is_empty() {
        return view! { <p class="muted">"No limits set: requests are not capped."</p> }.into_any();
    }
    view! {
        <ul class="bars">
            {bars.into_iter().map(|b| {
                let label = b.text();
                let full = b.limit.is_some_and(|l| b.used + b.pending >= l.max(b.maximum.unwrap_or(0)));
                let over = b.over;
                let mark = b.limit_mark();
                let (key, limit) = (b.resource.clone(), b.limit.map(quota::show).unwrap_or_default());
                view! {
                    <li data-resource=b.resource.clone()>
                        <div class="bar-head"><span title=b.resource.clone()>{b.name.clone()}</span><span class="muted" class:bad=full>{label.clone()}</span>
                            {draft.map(|d| view! { <button type="button" class="link small" data-testid="ask-more" on:click=move |_| d.add(key.clone(), limit.clone())>"Ask for more"</button> })}
                        </div>
                        {over.then(|| view! { <p class="error small" data-testid="over">"Over the limit: new requests are refused until it is back under."</p> })}
                        {match b.widths() {
                            Some((used, pending)) => view! {
                                <div class="bar" role="img" aria-label=label>
                                    <span class="used" style=format!("width:{used:.1}%")></span>
                                    <span class="pending" style=format!("width:{pending:.1}%")></span>
                                    {mark.map(|m| view! { <span class="limit-mark" title="the guarantee: above it, slices are borrowed" style=format!("left:{m:.1}%")></span> })}
                                </div>
                            }.into_any(),
                            None => ().into_any(),
                        }}
                    </li>
                }
            }).collect_view()}
        </ul>
        <p class="legend small"><span class="key used"></span>"used "<span class="key pending"></span>"pending · "<a href="#glossary">"what the units mean"</a></p>
    }
    .into_any()
}

/// The id of the tenant a page address names (by id or by name); names met once are remembered in the browser.
async fn tenant_key(key: String) -> Result<String, api::Problem> {
    #[cfg(feature = "hydrate")]
    thread_local! {
        static IDS: std::cell::RefCell<std::collections::HashMap<String, String>> = Default::default();
    }
    #[cfg(feature = "hydrate")]
    if let Some(id) = IDS.with(|m| m.borrow().get(&key).cloned()) {
        return Ok(id);
    }
    let t = api::get_json::<TenantView>(format!("/api/v1/tenants/{key}")).await?;
    #[cfg(feature = "hydrate")]
    IDS.with(|m| m.borrow_mut().insert(key, t.id.clone()));
    Ok(t.id)
}

#[component]
fn UsageCard(tenant: String) -> impl IntoView {
    let usage = Resource::new(
        move || tenant.clone(),
        |t| api::get_json::<UsageReport>(format!("/api/v1/usage?tenant={t}&limit=0")),
    );
    view! {
        <div class="card">
            <h2>"Usage, last 30 days"</h2>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match usage.await {
                        Err(p) => problem_view(&p),
                        Ok(u) => {
                            let (hours, allocs) = u.tenants.iter().fold((0.0, 0), |(h, n), t| (h + t.gpu_hours, n + t.allocations));
                            view! {
                                <dl class="stats">
                                    <div><dt>"GPU-hours"</dt><dd>{format!("{hours:.2}")}</dd></div>
                                    <div><dt>"Allocations"</dt><dd>{allocs}</dd></div>
                                </dl>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </div>
    }
}
