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
}

/// What the server has to reach clusters with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// Kubeconfig files by name.
    pub kubeconfigs: BTreeMap<String, PathBuf>,
    /// The server runs in a Kubernetes pod (`KUBERNETES_SERVICE_HOST` is set), so its service account can be used.
    pub in_cluster: bool,
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
        let s = KubernetesSettings { kubeconfigs: k, in_cluster: false };
        assert_eq!(s.credentials_problem(Some("east")), None);
        assert!(s.credentials_problem(Some("north")).is_some_and(|w| w.contains("north")));
        assert!(s.credentials_problem(None).is_some_and(|w| w.contains("KUBERNETES_SERVICE_HOST")));
        assert_eq!(KubernetesSettings { in_cluster: true, ..s }.credentials_problem(None), None);
    }
}
