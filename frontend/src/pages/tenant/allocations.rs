//! The tenant's allocations, each with a "Use this slice" panel: the host, the environment line, a container and a
//! Kubernetes snippet to copy, the expiry with a countdown, and a link to the request it serves.
//!
//! The list is redrawn only when the data changes (the page refreshes every 3 s), and which panels are open is kept
//! across redraws; the countdowns tick every second on their own.

use std::collections::HashSet;

use leptos::prelude::*;
use tessera_api::allocations::AllocationView;

use crate::api::Problem;
use crate::pages::shared::short;
use crate::pages::{countdown, datetime, now_ms};
use crate::widgets::{CopyButton, problem_view};

/// The container image the snippet runs (`nvidia-smi -L` lists the devices the container sees).
pub const CUDA_IMAGE: &str = "nvidia/cuda:12.4.1-base-ubuntu22.04";

/// What a workload needs to use an active slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snippets {
    /// `CUDA_VISIBLE_DEVICES=...` for a process on the node.
    pub env: String,
    /// `docker run` with the NVIDIA Container Toolkit.
    pub docker: String,
    /// A pod's container `resources.limits` and the node to run on.
    pub kubernetes: String,
    /// What that snippet cannot do: the device plugin picks the instance, not Tessera.
    pub kubernetes_note: String,
}

/// The snippets of an allocation, once it is active (it has a device). With a ResourceClaim (a DRA cluster), the
/// pod spec references it, which pins the pod to exactly this device; otherwise it is the device plugin's request,
/// and the note says plainly what that cannot do.
pub fn snippets(a: &AllocationView) -> Option<Snippets> {
    let device = a.cuda_visible_devices.as_ref().or(a.device_uuid.as_ref())?;
    if let Some(claim) = a.claims.first() {
        let elsewhere: Vec<String> =
            a.claims.iter().skip(1).map(|c| format!("{} ({})", c.namespace, c.cluster)).collect();
        let also = if elsewhere.is_empty() {
            String::new()
        } else {
            format!(
                " The same claim is in your namespaces {} too; one of them at a time gets the device.",
                elsewhere.join(", ")
            )
        };
        let using =
            if claim.pods.is_empty() { String::new() } else { format!(" In use now by {}.", claim.pods.join(", ")) };
        return Some(Snippets {
            env: format!("CUDA_VISIBLE_DEVICES={device}"),
            docker: format!("docker run --rm --gpus '\"device={device}\"' {CUDA_IMAGE} nvidia-smi -L"),
            kubernetes: format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: work\n  namespace: {}\nspec:\n  resourceClaims:\n  \
                 - name: gpu\n    resourceClaimName: {}\n  containers:\n  - name: work\n    image: {CUDA_IMAGE}\n    \
                 command: [\"nvidia-smi\", \"-L\"]\n    resources:\n      claims:\n      - name: gpu\n  restartPolicy: Never",
                claim.namespace, claim.name
            ),
            kubernetes_note: format!(
                "The ResourceClaim {} in namespace {} (cluster {}) can be allocated only this device ({device}): a \
                 pod that references it gets this slice and no other.{using}{also}",
                claim.name, claim.namespace, claim.cluster
            ),
        });
    }
    Some(Snippets {
        env: format!("CUDA_VISIBLE_DEVICES={device}"),
        docker: format!("docker run --rm --gpus '\"device={device}\"' {CUDA_IMAGE} nvidia-smi -L"),
        kubernetes: format!(
            "nodeSelector:\n  kubernetes.io/hostname: {}\ncontainers:\n- name: work\n  image: {CUDA_IMAGE}\n  \
             resources:\n    limits:\n      {}: 1",
            a.node, a.k8s_resource
        ),
        kubernetes_note: format!(
            "NVIDIA's device plugin gives the pod a free {} of {}: it cannot pin this one ({device}), so the pod \
             may get another instance of the node, another tenant's included. Only a DRA ResourceClaim selects \
             one device (docs/kubernetes.md).",
            a.k8s_resource, a.node
        ),
    })
}

/// What each Kubernetes claim of an allocation says, one line per claim: where it is, and whether a pod uses it.
pub fn claim_lines(a: &AllocationView) -> Vec<String> {
    a.claims
        .iter()
        .map(|c| {
            let state = match (c.allocated, c.pods.as_slice()) {
                (_, []) if !c.allocated => "no pod uses it yet".to_string(),
                (_, []) => "allocated, no pod on it".to_string(),
                (_, pods) => format!("in use by {}", pods.join(", ")),
            };
            format!("ResourceClaim {} in {} ({}): {state}", c.name, c.namespace, c.cluster)
        })
        .collect()
}

/// Who runs on an allocation now, as its node's agent last reported: `Runs now: python3 of ann, pid 7; pod
/// ml-a/train-0 (container main), pid 9`; `None` when nothing does.
pub fn runs_line(a: &AllocationView) -> Option<String> {
    let who: Vec<String> = a
        .processes
        .iter()
        .map(|p| crate::pages::shared::who_runs(p.pid, p.user.as_deref(), p.command.as_deref(), p.pod.as_ref()))
        .collect();
    (!who.is_empty()).then(|| format!("Runs now: {}", who.join("; ")))
}

/// What the state column says.
pub fn state_text(a: &AllocationView) -> String {
    match (a.state.as_str(), a.waiting_for_layout) {
        (_, true) => "waiting for its MIG layout".into(),
        ("active", _) => "ready".into(),
        ("reserved", _) => "being set up on the node".into(),
        ("prepared", _) => "prepared for its reservation: usable from the window's start".into(),
        (s, _) => s.to_string(),
    }
}

/// The notice on a borrowed slice that a lender needs back: who needs it, and when it is released.
pub fn reclaim_text(a: &AllocationView, now: i64) -> Option<String> {
    let at = a.reclaim_at_ms?;
    let who =
        a.reclaim_for.as_deref().map_or_else(|| "another team of your cohort".to_string(), |t| format!("team {t}"));
    let when = if at <= now { "now".to_string() } else { format!("in {} (at {})", countdown(at, now), datetime(at)) };
    Some(format!(
        "Being taken back: this slice is borrowed and {who} needs its guaranteed capacity. Save your work: it is \
         released {when}."
    ))
}

/// The allocations card's content.
#[component]
pub fn AllocationsList(
    allocations: Resource<Result<Vec<AllocationView>, Problem>>,
    /// What an empty list says.
    #[prop(default = "Nothing allocated yet. Ask for a slice with the form above.")]
    empty_text: &'static str,
) -> impl IntoView {
    // Redrawn only when the list changes; the open panels are remembered by allocation id.
    let latest = RwSignal::new(None::<Result<Vec<AllocationView>, Problem>>);
    Effect::new(move |_| {
        let Some(fresh) = allocations.get() else { return };
        if latest.with_untracked(|l| l.as_ref() != Some(&fresh)) {
            latest.set(Some(fresh));
        }
    });
    let open = RwSignal::new(HashSet::<String>::new());
    let now = RwSignal::new(now_ms());
    #[cfg(feature = "hydrate")]
    {
        if let Ok(handle) = set_interval_with_handle(move || now.set(now_ms()), std::time::Duration::from_secs(1)) {
            on_cleanup(move || handle.clear());
        }
    }
    move || match latest.get() {
        None => view! { <p>"Loading…"</p> }.into_any(),
        Some(Err(p)) => problem_view(&p),
        Some(Ok(list)) if list.is_empty() => view! { <p class="muted">{empty_text}</p> }.into_any(),
        Some(Ok(list)) => view! {
            <ul class="allocations" data-testid="allocations">
                {list.into_iter().map(|a| allocation_item(a, open, now)).collect_view()}
            </ul>
        }
        .into_any(),
    }
}

fn allocation_item(a: AllocationView, open: RwSignal<HashSet<String>>, now: RwSignal<i64>) -> impl IntoView {
    let id = a.id.clone();
    let is_open = {
        let id = id.clone();
        Signal::derive(move || open.with(|o| o.contains(&id)))
    };
    let toggle = {
        let id = id.clone();
        move |_| {
            open.update(|o| {
                if !o.remove(&id) {
                    o.insert(id.clone());
                }
            })
        }
    };
    let ready = a.state == "active" && !a.waiting_for_layout;
    let expiry = a.expires_at_ms;
    let borrowed = a.borrowed;
    let reclaim = {
        let a = a.clone();
        move || reclaim_text(&a, now.get())
    };
    let reclaimed = a.reclaim_at_ms.is_some();
    let request_link = format!("/requests/{}", a.request);
    let snips = snippets(&a);
    let claims = claim_lines(&a);
    let runs = runs_line(&a);
    let where_ = format!("{} · GPU {} · {}", a.node, a.gpu_index, a.model);
    let (state, profile, alloc_state, request_short) =
        (state_text(&a), a.profile.clone(), a.state.clone(), format!("request {}", short(&a.request)));
    view! {
        <li class="allocation" data-allocation=id data-state=alloc_state data-reclaim=reclaimed.to_string()>
            <Show when=move || reclaimed>
                <p class="notice reclaim" role="alert" data-testid="reclaim-banner">{reclaim.clone()}</p>
            </Show>
            <div class="alloc-head">
                <span class=format!("state {}", if ready { "ready" } else { "applying" })>{state}</span>
                <strong>{profile}</strong>
                <Show when=move || borrowed>
                    <span class="badge" title="Held above your team's guarantee, lent by another team of your cohort; it can be taken back when the lender needs it">"borrowed"</span>
                </Show>
                <span class="muted">{where_.clone()}</span>
                <span class="expiry" data-testid="expiry">
                    {move || match expiry {
                        Some(t) => format!("expires {} (in {})", datetime(t), countdown(t, now.get())),
                        None => "no end set: held until released".to_string(),
                    }}
                </span>
                <a href=request_link class="small">{request_short}</a>
                <button class="button small" type="button" data-testid="use-slice" aria-expanded=move || is_open.get().to_string() on:click=toggle>
                    {move || if is_open.get() { "Hide" } else { "Use this slice" }}
                </button>
            </div>
            {runs.map(|r| view! { <p class="runs small" data-testid="runs">{r}</p> })}
            {(!claims.is_empty()).then(|| view! {
                <ul class="claims small" data-testid="claims">
                    {claims.into_iter().map(|c| view! { <li>{c}</li> }).collect_view()}
                </ul>
            })}
            <Show when=move || is_open.get()>
                {
                    let snips = snips.clone();
                    let where_ = where_.clone();
                    let a = a.clone();
                    move || match snips.clone() {
                        None => view! {
                            <div class="use-slice" data-testid="use-panel">
                                <p class="muted">"The slice is still being set up on its node; what to run appears here once it is ready (usually within seconds; a layout change waits for an admin first)."</p>
                            </div>
                        }.into_any(),
                        Some(s) => view! {
                            <div class="use-slice" data-testid="use-panel">
                                <p>"Host "<strong>{a.node.clone()}</strong><span class="muted">{format!(" ({where_}), device ")}</span><code>{a.device_uuid.clone().unwrap_or_default()}</code></p>
                                <h4>"On the node"</h4>
                                <div class="snippet"><pre data-testid="env-line">{s.env.clone()}</pre><CopyButton text=s.env.clone() label="environment line" /></div>
                                <h4>"In a container (NVIDIA Container Toolkit)"</h4>
                                <div class="snippet"><pre data-testid="docker">{s.docker.clone()}</pre><CopyButton text=s.docker.clone() label="docker command" /></div>
                                <h4>"In Kubernetes (pod spec)"</h4>
                                <div class="snippet"><pre data-testid="k8s">{s.kubernetes.clone()}</pre><CopyButton text=s.kubernetes.clone() label="Kubernetes snippet" /></div>
                                <p class="small warn" data-testid="k8s-note">{s.kubernetes_note.clone()}</p>
                            </div>
                        }.into_any(),
                    }
                }
            </Show>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(active: bool) -> AllocationView {
        AllocationView {
            id: "a1".into(),
            request: "r1".into(),
            state: if active { "active" } else { "reserved" }.into(),
            node: "demo-node-1".into(),
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            model: "H100-80GB".into(),
            profile: "1g.10gb".into(),
            start: 6,
            k8s_resource: "nvidia.com/mig-1g.10gb".into(),
            waiting_for_layout: false,
            device_uuid: active.then(|| "MIG-abc".into()),
            cuda_visible_devices: active.then(|| "MIG-abc".into()),
            expires_at_ms: None,
            borrowed: false,
            reclaim_at_ms: None,
            reclaim_for: None,
            claims: vec![],
            processes: vec![],
        }
    }

    #[test]
    fn an_active_slice_comes_with_what_to_run() {
        let s = snippets(&allocation(true)).expect("active");
        assert_eq!(s.env, "CUDA_VISIBLE_DEVICES=MIG-abc");
        assert!(s.docker.contains("--gpus '\"device=MIG-abc\"'"), "{}", s.docker);
        assert!(s.kubernetes.contains("nvidia.com/mig-1g.10gb: 1"), "{}", s.kubernetes);
        assert!(s.kubernetes.contains("kubernetes.io/hostname: demo-node-1"), "{}", s.kubernetes);
        assert!(s.kubernetes_note.contains("cannot pin this one (MIG-abc)"), "{}", s.kubernetes_note);
        assert!(s.kubernetes_note.contains("another tenant's"), "{}", s.kubernetes_note);
        assert_eq!(snippets(&allocation(false)), None);
        assert_eq!(state_text(&allocation(true)), "ready");
        assert_eq!(state_text(&allocation(false)), "being set up on the node");
        let prepared = AllocationView { state: "prepared".into(), ..allocation(false) };
        assert_eq!(state_text(&prepared), "prepared for its reservation: usable from the window's start");
        assert!(snippets(&prepared).is_none(), "no snippet for a slice not usable yet");
    }

    #[test]
    fn who_runs_on_a_slice_is_one_line() {
        assert_eq!(runs_line(&allocation(true)), None, "nothing runs");
        let p = |pid: u32, pod: Option<&str>| tessera_api::nodes::ProcessView {
            device: "MIG-abc".into(),
            pid,
            user: Some("ann".into()),
            command: Some("python3".into()),
            pod: pod.map(|name| tessera_core::attribution::PodRef {
                namespace: "ml-a".into(),
                pod: name.into(),
                container: "main".into(),
            }),
            allocation: Some("a1".into()),
            unallocated: None,
            since_ms: 0,
        };
        let a = AllocationView { processes: vec![p(7, None), p(9, Some("train-0"))], ..allocation(true) };
        assert_eq!(
            runs_line(&a).as_deref(),
            Some("Runs now: python3 of ann, pid 7; pod ml-a/train-0 (container main), pid 9")
        );
    }

    #[test]
    fn with_a_claim_the_pod_spec_references_it_and_says_it_is_pinned() {
        let claim = |ns: &str, pods: &[&str]| tessera_api::allocations::ClaimView {
            cluster: "prod".into(),
            namespace: ns.into(),
            name: "tessera-a1".into(),
            allocated: !pods.is_empty(),
            pods: pods.iter().map(|p| p.to_string()).collect(),
            observed_at_ms: 0,
        };
        let a = AllocationView { claims: vec![claim("ml-a", &["trainer-0"]), claim("ml-a2", &[])], ..allocation(true) };
        let s = snippets(&a).expect("active");
        assert!(s.kubernetes.contains("namespace: ml-a\n"), "{}", s.kubernetes);
        assert!(s.kubernetes.contains("resourceClaimName: tessera-a1"), "{}", s.kubernetes);
        assert!(s.kubernetes.contains("claims:\n      - name: gpu"), "{}", s.kubernetes);
        assert!(
            !s.kubernetes.contains("nvidia.com/mig"),
            "no device-plugin request beside the claim: {}",
            s.kubernetes
        );
        assert!(s.kubernetes_note.contains("can be allocated only this device (MIG-abc)"), "{}", s.kubernetes_note);
        assert!(s.kubernetes_note.contains("In use now by trainer-0."), "{}", s.kubernetes_note);
        assert!(s.kubernetes_note.contains("ml-a2 (prod)"), "{}", s.kubernetes_note);
        assert_eq!(
            claim_lines(&a),
            [
                "ResourceClaim tessera-a1 in ml-a (prod): in use by trainer-0",
                "ResourceClaim tessera-a1 in ml-a2 (prod): no pod uses it yet"
            ]
        );
    }
}
