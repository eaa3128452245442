//! Server settings. Each comes from, in order: a command-line flag, its `TESSERA_*` environment variable (clap reads
//! both), the TOML file named by `--config` / `TESSERA_CONFIG`, and finally the default.
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! data_dir = "/var/lib/tessera"
//! database_url = "postgres://tessera@db/tessera"
//! demo = false
//!
//! [webhooks]
//! allow_internal = false                             # TESSERA_WEBHOOK_ALLOW_INTERNAL
//! allow = ["10.1.2.0/24", "hooks.internal.example"]  # TESSERA_WEBHOOK_ALLOW, comma-separated
//!
//! [secrets]
//! key = "base64 of 32 bytes"                         # TESSERA_SECRET_KEY
//! old_keys = []                                      # TESSERA_SECRET_OLD_KEYS, comma-separated
//!
//! [kubernetes.kubeconfigs]                            # TESSERA_KUBECONFIGS="east=/etc/...,west=/etc/..."
//! east = "/etc/tessera/kube/east.kubeconfig"          # clusters name these; the files are never stored or shown
//! # [kubernetes] eviction_grace_s = 30                # pods of a claim whose allocation ended get this long
//! # [kubernetes] eviction_refused_s = 300             # a pod whose eviction is refused this long is deleted
//! # [kubernetes] controller = true                    # false: this replica never runs the controller
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// Settings as a TOML file gives them; every field optional.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Address to listen on.
    pub listen: Option<String>,
    /// Data directory (the embedded SQLite database lives here).
    pub data_dir: Option<PathBuf>,
    /// `sqlite://...` or `postgres://...`.
    pub database_url: Option<String>,
    /// Register the demo node.
    pub demo: Option<bool>,
    /// Sign-in: local accounts, sessions, single sign-on (see [`tessera_services::auth`]).
    #[serde(default)]
    pub auth: tessera_services::auth::AuthConfig,
    /// Mail notifications: the SMTP server, the sender, the portal's address for links.
    #[serde(default)]
    pub email: tessera_services::email::EmailConfig,
    /// Where tenants' webhooks may connect beyond the internet.
    #[serde(default)]
    pub webhooks: WebhooksConfig,
    /// The key webhook secrets are sealed with (see [`tessera_services::sealed`]).
    #[serde(default)]
    pub secrets: tessera_services::sealed::SecretsConfig,
    /// Kubeconfigs of the clusters the server governs (see [`tessera_services::state::kubernetes`]).
    #[serde(default)]
    pub kubernetes: tessera_services::state::kubernetes::KubernetesConfig,
}

/// The `[webhooks]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Tenants' endpoints may reach any address.
    pub allow_internal: Option<bool>,
    /// Networks (CIDR form or single addresses) and host names tenants' endpoints may reach besides the internet.
    #[serde(default)]
    pub allow: Vec<String>,
}

impl std::fmt::Debug for FileConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileConfig")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &self.database_url.as_deref().map(tessera_services::redact::url))
            .field("demo", &self.demo)
            .field("auth", &self.auth)
            .field("email", &self.email)
            .field("webhooks", &self.webhooks)
            .field("secrets", &self.secrets)
            .field("kubernetes", &self.kubernetes)
            .finish()
    }
}

/// Settings as flags and environment give them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen` / `TESSERA_LISTEN`.
    pub listen: Option<String>,
    /// `--data-dir` / `TESSERA_DATA_DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--database-url` / `TESSERA_DATABASE_URL`.
    pub database_url: Option<String>,
    /// `--demo` (only ever turns it on).
    pub demo: bool,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("listen", &self.listen)
            .field("data_dir", &self.data_dir)
            .field("database_url", &self.database_url.as_deref().map(tessera_services::redact::url))
            .field("demo", &self.demo)
            .finish()
    }
}

/// Reads a TOML settings file.
pub fn load(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `$XDG_DATA_HOME/tessera`, else `$HOME/.local/share/tessera`, else `./tessera-data`.
pub fn default_data_dir() -> PathBuf {
    let from = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from);
    from("XDG_DATA_HOME")
        .map(|d| d.join("tessera"))
        .or_else(|| from("HOME").map(|h| h.join(".local/share/tessera")))
        .unwrap_or_else(|| PathBuf::from("tessera-data"))
}

/// The settings `tessera serve` runs with: flags (and their `TESSERA_*` variables) over the file over the
/// defaults, and the variables that only the environment gives (`TESSERA_BOOTSTRAP_TOKEN`,
/// `TESSERA_BOOTSTRAP_PASSWORD`, `TESSERA_BOOTSTRAP_JOIN_TOKENS` comma-separated, `TESSERA_MAX_CONNECTIONS`,
/// `TESSERA_MAX_CONNECTIONS_PER_ADDRESS`, `TESSERA_STREAM_LIFETIME_S`, `TESSERA_SHUTDOWN_DELAY_S`, `TESSERA_TELEMETRY_MAX_SERIES`, `TESSERA_TELEMETRY_BATCH_FLOOR_MS`, and the
/// sign-in variables of [`with_auth_env`]) read through `env`. `TESSERA_WEBHOOK_ALLOW_INTERNAL`,
/// `TESSERA_WEBHOOK_ALLOW` (comma-separated), `TESSERA_SECRET_KEY`, `TESSERA_SECRET_OLD_KEYS` (comma-separated) and
/// `TESSERA_KUBECONFIGS` (`name=path`, comma-separated) win over the file's `[webhooks]`, `[secrets]` and
/// `[kubernetes]`; `KUBERNETES_SERVICE_HOST` (set in every pod) says the in-cluster service account is there.
pub fn resolve(
    flags: Overrides,
    file: FileConfig,
    env: impl Fn(&str) -> Option<String>,
) -> Result<crate::serve::Settings, String> {
    let data_dir = flags.data_dir.or(file.data_dir).unwrap_or_else(default_data_dir);
    let database_url = flags
        .database_url
        .or(file.database_url)
        .unwrap_or_else(|| format!("sqlite://{}", data_dir.join("tessera.db").display()));
    let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    let max_connections = match env("TESSERA_MAX_CONNECTIONS") {
        Some(v) => Some(
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or("TESSERA_MAX_CONNECTIONS must be a whole number above 0")?,
        ),
        None => None,
    };
    let mut telemetry = crate::serve::TelemetrySettings::default();
    if let Some(v) = env("TESSERA_TELEMETRY_MAX_SERIES") {
        telemetry.max_series = v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000_000).contains(n))
            .ok_or("TESSERA_TELEMETRY_MAX_SERIES must be a whole number from 1 to 10000000")?;
    }
    if let Some(v) = env("TESSERA_TELEMETRY_BATCH_FLOOR_MS") {
        telemetry.batch_floor_ms = v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| (100..=tessera_services::state::pace::MAX_INTERVAL_MS).contains(n))
            .ok_or("TESSERA_TELEMETRY_BATCH_FLOOR_MS must be a whole number from 100 to 30000")?;
    }
    let max_connections_per_address = match env("TESSERA_MAX_CONNECTIONS_PER_ADDRESS") {
        Some(v) => Some(
            v.trim()
                .parse::<usize>()
                .ok()
                .ok_or("TESSERA_MAX_CONNECTIONS_PER_ADDRESS must be a whole number (0: no per-address cap)")?,
        ),
        None => None,
    };
    let stream_lifetime = match env("TESSERA_STREAM_LIFETIME_S") {
        Some(v) => Some(std::time::Duration::from_secs(
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| (10..=3600).contains(n))
                .ok_or("TESSERA_STREAM_LIFETIME_S must be a whole number of seconds from 10 to 3600")?,
        )),
        None => None,
    };
    let shutdown_delay = match env("TESSERA_SHUTDOWN_DELAY_S") {
        Some(v) => std::time::Duration::from_secs(
            v.trim()
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= tessera_services::state::draining::MAX_DELAY.as_secs())
                .ok_or("TESSERA_SHUTDOWN_DELAY_S must be a whole number of seconds from 0 to 300")?,
        ),
        None => std::time::Duration::ZERO,
    };
    let mut webhooks = tessera_services::notifications::Delivery::default();
    if let Some(v) = env("TESSERA_WEBHOOK_RETRY_CAP_S") {
        webhooks.retry_cap_ms = v
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=86_400).contains(n))
            .ok_or("TESSERA_WEBHOOK_RETRY_CAP_S must be a whole number of seconds from 1 to 86400")?
            * 1000;
    }
    webhooks.reach.allow_internal = file.webhooks.allow_internal.unwrap_or(false);
    if let Some(v) = env("TESSERA_WEBHOOK_ALLOW_INTERNAL") {
        webhooks.reach.allow_internal = match v.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => return Err("TESSERA_WEBHOOK_ALLOW_INTERNAL must be true or false".into()),
        };
    }
    match env("TESSERA_WEBHOOK_ALLOW") {
        Some(v) => webhooks.reach.allow(v.split(','))?,
        None => webhooks.reach.allow(file.webhooks.allow.iter().map(String::as_str))?,
    }
    let list = |v: String| v.split(',').map(str::trim).filter(|k| !k.is_empty()).map(str::to_string).collect();
    let secrets = tessera_services::sealed::SecretsConfig {
        key: env("TESSERA_SECRET_KEY").or(file.secrets.key),
        old_keys: env("TESSERA_SECRET_OLD_KEYS").map(list).unwrap_or(file.secrets.old_keys),
    };
    let kubernetes = tessera_services::state::kubernetes::KubernetesSettings {
        kubeconfigs: match env("TESSERA_KUBECONFIGS") {
            Some(v) => tessera_services::state::kubernetes::parse_kubeconfigs(&v)?,
            None => file.kubernetes.kubeconfigs,
        },
        in_cluster: env("KUBERNETES_SERVICE_HOST").is_some(),
        eviction_grace_s: file
            .kubernetes
            .eviction_grace_s
            .unwrap_or(tessera_services::state::kubernetes::DEFAULT_EVICTION_GRACE_S),
        eviction_refused_s: file
            .kubernetes
            .eviction_refused_s
            .unwrap_or(tessera_services::state::kubernetes::DEFAULT_EVICTION_REFUSED_S),
        timing: Default::default(),
        controller: file.kubernetes.controller.unwrap_or(true),
    };
    let listen = flags.listen.or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let email = file.email.resolve(env, &listen)?;
    Ok(crate::serve::Settings {
        listen,
        data_dir,
        database_url,
        demo: flags.demo || file.demo.unwrap_or(false),
        auth: with_auth_env(file.auth, env),
        bootstrap_token: env("TESSERA_BOOTSTRAP_TOKEN"),
        bootstrap_password: env("TESSERA_BOOTSTRAP_PASSWORD"),
        bootstrap_join_tokens: env("TESSERA_BOOTSTRAP_JOIN_TOKENS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect(),
        telemetry,
        max_connections,
        max_connections_per_address,
        stream_lifetime,
        shutdown_delay,
        webhooks,
        secrets,
        email,
        kubernetes,
    })
}

/// The process's environment, as [`resolve`] reads it.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Folds the sign-in environment variables into the `[auth]` table: `TESSERA_LOCAL_ACCOUNTS` (`true`/`false`),
/// `TESSERA_OIDC_ISSUER`, `TESSERA_OIDC_CLIENT_ID`, `TESSERA_OIDC_CLIENT_SECRET`, `TESSERA_OIDC_REDIRECT_URL`,
/// `TESSERA_OIDC_API_AUDIENCE`. The issuer variable alone is enough to turn single sign-on on (with the other
/// settings from the file or their defaults).
pub fn with_auth_env(
    mut auth: tessera_services::auth::AuthConfig,
    env: impl Fn(&str) -> Option<String>,
) -> tessera_services::auth::AuthConfig {
    if let Some(v) = env("TESSERA_LOCAL_ACCOUNTS") {
        auth.local_accounts = Some(!matches!(v.to_ascii_lowercase().as_str(), "false" | "0" | "no" | "off"));
    }
    let issuer = env("TESSERA_OIDC_ISSUER");
    if issuer.is_some() && auth.oidc.is_none() {
        auth.oidc = Some(tessera_services::auth::OidcConfig::default());
    }
    if let Some(o) = auth.oidc.as_mut() {
        let set = |field: &mut String, name: &str| {
            if let Some(v) = env(name) {
                *field = v;
            }
        };
        set(&mut o.issuer, "TESSERA_OIDC_ISSUER");
        set(&mut o.client_id, "TESSERA_OIDC_CLIENT_ID");
        set(&mut o.redirect_url, "TESSERA_OIDC_REDIRECT_URL");
        if let Some(v) = env("TESSERA_OIDC_CLIENT_SECRET") {
            o.client_secret = Some(v);
        }
        if let Some(v) = env("TESSERA_OIDC_API_AUDIENCE") {
            o.api_audience = Some(v);
        }
    }
    auth
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_string())
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_defaults_and_the_environment_adds_the_rest() {
        let file = FileConfig {
            listen: Some("0.0.0.0:9000".into()),
            data_dir: Some("/srv/tessera".into()),
            demo: Some(true),
            ..FileConfig::default()
        };
        let flags = Overrides { listen: Some("127.0.0.1:1".into()), ..Overrides::default() };
        let env = env_of(&[
            ("TESSERA_BOOTSTRAP_PASSWORD", "a long bootstrap password"),
            ("TESSERA_BOOTSTRAP_JOIN_TOKENS", " tsj_a , ,tsj_b"),
            ("TESSERA_BOOTSTRAP_TOKEN", "  "),
            ("TESSERA_MAX_CONNECTIONS", "64"),
            ("TESSERA_TELEMETRY_MAX_SERIES", "90000"),
            ("TESSERA_TELEMETRY_BATCH_FLOOR_MS", "5000"),
        ]);
        let s = resolve(flags, file, env).expect("settings");
        assert_eq!((s.listen.as_str(), s.demo), ("127.0.0.1:1", true));
        assert_eq!(s.database_url, "sqlite:///srv/tessera/tessera.db");
        assert_eq!(s.bootstrap_password.as_deref(), Some("a long bootstrap password"));
        assert_eq!(s.bootstrap_token, None, "a blank variable is no variable");
        assert_eq!(s.bootstrap_join_tokens, ["tsj_a", "tsj_b"]);
        assert_eq!(s.max_connections, Some(64));
        assert_eq!(s.telemetry.max_series, 90_000);
        assert_eq!(s.telemetry.batch_floor_ms, 5_000);
        assert!(!s.webhooks.reach.allow_internal, "tenants' webhooks stay outside the network by default");
        assert!(s.webhooks.reach.nets.is_empty() && s.webhooks.reach.hosts.is_empty());
        let debug = format!("{s:?}");
        assert!(!debug.contains("a long bootstrap password") && !debug.contains("tsj_a"), "{debug}");

        let defaults = resolve(Overrides::default(), FileConfig::default(), env_of(&[])).expect("settings");
        assert_eq!(defaults.listen, DEFAULT_LISTEN);
        let allowed =
            resolve(Overrides::default(), FileConfig::default(), env_of(&[("TESSERA_WEBHOOK_ALLOW_INTERNAL", "true")]));
        assert!(allowed.expect("settings").webhooks.reach.allow_internal);
        for bad in [
            &[("TESSERA_MAX_CONNECTIONS", "0")][..],
            &[("TESSERA_MAX_CONNECTIONS", "many")][..],
            &[("TESSERA_TELEMETRY_MAX_SERIES", "0")][..],
            &[("TESSERA_TELEMETRY_BATCH_FLOOR_MS", "50")][..],
            &[("TESSERA_TELEMETRY_BATCH_FLOOR_MS", "60000")][..],
            &[("TESSERA_WEBHOOK_ALLOW_INTERNAL", "maybe")][..],
            &[("TESSERA_WEBHOOK_ALLOW", "10.1.2.3/8")][..],
            &[("TESSERA_WEBHOOK_ALLOW", "http://x/")][..],
        ] {
            let bad: &'static [(&str, &str)] = Box::leak(bad.to_vec().into_boxed_slice());
            assert!(resolve(Overrides::default(), FileConfig::default(), env_of(bad)).is_err());
        }
    }

    #[test]
    fn webhook_allow_lists_and_secret_keys_come_from_the_file_or_the_environment() {
        let file: FileConfig = toml::from_str(
            "[webhooks]\nallow = [\"10.1.2.0/24\", \"Hooks.Internal.Example\"]\n\
             [secrets]\nkey = \"file-key\"\nold_keys = [\"old-key\"]\n",
        )
        .expect("toml");
        let s = resolve(Overrides::default(), file.clone(), env_of(&[])).expect("settings");
        assert_eq!(s.webhooks.reach.nets, ["10.1.2.0/24".parse::<ip_network::IpNetwork>().expect("net")]);
        assert_eq!(s.webhooks.reach.hosts, ["hooks.internal.example"]);
        assert_eq!(
            (s.secrets.key.as_deref(), s.secrets.old_keys.as_slice()),
            (Some("file-key"), &["old-key".to_string()][..])
        );
        assert!(!format!("{file:?}{s:?}").contains("file-key"), "keys never show");
        let env = env_of(&[
            ("TESSERA_WEBHOOK_ALLOW", "192.168.7.7, hooks.lan"),
            ("TESSERA_SECRET_KEY", "env-key"),
            ("TESSERA_SECRET_OLD_KEYS", "a, b"),
        ]);
        let s = resolve(Overrides::default(), file, env).expect("settings");
        assert_eq!(s.webhooks.reach.nets, ["192.168.7.7/32".parse::<ip_network::IpNetwork>().expect("net")]);
        assert_eq!(s.webhooks.reach.hosts, ["hooks.lan"]);
        assert_eq!((s.secrets.key.as_deref(), s.secrets.old_keys.len()), (Some("env-key"), 2));
    }

    #[test]
    fn kubeconfigs_and_the_controller_come_from_the_file_or_the_environment() {
        let file: FileConfig = toml::from_str(
            "[kubernetes]\neviction_grace_s = 90\neviction_refused_s = 60\ncontroller = false\n\
             [kubernetes.kubeconfigs]\neast = \"/etc/k/east\"\n",
        )
        .expect("toml");
        let s = resolve(Overrides::default(), file.clone(), env_of(&[])).expect("settings");
        let k = &s.kubernetes;
        assert_eq!((k.eviction_grace_s, k.eviction_refused_s, k.controller, k.in_cluster), (90, 60, false, false));
        assert_eq!(k.kubeconfigs.keys().collect::<Vec<_>>(), ["east"]);
        let env = env_of(&[("TESSERA_KUBECONFIGS", "west=/etc/k/west"), ("KUBERNETES_SERVICE_HOST", "10.0.0.1")]);
        let s = resolve(Overrides::default(), file, env).expect("settings");
        assert_eq!(s.kubernetes.kubeconfigs.keys().collect::<Vec<_>>(), ["west"], "the environment wins");
        assert!(s.kubernetes.in_cluster);
        let defaults = resolve(Overrides::default(), FileConfig::default(), env_of(&[])).expect("settings");
        assert_eq!(
            (
                defaults.kubernetes.eviction_grace_s,
                defaults.kubernetes.eviction_refused_s,
                defaults.kubernetes.controller
            ),
            (30, 300, true)
        );
        let bad = resolve(Overrides::default(), FileConfig::default(), env_of(&[("TESSERA_KUBECONFIGS", "east")]));
        assert!(bad.is_err_and(|e| e.contains("name=path")));
    }

    #[test]
    fn mail_is_off_without_an_smtp_server_and_checked_with_one() {
        let s = resolve(Overrides::default(), FileConfig::default(), env_of(&[])).expect("settings");
        assert_eq!(s.email, None);
        let file: FileConfig = toml::from_str(
            "listen = \"0.0.0.0:9000\"\n[email]\nsmtp_url = \"smtps://u:mail-password@mail.example.com\"\n\
             from = \"Tessera <t@example.com>\"\n",
        )
        .expect("toml");
        let s = resolve(Overrides::default(), file.clone(), env_of(&[])).expect("settings");
        let email = s.email.clone().expect("mail on");
        assert_eq!(email.portal_url, "http://0.0.0.0:9000", "links default to the listen address");
        assert!(!format!("{s:?}").contains("mail-password"), "{s:?}");
        let env =
            env_of(&[("TESSERA_PUBLIC_URL", "https://gpus.example.com/"), ("TESSERA_EMAIL_FROM", "ops@example.com")]);
        let email = resolve(Overrides::default(), file.clone(), env).expect("settings").email.expect("mail on");
        assert_eq!((email.portal_url.as_str(), email.from.as_str()), ("https://gpus.example.com", "ops@example.com"));
        for bad in [
            &[("TESSERA_SMTP_URL", "ftp://mail.example.com")][..],
            &[("TESSERA_EMAIL_FROM", "not an address")][..],
            &[("TESSERA_PUBLIC_URL", "file:///etc")][..],
        ] {
            let bad: &'static [(&str, &str)] = Box::leak(bad.to_vec().into_boxed_slice());
            assert!(resolve(Overrides::default(), file.clone(), env_of(bad)).is_err(), "{bad:?}");
        }
        let no_sender = env_of(&[("TESSERA_SMTP_URL", "smtp://127.0.0.1:2525")]);
        assert!(resolve(Overrides::default(), FileConfig::default(), no_sender).is_err(), "a sender is needed");
    }
}
