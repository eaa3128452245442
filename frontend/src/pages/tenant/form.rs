//! The new-request form on the tenant dashboard: what to ask for, live feedback from the core's quota arithmetic,
//! and the server's answer.
//!
//! The dashboard builds it once per tenant and hands it the quota as a signal. The dashboard's refreshes then only
//! update the feedback: what is being typed, the focus and the answer to the last request stay as they are.

use leptos::prelude::*;
use tessera_api::nodes::Offerings;
use tessera_api::requests::{NewRequestBody, PreviewOutcome, RequestPreview, RequestView};
use tessera_api::tenants::{QuotaView, TenantView};
use tessera_core::quota::Decision;
use tessera_core::request::SliceSpec;

use super::arithmetic::{Feedback, feedback};
use crate::api::{self, ProblemExt};
use crate::pages::shared::{AskDraft, describe, short, state_name};
use crate::pages::{ago, now_ms};
use crate::widgets::problem_view;
use crate::wire::approval_policy;

/// The mode chosen in the form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Mig,
    Timeslice,
    Mps,
    Exclusive,
}

impl Mode {
    fn parse(s: &str) -> Mode {
        match s {
            "timeslice" => Mode::Timeslice,
            "mps" => Mode::Mps,
            "exclusive" => Mode::Exclusive,
            _ => Mode::Mig,
        }
    }
}

/// The form. `quotas` is the dashboard's latest quota view (`None` until it has loaded); `offerings` what the
/// fleet offers (the dashboard reads it once for both of its forms).
#[component]
pub(super) fn RequestForm(
    tenant: TenantView,
    quotas: Signal<Option<Result<QuotaView, api::Problem>>>,
    offerings: Resource<Result<Offerings, api::Problem>>,
    on_done: Callback<()>,
) -> impl IntoView {
    let mode = RwSignal::new("mig".to_string());
    let model = RwSignal::new(String::new());
    let profile = RwSignal::new(String::new());
    let replicas = RwSignal::new("4".to_string());
    let count = RwSignal::new("1".to_string());
    let hours = RwSignal::new(String::new());
    let priority = RwSignal::new("normal".to_string());
    let reason = RwSignal::new(String::new());
    let sending = RwSignal::new(false);
    let result = RwSignal::new(None::<Result<RequestView, api::Problem>>);
    let spec = move || -> Option<SliceSpec> {
        let m = model.get();
        let r = replicas.get().trim().parse().unwrap_or(0);
        match Mode::parse(&mode.get()) {
            Mode::Mig => {
                let p = profile.get();
                (!p.is_empty()).then(|| SliceSpec::Mig { profile: p, model: (!m.is_empty()).then_some(m) })
            }
            _ if m.is_empty() => None,
            Mode::Timeslice => Some(SliceSpec::Timeslice { model: m, replicas: r }),
            Mode::Mps => Some(SliceSpec::Mps { model: m, replicas: r }),
            Mode::Exclusive => Some(SliceSpec::Exclusive { model: m }),
        }
    };
    let count_n = move || count.get().trim().parse::<u32>().ok().filter(|n| *n >= 1);
    let policy = approval_policy(&tenant);
    // Whether the viewer may ask for quota itself (the tenant's admins, platform admins); members pass the ask to
    // the tenant's admins instead.
    let session = use_context::<crate::widgets::SessionResource>();
    let may_ask = {
        let id = tenant.id.clone();
        Memo::new(move |_| {
            session.and_then(|s| s.get()).and_then(Result::ok).is_some_and(|s| {
                s.user.platform_admin
                    || s.memberships.iter().any(|m| m.tenant == id && m.role == tessera_api::Role::TenantAdmin)
            })
        })
    };
    let passed = RwSignal::new(None::<Result<String, String>>);
    let pass_tenant = tenant.id.clone();
    let pass_on = Callback::new(move |(needed, why): (Vec<(String, String)>, String)| {
        let tenant = pass_tenant.clone();
        let limits: std::collections::BTreeMap<String, f64> =
            needed.into_iter().filter_map(|(k, v)| Some((k, v.trim().parse::<f64>().ok()?))).collect();
        let body = tessera_api::quotas::NewQuotaRequest { limits, reason: why, until_ms: None };
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/tenants/{tenant}/quota-suggestions");
            let answer = api::send_json::<tessera_api::quotas::QuotaSuggestion>("POST", path, body).await;
            passed.set(Some(match answer {
                Ok(s) if s.tenant_admins.is_empty() => Ok(format!(
                    "Your tenant has no admin: sent to the platform admins ({}).",
                    s.platform_admins.join(", ")
                )),
                Ok(s) => Ok(format!(
                    "Sent to your tenant's admins ({}): they can ask a platform admin for it.",
                    s.tenant_admins.join(", ")
                )),
                Err(p) => Err(p.message()),
            }));
        });
    });
    // Right after a switch of tenant the page still holds the previous tenant's quota until this one's loads.
    let quota = {
        let id = tenant.id.clone();
        Memo::new(move |_| quotas.with(|q| q.clone().filter(|q| !matches!(q, Ok(q) if q.tenant != id))))
    };
    // The server's preview of what is being asked for: asked again 400 ms after the last change (in the browser
    // only; the server renders the form without one), answers to earlier versions ignored.
    let preview = RwSignal::new(None::<Result<RequestPreview, api::Problem>>);
    let asked = StoredValue::new(0u64);
    let preview_tenant = tenant.id.clone();
    Effect::new(move |_| {
        let body = match (spec(), count_n()) {
            (Some(spec), Some(n)) => {
                let duration_s =
                    hours.get().trim().parse::<f64>().ok().filter(|h| *h > 0.0).map(|h| (h * 3600.0) as u64);
                let priority = tessera_core::cohort::Priority::parse(&priority.get()).unwrap_or_default();
                NewRequestBody {
                    tenant: preview_tenant.clone(),
                    spec,
                    count: n,
                    reason: String::new(),
                    duration_s,
                    priority,
                }
            }
            _ => {
                preview.set(None);
                return;
            }
        };
        asked.update_value(|n| *n += 1);
        let mine = asked.get_value();
        set_timeout(
            move || {
                if asked.get_value() != mine {
                    return;
                }
                leptos::task::spawn_local(async move {
                    let answer =
                        api::send_json::<RequestPreview>("POST", "/api/v1/requests/preview".into(), body).await;
                    if asked.get_value() == mine {
                        preview.set(Some(answer));
                    }
                });
            },
            std::time::Duration::from_millis(400),
        );
    });
    let tenant_id = tenant.id.clone();
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (Some(spec), Some(n)) = (spec(), count_n()) else { return };
        let duration_s = hours.get().trim().parse::<f64>().ok().filter(|h| *h > 0.0).map(|h| (h * 3600.0) as u64);
        let chosen = tessera_core::cohort::Priority::parse(&priority.get()).unwrap_or_default();
        let body = NewRequestBody {
            tenant: tenant_id.clone(),
            spec,
            count: n,
            reason: reason.get(),
            duration_s,
            priority: chosen,
        };
        sending.set(true);
        leptos::task::spawn_local(async move {
            let answer = api::send_json::<RequestView>("POST", "/api/v1/requests".into(), body).await;
            sending.set(false);
            // Made: the form starts again (what it showed counted without the request, which now counts), and the
            // card below names the request. Refused: everything typed stays, to be changed.
            if answer.is_ok() {
                profile.set(String::new());
                count.set("1".to_string());
                hours.set(String::new());
                reason.set(String::new());
                priority.set("normal".to_string());
            }
            result.set(Some(answer));
            on_done.run(());
        });
    };
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || { let submit = submit.clone(); Suspend::new(async move {
                let offer = match offerings.await {
                    Ok(o) => o,
                    Err(p) => return problem_view(&p),
                };
                let wait = match (offer.pending_requests, offer.oldest_pending_ms) {
                    (0, _) => "No requests are waiting for an admin now.".to_string(),
                    (n, Some(t)) => format!("{} waiting for an admin, the oldest made {}.", crate::pages::count(n, "request"), ago(t, now_ms())),
                    (n, None) => format!("{} waiting for an admin.", crate::pages::count(n, "request")),
                };
                let offer_models = offer.models.clone();
                let models_for_mode = move || {
                    let mig = Mode::parse(&mode.get()) == Mode::Mig;
                    offer_models.iter().filter(|m| if mig { m.mig_gpus > 0 } else { m.whole_gpus > 0 }).cloned().collect::<Vec<_>>()
                };
                let offer_models = offer.models.clone();
                let profiles = move || {
                    let m = model.get();
                    let mut names: Vec<String> = offer_models.iter().filter(|o| o.mig_gpus > 0 && (m.is_empty() || o.model == m)).flat_map(|o| o.profiles.clone()).collect();
                    names.dedup();
                    let mut seen = std::collections::HashSet::new();
                    names.retain(|n| seen.insert(n.clone()));
                    names
                };
                view! {
                    <form class="form" on:submit=submit.clone() data-testid="request-form">
                        <fieldset class="modes">
                            <legend>"Sharing"</legend>
                            {[("mig", "MIG instance"), ("timeslice", "Time-sliced"), ("mps", "MPS"), ("exclusive", "Whole GPU")].map(|(v, label)| view! {
                                <label class="radio"><input type="radio" name="mode" value=v
                                    prop:checked=move || mode.get() == v
                                    on:change=move |_| { mode.set(v.to_string()); model.set(String::new()); profile.set(String::new()); } />{label}</label>
                            })}
                        </fieldset>
                        <label>"GPU model"
                            <select name="model" prop:value=move || model.get() on:change=move |ev| { model.set(event_target_value(&ev)); profile.set(String::new()); }>
                                {move || {
                                    let any = Mode::parse(&mode.get()) == Mode::Mig;
                                    view! {
                                        <option value="" selected=move || model.get().is_empty()>{if any { "any model" } else { "choose a model" }}</option>
                                        {models_for_mode().into_iter().map(|m| {
                                            let key = m.model.clone();
                                            // The model by the name the rest of the portal uses; the product name in the tooltip.
                                            let label = format!("{} · {}", m.model, crate::pages::count(m.gpus as u64, "GPU"));
                                            view! { <option value=key.clone() title=m.product.clone() selected=move || model.get() == key>{label}</option> }
                                        }).collect_view()}
                                    }
                                }}
                            </select>
                        </label>
                        {move || match Mode::parse(&mode.get()) {
                            Mode::Mig => view! {
                                <label>"MIG profile"
                                    <select name="profile" prop:value=move || profile.get() on:change=move |ev| profile.set(event_target_value(&ev))>
                                        <option value="">"choose a profile"</option>
                                        {profiles().into_iter().map(|p| { let v = p.clone(); view! { <option value=v.clone() selected=move || profile.get() == v>{p}</option> } }).collect_view()}
                                    </select>
                                </label>
                            }.into_any(),
                            Mode::Timeslice | Mode::Mps => view! {
                                <label>"Shares per GPU"<input name="replicas" type="number" min="2" max="48" bind:value=replicas /></label>
                            }.into_any(),
                            Mode::Exclusive => ().into_any(),
                        }}
                        <div class="row">
                            <label>"Count"<input name="count" type="number" min="1" max="64" bind:value=count /></label>
                            <label>"Duration (hours)"<input name="hours" type="number" min="0" step="0.5" placeholder="until released" bind:value=hours /></label>
                            <label title="High fills your team's guarantee first; low is taken back first when a lender needs its capacity">"Priority"
                                <select name="priority" bind:value=priority>
                                    <option value="low">"Low"</option>
                                    <option value="normal" selected>"Normal"</option>
                                    <option value="high">"High"</option>
                                </select>
                            </label>
                        </div>
                        <label>"Reason"<input name="reason" type="text" maxlength="500" placeholder="What it is for" bind:value=reason /></label>
                        <div class="feedback" data-testid="feedback" aria-live="polite">
                            {move || match (spec(), count_n()) {
                                (Some(s), Some(n)) => quota.with(|q| match q {
                                    Some(Ok(q)) => preview.with(|p| {
                                        let why = if reason.get().trim().is_empty() { describe(&s, n) } else { reason.get() };
                                        let ask = if may_ask.get() { Ask::Draft(use_context::<AskDraft>()) } else { Ask::PassOn(pass_on, why, passed) };
                                        feedback_view(feedback(&s, n, q, policy), p.as_ref(), ask)
                                    }),
                                    Some(Err(p)) => view! { <p class="error">"The quota could not be read: "{p.message()}</p> }.into_any(),
                                    None => view! { <p class="muted">"Reading the quota…"</p> }.into_any(),
                                }),
                                (_, None) => view! { <p class="muted">"The count is a whole number from 1."</p> }.into_any(),
                                _ => view! { <p class="muted">"Choose what you need to see what it takes from the quota."</p> }.into_any(),
                            }}
                            <p class="muted small">{wait.clone()}</p>
                        </div>
                        {move || {
                            // Refused as it stands: the button says so and waits for a change.
                            let refused = match (spec(), count_n()) {
                                (Some(s), Some(n)) => quota.with(|q| match q {
                                    Some(Ok(q)) => preview.with(|p| verdict(&feedback(&s, n, q, policy), p.as_ref().and_then(|p| p.as_ref().ok()), now_ms()).refused),
                                    _ => false,
                                }),
                                _ => false,
                            };
                            let label = if refused { "Over quota: change the ask or ask for more quota" } else { "Request" };
                            view! {
                                <button class="button primary" type="submit" data-refused=refused.to_string()
                                    disabled=move || refused || sending.get() || spec().is_none() || count_n().is_none()>{label}</button>
                            }
                        }}
                        {move || result.get().map(|r| match r {
                            Ok(r) => created_card(&r),
                            Err(p) => view! { <p class="error" role="alert" data-code=p.code.clone()>{p.message()}</p> }.into_any(),
                        })}
                    </form>
                }.into_any()
            })}}
        </Suspense>
    }
}

/// What the server says creating it would do now: where it goes, or why it would wait and from when it could
/// start, or why it would be refused.
pub fn preview_text(p: &RequestPreview, now: i64) -> String {
    let place = |p: &RequestPreview| {
        let s = p.slices.first();
        s.map(|s| format!("{} · GPU {} · {} at {}", s.node, s.gpu_index, s.profile, s.start)).unwrap_or_default()
    };
    match p.outcome {
        PreviewOutcome::ApprovedNow => format!("Placed now: {}.", place(p)),
        PreviewOutcome::ApprovedWaitingForLayout => {
            format!("Approved now on {}; a layout change it needs waits for a platform admin.", place(p))
        }
        PreviewOutcome::Pending => {
            let mut text = format!("It would wait. {}", p.sentence.clone().unwrap_or_default());
            match p.earliest_start_ms {
                Some(at) if at > now + 60_000 => {
                    text.push_str(&format!(" It could start in {}.", crate::pages::countdown(at, now)))
                }
                Some(_) => {}
                None => text.push_str(" No known end of other slices makes room for it yet."),
            }
            text
        }
        PreviewOutcome::Refused => {
            format!("It would be refused: {}", p.refused.as_ref().map(|r| r.detail.clone()).unwrap_or_default())
        }
    }
}

/// The one verdict the form gives: the quota and the tenant's policy (the core's arithmetic, at once) combined with
/// the server's preview (where it would go, or why it would wait), in one headline; the planner's detail behind
/// "Why?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `over`, `refused`, `auto` (approved and placed now), `layout` (approved, a layout change waits), `waits`
    /// (approved by the policy, then waits for room), `admin` (waits for a platform admin), `checking`.
    pub kind: &'static str,
    /// The CSS class: `ok`, `warn` or `error`.
    pub class: &'static str,
    /// The headline.
    pub headline: String,
    /// The detail behind "Why?", when there is one.
    pub why: Option<String>,
    /// Creating it would be refused.
    pub refused: bool,
}

/// See [`Verdict`]. `preview` is the server's answer for what is in the form now, when it came.
pub fn verdict(f: &Feedback, preview: Option<&RequestPreview>, now: i64) -> Verdict {
    let v = |kind, class, headline: String, why: Option<String>| Verdict {
        kind,
        class,
        headline,
        why,
        refused: matches!(kind, "over" | "refused"),
    };
    if !f.over.is_empty() {
        return v("over", "error", "Over quota: it would be refused.".into(), None);
    }
    let auto = preview.map_or(f.decision == Some(Decision::AutoApprove), |p| p.auto_approve);
    let detail = preview.map(|p| preview_text(p, now));
    match preview.map(|p| p.outcome) {
        Some(PreviewOutcome::Refused) => v(
            "refused",
            "error",
            format!(
                "It would be refused: {}",
                preview.and_then(|p| p.refused.as_ref()).map(|r| r.detail.clone()).unwrap_or_default()
            ),
            None,
        ),
        Some(PreviewOutcome::ApprovedNow) => {
            v("auto", "ok", "Approved by your tenant's policy and placed at once.".into(), detail)
        }
        Some(PreviewOutcome::ApprovedWaitingForLayout) => v(
            "layout",
            "warn",
            "Approved by your tenant's policy; a MIG layout change it needs waits for a platform admin.".into(),
            detail,
        ),
        Some(PreviewOutcome::Pending) if auto => v(
            "waits",
            "warn",
            format!(
                "Approved by your tenant's policy, then waits for room: {}",
                preview.and_then(|p| p.sentence.clone()).unwrap_or_else(|| "the fleet has none now.".into())
            ),
            detail,
        ),
        Some(PreviewOutcome::Pending) => {
            v("admin", "warn", "Within quota: waits for a platform admin's approval.".into(), detail)
        }
        None if auto => v("checking", "ok", "Within quota and your tenant's policy; looking for room…".into(), None),
        None => v("admin", "warn", "Within quota: waits for a platform admin's approval.".into(), None),
    }
}

/// How the form offers more quota when a request is over it.
enum Ask {
    /// The viewer asks itself: the tenant page's quota ask form, filled.
    Draft(Option<AskDraft>),
    /// A member: passes the ask (what is missing, why) to the tenant's admins; the answer shown below.
    PassOn(Callback<(Vec<(String, String)>, String)>, String, RwSignal<Option<Result<String, String>>>),
}

fn feedback_view(f: Feedback, preview: Option<&Result<RequestPreview, api::Problem>>, ask: Ask) -> AnyView {
    if let Some(why) = f.invalid {
        return view! { <p class="error">{why}</p> }.into_any();
    }
    let answered = preview.and_then(|p| p.as_ref().ok());
    let Verdict { kind, class, headline, why, .. } = verdict(&f, answered, now_ms());
    let outcome = answered.map(|p| match p.outcome {
        PreviewOutcome::ApprovedNow => "approved_now",
        PreviewOutcome::ApprovedWaitingForLayout => "approved_waiting_for_layout",
        PreviewOutcome::Pending => "pending",
        PreviewOutcome::Refused => "refused",
    });
    let failed = preview.and_then(|p| p.as_ref().err()).map(|p| p.message());
    view! {
        <div class=format!("verdict {class}") data-verdict=kind data-testid="verdict">
            <p>{headline}</p>
            {why.map(|w| view! {
                <details class="small"><summary>"Why?"</summary>
                    <p data-testid="preview" data-outcome=outcome.unwrap_or_default()>{w}</p>
                </details>
            })}
            {failed.map(|m| view! { <p class="error small" data-testid="preview">{m}</p> })}
        </div>
        <ul class="plain small">
            {f.charges.into_iter().map(|c| view! {
                <li data-resource=c.key.clone() title=c.key>{format!("{}: {}", c.name, c.amount)}<span class="muted">{c.left.map(|l| format!(" · {l} left after")).unwrap_or_default()}</span></li>
            }).collect_view()}
            {f.over.into_iter().map(|o| view! { <li class="error">{o}</li> }).collect_view()}
        </ul>
        {(!f.needed.is_empty()).then(|| {
            let needed = f.needed.clone();
            match ask {
                Ask::Draft(draft) => draft.map(|draft| view! {
                    <button type="button" class="button small" data-testid="ask-missing"
                        on:click=move |_| draft.fill(needed.clone())>"Ask for exactly what is missing"</button>
                }.into_any()),
                Ask::PassOn(send, why, passed) => Some(view! {
                    <button type="button" class="button small" data-testid="ask-admins"
                        on:click=move |_| send.run((needed.clone(), why.clone()))>"Ask your tenant's admins for exactly what is missing"</button>
                    {move || passed.get().map(|r| match r {
                        Ok(m) => view! { <p class="ok small" role="status" data-testid="ask-admins-sent">{m}</p> }.into_any(),
                        Err(m) => view! { <p class="error small" role="alert">{m}</p> }.into_any(),
                    })}
                }.into_any()),
            }
        })}
    }
    .into_any()
}

/// The card a made request leaves: its name linking to its page, its state and what happens next.
fn created_card(r: &RequestView) -> AnyView {
    let next = match (&r.waiting, r.state) {
        (Some(w), _) => w.sentence.clone(),
        (None, tessera_core::request::RequestState::Active) => "Its slices are ready to use.".into(),
        (None, tessera_core::request::RequestState::Approved | tessera_core::request::RequestState::Provisioning) => {
            "Its slices are being set up on their node.".into()
        }
        (None, _) => String::new(),
    };
    view! {
        <div class="created ok" role="status" data-testid="created" data-request=r.id.clone() data-state=state_name(r.state)>
            <p><strong>"Request made: "</strong><a href=format!("/requests/{}", r.id)>{format!("request {}", short(&r.id))}</a>
                {format!(" · {} · {}", describe(&r.spec, r.count), state_name(r.state))}</p>
            {(!next.is_empty()).then(|| view! { <p class="small">{next}</p> })}
        </div>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(decision: Decision) -> Feedback {
        Feedback { charges: vec![], over: vec![], decision: Some(decision), invalid: None, needed: vec![] }
    }

    fn preview(outcome: &str, auto_approve: bool, sentence: Option<&str>) -> RequestPreview {
        serde_json::from_value(serde_json::json!({
            "tenant": "t", "outcome": outcome, "refused": null, "quota": [], "borrowed": false, "reclaims": false,
            "auto_approve": auto_approve, "slices": [], "waiting": null, "sentence": sentence, "earliest_start_ms": null,
        }))
        .expect("a preview")
    }

    /// One headline whatever the quota arithmetic and the server's preview say together: never "approved at once"
    /// above "it would wait".
    #[test]
    fn the_form_gives_one_verdict() {
        let room = "the fleet has no room: 0 of 7 compute slices free on H100-80GB.";
        let auto = within(Decision::AutoApprove);
        let waits = verdict(&auto, Some(&preview("pending", true, Some(room))), 0);
        assert_eq!((waits.kind, waits.class, waits.refused), ("waits", "warn", false));
        assert_eq!(waits.headline, format!("Approved by your tenant's policy, then waits for room: {room}"));
        assert!(waits.why.as_deref().is_some_and(|w| w.starts_with("It would wait.")), "{waits:?}");
        assert!(!waits.headline.contains("at once"));
        let placed = verdict(&auto, Some(&preview("approved_now", true, None)), 0);
        assert_eq!((placed.kind, placed.class), ("auto", "ok"));
        assert_eq!(verdict(&auto, None, 0).kind, "checking", "no promise before the server answered");
        let admin = verdict(&within(Decision::NeedsAdmin), Some(&preview("pending", false, Some("x"))), 0);
        assert_eq!(
            (admin.kind, admin.headline.as_str()),
            ("admin", "Within quota: waits for a platform admin's approval.")
        );
        let over = Feedback { over: vec!["compute slices: 9 > 7".into()], ..within(Decision::AutoApprove) };
        let v = verdict(&over, Some(&preview("approved_now", true, None)), 0);
        assert_eq!((v.kind, v.refused), ("over", true), "the quota's refusal wins");
        let mut refused = preview("refused", true, None);
        refused.refused = serde_json::from_value(serde_json::json!({
            "type": "about:blank", "title": "Budget exhausted", "status": 409, "code": "budget_exhausted",
            "detail": "the month's budget is spent",
        }))
        .ok();
        let v = verdict(&auto, Some(&refused), 0);
        assert_eq!(
            (v.kind, v.refused, v.headline.as_str()),
            ("refused", true, "It would be refused: the month's budget is spent")
        );
    }
}
