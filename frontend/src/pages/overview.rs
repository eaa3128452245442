//! `/`: who you are, your tenants, and the fleet at a glance.
//!
//! Platform admins: capacity per GPU model in compute slices (allocated, free, stranded: free but out of reach of
//! any instance under the GPU's MIG layout, unavailable: on cordoned GPUs or nodes that are not ready), fleet utilisation now and hour by hour over 24 h, idle allocations, the requests and
//! layout changes waiting for them, the nodes needing attention, and efficiency (`GET /api/v1/efficiency`: MIG
//! compute slices placeable or stranded for the profiles asked for, and per tenant what it used of what it held). Members: per tenant, its slices, its pending
//! requests and its compute-slice quota.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::allocations::AllocationView;
use tessera_api::efficiency::{EfficiencyDay, EfficiencyHistory, EfficiencyReport, ModelPrice, Prices, PricesBody};
use tessera_api::layouts::{DefragQuery, DefragReport, LayoutView};
use tessera_api::nodes::NodeView;
use tessera_api::requests::RequestPage;
use tessera_api::telemetry::Heatmap;
use tessera_api::tenants::QuotaView;
use tessera_api::usage::UsageReport;
use tessera_core::catalog::Catalog;

use crate::api::{self, ProblemExt};
use crate::widgets::{SessionResource, TenantsResource, problem_view};
use crate::wire::role_label;

/// Counts for the fleet summary.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FleetSummary {
    /// Nodes.
    pub nodes: usize,
    /// Nodes `ready`.
    pub ready: usize,
    /// Nodes needing attention (`failed`, `not-ready`).
    pub attention: usize,
    /// GPUs cordoned (by an admin, a drain or their health) on nodes not counted in `attention`.
    pub cordoned_gpus: usize,
    /// GPUs whose health is not `healthy` (degraded or unhealthy) on nodes not counted in `attention`.
    pub sick_gpus: usize,
    /// GPUs.
    pub gpus: usize,
    /// MIG instances the agents report.
    pub instances: usize,
}

/// A node that needs attention as a whole: `failed` or `not-ready`.
fn down(n: &NodeView) -> bool {
    matches!(n.state.as_str(), "failed" | "not-ready")
}

impl FleetSummary {
    /// What needs attention: nodes down, then cordoned and unwell GPUs elsewhere (a GPU both cordoned and unwell is
    /// counted once). `(count, words)`, words empty when nothing does.
    pub fn attention_text(&self, nodes: &[NodeView]) -> (usize, String) {
        let gpus = nodes
            .iter()
            .filter(|n| !down(n))
            .flat_map(|n| &n.gpus)
            .filter(|g| g.cordoned || g.health.state != tessera_core::health::HealthState::Healthy)
            .count();
        let plural = |n: usize, one: &str| if n == 1 { format!("1 {one}") } else { format!("{n} {one}s") };
        let mut parts = Vec::new();
        if self.attention > 0 {
            parts.push(format!("{} down", plural(self.attention, "node")));
        }
        if self.cordoned_gpus > 0 {
            parts.push(format!("{} cordoned", plural(self.cordoned_gpus, "GPU")));
        }
        if self.sick_gpus > 0 {
            parts.push(format!("{} not healthy", plural(self.sick_gpus, "GPU")));
        }
        (self.attention + gpus, parts.join(" · "))
    }

    /// Counts `nodes`.
    pub fn of(nodes: &[NodeView]) -> FleetSummary {
        FleetSummary {
            nodes: nodes.len(),
            ready: nodes.iter().filter(|n| n.state == "ready").count(),
            attention: nodes.iter().filter(|n| down(n)).count(),
            cordoned_gpus: nodes.iter().filter(|n| !down(n)).flat_map(|n| &n.gpus).filter(|g| g.cordoned).count(),
            sick_gpus: nodes
                .iter()
                .filter(|n| !down(n))
                .flat_map(|n| &n.gpus)
                .filter(|g| g.health.state != tessera_core::health::HealthState::Healthy)
                .count(),
            gpus: nodes.iter().map(|n| n.gpus.len()).sum(),
            instances: nodes.iter().flat_map(|n| &n.gpus).filter_map(|g| g.applied.as_ref()).map(Vec::len).sum(),
        }
    }
}

/// One GPU model's capacity, in compute slices.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Capacity {
    /// Catalog model key.
    pub model: String,
    /// GPUs.
    pub gpus: usize,
    /// Compute slices in all.
    pub total: f64,
    /// Held by allocations.
    pub allocated: f64,
    /// Not held, on cordoned GPUs or nodes that are not ready: nothing new lands there.
    pub unavailable: f64,
    /// Not held and placeable: in instances not held, or room for new ones.
    pub free: f64,
    /// Not held, on usable GPUs, and out of reach under the GPU's MIG layout (the core's `stranded_compute`): a
    /// layout change (or a whole-GPU use) is needed to use it.
    pub stranded: f64,
}

impl Capacity {
    /// `10 of 28 allocated · 17 free · 1 stranded · 4 GPUs`: parts that are 0 (stranded, unavailable) left out.
    pub fn text(&self) -> String {
        let n = |v: f64| tessera_core::clock::rounded(v, 1);
        let mut parts =
            vec![format!("{} of {} allocated", n(self.allocated), n(self.total)), format!("{} free", n(self.free))];
        if self.stranded > 0.0 {
            parts.push(format!("{} stranded", n(self.stranded)));
        }
        if self.unavailable > 0.0 {
            parts.push(format!("{} unavailable", n(self.unavailable)));
        }
        parts.push(crate::pages::count(self.gpus as u64, "GPU"));
        parts.join(" · ")
    }
}

/// Capacity per GPU model, largest first. A MIG instance holds its profile's compute slices; on a whole GPU an
/// exclusive allocation holds all of them and a share (`timeslice:<n>`, `mps:<n>`) one n-th.
pub fn capacity(nodes: &[NodeView], catalog: &Catalog) -> Vec<Capacity> {
    let mut out: Vec<Capacity> = Vec::new();
    for n in nodes {
        for g in &n.gpus {
            let Some(model) = catalog.model(&g.model) else { continue };
            let total = f64::from(model.compute_slices_total);
            let held: f64 = g
                .in_use
                .iter()
                .map(|u| match u.profile.split_once(':') {
                    Some((_, n)) => total / n.parse::<f64>().unwrap_or(1.0).max(1.0),
                    None if u.profile == "exclusive" => total,
                    None => model.profile(&u.profile).map_or(0.0, |p| f64::from(p.compute_slices)),
                })
                .sum::<f64>()
                .min(total);
            let usable = !g.cordoned && n.state != "not-ready" && n.state != "failed";
            let entry = match out.iter_mut().position(|c| c.model == model.key) {
                Some(i) => &mut out[i],
                None => {
                    out.push(Capacity { model: model.key.clone(), ..Capacity::default() });
                    out.last_mut().expect("just pushed")
                }
            };
            entry.gpus += 1;
            entry.total += total;
            entry.allocated += held;
            if usable {
                let stranded = if g.mig_enabled {
                    f64::from(tessera_core::layout::stranded_compute(model, &g.layout)).min(total - held)
                } else {
                    0.0
                };
                entry.free += total - held - stranded;
                entry.stranded += stranded;
            } else {
                entry.unavailable += total - held;
            }
        }
    }
    out.sort_by(|a, b| b.total.total_cmp(&a.total).then_with(|| a.model.cmp(&b.model)));
    out
}

/// The mean of each column over the GPU rows of a heatmap (`None` where no GPU has a sample); of a heatmap grouped
/// as the whole fleet (`group=fleet`, what the overview asks: a row per device of 10,000 GPUs would not fit one
/// answer), its one row.
pub fn fleet_means(h: &Heatmap) -> Vec<Option<f64>> {
    if let Some(groups) = &h.groups {
        let row = groups.iter().find(|g| g.key == "fleet");
        return (0..h.columns).map(|c| row.and_then(|g| g.values.get(c).copied().flatten()).map(f64::from)).collect();
    }
    (0..h.columns)
        .map(|c| {
            let v: Vec<f64> = h
                .rows
                .iter()
                .filter(|r| r.kind == "gpu")
                .filter_map(|r| r.values.get(c).copied().flatten())
                .map(f64::from)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        })
        .collect()
}

/// The overview.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let tenants = expect_context::<TenantsResource>();
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
    let glance = Resource::new(|| (), |_| glances());
    view! {
        <section class="page">
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let s = match session.await {
                        Ok(s) => s,
                        Err(p) => return view! { <h1>"Tessera"</h1><p class="lead">"GPU slices for every team: MIG instances, time-sliced and MPS shares, whole GPUs."</p>{problem_view(&p)} }.into_any(),
                    };
                    // The fleet is the platform admins' to see.
                    let names = tenants.await.unwrap_or_default();
                    // Members see their tenants with their role; platform admins every tenant.
                    let listed: Vec<(String, String, &'static str)> = if s.user.platform_admin {
                        names.iter().map(|t| (t.id.clone(), t.name.clone(), "")).collect()
                    } else {
                        s.memberships.iter().map(|m| {
                            let name = names.iter().find(|t| t.id == m.tenant).map_or_else(|| m.tenant.clone(), |t| t.name.clone());
                            (m.tenant.clone(), name, role_label(m.role))
                        }).collect()
                    };
                    let summary = if s.user.platform_admin {
                        Some(nodes.await.map(|n| { let f = FleetSummary::of(&n); let a = f.attention_text(&n); (f, a) }))
                    } else {
                        None
                    };
                    view! {
                        <h1>{format!("Hello, {}", s.user.name)}</h1>
                        <div class="cards">
                            <div class="card">
                                <h2>{if s.user.platform_admin { "Tenants" } else { "Your tenants" }}</h2>
                                {if listed.is_empty() {
                                    view! { <p class="muted">"You are not a member of any tenant yet."</p> }.into_any()
                                } else {
                                    view! {
                                        <ul class="plain" data-testid="tenants">
                                            {listed.into_iter().map(|(_, name, role)| view! { <li><A href=format!("/t/{name}")><strong>{name}</strong></A>" "<span class="muted">{role}</span></li> }).collect_view()}
                                        </ul>
                                    }.into_any()
                                }}
                            </div>
                            {summary.map(|summary| view! {
                            <div class="card" data-testid="fleet-summary">
                                <h2>"Fleet"</h2>
                                {match summary {
                                    Ok((f, (count, words))) => { let attention = count > 0; view! {
                                        <dl class="stats">
                                            <div><dt>"Nodes ready"</dt><dd>{format!("{} / {}", f.ready, f.nodes)}</dd></div>
                                            <div><dt>"Need attention"</dt><dd class:bad=attention data-testid="attention-count" title=words.clone()>{count}</dd></div>
                                            <div><dt>"GPUs"</dt><dd>{f.gpus}</dd></div>
                                            <div><dt>"MIG instances"</dt><dd>{f.instances}</dd></div>
                                        </dl>
                                        {(!words.is_empty()).then(|| view! { <p class="muted small" data-testid="attention-words">{words}</p> })}
                                        <A href="/fleet">"Open the fleet"</A>
                                    }.into_any() }
                                    Err(p) => problem_view(&p),
                                }}
                            </div>
                            })}
                        </div>
                        {if s.user.platform_admin {
                            view! { <AdminGlance nodes /> }.into_any()
                        } else {
                            let mut data = glance.await.unwrap_or_default();
                            let mine: Vec<(String, Option<Glance>)> = s.memberships.iter().map(|m| {
                                let name = names.iter().find(|t| t.id == m.tenant).map_or_else(|| m.tenant.clone(), |t| t.name.clone());
                                let at = data.iter().position(|(id, _)| *id == m.tenant);
                                (name, at.map(|i| data.swap_remove(i).1))
                            }).collect();
                            view! { <div class="cards" data-testid="member-glance">{mine.into_iter().map(|(name, data)| view! { <TenantGlance name data /> }).collect_view()}</div> }.into_any()
                        }}
                    }.into_any()
                })}
            </Suspense>
        </section>
    }
}

/// What a platform admin looks at first.
#[component]
fn AdminGlance(nodes: Resource<Result<Vec<NodeView>, api::Problem>>) -> impl IntoView {
    let now = crate::pages::now_ms();
    let day = Resource::new(
        || (),
        move |_| {
            api::get_json::<Heatmap>(format!(
                "/api/v1/telemetry/heatmap?metric=util&from={}&step=3600&group=fleet",
                now - 86_400_000
            ))
        },
    );
    let live = Resource::new(
        || (),
        move |_| {
            api::get_json::<Heatmap>(format!(
                "/api/v1/telemetry/heatmap?metric=util&from={}&step=60&group=fleet",
                now - 60_000
            ))
        },
    );
    let usage = Resource::new(
        || (),
        move |_| api::get_json::<UsageReport>(format!("/api/v1/usage?from={}&to={now}&limit=0", now - 86_400_000)),
    );
    let pending =
        Resource::new(|| (), |_| api::get_json::<RequestPage>("/api/v1/requests?state=pending&limit=500".into()));
    let layouts = Resource::new(|| (), |_| api::get_json::<Vec<LayoutView>>("/api/v1/layouts?state=proposed".into()));
    let quota_asks = Resource::new(
        || (),
        |_| {
            api::get_json::<tessera_api::quotas::QuotaRequestPage>(
                "/api/v1/quota-requests?state=pending&limit=500".into(),
            )
        },
    );
    let efficiency = Resource::new(|| (), |_| api::get_json::<EfficiencyReport>("/api/v1/efficiency".into()));
    view! {
        <div class="cards glance" data-testid="admin-glance">
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let list = match nodes.await { Ok(n) => n, Err(p) => return problem_view(&p) };
                    let caps = capacity(&list, Catalog::builtin());
                    // Nodes down, then GPUs cordoned or not healthy on the others: what "Need attention" counts.
                    let mut sick: Vec<(String, String)> = list.iter().filter(|n| down(n)).map(|n| (n.name.clone(), n.state.clone())).collect();
                    for n in list.iter().filter(|n| !down(n)) {
                        for g in n.gpus.iter().filter(|g| g.cordoned || g.health.state != tessera_core::health::HealthState::Healthy) {
                            let why = match (g.cordoned, g.health.state != tessera_core::health::HealthState::Healthy) {
                                (true, true) => format!("cordoned, {}", g.health.state.as_str()),
                                (true, false) => "cordoned".to_string(),
                                (false, _) => g.health.state.as_str().to_string(),
                            };
                            sick.push((format!("{} GPU {}", n.name, g.index), why));
                        }
                    }
                    view! {
                        <div class="card" data-testid="capacity">
                            <h2>"Capacity"</h2>
                            <p class="muted small">"Compute slices per GPU model"</p>
                            <ul class="bars">
                                {caps.into_iter().map(|c| {
                                    let pct = |v: f64| v / c.total.max(1.0) * 100.0;
                                    let label = c.text();
                                    view! {
                                        <li data-model=c.model.clone()>
                                            <div class="bar-head"><span>{c.model.clone()}</span><span class="muted">{label.clone()}</span></div>
                                            <div class="bar" role="img" aria-label=label>
                                                <span class="used" style=format!("width:{:.1}%", pct(c.allocated))></span>
                                                <span class="stranded" style=format!("width:{:.1}%", pct(c.stranded))></span>
                                                <span class="off" style=format!("width:{:.1}%", pct(c.unavailable))></span>
                                            </div>
                                        </li>
                                    }
                                }).collect_view()}
                            </ul>
                            <p class="legend small">
                                <span class="item"><span class="key used"></span>"allocated"</span>
                                <span class="item"><span class="key"></span>"free"</span>
                                <span class="item" title="Free compute slices that no MIG instance can reach under the GPU's current layout"><span class="key stranded"></span>"stranded"</span>
                                <span class="item" title="Not held, on cordoned GPUs or nodes that are not ready: nothing new lands there"><span class="key off"></span>"unavailable"</span>
                            </p>
                            <p class="muted small">"Stranded slices are free but out of reach of any MIG instance under the GPU's layout: a layout change (on the fleet page) frees them. Unavailable ones are on cordoned GPUs or nodes that are not ready."</p>
                        </div>
                        <div class="card" data-testid="attention">
                            <h2>"Needs attention"</h2>
                            {if sick.is_empty() {
                                view! { <p class="muted">"Every node is ready and every GPU in service."</p> }.into_any()
                            } else {
                                view! { <ul class="plain">{sick.into_iter().map(|(n, st)| view! { <li><A href="/fleet"><strong>{n}</strong></A>" "<span class="state failed">{st}</span></li> }).collect_view()}</ul> }.into_any()
                            }}
                        </div>
                    }.into_any()
                })}
            </Suspense>
            <div class="card" data-testid="utilisation">
                <h2>"Utilisation"</h2>
                <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                    {move || Suspend::new(async move {
                        let (d, l) = (day.await, live.await);
                        let now_pct = l.ok().and_then(|h| fleet_means(&h).into_iter().flatten().last());
                        let hours = d.map(|h| fleet_means(&h)).unwrap_or_default();
                        let day_mean = { let v: Vec<f64> = hours.iter().flatten().copied().collect(); (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64) };
                        view! {
                            <dl class="stats">
                                <div><dt>"Now (mean over GPUs)"</dt><dd data-testid="util-now">{now_pct.map_or_else(|| "—".to_string(), |v| format!("{v:.0} %"))}</dd></div>
                                <div><dt>"Last 24 h"</dt><dd>{day_mean.map_or_else(|| "—".to_string(), |v| format!("{v:.0} %"))}</dd></div>
                            </dl>
                            {sparkline(&hours)}
                            <A href="/heatmap">"Open utilisation"</A>
                        }.into_any()
                    })}
                </Suspense>
            </div>
            <div class="card" data-testid="waiting">
                <h2>"Waiting for you"</h2>
                <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                    {move || Suspend::new(async move {
                        let (r, l, u, q) = (pending.await, layouts.await, usage.await, quota_asks.await);
                        let requests = r.map(|p| p.items.len()).unwrap_or(0);
                        let quota = q.map(|p| p.items.len()).unwrap_or(0);
                        let layouts = l.map(|v| v.len()).unwrap_or(0);
                        let idle = u.map(|u| u.idle_count).unwrap_or(0);
                        view! {
                            <dl class="stats">
                                <div><dt>"Requests to approve"</dt><dd data-testid="waiting-requests">{requests}</dd></div>
                                <div><dt>"Quota requests"</dt><dd data-testid="waiting-quota-requests">{quota}</dd></div>
                                <div><dt>"Layout changes"</dt><dd data-testid="waiting-layouts">{layouts}</dd></div>
                                <div><dt>"Idle allocations"</dt><dd data-testid="idle-allocations" class:warn-text=idle != 0>{idle}</dd></div>
                            </dl>
                            <p><A href="/approvals">"Open approvals"</A>" · "<A href="/usage">"Idle allocations in usage"</A></p>
                        }.into_any()
                    })}
                </Suspense>
            </div>
            <div class="card" data-testid="efficiency">
                <h2>"Efficiency"</h2>
                <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                    {move || Suspend::new(async move {
                        let r = match efficiency.await { Ok(r) => r, Err(p) => return problem_view(&p) };
                        let pct = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{:.0} %", v * 100.0));
                        let currency = r.currency.clone();
                        let priced = currency.is_some();
                        let money = move |v: Option<f64>| match (&currency, v) {
                            (Some(c), Some(v)) => format!("{v:.2} {c}"),
                            _ => "—".to_string(),
                        };
                        let total_waste = money(r.waste_cost);
                        view! {
                            <p class="muted small">"MIG compute slices for the profiles asked for, and what tenants used of what they held over the last 24 h."</p>
                            <ul class="plain">
                                {r.models.into_iter().map(|m| {
                                    let free = m.placeable + m.stranded;
                                    let text = format!("{} allocated · {} placeable · {} stranded{}", m.allocated, m.placeable, m.stranded,
                                        if m.cordoned > 0 { format!(" · {} cordoned", m.cordoned) } else { String::new() });
                                    view! {
                                        <li data-model=m.model.clone() data-allocated=m.allocated data-placeable=m.placeable data-stranded=m.stranded data-cordoned=m.cordoned data-gpus=m.gpus
                                            title=format!("{} of {free} free slices cannot hold any profile asked for without moving someone", m.stranded)>
                                            <strong>{m.model.clone()}</strong>" "<span class="muted">{text}</span>
                                        </li>
                                    }
                                }).collect_view()}
                            </ul>
                            {if r.tenants.is_empty() {
                                view! { <p class="muted small">"Nothing was held in the last 24 h."</p> }.into_any()
                            } else {
                                view! {
                                    <table class="small">
                                        <thead><tr><th>"Tenant"</th><th>"Slice-hours held"</th><th>"Used"</th><th>"Idle"</th>
                                            {priced.then(|| view! { <th>"Cost"</th><th title="Measured GPU-hours left unused, at the model's price">"Waste"</th> })}</tr></thead>
                                        <tbody>
                                            {r.tenants.into_iter().map(|t| { let wasting = t.waste_cost.unwrap_or(0.0) > 0.0; view! {
                                                <tr data-tenant=t.tenant.clone()>
                                                    <td>{t.tenant.clone()}</td>
                                                    <td>{tessera_core::clock::rounded(t.held_slice_hours, 1)}</td>
                                                    <td data-testid="efficiency-used">{pct(t.efficiency)}</td>
                                                    <td class:warn-text=!t.idle_allocations.is_empty()>{t.idle_allocations.len()}</td>
                                                    {priced.then(|| view! {
                                                        <td data-testid="efficiency-cost">{money(t.held_cost)}</td>
                                                        <td data-testid="efficiency-waste" class:warn-text=wasting>{money(t.waste_cost)}</td>
                                                    })}
                                                </tr>
                                            }}).collect_view()}
                                        </tbody>
                                    </table>
                                    {priced.then(|| view! { <p class="small">"Waste over 24 h: "<strong data-testid="efficiency-waste-total">{total_waste.clone()}</strong></p> })}
                                }.into_any()
                            }}
                        }.into_any()
                    })}
                </Suspense>
            </div>
            <EfficiencyHistoryCard />
            <PriceList />
            <Defragmentation />
        </div>
    }
}

/// Days shown by the efficiency history chart.
const HISTORY_DAYS: u32 = 90;

/// One day's column of the history chart, in chart units (0-`CHART_H` from the top): the stacked compute slices
/// (allocated, placeable, stranded, cordoned, bottom up, scaled to the largest day shown) and the efficiency point.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryColumn {
    /// Which of the days given.
    pub index: usize,
    /// Days since the window's first day.
    pub slot: i64,
    /// Left edge.
    pub x: f64,
    /// Heights of allocated, placeable, stranded and cordoned.
    pub heights: [f64; 4],
    /// The efficiency's height from the bottom, when measured.
    pub efficiency: Option<f64>,
}

/// Chart width and height.
pub const CHART_W: f64 = 360.0;
/// Chart height.
pub const CHART_H: f64 = 120.0;

/// The chart's columns: one per day of the last `span` days ending at `today_ms`, placed by date (a day without a
/// record leaves a gap), stacked heights scaled so the largest day shown fills the chart.
pub fn history_columns(days: &[EfficiencyDay], today_ms: i64, span: u32) -> Vec<HistoryColumn> {
    let span = span.max(1);
    let width = CHART_W / f64::from(span);
    let first = today_ms - i64::from(span - 1) * 86_400_000;
    let total = |d: &EfficiencyDay| d.allocated + d.placeable + d.stranded + d.cordoned;
    let shown: Vec<(usize, &EfficiencyDay)> =
        days.iter().enumerate().filter(|(_, d)| d.day_ms >= first && d.day_ms <= today_ms).collect();
    let top = shown.iter().map(|(_, d)| total(d)).fold(0.0_f64, f64::max).max(1e-9);
    shown
        .into_iter()
        .map(|(index, d)| {
            let slot = (d.day_ms - first) / 86_400_000;
            let h = |v: f64| v.max(0.0) / top * CHART_H;
            HistoryColumn {
                index,
                slot,
                x: slot as f64 * width,
                heights: [h(d.allocated), h(d.placeable), h(d.stranded), h(d.cordoned)],
                efficiency: d.efficiency.map(|e| e.clamp(0.0, 1.0) * CHART_H),
            }
        })
        .collect()
}

/// The efficiency line's pieces as SVG `points`: consecutive measured days joined, a gap wherever a day is missing
/// or unmeasured.
pub fn efficiency_lines(columns: &[HistoryColumn], span: u32) -> Vec<String> {
    let width = CHART_W / f64::from(span.max(1));
    let mut lines: Vec<Vec<String>> = Vec::new();
    let mut last: Option<i64> = None;
    for c in columns {
        let Some(e) = c.efficiency else {
            last = None;
            continue;
        };
        let point = format!("{:.1},{:.1}", c.x + width / 2.0, CHART_H - e);
        match (last, lines.last_mut()) {
            (Some(prev), Some(line)) if prev + 1 == c.slot => line.push(point),
            _ => lines.push(vec![point]),
        }
        last = Some(c.slot);
    }
    lines.into_iter().map(|l| l.join(" ")).collect()
}

/// The fleet's efficiency per day over 90 days (`GET /api/v1/efficiency/history`): compute slices allocated,
/// placeable, stranded and cordoned as stacked columns (means over the day), the share used of what was measured as
/// a line, and what was wasted in all and on the newest day.
#[component]
fn EfficiencyHistoryCard() -> impl IntoView {
    let history = Resource::new(
        || (),
        |_| api::get_json::<EfficiencyHistory>(format!("/api/v1/efficiency/history?days={HISTORY_DAYS}")),
    );
    view! {
        <div class="card wide" data-testid="efficiency-history">
            <h2>"Efficiency, day by day"</h2>
            <Suspense fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let h = match history.await { Ok(h) => h, Err(p) => return problem_view(&p) };
                    if h.days.is_empty() {
                        return view! { <p class="muted">"Nothing recorded yet: the server samples the fleet every "{h.sample_minutes}" minutes."</p> }.into_any();
                    }
                    let today = h.from_ms + i64::from(HISTORY_DAYS - 1) * 86_400_000;
                    let columns = history_columns(&h.days, today, HISTORY_DAYS);
                    let label = format!("Compute slices and efficiency per day, {} days recorded", columns.len());
                    let width = CHART_W / f64::from(HISTORY_DAYS);
                    let lines = efficiency_lines(&columns, HISTORY_DAYS);
                    let currency = h.currency.clone();
                    let waste: Option<f64> = h.days.iter().filter_map(|d| d.waste_cost).reduce(|a, b| a + b);
                    let unpriced: f64 = h.days.iter().map(|d| d.unpriced_gpu_hours).sum();
                    let newest = h.days.last().cloned();
                    let pct = |v: Option<f64>| v.map_or_else(|| "—".to_string(), |v| format!("{:.0} %", v * 100.0));
                    view! {
                        <svg class="history" viewBox=format!("0 0 {CHART_W} {CHART_H}") preserveAspectRatio="none" role="img"
                            aria-label=label>
                            {columns.into_iter().map(|c| {
                                let d = &h.days[c.index];
                                let mut y = CHART_H;
                                let rects = ["allocated", "placeable", "stranded", "cordoned"].into_iter().zip(c.heights).map(|(class, ht)| {
                                    y -= ht;
                                    view! { <rect class=class x=format!("{:.2}", c.x) y=format!("{y:.2}") width=format!("{:.2}", (width - 0.5).max(0.5)) height=format!("{ht:.2}") /> }
                                }).collect_view();
                                let title = format!("{}: {:.1} allocated, {:.1} placeable, {:.1} stranded, {:.1} cordoned; used {}", d.day, d.allocated, d.placeable, d.stranded, d.cordoned, pct(d.efficiency));
                                view! {
                                    <g data-testid="history-day" data-day=d.day.clone() data-allocated=format!("{:.3}", d.allocated) data-stranded=format!("{:.3}", d.stranded) data-samples=d.samples>
                                        <title>{title}</title>
                                        {rects}
                                    </g>
                                }
                            }).collect_view()}
                            {lines.into_iter().map(|points| view! { <polyline class="efficiency" points=points fill="none" /> }).collect_view()}
                        </svg>
                        <p class="legend small">
                            <span class="item"><span class="key used"></span>"allocated"</span>
                            <span class="item"><span class="key"></span>"placeable"</span>
                            <span class="item"><span class="key stranded"></span>"stranded"</span>
                            <span class="item"><span class="key off"></span>"cordoned"</span>
                            <span class="item"><span class="key efficiency"></span>"used of measured"</span>
                        </p>
                        {newest.map(|d| {
                            let money = |v: Option<f64>| match (&currency, v) { (Some(c), Some(v)) => format!(" · waste {v:.2} {c}"), _ => String::new() };
                            view! {
                                <p class="small" data-testid="history-newest">
                                    <strong>{d.day.clone()}</strong>
                                    {format!(": {:.1} slice-hours held, {} used{}", d.held_slice_hours, pct(d.efficiency), money(d.waste_cost))}
                                </p>
                            }
                        })}
                        {match (&h.currency, waste) {
                            (Some(c), Some(w)) => view! {
                                <p class="small">{format!("Waste over the {} days recorded: ", h.days.len())}<strong data-testid="history-waste">{format!("{w:.2} {c}")}</strong>
                                    {(unpriced > 0.0).then(|| format!(" ({unpriced:.1} GPU-hours of unpriced models left out)"))}</p>
                            }.into_any(),
                            _ => view! { <p class="muted small">"Set prices per GPU-hour to see what the waste costs."</p> }.into_any(),
                        }}
                    }.into_any()
                })}
            </Suspense>
        </div>
    }
}

/// The price list (`GET`/`PUT /api/v1/prices`): a currency and a price per GPU-hour for each catalog model (empty:
/// unpriced). Saving replaces the list and reloads the efficiency figures' costs on the next visit.
#[component]
fn PriceList() -> impl IntoView {
    let version = RwSignal::new(0u32);
    let message = RwSignal::new(None::<(bool, String)>);
    let list = Resource::new(move || version.get(), |_| api::get_json::<Prices>("/api/v1/prices".into()));
    view! {
        <div class="card" data-testid="prices">
            <h2>"Prices"</h2>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let p = match list.await { Ok(p) => p, Err(e) => return problem_view(&e) };
                    let currency = RwSignal::new(p.currency.clone().unwrap_or_else(|| "EUR".to_string()));
                    let rows: Vec<(String, RwSignal<String>)> = Catalog::builtin().models.iter().map(|m| {
                        let now = p.models.iter().find(|x| x.model == m.key).map(|x| x.per_gpu_hour.to_string()).unwrap_or_default();
                        (m.key.clone(), RwSignal::new(now))
                    }).collect();
                    let save_rows = rows.clone();
                    let save = move |ev: leptos::ev::SubmitEvent| {
                        ev.prevent_default();
                        let mut models = Vec::new();
                        for (model, v) in &save_rows {
                            let text = v.get_untracked();
                            let text = text.trim();
                            if text.is_empty() {
                                continue;
                            }
                            match text.parse::<f64>() {
                                Ok(per_gpu_hour) if per_gpu_hour.is_finite() && per_gpu_hour >= 0.0 => models.push(ModelPrice { model: model.clone(), per_gpu_hour }),
                                _ => {
                                    message.set(Some((false, format!("The price of {model} is not a number of 0 or more (a dot for decimals)."))));
                                    return;
                                }
                            }
                        }
                        let body = PricesBody { currency: currency.get_untracked().trim().to_string(), models };
                        leptos::task::spawn_local(async move {
                            match api::send_json::<Prices>("PUT", "/api/v1/prices".into(), body).await {
                                Ok(p) if p.models.is_empty() => {
                                    message.set(Some((true, "Every price removed: nothing is costed.".to_string())));
                                    version.update(|v| *v += 1);
                                }
                                Ok(p) => {
                                    message.set(Some((true, format!("{} price(s) saved in {}.", p.models.len(), p.currency.unwrap_or_default()))));
                                    version.update(|v| *v += 1);
                                }
                                Err(e) => message.set(Some((false, e.message()))),
                            }
                        });
                    };
                    // The inputs are given their values once (written back on every keystroke, a field being typed
                    // would lose what was typed), and are text: a number field reads as empty when what it holds is
                    // not a number, which would silently remove that price.
                    view! {
                        <p class="muted small">"Per GPU-hour of a whole GPU; a slice costs its share. Empty: not priced."
                            {p.updated_by.clone().map(|by| format!(" Set by {by}."))}</p>
                        <form class="prices" on:submit=save>
                            <label>"Currency"<input type="text" name="currency" maxlength="3" size="4" prop:value=currency.get_untracked() on:input=move |ev| currency.set(event_target_value(&ev)) /></label>
                            {rows.into_iter().map(|(model, v)| view! {
                                <label data-model=model.clone()>{model.clone()}
                                    <input type="text" inputmode="decimal" name=format!("price-{model}") size="8" prop:value=v.get_untracked() on:input=move |ev| v.set(event_target_value(&ev)) />
                                </label>
                            }).collect_view()}
                            <button type="submit" data-testid="prices-save">"Save prices"</button>
                        </form>
                    }.into_any()
                })}
            </Transition>
            {move || message.get().map(|(ok, text)| view! { <p class:ok=ok class:error=!ok data-testid="prices-message">{text}</p> })}
        </div>
    }
}

/// Defragmentation (`GET` and `POST /api/v1/defragmentation`): how many GPUs would gain if their free part were laid
/// out again for the largest profile asked for on each model, with the fleet's figures, and one button that makes
/// the layout proposals (approved under Approvals like any other).
#[component]
fn Defragmentation() -> impl IntoView {
    let version = RwSignal::new(0u32);
    let message = RwSignal::new(None::<(bool, String)>);
    let report =
        Resource::new(move || version.get(), |_| api::get_json::<DefragReport>("/api/v1/defragmentation".into()));
    let propose = move |_| {
        leptos::task::spawn_local(async move {
            let r =
                api::send_json::<DefragReport>("POST", "/api/v1/defragmentation".into(), DefragQuery::default()).await;
            message.set(Some(match r {
                Ok(r) if r.gpus.is_empty() => {
                    (false, "No layout change proposed: the fleet changed meanwhile.".to_string())
                }
                Ok(r) => (
                    true,
                    format!(
                        "{} layout change{} proposed: approve {} under Approvals.",
                        r.gpus.len(),
                        if r.gpus.len() == 1 { "" } else { "s" },
                        if r.gpus.len() == 1 { "it" } else { "them" }
                    ),
                ),
                Err(p) => (false, p.message()),
            }));
            version.update(|v| *v += 1);
        });
    };
    view! {
        <div class="card" data-testid="defragmentation">
            <h2>"Defragmentation"</h2>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let r = match report.await { Ok(r) => r, Err(p) => return problem_view(&p) };
                    let waiting = r.skipped.iter().filter(|s| s.code == "layout_proposal_open").count();
                    let held_back = r.skipped.len() - waiting;
                    let note = view! {
                        {(waiting > 0).then(|| view! { <p class="muted small" data-testid="defrag-waiting">{format!("{waiting} GPU(s) have a layout change waiting for approval.")}</p> })}
                        {(held_back > 0).then(|| view! { <p class="muted small" title="Cordoned, on a node that is not ready, on auto-layout, or past the batch's limit">{format!("{held_back} GPU(s) that would gain are left out.")}</p> })}
                    };
                    if r.gpus.is_empty() {
                        return view! {
                            <p class="muted" data-testid="defrag-none">"No GPU's free instances can be laid out better for the profiles asked for."</p>
                            {note}
                        }.into_any();
                    }
                    let more = r.gpus.len().saturating_sub(6);
                    view! {
                        <p class="muted small">"Free instances and free units laid out again for the largest profile asked for on each model; every instance held stays where it is."</p>
                        <dl class="stats">
                            <div><dt>"GPUs that gain"</dt><dd data-testid="defrag-gpus">{r.gpus.len()}</dd></div>
                            <div><dt>"Free target instances"</dt><dd data-testid="defrag-target">{format!("{} → {}", r.before.target_instances, r.after.target_instances)}</dd></div>
                            <div title="Free compute slices a request gets only after a layout change"><dt>"Slices needing a layout change"</dt><dd data-testid="defrag-not-ready">{format!("{} → {}", r.before.not_ready_slices, r.after.not_ready_slices)}</dd></div>
                        </dl>
                        <ul class="plain small">
                            {r.gpus.iter().take(6).map(|g| view! {
                                <li data-gpu=g.gpu.clone()>
                                    <strong>{format!("{} · {}", g.node, g.model)}</strong>" "
                                    <span class="muted">{format!("{} free {} → {}", g.target, g.before.target_instances, g.after.target_instances)}</span>
                                </li>
                            }).collect_view()}
                        </ul>
                        {(more > 0).then(|| view! { <p class="muted small">{format!("and {more} more")}</p> })}
                        {note}
                        {(r.stranded_slices > 0).then(|| view! { <p class="muted small">{format!("{} free slices stay out of reach: only moving an instance in use frees them.", r.stranded_slices)}</p> })}
                        <button type="button" data-testid="defrag-propose" on:click=propose>"Propose these layouts"</button>
                    }.into_any()
                })}
            </Transition>
            {move || message.get().map(|(ok, text)| view! { <p class:ok=ok class:error=!ok data-testid="defrag-message">{text}" "{ok.then(|| view! { <A href="/approvals">"Approvals"</A> })}</p> })}
        </div>
    }
}

/// 24 hourly means as a small SVG line (gaps where nothing was sampled).
fn sparkline(values: &[Option<f64>]) -> AnyView {
    if values.iter().all(Option::is_none) {
        return view! { <p class="muted small">"No samples in the last 24 h yet."</p> }.into_any();
    }
    let n = values.len().max(2) as f64 - 1.0;
    let points: String = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", i as f64 / n * 240.0, 40.0 - v.clamp(0.0, 100.0) * 0.38)))
        .collect::<Vec<_>>()
        .join(" ");
    view! {
        <svg class="sparkline" viewBox="0 0 240 42" width="240" height="42" role="img" aria-label="Fleet utilisation, hour by hour, over the last 24 hours">
            <polyline points=points fill="none" stroke="currentColor" stroke-width="1.5" />
        </svg>
    }
    .into_any()
}

/// What a member sees of one tenant: its allocations, how many requests wait, its quota.
type Glance = (Vec<AllocationView>, usize, QuotaView);

/// Every tenant of a member at a glance, read in one resource at the page's top (no resource is created inside a
/// suspended part of the page, whose streaming order could differ from the browser's hydration order).
async fn glances() -> Result<Vec<(String, Glance)>, api::Problem> {
    let s = api::get_json::<tessera_api::signin::SessionView>("/api/v1/session".into()).await?;
    if s.user.platform_admin {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for m in &s.memberships {
        let id = &m.tenant;
        let allocations = api::get_json::<Vec<AllocationView>>(format!("/api/v1/allocations?tenant={id}")).await?;
        let pending =
            api::get_json::<RequestPage>(format!("/api/v1/requests?tenant={id}&state=pending&limit=500")).await?;
        let quota = api::get_json::<QuotaView>(format!("/api/v1/tenants/{id}/quotas")).await?;
        out.push((id.clone(), (allocations, pending.items.len(), quota)));
    }
    Ok(out)
}

/// One tenant at a glance, for its members.
#[component]
fn TenantGlance(name: String, data: Option<Glance>) -> impl IntoView {
    let href = format!("/t/{name}");
    let tenant_attr = name.clone();
    view! {
        <div class="card" data-testid="tenant-glance" data-tenant=tenant_attr>
            <h2><A href=href>{name}</A></h2>
            {match data {
                None => view! { <p class="muted">"Not readable now."</p> }.into_any(),
                Some((allocations, pending, quota)) => {
                    let active = allocations.iter().filter(|a| a.state == "active").count();
                    let slices = quota.resources.iter().find(|l| l.resource == "compute_slices").map(|l| match l.limit {
                        Some(lim) => format!("{} of {}", tessera_core::clock::rounded(l.held, 1), tessera_core::clock::rounded(lim, 1)),
                        None => format!("{} (no limit)", tessera_core::clock::rounded(l.held, 1)),
                    });
                    view! {
                        <dl class="stats">
                            <div><dt>"Slices ready"</dt><dd data-testid="glance-active">{active}</dd></div>
                            <div><dt>"Being set up"</dt><dd>{allocations.len() - active}</dd></div>
                            <div><dt>"Pending requests"</dt><dd data-testid="glance-pending">{pending}</dd></div>
                            <div><dt>"Compute slices held"</dt><dd>{slices.unwrap_or_else(|| "none".into())}</dd></div>
                        </dl>
                    }.into_any()
                }
            }}
        </div>
    }
}

#[cfg(test)]
mod tests {
    use tessera_api::nodes::{GpuView, InUse, NodeView};
    use tessera_core::layout::PlacedInstance;

    use super::*;

    fn day(k: i64, allocated: f64, stranded: f64, efficiency: Option<f64>) -> EfficiencyDay {
        EfficiencyDay {
            day: format!("d{k}"),
            day_ms: k * 86_400_000,
            samples: 144,
            gpus: 2.0,
            allocated,
            placeable: 14.0 - allocated - stranded,
            stranded,
            cordoned: 0.0,
            held_slice_hours: allocated * 24.0,
            measured_slice_hours: allocated * 24.0,
            used_slice_hours: 0.0,
            efficiency,
            held_gpu_hours: 0.0,
            wasted_gpu_hours: 0.0,
            held_cost: None,
            waste_cost: None,
            unpriced_gpu_hours: 0.0,
        }
    }

    #[test]
    fn history_columns_sit_at_their_date_and_stack_to_the_largest_day() {
        // Days 10 and 12 of a 5-day window ending at day 12: day 11 is a gap, days 8 and 9 are empty.
        let days = [day(10, 7.0, 0.0, Some(0.5)), day(12, 3.5, 3.5, None), day(1, 14.0, 0.0, None)];
        let c = history_columns(&days, 12 * 86_400_000, 5);
        assert_eq!(c.len(), 2, "the day before the window is left out");
        let w = CHART_W / 5.0;
        assert_eq!((c[0].x, c[1].x), (2.0 * w, 4.0 * w));
        // Both days hold 14 slices: full height, split as their figures.
        assert_eq!(c[0].heights, [CHART_H / 2.0, CHART_H / 2.0, 0.0, 0.0]);
        assert_eq!(c[1].heights, [CHART_H / 4.0, CHART_H / 2.0, CHART_H / 4.0, 0.0]);
        assert_eq!((c[0].efficiency, c[1].efficiency), (Some(CHART_H / 2.0), None));
        assert_eq!((c[0].index, c[1].index), (0, 1), "each column names its day");
        assert!(history_columns(&[], 0, 90).is_empty());
        // The line joins consecutive measured days only.
        let days = [day(8, 7.0, 0.0, Some(0.5)), day(9, 7.0, 0.0, Some(0.25)), day(11, 7.0, 0.0, Some(1.0))];
        let c = history_columns(&days, 12 * 86_400_000, 5);
        let lines = efficiency_lines(&c, 5);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0].split(' ').count(), 2);
        assert_eq!(lines[1], format!("{:.1},{:.1}", 3.5 * CHART_W / 5.0, 0.0));
    }

    fn gpu(model: &str, layout: &[(&str, u8)], held: &[(&str, u8)], cordoned: bool) -> GpuView {
        GpuView {
            id: format!("g-{model}"),
            index: 0,
            uuid: String::new(),
            model: model.into(),
            mig_enabled: !layout.is_empty(),
            cordoned,
            layout: layout.iter().map(|&(p, s)| PlacedInstance { profile: p.into(), start: s }).collect(),
            layout_version: 1,
            auto_layout: false,
            applied: None,
            errors: vec![],
            in_use: held
                .iter()
                .map(|&(p, s)| InUse {
                    profile: p.into(),
                    start: s,
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
        }
    }

    #[test]
    fn capacity_splits_each_model_into_allocated_free_stranded_and_unavailable() {
        let node = NodeView {
            id: "n".into(),
            name: "n1".into(),
            created_at_ms: 0,
            gpus: vec![
                // 3g@0 held, 3g@4 free: the 7th compute slice has no memory left.
                gpu("H100-80GB", &[("3g.40gb", 0), ("3g.40gb", 4)], &[("3g.40gb", 0)], false),
                // Cordoned: what is not held is unavailable, stranded or not.
                gpu("H100-80GB", &[("3g.40gb", 0), ("3g.40gb", 4)], &[], true),
            ],
            state: "ready".into(),
            generation: 1,
            observed_generation: 1,
            last_seen_ms: None,
            agent: None,
            errors: vec![],
        };
        let caps = capacity(&[node], Catalog::builtin());
        let h = &caps[0];
        assert_eq!((h.gpus, h.total, h.allocated, h.free, h.stranded, h.unavailable), (2, 14.0, 3.0, 3.0, 1.0, 7.0));
        assert_eq!(h.text(), "3 of 14 allocated · 3 free · 1 stranded · 7 unavailable · 2 GPUs");
    }
}
