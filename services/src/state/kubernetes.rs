//! How the server reaches the Kubernetes clusters it governs: the kubeconfigs its settings name (the files stay on
//! disk, typically a mounted Secret; only their names are stored or shown), and whether it runs in a pod, where the
//! in-cluster service account reaches its own cluster.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The `[kubernetes]` table of the server's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// Kubeconfig files by the name clusters refer to them with (`TESSERA_KUBECONFIGS`, `name=path` pairs
    /// separated by commas).
    #[serde(default)]
    pub kubeconfigs: BTreeMap<String, PathBuf>,
    /// The grace period, in seconds, of the evictions of pods whose claim's allocation ended (default 30).
    pub eviction_grace_s: Option<u32>,
    /// Seconds a pod's eviction may be refused (its PodDisruptionBudget) before the pod is deleted with the grace
    /// period (default 300).
    pub eviction_refused_s: Option<u32>,
    /// Whether this replica takes part in running the controller (default true; one replica at a time runs it).
    pub controller: Option<bool>,
}

/// What the server has to reach clusters with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// Kubeconfig files by name.
    pub kubeconfigs: BTreeMap<String, PathBuf>,
    /// The server runs in a Kubernetes pod (`KUBERNETES_SERVICE_HOST` is set), so its service account can be used.
    pub in_cluster: bool,
    /// The grace period of evictions, in seconds.
    pub eviction_grace_s: u32,
    /// Seconds an eviction may be refused before the pod is deleted with the grace period.
    pub eviction_refused_s: u32,
    /// How quickly the controller reacts (tests shorten it).
    pub timing: ControllerTiming,
    /// This replica takes part in running the controller.
    pub controller: bool,
}

/// How quickly the Kubernetes controller reacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerTiming {
    /// How often Tessera's records are compared with what was last applied.
    pub tick: std::time::Duration,
    /// How often every cluster is reconciled whatever happened.
    pub resync: std::time::Duration,
    /// How long the leader's lease lasts unless renewed.
    pub lease_ttl: std::time::Duration,
    /// The longest wait between two tries after a failure.
    pub max_backoff: std::time::Duration,
}

impl Default for ControllerTiming {
    fn default() -> ControllerTiming {
        ControllerTiming {
            tick: std::time::Duration::from_secs(1),
            resync: std::time::Duration::from_secs(300),
            lease_ttl: std::time::Duration::from_secs(15),
            max_backoff: std::time::Duration::from_secs(30),
        }
    }
}

/// The eviction grace when the settings give none: Kubernetes' default termination grace period.
pub const DEFAULT_EVICTION_GRACE_S: u32 = 30;

/// How long evictions may be refused when the settings do not say.
pub const DEFAULT_EVICTION_REFUSED_S: u32 = 300;

impl Default for KubernetesSettings {
    fn default() -> KubernetesSettings {
        KubernetesSettings {
            kubeconfigs: BTreeMap::new(),
            in_cluster: false,
            eviction_grace_s: DEFAULT_EVICTION_GRACE_S,
            eviction_refused_s: DEFAULT_EVICTION_REFUSED_S,
            timing: ControllerTiming::default(),
            controller: true,
        }
    }
}

impl KubernetesSettings {
    /// Why a cluster reached with `kubeconfig` (`None`: the in-cluster account) cannot be reached from this server,
    /// or `None` when it has what it needs.
    pub fn credentials_problem(&self, kubeconfig: Option<&str>) -> Option<String> {
        match kubeconfig {
            Some(name) if !self.kubeconfigs.contains_key(name) => {
                Some(format!("this server's settings have no kubeconfig named `{name}` ([kubernetes.kubeconfigs])"))
            }
            Some(_) => None,
            None if !self.in_cluster => Some(
                "this server does not run in a Kubernetes pod (KUBERNETES_SERVICE_HOST is not set), so it has no \
                 in-cluster service account; name a kubeconfig instead"
                    .to_string(),
            ),
            None => None,
        }
    }
}

/// Parses `TESSERA_KUBECONFIGS`: `name=path` pairs separated by commas.
pub fn parse_kubeconfigs(text: &str) -> Result<BTreeMap<String, PathBuf>, String> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, path) = pair
            .split_once('=')
            .map(|(n, p)| (n.trim(), p.trim()))
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
            .ok_or_else(|| format!("TESSERA_KUBECONFIGS: `{pair}` is not name=path"))?;
        out.insert(name.to_string(), PathBuf::from(path));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeconfigs_parse_and_problems_say_what_is_missing() {
        let k = parse_kubeconfigs(" east=/etc/k/east , west=/etc/k/west").expect("parses");
        assert_eq!(k.len(), 2);
        assert_eq!(k["east"], PathBuf::from("/etc/k/east"));
        assert!(parse_kubeconfigs("east").is_err());
        assert!(parse_kubeconfigs("=/x").is_err());
        let s = KubernetesSettings { kubeconfigs: k, ..KubernetesSettings::default() };
        assert_eq!(s.credentials_problem(Some("east")), None);
        assert!(s.credentials_problem(Some("north")).is_some_and(|w| w.contains("north")));
        assert!(s.credentials_problem(None).is_some_and(|w| w.contains("KUBERNETES_SERVICE_HOST")));
        assert_eq!(KubernetesSettings { in_cluster: true, ..s }.credentials_problem(None), None);
    }
}
