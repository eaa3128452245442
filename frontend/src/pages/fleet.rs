//! `/fleet`: every node and GPU with its state, applied against desired generation, instances and errors, and per
//! GPU two switches: cordoned (it gets nothing new) and auto-layout (the planner may change its MIG layout without
//! an admin's approval); and each GPU's health (healthy, degraded or unhealthy, with the findings and the temperature
//! its agent read). It refreshes itself every 5 s in the browser.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::nodes::{GpuView, NodeView};

use crate::api::{self, ProblemExt};
use crate::pages::{ago, clock, now_ms};
use crate::widgets::{Messages, problem_view};
use crate::wire::gpu_state;

/// The fleet page.
#[component]
pub fn FleetPage() -> impl IntoView {
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(move || nodes.refetch(), std::time::Duration::from_secs(5)) {
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
                    match nodes.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="notice">"No nodes yet. Create a join token (" <code>"tessera node join-token"</code> ") and start an agent."</p> }.into_any(),
                        Ok(list) => {
                            let now = now_ms();
                            view! {
                                <div class="legend" aria-hidden="true">
                                    {["ready", "applying", "failed", "not-ready", "cordoned"].map(|s| view! { <span class=format!("state {s}")>{s}</span> })}
                                </div>
                                {move || {
                                    let needle = filter.get().to_lowercase();
                                    list.iter()
                                        .filter(|n| needle.is_empty() || matches(n, &needle))
                                        .map(|n| view! { <NodeCard node=n.clone() now changed /> })
                                        .collect_view()
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

#[component]
fn NodeCard(node: NodeView, now: i64, changed: Callback<(bool, String)>) -> impl IntoView {
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
                <span class="muted" title="Applied / desired spec generation">
                    {format!("generation {} / {}", node.observed_generation, node.generation)}
                </span>
                {agent.map(|a| view! { <span class="muted">{a}</span> })}
                {seen.map(|s| view! { <span class="muted">{s}</span> })}
            </header>
            {(!node.errors.is_empty()).then(|| view! {
                <ul class="errors">{node.errors.iter().map(|e| view! { <li><code>{e.code.clone()}</code>" "{e.step.clone()}": "{e.message.clone()}</li> }).collect_view()}</ul>
            })}
            <table class="gpus">
                <thead><tr><th scope="col">"GPU"</th><th scope="col">"Model"</th><th scope="col">"State"</th><th scope="col" title="What its agent reads from the driver: XID errors, ECC, row remapping, throttling, temperature">"Health"</th><th scope="col">"Instances (applied / desired)"</th><th scope="col">"UUID"</th><th scope="col" title="A cordoned GPU gets nothing new">"Cordoned"</th><th scope="col" title="The planner may change the MIG layout without an admin's approval">"Auto-layout"</th><th scope="col"><span class="sr-only">"Actions"</span></th></tr></thead>
                <tbody>
                    {node.gpus.iter().map(|g| view! { <GpuRow gpu=g.clone() node_name=node.name.clone() node_state=node.state.clone() changed /> }).collect_view()}
                </tbody>
            </table>
        </article>
    }
}

#[component]
fn GpuRow(gpu: GpuView, node_name: String, node_state: String, changed: Callback<(bool, String)>) -> impl IntoView {
    let name = format!("{node_name} GPU {}", gpu.index);
    let (id, cordoned, auto_layout) = (gpu.id.clone(), gpu.cordoned, gpu.auto_layout);
    let on_cordon = {
        let (id, name) = (id.clone(), name.clone());
        move |_| {
            let (id, name) = (id.clone(), name.clone());
            leptos::task::spawn_local(async move {
                let verb = if cordoned { "uncordon" } else { "cordon" };
                let r = api::send_empty::<GpuView>("POST", format!("/api/v1/gpus/{id}/{verb}")).await;
                changed.run(match r {
                    Ok(g) if g.cordoned => (true, format!("{name} is cordoned: it gets nothing new.")),
                    Ok(_) => (true, format!("{name} takes new slices again.")),
                    Err(p) => (false, format!("{name}: {}", p.message())),
                });
            });
        }
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
        move |_| {
            let (id, name) = (id.clone(), name.clone());
            #[cfg(feature = "hydrate")]
            {
                let ask = format!("Drain {name}? It is cordoned now; slices still on it in one hour end then.");
                if !web_sys::window().and_then(|w| w.confirm_with_message(&ask).ok()).unwrap_or(false) {
                    return;
                }
            }
            leptos::task::spawn_local(async move {
                let body = tessera_api::nodes::DrainBody {
                    deadline_s: Some(tessera_core::health::DEFAULT_DRAIN_S),
                    reason: Some("maintenance".to_string()),
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
        }
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
    view! {
        <tr data-gpu=gpu.uuid.clone()>
            <td>{gpu.index}</td>
            <td>{gpu.model.clone()}</td>
            <td>
                <span class=format!("state {state}")>{state}</span>
                {drain.clone().map(|(kind, text)| view! { <div class="muted" data-testid="drain" data-drain=kind>{text}</div> })}
            </td>
            <td data-testid="health" data-health=health.state.as_str()>{health_cell(&health)}</td>
            <td>
                {counts.map(|c| view! { <span class="count">{c}</span> })}
                " "
                {instances}
                {(!gpu.errors.is_empty()).then(|| view! {
                    <ul class="errors">{gpu.errors.iter().map(|e| view! { <li><code>{e.code.clone()}</code>" "{e.step.clone()}": "{e.message.clone()}</li> }).collect_view()}</ul>
                })}
            </td>
            <td><code class="uuid">{gpu.uuid.clone()}</code></td>
            <td><label class="switch-cell"><input type="checkbox" role="switch" data-testid="cordon" prop:checked=cordoned on:change=on_cordon aria-label=format!("Cordon {name}") /></label></td>
            <td>{gpu.mig_enabled.then(|| view! { <label class="switch-cell"><input type="checkbox" role="switch" data-testid="auto-layout" prop:checked=auto_layout on:change=on_auto aria-label=format!("Auto-layout on {name}") /></label> })}</td>
            <td>
                {gpu.mig_enabled.then(|| view! { <A href=format!("/gpus/{}/layout", gpu.id) attr:data-testid="edit-layout">"Edit layout"</A> })}
                {drain.is_none().then(|| view! { <button type="button" class="link" data-testid="drain-gpu" on:click=on_drain title="Cordon it, tell its holders, end their slices in one hour">"Drain"</button> })}
            </td>
        </tr>
    }
}

/// A GPU's health: its state, the temperature its agent last read, and the findings (an unhealthy GPU is cordoned
/// until an admin uncordons it, which returns it to service).
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
