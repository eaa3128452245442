//! A Kubernetes API server double for the controller's tests, speaking the API server's JSON wire format for what
//! the controller uses: namespaces (read, server-side apply), ResourceQuotas and `resource.k8s.io/v1`
//! ResourceClaims (server-side apply with a field manager, whose spec cannot change once made; list and watch by
//! label selector, delete), and the
//! Eviction subresource of pods. Lists carry a `resourceVersion`; a watch from a version replays what came after
//! it, then streams events (`{"type":"ADDED"|"MODIFIED"|"DELETED","object":...}` lines) as they happen. Errors
//! are `Status` objects. The test can edit objects "by hand", play the scheduler (allocate a claim, reserve it for
//! a pod), slow writes down, and take the server down (every call answers 503).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use serde_json::{Value, json};

/// The token the kubeconfig gives; anything else is 401.
pub(crate) const TOKEN: &str = "tessera-test-token";

/// Kinds the double keeps, as `(kind, api path prefix)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Namespace,
    Quota,
    Claim,
}

impl Kind {
    fn meta(self) -> (&'static str, &'static str) {
        match self {
            Kind::Namespace => ("v1", "Namespace"),
            Kind::Quota => ("v1", "ResourceQuota"),
            Kind::Claim => ("resource.k8s.io/v1", "ResourceClaim"),
        }
    }
}

/// An eviction the double was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Eviction {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) grace_s: Option<i64>,
}

#[derive(Default)]
pub(crate) struct Cluster {
    objects: BTreeMap<(Kind, String, String), Value>,
    version: u64,
    history: Vec<(u64, Kind, Value)>,
    events: Option<tokio::sync::broadcast::Sender<(u64, Kind, Value)>>,
    /// Every call, as `METHOD path?query` with the field manager of applies.
    pub(crate) log: Vec<String>,
    pub(crate) evictions: Vec<Eviction>,
    /// Evictions are refused with 429, as a PodDisruptionBudget that allows no disruption refuses them.
    pub(crate) refuse_evictions: bool,
    /// Pods deleted (`DELETE /api/v1/namespaces/{ns}/pods/{name}`), with the grace period of the delete options.
    pub(crate) pod_deletes: Vec<Eviction>,
    /// Every call answers 503.
    pub(crate) down: bool,
    /// Writes wait this long before they are done.
    pub(crate) write_delay: Duration,
    /// The labels and annotations (`labels/<key>`, `annotations/<key>`) each object's applier set: applying again
    /// without one removes it, as server-side apply removes the fields a manager stops applying.
    owned: BTreeMap<(Kind, String, String), std::collections::BTreeSet<String>>,
}

type Shared = Arc<Mutex<Cluster>>;

/// The running double.
pub(crate) struct KubeApi {
    pub(crate) url: String,
    pub(crate) cluster: Shared,
    _task: tokio::task::JoinHandle<()>,
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self._task.abort();
    }
}

fn status(code: u16, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

fn lock(c: &Shared) -> std::sync::MutexGuard<'_, Cluster> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    fn publish(&mut self, kind: Kind, kind_of_event: &str, object: &Value) {
        let event = json!({"type": kind_of_event, "object": object});
        self.history.push((self.version, kind, event.clone()));
        if let Some(tx) = &self.events {
            let _ = tx.send((self.version, kind, event));
        }
    }

    /// Stores `object` (a new version), publishing the event.
    pub(crate) fn put(&mut self, kind: Kind, namespace: &str, name: &str, mut object: Value) {
        self.version += 1;
        let (api_version, k) = kind.meta();
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(k);
        object["metadata"]["name"] = json!(name);
        if kind != Kind::Namespace {
            object["metadata"]["namespace"] = json!(namespace);
        }
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        let key = (kind, namespace.to_string(), name.to_string());
        let verb = if self.objects.contains_key(&key) { "MODIFIED" } else { "ADDED" };
        self.objects.insert(key, object.clone());
        self.publish(kind, verb, &object);
    }

    fn remove(&mut self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        let mut gone = self.objects.remove(&(kind, namespace.to_string(), name.to_string()))?;
        self.version += 1;
        gone["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.publish(kind, "DELETED", &gone);
        Some(gone)
    }

    /// An object as stored.
    pub(crate) fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.objects.get(&(kind, namespace.to_string(), name.to_string())).cloned()
    }

    /// Every object of `kind` in `namespace`, by name.
    pub(crate) fn all(&self, kind: Kind, namespace: &str) -> BTreeMap<String, Value> {
        self.objects
            .iter()
            .filter(|((k, ns, _), _)| *k == kind && (kind == Kind::Namespace || ns == namespace))
            .map(|((_, _, name), v)| (name.clone(), v.clone()))
            .collect()
    }

    /// Changes a stored object the way a person with kubectl would (a new version, a watch event).
    pub(crate) fn edit(&mut self, kind: Kind, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) {
        let mut object = self.get(kind, namespace, name).expect("the object to edit");
        change(&mut object);
        self.put(kind, namespace, name, object);
    }
}

/// `labelSelector` as `key=value` pairs (the only form the controller uses).
fn matches(object: &Value, selector: Option<&str>) -> bool {
    selector.is_none_or(|s| {
        s.split(',').filter(|p| !p.is_empty()).all(|pair| match pair.split_once('=') {
            Some((k, v)) => object["metadata"]["labels"][k] == v,
            None => false,
        })
    })
}

fn authorised(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {TOKEN}"))
}

/// A list, or a watch when `watch=true`.
async fn list_or_watch(c: Shared, kind: Kind, headers: HeaderMap, query: BTreeMap<String, String>) -> Response {
    let selector = query.get("labelSelector").cloned();
    let since = query.get("resourceVersion").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let mut guard = lock(&c);
    guard.log.push(format!(
        "GET {kind:?} {}",
        if query.get("watch").is_some_and(|w| w == "true") { "watch" } else { "list" }
    ));
    if guard.down {
        return status(503, "ServiceUnavailable", "the API server is unavailable");
    }
    if !authorised(&headers) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    if query.get("watch").is_none_or(|w| w != "true") {
        let items: Vec<Value> = guard
            .objects
            .iter()
            .filter(|((k, _, _), v)| *k == kind && matches(v, selector.as_deref()))
            .map(|(_, v)| v.clone())
            .collect();
        let (api_version, k) = kind.meta();
        let body = json!({"apiVersion": api_version, "kind": format!("{k}List"),
            "metadata": {"resourceVersion": guard.version.to_string()}, "items": items});
        return axum::Json(body).into_response();
    }
    let tx = guard.events.get_or_insert_with(|| tokio::sync::broadcast::channel(1024).0).clone();
    let rx = tx.subscribe();
    let replay: Vec<(u64, Kind, Value)> = guard.history.iter().filter(|(v, _, _)| *v > since).cloned().collect();
    drop(guard);
    let wanted = move |k: Kind, event: &Value| k == kind && matches(&event["object"], selector.as_deref());
    let replayed: Vec<Bytes> =
        replay.into_iter().filter(|(_, k, e)| wanted(*k, e)).map(|(_, _, e)| Bytes::from(format!("{e}\n"))).collect();
    let live = futures_util::stream::unfold((rx, wanted), |(mut rx, wanted)| async move {
        loop {
            match rx.recv().await {
                Ok((_, k, e)) if wanted(k, &e) => return Some((Bytes::from(format!("{e}\n")), (rx, wanted))),
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    let stream = futures_util::stream::iter(replayed).chain(live);
    use futures_util::StreamExt;
    let body = Body::from_stream(stream.map(Ok::<Bytes, std::convert::Infallible>));
    Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_else(|_| status(500, "InternalError", "body"))
}

/// Server-side apply: creates the object, or takes the applied labels, annotations and spec (the applier owns
/// them; forced, so nobody else's ownership stops it); the status stays.
async fn apply(
    c: Shared,
    kind: Kind,
    namespace: String,
    name: String,
    headers: HeaderMap,
    query: Option<String>,
    body: Bytes,
) -> Response {
    let delay = {
        let mut guard = lock(&c);
        guard.log.push(format!("PATCH {kind:?} {namespace}/{name}?{}", query.clone().unwrap_or_default()));
        if guard.down {
            return status(503, "ServiceUnavailable", "the API server is unavailable");
        }
        guard.write_delay
    };
    tokio::time::sleep(delay).await;
    if !authorised(&headers) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("");
    let query = query.unwrap_or_default();
    if content_type != "application/apply-patch+yaml" || !query.contains("fieldManager=") {
        return status(
            415,
            "UnsupportedMediaType",
            format!("only server-side apply is served here, not {content_type}"),
        );
    }
    let Ok(applied) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the body is not JSON (kube-rs sends applies as JSON)");
    };
    if applied["metadata"]["name"] != name.as_str() {
        return status(400, "BadRequest", "the applied object's name is not the one in the path");
    }
    let mut guard = lock(&c);
    let current = guard.get(kind, &namespace, &name);
    if kind == Kind::Namespace && current.is_none() {
        return status(404, "NotFound", format!("namespaces \"{name}\" not found"));
    }
    if kind == Kind::Claim
        && let Some(existing) = &current
        && existing["spec"] != applied["spec"]
    {
        return status(
            422,
            "Invalid",
            format!("ResourceClaim.resource.k8s.io \"{name}\" is invalid: spec: Invalid value: field is immutable"),
        );
    }
    let mut object = current.unwrap_or_else(|| json!({"metadata": {}}));
    let key = (kind, namespace.clone(), name.clone());
    let before = guard.owned.remove(&key).unwrap_or_default();
    let mut now = std::collections::BTreeSet::new();
    for field in ["labels", "annotations"] {
        let applied_here = applied["metadata"][field].as_object().cloned().unwrap_or_default();
        let target = &mut object["metadata"][field];
        if !target.is_object() {
            *target = json!({});
        }
        let map = target.as_object_mut().expect("object");
        for k in before.iter().filter_map(|o| o.strip_prefix(&format!("{field}/"))) {
            if !applied_here.contains_key(k) {
                map.remove(k);
            }
        }
        for (k, v) in applied_here {
            now.insert(format!("{field}/{k}"));
            map.insert(k, v);
        }
    }
    guard.owned.insert(key, now);
    if !applied["spec"].is_null() {
        object["spec"] = applied["spec"].clone();
    }
    guard.put(kind, &namespace, &name, object.clone());
    let stored = guard.get(kind, &namespace, &name).unwrap_or(object);
    axum::Json(stored).into_response()
}

async fn delete(c: Shared, kind: Kind, namespace: String, name: String, headers: HeaderMap) -> Response {
    let mut guard = lock(&c);
    guard.log.push(format!("DELETE {kind:?} {namespace}/{name}"));
    if guard.down {
        return status(503, "ServiceUnavailable", "the API server is unavailable");
    }
    if !authorised(&headers) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    guard.owned.remove(&(kind, namespace.clone(), name.clone()));
    match guard.remove(kind, &namespace, &name) {
        Some(gone) => axum::Json(gone).into_response(),
        None => status(404, "NotFound", format!("{kind:?} \"{name}\" not found")),
    }
}

async fn evict(c: Shared, namespace: String, pod: String, headers: HeaderMap, body: Bytes) -> Response {
    let mut guard = lock(&c);
    guard.log.push(format!("POST eviction {namespace}/{pod}"));
    if guard.down {
        return status(503, "ServiceUnavailable", "the API server is unavailable");
    }
    if !authorised(&headers) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let Ok(eviction) = serde_json::from_slice::<Value>(&body) else {
        return status(400, "BadRequest", "the eviction is not JSON");
    };
    // A policy/v1 Eviction of this pod; unknown fields are refused, as a strict decoder would (a misspelt
    // `deleteOptions` would otherwise lose the grace period without a word).
    let known = ["apiVersion", "kind", "metadata", "deleteOptions"];
    let unknown: Vec<String> = eviction
        .as_object()
        .map(|o| o.keys().filter(|k| !known.contains(&k.as_str())).cloned().collect())
        .unwrap_or_default();
    if !unknown.is_empty() {
        return status(400, "BadRequest", format!("strict decoding error: unknown field(s) {unknown:?}"));
    }
    if eviction["apiVersion"] != "policy/v1"
        || eviction["kind"] != "Eviction"
        || eviction["metadata"]["name"] != pod.as_str()
    {
        return status(400, "BadRequest", format!("not an Eviction of {pod}: {eviction}"));
    }
    let grace_s = eviction["deleteOptions"]["gracePeriodSeconds"].as_i64();
    if guard.refuse_evictions {
        return status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.");
    }
    guard.evictions.push(Eviction { namespace, pod, grace_s });
    axum::Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}))
        .into_response()
}

/// `DELETE` of a pod: the grace period from the body's DeleteOptions (or the query), recorded.
async fn delete_pod(
    c: Shared,
    namespace: String,
    pod: String,
    headers: HeaderMap,
    q: Option<String>,
    body: Bytes,
) -> Response {
    let mut guard = lock(&c);
    guard.log.push(format!("DELETE pod {namespace}/{pod}"));
    if guard.down {
        return status(503, "ServiceUnavailable", "the API server is unavailable");
    }
    if !authorised(&headers) {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let options: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(_) => return status(400, "BadRequest", "the delete options are not JSON"),
        }
    };
    let from_query =
        q.as_deref().unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("gracePeriodSeconds=")?.parse().ok());
    let grace_s = options["gracePeriodSeconds"].as_i64().or(from_query);
    guard.pod_deletes.push(Eviction { namespace: namespace.clone(), pod: pod.clone(), grace_s });
    axum::Json(json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": pod, "namespace": namespace}}))
        .into_response()
}

impl KubeApi {
    /// Starts the double with these namespaces.
    pub(crate) async fn start(namespaces: &[&str]) -> KubeApi {
        let cluster: Shared = Arc::new(Mutex::new(Cluster::default()));
        {
            let mut c = lock(&cluster);
            for ns in namespaces {
                c.put(Kind::Namespace, "", ns, json!({"metadata": {"labels": {"kubernetes.io/metadata.name": ns}}}));
            }
        }
        type Q = Query<BTreeMap<String, String>>;
        let app = Router::new()
            .route(
                "/api/v1/namespaces/{name}",
                get(|State(c): State<Shared>, Path(name): Path<String>, headers: HeaderMap| async move {
                    let guard = lock(&c);
                    if guard.down {
                        return status(503, "ServiceUnavailable", "the API server is unavailable");
                    }
                    if !authorised(&headers) {
                        return status(401, "Unauthorized", "Unauthorized");
                    }
                    match guard.get(Kind::Namespace, "", &name) {
                        Some(n) => axum::Json(n).into_response(),
                        None => status(404, "NotFound", format!("namespaces \"{name}\" not found")),
                    }
                })
                .patch(
                    |State(c): State<Shared>,
                     Path(name): Path<String>,
                     headers: HeaderMap,
                     RawQuery(q): RawQuery,
                     body: Bytes| {
                        apply(c, Kind::Namespace, String::new(), name, headers, q, body)
                    },
                ),
            )
            .route(
                "/api/v1/namespaces",
                get(|State(c): State<Shared>, headers: HeaderMap, Query(q): Q| {
                    list_or_watch(c, Kind::Namespace, headers, q)
                }),
            )
            .route(
                "/api/v1/resourcequotas",
                get(|State(c): State<Shared>, headers: HeaderMap, Query(q): Q| {
                    list_or_watch(c, Kind::Quota, headers, q)
                }),
            )
            .route(
                "/api/v1/namespaces/{ns}/resourcequotas/{name}",
                patch(
                    |State(c): State<Shared>,
                     Path((ns, name)): Path<(String, String)>,
                     headers: HeaderMap,
                     RawQuery(q): RawQuery,
                     body: Bytes| { apply(c, Kind::Quota, ns, name, headers, q, body) },
                )
                .delete(
                    |State(c): State<Shared>, Path((ns, name)): Path<(String, String)>, headers: HeaderMap| {
                        delete(c, Kind::Quota, ns, name, headers)
                    },
                ),
            )
            .route(
                "/apis/resource.k8s.io/v1/resourceclaims",
                get(|State(c): State<Shared>, headers: HeaderMap, Query(q): Q| {
                    list_or_watch(c, Kind::Claim, headers, q)
                }),
            )
            .route(
                "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}",
                patch(
                    |State(c): State<Shared>,
                     Path((ns, name)): Path<(String, String)>,
                     headers: HeaderMap,
                     RawQuery(q): RawQuery,
                     body: Bytes| { apply(c, Kind::Claim, ns, name, headers, q, body) },
                )
                .delete(
                    |State(c): State<Shared>, Path((ns, name)): Path<(String, String)>, headers: HeaderMap| {
                        delete(c, Kind::Claim, ns, name, headers)
                    },
                ),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}",
                axum::routing::delete(
                    |State(c): State<Shared>,
                     Path((ns, name)): Path<(String, String)>,
                     headers: HeaderMap,
                     RawQuery(q): RawQuery,
                     body: Bytes| delete_pod(c, ns, name, headers, q, body),
                ),
            )
            .route(
                "/api/v1/namespaces/{ns}/pods/{name}/eviction",
                post(
                    |State(c): State<Shared>,
                     Path((ns, name)): Path<(String, String)>,
                     headers: HeaderMap,
                     body: Bytes| evict(c, ns, name, headers, body),
                ),
            )
            .fallback(|uri: axum::http::Uri| async move {
                status(404, "NotFound", format!("the double does not serve {uri}"))
            })
            .with_state(cluster.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        KubeApi { url, cluster, _task: task }
    }

    /// A kubeconfig file for the double (written under the system's temporary folder); its path.
    pub(crate) fn kubeconfig(&self) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("tessera-kubeconfig-{}.yaml", uuid::Uuid::new_v4().simple()));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {}\ncontexts:\n- name: double\n  \
             context:\n    cluster: double\n    user: tessera\ncurrent-context: double\nusers:\n- name: tessera\n  user:\n    token: {TOKEN}\n",
            self.url
        );
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        f(&mut lock(&self.cluster))
    }
}
