//! The cohorts card of `/admin/tenants` (platform admins): each cohort with, per member and resource, what it is
//! guaranteed, may hold at most, holds, borrows and can lend, and what the cohort is short of (borrowed slices
//! being taken back); forms to create a cohort and to put a tenant in one, with its weight.

use leptos::prelude::*;
use tessera_api::cohorts::{CohortLine, CohortMembership, CohortView, NewCohort};
use tessera_api::tenants::TenantView;

use crate::api::{self, ProblemExt};
use crate::widgets::{TenantsResource, problem_view};

/// What a member's line says, in words: `borrows 5 above its guarantee of 7`, `lends up to 4`, `uses its
/// guarantee`.
pub fn line_text(l: &CohortLine) -> String {
    if l.borrowed > 0.0 {
        format!("borrows {} above its guarantee of {} (at most {})", l.borrowed, l.guaranteed, l.maximum)
    } else if l.lendable > 0.0 {
        format!("holds {} of {}; can lend {}", l.held, l.guaranteed, l.lendable)
    } else {
        format!("uses its guarantee ({} of {})", l.held, l.guaranteed)
    }
}

/// The cohorts card.
#[component]
pub fn CohortsCard() -> impl IntoView {
    let tenants = expect_context::<TenantsResource>();
    let cohorts = Resource::new(|| (), |_| api::get_json::<Vec<CohortView>>("/api/v1/cohorts".into()));
    let name = RwSignal::new(String::new());
    let grace_min = RwSignal::new("10".to_string());
    let tenant = RwSignal::new(String::new());
    let cohort = RwSignal::new(String::new());
    let weight = RwSignal::new("1".to_string());
    let message = RwSignal::new(None::<(bool, String)>);
    let create = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let n = name.get_untracked().trim().to_string();
        let Ok(minutes) = grace_min.get_untracked().trim().parse::<f64>() else {
            message.set(Some((false, "The grace period is a number of minutes.".into())));
            return;
        };
        let body = NewCohort { name: n, grace_s: Some((minutes * 60.0).round().clamp(0.0, 604_800.0) as u32) };
        leptos::task::spawn_local(async move {
            match api::send_json::<CohortView>("POST", "/api/v1/cohorts".into(), body).await {
                Ok(c) => {
                    message.set(Some((true, format!("Created cohort {}.", c.name))));
                    name.set(String::new());
                    cohorts.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    let join = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let t = tenant.get_untracked();
        if t.is_empty() {
            message.set(Some((false, "Choose a tenant.".into())));
            return;
        }
        let c = cohort.get_untracked();
        let body = CohortMembership {
            cohort: (!c.is_empty()).then_some(c),
            weight: weight.get_untracked().trim().parse().ok(),
        };
        leptos::task::spawn_local(async move {
            match api::send_json::<TenantView>("PUT", format!("/api/v1/tenants/{t}/cohort"), body).await {
                Ok(t) => {
                    let where_ = if t.cohort.is_some() { "is in the cohort" } else { "is in no cohort" };
                    message.set(Some((true, format!("{} {where_} (weight {}).", t.name, t.weight))));
                    cohorts.refetch();
                    tenants.refetch();
                }
                Err(p) => message.set(Some((false, p.message()))),
            }
        });
    };
    view! {
        <section class="card" data-testid="cohorts">
            <h2>"Cohorts"</h2>
            <p class="muted small">"Tenants of a cohort lend each other what they are guaranteed but do not use. A tenant may borrow up to its maximum; when a lender asks for its guarantee back, or another team wants its fair share by weight, borrowed slices are taken back after the cohort's grace period: from the team borrowing most for its weight first, and within it lowest priority and newest first."</p>
            <Transition fallback=|| view! { <p>"Loading…"</p> }>
                {move || Suspend::new(async move {
                    let list = match (cohorts.await, tenants.await) {
                        (Err(p), _) | (_, Err(p)) => return problem_view(&p),
                        (Ok(c), Ok(t)) => (c, t),
                    };
                    let (list, all_tenants) = list;
                    view! {
                        {if list.is_empty() { Some(view! { <p class="muted">"No cohorts yet: every tenant is limited to its own quota."</p> }) } else { None }}
                        {list.iter().map(|c| cohort_view(c.clone())).collect_view()}
                        <form class="toolbar" data-testid="cohort-create" on:submit=create>
                            <label class="grow">"New cohort"<input type="text" name="cohort-name" placeholder="e.g. research" bind:value=name /></label>
                            <label>"Grace (minutes)"<input type="number" name="cohort-grace" min="0" step="any" bind:value=grace_min /></label>
                            <button class="button" type="submit">"Create cohort"</button>
                        </form>
                        <form class="toolbar" data-testid="cohort-join" on:submit=join>
                            <label>"Tenant"
                                <select name="join-tenant" bind:value=tenant>
                                    <option value="">"—"</option>
                                    {all_tenants.iter().map(|t| view! { <option value=t.id.clone()>{t.name.clone()}</option> }).collect_view()}
                                </select>
                            </label>
                            <label>"Cohort"
                                <select name="join-cohort" bind:value=cohort>
                                    <option value="">"none"</option>
                                    {list.iter().map(|c| view! { <option value=c.id.clone()>{c.name.clone()}</option> }).collect_view()}
                                </select>
                            </label>
                            <label>"Weight"<input type="number" name="join-weight" min="1" max="1000" step="1" bind:value=weight /></label>
                            <button class="button" type="submit">"Save membership"</button>
                        </form>
                    }.into_any()
                })}
            </Transition>
            {move || message.get().map(|(ok, m)| view! { <p class="notice" class:error=!ok role="status">{m}</p> })}
        </section>
    }
}

fn cohort_view(c: CohortView) -> impl IntoView {
    let grace =
        if c.grace_s.is_multiple_of(60) { format!("{} min", c.grace_s / 60) } else { format!("{} s", c.grace_s) };
    let short = (!c.deficits.is_empty()).then(|| {
        let what = c.deficits.iter().map(|(r, v)| format!("{v} {r}")).collect::<Vec<_>>().join(", ");
        view! { <p class="notice reclaim" data-testid="cohort-short">{format!("Short of {what}: borrowed slices are being taken back.")}</p> }
    });
    view! {
        <div class="cohort" data-cohort=c.name.clone()>
            <h3>{c.name.clone()}<span class="muted small">{format!(" · grace {grace} · {} members", c.members.len())}</span></h3>
            {short}
            <div class="table-wrap">
            <table>
                <thead><tr><th scope="col">"Tenant"</th><th scope="col">"Weight"</th><th scope="col">"Resource"</th><th scope="col">"Now"</th></tr></thead>
                <tbody>
                    {c.members.into_iter().flat_map(|m| {
                        let lines = if m.resources.is_empty() { vec![None] } else { m.resources.into_iter().map(Some).collect() };
                        let (name, weight) = (m.name.clone(), m.weight);
                        lines.into_iter().map(move |l| {
                            let (resource, text, borrowing) = match &l {
                                Some(l) => (l.resource.clone(), line_text(l), l.borrowed > 0.0),
                                None => (String::new(), "no limits: takes no part".to_string(), false),
                            };
                            view! {
                                <tr data-member=name.clone() class:borrowing=borrowing>
                                    <td>{name.clone()}</td><td>{weight}</td><td><code>{resource}</code></td><td>{text}</td>
                                </tr>
                            }
                        }).collect::<Vec<_>>()
                    }).collect_view()}
                </tbody>
            </table>
            </div>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_borrowing_lending_or_using() {
        let l = |g: f64, max: f64, held: f64, lendable: f64| CohortLine {
            resource: "compute_slices".into(),
            guaranteed: g,
            maximum: max,
            held,
            borrowed: (held - g).max(0.0),
            lendable,
        };
        assert_eq!(line_text(&l(7.0, 14.0, 12.0, 0.0)), "borrows 5 above its guarantee of 7 (at most 14)");
        assert_eq!(line_text(&l(7.0, 7.0, 3.0, 4.0)), "holds 3 of 7; can lend 4");
        assert_eq!(line_text(&l(7.0, 7.0, 7.0, 0.0)), "uses its guarantee (7 of 7)");
    }
}
