//! `/inbox`: the events the viewer may read (its tenants'; every tenant's and the platform's for platform admins),
//! newest first, asked again as soon as the inbox stream (`/api/v1/inbox/stream`, followed by the header's "Inbox"
//! link) tells of a new event, and every 30 s besides. Opening it marks them read, which clears the count beside "Inbox" in
//! the header. Below, the viewer chooses which event types are mailed to them.

use std::collections::BTreeSet;

use leptos::prelude::*;
use tessera_api::notifications::{
    EventTypeView, EventView, InboxCount, InboxRead, NotificationSettings, NotificationSettingsUpdate,
};
use tessera_core::event::TypeFilter;

use crate::api;
use crate::pages::audit::{Names, object_in_words};
use crate::pages::shared::describe as describe_slices;
use crate::pages::{ago, now_ms};
use crate::widgets::problem_view;

/// How many events the page shows.
const LIMIT: u32 = 100;

/// How often the page asks for new events without being told of one, ms (should the stream be cut).
pub const REFRESH_MS: u64 = 30_000;

/// Bumped when the inbox was read, so the header's count is asked again at once.
#[derive(Debug, Clone, Copy)]
pub struct InboxRefresh(pub RwSignal<u64>);

/// The newest unread count the inbox stream brought (`None` before its first event).
#[derive(Debug, Clone, Copy)]
pub struct InboxLive(pub RwSignal<Option<InboxCount>>);

/// What an event type tells, in words (the type itself when unknown).
pub fn describe(kind: &str) -> String {
    tessera_core::event::TYPES.iter().find(|(t, _)| *t == kind).map_or_else(
        || kind.to_string(),
        |(_, d)| {
            let mut d = d.to_string();
            if let Some(first) = d.get(..1) {
                d.replace_range(..1, &first.to_uppercase());
            }
            d
        },
    )
}

/// Who did it, in words: a user by name, the system's parts by what they are.
fn actor_words(actor: &str) -> String {
    match actor {
        "system:auto-approve" => "the tenant's policy".into(),
        "system:reclaim" => "the cohort's reclaim".into(),
        "system" | "" => "Tessera".into(),
        a => a.strip_prefix("user:").or_else(|| a.strip_prefix("system:")).unwrap_or(a).to_string(),
    }
}

/// An event in words: who did what, to which named object, with the numbers ("dana asked for 2 × MIG 3g.40gb on
/// H100-80GB for vision"). Types it has no sentence for read as their description and object.
pub fn event_words(e: &EventView, names: &Names) -> String {
    let actor = actor_words(e.data.get("actor").and_then(|a| a.as_str()).unwrap_or("system"));
    let object = e.data.get("after").filter(|a| !a.is_null()).or_else(|| e.data.get("before"));
    let slices = object.and_then(|o| {
        let spec = serde_json::from_value::<tessera_core::request::SliceSpec>(o.get("spec")?.clone()).ok()?;
        let count = u32::try_from(o.get("count")?.as_u64()?).ok()?;
        Some(describe_slices(&spec, count))
    });
    let tenant = e.tenant.as_deref().map(|t| names.of(t)).unwrap_or_default();
    let of = |what: &str| if tenant.is_empty() { what.to_string() } else { format!("{tenant}'s {what}") };
    let req = slices.clone().unwrap_or_else(|| "request".into());
    let words = match e.kind.as_str() {
        "request.created" => Some(format!("{actor} asked for {req} for {tenant}")),
        "request.approved" => Some(format!("{actor} approved {}", of(&req))),
        "request.provisioning" => Some(format!("{} is being set up on its node", of(&req))),
        "request.active" => Some(format!("{} is ready to use", of(&req))),
        "request.rejected" => Some(format!("{actor} rejected {}", of(&req))),
        "request.cancelled" => Some(format!("{actor} cancelled {}", of(&req))),
        "request.released" => Some(format!("{actor} released {}", of(&req))),
        "request.expired" => Some(format!("{} reached the end of its duration", of(&req))),
        "request.failed" => Some(format!("{} could not be set up", of(&req))),
        "request.reclaimed" => Some(format!("{} was given back to its lender", of(&req))),
        "quota_request.suggested" => {
            let asked = object
                .and_then(|o| o.get("limits")?.as_object().cloned())
                .map(|l| {
                    let amount = |v: &serde_json::Value| match v.as_f64() {
                        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
                        Some(x) => format!("{x}"),
                        None => v.to_string(),
                    };
                    l.iter()
                        .map(|(k, v)| format!("{} to {}", k.replace('_', " "), amount(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            Some(format!("{actor} asks {tenant}'s admins for more quota: {asked}"))
        }
        "reservation.created" => Some(format!("{actor} booked {} for {tenant}", slices.clone().unwrap_or_default())),
        "reservation.accepted"
        | "reservation.rejected"
        | "reservation.cancelled"
        | "reservation.ended"
        | "reservation.failed" => {
            let verb = e.kind.trim_start_matches("reservation.");
            Some(format!("{}'s reservation of {} {verb}", tenant, slices.clone().unwrap_or_default()))
        }
        _ => None,
    };
    match words {
        Some(w) => w.replace("  ", " ").trim().to_string(),
        None => format!("{} · {}", describe(&e.kind), object_in_words(&e.subject, names)),
    }
}

/// The area of an event type (`request`, `layout`, `gpu`, ...), for the inbox's filter.
fn area(kind: &str) -> &str {
    kind.split('.').next().unwrap_or_default()
}

/// The count beside "Inbox": none when all is read, `99+` from 100.
pub fn unread_badge(unread: u32) -> Option<String> {
    match unread {
        0 => None,
        1..=99 => Some(unread.to_string()),
        _ => Some("99+".to_string()),
    }
}

/// The inbox page.
#[component]
pub fn InboxPage() -> impl IntoView {
    let tick = RwSignal::new(0u64);
    // Asked again when the stream tells of a newer event (not when only the count changed: reading changes it).
    let live = use_context::<InboxLive>();
    let latest = Memo::new(move |_| live.and_then(|l| l.0.get()).map(|c| c.latest_seq));
    let events = Resource::new(
        move || (tick.get(), latest.get()),
        |_| api::get_json::<Vec<EventView>>(format!("/api/v1/inbox?limit={LIMIT}")),
    );
    #[cfg(feature = "hydrate")]
    if let Ok(handle) =
        set_interval_with_handle(move || tick.update(|n| *n += 1), std::time::Duration::from_millis(REFRESH_MS))
    {
        on_cleanup(move || handle.clear());
    }
    let refresh = use_context::<InboxRefresh>();
    let kind_filter = RwSignal::new(String::new());
    let tenant_filter = RwSignal::new(String::new());
    // Names for the ids events carry: the tenants the viewer sees, and nodes where it may read them.
    let names = Resource::new(
        || (),
        |_| async move {
            let tenants = api::get_json::<Vec<tessera_api::tenants::TenantView>>("/api/v1/tenants".into()).await;
            let nodes = api::get_json::<Vec<tessera_api::nodes::NodeView>>("/api/v1/nodes".into()).await;
            Names::new(&tenants.unwrap_or_default(), &[], &nodes.unwrap_or_default())
        },
    );
    // Read once shown (in the browser only: the page rendered on the server marks nothing).
    Effect::new(move |_| {
        if let Some(Ok(list)) = events.get()
            && let Some(newest) = list.first()
        {
            let up_to = newest.seq;
            leptos::task::spawn_local(async move {
                let read = InboxRead { up_to };
                if api::send_json::<InboxCount>("POST", "/api/v1/inbox/read".into(), read).await.is_ok()
                    && let Some(r) = refresh
                {
                    r.0.update(|n| *n += 1);
                }
            });
        }
    });
    view! {
        <section class="page">
            <h1>"Inbox"</h1>
            <p class="muted">"What changed in your tenants: requests made, approved, ready and ending, idle slices, budgets, layouts, quota requests and reservations. It updates itself; webhooks and e-mail carry the same events elsewhere."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match events.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="muted" data-testid="inbox-empty">"Nothing yet."</p> }.into_any(),
                        Ok(list) => {
                            let now = now_ms();
                            let names = names.await;
                            let tenants: BTreeSet<String> = list.iter().filter_map(|e| e.tenant.clone()).collect();
                            let areas: BTreeSet<String> = list.iter().map(|e| area(&e.kind).to_string()).collect();
                            let tenant_options: Vec<(String, String)> = tenants.into_iter().map(|t| (names.of(&t), t)).collect();
                            let items: Vec<(EventView, String)> = list.into_iter().map(|e| { let w = event_words(&e, &names); (e, w) }).collect();
                            view! {
                                <div class="row small" data-testid="inbox-filters">
                                    <label>"Type "
                                        <select data-testid="inbox-type" on:change=move |ev| kind_filter.set(event_target_value(&ev))>
                                            <option value="">"all"</option>
                                            {areas.into_iter().map(|a| view! { <option value=a.clone()>{a.replace('_', " ")}</option> }).collect_view()}
                                        </select>
                                    </label>
                                    <label>"Tenant "
                                        <select data-testid="inbox-tenant" on:change=move |ev| tenant_filter.set(event_target_value(&ev))>
                                            <option value="">"all"</option>
                                            {tenant_options.into_iter().map(|(name, id)| view! { <option value=id>{name}</option> }).collect_view()}
                                        </select>
                                    </label>
                                </div>
                                <ul class="inbox" data-testid="inbox">
                                    {items.into_iter().map(|(e, words)| {
                                        let (kind, tenant) = (e.kind.clone(), e.tenant.clone().unwrap_or_default());
                                        let shown = move || {
                                            let k = kind_filter.get();
                                            let t = tenant_filter.get();
                                            (k.is_empty() || area(&kind) == k) && (t.is_empty() || tenant == t)
                                        };
                                        view! {
                                            <li class="card" data-testid="inbox-item" data-type=e.kind.clone() data-subject=e.subject.clone()
                                                data-tenant=e.tenant.clone().unwrap_or_default() style:display=move || if shown() { "" } else { "none" }>
                                                <a href=tessera_core::event::portal_path(&e.kind, &e.subject, e.tenant.as_deref())>{words}</a>
                                                <span class="muted">{format!(" · {}", ago(e.at_ms, now))}</span>
                                            </li>
                                        }
                                    }).collect_view()}
                                </ul>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
            <EmailCard />
        </section>
    }
}

/// The event types a choice of patterns covers, among `types` (never the webhook test).
pub fn chosen(patterns: &[String], types: &[String]) -> BTreeSet<String> {
    let filter = TypeFilter::new(patterns).unwrap_or_default();
    if patterns.is_empty() {
        return BTreeSet::new();
    }
    types.iter().filter(|t| *t != "webhook.test" && filter.wants(t)).cloned().collect()
}

/// Which event types are mailed to the viewer: a box per type, grouped by area; saved only when asked, and never
/// reset by anything else on the page.
#[component]
fn EmailCard() -> impl IntoView {
    let settings =
        Resource::new(|| (), |_| api::get_json::<NotificationSettings>("/api/v1/notification-settings".into()));
    let types = Resource::new(|| (), |_| api::get_json::<Vec<EventTypeView>>("/api/v1/event-types".into()));
    let picked = RwSignal::new(None::<BTreeSet<String>>);
    let message = RwSignal::new(None::<(bool, String)>);
    let save = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        // Nothing ticked or cleared yet: the saved choice stands.
        let Some(picked) = picked.get_untracked() else {
            return message.set(Some((true, "Nothing changed.".to_string())));
        };
        let email_types: Vec<String> = picked.into_iter().collect();
        leptos::task::spawn_local(async move {
            let body = NotificationSettingsUpdate { email_types };
            match api::send_json::<NotificationSettings>("PUT", "/api/v1/notification-settings".into(), body).await {
                Ok(s) => {
                    message.set(Some((true, format!("Saved: {} event types are mailed to you.", s.email_types.len()))))
                }
                Err(p) => message.set(Some((false, crate::api::ProblemExt::message(&p)))),
            }
        });
    };
    view! {
        <Transition fallback=|| ()>
            {move || Suspend::new(async move {
                let (s, list) = match (settings.await, types.await) {
                    (Ok(s), Ok(t)) => (s, t),
                    (Err(p), _) | (_, Err(p)) => return problem_view(&p),
                };
                let all: Vec<String> = list.iter().map(|t| t.kind.clone()).filter(|t| t != "webhook.test").collect();
                // The server's choice until the viewer ticks a box; from then on the boxes are the viewer's (never
                // set while rendering).
                let saved = chosen(&s.email_types, &all);
                let mut areas: Vec<(String, Vec<EventTypeView>)> = Vec::new();
                for t in list.into_iter().filter(|t| t.kind != "webhook.test") {
                    let area = t.kind.split('.').next().unwrap_or_default().to_string();
                    match areas.iter_mut().find(|(a, _)| *a == area) {
                        Some((_, v)) => v.push(t),
                        None => areas.push((area, vec![t])),
                    }
                }
                let address = match (&s.email, s.email_enabled) {
                    (_, false) => "This server sends no e-mail (no SMTP server is configured); your choice is kept for when it does.".to_string(),
                    (Some(a), true) => format!("Mail goes to {a}."),
                    (None, true) => "You have no e-mail address (your identity provider gave none): nothing can be mailed to you.".to_string(),
                };
                let recent = s.recent.clone();
                view! {
                    <form class="card email-choice" data-testid="email-form" on:submit=save>
                        <h2>"E-mail"</h2>
                        <p class="muted" data-testid="email-address">{address}</p>
                        {areas.into_iter().map(|(area, kinds)| view! {
                            <fieldset>
                                <legend>{area}</legend>
                                {kinds.into_iter().map(|t| {
                                    let kind = t.kind.clone();
                                    let checked_kind = kind.clone();
                                    let was = saved.contains(&kind);
                                    let saved = saved.clone();
                                    view! {
                                        <label class="check">
                                            <input type="checkbox" name="email-type" value=kind.clone()
                                                checked=was
                                                prop:checked=move || picked.get().map_or(was, |p| p.contains(&checked_kind))
                                                on:change=move |ev| {
                                                    let on = event_target_checked(&ev);
                                                    let kind = kind.clone();
                                                    let saved = saved.clone();
                                                    picked.update(|p| {
                                                        let p = p.get_or_insert_with(|| saved);
                                                        if on { p.insert(kind); } else { p.remove(&kind); }
                                                    });
                                                } />
                                            {describe(&t.kind)}
                                        </label>
                                    }
                                }).collect_view()}
                            </fieldset>
                        }).collect_view()}
                        <button class="button primary" type="submit">"Save e-mail choices"</button>
                        {move || message.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="status" data-testid="email-saved">{m}</p> })}
                        {(!recent.is_empty()).then(|| view! {
                            <details>
                                <summary>"Recently mailed"</summary>
                                <ul class="plain" data-testid="email-recent">
                                    {recent.into_iter().map(|d| view! {
                                        <li data-state=d.state.clone()>{format!("{} · {} · {}{}", describe(&d.kind), d.subject, d.state,
                                            if d.last_error.is_empty() { String::new() } else { format!(" · {}", d.last_error) })}</li>
                                    }).collect_view()}
                                </ul>
                            </details>
                        })}
                    </form>
                }.into_any()
            })}
        </Transition>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, actor: &str, after: serde_json::Value) -> EventView {
        EventView {
            seq: 1,
            id: "e-1".into(),
            kind: kind.into(),
            tenant: Some("t-1".into()),
            subject: "request/01a2115b-6fed-77df-b682-ff07d4fd86c1".into(),
            at_ms: 0,
            text: String::new(),
            data: serde_json::json!({"actor": actor, "action": "x", "before": null, "after": after}),
        }
    }

    /// Who, what, on which named object, with the numbers; the link opens the request's own page.
    #[test]
    fn events_read_in_words_with_names_and_numbers() {
        let names: Names = serde_json::from_value(serde_json::json!({"t-1": "vision"})).expect("names");
        let asked = serde_json::json!({"tenant_id": "t-1", "count": 2,
            "spec": {"mode": "mig", "profile": "3g.40gb", "model": "H100-80GB"}});
        let e = event("request.created", "user:dana", asked.clone());
        assert_eq!(event_words(&e, &names), "dana asked for 2 × MIG 3g.40gb on H100-80GB for vision");
        assert_eq!(
            event_words(&event("request.approved", "system:auto-approve", asked.clone()), &names),
            "the tenant's policy approved vision's 2 × MIG 3g.40gb on H100-80GB"
        );
        assert_eq!(
            event_words(&event("request.active", "system", asked), &names),
            "vision's 2 × MIG 3g.40gb on H100-80GB is ready to use"
        );
        assert_eq!(
            tessera_core::event::portal_path(&e.kind, &e.subject, e.tenant.as_deref()),
            "/requests/01a2115b-6fed-77df-b682-ff07d4fd86c1"
        );
        let ask = serde_json::json!({"tenant_id": "t-1", "limits": {"compute_slices": 62.0, "memory_gib": 1.5}});
        assert_eq!(
            event_words(&event("quota_request.suggested", "user:dana", ask), &names),
            "dana asks vision's admins for more quota: compute slices to 62, memory gib to 1.5"
        );
        let other = EventView {
            subject: "gpu/g-1".into(),
            tenant: None,
            ..event("gpu.cordoned", "user:root", serde_json::Value::Null)
        };
        assert!(event_words(&other, &names).starts_with("A GPU was cordoned"), "{}", event_words(&other, &names));
    }

    #[test]
    fn types_read_as_sentences_and_counts_stop_at_99() {
        assert_eq!(describe("request.active"), "A request's slices are ready to use");
        assert_eq!(describe("no.such"), "no.such");
        assert_eq!(unread_badge(0), None);
        assert_eq!(unread_badge(7).as_deref(), Some("7"));
        assert_eq!(unread_badge(100).as_deref(), Some("99+"));
    }

    #[test]
    fn patterns_become_the_boxes_they_cover() {
        let types: Vec<String> =
            ["request.created", "request.active", "layout.failed", "webhook.test"].map(String::from).to_vec();
        let got = chosen(&["request.*".to_string()], &types);
        assert_eq!(got.into_iter().collect::<Vec<_>>(), ["request.active", "request.created"]);
        assert_eq!(chosen(&["*".to_string()], &types).len(), 3, "never the webhook test");
        assert!(chosen(&[], &types).is_empty(), "nothing chosen is nothing mailed");
    }
}
