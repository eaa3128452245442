//! The accept loop: HTTP/1.1 connections with a deadline for reading each request's headers, a cap on open
//! connections, and per client address a cap on open connections and on connections that have not yet sent a
//! request's headers, so that clients that connect and send slowly (or nothing) cannot hold the server's file
//! descriptors, and one address cannot hold what everybody else needs. Each request carries its client's address
//! ([`ClientAddr`]). Upgrades (the agents' WebSockets) are served on the same connections.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

/// How long a client has to send a request's headers once it connected or finished the previous request (an idle
/// keep-alive connection is closed after this too): the contract its clients keep their idle connections under.
pub const HEADER_READ_TIMEOUT: Duration = tessera_core::api::SERVER_IDLE_CLOSE;
pub use tessera_services::connections::{
    DEFAULT_MAX_CONNECTIONS, FD_HEADROOM, Limits, PENDING_PER_ADDRESS, default_max_connections, default_per_address,
    open_files_limit,
};

/// The address a request came from (the peer of its connection; behind a proxy, the proxy's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::IpAddr);

/// How long open connections get to finish after shutdown was asked for.
const DRAIN: Duration = Duration::from_secs(10);

/// The answer a connection past the cap gets before it is closed: a 503 problem report.
pub static BUSY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = serde_json::json!({
        "type": "urn:tessera:problem:too_many_connections",
        "title": "Service unavailable",
        "status": 503,
        "detail": "the server has its most connections open; retry shortly",
        "code": "too_many_connections",
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\nconnection: close\r\n\
         retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// The answer a connection past its client address's caps gets before it is closed: a 429 problem report.
pub static CROWDED: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = serde_json::json!({
        "type": "urn:tessera:problem:too_many_connections",
        "title": "Too many requests",
        "status": 429,
        "detail": "this client address has its most connections open (or waiting to send their headers); close some \
                   and retry",
        "code": "too_many_connections",
    })
    .to_string();
    format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/problem+json\r\nconnection: close\r\n\
         retry-after: 1\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
});

/// Serves `app` on `listener` until `shutdown` completes, with at most `limits.max_connections` open at once,
/// upgraded WebSockets included (the connection past it gets a 503 and is closed), and the per-address caps (past
/// them a 429); then lets open connections finish for up to 10 s.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let max_connections = limits.max_connections.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
    if let Some(limit) = open_files_limit()
        && limit < max_connections as u64 + FD_HEADROOM
    {
        tracing::warn!(
            limit,
            max_connections,
            "the file-descriptor limit is below the connection cap plus {FD_HEADROOM}: raise it (ulimit -n) or lower \
             TESSERA_MAX_CONNECTIONS, or connections will fail with 'too many open files' before the cap answers"
        );
    }
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let per_address = Arc::new(PerAddress::default());
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors (or a connection reset before it was accepted): wait, do not spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let client = ClientAddr(peer.ip());
        let (open, pending) = if limits.per_address > 0 {
            match per_address.take(client.0, limits) {
                Some(held) => (Some(held.0), Some(held.1)),
                None => {
                    tokio::spawn(refuse(stream, &CROWDED));
                    continue;
                }
            }
        } else {
            (None, None)
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, &BUSY));
            continue;
        };
        let _ = stream.set_nodelay(true);
        // The first request's headers are in once the service is called: the connection is no longer pending.
        let pending = Arc::new(std::sync::Mutex::new(pending));
        let app = app.clone();
        let service = tower::service_fn(move |mut request: axum::extract::Request<hyper::body::Incoming>| {
            if let Ok(mut p) = pending.lock() {
                p.take();
            }
            request.extensions_mut().insert(client);
            tower::ServiceExt::oneshot(app.clone(), request)
        });
        let service = TowerToHyperService::new(service);
        // The slot travels with the stream, into an upgraded WebSocket too: it is free once the socket closes.
        let io = TokioIo::new(crate::malformed::Problems::new(Counted { stream, _slot: slot, _open: open }));
        let mut connection = http.serve_connection(io, service).with_upgrades();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            // Errors here are the client's (reset, timeout, malformed request): nothing to report.
            tokio::select! {
                _ = &mut connection => return,
                _ = stop.wait_for(|s| *s) => {}
            }
            std::pin::Pin::new(&mut connection).graceful_shutdown();
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    // Every slot back means every connection (and socket) is closed.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN, slots.acquire_many(all)).await.is_err() {
        tracing::info!("connections still open {} s after shutdown; closing them", DRAIN.as_secs());
    }
    Ok(())
}

/// Connections open per client address: in all, and before their first request's headers.
#[derive(Debug, Default)]
struct PerAddress(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, (usize, usize)>>);

impl PerAddress {
    /// Places for one more connection from `ip` (open, and pending until its headers are in), unless the address
    /// holds its most of either.
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, limits: Limits) -> Option<(AddrSlot, AddrSlot)> {
        let ip = tessera_services::streams::network_of(ip);
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let counts = map.entry(ip).or_default();
        if counts.0 >= limits.per_address || counts.1 >= limits.pending_per_address {
            if *counts == (0, 0) {
                map.remove(&ip);
            }
            return None;
        }
        counts.0 += 1;
        counts.1 += 1;
        Some((AddrSlot { map: self.clone(), ip, pending: false }, AddrSlot { map: self.clone(), ip, pending: true }))
    }
}

/// A connection's place in its address's count (open, or pending); dropping it frees the place.
#[derive(Debug)]
struct AddrSlot {
    map: Arc<PerAddress>,
    ip: std::net::IpAddr,
    pending: bool,
}

impl Drop for AddrSlot {
    fn drop(&mut self) {
        let mut map = self.map.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counts) = map.get_mut(&self.ip) {
            if self.pending {
                counts.1 = counts.1.saturating_sub(1);
            } else {
                counts.0 = counts.0.saturating_sub(1);
            }
            if *counts == (0, 0) {
                map.remove(&self.ip);
            }
        }
    }
}

/// A connection's stream, holding its place under the cap for as long as it is open.
struct Counted {
    stream: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
    _open: Option<AddrSlot>,
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Answers a connection past a cap with a problem report ([`BUSY`] or [`CROWDED`]) and closes it.
async fn refuse(mut stream: tokio::net::TcpStream, answer: &'static [u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(answer).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
