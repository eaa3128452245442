//! `/t/:tenant`: a tenant's dashboard: quota bars (used, pending, limit), the new-request form with live feedback,
//! requests with their history, allocations with what a workload needs to reach them, and usage.
//!
//! The form's feedback is the core's quota arithmetic (`charge`, `check`, the approval policy), the same the server
//! runs when the request is made; the server's answer is still what counts.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_core::catalog::Catalog;
use tessera_core::quota::{self, Decision, MILLI, Milli, Resource as QuotaResource, Usage};
use tessera_core::request::{RequestState, SliceSpec};

use crate::api;
use crate::app::problem_view;
use crate::model::{Allocation, Offerings, Quotas, RequestPage, SliceRequest, Tenant};
use crate::pages::{ago, now_ms};

/// One quota bar: amounts in thousandths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaBar {
    /// Resource key.
    pub resource: String,
    /// Held by approved, provisioning and active requests.
    pub used: Milli,
    /// Held by pending requests.
    pub pending: Milli,
    /// The limit (`None`: unlimited).
    pub limit: Option<Milli>,
}

impl QuotaBar {
    /// Widths of the used and pending parts, in percent of the limit (or of what is held, when unlimited).
    pub fn widths(&self) -> (f64, f64) {
        let whole = self.limit.unwrap_or(self.used + self.pending).max(1) as f64;
        let used = (self.used as f64 / whole * 100.0).min(100.0);
        let pending = (self.pending as f64 / whole * 100.0).min(100.0 - used);
        (used, pending)
    }
}

fn milli(v: f64) -> Milli {
    (v.max(0.0) * MILLI as f64).round() as Milli
}

/// The tenant's limits and holdings as the core counts them, from the quota view.
pub fn limits_and_held(q: &Quotas) -> (Usage, Usage) {
    let catalog = Catalog::builtin();
    let (mut limits, mut held) = (Usage::new(), Usage::new());
    for line in &q.resources {
        let Ok(r) = QuotaResource::parse(catalog, &line.resource) else { continue };
        if let Some(l) = line.limit {
            limits.insert(r.clone(), milli(l));
        }
        held.insert(r, milli(line.held));
    }
    (limits, held)
}

/// What the tenant's pending requests hold, per resource (the core's `charge` of each).
pub fn pending_usage(requests: &[SliceRequest]) -> Usage {
    let mut usage = Usage::new();
    for r in requests.iter().filter(|r| r.state == RequestState::Pending) {
        if let Ok(c) = quota::charge(Catalog::builtin(), &r.spec, r.count) {
            quota::accumulate(&mut usage, &c);
        }
    }
    usage
}

/// The bars: every resource with a limit or holdings, used and pending apart.
pub fn quota_bars(q: &Quotas, requests: &[SliceRequest]) -> Vec<QuotaBar> {
    let (limits, held) = limits_and_held(q);
    let pending = pending_usage(requests);
    let mut keys: Vec<&QuotaResource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|r| {
            let h = held.get(r).copied().unwrap_or(0);
            let p = pending.get(r).copied().unwrap_or(0).min(h);
            QuotaBar { resource: r.to_string(), used: h - p, pending: p, limit: limits.get(r).copied() }
        })
        .filter(|b| b.limit.is_some() || b.used + b.pending > 0)
        .collect()
}

/// What the form says about a request before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// What it charges, per resource: (key, amount, left after it; `None`: unlimited).
    pub charges: Vec<(String, String, Option<String>)>,
    /// Limits it would exceed, in the core's words; empty when it fits.
    pub over: Vec<String>,
    /// Whether it would be approved at once.
    pub decision: Option<Decision>,
    /// A request the core cannot charge (unknown model, bad replicas).
    pub invalid: Option<String>,
}

/// The feedback for `count` slices of `spec` under `quotas` and `policy`.
pub fn feedback(
    spec: &SliceSpec,
    count: u32,
    quotas: &Quotas,
    policy: tessera_core::quota::ApprovalPolicy,
) -> Feedback {
    let requested = match quota::charge(Catalog::builtin(), spec, count) {
        Ok(r) => r,
        Err(e) => return Feedback { charges: vec![], over: vec![], decision: None, invalid: Some(e.to_string()) },
    };
    let (limits, held) = limits_and_held(quotas);
    let charges = requested
        .iter()
        .map(|(r, &a)| {
            let left = limits
                .get(r)
                .map(|&l| quota::show(l.saturating_sub(held.get(r).copied().unwrap_or(0)).saturating_sub(a)));
            (r.to_string(), quota::show(a), left)
        })
        .collect();
    match quota::check(&limits, &held, &requested) {
        Ok(()) => Feedback { charges, over: vec![], decision: Some(policy.decide(&requested)), invalid: None },
        Err(errors) => {
            Feedback { charges, over: errors.iter().map(ToString::to_string).collect(), decision: None, invalid: None }
        }
    }
}

/// `3 × MIG 1g.10gb on H100-80GB`, `1 × H100-80GB (time-sliced 1/4)`.
pub fn describe(spec: &SliceSpec, count: u32) -> String {
    let what = match spec {
        SliceSpec::Mig { profile, model: Some(m) } => format!("MIG {profile} on {m}"),
        SliceSpec::Mig { profile, model: None } => format!("MIG {profile}"),
        SliceSpec::Timeslice { model, replicas } => format!("{model} time-sliced 1/{replicas}"),
        SliceSpec::Mps { model, replicas } => format!("{model} MPS 1/{replicas}"),
        SliceSpec::Exclusive { model } => format!("whole {model}"),
    };
    format!("{count} × {what}")
}

/// `pending`, `active`, ... as the API writes them.
pub fn state_name(s: RequestState) -> String {
    serde_json::to_value(s).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

fn cancellable(s: RequestState) -> bool {
    matches!(s, RequestState::Pending | RequestState::Approved | RequestState::Provisioning)
}

/// The tenant dashboard.
#[component]
pub fn TenantPage() -> impl IntoView {
    let params = use_params_map();
    let tenant_id = move || params.read().get("tenant").unwrap_or_default();
    let tenant = Resource::new(tenant_id, |id| api::get_json::<Tenant>(format!("/api/v1/tenants/{id}")));
    let quotas = Resource::new(tenant_id, |id| api::get_json::<Quotas>(format!("/api/v1/tenants/{id}/quotas")));
    let requests =
        Resource::new(tenant_id, |id| api::get_json::<RequestPage>(format!("/api/v1/requests?tenant={id}&limit=500")));
    let allocations =
        Resource::new(tenant_id, |id| api::get_json::<Vec<Allocation>>(format!("/api/v1/allocations?tenant={id}")));
    let refresh = move || {
        quotas.refetch();
        requests.refetch();
        allocations.refetch();
    };
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(refresh, std::time::Duration::from_secs(3)) {
            on_cleanup(move || handle.clear());
        }
    }
    view! {
        <section class="page">
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let t = match tenant.await {
                        Ok(t) => t,
                        Err(p) => return problem_view(&p),
                    };
                    let (q, reqs, allocs) = (quotas.await, requests.await, allocations.await);
                    let items = reqs.as_ref().map(|p| p.items.clone()).unwrap_or_default();
                    view! {
                        <div class="title-row"><h1>{t.name.clone()}</h1>
                            <span class="muted">{if t.auto_approve { format!("auto-approves up to {} compute slices", t.auto_approve_max_compute_slices) } else { "every request waits for an admin".to_string() }}</span>
                        </div>
                        <div class="cards two">
                            <div class="card" data-testid="quota">
                                <h2>"Quota"</h2>
                                {match &q {
                                    Ok(q) => quota_view(quota_bars(q, &items)),
                                    Err(p) => problem_view(p),
                                }}
                            </div>
                            <div class="card">
                                <h2>"New request"</h2>
                                {match q.clone() {
                                    Ok(q) => view! { <RequestForm tenant=t.clone() quotas=q on_done=Callback::new(move |_| refresh()) /> }.into_any(),
                                    Err(p) => problem_view(&p),
                                }}
                            </div>
                        </div>
                        <div class="card">
                            <h2>"Allocations"</h2>
                            {match allocs {
                                Ok(a) => allocations_view(a),
                                Err(p) => problem_view(&p),
                            }}
                        </div>
                        <div class="card">
                            <h2>"Requests"</h2>
                            {match reqs {
                                Ok(p) => view! { <RequestsTable items=p.items on_done=Callback::new(move |_| refresh()) /> }.into_any(),
                                Err(p) => problem_view(&p),
                            }}
                        </div>
                        <UsageCard tenant=t.id.clone() />
                    }.into_any()
                })}
            </Transition>
        </section>
    }
}

fn quota_view(bars: Vec<QuotaBar>) -> AnyView {
    if bars.is_empty() {
        return view! { <p class="muted">"No limits set: requests are not capped."</p> }.into_any();
    }
    view! {
        <ul class="bars">
            {bars.into_iter().map(|b| {
                let (used, pending) = b.widths();
                let label = match b.limit {
                    Some(l) => format!("{} used · {} pending · limit {}", quota::show(b.used), quota::show(b.pending), quota::show(l)),
                    None => format!("{} used · {} pending · no limit", quota::show(b.used), quota::show(b.pending)),
                };
                let full = b.limit.is_some_and(|l| b.used + b.pending >= l);
                view! {
                    <li data-resource=b.resource.clone()>
                        <div class="bar-head"><code>{b.resource.clone()}</code><span class="muted" class:bad=full>{label.clone()}</span></div>
                        <div class="bar" role="img" aria-label=label>
                            <span class="used" style=format!("width:{used:.1}%")></span>
                            <span class="pending" style=format!("width:{pending:.1}%")></span>
                        </div>
                    </li>
                }
            }).collect_view()}
        </ul>
        <p class="legend small"><span class="key used"></span>"used "<span class="key pending"></span>"pending"</p>
    }
    .into_any()
}

fn allocations_view(list: Vec<Allocation>) -> AnyView {
    if list.is_empty() {
        return view! { <p class="muted">"Nothing allocated yet."</p> }.into_any();
    }
    view! {
        <div class="table-wrap">
        <table data-testid="allocations">
            <thead><tr><th>"State"</th><th>"Slice"</th><th>"Node / GPU"</th><th>"Device"</th><th><code>"CUDA_VISIBLE_DEVICES"</code></th><th>"Kubernetes resource"</th></tr></thead>
            <tbody>
                {list.into_iter().map(|a| {
                    let state = if a.waiting_for_layout { "waiting for layout".to_string() } else { a.state.clone() };
                    view! {
                        <tr data-allocation=a.id.clone() data-state=a.state.clone()>
                            <td><span class=format!("state {}", if a.state == "active" { "ready" } else { "applying" })>{state}</span></td>
                            <td>{a.profile.clone()}<span class="muted">{format!(" @{}", a.start)}</span></td>
                            <td>{a.node.clone()}<span class="muted">{format!(" · GPU {}", a.gpu_index)}</span></td>
                            <td><code class="uuid">{a.device_uuid.clone().unwrap_or_else(|| "—".into())}</code></td>
                            <td><code>{a.cuda_visible_devices.clone().unwrap_or_else(|| "—".into())}</code></td>
                            <td><code>{a.k8s_resource.clone()}</code></td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
        </div>
    }
    .into_any()
}

#[component]
fn RequestsTable(items: Vec<SliceRequest>, on_done: Callback<()>) -> impl IntoView {
    if items.is_empty() {
        return view! { <p class="muted">"No requests yet."</p> }.into_any();
    }
    let now = now_ms();
    let mut items = items;
    items.reverse();
    view! {
        <div class="table-wrap">
        <table data-testid="requests">
            <thead><tr><th>"State"</th><th>"What"</th><th>"Asked"</th><th>"Reason"</th><th></th></tr></thead>
            <tbody>
                {items.into_iter().map(|r| view! { <RequestRow r now on_done /> }).collect_view()}
            </tbody>
        </table>
        </div>
    }
    .into_any()
}

#[component]
fn RequestRow(r: SliceRequest, now: i64, on_done: Callback<()>) -> impl IntoView {
    let state = state_name(r.state);
    let history = RwSignal::new(None::<Result<Vec<crate::model::AuditEntry>, api::Problem>>);
    let error = RwSignal::new(None::<String>);
    let id = r.id.clone();
    let show_history = move |_| {
        if history.get_untracked().is_some() {
            history.set(None);
            return;
        }
        let id = id.clone();
        leptos::task::spawn_local(async move {
            history.set(Some(api::get_json(format!("/api/v1/audit?object=request/{id}")).await));
        });
    };
    let id = r.id.clone();
    let cancel = move |_| {
        let id = id.clone();
        leptos::task::spawn_local(async move {
            match api::send_json::<serde_json::Value>("POST", format!("/api/v1/requests/{id}/cancel"), None).await {
                Ok(_) => on_done.run(()),
                Err(p) => error.set(Some(p.message())),
            }
        });
    };
    let id = r.id.clone();
    let release = move |_| {
        let id = id.clone();
        leptos::task::spawn_local(async move {
            match api::send_json::<serde_json::Value>("POST", format!("/api/v1/requests/{id}/release"), None).await {
                Ok(_) => on_done.run(()),
                Err(p) => error.set(Some(p.message())),
            }
        });
    };
    let can_cancel = cancellable(r.state);
    let can_release = r.state == RequestState::Active;
    view! {
        <tr data-request=r.id.clone() data-state=state.clone()>
            <td><span class=format!("rstate {state}")>{state.clone()}</span></td>
            <td>{describe(&r.spec, r.count)}</td>
            <td title=r.created_at_ms.to_string()>{ago(r.created_at_ms, now)}</td>
            <td class="muted">{r.reason.clone()}</td>
            <td class="actions">
                <button class="link" on:click=show_history>"History"</button>
                {can_cancel.then(|| view! { <button class="link danger" on:click=cancel.clone()>"Cancel"</button> })}
                {can_release.then(|| view! { <button class="link danger" data-testid="release" on:click=release.clone()>"Release"</button> })}
                {move || error.get().map(|e| view! { <span class="error">{e}</span> })}
            </td>
        </tr>
        {move || history.get().map(|h| view! {
            <tr class="history"><td colspan="5">
                {match h {
                    Ok(entries) => view! {
                        <ol class="timeline">
                            {entries.into_iter().map(|e| view! {
                                <li><span class="muted">{ago(e.at_ms, now_ms())}</span>" "<strong>{e.action}</strong>" by "{e.actor}</li>
                            }).collect_view()}
                        </ol>
                    }.into_any(),
                    Err(p) => problem_view(&p),
                }}
            </td></tr>
        })}
    }
}

/// The mode chosen in the form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Mig,
    Timeslice,
    Mps,
    Exclusive,
}

impl Mode {
    fn parse(s: &str) -> Mode {
        match s {
            "timeslice" => Mode::Timeslice,
            "mps" => Mode::Mps,
            "exclusive" => Mode::Exclusive,
            _ => Mode::Mig,
        }
    }
}

#[component]
fn RequestForm(tenant: Tenant, quotas: Quotas, on_done: Callback<()>) -> impl IntoView {
    let offerings = Resource::new(|| (), |_| api::get_json::<Offerings>("/api/v1/offerings".into()));
    let mode = RwSignal::new("mig".to_string());
    let model = RwSignal::new(String::new());
    let profile = RwSignal::new(String::new());
    let replicas = RwSignal::new("4".to_string());
    let count = RwSignal::new("1".to_string());
    let hours = RwSignal::new(String::new());
    let reason = RwSignal::new(String::new());
    let sending = RwSignal::new(false);
    let result = RwSignal::new(None::<Result<String, api::Problem>>);
    let spec = move || -> Option<SliceSpec> {
        let m = model.get();
        let r = replicas.get().trim().parse().unwrap_or(0);
        match Mode::parse(&mode.get()) {
            Mode::Mig => {
                let p = profile.get();
                (!p.is_empty()).then(|| SliceSpec::Mig { profile: p, model: (!m.is_empty()).then_some(m) })
            }
            _ if m.is_empty() => None,
            Mode::Timeslice => Some(SliceSpec::Timeslice { model: m, replicas: r }),
            Mode::Mps => Some(SliceSpec::Mps { model: m, replicas: r }),
            Mode::Exclusive => Some(SliceSpec::Exclusive { model: m }),
        }
    };
    let count_n = move || count.get().trim().parse::<u32>().ok().filter(|n| *n >= 1);
    let policy = tenant.policy();
    let tenant_id = tenant.id.clone();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (Some(spec), Some(n)) = (spec(), count_n()) else { return };
        let duration_s = hours.get().trim().parse::<f64>().ok().filter(|h| *h > 0.0).map(|h| (h * 3600.0) as i64);
        let body = serde_json::json!({
            "tenant": tenant_id, "spec": spec, "count": n, "reason": reason.get(), "duration_s": duration_s,
        });
        sending.set(true);
        leptos::task::spawn_local(async move {
            let answer = api::send_json::<SliceRequest>("POST", "/api/v1/requests".into(), Some(body)).await;
            sending.set(false);
            result.set(Some(answer.map(|r| format!("Request {} is {}.", short(&r.id), state_name(r.state)))));
            on_done.run(());
        });
    };
    let quotas = StoredValue::new(quotas);
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || { let submit = submit.clone(); Suspend::new(async move {
                let offer = match offerings.await {
                    Ok(o) => o,
                    Err(p) => return problem_view(&p),
                };
                let wait = match (offer.pending_requests, offer.oldest_pending_ms) {
                    (0, _) => "No requests are waiting for an admin now.".to_string(),
                    (n, Some(t)) => format!("{n} request(s) waiting for an admin, the oldest made {}.", ago(t, now_ms())),
                    (n, None) => format!("{n} request(s) waiting for an admin."),
                };
                let offer_models = offer.models.clone();
                let models_for_mode = move || {
                    let mig = Mode::parse(&mode.get()) == Mode::Mig;
                    offer_models.iter().filter(|m| if mig { m.mig_gpus > 0 } else { m.whole_gpus > 0 }).cloned().collect::<Vec<_>>()
                };
                let offer_models = offer.models.clone();
                let profiles = move || {
                    let m = model.get();
                    let mut names: Vec<String> = offer_models.iter().filter(|o| o.mig_gpus > 0 && (m.is_empty() || o.model == m)).flat_map(|o| o.profiles.clone()).collect();
                    names.dedup();
                    let mut seen = std::collections::HashSet::new();
                    names.retain(|n| seen.insert(n.clone()));
                    names
                };
                let quotas = quotas.get_value();
                view! {
                    <form class="form" on:submit=submit.clone() data-testid="request-form">
                        <fieldset class="modes">
                            <legend>"Sharing"</legend>
                            {[("mig", "MIG instance"), ("timeslice", "Time-sliced"), ("mps", "MPS"), ("exclusive", "Whole GPU")].map(|(v, label)| view! {
                                <label class="radio"><input type="radio" name="mode" value=v
                                    prop:checked=move || mode.get() == v
                                    on:change=move |_| { mode.set(v.to_string()); model.set(String::new()); profile.set(String::new()); } />{label}</label>
                            })}
                        </fieldset>
                        <label>"GPU model"
                            <select name="model" prop:value=move || model.get() on:change=move |ev| { model.set(event_target_value(&ev)); profile.set(String::new()); }>
                                {move || {
                                    let any = Mode::parse(&mode.get()) == Mode::Mig;
                                    view! {
                                        <option value="" selected=move || model.get().is_empty()>{if any { "any model" } else { "choose a model" }}</option>
                                        {models_for_mode().into_iter().map(|m| {
                                            let key = m.model.clone();
                                            let label = format!("{} ({} GPU{})", m.product, m.gpus, if m.gpus == 1 { "" } else { "s" });
                                            view! { <option value=key.clone() selected=move || model.get() == key>{label}</option> }
                                        }).collect_view()}
                                    }
                                }}
                            </select>
                        </label>
                        {move || match Mode::parse(&mode.get()) {
                            Mode::Mig => view! {
                                <label>"MIG profile"
                                    <select name="profile" prop:value=move || profile.get() on:change=move |ev| profile.set(event_target_value(&ev))>
                                        <option value="">"choose a profile"</option>
                                        {profiles().into_iter().map(|p| { let v = p.clone(); view! { <option value=v.clone() selected=move || profile.get() == v>{p}</option> } }).collect_view()}
                                    </select>
                                </label>
                            }.into_any(),
                            Mode::Timeslice | Mode::Mps => view! {
                                <label>"Shares per GPU"<input name="replicas" type="number" min="2" max="48" bind:value=replicas /></label>
                            }.into_any(),
                            Mode::Exclusive => ().into_any(),
                        }}
                        <div class="row">
                            <label>"Count"<input name="count" type="number" min="1" max="64" bind:value=count /></label>
                            <label>"Duration (hours)"<input name="hours" type="number" min="0" step="0.5" placeholder="until released" bind:value=hours /></label>
                        </div>
                        <label>"Reason"<input name="reason" type="text" maxlength="500" placeholder="What it is for" bind:value=reason /></label>
                        <div class="feedback" data-testid="feedback" aria-live="polite">
                            {move || match (spec(), count_n()) {
                                (Some(s), Some(n)) => feedback_view(feedback(&s, n, &quotas, policy)),
                                (_, None) => view! { <p class="muted">"The count is a whole number from 1."</p> }.into_any(),
                                _ => view! { <p class="muted">"Choose what you need to see what it takes from the quota."</p> }.into_any(),
                            }}
                            <p class="muted small">{wait.clone()}</p>
                        </div>
                        <button class="button primary" type="submit" disabled=move || sending.get() || spec().is_none() || count_n().is_none()>"Request"</button>
                        {move || result.get().map(|r| match r {
                            Ok(m) => view! { <p class="ok" role="status">{m}</p> }.into_any(),
                            Err(p) => view! { <p class="error" role="alert"><strong>{p.code.clone()}</strong>": "{p.message()}</p> }.into_any(),
                        })}
                    </form>
                }.into_any()
            })}}
        </Suspense>
    }
}

fn feedback_view(f: Feedback) -> AnyView {
    if let Some(why) = f.invalid {
        return view! { <p class="error">{why}</p> }.into_any();
    }
    let verdict = match (&f.decision, f.over.is_empty()) {
        (_, false) => view! { <p class="error" data-verdict="over">"Over quota: it would be refused."</p> }.into_any(),
        (Some(Decision::AutoApprove), _) => {
            view! { <p class="ok" data-verdict="auto">"Within quota: approved at once."</p> }.into_any()
        }
        _ => {
            view! { <p class="warn" data-verdict="admin">"Within quota: waits for an admin's approval."</p> }.into_any()
        }
    };
    view! {
        {verdict}
        <ul class="plain small">
            {f.charges.into_iter().map(|(r, a, left)| view! {
                <li><code>{r}</code>{format!(" {a}")}<span class="muted">{left.map(|l| format!(" · {l} left after")).unwrap_or_default()}</span></li>
            }).collect_view()}
            {f.over.into_iter().map(|o| view! { <li class="error">{o}</li> }).collect_view()}
        </ul>
    }
    .into_any()
}

/// The last 8 characters of an id (UUIDv7s share their first ones, the time).
pub fn short(id: &str) -> String {
    id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect()
}

#[component]
fn UsageCard(tenant: String) -> impl IntoView {
    let usage = Resource::new(
        move || tenant.clone(),
        |t| api::get_json::<crate::model::UsageReport>(format!("/api/v1/usage?tenant={t}")),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::QuotaLine;

    fn quotas(held: f64, limit: f64) -> Quotas {
        Quotas {
            tenant: "t".into(),
            resources: vec![QuotaLine { resource: "compute_slices".into(), held, limit: Some(limit) }],
        }
    }

    fn request(state: RequestState, profile: &str, count: u32) -> SliceRequest {
        SliceRequest {
            id: "r".into(),
            tenant: "t".into(),
            spec: SliceSpec::Mig { profile: profile.into(), model: Some("H100-80GB".into()) },
            count,
            state,
            reason: String::new(),
            version: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            duration_s: None,
            expires_at_ms: None,
        }
    }

    #[test]
    fn bars_split_what_is_held_into_used_and_pending() {
        // 3 compute slices held: a pending 2g (2) and an active 1g (1).
        let reqs = [request(RequestState::Pending, "2g.20gb", 1), request(RequestState::Active, "1g.10gb", 1)];
        let bars = quota_bars(&quotas(3.0, 7.0), &reqs);
        let bar = bars.iter().find(|b| b.resource == "compute_slices").expect("bar");
        assert_eq!((bar.used, bar.pending, bar.limit), (1000, 2000, Some(7000)));
        let (u, p) = bar.widths();
        assert!((u - 14.28).abs() < 0.1 && (p - 28.57).abs() < 0.1, "{u} {p}");
    }

    #[test]
    fn feedback_is_the_core_quota_check_and_policy() {
        let policy = tessera_core::quota::ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 2 };
        let spec = SliceSpec::Mig { profile: "1g.10gb".into(), model: Some("H100-80GB".into()) };
        let f = feedback(&spec, 2, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::AutoApprove));
        assert!(f.charges.contains(&("compute_slices".into(), "2".into(), Some("2".into()))), "{:?}", f.charges);
        let f = feedback(&spec, 3, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::NeedsAdmin));
        let f = feedback(&spec, 5, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, None);
        assert_eq!(f.over, vec!["compute_slices: 3 held + 5 requested would exceed the limit of 7".to_string()]);
        let bad = SliceSpec::Timeslice { model: "H100-80GB".into(), replicas: 1 };
        assert!(feedback(&bad, 1, &quotas(0.0, 7.0), policy).invalid.is_some_and(|e| e.contains("replicas")));
    }

    #[test]
    fn requests_read_naturally() {
        let spec = SliceSpec::Timeslice { model: "A100-80GB".into(), replicas: 4 };
        assert_eq!(describe(&spec, 2), "2 × A100-80GB time-sliced 1/4");
        assert_eq!(state_name(RequestState::Provisioning), "provisioning");
        assert_eq!(short("0193-abcdef12"), "abcdef12");
    }
}
