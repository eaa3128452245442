//! The document shell, the header (navigation, who is signed in, theme) and the routes.

use leptos::prelude::*;
use leptos_meta::{MetaTags, Title, provide_meta_context};
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use tessera_api::signin::SessionView;
use tessera_api::tenants::TenantView;

use crate::api;
use crate::pages::{
    admin::{TenantAdminPage, TenantsAdminPage},
    approvals::ApprovalsPage,
    audit::AuditLogPage,
    fleet::FleetPage,
    governance::StandingPage,
    heatmap::HeatmapPage,
    inbox::{InboxLive, InboxPage, InboxRefresh},
    layout::LayoutEditorPage,
    overview::OverviewPage,
    signin::SignInPage,
    tenant::TenantPage,
    tokens::TokensPage,
    usage::UsagePage,
};
use crate::widgets::{SessionResource, TenantsResource};

/// Whether the hydration scripts are served (the server knows whether it has the wasm).
#[derive(Debug, Clone, Copy)]
pub struct Hydrates(pub bool);

/// The whole HTML document, rendered on the server. `hydrates`: include the scripts that hydrate it.
pub fn shell(options: LeptosOptions, hydrates: bool) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <meta name="color-scheme" content="light dark" />
                <link rel="stylesheet" href="/pkg/tessera.css" />
                <link rel="icon" href="/pkg/icon.svg" type="image/svg+xml" />
                // The theme chosen earlier, before the first paint (no flash of the other theme).
                <script>
                    "try{var t=localStorage.getItem('tessera-theme');if(t)document.documentElement.dataset.theme=t}catch(e){}"
                </script>
                {hydrates.then(|| view! { <HydrationScripts options=options.clone() /> })}
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

/// The portal.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    let session: SessionResource = Resource::new(|| (), |_| api::get_json::<SessionView>("/api/v1/session".into()));
    provide_context(session);
    let tenants: TenantsResource = Resource::new(|| (), |_| api::get_json::<Vec<TenantView>>("/api/v1/tenants".into()));
    provide_context(tenants);
    provide_context(InboxRefresh(RwSignal::new(0)));
    provide_context(InboxLive(RwSignal::new(None)));
    view! {
        <Title text="Tessera" />
        <Router>
            <Header session tenants />
            <main id="main">
                <Routes fallback=|| view! { <section class="page"><h1>"Not found"</h1><p>"There is no page here."</p><A href="/">"Overview"</A></section> }>
                    <Route path=path!("/") view=OverviewPage />
                    <Route path=path!("/fleet") view=FleetPage />
                    <Route path=path!("/signin") view=SignInPage />
                    <Route path=path!("/t/:tenant") view=TenantPage />
                    <Route path=path!("/requests/:id") view=crate::pages::tenant::RequestPage />
                    <Route path=path!("/approvals") view=ApprovalsPage />
                    <Route path=path!("/heatmap") view=HeatmapPage />
                    <Route path=path!("/gpus/:id/layout") view=LayoutEditorPage />
                    <Route path=path!("/usage") view=UsagePage />
                    <Route path=path!("/tokens") view=TokensPage />
                    <Route path=path!("/audit") view=AuditLogPage />
                    <Route path=path!("/inbox") view=InboxPage />
                    <Route path=path!("/webhooks") view=crate::pages::webhooks::WebhooksPage />
                    <Route path=path!("/admin/tenants") view=TenantsAdminPage />
                    <Route path=path!("/admin/tenants/:id") view=TenantAdminPage />
                    <Route path=path!("/admin/quotas") view=StandingPage />
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn Header(session: SessionResource, tenants: TenantsResource) -> impl IntoView {
    view! {
        <header class="top">
            <a class="skip" href="#main">"Skip to content"</a>
            <A href="/" attr:class="brand">
                <span class="logo" aria-hidden="true"></span>
                "Tessera"
            </A>
            <nav aria-label="Main">
                <A href="/">"Overview"</A>
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        let Ok(s) = session.await else { return ().into_any() };
                        let names = tenants.await.unwrap_or_default();
                        view! {
                            <TenantSwitch session=s.clone() tenants=names />
                            {s.user.platform_admin.then(|| view! {
                                <ApprovalsLink />
                                <A href="/fleet">"Fleet"</A>
                                <A href="/admin/tenants">"Tenants"</A>
                                <A href="/audit">"Audit"</A>
                            })}
                            <A href="/heatmap">"Utilisation"</A>
                            <A href="/usage">"Usage"</A>
                            {(s.user.platform_admin || s.memberships.iter().any(|m| m.role == tessera_api::people::Role::TenantAdmin))
                                .then(|| view! { <A href="/webhooks">"Webhooks"</A> })}
                        }.into_any()
                    })}
                </Transition>
                <a href="/api/docs" rel="external">"API"</a>
            </nav>
            <div class="who">
                <Transition fallback=|| ()>
                    {move || Suspend::new(async move {
                        match session.await {
                            Ok(s) => view! {
                                <span class="user" data-testid="user">{s.user.name.clone()}</span>
                                {s.user.platform_admin.then(|| view! { <span class="badge">"admin"</span> })}
                                <InboxLink />
                                <A href="/tokens">"Account"</A>
                                <SignOut />
                            }.into_any(),
                            Err(_) => view! { <A href="/signin">"Sign in"</A> }.into_any(),
                        }
                    })}
                </Transition>
                <ThemeToggle />
            </div>
        </header>
    }
}

/// "Approvals" with the number of requests, quota requests and layout changes waiting (platform admins), counted
/// every 10 s.
#[component]
fn ApprovalsLink() -> impl IntoView {
    let waiting = RwSignal::new(None::<String>);
    #[cfg(feature = "hydrate")]
    {
        let count = move || {
            leptos::task::spawn_local(async move {
                use tessera_api::layouts::LayoutView;
                use tessera_api::requests::RequestPage;
                let requests =
                    crate::api::get_json::<RequestPage>("/api/v1/requests?state=pending&limit=500".into()).await;
                let layouts = crate::api::get_json::<Vec<LayoutView>>("/api/v1/layouts?state=proposed".into()).await;
                let quotas = crate::api::get_json::<tessera_api::quotas::QuotaRequestPage>(
                    "/api/v1/quota-requests?state=pending&limit=500".into(),
                )
                .await;
                if let (Ok(r), Ok(l), Ok(q)) = (requests, layouts, quotas) {
                    let more = r.next_cursor.is_some() || q.next_cursor.is_some();
                    waiting.set(approvals_badge(r.items.len() + q.items.len(), more, l.len()));
                }
            });
        };
        count();
        if let Ok(handle) = set_interval_with_handle(count, std::time::Duration::from_secs(10)) {
            on_cleanup(move || handle.clear());
        }
    }
    view! {
        <A href="/approvals">
            "Approvals"
            {move || waiting.get().map(|n| { let label = format!("{n} waiting"); view! { <span class="count-badge" data-testid="approvals-count" aria-label=label>{n}</span> } })}
        </A>
    }
}

/// "Inbox" with the number of unread events: followed through the inbox stream (an `inbox` event whenever the
/// count changes, which also tells the inbox page of new events), asked at once after the inbox was read, and every
/// 60 s should the stream be cut.
#[component]
fn InboxLink() -> impl IntoView {
    let unread = RwSignal::new(None::<String>);
    #[cfg(feature = "hydrate")]
    {
        use wasm_bindgen::JsCast;
        use wasm_bindgen::closure::Closure;

        let live = use_context::<InboxLive>();
        let count = move || {
            leptos::task::spawn_local(async move {
                let c = crate::api::get_json::<tessera_api::notifications::InboxCount>("/api/v1/inbox/unread".into());
                if let Ok(c) = c.await {
                    unread.set(crate::pages::inbox::unread_badge(c.unread));
                }
            });
        };
        count();
        if let Ok(handle) = set_interval_with_handle(count, std::time::Duration::from_secs(60)) {
            on_cleanup(move || handle.clear());
        }
        if let Some(refresh) = use_context::<InboxRefresh>() {
            Effect::new(move |first: Option<()>| {
                refresh.0.track();
                if first.is_some() {
                    count();
                }
            });
        }
        // The stream: `EventSource` opens it again by itself when it ends (every 5 minutes) or is cut.
        if let Ok(es) = web_sys::EventSource::new("/api/v1/inbox/stream") {
            let on_count = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |ev: web_sys::MessageEvent| {
                let Some(text) = ev.data().as_string() else { return };
                let Ok(c) = serde_json::from_str::<tessera_api::notifications::InboxCount>(&text) else { return };
                unread.set(crate::pages::inbox::unread_badge(c.unread));
                if let Some(l) = live {
                    l.0.set(Some(c));
                }
            });
            let _ = es.add_event_listener_with_callback("inbox", on_count.as_ref().unchecked_ref());
            on_count.forget();
            let es = send_wrapper::SendWrapper::new(es);
            on_cleanup(move || es.close());
        }
    }
    view! {
        <A href="/inbox" attr:data-testid="inbox-link">
            "Inbox"
            {move || unread.get().map(|n| { let label = format!("{n} unread"); view! { <span class="count-badge" data-testid="inbox-count" aria-label=label>{n}</span> } })}
        </A>
    }
}

/// The badge beside "Approvals": `None` when nothing waits, `500+` past the first page of requests.
pub fn approvals_badge(requests: usize, more: bool, layouts: usize) -> Option<String> {
    match (requests + layouts, more) {
        (0, false) => None,
        (n, false) => Some(n.to_string()),
        (n, true) => Some(format!("{n}+")),
    }
}

/// The viewer's tenants: a link for one, a switcher for several.
#[component]
fn TenantSwitch(session: SessionView, tenants: Vec<TenantView>) -> impl IntoView {
    let name = move |id: &str| tenants.iter().find(|t| t.id == id).map_or_else(|| id.to_string(), |t| t.name.clone());
    let mine: Vec<(String, String)> = session.memberships.iter().map(|m| (m.tenant.clone(), name(&m.tenant))).collect();
    match mine.len() {
        0 => ().into_any(),
        1 => {
            let (_, name) = mine[0].clone();
            view! { <A href=format!("/t/{name}")>{name.clone()}</A> }.into_any()
        }
        _ => {
            let navigate = leptos_router::hooks::use_navigate();
            let location = leptos_router::hooks::use_location();
            let current = move || location.pathname.get().strip_prefix("/t/").map(str::to_string).unwrap_or_default();
            view! {
                <label class="switch">
                    <span class="sr-only">"Tenant"</span>
                    <select data-testid="tenant-switch" on:change=move |ev| {
                        let name = event_target_value(&ev);
                        if !name.is_empty() { navigate(&format!("/t/{name}"), Default::default()); }
                    }>
                        <option value="" selected=move || current().is_empty()>"Tenants…"</option>
                        {mine.into_iter().map(|(id, name)| {
                            let (v, n, value) = (id.clone(), name.clone(), name.clone());
                            view! { <option value=value selected=move || current() == v || current() == n>{name}</option> }
                        }).collect_view()}
                    </select>
                </label>
            }
            .into_any()
        }
    }
}

#[component]
fn SignOut() -> impl IntoView {
    let on_click = move |_| {
        #[cfg(feature = "hydrate")]
        leptos::task::spawn_local(async move {
            let _ = api::browser::fetch("POST", "/auth/logout", None).await;
            if let Some(w) = web_sys::window() {
                let _ = w.location().set_href("/signin");
            }
        });
    };
    view! { <button class="link" on:click=on_click>"Sign out"</button> }
}

/// Switches between the light and the dark theme (kept in local storage; the system's choice until then).
#[component]
fn ThemeToggle() -> impl IntoView {
    let on_click = move |_| {
        #[cfg(feature = "hydrate")]
        {
            let Some(window) = web_sys::window() else { return };
            let Some(root) = window.document().and_then(|d| d.document_element()) else { return };
            let dark_now = match root.get_attribute("data-theme").as_deref() {
                Some("dark") => true,
                Some(_) => false,
                None => window.match_media("(prefers-color-scheme: dark)").ok().flatten().is_some_and(|m| m.matches()),
            };
            let next = if dark_now { "light" } else { "dark" };
            let _ = root.set_attribute("data-theme", next);
            if let Ok(Some(storage)) = window.local_storage() {
                let _ = storage.set_item("tessera-theme", next);
            }
        }
    };
    view! {
        <button class="theme" on:click=on_click aria-label="Switch between light and dark theme" title="Light / dark">
            <span aria-hidden="true">"◐"</span>
        </button>
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_approvals_badge_counts_what_waits() {
        assert_eq!(super::approvals_badge(0, false, 0), None);
        assert_eq!(super::approvals_badge(1, false, 2), Some("3".into()));
        assert_eq!(super::approvals_badge(500, true, 1), Some("501+".into()));
    }
}
