//! What the integration tests share: a fresh database on either backend ([`TestDb`]), the macro that runs a test
//! on both ([`on_both_backends`]), the server started in this process on port 0 ([`TestApp`], built with
//! [`TestApp::on`] or [`TestApp::sqlite`]), and the fixtures every area needs (users with tokens, tenants, quotas).
//!
//! Tests that must see the released binary as it runs (logging, signals, the agent, Prometheus) start it as a
//! process instead (`agents::Server`).

use std::path::PathBuf;

use reqwest::{Client, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tessera_server::app::AppState;
use tessera_server::auth::AuthConfig;
use tessera_server::http::auth::{new_token_secret, token_hash};
use tessera_server::serve::{Settings, prepare, serve};
use tessera_server::store::{Role, Store};

/// A store on a fresh database, dropped with it by [`TestDb::close`].
pub(crate) struct TestDb {
    pub(crate) store: Store,
    /// The database's URL, for a server on the same database.
    pub(crate) url: String,
    drop_pg: Option<(String, String)>,
    sqlite_file: Option<PathBuf>,
}

impl TestDb {
    pub(crate) async fn close(self) {
        self.store.close().await;
        if let Some((admin, name)) = self.drop_pg
            && let Ok(pool) = sqlx::PgPool::connect(&admin).await
        {
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).execute(&pool).await;
        }
        if let Some(f) = self.sqlite_file {
            remove_sqlite(&f);
        }
    }
}

fn temp_sqlite() -> PathBuf {
    std::env::temp_dir().join(format!("tessera-test-{}.db", uuid::Uuid::now_v7().simple()))
}

fn remove_sqlite(file: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// A migrated store on a fresh SQLite file.
pub(crate) async fn sqlite() -> TestDb {
    let file = temp_sqlite();
    let url = format!("sqlite://{}", file.display());
    let store = Store::connect(&url).await.expect("sqlite");
    store.migrate().await.expect("migrate");
    TestDb { store, url, drop_pg: None, sqlite_file: Some(file) }
}

/// `url` with its database name replaced by `name`.
pub(crate) fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// A fresh PostgreSQL database for servers started by a test (`None` when `TESSERA_TEST_POSTGRES_URL` is not set);
/// dropped by [`ScratchDb::drop`].
pub(crate) struct ScratchDb {
    pool: sqlx::PgPool,
    name: String,
    /// Its URL.
    pub(crate) url: String,
}

impl ScratchDb {
    /// A fresh, empty PostgreSQL database.
    pub(crate) async fn create(what: &str) -> Option<ScratchDb> {
        Self::made(what, false).await
    }

    /// A fresh PostgreSQL database with every migration applied: a copy of [`migrated_template`], which costs a
    /// fifth of a second where migrating a database costs one and a half (37 migrations, about 190 relations), for
    /// each of the suite's 125 PostgreSQL tests.
    pub(crate) async fn create_migrated(what: &str) -> Option<ScratchDb> {
        Self::made(what, true).await
    }

    async fn made(what: &str, migrated: bool) -> Option<ScratchDb> {
        let Ok(admin) = std::env::var("TESSERA_TEST_POSTGRES_URL") else {
            eprintln!("TESSERA_TEST_POSTGRES_URL is not set: {what} skipped");
            return None;
        };
        let pool = sqlx::PgPool::connect(&admin).await.expect("TESSERA_TEST_POSTGRES_URL is set but unreachable");
        let name = format!("tessera_test_{}", uuid::Uuid::now_v7().simple());
        if !migrated {
            sqlx::query(&format!("CREATE DATABASE {name}")).execute(&pool).await.expect("create test database");
            return Some(ScratchDb { url: with_database(&admin, &name), pool, name });
        }
        let template = migrated_template(&pool, &admin).await;
        // A copy fails while anything is connected to its template: only the moment its builder renames it.
        let mut tries = 0;
        while let Err(e) = sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE {template}")).execute(&pool).await {
            tries += 1;
            assert!(tries < 50, "copy the migrated template database {template}: {e}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Some(ScratchDb { url: with_database(&admin, &name), pool, name })
    }

    pub(crate) async fn drop(self) {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).execute(&self.pool).await;
    }
}

/// The name of a database with every PostgreSQL migration applied and nothing else, made once for a set of
/// migrations (its name carries their digest; several test processes may ask at once: each builds under a name of
/// its own and the first rename wins). The suite's own databases are copies of it; the migrations themselves run
/// where a test asks for an empty database ([`ScratchDb::create`]: the upgrade tests, the replicas' tests) and
/// here, on every run on a fresh PostgreSQL server, as CI's is.
async fn migrated_template(pool: &sqlx::PgPool, admin: &str) -> String {
    static TEMPLATE: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TEMPLATE
        .get_or_init(|| async {
            use std::hash::{Hash, Hasher};
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/postgres");
            let mut files: Vec<PathBuf> =
                std::fs::read_dir(&dir).expect("migrations").map(|e| e.expect("entry").path()).collect();
            files.sort();
            let mut digest = std::hash::DefaultHasher::new();
            for f in &files {
                f.file_name().hash(&mut digest);
                std::fs::read(f).expect("migration").hash(&mut digest);
            }
            let name = format!("tessera_test_template_{:016x}", digest.finish());
            let exists = |pool: sqlx::PgPool, name: String| async move {
                sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_database WHERE datname = $1")
                    .bind(name)
                    .fetch_one(&pool)
                    .await
                    .expect("list databases")
                    > 0
            };
            if exists(pool.clone(), name.clone()).await {
                return name;
            }
            let building = format!("tessera_test_building_{}", uuid::Uuid::now_v7().simple());
            sqlx::query(&format!("CREATE DATABASE {building}")).execute(pool).await.expect("create template database");
            let store = Store::connect(&with_database(admin, &building)).await.expect("postgres");
            store.migrate().await.expect("migrate the template database");
            store.close().await;
            for _ in 0..50 {
                let Err(e) = sqlx::query(&format!("ALTER DATABASE {building} RENAME TO {name}")).execute(pool).await
                else {
                    return name;
                };
                if exists(pool.clone(), name.clone()).await {
                    // Another process made it meanwhile.
                    let _ =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {building} WITH (FORCE)")).execute(pool).await;
                    return name;
                }
                // A connection of the store just closed may linger a moment.
                eprintln!("renaming the template database {building}: {e}; again");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            panic!("cannot rename the template database {building} to {name}")
        })
        .await
        .clone()
}

/// A migrated store on a fresh PostgreSQL database (`None` when `TESSERA_TEST_POSTGRES_URL` is not set).
pub(crate) async fn postgres() -> Option<TestDb> {
    let scratch = ScratchDb::create_migrated("the PostgreSQL half of this test").await?;
    scratch.pool.close().await;
    let admin = std::env::var("TESSERA_TEST_POSTGRES_URL").expect("set");
    let store = Store::connect(&scratch.url).await.expect("postgres");
    store.migrate().await.expect("migrate");
    Some(TestDb { store, url: scratch.url, drop_pg: Some((admin, scratch.name)), sqlite_file: None })
}

/// Runs each named test on a fresh SQLite database and on a fresh PostgreSQL one (when `TESSERA_TEST_POSTGRES_URL`
/// is set; CI always sets it). Each test is `async fn name(db: &TestDb)`; with `|db| expr;` first, it is given
/// `expr` instead (the store suite passes `&db.store`).
macro_rules! on_both_backends {
    (|$db:ident| $arg:expr; $($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let $db = crate::harness::sqlite().await;
                    super::$name($arg).await;
                    $db.close().await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some($db) = crate::harness::postgres().await {
                        super::$name($arg).await;
                        $db.close().await;
                    }
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        crate::harness::on_both_backends!(|db| &db; $($name),*);
    };
}
pub(crate) use on_both_backends;

/// The key webhook secrets are sealed with in tests (32 bytes in base64).
pub(crate) const TEST_SECRET_KEY: &str = "dGVzc2VyYS10ZXN0LXNlYWxpbmcta2V5LTMyLWJ5dGU=";

/// How a [`TestApp`] is started.
pub(crate) struct AppBuilder {
    database_url: Option<String>,
    demo: bool,
    auto_layout: bool,
    auth: AuthConfig,
    bootstrap_password: Option<String>,
    listener: Option<tokio::net::TcpListener>,
    email: Option<tessera_server::services::email::EmailSettings>,
    strict_webhooks: bool,
    stream_lifetime: Option<std::time::Duration>,
    webhook_allow: Vec<String>,
    kubernetes: tessera_server::services::state::kubernetes::KubernetesSettings,
}

impl AppBuilder {
    /// The Kubernetes controller reacts this fast: compares every `tick`, a lease of `lease`, backs off up to `backoff`.
    pub(crate) fn kube_timing(mut self, tick_ms: u64, lease_ms: u64, backoff_ms: u64) -> AppBuilder {
        self.kubernetes.timing = tessera_server::services::state::kubernetes::ControllerTiming {
            tick: std::time::Duration::from_millis(tick_ms),
            resync: std::time::Duration::from_secs(300),
            lease_ttl: std::time::Duration::from_millis(lease_ms),
            max_backoff: std::time::Duration::from_millis(backoff_ms),
        };
        self
    }

    /// A pod whose eviction is refused this long is deleted (with the grace period).
    pub(crate) fn eviction_refused_s(mut self, seconds: u32) -> AppBuilder {
        self.kubernetes.eviction_refused_s = seconds;
        self
    }

    /// The server's database (`sqlite://PATH` or `postgres://...`), which the test keeps and removes.
    pub(crate) fn database_url(mut self, url: &str) -> AppBuilder {
        self.database_url = Some(url.to_string());
        self
    }

    /// This server runs no Kubernetes controller (a test runs its own replicas of it).
    pub(crate) fn without_controller(mut self) -> AppBuilder {
        self.kubernetes.controller = false;
        self
    }

    /// The server's settings name these kubeconfigs (`[kubernetes.kubeconfigs]`).
    pub(crate) fn kubeconfigs(mut self, named: &[(&str, &str)]) -> AppBuilder {
        self.kubernetes.kubeconfigs = named.iter().map(|(n, p)| (n.to_string(), p.into())).collect();
        self
    }

    /// Tenants' webhooks may not reach internal addresses, as by default in `tessera serve` (the other tests' receivers
    /// listen on 127.0.0.1, which only `TESSERA_WEBHOOK_ALLOW_INTERNAL` allows).
    pub(crate) fn strict_webhooks(mut self) -> AppBuilder {
        self.strict_webhooks = true;
        self
    }

    /// Streams last this long (`TESSERA_STREAM_LIFETIME_S`).
    pub(crate) fn stream_lifetime(mut self, lifetime: std::time::Duration) -> AppBuilder {
        self.stream_lifetime = Some(lifetime);
        self
    }

    /// Tenants' webhooks may reach these networks and host names besides the internet (`TESSERA_WEBHOOK_ALLOW`);
    /// implies [`AppBuilder::strict_webhooks`].
    pub(crate) fn webhook_allow(mut self, allow: &[&str]) -> AppBuilder {
        self.strict_webhooks = true;
        self.webhook_allow = allow.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Send mail with these settings.
    pub(crate) fn email(mut self, email: tessera_server::services::email::EmailSettings) -> AppBuilder {
        self.email = Some(email);
        self
    }

    /// No demo fleet (the default has the demo node, its GPUs and its catalog).
    pub(crate) fn bare(mut self) -> AppBuilder {
        self.demo = false;
        self
    }

    /// Auto-layout on for every MIG GPU of the demo node, so approval reshapes GPUs without a layout approval.
    pub(crate) fn auto_layout(mut self) -> AppBuilder {
        self.auto_layout = true;
        self
    }

    /// Sign-in settings (an identity provider, session lifetimes).
    pub(crate) fn auth(mut self, auth: AuthConfig) -> AppBuilder {
        self.auth = auth;
        self
    }

    /// The bootstrap admin may also sign in with this password.
    pub(crate) fn bootstrap_password(mut self, password: &str) -> AppBuilder {
        self.bootstrap_password = Some(password.to_string());
        self
    }

    /// Serve on this listener (when the server's address must be known before it starts, e.g. by a provider).
    pub(crate) fn listener(mut self, listener: tokio::net::TcpListener) -> AppBuilder {
        self.listener = Some(listener);
        self
    }

    /// Prepares the state as `tessera serve` does (migrations, bootstrap, demo data) and serves it on a task.
    pub(crate) async fn start(self) -> TestApp {
        let (database_url, sqlite_file) = match self.database_url {
            Some(url) => (url, None),
            None => {
                let file = temp_sqlite();
                (format!("sqlite://{}", file.display()), Some(file))
            }
        };
        let admin = new_token_secret();
        let settings = Settings {
            database_url,
            bootstrap_token: Some(admin.clone()),
            bootstrap_password: self.bootstrap_password,
            demo: self.demo,
            auth: self.auth,
            email: self.email,
            stream_lifetime: self.stream_lifetime,
            webhooks: {
                let mut reach = tessera_server::services::outbound::Reach {
                    allow_internal: !self.strict_webhooks,
                    ..Default::default()
                };
                reach.allow(self.webhook_allow.iter().map(String::as_str)).expect("allow list");
                tessera_server::services::notifications::Delivery { reach, ..Default::default() }
            },
            // One key for every server of a test, as replicas of one deployment share theirs.
            secrets: tessera_server::sealed::SecretsConfig { key: Some(TEST_SECRET_KEY.to_string()), old_keys: vec![] },
            kubernetes: self.kubernetes,
            ..Settings::default()
        };
        let (state, generated) = prepare(&settings).await.expect("prepare");
        assert!(generated.is_none(), "the given bootstrap token is used, not a new one");
        if self.auto_layout {
            for node in state.store.nodes().await.expect("nodes") {
                for gpu in node.gpus.iter().filter(|g| g.mig_enabled) {
                    state.store.set_auto_layout(&gpu.id, true, "test").await.expect("auto-layout");
                }
            }
        }
        let listener = match self.listener {
            Some(l) => l,
            None => tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind"),
        };
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(state.clone(), listener, async {
            let _ = rx.await;
        }));
        TestApp { base, admin, store: state.store.clone(), state, client: Client::new(), sqlite_file, _shutdown: tx }
    }
}

/// The server running in this process, stopped when dropped.
pub(crate) struct TestApp {
    /// `http://127.0.0.1:<port>`.
    pub(crate) base: String,
    /// The bootstrap admin's API token.
    pub(crate) admin: String,
    pub(crate) state: AppState,
    pub(crate) store: Store,
    pub(crate) client: Client,
    sqlite_file: Option<PathBuf>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(f) = &self.sqlite_file {
            remove_sqlite(f);
        }
    }
}

impl TestApp {
    /// A server on `db`.
    pub(crate) fn on(db: &TestDb) -> AppBuilder {
        AppBuilder { database_url: Some(db.url.clone()), ..TestApp::sqlite() }
    }

    /// A server on a SQLite file of its own, removed when the server is dropped.
    pub(crate) fn sqlite() -> AppBuilder {
        AppBuilder {
            database_url: None,
            demo: true,
            auto_layout: false,
            auth: AuthConfig::default(),
            bootstrap_password: None,
            listener: None,
            email: None,
            strict_webhooks: false,
            stream_lifetime: None,
            webhook_allow: Vec::new(),
            kubernetes: Default::default(),
        }
    }

    /// A request to `path`, as `token` when given.
    pub(crate) fn call(&self, method: Method, path: &str, token: Option<&str>) -> RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.base));
        match token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Calls the API as `token` (with a JSON body when given); the status and the body (JSON, or else its text).
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut r = self.call(method, path, Some(token));
        if let Some(b) = body {
            r = r.json(&b);
        }
        answer(r).await
    }

    pub(crate) async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.send(Method::GET, path, token, None).await
    }

    /// Runs the `tessera` binary against this server as `token` (`TESSERA_SERVER`, `TESSERA_TOKEN`): its exit code
    /// and standard output.
    pub(crate) async fn cli(&self, token: &str, args: &[&str]) -> (Option<i32>, String) {
        let (base, token) = (self.base.clone(), token.to_string());
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(&args)
                .env("TESSERA_SERVER", base)
                .env("TESSERA_TOKEN", token)
                .output()
                .expect("run tessera");
            (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned())
        })
        .await
        .expect("join")
    }

    /// The ids of the fleet's GPUs of `model` in MIG mode.
    pub(crate) async fn mig_gpus(&self, model: &str) -> Vec<String> {
        let (_, nodes) = self.get("/api/v1/nodes", &self.admin).await;
        nodes
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|n| n["gpus"].as_array().cloned().unwrap_or_default())
            .filter(|g| g["model"] == model && g["mig_enabled"] == true)
            .filter_map(|g| g["id"].as_str().map(str::to_string))
            .collect()
    }

    /// The node (as `GET /api/v1/nodes` lists it) of the GPU `gpu`, marked as heard from by this replica: its
    /// GPUs count as on a ready node.
    pub(crate) async fn heard_node_of(&self, gpu: &str) -> Value {
        let (_, nodes) = self.get("/api/v1/nodes", &self.admin).await;
        let node = nodes
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["gpus"].as_array().is_some_and(|g| g.iter().any(|g| g["id"] == gpu)))
            .cloned()
            .expect("the GPU's node");
        self.state.hub.seen(node["id"].as_str().expect("node id"));
        node
    }

    /// Cordons every GPU of `model` in MIG mode but the first: one takes new work.
    pub(crate) async fn one_gpu_of(&self, model: &str) {
        let gpus = self.mig_gpus(model).await;
        assert!(!gpus.is_empty(), "no {model} in MIG mode");
        for g in &gpus[1..] {
            let (s, b) = self.send(Method::POST, &format!("/api/v1/gpus/{g}/cordon"), &self.admin, None).await;
            assert_eq!(s, StatusCode::OK, "{b}");
        }
    }

    /// A user with an API token and these memberships: (user id, token secret).
    pub(crate) async fn user(&self, name: &str, memberships: &[(&str, Role)]) -> (String, String) {
        user_with_token(&self.store, name, memberships).await
    }

    /// A plain member of `tenant`; their token secret.
    pub(crate) async fn member(&self, name: &str, tenant: &str) -> String {
        self.user(name, &[(tenant, Role::Member)]).await.1
    }

    /// A tenant created by the admin through the API (with `extra` fields beside its name); its id.
    pub(crate) async fn tenant(&self, name: &str, extra: Value) -> String {
        let mut body = json!({ "name": name });
        body.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
        let (s, t) = self.send(Method::POST, "/api/v1/tenants", &self.admin, Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        t["id"].as_str().expect("id").to_string()
    }

    /// Sets `tenant`'s limits as the admin; the answer, for the test to judge.
    pub(crate) async fn quota(&self, tenant: &str, limits: Value) -> Response {
        self.call(Method::PUT, &format!("/api/v1/tenants/{tenant}/quotas"), Some(&self.admin))
            .json(&json!({ "limits": limits }))
            .send()
            .await
            .expect("send")
    }
}

/// A user with an API token and these memberships, written straight to `store`: (user id, token secret).
pub(crate) async fn user_with_token(store: &Store, name: &str, memberships: &[(&str, Role)]) -> (String, String) {
    let u = store.create_user(name, false, "test").await.expect("user");
    for (tenant, role) in memberships {
        store.set_membership(&u.id, tenant, *role, "test").await.expect("member");
    }
    let secret = new_token_secret();
    store.create_token(&u.id, "test", &token_hash(&secret), "test").await.expect("token");
    (u.id, secret)
}

/// Sends `r`: the status and the body (JSON, or else its text).
pub(crate) async fn answer(r: RequestBuilder) -> (StatusCode, Value) {
    let r = r.send().await.expect("send");
    let status = r.status();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}
