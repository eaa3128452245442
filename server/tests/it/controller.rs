//! The Kubernetes controller against an API-server double (`kube_api.rs`), with the server as it runs: a cluster
//! registered with a kubeconfig, a namespace given to a tenant, the demo node in the cluster, and requests made
//! active the way an agent makes them active. What the double holds is checked after each change, with the time it
//! took: the namespace labelled, the quota following what the tenant holds, a claim per allocation selecting
//! exactly its device, a hand edit put back, a released allocation's claim deleted after its pod was evicted with
//! the grace period, an unreachable cluster caught up with after, and a second replica taking over when the one
//! leading dies mid-reconcile.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::admin::{App, with_node_credential};
use crate::harness::{TestApp, TestDb, on_both_backends};
use crate::kube_api::{Eviction, Kind, KubeApi};

on_both_backends!(a_second_replica_takes_over_when_the_leader_dies_mid_reconcile,);

const MIG_CLASS_KEY: &str = "mig.nvidia.com.deviceclass.resource.k8s.io/devices";

/// Waits up to `limit` for `check` to hold on the double; how long it took.
async fn within(
    kube: &KubeApi,
    limit: Duration,
    what: &str,
    check: impl Fn(&crate::kube_api::Cluster) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if kube.with(|c| check(c)) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; the double saw {:#?}",
            kube.with(|c| c.log.clone())
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn hard(c: &crate::kube_api::Cluster, ns: &str, key: &str) -> Option<String> {
    c.get(Kind::Quota, ns, "tessera-gpus").and_then(|q| q["spec"]["hard"][key].as_str().map(str::to_string))
}

fn selector(claim: &Value) -> String {
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// A server with the double as cluster `prod` (DRA), `ml-a` given to `team-a`, the demo node in the cluster.
async fn governed(db_app: TestApp) -> (App, String, String) {
    let app = with_node_credential(db_app).await;
    let t = app.limited_tenant("team-a", json!({"auto_approve": true, "auto_approve_max_compute_slices": 8}), 8).await;
    let dev = app.member("ann", &t).await;
    let body = json!({"name": "prod", "mode": "dra", "kubeconfig": "double"});
    let (s, c) = app.send(Method::POST, "/api/v1/clusters", &app.admin, Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    let (s, _) =
        app.send(Method::PUT, "/api/v1/clusters/prod/namespaces/ml-a", &app.admin, Some(json!({"tenant": t}))).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = app
        .send(
            Method::PUT,
            &format!("/api/v1/nodes/{}/cluster", app.node_id),
            &app.admin,
            Some(json!({"cluster": "prod"})),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    (app, t, dev)
}

/// A server on SQLite whose settings name the double's kubeconfig `double`, its controller quick to react.
async fn fast_server(kubeconfig: &std::path::Path) -> TestApp {
    TestApp::sqlite()
        .auto_layout()
        .kubeconfigs(&[("double", kubeconfig.to_str().expect("path"))])
        .kube_timing(100, 2000, 1000)
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_and_quotas_follow_allocations_and_hand_edits_are_put_back() {
    let kube = KubeApi::start(&["ml-a", "elsewhere"]).await;
    let kubeconfig = kube.kubeconfig();
    let (app, t, dev) = governed(fast_server(&kubeconfig).await).await;

    // Governed: labelled, and a quota of nothing held.
    let took = within(&kube, Duration::from_secs(5), "the namespace labelled and its quota", |c| {
        let labelled = c.get(Kind::Namespace, "", "ml-a").is_some_and(|n| {
            n["metadata"]["labels"]["tessera.io/tenant"] == "team-a"
                && n["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tessera"
        });
        labelled && hard(c, "ml-a", MIG_CLASS_KEY).as_deref() == Some("0")
    })
    .await;
    eprintln!("governed namespace labelled and quota written in {took:?}");
    let patches: Vec<String> = kube.with(|c| c.log.iter().filter(|l| l.starts_with("PATCH")).cloned().collect());
    assert!(
        !patches.is_empty() && patches.iter().all(|l| l.contains("fieldManager=tessera") && l.contains("force=true")),
        "every write is a server-side apply as field manager `tessera`, forced: {patches:?}"
    );

    // Active: a claim per allocation, selecting exactly its device, within 2 s; the quota counts them.
    let (request, active) = app.active(&dev, &t, "1g.10gb", 2).await;
    let devices: Vec<String> = active.iter().map(|a| a["device_uuid"].as_str().expect("device").to_string()).collect();
    let ids: Vec<String> = active.iter().map(|a| a["id"].as_str().expect("id").to_string()).collect();
    let took = within(&kube, Duration::from_secs(2), "a claim per allocation and the quota", |c| {
        let claims = c.all(Kind::Claim, "ml-a");
        ids.iter().zip(&devices).all(|(id, device)| {
            claims.get(&format!("tessera-{id}")).is_some_and(|claim| {
                selector(claim) == format!("device.attributes[\"gpu.nvidia.com\"].uuid == \"{device}\"")
                    && claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "mig.nvidia.com"
            })
        }) && hard(c, "ml-a", MIG_CLASS_KEY).as_deref() == Some("2")
    })
    .await;
    eprintln!("allocation active -> claims and quota in {took:?}");
    assert!(
        kube.with(|c| c.all(Kind::Claim, "elsewhere").is_empty()),
        "nothing in a namespace Tessera does not govern"
    );

    // The scheduler allocates the first claim and reserves it for a pod: the API shows it.
    let first = format!("tessera-{}", ids[0]);
    kube.with(|c| {
        c.edit(Kind::Claim, "ml-a", &first, |claim| {
            claim["status"] = json!({"allocation": {"devices": {"results": []}},
                "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u-1"}]});
        })
    });
    let start = Instant::now();
    loop {
        let (_, list) = app.get(&format!("/api/v1/allocations?tenant={t}"), &dev).await;
        let claims_of = |id: &str| -> Vec<Value> {
            let a = list.as_array().into_iter().flatten().find(|a| a["id"] == id);
            a.and_then(|a| a["claims"].as_array().cloned()).unwrap_or_default()
        };
        let (one, two) = (claims_of(&ids[0]), claims_of(&ids[1]));
        let shown = one.len() == 1
            && one[0]
                == json!({"cluster": "prod", "namespace": "ml-a", "name": first, "allocated": true,
                "pods": ["trainer-0"], "observed_at_ms": one[0]["observed_at_ms"]})
            && two.len() == 1
            && two[0]["allocated"] == false
            && two[0]["pods"] == json!([]);
        if shown {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "the claims' state reaches the API: {list}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A hand edit of the second claim's selector (say, to any device) is put back.
    let second = format!("tessera-{}", ids[1]);
    kube.with(|c| {
        c.edit(Kind::Claim, "ml-a", &second, |claim| {
            claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = json!("true");
        })
    });
    let took = within(&kube, Duration::from_secs(2), "the hand edit put back", |c| {
        c.get(Kind::Claim, "ml-a", &second).is_some_and(|claim| selector(&claim).contains(&devices[1]))
    })
    .await;
    eprintln!("hand edit put back in {took:?}");

    // Released: both claims go, the pod using the first is evicted with the grace period first, the quota drops.
    let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{request}/release"), &dev, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let took = within(&kube, Duration::from_secs(2), "claims deleted and the quota lowered", |c| {
        c.all(Kind::Claim, "ml-a").is_empty() && hard(c, "ml-a", MIG_CLASS_KEY).as_deref() == Some("0")
    })
    .await;
    eprintln!("released -> claims deleted, quota lowered in {took:?}");
    let evictions = kube.with(|c| c.evictions.clone());
    assert_eq!(evictions, [Eviction { namespace: "ml-a".into(), pod: "trainer-0".into(), grace_s: Some(30) }]);
    let log = kube.with(|c| c.log.clone());
    let evicted_at = log.iter().position(|l| l == "POST eviction ml-a/trainer-0").expect("evicted");
    let deleted_at = log.iter().position(|l| l == &format!("DELETE Claim ml-a/{first}")).expect("deleted");
    assert!(evicted_at < deleted_at, "the pod is asked to leave before its claim goes");
    let (_, cluster) = app.get("/api/v1/clusters/prod", &app.admin).await;
    assert!(
        cluster["sync"]["synced_at_ms"].as_i64().is_some_and(|t| t > 0) && cluster["sync"]["error"].is_null(),
        "{cluster}"
    );

    // Given up: a namespace loses every object of Tessera's and its labels (another tenant may get it next), its
    // own labels stay.
    let (_, again) = app.active(&dev, &t, "1g.10gb", 1).await;
    let claim = format!("tessera-{}", again[0]["id"].as_str().expect("id"));
    within(&kube, Duration::from_secs(2), "the new claim", |c| c.get(Kind::Claim, "ml-a", &claim).is_some()).await;
    let (s, _) = app.send(Method::DELETE, "/api/v1/clusters/prod/namespaces/ml-a", &app.admin, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let took = within(&kube, Duration::from_secs(2), "the given-up namespace cleared", |c| {
        let labels = c.get(Kind::Namespace, "", "ml-a").map(|n| n["metadata"]["labels"].clone()).unwrap_or_default();
        c.all(Kind::Claim, "ml-a").is_empty()
            && c.get(Kind::Quota, "ml-a", "tessera-gpus").is_none()
            && labels == json!({"kubernetes.io/metadata.name": "ml-a"})
    })
    .await;
    eprintln!("namespace given up -> claims, quota and labels gone in {took:?}");
    let _ = std::fs::remove_file(kubeconfig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_whose_eviction_is_refused_is_deleted_with_its_grace_period_after_the_limit() {
    let kube = KubeApi::start(&["ml-a"]).await;
    let kubeconfig = kube.kubeconfig();
    let server = TestApp::sqlite()
        .auto_layout()
        .kubeconfigs(&[("double", kubeconfig.to_str().expect("path"))])
        .kube_timing(100, 2000, 200)
        .eviction_refused_s(2)
        .start()
        .await;
    let (app, t, dev) = governed(server).await;
    let (request, active) = app.active(&dev, &t, "1g.10gb", 1).await;
    let claim = format!("tessera-{}", active[0]["id"].as_str().expect("id"));
    within(&kube, Duration::from_secs(3), "the claim", |c| c.get(Kind::Claim, "ml-a", &claim).is_some()).await;
    kube.with(|c| {
        c.refuse_evictions = true;
        c.edit(Kind::Claim, "ml-a", &claim, |claim| {
            claim["status"] = json!({"allocation": {"devices": {"results": []}},
                "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u-1"}]});
        });
    });

    // Released: the pod's disruption budget refuses its eviction; the claim stays (its pod still runs), tried
    // again, and the cluster says why.
    let released = Instant::now();
    let (s, v) = app.send(Method::POST, &format!("/api/v1/requests/{request}/release"), &dev, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    within(&kube, Duration::from_secs(2), "the eviction tried", |c| {
        c.log.iter().any(|l| l == "POST eviction ml-a/trainer-0")
    })
    .await;
    let mut said = Value::Null;
    for _ in 0..40 {
        let (_, cluster) = app.get("/api/v1/clusters/prod", &app.admin).await;
        said = cluster["sync"]["error"].clone();
        if said.as_str().is_some_and(|e| e.contains("evicting pod ml-a/trainer-0 (refused for")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(said.as_str().is_some_and(|e| e.contains("disruption budget")), "the refusal is shown: {said}");
    assert!(kube.with(|c| c.get(Kind::Claim, "ml-a", &claim).is_some() && c.pod_deletes.is_empty()));

    // Past the limit (2 s): the pod is deleted with the grace period, then its claim.
    let took = within(&kube, Duration::from_secs(5), "the pod deleted, then the claim", |c| {
        !c.pod_deletes.is_empty() && c.get(Kind::Claim, "ml-a", &claim).is_none()
    })
    .await;
    let after = released.elapsed();
    eprintln!("eviction refused -> pod deleted {after:?} after the release ({took:?} after the refusal was shown)");
    assert!(after >= Duration::from_secs(2), "not before the limit: {after:?}");
    let deletes = kube.with(|c| c.pod_deletes.clone());
    assert_eq!(deletes, [Eviction { namespace: "ml-a".into(), pod: "trainer-0".into(), grace_s: Some(30) }]);
    let log = kube.with(|c| c.log.clone());
    let pod_at = log.iter().position(|l| l == "DELETE pod ml-a/trainer-0").expect("pod deleted");
    let claim_at = log.iter().position(|l| l == &format!("DELETE Claim ml-a/{claim}")).expect("claim deleted");
    assert!(pod_at < claim_at, "the pod goes before its claim");
    let _ = std::fs::remove_file(kubeconfig);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_cluster_is_reported_and_caught_up_with_after() {
    let kube = KubeApi::start(&["ml-a"]).await;
    let kubeconfig = kube.kubeconfig();
    let (app, t, dev) = governed(fast_server(&kubeconfig).await).await;
    within(&kube, Duration::from_secs(5), "governed", |c| hard(c, "ml-a", MIG_CLASS_KEY).is_some()).await;

    kube.with(|c| c.down = true);
    let (_, active) = app.active(&dev, &t, "1g.10gb", 1).await;
    let start = Instant::now();
    let error = loop {
        let (_, cluster) = app.get("/api/v1/clusters/prod", &app.admin).await;
        if let Some(e) = cluster["sync"]["error"].as_str() {
            break e.to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(5), "the failure is shown on the cluster: {cluster}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(error.contains("503") || error.contains("unavailable"), "{error}");
    // Down for a while: the controller keeps trying, no faster than its backoff allows.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let tries = kube.with(|c| c.log.len());
    kube.with(|c| c.down = false);
    let claim = format!("tessera-{}", active[0]["id"].as_str().expect("id"));
    let took = within(&kube, Duration::from_secs(3), "caught up after the outage", |c| {
        c.get(Kind::Claim, "ml-a", &claim).is_some() && hard(c, "ml-a", MIG_CLASS_KEY).as_deref() == Some("1")
    })
    .await;
    eprintln!("cluster back -> caught up in {took:?} ({tries} calls during 3 s down)");
    let start = Instant::now();
    loop {
        let (_, cluster) = app.get("/api/v1/clusters/prod", &app.admin).await;
        if cluster["sync"]["error"].is_null() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(3), "the error clears once a reconcile completes: {cluster}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_file(kubeconfig);
}

/// Two replicas of the controller (run here, the server's own switched off) on one database: one leads; killed in
/// the middle of a reconcile (its task aborted, its lease left to expire), the other takes over and finishes.
async fn a_second_replica_takes_over_when_the_leader_dies_mid_reconcile(db: &TestDb) {
    let kube = KubeApi::start(&["ml-a"]).await;
    let kubeconfig = kube.kubeconfig();
    let server = TestApp::on(db)
        .auto_layout()
        .kubeconfigs(&[("double", kubeconfig.to_str().expect("path"))])
        .without_controller()
        .start()
        .await;
    let (app, t, dev) = governed(server).await;
    let settings = |holder: &str| tessera_controller::Settings {
        tick: Duration::from_millis(100),
        lease_ttl: Duration::from_millis(1500),
        max_backoff: Duration::from_millis(500),
        ..tessera_controller::Settings::new(
            [("double".to_string(), kubeconfig.clone())].into(),
            false,
            holder.to_string(),
        )
    };
    let replica = |holder: &str| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(tessera_controller::run(
            app.store.clone(),
            tessera_core::Catalog::builtin(),
            settings(holder),
            stopped,
        ));
        (stop, task)
    };
    let (_stop_a, a) = replica("replica-a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_stop_b, b) = replica("replica-b");
    within(&kube, Duration::from_secs(5), "governed by the first", |c| hard(c, "ml-a", MIG_CLASS_KEY).is_some()).await;

    // Slow writes, so that the leader is caught in the middle of applying three claims.
    kube.with(|c| c.write_delay = Duration::from_millis(300));
    let (_, active) = app.active(&dev, &t, "1g.10gb", 3).await;
    within(&kube, Duration::from_secs(3), "the leader started applying", |c| {
        c.log.iter().filter(|l| l.starts_with("PATCH Claim")).count() >= 1
    })
    .await;
    // Which replica leads is in the lease; kill that one.
    let leader = lease_holder(db).await;
    let applied_before = kube.with(|c| c.all(Kind::Claim, "ml-a").len());
    assert!(applied_before < 3, "killed before it finished ({applied_before} of 3 claims)");
    let survivor = if leader == "replica-a" {
        a.abort();
        "replica-b"
    } else {
        b.abort();
        "replica-a"
    };
    let claims: Vec<String> = active.iter().map(|a| format!("tessera-{}", a["id"].as_str().expect("id"))).collect();
    let took = within(&kube, Duration::from_secs(8), "the other replica finished", |c| {
        let held = c.all(Kind::Claim, "ml-a");
        claims.iter().all(|n| held.contains_key(n)) && hard(c, "ml-a", MIG_CLASS_KEY).as_deref() == Some("3")
    })
    .await;
    eprintln!("leader {leader} killed mid-reconcile -> {survivor} converged in {took:?}");
    assert_eq!(lease_holder(db).await, survivor, "the lease passed to the survivor");
    let _ = std::fs::remove_file(kubeconfig);
}

async fn lease_holder(db: &TestDb) -> String {
    let sql = "SELECT holder FROM leases WHERE name = 'kubernetes-controller'";
    if db.url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(&db.url).await.expect("sqlite");
        let (h,): (String,) = sqlx::query_as(sql).fetch_one(&pool).await.expect("lease");
        pool.close().await;
        h
    } else {
        let pool = sqlx::PgPool::connect(&db.url).await.expect("postgres");
        let (h,): (String,) = sqlx::query_as(sql).fetch_one(&pool).await.expect("lease");
        pool.close().await;
        h
    }
}
