//! The tenant's requests, newest first, with their history and the actions a request allows: the live ones (the
//! dashboard's current work) and the ended ones a page at a time ([`HistoryCard`]).
//!
//! Rows are keyed by request id and read their request from the latest list, so a refresh updates what a row shows
//! but keeps the row itself: an open history stays open (and is read again when the request changes), a release
//! waiting for confirmation keeps waiting.

use leptos::prelude::*;
use tessera_api::audit::AuditView;
use tessera_api::requests::{RequestPage, RequestView, Waiting};
use tessera_core::request::RequestState;

use crate::api::{self, ProblemExt};
use crate::pages::ago;
use crate::pages::shared::{describe, state_name};
use crate::widgets::{ConfirmAction, problem_view};

/// The table. Meant to sit in a `<Transition>`: it reads `requests`, and the transition holds the table while the
/// first page loads, then keeps it in place through refreshes. `now` is when the page last refreshed.
#[component]
pub(super) fn RequestsTable(
    requests: Resource<Result<RequestPage, api::Problem>>,
    waiting: Resource<Result<Vec<Waiting>, api::Problem>>,
    now: Signal<i64>,
    on_done: Callback<()>,
    /// What an empty list says.
    #[prop(default = "No requests yet.")]
    empty_text: &'static str,
) -> impl IntoView {
    // Why each waiting request waits, as last read (a failed read keeps the last answer).
    let why = Memo::new(move |prev: Option<&Vec<Waiting>>| {
        waiting.with(|w| match w {
            Some(Ok(list)) => list.clone(),
            _ => prev.cloned().unwrap_or_default(),
        })
    });
    // The last list that loaded, newest first: a refresh that fails keeps it, and says why above it.
    let latest = Memo::new(move |prev: Option<&Vec<RequestView>>| {
        requests.with(|r| match r {
            Some(Ok(page)) => {
                let mut items = page.items.clone();
                items.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| b.id.cmp(&a.id)));
                items
            }
            _ => prev.cloned().unwrap_or_default(),
        })
    });
    let problem = Memo::new(move |_| requests.with(|r| r.as_ref().and_then(|r| r.as_ref().err().cloned())));
    let ids = Memo::new(move |_| latest.with(|l| l.iter().map(|r| r.id.clone()).collect::<Vec<_>>()));
    let empty = Memo::new(move |_| latest.with(Vec::is_empty));
    view! {
        {move || problem.get().map(|p| problem_view(&p))}
        <Show
            when=move || !empty.get()
            fallback=move || problem.with(Option::is_none).then(|| view! { <p class="muted">{empty_text}</p> })
        >
            <div class="table-wrap">
            <table data-testid="requests">
                <thead><tr><th>"State"</th><th>"What"</th><th>"Asked"</th><th>"Reason"</th><th></th></tr></thead>
                <tbody>
                    <For each=move || ids.get() key=String::clone let:id>
                        <RequestRow id latest why now on_done />
                    </For>
                </tbody>
            </table>
            </div>
        </Show>
    }
}

fn cancellable(s: RequestState) -> bool {
    matches!(s, RequestState::Pending | RequestState::Approved | RequestState::Provisioning)
}

#[component]
fn RequestRow(
    id: String,
    latest: Memo<Vec<RequestView>>,
    why: Memo<Vec<Waiting>>,
    now: Signal<i64>,
    on_done: Callback<()>,
) -> impl IntoView {
    let waits = Memo::new({
        let id = id.clone();
        move |_| why.with(|w| w.iter().find(|w| w.request == id).cloned())
    });
    let row = Memo::new({
        let id = id.clone();
        move |_| latest.with(|l| l.iter().find(|r| r.id == id).cloned())
    });
    let text = move |f: fn(&RequestView) -> String| move || row.with(|r| r.as_ref().map(f).unwrap_or_default());
    let state = Memo::new(move |_| row.with(|r| r.as_ref().map(|r| r.state)));
    let state_text = move || state.get().map(state_name).unwrap_or_default();
    // Memos, so that the buttons are only rebuilt (and lose the focus) when what they offer changes.
    let can_cancel = Memo::new(move |_| state.get().is_some_and(cancellable));
    let can_release = Memo::new(move |_| state.get() == Some(RequestState::Active));

    let id = StoredValue::new(id);
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let act = move |action: &'static str| {
        let id = id.get_value();
        busy.set(true);
        leptos::task::spawn_local(async move {
            // Neither needs a body: a release without one gives no reason.
            let answer = api::send_empty::<RequestView>("POST", format!("/api/v1/requests/{id}/{action}")).await;
            busy.set(false);
            match answer {
                Ok(_) => {
                    error.set(None);
                    on_done.run(());
                }
                Err(p) => error.set(Some(p.message())),
            }
        });
    };

    let open = RwSignal::new(false);
    let history = RwSignal::new(None::<Result<Vec<AuditView>, api::Problem>>);
    let load_history = move || {
        let id = id.get_value();
        leptos::task::spawn_local(async move {
            history.set(Some(api::get_json(format!("/api/v1/audit?object=request/{id}")).await));
        });
    };
    let toggle_history = move |_| {
        if open.get_untracked() {
            open.set(false);
        } else {
            open.set(true);
            load_history();
        }
    };
    // An open history follows the request: read again when a refresh brings a change to it.
    Effect::watch(
        move || row.track(),
        move |_, _, _| {
            if open.get_untracked() {
                load_history();
            }
        },
        false,
    );

    view! {
        <tr data-request=id.get_value() id=format!("request-{}", id.get_value()) data-state=state_text>
            <td><span class=move || format!("rstate {}", state_text())>{state_text}</span></td>
            <td><a href=format!("/requests/{}", id.get_value()) data-testid="request-link">{text(|r| describe(&r.spec, r.count))}</a></td>
            <td title=text(|r| r.created_at_ms.to_string())>
                {move || row.with(|r| r.as_ref().map(|r| ago(r.created_at_ms, now.get())).unwrap_or_default())}
            </td>
            <td class="muted">{text(|r| r.reason.clone())}
                {move || waits.get().map(|w| view! {
                    <p class="why small" data-testid="why" data-code=w.reason.code()>{waiting_text(&w, now.get())}</p>
                })}
            </td>
            <td class="actions">
                <button class="link" data-testid="history" aria-expanded=move || open.get().to_string() on:click=toggle_history>"History"</button>
                {move || can_cancel.get().then(|| view! {
                    <button class="link danger" data-testid="cancel" disabled=move || busy.get() on:click=move |_| act("cancel")>"Cancel"</button>
                })}
                {move || can_release.get().then(|| view! {
                    <ConfirmAction label="Release…" confirm="Release" testid="release"
                        says="Release it? Its slices end now and go back to the fleet; its processes lose the device."
                        on_confirm=Callback::new(move |_| act("release")) />
                })}
                {move || error.get().map(|e| view! { <span class="error">{e}</span> })}
            </td>
        </tr>
        {move || open.get().then(|| view! {
            <tr class="history" data-testid="history-panel"><td colspan="5">
                {move || match history.get() {
                    None => view! { <p class="muted">"Loading…"</p> }.into_any(),
                    Some(Ok(entries)) => view! {
                        <ol class="timeline">
                            {entries.into_iter().map(|e| view! {
                                <li><span class="muted">{move || ago(e.at_ms, now.get())}</span>" "<strong>{e.action}</strong>" by "{e.actor}</li>
                            }).collect_view()}
                        </ol>
                    }.into_any(),
                    Some(Err(p)) => problem_view(&p),
                }}
            </td></tr>
        })}
    }
}

/// Why a request waits, for its row: the reason, then its place in the queue and when it could start.
pub fn waiting_text(w: &Waiting, now: i64) -> String {
    let mut text = w.sentence.clone();
    if let Some(p) = w.queue_position {
        text.push_str(&format!(" Position {p} in the queue for these slices."));
    }
    match (w.queue_position, w.earliest_start_ms) {
        (Some(_), Some(at)) if at > now + 60_000 => {
            text.push_str(&format!(" It could start in {}.", crate::pages::countdown(at, now)))
        }
        (Some(_), None) => text.push_str(" No known end of other slices makes room for it yet."),
        _ => {}
    }
    text
}

/// The states an ended request can be in, for the history's filter.
const ENDED: [&str; 5] = ["released", "expired", "cancelled", "rejected", "failed"];

/// Ended requests, newest first, 20 a page, with a filter by state; the pages are read from the API a page at a
/// time (`open=false&order=newest` and its cursor).
#[component]
pub(super) fn HistoryCard(
    tenant: String,
    waiting: Resource<Result<Vec<Waiting>, api::Problem>>,
    now: Signal<i64>,
    on_done: Callback<()>,
) -> impl IntoView {
    let state = RwSignal::new(String::new());
    // The cursors of the pages shown so far: the last is the page on screen (`None`: the newest).
    let pages = RwSignal::new(vec![None::<String>]);
    let requests = Resource::new(
        // Read again at each of the dashboard's refreshes: a request that ends shows here within one.
        move || (tenant.clone(), state.get(), pages.with(|p| p.last().cloned().flatten()), now.get()),
        |(t, s, cursor, _)| {
            let mut path = format!("/api/v1/requests?tenant={t}&open=false&order=newest&limit=20");
            if !s.is_empty() {
                path.push_str(&format!("&state={s}"));
            }
            if let Some(c) = cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            api::get_json::<RequestPage>(path)
        },
    );
    let next = Memo::new(move |_| requests.with(|r| r.as_ref().and_then(|r| r.as_ref().ok()?.next_cursor.clone())));
    view! {
        <div class="card" data-testid="history-card">
            <div class="title-row"><h2>"History"</h2>
                <label class="small">"State "
                    <select data-testid="history-state" on:change=move |ev| { state.set(event_target_value(&ev)); pages.set(vec![None]); }>
                        <option value="">"any ended"</option>
                        {ENDED.map(|s| view! { <option value=s>{s}</option> })}
                    </select>
                </label>
            </div>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                <RequestsTable requests waiting now on_done empty_text="No ended requests here." />
            </Transition>
            <div class="pager">
                <button type="button" class="button small" data-testid="history-newer" disabled=move || pages.with(|p| p.len() <= 1)
                    on:click=move |_| pages.update(|p| { p.pop(); })>"Newer"</button>
                <span class="muted small">{move || format!("page {}", pages.with(Vec::len))}</span>
                <button type="button" class="button small" data-testid="history-older" disabled=move || next.with(Option::is_none)
                    on:click=move |_| if let Some(c) = next.get_untracked() { pages.update(|p| p.push(Some(c))) }>"Older"</button>
            </div>
        </div>
    }
}
