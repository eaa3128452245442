//! The tenant dashboard's reservations: a calendar of the fleet (GPUs on one axis, the next hours on the other)
//! with what is held until its known end and what is booked; a booking form whose window can be picked by dragging
//! across the calendar, with the server's preview of how many slices fit that window; and the tenant's
//! reservations with their state.

use leptos::prelude::*;
use tessera_api::reservations::{
    BlockKind, CalendarGpu, CalendarView, NewReservationBody, ReservationPage, ReservationPreview, ReservationState,
    ReservationView,
};
use tessera_api::tenants::TenantView;
use tessera_core::request::SliceSpec;

use crate::api::{self, ProblemExt};
use crate::pages::shared::{describe, short};
use crate::pages::{countdown, datetime};
use crate::widgets::problem_view;

/// Hours the calendar shows.
const SPAN_H: i64 = 24;
const HOUR_MS: i64 = 3_600_000;

fn state_word(s: ReservationState) -> &'static str {
    s.as_str()
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
    // The form: what, how many, and the window as minutes from now and hours long.
    let profile = RwSignal::new("1g.10gb".to_string());
    let model = RwSignal::new("H100-80GB".to_string());
    let count = RwSignal::new("1".to_string());
    let in_min = RwSignal::new("60".to_string());
    let hours = RwSignal::new("2".to_string());
    let reason = RwSignal::new(String::new());
    let answer = RwSignal::new(None::<Result<String, api::Problem>>);
    let preview = RwSignal::new(None::<Result<ReservationPreview, api::Problem>>);
    let body = move || -> Option<NewReservationBody> {
        let n: u32 = count.get().trim().parse().ok().filter(|n| *n >= 1)?;
        let start_in: f64 = in_min.get().trim().parse().ok().filter(|m: &f64| *m >= 0.0)?;
        let h: f64 = hours.get().trim().parse().ok().filter(|h: &f64| *h > 0.0)?;
        let p = profile.get();
        if p.trim().is_empty() {
            return None;
        }
        let m = model.get();
        // Whole minutes, so that a preview and the booking that follows ask for the same window.
        let now = crate::pages::now_ms() / 60_000 * 60_000;
        let start_ms = now + (start_in * 60_000.0) as i64;
        Some(NewReservationBody {
            spec: SliceSpec::Mig {
                profile: p.trim().to_string(),
                model: (!m.trim().is_empty()).then(|| m.trim().to_string()),
            },
            count: n,
            start_ms,
            end_ms: start_ms + (h * HOUR_MS as f64) as i64,
            reason: reason.get(),
        })
    };
    // The server's preview, asked 400 ms after the last change; answers to earlier versions are ignored.
    let asked = StoredValue::new(0u64);
    let preview_tenant = tenant.id.clone();
    Effect::new(move |_| {
        let Some(b) = body() else {
            preview.set(None);
            return;
        };
        asked.update_value(|n| *n += 1);
        let mine = asked.get_value();
        let path = format!("/api/v1/tenants/{}/reservations/preview", preview_tenant);
        set_timeout(
            move || {
                if asked.get_value() != mine {
                    return;
                }
                leptos::task::spawn_local(async move {
                    let got = api::send_json::<ReservationPreview>("POST", path, b).await;
                    if asked.get_value() == mine {
                        preview.set(Some(got));
                    }
                });
            },
            std::time::Duration::from_millis(400),
        );
    });
    let book_tenant = tenant.id.clone();
    let book = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Some(b) = body() else { return };
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
    // Dragging across a calendar row picks the window: where the pointer went down is the start, where it came up
    // the end (in whole quarter hours).
    let drag_from = RwSignal::new(None::<f64>);
    let pick = move |a: f64, b: f64| {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let q = |f: f64| ((f * SPAN_H as f64 * 4.0).round() / 4.0).max(0.0);
        let (start_h, end_h) = (q(lo), q(hi).max(q(lo) + 0.25));
        in_min.set(format!("{}", (start_h * 60.0).round() as i64));
        hours.set(format!("{}", end_h - start_h));
    };
    view! {
        <div class="card" data-testid="reservations">
            <h2>"Reservations"</h2>
            <p class="muted small">"Book slices for a window ahead: the fleet keeps their room for you. Drag across the calendar to pick a window."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match calendar.await {
                        Err(p) => problem_view(&p),
                        Ok(c) => calendar_view(c, drag_from, pick).into_any(),
                    }
                })}
            </Transition>
            <form class="form inline" on:submit=book data-testid="reservation-form">
                <label>"MIG profile"<input name="profile" prop:value=move || profile.get() on:input=move |ev| profile.set(event_target_value(&ev)) /></label>
                <label>"GPU model"<input name="model" prop:value=move || model.get() on:input=move |ev| model.set(event_target_value(&ev)) /></label>
                <label>"Slices"<input name="count" type="number" min="1" max="1000" prop:value=move || count.get() on:input=move |ev| count.set(event_target_value(&ev)) /></label>
                <label>"Starts in (minutes)"<input name="start-in" type="number" min="0" step="any" prop:value=move || in_min.get() on:input=move |ev| in_min.set(event_target_value(&ev)) /></label>
                <label>"For (hours)"<input name="hours" type="number" min="0" step="any" prop:value=move || hours.get() on:input=move |ev| hours.set(event_target_value(&ev)) /></label>
                <label>"Why"<input name="reason" prop:value=move || reason.get() on:input=move |ev| reason.set(event_target_value(&ev)) /></label>
                <button type="submit">"Book"</button>
            </form>
            <p class="small" role="status" data-testid="reservation-preview">
                {move || match preview.get() {
                    None => String::new(),
                    Some(Err(p)) => p.message(),
                    Some(Ok(p)) => {
                        let free = if p.free_in_window_limit > 0 && p.free_in_window >= p.free_in_window_limit {
                            format!("{} or more", p.free_in_window)
                        } else {
                            p.free_in_window.to_string()
                        };
                        match (&p.refused, p.auto_approve) {
                            (None, true) => format!("It fits: {free} of this profile are free for that whole window; it is accepted at once."),
                            (None, false) => format!("It fits: {free} of this profile are free for that whole window; a platform admin accepts it."),
                            (Some(r), _) => format!("{} {free} of this profile are free for that whole window.", r.detail),
                        }
                    }
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

/// Per GPU a row over the next [`SPAN_H`] hours: what is held (until its end; to the edge when none is known) and
/// what is booked, the tenant's own marked.
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

fn calendar_view(
    c: CalendarView,
    drag_from: RwSignal<Option<f64>>,
    pick: impl Fn(f64, f64) + Copy + 'static,
) -> impl IntoView {
    let span = (c.to_ms - c.from_ms).max(1) as f64;
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
                let heading = format!("{model} · {} GPU{}", gpus.len(), if gpus.len() == 1 { "" } else { "s" });
                view! {
                <div class="cal-model" data-model=model.clone()>
                <div class="cal-model-head">{heading}</div>
                {gpus.into_iter().map(|g| {
                let label = format!("{} · GPU {}", g.node, g.index);
                view! {
                    <div class="cal-row" data-gpu=g.gpu.clone() data-model=g.model.clone()>
                        <span class="cal-label" title=g.gpu.clone()>{label}{g.cordoned.then_some(" (cordoned)")}</span>
                        <div class="cal-track"
                            on:mousedown=move |ev| drag_from.set(fraction(&ev))
                            on:mouseup=move |ev| if let (Some(a), Some(b)) = (drag_from.get_untracked(), fraction(&ev)) { pick(a, b); drag_from.set(None); }>
                            {g.blocks.into_iter().map(|b| {
                                let left = at(b.start_ms);
                                let right = b.end_ms.map_or(100.0, at);
                                let kind = match b.kind { BlockKind::Allocation => "held", BlockKind::Reservation => "booked" };
                                let mine = b.tenant.is_some();
                                let until = b.end_ms.map_or_else(|| "no known end".to_string(), |e| format!("until {}", datetime(e)));
                                let title = format!("{} {} @{} · {} · {}", kind, b.profile, b.slot, if mine { "yours" } else { "another tenant's" }, until);
                                view! {
                                    <span class=format!("cal-block {kind}") class:mine=mine class:open-ended=b.end_ms.is_none()
                                        data-kind=kind data-owner=b.owner.clone().unwrap_or_default()
                                        style=format!("left:{left:.2}%;width:{:.2}%", (right - left).max(0.4)) title=title></span>
                                }
                            }).collect_view()}
                        </div>
                    </div>
                }
                }).collect_view()}
                </div>
                }
            }).collect_view()}
            <p class="legend small"><span class="key held"></span>"held "<span class="key booked"></span>"booked · outlined: yours"</p>
        </div>
    }
}
