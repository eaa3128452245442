//! `/usage`: usage and chargeback. GPU-hours per tenant or per profile over a period, as a chart and a table,
//! with the allocations behind them and a CSV export (the API's own `format=csv`). Allocations that are held but
//! idle (under N % utilisation for the last H hours) are highlighted; platform admins can reclaim them, which
//! releases the request with a reason the tenant sees. Members see their tenants only. Below them, right-sizing
//! (`GET /api/v1/rightsizing`): per active allocation its peak memory and 95th percentile utilisation, and the
//! smallest slice that would carry them with headroom.

use leptos::prelude::*;
use tessera_api::requests::{ReleaseBody, RequestView};
use tessera_api::rightsize::{Replacement, RightsizeAllocation, RightsizeBody, RightsizeReport, RightsizeVerdict};
use tessera_api::usage::UsageReport;

use crate::api::{self, ProblemExt};
use crate::pages::now_ms;
use crate::pages::shared::short;
use crate::widgets::{Glossary, Messages, SessionResource, problem_view};

const HOUR_MS: i64 = 3_600_000;

/// The usage query for a period of `days` ending at `now_ms` (rounded up to the minute, so that the server's
/// render and the browser's ask for the same thing).
pub fn usage_query(days: i64, now_ms: i64, idle_below: f64, idle_hours: f64) -> String {
    let to = (now_ms / 60_000 + 1) * 60_000;
    let from = to - days * 24 * HOUR_MS;
    format!("/api/v1/usage?from={from}&to={to}&idle_below={idle_below}&idle_hours={idle_hours}")
}

/// The page's read of `query`: its first [`PAGE_ROWS`] allocations in the attention order, or all of them.
pub fn page_query(query: &str, all: bool) -> String {
    if all { query.to_string() } else { format!("{query}&limit={PAGE_ROWS}") }
}

/// One bar: label, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// What it is.
    pub label: String,
    /// GPU-hours.
    pub value: f64,
}

/// The bars of a report, per tenant or per profile, largest first.
pub fn bars(report: &UsageReport, by_profile: bool) -> Vec<Bar> {
    let mut out: Vec<Bar> = if by_profile {
        report
            .profiles
            .iter()
            .map(|p| Bar { label: format!("{} {}", p.model, p.profile), value: p.gpu_hours })
            .collect()
    } else {
        report.tenants.iter().map(|t| Bar { label: t.tenant.clone(), value: t.gpu_hours }).collect()
    };
    out.sort_by(|a, b| b.value.total_cmp(&a.value).then_with(|| a.label.cmp(&b.label)));
    out
}

/// GPU-hours for people: whole above 100, one decimal above 10, two below.
pub fn hours(h: f64) -> String {
    let places = if h >= 100.0 {
        0
    } else if h >= 10.0 {
        1
    } else {
        2
    };
    tessera_core::clock::rounded(h, places)
}

/// How long something was held: `9 min`, `2.5 h`, `3 d 4 h`.
pub fn held(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        format!("{s:.0} s")
    } else if s < 3600.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 86_400.0 {
        format!("{} h", tessera_core::clock::rounded(s / 3600.0, 1))
    } else {
        format!("{} d {:.0} h", (s / 86_400.0).floor(), (s % 86_400.0) / 3600.0)
    }
}

/// Rows shown before "Show all".
pub const PAGE_ROWS: usize = 25;

/// The order of the allocations table: the API's attention order (idle ones first, then the other active ones,
/// then the rest; within each, the most GPU-hours first).
pub fn ordered(mut list: Vec<tessera_api::usage::AllocationUsage>) -> Vec<tessera_api::usage::AllocationUsage> {
    tessera_api::usage::attention_order(&mut list);
    list
}

/// A horizontal bar chart (SVG), widths relative to the largest bar.
fn chart(bars: &[Bar]) -> AnyView {
    let max = bars.iter().map(|b| b.value).fold(0.0, f64::max);
    let h = 26 * bars.len().max(1) as i32 + 4;
    let described =
        bars.iter().map(|b| format!("{}: {} GPU-hours", b.label, hours(b.value))).collect::<Vec<_>>().join("; ");
    view! {
        <svg class="chart" data-testid="usage-chart" viewBox=format!("0 0 640 {h}") width="100%" height=h role="img"
            aria-label=described>
            {bars.iter().enumerate().map(|(i, b)| {
                let w = if max > 0.0 { (b.value / max * 380.0).max(2.0) } else { 2.0 };
                let y = 26 * i as i32 + 4;
                view! {
                    <g>
                        <text x="0" y=y + 15 class="chart-label">{b.label.clone()}</text>
                        <rect x="200" y=y width=format!("{w:.1}") height="20" rx="3" class="chart-bar" />
                        <text x=format!("{:.1}", 206.0 + w) y=y + 15 class="chart-value">{hours(b.value)}</text>
                    </g>
                }
            }).collect_view()}
        </svg>
    }
    .into_any()
}

/// The usage page.
#[component]
pub fn UsagePage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let days = RwSignal::new(7i64);
    let idle_below = RwSignal::new(5.0f64);
    let idle_hours = RwSignal::new(2.0f64);
    let by_profile = RwSignal::new(false);
    let reason = RwSignal::new(String::new());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let show_all = RwSignal::new(false);
    let reclaimed = RwSignal::new(0u64);
    let path = Memo::new(move |_| usage_query(days.get(), now_ms(), idle_below.get(), idle_hours.get()));
    // The first rows only until "Show all": a fleet's month is tens of thousands of allocations.
    let report = Resource::new(move || page_query(&path.get(), show_all.get()), api::get_json::<UsageReport>);
    let reclaim = move |request: String| {
        let why = reason.get_untracked();
        if why.trim().is_empty() {
            messages.set(vec![(false, "Give a reason to reclaim: the tenant sees it.".into())]);
            return;
        }
        leptos::task::spawn_local(async move {
            let body = ReleaseBody { reason: Some(why.trim().to_string()) };
            match api::send_json::<RequestView>("POST", format!("/api/v1/requests/{request}/release"), body).await {
                Ok(r) => {
                    messages.set(vec![(true, format!("Reclaimed {}: the request is {}.", short(&r.id), r.state))]);
                    report.refetch();
                    reclaimed.update(|n| *n += 1);
                }
                Err(p) => messages.set(vec![(false, p.message())]),
            }
        });
    };
    let number = |signal: RwSignal<f64>| {
        move |ev: leptos::ev::Event| {
            if let Ok(v) = event_target_value(&ev).parse::<f64>() {
                signal.set(v);
            }
        }
    };
    view! {
        <section class="page">
            <div class="title-row">
                <h1>"Usage and chargeback"</h1>
                <a class="button" data-testid="csv" rel="external" download="" href=move || format!("{}&format=csv", path.get())>"Export CSV"</a>
            </div>
            <div class="card toolbar" data-testid="usage-controls">
                <label>"Period"
                    <select name="days" on:change=move |ev| { if let Ok(d) = event_target_value(&ev).parse() { days.set(d); } }>
                        <option value="1" selected=move || days.get() == 1>"Last 24 hours"</option>
                        <option value="7" selected=move || days.get() == 7>"Last 7 days"</option>
                        <option value="30" selected=move || days.get() == 30>"Last 30 days"</option>
                        <option value="90" selected=move || days.get() == 90>"Last 90 days"</option>
                    </select>
                </label>
                <fieldset class="modes">
                    <legend class="sr-only">"Group by"</legend>
                    <label><input type="radio" name="group" prop:checked=move || !by_profile.get() on:change=move |_| by_profile.set(false) />" per tenant"</label>
                    <label><input type="radio" name="group" prop:checked=move || by_profile.get() on:change=move |_| by_profile.set(true) />" per profile"</label>
                </fieldset>
                <label>"Idle below (%)"<input type="number" name="idle-below" min="0" max="100" step="1" prop:value=move || idle_below.get().to_string() on:change=number(idle_below) /></label>
                <label>"for (hours)"<input type="number" name="idle-hours" min="0.005" max="720" step="any" prop:value=move || idle_hours.get().to_string() on:change=number(idle_hours) /></label>
            </div>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let admin = session.await.is_ok_and(|s| s.user.platform_admin);
                    match report.await {
                        Err(p) => problem_view(&p),
                        Ok(r) => {
                            let idle = r.idle_count;
                            let has_idle = idle != 0;
                            let total: f64 = r.tenants.iter().map(|t| t.gpu_hours).sum();
                            let r2 = r.clone();
                            view! {
                                <div class="cards two">
                                    <div class="card">
                                        <h2>{move || if by_profile.get() { "GPU-hours per profile" } else { "GPU-hours per tenant" }}</h2>
                                        {move || chart(&bars(&r2, by_profile.get()))}
                                    </div>
                                    <div class="card">
                                        <h2>"Totals"</h2>
                                        <p class="big" data-testid="total-hours">{hours(total)}" GPU-hours"</p>
                                        <p class="muted">{format!("{} in the period", crate::pages::count(r.allocation_count as u64, "allocation"))}</p>
                                        <p class:warn-text=has_idle data-testid="idle-count">{format!("{idle} idle now (under {}% for {} h)", r.idle_below, r.idle_hours)}</p>
                                    </div>
                                </div>
                                <div class="card">
                                    <div class="table-wrap">
                                    <table data-testid="usage-groups">
                                        <thead><tr><th scope="col">{move || if by_profile.get() { "Profile" } else { "Tenant" }}</th><th scope="col">"Allocations"</th><th scope="col" title="Slice-hours: hours held times the compute slices held">"Slice-hours"</th><th scope="col" title="GPU-hours: hours held times the share of a whole GPU">"GPU-hours"</th></tr></thead>
                                        <tbody>
                                            {let r = r.clone(); move || if by_profile.get() {
                                                r.profiles.iter().map(|p| view! { <tr><td>{format!("{} {}", p.model, p.profile)}</td><td>{p.allocations}</td><td>{hours(p.slice_seconds / 3600.0)}</td><td>{hours(p.gpu_hours)}</td></tr> }).collect_view().into_any()
                                            } else {
                                                r.tenants.iter().map(|t| view! { <tr><td>{t.tenant.clone()}</td><td>{t.allocations}</td><td>{hours(t.slice_seconds / 3600.0)}</td><td>{hours(t.gpu_hours)}</td></tr> }).collect_view().into_any()
                                            }}
                                        </tbody>
                                    </table>
                                    </div>
                                </div>
                                <h2>"Allocations"</h2>
                                {admin.then(|| view! {
                                    <div class="toolbar">
                                        <label class="grow">"Reason (for reclaims)"<input type="text" name="reclaim-reason" bind:value=reason placeholder="e.g. idle for a day" /></label>
                                    </div>
                                })}
                                <Messages messages=messages />
                                <div class="table-wrap">
                                <table data-testid="usage-allocations">
                                    <thead><tr><th scope="col">"Tenant"</th><th scope="col">"Slice"</th><th scope="col">"Node"</th><th scope="col">"State"</th><th scope="col">"Held"</th><th scope="col" title="GPU-hours: hours held times the share of a whole GPU">"GPU-hours"</th><th scope="col" title="Mean utilisation of its device while held in this period, from the stored minutes">"Mean utilisation"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                    <tbody>
                                        {let rows = ordered(r.allocations.clone()); move || rows.iter().take(if show_all.get_untracked() { usize::MAX } else { PAGE_ROWS }).map(|a| {
                                            let request = a.request.clone();
                                            let can_reclaim = admin && a.state == "active";
                                            view! {
                                                <tr class:idle=a.idle data-allocation=a.allocation.clone() data-idle=a.idle.to_string() data-state=a.state.clone()>
                                                    <td>{a.tenant.clone()}</td>
                                                    <td>{format!("{} {}", a.model, a.profile)}</td>
                                                    <td>{a.node.clone()}</td>
                                                    <td>{a.state.clone()}{a.idle.then(|| view! { <span class="tag warn-text">" idle"</span> })}</td>
                                                    <td>{held(a.seconds)}</td>
                                                    <td>{hours(a.gpu_hours)}</td>
                                                    <td data-testid="util-in-period">{a.util_in_period.or(a.util_mean).map_or_else(|| "—".to_string(), |u| format!("{u:.1} %"))}</td>
                                                    <td class="actions">{can_reclaim.then(|| view! {
                                                        <button class="button small danger" data-testid="reclaim" on:click=move |_| reclaim(request.clone())>"Reclaim"</button>
                                                    })}</td>
                                                </tr>
                                            }
                                        }).collect_view().into_any()}
                                    </tbody>
                                </table>
                                </div>
                                {let n = r.allocation_count; (n > PAGE_ROWS).then(|| view! {
                                    <p class="more">
                                        <span class="muted">{move || if show_all.get_untracked() { format!("All {n} allocations") } else { format!("The first {PAGE_ROWS} of {n} allocations (idle and active first)") }}</span>" "
                                        <button class="button small" type="button" data-testid="show-all" on:click=move |_| show_all.update(|v| *v = !*v)>{move || if show_all.get_untracked() { "Show fewer" } else { "Show all" }}</button>
                                    </p>
                                })}
                                <Glossary />
                            }.into_any()
                        }
                    }
                })}
            </Transition>
            // Outside the usage report's transition: changing the period or reclaiming leaves its settings alone.
            <Rightsizing reclaimed=reclaimed />
        </section>
    }
}

/// What the right-sizing table says of one allocation's judgement.
pub fn verdict_text(a: &RightsizeAllocation) -> String {
    match a.verdict {
        RightsizeVerdict::Smaller => format!(
            "a {} would do: {} compute slices back, {} slice-hours a day",
            a.suggested_profile.as_deref().unwrap_or("smaller slice"),
            a.compute_slices_saved,
            a.slice_hours_saved_per_day
        ),
        RightsizeVerdict::RightSized => "right-sized".into(),
        RightsizeVerdict::AtLimit => "at its limit: it may want a larger slice".into(),
        RightsizeVerdict::NotEnoughData => "under an hour of telemetry".into(),
        RightsizeVerdict::SharedDevice => "shared GPU: not judged".into(),
        RightsizeVerdict::UnknownModel => "unknown model".into(),
    }
}

/// The verdict as the API spells it.
pub fn verdict_code(v: RightsizeVerdict) -> &'static str {
    match v {
        RightsizeVerdict::Smaller => "smaller",
        RightsizeVerdict::RightSized => "right_sized",
        RightsizeVerdict::AtLimit => "at_limit",
        RightsizeVerdict::NotEnoughData => "not_enough_data",
        RightsizeVerdict::SharedDevice => "shared_device",
        RightsizeVerdict::UnknownModel => "unknown_model",
    }
}

/// Memory in GiB with one decimal, or a dash.
fn gib(mib: Option<f64>) -> String {
    mib.map_or_else(|| "—".to_string(), |m| format!("{:.1} GiB", m / 1024.0))
}

/// Right-sizing of the active allocations the caller may see, over a window and with a headroom they choose.
#[component]
fn Rightsizing(
    /// Bumped by each reclaim on the page: the allocations changed, so the report is read again.
    reclaimed: RwSignal<u64>,
) -> impl IntoView {
    let days = RwSignal::new(7u32);
    let headroom = RwSignal::new(20.0f64);
    let report = Resource::new(
        move || (days.get(), headroom.get(), reclaimed.get()),
        |(d, h, _)| api::get_json::<RightsizeReport>(format!("/api/v1/rightsizing?days={d}&headroom_pct={h}")),
    );
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    // Optional for the tenant's members; a platform admin shrinking another tenant's request must give one.
    let reason = RwSignal::new(String::new());
    let asked = RwSignal::new(Vec::<String>::new());
    let resize = move |allocation: String, profile: String| {
        // Offered once: the button is off from the click, and back only if the server refused.
        asked.update(|a| a.push(allocation.clone()));
        leptos::task::spawn_local(async move {
            let why = reason.get_untracked();
            let why = (!why.trim().is_empty()).then(|| why.trim().to_string());
            let body = RightsizeBody { profile: profile.clone(), reason: why };
            let path = format!("/api/v1/allocations/{allocation}/rightsize");
            match api::send_json::<Replacement>("POST", path, body).await {
                Ok(r) => {
                    let text = format!(
                        "Asked for a {profile} (request {}, {}): request {} is released when it is active.",
                        short(&r.request.id),
                        r.request.state,
                        short(&r.replaces)
                    );
                    messages.set(vec![(true, text)]);
                    report.refetch();
                }
                Err(p) => {
                    asked.update(|a| a.retain(|x| *x != allocation));
                    messages.set(vec![(false, p.message())]);
                }
            }
        });
    };
    view! {
        <h2 id="rightsizing">"Right-sizing"</h2>
        <div class="card" data-testid="rightsizing">
            <div class="toolbar">
                <label>"Over"
                    <select name="rightsize-days" on:change=move |ev| { if let Ok(d) = event_target_value(&ev).parse() { days.set(d); } }>
                        <option value="1" selected=move || days.get() == 1>"the last day"</option>
                        <option value="7" selected=move || days.get() == 7>"the last 7 days"</option>
                        <option value="30" selected=move || days.get() == 30>"the last 30 days"</option>
                    </select>
                </label>
                <label class="grow">"Reason (shown to approvers and the tenant)"<input type="text" name="rightsize-reason" bind:value=reason placeholder="needed when it is not your tenant" /></label>
                <label>"Headroom (%)"<input type="number" name="rightsize-headroom" min="0" max="100" step="5" prop:value=move || headroom.get().to_string()
                    on:change=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<f64>() && (0.0..=100.0).contains(&v) { headroom.set(v); } } /></label>
            </div>
            <Messages messages=messages />
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match report.await {
                        Err(p) => problem_view(&p),
                        Ok(r) => view! {
                            <p data-testid="rightsize-summary" class:warn-text=r.smaller != 0>{format!(
                                "{} of {} could be smaller with {}% headroom: {} compute slices back, {} slice-hours a day.",
                                r.smaller, crate::pages::count(r.allocations.len() as u64, "active allocation"), r.headroom_pct,
                                r.compute_slices_saved, r.slice_hours_saved_per_day)}</p>
                            <div class="table-wrap">
                            <table data-testid="rightsize-allocations">
                                <thead><tr><th scope="col">"Tenant"</th><th scope="col">"Slice"</th><th scope="col">"Node"</th><th scope="col" title="Highest memory in use in the window">"Peak memory"</th><th scope="col" title="95th percentile of the one-minute mean utilisation, of what it holds">"p95 utilisation"</th><th scope="col">"Verdict"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                                <tbody>
                                    {r.allocations.iter().take(PAGE_ROWS).map(|a| view! {
                                        <tr data-allocation=a.allocation.clone() data-verdict=verdict_code(a.verdict) data-suggested=a.suggested_profile.clone().unwrap_or_default()>
                                            <td>{a.tenant.clone()}</td>
                                            <td>{format!("{} {}", a.model, a.held)}</td>
                                            <td>{a.node.clone()}</td>
                                            <td>{format!("{} of {}", gib(a.peak_mem_mib), gib(Some(a.memory_mib)))}</td>
                                            <td>{a.p95_util_pct.map_or_else(|| "not measured".to_string(), |u| format!("{u:.1} %"))}</td>
                                            <td class:ok-text=a.verdict == RightsizeVerdict::Smaller>{verdict_text(a)}</td>
                                            <td class="actions">{a.suggested_profile.clone().map(|to| {
                                                let (allocation, label) = (a.allocation.clone(), format!("Request a {to}"));
                                                let done = allocation.clone();
                                                view! {
                                                    <button class="button small" data-testid="resize" title="Ask for the smaller slice; this one is released when it is active"
                                                        prop:disabled=move || asked.get().contains(&done)
                                                        on:click=move |_| resize(allocation.clone(), to.clone())>{label}</button>
                                                }
                                            })}</td>
                                        </tr>
                                    }).collect_view()}
                                </tbody>
                            </table>
                            </div>
                            {let n = r.allocations.len(); (n > PAGE_ROWS).then(|| view! {
                                <p class="more muted">{format!("The first {PAGE_ROWS} of {n} (those that could be smaller first); `tessera request rightsize` lists all.")}</p>
                            })}
                        }.into_any(),
                    }
                })}
            </Transition>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::usage::{ProfileUsage, TenantUsage};

    #[test]
    fn the_query_is_stable_within_a_minute() {
        let a = usage_query(7, 1_700_000_040_500, 5.0, 2.0);
        assert_eq!(a, usage_query(7, 1_700_000_099_000, 5.0, 2.0));
        assert!(a.contains("idle_below=5&idle_hours=2"), "{a}");
        assert!(a.contains(&format!("from={}", 1_700_000_100_000 - 7 * 24 * HOUR_MS)), "{a}");
        assert_eq!(page_query(&a, false), format!("{a}&limit={PAGE_ROWS}"));
        assert_eq!(page_query(&a, true), a);
    }

    #[test]
    fn bars_are_per_tenant_or_per_profile_largest_first() {
        let t = |n: &str, h: f64| TenantUsage {
            tenant_id: n.into(),
            tenant: n.into(),
            allocations: 1,
            slice_seconds: h * 3600.0,
            gpu_hours: h,
        };
        let report = UsageReport {
            from_ms: 0,
            to_ms: 1,
            tenants: vec![t("a", 1.0), t("b", 3.0)],
            profiles: vec![ProfileUsage {
                model: "H100-80GB".into(),
                profile: "3g.40gb".into(),
                allocations: 2,
                slice_seconds: 0.0,
                gpu_hours: 4.0,
            }],
            allocations: vec![],
            allocation_count: 0,
            idle_count: 0,
            idle_below: 5.0,
            idle_hours: 2.0,
        };
        assert_eq!(bars(&report, false).iter().map(|b| b.label.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(bars(&report, true)[0], Bar { label: "H100-80GB 3g.40gb".into(), value: 4.0 });
        assert_eq!(
            (hours(0.0123), hours(0.162), hours(2.26), hours(12.26), hours(250.4)),
            ("0.01".into(), "0.16".into(), "2.26".into(), "12.3".into(), "250".into())
        );
        assert_eq!(
            (held(40.0), held(583.0), held(9000.0), held(3.0 * 86_400.0 + 4.0 * 3600.0)),
            ("40 s".into(), "10 min".into(), "2.5 h".into(), "3 d 4 h".into())
        );
    }
}
