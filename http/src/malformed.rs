//! Problem reports for requests too malformed to reach the router.
//!
//! hyper answers a request it cannot parse (a NUL byte, a bare CR or another control character in a header, a
//! header line without a colon, a bad request line) by itself, before any service sees it: an empty `400`, or
//! `431` for headers past its limit and `414` for a URI too long. It offers no hook to change that answer. Its
//! answer is recognisable, though: one of those status lines, then only `connection: close`, `content-length: 0`
//! and `date`, and nothing after the head. No answer of the router looks like that (every client error it gives is a problem report with
//! a body), and a WebSocket frame the server writes cannot either (frames start with a frame header; their JSON
//! text has no raw CR or LF). [`Problems`] wraps a connection's stream and replaces exactly those bytes, as they
//! are written, with the same status as an `application/problem+json` report; the connection closes after it, as
//! hyper closes it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's stream whose answers to unparseable requests are problem reports.
pub struct Problems<T> {
    inner: T,
    /// A replacement being written, and the length of hyper's answer it stands for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<T> std::fmt::Debug for Problems<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Problems").field("replacing", &self.pending.is_some()).finish_non_exhaustive()
    }
}

impl<T> Problems<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Problems<T> {
        Problems { inner, pending: None }
    }
}

/// hyper's own answer to a request it could not parse, if `head` is one: the problem report to send instead.
pub fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    if head.len() > 256 || !head.starts_with(b"HTTP/1.1 4") || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(&head[..head.len() - 4]).ok()?;
    let mut lines = text.split("\r\n");
    let (status, code, detail) = match lines.next()? {
        "HTTP/1.1 400 Bad Request" => (
            "400 Bad Request",
            "malformed_request",
            "the request line or a header could not be read: header names are tokens, each header line has a \
             colon, and values hold no control characters (NUL, CR, LF)",
        ),
        "HTTP/1.1 431 Request Header Fields Too Large" => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            "the request's headers are larger than the server reads",
        ),
        "HTTP/1.1 414 URI Too Long" => {
            ("414 URI Too Long", "uri_too_long", "the request's URI is longer than the server reads")
        }
        _ => return None,
    };
    for line in lines {
        let (name, value) = line.split_once(": ")?;
        let expected = name.eq_ignore_ascii_case("date")
            || name.eq_ignore_ascii_case("content-length") && value == "0"
            || name.eq_ignore_ascii_case("connection") && value == "close";
        if !expected {
            return None;
        }
    }
    let (number, title) = status.split_once(' ')?;
    let body = serde_json::json!({
        "type": format!("urn:tessera:problem:{code}"),
        "title": title,
        "status": number.parse::<u16>().ok()?,
        "detail": detail,
        "code": code,
    })
    .to_string();
    Some(
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/problem+json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<T: AsyncWrite + Unpin> Problems<T> {
    /// Writes the pending replacement out; then reports hyper's answer as written.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let Some((bytes, written, stands_for)) = self.pending.as_mut() else { return Poll::Ready(Ok(0)) };
        while *written < bytes.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        let stands_for = *stands_for;
        self.pending = None;
        Poll::Ready(Ok(stands_for))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Problems<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Problems<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.pending.is_none() {
            match replacement(buf) {
                Some(bytes) => self.pending = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        self.poll_pending(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.pending.is_none() {
            let mut filled = bufs.iter().filter(|b| !b.is_empty());
            let only = match (filled.next(), filled.next()) {
                (Some(only), None) => Some(only),
                _ => None,
            };
            match only.and_then(|b| Some((replacement(b)?, b.len()))) {
                Some((bytes, stands_for)) => self.pending = Some((bytes, 0, stands_for)),
                None => return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs),
            }
        }
        self.poll_pending(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.poll_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.poll_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
