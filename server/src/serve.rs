//! Starting the control plane: connect and migrate the store, make sure a platform admin exists, serve.
//! `prepare` and `serve` take their inputs (settings, a bound listener, a shutdown future), so tests start the real
//! server on port 0.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use tessera_services::app::{App, AppState};
use tessera_services::auth::secrets::{JOIN_TOKEN_PREFIX, TOKEN_PREFIX, new_token_secret, token_hash};
use tessera_store::{Store, StoreError};

/// What the server needs to start: the one settings struct, from flags, environment, file and defaults
/// (`config.rs`). Its `Debug` shows no secret.
#[derive(Clone, Default)]
pub struct Settings {
    /// Address to listen on (`tessera serve`; a test binds its own listener).
    pub listen: String,
    /// Where the embedded SQLite database and the demo agents' state live.
    pub data_dir: std::path::PathBuf,
    /// `sqlite://PATH` or `postgres://...`.
    pub database_url: String,
    /// Token for the bootstrap admin (`TESSERA_BOOTSTRAP_TOKEN`); generated when absent.
    pub bootstrap_token: Option<String>,
    /// Password for the bootstrap admin (`TESSERA_BOOTSTRAP_PASSWORD`), set when it is created; none when absent.
    pub bootstrap_password: Option<String>,
    /// Join tokens (`tsj_...`) to accept from the first start on, e.g. for agents of a compose file or a
    /// provisioning script; each is good for one join and expires after 30 days.
    pub bootstrap_join_tokens: Vec<String>,
    /// Register a simulated node with a few GPUs of different models (`--demo`).
    pub demo: bool,
    /// Sign-in settings.
    pub auth: tessera_services::auth::AuthConfig,
    /// Telemetry window and retention.
    pub telemetry: TelemetrySettings,
    /// Most connections open at once (`TESSERA_MAX_CONNECTIONS`); default
    /// [`tessera_http::listen::default_max_connections`].
    pub max_connections: Option<usize>,
    /// Most connections open from one client address (`TESSERA_MAX_CONNECTIONS_PER_ADDRESS`; 0: no per-address
    /// caps, for a server behind a proxy); default [`tessera_http::listen::default_per_address`].
    pub max_connections_per_address: Option<usize>,
    /// How long one live telemetry or inbox stream lasts before the client opens another
    /// (`TESSERA_STREAM_LIFETIME_S`, 10 to 3600); default [`tessera_services::streams::STREAM_LIFETIME`].
    pub stream_lifetime: Option<std::time::Duration>,
    /// How long requests are still served after SIGTERM or SIGINT while `/readyz` fails, before the listener closes
    /// (`TESSERA_SHUTDOWN_DELAY_S`, 0 to 300; default 0): the time a load balancer needs to stop sending new work.
    pub shutdown_delay: std::time::Duration,
    /// Webhook delivery (`TESSERA_WEBHOOK_RETRY_CAP_S`: the longest wait between two attempts; which addresses
    /// tenants' endpoints may reach).
    pub webhooks: tessera_services::notifications::Delivery,
    /// The key webhook secrets are sealed with (`[secrets]`, `TESSERA_SECRET_KEY`, `TESSERA_SECRET_OLD_KEYS`).
    pub secrets: tessera_services::sealed::SecretsConfig,
    /// Mail (`[email]`, `TESSERA_SMTP_URL`...); `None`: no mail is sent.
    pub email: Option<tessera_services::email::EmailSettings>,
    /// What the server reaches Kubernetes clusters with (`[kubernetes]`, `TESSERA_KUBECONFIGS`).
    pub kubernetes: tessera_services::state::kubernetes::KubernetesSettings,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use tessera_services::redact::{secret, url};
        f.debug_struct("Settings")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &url(&self.database_url))
            .field("bootstrap_token", &secret(&self.bootstrap_token))
            .field("bootstrap_password", &secret(&self.bootstrap_password))
            .field("bootstrap_join_tokens", &format_args!("[{} redacted]", self.bootstrap_join_tokens.len()))
            .field("demo", &self.demo)
            .field("auth", &self.auth)
            .field("telemetry", &self.telemetry)
            .field("max_connections", &self.max_connections)
            .field("max_connections_per_address", &self.max_connections_per_address)
            .field("stream_lifetime", &self.stream_lifetime)
            .field("shutdown_delay", &self.shutdown_delay)
            .field("webhooks", &self.webhooks)
            .field("secrets", &self.secrets)
            .field("email", &self.email)
            .field("kubernetes", &self.kubernetes)
            .finish()
    }
}

/// How much telemetry is kept.
#[derive(Debug, Clone, Copy)]
pub struct TelemetrySettings {
    /// Seconds of 1 s samples kept in memory for live views.
    pub window_s: u32,
    /// Most device series (GPUs and MIG instances, all nodes together) kept in memory; new series past it are
    /// refused and counted.
    pub max_series: usize,
    /// The shortest interval agents are asked to send their telemetry batches at, in milliseconds (longer while
    /// the server runs late: `tessera_services::state::pace`).
    pub batch_floor_ms: u64,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            window_s: 900,
            max_series: tessera_services::telemetry::DEFAULT_MAX_SERIES,
            batch_floor_ms: tessera_services::state::pace::DEFAULT_FLOOR_MS,
        }
    }
}

pub use tessera_services::auth::BOOTSTRAP_ADMIN;

/// Startup failures.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store could not be opened or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bootstrap token is malformed.
    #[error("the bootstrap token must start with `{TOKEN_PREFIX}` and have at least 32 characters after it")]
    BadBootstrapToken,
    /// The sign-in settings are wrong.
    #[error("{0}")]
    Config(String),
    /// The server failed.
    #[error("server: {0}")]
    Io(#[from] std::io::Error),
}

/// Opens the store, migrates it and, on first start, creates the platform admin `admin`. Returns the state and,
/// when a token was generated, its secret (shown once; only its hash is stored).
pub async fn prepare(settings: &Settings) -> Result<(AppState, Option<String>), ServeError> {
    let auth = tessera_services::auth::Auth::from_config(&settings.auth).map_err(ServeError::Config)?;
    let secrets = tessera_services::sealed::Keyring::from_settings(&settings.secrets, &settings.data_dir)
        .map_err(ServeError::Config)?;
    let store = Store::connect(&settings.database_url).await?;
    store.migrate().await?;
    tessera_services::notifications::seal_secrets(&store, &secrets).await?;
    if let Some(password) = &settings.bootstrap_password
        && password.chars().count() < tessera_services::auth::MIN_PASSWORD
    {
        return Err(ServeError::Config(format!(
            "TESSERA_BOOTSTRAP_PASSWORD needs at least {} characters",
            tessera_services::auth::MIN_PASSWORD
        )));
    }
    let (admin_id, generated) = match store.user_by_name(BOOTSTRAP_ADMIN).await {
        Ok(admin) => (admin.id, None),
        Err(StoreError::NotFound { .. }) => {
            let (secret, generated) = match &settings.bootstrap_token {
                Some(t) if t.starts_with(TOKEN_PREFIX) && t.len() >= TOKEN_PREFIX.len() + 32 => (t.clone(), false),
                Some(_) => return Err(ServeError::BadBootstrapToken),
                None => (new_token_secret(), true),
            };
            let admin = store.create_user(BOOTSTRAP_ADMIN, true, "system").await?;
            store.create_token(&admin.id, "bootstrap", &token_hash(&secret), "system").await?;
            (admin.id, generated.then_some(secret))
        }
        Err(e) => return Err(e.into()),
    };
    // The bootstrap password is for an admin who has none yet: it never overwrites one set since.
    if let Some(password) = &settings.bootstrap_password {
        if store.password_hash(BOOTSTRAP_ADMIN).await?.is_some() {
            tracing::warn!(
                "TESSERA_BOOTSTRAP_PASSWORD ignored: `{BOOTSTRAP_ADMIN}` has a password already (change it in the \
                 portal, or with `tessera user set-password {BOOTSTRAP_ADMIN}`)"
            );
        } else {
            let hash = tessera_services::auth::hash_password(password).map_err(ServeError::Config)?;
            store.set_password_hash(&admin_id, Some(&hash), "system").await?;
        }
    }
    for token in &settings.bootstrap_join_tokens {
        if !token.starts_with(JOIN_TOKEN_PREFIX) || token.len() < 36 {
            return Err(ServeError::Config(
                "TESSERA_BOOTSTRAP_JOIN_TOKENS: each token is tsj_ followed by at least 32 characters".to_string(),
            ));
        }
        let expires = tessera_store::now_ms() + 30 * 24 * 3600 * 1000;
        match store.create_join_token(&token_hash(token), None, expires, "system").await {
            Ok(_) | Err(StoreError::Conflict { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if settings.demo && !store.nodes().await?.iter().any(|n| n.name == crate::demo::DEMO_NODE) {
        store.register_node(crate::demo::DEMO_NODE, &crate::demo::demo_gpus(), "system").await?;
    }
    let limits = tessera_http::listen::Limits::new(
        settings.max_connections.unwrap_or_else(tessera_http::listen::default_max_connections),
        settings.max_connections_per_address,
    );
    let state = AppState(Arc::new(App {
        creates: tessera_services::queue::CreateQueue::start(store.clone()),
        store,
        catalog: tessera_core::Catalog::builtin(),
        auth,
        principals: Default::default(),
        reads: Default::default(),
        hub: Default::default(),
        telemetry: Arc::new(tessera_services::telemetry::Telemetry::new(
            settings.telemetry.window_s,
            settings.telemetry.max_series,
        )),
        node_gpus: Default::default(),
        pace: Arc::new(tessera_services::state::pace::Pace::new(settings.telemetry.batch_floor_ms)),
        connections: limits,
        streams: tessera_services::streams::Streams::new(tessera_services::streams::StreamLimits {
            lifetime: settings.stream_lifetime.unwrap_or(tessera_services::streams::STREAM_LIFETIME),
            ..tessera_services::streams::StreamLimits::for_connections(limits.max_connections, limits.per_address)
        }),
        budgets: Default::default(),
        prepared: Default::default(),
        wait_reads: Default::default(),
        queue_reads: Default::default(),
        webhooks: settings.webhooks.clone(),
        secrets,
        sends: Default::default(),
        email: settings.email.clone(),
        inbox: Default::default(),
        kubernetes: settings.kubernetes.clone(),
        draining: tessera_services::state::draining::Draining::new(settings.shutdown_delay),
    }));
    Ok((state, generated))
}

/// The one-time sign-in links `tessera serve` prints at start, as `(user name, link)`: one for the bootstrap admin
/// while it has no other way into the portal (no password, no identity provider), and with `--demo` one for the
/// demo tenant member. Each start prints fresh links; the ones printed before stop working.
pub async fn start_links(
    state: &AppState,
    demo: bool,
) -> Result<Vec<(String, tessera_services::auth::links::IssuedLink)>, ServeError> {
    use tessera_services::auth::links::{PRINTED_LINK_TTL_MS, issue};
    let mut links = Vec::new();
    if !state.auth.local_accounts {
        return Ok(links);
    }
    let admin = state.store.user_by_name(BOOTSTRAP_ADMIN).await?;
    let locked_out = state.auth.sso.is_none() && state.store.password_hash(BOOTSTRAP_ADMIN).await?.is_none();
    if locked_out {
        links.push((admin.name, issue(&state.store, &admin.id, PRINTED_LINK_TTL_MS, "system").await?));
    }
    if demo {
        let member = crate::demo::member(state).await?;
        links.push((member.name, issue(&state.store, &member.id, PRINTED_LINK_TTL_MS, "system:demo").await?));
    }
    Ok(links)
}

/// How often finished telemetry minutes are written.
pub const TELEMETRY_FLUSH: std::time::Duration = std::time::Duration::from_secs(10);

/// How often active requests are checked for the end of their duration.
pub const EXPIRY_SWEEP: std::time::Duration = std::time::Duration::from_secs(15);

/// How often active slices are checked for idleness (`allocation.idle`).
pub const IDLE_SWEEP: std::time::Duration = std::time::Duration::from_secs(300);

/// How long after an hour's end the sweep keeps the quota standing's hours (past the standing's own settling).
const STANDING_SETTLE_MS: i64 = 180_000;

/// How long one sweep spends keeping allocation hours ([`tessera_services::use_hours::keep`]) at most.
const KEEP_HOURS_BUDGET: std::time::Duration = std::time::Duration::from_millis(300);

/// One pass of the sweep every replica runs each [`EXPIRY_SWEEP`] at `now` (UTC ms): expiries and their reminders,
/// temporary quotas ending, budgets, cohort reclaim, reservations, queued requests placed, allocation hours kept,
/// sign-in records purged (sessions unused for `session_idle`), drain deadlines and node specs. Failures are
/// logged; the next pass tries again.
pub async fn sweep(state: &AppState, now: i64, session_idle: std::time::Duration) {
    match state.store.expire_due(now).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(expired = n, "requests expired"),
        Err(e) => tracing::warn!(error = %e, "expiry sweep failed"),
    }
    match state.store.remind_expiring(now).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(reminded = n, "requests told their end is near"),
        Err(e) => tracing::warn!(error = %e, "expiry reminder sweep failed"),
    }
    match state.store.end_due_quota_requests(now).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(ended = n, "temporary quota increases ended"),
        Err(e) => tracing::warn!(error = %e, "quota end sweep failed"),
    }
    if let Err(e) = tessera_services::budgets::refresh(state).await {
        tracing::warn!(error = %e, "budget sweep failed");
    }
    match tessera_services::cohorts::sweep(state).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(released = n, "borrowed requests reclaimed after their grace period"),
        Err(e) => tracing::warn!(error = %e, "cohort rebalance sweep failed"),
    }
    match tessera_services::reservations::sweep(state).await {
        Ok(s) if s == Default::default() => {}
        Ok(s) => tracing::info!(
            started = s.started,
            activated = s.activated,
            ended = s.ended,
            failed = s.failed,
            "reservations moved on"
        ),
        Err(e) => tracing::warn!(error = %e, "reservation sweep failed"),
    }
    match tessera_services::approvals::place_queued(state, None).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(placed = n, "queued requests placed"),
        Err(e) => tracing::warn!(error = %e, "placing queued requests failed"),
    }
    // A few hours at most a pass while catching up (35 days after a first start), one an hour after that.
    match tessera_services::use_hours::keep(&state.store, now, KEEP_HOURS_BUDGET).await {
        Ok(k) if k.hours == 0 => {}
        Ok(k) => tracing::info!(hours = k.hours, rows = k.rows, behind = k.behind, "allocation hours kept"),
        Err(e) => tracing::warn!(error = %e, "keeping allocation hours failed"),
    }
    let idle_before = now - session_idle.as_millis() as i64;
    let attempts_before = now - tessera_services::auth::LOGIN_TTL_MS;
    if let Err(e) = state.store.purge_sign_in(now, idle_before, attempts_before).await {
        tracing::warn!(error = %e, "session sweep failed");
    }
    match tessera_services::fleet::drain_sweep(state, tessera_store::now_ms()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(requests = n, "drain deadlines ended requests"),
        Err(e) => tracing::warn!(error = %e, "drain sweep failed"),
    }
    if let Err(e) = tessera_services::agents::refresh(state, None).await {
        tracing::warn!(error = %e, "node spec sweep failed");
    }
}

/// Serves the API on `listener` until `shutdown` completes and the shutdown delay has passed (meanwhile `/readyz`
/// fails); meanwhile expires requests whose duration ran out.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let idle = state.auth.session_idle;
    let agents = tessera_services::agents::start_background(&state);
    let telemetry =
        tessera_services::telemetry::start_background(state.store.clone(), state.telemetry.clone(), TELEMETRY_FLUSH);
    let pace = tessera_services::state::pace::start_background(state.pace.clone());
    let webhooks = tessera_services::notifications::start_background(
        state.store.clone(),
        state.webhooks.clone(),
        state.secrets.clone(),
        state.email.clone(),
        state.draining.clone(),
    );
    let (stop_controller, controller_stopped) = tokio::sync::watch::channel(false);
    let controller = state.kubernetes.controller.then(|| {
        tokio::spawn(tessera_controller::run(
            state.store.clone(),
            state.catalog,
            controller_settings(&state.kubernetes),
            controller_stopped,
        ))
    });
    let sweeping = state.clone();
    let sweeper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_SWEEP);
        let mut idle_swept = tokio::time::Instant::now();
        let mut efficiency_recorded: Option<tokio::time::Instant> = None;
        let mut standing_kept: Option<i64> = None;
        loop {
            tick.tick().await;
            let now = tessera_store::now_ms();
            sweep(&sweeping, now, idle).await;
            // The quota standing's hours, kept once each has ended (a replica's first standing then reads the
            // last hour, not 30 days).
            let ended = tessera_core::rollup::Tier::Hour.bucket_of(now - STANDING_SETTLE_MS);
            if standing_kept != Some(ended) {
                match tessera_services::governance::keep_hours(&sweeping, now).await {
                    Ok(()) => standing_kept = Some(ended),
                    Err(e) => tracing::warn!(error = %e, "keeping the quota standing's hours failed"),
                }
            }
            if idle_swept.elapsed() >= IDLE_SWEEP {
                idle_swept = tokio::time::Instant::now();
                match tessera_services::notifications::warn_idle(&sweeping, now).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(told = n, "idle slices told"),
                    Err(e) => tracing::warn!(error = %e, "idle sweep failed"),
                }
            }
            let sample_every =
                std::time::Duration::from_secs(u64::from(tessera_services::efficiency::SAMPLE_MINUTES) * 60);
            if efficiency_recorded.is_none_or(|at| at.elapsed() >= sample_every) {
                efficiency_recorded = Some(tokio::time::Instant::now());
                if let Err(e) = tessera_services::efficiency::record(&sweeping, tessera_store::now_ms()).await {
                    tracing::warn!(error = %e, "efficiency history sample failed");
                }
            }
            match tessera_services::agents::tell_readiness(&sweeping).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(changed = n, "node readiness changed"),
                Err(e) => tracing::warn!(error = %e, "node readiness sweep failed"),
            }
        }
    });
    let state_for_flush = state.clone();
    let limits = state.connections;
    let site = match tessera_portal::Site::default_dir() {
        Some(dir) => match tessera_portal::Site::load(&dir) {
            Ok(Some(site)) => {
                tracing::info!(dir = %dir.display(), bytes = site.size(), "portal: browser half loaded");
                Some(site)
            }
            Ok(None) => {
                tracing::warn!(
                    dir = %dir.display(),
                    "portal: no browser half here (`cargo xtask site` builds it; TESSERA_SITE_DIR names another \
                     folder): pages are rendered on the server only, without their live parts"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "portal: browser half not used: pages are rendered on the server only");
                None
            }
        },
        None => None,
    };
    // From the signal on, `/readyz` fails and sockets and streams end with a reconnect hint; requests are served
    // for the delay more, then the listener closes and what is in flight finishes.
    let draining = state.draining.clone();
    let shutdown = async move {
        shutdown.await;
        draining.begin();
        tracing::info!(
            delay_s = draining.delay().as_secs(),
            "shutting down: /readyz answers 503; the listener closes after the delay"
        );
        tokio::time::sleep(draining.delay()).await;
    };
    let app = tessera_http::router(state, |api| tessera_portal::routes(api, site));
    let served = tessera_http::listen::serve(listener, app, limits, shutdown).await;
    sweeper.abort();
    // The controller gives its lease up, so that another replica takes over at once.
    let _ = stop_controller.send(true);
    if let Some(controller) = controller
        && tokio::time::timeout(std::time::Duration::from_secs(5), controller).await.is_err()
    {
        tracing::warn!("the Kubernetes controller did not stop within 5 s");
    }
    // Delivery ends after its round (it stops claiming once draining began): nothing it claimed is left for a
    // lease to free.
    let delivery = webhooks.abort_handle();
    if tokio::time::timeout(std::time::Duration::from_secs(15), webhooks).await.is_err() {
        delivery.abort();
        tracing::warn!("webhook and mail delivery did not finish its round within 15 s; stopped");
    }
    agents.abort();
    telemetry.abort();
    pace.abort();
    if let Err(e) = tessera_services::telemetry::flush_all(&state_for_flush.store, &state_for_flush.telemetry).await {
        tracing::warn!(error = %e, "cannot write the last telemetry minutes");
    }
    served?;
    Ok(())
}

/// The controller's settings from the server's: this replica is named after its host (a pod's name) and a random
/// id.
fn controller_settings(k: &tessera_services::state::kubernetes::KubernetesSettings) -> tessera_controller::Settings {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "tessera".to_string());
    let holder = format!("{host}-{}", uuid::Uuid::new_v4().simple());
    tessera_controller::Settings {
        tick: k.timing.tick,
        resync: k.timing.resync,
        lease_ttl: k.timing.lease_ttl,
        max_backoff: k.timing.max_backoff,
        eviction_grace_s: i64::from(k.eviction_grace_s),
        eviction_refused_for: std::time::Duration::from_secs(u64::from(k.eviction_refused_s)),
        ..tessera_controller::Settings::new(k.kubeconfigs.clone(), k.in_cluster, holder)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn debug_output_never_shows_a_secret() {
        let settings = super::Settings {
            database_url: "postgres://tessera:db-password@db/tessera".into(),
            bootstrap_token: Some("tsr_bootstrap-secret".into()),
            bootstrap_password: Some("admin-password".into()),
            bootstrap_join_tokens: vec!["tsj_join-secret".into()],
            secrets: tessera_services::sealed::SecretsConfig {
                key: Some("c2VhbGluZy1rZXk=".into()),
                old_keys: vec!["b2xkLWtleQ==".into()],
            },
            auth: tessera_services::auth::AuthConfig {
                oidc: Some(tessera_services::auth::OidcConfig {
                    client_secret: Some("client-secret".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let text = format!("{settings:?}");
        for secret in [
            "db-password",
            "bootstrap-secret",
            "admin-password",
            "join-secret",
            "client-secret",
            "c2VhbGluZy1rZXk",
            "b2xkLWtleQ",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("postgres://tessera:***@db/tessera") && text.contains("Some(<redacted>)"), "{text}");
    }
}
