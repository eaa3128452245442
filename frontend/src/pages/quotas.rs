//! Quota requests in the portal: on a tenant's dashboard its admins ask for more (from a quota bar, or for exactly
//! what a refused request misses) and everyone sees where the tenant's asks stand; on `/approvals` platform admins
//! grant them, in full or in part, or refuse them.
//!
//! What is typed lives in signals above the parts that refresh, so a refresh never clears an amount or a reason.

use std::collections::BTreeMap;

use leptos::prelude::*;
use tessera_api::quotas::{
    GrantBody, NewQuotaRequest, QuotaRequestLine, QuotaRequestPage, QuotaRequestState, QuotaRequestView, QuotaTimeline,
    TimelineSummary,
};
use tessera_api::requests::RejectBody;
use tessera_api::tenants::{QuotaView, TenantView};
use tessera_core::Catalog;
use tessera_core::layout::PlacedInstance;
use tessera_core::quota::{MILLI, Resource as QuotaResource, show_places};

use tessera_api::nodes::NodeView;
use tessera_api::usage::UsageReport;

use crate::api::{self, ProblemExt};
use crate::pages::shared::{AskDraft, short};
use crate::pages::{ago, now_ms};
use crate::widgets::{TenantsResource, problem_view};

/// A resource key by name and unit: `("Compute slices", "slices")`; unknown keys as they are.
fn named(key: &str) -> (String, &'static str) {
    QuotaResource::parse(Catalog::builtin(), key).map_or_else(|_| (key.to_string(), ""), |r| r.describe())
}

fn amount(v: f64) -> String {
    show_places((v.max(0.0) * MILLI as f64).round() as u64, 1)
}

/// One line of a quota request in words: `Compute slices: 7 → 14 slices`, `Whole H100-80GB GPUs: no limit → 2
/// GPUs, 1 granted`.
pub fn line_text(l: &QuotaRequestLine, state: QuotaRequestState) -> String {
    let (name, unit) = named(&l.resource);
    let before = l.before.map_or_else(|| "no limit".to_string(), amount);
    let granted = match (state, l.granted) {
        (QuotaRequestState::Approved | QuotaRequestState::Ended, Some(g)) if g != l.asked => {
            format!(", {} granted", amount(g))
        }
        (QuotaRequestState::Approved | QuotaRequestState::Ended, None) => ", not granted".to_string(),
        _ => String::new(),
    };
    format!("{name}: {before} → {} {unit}{granted}", amount(l.asked))
}

/// Where a quota request stands, in words.
pub fn state_text(r: &QuotaRequestView) -> String {
    let who = |w: &Option<String>| w.as_deref().unwrap_or("").trim_start_matches("user:").to_string();
    match r.state {
        QuotaRequestState::Pending => "waiting for a platform admin".to_string(),
        QuotaRequestState::Approved => format!("granted by {}", who(&r.decided_by)),
        QuotaRequestState::Rejected => format!("refused by {}", who(&r.decided_by)),
        QuotaRequestState::Cancelled => "withdrawn".to_string(),
        QuotaRequestState::Ended => "ended: the temporary increase was taken back".to_string(),
    }
}

/// The ask rows as the API's `limits`, or what is wrong with the first bad one.
pub fn parse_rows(rows: &[(String, String)]) -> Result<BTreeMap<String, f64>, String> {
    let mut limits = BTreeMap::new();
    for (key, typed) in rows {
        let key = key.trim();
        if key.is_empty() {
            continue;
        }
        if QuotaResource::parse(Catalog::builtin(), key).is_err() {
            return Err(format!("`{key}` is not a resource a quota can limit."));
        }
        match typed.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=1e12).contains(&v) => {
                limits.insert(key.to_string(), v);
            }
            _ => return Err(format!("{}: give the limit you need, a number from 0.", named(key).0)),
        }
    }
    if limits.is_empty() {
        return Err("Name at least one resource and the limit you need.".to_string());
    }
    Ok(limits)
}

/// The tenant's quota requests, and for its admins the form to ask for more.
#[component]
pub fn QuotaRequestsCard(tenant: TenantView, can_ask: bool) -> impl IntoView {
    let draft = expect_context::<AskDraft>();
    let id = StoredValue::new(tenant.id.clone());
    let list = Resource::new(
        move || id.get_value(),
        |id| api::get_json::<QuotaRequestPage>(format!("/api/v1/quota-requests?tenant={id}&limit=10")),
    );
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(move || list.refetch(), std::time::Duration::from_secs(5)) {
            on_cleanup(move || handle.clear());
        }
    }
    let reason = RwSignal::new(String::new());
    let hours = RwSignal::new(String::new());
    let message = RwSignal::new(None::<(bool, String)>);
    let sending = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let limits = match parse_rows(&draft.lines.get_untracked()) {
            Ok(l) => l,
            Err(e) => return message.set(Some((false, e))),
        };
        let until_ms = match hours.get_untracked().trim() {
            "" => None,
            h => match h.parse::<i64>() {
                Ok(h) if (1..=8784).contains(&h) => Some(now_ms() + h * 3_600_000),
                _ => return message.set(Some((false, "A temporary increase lasts 1 to 8,784 hours.".into()))),
            },
        };
        let body = NewQuotaRequest { limits, reason: reason.get_untracked(), until_ms };
        sending.set(true);
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/tenants/{}/quota-requests", id.get_value());
            match api::send_json::<QuotaRequestView>("POST", path, body).await {
                Ok(r) => {
                    message.set(Some((true, format!("Asked ({}): a platform admin decides.", short(&r.id)))));
                    draft.lines.set(Vec::new());
                    draft.open.set(false);
                    reason.set(String::new());
                    hours.set(String::new());
                    list.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
            sending.set(false);
        });
    };
    let cancel = move |qid: String| {
        leptos::task::spawn_local(async move {
            match api::send_empty::<QuotaRequestView>("POST", format!("/api/v1/quota-requests/{qid}/cancel")).await {
                Ok(_) => message.set(Some((true, format!("Withdrew {}.", short(&qid))))),
                Err(p) => message.set(Some((false, p.message()))),
            }
            list.refetch();
        });
    };
    let rows = move || draft.lines.get().into_iter().enumerate().collect::<Vec<(usize, (String, String))>>();
    view! {
        <div class="card" id="ask-quota" data-testid="quota-requests">
            <div class="title-row">
                <h2>"Quota requests"</h2>
                {can_ask.then(|| view! {
                    <button class="button small" data-testid="ask-open" on:click=move |_| {
                        if draft.lines.get_untracked().is_empty() { draft.add("compute_slices".into(), String::new()); } else { draft.open.set(true); }
                    }>"Ask for more quota"</button>
                })}
            </div>
            {move || message.get().map(|(ok, m)| view! { <p class:ok=ok class:error=!ok role="status">{m}</p> })}
            <Show when=move || can_ask && draft.open.get()>
                <form class="stack" data-testid="ask-form" on:submit=submit>
                    <For each=rows key=|(i, (r, _))| (*i, r.clone()) let:row>
                        {
                            let (i, (key, typed)) = row;
                            let (name, unit) = named(&key);
                            view! {
                                <div class="row" data-ask=key.clone()>
                                    <label class="grow">{name}
                                        <input type="number" min="0" step="any" name="limit" value=typed
                                            on:input=move |ev| { let v = event_target_value(&ev); draft.lines.update(|l| if let Some(row) = l.get_mut(i) { row.1 = v; }); } />
                                    </label>
                                    <span class="muted small">{unit}</span>
                                    <button type="button" class="button small" aria-label="Remove" on:click=move |_| draft.lines.update(|l| { if i < l.len() { l.remove(i); } })>"×"</button>
                                </div>
                            }
                        }
                    </For>
                    <label>"Why (the platform admins read it)"<textarea name="quota-reason" rows="2" bind:value=reason></textarea></label>
                    <label>"Only for (hours; empty: for good)"<input type="number" min="1" max="8784" name="hours" bind:value=hours /></label>
                    <div class="actions">
                        <button type="submit" class="button primary" data-testid="ask-send" disabled=move || sending.get()>"Ask"</button>
                        <button type="button" class="button" on:click=move |_| draft.open.set(false)>"Not now"</button>
                    </div>
                </form>
            </Show>
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match list.await {
                        Err(p) => problem_view(&p),
                        Ok(page) if page.items.is_empty() => view! { <p class="muted">"No quota request yet."</p> }.into_any(),
                        Ok(page) => {
                            let now = now_ms();
                            view! {
                                <ul class="plain quota-requests">
                                    {page.items.into_iter().map(|r| {
                                        let qid = r.id.clone();
                                        let pending = r.state == QuotaRequestState::Pending;
                                        view! {
                                            <li data-quota-request=r.id.clone() data-state=r.state.as_str()>
                                                <div class="bar-head"><strong>{state_text(&r)}</strong><span class="muted small">{format!("{} asked {}", r.requested_by.trim_start_matches("user:"), ago(r.created_at_ms, now))}</span></div>
                                                <ul class="plain small">{r.lines.iter().map(|l| view! { <li>{line_text(l, r.state)}</li> }).collect_view()}</ul>
                                                <p class="muted small">{r.reason.clone()}{r.until_ms.map(|u| format!(" · until {}", tessera_core::clock::utc_minute(u)))}</p>
                                                {(!r.comment.is_empty()).then(|| view! { <p class="small">{format!("“{}”", r.comment)}</p> })}
                                                {(pending && can_ask).then(|| view! { <button class="button small" on:click=move |_| cancel(qid.clone())>"Withdraw"</button> })}
                                            </li>
                                        }
                                    }).collect_view()}
                                </ul>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </div>
    }
}

/// What the approvals page knows of a tenant that asks: its quota (what it holds) and its GPU-hours of the last 30
/// days.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct TenantFacts {
    quota: Option<QuotaView>,
    gpu_hours: Option<f64>,
    /// Per asked resource, its 30-day timeline at a glance (peak held, mean used), in the resource's unit.
    timelines: BTreeMap<String, TimelineSummary>,
}

/// A resource's last 30 days in words: `peak 6 · 2.3 used on average`.
pub fn past_text(s: &TimelineSummary, unit: &str) -> String {
    let n = |v: f64| tessera_core::clock::rounded(v, 1);
    format!("peak {} · {} {unit} used on average", n(s.peak_held), n(s.mean_used))
}

/// What the fleet has free for a resource, in the resource's own unit, on GPUs that take new work (not cordoned,
/// on nodes that are ready or applying): compute slices in all for `compute_slices`; for a MIG profile, how many
/// more instances of it fit beside the instances in use (the core's `room_for`, exact under the placement rules);
/// for whole GPUs and shares, GPUs of the model with nothing on them. `—` for memory, which is not counted free.
pub fn fleet_free(resource: &str, nodes: &[NodeView]) -> String {
    let catalog = Catalog::builtin();
    let n = |v: f64| tessera_core::clock::rounded(v, 1);
    let usable = || {
        nodes
            .iter()
            .filter(|node| node.state == "ready" || node.state == "applying")
            .flat_map(|node| node.gpus.iter())
            .filter(|g| !g.cordoned)
    };
    match QuotaResource::parse(catalog, resource) {
        Ok(QuotaResource::ComputeSlices) => {
            let free: f64 = crate::pages::overview::capacity(nodes, catalog).iter().map(|c| c.free).sum();
            format!("{} slices", n(free))
        }
        Ok(QuotaResource::Mig { model, profile }) => {
            let Some(m) = catalog.model(&model) else { return "—".to_string() };
            let room: u32 = usable()
                .filter(|g| g.model == model && g.mig_enabled)
                .map(|g| {
                    let in_use: Vec<PlacedInstance> = g
                        .in_use
                        .iter()
                        .map(|u| PlacedInstance { profile: u.profile.clone(), start: u.start })
                        .collect();
                    u32::from(tessera_core::layout::room_for(m, &in_use, &profile))
                })
                .sum();
            crate::pages::count(room, &format!("{profile} instance"))
        }
        Ok(QuotaResource::Gpu { model } | QuotaResource::Timeslice { model } | QuotaResource::Mps { model }) => {
            let empty = usable().filter(|g| g.model == model && !g.mig_enabled && g.in_use.is_empty()).count();
            format!(
                "{} with nothing on {}",
                crate::pages::count(empty as u64, &format!("{model} GPU")),
                if empty == 1 { "it" } else { "them" }
            )
        }
        _ => "—".to_string(),
    }
}

/// `/approvals`: quota requests waiting for a platform admin, each line with what the tenant holds and an amount
/// to grant (the amount asked until changed), and each request its own note or reason (a grant's comment, or why
/// it is refused: the tenant reads it).
#[component]
pub fn QuotaApprovals() -> impl IntoView {
    let tenants = expect_context::<TenantsResource>();
    // Each waiting request with its tenant's quota (what it holds), read in one go: nothing loads inside a card.
    let pending = Resource::new(
        || (),
        |_| async move {
            let page =
                api::get_json::<QuotaRequestPage>("/api/v1/quota-requests?state=pending&limit=100".into()).await?;
            let mut tenants: BTreeMap<String, TenantFacts> = BTreeMap::new();
            for r in &page.items {
                if tenants.contains_key(&r.tenant) {
                    continue;
                }
                let quota = api::get_json::<QuotaView>(format!("/api/v1/tenants/{}/quotas", r.tenant)).await.ok();
                let usage =
                    api::get_json::<UsageReport>(format!("/api/v1/usage?tenant={}&limit=0", r.tenant)).await.ok();
                let gpu_hours = usage.map(|u| u.tenants.iter().map(|t| t.gpu_hours).sum());
                tenants.insert(r.tenant.clone(), TenantFacts { quota, gpu_hours, timelines: BTreeMap::new() });
            }
            // Each asked resource's last 30 days, in its own unit.
            for r in &page.items {
                for l in &r.lines {
                    let Some(facts) = tenants.get_mut(&r.tenant) else { continue };
                    if facts.timelines.contains_key(&l.resource) {
                        continue;
                    }
                    let path = format!(
                        "/api/v1/tenants/{}/quota-timeline?days=30&resource={}",
                        r.tenant,
                        crate::pages::shared::encode(&l.resource)
                    );
                    if let Ok(tl) = api::get_json::<QuotaTimeline>(path).await {
                        facts.timelines.insert(l.resource.clone(), tl.summary);
                    }
                }
            }
            let nodes = api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()).await.unwrap_or_default();
            Ok::<_, api::Problem>((page, tenants, nodes))
        },
    );
    // (request id, resource) -> the amount typed; absent: the amount asked.
    let grants = RwSignal::new(BTreeMap::<(String, String), String>::new());
    // request id -> its note or reason, typed in its card.
    let reasons = RwSignal::new(BTreeMap::<String, String>::new());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let decide = move |r: QuotaRequestView, approve: bool| {
        let why = reasons.with_untracked(|w| w.get(&r.id).cloned().unwrap_or_default()).trim().to_string();
        if !approve && why.is_empty() {
            messages.update(|m| m.push((false, "Give a reason to refuse: the tenant sees it.".into())));
            return;
        }
        let typed = grants.get_untracked();
        let mut limits = BTreeMap::new();
        for l in &r.lines {
            let t = typed.get(&(r.id.clone(), l.resource.clone())).cloned().unwrap_or_else(|| l.asked.to_string());
            match t.trim() {
                "" => {}
                v => match v.parse::<f64>() {
                    Ok(v) => {
                        limits.insert(l.resource.clone(), v);
                    }
                    Err(_) => {
                        messages.update(|m| {
                            m.push((false, format!("{}: a number, or empty to grant none.", named(&l.resource).0)))
                        });
                        return;
                    }
                },
            }
        }
        leptos::task::spawn_local(async move {
            let id = r.id.clone();
            let answer = if approve {
                let body = GrantBody { limits: Some(limits), comment: why };
                api::send_json::<QuotaRequestView>("POST", format!("/api/v1/quota-requests/{id}/approve"), body).await
            } else {
                let body = RejectBody { reason: why };
                api::send_json::<QuotaRequestView>("POST", format!("/api/v1/quota-requests/{id}/reject"), body).await
            };
            match answer {
                Ok(r) => {
                    messages.update(|m| m.push((true, format!("Quota request {}: {}.", short(&id), state_text(&r)))))
                }
                Err(p) => messages.update(|m| m.push((false, format!("{}: {}", short(&id), p.message())))),
            }
            pending.refetch();
        });
    };
    view! {
        <h2>"Quota requests waiting"</h2>
        <ul class="messages" aria-live="polite">
            {move || messages.get().into_iter().rev().take(4).map(|(ok, m)| view! { <li class:ok=ok class:error=!ok>{m}</li> }).collect_view()}
        </ul>
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                let names = tenants.await.unwrap_or_default();
                match pending.await {
                    Err(p) => problem_view(&p),
                    Ok((page, _, _)) if page.items.is_empty() => view! { <p class="muted" data-testid="no-quota-requests">"No quota request is waiting."</p> }.into_any(),
                    Ok((page, facts, nodes)) => { page.items.into_iter().map(|r| {
                        let tenant = names.iter().find(|t| t.id == r.tenant).map_or_else(|| r.tenant.clone(), |t| t.name.clone());
                        let quota = facts.get(&r.tenant).and_then(|f| f.quota.clone());
                        let past = facts.get(&r.tenant).map(|f| f.timelines.clone()).unwrap_or_default();
                        let used = facts.get(&r.tenant).and_then(|f| f.gpu_hours).map(|h| format!("{} GPU-hours used in the last 30 days", tessera_core::clock::rounded(h, 1)));
                        let (approve, reject) = (r.clone(), r.clone());
                        let rid = r.id.clone();
                        view! {
                            <div class="card" data-testid="quota-request" data-quota-request=r.id.clone()>
                                <div class="title-row">
                                    <h3>{tenant}</h3>
                                    <span class="muted small">{format!("{} asked {}{}", r.requested_by.trim_start_matches("user:"), ago(r.created_at_ms, now_ms()), r.until_ms.map(|u| format!(" · until {}", tessera_core::clock::utc_minute(u))).unwrap_or_default())}</span>
                                </div>
                                <p class="muted">{r.reason.clone()}</p>
                                {used.map(|u| view! { <p class="small" data-testid="used-30d">{u}</p> })}
                                <div class="table-wrap"><table>
                                    <thead><tr><th>"Resource"</th><th>"Limit now"</th><th>"Asked"</th><th>"Held"</th><th>"Fleet free"</th><th>"Last 30 days"</th><th>"Grant"</th></tr></thead>
                                    <tbody>
                                        {r.lines.iter().map(|l| {
                                            let (name, unit) = named(&l.resource);
                                            let key = (rid.clone(), l.resource.clone());
                                            let shown = { let key = key.clone(); let asked = l.asked.to_string(); move || grants.with(|g| g.get(&key).cloned().unwrap_or_else(|| asked.clone())) };
                                            let resource = l.resource.clone();
                                            view! {
                                                <tr data-resource=l.resource.clone()>
                                                    <td title=l.resource.clone()>{name}</td>
                                                    <td>{l.before.map_or_else(|| "no limit".to_string(), |b| format!("{} {unit}", amount(b)))}</td>
                                                    <td>{format!("{} {unit}", amount(l.asked))}</td>
                                                    <td>{quota.as_ref().and_then(|q| q.resources.iter().find(|x| x.resource == resource)).map_or_else(|| format!("0 {unit}"), |x| format!("{} {unit}", amount(x.held)))}</td>
                                                    <td class="muted">{fleet_free(&resource, &nodes)}</td>
                                                    <td class="muted" data-testid="past-30d">{past.get(&resource).map_or_else(|| "—".to_string(), |s| past_text(s, unit))}</td>
                                                    <td><input type="number" min="0" step="any" name="grant" aria-label="Grant" prop:value=shown
                                                        on:input=move |ev| { let v = event_target_value(&ev); let key = key.clone(); grants.update(|g| { g.insert(key, v); }); } /></td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table></div>
                                <label class="small">"Note to the tenant (with a grant) or why you refuse (needed to refuse)"
                                    <input type="text" name="quota-decision" data-testid="quota-decision" maxlength="2000"
                                        prop:value={let id = rid.clone(); move || reasons.with(|w| w.get(&id).cloned().unwrap_or_default())}
                                        on:input={let id = rid.clone(); move |ev| { let v = event_target_value(&ev); let id = id.clone(); reasons.update(|w| { w.insert(id, v); }); }} />
                                </label>
                                <div class="actions">
                                    <button class="button primary" data-testid="grant" on:click=move |_| decide(approve.clone(), true)>"Grant"</button>
                                    <button class="button danger" data-testid="refuse-quota" on:click=move |_| decide(reject.clone(), false)>"Refuse"</button>
                                </div>
                            </div>
                        }
                    }).collect_view().into_any() }
                }
            })}
        </Transition>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::nodes::{GpuView, InUse};

    fn line(resource: &str, before: Option<f64>, asked: f64, granted: Option<f64>) -> QuotaRequestLine {
        QuotaRequestLine { resource: resource.into(), before, asked, granted }
    }

    #[test]
    fn lines_read_in_words_with_what_was_granted() {
        let l = line("compute_slices", Some(7.0), 14.0, None);
        assert_eq!(line_text(&l, QuotaRequestState::Pending), "Compute slices: 7 → 14 slices");
        let l = line("compute_slices", Some(7.0), 14.0, Some(10.0));
        assert_eq!(line_text(&l, QuotaRequestState::Approved), "Compute slices: 7 → 14 slices, 10 granted");
        let l = line("gpu/H100-80GB", None, 2.0, None);
        assert_eq!(line_text(&l, QuotaRequestState::Approved), "Whole H100-80GB GPUs: no limit → 2 GPUs, not granted");
        let l = line("compute_slices", Some(7.0), 14.0, Some(14.0));
        assert_eq!(line_text(&l, QuotaRequestState::Approved), "Compute slices: 7 → 14 slices");
    }

    #[test]
    fn fleet_free_counts_in_the_resources_unit() {
        let gpu = |model: &str, mig: bool, in_use: &[(&str, u8)], cordoned: bool| GpuView {
            id: "g".into(),
            index: 0,
            uuid: "GPU-1".into(),
            model: model.into(),
            mig_enabled: mig,
            cordoned,
            layout: vec![],
            layout_version: 0,
            auto_layout: false,
            applied: None,
            errors: vec![],
            in_use: in_use
                .iter()
                .map(|(p, s)| InUse {
                    profile: (*p).into(),
                    start: *s,
                    request: "r".into(),
                    tenant: "t".into(),
                    state: "active".into(),
                })
                .collect(),
            health: Default::default(),
            drain: None,
            now: None,
            layout_waiting: None,
            processes: vec![],
        };
        let node = |state: &str, gpus: Vec<GpuView>| NodeView {
            id: "n".into(),
            name: "n".into(),
            created_at_ms: 0,
            gpus,
            state: state.into(),
            generation: 0,
            observed_generation: 0,
            last_seen_ms: None,
            agent: None,
            errors: vec![],
        };
        let nodes = [
            node("ready", vec![gpu("H100-80GB", true, &[("1g.10gb", 0)], false), gpu("H100-80GB", true, &[], false)]),
            node("ready", vec![gpu("H100-80GB", true, &[], true), gpu("A30-24GB", false, &[], false)]),
            node("not-ready", vec![gpu("H100-80GB", true, &[], false)]),
        ];
        // A 1g in use at 0 leaves room for one 3g; an empty H100 two; cordoned and unready GPUs count for nothing.
        assert_eq!(fleet_free("mig/H100-80GB/3g.40gb", &nodes), "3 3g.40gb instances");
        assert_eq!(fleet_free("mig/H100-80GB/7g.80gb", &nodes), "1 7g.80gb instance");
        assert_eq!(fleet_free("gpu/A30-24GB", &nodes), "1 A30-24GB GPU with nothing on it");
        assert_eq!(fleet_free("timeslice/H100-80GB", &nodes), "0 H100-80GB GPUs with nothing on them");
        assert_eq!(fleet_free("memory_gib", &nodes), "—");
        assert!(fleet_free("compute_slices", &nodes).ends_with(" slices"));
    }

    #[test]
    fn the_last_30_days_read_in_the_resources_unit() {
        let s = TimelineSummary {
            peak_held: 6.0,
            mean_held: 3.0,
            mean_used: 2.26,
            limit: Some(7.0),
            never_used: Some(1.0),
        };
        assert_eq!(past_text(&s, "slices"), "peak 6 · 2.3 slices used on average");
    }

    #[test]
    fn rows_are_checked_before_anything_is_sent() {
        let rows = |r: &[(&str, &str)]| r.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>();
        assert_eq!(
            parse_rows(&rows(&[("compute_slices", "14"), ("", "")])),
            Ok([("compute_slices".to_string(), 14.0)].into())
        );
        assert!(parse_rows(&rows(&[])).is_err());
        assert!(parse_rows(&rows(&[("cpu", "1")])).expect_err("cpu").contains("not a resource"));
        assert!(parse_rows(&rows(&[("compute_slices", "-1")])).is_err());
        assert!(parse_rows(&rows(&[("compute_slices", "lots")])).is_err());
    }
}
