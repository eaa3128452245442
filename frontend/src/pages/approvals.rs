//! `/approvals` (platform admins): pending requests with the planner's placement, approved or rejected one at a
//! time or in bulk; then the layout changes that approvals proposed, drawn as a diff, to approve or reject.

use std::collections::BTreeSet;

use leptos::prelude::*;
use tessera_api::layouts::{LayoutView, RejectLayout};
use tessera_api::nodes::NodeView;
use tessera_api::requests::{ApprovalView, RejectBody, RequestPage, RequestView};
use tessera_core::planner::Plan;

use crate::api::{self, Problem, ProblemExt};
use crate::pages::shared::{describe, short};
use crate::pages::slots::diff_view;
use crate::pages::{ago, now_ms};
use crate::widgets::{TenantsResource, problem_view};

/// Where a GPU is: `(node name, GPU index, model)`. `gpu` is its id, its UUID, or the planner's `node/index`.
pub fn locate(nodes: &[NodeView], gpu: &str) -> Option<(String, u32, String)> {
    let by_index = gpu.rsplit_once('/').and_then(|(node, i)| Some((node, i.parse::<u32>().ok()?)));
    nodes.iter().find_map(|n| {
        n.gpus
            .iter()
            .find(|g| g.id == gpu || g.uuid == gpu || by_index == Some((n.name.as_str(), g.index)))
            .map(|g| (n.name.clone(), g.index, g.model.clone()))
    })
}

/// Whether a request matches the filter text (tenant name, what it asks, reason).
pub fn matches(r: &RequestView, tenant: &str, needle: &str) -> bool {
    let needle = needle.trim().to_lowercase();
    needle.is_empty()
        || tenant.to_lowercase().contains(&needle)
        || describe(&r.spec, r.count).to_lowercase().contains(&needle)
        || r.reason.to_lowercase().contains(&needle)
}

/// The approvals page.
#[component]
pub fn ApprovalsPage() -> impl IntoView {
    let tenants = expect_context::<TenantsResource>();
    let pending =
        Resource::new(|| (), |_| api::get_json::<RequestPage>("/api/v1/requests?state=pending&limit=500".into()));
    let layouts = Resource::new(|| (), |_| api::get_json::<Vec<LayoutView>>("/api/v1/layouts?state=proposed".into()));
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
    let refresh = move || {
        pending.refetch();
        layouts.refetch();
        nodes.refetch();
    };
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(refresh, std::time::Duration::from_secs(5)) {
            on_cleanup(move || handle.clear());
        }
    }
    let filter = RwSignal::new(String::new());
    let reason = RwSignal::new(String::new());
    let selected = RwSignal::new(BTreeSet::<String>::new());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let say = move |ok: bool, m: String| messages.update(|v| v.push((ok, m)));

    // One decision; `Err` carries the API's message.
    let decide = move |id: String, approve: bool, why: String| async move {
        if approve {
            api::send_empty::<ApprovalView>("POST", format!("/api/v1/requests/{id}/approve")).await.map(|a| {
                let waiting = a.layout_proposals.iter().filter(|l| l.state == "proposed").count();
                if waiting > 0 {
                    format!(
                        "Approved {}; {} waiting for approval below.",
                        short(&id),
                        crate::pages::count(waiting as u64, "layout change")
                    )
                } else {
                    format!("Approved {}.", short(&id))
                }
            })
        } else {
            let body = RejectBody { reason: why };
            api::send_json::<RequestView>("POST", format!("/api/v1/requests/{id}/reject"), body)
                .await
                .map(|_| format!("Rejected {}.", short(&id)))
        }
    };
    // `why`: the reason for rejecting (a row's own, or the toolbar's for the selected rows).
    let act = move |ids: Vec<String>, approve: bool, why: String| {
        if !approve && why.trim().is_empty() {
            say(false, "Give a reason to reject: the tenant sees it.".into());
            return;
        }
        leptos::task::spawn_local(async move {
            for id in ids {
                match decide(id.clone(), approve, why.clone()).await {
                    Ok(m) => say(true, m),
                    Err(p) => say(false, format!("{}: {}", short(&id), p.message())),
                }
                selected.update(|s| {
                    s.remove(&id);
                });
            }
            refresh();
        });
    };

    view! {
        <section class="page">
            <div class="title-row">
                <h1>"Approvals"</h1>
                <label class="search">
                    <span class="sr-only">"Filter requests"</span>
                    <input type="search" placeholder="Filter by tenant, profile or reason" bind:value=filter />
                </label>
            </div>
            <div class="toolbar" data-testid="bulk">
                <label class="grow">"Reason (for rejecting the selected requests)"<input type="text" name="reason" bind:value=reason placeholder="e.g. over the team's budget" /></label>
                <button class="button primary" data-testid="approve-selected" disabled=move || selected.get().is_empty()
                    on:click=move |_| act(selected.get_untracked().into_iter().collect(), true, String::new())>
                    {move || format!("Approve selected ({})", selected.get().len())}
                </button>
                <button class="button danger" disabled=move || selected.get().is_empty()
                    on:click=move |_| act(selected.get_untracked().into_iter().collect(), false, reason.get_untracked())>"Reject selected"</button>
            </div>
            <ul class="messages" aria-live="polite">
                {move || messages.get().into_iter().rev().take(6).map(|(ok, m)| view! { <li class:ok=ok class:error=!ok>{m}</li> }).collect_view()}
            </ul>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let names = tenants.await.unwrap_or_default();
                    let name = move |id: &str| names.iter().find(|t| t.id == id).map_or_else(|| id.to_string(), |t| t.name.clone());
                    match pending.await {
                        Err(p) => problem_view(&p),
                        Ok(page) if page.items.is_empty() => view! { <p class="notice" data-testid="no-pending">"No request is waiting."</p> }.into_any(),
                        Ok(page) => {
                            let now = now_ms();
                            view! {
                                <div class="table-wrap">
                                <table data-testid="pending">
                                    <thead><tr><th><span class="sr-only">"Select"</span></th><th>"Tenant"</th><th>"What"</th><th>"Asked"</th><th>"Reason"</th><th>"Placement"</th><th></th></tr></thead>
                                    <tbody>
                                        {move || {
                                            let needle = filter.get();
                                            page.items.iter().filter(|r| matches(r, &name(&r.tenant), &needle)).map(|r| {
                                                let id = r.id.clone();
                                                let (a, b, c) = (id.clone(), id.clone(), id.clone());
                                                // Rejecting one row asks for its own reason, in the row.
                                                let refusing = RwSignal::new(false);
                                                let why = RwSignal::new(String::new());
                                                view! {
                                                    <tr data-request=id.clone()>
                                                        <td><input type="checkbox" aria-label="Select"
                                                            prop:checked=move || selected.get().contains(&a)
                                                            on:change=move |ev| { let on = event_target_checked(&ev); let id = b.clone(); selected.update(|s| { if on { s.insert(id); } else { s.remove(&id); } }); } /></td>
                                                        <td><strong>{name(&r.tenant)}</strong></td>
                                                        <td>{describe(&r.spec, r.count)}</td>
                                                        <td>{ago(r.created_at_ms, now)}</td>
                                                        <td class="muted">{r.reason.clone()}</td>
                                                        <td><PlacementCell id=id.clone() nodes /></td>
                                                        <td class="actions">
                                                            <button class="button small primary" data-testid="approve" on:click={let id = c.clone(); move |_| act(vec![id.clone()], true, String::new())}>"Approve"</button>
                                                            {let c = c.clone(); move || if refusing.get() {
                                                                let id = c.clone();
                                                                view! {
                                                                    <input type="text" name="row-reason" data-testid="row-reason" aria-label="Why reject it?" placeholder="why (the tenant sees it)" bind:value=why />
                                                                    <button class="button small danger" data-testid="confirm-reject" on:click=move |_| act(vec![id.clone()], false, why.get_untracked())>"Reject"</button>
                                                                    <button class="button small" on:click=move |_| refusing.set(false)>"Keep"</button>
                                                                }.into_any()
                                                            } else {
                                                                view! { <button class="button small danger" data-testid="reject" on:click=move |_| refusing.set(true)>"Reject…"</button> }.into_any()
                                                            }}
                                                        </td>
                                                    </tr>
                                                }
                                            }).collect_view()
                                        }}
                                    </tbody>
                                </table>
                                </div>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
            <crate::pages::quotas::QuotaApprovals />
            <h2>"Layout changes waiting"</h2>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let fleet = nodes.await.unwrap_or_default();
                    match layouts.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="muted" data-testid="no-layouts">"No layout change is waiting."</p> }.into_any(),
                        Ok(list) => list.into_iter().map(|l| view! { <LayoutCard l fleet=fleet.clone() reason on_done=Callback::new(move |m: (bool, String)| { say(m.0, m.1); refresh(); }) /> }).collect_view().into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

/// The planner's answer for one request, as it would place it now.
#[component]
fn PlacementCell(id: String, nodes: Resource<Result<Vec<NodeView>, Problem>>) -> impl IntoView {
    let plan =
        Resource::new(move || id.clone(), |id| api::get_json::<Plan>(format!("/api/v1/requests/{id}/placement")));
    view! {
        <Suspense fallback=|| view! { <span class="muted">"…"</span> }>
            {move || Suspend::new(async move {
                let fleet = nodes.await.unwrap_or_default();
                match plan.await {
                    Err(p) if p.code == "not_mig" || p.status == 422 => view! { <span class="muted">{p.message()}</span> }.into_any(),
                    Err(p) => view! { <span class="error">{p.message()}</span> }.into_any(),
                    Ok(plan) => view! {
                        <ul class="plain small placement">
                            {plan.placed.iter().map(|s| {
                                let at = locate(&fleet, &s.gpu).map_or_else(|| s.gpu.clone(), |(n, i, _)| format!("{n} GPU {i}"));
                                view! { <li>{format!("{}@{} on {at}", s.profile, s.start)}{s.new.then(|| view! { <span class="tag created-text">" new"</span> })}</li> }
                            }).collect_view()}
                            {plan.unplaced.iter().map(|u| view! { <li class="error">{format!("{} × {} unplaced: {}", u.count, u.profile, u.reason)}</li> }).collect_view()}
                            {(plan.summary.destroyed > 0).then(|| view! { <li class="destroyed-text">{format!("{} destroyed", crate::pages::count(plan.summary.destroyed as u64, "instance"))}</li> })}
                        </ul>
                    }.into_any(),
                }
            })}
        </Suspense>
    }
}

/// Who proposed a layout change, in words: the planner when an approval placed requests on it (`needed_by`), else
/// the admin who edited it by hand.
pub fn proposer_words(l: &LayoutView) -> String {
    let who = match l.created_by.as_str() {
        "system:auto-approve" => "the tenant's policy".to_string(),
        a => a.strip_prefix("user:").or_else(|| a.strip_prefix("system:")).unwrap_or(a).to_string(),
    };
    if l.needed_by.is_empty() {
        format!("proposed by {who}")
    } else {
        format!("planned when {who} approved the request it places")
    }
}

/// What a layout change unblocks, in words: "needed by llm-serving's 2 × MIG 1g.10gb on H100-80GB".
pub fn needed_words(n: &tessera_api::layouts::LayoutNeed) -> String {
    format!("needed by {}'s {}", n.tenant_name, describe(&n.spec, n.count))
}

/// A layout proposal as a diff, with what it unblocks, Approve, and Reject with a reason of its own (the tenants
/// waiting for it see it). `reason` is the reason typed in beforehand, if the page has one.
#[component]
pub fn LayoutCard(
    l: LayoutView,
    fleet: Vec<NodeView>,
    reason: RwSignal<String>,
    on_done: Callback<(bool, String)>,
) -> impl IntoView {
    let (where_, model) = match locate(&fleet, &l.gpu) {
        Some((n, i, m)) => (format!("{n} · GPU {i} · {m}"), m),
        None => (l.gpu.clone(), String::new()),
    };
    let id = l.id.clone();
    // This card's own refusal reason, opened by Reject.
    let refusing = RwSignal::new(false);
    let why = RwSignal::new(reason.get_untracked());
    let error = RwSignal::new(None::<String>);
    let decide = move |approve: bool| {
        let id = id.clone();
        let why = why.get_untracked();
        if !approve && why.trim().is_empty() {
            error.set(Some("Give a reason: the tenants waiting for it see it.".into()));
            return;
        }
        leptos::task::spawn_local(async move {
            let (what, answer) = if approve {
                ("approved", api::send_empty::<LayoutView>("POST", format!("/api/v1/layouts/{id}/approve")).await)
            } else {
                let body = RejectLayout { reason: why };
                ("rejected", api::send_json::<LayoutView>("POST", format!("/api/v1/layouts/{id}/reject"), body).await)
            };
            match answer {
                Ok(_) => on_done.run((true, format!("Layout change {} {what}.", short(&id)))),
                Err(p) => error.set(Some(p.message())),
            }
        });
    };
    let (approve, reject) = (decide.clone(), decide);
    let proposer = proposer_words(&l);
    view! {
        <div class="card layout" data-testid="layout" data-layout=l.id.clone()>
            <div class="title-row">
                <h3>{where_}</h3>
                <span class="muted small" data-testid="proposer">{format!("{proposer} {}", ago(l.created_at_ms, now_ms()))}</span>
            </div>
            {(!l.needed_by.is_empty()).then(|| view! {
                <ul class="plain small" data-testid="needed-by">
                    {l.needed_by.iter().map(|n| view! {
                        <li data-request=n.request.clone()>{needed_words(n)}" "
                            <a href=format!("/requests/{}", n.request)>{format!("(request {})", short(&n.request))}</a>
                            {(n.slices < n.count).then(|| format!(": {} of its {} slices", n.slices, n.count))}
                        </li>
                    }).collect_view()}
                </ul>
            })}
            {diff_view(&model, &l.layout, &l.created, &l.destroyed)}
            {(!l.reason.is_empty()).then(|| view! { <p class="muted small">{l.reason.clone()}</p> })}
            <div class="actions">
                <button class="button primary" data-testid="approve-layout" on:click=move |_| approve(true)>"Approve layout"</button>
                {move || if refusing.get() {
                    let reject = reject.clone();
                    view! {
                        <label class="grow small">"Why refuse it?"<input type="text" name="layout-reason" data-testid="layout-reason" bind:value=why placeholder="the tenants waiting for it see this" /></label>
                        <button class="button danger" data-testid="confirm-reject-layout" on:click=move |_| reject(false)>"Refuse layout"</button>
                        <button class="button" on:click=move |_| { refusing.set(false); error.set(None); }>"Keep"</button>
                    }.into_any()
                } else {
                    view! { <button class="button danger" data-testid="reject-layout" on:click=move |_| refusing.set(true)>"Reject…"</button> }.into_any()
                }}
            </div>
            {move || error.get().map(|e| view! { <p class="error small" role="alert">{e}</p> })}
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::node_with_gpu;
    use crate::wire::tests::gpu;
    use tessera_core::request::{RequestState, SliceSpec};

    #[test]
    fn gpus_are_found_by_id_uuid_or_the_planners_reference() {
        let nodes = vec![node_with_gpu("demo-node-2".into(), gpu("g7", 1, "GPU-7"))];
        let at = Some(("demo-node-2".to_string(), 1, "H100-80GB".to_string()));
        assert_eq!(locate(&nodes, "g7"), at);
        assert_eq!(locate(&nodes, "GPU-7"), at);
        assert_eq!(locate(&nodes, "demo-node-2/1"), at);
        assert_eq!(locate(&nodes, "demo-node-2/0"), None);
    }

    #[test]
    fn the_filter_looks_at_tenant_slice_and_reason() {
        let r = RequestView {
            id: "r".into(),
            tenant: "t".into(),
            spec: SliceSpec::Mig { profile: "3g.40gb".into(), model: None },
            count: 1,
            state: RequestState::Pending,
            reason: "Training run".into(),
            version: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            duration_s: None,
            expires_at_ms: None,
            priority: Default::default(),
            borrowed: false,
            reclaim_at_ms: None,
            reclaim_for: None,
            waiting: None,
        };
        assert!(matches(&r, "vision", ""));
        assert!(matches(&r, "vision", "VIS"));
        assert!(matches(&r, "vision", "3g.40"));
        assert!(matches(&r, "vision", "training"));
        assert!(!matches(&r, "vision", "llm"));
    }
}
