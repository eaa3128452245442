//! Store conformance: every test runs on SQLite and on PostgreSQL. PostgreSQL runs when
//! `TESSERA_TEST_POSTGRES_URL` is set (CI always sets it) and then must be reachable: each test gets a fresh database.

use std::sync::Arc;

use crate::harness::{on_both_backends, with_database};
use tessera_core::Catalog;
use tessera_core::layout::PlacedInstance;
use tessera_core::quota::{ApprovalPolicy, MILLI, Resource, charge};
use tessera_core::request::{RequestState, SliceSpec};
use tessera_core::rollup::Tier;
use tessera_server::store::auth::{LoginAttempt, SessionRecord, SsoIdentity};
use tessera_server::store::{LayoutChange, NewGpu, NewRequest, Reservation, Role, Store, StoreError, Transition};

on_both_backends!(
    |db| &db.store;
    tenants_are_unique_by_name,
    quotas_round_trip_and_replace,
    requests_within_quota_are_held_until_they_end,
    requests_over_quota_are_refused_with_every_limit,
    sixty_four_clients_racing_for_the_last_five_units_get_exactly_five,
    transitions_follow_the_life_cycle_and_are_audited,
    two_admins_approving_at_once_one_wins,
    tokens_resolve_to_their_user_and_memberships,
    a_retried_request_with_the_same_idempotency_key_creates_one_request,
    nodes_are_registered_whole_and_gpus_cordoned,
    heartbeats_move_each_nodes_last_seen_forward_only,
    the_fleets_bulk_writes_wait_for_an_approvals_writes_on_sqlite_only,
    approvals_reserve_exact_instances_and_propose_layouts,
    decisions_on_layouts_protect_instances_in_use_and_fail_waiting_requests,
    requests_with_a_duration_expire_and_free_their_instances,
    stale_plans_can_neither_destroy_nor_reserve_what_changed,
    a_batch_decides_each_request_in_order_as_one_transaction_each_would,
    racing_batches_and_single_creates_never_overshoot,
    single_sign_on_creates_users_and_re_maps_their_memberships_at_each_sign_in,
    sessions_and_login_attempts_live_in_the_database,
    node_credentials_identify_one_node_until_revoked,
    telemetry_minutes_are_merged_queried_and_pruned,
    leases_run_on_the_databases_clock,
    people_tokens_and_policies_are_listed_and_changed_with_an_audit_trail,
    the_audit_log_filters_by_exact_prefixes_and_pages_by_id,
    utilisation_sums_are_sample_weighted_per_device_within_the_range,
    cohorts_rebalance_tells_releases_and_withdraws_under_their_lock,
    spans_and_budgets_are_read_back_as_written,
);

fn h100_1g() -> SliceSpec {
    SliceSpec::Mig { profile: "1g.10gb".into(), model: Some("H100-80GB".into()) }
}

fn res(text: &str) -> Resource {
    Resource::parse(Catalog::builtin(), text).expect("resource")
}

const POLICY: ApprovalPolicy = ApprovalPolicy { auto_approve: false, auto_approve_max_compute_slices: 0 };

async fn request(
    store: &Store,
    tenant: &str,
    spec: &SliceSpec,
    count: u32,
) -> Result<tessera_server::store::SliceRequest, StoreError> {
    let charge = charge(Catalog::builtin(), spec, count).expect("charge");
    store
        .create_request(NewRequest {
            tenant_id: tenant,
            spec,
            count,
            reason: "training run",
            charge: &charge,
            state: RequestState::Pending,
            actor: "user:alice",
            idempotency: None,
            duration_s: None,
            priority: Default::default(),
            replaces: None,
        })
        .await
        .map(|(r, _)| r)
}

async fn tenants_are_unique_by_name(store: &Store) {
    let t = store.create_tenant("ml-team", POLICY, "admin").await.expect("create");
    assert_eq!(store.tenant(&t.id).await.expect("get"), t);
    match store.create_tenant("ml-team", POLICY, "admin").await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "tenants.name"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(store.tenant("nope").await, Err(StoreError::NotFound { .. })));
    assert_eq!(store.audit(&format!("tenant/{}", t.id)).await.expect("audit").len(), 1);
}

async fn quotas_round_trip_and_replace(store: &Store) {
    let t = store.create_tenant("vision", POLICY, "admin").await.expect("create");
    store.set_quota(&t.id, &res("mig/H100-80GB/1g.10gb"), 4 * MILLI, "admin").await.expect("set");
    store.set_quota(&t.id, &Resource::ComputeSlices, 10 * MILLI, "admin").await.expect("set");
    store.set_quota(&t.id, &res("mig/H100-80GB/1g.10gb"), 6 * MILLI, "admin").await.expect("replace");
    let q = store.quotas(&t.id).await.expect("quotas");
    assert_eq!(q.len(), 2);
    assert_eq!(q[&res("mig/H100-80GB/1g.10gb")], 6 * MILLI);
    assert!(matches!(
        store.set_quota("nope", &Resource::MemoryGib, 1, "admin").await,
        Err(StoreError::NotFound { .. })
    ));
}

async fn requests_within_quota_are_held_until_they_end(store: &Store) {
    let t = store.create_tenant("nlp", POLICY, "admin").await.expect("create");
    store.set_quota(&t.id, &res("mig/H100-80GB/1g.10gb"), 3 * MILLI, "admin").await.expect("set");
    let r = request(store, &t.id, &h100_1g(), 2).await.expect("fits");
    assert_eq!(store.request(&r.id).await.expect("get"), r);
    assert_eq!(store.held(&t.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], 2 * MILLI);
    store
        .transition(Transition {
            id: &r.id,
            expected_version: Some(1),
            to: RequestState::Cancelled,
            reason: None,
            actor: "user:alice",
        })
        .await
        .expect("cancel");
    assert_eq!(
        store.held(&t.id).await.expect("held").get(&res("mig/H100-80GB/1g.10gb")),
        None,
        "cancelled holds nothing"
    );
    request(store, &t.id, &h100_1g(), 3).await.expect("the freed quota is usable");
    let missing = request(store, "no-such-tenant", &h100_1g(), 1).await;
    assert!(matches!(missing, Err(StoreError::NotFound { .. })), "{missing:?}");
}

async fn requests_over_quota_are_refused_with_every_limit(store: &Store) {
    let t = store.create_tenant("speech", POLICY, "admin").await.expect("create");
    store.set_quota(&t.id, &res("mig/H100-80GB/1g.10gb"), 2 * MILLI, "admin").await.expect("set");
    store.set_quota(&t.id, &Resource::ComputeSlices, 2 * MILLI, "admin").await.expect("set");
    match request(store, &t.id, &h100_1g(), 3).await {
        Err(StoreError::Quota(errors)) => {
            let resources: Vec<String> = errors
                .iter()
                .map(|e| match e {
                    tessera_core::quota::QuotaError::Exceeded { resource, .. } => resource.to_string(),
                    other => panic!("unexpected {other}"),
                })
                .collect();
            assert_eq!(resources, vec!["mig/H100-80GB/1g.10gb", "compute_slices"]);
        }
        other => panic!("expected quota errors, got {other:?}"),
    }
    assert!(store.held(&t.id).await.expect("held").is_empty(), "a refused request leaves nothing behind");
}

async fn sixty_four_clients_racing_for_the_last_five_units_get_exactly_five(store: &Store) {
    let t = store.create_tenant("race", POLICY, "admin").await.expect("create");
    store.set_quota(&t.id, &res("mig/H100-80GB/1g.10gb"), 8 * MILLI, "admin").await.expect("set");
    request(store, &t.id, &h100_1g(), 3).await.expect("first three");
    let store = Arc::new(store.clone());
    let tenant = Arc::new(t.id.clone());
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (store, tenant) = (store.clone(), tenant.clone());
            tokio::spawn(async move { request(&store, &tenant, &h100_1g(), 1).await })
        })
        .collect();
    let mut approved = 0;
    let mut refused = 0;
    for c in clients {
        match c.await.expect("task") {
            Ok(_) => approved += 1,
            Err(StoreError::Quota(_)) => refused += 1,
            Err(other) => panic!("unexpected error under contention: {other}"),
        }
    }
    assert_eq!((approved, refused), (5, 59));
    assert_eq!(store.held(&t.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], 8 * MILLI);
}

async fn transitions_follow_the_life_cycle_and_are_audited(store: &Store) {
    let t = store.create_tenant("infra", POLICY, "admin").await.expect("create");
    let r = request(store, &t.id, &h100_1g(), 1).await.expect("create");
    let step =
        |to, version| Transition { id: &r.id, expected_version: Some(version), to, reason: None, actor: "admin" };
    let approved = store.transition(step(RequestState::Approved, 1)).await.expect("approve");
    assert_eq!((approved.state, approved.version), (RequestState::Approved, 2));
    assert!(
        matches!(store.transition(step(RequestState::Provisioning, 1)).await, Err(StoreError::Conflict { .. })),
        "stale version"
    );
    match store.transition(step(RequestState::Active, 2)).await {
        Err(StoreError::Transition(e)) => assert_eq!((e.from, e.to), (RequestState::Approved, RequestState::Active)),
        other => panic!("approved cannot jump to active: {other:?}"),
    }
    store.transition(step(RequestState::Provisioning, 2)).await.expect("provision");
    store.transition(step(RequestState::Active, 3)).await.expect("activate");
    let released = store.transition(step(RequestState::Released, 4)).await.expect("release");
    assert_eq!(store.request(&r.id).await.expect("get"), released);
    let actions: Vec<String> =
        store.audit(&format!("request/{}", r.id)).await.expect("audit").into_iter().map(|e| e.action).collect();
    assert_eq!(
        actions,
        ["request.create", "request.approved", "request.provisioning", "request.active", "request.released"]
    );
    let last = store.audit(&format!("request/{}", r.id)).await.expect("audit").pop().expect("entry");
    assert!(
        last.before.is_some_and(|b| b.contains("\"active\"")) && last.after.is_some_and(|a| a.contains("\"released\""))
    );
}

async fn two_admins_approving_at_once_one_wins(store: &Store) {
    let t = store.create_tenant("dup", POLICY, "admin").await.expect("create");
    let r = request(store, &t.id, &h100_1g(), 1).await.expect("create");
    let store = Arc::new(store.clone());
    let admins: Vec<_> = ["admin:ann", "admin:bob"]
        .into_iter()
        .map(|actor| {
            let (store, id) = (store.clone(), r.id.clone());
            tokio::spawn(async move {
                store
                    .transition(Transition {
                        id: &id,
                        expected_version: Some(1),
                        to: RequestState::Approved,
                        reason: None,
                        actor,
                    })
                    .await
            })
        })
        .collect();
    let mut wins = 0;
    let mut conflicts = 0;
    for a in admins {
        match a.await.expect("task") {
            Ok(_) => wins += 1,
            Err(StoreError::Conflict { .. }) => conflicts += 1,
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert_eq!((wins, conflicts), (1, 1));
    assert_eq!(store.request(&r.id).await.expect("get").version, 2);
}

#[test]
fn database_names_are_replaced_in_urls() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
        "postgres://postgres@127.0.0.1:5432/t1"
    );
    assert_eq!(with_database("postgres://u:p@h/db?sslmode=disable", "t2"), "postgres://u:p@h/t2?sslmode=disable");
    assert_eq!(with_database("postgres://h:5432", "t3"), "postgres://h:5432/t3");
}

async fn tokens_resolve_to_their_user_and_memberships(store: &Store) {
    let t = store.create_tenant("tok", POLICY, "admin").await.expect("tenant");
    let u = store.create_user("alice", false, "admin").await.expect("user");
    assert!(matches!(store.create_user("alice", true, "admin").await, Err(StoreError::Conflict { .. })));
    store.set_membership(&u.id, &t.id, Role::Member, "admin").await.expect("member");
    store.set_membership(&u.id, &t.id, Role::TenantAdmin, "admin").await.expect("promote");
    store.create_token(&u.id, "laptop", "ab12", "admin").await.expect("token");
    let p = store.principal_by_token("ab12").await.expect("lookup").expect("known");
    assert_eq!(p.user, u);
    assert_eq!(p.memberships, vec![(t.id.clone(), Role::TenantAdmin)]);
    assert!(p.can_see(&t.id) && !p.can_see("other"));
    assert_eq!(store.principal_by_token("ffff").await.expect("lookup"), None);
    assert_eq!(store.user_by_name("alice").await.expect("by name"), u);
    assert!(matches!(store.create_token(&u.id, "dup", "ab12", "admin").await, Err(StoreError::Conflict { .. })));
}

async fn a_retried_request_with_the_same_idempotency_key_creates_one_request(store: &Store) {
    let t = store.create_tenant("idem", POLICY, "admin").await.expect("tenant");
    let u = store.create_user("bob", false, "admin").await.expect("user");
    let spec = h100_1g();
    let charge = charge(Catalog::builtin(), &spec, 1).expect("charge");
    let store = Arc::new(store.clone());
    let tries: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            let (tenant, spec, charge, user) = (t.id.clone(), spec.clone(), charge.clone(), u.id.clone());
            tokio::spawn(async move {
                let new = NewRequest {
                    tenant_id: &tenant,
                    spec: &spec,
                    count: 1,
                    reason: "retry me",
                    charge: &charge,
                    state: RequestState::Pending,
                    actor: "user:bob",
                    idempotency: Some((&user, "key-1")),
                    duration_s: None,
                    priority: Default::default(),
                    replaces: None,
                };
                store.create_request(new).await.expect("create")
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for t in tries {
        let (r, fresh) = t.await.expect("task");
        ids.insert(r.id);
        created += usize::from(fresh);
    }
    assert_eq!((ids.len(), created), (1, 1), "eight retries, one request");
    assert_eq!(store.held(&t.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], MILLI);
}

async fn nodes_are_registered_whole_and_gpus_cordoned(store: &Store) {
    let gpu = |index: u32, uuid: &str| NewGpu {
        index,
        uuid: uuid.to_string(),
        model: "H100-80GB".to_string(),
        mig_enabled: true,
        layout: vec![tessera_core::layout::PlacedInstance { profile: "3g.40gb".into(), start: 4 }],
    };
    let node = store.register_node("gpu-a", &[gpu(0, "GPU-a0"), gpu(1, "GPU-a1")], "admin").await.expect("register");
    // A second node reusing a GPU UUID is refused as a whole: no node, no GPU.
    match store.register_node("gpu-b", &[gpu(0, "GPU-b0"), gpu(1, "GPU-a1")], "admin").await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "gpus.uuid"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(store.register_node("gpu-a", &[], "admin").await, Err(StoreError::Conflict { .. })));
    let nodes = store.nodes().await.expect("nodes");
    assert_eq!(nodes, vec![node.clone()]);
    let cordoned = store.set_cordoned(&node.gpus[1].id, true, "admin", Some("fan noise")).await.expect("cordon");
    assert!(cordoned.cordoned && cordoned.layout == node.gpus[1].layout);
    assert!(store.nodes().await.expect("nodes")[0].gpus[1].cordoned);
    assert!(matches!(store.set_cordoned("nope", true, "admin", None).await, Err(StoreError::NotFound { .. })));
    assert_eq!(store.audit(&format!("gpu/{}", node.gpus[1].id)).await.expect("audit")[0].action, "gpu.cordoned.on");
}

async fn heartbeats_move_each_nodes_last_seen_forward_only(store: &Store) {
    let a = store.register_node("beat-a", &[], "admin").await.expect("register a");
    let b = store.register_node("beat-b", &[], "admin").await.expect("register b");
    let c = store.register_node("beat-c", &[], "admin").await.expect("register c");
    let seen = |rows: Vec<(String, String, Option<bool>, Option<i64>)>| -> Vec<(String, Option<i64>)> {
        rows.into_iter().map(|(_, name, _, at)| (name, at)).collect()
    };
    store
        .touch_nodes(&[(a.id.clone(), 5_000), (b.id.clone(), 7_000), ("no-such-node".into(), 9_000)])
        .await
        .expect("touch");
    let first = seen(store.readiness_told().await.expect("read"));
    assert!(
        first.contains(&("beat-a".into(), Some(5_000))) && first.contains(&("beat-b".into(), Some(7_000))),
        "{first:?}"
    );
    assert!(
        first.iter().any(|(n, at)| n == "beat-c" && *at != Some(9_000)),
        "an unknown id touches nothing: {first:?}"
    );
    // An older heartbeat (a replica's late write) leaves a newer one; a newer one moves it on.
    store
        .touch_nodes(&[(a.id.clone(), 6_000), (b.id.clone(), 6_000), (c.id.clone(), 1_000)])
        .await
        .expect("touch again");
    let second = seen(store.readiness_told().await.expect("read"));
    assert!(second.contains(&("beat-a".into(), Some(6_000))), "{second:?}");
    assert!(second.contains(&("beat-b".into(), Some(7_000))), "{second:?}");
    store.touch_nodes(&[]).await.expect("nothing to write");
}

async fn the_fleets_bulk_writes_wait_for_an_approvals_writes_on_sqlite_only(store: &Store) {
    use std::time::{Duration, Instant};
    let node = store.register_node("turns", &[], "admin").await.expect("register");
    let before = store.turn_counts();
    let turn = store.interactive();
    let beat = {
        let (store, id) = (store.clone(), node.id.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            store.touch_nodes(&[(id, 5_000)]).await.expect("touch");
            start.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    if store.backend() == "sqlite" {
        // SQLite's one writer: the heartbeat waits while the approval's writes hold their turn, and goes on when it
        // is given back (well before its one-second limit).
        assert!(!beat.is_finished(), "the heartbeat went ahead of the approval's writes");
        drop(turn);
        let waited =
            tokio::time::timeout(Duration::from_millis(900), beat).await.expect("told at once").expect("joined");
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
        let after = store.turn_counts();
        assert_eq!((after.waited - before.waited, after.gave_up - before.gave_up), (1, 0));
        // Held past the limit, a bulk write goes ahead anyway: approvals never stop the fleet's writes.
        let _held = store.interactive();
        let start = Instant::now();
        store.touch_nodes(&[(node.id.clone(), 6_000)]).await.expect("touch past the limit");
        assert!(start.elapsed() >= tessera_server::store::turns::BULK_WAIT, "{:?}", start.elapsed());
        assert_eq!(store.turn_counts().gave_up - before.gave_up, 1);
    } else {
        // PostgreSQL's writers do not queue behind each other: nothing waits.
        assert!(beat.is_finished(), "a heartbeat waited on PostgreSQL");
        drop(turn);
        assert_eq!(store.turn_counts(), before);
    }
    let seen = store.readiness_told().await.expect("read");
    assert!(seen.iter().any(|(_, name, _, at)| name == "turns" && at.is_some()), "{seen:?}");
}

fn inst(profile: &str, start: u8) -> PlacedInstance {
    PlacedInstance { profile: profile.into(), start }
}

async fn one_h100(store: &Store, name: &str) -> tessera_server::store::Gpu {
    let gpu = NewGpu {
        index: 0,
        uuid: format!("GPU-{name}"),
        model: "H100-80GB".into(),
        mig_enabled: true,
        layout: vec![inst("1g.10gb", 6)],
    };
    store.register_node(name, &[gpu], "admin").await.expect("node").gpus.remove(0)
}

fn approve<'a>(id: &'a str, version: i64) -> Transition<'a> {
    Transition { id, expected_version: Some(version), to: RequestState::Approved, reason: None, actor: "admin" }
}

async fn approvals_reserve_exact_instances_and_propose_layouts(store: &Store) {
    let gpu = one_h100(store, "node-x").await;
    let t = store.create_tenant("alloc", POLICY, "admin").await.expect("tenant");
    let r1 = request(store, &t.id, &h100_1g(), 2).await.expect("r1");
    let change = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: gpu.layout_version,
        layout: vec![inst("1g.10gb", 5), inst("1g.10gb", 6)],
        created: vec![inst("1g.10gb", 5)],
        destroyed: vec![],
        auto_apply: false,
    };
    let reservations = [
        Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 6, change: None },
        Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 5, change: Some(0) },
    ];
    let (approved, proposals) = store
        .approve_request(approve(&r1.id, 1), std::slice::from_ref(&change), &reservations, unguarded())
        .await
        .expect("approve");
    assert_eq!((approved.state, approved.version), (RequestState::Approved, 2));
    assert_eq!(proposals.len(), 1);
    assert_eq!((proposals[0].state.as_str(), proposals[0].created.clone()), ("proposed", vec![inst("1g.10gb", 5)]));
    let live = store.live_allocations().await.expect("live");
    assert_eq!(live.len(), 2);
    assert!(live.iter().any(|a| a.start == 5 && a.proposal_id.as_deref() == Some(proposals[0].id.as_str())));

    // Another request planned on the same instance is refused whole: still pending, nothing reserved.
    let r2 = request(store, &t.id, &h100_1g(), 1).await.expect("r2");
    let same = [Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 6, change: None }];
    match store.approve_request(approve(&r2.id, 1), &[], &same, unguarded()).await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "allocations_live_instance"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(store.request(&r2.id).await.expect("r2").state, RequestState::Pending);
    // A second open proposal for the GPU is refused too.
    let free = [Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 4, change: Some(0) }];
    match store.approve_request(approve(&r2.id, 1), std::slice::from_ref(&change), &free, unguarded()).await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "layout_proposals_open"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(store.live_allocations().await.expect("live").len(), 2);

    // The sweep reads every node's spec inputs at once: what each node's own read gives (another node holds
    // nothing).
    let other = one_h100(store, "node-y").await;
    let every = store.all_spec_inputs().await.expect("every node");
    assert_eq!(every.len(), 2);
    // The nodes an approval on some GPUs refreshes: each holder once, nothing for an unknown GPU.
    let ids = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let holders = store.nodes_of_gpus(&ids(&[&gpu.id, &other.id, &gpu.id, "no-such-gpu"])).await.expect("holders");
    let mut both = vec![gpu.node_id.clone(), other.node_id.clone()];
    both.sort();
    assert_eq!(holders, both);
    assert_eq!(store.nodes_of_gpus(&ids(&[&other.id])).await.expect("holder"), std::slice::from_ref(&other.node_id));
    assert!(store.nodes_of_gpus(&[]).await.expect("none").is_empty());
    for (node_id, inputs) in &every {
        let mut one = store.spec_inputs(node_id).await.expect("one node");
        let mut all = inputs.clone();
        for x in [&mut one, &mut all] {
            x.live.sort_by(|a, b| a.id.cmp(&b.id));
        }
        assert_eq!(all, one, "{node_id}");
    }
    let held = |node: &str| every.iter().find(|(id, _)| id == node).map(|(_, i)| (i.gpus.len(), i.live.len()));
    assert_eq!((held(&gpu.node_id), held(&other.node_id)), (Some((1, 2)), Some((1, 0))));

    let decided = store.decide_proposal(&proposals[0].id, true, "", "admin:ann").await.expect("approve layout");
    assert_eq!((decided.state.as_str(), decided.decided_by.as_deref()), ("approved", Some("admin:ann")));
    let gpu_now = store.nodes().await.expect("nodes").remove(0).gpus.remove(0);
    assert_eq!((gpu_now.layout, gpu_now.layout_version), (change.layout.clone(), 2));
    assert!(matches!(
        store.decide_proposal(&proposals[0].id, false, "late", "admin").await,
        Err(StoreError::Conflict { .. })
    ));
    assert_eq!(store.proposals(Some("proposed")).await.expect("open"), vec![]);

    // When the request ends, its instances are free again.
    store
        .transition(Transition {
            id: &r1.id,
            expected_version: Some(2),
            to: RequestState::Cancelled,
            reason: None,
            actor: "user:alice",
        })
        .await
        .expect("cancel");
    assert_eq!(store.live_allocations().await.expect("live"), vec![]);
}

async fn decisions_on_layouts_protect_instances_in_use_and_fail_waiting_requests(store: &Store) {
    let gpu = one_h100(store, "node-y").await;
    let t = store.create_tenant("decide", POLICY, "admin").await.expect("tenant");
    // r1 holds the existing 1g at unit 6.
    let r1 = request(store, &t.id, &h100_1g(), 1).await.expect("r1");
    let hold = [Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 6, change: None }];
    store.approve_request(approve(&r1.id, 1), &[], &hold, unguarded()).await.expect("r1 approved");
    // r2 waits for a proposal that (wrongly) destroys it: approving that layout must be refused.
    let r2 = request(store, &t.id, &SliceSpec::Mig { profile: "7g.80gb".into(), model: Some("H100-80GB".into()) }, 1)
        .await
        .expect("r2");
    let bad = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: 1,
        layout: vec![inst("7g.80gb", 0)],
        created: vec![inst("7g.80gb", 0)],
        destroyed: vec![inst("1g.10gb", 6)],
        auto_apply: false,
    };
    let waits = [Reservation { gpu_id: gpu.id.clone(), profile: "7g.80gb".into(), start: 0, change: Some(0) }];
    let (_, proposals) =
        store.approve_request(approve(&r2.id, 1), &[bad], &waits, unguarded()).await.expect("r2 approved");
    match store.decide_proposal(&proposals[0].id, true, "", "admin").await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "instance_in_use"),
        other => panic!("expected instance_in_use, got {other:?}"),
    }
    // Rejecting it releases r2's reservation and fails r2 with the reason; r1 keeps its instance.
    let rejected =
        store.decide_proposal(&proposals[0].id, false, "would destroy a busy instance", "admin").await.expect("reject");
    assert_eq!(rejected.state, "rejected");
    let r2_now = store.request(&r2.id).await.expect("r2");
    assert_eq!(r2_now.state, RequestState::Failed);
    assert!(r2_now.reason.contains("would destroy a busy instance"), "{}", r2_now.reason);
    let live = store.live_allocations().await.expect("live");
    assert_eq!(live.iter().map(|a| (a.request_id.as_str(), a.start)).collect::<Vec<_>>(), vec![(r1.id.as_str(), 6)]);
    assert_eq!(
        store.held(&t.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")],
        MILLI,
        "r2 no longer holds quota"
    );
}

async fn requests_with_a_duration_expire_and_free_their_instances(store: &Store) {
    let gpu = one_h100(store, "node-z").await;
    let t = store.create_tenant("expiry", POLICY, "admin").await.expect("tenant");
    let spec = h100_1g();
    let charge = charge(Catalog::builtin(), &spec, 1).expect("charge");
    let new = NewRequest {
        tenant_id: &t.id,
        spec: &spec,
        count: 1,
        reason: "nightly eval",
        charge: &charge,
        state: RequestState::Pending,
        actor: "user:alice",
        idempotency: None,
        duration_s: Some(3600),
        priority: Default::default(),
        replaces: None,
    };
    let (r, _) = store.create_request(new).await.expect("create");
    assert_eq!((r.duration_s, r.expires_at_ms), (Some(3600), None));
    let hold = [Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 6, change: None }];
    store.approve_request(approve(&r.id, 1), &[], &hold, unguarded()).await.expect("approve");
    let step = |to, v| Transition { id: &r.id, expected_version: Some(v), to, reason: None, actor: "agent" };
    store.transition(step(RequestState::Provisioning, 2)).await.expect("provision");
    let active = store.transition(step(RequestState::Active, 3)).await.expect("activate");
    assert_eq!(active.expires_at_ms, Some(active.updated_at_ms + 3_600_000));
    assert_eq!(store.expire_due(active.updated_at_ms + 3_599_000).await.expect("sweep"), 0, "not yet");
    assert_eq!(store.expire_due(active.updated_at_ms + 3_600_000).await.expect("sweep"), 1);
    let expired = store.request(&r.id).await.expect("get");
    assert_eq!(expired.state, RequestState::Expired);
    assert_eq!(store.live_allocations().await.expect("live"), vec![], "its instance is free again");
    assert_eq!(
        store.audit(&format!("request/{}", r.id)).await.expect("audit").last().map(|e| e.actor.clone()),
        Some("system:expiry".into())
    );
}

async fn stale_plans_can_neither_destroy_nor_reserve_what_changed(store: &Store) {
    let gpu = store
        .register_node(
            "node-s",
            &[NewGpu {
                index: 0,
                uuid: "GPU-s".into(),
                model: "H100-80GB".into(),
                mig_enabled: true,
                layout: vec![inst("1g.10gb", 0), inst("1g.10gb", 1), inst("1g.10gb", 6)],
            }],
            "admin",
        )
        .await
        .expect("node")
        .gpus
        .remove(0);
    store.set_auto_layout(&gpu.id, true, "admin").await.expect("auto");
    let t = store.create_tenant("stale", POLICY, "admin").await.expect("tenant");
    let keep = |start| Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start, change: None };
    // A holds 1g@1. B was planned before that: it would destroy both 1g to make a 2g, applied at once.
    let a = request(store, &t.id, &h100_1g(), 1).await.expect("a");
    store.approve_request(approve(&a.id, 1), &[], &[keep(1)], unguarded()).await.expect("a approved");
    let b = request(store, &t.id, &SliceSpec::Mig { profile: "2g.20gb".into(), model: Some("H100-80GB".into()) }, 1)
        .await
        .expect("b");
    let destroy = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: 1,
        layout: vec![inst("2g.20gb", 0), inst("1g.10gb", 6)],
        created: vec![inst("2g.20gb", 0)],
        destroyed: vec![inst("1g.10gb", 0), inst("1g.10gb", 1)],
        auto_apply: true,
    };
    let b_slot = [Reservation { gpu_id: gpu.id.clone(), profile: "2g.20gb".into(), start: 0, change: Some(0) }];
    match store.approve_request(approve(&b.id, 1), std::slice::from_ref(&destroy), &b_slot, unguarded()).await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "instance_in_use"),
        other => panic!("an auto-applied change destroyed a reserved instance: {other:?}"),
    }
    let now =
        store.nodes().await.expect("nodes").into_iter().find(|n| n.name == "node-s").expect("node").gpus.remove(0);
    assert_eq!(now.layout.len(), 3, "nothing applied");

    // An admin's edit removes 1g@6; a plan made before it cannot reserve 1g@6 any more.
    let edit = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: now.layout_version,
        layout: vec![inst("1g.10gb", 0), inst("1g.10gb", 1)],
        created: vec![],
        destroyed: vec![inst("1g.10gb", 6)],
        auto_apply: false,
    };
    let proposal = store.propose_layout(&edit, "admin").await.expect("propose");
    store.decide_proposal(&proposal.id, true, "", "admin").await.expect("apply");
    let c = request(store, &t.id, &h100_1g(), 1).await.expect("c");
    match store.approve_request(approve(&c.id, 1), &[], &[keep(6)], unguarded()).await {
        Err(StoreError::Conflict { constraint }) => assert_eq!(constraint, "gpu_layout_version"),
        other => panic!("a reservation on a destroyed instance was accepted: {other:?}"),
    }

    // A request that fails because its layout change is rejected gives back every instance it held.
    store.set_auto_layout(&gpu.id, false, "admin").await.expect("manual");
    let d = request(store, &t.id, &h100_1g(), 2).await.expect("d");
    let grow = LayoutChange {
        gpu_id: gpu.id.clone(),
        base_version: now.layout_version + 1,
        layout: vec![inst("1g.10gb", 0), inst("1g.10gb", 1), inst("1g.10gb", 2)],
        created: vec![inst("1g.10gb", 2)],
        destroyed: vec![],
        auto_apply: false,
    };
    let d_slots =
        [keep(0), Reservation { gpu_id: gpu.id.clone(), profile: "1g.10gb".into(), start: 2, change: Some(0) }];
    let (_, props) =
        store.approve_request(approve(&d.id, 1), &[grow], &d_slots, unguarded()).await.expect("d approved");
    store.decide_proposal(&props[0].id, false, "no", "admin").await.expect("reject");
    assert_eq!(store.request(&d.id).await.expect("d").state, RequestState::Failed);
    let live: Vec<(String, u8)> =
        store.live_allocations().await.expect("live").into_iter().map(|a| (a.request_id, a.start)).collect();
    assert_eq!(live, vec![(a.id.clone(), 1)], "only A's instance is still held");
}

/// A creation for a batch, charged `count` H100 1g.10gb slices.
struct Ask {
    tenant: String,
    count: u32,
    key: Option<(&'static str, &'static str)>,
    charge: tessera_core::quota::Usage,
    spec: SliceSpec,
}

fn ask(tenant: &str, count: u32, key: Option<(&'static str, &'static str)>) -> Ask {
    let spec = h100_1g();
    let charge = charge(Catalog::builtin(), &spec, count).expect("charge");
    Ask { tenant: tenant.to_string(), count, key, charge, spec }
}

impl Ask {
    fn new_request(&self) -> NewRequest<'_> {
        NewRequest {
            tenant_id: &self.tenant,
            spec: &self.spec,
            count: self.count,
            reason: "batch",
            charge: &self.charge,
            state: RequestState::Pending,
            actor: "user:alice",
            idempotency: self.key,
            duration_s: None,
            priority: Default::default(),
            replaces: None,
        }
    }
}

async fn a_batch_decides_each_request_in_order_as_one_transaction_each_would(store: &Store) {
    let policy = ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 2 };
    let a = store.create_tenant("a", policy, "admin").await.expect("tenant a");
    let b = store.create_tenant("b", POLICY, "admin").await.expect("tenant b");
    store.set_quota(&a.id, &res("mig/H100-80GB/1g.10gb"), 3 * MILLI, "admin").await.expect("quota");
    let old = ask(&a.id, 1, Some(("alice", "old")));
    let (first, created) = store.create_request(old.new_request()).await.expect("first");
    assert!(created);
    let generation = store.generation().expect("this replica's own writes are always seen");

    let asks = [
        ask(&a.id, 1, Some(("alice", "new"))), // created: 2 of 3 held
        ask(&a.id, 1, Some(("alice", "new"))), // a retry inside the batch: the one above
        ask(&a.id, 1, None),                   // created: 3 of 3
        ask(&a.id, 1, None),                   // over the quota
        ask(&b.id, 2, Some(("alice", "old"))), // a key used before the batch: the first request, whatever it asks
        ask("no-such-tenant", 1, None),
        ask(&b.id, 2, Some(("bob", "new"))), // another user's key is another key
    ];
    let batch: Vec<NewRequest<'_>> = asks.iter().map(Ask::new_request).collect();
    let out = store.create_requests(&batch).await;
    assert_eq!(out.len(), asks.len());
    let ok = |i: usize| out[i].as_ref().unwrap_or_else(|e| panic!("batch item {i}: {e}"));
    assert!(ok(0).created && ok(0).request.tenant_id == a.id && ok(0).tenant == a);
    assert!(!ok(1).created && ok(1).request.id == ok(0).request.id);
    assert!(ok(2).created);
    assert!(matches!(&out[3], Err(StoreError::Quota(e)) if e.len() == 1), "{:?}", out[3]);
    assert!(!ok(4).created && ok(4).request == first, "a key names its first request");
    assert!(matches!(&out[5], Err(StoreError::NotFound { .. })), "{:?}", out[5]);
    assert!(ok(6).created && ok(6).tenant == b && ok(6).request.count == 2);
    assert!(store.generation().expect("generation") > generation, "a batch counts as a change");

    // What the batch wrote is what one request at a time writes: held usage, rows, keys, audit entries.
    assert_eq!(store.held(&a.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], 3 * MILLI);
    assert_eq!(store.held(&b.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], 2 * MILLI);
    let listed = |t: String| async move {
        let f = tessera_server::store::RequestFilter {
            tenant: Some(&t),
            state: None,
            after: None,
            limit: 100,
            open: None,
            newest_first: false,
        };
        store.list_requests(f).await.expect("list")
    };
    assert_eq!(listed(a.id.clone()).await.len(), 3);
    assert_eq!(listed(b.id.clone()).await, vec![ok(6).request.clone()]);
    let retry = store.create_request(asks[0].new_request()).await.expect("retry");
    assert_eq!(retry, (ok(0).request.clone(), false), "keys written by a batch hold for later retries");
    let audit = store.audit(&format!("request/{}", ok(2).request.id)).await.expect("audit");
    assert_eq!(audit.len(), 1);
    assert_eq!((audit[0].actor.as_str(), audit[0].action.as_str()), ("user:alice", "request.create"));
    // Ending a request created by a batch gives its charge back like any other.
    let t = Transition {
        id: &ok(2).request.id,
        expected_version: Some(1),
        to: RequestState::Cancelled,
        reason: None,
        actor: "user:alice",
    };
    store.transition(t).await.expect("cancel");
    assert_eq!(store.held(&a.id).await.expect("held")[&res("mig/H100-80GB/1g.10gb")], 2 * MILLI);
}

async fn racing_batches_and_single_creates_never_overshoot(store: &Store) {
    let t = store.create_tenant("racers", POLICY, "admin").await.expect("tenant");
    store.set_quota(&t.id, &res("compute_slices"), 40 * MILLI, "admin").await.expect("quota");
    let store = Arc::new(store.clone());
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (store, tenant) = (store.clone(), t.id.clone());
            tokio::spawn(async move {
                if i % 2 == 0 {
                    let asks: Vec<Ask> = (0..8).map(|_| ask(&tenant, 1, None)).collect();
                    let batch: Vec<NewRequest<'_>> = asks.iter().map(Ask::new_request).collect();
                    store.create_requests(&batch).await.iter().filter(|r| r.is_ok()).count()
                } else {
                    let one = ask(&tenant, 1, None);
                    let mut n = 0;
                    for _ in 0..8 {
                        n += usize::from(store.create_request(one.new_request()).await.is_ok());
                    }
                    n
                }
            })
        })
        .collect();
    let mut created = 0;
    for task in tasks {
        created += task.await.expect("task");
    }
    assert_eq!(created, 40, "128 one-slice asks for 40 slices: exactly 40 created");
    assert_eq!(store.held(&t.id).await.expect("held")[&res("compute_slices")], 40 * MILLI);
}

/// Two server replicas on one PostgreSQL database: a write through one makes the other's cached reads stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_see_each_others_changes_to_requests() {
    let Some(db) = crate::harness::postgres().await else { return };
    let other = Store::connect(&db.url).await.expect("second replica");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let seen = loop {
        if let Some(g) = other.generation() {
            break g;
        }
        assert!(std::time::Instant::now() < deadline, "the second replica never started following changes");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let t = db.store.create_tenant("t", POLICY, "admin").await.expect("tenant");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(other.generation(), Some(seen), "a change to tenants does not touch cached requests");
    request(&db.store, &t.id, &h100_1g(), 1).await.expect("request");
    loop {
        if other.generation().is_some_and(|g| g > seen) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the other replica missed a committed request");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    other.close().await;
    db.close().await;
}

/// Two replicas on one PostgreSQL database: a GPU registered to a node, or a status whose MIG instances differ from
/// the stored one's, is announced to the other replica (which forgets the node's devices it cached for telemetry);
/// a status that repeats the instances (every 30 s per node, with other processes in them) is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_hear_when_a_nodes_devices_change_and_only_then() {
    use std::time::Duration;
    let Some(db) = crate::harness::postgres().await else { return };
    let other = Store::connect(&db.url).await.expect("second replica");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while other.generation().is_none() {
        assert!(std::time::Instant::now() < deadline, "the second replica never started following changes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut heard = other.node_device_changes();
    async fn next(heard: &mut tokio::sync::broadcast::Receiver<String>) -> String {
        tokio::time::timeout(Duration::from_secs(5), heard.recv()).await.expect("heard within 5 s").expect("heard")
    }
    let gpu =
        NewGpu { index: 0, uuid: "GPU-devices-0".into(), model: "H100-80GB".into(), mig_enabled: true, layout: vec![] };
    let node = db.store.register_node("devices", &[gpu], "admin").await.expect("node");
    assert_eq!(next(&mut heard).await, node.id, "a GPU registered to the node");
    let status = |uuids: &[&str], pids: &[u32]| -> tessera_core::api::NodeStatus {
        let instances: Vec<serde_json::Value> = uuids
            .iter()
            .enumerate()
            .map(|(k, u)| {
                serde_json::json!({"profile": "1g.10gb", "start": k, "uuid": u, "gi_id": k, "ci_id": 0,
                    "device_name": "MIG 1g.10gb Device 0", "processes": pids})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"observed_generation": 1,
            "gpus": [{"uuid": "GPU-devices-0", "mig_enabled": true, "instances": instances}]}))
        .expect("status")
    };
    assert!(db.store.record_status(&node.id, &status(&["MIG-a"], &[])).await.expect("status"));
    assert_eq!(next(&mut heard).await, node.id, "the first status");
    // The same instances with other processes in them, then the same status again: nothing is announced; the
    // next announcement is the instance that came.
    assert!(db.store.record_status(&node.id, &status(&["MIG-a"], &[4242])).await.expect("status"));
    assert!(db.store.record_status(&node.id, &status(&["MIG-a"], &[4242])).await.expect("status"));
    let other_node = db.store.register_node("elsewhere", &[], "admin").await.expect("node");
    assert!(db.store.record_status(&node.id, &status(&["MIG-a", "MIG-b"], &[4242])).await.expect("status"));
    assert_eq!(next(&mut heard).await, node.id, "an instance more; nothing before it for the repeated instances");
    assert!(db.store.record_status(&node.id, &status(&["MIG-b"], &[])).await.expect("status"));
    assert_eq!(next(&mut heard).await, node.id, "an instance less");
    assert!(heard.try_recv().is_err(), "nothing else (a node registered without GPUs: {})", other_node.id);
    other.close().await;
    db.close().await;
}

async fn single_sign_on_creates_users_and_re_maps_their_memberships_at_each_sign_in(store: &Store) {
    let ml = store.create_tenant("ml", POLICY, "admin").await.expect("tenant");
    let cv = store.create_tenant("cv", POLICY, "admin").await.expect("tenant");
    let nlp = store.create_tenant("nlp", POLICY, "admin").await.expect("tenant");
    let local = store.create_user("ada", false, "admin").await.expect("local user");
    let who = |admin: Option<bool>, memberships: &[(&str, Role)]| SsoIdentity {
        issuer: "https://idp.example.com".into(),
        subject: "s-1".into(),
        name: "ada".into(),
        email: Some("ada@example.com".into()),
        platform_admin: admin,
        memberships: Some(memberships.iter().map(|(t, r)| (t.to_string(), *r)).collect()),
    };
    let first = store
        .sso_sign_in(&who(
            Some(true),
            &[("ml", Role::Member), ("ml", Role::TenantAdmin), ("cv", Role::Member), ("ghost", Role::Member)],
        ))
        .await
        .expect("first sign-in");
    assert!(first.created);
    let user = first.principal.user.clone();
    assert_ne!(user.id, local.id, "never the local user of the same name");
    assert!(user.name.starts_with("ada~") && user.platform_admin);
    let mut expected = vec![(ml.id.clone(), Role::TenantAdmin), (cv.id.clone(), Role::Member)];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(first.principal.memberships, expected, "highest role per tenant");
    assert_eq!(first.unknown_tenants, vec!["ghost".to_string()]);

    // A platform admin adds nlp by hand: the mapping leaves it alone. Editing a mapped membership (cv) by hand
    // does not take it away from the mapping: the provider's groups stay the truth for it.
    store.set_membership(&user.id, &nlp.id, Role::Member, "admin").await.expect("by hand");
    store.set_membership(&user.id, &cv.id, Role::TenantAdmin, "admin").await.expect("edit a mapped one");
    let second = store.sso_sign_in(&who(Some(false), &[("ml", Role::Member)])).await.expect("second sign-in");
    assert!(!second.created);
    assert_eq!(second.principal.user.id, user.id);
    assert!(!second.principal.user.platform_admin);
    let mut expected = vec![(ml.id.clone(), Role::Member), (nlp.id.clone(), Role::Member)];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(second.principal.memberships, expected, "cv went with its group; nlp stayed");
    let third = store.sso_sign_in(&who(None, &[])).await.expect("third sign-in");
    assert_eq!(third.principal.memberships, vec![(nlp.id.clone(), Role::Member)], "the mapped one went");
    assert!(!third.principal.user.platform_admin, "None leaves the flag as it is");
    // A token without any groups claim changes no membership.
    let unknown = SsoIdentity { memberships: None, ..who(None, &[]) };
    store.sso_sign_in(&who(None, &[("ml", Role::Member)])).await.expect("back in ml");
    let kept = store.sso_sign_in(&unknown).await.expect("no groups claim");
    assert_eq!(kept.principal.memberships.len(), 2, "ml and nlp kept");
    store.sso_sign_in(&who(None, &[])).await.expect("out of ml again");

    // A sign-in that changes nothing writes nothing.
    let before = store.audit(&format!("user/{}", user.id)).await.expect("audit").len();
    store.sso_sign_in(&who(None, &[])).await.expect("again");
    assert_eq!(store.audit(&format!("user/{}", user.id)).await.expect("audit").len(), before);
    assert_eq!(store.principal(&user.id).await.expect("principal"), third.principal);

    // Many first sign-ins of one new identity at once make one user.
    let racing = |i: usize| {
        let store = store.clone();
        async move {
            let id = SsoIdentity {
                subject: "s-new".into(),
                name: format!("newbie{}", i % 2),
                ..who(None, &[("ml", Role::Member)])
            };
            store.sso_sign_in(&id).await.expect("racing sign-in").principal.user.id
        }
    };
    let ids: Vec<String> = futures_join((0..8).map(racing).collect()).await;
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
}

async fn futures_join<F: std::future::Future<Output = String> + Send + 'static>(futures: Vec<F>) -> Vec<String> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("join"));
    }
    out
}

async fn sessions_and_login_attempts_live_in_the_database(store: &Store) {
    let u = store.create_user("sam", false, "admin").await.expect("user");
    let session = |created: i64, expires: i64| SessionRecord {
        user_id: u.id.clone(),
        csrf_token: "csrf".into(),
        id_token: Some("id.token.here".into()),
        created_at_ms: created,
        last_seen_at_ms: created,
        expires_at_ms: expires,
    };
    store.create_session("live", &session(1_000, 100_000)).await.expect("create");
    store.create_session("idle", &session(500, 100_000)).await.expect("create");
    store.create_session("old", &session(1_000, 5_000)).await.expect("create");
    assert!(matches!(store.create_session("live", &session(1, 2)).await, Err(StoreError::Conflict { .. })));
    assert_eq!(store.session("live").await.expect("read"), Some(session(1_000, 100_000)));
    store.touch_session("live", 9_000).await.expect("touch");
    store.touch_session("live", 8_000).await.expect("touch");
    assert_eq!(store.session("live").await.expect("read").expect("live").last_seen_at_ms, 9_000, "only forward");
    // At 10 s: `old` is past its absolute expiry, `idle` unused since before 8.5 s.
    assert_eq!(store.purge_sign_in(10_000, 8_500, 0).await.expect("purge"), 2);
    assert!(
        store.session("old").await.expect("read").is_none() && store.session("idle").await.expect("read").is_none()
    );
    let ended = store.delete_session("live").await.expect("delete").expect("was there");
    assert_eq!(ended.id_token.as_deref(), Some("id.token.here"));
    assert_eq!(store.delete_session("live").await.expect("delete"), None);

    let attempt = LoginAttempt {
        state_sha256: "st".into(),
        browser_sha256: "br".into(),
        nonce: "n".into(),
        pkce_verifier: "v".into(),
        return_to: "/x".into(),
        created_at_ms: 1_000,
    };
    store.create_login_attempt(&attempt).await.expect("attempt");
    assert_eq!(store.take_login_attempt("st", "another browser").await.expect("take"), None);
    let takers: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.take_login_attempt("st", "br").await.expect("take") })
        })
        .collect();
    let mut taken = Vec::new();
    for t in takers {
        taken.extend(t.await.expect("join"));
    }
    assert_eq!(taken, vec![attempt.clone()], "a login is taken exactly once");
    store.create_login_attempt(&LoginAttempt { state_sha256: "old".into(), ..attempt }).await.expect("attempt");
    store.purge_sign_in(10_000, 0, 2_000).await.expect("purge");
    assert_eq!(store.take_login_attempt("old", "br").await.expect("take"), None, "stale attempts are purged");
}

async fn node_credentials_identify_one_node_until_revoked(store: &Store) {
    let node = store.register_node("gpu-n", &[], "admin").await.expect("node");
    assert!(matches!(store.create_node_credential("nope", "h0", "admin").await, Err(StoreError::NotFound { .. })));
    store.create_node_credential(&node.id, "h1", "admin").await.expect("credential");
    let p = store.node_by_credential("h1").await.expect("lookup").expect("known");
    assert_eq!((p.node_id.as_str(), p.node_name.as_str()), (node.id.as_str(), "gpu-n"));
    assert_eq!(p.actor(), "node:gpu-n");
    assert_eq!(store.node_by_credential("h2").await.expect("lookup"), None);
    assert_eq!(store.revoke_node_credentials(&node.id, "admin").await.expect("revoke"), 1);
    assert_eq!(store.node_by_credential("h1").await.expect("lookup"), None, "revoked");
    assert_eq!(
        store.audit(&format!("node/{}", node.id)).await.expect("audit").last().map(|e| e.action.as_str()),
        Some("node.credential.revoke")
    );
}

async fn telemetry_minutes_are_merged_queried_and_pruned(store: &Store) {
    use tessera_core::api::{DeviceSeries, Sample, TelemetryBatch};
    use tessera_server::services::telemetry::{Metric, Owned, Telemetry, cell_rows, minute_rows};

    let m0: i64 = (tessera_server::store::now_ms() / 60_000 - 5) * 60_000;
    let series = |device: &str, profile: Option<&str>, util: fn(i64) -> f32| DeviceSeries {
        device: device.into(),
        gpu: "GPU-1".into(),
        profile: profile.map(Into::into),
        start: profile.map(|_| 0),
        samples: (0..120)
            .map(|s| Sample {
                t: m0 + s * 1000,
                util: util(s),
                mem_used_mib: 100.0,
                mem_total_mib: 1000.0,
                power_w: profile.is_none().then_some(200.0),
                temp_c: profile.is_none().then_some(40.0 + (s % 60) as f32 / 10.0),
            })
            .collect(),
    };
    let telemetry = Telemetry::new(900, 100);
    let mut gpus = Owned::default();
    gpus.gpus.insert("GPU-1".to_string());
    gpus.mig.insert("MIG-1".to_string(), "GPU-1".to_string());
    let mut batch = TelemetryBatch {
        dropped: 3,
        devices: vec![
            series("GPU-1", None, |s| if s < 60 { 10.0 } else { 30.0 }),
            series("MIG-1", Some("1g.10gb"), |_| 50.0),
        ],
    };
    // A device on a GPU the node does not have, and a sample from the future, are refused.
    batch.devices.push(DeviceSeries { gpu: "GPU-2".into(), device: "GPU-2".into(), ..series("x", None, |_| 1.0) });
    let future = Sample { t: m0 + 3_600_000, ..batch.devices[1].samples[0] };
    batch.devices[1].samples.push(future);
    let got = telemetry.ingest("n1", &gpus, batch, m0 + 125_000);
    assert_eq!((got.accepted, got.rejected), (240, 121));
    // A minute is finished by a sample of a later one, or once it is over (plus a grace).
    let rows = telemetry.take_finished(m0 + 62_000, 5_000);
    assert_eq!(rows.len(), 2, "minute 0 of both devices: {rows:?}");
    store.write_minutes(&rows).await.expect("write");
    assert!(telemetry.take_finished(m0 + 121_000, 5_000).is_empty(), "minute 1 is still open");
    let rest = telemetry.take_finished(m0 + 126_000, 5_000);
    assert_eq!(rest.len(), 2);
    store.write_minutes(&rest).await.expect("write");

    let stored = store.minutes(Some("n1"), m0, m0 + 120_000).await.expect("minutes");
    assert_eq!(stored.len(), 4);
    let gpu0 = stored.iter().find(|r| r.device == "GPU-1" && r.minute_ms == m0).expect("gpu minute 0");
    assert_eq!((gpu0.samples, gpu0.util_avg, gpu0.util_max), (60, 10.0, 10.0));
    assert_eq!((gpu0.power_avg, gpu0.temp_max), (Some(200.0), Some(45.900001525878906)));
    let mig = stored.iter().find(|r| r.device == "MIG-1").expect("mig");
    assert_eq!((mig.profile.as_deref(), mig.start, mig.power_avg), (Some("1g.10gb"), Some(0), None));
    assert!(store.minutes(Some("n2"), m0, m0 + 120_000).await.expect("minutes").is_empty());

    // The same minute arriving again in part (a backlog, another replica) is merged, weighted by samples.
    let mut late = gpu0.clone();
    late.samples = 20;
    late.util_avg = 50.0;
    late.util_max = 70.0;
    late.power_avg = None;
    late.temp_max = Some(90.0);
    store.write_minutes(&[late]).await.expect("merge");
    let merged = store.minutes(None, m0, m0 + 60_000).await.expect("minutes");
    let gpu0 = merged.iter().find(|r| r.device == "GPU-1").expect("gpu minute 0");
    assert_eq!((gpu0.samples, gpu0.util_avg, gpu0.util_max), (80, 20.0, 70.0));
    assert_eq!((gpu0.power_avg, gpu0.temp_max), (Some(200.0), Some(90.0)));

    // A two-minute column of the heatmap is the sample-weighted mean: (80 × 20 + 60 × 30) / 140.
    let all = store.minutes(None, m0, m0 + 120_000).await.expect("minutes");
    let cells = minute_rows(&all, Metric::Util, m0, 120_000, 1);
    let gpu = cells.iter().find(|(k, _)| k.device == "GPU-1").expect("row");
    assert!((f64::from(gpu.1[0].expect("value")) - 3400.0 / 140.0).abs() < 1e-3, "{:?}", gpu.1);

    // Grouped in the database, every metric gives what grouping the rows gives, column by column.
    for metric in [Metric::Util, Metric::MemUsed, Metric::MemPct, Metric::Power, Metric::Temp] {
        for (step, columns) in [(60_000, 2), (120_000, 1), (30_000, 4)] {
            let grouped =
                store.minute_cells(Tier::Minute, None, None, metric, m0, step, columns, m0 + 120_000, 100).await;
            let mut grouped = cell_rows(grouped.expect("cells"), columns);
            let mut expected = minute_rows(&all, metric, m0, step, columns);
            grouped.sort_by(|a, b| a.0.device.cmp(&b.0.device));
            expected.sort_by(|a, b| a.0.device.cmp(&b.0.device));
            assert_eq!(grouped.len(), expected.len(), "{metric:?} step {step}");
            for ((gk, gv), (ek, ev)) in grouped.iter().zip(&expected) {
                assert_eq!(gk, ek, "{metric:?}");
                let close = gv.iter().zip(ev).all(|(g, e)| match (g, e) {
                    (Some(g), Some(e)) => (g - e).abs() < 1e-3,
                    (g, e) => g == e,
                });
                assert!(close, "{metric:?} step {step}: {gv:?} against {ev:?}");
            }
        }
    }
    // Scoped to tenants, only devices they held: a tenant that held nothing, or no tenant, reads nothing.
    let t = store.create_tenant("no-holder", POLICY, "test").await.expect("tenant");
    let scoped = store
        .minute_cells(
            Tier::Minute,
            Some(std::slice::from_ref(&t.id)),
            None,
            Metric::Util,
            m0,
            60_000,
            2,
            m0 + 120_000,
            100,
        )
        .await;
    assert!(scoped.expect("cells").is_empty());
    assert!(
        store
            .minute_cells(Tier::Minute, Some(&[]), None, Metric::Util, m0, 60_000, 2, m0, 100)
            .await
            .expect("cells")
            .is_empty()
    );
    // At most `limit` cells are read; a node filter keeps to the node.
    assert_eq!(
        store.minute_cells(Tier::Minute, None, None, Metric::Util, m0, 60_000, 2, m0, 3).await.expect("cells").len(),
        3
    );
    assert!(
        store
            .minute_cells(Tier::Minute, None, Some("n2"), Metric::Util, m0, 60_000, 2, m0, 9)
            .await
            .expect("cells")
            .is_empty()
    );

    assert_eq!(store.prune_minutes(m0 + 60_000).await.expect("prune"), 2);
    assert_eq!(store.minutes(None, 0, i64::MAX).await.expect("minutes").len(), 2);
}

async fn people_tokens_and_policies_are_listed_and_changed_with_an_audit_trail(store: &Store) {
    let t = store.create_tenant("people", POLICY, "test").await.expect("tenant");
    let zed = store.create_user("zed", false, "test").await.expect("user");
    let amy = store.create_user("amy", true, "test").await.expect("user");
    let names: Vec<String> = store.users().await.expect("users").into_iter().map(|u| u.name).collect();
    assert_eq!(names, ["amy", "zed"]);

    let first = store.create_token(&zed.id, "first", "hash-1", "test").await.expect("token");
    let second = store.create_token(&zed.id, "second", "hash-2", "test").await.expect("token");
    store.create_token(&amy.id, "amy's", "hash-3", "test").await.expect("token");
    store.revoke_token(&first, Some(&zed.id), "test").await.expect("revoke");
    let tokens = store.tokens(&zed.id).await.expect("tokens");
    let listed: Vec<(&str, bool)> = tokens.iter().map(|t| (t.id.as_str(), t.revoked_at_ms.is_some())).collect();
    assert_eq!(listed, [(second.as_str(), false), (first.as_str(), true)], "newest first");
    assert!(tokens[1].revoked_at_ms >= Some(tokens[1].created_at_ms));

    store.set_membership(&zed.id, &t.id, Role::TenantAdmin, "test").await.expect("member");
    store.remove_membership(&zed.id, &t.id, "user:amy").await.expect("remove");
    assert!(store.members(&t.id).await.expect("members").is_empty());
    assert!(matches!(store.remove_membership(&zed.id, &t.id, "user:amy").await, Err(StoreError::NotFound { .. })));
    let history = store.audit(&format!("tenant/{}/member/{}", t.id, zed.id)).await.expect("audit");
    let last = history.last().expect("entry");
    assert_eq!((last.action.as_str(), last.actor.as_str()), ("membership.remove", "user:amy"));
    assert!(last.before.as_deref().is_some_and(|b| b.contains("tenant-admin")), "{last:?}");

    let policy = ApprovalPolicy { auto_approve: true, auto_approve_max_compute_slices: 3 };
    let after = store.set_policy(&t.id, policy, "user:amy").await.expect("policy");
    assert_eq!((after.policy, after.name.as_str(), after.created_at_ms), (policy, "people", t.created_at_ms));
    assert_eq!(store.tenant(&t.id).await.expect("tenant").policy, policy);
    let last = store.audit(&format!("tenant/{}", t.id)).await.expect("audit").pop().expect("entry");
    assert_eq!(last.action, "tenant.policy");
    let after: serde_json::Value = serde_json::from_str(last.after.as_deref().expect("after")).expect("json");
    assert_eq!(after["policy"], serde_json::json!({"auto_approve": true, "auto_approve_max_compute_slices": 3}));
    assert!(matches!(store.set_policy("nope", policy, "test").await, Err(StoreError::NotFound { .. })));
}

async fn the_audit_log_filters_by_exact_prefixes_and_pages_by_id(store: &Store) {
    use tessera_server::store::audit::AuditFilter;

    // Tenant creations are audited as `tenant/<id>`; these names make objects and actors to filter on.
    for (i, actor) in ["user:a", "user:b", "user:a", "user:a_b"].iter().enumerate() {
        store.create_tenant(&format!("audit-{i}"), POLICY, actor).await.expect("tenant");
    }
    let all = store.audit_entries(AuditFilter { limit: 100, ..Default::default() }).await.expect("entries");
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].0 > w[1].0), "newest first");
    assert_eq!(all[0].1.actor, "user:a_b");

    let by = |f: AuditFilter<'static>| async move {
        store.audit_entries(f).await.expect("entries").into_iter().map(|(_, e)| e.actor).collect::<Vec<_>>()
    };
    assert_eq!(by(AuditFilter { actor: Some("user:a"), limit: 100, ..Default::default() }).await, ["user:a"; 2]);
    // Prefixes are literal and case-sensitive: `_` is no wildcard, `TENANT/` is not `tenant/`.
    assert_eq!(by(AuditFilter { object_prefix: Some("tenant/"), limit: 100, ..Default::default() }).await.len(), 4);
    assert!(by(AuditFilter { object_prefix: Some("TENANT/"), limit: 100, ..Default::default() }).await.is_empty());
    assert!(by(AuditFilter { action_prefix: Some("tenant_"), limit: 100, ..Default::default() }).await.is_empty());
    assert_eq!(by(AuditFilter { action_prefix: Some("tenant."), limit: 100, ..Default::default() }).await.len(), 4);
    let object = all[1].1.object.clone();
    let exact = store
        .audit_entries(AuditFilter { object: Some(&object), limit: 100, ..Default::default() })
        .await
        .expect("entries");
    assert_eq!(exact.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [all[1].0]);
    let at = all[1].1.at_ms;
    let since = store.audit_entries(AuditFilter { from_ms: Some(at), limit: 100, ..Default::default() });
    assert!(since.await.expect("entries").iter().all(|(_, e)| e.at_ms >= at));
    let until = store.audit_entries(AuditFilter { to_ms: Some(at), limit: 100, ..Default::default() });
    assert!(until.await.expect("entries").iter().all(|(_, e)| e.at_ms < at));

    // Pages of one by id: every entry once, in order.
    let mut paged = Vec::new();
    let mut before = None;
    loop {
        let page =
            store.audit_entries(AuditFilter { before_id: before, limit: 1, ..Default::default() }).await.expect("page");
        let Some((id, _)) = page.first() else { break };
        before = Some(*id);
        paged.push(*id);
    }
    assert_eq!(paged, all.iter().map(|(id, _)| *id).collect::<Vec<_>>());
}

async fn utilisation_sums_are_sample_weighted_per_device_within_the_range(store: &Store) {
    use tessera_server::store::telemetry::MinuteRow;

    let row = |device: &str, minute: i64, samples: i64, util: f64| MinuteRow {
        device: device.into(),
        minute_ms: minute * 60_000,
        node_id: "n".into(),
        gpu: "GPU-1".into(),
        profile: Some("1g.10gb".into()),
        start: Some(0),
        samples,
        util_avg: util,
        util_max: util,
        mem_used_avg: 1.0,
        mem_used_max: None,
        mem_total: 10.0,
        power_avg: None,
        temp_max: None,
    };
    store
        .write_minutes(&[
            row("MIG-a", 10, 60, 2.0),
            row("MIG-a", 11, 30, 8.0),
            row("MIG-a", 12, 60, 99.0),
            row("MIG-b", 9, 60, 50.0),
            row("MIG-b", 10, 1, 40.0),
        ])
        .await
        .expect("write");
    let sums = store.util_sums(Tier::Minute, 10 * 60_000, 12 * 60_000).await.expect("sums");
    assert_eq!(sums, [("MIG-a".to_string(), 360.0, 90), ("MIG-b".to_string(), 40.0, 1)]);
    assert!(store.util_sums(Tier::Minute, 0, 9 * 60_000).await.expect("sums").is_empty());
}

async fn cohorts_rebalance_tells_releases_and_withdraws_under_their_lock(store: &Store) {
    use tessera_server::store::cohorts::Bound;
    let c = store.create_cohort("lab", 60, "admin").await.expect("cohort");
    let (a, b) = (
        store.create_tenant("borrower", POLICY, "admin").await.expect("a"),
        store.create_tenant("lender", POLICY, "admin").await.expect("b"),
    );
    let cs = Resource::ComputeSlices;
    store
        .set_quota_lines(
            &a.id,
            &[(cs.clone(), Some(MILLI))],
            &[(cs.clone(), Bound::Maximum, Some(4 * MILLI))],
            "admin",
            "",
        )
        .await
        .expect("a's bounds");
    store.set_quota_lines(&b.id, &[(cs.clone(), Some(3 * MILLI))], &[], "admin", "").await.expect("b's limit");
    for t in [&a, &b] {
        store.set_cohort(&t.id, Some(&c.id), 1, "admin").await.expect("join");
    }
    assert_eq!(store.cohort(&c.id).await.expect("cohort").members.len(), 2);
    // a holds 3 against a guarantee of 1: 2 borrowed from b's 3; b then asks for 2 of its own.
    let borrowed = request(store, &a.id, &h100_1g(), 3).await.expect("borrows");
    assert!(borrowed.borrowed, "{borrowed:?}");
    request(store, &b.id, &h100_1g(), 2).await.expect("within b's guarantee");
    let now = 1_000_000;
    let done = store.rebalance(&c.id, now, Some(&b.id), &[]).await.expect("rebalance");
    assert_eq!(done.told, vec![borrowed.id.clone()]);
    let told = store.request(&borrowed.id).await.expect("get");
    assert_eq!((told.reclaim_at_ms, told.reclaim_for.as_deref()), (Some(now + 60_000), Some("lender")));
    // Again before the deadline: nothing new; after it: released (cancelled, never running), quota given back.
    assert_eq!(store.rebalance(&c.id, now + 1, None, &[]).await.expect("again"), Default::default());
    let done = store.rebalance(&c.id, now + 60_000, None, &[]).await.expect("due");
    assert_eq!(done.released.iter().map(|r| r.state).collect::<Vec<_>>(), vec![RequestState::Cancelled]);
    assert_eq!(store.held(&a.id).await.expect("held").get(&cs), None);
    let audit: Vec<String> =
        store.audit(&format!("request/{}", borrowed.id)).await.expect("audit").into_iter().map(|e| e.action).collect();
    assert!(
        audit.contains(&"request.reclaim".to_string()) && audit.contains(&"request.cancelled".to_string()),
        "{audit:?}"
    );
    // A bound without a limit is refused, and nothing of the change is written.
    let refused = store
        .set_quota_lines(
            &a.id,
            &[(cs.clone(), Some(5 * MILLI))],
            &[(Resource::MemoryGib, Bound::Lending, Some(1))],
            "admin",
            "",
        )
        .await;
    assert!(matches!(refused, Err(StoreError::Rule { code: "quota_bound_without_limit", .. })), "{refused:?}");
    assert_eq!(store.quotas(&a.id).await.expect("quotas")[&cs], MILLI, "nothing half-applied");
}

async fn spans_and_budgets_are_read_back_as_written(store: &Store) {
    use tessera_core::budget::{BudgetPolicy, BudgetUnit};
    let t = store.create_tenant("vision", POLICY, "admin").await.expect("tenant");
    let r = request(store, &t.id, &h100_1g(), 2).await.expect("request");
    let spans = store.spans(Some(&t.id), &Resource::ComputeSlices, 0).await.expect("spans");
    let mine = &spans[&t.id];
    assert_eq!((mine.held.len(), mine.held[0].amount, mine.held[0].to_ms), (1, 2 * MILLI, None), "{mine:?}");
    assert!(mine.used.is_empty(), "nothing runs yet");
    store
        .transition(Transition {
            id: &r.id,
            expected_version: Some(1),
            to: RequestState::Cancelled,
            reason: None,
            actor: "a",
        })
        .await
        .expect("cancel");
    let ended = &store.spans(None, &Resource::ComputeSlices, 0).await.expect("spans")[&t.id].held[0];
    assert!(ended.to_ms.is_some_and(|to| to >= ended.from_ms), "{ended:?}");
    assert!(store.spans(None, &Resource::ComputeSlices, i64::MAX).await.expect("none").is_empty(), "ended before then");

    assert_eq!(store.budgets(&t.id).await.expect("none"), Default::default());
    let h100 = BudgetUnit::GpuHours { model: "H100-80GB".into() };
    let b = store
        .set_budgets(
            &t.id,
            Some(BudgetPolicy::Block),
            &[(h100.clone(), Some(5 * MILLI)), (BudgetUnit::ComputeSliceHours, Some(MILLI))],
            "admin",
        )
        .await
        .expect("set");
    assert_eq!((b.policy, b.limits.len(), b.limits["gpu_hours/H100-80GB"]), (BudgetPolicy::Block, 2, 5 * MILLI));
    let b = store.set_budgets(&t.id, None, &[(h100, None)], "admin").await.expect("remove one");
    assert_eq!(
        (b.policy, b.limits.keys().cloned().collect::<Vec<_>>()),
        (BudgetPolicy::Block, vec!["compute_slice_hours".to_string()])
    );
    assert_eq!(store.all_budgets(None).await.expect("all").len(), 1);
    assert!(matches!(store.set_budgets("nope", None, &[], "admin").await, Err(StoreError::NotFound { .. })));
    assert_eq!(store.audit(&format!("tenant/{}/budget", t.id)).await.expect("audit").len(), 2);
}

/// An approval checked against an empty reservation calendar.
fn unguarded() -> tessera_server::store::Guard {
    tessera_server::store::Guard { bookings_version: 0, ends_by_ms: None }
}

async fn leases_run_on_the_databases_clock(store: &Store) {
    let now = tessera_server::store::now_ms();
    assert!(store.hold_lease("test-lease", "a", 60_000).await.expect("hold"));
    assert!(!store.hold_lease("test-lease", "b", 60_000).await.expect("hold"), "held by a");
    // Until now + ttl by the database's clock, in UTC milliseconds (this machine's clock is the database's here).
    let (holder, expires) = store.lease("test-lease").await.expect("read").expect("lease");
    assert_eq!(holder, "a");
    assert!((expires - (now + 60_000)).abs() < 5_000, "expires {expires}, now {now}");
    // Renewed by its holder; lapsed, taken by another.
    assert!(store.hold_lease("test-lease", "a", -1_000).await.expect("renew"));
    assert!(store.hold_lease("test-lease", "b", 60_000).await.expect("take"), "a lapsed lease is taken");
    assert_eq!(store.lease("test-lease").await.expect("read").map(|l| l.0).as_deref(), Some("b"));
    store.drop_lease("test-lease", "b").await.expect("drop");
    assert_eq!(store.lease("test-lease").await.expect("read"), None);
}

/// The fleet read is kept while nothing changed, and read again after any change to a node or a GPU, made through
/// this store or another connection to the database (another replica, or the same server's next start).
mod fleet_read {
    use tessera_server::store::{NewGpu, Store};

    use crate::harness::{TestDb, on_both_backends};

    on_both_backends!(|db| &db;
        the_fleet_read_is_kept_until_a_node_or_a_gpu_changes_on_any_connection,
        a_status_equal_to_the_stored_one_counts_as_stored_without_a_write,
    );

    async fn a_status_equal_to_the_stored_one_counts_as_stored_without_a_write(db: &TestDb) {
        let store = &db.store;
        let node = store.register_node("repeats", &[], "admin").await.expect("node");
        let status = |generation: i64, applying: bool| -> tessera_core::api::NodeStatus {
            serde_json::from_value(serde_json::json!({"observed_generation": generation, "applying": applying,
                "gpus": []}))
            .expect("status")
        };
        let at = || async { store.agent_record(&node.id).await.expect("record").status_at_ms.expect("a status") };
        assert!(store.record_status(&node.id, &status(2, false)).await.expect("first"));
        let first = at().await;
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert!(store.record_status(&node.id, &status(2, false)).await.expect("again"), "counts as stored");
        assert_eq!(at().await, first, "not written again");
        assert!(!store.record_status(&node.id, &status(1, false)).await.expect("older"), "an older one is not stored");
        assert!(store.record_status(&node.id, &status(2, true)).await.expect("other"));
        assert!(at().await > first, "another status is written");
    }

    async fn the_fleet_read_is_kept_until_a_node_or_a_gpu_changes_on_any_connection(db: &TestDb) {
        let store = &db.store;
        let other = Store::connect(&db.url).await.expect("another connection");
        let gpu = |uuid: &str| NewGpu {
            index: 0,
            uuid: uuid.to_string(),
            model: "H100-80GB".into(),
            mig_enabled: false,
            layout: vec![],
        };
        let first = store.register_node("fleet-a", &[gpu("GPU-fleet-a")], "admin").await.expect("node");
        let read = store.nodes().await.expect("nodes");
        assert_eq!(read.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["fleet-a"]);
        assert_eq!(store.nodes().await.expect("again"), read, "nothing changed: the same fleet");

        // A GPU cordoned through the other connection.
        other.set_cordoned(&first.gpus[0].id, true, "admin", None).await.expect("cordon");
        let read = store.nodes().await.expect("nodes");
        assert!(read[0].gpus[0].cordoned, "a GPU changed elsewhere is read again");

        // A node registered through the other connection, then one joining through this store.
        other.register_node("fleet-b", &[gpu("GPU-fleet-b")], "admin").await.expect("node");
        let names = |nodes: Vec<tessera_server::store::Node>| nodes.into_iter().map(|n| n.name).collect::<Vec<_>>();
        assert_eq!(names(store.nodes().await.expect("nodes")), ["fleet-a", "fleet-b"]);
        store.register_node("fleet-c", &[], "admin").await.expect("node");
        assert_eq!(names(other.nodes().await.expect("nodes")), ["fleet-a", "fleet-b", "fleet-c"]);
        store.set_cordoned(&first.gpus[0].id, false, "admin", None).await.expect("uncordon");
        assert!(!other.nodes().await.expect("nodes")[0].gpus[0].cordoned);
        other.close().await;
    }
}
