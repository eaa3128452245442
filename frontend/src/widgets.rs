//! Pieces every page shares: how a refused API call shows, and the resources the shell provides to pages. Pages
//! import them from here, never from the shell (`app.rs`), which imports the pages.

use leptos::prelude::*;
use leptos_router::components::A;

use tessera_api::signin::SessionView;
use tessera_api::tenants::TenantView;

use crate::api::{Problem, ProblemExt};

/// The session of the page's viewer (`Err` with status 401 when nobody is signed in).
pub type SessionResource = Resource<Result<SessionView, Problem>>;

/// The tenants the viewer may see (names for ids).
pub type TenantsResource = Resource<Result<Vec<TenantView>, Problem>>;

/// What a page shows when the API refused: a sign-in link for 401, otherwise what happened and what to do next
/// in a sentence (the stable code stays in `data-code` and the tooltip, for reports).
pub fn problem_view(problem: &Problem) -> AnyView {
    if problem.needs_sign_in() {
        view! {
            <div class="notice" role="status">
                <p>"Sign in to see this page."</p>
                <A href="/signin">"Sign in"</A>
            </div>
        }
        .into_any()
    } else {
        let code = problem.code.clone();
        view! {
            <div class="notice error" role="alert" data-code=code.clone() title=(!code.is_empty()).then(|| format!("code: {code}"))>
                <p>{problem.message()}</p>
            </div>
        }
        .into_any()
    }
}

/// Messages after an action (`(ok, text)`, oldest first), read out politely as they change.
#[component]
pub fn Messages(
    messages: RwSignal<Vec<(bool, String)>>,
    #[prop(optional)] testid: Option<&'static str>,
) -> impl IntoView {
    view! {
        <ul class="messages" aria-live="polite" data-testid=testid>
            {move || messages.get().into_iter().map(|(ok, m)| view! { <li class:ok=ok class:error=!ok>{m}</li> }).collect_view()}
        </ul>
    }
}

/// Provided by a page whose rows are drawn again when it refreshes: it counts the confirmations open, and the page
/// holds its refresh while one is (a redraw would close it while the reason is being typed).
#[derive(Debug, Clone, Copy)]
pub struct RefreshHold(pub RwSignal<u32>);

impl RefreshHold {
    /// Provides a new one to the page's children and returns it.
    pub fn provide() -> RefreshHold {
        let hold = RefreshHold(RwSignal::new(0));
        provide_context(hold);
        hold
    }

    /// Whether the page may refresh now.
    pub fn free(self) -> bool {
        self.0.get_untracked() == 0
    }
}

/// The one way an action that takes something away is confirmed: its button (`label`, `data-testid=testid`)
/// opens, in place, a sentence saying what it will do (`says`), a reason field when the audit log keeps one
/// (`reason`), and the action's own button (`confirm`, `data-testid=confirm`) beside Keep (`data-testid=keep`),
/// which closes it. Confirming hands the reason (empty when none was typed) to `on_confirm` and closes it; the
/// page says how it went. The focus moves to the action's button on opening and back on closing.
#[component]
pub fn ConfirmAction(
    #[prop(into)] label: String,
    #[prop(into)] confirm: String,
    #[prop(into)] says: String,
    testid: &'static str,
    #[prop(optional)] reason: bool,
    on_confirm: Callback<String>,
) -> impl IntoView {
    let open = RwSignal::new(false);
    let why = RwSignal::new(String::new());
    let opener = NodeRef::<leptos::html::Button>::new();
    let confirmer = NodeRef::<leptos::html::Button>::new();
    let (label, confirm, says) = (StoredValue::new(label), StoredValue::new(confirm), StoredValue::new(says));
    let hold = use_context::<RefreshHold>();
    let set_open = move |on: bool| {
        if open.get_untracked() != on {
            open.set(on);
            if let Some(h) = hold {
                h.0.update(|n| *n = if on { *n + 1 } else { n.saturating_sub(1) });
            }
        }
    };
    on_cleanup(move || {
        if open.try_get_untracked().unwrap_or(false)
            && let Some(h) = hold
        {
            h.0.try_update(|n| *n = n.saturating_sub(1));
        }
    });
    let close = move || {
        set_open(false);
        focus_when_drawn(opener);
    };
    view! {
        {move || if open.get() {
            view! {
                <div class="confirm" role="group" data-testid=format!("{testid}-confirm")>
                    <p class="small">{says.get_value()}</p>
                    {reason.then(|| view! {
                        <label class="small">"Why? "<span class="muted">"(kept in the audit log)"</span>
                            <input type="text" name="reason" data-testid="confirm-reason" maxlength="2000" bind:value=why />
                        </label>
                    })}
                    <div class="confirm-buttons">
                        <button type="button" class="button small danger" data-testid="confirm" node_ref=confirmer
                            on:click=move |_| { on_confirm.run(why.get_untracked().trim().to_string()); why.set(String::new()); close(); }>
                            {confirm.get_value()}
                        </button>
                        <button type="button" class="button small" data-testid="keep" on:click=move |_| close()>"Keep"</button>
                    </div>
                </div>
            }.into_any()
        } else {
            view! {
                <button type="button" class="link danger" data-testid=testid node_ref=opener
                    on:click=move |_| { set_open(true); focus_when_drawn(confirmer); }>{label.get_value()}</button>
            }.into_any()
        }}
    }
}

/// Moves the focus to `button` once it is drawn (a button that replaces the one just pressed).
pub fn focus_when_drawn(button: NodeRef<leptos::html::Button>) {
    #[cfg(feature = "hydrate")]
    request_animation_frame(move || {
        if let Some(b) = button.get_untracked() {
            let _ = b.focus();
        }
    });
    #[cfg(not(feature = "hydrate"))]
    let _ = button;
}

/// Copies `text` to the clipboard; says "Copied" once done. `label` names what it copies for screen readers.
#[component]
pub fn CopyButton(text: String, #[prop(optional, into)] label: String) -> impl IntoView {
    let copied = RwSignal::new(false);
    let on_click = move |_| {
        #[cfg(feature = "hydrate")]
        if let Some(w) = web_sys::window() {
            let _ = w.navigator().clipboard().write_text(&text);
            copied.set(true);
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
    };
    let aria = if label.is_empty() { "Copy".to_string() } else { format!("Copy {label}") };
    view! { <button class="button small copy" type="button" aria-label=aria on:click=on_click>{move || if copied.get() { "Copied" } else { "Copy" }}</button> }
}

/// The words of quotas and usage, explained once.
#[component]
pub fn Glossary() -> impl IntoView {
    view! {
        <details class="glossary card" id="glossary" data-testid="glossary">
            <summary>"What the units mean"</summary>
            <dl>
                <dt>"Compute slice"</dt>
                <dd>"The unit of GPU compute that MIG hands out: an H100 or A100 has 7 (a 1g instance is 1 slice, a 3g instance 3, a whole GPU 7), an A30 has 4. Quotas count compute slices across all kinds of slices; time-slice and MPS shares count as their share of the GPU's slices."</dd>
                <dt>"GPU memory (GiB)"</dt>
                <dd>"The memory that comes with a slice: a 1g.10gb instance brings 10 GB, a whole H100-80GB 80 GB."</dd>
                <dt>"Slice-hour"</dt>
                <dd>"One compute slice held for one hour: a 3g instance held for 2 hours is 6 slice-hours. Usage and chargeback count these."</dd>
                <dt>"GPU-hour"</dt>
                <dd>"A whole GPU for one hour; a slice counts as its share of the GPU (a 3g instance of an H100 held for 7 hours is 3 GPU-hours)."</dd>
                <dt>"Idle"</dt>
                <dd>"An active allocation whose device stayed under the chosen utilisation for the chosen number of hours: a candidate to release."</dd>
                <dt>"Pending"</dt>
                <dd>"Asked for, waiting for an admin (or for a MIG layout change to be approved); it counts against the quota until decided."</dd>
            </dl>
        </details>
    }
}

/// The rows of a list to render: the ones a viewport of `viewport` pixels scrolled to `scroll_top` shows, each row
/// `row_px` pixels high, and `overscan` more on either side, within `0..total`.
pub fn window_rows(
    scroll_top: f64,
    viewport: f64,
    row_px: f64,
    total: usize,
    overscan: usize,
) -> std::ops::Range<usize> {
    let row_px = row_px.max(1.0);
    let first = (scroll_top.max(0.0) / row_px).floor() as usize;
    let shown = (viewport.max(0.0) / row_px).ceil() as usize + 1;
    let start = first.saturating_sub(overscan).min(total);
    let end = first.saturating_add(shown).saturating_add(overscan).min(total);
    start..end.max(start)
}

/// Where a scroll container stands: how far it is scrolled and how tall it is, CSS pixels. The browser updates it
/// at most once an animation frame, however many scroll events arrive; the server renders the first screenful,
/// with [`ScrollWatch::new`]'s height.
#[derive(Debug, Clone, Copy)]
pub struct ScrollWatch {
    /// `scrollTop`.
    pub top: RwSignal<f64>,
    /// `clientHeight`.
    pub height: RwSignal<f64>,
}

impl ScrollWatch {
    /// At the top, `height` pixels tall until the browser says otherwise.
    pub fn new(height: f64) -> ScrollWatch {
        ScrollWatch { top: RwSignal::new(0.0), height: RwSignal::new(height) }
    }

    /// Follows the element `el` once it is drawn: its scroll position is set back to the one kept (an element
    /// drawn again, on a refresh, keeps its place), then every scroll and window resize is read in the next
    /// animation frame.
    pub fn follow(self, el: NodeRef<leptos::html::Div>) {
        #[cfg(feature = "hydrate")]
        {
            use wasm_bindgen::JsCast;
            use wasm_bindgen::prelude::Closure;
            let ScrollWatch { top, height } = self;
            Effect::new(move || {
                let Some(el) = el.get() else { return };
                let el: web_sys::Element = el.into();
                let kept = top.get_untracked();
                if kept > 0.0 {
                    el.set_scroll_top(kept as i32);
                }
                let pending = std::rc::Rc::new(std::cell::Cell::new(false));
                let read = {
                    let el = el.clone();
                    move || {
                        if pending.replace(true) {
                            return;
                        }
                        let (el, pending) = (el.clone(), pending.clone());
                        request_animation_frame(move || {
                            pending.set(false);
                            let (t, h) = (f64::from(el.scroll_top()), f64::from(el.client_height()));
                            if top.try_get_untracked().is_some_and(|v| v != t) {
                                top.set(t);
                            }
                            if h > 0.0 && height.try_get_untracked().is_some_and(|v| v != h) {
                                height.set(h);
                            }
                        });
                    }
                };
                read();
                let on_scroll = Closure::<dyn FnMut()>::new(read);
                let _ = el.add_event_listener_with_callback("scroll", on_scroll.as_ref().unchecked_ref());
                if let Some(w) = web_sys::window() {
                    let _ = w.add_event_listener_with_callback("resize", on_scroll.as_ref().unchecked_ref());
                }
                on_scroll.forget();
            });
        }
        #[cfg(not(feature = "hydrate"))]
        let _ = (self, el);
    }

    /// The rows to render of `total`, `row_px` high, with `overscan` more on either side.
    pub fn rows(self, row_px: f64, total: usize, overscan: usize) -> std::ops::Range<usize> {
        window_rows(self.top.get(), self.height.get(), row_px, total, overscan)
    }
}

#[cfg(test)]
mod tests {
    use super::window_rows;

    #[test]
    fn only_the_rows_in_view_and_a_margin_are_rendered() {
        assert_eq!(window_rows(0.0, 400.0, 20.0, 10_000, 5), 0..26);
        assert_eq!(window_rows(2000.0, 400.0, 20.0, 10_000, 5), 95..126);
        assert_eq!(window_rows(199_990.0, 400.0, 20.0, 10_000, 5), 9994..10_000);
        assert_eq!(window_rows(0.0, 400.0, 20.0, 3, 5), 0..3);
        assert_eq!(window_rows(500.0, 400.0, 20.0, 0, 5), 0..0);
        assert_eq!(window_rows(-10.0, 0.0, 0.0, 10, 0), 0..1);
    }
}
