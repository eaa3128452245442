//! `/`: who you are, your tenants, and the fleet at a glance.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::nodes::NodeView;

use crate::api;
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
    /// GPUs.
    pub gpus: usize,
    /// MIG instances the agents report.
    pub instances: usize,
}

impl FleetSummary {
    /// Counts `nodes`.
    pub fn of(nodes: &[NodeView]) -> FleetSummary {
        FleetSummary {
            nodes: nodes.len(),
            ready: nodes.iter().filter(|n| n.state == "ready").count(),
            attention: nodes.iter().filter(|n| matches!(n.state.as_str(), "failed" | "not-ready")).count(),
            gpus: nodes.iter().map(|n| n.gpus.len()).sum(),
            instances: nodes.iter().flat_map(|n| &n.gpus).filter_map(|g| g.applied.as_ref()).map(Vec::len).sum(),
        }
    }
}

/// The overview.
#[component]
pub fn OverviewPage() -> impl IntoView {
    let session = expect_context::<SessionResource>();
    let tenants = expect_context::<TenantsResource>();
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
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
                    let summary = if s.user.platform_admin { Some(nodes.await.map(|n| FleetSummary::of(&n))) } else { None };
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
                                            {listed.into_iter().map(|(id, name, role)| view! { <li><A href=format!("/t/{id}")><strong>{name}</strong></A>" "<span class="muted">{role}</span></li> }).collect_view()}
                                        </ul>
                                    }.into_any()
                                }}
                            </div>
                            {summary.map(|summary| view! {
                            <div class="card" data-testid="fleet-summary">
                                <h2>"Fleet"</h2>
                                {match summary {
                                    Ok(f) => { let attention = f.attention > 0; view! {
                                        <dl class="stats">
                                            <div><dt>"Nodes ready"</dt><dd>{format!("{} / {}", f.ready, f.nodes)}</dd></div>
                                            <div><dt>"Need attention"</dt><dd class:bad=attention>{f.attention}</dd></div>
                                            <div><dt>"GPUs"</dt><dd>{f.gpus}</dd></div>
                                            <div><dt>"MIG instances"</dt><dd>{f.instances}</dd></div>
                                        </dl>
                                        <A href="/fleet">"Open the fleet"</A>
                                    }.into_any() }
                                    Err(p) => problem_view(&p),
                                }}
                            </div>
                            })}
                        </div>
                    }.into_any()
                })}
            </Suspense>
        </section>
    }
}
