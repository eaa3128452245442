//! `/t/:tenant`: a tenant's dashboard: quota bars (used, pending, limit), the new-request form with live feedback,
//! requests with their history, allocations with what a workload needs to reach them, and usage.
//!
//! The form's feedback is the core's quota arithmetic (`charge`, `check`, the approval policy), the same the server
//! runs when the request is made; the server's answer is still what counts.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_api::allocations::AllocationView;
use tessera_api::requests::{RequestPage, RequestView, Waiting};
use tessera_api::tenants::{QuotaView, TenantView};
use tessera_api::usage::UsageReport;
use tessera_core::catalog::Catalog;
use tessera_core::quota::{self, Decision, MILLI, Milli, QuotaError, Resource as QuotaResource, Usage};
use tessera_core::request::{RequestState, SliceSpec};

use crate::api;
use crate::pages::now_ms;
use crate::widgets::{Glossary, problem_view};

mod allocations;
mod form;
mod requests;
mod reservations;

use allocations::AllocationsList;
use form::RequestForm;
use requests::RequestsTable;
use reservations::ReservationsCard;

/// One quota bar: amounts in thousandths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaBar {
    /// Resource key.
    pub resource: String,
    /// What people call it (`Compute slices`, `GPU memory`, ...).
    pub name: String,
    /// The unit of its amounts (`slices`, `GiB`, ...).
    pub unit: &'static str,
    /// Held by approved, provisioning and active requests.
    pub used: Milli,
    /// Held by pending requests.
    pub pending: Milli,
    /// The limit (`None`: unlimited): what the tenant is guaranteed.
    pub limit: Option<Milli>,
    /// In a cohort, the most it may hold by borrowing what the others do not use.
    pub maximum: Option<Milli>,
    /// More is held than allowed (the server's word: past the maximum in a cohort, past the limit otherwise).
    pub over: bool,
}

impl QuotaBar {
    /// Widths of the used and pending parts, in percent of the limit; `None` when unlimited (no bar is drawn:
    /// there is nothing to fill).
    pub fn widths(&self) -> Option<(f64, f64)> {
        let whole = self.limit?.max(self.maximum.unwrap_or(0)).max(1) as f64;
        let used = (self.used as f64 / whole * 100.0).min(100.0);
        let pending = (self.pending as f64 / whole * 100.0).min(100.0 - used);
        Some((used, pending))
    }

    /// What is held above the limit, borrowed from the cohort.
    pub fn borrowed(&self) -> Milli {
        self.limit.map_or(0, |l| (self.used + self.pending).saturating_sub(l))
    }

    /// Where the limit sits on the bar, in percent of its length, when a maximum lies beyond it.
    pub fn limit_mark(&self) -> Option<f64> {
        let (l, m) = (self.limit?, self.maximum?);
        (m > l).then(|| l as f64 / m.max(1) as f64 * 100.0)
    }

    /// `12 of 20 slices used · 2 pending`, `19.6 GiB used · no limit`: amounts to one decimal, with the unit.
    pub fn text(&self) -> String {
        let n = |m: Milli| quota::show_places(m, 1);
        let pending = if self.pending > 0 { format!(" · {} pending", n(self.pending)) } else { String::new() };
        let borrowed = match (self.borrowed(), self.maximum) {
            (0, Some(m)) if self.limit.is_some_and(|l| m > l) => format!(" · up to {} with the cohort", n(m)),
            (0, _) => String::new(),
            (b, Some(m)) => format!(" · {} borrowed (at most {})", n(b), n(m)),
            (b, None) => format!(" · {} over", n(b)),
        };
        match self.limit {
            Some(l) => format!("{} of {} {} used{pending}{borrowed}", n(self.used), n(l), self.unit),
            None => format!("{} {} used{pending} · no limit", n(self.used), self.unit),
        }
    }
}

fn milli(v: f64) -> Milli {
    (v.max(0.0) * MILLI as f64).round() as Milli
}

/// The tenant's limits and holdings as the core counts them, from the quota view.
pub fn limits_and_held(q: &QuotaView) -> (Usage, Usage) {
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
pub fn pending_usage(requests: &[RequestView]) -> Usage {
    let mut usage = Usage::new();
    for r in requests.iter().filter(|r| r.state == RequestState::Pending) {
        if let Ok(c) = quota::charge(Catalog::builtin(), &r.spec, r.count) {
            quota::accumulate(&mut usage, &c);
        }
    }
    usage
}

/// The bars: every resource with a limit or holdings, used and pending apart.
pub fn quota_bars(q: &QuotaView, requests: &[RequestView]) -> Vec<QuotaBar> {
    let (limits, held) = limits_and_held(q);
    let pending = pending_usage(requests);
    let mut keys: Vec<&QuotaResource> = limits.keys().chain(held.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .map(|r| {
            let h = held.get(r).copied().unwrap_or(0);
            let p = pending.get(r).copied().unwrap_or(0).min(h);
            let (name, unit) = r.describe();
            let line = q
                .resources
                .iter()
                .find(|l| QuotaResource::parse(Catalog::builtin(), &l.resource).ok().as_ref() == Some(r));
            QuotaBar {
                resource: r.to_string(),
                name,
                unit,
                used: h - p,
                pending: p,
                limit: limits.get(r).copied(),
                maximum: line.and_then(|l| l.maximum).map(milli),
                over: line.is_some_and(|l| l.over),
            }
        })
        .filter(|b| b.limit.is_some() || b.used + b.pending > 0)
        .collect()
}

/// What the form says about a request before it is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feedback {
    /// What it charges, per resource.
    pub charges: Vec<Charge>,
    /// Limits it would exceed, in the core's words; empty when it fits.
    pub over: Vec<String>,
    /// Whether it would be approved at once.
    pub decision: Option<Decision>,
    /// A request the core cannot charge (unknown model, bad replicas).
    pub invalid: Option<String>,
    /// When over quota: the limits that would let it through (resource key, amount), what a quota request asking
    /// for exactly what is missing names (the core's `needed_limits`, as the server's `ask_for`).
    pub needed: Vec<(String, String)>,
}

/// One resource a request takes, in words: `Compute slices`, `2 slices`, `10 left after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Charge {
    /// The quota key (`compute_slices`), for a title and for tests.
    pub key: String,
    /// What people call it.
    pub name: String,
    /// The amount with its unit, to one decimal.
    pub amount: String,
    /// What the limit leaves after it, with its unit; `None`: unlimited.
    pub left: Option<String>,
}

/// The feedback for `count` slices of `spec` under `quotas` and `policy`.
pub fn feedback(
    spec: &SliceSpec,
    count: u32,
    quotas: &QuotaView,
    policy: tessera_core::quota::ApprovalPolicy,
) -> Feedback {
    let requested = match quota::charge(Catalog::builtin(), spec, count) {
        Ok(r) => r,
        Err(e) => {
            return Feedback {
                charges: vec![],
                over: vec![],
                decision: None,
                invalid: Some(e.to_string()),
                needed: vec![],
            };
        }
    };
    let (limits, held) = limits_and_held(quotas);
    // In a cohort a tenant may hold more than its limit, borrowing what the others do not use: the server says how
    // much more it may take now, and the check counts that.
    let limits: Usage = limits
        .into_iter()
        .map(|(r, l)| {
            let line = quotas
                .resources
                .iter()
                .find(|x| QuotaResource::parse(Catalog::builtin(), &x.resource).ok().as_ref() == Some(&r));
            let reach =
                line.and_then(|x| x.available).map(|a| held.get(&r).copied().unwrap_or(0).saturating_add(milli(a)));
            (r, reach.filter(|&m| m > l).unwrap_or(l))
        })
        .collect();
    let charges = requested
        .iter()
        .map(|(r, &a)| {
            let (name, unit) = r.describe();
            let n = |m: Milli| format!("{} {unit}", quota::show_places(m, 1));
            let left = limits.get(r).map(|&l| n(l.saturating_sub(held.get(r).copied().unwrap_or(0)).saturating_sub(a)));
            Charge { key: r.to_string(), name, amount: n(a), left }
        })
        .collect();
    match quota::check(&limits, &held, &requested) {
        Ok(()) => {
            Feedback { charges, over: vec![], decision: Some(policy.decide(&requested)), invalid: None, needed: vec![] }
        }
        Err(errors) => Feedback {
            charges,
            over: errors.iter().map(QuotaError::in_words).collect(),
            decision: None,
            invalid: None,
            needed: tessera_core::quota_request::needed_limits(&errors)
                .into_iter()
                .map(|(r, m)| (r.to_string(), quota::show(m)))
                .collect(),
        },
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
///
/// It refreshes every 3 s. Only the tenant is awaited around the whole page; the quota, the allocations and the
/// requests are read inside their own cards, so a refresh updates their data and never rebuilds the form or the
/// requests table (what is typed, the focus, an open history and the last answer stay as they are).
#[component]
pub fn TenantPage() -> impl IntoView {
    let params = use_params_map();
    let draft = crate::pages::quotas::AskDraft::new();
    provide_context(draft);
    let session = expect_context::<crate::widgets::SessionResource>();
    // `/t/vision` or `/t/<id>`: the API takes either for the tenant itself; the other reads need its id.
    let tenant_id = move || params.read().get("tenant").unwrap_or_default();
    let tenant = Resource::new(tenant_id, |id| api::get_json::<TenantView>(format!("/api/v1/tenants/{id}")));
    let quotas = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        api::get_json::<QuotaView>(format!("/api/v1/tenants/{id}/quotas")).await
    });
    let requests = Resource::new(tenant_id, |key| async move {
        let id = tenant_key(key).await?;
        api::get_json::<RequestPage>(format!("/api/v1/requests?tenant={id}&limit=500")).await
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
                                <RequestForm tenant=t.clone() quotas=latest_quotas.into() on_done />
                            </div>
                        </div>
                        <crate::pages::governance::BudgetCard tenant=t.id.clone() tick=now />
                        <crate::pages::quotas::QuotaRequestsCard tenant=t.clone() can_ask />
                        <div class="card">
                            <h2>"Allocations"</h2>
                            <AllocationsList allocations />
                        </div>
                        <ReservationsCard tenant=t.clone() tick=now />
                        <div class="card">
                            <h2>"Requests"</h2>
                            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                                <RequestsTable requests waiting now=now.into() on_done />
                            </Transition>
                        </div>
                        <UsageCard tenant=t.id.clone() />
                        <crate::pages::governance::TimelineCard tenant=t.id.clone() />
                        <Glossary />
                    }.into_any()
                })}
            </Transition>
        </section>
    }
}

fn quota_view(bars: Vec<QuotaBar>, draft: Option<crate::pages::quotas::AskDraft>) -> AnyView {
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

/// The last 8 characters of an id (UUIDv7s share their first ones, the time).
pub fn short(id: &str) -> String {
    id.chars().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect()
}

#[component]
fn UsageCard(tenant: String) -> impl IntoView {
    let usage =
        Resource::new(move || tenant.clone(), |t| api::get_json::<UsageReport>(format!("/api/v1/usage?tenant={t}")));
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
    use tessera_api::tenants::QuotaLine;

    fn quotas(held: f64, limit: f64) -> QuotaView {
        QuotaView {
            tenant: "t".into(),
            resources: vec![QuotaLine {
                resource: "compute_slices".into(),
                held,
                limit: Some(limit),
                over: held > limit,
                maximum: None,
                lending_limit: None,
                borrowed: 0.0,
                available: Some((limit - held).max(0.0)),
            }],
        }
    }

    fn request(state: RequestState, profile: &str, count: u32) -> RequestView {
        RequestView {
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
            priority: Default::default(),
            borrowed: false,
            reclaim_at_ms: None,
            reclaim_for: None,
            waiting: None,
        }
    }

    #[test]
    fn bars_split_what_is_held_into_used_and_pending() {
        // 3 compute slices held: a pending 2g (2) and an active 1g (1).
        let reqs = [request(RequestState::Pending, "2g.20gb", 1), request(RequestState::Active, "1g.10gb", 1)];
        let bars = quota_bars(&quotas(3.0, 7.0), &reqs);
        let bar = bars.iter().find(|b| b.resource == "compute_slices").expect("bar");
        assert_eq!((bar.used, bar.pending, bar.limit), (1000, 2000, Some(7000)));
        let (u, p) = bar.widths().expect("limited");
        assert!((u - 14.28).abs() < 0.1 && (p - 28.57).abs() < 0.1, "{u} {p}");
        assert_eq!(bar.text(), "1 of 7 slices used · 2 pending");
        // Unlimited: no bar to fill, and the amount rounded with its unit.
        let free = QuotaBar {
            resource: "memory_gib".into(),
            name: "GPU memory".into(),
            unit: "GiB",
            used: 19_625,
            pending: 0,
            limit: None,
            maximum: None,
            over: false,
        };
        assert_eq!((free.widths(), free.text()), (None, "19.6 GiB used · no limit".to_string()));
        // In a cohort: the bar runs to the maximum, the guarantee marked on it, and what is above it borrowed.
        let cohort = QuotaBar { used: 9_000, pending: 0, limit: Some(7_000), maximum: Some(14_000), ..free.clone() };
        assert_eq!(cohort.text(), "9 of 7 GiB used · 2 borrowed (at most 14)");
        assert_eq!((cohort.widths(), cohort.limit_mark()), (Some((9.0 / 14.0 * 100.0, 0.0)), Some(50.0)));
        let lender = QuotaBar { used: 3_000, ..cohort };
        assert_eq!(lender.text(), "3 of 7 GiB used · up to 14 with the cohort");
    }

    #[test]
    fn feedback_is_the_core_quota_check_and_policy() {
        let policy = tessera_core::quota::ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 2 };
        let spec = SliceSpec::Mig { profile: "1g.10gb".into(), model: Some("H100-80GB".into()) };
        let f = feedback(&spec, 2, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::AutoApprove));
        let slices = f.charges.iter().find(|c| c.key == "compute_slices").expect("compute slices charged");
        assert_eq!(
            (slices.name.as_str(), slices.amount.as_str(), slices.left.as_deref()),
            ("Compute slices", "2 slices", Some("2 slices"))
        );
        let f = feedback(&spec, 3, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, Some(Decision::NeedsAdmin));
        let f = feedback(&spec, 5, &quotas(3.0, 7.0), policy);
        assert_eq!(f.decision, None);
        assert_eq!(
            f.over,
            vec!["Compute slices: 3 held and 5 asked for would pass the limit of 7 slices.".to_string()]
        );
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
