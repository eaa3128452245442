//! Kubernetes clusters over real HTTP and the CLI, on SQLite and PostgreSQL: a platform admin registers clusters
//! (reached with a kubeconfig named in the server's settings, whose path is never shown, or the in-cluster service
//! account), gives tenants namespaces in them, and puts nodes in them; names, namespaces, credentials and hand-overs
//! are checked; a tenant's members read their tenant's namespaces and nothing else.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_server::store::Role;

use crate::harness::{TestApp, TestDb, on_both_backends};

on_both_backends!(clusters_namespaces_and_nodes_are_registered_checked_and_given_up, the_cluster_commands,);

const KUBECONFIG_PATH: &str = "/etc/tessera/kube/secret-east.kubeconfig";

fn code(body: &Value) -> &str {
    body["code"].as_str().unwrap_or("")
}

async fn clusters_namespaces_and_nodes_are_registered_checked_and_given_up(db: &TestDb) {
    let app = TestApp::on(db).kubeconfigs(&[("east", KUBECONFIG_PATH)]).start().await;
    let a = app.tenant("team-a", json!({})).await;
    let b = app.tenant("team-b", json!({})).await;
    let member_a = app.member("ann", &a).await;
    let member_b = app.member("bob", &b).await;
    let tenant_admin = app.user("tad", &[(&a, Role::TenantAdmin)]).await.1;

    // Registering.
    let (s, c) = app
        .send(
            Method::POST,
            "/api/v1/clusters",
            &app.admin,
            Some(json!({"name": "prod", "mode": "dra", "kubeconfig": "east"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_eq!(
        (c["name"].as_str(), c["mode"].as_str(), c["kubeconfig"].as_str()),
        (Some("prod"), Some("dra"), Some("east"))
    );
    assert_eq!(c["credentials_problem"], Value::Null, "the settings have `east`: {c}");
    assert!(!c.to_string().contains(KUBECONFIG_PATH), "the kubeconfig's path is never shown: {c}");
    let prod = c["id"].as_str().expect("id").to_string();
    let (s, c) = app
        .send(Method::POST, "/api/v1/clusters", &app.admin, Some(json!({"name": "lab", "mode": "device_plugin"})))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert!(
        c["credentials_problem"].as_str().is_some_and(|w| w.contains("KUBERNETES_SERVICE_HOST")),
        "this server runs in no pod: the in-cluster account is not there, and the view says so: {c}"
    );
    for (body, status, expected) in [
        (json!({"name": "prod", "mode": "dra"}), StatusCode::CONFLICT, "already_exists"),
        (json!({"name": "Prod", "mode": "dra"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_name"),
        (
            json!({"name": "west", "mode": "dra", "kubeconfig": "west"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown_kubeconfig",
        ),
        (json!({"name": "west", "mode": "kubelet"}), StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
    ] {
        let (s, p) = app.send(Method::POST, "/api/v1/clusters", &app.admin, Some(body.clone())).await;
        assert_eq!((s, code(&p)), (status, expected), "{body}: {p}");
    }
    let (_, all) = app.get("/api/v1/clusters", &app.admin).await;
    let names: Vec<&str> = all.as_array().expect("list").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["lab", "prod"], "a refused registration wrote nothing");

    // Changing.
    let (s, c) = app
        .send(Method::PATCH, "/api/v1/clusters/lab", &app.admin, Some(json!({"kubeconfig": "east", "mode": "dra"})))
        .await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!((c["mode"].as_str(), c["kubeconfig"].as_str()), (Some("dra"), Some("east")));
    let (s, c) = app.send(Method::PATCH, "/api/v1/clusters/lab", &app.admin, Some(json!({"kubeconfig": null}))).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!((c["mode"].as_str(), &c["kubeconfig"]), (Some("dra"), &Value::Null), "absent mode unchanged: {c}");
    let (s, p) = app.send(Method::PATCH, "/api/v1/clusters/lab", &app.admin, Some(json!({"kubeconfig": "west"}))).await;
    assert_eq!((s, code(&p)), (StatusCode::UNPROCESSABLE_ENTITY, "unknown_kubeconfig"), "{p}");

    // Namespaces.
    let ns = |cluster: &str, name: &str| format!("/api/v1/clusters/{cluster}/namespaces/{name}");
    let (s, n) = app.send(Method::PUT, &ns("prod", "ml-a"), &app.admin, Some(json!({"tenant": "team-a"}))).await;
    assert_eq!(s, StatusCode::CREATED, "{n}");
    assert_eq!(
        (n["namespace"].as_str(), n["tenant"].as_str(), n["cluster"].as_str()),
        (Some("ml-a"), Some(a.as_str()), Some(prod.as_str()))
    );
    assert_eq!(
        (n["tenant_name"].as_str(), n["cluster_name"].as_str(), n["mode"].as_str()),
        (Some("team-a"), Some("prod"), Some("dra"))
    );
    let (s, again) = app.send(Method::PUT, &ns(&prod, "ml-a"), &app.admin, Some(json!({"tenant": a}))).await;
    assert_eq!((s, &again), (StatusCode::OK, &n), "giving it again to the same tenant changes nothing");
    let (s, p) = app.send(Method::PUT, &ns("prod", "ml-a"), &app.admin, Some(json!({"tenant": "team-b"}))).await;
    assert_eq!((s, code(&p)), (StatusCode::CONFLICT, "namespace_taken"), "{p}");
    assert!(p["detail"].as_str().is_some_and(|d| d.contains("team-a")), "{p}");
    for bad in ["kube-system", "default", "Bad_NS", "-x"] {
        let (s, p) = app.send(Method::PUT, &ns("prod", bad), &app.admin, Some(json!({"tenant": "team-a"}))).await;
        assert_eq!((s, code(&p)), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_namespace"), "{bad}: {p}");
    }
    let (s, p) = app.send(Method::PUT, &ns("prod", "ml-x"), &app.admin, Some(json!({"tenant": "nobody"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
    let (s, p) = app.send(Method::PUT, &ns("nowhere", "ml-x"), &app.admin, Some(json!({"tenant": "team-a"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
    let (s, _) = app.send(Method::PUT, &ns("prod", "ml-b"), &app.admin, Some(json!({"tenant": "team-b"}))).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = app.send(Method::PUT, &ns("lab", "ml-a"), &app.admin, Some(json!({"tenant": "team-a"}))).await;
    assert_eq!(s, StatusCode::CREATED, "the same name in another cluster is another namespace");

    // What members read.
    let (s, mine) = app.get("/api/v1/tenants/team-a/namespaces", &member_a).await;
    assert_eq!(s, StatusCode::OK, "{mine}");
    let listed: Vec<(&str, &str)> = mine
        .as_array()
        .expect("list")
        .iter()
        .map(|n| (n["cluster_name"].as_str().unwrap_or(""), n["namespace"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(listed, [("lab", "ml-a"), ("prod", "ml-a")], "its own, by cluster, never team-b's");
    let (s, _) = app.get(&format!("/api/v1/tenants/{a}/namespaces"), &member_b).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "another tenant's namespaces are not there to see");
    for token in [&member_a, &tenant_admin] {
        let (s, p) = app.get("/api/v1/clusters", token).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{p}");
        let (s, p) =
            app.send(Method::POST, "/api/v1/clusters", token, Some(json!({"name": "mine", "mode": "dra"}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{p}");
        let (s, p) = app.send(Method::PUT, &ns("prod", "ml-z"), token, Some(json!({"tenant": "team-a"}))).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{p}");
        let (s, p) = app.send(Method::DELETE, &ns("prod", "ml-b"), token, None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{p}");
    }

    // Nodes.
    let (_, nodes) = app.get("/api/v1/nodes", &app.admin).await;
    let node = nodes[0]["name"].as_str().expect("the demo node").to_string();
    let (s, p) = app
        .send(Method::PUT, &format!("/api/v1/nodes/{node}/cluster"), &app.admin, Some(json!({"cluster": "prod"})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{p}");
    let (_, c) = app.get("/api/v1/clusters/prod", &app.admin).await;
    assert_eq!(c["nodes"][0]["name"].as_str(), Some(node.as_str()), "{c}");
    let (s, p) = app.send(Method::PUT, &format!("/api/v1/nodes/{node}/cluster"), &app.admin, Some(json!({}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "a body without `cluster` takes no node out: {p}");
    let (s, p) =
        app.send(Method::PUT, "/api/v1/nodes/no-such-node/cluster", &app.admin, Some(json!({"cluster": "prod"}))).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{p}");
    let (s, p) = app
        .send(Method::PUT, &format!("/api/v1/nodes/{node}/cluster"), &app.admin, Some(json!({"cluster": "nowhere"})))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{p}");

    // Giving up.
    let (s, p) = app.send(Method::DELETE, "/api/v1/clusters/prod", &app.admin, None).await;
    assert_eq!((s, code(&p)), (StatusCode::CONFLICT, "cluster_has_namespaces"), "{p}");
    assert!(p["detail"].as_str().is_some_and(|d| d.contains("2 namespace")), "{p}");
    for name in ["ml-a", "ml-b"] {
        let (s, p) = app.send(Method::DELETE, &ns("prod", name), &app.admin, None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{p}");
    }
    let (s, _) = app.send(Method::DELETE, &ns("prod", "ml-a"), &app.admin, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "already given up");
    let (s, p) = app.send(Method::PUT, &ns("prod", "ml-a"), &app.admin, Some(json!({"tenant": "team-b"}))).await;
    assert_eq!(s, StatusCode::CREATED, "given up, it can change hands: {p}");
    let (s, _) = app.send(Method::DELETE, &ns("prod", "ml-a"), &app.admin, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, p) = app.send(Method::DELETE, &format!("/api/v1/clusters/{prod}"), &app.admin, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{p}");
    let (s, _) = app.get("/api/v1/clusters/prod", &app.admin).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (_, mine) = app.get("/api/v1/tenants/team-a/namespaces", &member_a).await;
    assert_eq!(mine.as_array().map(Vec::len), Some(1), "lab's stays: {mine}");
    let (s, p) = app
        .send(Method::PUT, &format!("/api/v1/nodes/{node}/cluster"), &app.admin, Some(json!({"cluster": "lab"})))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "the node, in no cluster since prod went, can join another: {p}");

    // Every change is in the audit log.
    let (_, audit) = app.get("/api/v1/audit/entries?limit=500", &app.admin).await;
    let text = audit.to_string();
    for action in [
        "cluster.create",
        "cluster.update",
        "cluster.delete",
        "cluster.namespace.govern",
        "cluster.namespace.release",
        "node.cluster",
    ] {
        assert!(text.contains(action), "{action} audited: {audit}");
    }
    assert!(!text.contains(KUBECONFIG_PATH), "nor does the audit log show the kubeconfig's path");
}

async fn the_cluster_commands(db: &TestDb) {
    let app = TestApp::on(db).kubeconfigs(&[("east", KUBECONFIG_PATH)]).start().await;
    let a = app.tenant("team-a", json!({})).await;
    let member = app.member("ann", &a).await;
    let (code, out) =
        app.cli(&app.admin, &["cluster", "create", "prod", "--mode", "dra", "--kubeconfig", "east"]).await;
    assert_eq!(code, Some(0), "{out}");
    let c: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(c["kubeconfig"], "east");
    let (code, out) = app.cli(&app.admin, &["cluster", "govern", "prod", "ml-a", "--tenant", "team-a"]).await;
    assert_eq!(code, Some(0), "{out}");
    let node = tessera_server::demo::DEMO_NODE;
    let (code, out) = app.cli(&app.admin, &["cluster", "node", "no-such-node", "prod"]).await;
    assert_eq!(code, Some(1), "an unknown node is refused: {out}");
    let (code, out) = app.cli(&app.admin, &["cluster", "node", node, "prod"]).await;
    assert_eq!(code, Some(0), "{out}");
    let (code, out) =
        app.cli(&app.admin, &["cluster", "update", "prod", "--mode", "device_plugin", "--in-cluster"]).await;
    assert_eq!(code, Some(0), "{out}");
    let c: Value = serde_json::from_str(&out).expect("json");
    assert_eq!((c["mode"].as_str(), &c["kubeconfig"]), (Some("device_plugin"), &Value::Null));
    assert_eq!(c["nodes"][0]["name"].as_str(), Some(node), "{c}");
    let (code, out) = app.cli(&member, &["cluster", "namespaces", "--tenant", "team-a"]).await;
    assert_eq!(code, Some(0), "{out}");
    let mine: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(mine[0]["namespace"], "ml-a");
    let (code, out) = app.cli(&app.admin, &["cluster", "delete", "prod"]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("error[cluster_has_namespaces]"), "{out}");
    let (code, out) = app.cli(&app.admin, &["cluster", "release", "prod", "ml-a"]).await;
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = app.cli(&app.admin, &["cluster", "delete", "prod"]).await;
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = app.cli(&app.admin, &["cluster", "list"]).await;
    assert_eq!((code, out.trim()), (Some(0), "[]"));
}

/// The wire types tell an absent field from `null` where it matters: a PATCH without `kubeconfig` keeps it, with
/// `null` it switches to the in-cluster account; a node's body must name its cluster or `null`.
#[test]
fn an_update_tells_absent_from_null() {
    use tessera_api::clusters::{ClusterUpdate, Mode, NewCluster, NodeCluster};
    let absent: ClusterUpdate = serde_json::from_str("{}").expect("absent");
    assert_eq!(absent.kubeconfig, None);
    let null: ClusterUpdate = serde_json::from_str(r#"{"kubeconfig": null}"#).expect("null");
    assert_eq!(null.kubeconfig, Some(None));
    let named: ClusterUpdate = serde_json::from_str(r#"{"kubeconfig": "east", "mode": "dra"}"#).expect("named");
    assert_eq!(named.kubeconfig, Some(Some("east".into())));
    assert_eq!(named.mode, Some(Mode::Dra));
    assert_eq!(
        serde_json::to_value(&null).expect("encode"),
        json!({"kubeconfig": null}),
        "and it encodes back as sent"
    );
    assert!(serde_json::from_str::<NodeCluster>("{}").is_err(), "cluster is required");
    assert!(serde_json::from_str::<NewCluster>(r#"{"name":"a","mode":"magic"}"#).is_err());
}
