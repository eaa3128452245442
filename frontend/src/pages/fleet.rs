//! `/fleet`: every node and GPU with its state, whether its agent has applied the latest configuration, and per GPU
//! what is held (compute slices, by tenant) and free, its utilisation and memory now, its health (healthy, degraded
//! or unhealthy, with the findings and the temperature its agent read), a marker when a layout change waits for an
//! admin, its MIG instances, a short UUID to copy, and its actions: cordon or uncordon and drain (each confirmed in
//! place, with a reason for the audit log), auto-layout (the planner may change its MIG layout without an admin's
//! approval) and the layout editor. It refreshes itself every 5 s in the browser.
//!
//! A large fleet (more than [`CARDS_UP_TO`] GPUs shown) is one table of groups instead, by node or by model: each
//! group's row says how many GPUs it has, in which states, what they hold and use now, and opens to its GPUs (a
//! node's card, with its actions, is one click further). The table scrolls inside a box and renders only the rows
//! in view and a few beyond them, every row [`ROW_PX`] high: 10,000 GPUs draw as fast as 10.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::nodes::{GpuView, NodeView};

use crate::api::{self, ProblemExt};
use crate::pages::{ago, clock, now_ms};
use crate::widgets::{ConfirmAction, CopyButton, Messages, RefreshHold, ScrollWatch, TenantsResource, problem_view};
use crate::wire::gpu_state;

/// The fleet page.
#[component]
pub fn FleetPage() -> impl IntoView {
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
    let tenants = expect_context::<TenantsResource>();
    // Rows are drawn again on each refresh: it waits while a cordon or drain is being confirmed.
    let hold = RefreshHold::provide();
    // The grouped table's choices live here, above the refreshes that draw it again.
    let grouping = Grouping {
        by: RwSignal::new(GroupBy::Node),
        open: RwSignal::new(std::collections::HashSet::new()),
        scroll: ScrollWatch::new(600.0),
        only: RwSignal::new(None),
    };
    #[cfg(not(feature = "hydrate"))]
    let _ = hold;
    #[cfg(feature = "hydrate")]
    {
        // It waits too while the grouped table is being scrolled: a large fleet's refresh takes frames.
        let scrolled_to = StoredValue::new(0.0_f64);
        let refresh = move || {
            let top = grouping.scroll.top.get_untracked();
            let still = scrolled_to.get_value() == top;
            scrolled_to.set_value(top);
            if hold.free() && still {
                nodes.refetch()
            }
        };
        if let Ok(handle) = set_interval_with_handle(refresh, std::time::Duration::from_secs(5)) {
            on_cleanup(move || handle.clear());
        }
    }
    let filter = RwSignal::new(String::new());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let changed = Callback::new(move |(ok, text): (bool, String)| {
        messages.set(vec![(ok, text)]);
        nodes.refetch();
    });
    view! {
        <section class="page">
            <div class="title-row">
                <h1>"Fleet"</h1>
                <label class="search">
                    <span class="sr-only">"Filter nodes"</span>
                    <input type="search" placeholder="Filter by node, model or state" bind:value=filter />
                </label>
            </div>
            <Messages messages=messages />
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let names = StoredValue::new(tenants.await.unwrap_or_default());
                    match nodes.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="notice">"No nodes yet. Create a join token (" <code>"tessera node join-token"</code> ") and start an agent."</p> }.into_any(),
                        Ok(list) => {
                            let now = now_ms();
                            view! {
                                <div class="legend" aria-hidden="true">
                                    {["ready", "applying", "failed", "not-ready", "cordoned"].map(|s| view! { <span class=format!("state {s}")>{s}</span> })}
                                </div>
                                <p class="muted small" data-testid="fleet-words">
                                    "Held: compute slices allocated to tenants (a GPU has 7 on the largest models). "
                                    "Cordoned: nothing new is placed on the GPU; what it holds keeps running. "
                                    "Auto-layout: the planner may change the free part of the GPU's MIG layout without waiting for an admin. "
                                    "Configuration: each change to a node's layouts or sharing is numbered; its agent applies them in turn."
                                </p>
                                {move || {
                                    let needle = filter.get().to_lowercase();
                                    if let Some(only) = grouping.only.get() {
                                        return view! {
                                            <button type="button" class="button small" data-testid="all-nodes" on:click=move |_| grouping.only.set(None)>"← All nodes"</button>
                                            {list.iter().filter(|n| n.name == only).map(|n| view! { <NodeCard node=n.clone() now names changed /> }).collect_view()}
                                        }.into_any();
                                    }
                                    let shown: usize = list.iter().filter(|n| needle.is_empty() || matches(n, &needle)).map(|n| n.gpus.len()).sum();
                                    if shown > CARDS_UP_TO {
                                        return view! { <GroupedFleet list=list.clone() needle grouping names /> }.into_any();
                                    }
                                    list.iter()
                                        .filter(|n| needle.is_empty() || matches(n, &needle))
                                        .map(|n| view! { <NodeCard node=n.clone() now names changed /> })
                                        .collect_view()
                                        .into_any()
                                }}
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

fn matches(node: &NodeView, needle: &str) -> bool {
    node.name.to_lowercase().contains(needle)
        || node.state.contains(needle)
        || node.gpus.iter().any(|g| g.model.to_lowercase().contains(needle))
}

/// Beyond this many GPUs shown, the page is one grouped table that renders only the rows in view.
pub const CARDS_UP_TO: usize = 200;
/// The height of every row of the grouped table, CSS pixels.
pub const ROW_PX: f64 = 36.0;
/// Rows rendered beyond the visible ones, above and below.
const OVERSCAN: usize = 10;

/// What the grouped table groups GPUs by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupBy {
    /// One group per node.
    Node,
    /// One group per GPU model.
    Model,
}

/// The grouped table's state, kept across the page's refreshes.
#[derive(Debug, Clone, Copy)]
struct Grouping {
    /// By node or by model.
    by: RwSignal<GroupBy>,
    /// Keys of the groups shown open.
    open: RwSignal<std::collections::HashSet<String>>,
    /// The table's scroll position.
    scroll: ScrollWatch,
    /// The node whose card is shown alone, when one was opened from the table.
    only: RwSignal<Option<String>>,
}

/// A group of GPUs and what they add up to.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// The node's name or the model.
    pub key: String,
    /// The node's state (groups by node).
    pub node_state: Option<String>,
    /// Its GPUs, as (node, GPU) positions in the list.
    pub gpus: Vec<(usize, usize)>,
    /// How many nodes its GPUs are on.
    pub nodes: usize,
    /// GPUs per state (`ready`, `cordoned`, ...), in the legend's order.
    pub states: Vec<(&'static str, usize)>,
    /// GPUs degraded, and unhealthy.
    pub sick: (usize, usize),
    /// Compute slices held, and in all.
    pub held: (f64, f64),
    /// Mean utilisation of the GPUs with a sample in the last minute, percent.
    pub util: Option<f32>,
}

/// The groups of the nodes matching `needle` (lowercase; all when empty), by node or by model, in name order.
pub fn groups(nodes: &[NodeView], needle: &str, by: GroupBy, catalog: &tessera_core::catalog::Catalog) -> Vec<Group> {
    let mut keyed: std::collections::BTreeMap<String, Vec<(usize, usize)>> = Default::default();
    for (ni, n) in nodes.iter().enumerate().filter(|(_, n)| needle.is_empty() || matches(n, needle)) {
        for (gi, g) in n.gpus.iter().enumerate() {
            let key = match by {
                GroupBy::Node => n.name.clone(),
                GroupBy::Model => g.model.clone(),
            };
            keyed.entry(key).or_default().push((ni, gi));
        }
    }
    keyed
        .into_iter()
        .map(|(key, gpus)| {
            let mut states: Vec<(&'static str, usize)> = Vec::new();
            let (mut sick, mut held, mut util, mut sampled) = ((0, 0), (0.0, 0.0), 0.0_f32, 0_u32);
            let mut seen_nodes: Vec<usize> = gpus.iter().map(|p| p.0).collect();
            seen_nodes.dedup();
            for &(ni, gi) in &gpus {
                let (n, g) = (&nodes[ni], &nodes[ni].gpus[gi]);
                let state = gpu_state(g, &n.state);
                match states.iter_mut().find(|(s, _)| *s == state) {
                    Some((_, c)) => *c += 1,
                    None => states.push((state, 1)),
                }
                match g.health.state {
                    tessera_core::health::HealthState::Degraded => sick.0 += 1,
                    tessera_core::health::HealthState::Unhealthy => sick.1 += 1,
                    tessera_core::health::HealthState::Healthy => {}
                }
                if let Some(o) = Occupancy::of(g, catalog) {
                    held = (held.0 + o.held, held.1 + o.total);
                }
                if let Some(now) = &g.now {
                    util += now.util_pct;
                    sampled += 1;
                }
            }
            const ORDER: [&str; 6] = ["ready", "applying", "failed", "unknown", "not-ready", "cordoned"];
            states.sort_by_key(|(s, _)| ORDER.iter().position(|o| o == s).unwrap_or(ORDER.len()));
            Group {
                node_state: (by == GroupBy::Node).then(|| nodes[gpus[0].0].state.clone()),
                key,
                nodes: seen_nodes.len(),
                states,
                sick,
                held,
                util: (sampled > 0).then(|| util / sampled as f32),
                gpus,
            }
        })
        .collect()
}

/// A row of the grouped table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Line {
    /// The group's own row (its position among the groups).
    Group(usize),
    /// A GPU of an open group: the group's position, and the GPU's among its GPUs.
    Gpu(usize, usize),
}

/// The table's rows: each group, followed by its GPUs when it is open.
pub fn lines(groups: &[Group], open: &std::collections::HashSet<String>) -> Vec<Line> {
    let mut out = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        out.push(Line::Group(i));
        if open.contains(&g.key) {
            out.extend((0..g.gpus.len()).map(|k| Line::Gpu(i, k)));
        }
    }
    out
}

/// "6 ready · 1 cordoned · 1 unhealthy": a group's GPUs by state, and those not healthy.
pub fn state_words(g: &Group) -> String {
    let mut parts: Vec<String> = g.states.iter().map(|(s, n)| format!("{n} {s}")).collect();
    if g.sick.0 > 0 {
        parts.push(format!("{} degraded", g.sick.0));
    }
    if g.sick.1 > 0 {
        parts.push(format!("{} unhealthy", g.sick.1));
    }
    parts.join(" · ")
}

/// The grouped table of a large fleet: groups by node or model, opened to their GPUs in place, and a node's card
/// (its actions) one click further; only the rows in view are in the page.
#[component]
fn GroupedFleet(
    list: Vec<NodeView>,
    needle: String,
    grouping: Grouping,
    names: StoredValue<Vec<tessera_api::tenants::TenantView>>,
) -> impl IntoView {
    let catalog = tessera_core::catalog::Catalog::builtin();
    let list = StoredValue::new(list);
    let Grouping { by, open, scroll, only } = grouping;
    let grouped = Memo::new(move |_| list.with_value(|l| groups(l, &needle, by.get(), catalog)));
    let rows = Memo::new(move |_| grouped.with(|g| open.with(|o| lines(g, o))));
    let range = Memo::new(move |_| scroll.rows(ROW_PX, rows.with(Vec::len), OVERSCAN));
    let boxed = NodeRef::<leptos::html::Div>::new();
    scroll.follow(boxed);
    let gpu_count = move || grouped.with(|g| g.iter().map(|g| g.gpus.len()).sum::<usize>());
    // The rows in view, each with what its drawing depends on beyond its data: whether its group is open, and the
    // grouping.
    let shown = move || {
        let r = range.get();
        let by_model = by.get() == GroupBy::Model;
        rows.with(|l| {
            grouped.with(|gs| {
                open.with(|o| {
                    (r.start..r.end.min(l.len()))
                        .map(|i| {
                            let line = l[i];
                            let is_open = matches!(line, Line::Group(g) if o.contains(&gs[g].key));
                            (i, line, is_open, by_model)
                        })
                        .collect::<Vec<_>>()
                })
            })
        })
    };
    let toggle = move |key: String| {
        open.update(|o| {
            if !o.remove(&key) {
                o.insert(key);
            }
        })
    };
    let line_view = move |i: usize, line: Line| -> AnyView {
        let index = (i + 2).to_string();
        grouped.with_untracked(|gs| match line {
            Line::Group(gi) => {
                let g = &gs[gi];
                let is_open = open.with_untracked(|o| o.contains(&g.key));
                let key = g.key.clone();
                let share = if g.held.1 > 0.0 { 100.0 * g.held.0 / g.held.1 } else { 0.0 };
                let size = match by.get_untracked() {
                    GroupBy::Node => crate::pages::count(g.gpus.len() as u64, "GPU"),
                    GroupBy::Model => format!(
                        "{} on {}",
                        crate::pages::count(g.gpus.len() as u64, "GPU"),
                        crate::pages::count(g.nodes as u64, "node")
                    ),
                };
                let node = g.node_state.is_some().then(|| g.key.clone());
                view! {
                    <tr class="group" data-testid="fleet-group" data-group=g.key.clone() data-line=i.to_string() aria-rowindex=index>
                        <th scope="row" class="nowrap">
                            <button type="button" class="fold" aria-expanded=is_open.to_string()
                                aria-label=format!("Show or hide the GPUs of {}", g.key) on:click=move |_| toggle(key.clone())>
                                {if is_open { "▾" } else { "▸" }}
                            </button>
                            " "{g.key.clone()}
                        </th>
                        <td>{size}</td>
                        <td>{g.node_state.clone().map(|s| view! { <span class=format!("state {s}")>{s.clone()}</span>" " })}<span class="small">{state_words(g)}</span></td>
                        <td data-testid="group-held" data-held=g.held.0.to_string() data-total=g.held.1.to_string()>
                            <span class="small">{format!("{} of {} slices held", fmt_slices(g.held.0), fmt_slices(g.held.1))}</span>
                            <div class="bar" role="img" aria-label=format!("{share:.0}% held")><span class="used" style=format!("width:{share:.1}%")></span></div>
                        </td>
                        <td>{g.util.map_or_else(|| "—".to_string(), |u| format!("{u:.0}\u{a0}% mean"))}</td>
                        <td class="actions">{node.map(|n| view! {
                            <button type="button" class="link" data-testid="open-node" on:click=move |_| only.set(Some(n.clone()))>"Details"</button>
                        })}</td>
                    </tr>
                }
                .into_any()
            }
            Line::Gpu(gi, k) => list.with_value(|l| {
                let (ni, gpu_i) = gs[gi].gpus[k];
                let (n, g) = (&l[ni], &l[ni].gpus[gpu_i]);
                let state = gpu_state(g, &n.state);
                let held = Occupancy::of(g, catalog);
                let holders = held.as_ref().map(|o| {
                    o.holder_words(|t| names.with_value(|n| n.iter().find(|x| x.id == t).map(|x| x.name.clone())))
                });
                let held_words = held.map(|o| {
                    let who = holders.clone().filter(|h| !h.is_empty()).map(|h| format!(" · {h}")).unwrap_or_default();
                    format!("{} of {} held{who}", fmt_slices(o.held), fmt_slices(o.total))
                });
                let name = match by.get_untracked() {
                    GroupBy::Node => format!("GPU {}", g.index),
                    GroupBy::Model => format!("{} · GPU {}", n.name, g.index),
                };
                let node = n.name.clone();
                view! {
                    <tr class="member" data-gpu=g.uuid.clone() data-line=i.to_string() aria-rowindex=index>
                        <th scope="row" class="nowrap indent">{name}</th>
                        <td>{g.model.clone()}</td>
                        <td>
                            <span class=format!("state {state}") data-testid="gpu-state">{state}</span>" "
                            <span class=format!("state {}", g.health.state.as_str())>{g.health.state.as_str()}</span>
                        </td>
                        <td class="small" title=holders.clone().unwrap_or_default()>{held_words}</td>
                        <td>{g.now.as_ref().map_or_else(|| "—".to_string(), |s| format!("{:.0}\u{a0}%", s.util_pct))}</td>
                        <td class="nowrap"><code class="uuid" title=g.uuid.clone()>{short_uuid(&g.uuid)}</code>" "
                            <button type="button" class="link" on:click=move |_| only.set(Some(node.clone()))>"Node"</button></td>
                    </tr>
                }
                .into_any()
            }),
        })
    };
    view! {
        <div class="fleet-toolbar">
            <label>"Group by "
                <select data-testid="group-by" prop:value=move || if by.get() == GroupBy::Node { "node" } else { "model" }
                    on:change=move |ev| {
                        by.set(if event_target_value(&ev) == "model" { GroupBy::Model } else { GroupBy::Node });
                        open.set(Default::default());
                    }>
                    <option value="node">"node"</option>
                    <option value="model">"model"</option>
                </select>
            </label>
            <span class="muted small" data-testid="fleet-count">
                {move || format!("{} in {} groups", crate::pages::count(gpu_count() as u64, "GPU"), grouped.with(Vec::len))}
            </span>
        </div>
        <div class="fleet-scroll" node_ref=boxed data-testid="fleet-scroll">
            <table class="gpus grouped" data-testid="fleet-table" data-lines=move || rows.with(Vec::len).to_string() aria-rowcount=move || (rows.with(Vec::len) + 1).to_string()>
                <colgroup><col class="c-name" /><col class="c-size" /><col class="c-state" /><col class="c-held" /><col class="c-now" /><col class="c-more" /></colgroup>
                <thead><tr aria-rowindex="1">
                    <th scope="col">{move || if by.get() == GroupBy::Node { "Node / GPU" } else { "Model / GPU" }}</th>
                    <th scope="col">"GPUs / model"</th>
                    <th scope="col">"State"</th>
                    <th scope="col" title="Compute slices allocated to tenants">"Held"</th>
                    <th scope="col" title="Utilisation its agent read in the last minute">"Now"</th>
                    <th scope="col"><span class="sr-only">"More"</span></th>
                </tr></thead>
                <tbody>
                    <tr class="spacer" aria-hidden="true"><td colspan="6" style=move || format!("height:{}px;padding:0;border:0", range.get().start as f64 * ROW_PX)></td></tr>
                    // Keyed: as the box scrolls, only the rows coming into view are made.
                    <For each=shown key=|k| *k children=move |(i, line, _, _)| line_view(i, line) />
                    <tr class="spacer" aria-hidden="true"><td colspan="6" style=move || format!("height:{}px;padding:0;border:0", (rows.with(Vec::len) - range.get().end.min(rows.with(Vec::len))) as f64 * ROW_PX)></td></tr>
                </tbody>
            </table>
        </div>
    }
}

#[component]
fn NodeCard(
    node: NodeView,
    now: i64,
    names: StoredValue<Vec<tessera_api::tenants::TenantView>>,
    changed: Callback<(bool, String)>,
) -> impl IntoView {
    let agent = node.agent.as_ref().map(|a| {
        format!(
            "agent {} · {}{}",
            a.version,
            a.backend,
            a.driver_version.as_ref().map(|d| format!(" · driver {d}")).unwrap_or_default()
        )
    });
    let seen = node.last_seen_ms.map(|t| format!("seen {}", ago(t, now)));
    let state = node.state.clone();
    view! {
        <article class="card node" data-testid="node" data-node=node.name.clone() data-state=state.clone()>
            <header class="node-head">
                <h2>{node.name.clone()}</h2>
                <span class=format!("state {state}")>{state.clone()}</span>
                <span class="muted" data-testid="generation" title="Each change to the node's layouts or sharing is a new generation of its configuration; its agent applies them in turn">
                    {generation_words(node.observed_generation, node.generation)}
                </span>
                {agent.map(|a| view! { <span class="muted">{a}</span> })}
                {seen.map(|s| view! { <span class="muted">{s}</span> })}
            </header>
            {(!node.errors.is_empty()).then(|| view! {
                <ul class="errors">{node.errors.iter().map(|e| view! { <li><code>{e.code.clone()}</code>" "{e.step.clone()}": "{e.message.clone()}</li> }).collect_view()}</ul>
            })}
            <table class="gpus">
                <thead><tr><th scope="col">"GPU"</th><th scope="col">"Model"</th><th scope="col">"State"</th><th scope="col" title="Compute slices allocated to tenants, by tenant, and the instances free">"Held"</th><th scope="col" title="Utilisation and memory its agent read in the last minute">"Now"</th><th scope="col" title="What its agent reads from the driver: XID errors, ECC, row remapping, throttling, temperature">"Health"</th><th scope="col" title="MIG instances its agent shows / the layout it should have">"Instances (applied / desired)"</th><th scope="col">"UUID"</th><th scope="col" title="The planner may change the free part of the MIG layout without an admin's approval">"Auto-layout"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                <tbody>
                    {node.gpus.iter().map(|g| view! { <GpuRow gpu=g.clone() node_name=node.name.clone() node_state=node.state.clone() names changed /> }).collect_view()}
                </tbody>
            </table>
        </article>
    }
}

#[component]
fn GpuRow(
    gpu: GpuView,
    node_name: String,
    node_state: String,
    names: StoredValue<Vec<tessera_api::tenants::TenantView>>,
    changed: Callback<(bool, String)>,
) -> impl IntoView {
    let name = format!("{node_name} GPU {}", gpu.index);
    let (id, cordoned, auto_layout) = (gpu.id.clone(), gpu.cordoned, gpu.auto_layout);
    let on_cordon = {
        let (id, name) = (id.clone(), name.clone());
        Callback::new(move |reason: String| {
            let (id, name) = (id.clone(), name.clone());
            leptos::task::spawn_local(async move {
                let verb = if cordoned { "uncordon" } else { "cordon" };
                let body = tessera_api::nodes::CordonBody { reason: (!reason.is_empty()).then_some(reason) };
                let r = api::send_json::<GpuView>("POST", format!("/api/v1/gpus/{id}/{verb}"), body).await;
                changed.run(match r {
                    Ok(g) if g.cordoned => (true, format!("{name} is cordoned: nothing new is placed on it.")),
                    Ok(_) => (true, format!("{name} takes new slices again.")),
                    Err(p) => (false, format!("{name}: {}", p.message())),
                });
            });
        })
    };
    let on_auto = {
        let (id, name) = (id.clone(), name.clone());
        move |_| {
            let (id, name) = (id.clone(), name.clone());
            leptos::task::spawn_local(async move {
                let body = tessera_api::layouts::AutoLayout { enabled: !auto_layout };
                let r =
                    api::send_json::<serde_json::Value>("PUT", format!("/api/v1/gpus/{id}/auto-layout"), body).await;
                changed.run(match r {
                    Ok(_) if !auto_layout => {
                        (true, format!("{name}: auto-layout on; the planner changes its layout as requests need."))
                    }
                    Ok(_) => (true, format!("{name}: auto-layout off; layout changes wait for an admin.")),
                    Err(p) => (false, format!("{name}: {}", p.message())),
                });
            });
        }
    };
    let on_drain = {
        let (id, name) = (id.clone(), name.clone());
        Callback::new(move |reason: String| {
            let (id, name) = (id.clone(), name.clone());
            leptos::task::spawn_local(async move {
                let body = tessera_api::nodes::DrainBody {
                    deadline_s: Some(tessera_core::health::DEFAULT_DRAIN_S),
                    reason: Some(if reason.is_empty() { "maintenance".to_string() } else { reason }),
                };
                let r =
                    api::send_json::<tessera_api::nodes::GpuDrain>("POST", format!("/api/v1/gpus/{id}/drain"), body)
                        .await;
                changed.run(match r {
                    Ok(d) if d.drained_at_ms.is_some() => (true, format!("{name} is drained: empty for maintenance.")),
                    Ok(d) => (
                        true,
                        format!(
                            "{name} is draining: {} request(s) hold slices until {}.",
                            d.holders.len(),
                            clock(d.deadline_ms)
                        ),
                    ),
                    Err(p) => (false, format!("{name}: {}", p.message())),
                });
            });
        })
    };
    let drain = gpu.drain.clone().map(|d| match d.drained_at_ms {
        Some(_) => ("drained", "drained: empty for maintenance".to_string()),
        None => ("draining", format!("draining: {} holding until {}", d.holders.len(), clock(d.deadline_ms))),
    });
    let state = gpu_state(&gpu, &node_state);
    let applied = gpu.applied.clone().unwrap_or_default();
    let instances = if gpu.mig_enabled {
        gpu.layout
            .iter()
            .map(|i| {
                let seen = applied.iter().find(|a| a.profile == i.profile && a.start == i.start);
                let busy = seen.is_some_and(|a| !a.processes.is_empty());
                let class = match (seen.is_some(), busy) {
                    (true, true) => "chip busy",
                    (true, false) => "chip",
                    (false, _) => "chip pending",
                };
                let title = match seen {
                    Some(a) => format!("{} · {} process(es)", a.uuid, a.processes.len()),
                    None => "not applied yet".to_string(),
                };
                view! { <span class=class title=title>{format!("{}@{}", i.profile, i.start)}</span> }
            })
            .collect_view()
            .into_any()
    } else {
        view! { <span class="muted">"whole GPU (MIG off)"</span> }.into_any()
    };
    let counts = gpu.mig_enabled.then(|| format!("{} / {}", applied.len(), gpu.layout.len()));
    let health = gpu.health.clone();
    let held = Occupancy::of(&gpu, tessera_core::catalog::Catalog::builtin());
    let held_cell = held.map(|o| {
        let words = o.holder_words(|t| names.with_value(|n| n.iter().find(|x| x.id == t).map(|x| x.name.clone())));
        let share = if o.total > 0.0 { 100.0 * o.held / o.total } else { 0.0 };
        view! {
            <div data-testid="held" data-held=o.held.to_string() data-total=o.total.to_string()>
                <div class="bar-head"><span>{format!("{} of {} compute slices held", fmt_slices(o.held), fmt_slices(o.total))}</span></div>
                <div class="bar" role="img" aria-label=format!("{share:.0}% held")><span class="used" style=format!("width:{share:.1}%")></span></div>
                {(!words.is_empty()).then(|| view! { <div class="small">{words}</div> })}
                {(!o.free.is_empty()).then(|| view! { <div class="small muted" data-testid="free">{format!("free: {}", o.free.join(", "))}</div> })}
            </div>
        }
    });
    let now_cell = match &gpu.now {
        Some(n) => view! {
            <span data-testid="now" data-util=n.util_pct.to_string() title=format!("read at {}", clock(n.at_ms))>
                <strong>{format!("{:.0}\u{a0}%", n.util_pct)}</strong>
                <span class="muted small">{format!(" · {:.1} of {:.0} GiB", n.mem_used_mib / 1024.0, n.mem_total_mib / 1024.0)}</span>
            </span>
        }
        .into_any(),
        None => view! { <span class="muted" data-testid="now" title="No sample from its agent in the last minute">"—"</span> }.into_any(),
    };
    let short = short_uuid(&gpu.uuid);
    let verb = if cordoned { "Uncordon" } else { "Cordon" };
    let cordon_says = if cordoned {
        format!(
            "Uncordon {name}? New slices may be placed on it again; an unhealthy GPU returns to service and a drain ends."
        )
    } else {
        format!("Cordon {name}? Nothing new is placed on it; what it holds keeps running.")
    };
    let drain_says =
        format!("Drain {name}? It is cordoned now, its holders are told, and slices still on it in one hour end then.");
    let stray = unallocated_lines(&gpu);
    let runs: Vec<String> = gpu.processes.iter().filter(|p| p.unallocated.is_none()).map(process_who).collect();
    view! {
        <tr data-gpu=gpu.uuid.clone() data-cordoned=cordoned.to_string()>
            <td>{gpu.index}</td>
            <td>{gpu.model.clone()}</td>
            <td>
                <span class=format!("state {state}") data-testid="gpu-state">{state}</span>
                {drain.clone().map(|(kind, text)| view! { <div class="muted" data-testid="drain" data-drain=kind>{text}</div> })}
                {gpu.layout_waiting.clone().map(|p| view! {
                    <div class="small"><A href="/approvals" attr:data-testid="layout-waiting" attr:data-proposal=p>"layout change waits for approval"</A></div>
                })}
                {(!stray.is_empty()).then(|| view! {
                    <div class="notice error small" role="alert" data-testid="unallocated-marker" data-count=stray.len().to_string()>
                        <strong>"Unallocated use"</strong>
                        <ul>{stray.iter().map(|l| view! { <li>{l.clone()}</li> }).collect_view()}</ul>
                    </div>
                })}
                {(!runs.is_empty()).then(|| view! {
                    <div class="muted small" data-testid="runs">{format!("runs: {}", runs.join("; "))}</div>
                })}
            </td>
            <td>{held_cell}</td>
            <td>{now_cell}</td>
            <td data-testid="health" data-health=health.state.as_str()>{health_cell(&health)}</td>
            <td>
                {counts.map(|c| view! { <span class="count">{c}</span> })}
                " "
                {instances}
                {(!gpu.errors.is_empty()).then(|| view! {
                    <ul class="errors">{gpu.errors.iter().map(|e| view! { <li><code>{e.code.clone()}</code>" "{e.step.clone()}": "{e.message.clone()}</li> }).collect_view()}</ul>
                })}
            </td>
            <td class="nowrap"><code class="uuid" title=gpu.uuid.clone()>{short}</code>" "<CopyButton text=gpu.uuid.clone() label="UUID" /></td>
            <td>{gpu.mig_enabled.then(|| view! { <label class="switch-cell"><input type="checkbox" role="switch" data-testid="auto-layout" prop:checked=auto_layout on:change=on_auto aria-label=format!("Auto-layout on {name}") /></label> })}</td>
            <td class="actions">
                <ConfirmAction label=format!("{verb}…") confirm=verb testid=if cordoned { "uncordon" } else { "cordon" } says=cordon_says reason=true on_confirm=on_cordon />
                {drain.is_none().then(|| view! {
                    <ConfirmAction label="Drain…" confirm="Drain" testid="drain-gpu" says=drain_says reason=true on_confirm=on_drain />
                })}
                {gpu.mig_enabled.then(|| view! { <A href=format!("/gpus/{}/layout", gpu.id) attr:data-testid="edit-layout">"Edit layout"</A> })}
            </td>
        </tr>
    }
}

/// What a GPU holds: compute slices in all and held (reserved or active allocations, a share counting its part of
/// the GPU), per tenant, and the MIG instances of its layout nobody holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Occupancy {
    /// Its model's compute slices.
    pub total: f64,
    /// Held, in compute slices.
    pub held: f64,
    /// Per tenant id, its compute slices, most first.
    pub holders: Vec<(String, f64)>,
    /// Free instances of its layout, as `profile@start`.
    pub free: Vec<String>,
}

impl Occupancy {
    /// `None` for a model the catalog does not know.
    pub fn of(gpu: &GpuView, catalog: &tessera_core::catalog::Catalog) -> Option<Occupancy> {
        let model = catalog.model(&gpu.model)?;
        let total = f64::from(model.compute_slices_total);
        let mut holders: Vec<(String, f64)> = Vec::new();
        for u in &gpu.in_use {
            let w = tessera_core::quota::weight(model, &u.profile).unwrap_or(0.0);
            match holders.iter_mut().find(|(t, _)| *t == u.tenant) {
                Some((_, n)) => *n += w,
                None => holders.push((u.tenant.clone(), w)),
            }
        }
        holders.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        // From +0: nothing held is 0, not the -0 an empty `sum` gives.
        let held = holders.iter().fold(0.0, |a, (_, n)| a + n).min(total);
        let free = if gpu.mig_enabled {
            gpu.layout
                .iter()
                .filter(|i| !gpu.in_use.iter().any(|u| u.profile == i.profile && u.start == i.start))
                .map(|i| format!("{}@{}", i.profile, i.start))
                .collect()
        } else {
            Vec::new()
        };
        Some(Occupancy { total, held, holders, free })
    }

    /// "vision 3 · research 1", names from `name` (the id's start where it has none).
    pub fn holder_words(&self, name: impl Fn(&str) -> Option<String>) -> String {
        self.holders
            .iter()
            .map(|(t, n)| format!("{} {}", name(t).unwrap_or_else(|| t.chars().take(8).collect()), fmt_slices(*n)))
            .collect::<Vec<_>>()
            .join(" · ")
    }
}

/// Slices as a person writes them: whole numbers without a point, parts with one decimal.
fn fmt_slices(n: f64) -> String {
    if (n - n.round()).abs() < 0.05 { format!("{n:.0}") } else { format!("{n:.1}") }
}

/// `GPU-1a2b3c4d…9f0e`: its start and end, enough to tell GPUs apart on a page (whatever part of it differs); the
/// whole one is in the tooltip and copied.
pub fn short_uuid(uuid: &str) -> String {
    let chars: Vec<char> = uuid.chars().collect();
    if chars.len() <= 18 {
        return uuid.to_string();
    }
    let head: String = chars[..12].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

/// Whether the node's agent has applied its latest configuration, in words.
pub fn generation_words(observed: i64, desired: i64) -> String {
    if desired == 0 {
        "no configuration yet".to_string()
    } else if observed >= desired {
        format!("configuration applied (generation {desired})")
    } else {
        format!("applying configuration {desired} (its agent has applied {observed})")
    }
}

/// A GPU's health: its state, the temperature its agent last read, and the findings (an unhealthy GPU is cordoned
/// until an admin uncordons it, which returns it to service).
/// Who a process is, in words: its pod, else its user and command.
pub fn process_who(p: &tessera_api::nodes::ProcessView) -> String {
    crate::pages::shared::who_runs(p.pid, p.user.as_deref(), p.command.as_deref(), p.pod.as_ref())
}

/// The GPU's unallocated use, one line a process: who, what is wrong, and on which device.
pub fn unallocated_lines(gpu: &GpuView) -> Vec<String> {
    gpu.processes
        .iter()
        .filter_map(|p| p.unallocated.map(|why| format!("{} {} ({})", process_who(p), why.sentence(), p.device)))
        .collect()
}

fn health_cell(h: &tessera_api::nodes::GpuHealth) -> impl IntoView + use<> {
    let state = h.state.as_str();
    let temperature = h.report.as_ref().and_then(|r| r.temperature_c).map(|t| format!(" {t}\u{a0}°C"));
    let title = match h.state {
        tessera_core::health::HealthState::Unhealthy => "Cordoned for a fatal error; uncordon to return it to service",
        tessera_core::health::HealthState::Degraded => "Serves, with something to look at",
        tessera_core::health::HealthState::Healthy => "Nothing wrong reported",
    };
    view! {
        <span class=format!("state {state}") title=title>{state}</span>
        <span class="muted">{temperature}</span>
        {(!h.findings.is_empty()).then(|| view! {
            <ul class="errors">{h.findings.iter().map(|f| view! { <li><code>{f.code.clone()}</code>" "{f.message.clone()}</li> }).collect_view()}</ul>
        })}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::gpu;
    use tessera_api::nodes::InUse;
    use tessera_core::layout::PlacedInstance;

    #[test]
    fn unallocated_use_says_who_what_and_where() {
        use tessera_api::nodes::ProcessView;
        use tessera_core::attribution::{PodRef, Stray};
        let p = |pid: u32, pod: Option<&str>, unallocated: Option<Stray>| ProcessView {
            device: "MIG-1".into(),
            pid,
            user: Some("mallory".into()),
            command: Some("miner".into()),
            pod: pod.map(|n| PodRef { namespace: n.into(), pod: "sneaky-0".into(), container: "main".into() }),
            allocation: unallocated.is_none().then(|| "a1".into()),
            unallocated,
            since_ms: 0,
        };
        let g = GpuView {
            processes: vec![
                p(1, Some("ml-a"), None),
                p(2, Some("ml-b"), Some(Stray::OtherTenant)),
                p(3, None, Some(Stray::NoAllocation)),
            ],
            ..gpu("g", 0, "GPU-1")
        };
        assert_eq!(
            unallocated_lines(&g),
            [
                "pod ml-b/sneaky-0 (container main), pid 2 is a pod of another tenant than the one the device is allocated to (MIG-1)",
                "miner of mallory, pid 3 runs on a device no allocation holds (MIG-1)",
            ]
        );
        assert_eq!(process_who(&g.processes[0]), "pod ml-a/sneaky-0 (container main), pid 1");
    }

    fn held(profile: &str, start: u8, tenant: &str) -> InUse {
        InUse { profile: profile.into(), start, request: "r".into(), tenant: tenant.into(), state: "active".into() }
    }

    #[test]
    fn a_gpu_says_what_is_held_by_whom_and_what_is_free() {
        let catalog = tessera_core::catalog::Catalog::builtin();
        let mut g = gpu("g", 0, "GPU-0123456789abcdef");
        g.model = "H100-80GB".into();
        g.mig_enabled = true;
        g.layout = [("3g.40gb", 4), ("2g.20gb", 2), ("1g.10gb", 0), ("1g.10gb", 1)]
            .map(|(p, s)| PlacedInstance { profile: p.into(), start: s })
            .to_vec();
        g.in_use =
            vec![held("1g.10gb", 0, "t-research"), held("3g.40gb", 4, "t-vision"), held("1g.10gb", 1, "t-vision")];
        let o = Occupancy::of(&g, catalog).expect("known model");
        assert_eq!((o.total, o.held), (7.0, 5.0));
        assert_eq!(o.free, vec!["2g.20gb@2".to_string()]);
        let names = |t: &str| (t == "t-vision").then(|| "vision".to_string());
        assert_eq!(o.holder_words(names), "vision 4 · t-resear 1");
        // A whole GPU shared four ways, one share held: a quarter of it.
        let mut whole = gpu("w", 1, "GPU-1");
        whole.model = "H100-80GB".into();
        whole.mig_enabled = false;
        whole.in_use = vec![held("timeslice:4", 0, "t-vision")];
        let o = Occupancy::of(&whole, catalog).expect("known model");
        assert_eq!((o.held, o.free.len()), (1.75, 0));
        assert_eq!(o.holder_words(|_| Some("vision".into())), "vision 1.8");
        assert_eq!(Occupancy::of(&GpuView { model: "nope".into(), ..whole }, catalog), None);
    }

    #[test]
    fn a_large_fleet_groups_by_node_or_model_and_opens_a_group_to_its_gpus() {
        use tessera_api::nodes::GpuNow;
        let catalog = tessera_core::catalog::Catalog::builtin();
        let node = |name: &str, models: &[&str]| {
            let mut n = crate::wire::node_with_gpu(name.into(), gpu("x", 0, "GPU-x"));
            n.state = "ready".into();
            n.gpus = models
                .iter()
                .enumerate()
                .map(|(i, m)| GpuView {
                    model: m.to_string(),
                    mig_enabled: false,
                    ..gpu(&format!("{name}-{i}"), i as u32, &format!("GPU-{name}-{i}"))
                })
                .collect();
            n
        };
        let mut nodes = vec![node("b", &["H100-80GB", "A100-80GB"]), node("a", &["H100-80GB"])];
        nodes[0].gpus[0].cordoned = true;
        nodes[0].gpus[0].in_use = vec![held("timeslice:7", 0, "t")];
        nodes[0].gpus[1].now = Some(GpuNow { at_ms: 0, util_pct: 40.0, mem_used_mib: 0.0, mem_total_mib: 1.0 });
        nodes[1].gpus[0].now = Some(GpuNow { at_ms: 0, util_pct: 20.0, mem_used_mib: 0.0, mem_total_mib: 1.0 });
        let by_node = groups(&nodes, "", GroupBy::Node, catalog);
        assert_eq!(by_node.iter().map(|g| g.key.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let b = &by_node[1];
        assert_eq!((b.gpus.len(), b.nodes, b.node_state.as_deref()), (2, 1, Some("ready")));
        assert_eq!(state_words(b), "1 ready · 1 cordoned");
        assert_eq!(b.held.1, 14.0);
        assert_eq!(b.util, Some(40.0));
        let by_model = groups(&nodes, "", GroupBy::Model, catalog);
        assert_eq!(
            by_model.iter().map(|g| (g.key.as_str(), g.gpus.len(), g.nodes)).collect::<Vec<_>>(),
            [("A100-80GB", 1, 1), ("H100-80GB", 2, 2)]
        );
        assert_eq!(by_model[1].util, Some(20.0));
        assert_eq!(groups(&nodes, "a100", GroupBy::Node, catalog).len(), 1, "the filter keeps matching nodes");
        // Closed, a group is one row; open, its GPUs follow it.
        let open = std::collections::HashSet::from(["H100-80GB".to_string()]);
        assert_eq!(lines(&by_model, &Default::default()), [Line::Group(0), Line::Group(1)]);
        assert_eq!(lines(&by_model, &open), [Line::Group(0), Line::Group(1), Line::Gpu(1, 0), Line::Gpu(1, 1)]);
    }

    #[test]
    fn uuids_shorten_and_generations_read_in_words() {
        assert_eq!(short_uuid("GPU-0123456789abcdef"), "GPU-01234567…cdef");
        assert_eq!(short_uuid("GPU-00000000-0000-4000-8000-0000dead0001"), "GPU-00000000…0001");
        assert_eq!(short_uuid("GPU-1"), "GPU-1");
        assert_eq!(generation_words(7, 7), "configuration applied (generation 7)");
        assert_eq!(generation_words(6, 7), "applying configuration 7 (its agent has applied 6)");
        assert_eq!(generation_words(0, 0), "no configuration yet");
    }
}
