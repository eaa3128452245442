//! Quota governance in the portal: a tenant's quota over time (limit, maximum, held, used, hour by hour) and its
//! budgets this month (on the tenant's page); budgets set by platform admins (on the admin tenant page); and where
//! every tenant stands (`/admin/quotas`): who borrows, who waits within its guarantee, who holds quota it does not
//! use, how far budgets are spent.

use leptos::prelude::*;
use leptos_router::components::A;
use tessera_api::budgets::{BudgetLevel, BudgetPolicy, BudgetUpdate, BudgetView};
use tessera_api::quotas::{QuotaStanding, QuotaTimeline, TenantStanding};
use tessera_api::tenants::QuotaView;

use crate::api::{self, ProblemExt};
use crate::widgets::problem_view;

/// Chart width and height, in SVG units.
const W: f64 = 720.0;
const H: f64 = 150.0;

/// What a timeline chart draws: SVG paths in a `W` x `H` box, and the amount at the top.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChartPaths {
    /// The held area (a closed path).
    pub held: String,
    /// The used area (a closed path).
    pub used: String,
    /// The limit, as steps (empty where there is none).
    pub limit: String,
    /// The maximum, as steps.
    pub maximum: String,
    /// The amount the chart's top stands for.
    pub top: f64,
}

fn x(i: usize, n: usize) -> f64 {
    i as f64 / n.max(1) as f64 * W
}

/// The chart of a timeline: areas for held and used, step lines for the limit and the maximum, scaled so the
/// largest of them fits.
pub fn chart(tl: &QuotaTimeline) -> ChartPaths {
    let n = tl.held.len();
    let highest = tl
        .peak_held
        .iter()
        .chain(&tl.used)
        .chain(tl.limit.iter().flatten())
        .chain(tl.maximum.iter().flatten())
        .fold(0.0f64, |a, &b| a.max(b));
    let top = if highest <= 0.0 { 1.0 } else { highest * 1.1 };
    let y = |v: f64| H - (v / top * H).clamp(0.0, H);
    let area = |values: &[f64]| -> String {
        if values.is_empty() {
            return String::new();
        }
        let mut d = format!("M0,{H:.1}");
        for (i, v) in values.iter().enumerate() {
            d.push_str(&format!(" L{:.1},{:.1} L{:.1},{:.1}", x(i, n), y(*v), x(i + 1, n), y(*v)));
        }
        d.push_str(&format!(" L{W:.1},{H:.1} Z"));
        d
    };
    let steps = |values: &[Option<f64>]| -> String {
        let mut d = String::new();
        let mut drawing = false;
        for (i, v) in values.iter().enumerate() {
            match v {
                Some(v) => {
                    let verb = if drawing { 'L' } else { 'M' };
                    d.push_str(&format!("{verb}{:.1},{:.1} L{:.1},{:.1} ", x(i, n), y(*v), x(i + 1, n), y(*v)));
                    drawing = true;
                }
                None => drawing = false,
            }
        }
        d.trim_end().to_string()
    };
    ChartPaths { held: area(&tl.held), used: area(&tl.used), limit: steps(&tl.limit), maximum: steps(&tl.maximum), top }
}

/// The timeline in a sentence: `Peak held 6 of a limit of 7 in 30 days; 2.3 used on average; 1 never used.`
pub fn summary_text(tl: &QuotaTimeline, days: u32) -> String {
    let n = |v: f64| tessera_core::clock::rounded(v, 1);
    let s = &tl.summary;
    let mut text = match s.limit {
        Some(l) => format!("Peak held {} of a limit of {} in {days} days", n(s.peak_held), n(l)),
        None => format!("Peak held {} in {days} days (no limit)", n(s.peak_held)),
    };
    text.push_str(&format!("; {} used on average", n(s.mean_used)));
    if let Some(never) = s.never_used.filter(|v| *v > 0.0) {
        text.push_str(&format!("; {} of the limit never used", n(never)));
    }
    text.push('.');
    text
}

/// A tenant's quota over time, one resource at a time (the resources it has a limit on or holds).
#[component]
pub fn TimelineCard(tenant: String) -> impl IntoView {
    let resource = RwSignal::new("compute_slices".to_string());
    let days = RwSignal::new(30u32);
    let tenant = StoredValue::new(tenant);
    let keys = Resource::new(
        move || tenant.get_value(),
        |t| async move {
            let q = api::get_json::<QuotaView>(format!("/api/v1/tenants/{t}/quotas")).await?;
            let mut keys: Vec<String> = q.resources.into_iter().map(|l| l.resource).collect();
            if !keys.iter().any(|k| k == "compute_slices") {
                keys.insert(0, "compute_slices".to_string());
            }
            Ok::<_, api::Problem>(keys)
        },
    );
    let timeline = Resource::new(
        move || (resource.get(), days.get()),
        move |(r, d)| {
            api::get_json::<QuotaTimeline>(format!(
                "/api/v1/tenants/{}/quota-timeline?resource={}&days={d}",
                tenant.get_value(),
                crate::pages::shared::encode(&r)
            ))
        },
    );
    view! {
        <div class="card" data-testid="quota-timeline">
            <div class="title-row">
                <h2>"Quota over time"</h2>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        let options = keys.await.unwrap_or_default();
                        view! {
                            <label class="small">"Resource "
                                <select name="timeline-resource" on:change=move |ev| resource.set(event_target_value(&ev))>
                                    {options.into_iter().map(|r| {
                                        let selected = r == "compute_slices";
                                        view! { <option value=r.clone() selected=selected>{r.clone()}</option> }
                                    }).collect_view()}
                                </select>
                            </label>
                        }
                    })}
                </Transition>
                <label class="small">"Days "
                    <select name="timeline-days" on:change=move |ev| days.set(event_target_value(&ev).parse().unwrap_or(30))>
                        <option value="7">"7"</option>
                        <option value="30" selected>"30"</option>
                        <option value="90">"90"</option>
                    </select>
                </label>
            </div>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match timeline.await {
                        Err(p) => problem_view(&p),
                        Ok(tl) => {
                            let c = chart(&tl);
                            let text = summary_text(&tl, days.get_untracked());
                            let hours = tl.held.len();
                            let top = tessera_core::clock::rounded(c.top, 1);
                            let label = format!("{}: limit, held and used, hour by hour. {text}", tl.resource);
                            view! {
                                <svg class="timeline" viewBox=format!("0 0 {W} {H}") preserveAspectRatio="none" role="img" aria-label=label
                                    data-hours=hours.to_string() data-peak=tl.summary.peak_held.to_string()>
                                    <path class="held" d=c.held />
                                    <path class="used" d=c.used />
                                    <path class="maximum" d=c.maximum fill="none" />
                                    <path class="limit" d=c.limit fill="none" />
                                </svg>
                                <p class="legend small">
                                    <span class="key held"></span>"held "<span class="key used"></span>"used "
                                    <span class="key limit"></span>"limit "<span class="key maximum"></span>"maximum (borrowing) · top "{top}
                                </p>
                                <p class="small" data-testid="timeline-summary">{text}</p>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </div>
    }
}

/// A budget level in words and as a CSS class.
pub fn level_name(level: BudgetLevel) -> &'static str {
    match level {
        BudgetLevel::Ok => "ok",
        BudgetLevel::Warning => "warning",
        BudgetLevel::Exhausted => "exhausted",
    }
}

/// A budget level in words, and its CSS class.
pub fn level_words(level: BudgetLevel) -> (&'static str, &'static str) {
    match level {
        BudgetLevel::Ok => ("within budget", "lvl-ok"),
        BudgetLevel::Warning => ("80 % or more spent", "lvl-warn"),
        BudgetLevel::Exhausted => ("spent", "lvl-bad"),
    }
}

/// A budget line in words: `GPU-hours on H100-80GB: 85.3 of 100 spent this month (85 %)`.
pub fn budget_text(unit: &str, spent: f64, limit: f64, fraction: f64) -> String {
    let n = |v: f64| tessera_core::clock::rounded(v, 1);
    format!("{unit}: {} of {} spent this month ({:.0} %)", n(spent), n(limit), fraction * 100.0)
}

/// What the banner says at 80 % and 100 %, by policy; `None` below 80 %.
pub fn budget_banner(b: &BudgetView) -> Option<String> {
    let end = tessera_core::clock::utc_minute(b.month_end_ms);
    match (b.level, b.policy) {
        (BudgetLevel::Ok, _) => None,
        (BudgetLevel::Warning, _) => {
            Some("80 % or more of a budget is spent this month: plan what still needs to run.".to_string())
        }
        (BudgetLevel::Exhausted, BudgetPolicy::Warn) => Some(format!(
            "A budget is spent for this month: requests still go through, and the platform admins can see it. It \
             starts again on {end} (UTC)."
        )),
        (BudgetLevel::Exhausted, BudgetPolicy::Block) => Some(format!(
            "A budget is spent for this month: new requests that could spend from it are refused until {end} (UTC), \
             or until a platform admin raises it."
        )),
    }
}

/// A tenant's budgets this month, read again at each `tick` (the dashboard's refresh).
#[component]
pub fn BudgetCard(tenant: String, #[prop(into)] tick: Signal<i64>) -> impl IntoView {
    let budget = Resource::new(
        move || (tenant.clone(), tick.get()),
        |(t, _)| api::get_json::<BudgetView>(format!("/api/v1/tenants/{t}/budget")),
    );
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                match budget.await {
                    Err(p) => problem_view(&p),
                    Ok(b) if b.lines.is_empty() => ().into_any(),
                    Ok(b) => budget_view(b).into_any(),
                }
            })}
        </Transition>
    }
}

fn budget_view(b: BudgetView) -> impl IntoView {
    let banner = budget_banner(&b);
    let (words, class) = level_words(b.level);
    let policy = match b.policy {
        BudgetPolicy::Warn => "When a budget is spent the tenant and the platform admins are told; requests go on.",
        BudgetPolicy::Block => "When a budget is spent, new requests that could spend from it are refused.",
    };
    view! {
        <div class="card" data-testid="budget" data-level=level_name(b.level)>
            <h2>"Budget this month " <span class=format!("state {class}")>{words}</span></h2>
            {banner.map(|t| view! { <p class="notice" class:error=b.level == BudgetLevel::Exhausted role="status" data-testid="budget-banner">{t}</p> })}
            <ul class="bars">
                {b.lines.into_iter().map(|l| {
                    let text = budget_text(&l.label, l.spent, l.limit, l.fraction);
                    let (_, c) = level_words(l.level);
                    let width = (l.fraction * 100.0).clamp(0.0, 100.0);
                    view! {
                        <li data-unit=l.unit.clone() data-level=level_name(l.level)>
                            <div class="bar-head"><span>{l.label.clone()}</span><span class="muted" class:bad=l.level == BudgetLevel::Exhausted>{text.clone()}</span></div>
                            <div class="bar" role="img" aria-label=text><span class=format!("used {c}") style=format!("width:{width:.1}%")></span></div>
                        </li>
                    }
                }).collect_view()}
            </ul>
            <p class="muted small">{policy}</p>
        </div>
    }
}

/// The budget editor on the admin tenant page: the policy, and hours per unit (empty removes a budget).
#[component]
pub fn BudgetEditor(tenant: String) -> impl IntoView {
    let id = StoredValue::new(tenant);
    let budget =
        Resource::new(move || id.get_value(), |t| api::get_json::<BudgetView>(format!("/api/v1/tenants/{t}/budget")));
    let policy = RwSignal::new(String::new());
    let unit = RwSignal::new("compute_slice_hours".to_string());
    let hours = RwSignal::new(String::new());
    let message = RwSignal::new(None::<(bool, String)>);
    let send = move |body: BudgetUpdate| {
        leptos::task::spawn_local(async move {
            match api::send_json::<BudgetView>("PUT", format!("/api/v1/tenants/{}/budget", id.get_value()), body).await
            {
                Ok(_) => {
                    message.set(Some((true, "Budget saved.".into())));
                    hours.set(String::new());
                    budget.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let save = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut body = BudgetUpdate { policy: BudgetPolicy::parse(&policy.get_untracked()), ..Default::default() };
        let h = hours.get_untracked();
        let key = unit.get_untracked().trim().to_string();
        if !h.trim().is_empty() {
            match h.trim().parse::<f64>() {
                Ok(v) if v >= 0.0 => {
                    body.limits.insert(key, Some(v));
                }
                _ => {
                    message.set(Some((false, "A budget is a number of hours, 0 or more.".into())));
                    return;
                }
            }
        }
        send(body);
    };
    view! {
        <form class="card" data-testid="budget-form" on:submit=save>
            <h2>"Monthly budget"</h2>
            <p class="muted small">"Hours a UTC calendar month: compute-slice-hours over every model (compute_slice_hours), or GPU-hours on one model (gpu_hours/H100-80GB). From 80 % the tenant and the admins see a warning; at 100 % the policy decides."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match budget.await {
                        Err(p) => problem_view(&p),
                        Ok(b) => {
                            let current = b.policy.as_str();
                            view! {
                                <table data-testid="budget-lines">
                                    <thead><tr><th scope="col">"Budget"</th><th scope="col">"Spent"</th><th scope="col">""</th></tr></thead>
                                    <tbody>
                                        {b.lines.into_iter().map(|l| {
                                            let key = l.unit.clone();
                                            let text = budget_text(&l.label, l.spent, l.limit, l.fraction);
                                            view! {
                                                <tr data-unit=l.unit.clone()>
                                                    <td><code>{l.unit.clone()}</code></td>
                                                    <td>{text}</td>
                                                    <td><button type="button" class="link small" on:click=move |_| {
                                                        let mut body = BudgetUpdate::default();
                                                        body.limits.insert(key.clone(), None);
                                                        send(body);
                                                    }>"Remove"</button></td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table>
                                <label>"When a budget is spent "
                                    <select name="budget-policy" on:change=move |ev| policy.set(event_target_value(&ev))>
                                        <option value="warn" selected=current == "warn">"warn"</option>
                                        <option value="block" selected=current == "block">"block new requests"</option>
                                    </select>
                                </label>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
            <div class="row">
                <label>"Unit"<input name="budget-unit" type="text" bind:value=unit /></label>
                <label>"Hours a month"<input name="budget-hours" type="number" min="0" step="any" bind:value=hours /></label>
                <button type="submit" class="button">"Save"</button>
            </div>
            {move || message.get().map(|(ok, m)| view! { <p class=if ok { "ok-text small" } else { "error small" } role="status">{m}</p> })}
        </form>
    }
}

/// Where a tenant stands, in words: what stands out first.
pub fn standing_flags(t: &TenantStanding) -> Vec<String> {
    let mut flags = Vec::new();
    if t.starved {
        flags.push(format!(
            "{} waiting within its guarantee",
            crate::pages::count(u64::from(t.waiting_within_guarantee), "request")
        ));
    }
    if t.borrowing {
        flags.push("borrowing from its cohort".to_string());
    }
    if t.over_limit {
        flags.push("over its limit (new requests refused until it is back under)".to_string());
    }
    if t.being_reclaimed > 0 {
        flags.push(format!("{} being taken back", crate::pages::count(u64::from(t.being_reclaimed), "request")));
    }
    if t.idle_quota {
        flags.push("held under half its guarantee in 30 days".to_string());
    }
    match t.budget {
        BudgetLevel::Warning => flags.push("80 % of a budget spent".to_string()),
        BudgetLevel::Exhausted => flags.push("a budget spent".to_string()),
        BudgetLevel::Ok => {}
    }
    flags
}

/// `/admin/quotas`: where every tenant stands.
#[component]
pub fn StandingPage() -> impl IntoView {
    let standing = Resource::new(|| (), |_| api::get_json::<QuotaStanding>("/api/v1/quota-standing".into()));
    view! {
        <section class="page">
            <h1>"Quota standing"</h1>
            <p class="muted">"Who borrows from its cohort, who waits within its guarantee (starved), who holds quota it did not use in 30 days, and how far budgets are spent this month."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match standing.await {
                        Err(p) => problem_view(&p),
                        Ok(s) => view! {
                            <div class="card"><div class="table-wrap">
                            <table data-testid="standing">
                                <thead><tr>
                                    <th scope="col">"Tenant"</th><th scope="col">"Cohort"</th><th scope="col">"Compute slices held / limit (max)"</th>
                                    <th scope="col">"Peak · mean used, 30 days"</th><th scope="col">"Stands out"</th>
                                </tr></thead>
                                <tbody>
                                    {s.tenants.into_iter().map(|t| {
                                        let flags = standing_flags(&t);
                                        let n = |v: f64| tessera_core::clock::rounded(v, 1);
                                        let line = t.lines.iter().find(|l| l.resource == "compute_slices").cloned();
                                        let held = line.as_ref().map_or_else(|| "—".to_string(), |l| {
                                            let limit = l.limit.map_or_else(|| "no limit".to_string(), n);
                                            let max = l.maximum.map(|m| format!(" (max {})", n(m))).unwrap_or_default();
                                            let borrowed = if l.borrowed > 0.0 { format!(", {} borrowed", n(l.borrowed)) } else { String::new() };
                                            let over = if l.over > 0.0 { format!(", {} over", n(l.over)) } else { String::new() };
                                            format!("{} / {limit}{max}{borrowed}{over}", n(l.held))
                                        });
                                        let peak = line.as_ref().map_or_else(|| "—".to_string(), |l| format!("{} · {}", n(l.peak_held_30d), n(l.mean_used_30d)));
                                        let href = format!("/t/{}", t.name);
                                        let (name, row_name) = (t.name.clone(), t.name.clone());
                                        let cohort = t.cohort.clone().unwrap_or_else(|| "—".into());
                                        view! {
                                            <tr data-tenant=row_name data-starved=t.starved.to_string() data-borrowing=t.borrowing.to_string() data-idle=t.idle_quota.to_string()>
                                                <td><A href=href>{name}</A></td>
                                                <td>{cohort}</td>
                                                <td>{held}</td>
                                                <td>{peak}</td>
                                                <td class:warn-text=!flags.is_empty()>{if flags.is_empty() { "—".to_string() } else { flags.join("; ") }}</td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                            </div></div>
                        }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_api::quotas::TimelineSummary;

    fn timeline(held: Vec<f64>, used: Vec<f64>, limit: Vec<Option<f64>>) -> QuotaTimeline {
        let n = held.len();
        QuotaTimeline {
            tenant: "t".into(),
            resource: "compute_slices".into(),
            start_ms: 0,
            step_ms: 3_600_000,
            maximum: vec![None; n],
            peak_held: held.clone(),
            held,
            used,
            limit,
            summary: TimelineSummary {
                peak_held: 6.0,
                mean_held: 3.0,
                mean_used: 2.26,
                limit: Some(7.0),
                never_used: Some(1.0),
            },
        }
    }

    #[test]
    fn the_chart_scales_to_the_highest_line_and_steps_the_limit() {
        let tl = timeline(vec![0.0, 6.0], vec![0.0, 4.5], vec![None, Some(10.0)]);
        let c = chart(&tl);
        assert_eq!(c.top, 11.0, "10 % above the highest: the limit of 10");
        assert!(c.limit.starts_with("M360.0,"), "no limit in the first hour: {}", c.limit);
        assert!(c.held.starts_with("M0,150.0") && c.held.ends_with('Z'), "{}", c.held);
        assert_eq!(chart(&timeline(vec![0.0], vec![0.0], vec![None])).top, 1.0, "an empty chart still has a scale");
    }

    #[test]
    fn summaries_and_budgets_read_in_words() {
        let tl = timeline(vec![0.0], vec![0.0], vec![None]);
        assert_eq!(
            summary_text(&tl, 30),
            "Peak held 6 of a limit of 7 in 30 days; 2.3 used on average; 1 of the limit never used."
        );
        assert_eq!(
            budget_text("GPU-hours on H100-80GB", 85.26, 100.0, 0.8526),
            "GPU-hours on H100-80GB: 85.3 of 100 spent this month (85 %)"
        );
        let mut b = BudgetView {
            tenant: "t".into(),
            policy: BudgetPolicy::Block,
            month_start_ms: 0,
            month_end_ms: 2_678_400_000,
            level: BudgetLevel::Exhausted,
            lines: vec![],
        };
        assert!(budget_banner(&b).is_some_and(|t| t.contains("refused until 1970-02-01 00:00")));
        b.level = BudgetLevel::Ok;
        assert_eq!(budget_banner(&b), None);
    }
}
