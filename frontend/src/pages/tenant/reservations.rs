//! The tenant dashboard's reservations: what the fleet has free over the next hours, per GPU model, as compute
//! slices held, booked and free (and per GPU on demand, each slice drawn as its share of the GPU); a booking form
//! with the model and profile to choose, the window's start and end as dates and times (or dragged across the
//! calendar), and the server's preview in a sentence; and the tenant's reservations with their state.

use leptos::prelude::*;
use tessera_api::reservations::{
    BlockKind, CalendarBlock, CalendarGpu, CalendarView, NewReservationBody, ReservationPage, ReservationPreview,
    ReservationState, ReservationView,
};
use tessera_api::tenants::TenantView;
use tessera_core::catalog::{Catalog, GpuModel};
use tessera_core::request::SliceSpec;

use crate::api::{self, ProblemExt};
use crate::pages::shared::{describe, short};
use crate::pages::{countdown, datetime, from_local_input, local_input};
use crate::widgets::problem_view;

/// Hours the calendar shows.
const SPAN_H: i64 = 24;
const HOUR_MS: i64 = 3_600_000;
/// Columns of the free-capacity strips: half hours.
const COLUMNS: usize = 48;

fn state_word(s: ReservationState) -> &'static str {
    s.as_str()
}

/// A window's length in words: `2 h`, `1 h 30 min`, `45 min`.
fn length_words(ms: i64) -> String {
    let m = (ms / 60_000).max(0);
    match (m / 60, m % 60) {
        (0, m) => format!("{m} min"),
        (h, 0) => format!("{h} h"),
        (h, m) => format!("{h} h {m} min"),
    }
}

/// The preview in a sentence: what, when, and whether it fits (and how it would be accepted), or why not.
fn preview_words(body: &NewReservationBody, p: &ReservationPreview) -> String {
    let what = format!(
        "{}, {} to {} ({})",
        describe(&body.spec, body.count),
        datetime(body.start_ms),
        datetime(body.end_ms),
        length_words(body.end_ms - body.start_ms)
    );
    let free = if p.free_in_window_limit > 0 && p.free_in_window >= p.free_in_window_limit {
        format!("{} or more", p.free_in_window)
    } else {
        p.free_in_window.to_string()
    };
    let room = match p.free_in_window {
        0 => "none of this profile is free for that whole window".to_string(),
        1 => "1 of this profile is free for that whole window".to_string(),
        _ => format!("{free} of this profile are free for that whole window"),
    };
    match (&p.refused, p.auto_approve) {
        (None, true) => format!("{what}: it fits ({room}); your tenant's policy accepts it at once."),
        (None, false) => format!("{what}: it fits ({room}); a platform admin accepts it."),
        (Some(r), _) => format!("{what}: it would be refused. {} ({room}.)", r.message()),
    }
}

/// The card.
#[component]
pub(super) fn ReservationsCard(tenant: TenantView, #[prop(into)] tick: Signal<i64>) -> impl IntoView {
    let id = tenant.id.clone();
    let list = Resource::new(
        move || (id.clone(), tick.get()),
        |(t, _)| api::get_json::<ReservationPage>(format!("/api/v1/reservations?tenant={t}")),
    );
    let calendar = Resource::new(
        move || tick.get(),
        |_| {
            api::get_json::<CalendarView>(format!(
                "/api/v1/calendar?to_ms={}",
                crate::pages::now_ms() + SPAN_H * HOUR_MS
            ))
        },
    );
    // The form: what, how many, and the window as local dates and times (from the next whole hour, for two hours).
    let profile = RwSignal::new("1g.10gb".to_string());
    let model = RwSignal::new("H100-80GB".to_string());
    let count = RwSignal::new("1".to_string());
    let next_hour = (crate::pages::now_ms() / HOUR_MS + 1) * HOUR_MS;
    let starts = RwSignal::new(local_input(next_hour));
    let ends = RwSignal::new(local_input(next_hour + 2 * HOUR_MS));
    let reason = RwSignal::new(String::new());
    let answer = RwSignal::new(None::<Result<String, api::Problem>>);
    let preview = RwSignal::new(None::<Result<(NewReservationBody, ReservationPreview), api::Problem>>);
    let problem = RwSignal::new(None::<String>);
    let body = move || -> Result<NewReservationBody, String> {
        let n: u32 =
            count.get().trim().parse().ok().filter(|n| *n >= 1).ok_or("How many slices? A whole number, 1 or more.")?;
        let start_ms = from_local_input(&starts.get()).ok_or("When does it start? Pick a date and time.")?;
        let end_ms = from_local_input(&ends.get()).ok_or("When does it end? Pick a date and time.")?;
        if end_ms <= start_ms {
            return Err("It must end after it starts.".into());
        }
        let p = profile.get();
        if p.trim().is_empty() {
            return Err("Which MIG profile? Choose one.".into());
        }
        let m = model.get();
        Ok(NewReservationBody {
            spec: SliceSpec::Mig {
                profile: p.trim().to_string(),
                model: (!m.trim().is_empty()).then(|| m.trim().to_string()),
            },
            count: n,
            start_ms,
            end_ms,
            reason: reason.get(),
        })
    };
    // The server's preview, asked 400 ms after the last change; answers to earlier versions are ignored.
    let asked = StoredValue::new(0u64);
    let preview_tenant = tenant.id.clone();
    Effect::new(move |_| {
        asked.update_value(|n| *n += 1);
        let b = match body() {
            Ok(b) => b,
            Err(e) => {
                preview.set(None);
                problem.set(Some(e));
                return;
            }
        };
        problem.set(None);
        let mine = asked.get_value();
        let path = format!("/api/v1/tenants/{}/reservations/preview", preview_tenant);
        set_timeout(
            move || {
                if asked.get_value() != mine {
                    return;
                }
                leptos::task::spawn_local(async move {
                    let got = api::send_json::<ReservationPreview>("POST", path, b.clone()).await;
                    if asked.get_value() == mine {
                        preview.set(Some(got.map(|p| (b, p))));
                    }
                });
            },
            std::time::Duration::from_millis(400),
        );
    });
    let book_tenant = tenant.id.clone();
    let book = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Ok(b) = body() else { return };
        let path = format!("/api/v1/tenants/{}/reservations", book_tenant);
        leptos::task::spawn_local(async move {
            let got = api::send_json::<ReservationView>("POST", path, b).await;
            answer.set(Some(got.map(|r| {
                format!(
                    "Reservation {} is {}: {} from {}.",
                    short(&r.id),
                    state_word(r.state),
                    describe(&r.spec, r.count),
                    datetime(r.start_ms)
                )
            })));
            list.refetch();
            calendar.refetch();
        });
    };
    // Dragging across a model's strip (or a GPU's row) picks the window, in whole quarter hours from the
    // calendar's start: where the pointer went down is the start, where it came up the end; the model follows.
    let drag_from = RwSignal::new(None::<f64>);
    let pick = move |from_ms: i64, a: f64, b: f64, on_model: String| {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let q = |f: f64| ((f * SPAN_H as f64 * 4.0).round() / 4.0).max(0.0);
        let (start_h, end_h) = (q(lo), q(hi).max(q(lo) + 0.25));
        let at = |h: f64| from_ms + (h * HOUR_MS as f64) as i64;
        // Whole minutes, so that the inputs show the window exactly.
        starts.set(local_input(at(start_h) / 60_000 * 60_000));
        ends.set(local_input(at(end_h) / 60_000 * 60_000));
        if model.get_untracked() != on_model {
            // The profile stays where the new model offers it.
            let offered =
                Catalog::builtin().model(&on_model).is_some_and(|m| m.profile(&profile.get_untracked()).is_some());
            if !offered {
                profile.set(String::new());
            }
            model.set(on_model);
        }
    };
    view! {
        <div class="card" data-testid="reservations">
            <h2>"Reservations"</h2>
            <p class="muted small">"Book slices for a window ahead: the fleet keeps their room for you. The strips show, per GPU model, the compute slices free over the next 24 hours; drag across one to pick a window."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match calendar.await {
                        Err(p) => problem_view(&p),
                        Ok(c) => calendar_view(c, drag_from, pick).into_any(),
                    }
                })}
            </Transition>
            // The catalog's MIG models and their profiles: known without a read, so the form renders at once (a
            // booking on a model the fleet lacks is previewed as having no room).
            <form class="form inline" on:submit=book data-testid="reservation-form">
                <label>"GPU model"
                    <select name="model" prop:value=move || model.get() on:change=move |ev| { model.set(event_target_value(&ev)); profile.set(String::new()); }>
                        {mig_models().into_iter().map(|(k, _)| { let v = k.clone(); view! { <option value=v.clone() selected=move || model.get() == v>{k}</option> } }).collect_view()}
                    </select>
                </label>
                <label>"MIG profile"
                    <select name="profile" prop:value=move || profile.get() on:change=move |ev| profile.set(event_target_value(&ev))>
                        <option value="">"choose a profile"</option>
                        {move || {
                            let m = model.get();
                            let profiles = mig_models().into_iter().find(|(k, _)| *k == m).map(|(_, p)| p).unwrap_or_default();
                            profiles.into_iter().map(|p| { let v = p.clone(); view! { <option value=v.clone() selected=move || profile.get() == v>{p}</option> } }).collect_view()
                        }}
                    </select>
                </label>
                <label>"Slices"<input name="count" type="number" min="1" max="1000" prop:value=move || count.get() on:input=move |ev| count.set(event_target_value(&ev)) /></label>
                <label>"Starts"<input name="starts" type="datetime-local" step="60" prop:value=move || starts.get() on:input=move |ev| starts.set(event_target_value(&ev)) /></label>
                <label>"Ends"<input name="ends" type="datetime-local" step="60" prop:value=move || ends.get() on:input=move |ev| ends.set(event_target_value(&ev)) /></label>
                <label>"Why"<input name="reason" prop:value=move || reason.get() on:input=move |ev| reason.set(event_target_value(&ev)) /></label>
                <button type="submit">"Book"</button>
            </form>
            <p class="small" role="status" data-testid="reservation-preview">
                {move || match (problem.get(), preview.get()) {
                    (Some(e), _) => e,
                    (None, None) => String::new(),
                    (None, Some(Err(p))) => p.message(),
                    (None, Some(Ok((b, p)))) => preview_words(&b, &p),
                }}
            </p>
            {move || answer.get().map(|a| match a {
                Ok(t) => view! { <p class="notice" role="status" data-testid="reservation-answer">{t}</p> }.into_any(),
                Err(p) => view! { <div data-testid="reservation-answer">{problem_view(&p)}</div> }.into_any(),
            })}
            <Transition fallback=|| ()>
                {move || Suspend::new(async move {
                    match list.await {
                        Err(p) => problem_view(&p),
                        Ok(page) if page.items.is_empty() => view! { <p class="muted">"No reservations."</p> }.into_any(),
                        Ok(page) => reservations_table(page.items, list).into_any(),
                    }
                })}
            </Transition>
        </div>
    }
}

fn reservations_table(
    items: Vec<ReservationView>,
    list: Resource<Result<ReservationPage, api::Problem>>,
) -> impl IntoView {
    let now = crate::pages::now_ms();
    view! {
        <table class="table" data-testid="reservations-table">
            <thead><tr><th>"Slices"</th><th>"Window"</th><th>"State"</th><th>"Request"</th><th></th></tr></thead>
            <tbody>
                {items.into_iter().map(|r| {
                    let id = r.id.clone();
                    let open = matches!(r.state, ReservationState::Pending | ReservationState::Accepted | ReservationState::Preparing | ReservationState::Started);
                    let when = match r.state {
                        ReservationState::Accepted | ReservationState::Pending if r.start_ms > now => format!("starts in {}", countdown(r.start_ms, now)),
                        ReservationState::Preparing => format!("slices being prepared; usable in {}", countdown(r.start_ms, now)),
                        ReservationState::Started if r.end_ms > now => format!("ends in {}", countdown(r.end_ms, now)),
                        _ => String::new(),
                    };
                    let cancel = move |_| {
                        let id = id.clone();
                        leptos::task::spawn_local(async move {
                            let _ = api::send_empty::<ReservationView>("POST", format!("/api/v1/reservations/{id}/cancel")).await;
                            list.refetch();
                        });
                    };
                    view! {
                        <tr data-reservation=r.id.clone() data-state=state_word(r.state) data-request=r.request.clone().unwrap_or_default()>
                            <td>{describe(&r.spec, r.count)}</td>
                            <td>{format!("{} – {}", datetime(r.start_ms), datetime(r.end_ms))}<br/><span class="muted small">{when}</span></td>
                            <td><span class="state">{state_word(r.state)}</span>
                                {r.ending_soon.then(|| view! { <span class="badge warn" title="the slices are released at the window's end">"ending soon"</span> })}
                                {(!r.decision.is_empty()).then(|| view! { <br/><span class="muted small">{r.decision.clone()}</span> })}
                            </td>
                            <td>{r.request.as_ref().map(|q| short(q))}</td>
                            <td>{open.then(|| view! { <button type="button" class="link small" on:click=cancel>"Cancel"</button> })}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
    }
}

/// The catalog's models with MIG profiles, by key, each with its profiles' names (smallest first, as listed).
fn mig_models() -> Vec<(String, Vec<String>)> {
    Catalog::builtin()
        .models
        .iter()
        .filter(|m| !m.profiles.is_empty())
        .map(|m| {
            let mut names: Vec<String> = Vec::new();
            for p in &m.profiles {
                if !names.contains(&p.name) {
                    names.push(p.name.clone());
                }
            }
            (m.key.clone(), names)
        })
        .collect()
}

/// The calendar's GPUs grouped by model (models and, within one, nodes and indexes in order): GPUs in MIG mode, and
/// whole GPUs with something on them.
fn by_model(gpus: Vec<CalendarGpu>) -> Vec<(String, Vec<CalendarGpu>)> {
    let mut groups: std::collections::BTreeMap<String, Vec<CalendarGpu>> = std::collections::BTreeMap::new();
    for g in gpus.into_iter().filter(|g| g.mig || !g.blocks.is_empty()) {
        groups.entry(g.model.clone()).or_default().push(g);
    }
    for gpus in groups.values_mut() {
        gpus.sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
    }
    groups.into_iter().collect()
}

/// One step of a model's strip: compute slices held, booked, on cordoned GPUs (not free) and free over
/// `[start_ms, end_ms)`. Anything on a GPU for part of the step counts for the whole of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// From, UTC ms.
    pub start_ms: i64,
    /// To, UTC ms.
    pub end_ms: i64,
    /// Held by allocations.
    pub held: f64,
    /// Booked by accepted reservations.
    pub booked: f64,
    /// Not held on cordoned GPUs: nothing new goes there.
    pub cordoned: f64,
    /// Free.
    pub free: f64,
}

/// What one slice of a GPU weighs in compute slices (a MIG instance its profile's, a share its part).
fn weight(model: &GpuModel, profile: &str) -> f64 {
    tessera_core::quota::weight(model, profile).unwrap_or(0.0)
}

/// Whether a block covers any of `[from, to)`.
fn covers(b: &CalendarBlock, from: i64, to: i64) -> bool {
    b.start_ms < to && b.end_ms.is_none_or(|e| e > from)
}

/// A model's MIG GPUs over `[from_ms, to_ms)` in `steps` equal steps: the compute slices in all, and each step.
pub fn strip(gpus: &[CalendarGpu], model: &GpuModel, from_ms: i64, to_ms: i64, steps: usize) -> (f64, Vec<Step>) {
    let per_gpu = f64::from(model.compute_slices_total);
    let mig: Vec<&CalendarGpu> = gpus.iter().filter(|g| g.mig).collect();
    let total = per_gpu * mig.len() as f64;
    let width = (to_ms - from_ms).max(1) as f64 / steps.max(1) as f64;
    let out = (0..steps)
        .map(|i| {
            let start_ms = from_ms + (i as f64 * width) as i64;
            let end_ms = from_ms + ((i + 1) as f64 * width) as i64;
            let (mut held, mut booked, mut cordoned) = (0.0, 0.0, 0.0);
            for g in &mig {
                let sum = |kind: BlockKind| -> f64 {
                    g.blocks
                        .iter()
                        .filter(|b| b.kind == kind && covers(b, start_ms, end_ms))
                        .map(|b| weight(model, &b.profile))
                        .fold(0.0, |a, w| a + w)
                };
                let h = sum(BlockKind::Allocation).min(per_gpu);
                let k = sum(BlockKind::Reservation).min(per_gpu - h);
                held += h;
                booked += k;
                if g.cordoned {
                    cordoned += per_gpu - h - k;
                }
            }
            let free = (total - held - booked - cordoned).max(0.0);
            Step { start_ms, end_ms, held, booked, cordoned, free }
        })
        .collect();
    (total, out)
}

/// Where a slice sits on its GPU's row, as fractions of the row's height from the top: a MIG instance by its
/// placement units, a share by its index, a whole GPU all of it.
pub fn band(model: &GpuModel, profile: &str, slot: u8) -> (f64, f64) {
    if let Some(p) = model.profile(profile) {
        let units = f64::from(model.placement_units_total.max(1));
        let size = p.placements.iter().find(|x| x.start == slot).map_or(p.memory_slices, |x| x.size);
        return (f64::from(slot) / units, f64::from(size) / units);
    }
    match tessera_core::sharing::Sharing::from_key(profile).map(|s| s.replicas().max(1)) {
        Some(n) if n > 1 => (f64::from(slot % n as u8) / f64::from(n), 1.0 / f64::from(n)),
        _ => (0.0, 1.0),
    }
}

fn calendar_view(
    c: CalendarView,
    drag_from: RwSignal<Option<f64>>,
    pick: impl Fn(i64, f64, f64, String) + Copy + 'static,
) -> impl IntoView {
    let catalog = Catalog::builtin();
    let span = (c.to_ms - c.from_ms).max(1) as f64;
    let from_ms = c.from_ms;
    let at = move |ms: i64| ((ms - c.from_ms) as f64 / span * 100.0).clamp(0.0, 100.0);
    let hours: Vec<(f64, String)> = (0..=SPAN_H)
        .step_by(6)
        .map(|h| (h as f64 / SPAN_H as f64 * 100.0, crate::pages::clock(c.from_ms + h * HOUR_MS)))
        .collect();
    let fraction = |ev: &leptos::ev::MouseEvent| -> Option<f64> {
        #[cfg(feature = "hydrate")]
        {
            use wasm_bindgen::JsCast;
            // Events are delegated: the track is the nearest `.cal-track` above what the pointer is on.
            let el = ev.target()?.dyn_into::<web_sys::Element>().ok()?.closest(".cal-track").ok()??;
            let r = el.get_bounding_client_rect();
            Some(((f64::from(ev.client_x()) - r.left()) / r.width().max(1.0)).clamp(0.0, 1.0))
        }
        #[cfg(not(feature = "hydrate"))]
        {
            let _ = ev;
            None
        }
    };
    view! {
        <div class="calendar" data-testid="calendar" data-from=c.from_ms data-to=c.to_ms>
            <div class="cal-axis">{hours.into_iter().map(|(x, t)| view! { <span style=format!("left:{x:.2}%")>{t}</span> }).collect_view()}</div>
            {by_model(c.gpus).into_iter().map(|(model, gpus)| {
                let spec = catalog.model(&model);
                let (total, steps) = spec.map(|m| strip(&gpus, m, c.from_ms, c.to_ms, COLUMNS)).unwrap_or_default();
                let mig = gpus.iter().filter(|g| g.mig).count();
                let least = steps.iter().map(|s| s.free).fold(f64::INFINITY, f64::min);
                let now_free = steps.first().map_or(0.0, |s| s.free);
                let heading = if mig > 0 {
                    format!(
                        "{model} · {} in MIG mode, {} compute slices: {} free now, at least {} free all day",
                        crate::pages::count(mig as u64, "GPU"),
                        total,
                        now_free,
                        if least.is_finite() { least } else { 0.0 }
                    )
                } else {
                    format!("{model} · whole GPUs in use")
                };
                let rows = gpus.len();
                let up = model.clone();
                view! {
                <div class="cal-model" data-model=model.clone()>
                <div class="cal-model-head">{heading}</div>
                {(mig > 0).then(|| view! {
                    <div class="cal-row cap-row">
                        <span class="cal-label">"free, held and booked"</span>
                        <div class="cal-track cap" data-testid="capacity" data-model=model.clone() data-total=total.to_string()
                            on:mousedown=move |ev| drag_from.set(fraction(&ev))
                            on:mouseup=move |ev| if let (Some(a), Some(b)) = (drag_from.get_untracked(), fraction(&ev)) { pick(from_ms, a, b, up.clone()); drag_from.set(None); }>
                            {steps.iter().map(|s| {
                                let pct = |v: f64| if total > 0.0 { v / total * 100.0 } else { 0.0 };
                                // Each column a hair wider than its step, so that no seam shows between them.
                                let title = format!("{}–{}: {} free, {} held, {} booked{}", crate::pages::clock(s.start_ms), crate::pages::clock(s.end_ms), s.free, s.held, s.booked,
                                    if s.cordoned > 0.0 { format!(", {} on cordoned GPUs", s.cordoned) } else { String::new() });
                                view! {
                                    <span class="cap-col" data-start=s.start_ms data-free=s.free.to_string() data-held=s.held.to_string() data-booked=s.booked.to_string()
                                        style=format!("left:{:.3}%;width:{:.3}%", at(s.start_ms), at(s.end_ms) - at(s.start_ms) + 0.1) title=title>
                                        <i class="held" style=format!("height:{:.1}%", pct(s.held))></i>
                                        <i class="booked" style=format!("height:{:.1}%", pct(s.booked))></i>
                                        <i class="off" style=format!("height:{:.1}%", pct(s.cordoned))></i>
                                    </span>
                                }
                            }).collect_view()}
                        </div>
                    </div>
                })}
                <details class="cal-gpus">
                <summary class="small">{format!("Per GPU ({rows})")}</summary>
                {gpus.into_iter().map(|g| {
                let label = format!("{} · GPU {}", g.node, g.index);
                let on_model = g.model.clone();
                let gpu_model = catalog.model(&g.model);
                view! {
                    <div class="cal-row" data-gpu=g.gpu.clone() data-model=g.model.clone()>
                        <span class="cal-label" title=g.gpu.clone()>{label}{g.cordoned.then_some(" (cordoned)")}</span>
                        <div class="cal-track gpu"
                            on:mousedown=move |ev| drag_from.set(fraction(&ev))
                            on:mouseup=move |ev| if let (Some(a), Some(b)) = (drag_from.get_untracked(), fraction(&ev)) { pick(from_ms, a, b, on_model.clone()); drag_from.set(None); }>
                            {g.blocks.into_iter().map(|b| {
                                let left = at(b.start_ms);
                                let right = b.end_ms.map_or(100.0, at);
                                let kind = match b.kind { BlockKind::Allocation => "held", BlockKind::Reservation => "booked" };
                                let mine = b.tenant.is_some();
                                let until = b.end_ms.map_or_else(|| "no known end".to_string(), |e| format!("until {}", datetime(e)));
                                let title = format!("{} {} @{} · {} · {}", kind, b.profile, b.slot, if mine { "yours" } else { "another tenant's" }, until);
                                let (top, height) = gpu_model.map_or((0.0, 1.0), |m| band(m, &b.profile, b.slot));
                                view! {
                                    <span class=format!("cal-block {kind}") class:mine=mine class:open-ended=b.end_ms.is_none()
                                        data-kind=kind data-owner=b.owner.clone().unwrap_or_default() data-share=format!("{height:.3}")
                                        style=format!("left:{left:.2}%;width:{:.2}%;top:{:.1}%;height:{:.1}%", (right - left).max(0.4), top * 100.0, height * 100.0) title=title></span>
                                }
                            }).collect_view()}
                        </div>
                    </div>
                }
                }).collect_view()}
                </details>
                </div>
                }
            }).collect_view()}
            <p class="legend small"><span class="key held"></span>"held "<span class="key booked"></span>"booked "<span class="key off"></span>"cordoned · blank: free · per GPU, each slice is drawn as its share of the GPU; outlined: yours"</p>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(kind: BlockKind, profile: &str, slot: u8, start_ms: i64, end_ms: Option<i64>) -> CalendarBlock {
        CalendarBlock { kind, start_ms, end_ms, profile: profile.into(), slot, tenant: None, owner: None }
    }

    fn gpu(id: &str, cordoned: bool, blocks: Vec<CalendarBlock>) -> CalendarGpu {
        CalendarGpu {
            gpu: id.into(),
            node: "n".into(),
            index: 0,
            model: "H100-80GB".into(),
            mig: true,
            cordoned,
            blocks,
        }
    }

    #[test]
    fn a_gpu_with_one_small_instance_is_mostly_free() {
        let h100 = Catalog::builtin().model("H100-80GB").expect("H100");
        let hour = HOUR_MS;
        let gpus = vec![
            // One 1g.10gb held with no known end, and a 3g.40gb booked for the second hour.
            gpu(
                "a",
                false,
                vec![
                    block(BlockKind::Allocation, "1g.10gb", 6, 0, None),
                    block(BlockKind::Reservation, "3g.40gb", 0, hour, Some(2 * hour)),
                ],
            ),
            // A cordoned GPU with nothing on it: none of it is free.
            gpu("b", true, vec![]),
        ];
        let (total, steps) = strip(&gpus, h100, 0, 4 * hour, 4);
        assert_eq!(total, 14.0);
        let seen: Vec<(f64, f64, f64, f64)> = steps.iter().map(|s| (s.held, s.booked, s.cordoned, s.free)).collect();
        assert_eq!(seen, vec![(1.0, 0.0, 7.0, 6.0), (1.0, 3.0, 7.0, 3.0), (1.0, 0.0, 7.0, 6.0), (1.0, 0.0, 7.0, 6.0)]);
        // Drawn as its share of the GPU: a 1g.10gb one eighth of the row at its unit, a whole GPU all of it, a
        // quarter share a quarter.
        assert_eq!(band(h100, "1g.10gb", 6), (0.75, 0.125));
        assert_eq!(band(h100, "3g.40gb", 4), (0.5, 0.5));
        assert_eq!(band(h100, "exclusive", 0), (0.0, 1.0));
        assert_eq!(band(h100, "timeslice:4", 2), (0.5, 0.25));
    }

    #[test]
    fn the_preview_reads_as_a_sentence() {
        let body = NewReservationBody {
            spec: SliceSpec::Mig { profile: "1g.10gb".into(), model: Some("H100-80GB".into()) },
            count: 2,
            start_ms: 1_795_773_900_000,
            end_ms: 1_795_773_900_000 + 90 * 60_000,
            reason: String::new(),
        };
        let p = ReservationPreview {
            fits: true,
            auto_approve: true,
            refused: None,
            free_in_window: 64,
            free_in_window_limit: 64,
            policy: Default::default(),
        };
        assert_eq!(
            preview_words(&body, &p),
            "2 × MIG 1g.10gb on H100-80GB, 2026-11-27 10:05 to 2026-11-27 11:35 (1 h 30 min): it fits (64 or more of \
             this profile are free for that whole window); your tenant's policy accepts it at once."
        );
        assert_eq!(length_words(45 * 60_000), "45 min");
        assert_eq!(length_words(2 * HOUR_MS), "2 h");
    }
}
