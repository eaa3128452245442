//! The clusters card of `/admin/tenants` (platform admins): each Kubernetes cluster with how its pods get devices,
//! how the server reaches it (and why it cannot, where it cannot), its nodes and the namespaces that belong to
//! tenants; forms to register a cluster and to give a tenant a namespace, and a button to give one up.

use leptos::prelude::*;
use tessera_api::clusters::{ClusterView, GovernNamespace, Mode, NamespaceView, NewCluster};

use crate::api::{self, ProblemExt};
use crate::widgets::{TenantsResource, problem_view};

/// What a cluster's mode means for its tenants, in words.
pub fn mode_text(mode: Mode) -> &'static str {
    match mode {
        Mode::Dra => "DRA: each allocation is a ResourceClaim on exactly its device",
        Mode::DevicePlugin => "device plugin: a pod gets a free device of the kind asked for, which Tessera cannot pin",
    }
}

/// How the server reaches a cluster, in words.
pub fn credentials_text(c: &ClusterView) -> String {
    match &c.kubeconfig {
        Some(name) => format!("kubeconfig {name} from the server's settings"),
        None => "the server's in-cluster service account".to_string(),
    }
}

/// How the controller's last reconcile went, in words.
pub fn sync_text(c: &ClusterView) -> String {
    match (&c.sync.error, c.sync.synced_at_ms) {
        (Some(e), _) => format!("Not in step: {e}"),
        (None, Some(at)) => format!("In step with Tessera (last checked {}).", crate::pages::datetime(at)),
        (None, None) => "Not reconciled yet.".to_string(),
    }
}

/// The clusters card.
#[component]
pub fn ClustersCard() -> impl IntoView {
    let tenants = expect_context::<TenantsResource>();
    let clusters = Resource::new(|| (), |_| api::get_json::<Vec<ClusterView>>("/api/v1/clusters".into()));
    let name = RwSignal::new(String::new());
    let mode = RwSignal::new("dra".to_string());
    let kubeconfig = RwSignal::new(String::new());
    let cluster = RwSignal::new(String::new());
    let namespace = RwSignal::new(String::new());
    let tenant = RwSignal::new(String::new());
    let message = RwSignal::new(None::<(bool, String)>);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Some(m) = Mode::parse(&mode.get_untracked()) else {
            message.set(Some((false, "Choose how the cluster's pods get devices.".into())));
            return;
        };
        let k = kubeconfig.get_untracked().trim().to_string();
        let body = NewCluster {
            name: name.get_untracked().trim().to_string(),
            mode: m,
            kubeconfig: (!k.is_empty()).then_some(k),
        };
        leptos::task::spawn_local(async move {
            match api::send_json::<ClusterView>("POST", "/api/v1/clusters".into(), body).await {
                Ok(c) => {
                    let warning = c
                        .credentials_problem
                        .as_deref()
                        .map(|w| format!(" Not reachable yet: {w}."))
                        .unwrap_or_default();
                    message.set(Some((true, format!("Registered cluster {}.{warning}", c.name))));
                    name.set(String::new());
                    kubeconfig.set(String::new());
                    clusters.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let govern = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (c, n, t) = (cluster.get_untracked(), namespace.get_untracked().trim().to_string(), tenant.get_untracked());
        if c.is_empty() || t.is_empty() || n.is_empty() {
            message.set(Some((false, "Choose a cluster and a tenant, and name the namespace.".into())));
            return;
        }
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/clusters/{c}/namespaces/{n}");
            match api::send_json::<NamespaceView>("PUT", path, GovernNamespace { tenant: t }).await {
                Ok(v) => {
                    message.set(Some((
                        true,
                        format!("Namespace {} of {} belongs to {}.", v.namespace, v.cluster_name, v.tenant_name),
                    )));
                    namespace.set(String::new());
                    clusters.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let release = move |c: NamespaceView| {
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/clusters/{}/namespaces/{}", c.cluster, c.namespace);
            match api::send_empty::<()>("DELETE", path).await {
                Ok(()) => {
                    message.set(Some((
                        true,
                        format!("Namespace {} of {} is no longer governed.", c.namespace, c.cluster_name),
                    )));
                    clusters.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <section class="card" data-testid="clusters">
            <h2>"Kubernetes clusters"</h2>
            <p class="muted small">"Namespaces given to a tenant are where its allocations become Kubernetes objects. A namespace belongs to one tenant; give it up before giving it to another."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let (list, all_tenants) = match (clusters.await, tenants.await) {
                        (Err(p), _) | (_, Err(p)) => return problem_view(&p),
                        (Ok(c), Ok(t)) => (c, t),
                    };
                    view! {
                        {if list.is_empty() { Some(view! { <p class="muted">"No clusters registered."</p> }) } else { None }}
                        {list.iter().map(|c| cluster_view(c.clone(), release)).collect_view()}
                        <form class="toolbar" data-testid="cluster-create" on:submit=create>
                            <label class="grow">"New cluster"<input type="text" name="cluster-name" placeholder="e.g. prod-east" bind:value=name /></label>
                            <label>"Devices through"
                                <select name="cluster-mode" bind:value=mode>
                                    <option value="dra">"DRA driver"</option>
                                    <option value="device_plugin">"device plugin"</option>
                                </select>
                            </label>
                            <label>"Kubeconfig (name in the settings; empty: in-cluster)"<input type="text" name="cluster-kubeconfig" bind:value=kubeconfig /></label>
                            <button class="button" type="submit">"Register cluster"</button>
                        </form>
                        <form class="toolbar" data-testid="namespace-govern" on:submit=govern>
                            <label>"Cluster"
                                <select name="govern-cluster" bind:value=cluster>
                                    <option value="">"—"</option>
                                    {list.iter().map(|c| view! { <option value=c.id.clone()>{c.name.clone()}</option> }).collect_view()}
                                </select>
                            </label>
                            <label class="grow">"Namespace"<input type="text" name="govern-namespace" placeholder="e.g. ml-vision" bind:value=namespace /></label>
                            <label>"Tenant"
                                <select name="govern-tenant" bind:value=tenant>
                                    <option value="">"—"</option>
                                    {all_tenants.iter().map(|t| view! { <option value=t.id.clone()>{t.name.clone()}</option> }).collect_view()}
                                </select>
                            </label>
                            <button class="button" type="submit">"Give namespace"</button>
                        </form>
                    }.into_any()
                })}
            </Transition>
            {move || message.get().map(|(ok, m)| view! { <p class="notice" class:error=!ok role="status">{m}</p> })}
        </section>
    }
}

fn cluster_view(c: ClusterView, release: impl Fn(NamespaceView) + Copy + Send + Sync + 'static) -> impl IntoView {
    let problem = c.credentials_problem.clone().map(
        |w| view! { <p class="notice error" data-testid="cluster-problem">{format!("Cannot reach it: {w}.")}</p> },
    );
    let nodes = if c.nodes.is_empty() {
        "no nodes yet".to_string()
    } else {
        format!("nodes: {}", c.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>().join(", "))
    };
    let empty = c.namespaces.is_empty().then(|| view! { <p class="muted">"No namespace belongs to a tenant yet."</p> });
    view! {
        <div class="cluster" data-cluster=c.name.clone()>
            <h3>{c.name.clone()}<span class="muted small">{format!(" · {} · {}", mode_text(c.mode), credentials_text(&c))}</span></h3>
            {problem}
            <p class="small" class:error=c.sync.error.is_some() data-testid="cluster-sync">{sync_text(&c)}</p>
            <p class="muted small">{nodes}</p>
            {empty}
            {(!c.namespaces.is_empty()).then(|| view! {
                <div class="table-wrap">
                <table>
                    <thead><tr><th scope="col">"Namespace"</th><th scope="col">"Tenant"</th><th scope="col"></th></tr></thead>
                    <tbody>
                        {c.namespaces.into_iter().map(|n| {
                            let label = format!("Give up {}", n.namespace);
                            let (ns, key, tenant) = (n.namespace.clone(), n.namespace.clone(), n.tenant_name.clone());
                            view! {
                                <tr data-namespace=key>
                                    <td><code>{ns}</code></td><td>{tenant}</td>
                                    <td><button class="button secondary" type="button" aria-label=label on:click=move |_| release(n.clone())>"Give up"</button></td>
                                </tr>
                            }
                        }).collect_view()}
                    </tbody>
                </table>
                </div>
            })}
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_credentials_read_as_what_they_mean() {
        assert!(mode_text(Mode::Dra).contains("exactly its device"));
        assert!(mode_text(Mode::DevicePlugin).contains("cannot pin"));
        let mut c = ClusterView {
            id: "c".into(),
            name: "prod".into(),
            mode: Mode::Dra,
            kubeconfig: Some("east".into()),
            credentials_problem: None,
            created_at_ms: 0,
            namespaces: vec![],
            nodes: vec![],
            sync: Default::default(),
        };
        assert_eq!(credentials_text(&c), "kubeconfig east from the server's settings");
        c.kubeconfig = None;
        assert_eq!(credentials_text(&c), "the server's in-cluster service account");
        assert_eq!(sync_text(&c), "Not reconciled yet.");
        c.sync.error = Some("listing Tessera's ResourceClaims: 503".into());
        assert_eq!(sync_text(&c), "Not in step: listing Tessera's ResourceClaims: 503");
    }
}
