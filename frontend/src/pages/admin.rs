//! `/admin/tenants` and `/admin/tenants/:id` (platform admins): tenants, their approval policy, quotas and
//! members. Quota keys and amounts are checked with the core's `Resource::parse` before anything is sent, so a
//! typo is explained at once, in the words the server would use.

use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_params_map;
use tessera_api::Role;
use tessera_api::people::{MemberView, Membership, NewUser, UserView};
use tessera_api::signin::SignInLink;
use tessera_api::tenants::{NewTenant, PolicyUpdate, QuotaUpdate, QuotaView, TenantView};
use tessera_core::catalog::Catalog;
use tessera_core::quota::Resource as QuotaResource;

use crate::api::{self, ProblemExt};
use crate::widgets::{Messages, TenantsResource, problem_view};
use crate::wire::role_label;

/// A quota edit checked as the server checks it: `(canonical key, limit)`, where a blank amount (`None`) removes
/// the limit and leaves the resource unlimited, or the reason it is refused.
pub fn check_limit(key: &str, amount: &str) -> Result<(String, Option<f64>), String> {
    let resource = QuotaResource::parse(Catalog::builtin(), key).map_err(|e| e.to_string())?;
    if amount.trim().is_empty() {
        return Ok((resource.to_string(), None));
    }
    let limit: f64 = amount.trim().parse().map_err(|_| format!("{key}: `{amount}` is not a number"))?;
    if !limit.is_finite() || !(0.0..=1e12).contains(&limit) {
        return Err(format!("{key}: a limit is a number from 0 to 1e12"));
    }
    Ok((resource.to_string(), Some(limit)))
}

/// Checks a tenant name as the server does.
pub fn tenant_name_error(name: &str) -> Option<&'static str> {
    let ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    (!ok).then_some("A tenant name is 1-63 characters of a-z, 0-9 and -, not starting with -.")
}

/// Suggested quota keys: the aggregates, then per model its whole GPUs and MIG profiles.
fn quota_keys() -> Vec<String> {
    let mut keys = vec!["compute_slices".to_string(), "memory_gib".to_string()];
    for m in &Catalog::builtin().models {
        keys.push(format!("gpu/{}", m.key));
        keys.extend(m.profiles.iter().map(|p| format!("mig/{}/{}", m.key, p.name)));
    }
    keys
}

/// The tenants list, with a form to create one.
#[component]
pub fn TenantsAdminPage() -> impl IntoView {
    let tenants = expect_context::<TenantsResource>();
    let name = RwSignal::new(String::new());
    let auto = RwSignal::new(false);
    let max = RwSignal::new(String::from("0"));
    let message = RwSignal::new(None::<(bool, String)>);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let n = name.get_untracked().trim().to_string();
        if let Some(e) = tenant_name_error(&n) {
            message.set(Some((false, e.into())));
            return;
        }
        let Ok(m) = max.get_untracked().trim().parse::<u32>() else {
            message.set(Some((false, "The auto-approval size is a whole number of compute slices.".into())));
            return;
        };
        leptos::task::spawn_local(async move {
            let body = NewTenant { name: n, auto_approve: auto.get_untracked(), auto_approve_max_compute_slices: m };
            match api::send_json::<TenantView>("POST", "/api/v1/tenants".into(), body).await {
                Ok(t) => {
                    message.set(Some((true, format!("Created {}.", t.name))));
                    name.set(String::new());
                    tenants.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <section class="page">
            <div class="title-row"><h1>"Tenants"</h1>
                <A href="/admin/quotas">"Quota standing: who borrows, who waits, who does not use its quota"</A>
            </div>
            <form class="card toolbar" data-testid="tenant-form" on:submit=create>
                <label class="grow">"Name"<input type="text" name="tenant-name" placeholder="e.g. research" bind:value=name /></label>
                <label class="check"><input type="checkbox" name="auto-approve" bind:checked=auto />" auto-approve"</label>
                <label>"up to (compute slices)"<input type="number" name="auto-max" min="0" step="1" bind:value=max /></label>
                <button class="button primary" type="submit">"Create tenant"</button>
            </form>
            {move || message.get().map(|(ok, m)| view! { <p class="notice" class:error=!ok role="status">{m}</p> })}
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match tenants.await {
                        Err(p) => problem_view(&p),
                        Ok(list) => view! {
                            <div class="table-wrap">
                            <table data-testid="tenant-list">
                                <thead><tr><th scope="col">"Tenant"</th><th scope="col">"Approval"</th></tr></thead>
                                <tbody>
                                    {list.into_iter().map(|t| {
                                        let (name, policy, href) = (t.name.clone(), policy_text(&t), format!("/admin/tenants/{}", t.id));
                                        view! {
                                            <tr data-tenant=t.name>
                                                <td><A href=href>{name}</A></td>
                                                <td>{policy}</td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                            </div>
                        }.into_any(),
                    }
                })}
            </Transition>
            <super::cohorts::CohortsCard />
            <super::clusters::ClustersCard />
        </section>
    }
}

fn policy_text(t: &TenantView) -> String {
    if t.auto_approve {
        format!("automatic up to {} compute slices", t.auto_approve_max_compute_slices)
    } else {
        "every request by an admin".to_string()
    }
}

/// One tenant: policy, quotas, members.
#[component]
pub fn TenantAdminPage() -> impl IntoView {
    let params = use_params_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let tenant = Resource::new(id, |id| api::get_json::<TenantView>(format!("/api/v1/tenants/{id}")));
    view! {
        <section class="page">
            <p><A href="/admin/tenants">"← Tenants"</A></p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match tenant.await {
                        Err(p) => problem_view(&p),
                        Ok(t) => view! {
                            <h1>{t.name.clone()}</h1>
                            <div class="cards two">
                                <PolicyCard t=t.clone() />
                                <MembersCard tenant=t.id.clone() />
                            </div>
                            <QuotaCard tenant=t.id.clone() />
                            <crate::pages::governance::BudgetEditor tenant=t.id.clone() />
                        }.into_any(),
                    }
                })}
            </Transition>
        </section>
    }
}

#[component]
fn PolicyCard(t: TenantView) -> impl IntoView {
    let auto = RwSignal::new(t.auto_approve);
    let max = RwSignal::new(t.auto_approve_max_compute_slices.to_string());
    let message = RwSignal::new(None::<(bool, String)>);
    let id = StoredValue::new(t.id.clone());
    let save = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let Ok(m) = max.get_untracked().trim().parse::<u32>() else {
            message.set(Some((false, "The auto-approval size is a whole number of compute slices.".into())));
            return;
        };
        let body = PolicyUpdate { auto_approve: auto.get_untracked(), auto_approve_max_compute_slices: m };
        leptos::task::spawn_local(async move {
            match api::send_json::<TenantView>("PUT", format!("/api/v1/tenants/{}/policy", id.get_value()), body).await
            {
                // The card keeps its own state: reloading the tenant would render a new card and lose the message.
                Ok(t) => message.set(Some((true, format!("Saved: {}.", policy_text(&t))))),
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <form class="card stack" data-testid="policy-form" on:submit=save>
            <h2>"Approval"</h2>
            <label class="check"><input type="checkbox" name="auto-approve" bind:checked=auto />" Approve requests within quota without an admin"</label>
            <label>"Largest request approved automatically (compute slices)"<input type="number" name="auto-max" min="0" step="1" bind:value=max /></label>
            <button class="button primary" type="submit">"Save"</button>
            {move || message.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="status">{m}</p> })}
        </form>
    }
}

#[component]
fn QuotaCard(tenant: String) -> impl IntoView {
    let id = StoredValue::new(tenant);
    let quotas =
        Resource::new(move || id.get_value(), |t| api::get_json::<QuotaView>(format!("/api/v1/tenants/{t}/quotas")));
    let edits = RwSignal::new(Vec::<(String, String)>::new()); // (key, amount) typed
    let max_edits = RwSignal::new(Vec::<(String, String)>::new());
    let lend_edits = RwSignal::new(Vec::<(String, String)>::new());
    let set_in = move |signal: RwSignal<Vec<(String, String)>>, key: String, amount: String| {
        signal.update(|e| match e.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = amount,
            None => e.push((key, amount)),
        })
    };
    let new_key = RwSignal::new(String::new());
    let new_amount = RwSignal::new(String::new());
    let messages = RwSignal::new(Vec::<(bool, String)>::new());
    let set_edit = move |key: String, amount: String| {
        edits.update(|e| match e.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = amount,
            None => e.push((key, amount)),
        })
    };
    let save = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let mut all = edits.get_untracked();
        let added = new_key.get_untracked().trim().to_string();
        let mut errors = Vec::new();
        if !added.is_empty() {
            if new_amount.get_untracked().trim().is_empty() {
                errors.push((false, format!("{added}: give the new limit an amount")));
            }
            all.push((added, new_amount.get_untracked()));
        }
        let checked: Vec<Result<(String, Option<f64>), String>> = all.iter().map(|(k, a)| check_limit(k, a)).collect();
        let maxima: Vec<Result<(String, Option<f64>), String>> =
            max_edits.get_untracked().iter().map(|(k, a)| check_limit(k, a)).collect();
        let lending: Vec<Result<(String, Option<f64>), String>> =
            lend_edits.get_untracked().iter().map(|(k, a)| check_limit(k, a)).collect();
        errors
            .extend(checked.iter().chain(&maxima).chain(&lending).filter_map(|c| c.clone().err()).map(|e| (false, e)));
        if !errors.is_empty() {
            messages.set(errors);
            return;
        }
        if checked.is_empty() && maxima.is_empty() && lending.is_empty() {
            messages.set(vec![(false, "Nothing changed.".into())]);
            return;
        }
        let body = QuotaUpdate {
            limits: checked.into_iter().flatten().collect(),
            maximums: maxima.into_iter().flatten().collect(),
            lending_limits: lending.into_iter().flatten().collect(),
            reason: String::new(),
        };
        leptos::task::spawn_local(async move {
            match api::send_json::<QuotaView>("PUT", format!("/api/v1/tenants/{}/quotas", id.get_value()), body).await {
                Ok(_) => {
                    messages.set(vec![(true, "Quotas saved.".into())]);
                    edits.set(Vec::new());
                    max_edits.set(Vec::new());
                    lend_edits.set(Vec::new());
                    new_key.set(String::new());
                    new_amount.set(String::new());
                    quotas.refetch();
                }
                Err(p) => messages.set(vec![(false, p.message())]),
            }
        });
    };
    // The new key, checked as it is typed.
    let new_key_error = move || {
        let k = new_key.get();
        if k.trim().is_empty() {
            None
        } else {
            QuotaResource::parse(Catalog::builtin(), &k).err().map(|e| e.to_string())
        }
    };
    view! {
        <form class="card" data-testid="quota-form" on:submit=save>
            <h2>"Quotas"</h2>
            <p class="muted small">"A resource without a limit is unlimited; clear a limit and save to remove it. The limit is what the tenant is guaranteed; in a cohort it may borrow up to its maximum from what the others do not use, and lends at most its lending limit of what it does not use."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    match quotas.await {
                        Err(p) => problem_view(&p),
                        Ok(q) => view! {
                            <table data-testid="quota-lines">
                                <thead><tr><th scope="col">"Resource"</th><th scope="col">"Held"</th><th scope="col">"Limit (guaranteed)"</th><th scope="col">"Maximum"</th><th scope="col">"Lends at most"</th></tr></thead>
                                <tbody>
                                    {q.resources.into_iter().map(|line| {
                                        let key = line.resource.clone();
                                        let held = line.held;
                                        let below = move || edits.get().iter().find(|(k, _)| *k == key).and_then(|(_, a)| a.trim().parse::<f64>().ok()).is_some_and(|v| v < held);
                                        let key2 = line.resource.clone();
                                        let (key3, key4) = (line.resource.clone(), line.resource.clone());
                                        let borrowed = (line.borrowed > 0.0).then(|| format!(" ({} borrowed)", line.borrowed));
                                        view! {
                                            <tr data-resource=line.resource.clone()>
                                                <td><code>{line.resource.clone()}</code></td>
                                                <td>{format!("{held}")}{borrowed}</td>
                                                <td>
                                                    <input type="number" min="0" step="any" aria-label=format!("Limit of {}", line.resource)
                                                        value=line.limit.map(|l| l.to_string()).unwrap_or_default() placeholder="unlimited"
                                                        on:input=move |ev| set_edit(key2.clone(), event_target_value(&ev)) />
                                                    {move || below().then(|| view! { <span class="warn-text small">" below what is held: new requests wait until it drops"</span> })}
                                                </td>
                                                <td>
                                                    <input type="number" min="0" step="any" aria-label=format!("Maximum of {}", line.resource)
                                                        value=line.maximum.map(|l| l.to_string()).unwrap_or_default() placeholder="no borrowing"
                                                        on:input=move |ev| set_in(max_edits, key3.clone(), event_target_value(&ev)) />
                                                </td>
                                                <td>
                                                    <input type="number" min="0" step="any" aria-label=format!("Lending limit of {}", line.resource)
                                                        value=line.lending_limit.map(|l| l.to_string()).unwrap_or_default() placeholder="all it does not use"
                                                        on:input=move |ev| set_in(lend_edits, key4.clone(), event_target_value(&ev)) />
                                                </td>
                                            </tr>
                                        }
                                    }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any(),
                    }
                })}
            </Transition>
            <div class="toolbar">
                <label class="grow">"Add a limit on"
                    <input type="text" name="quota-key" list="quota-keys" placeholder="mig/H100-80GB/3g.40gb, gpu/A30-24GB, compute_slices" bind:value=new_key />
                </label>
                <datalist id="quota-keys">{quota_keys().into_iter().map(|k| view! { <option value=k></option> }).collect_view()}</datalist>
                <label>"Limit"<input type="number" name="quota-amount" min="0" step="any" bind:value=new_amount /></label>
                <button class="button primary" type="submit">"Save quotas"</button>
            </div>
            {move || new_key_error().map(|e| view! { <p class="error small" data-testid="quota-key-error">{e}</p> })}
            <Messages messages=messages testid="quota-messages" />
        </form>
    }
}

/// The roles a member may have, in the order the selects offer them.
const ROLES: [Role; 2] = [Role::Member, Role::TenantAdmin];

#[component]
fn MembersCard(tenant: String) -> impl IntoView {
    let id = StoredValue::new(tenant);
    let members = Resource::new(
        move || id.get_value(),
        |t| api::get_json::<Vec<MemberView>>(format!("/api/v1/tenants/{t}/members")),
    );
    let users = Resource::new(|| (), |_| api::get_json::<Vec<UserView>>("/api/v1/users".into()));
    let add_user = RwSignal::new(String::new());
    let add_role = RwSignal::new(Role::Member);
    let new_user = RwSignal::new(String::new());
    let message = RwSignal::new(None::<(bool, String)>);
    // The one-time sign-in link of a user just created: (name, link, expiry).
    let invite = RwSignal::new(None::<(String, String, i64)>);
    let set_role = move |user: String, role: Role| {
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/tenants/{}/members/{user}", id.get_value());
            match api::send_json::<()>("PUT", path, Membership { role }).await {
                Ok(()) => {
                    message.set(Some((true, format!("Role set to {}.", role_label(role)))));
                    members.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let remove = move |user: String, name: String| {
        leptos::task::spawn_local(async move {
            let path = format!("/api/v1/tenants/{}/members/{user}", id.get_value());
            match api::send_empty::<()>("DELETE", path).await {
                Ok(()) => {
                    message.set(Some((true, format!("Removed {name}."))));
                    members.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let add = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let (user, role, create) = (add_user.get_untracked(), add_role.get_untracked(), new_user.get_untracked());
        leptos::task::spawn_local(async move {
            // A new name creates the user first (they sign in through the identity provider later).
            let user = if !create.trim().is_empty() {
                let body = NewUser { name: create.trim().to_string(), platform_admin: false };
                match api::send_json::<UserView>("POST", "/api/v1/users".into(), body).await {
                    Ok(u) => {
                        users.refetch();
                        new_user.set(String::new());
                        // A link to sign in once and set a password; only platform admins may issue one.
                        let path = format!("/api/v1/users/{}/sign-in-link", u.id);
                        match api::send_empty::<SignInLink>("POST", path).await {
                            Ok(link) => {
                                invite.set(Some((u.name.clone(), super::origin() + &link.path, link.expires_at_ms)))
                            }
                            Err(_) => invite.set(None),
                        }
                        u.id
                    }
                    Err(p) => return message.set(Some((false, p.message()))),
                }
            } else if user.is_empty() {
                return message.set(Some((false, "Pick a user or type a new one's name.".into())));
            } else {
                user
            };
            set_role(user, role);
        });
    };
    view! {
        <div class="card" data-testid="members">
            <h2>"Members"</h2>
            {move || message.get().map(|(ok, m)| view! { <p class:ok-text=ok class:error=!ok role="status">{m}</p> })}
            {move || invite.get().map(|(name, link, expires)| view! {
                <div class="notice" data-testid="invite">
                    <p>{format!("Send {name} this sign-in link. It works once, for the next {}; they then set a password on the Tokens page.", super::within(expires, super::now_ms()))}</p>
                    <input type="text" readonly value=link.clone() aria-label=format!("Sign-in link for {name}") data-testid="invite-link" />
                </div>
            })}
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let all = users.await.unwrap_or_default();
                    match members.await {
                        Err(p) => problem_view(&p),
                        Ok(list) => {
                            let others: Vec<UserView> = all.into_iter().filter(|u| !list.iter().any(|m| m.id == u.id)).collect();
                            view! {
                                <table data-testid="member-list">
                                    <tbody>
                                        {list.into_iter().map(|m| {
                                            let (a, b, name) = (m.id.clone(), m.id.clone(), m.name.clone());
                                            view! {
                                                <tr data-member=m.name.clone()>
                                                    <td>{m.name.clone()}</td>
                                                    <td>
                                                        <select aria-label=format!("Role of {}", m.name) on:change=move |ev| {
                                                            if let Ok(role) = event_target_value(&ev).parse::<Role>() { set_role(a.clone(), role) }
                                                        }>
                                                            {ROLES.map(|r| view! { <option value=r.as_str() selected=m.role == r>{role_label(r)}</option> })}
                                                        </select>
                                                    </td>
                                                    <td><button class="button small danger" on:click=move |_| remove(b.clone(), name.clone())>"Remove"</button></td>
                                                </tr>
                                            }
                                        }).collect_view()}
                                    </tbody>
                                </table>
                                <form class="toolbar" data-testid="add-member" on:submit=add>
                                    <label>"User"
                                        <select name="user" on:change=move |ev| add_user.set(event_target_value(&ev))>
                                            <option value="">"—"</option>
                                            {others.into_iter().map(|u| view! { <option value=u.id.clone()>{u.name.clone()}</option> }).collect_view()}
                                        </select>
                                    </label>
                                    <label>"or new"<input type="text" name="new-user" placeholder="name or e-mail" bind:value=new_user /></label>
                                    <label>"Role"
                                        <select name="role" on:change=move |ev| {
                                            if let Ok(role) = event_target_value(&ev).parse::<Role>() { add_role.set(role) }
                                        }>
                                            {ROLES.map(|r| view! { <option value=r.as_str()>{role_label(r)}</option> })}
                                        </select>
                                    </label>
                                    <button class="button primary" type="submit">"Add"</button>
                                </form>
                            }.into_any()
                        }
                    }
                })}
            </Transition>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_edits_are_checked_with_the_core_parser() {
        assert_eq!(check_limit("compute_slices", "14"), Ok(("compute_slices".into(), Some(14.0))));
        assert_eq!(check_limit("compute_slices", " "), Ok(("compute_slices".into(), None)), "blank removes the limit");
        assert!(check_limit("mig/H100-80GB/5g.40gb", "").is_err(), "removal still needs a valid key");
        let canonical = check_limit("mig/H100-80GB/3g.40gb", "2").expect("valid").0;
        assert_eq!(
            canonical,
            QuotaResource::parse(Catalog::builtin(), "mig/H100-80GB/3g.40gb").expect("ok").to_string()
        );
        assert!(check_limit("mig/H100-80GB/5g.40gb", "1").expect_err("no such profile").contains("5g.40gb"));
        assert!(check_limit("compute_slices", "-1").is_err());
        assert!(check_limit("compute_slices", "lots").expect_err("nan").contains("not a number"));
    }

    #[test]
    fn tenant_names_follow_the_server_rule() {
        assert_eq!(tenant_name_error("research-2"), None);
        assert!(tenant_name_error("Research").is_some());
        assert!(tenant_name_error("-x").is_some());
        assert!(tenant_name_error("").is_some());
    }
}
