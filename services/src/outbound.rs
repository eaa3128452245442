//! Where webhooks may connect, and how a failed attempt is told.
//!
//! A platform endpoint may reach any address. A tenant's endpoint reaches globally routable unicast addresses only
//! ([`tessera_core::address::is_global`], which also judges the IPv4 address inside NAT64, 6to4, Teredo and
//! IPv4-mapped forms), unless the operator allows more: every address (`TESSERA_WEBHOOK_ALLOW_INTERNAL`), or some
//! networks and host names (`[webhooks] allow` / `TESSERA_WEBHOOK_ALLOW`). The rule is checked when an endpoint is
//! made and again at every connection: names are resolved by [`Vetted`], which keeps only the addresses the
//! endpoint may reach (a name may point elsewhere after the endpoint was checked), and a URL with a literal address,
//! which the HTTP client connects to without resolving, is checked before sending. Redirects are never followed,
//! and no proxy is used for tenants' endpoints (it would resolve the name itself).
//!
//! The delivery log tells the endpoint's owner the HTTP status and one of [`FAILURES`], never what the target
//! answered: a target inside the network must not become a way to read it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ip_network::IpNetwork;
use tessera_core::address::{embedded_ipv4, is_global};

use tessera_store::notifications::WebhookRecord;

/// How long one attempt may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// What the delivery log says of an attempt that failed: answered with a status that is not 2xx; answered with a
/// redirect (never followed); no answer in time; no connection; the name did not resolve; it resolved, or the URL
/// points, only to addresses the endpoint may not reach; the TLS handshake or certificate failed; the secret could
/// not be read (the server lacks the key that sealed it); anything else.
pub const FAILURES: &[&str] = &[
    "http_status",
    "redirect_refused",
    "timeout",
    "connect_failed",
    "dns_failed",
    "address_not_allowed",
    "tls_failed",
    "secret_unreadable",
    "request_failed",
];

/// Which addresses tenants' endpoints may reach beyond the internet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// Any address (`TESSERA_WEBHOOK_ALLOW_INTERNAL`).
    pub allow_internal: bool,
    /// These networks (`[webhooks] allow` entries in CIDR form, or single addresses).
    pub nets: Vec<IpNetwork>,
    /// These host names, whatever they resolve to (`[webhooks] allow` entries that are names), lower case.
    pub hosts: Vec<String>,
}

/// A host name as compared: lower case, without a trailing dot.
fn host_key(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

impl Reach {
    /// Adds the entries of an allow list: networks (`10.1.2.0/24`), addresses (`10.1.2.3`) or host names.
    pub fn allow<'a>(&mut self, entries: impl IntoIterator<Item = &'a str>) -> Result<(), String> {
        for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
            if let Ok(ip) = entry.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
                self.nets.push(IpNetwork::from(ip));
            } else if entry.contains('/') {
                let net = entry.parse::<IpNetwork>().map_err(|e| {
                    format!("webhook allow list: `{entry}` is not a network in CIDR form ({e}; host bits must be 0)")
                })?;
                self.nets.push(net);
            } else if entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
                self.hosts.push(host_key(entry));
            } else {
                return Err(format!("webhook allow list: `{entry}` is neither a network nor a host name"));
            }
        }
        Ok(())
    }

    /// Whether a tenant's endpoint may reach whatever `host` resolves to.
    fn host_allowed(&self, host: &str) -> bool {
        self.allow_internal || self.hosts.contains(&host_key(host))
    }

    /// Whether a tenant's endpoint may connect to `ip`.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        let listed = |ip: IpAddr| self.nets.iter().any(|n| n.contains(ip));
        let carried = match ip {
            IpAddr::V6(v6) => embedded_ipv4(v6),
            IpAddr::V4(_) => Vec::new(),
        };
        self.allow_internal
            || is_global(ip)
            || listed(ip)
            || (!carried.is_empty() && carried.into_iter().all(|v4| listed(IpAddr::V4(v4))))
    }

    /// Why a tenant's endpoint may not be posted to `url`, when it may not: the host is this host's name
    /// (`localhost`) or an address it may not reach. Other names are checked when they are resolved.
    pub fn refusal(&self, url: &reqwest::Url) -> Option<String> {
        match url.host()? {
            url::Host::Domain(d) => {
                let d = host_key(d);
                let local = d == "localhost" || d.ends_with(".localhost");
                (local && !self.host_allowed(&d)).then(|| format!("{d} is this host"))
            }
            url::Host::Ipv4(ip) => {
                (!self.ip_allowed(ip.into())).then(|| format!("{ip} is an internal address (not globally routable)"))
            }
            url::Host::Ipv6(ip) => {
                (!self.ip_allowed(ip.into())).then(|| format!("{ip} is an internal address (not globally routable)"))
            }
        }
    }

    /// The addresses among `all` that a tenant's endpoint at `host` may connect to.
    fn vet(&self, host: &str, all: Vec<SocketAddr>) -> Vec<SocketAddr> {
        if self.host_allowed(host) {
            return all;
        }
        all.into_iter().filter(|a| self.ip_allowed(a.ip())).collect()
    }
}

const NOT_ALLOWED: &str = "resolves to no address a tenant's webhook may reach";
const DNS_FAILED: &str = "cannot resolve the webhook's host";

/// The name resolved to no address the endpoint may reach.
#[derive(Debug, thiserror::Error)]
#[error("{0} {NOT_ALLOWED}")]
struct NotAllowed(String);

/// The name did not resolve.
#[derive(Debug, thiserror::Error)]
#[error("{DNS_FAILED} {host}: {source}")]
struct DnsFailed {
    host: String,
    source: std::io::Error,
}

/// A resolver that keeps only the addresses a tenant's endpoint may reach, and fails when none is left.
#[derive(Debug, Clone)]
pub struct Vetted(pub Arc<Reach>);

impl reqwest::dns::Resolve for Vetted {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let reach = self.0.clone();
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await.map(Iterator::collect::<Vec<SocketAddr>>);
            let all = match found {
                Ok(all) => all,
                Err(source) => return Err(Box::new(DnsFailed { host, source }) as _),
            };
            let kept = reach.vet(&host, all);
            if kept.is_empty() {
                return Err(Box::new(NotAllowed(host)) as _);
            }
            let addrs: reqwest::dns::Addrs = Box::new(kept.into_iter());
            Ok(addrs)
        })
    }
}

/// The failure class of a request that got no answer.
pub fn classify(e: &reqwest::Error) -> &'static str {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut tls = false;
    while let Some(s) = source {
        // A boxed error may stand between the chain and ours, so its message is looked at too.
        let text = s.to_string().to_ascii_lowercase();
        if s.is::<NotAllowed>() || text.contains(NOT_ALLOWED) {
            return "address_not_allowed";
        }
        if s.is::<DnsFailed>() || text.contains(DNS_FAILED) {
            return "dns_failed";
        }
        tls |= text.contains("certificate") || text.contains("tls") || text.contains("handshake");
        source = s.source();
    }
    if e.is_timeout() {
        "timeout"
    } else if tls {
        "tls_failed"
    } else if e.is_connect() {
        "connect_failed"
    } else if e.is_redirect() {
        "redirect_refused"
    } else {
        "request_failed"
    }
}

/// The failure class of an answer that is not 2xx.
pub fn classify_status(status: reqwest::StatusCode) -> &'static str {
    if status.is_redirection() { "redirect_refused" } else { "http_status" }
}

/// The HTTP clients deliveries go out with: one for any address (platform endpoints, and tenants' when every
/// address is allowed), one that resolves through [`Vetted`].
#[derive(Debug, Clone)]
pub struct Clients {
    any: reqwest::Client,
    vetted: reqwest::Client,
    reach: Arc<Reach>,
}

impl Clients {
    /// Both clients.
    pub fn new(reach: Reach) -> Result<Clients, reqwest::Error> {
        let builder = || {
            reqwest::Client::builder()
                .timeout(SEND_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("Tessera-Webhooks/", env!("CARGO_PKG_VERSION")))
        };
        let reach = Arc::new(reach);
        Ok(Clients {
            any: builder().build()?,
            vetted: builder().no_proxy().dns_resolver(Arc::new(Vetted(reach.clone()))).build()?,
            reach,
        })
    }

    /// The client for `w`, or why `w` may not be posted to.
    pub fn for_hook(&self, w: &WebhookRecord) -> Result<&reqwest::Client, &'static str> {
        if w.tenant_id.is_none() || self.reach.allow_internal {
            return Ok(&self.any);
        }
        match reqwest::Url::parse(&w.url) {
            Ok(url) if self.reach.refusal(&url).is_none() => Ok(&self.vetted),
            Ok(_) => Err("address_not_allowed"),
            Err(_) => Err("request_failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> reqwest::Url {
        reqwest::Url::parse(u).expect("url")
    }

    #[test]
    fn literal_addresses_and_this_host_are_refused_unless_allowed() {
        let strict = Reach::default();
        for inside in [
            "http://127.0.0.1:9/x",
            "http://localhost/x",
            "http://a.localhost./x",
            "http://[::1]/x",
            "http://169.254.169.254/latest/meta-data",
            "http://[64:ff9b::a9fe:a9fe]/x",
            "http://[64:ff9b::a00:1]/x",
            "http://[64:ff9b:1::a00:1]/x",
            "http://[::a00:1]/x",
            "http://[::ffff:192.168.0.1]/x",
            "http://[2002:a9fe:a9fe::]/x",
            "http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/x",
            "http://[fec0::1]/x",
            "http://198.18.0.1/x",
            "http://192.0.0.8/x",
            "http://240.0.0.1/x",
            "http://100.64.0.1/x",
            "http://0x7f.1/x",
        ] {
            assert!(strict.refusal(&url(inside)).is_some(), "{inside}");
        }
        assert_eq!(strict.refusal(&url("https://hooks.example.com/x")), None);
        assert_eq!(strict.refusal(&url("http://8.8.8.8/x")), None);
        let mut some = Reach::default();
        some.allow(["10.1.2.0/24", "hooks.internal.example", "fd00::7", "localhost"]).expect("valid");
        assert_eq!(some.refusal(&url("http://10.1.2.9/x")), None);
        assert_eq!(some.refusal(&url("http://[::ffff:10.1.2.9]/x")), None, "an allowed address in IPv6 form");
        assert!(some.refusal(&url("http://10.1.3.9/x")).is_some());
        assert_eq!(some.refusal(&url("http://[fd00::7]/x")), None);
        assert_eq!(some.refusal(&url("http://localhost/x")), None);
        for bad in ["10.1.2.1/24", "not a host", "10.0.0.0/99"] {
            assert!(Reach::default().allow([bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn resolved_addresses_are_vetted_by_name_and_network() {
        let resolved: Vec<SocketAddr> =
            ["10.0.0.1:0", "8.8.8.8:0", "[::1]:0", "[2001:4860::1]:0", "[64:ff9b::a9fe:a9fe]:0", "10.1.2.3:0"]
                .iter()
                .map(|a| a.parse().expect("addr"))
                .collect();
        let ips = |v: Vec<SocketAddr>| v.iter().map(|a| a.ip().to_string()).collect::<Vec<_>>();
        let strict = Reach::default();
        assert_eq!(ips(strict.vet("a.example", resolved.clone())), ["8.8.8.8", "2001:4860::1"]);
        let mut some = Reach::default();
        some.allow(["10.1.2.0/24", "hooks.internal.example"]).expect("valid");
        assert_eq!(ips(some.vet("a.example", resolved.clone())), ["8.8.8.8", "2001:4860::1", "10.1.2.3"]);
        assert_eq!(some.vet("Hooks.Internal.Example.", resolved.clone()).len(), resolved.len(), "an allowed name");
    }

    #[tokio::test]
    async fn a_name_that_resolves_inside_is_refused_when_connecting() {
        use reqwest::dns::Resolve;
        let name = |n: &str| n.parse::<reqwest::dns::Name>().expect("name");
        let strict = Vetted(Arc::new(Reach::default()));
        let Err(e) = strict.resolve(name("localhost")).await else { panic!("localhost resolves inside") };
        assert!(e.is::<NotAllowed>(), "{e}");
        let mut loopback = Reach::default();
        loopback.allow(["127.0.0.0/8", "::1/128"]).expect("valid");
        let addrs: Vec<SocketAddr> = Vetted(Arc::new(loopback)).resolve(name("localhost")).await.expect("ok").collect();
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()), "{addrs:?}");
        // Through the client: the classification a tenant sees.
        let clients = Clients::new(Reach::default()).expect("clients");
        let e = clients.vetted.post("http://localhost:9/x").send().await.expect_err("refused");
        assert_eq!(classify(&e), "address_not_allowed", "{e:?}");
    }
}
