//! How many connections a replica holds open, in all and per client address: the caps the listener enforces and
//! the streams' own caps are cut from.

/// Most connections one client address holds open before its first request's headers are in (room for a burst
/// of clients behind one address connecting at once; a silent socket holds its place for at most
/// the listener's header read timeout).
pub const PENDING_PER_ADDRESS: usize = 128;

/// How many connections may be open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// In all.
    pub max_connections: usize,
    /// From one client address (an IPv6 address counts by its /64); 0: no per-address caps (behind a proxy,
    /// whose address every connection has).
    pub per_address: usize,
    /// From one client address before their first request's headers are in.
    pub pending_per_address: usize,
}

impl Limits {
    /// The caps for `max_connections` in all and `per_address` (default [`default_per_address`]).
    pub fn new(max_connections: usize, per_address: Option<usize>) -> Self {
        let per_address = per_address.unwrap_or_else(|| default_per_address(max_connections));
        Self { max_connections, per_address, pending_per_address: PENDING_PER_ADDRESS.min(per_address) }
    }
}

/// The default per-address cap: an eighth of the connection cap, at least 16.
pub fn default_per_address(max_connections: usize) -> usize {
    (max_connections / 8).max(16)
}
/// Default for the most connections open at once, where the file-descriptor limit allows it (each connection takes
/// a descriptor; see the README).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

/// The default connection cap: [`DEFAULT_MAX_CONNECTIONS`], or fewer when the process's file-descriptor limit
/// leaves less room (the limit minus what the server needs beside its connections, at least 64).
pub fn default_max_connections() -> usize {
    match open_files_limit() {
        Some(limit) => {
            usize::try_from(limit.saturating_sub(FD_HEADROOM)).unwrap_or(usize::MAX).clamp(64, DEFAULT_MAX_CONNECTIONS)
        }
        None => DEFAULT_MAX_CONNECTIONS,
    }
}
/// Descriptors the server needs beside its connections (database pool, files, the listener).
pub const FD_HEADROOM: u64 = 256;

/// The process's soft limit of open files, where the system says (Linux's `/proc/self/limits`).
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
