//! `/inbox`: the events the viewer may read (its tenants'; every tenant's and the platform's for platform admins),
//! newest first. Opening it marks them read, which clears the count beside "Inbox" in the header.

use leptos::prelude::*;
use tessera_api::notifications::{EventView, InboxCount, InboxRead};

use crate::api;
use crate::pages::audit::{Names, object_in_words};
use crate::pages::{ago, now_ms};
use crate::widgets::problem_view;

/// How many events the page shows.
const LIMIT: u32 = 100;

/// Bumped when the inbox was read, so the header's count is asked again at once.
#[derive(Debug, Clone, Copy)]
pub struct InboxRefresh(pub RwSignal<u64>);

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
    let events = Resource::new(|| (), |_| api::get_json::<Vec<EventView>>(format!("/api/v1/inbox?limit={LIMIT}")));
    let refresh = use_context::<InboxRefresh>();
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
            <p class="muted">"What changed in your tenants: requests made, approved, ready and ending, layouts, quota requests and reservations. Webhooks carry the same events to other tools."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match events.await {
                        Err(p) => problem_view(&p),
                        Ok(list) if list.is_empty() => view! { <p class="muted" data-testid="inbox-empty">"Nothing yet."</p> }.into_any(),
                        Ok(list) => {
                            let now = now_ms();
                            let names = Names::default();
                            view! {
                                <ul class="inbox" data-testid="inbox">
                                    {list.into_iter().map(|e| {
                                        let actor = e.data.get("actor").and_then(|a| a.as_str()).unwrap_or("system").to_string();
                                        view! {
                                            <li class="card" data-testid="inbox-item" data-type=e.kind.clone() data-subject=e.subject.clone()>
                                                <strong>{describe(&e.kind)}</strong>
                                                <span class="muted">{format!(" · {} · {} · by {actor}", object_in_words(&e.subject, &names), ago(e.at_ms, now))}</span>
                                            </li>
                                        }
                                    }).collect_view()}
                                </ul>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_read_as_sentences_and_counts_stop_at_99() {
        assert_eq!(describe("request.active"), "A request's slices are ready to use");
        assert_eq!(describe("no.such"), "no.such");
        assert_eq!(unread_badge(0), None);
        assert_eq!(unread_badge(7).as_deref(), Some("7"));
        assert_eq!(unread_badge(100).as_deref(), Some("99+"));
    }
}
