//! Places for long-lived streams (the live telemetry and inbox server-sent events): at most so many a user holds
//! of one kind, so many one client address holds, and so many all users hold together, so that streams never take
//! the connections that `/healthz`, agents and admins need. A place is held for as long as its [`Held`] lives.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most streams of one kind one user holds on one replica (browser tabs, and streams of pages just left: a stream
/// closed by the browser is noticed at its next write, within the 15 s keep-alive).
pub const MAX_STREAMS_PER_USER: usize = 32;
/// Most streams of every kind one client address holds on one replica.
pub const MAX_STREAMS_PER_ADDRESS: usize = 64;
/// How long one stream lasts by default (`TESSERA_STREAM_LIFETIME_S`); the client then opens another (an `EventSource` does so by itself), with its
/// credentials and memberships read again.
pub const STREAM_LIFETIME: Duration = Duration::from_secs(300);
/// How often a running stream checks that its caller's credential, memberships and roles are unchanged.
pub const RIGHT_RECHECK: Duration = Duration::from_secs(2);

/// The kinds of stream, each with its own per-user count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamKind {
    /// `GET /api/v1/telemetry/live`.
    Telemetry,
    /// `GET /api/v1/inbox/stream`.
    Inbox,
}

impl StreamKind {
    /// How the kind is named in answers.
    pub fn name(self) -> &'static str {
        match self {
            Self::Telemetry => "live telemetry",
            Self::Inbox => "inbox",
        }
    }
}

/// Why a stream was not opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The user holds [`StreamLimits::per_user`] streams of this kind.
    User(usize),
    /// The client address holds [`StreamLimits::per_address`] streams.
    Address(usize),
    /// All users together hold [`StreamLimits::total`] streams.
    Total(usize),
}

impl Refused {
    /// A sentence for the caller.
    pub fn detail(&self, kind: StreamKind) -> String {
        match self {
            Self::User(n) => format!("at most {n} {} streams a user at once; close another tab's", kind.name()),
            Self::Address(n) => format!("at most {n} streams from one client address at once"),
            Self::Total(n) => format!("the server holds its most streams ({n}); retry shortly"),
        }
    }
}

/// The caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Per user and kind.
    pub per_user: usize,
    /// Per client address (an IPv6 address counts by its /64); 0: no cap (behind a proxy that caps).
    pub per_address: usize,
    /// Every stream on the replica: half the connection cap, so the other half stays for everything else.
    pub total: usize,
    /// How long one stream lasts.
    pub lifetime: Duration,
}

impl StreamLimits {
    /// The caps for a server with `max_connections` and `per_address` connections a client address may hold.
    pub fn for_connections(max_connections: usize, per_address: usize) -> Self {
        let per_address = if per_address == 0 { 0 } else { MAX_STREAMS_PER_ADDRESS.min(per_address / 2).max(1) };
        Self {
            per_user: MAX_STREAMS_PER_USER,
            per_address,
            total: (max_connections / 2).max(1),
            lifetime: STREAM_LIFETIME,
        }
    }
}

#[derive(Debug, Default)]
struct Counts {
    users: HashMap<(String, StreamKind), usize>,
    addresses: HashMap<IpAddr, usize>,
    total: usize,
}

/// The streams open on this replica.
#[derive(Debug)]
pub struct Streams {
    limits: StreamLimits,
    open: Arc<Mutex<Counts>>,
}

impl Streams {
    /// No stream open yet.
    pub fn new(limits: StreamLimits) -> Self {
        Self { limits, open: Arc::default() }
    }

    /// The caps in force.
    pub fn limits(&self) -> StreamLimits {
        self.limits
    }

    /// Streams open now.
    pub fn open_now(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// A place for one more stream of `kind` for `user` from `address`, or why not.
    pub fn open(&self, kind: StreamKind, user: &str, address: Option<IpAddr>) -> Result<Held, Refused> {
        let address = address.map(network_of);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= self.limits.total {
            return Err(Refused::Total(self.limits.total));
        }
        let key = (user.to_string(), kind);
        if open.users.get(&key).copied().unwrap_or(0) >= self.limits.per_user {
            return Err(Refused::User(self.limits.per_user));
        }
        let address = address.filter(|_| self.limits.per_address > 0);
        if let Some(a) = address
            && open.addresses.get(&a).copied().unwrap_or(0) >= self.limits.per_address
        {
            return Err(Refused::Address(self.limits.per_address));
        }
        open.total += 1;
        *open.users.entry(key.clone()).or_default() += 1;
        if let Some(a) = address {
            *open.addresses.entry(a).or_default() += 1;
        }
        Ok(Held { open: self.open.clone(), user: key, address })
    }
}

/// The address a client is counted by: an IPv4 address as it is, an IPv6 address by its /64 (one host usually
/// has a whole /64), an IPv4-mapped IPv6 address as its IPv4 address.
pub fn network_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// One open stream's place; dropping it frees the place.
#[derive(Debug)]
pub struct Held {
    open: Arc<Mutex<Counts>>,
    user: (String, StreamKind),
    address: Option<IpAddr>,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.users.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                open.users.remove(&self.user);
            }
        }
        if let Some(a) = self.address
            && let Some(n) = open.addresses.get_mut(&a)
        {
            *n -= 1;
            if *n == 0 {
                open.addresses.remove(&a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        s.parse().ok()
    }

    #[test]
    fn each_cap_holds_and_a_dropped_place_is_free_again() {
        let streams = Streams::new(StreamLimits { per_user: 2, per_address: 3, total: 4, lifetime: STREAM_LIFETIME });
        let a1 = streams.open(StreamKind::Telemetry, "u1", ip("10.0.0.1")).expect("first");
        let _a2 = streams.open(StreamKind::Telemetry, "u1", ip("10.0.0.1")).expect("second");
        assert_eq!(streams.open(StreamKind::Telemetry, "u1", ip("10.0.0.2")).err(), Some(Refused::User(2)));
        // Another kind has its own per-user count; the address is at its cap after it.
        let _b = streams.open(StreamKind::Inbox, "u1", ip("10.0.0.1")).expect("inbox");
        assert_eq!(streams.open(StreamKind::Inbox, "u2", ip("10.0.0.1")).err(), Some(Refused::Address(3)));
        let _c = streams.open(StreamKind::Inbox, "u2", ip("10.0.0.2")).expect("other address");
        assert_eq!(streams.open(StreamKind::Inbox, "u3", ip("10.0.0.3")).err(), Some(Refused::Total(4)));
        assert_eq!(streams.open_now(), 4);
        drop(a1);
        assert_eq!(streams.open_now(), 3);
        streams.open(StreamKind::Telemetry, "u1", ip("10.0.0.1")).expect("a freed place");
    }

    #[test]
    fn an_ipv6_client_counts_by_its_64() {
        let streams = Streams::new(StreamLimits { per_user: 10, per_address: 1, total: 10, lifetime: STREAM_LIFETIME });
        let _a = streams.open(StreamKind::Inbox, "u1", ip("2001:db8:1:2::1")).expect("first");
        assert_eq!(streams.open(StreamKind::Inbox, "u2", ip("2001:db8:1:2::ffff")).err(), Some(Refused::Address(1)));
        streams.open(StreamKind::Inbox, "u2", ip("2001:db8:1:3::1")).expect("another /64");
        assert_eq!(network_of("::ffff:10.1.2.3".parse().expect("ip")), "10.1.2.3".parse::<IpAddr>().expect("ip"));
    }

    #[test]
    fn limits_leave_half_the_connections_to_everything_else() {
        let l = StreamLimits::for_connections(4096, 512);
        assert_eq!((l.per_user, l.per_address, l.total), (32, 64, 2048));
        assert_eq!(StreamLimits::for_connections(4096, 0).per_address, 0);
        assert_eq!(StreamLimits::for_connections(64, 16).per_address, 8);
    }
}
