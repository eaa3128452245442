//! `/gpus/:id/layout` (platform admins): the MIG layout editor. One GPU as its placement units, the draft's
//! instances where they sit; pick a profile and click one of its allowed starts to add it, click an instance to
//! take it out. Every move is checked by the core's `layout::validate` (the rules the planner, the server and the
//! agent use), and refused moves say why in its words. Instances held by an allocation or running processes are
//! locked. The draft is shown as a diff against the GPU's layout, proposed, and approved like any other change.

use leptos::prelude::*;
use leptos_router::hooks::use_params_map;
use tessera_api::layouts::{LayoutEdit, LayoutView};
use tessera_api::nodes::{GpuView, NodeView};
use tessera_core::catalog::{Catalog, GpuModel};
use tessera_core::layout::{InstanceSpec, PlacedInstance, validate};

use crate::api::{self, ProblemExt};
use crate::pages::approvals::LayoutCard;
use crate::pages::slots::{diff_view, units};
use crate::widgets::{Messages, problem_view};
use crate::wire::node_with_gpu;

/// An instance that cannot go, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// The instance.
    pub instance: PlacedInstance,
    /// Why it is locked, for people.
    pub why: String,
}

/// The GPU's instances that a new layout must keep: those held by an allocation (reserved or active) and those
/// the agent reports processes in.
pub fn locks(gpu: &GpuView) -> Vec<Lock> {
    let mut out: Vec<Lock> = gpu
        .in_use
        .iter()
        .map(|u| Lock {
            instance: PlacedInstance { profile: u.profile.clone(), start: u.start },
            why: format!("held by request …{} ({})", crate::pages::shared::short(&u.request), u.state),
        })
        .collect();
    for a in gpu.applied.iter().flatten().filter(|a| !a.processes.is_empty()) {
        let instance = PlacedInstance { profile: a.profile.clone(), start: a.start };
        if !out.iter().any(|l| l.instance == instance) {
            out.push(Lock { instance, why: format!("{} process(es) running", a.processes.len()) });
        }
    }
    out
}

fn specs(layout: &[PlacedInstance]) -> Vec<InstanceSpec> {
    layout.iter().map(|i| InstanceSpec { profile: i.profile.clone(), start: Some(i.start) }).collect()
}

/// `draft` with `profile@start` added, as the core validates it; `Err`: the core's messages.
pub fn try_add(
    model: &GpuModel,
    draft: &[PlacedInstance],
    profile: &str,
    start: u8,
) -> Result<Vec<PlacedInstance>, Vec<String>> {
    let mut next = specs(draft);
    next.push(InstanceSpec { profile: profile.to_string(), start: Some(start) });
    validate(model, &next).map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// `draft` without `inst`; `Err` when it is locked.
pub fn try_remove(
    draft: &[PlacedInstance],
    inst: &PlacedInstance,
    locks: &[Lock],
) -> Result<Vec<PlacedInstance>, String> {
    if let Some(l) = locks.iter().find(|l| l.instance == *inst) {
        return Err(format!("{}@{} is in use ({}); a new layout must keep it", inst.profile, inst.start, l.why));
    }
    Ok(draft.iter().filter(|i| *i != inst).cloned().collect())
}

/// What going from `current` to `draft` creates and destroys.
pub fn diff(current: &[PlacedInstance], draft: &[PlacedInstance]) -> (Vec<PlacedInstance>, Vec<PlacedInstance>) {
    let created = draft.iter().filter(|i| !current.contains(i)).cloned().collect();
    let destroyed = current.iter().filter(|i| !draft.contains(i)).cloned().collect();
    (created, destroyed)
}

/// Rows for a profile's placements, so that overlapping ones (none on most models) do not hide each other:
/// `(start, size, row)`.
pub fn placement_rows(model: &GpuModel, profile: &str) -> Vec<(u8, u8, u8)> {
    let Some(p) = model.profile(profile) else { return Vec::new() };
    let mut rows: Vec<u8> = Vec::new(); // per row, the first free unit
    let mut out = Vec::new();
    let mut placements = p.placements.clone();
    placements.sort_by_key(|pl| pl.start);
    for pl in placements {
        let row = match rows.iter().position(|&free| free <= pl.start) {
            Some(r) => r,
            None => {
                rows.push(0);
                rows.len() - 1
            }
        };
        rows[row] = pl.start + pl.size;
        out.push((pl.start, pl.size, row as u8));
    }
    out
}

fn locate(nodes: &[NodeView], id: &str) -> Option<(String, GpuView)> {
    nodes.iter().find_map(|n| n.gpus.iter().find(|g| g.id == id || g.uuid == id).map(|g| (n.name.clone(), g.clone())))
}

/// The layout editor page.
#[component]
pub fn LayoutEditorPage() -> impl IntoView {
    let params = use_params_map();
    let gpu_id = move || params.read().get("id").unwrap_or_default();
    let nodes = Resource::new(|| (), |_| api::get_json::<Vec<NodeView>>("/api/v1/nodes".into()));
    view! {
        <section class="page">
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let id = gpu_id();
                    match nodes.await {
                        Err(p) => problem_view(&p),
                        Ok(list) => match locate(&list, &id) {
                            None => view! { <h1>"Layout editor"</h1><p class="notice error" role="alert">{format!("There is no GPU {id}.")}</p> }.into_any(),
                            Some((node, gpu)) if !gpu.mig_enabled => view! {
                                <h1>{format!("{node} · GPU {} · {}", gpu.index, gpu.model)}</h1>
                                <p class="notice">"This GPU is not in MIG mode: it is shared whole (exclusive, time-slicing or MPS). Tessera never changes the MIG mode."</p>
                            }.into_any(),
                            Some((node, gpu)) => view! { <Editor node gpu on_applied=Callback::new(move |()| nodes.refetch()) /> }.into_any(),
                        },
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn Editor(node: String, gpu: GpuView, on_applied: Callback<()>) -> impl IntoView {
    let Some((model, _)) = Catalog::builtin().resolve(&gpu.model) else {
        return view! { <p class="notice error">{format!("{} is not in the catalog.", gpu.model)}</p> }.into_any();
    };
    let locks = StoredValue::new(locks(&gpu));
    let current = StoredValue::new(gpu.layout.clone());
    let draft = RwSignal::new(gpu.layout.clone());
    let profile = RwSignal::new(model.profiles.first().map(|p| p.name.clone()).unwrap_or_default());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let say = move |ok: bool, m: String| messages.set(vec![(ok, m)]);
    let proposals = Resource::new(|| (), |_| api::get_json::<Vec<LayoutView>>("/api/v1/layouts?state=proposed".into()));
    let gpu_id = StoredValue::new(gpu.id.clone());
    let n = units(&gpu.model);
    let model_key = StoredValue::new(model.key.clone());
    let fleet_gpu = StoredValue::new(gpu.clone());
    let node_name = StoredValue::new(node.clone());

    let add = move |start: u8| {
        let p = profile.get_untracked();
        match try_add(model, &draft.get_untracked(), &p, start) {
            Ok(next) => {
                draft.set(next);
                say(true, format!("Added {p}@{start}."));
            }
            Err(errors) => messages.set(errors.into_iter().map(|e| (false, e)).collect()),
        }
    };
    let remove = move |inst: PlacedInstance| match try_remove(&draft.get_untracked(), &inst, &locks.read_value()) {
        Ok(next) => {
            draft.set(next);
            say(true, format!("Took out {}@{}.", inst.profile, inst.start));
        }
        Err(m) => say(false, m),
    };
    let propose = move |_| {
        let body = LayoutEdit { instances: specs(&draft.get_untracked()) };
        let id = gpu_id.get_value();
        leptos::task::spawn_local(async move {
            match api::send_json::<LayoutView>("PUT", format!("/api/v1/gpus/{id}/layout"), body).await {
                Ok(_) => {
                    say(true, "Proposed: approve it below to apply it.".into());
                    proposals.refetch();
                }
                Err(p) => say(false, p.message()),
            }
        });
    };
    let changed = move || {
        let (c, d) = diff(&current.read_value(), &draft.get());
        !c.is_empty() || !d.is_empty()
    };

    view! {
        <div class="title-row">
            <h1>{format!("{node} · GPU {} · {}", gpu.index, gpu.model)}</h1>
            <span class="muted small">{format!("layout version {} · auto-layout {}", gpu.layout_version, if gpu.auto_layout { "on" } else { "off" })}</span>
        </div>
        <p class="muted">{format!("{n} placement units, {} compute and {} memory slices. Pick a profile, then one of its allowed starts.", model.compute_slices_total, model.memory_slices_total)}</p>
        <div class="card editor" data-testid="editor">
            <fieldset class="profiles">
                <legend>"Profile"</legend>
                {model.profiles.iter().map(|p| {
                    let name = p.name.clone();
                    let (a, b) = (name.clone(), name.clone());
                    let mem = p.memory_mib.map(|m| format!(" · {:.0} GB", f64::from(m) / 1024.0)).unwrap_or_default();
                    view! {
                        <label class="chip-radio">
                            <input type="radio" name="profile" value=name.clone() prop:checked=move || profile.get() == a
                                on:change=move |_| { profile.set(b.clone()); messages.set(vec![]); } />
                            {format!("{name} ({}c{mem})", p.compute_slices)}
                        </label>
                    }
                }).collect_view()}
            </fieldset>
            <div class="slots editor-grid" style=format!("--units:{n}") data-testid="draft">
                <span class="slots-label">"draft"</span>
                {(0..n).map(|u| view! { <span class="unit" style=format!("grid-column:{}", u + 2)></span> }).collect_view()}
                {move || draft.get().into_iter().map(|i| {
                    let Some((start, size)) = crate::pages::slots::span(&model_key.get_value(), &i) else { return ().into_any() };
                    let lock = locks.read_value().iter().find(|l| l.instance == i).map(|l| l.why.clone());
                    let is_new = !current.read_value().contains(&i);
                    let class = match (&lock, is_new) { (Some(_), _) => "inst locked", (None, true) => "inst created", (None, false) => "inst kept" };
                    let label = match &lock { Some(why) => format!("{}@{} locked: {why}", i.profile, i.start), None => format!("Take out {}@{}", i.profile, i.start) };
                    let what = i.clone();
                    view! {
                        <button type="button" class=class data-profile=i.profile.clone() data-start=i.start title=label.clone() aria-label=label
                            style=format!("grid-column:{} / span {}", start + 2, size) on:click=move |_| remove(what.clone())>
                            {i.profile.clone()}<small>{format!("@{}", i.start)}</small>
                        </button>
                    }.into_any()
                }).collect_view()}
            </div>
            <div class="slots starts" style=format!("--units:{n}") data-testid="starts">
                <span class="slots-label">"starts"</span>
                {move || {
                    let p = profile.get();
                    let d = draft.get();
                    placement_rows(model, &p).into_iter().map(|(start, size, row)| {
                        let verdict = try_add(model, &d, &p, start);
                        let ok = verdict.is_ok();
                        let why = verdict.err().map(|e| e.join("; ")).unwrap_or_else(|| format!("Add {p} at unit {start}"));
                        view! {
                            <button type="button" class="start" class:ok=ok class:blocked=!ok data-start=start title=why.clone()
                                aria-label=format!("{p} at {start}: {why}")
                                style=format!("grid-column:{} / span {};grid-row:{}", start + 2, size, row + 1)
                                on:click=move |_| add(start)>
                                {format!("+{start}")}
                            </button>
                        }
                    }).collect_view()
                }}
            </div>
            <Messages messages=messages testid="editor-messages" />
            <h2>"Change against the GPU's layout"</h2>
            <div data-testid="draft-diff">
                {move || {
                    let d = draft.get();
                    let (created, destroyed) = diff(&current.read_value(), &d);
                    diff_view(&model_key.get_value(), &d, &created, &destroyed)
                }}
            </div>
            <div class="actions">
                <button class="button primary" data-testid="propose" disabled=move || !changed() on:click=propose>"Propose layout"</button>
                <button class="button" on:click=move |_| { draft.set(current.get_value()); messages.set(vec![]); }>"Reset"</button>
                <button class="button" on:click=move |_| {
                    draft.set(locks.read_value().iter().map(|l| l.instance.clone()).collect());
                    say(true, "Kept only the instances in use.".into());
                }>"Keep only what is in use"</button>
            </div>
        </div>
        <h2>"Waiting for approval on this GPU"</h2>
        <Transition fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match proposals.await {
                    Err(p) => problem_view(&p),
                    Ok(list) => {
                        let id = gpu_id.get_value();
                        let mine: Vec<LayoutView> = list.into_iter().filter(|l| l.gpu == id).collect();
                        if mine.is_empty() {
                            return view! { <p class="muted" data-testid="no-layouts">"Nothing waits for approval on this GPU."</p> }.into_any();
                        }
                        let fleet = vec![node_with_gpu(node_name.get_value(), fleet_gpu.get_value())];
                        let reason = RwSignal::new("rejected in the layout editor".to_string());
                        mine.into_iter().map(|l| view! {
                            <LayoutCard l fleet=fleet.clone() reason on_done=Callback::new(move |m: (bool, String)| {
                                say(m.0, m.1);
                                proposals.refetch();
                                on_applied.run(());
                            }) />
                        }).collect_view().into_any()
                    }
                }
            })}
        </Transition>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::gpu;
    use tessera_api::nodes::InUse;
    use tessera_core::api::ObservedInstance;

    fn i(p: &str, s: u8) -> PlacedInstance {
        PlacedInstance { profile: p.into(), start: s }
    }

    fn h100() -> &'static GpuModel {
        Catalog::builtin().model("H100-80GB").expect("H100")
    }

    #[test]
    fn adding_is_checked_by_the_core_rules() {
        let draft = vec![i("3g.40gb", 4)];
        assert_eq!(try_add(h100(), &draft, "3g.40gb", 0), Ok(vec![i("3g.40gb", 4), i("3g.40gb", 0)]));
        let overlap = try_add(h100(), &draft, "1g.10gb", 5).expect_err("overlaps 3g.40gb@4");
        assert!(overlap.iter().any(|m| m.contains("overlap")), "{overlap:?}");
        let not_allowed = try_add(h100(), &[], "3g.40gb", 1).expect_err("3g.40gb cannot start at 1");
        assert!(!not_allowed.is_empty());
        // The same messages the server gives for the same layout.
        let core = validate(h100(), &specs(&[i("3g.40gb", 4), i("1g.10gb", 5)]))
            .expect_err("invalid")
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>();
        assert_eq!(overlap, core);
    }

    #[test]
    fn instances_in_use_are_locked() {
        let gpu = GpuView {
            layout: vec![i("3g.40gb", 4), i("1g.10gb", 0), i("1g.10gb", 1)],
            applied: Some(vec![ObservedInstance {
                profile: "1g.10gb".into(),
                start: 1,
                uuid: "MIG-2".into(),
                gi_id: 2,
                ci_id: 0,
                device_name: "d".into(),
                processes: vec![42],
            }]),
            in_use: vec![InUse {
                profile: "3g.40gb".into(),
                start: 4,
                request: "0192-abcdefgh".into(),
                tenant: "t".into(),
                state: "active".into(),
            }],
            ..gpu("g", 0, "GPU-1")
        };
        let locks = locks(&gpu);
        assert_eq!(locks.len(), 2);
        let err = try_remove(&gpu.layout, &i("3g.40gb", 4), &locks).expect_err("held");
        assert!(err.contains("abcdefgh") && err.contains("must keep"), "{err}");
        assert!(try_remove(&gpu.layout, &i("1g.10gb", 1), &locks).expect_err("busy").contains("1 process"));
        assert_eq!(try_remove(&gpu.layout, &i("1g.10gb", 0), &locks), Ok(vec![i("3g.40gb", 4), i("1g.10gb", 1)]));
    }

    #[test]
    fn the_diff_is_against_the_gpu_layout() {
        let (created, destroyed) = diff(&[i("3g.40gb", 4), i("1g.10gb", 0)], &[i("3g.40gb", 4), i("2g.20gb", 0)]);
        assert_eq!((created, destroyed), (vec![i("2g.20gb", 0)], vec![i("1g.10gb", 0)]));
    }

    #[test]
    fn placements_get_rows_only_when_they_overlap() {
        let rows = placement_rows(h100(), "1g.10gb");
        assert!(rows.iter().all(|r| r.2 == 0), "{rows:?}");
        assert_eq!(rows.len(), 7);
        let big = placement_rows(h100(), "3g.40gb");
        assert_eq!(big.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>(), vec![(0, 0), (4, 0)]);
    }
}
